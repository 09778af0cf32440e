"""Deletes by id (ReplayBuffer.remove, Reverb's mutate_priorities deletes), Reverb's
successive selections (FifoSampler(successive=True), ...) and the count of items
sampled at least once (Reverb's num_unique_samples)."""

from __future__ import annotations

import numpy as np
import pytest

from redisbuf import (
    FifoSampler,
    LifoSampler,
    MaxHeapSampler,
    MinHeapSampler,
    PERSampler,
    ReplayBuffer,
)


def test_remove_deletes_from_every_structure(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(), seed=0)
    buffer.add({"x": np.arange(5.0)}, priorities=[1.0, 2.0, 3.0, 4.0, 5.0])
    buffer.sample(8)
    assert buffer.remove(np.array([2, 4, 4, 77])) == 2
    assert len(buffer) == 3
    for key in (buffer.keys.items, buffer.keys.per, buffer.keys.uses):
        assert not client.hexists(key, b"%012d" % 2) and not client.hexists(key, b"%012d" % 4)
    assert sorted(set(buffer.sample(50)["x"].tolist())) == [0.0, 2.0, 4.0]
    stats = buffer.stats()
    assert stats["deleted"] == 2 and stats["priority_mean"] == pytest.approx(3.0)
    assert buffer.remove([2]) == 0 and buffer.remove([]) == 0


def test_remove_refuses_ids_that_are_not_positive_integers(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add({"x": np.arange(2.0)})
    with pytest.raises(ValueError, match="positive integers"):
        buffer.remove([0])
    with pytest.raises(ValueError, match="positive integers"):
        buffer.remove([1.5])
    assert len(buffer) == 2


def test_remove_of_many_ids_in_slices(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=5000)
    for start in range(0, 4500, 900):
        buffer.add({"x": np.arange(start, start + 900.0)})
    assert buffer.remove(np.arange(1, 4001)) == 4000
    assert len(buffer) == 500


@pytest.mark.parametrize("sampler, first", [
    (FifoSampler(successive=True), 0.0), (LifoSampler(successive=True), 3.0),
    (MaxHeapSampler(by="priority", successive=True), 2.0),
    (MinHeapSampler(by="priority", successive=True), 1.0),
])
def test_successive_selections_repeat_the_first_item_without_max_use(client, buffer_name,
                                                                      sampler, first):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    buffer.add({"x": np.arange(4.0)}, priorities=[2.0, 0.5, 9.0, 3.0])
    buffer.sampler = sampler
    sampler.prepare(buffer.view)
    assert buffer.sample(3)["x"].tolist() == [first] * 3
    assert len(buffer) == 4


def test_successive_selections_use_each_item_up_to_max_use(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, max_use=2,
                          sampler=FifoSampler(successive=True))
    buffer.add({"x": np.arange(3.0)})
    assert buffer.sample(3)["x"].tolist() == [0.0, 0.0, 1.0]
    assert len(buffer) == 2  # item 0 used up
    # item 1 has one use left, item 2 two: five selections asked, three left
    assert buffer.sample(5)["x"].tolist() == [1.0, 2.0, 2.0]
    assert len(buffer) == 0


def test_plain_selections_are_unchanged(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=FifoSampler())
    buffer.add({"x": np.arange(3.0)})
    assert buffer.sample(4)["x"].tolist() == [0.0, 1.0, 2.0, 0.0]


def test_items_sampled_at_least_once_are_counted(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=FifoSampler(), max_use=3)
    buffer.add({"x": np.arange(4.0)})
    buffer.sample(2)
    buffer.sample(3)  # items 1, 2 again, and 3 for the first time
    assert buffer.stats()["sampled_unique"] == 3
    buffer.clear()
    assert buffer.stats()["sampled_unique"] == 0


def test_a_first_draw_taken_back_is_no_longer_counted_unique(client, buffer_name):
    from redisbuf.store.keys import format_id

    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=FifoSampler())
    buffer.add({"x": np.arange(3.0)})
    buffer.sample(1)  # item 1
    buffer.sample(2)  # items 1 and 2: 2 is new
    buffer.sample(2)  # both again
    assert buffer.stats()["sampled_unique"] == 2
    keys = buffer.keys.all_keys()
    # a sampler takes back draws (as after blobs read as gone): one of 1, both of 2
    buffer._run("undo_draws", keys, [format_id(1), format_id(2), format_id(2)])
    assert buffer.stats()["sampled_unique"] == 1  # 1 keeps two draws; 2 has none now
    buffer.sample(2)
    assert buffer.stats()["sampled_unique"] == 2


def test_a_selection_that_asks_the_limiter_counts_what_it_takes(client, buffer_name):
    from redisbuf.errors import RateLimitTimeoutError, WaitTimeoutError
    from redisbuf.limiters import Queue

    queue = ReplayBuffer(client, buffer_name, capacity=3, max_use=1,
                         sampler=FifoSampler(successive=True, admits=True),
                         rate_limiter=Queue(3, timeout=0))
    with pytest.raises(RateLimitTimeoutError):
        queue.sample(1)
    queue.add({"x": np.arange(2.0)})
    assert queue.sample(5)["x"].tolist() == [0.0, 1.0]  # two admitted: two taken, counted
    assert [int(v) for v in client.hmget(queue.keys.meta, "rl_inserts", "rl_samples")] == [2, 2]
    queue.add({"x": np.array([2.0])})
    assert queue.sample(3, block=True, timeout=5)["x"].tolist() == [2.0]
    with pytest.raises(WaitTimeoutError, match="drawable items"):
        queue.sample(1, block=True, timeout=0.2)  # empty: it waits for an item
    with pytest.raises(ValueError, match="successive"):
        FifoSampler(admits=True)
