"""+inf log-rewards (accepted wherever their meaning is defined, refused by name where a
softmax is not) and EmptyBufferError's two bases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_bad_input import snapshot
from test_sampling import assert_matches_softmax, assert_tree_consistent, priorities

from redisbuf import ReplayBuffer, States, Trajectories, Transitions
from redisbuf.errors import EmptyBufferError, SamplingError

INF = math.inf


def _items(rewards, start: int = 0) -> dict:
    rewards = np.asarray(rewards, dtype=np.float64)
    return {"v": np.arange(start, start + len(rewards)), "log_rewards": rewards}


def test_empty_buffer_error_is_a_lookup_error_and_a_value_error(client, buffer_name):
    assert issubclass(EmptyBufferError, LookupError)
    assert issubclass(EmptyBufferError, ValueError)
    for prioritized in (False, True):
        buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_sampling=prioritized)
        with pytest.raises(ValueError, match="buffer is empty"):  # what torchgfn code catches
            buffer.sample(1)
        with pytest.raises(LookupError, match="buffer is empty"):
            buffer.sample(1)


def test_fifo_buffer_stores_plus_inf_and_evicts_it_by_age(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    buffer.add(_items([INF, 0.0, -INF]))
    assert buffer.get([1])["log_rewards"].tolist() == [INF]
    assert buffer.top(1) == [(1, INF)]
    buffer.add(_items([1.0], start=3))
    assert sorted(priorities(client, buffer_name)) == [2, 3, 4]  # the oldest, +inf, went


def test_reward_eviction_keeps_plus_inf_items_first(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_capacity=True)
    buffer.add(_items([INF, 0.0, 5.0]))
    buffer.add(_items([7.0, INF, 1e300], start=3))
    assert priorities(client, buffer_name) == {1: INF, 5: INF, 6: 1e300}
    buffer.add(_items([INF, INF], start=6))  # among equals the oldest goes first
    assert priorities(client, buffer_name) == {5: INF, 7: INF, 8: INF}


def test_uniform_sampling_draws_plus_inf_items(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, seed=1)
    buffer.add(_items([INF, INF, 0.0]))
    assert sorted(buffer.sample(3)["v"].tolist()) == [0, 1, 2]
    assert len(buffer.sample(10, replacement=True)["v"]) == 10


def test_every_container_kind_accepts_plus_inf(client, buffer_name):
    rewards = np.array([INF, 0.0])
    batches = [
        States(np.zeros((2, 3), np.float32), log_rewards=rewards),
        Transitions(
            np.zeros((2, 3)), np.ones((2, 3)), np.zeros((2, 1)), np.ones(2, bool), rewards
        ),
        Trajectories(np.zeros((3, 2, 3)), np.zeros((2, 2, 1)), np.array([2, 1]), rewards),
    ]
    for index, batch in enumerate(batches):
        buffer = ReplayBuffer(client, f"{buffer_name}-{index}", capacity=4)
        buffer.add(batch)
        assert buffer.get([1, 2]).log_rewards.tolist() == [INF, 0.0]


def test_prioritized_sampling_refuses_plus_inf_by_name_and_writes_nothing(client, buffer_name):
    buffer = ReplayBuffer(
        client, buffer_name, capacity=4, prioritized_sampling=True, seed=2
    )
    buffer.add(_items([0.0, 1.0, 2.0]))
    buffer.add(_items([INF], start=3))
    assert_tree_consistent(client, buffer_name)
    before = snapshot(client, buffer_name)
    for n, replacement in ((2, None), (10, None), (2, True)):
        with pytest.raises(SamplingError, match=r"1 item\(s\) have log-reward \+inf") as info:
            buffer.sample(n, replacement=replacement)
        assert isinstance(info.value, ValueError)
        assert snapshot(client, buffer_name) == before
    # once the +inf item is evicted (FIFO), the softmax is defined again
    buffer.add(_items([0.5, -1.0, 3.0, 0.0], start=4))
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, buffer)


def test_tree_stays_consistent_when_plus_inf_items_come_and_go(client, buffer_name):
    buffer = ReplayBuffer(
        client, buffer_name, capacity=5, prioritized_capacity=True, prioritized_sampling=True,
        seed=3,
    )
    for start, rewards in enumerate(
        ([INF], [0.0, -INF, INF], [400.0, 1.0], [INF, INF], [-400.0])
    ):
        buffer.add(_items(rewards, start=10 * start))
        assert_tree_consistent(client, buffer_name)
    assert sorted(priorities(client, buffer_name).values()) == [400.0, INF, INF, INF, INF]
    buffer.clear()
    buffer.add(_items([1.0, 2.0]))
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, buffer, draws=5000)
