"""update_priority from several OS processes at once on a real server, while another
process adds (and so evicts): every call is atomic, evicted ids are skipped, and the
priorities, their sum and the replicas stay consistent. Each updater samples after each
update, so its next update comes from a current replica when no other process wrote in
between (no item read, a P entry) and reads the items otherwise: both forms interleave
(in one run, 44 of 236 calls were of the first)."""

from __future__ import annotations

import traceback
import uuid

import numpy as np
import pytest
from process_helpers import fresh_context
from replica_helpers import fresh_replica, replica_masses, stored_priorities

from redisbuf import BufferKeys, PERSampler, ReplayBuffer
from redisbuf.control.ipc import MessageQueue

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]

UPDATERS = 4
CAPACITY = 100
ROUNDS = 60


def _updater(url: str, name: str, index: int, start, results) -> None:
    try:
        buffer = ReplayBuffer(url, name, capacity=CAPACITY, sampler=PERSampler(), seed=index)
        rng = np.random.default_rng(index)
        start.wait(timeout=60)
        updated = 0
        for round_ in range(ROUNDS):
            last = int(buffer.client.hget(buffer.keys.meta, "last_id"))
            ids = rng.choice(np.arange(1, last + 1), size=20, replace=False)
            # every value names its writer: (index, round) -> 1000 * index + round + 1
            updated += buffer.update_priority(ids, np.full(20, 1000.0 * index + round_ + 1))
            info = buffer.sample_with_info(8)
            assert np.isfinite(info.weights).all() and (info.weights <= 1.0 + 1e-12).all()
        results.put({"worker": index, "updated": updated})
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put({"worker": index, "error": traceback.format_exc()})


def _adder(url: str, name: str, start, results) -> None:
    try:
        buffer = ReplayBuffer(url, name, capacity=CAPACITY, sampler=PERSampler())
        start.wait(timeout=60)
        for round_ in range(ROUNDS):
            buffer.add({"x": np.full((5, 1), round_, dtype=np.float32)})
        results.put({"worker": "adder"})
    except BaseException:  # noqa: BLE001
        results.put({"worker": "adder", "error": traceback.format_exc()})


def test_concurrent_update_priority_stays_consistent(redis_server):
    import redis

    name = f"per-mp-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_server.url)
    buffer = ReplayBuffer(client, name, capacity=CAPACITY, sampler=PERSampler(initial_priority=1))
    buffer.add({"x": np.zeros((CAPACITY, 1), dtype=np.float32)})
    ctx = fresh_context()
    start = ctx.Barrier(UPDATERS + 1)
    results = MessageQueue(ctx)
    procs = [
        ctx.Process(target=_updater, args=(redis_server.url, name, i, start, results))
        for i in range(UPDATERS)
    ]
    procs.append(ctx.Process(target=_adder, args=(redis_server.url, name, start, results)))
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=180) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, errors[0]
    keys = BufferKeys(name)
    per = stored_priorities(client, name)
    present = {int(m) for m in client.zrange(keys.order, 0, -1)}
    assert set(per) == present and len(present) == CAPACITY
    written = {1000.0 * i + r + 1 for i in range(UPDATERS) for r in range(ROUNDS)}
    # a new item starts at the highest priority present, itself a written value
    assert set(per.values()) <= written | {1.0}
    assert 0 < sum(r.get("updated", 0) for r in reports) <= UPDATERS * ROUNDS * 20
    # a replica's masses: (p + eps)^alpha, and its sum and count of the priorities
    fresh = fresh_replica(client, name, "per")
    assert fresh.nonzero == CAPACITY
    assert fresh.score_sum == pytest.approx(sum(per.values()))
    masses = replica_masses(fresh)
    assert set(masses) == present
    ratio = {i: masses[i] / (per[i] + 1e-6) ** 0.6 for i in present}
    scale = next(iter(ratio.values()))
    assert all(r == pytest.approx(scale, rel=1e-9) for r in ratio.values())
