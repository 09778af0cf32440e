"""Reverb's rate-limiter arithmetic an item at a time (acquire_upto, can), and the Queue
and Stack limiters, against a transcription of Reverb's C++ RateLimiter (its
CanInsert / CanSample with inserts, samples and the table's size)."""

from __future__ import annotations

import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf import FifoSampler, ReplayBuffer
from redisbuf.errors import RateLimitTimeoutError
from redisbuf.limiters import MinSize, Queue, RateLimiter, SampleToInsertRatio, Stack
from redisbuf.sampling import limiters

PROPERTY = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


class ReverbLimiter:
    """rate_limiter.cc: size is inserts - deletes (here: the items stored)."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.spi = limiter.samples_per_insert
        self.min_size = limiter.min_size_to_sample
        self.min_diff, self.max_diff = limiter.min_diff, limiter.max_diff
        self.inserts = self.samples = self.size = 0

    def can_insert(self, n: int) -> bool:
        if self.size + n <= self.min_size:
            return True
        return (n + self.inserts) * self.spi - self.samples <= self.max_diff

    def can_sample(self, n: int) -> bool:
        if self.size < self.min_size:
            return False
        return self.inserts * self.spi - self.samples - n >= self.min_diff

    def insert_one_by_one(self, n: int) -> int:
        done = 0
        while done < n and self.can_insert(1):
            self.inserts += 1
            self.size += 1
            done += 1
        return done

    def sample_one_by_one(self, n: int) -> int:
        done = 0
        while done < n and self.can_sample(1):
            self.samples += 1
            done += 1
        return done


LIMITERS = st.one_of(
    st.builds(MinSize, st.integers(1, 4)),
    st.builds(Queue, st.integers(1, 5)),
    st.builds(lambda spi, size, buffer: SampleToInsertRatio(spi, size, buffer),
              st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.integers(1, 4),
              st.sampled_from([6.0, 8.0, 13.5])),
    st.builds(lambda lo, width: RateLimiter(1.5, 2, lo, lo + width),
              st.sampled_from([-3.0, 0.0, 2.0]), st.sampled_from([3.0, 7.0])),
)


def admitted(buffer: ReplayBuffer, side: str, n: int) -> int:
    try:
        return limiters.acquire_upto(buffer.view, buffer.rate_limiter, side, n, timeout=0)
    except RateLimitTimeoutError:
        return 0


@PROPERTY
@given(limiter=LIMITERS,
       ops=st.lists(st.tuples(st.sampled_from(["insert", "sample", "can_insert",
                                               "can_sample"]), st.integers(1, 7)),
                    min_size=1, max_size=16))
def test_one_item_at_a_time_as_reverbs_rate_limiter(client, buffer_name, limiter, ops):
    client.flushall()
    buffer = ReplayBuffer(client, buffer_name, capacity=1000, rate_limiter=limiter)
    writer = ReplayBuffer.open(client, buffer_name)
    writer.rate_limiter = None  # its adds were admitted by acquire_upto already
    model = ReverbLimiter(limiter)
    for op, n in ops:
        if op == "insert":
            k = admitted(buffer, "insert", n)
            assert k == model.insert_one_by_one(n)
            if k:
                writer.add({"x": np.zeros(k)})
        elif op == "sample":
            assert admitted(buffer, "sample", n) == model.sample_one_by_one(n)
        elif op == "can_insert":
            assert limiters.can(buffer.view, "insert", n) == model.can_insert(n)
        else:
            assert limiters.can(buffer.view, "sample", n) == model.can_sample(n)
    stats = client.hmget(buffer.keys.meta, "rl_inserts", "rl_samples")
    assert [int(v or 0) for v in stats] == [model.inserts, model.samples]


def test_queue_is_a_bounded_queue(client, buffer_name):
    queue = ReplayBuffer(client, buffer_name, capacity=2, sampler=FifoSampler(), max_use=1,
                         rate_limiter=Queue(2, timeout=0))
    with pytest.raises(RateLimitTimeoutError, match="inserts"):
        queue.sample(1)  # empty: the sample waits for an insert
    queue.add({"x": np.array([1.0])})
    queue.add({"x": np.array([2.0])})
    with pytest.raises(RateLimitTimeoutError, match="samplers to catch up"):
        queue.add({"x": np.array([3.0])})  # full: the insert waits for a sample
    assert queue.sample(1)["x"].tolist() == [1.0]
    queue.add({"x": np.array([3.0])})
    assert [queue.sample(1)["x"].tolist() for _ in range(2)] == [[2.0], [3.0]]
    assert len(queue) == 0


def test_stack_has_the_queues_numbers():
    assert Stack(7) == Queue(7) == RateLimiter(1.0, 1, 0.0, 7.0)


def test_can_is_true_without_a_limiter(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    assert limiters.can(buffer.view, "sample", 3) and limiters.can(buffer.view, "insert", 9)
    assert limiters.acquire_upto(buffer.view, MinSize(1), "insert", 5) == 5


def test_min_size_with_reverbs_float_bounds(client, buffer_name):
    big = sys.float_info.max
    buffer = ReplayBuffer(client, buffer_name, capacity=100,
                          rate_limiter=RateLimiter(1.0, 2, -big, big, timeout=0))
    assert admitted(buffer, "insert", 50) == 50
    assert limiters.can(buffer.view, "sample", 10**6) is False  # nothing stored yet
    ReplayBuffer.open(client, buffer_name).add({"x": np.zeros(2)})
    assert limiters.can(buffer.view, "sample", 10**6)


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_queue_size_must_be_a_positive_integer(size):
    with pytest.raises(ValueError, match="size"):
        Queue(size)
