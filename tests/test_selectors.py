"""Reverb's selectors (FIFO, LIFO, max-heap, min-heap) against an in-memory model: one
random sequence of adds, priority updates and selections, compared after every step."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from redisbuf import (
    FifoSampler,
    LifoSampler,
    MaxHeapSampler,
    MinHeapSampler,
    PERSampler,
    ReplayBuffer,
)
from redisbuf.errors import ConfigMismatchError, EmptyBufferError

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
SELECTORS = {
    "fifo": FifoSampler,
    "lifo": LifoSampler,
    "max": MaxHeapSampler,
    "min": MinHeapSampler,
}
REWARDS = st.sampled_from([-math.inf, -1.0, 0.0, 0.5, 2.0])

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(REWARDS, min_size=1, max_size=4)),
        st.tuples(
            st.just("update"),
            st.lists(st.integers(1, 30), min_size=1, max_size=5),
            st.sampled_from([0.0, 1.0, 3.0]),
        ),
        st.tuples(
            st.just("select"),
            st.sampled_from(sorted(SELECTORS)),
            st.sampled_from(["log_reward", "priority"]),
            st.integers(1, 9),
        ),
    ),
    min_size=1,
    max_size=14,
)


def expected(kind: str, order: list[int], score: dict[int, float], n: int) -> list[int]:
    if kind == "fifo":
        seq = order
    elif kind == "lifo":
        seq = order[::-1]
    elif kind == "max":
        seq = sorted(order, key=lambda i: (-score[i], i))
    else:
        seq = sorted(order, key=lambda i: (score[i], i))
    return [seq[k % len(seq)] for k in range(n)]


@PROPERTY
@given(ops=OPS, prioritized_capacity=st.booleans())
# a priority lowered after it was the highest: new items still get the highest ever set
@example(ops=[("add", [-math.inf]), ("update", [1], 3.0), ("update", [1], 1.0),
              ("add", [-math.inf]), ("select", "max", "priority", 1)],
         prioritized_capacity=False)
def test_selectors_follow_the_model(client, buffer_name, ops, prioritized_capacity):
    client.flushall()
    capacity = 5
    writer = ReplayBuffer(
        client, buffer_name, capacity=capacity, prioritized_capacity=prioritized_capacity,
        sampler=PERSampler(initial_priority=1.0),
    )
    order: list[int] = []
    rewards: dict[int, float] = {}
    per: dict[int, float] = {}
    # the running max new items get: the highest priority ever given, to a stored id or
    # not (an update is a log append; the server looks no id up: docs/sampling.md)
    top = 0.0
    for op in ops:
        if op[0] == "add":
            start = top
            ids = writer.add(
                {"x": np.zeros((len(op[1]), 1), np.float32), "log_rewards": np.array(op[1])}
            ).ids.tolist()
            for item_id, reward in zip(ids, op[1], strict=True):
                order.append(item_id)
                rewards[item_id] = reward
                per[item_id] = max(1.0, start)
            excess = len(order) - capacity
            if excess > 0:
                if prioritized_capacity:
                    victims = sorted(order, key=lambda i: (rewards[i], i))[:excess]
                else:
                    victims = order[:excess]
                for victim in victims:
                    order.remove(victim)
                    del rewards[victim], per[victim]
        elif op[0] == "update":
            writer.update_priority(op[1], [op[2]] * len(op[1]))
            top = max(top, op[2])
            for item_id in op[1]:
                if item_id in per:
                    per[item_id] = op[2]
        else:
            kind, by, n = op[1:]
            sampler = SELECTORS[kind]() if kind in ("fifo", "lifo") else SELECTORS[kind](by)
            reader = ReplayBuffer(client, buffer_name, capacity=capacity,
                                  prioritized_capacity=prioritized_capacity, sampler=sampler)
            if not order:
                with pytest.raises(EmptyBufferError):
                    reader.sample(n)
                continue
            info = reader.sample_with_info(n)
            score = per if by == "priority" else rewards
            assert info.ids.tolist() == expected(kind, order, score, n)
            assert info.batch["log_rewards"].tolist() == [rewards[i] for i in info.ids.tolist()]


def test_heap_by_priority_needs_per(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, sampler=MaxHeapSampler("priority"))
    buffer.add({"x": np.zeros((2, 1), np.float32)})
    with pytest.raises(ConfigMismatchError, match="PER"):
        buffer.sample(1)
    with pytest.raises(ValueError, match="by must be"):
        MinHeapSampler("reward")


def test_selections_count_as_draws(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, sampler=LifoSampler())
    buffer.add({"x": np.arange(3, dtype=np.float32)[:, None]})
    assert buffer.sample(2)["x"].ravel().tolist() == [2.0, 1.0]
    assert buffer.stats()["sampled"] == 2
