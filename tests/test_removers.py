"""Removers (Reverb's remover selectors): which items leave a full buffer.

The deterministic ones (LIFO, max / min heap) are checked against a model of Reverb's
table, which inserts a batch one item at a time and, when full, removes one item among
those present first; the random ones by the law of the item they remove (chi-square).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from key_contents import key_contents

from redisbuf import PERSampler, ReplayBuffer, UniformSampler
from redisbuf.errors import ConfigMismatchError, HeapNotBuiltError
from redisbuf.selectors import (
    FifoRemover,
    LifoRemover,
    MaxHeapRemover,
    MinHeapRemover,
    PrioritizedRemover,
    UniformRemover,
)

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
REMOVERS = {"lifo": LifoRemover, "max_heap": MaxHeapRemover, "min_heap": MinHeapRemover}
PRIORITIES = st.sampled_from([0.0, 1.0, 2.0, 5.0])


def model_add(present: list[tuple[int, float]], batch: list[tuple[int, float]],
              capacity: int, mode: str) -> None:
    """Reverb's table: each new item, when the table is full, first removes one."""
    for item in batch:
        if len(present) >= capacity:
            if mode == "lifo":
                victim = present[-1]
            elif mode == "max_heap":  # highest priority, the oldest among equals
                victim = min(present, key=lambda e: (-e[1], e[0]))
            else:
                victim = min(present, key=lambda e: (e[1], e[0]))
            present.remove(victim)
        present.append(item)


def present_ids(buffer: ReplayBuffer) -> list[int]:
    return sorted(int(i) for i in buffer.client.zrange(buffer.keys.order, 0, -1))


@PROPERTY
@given(
    mode=st.sampled_from(sorted(REMOVERS)),
    capacity=st.integers(1, 5),
    ops=st.lists(
        st.one_of(
            st.tuples(st.just("add"), st.lists(PRIORITIES, min_size=1, max_size=6)),
            st.tuples(st.just("update"), st.integers(1, 30), PRIORITIES),
        ),
        min_size=1, max_size=10,
    ),
)
def test_deterministic_removers_follow_reverbs_table(client, buffer_name, mode, capacity,
                                                     ops):
    client.flushall()
    buffer = ReplayBuffer(client, buffer_name, capacity=capacity,
                          sampler=PERSampler(alpha=1.0, eps=0.0), remover=REMOVERS[mode]())
    present: list[tuple[int, float]] = []
    next_id = 1
    for op in ops:
        if op[0] == "add":
            priorities = op[1]
            ids = buffer.add({"x": np.zeros(len(priorities))}, priorities=priorities).ids
            assert ids.tolist() == list(range(next_id, next_id + len(priorities)))
            model_add(present, list(zip(ids.tolist(), priorities, strict=True)), capacity, mode)
            next_id += len(priorities)
        else:
            _, item, priority = op
            buffer.update_priority([item], [priority])
            present = [(i, priority if i == item else p) for i, p in present]
        assert present_ids(buffer) == sorted(i for i, _ in present)
        assert len(buffer) == len(present) <= capacity


def test_lifo_keeps_the_first_items_and_the_newest(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, remover=LifoRemover())
    buffer.add({"x": np.arange(6.0)})
    # 1, 2, 3 enter; each later item replaces the one that entered just before it
    assert present_ids(buffer) == [1, 2, 6]
    assert buffer.stats()["evicted"] == 3


def test_fifo_remover_is_the_default_eviction(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=2, remover=FifoRemover())
    buffer.add({"x": np.arange(5.0)})
    assert present_ids(buffer) == [4, 5]
    assert client.hget(buffer.keys.meta, "eviction") == b"fifo"


def removal_counts(client, name, remover, priorities, trials, seed):
    """How often each of the first items is the one removed by one more insert."""
    counts = np.zeros(len(priorities), dtype=np.int64)
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        client.flushall()
        buffer = ReplayBuffer(client, f"{name}-{trial}", capacity=len(priorities),
                              sampler=PERSampler(alpha=1.0, eps=0.0), remover=remover,
                              seed=int(rng.integers(2**32)))
        buffer.add({"x": np.zeros(len(priorities))}, priorities=priorities)
        buffer.add({"x": np.zeros(1)}, priorities=[1.0])
        left = set(present_ids(buffer))
        gone = [i for i in range(1, len(priorities) + 1) if i not in left]
        assert len(gone) == 1 and len(left) == len(priorities)
        counts[gone[0] - 1] += 1
    return counts


def chi_square_ok(counts: np.ndarray, probabilities: np.ndarray) -> bool:
    expected = probabilities * counts.sum()
    statistic = float((((counts - expected) ** 2) / expected).sum())
    # 99.9% quantile of chi-square with 3 degrees of freedom
    return statistic < 16.27


