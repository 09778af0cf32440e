"""No single call stalls the server (issue 35): while each operation runs at a size far
above one command's bound, a probe process PINGs the server every 2 ms.

The primary check is the server's own account: no command in its SLOWLOG took longer
than SERVER_LIMIT while the operation ran (a loaded 2-core machine slows the probe's
clock far more than the server's). The probe's worst reply is checked too, against a
generous PROBE_LIMIT. benchmarks/bench_latency.py runs the 2x10^6-item version."""

from __future__ import annotations

import time

import numpy as np
import pytest
import redis

from redisbuf import PERSampler, ReplayBuffer, SequenceBuffer
from redisbuf.ops.latency import LatencyProbe
from redisbuf.sampling.replica import MassReplica
from redisbuf.store import bounds, functions

pytestmark = pytest.mark.redis_server

ITEMS = 60_000
SERVER_LIMIT = 0.05  # seconds: ~5x what a bounded command takes on an idle machine
PROBE_LIMIT = 0.1


@pytest.fixture(scope="module")
def filled(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    buffer = ReplayBuffer(client, "latency-bound", capacity=ITEMS, seed=0)
    buffer.clear()
    rng = np.random.default_rng(0)
    for start, stop in bounds.chunks(ITEMS, bounds.MAX_ADD_ITEMS):
        k = stop - start
        buffer.add({"obs": rng.standard_normal((k, 8)).astype(np.float32),
                    "log_rewards": rng.standard_normal(k)})
    with LatencyProbe(redis_server.url) as probe:
        yield buffer, probe
    buffer.drop()
    client.close()


def _bounded(probe: LatencyProbe, op, what: str, attempts: int = 3):
    """Run ``op`` beside the probe: in one of ``attempts`` runs no command may exceed
    SERVER_LIMIT and the probe's worst reply must stay under PROBE_LIMIT. A loaded machine
    may keep the server or the probe off the CPU for a while (SLOWLOG times are wall
    clock); a command whose work is unbounded exceeds the limits in every run."""
    runs = []
    for _ in range(attempts):
        with probe.window() as seen:
            result = op()
        runs.append((seen.server_worst, seen.probe_worst, seen.server_command))
        if seen.server_worst < SERVER_LIMIT and seen.probe_worst < PROBE_LIMIT:
            return result
    raise AssertionError(f"{what}: every run went over (server s, probe s, slowest): {runs}")


def test_large_uniform_samples_stay_bounded(filled):
    buffer, probe = filled
    n = ITEMS // 2  # above the bound ~7 times, half the buffer: the rejection chunks
    info = _bounded(probe, lambda: buffer.sample_with_info(n), "sample(n)")
    assert len(set(info.ids.tolist())) == n
    n = ITEMS - 10  # nearly all of it: the scan
    info = _bounded(probe, lambda: buffer.sample_with_info(n), "sample(nearly all)")
    assert len(set(info.ids.tolist())) == n and len(info.batch["obs"]) == n
    info = _bounded(probe, lambda: buffer.sample_with_info(2 * ITEMS), "sample(2 len)")
    assert len(info.ids) == 2 * ITEMS  # more than the length: with replacement


def test_get_top_stats_stay_bounded(filled):
    buffer, probe = filled
    ids = np.arange(1, ITEMS + 1)
    batch = _bounded(probe, lambda: buffer.get(ids), "get")
    assert len(batch["obs"]) == ITEMS
    top = _bounded(probe, lambda: buffer.top(ITEMS), "top")
    assert len(top) == ITEMS and top[0][1] >= top[-1][1]
    stats = _bounded(probe, buffer.stats, "stats")
    assert stats["length"] == ITEMS and stats["memory_bytes"] > 0


def test_fcall_far_above_the_bound_is_refused_at_once(filled):
    buffer, probe = filled
    client = buffer.client
    functions.install(client)
    keys = buffer.keys.all_keys()
    n = 10 * bounds.MAX_ITEMS_PER_COMMAND
    sampled_before = int(client.hget(buffer.keys.meta, "sampled") or 0)
    uniforms = np.random.default_rng(1).bytes(6 * n)
    def refused() -> float:
        started = time.perf_counter()
        with pytest.raises(redis.ResponseError, match="RB_LIMIT"):
            client.execute_command("FCALL", "rb_sample_uniform", len(keys), *keys,
                                   n, 1, 0, uniforms)
        return time.perf_counter() - started

    assert _bounded(probe, refused, "FCALL above the bound") < 1.0
    assert int(client.hget(buffer.keys.meta, "sampled") or 0) == sampled_before


def test_load_over_a_large_buffer_stays_bounded(filled, tmp_path):
    """The swap of a load unlinks the old keys and renames the staged ones (O(1) each) and
    iterates no item: a PER buffer that gets every item's new-item priority, loaded twice
    (the second time over its own large keys)."""
    buffer, probe = filled
    buffer.save(tmp_path / "all.rbuf")
    target = ReplayBuffer(buffer.client, "latency-bound-load", capacity=ITEMS,
                          sampler=PERSampler(alpha=0.6, initial_priority=2.0))
    try:
        for _ in range(2):
            assert _bounded(probe, lambda: target.load(tmp_path / "all.rbuf"), "load") == ITEMS
        replica = MassReplica("per")  # the restored snapshot: every item, at 2.0
        replica.load(target.view)
        assert len(target) == ITEMS and len(replica) == ITEMS
        assert replica.score_sum == pytest.approx(2.0 * ITEMS) and replica.nonzero == ITEMS
    finally:
        target.drop()


def test_sequence_reads_stay_bounded(redis_server, filled):
    """Windows, gather_all and get_field of far more steps than the bound."""
    _, probe = filled
    client = redis.Redis.from_url(redis_server.url)
    envs, length = 16, 4000
    seq = SequenceBuffer(client, "latency-bound-seq", envs, length, seed=0)
    try:
        for t in range(length):
            seq.add_batch({"obs": np.full((envs, 128), t, dtype=np.float32),
                           "t": np.full(envs, t, dtype=np.int64)})
        data, info = _bounded(probe, lambda: seq.get_batch(2000, 16), "get_batch")
        assert (data["t"] == info.positions[:, None] + np.arange(16)).all()
        data, info = _bounded(probe, seq.gather_all, "gather_all")
        assert data["t"].shape == (envs, length) and (data["t"] == np.arange(length)).all()
        got = _bounded(probe, lambda: seq.get_field("t", np.repeat(np.arange(envs), length),
                                                     np.tile(np.arange(length), envs)),
                       "get_field")
        assert got.tolist() == np.tile(np.arange(length), envs).tolist()
    finally:
        seq.drop()
        client.close()


def test_large_window_draws_without_replacement_stay_bounded(filled):
    buffer, probe = filled
    n, window = ITEMS // 2, slice(-(ITEMS - 100), None)
    info = _bounded(probe, lambda: buffer.sample_with_info(n, sample_range=window),
                    "sample_range without replacement")
    ids = info.ids.tolist()
    assert len(set(ids)) == n and min(ids) > 100 and len(info.batch["obs"]) == n
