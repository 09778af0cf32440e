"""Eight OS processes adding and sampling at once on one FIFO buffer and one
prioritized-capacity + prioritized-sampling buffer (real server only)."""

from __future__ import annotations

import math
import queue
import time
import traceback
import uuid

import numpy as np
import pytest
from process_helpers import fresh_context

from redisbuf import BufferKeys, ReplayBuffer
from redisbuf.control.ipc import MessageQueue

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]

WORKERS = 8
ROUNDS = 25
CAPACITY = 60
JOIN_TIMEOUT = 120.0


def _worker(url: str, fifo: str, prio: str, index: int, start, results) -> None:
    """Adds and samples on both buffers; reports one JSON line (or a traceback)."""
    try:
        rng = np.random.default_rng(1000 + index)
        buffers = {
            fifo: ReplayBuffer(url, fifo, capacity=CAPACITY, seed=index),
            prio: ReplayBuffer(
                url, prio, capacity=CAPACITY, prioritized_capacity=True,
                prioritized_sampling=True, seed=index,
            ),
        }
        start.wait(timeout=60)
        added: dict[str, list[tuple[int, float]]] = {fifo: [], prio: []}
        drawn = {fifo: 0, prio: 0}
        for round_ in range(ROUNDS):
            for name, buffer in buffers.items():
                n = int(rng.integers(1, 12))
                rewards = rng.normal(size=n)
                rewards[rng.random(n) < 0.15] = -np.inf
                batch = {
                    "tag": np.array([[index, round_]] * n, dtype=np.int32),
                    "log_rewards": rewards,
                }
                result = buffer.add(batch)
                assert len(result.ids) == n and 0 <= result.evicted <= n + CAPACITY
                added[name].extend(zip(result.ids.tolist(), rewards.tolist(), strict=True))
                k = int(rng.integers(1, 20))
                # prioritized: with replacement, as this test was written for; without it
                # a draw of k fails whenever fewer than k items present have a finite
                # log-reward, which depends on how the workers interleave
                replace = True if buffer.prioritized_sampling else None
                info = buffer.sample_with_info(k, replacement=replace)
                drawn[name] += k
                assert len(info.ids) == k and info.batch["tag"].shape == (k, 2)
                if buffer.prioritized_sampling:
                    assert np.isfinite(info.batch["log_rewards"]).all(), "drew a -inf item"
                    assert ((info.probabilities > 0) & (info.probabilities <= 1)).all()
                else:
                    assert info.probabilities is None
        results.put({"worker": index, "added": added, "drawn": drawn})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"worker": index, "error": traceback.format_exc()})
        raise


@pytest.fixture(scope="module")
def concurrent_run(redis_server):
    """Runs the workers once; yields (url, fifo name, prio name, reports)."""
    import redis

    tag = uuid.uuid4().hex[:8]
    fifo, prio = f"mp-fifo-{tag}", f"mp-prio-{tag}"
    client = redis.Redis.from_url(redis_server.url)
    # the prioritized buffer is created without prioritized sampling: workers enable it
    ReplayBuffer(client, prio, capacity=CAPACITY, prioritized_capacity=True)
    ctx = fresh_context()
    start = ctx.Barrier(WORKERS)
    results = MessageQueue(ctx)
    processes = [
        ctx.Process(target=_worker, args=(redis_server.url, fifo, prio, i, start, results))
        for i in range(WORKERS)
    ]
    for process in processes:
        process.start()
    reports, deadline = [], time.monotonic() + JOIN_TIMEOUT
    while len(reports) < WORKERS and time.monotonic() < deadline:
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:
            if all(p.exitcode is not None for p in processes):
                break
    stragglers = []
    for process in processes:
        process.join(timeout=max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            stragglers.append(process.pid)
            process.terminate()
            process.join(timeout=5)
    exit_codes = [p.exitcode for p in processes]
    yield client, fifo, prio, reports, exit_codes, stragglers
    for name in (fifo, prio):
        client.delete(*BufferKeys(name).all_keys())
    client.close()


def test_no_process_failed(concurrent_run):
    _, _, _, reports, exit_codes, stragglers = concurrent_run
    assert stragglers == [], f"processes still running after {JOIN_TIMEOUT} s"
    errors = [r["error"] for r in reports if "error" in r]
    assert errors == [], "\n\n".join(errors)
    assert sorted(r["worker"] for r in reports) == list(range(WORKERS))
    assert exit_codes == [0] * WORKERS


def _check_common(client, name: str, reports) -> dict[int, float]:
    keys = BufferKeys(name)
    prio = {int(m): s for m, s in client.zrange(keys.prio, 0, -1, withscores=True)}
    order = {int(m) for m in client.zrange(keys.order, 0, -1)}
    items = {int(k) for k in client.hkeys(keys.items)}
    assert set(prio) == order == items
    assert len(order) == CAPACITY
    buffer = ReplayBuffer.open(client, name)
    stats = buffer.stats()
    assert len(buffer) == stats["length"] <= CAPACITY
    added = [pair for r in reports for pair in r["added"][name]]
    ids = sorted(i for i, _ in added)
    assert ids == list(range(1, len(ids) + 1)), "ids are not unique and consecutive"
    assert stats["inserted"] == len(added) == stats["last_id"]
    assert stats["inserted"] - stats["evicted"] == stats["length"]
    assert stats["sampled"] == sum(r["drawn"][name] for r in reports)
    return dict(added)


def test_fifo_buffer_is_consistent(concurrent_run):
    client, fifo, _, reports, _, _ = concurrent_run
    if any("error" in r for r in reports) or len(reports) < WORKERS:
        pytest.fail("a worker failed (see test_no_process_failed)")
    added = _check_common(client, fifo, reports)
    order = [int(m) for m in client.zrange(BufferKeys(fifo).order, 0, -1)]
    last = max(added)
    assert order == list(range(last - CAPACITY + 1, last + 1))  # the newest survive


def test_prioritized_buffer_is_consistent(concurrent_run):
    client, _, prio, reports, _, _ = concurrent_run
    if any("error" in r for r in reports) or len(reports) < WORKERS:
        pytest.fail("a worker failed (see test_no_process_failed)")
    added = _check_common(client, prio, reports)
    stored = {int(m): s for m, s in client.zrange(BufferKeys(prio).prio, 0, -1, withscores=True)}
    assert all(stored[i] == added[i] for i in stored)
    # with atomic adds, the survivors are the best CAPACITY items ever added, ranked by
    # (log-reward, id): a lower log-reward, or an older id among equals, goes first
    best = sorted(added, key=lambda i: (added[i], i))[-CAPACITY:]
    assert sorted(stored) == sorted(best)
    assert not any(math.isnan(v) for v in stored.values())


def test_prioritized_buffer_sum_tree_is_consistent(concurrent_run):
    from test_sampling import assert_tree_consistent

    client, _, prio, reports, _, _ = concurrent_run
    if any("error" in r for r in reports) or len(reports) < WORKERS:
        pytest.fail("a worker failed (see test_no_process_failed)")
    assert_tree_consistent(client, prio)
