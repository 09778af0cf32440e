"""sample_range (DI-engine) and recent data (ALF): which items can be drawn follows an
in-memory model of the insertion order after every step; how often is checked
statistically."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.errors import EmptyBufferError

PROPERTY = settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
BOUND = st.one_of(st.none(), st.integers(-9, 9))
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.lists(st.sampled_from([-1.0, 0.0, 1.0]), min_size=1,
                                            max_size=4)),
        st.tuples(
            st.just("sample"), BOUND, BOUND,
            st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0)),
            st.integers(1, 8), st.booleans(),
        ),
    ),
    min_size=1,
    max_size=14,
)


def chi2_limit(df: int, z: float = 5.0) -> float:
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def items(values):
    return {"x": np.zeros((len(values), 1), np.float32), "log_rewards": np.array(values)}


@PROPERTY
@given(ops=OPS, prioritized_capacity=st.booleans())
def test_sample_range_draws_only_the_slice(client, buffer_name, ops, prioritized_capacity):
    client.flushall()
    capacity = 7
    buffer = ReplayBuffer(client, buffer_name, capacity=capacity,
                          prioritized_capacity=prioritized_capacity, seed=0)
    order: list[int] = []
    rewards: dict[int, float] = {}
    for op in ops:
        if op[0] == "add":
            ids = buffer.add(items(op[1])).ids.tolist()
            order += ids
            rewards.update(zip(ids, op[1], strict=True))
            excess = len(order) - capacity
            if excess > 0:
                victims = (sorted(order, key=lambda i: (rewards[i], i)) if prioritized_capacity
                           else order)[:excess]
                order = [i for i in order if i not in victims]
            continue
        _, start, stop, step, n, replacement = op
        window = order[slice(start, stop, step)]
        if not window:
            with pytest.raises(EmptyBufferError, match="sample_range"):
                buffer.sample(n, sample_range=slice(start, stop, step))
            continue
        drawn = buffer.sample_with_info(
            n, replacement=replacement, sample_range=slice(start, stop, step)
        ).ids.tolist()
        assert len(drawn) == n and set(drawn) <= set(window)
        if not replacement and n <= len(window):
            assert len(set(drawn)) == n
        if not replacement and n == len(window):
            assert sorted(drawn) == sorted(window)


def test_sample_range_is_uniform_over_the_slice(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=100, sampler=PERSampler(), seed=4)
    ids = buffer.add(items([0.0] * 40)).ids
    buffer.update_priority(ids, np.arange(40) * 10.0)  # PER would favour the newest
    window = ids[slice(-30, None, 3)].tolist()  # ten items
    counts = dict.fromkeys(window, 0)
    for _ in range(100):
        for item_id in buffer.sample_with_info(50, sample_range=slice(-30, None, 3)).ids:
            counts[int(item_id)] += 1
    observed = np.array(list(counts.values()), dtype=float)
    expected = 5000 / 10
    assert ((observed - expected) ** 2 / expected).sum() < chi2_limit(9)


def test_recent_data_ratio_takes_its_share_from_the_newest(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=200, recent_data_ratio=0.3,
                          recent_data_steps=10, seed=5)
    ids = buffer.add(items([0.0] * 100)).ids
    newest = set(ids[-10:].tolist())
    recent_counts = dict.fromkeys(sorted(newest), 0)
    in_newest = total = 0
    for _ in range(400):
        drawn = buffer.sample_with_info(10).ids.tolist()  # ceil(3.0) = 3 recent draws
        assert set(drawn[:3]) <= newest and len(set(drawn[:3])) == 3
        for item_id in drawn[:3]:
            recent_counts[item_id] += 1
        in_newest += sum(i in newest for i in drawn[3:])
        total += 7
    observed = np.array(list(recent_counts.values()), dtype=float)
    assert ((observed - 120) ** 2 / 120).sum() < chi2_limit(9)
    # the other 7 are uniform over all 100: 10% of them from the newest ten
    p = 0.1
    assert abs(in_newest / total - p) < 5 * math.sqrt(p * (1 - p) / total)
    info = buffer.sample_with_info(1)  # ceil(0.3) = 1: all recent
    assert info.probabilities is None and int(info.ids[0]) in newest


def test_recent_data_with_per_keeps_the_per_part(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=50, sampler=PERSampler(eps=0.0),
                          recent_data_ratio=0.5, recent_data_steps=2, seed=6)
    ids = buffer.add(items([0.0] * 20)).ids
    buffer.update_priority(ids, [0.0] * 19 + [1.0])  # PER draws only the first and last
    buffer.update_priority(ids[:1], [1.0])
    drawn = buffer.sample_with_info(6).ids.tolist()
    assert set(drawn[:3]) <= set(ids[-2:].tolist())
    assert set(drawn[3:]) <= {int(ids[0]), int(ids[-1])}


@pytest.mark.parametrize(
    "bad, word",
    [(slice(0, 5, 0), "zero"), (slice(0.5, None), "integer"), ([0, 5], "slice"),
     (slice("a", None), "integer")],
)
def test_bad_sample_ranges_are_refused(client, buffer_name, bad, word):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(items([0.0]))
    with pytest.raises(ValueError, match=word):
        buffer.sample(1, sample_range=bad)


@pytest.mark.parametrize(
    "kwargs, word",
    [({"recent_data_ratio": 1.5}, "recent_data_ratio"),
     ({"recent_data_ratio": -0.1}, "recent_data_ratio"),
     ({"recent_data_steps": 0}, "recent_data_steps"),
     ({"recent_data_steps": 2.5}, "recent_data_steps")],
)
def test_bad_recent_settings_are_refused(client, buffer_name, kwargs, word):
    with pytest.raises(ValueError, match=word):
        ReplayBuffer(client, buffer_name, capacity=5, **kwargs)
