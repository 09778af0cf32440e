"""Rate limiters (redisbuf/sampling/limiters.py, lua/rate_limit.lua): Reverb's admission rule
checked against a reference model by hypothesis, timeouts that say who waited for what,
blocked sides woken by the other side, and several OS processes on a real server."""

from __future__ import annotations

import math
import threading
import traceback
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import fresh_context

from redisbuf import ReplayBuffer
from redisbuf.control.ipc import MessageQueue
from redisbuf.errors import ConfigMismatchError, RateLimitTimeoutError
from redisbuf.limiters import MinSize, RateLimiter, SampleToInsertRatio


def _batch(n: int) -> dict[str, np.ndarray]:
    return {"x": np.arange(n, dtype=np.int64)[:, None], "log_rewards": np.zeros(n)}


class Model:
    """Reverb's rule, written out: counters and size, one call of n items at a time."""

    def __init__(self, limiter: RateLimiter) -> None:
        self.limiter, self.inserts, self.samples, self.size = limiter, 0, 0, 0

    def diff(self) -> float:
        return self.inserts * self.limiter.samples_per_insert - self.samples

    def insert(self, n: int) -> bool:
        lim = self.limiter
        if self.size + 1 <= lim.min_size_to_sample or self.diff() + lim.samples_per_insert <= (
            lim.max_diff
        ):
            self.inserts += n
            self.size += n
            return True
        return False

    def sample(self, n: int) -> bool:
        lim = self.limiter
        if self.size >= lim.min_size_to_sample and self.diff() - 1 >= lim.min_diff:
            self.samples += n
            return True
        return False


limiter_strategy = st.one_of(
    st.builds(
        lambda spi, size, slack: SampleToInsertRatio(spi, size, max(1.0, spi) + slack, timeout=0),
        st.sampled_from([0.5, 1.0, 2.0, 3.0]), st.integers(1, 4), st.sampled_from([0, 0.5, 2, 5]),
    ),
    st.builds(lambda size: MinSize(size, timeout=0), st.integers(1, 4)),
)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(limiter=limiter_strategy,
       ops=st.lists(st.tuples(st.sampled_from(["insert", "sample"]), st.integers(1, 3)),
                    max_size=30))
def test_admission_matches_reverbs_rule(client, limiter, ops) -> None:
    buf = ReplayBuffer(client, f"rl-{uuid.uuid4().hex[:8]}", capacity=1000,
                       rate_limiter=limiter, seed=0)
    model = Model(limiter)
    for side, n in ops:
        expected = model.insert(n) if side == "insert" else model.sample(n)
        try:
            if side == "insert":
                buf.add(_batch(n))
            else:
                buf.sample(n)
            admitted = True
        except RateLimitTimeoutError as exc:
            admitted = False
            assert f"{side} of {n} items waited 0 s for" in str(exc)
        assert admitted == expected, (side, n, model.inserts, model.samples)
        meta = client.hmget(buf.keys.meta, "rl_inserts", "rl_samples")
        assert [int(v or 0) for v in meta] == [model.inserts, model.samples]
        assert len(buf) == model.size
    buf.drop()


def test_messages_say_which_side_waited_for_what(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=100,
                       rate_limiter=SampleToInsertRatio(1.0, 2, 1.0, timeout=0.05))
    with pytest.raises(RateLimitTimeoutError, match="sample of 1 items waited 0.05 s for inserts: "
                       "the buffer holds 0 items, below min_size_to_sample=2"):
        buf.sample(1)
    buf.add(_batch(1))
    buf.add(_batch(1))
    buf.add(_batch(1))  # size 2 -> 3: diff 3 = max_diff (2 + 1)
    with pytest.raises(RateLimitTimeoutError, match="insert of 1 items waited 0.05 s for "
                       "samplers to catch up: .* = 4, above max_diff=3") as info:
        buf.add(_batch(1))
    assert isinstance(info.value, TimeoutError)
    buf.sample(1)
    buf.sample(1)  # diff 1 = min_diff
    with pytest.raises(RateLimitTimeoutError, match="for inserts: one more sample .* = 0, "
                       "below min_diff=1"):
        buf.sample(1)


