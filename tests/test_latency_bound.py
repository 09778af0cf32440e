"""No single call stalls the server (issue 35): each operation, run at a size far above
one command's bound, asks the server only for bounded work.

The check is the server's own account of what it ran (MONITOR: the commands clients sent
and those their scripts ran, tests/command_work.py), not a clock, which a loaded machine
stretches: no command names or asks for more than COMMAND_ITEMS items, and no client
command with the commands its script ran more than CALL_ITEMS; an operation whose work
grew with the buffer (ITEMS items) would pass both by far. How long the commands take,
beside a probe that PINGs the server every 2 ms, is benchmarks/bench_latency.py's (at
2x10^6 items)."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from command_work import watched

from redisbuf import PERSampler, ReplayBuffer, SequenceBuffer
from redisbuf.sampling import first_read
from redisbuf.sampling.replica import MassReplica
from redisbuf.store import bounds, functions

pytestmark = pytest.mark.redis_server

ITEMS = 60_000
# the largest command: a replica's first read takes 10,000 ids an HMGET (or a SCAN step
# of that COUNT), the others at most MAX_ITEMS_PER_COMMAND
COMMAND_ITEMS = max(first_read._SCAN_COUNT, bounds.MAX_ITEMS_PER_COMMAND)
# a script's commands in all: a uniform draw of 2048 items reads and counts each a few times
CALL_ITEMS = 8 * bounds.MAX_ITEMS_PER_COMMAND


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
    yield buffer, redis_server.url
    buffer.drop()
    client.close()


def _bounded(url: str, op, what: str):
    """Run ``op`` and check the work it asked of the server at ``url``: every command
    within COMMAND_ITEMS items, every client command with its script's within
    CALL_ITEMS. Returns what ``op`` returned."""
    with watched(url) as work:
        result = op()
    items, command = work.most_items()
    assert items <= COMMAND_ITEMS, f"{what}: a command of {items} items: {command}"
    items, command = work.most_items_per_call()
    assert items <= CALL_ITEMS, f"{what}: a call of {items} items in all: {command}"
    return result


def test_large_uniform_samples_stay_bounded(filled):
    buffer, url = filled
    n = ITEMS // 2  # above the bound ~7 times, half the buffer: the rejection chunks
    info = _bounded(url, lambda: buffer.sample_with_info(n), "sample(n)")
    assert len(set(info.ids.tolist())) == n
    n = ITEMS - 10  # nearly all of it: the scan
    info = _bounded(url, lambda: buffer.sample_with_info(n), "sample(nearly all)")
    assert len(set(info.ids.tolist())) == n and len(info.batch["obs"]) == n
    info = _bounded(url, lambda: buffer.sample_with_info(2 * ITEMS), "sample(2 len)")
    assert len(info.ids) == 2 * ITEMS  # more than the length: with replacement


def test_get_top_stats_stay_bounded(filled):
    buffer, url = filled
    ids = np.arange(1, ITEMS + 1)
    batch = _bounded(url, lambda: buffer.get(ids), "get")
    assert len(batch["obs"]) == ITEMS
    top = _bounded(url, lambda: buffer.top(ITEMS), "top")
    assert len(top) == ITEMS and top[0][1] >= top[-1][1]
    stats = _bounded(url, buffer.stats, "stats")
    assert stats["length"] == ITEMS and stats["memory_bytes"] > 0


def test_fcall_far_above_the_bound_is_refused_at_once(filled):
    """A draw far above the bound sent as FCALL by another client is refused before the
    script reads anything but the large-add flag (one HEXISTS of meta, lua/_common.lua)."""
    buffer, url = filled
    client = buffer.client
    functions.install(client)
    keys = buffer.keys.all_keys()
    n = 10 * bounds.MAX_ITEMS_PER_COMMAND
    sampled_before = int(client.hget(buffer.keys.meta, "sampled") or 0)
    uniforms = np.random.default_rng(1).bytes(6 * n)
    with watched(url) as work:
        with pytest.raises(redis.ResponseError, match="RB_LIMIT"):
            client.execute_command("FCALL", "rb_sample_uniform", len(keys), *keys,
                                   n, 1, 0, uniforms)
    assert [args[0] for args, scripted in work.commands if scripted] == ["HEXISTS"]
    assert int(client.hget(buffer.keys.meta, "sampled") or 0) == sampled_before


def test_load_over_a_large_buffer_stays_bounded(filled, tmp_path):
    """The swap of a load unlinks the old keys and renames the staged ones (O(1) each) and
    iterates no item: a PER buffer that gets every item's new-item priority, loaded twice
    (the second time over its own large keys)."""
    buffer, url = filled
    buffer.save(tmp_path / "all.rbuf")
    target = ReplayBuffer(buffer.client, "latency-bound-load", capacity=ITEMS,
                          sampler=PERSampler(alpha=0.6, initial_priority=2.0))
    try:
        for _ in range(2):
            assert _bounded(url, lambda: target.load(tmp_path / "all.rbuf"), "load") == ITEMS
        replica = MassReplica("per")  # the restored snapshot: every item, at 2.0
        replica.load(target.view)
        assert len(target) == ITEMS and len(replica) == ITEMS
        assert replica.score_sum == pytest.approx(2.0 * ITEMS) and replica.nonzero == ITEMS
    finally:
        target.drop()


def test_sequence_reads_stay_bounded(redis_server, filled):
    """Windows, gather_all and get_field of far more steps than the bound."""
    _, url = filled
    client = redis.Redis.from_url(redis_server.url)
    envs, length = 16, 2500
    seq = SequenceBuffer(client, "latency-bound-seq", envs, length, seed=0)
    try:
        for t in range(length):
            seq.add_batch({"obs": np.full((envs, 128), t, dtype=np.float32),
                           "t": np.full(envs, t, dtype=np.int64)})
        data, info = _bounded(url, lambda: seq.get_batch(2000, 16), "get_batch")
        assert (data["t"] == info.positions[:, None] + np.arange(16)).all()
        data, info = _bounded(url, seq.gather_all, "gather_all")
        assert data["t"].shape == (envs, length) and (data["t"] == np.arange(length)).all()
        got = _bounded(url, lambda: seq.get_field("t", np.repeat(np.arange(envs), length),
                                                     np.tile(np.arange(length), envs)),
                       "get_field")
        assert got.tolist() == np.tile(np.arange(length), envs).tolist()
    finally:
        seq.drop()
        client.close()


def test_large_window_draws_without_replacement_stay_bounded(filled):
    buffer, url = filled
    n, window = ITEMS // 2, slice(-(ITEMS - 100), None)
    info = _bounded(url, lambda: buffer.sample_with_info(n, sample_range=window),
                    "sample_range without replacement")
    ids = info.ids.tolist()
    assert len(set(ids)) == n and min(ids) > 100 and len(info.batch["obs"]) == n
