"""The manager's baselines (lua/baseline.lua) against numpy / torch references."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from redisbuf import ReplayBuffer
from redisbuf.control.manager import ReplayBufferManager
from redisbuf.errors import ConfigMismatchError, ControlTimeoutError


class _NoTransport:
    """Stands in for a control backend: these tests call the manager directly."""

    rank = 0

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        raise AssertionError("no message expected")

    def recv(self, source: int, tag: int, timeout: float | None) -> tuple[int, bytes]:
        raise ControlTimeoutError("nothing to receive")

    def check_peers(self, done: set[int]) -> None:
        return None

    def close(self) -> None:
        return None


def _random_log_rewards(rng: np.random.Generator, n: int, inf_fraction: float = 0.2) -> np.ndarray:
    values = rng.normal(0.0, 3.0, n)
    values[rng.random(n) < inf_fraction] = -np.inf
    return values


def _fill(buffer: ReplayBuffer, log_rewards: np.ndarray) -> None:
    states = np.arange(len(log_rewards), dtype=np.float32)[:, None]
    buffer.add({"x": states, "log_rewards": log_rewards})


def _manager(buffer: ReplayBuffer, **kwargs: object) -> ReplayBufferManager:
    return ReplayBufferManager(buffer, 0, 1, transport=_NoTransport(), **kwargs)


def _torch_quantile(values: np.ndarray, q: float) -> float:
    return float(torch.quantile(torch.from_numpy(values), q))


@pytest.mark.parametrize("seed", range(5))
def test_min_is_the_lowest_finite_log_reward_once_full(client, buffer_name, seed):
    rng = np.random.default_rng(seed)
    capacity = int(rng.integers(5, 300))
    # FIFO keeps -inf items in the buffer, so the baseline must skip them itself
    buffer = ReplayBuffer(client, buffer_name, capacity=capacity)
    data = _random_log_rewards(rng, capacity + int(rng.integers(0, 50)))
    _fill(buffer, data)
    kept = data[-capacity:]
    manager = _manager(buffer, baseline_strategy="min")
    baseline = manager.update_baseline(np.array([]))
    finite = kept[np.isfinite(kept)]
    assert manager.last_baseline_source == "buffer"
    assert baseline == finite.min()


@pytest.mark.parametrize("seed", range(6))
def test_percentile_matches_torch_quantile(client, buffer_name, seed):
    rng = np.random.default_rng(100 + seed)
    capacity = int(rng.integers(2, 400))
    buffer = ReplayBuffer(client, buffer_name, capacity=capacity)
    data = _random_log_rewards(rng, capacity)
    data[0] = 1.5  # at least one finite value
    _fill(buffer, data)
    finite = data[np.isfinite(data)]
    for q in (0.0, 1.0, 0.5, float(rng.random()), float(rng.random())):
        manager = _manager(buffer, baseline_strategy="percentile", baseline_percentile=q)
        baseline = manager.update_baseline(np.array([]))
        assert baseline == pytest.approx(_torch_quantile(finite, q), rel=1e-12, abs=1e-12)


def test_percentile_with_ties_and_one_finite_value(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=6)
    _fill(buffer, np.array([-np.inf, 2.0, -np.inf, -np.inf, -np.inf, -np.inf]))
    manager = _manager(buffer, baseline_strategy="percentile", baseline_percentile=0.7)
    assert manager.update_baseline(np.array([])) == 2.0


def _ema_reference(batches: list[np.ndarray], alpha: float) -> float | None:
    ema = None
    for batch in batches:
        finite = batch[np.isfinite(batch)]
        if finite.size:
            m = float(finite.min())
            ema = m if ema is None else alpha * m + (1 - alpha) * ema
    return ema


@pytest.mark.parametrize("seed", range(4))
def test_ema_follows_batch_minima_and_skips_non_finite(client, buffer_name, seed):
    rng = np.random.default_rng(200 + seed)
    alpha = float(rng.uniform(0.01, 1.0))
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    manager = _manager(buffer, baseline_strategy="ema", baseline_ema_alpha=alpha)
    batches = [_random_log_rewards(rng, int(rng.integers(1, 20)), 0.3) for _ in range(30)]
    batches.insert(3, np.full(4, -np.inf))  # a batch with nothing finite leaves the EMA alone
    for i, batch in enumerate(batches):
        got = manager.update_baseline(batch)
        want = _ema_reference(batches[: i + 1], alpha)
        if want is None:
            assert got is None
        else:
            assert got == pytest.approx(want, rel=1e-12)
            assert manager.last_baseline_source == "ema"
    stored = float(client.hget(buffer.keys.meta, "baseline_ema"))
    assert stored == pytest.approx(_ema_reference(batches, alpha), rel=1e-12)


@pytest.mark.parametrize("strategy", ["min", "percentile"])
def test_buffer_strategies_fall_back_to_the_ema(client, buffer_name, strategy):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    manager = _manager(buffer, baseline_strategy=strategy, baseline_ema_alpha=0.5)
    assert manager.update_baseline(np.array([-np.inf])) is None  # nothing finite yet
    _fill(buffer, np.arange(5.0))  # not full: the EMA answers
    assert manager.update_baseline(np.array([3.0, -np.inf, 1.0])) == 1.0
    assert manager.last_baseline_source == "ema"
    assert manager.update_baseline(np.array([3.0])) == 2.0
    _fill(buffer, np.full(5, -np.inf))  # full, but one half is -inf
    assert manager.update_baseline(np.array([])) == (0.0 if strategy == "min" else 0.4)
    assert manager.last_baseline_source == "buffer"


def test_full_buffer_of_only_minus_inf_answers_the_ema(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    _fill(buffer, np.full(4, -np.inf))
    manager = _manager(buffer, baseline_strategy="min")
    assert manager.update_baseline(np.array([-np.inf])) is None
    assert manager.update_baseline(np.array([-3.0])) == -3.0
    assert manager.last_baseline_source == "ema"


def test_store_locally_false_always_uses_the_ema(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    _fill(buffer, np.array([1.0, 2.0, 3.0, 4.0]))
    manager = _manager(buffer, baseline_strategy="min", store_locally=False)
    assert manager.update_baseline(np.array([7.0])) == 7.0
    assert manager.last_baseline_source == "ema"


def test_a_new_manager_starts_a_fresh_ema(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    _manager(buffer, baseline_strategy="ema").update_baseline(np.array([5.0]))
    assert _manager(buffer, baseline_strategy="ema").update_baseline(np.array([1.0])) == 1.0


def test_baseline_reads_two_order_statistics_by_rank(real_client, buffer_name):
    buffer = ReplayBuffer(real_client, buffer_name, capacity=20000, prioritized_capacity=True)
    for start in range(0, 20000, 1000):
        _fill(buffer, np.linspace(start, start + 1, 1000))
    manager = _manager(buffer, baseline_strategy="percentile", baseline_percentile=0.25)
    real_client.config_resetstat()
    manager.update_baseline(np.array([1.0]))
    stats = real_client.info("commandstats")
    called = {name.removeprefix("cmdstat_") for name in stats}
    # O(log n) commands only: no ZRANGE over everything, no ZRANGEBYSCORE / ZSCAN
    assert called <= {"fcall", "evalsha", "eval", "script|load", "hmget", "hset", "zcard",
                      "zcount", "zrange", "config|resetstat"}
    assert stats["cmdstat_zrange"]["calls"] == 2  # the two order statistics around q


@pytest.mark.parametrize("strategy", ["min", "percentile"])
@pytest.mark.parametrize("prioritized", [False, True])
def test_plus_inf_log_rewards_never_enter_a_baseline(client, buffer_name, strategy, prioritized):
    # +inf items are kept (first, under reward eviction) but a baseline from them would
    # filter out everything: the order statistics are taken over the finite values only
    buffer = ReplayBuffer(client, buffer_name, capacity=8, prioritized_capacity=prioritized)
    data = np.array([np.inf, 1.0, -np.inf, 4.0, np.inf, 2.0, 3.0, np.inf])
    _fill(buffer, data)
    manager = _manager(buffer, baseline_strategy=strategy, baseline_percentile=0.5)
    got = manager.update_baseline(np.array([np.inf, 9.0]))
    finite = data[np.isfinite(data)]
    want = finite.min() if strategy == "min" else _torch_quantile(finite, 0.5)
    assert manager.last_baseline_source == "buffer"
    assert got == pytest.approx(want, rel=1e-12)
    # the batch's +inf is not its minimum either: the EMA took 9.0
    assert float(client.hget(buffer.keys.meta, "baseline_ema")) == 9.0


@pytest.mark.parametrize("strategy", ["min", "percentile"])
def test_full_buffer_of_only_infinite_log_rewards_answers_the_ema(client, buffer_name, strategy):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    _fill(buffer, np.array([np.inf, -np.inf, np.inf, np.inf]))
    manager = _manager(buffer, baseline_strategy=strategy)
    assert manager.update_baseline(np.array([np.inf, -np.inf])) is None
    assert manager.last_baseline_source == "none"
    assert manager.update_baseline(np.array([-2.0, np.inf])) == -2.0
    assert manager.last_baseline_source == "ema"


def test_baseline_of_a_dropped_buffer_raises_and_writes_nothing(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    manager = _manager(buffer, baseline_strategy="ema")
    meta = buffer.keys.meta
    buffer.drop()
    with pytest.raises(ConfigMismatchError, match="does not exist"):
        manager.update_baseline(np.array([1.0]))
    assert client.exists(meta) == 0  # the EMA did not recreate a meta hash


def test_unknown_strategy_and_bad_parameters_raise(fake_client, buffer_name):
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=4)
    with pytest.raises(ValueError, match="baseline_strategy"):
        _manager(buffer, baseline_strategy="median")
    with pytest.raises(ValueError, match="percentile"):
        _manager(buffer, baseline_percentile=1.5)
    with pytest.raises(ValueError, match="alpha"):
        _manager(buffer, baseline_ema_alpha=0.0)


def test_reference_helpers_agree_with_math():
    assert _ema_reference([np.array([2.0]), np.array([0.0])], 0.25) == 1.5
    assert math.isclose(_torch_quantile(np.array([0.0, 10.0]), 0.3), 3.0)