def test_a_blocked_inserter_wakes_when_a_sampler_catches_up(client, buffer_name) -> None:
    limiter = SampleToInsertRatio(1.0, 1, 1.0, timeout=30)
    inserter = ReplayBuffer(client, buffer_name, capacity=100, rate_limiter=limiter)
    sampler = ReplayBuffer(client, buffer_name, capacity=100, seed=0)  # adopts the limiter
    assert sampler.rate_limiter == RateLimiter(1.0, 1, 0.0, 2.0, 60.0)
    inserter.add(_batch(1))
    inserter.add(_batch(1))  # diff 2 = max_diff: the next insert must wait for a sample
    timer = threading.Timer(0.2, lambda: sampler.sample(1))
    timer.start()
    try:
        inserter.add(_batch(1))
    finally:
        timer.join()
    assert [int(v) for v in client.hmget(inserter.keys.meta, "rl_inserts", "rl_samples")] == [3, 1]


def test_blocking_sample_reports_the_limiter(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=100,
                       rate_limiter=SampleToInsertRatio(1.0, 1, 1.0, timeout=5))
    buf.add(_batch(3))  # one call of 3 counts 3 inserts: diff 3
    buf.sample(2)
    buf.sample(1)  # diff 0 = min_diff
    with pytest.raises(RateLimitTimeoutError, match="rate limiter held the sample back"):
        buf.sample(1, block=True, timeout=0.1)


def test_a_per_call_timeout_wins_over_the_limiters(client, buffer_name) -> None:
    # the limiter's own patience is 60 s: sample(timeout=...) must not wait that long
    buf = ReplayBuffer(client, buffer_name, capacity=100, rate_limiter=MinSize(5))
    buf.add(_batch(2))
    with pytest.raises(RateLimitTimeoutError, match="sample of 1 items waited 0.05 s for "
                       "inserts: the buffer holds 2 items, below min_size_to_sample=5"):
        buf.sample(1, timeout=0.05)
    with pytest.raises(RateLimitTimeoutError, match="waited 0.05 s"):
        buf.sample_with_info(1, timeout=0.05)
    assert client.hget(buf.keys.meta, "rl_samples") in (None, b"0")  # nothing counted


def test_a_blocking_sample_names_min_size_to_sample_when_that_holds_it(
    client, buffer_name
) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=100, rate_limiter=MinSize(5))
    buf.add(_batch(2))  # 2 >= n = 1 drawable items, but the limiter wants 5
    with pytest.raises(RateLimitTimeoutError, match="the buffer holds 2 items, below "
                       "min_size_to_sample=5") as info:
        buf.sample(1, block=True, timeout=0.05)
    assert "waited 0.05 s" in str(info.value)


def test_a_refused_or_failed_call_is_taken_back(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=100, max_staleness=0,
                       rate_limiter=MinSize(1, timeout=0))
    buf.update_model_version("s", 3)
    assert buf.add(_batch(2), model_version=1).rejected == "stale"
    with pytest.raises(ValueError):
        buf.add({"x": np.zeros((2, 1)), "log_rewards": np.array([0.0, np.nan])})
    assert client.hget(buf.keys.meta, "rl_inserts") in (None, b"0")


def test_the_limiter_is_fixed_at_creation(client, buffer_name) -> None:
    ReplayBuffer(client, buffer_name, capacity=10, rate_limiter=MinSize(3))
    with pytest.raises(ConfigMismatchError, match="rate limiter"):
        ReplayBuffer(client, buffer_name, capacity=10, rate_limiter=MinSize(4))
    assert ReplayBuffer(client, buffer_name, capacity=10).rate_limiter.min_size_to_sample == 3
    plain = f"{buffer_name}-b"
    ReplayBuffer(client, plain, capacity=10).add(_batch(1))
    with pytest.raises(ConfigMismatchError, match="fixed when the buffer is created"):
        ReplayBuffer(client, plain, capacity=10, rate_limiter=MinSize(3))


@pytest.mark.parametrize(
    "make, match",
    [(lambda: SampleToInsertRatio(0, 1, 1.0), "samples_per_insert"),
     (lambda: SampleToInsertRatio(2.0, 1, 1.5), "error_buffer"),
     (lambda: SampleToInsertRatio(1.0, 0, 2.0), "min_size_to_sample"),
     (lambda: SampleToInsertRatio(1.0, 1, (3.0, 1.0)), "min_diff"),
     (lambda: SampleToInsertRatio(3.0, 1, (0.0, 5.0)), "locked out"),
     (lambda: MinSize(1, timeout=-1), "timeout"),
     (lambda: RateLimiter(1.0, 1, math.nan, 1.0), "min_diff")],
)
def test_bad_limiters_are_refused(make, match) -> None:
    with pytest.raises(ValueError, match=match):
        make()