def test_prioritized_remover_removes_by_priority_power(fake_client, buffer_name):
    priorities = [1.0, 2.0, 3.0, 4.0]
    counts = removal_counts(fake_client, buffer_name, PrioritizedRemover(2.0), priorities,
                            trials=600, seed=3)
    law = np.array(priorities) ** 2 / np.sum(np.array(priorities) ** 2)
    assert chi_square_ok(counts, law), counts


def test_prioritized_remover_never_removes_a_zero_priority(fake_client, buffer_name):
    counts = removal_counts(fake_client, buffer_name, PrioritizedRemover(1.0),
                            [0.0, 1.0, 0.0, 1.0], trials=60, seed=4)
    assert counts[0] == counts[2] == 0 and counts.sum() == 60


def test_prioritized_remover_scans_when_the_running_max_is_far_above(fake_client,
                                                                        buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=3, seed=1,
                          sampler=PERSampler(alpha=1.0, eps=0.0),
                          remover=PrioritizedRemover(1.0))
    buffer.add({"x": np.zeros(3)}, priorities=[1e300, 1.0, 1.0])
    buffer.update_priority([1], [0.0])  # per_max stays 1e300: rejection cannot accept
    buffer.add({"x": np.zeros(1)}, priorities=[1.0])
    left = present_ids(buffer)
    assert 1 in left and len(left) == 3


def test_uniform_remover_is_uniform(fake_client, buffer_name):
    counts = removal_counts(fake_client, buffer_name, UniformRemover(), [5.0, 1.0, 0.0, 2.0],
                            trials=600, seed=5)
    assert chi_square_ok(counts, np.full(4, 0.25)), counts


def test_heap_remover_needs_per_priorities(client, buffer_name):
    with pytest.raises(ConfigMismatchError, match="PER priority"):
        ReplayBuffer(client, buffer_name, capacity=4, sampler=UniformSampler(),
                     remover=MinHeapRemover())


def test_remover_is_fixed_at_creation(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=4, remover=LifoRemover())
    with pytest.raises(ConfigMismatchError, match="remover mismatch"):
        ReplayBuffer(client, buffer_name, capacity=4, remover=FifoRemover())
    opened = ReplayBuffer.open(client, buffer_name)
    assert opened.remover == LifoRemover()


def test_remover_and_prioritized_capacity_exclude_each_other(client, buffer_name):
    with pytest.raises(ValueError, match="give one"):
        ReplayBuffer(client, buffer_name, capacity=4, prioritized_capacity=True,
                     remover=LifoRemover())


@pytest.mark.parametrize("remover", [PrioritizedRemover(1.0), MinHeapRemover()], ids=repr)
def test_a_load_keeps_the_heap_a_remover_by_priority_reads(client, buffer_name, tmp_path,
                                                           remover):
    # the server keeps no per-item priority but the heap: a load swaps in a whole one
    # (filled from the file's priorities), so the first add after it, by any process,
    # removes by the loaded priorities
    source = ReplayBuffer(client, buffer_name, capacity=4, seed=2,
                          sampler=PERSampler(alpha=1.0, eps=0.0), remover=remover)
    source.add({"x": np.zeros(4)}, priorities=[0.0, 3.0, 0.0, 2.0])
    source.save(tmp_path / "saved.rb")
    source.update_priority([2, 4], [0.0, 0.0])  # the load brings the saved ones back
    source.load(tmp_path / "saved.rb")
    assert client.hget(source.keys.meta, "per_heap") == b"1"
    loaded = present_ids(source)  # a load gives the items new ids, in the saved order
    assert source.priorities(loaded).tolist() == [0.0, 3.0, 0.0, 2.0]
    new = source.add({"x": np.zeros(1)}, priorities=[5.0]).ids.tolist()
    left = present_ids(source)
    if isinstance(remover, MinHeapRemover):  # the oldest of the two lowest
        assert left == [*loaded[1:], *new]
    else:  # never a zero priority: the second or the fourth, by 3 : 2
        assert {loaded[0], loaded[2], *new} <= set(left) and len(left) == 4


def test_an_add_without_the_heap_its_remover_reads_writes_nothing(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=2,
                          sampler=PERSampler(alpha=1.0, eps=0.0), remover=MaxHeapRemover())
    buffer.add({"x": np.zeros(2)}, priorities=[1.0, 2.0])
    client.hdel(buffer.keys.meta, "per_heap")  # as a buffer whose heap was lost
    before = key_contents(client, buffer.keys.all_keys())
    with pytest.raises(HeapNotBuiltError, match="open the buffer with its remover"):
        buffer.add({"x": np.zeros(1)}, priorities=[3.0])
    assert key_contents(client, buffer.keys.all_keys()) == before
    reopened = ReplayBuffer(client, buffer_name, capacity=2,
                            sampler=PERSampler(alpha=1.0, eps=0.0), remover=MaxHeapRemover())
    reopened.add({"x": np.zeros(1)}, priorities=[3.0])  # the open built the heap again
    assert present_ids(reopened) == [1, 3]
