"""Eviction against a plain Python reference model: FIFO keeps the newest ``capacity``
items; prioritized capacity evicts the lowest log-reward first, oldest first among equal
log-rewards, new items included."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass, field

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf import BufferKeys, ReplayBuffer
from redisbuf.store import bounds

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# few distinct values, so that ties (and -inf) are common
REWARDS = st.sampled_from([-math.inf, -3.0, -1.0, 0.0, 0.0, 0.5, 2.0, 7.25])


@dataclass
class Model:
    """What the buffer should hold: {id: log_reward} in insertion order."""

    capacity: int
    prioritized: bool
    items: dict[int, float] = field(default_factory=dict)
    last_id: int = 0
    inserted: int = 0
    evicted: int = 0

    def add(self, rewards: list[float]) -> tuple[list[int], int]:
        ids = list(range(self.last_id + 1, self.last_id + 1 + len(rewards)))
        self.last_id += len(rewards)
        self.items.update(zip(ids, rewards, strict=True))
        self.inserted += len(rewards)
        excess = len(self.items) - self.capacity
        if excess > 0:
            if self.prioritized:
                victims = sorted(self.items, key=lambda i: (self.items[i], i))[:excess]
            else:
                victims = sorted(self.items)[:excess]
            for victim in victims:
                del self.items[victim]
            self.evicted += excess
        return ids, max(excess, 0)

    def clear(self) -> int:
        removed = len(self.items)
        self.items.clear()
        self.inserted = self.evicted = 0
        return removed


def _state(client, name: str) -> tuple[list[int], dict[int, float], list[int]]:
    keys = BufferKeys(name)
    order = [int(m) for m in client.zrange(keys.order, 0, -1)]
    prio = {int(m): s for m, s in client.zrange(keys.prio, 0, -1, withscores=True)}
    blob_ids = sorted(int(k) for k in client.hkeys(keys.items))
    return order, prio, blob_ids


def _check(client, buffer: ReplayBuffer, model: Model) -> None:
    order, prio, blob_ids = _state(client, buffer.name)
    assert order == sorted(model.items)
    assert prio == model.items
    assert blob_ids == sorted(model.items)
    assert len(buffer) == len(model.items) <= model.capacity
    stats = buffer.stats()
    assert (stats["inserted"], stats["evicted"], stats["last_id"]) == (
        model.inserted,
        model.evicted,
        model.last_id,
    )


OPERATIONS = st.lists(
    st.one_of(
        st.lists(REWARDS, min_size=1, max_size=8).map(lambda r: ("add", r)),
        st.just(("clear", None)),
    ),
    min_size=1,
    max_size=12,
)


@PROPERTY
@given(
    capacity=st.integers(1, 6),
    prioritized=st.booleans(),
    operations=OPERATIONS,
)
def test_eviction_matches_reference_model(client, capacity, prioritized, operations):
    name = f"evict-{uuid.uuid4().hex[:8]}"
    buffer = ReplayBuffer(client, name, capacity=capacity, prioritized_capacity=prioritized)
    model = Model(capacity, prioritized)
    for op, rewards in operations:
        if op == "clear":
            assert buffer.clear() == model.clear()
        else:
            ids, evicted = model.add(rewards)
            result = buffer.add(
                {"v": np.array(ids, dtype=np.int64), "log_rewards": np.array(rewards)}
            )
            assert result.ids.tolist() == ids
            assert result.evicted == evicted
        _check(client, buffer, model)
    # the survivors' payloads are theirs
    if model.items:
        survivors = sorted(model.items)
        assert buffer.get(survivors)["v"].tolist() == survivors
    buffer.drop()


def test_fifo_evicts_oldest_first(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    buffer.add({"v": np.arange(3), "log_rewards": np.array([9.0, 9.0, 9.0])})
    result = buffer.add({"v": np.arange(3, 5), "log_rewards": np.array([-9.0, -9.0])})
    assert result.evicted == 2
    assert _state(client, buffer_name)[0] == [3, 4, 5]  # high rewards do not protect


def test_prioritized_capacity_evicts_lowest_reward_then_oldest(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_capacity=True)
    buffer.add({"v": np.arange(3), "log_rewards": np.array([1.0, 0.0, 0.0])})
    # ids 2 and 3 tie at 0.0: id 2 (older) goes first
    assert buffer.add({"v": np.array([3]), "log_rewards": np.array([0.5])}).evicted == 1
    assert _state(client, buffer_name)[0] == [1, 3, 4]
    # a new item below everything is evicted at once
    result = buffer.add({"v": np.array([4]), "log_rewards": np.array([-np.inf])})
    assert result.ids.tolist() == [5] and result.evicted == 1
    assert _state(client, buffer_name)[0] == [1, 3, 4]
    # a new item tying the minimum is newer, so the old one goes
    buffer.add({"v": np.array([5]), "log_rewards": np.array([0.0])})
    assert _state(client, buffer_name)[0] == [1, 4, 6]


def test_prioritized_capacity_keeps_the_best_of_a_large_batch(client, buffer_name):
    rng = np.random.default_rng(4)
    rewards = rng.normal(size=200)
    buffer = ReplayBuffer(client, buffer_name, capacity=20, prioritized_capacity=True)
    result = buffer.add({"v": np.arange(200), "log_rewards": rewards})
    assert result.evicted == 180
    kept = sorted(int(i) for i, _ in buffer.top(100))
    assert kept == sorted((np.argsort(rewards)[-20:] + 1).tolist())


def test_large_removals_cross_the_lua_unpack_limit(client, buffer_name):
    # more than ~8000 values per command fails in Lua's unpack(): the scripts chunk. One
    # add is bounded (1024 items), so the large change is a removal of 9000 stale items
    _large_removal(client, buffer_name, prioritized=True)


@pytest.mark.redis_server
def test_large_fifo_removals_cross_the_lua_unpack_limit(real_client, buffer_name):
    # (FIFO on the real server only: fakeredis' Lua takes seconds at this size)
    _large_removal(real_client, buffer_name, prioritized=False)


def _large_removal(client, buffer_name, prioritized):
    n = 9000
    buffer = ReplayBuffer(
        client, buffer_name, capacity=10_000, prioritized_capacity=prioritized,
        prioritized_sampling=True, max_staleness=0,
    )
    buffer.update_model_version("s", 0)
    rewards = np.linspace(-5, 5, n)
    for start in range(0, n, 1000):
        part = slice(start, start + 1000)
        buffer.add({"v": np.arange(n, dtype=np.int32)[part], "log_rewards": rewards[part]},
                   model_version=0)
    assert len(buffer) == n
    # every item is stale now: removed in commands of at most the add bound
    assert buffer.update_model_version("s", 1) == n
    assert len(buffer) == 0 and buffer.stats()["stale_removed"] == n
    keys = BufferKeys(buffer_name)
    assert client.hlen(keys.items) == client.zcard(keys.prio) == client.zcard(keys.times) == 0
    calls = -(-n // bounds.MAX_ADD_ITEMS)
    entries = client.lrange(keys.masslog, -calls, -1)  # one log entry per command
    counts = [int(entry.split(b"|")[1]) for entry in entries]
    assert sum(counts) == n and max(counts) == bounds.MAX_ADD_ITEMS