# -- several OS processes on a real server -------------------------------------------------

SPI, MIN_SIZE, ERROR = 1.0, 5, 3.0  # min_diff 2, max_diff 8
INSERTS, SAMPLES = 25, 22  # per process; two of each


def _worker(url: str, name: str, side: str, index: int, start, results) -> None:
    try:
        from redisbuf.sampling import limiters

        seen = []
        original = limiters.acquire

        def recording(*args, **kwargs):
            counters = original(*args, **kwargs)
            seen.append((args[2], *counters))
            return counters

        limiters.acquire = recording
        buf = ReplayBuffer(url, name, capacity=1000, seed=index)
        start.wait(timeout=60)
        for _ in range(INSERTS if side == "insert" else SAMPLES):
            if side == "insert":
                buf.add(_batch(1))
            else:
                buf.sample(1)
        results.put({"worker": index, "seen": seen})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"worker": index, "error": traceback.format_exc()})


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_the_ratio_holds_across_processes(redis_server, real_client, buffer_name) -> None:
    limiter = SampleToInsertRatio(SPI, MIN_SIZE, ERROR, timeout=60)
    ReplayBuffer(real_client, buffer_name, capacity=1000, rate_limiter=limiter)
    ctx = fresh_context()
    start, results = ctx.Barrier(4), MessageQueue(ctx)
    sides = ["insert", "insert", "sample", "sample"]
    procs = [ctx.Process(target=_worker,
                         args=(redis_server.url, buffer_name, side, i, start, results))
             for i, side in enumerate(sides)]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, errors[0]
    seen = [tuple(s) for r in reports for s in r["seen"]]
    assert len(seen) == 2 * INSERTS + 2 * SAMPLES
    for side, inserts, samples in seen:
        diff = inserts * SPI - samples  # right after this admission, for every process
        if side == "sample":
            assert diff >= limiter.min_diff
        else:  # below min size inserts are free (two inserters: one may be in flight)
            assert diff <= limiter.max_diff or inserts <= MIN_SIZE + 1
    counters = real_client.hmget(f"rb:{{{buffer_name}}}:meta", "rl_inserts", "rl_samples")
    assert [int(v) for v in counters] == [2 * INSERTS, 2 * SAMPLES]


def _one_at_a_time(url: str, name: str, count: int, results) -> None:
    try:
        buf = ReplayBuffer(url, name, capacity=1000)
        for _ in range(count):
            buf.add(_batch(1))
        results.put({"added": count})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"error": traceback.format_exc()})


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_a_blocking_batch_larger_than_the_limiter_lets_in_does_not_deadlock(
    redis_server, real_client, buffer_name
) -> None:
    """The rate-control example's limiter (max_diff 10) with two writer processes adding
    one item a call and a PER learner drawing 32 a call with ``block=True``: the learner
    waits for the limiter's min_size_to_sample, not for 32 items the limiter holds back
    until it samples (the review saw both sides wait for good after 5 inserts)."""
    from redisbuf import PERSampler

    limiter = SampleToInsertRatio(2, min_size_to_sample=3, error_buffer=4, timeout=60)
    learner = ReplayBuffer(real_client, buffer_name, capacity=1000, sampler=PERSampler(),
                           rate_limiter=limiter)
    ctx = fresh_context()
    results = MessageQueue(ctx)
    writers = [ctx.Process(target=_one_at_a_time, args=(redis_server.url, buffer_name, 15,
                                                        results)) for _ in range(2)]
    for writer in writers:
        writer.start()
    try:
        # the limiter admits a sample while inserts * 2 - samples - 1 >= 2 and an insert
        # while inserts * 2 - samples + 2 <= 10: two batches of 32 fit 30 inserts
        batches = [learner.sample(32, block=True, timeout=20) for _ in range(2)]
        reports = [results.get(timeout=60) for _ in writers]
    finally:
        for writer in writers:
            writer.join(timeout=30)
            if writer.is_alive():
                writer.kill()
    assert [r.get("error") for r in reports] == [None, None], reports
    assert all(len(batch["x"]) == 32 for batch in batches) and len(learner) == 30
