"""Two real processes share one redisbuf.ding DequeBuffer by name on a real server: one
pushes (through use_time_check and PriorityExperienceReplay) and samples, the other
samples and updates priorities, at the same time. The use counts are exact across both
(the server counts every draw of either process once, and removes an item by the draw
that brings its count to max_use), and the draws follow the priorities both set
(chi-square)."""

from __future__ import annotations

import traceback
import uuid
from collections import Counter

import pytest
import redis
from cluster_helpers import chi2_limit
from process_helpers import fresh_context

from redisbuf.control.ipc import MessageQueue
from redisbuf.store.keys import BufferKeys

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]

MAX_USE = 3
PUSHES = 150
ALPHA = 0.6


def _buffer(url: str, name: str, max_use: int | None):
    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay, use_time_check

    buffer = DequeBuffer(size=1000, url=url, name=name)
    if max_use is not None:
        buffer.use(use_time_check(buffer, max_use=max_use))
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=True, priority_power_factor=ALPHA))
    return buffer


def _pusher(url: str, name: str, start, finished, results) -> None:
    try:
        buffer = _buffer(url, name, MAX_USE)
        start.wait(timeout=120)
        returned: Counter[str] = Counter()
        for step in range(PUSHES):
            meta = {"priority": 1.0 + step % 4} if step % 2 else None
            buffer.push({"step": step}, meta)
            if step % 10 == 9:
                try:
                    returned.update(item.index for item in buffer.sample(4))
                except ValueError:
                    pass
        finished.set()
        results.put({"worker": "pusher", "returned": dict(returned)})
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put({"worker": "pusher", "error": traceback.format_exc()})


def _learner(url: str, name: str, start, finished, results) -> None:
    try:
        buffer = _buffer(url, name, MAX_USE)
        start.wait(timeout=120)
        returned: Counter[str] = Counter()
        updated = 0
        round_, after = 0, 0
        # while the other process pushes, then 60 rounds more (or until it is empty)
        while after < 60:
            round_ += 1
            after += finished.is_set()
            try:
                batch = buffer.sample(8)
            except ValueError:  # empty at the start, or used up at the end
                if finished.is_set():
                    break
                continue
            returned.update(item.index for item in batch)
            for item in batch:
                assert 0 < item.meta["priority_IS"] <= 1.0 + 1e-9
                item.meta["priority"] = 1.0 + round_ % 5
                updated += buffer.update(item.index, None, item.meta)
        results.put({"worker": "learner", "returned": dict(returned), "updated": updated})
    except BaseException:  # noqa: BLE001
        results.put({"worker": "learner", "error": traceback.format_exc()})


def _run(url: str, targets, finished: bool = False) -> list[dict]:
    ctx = fresh_context()
    start = ctx.Barrier(len(targets))
    results = MessageQueue(ctx)
    extra = (ctx.Event(),) if finished else ()
    procs = [ctx.Process(target=target, args=(url, *args, start, *extra, results))
             for target, args in targets]
    for proc in procs:
        proc.start()
    reports = [results.get(timeout=300) for _ in procs]
    for proc in procs:
        proc.join(timeout=60)
        assert proc.exitcode == 0
    errors = [r["error"] for r in reports if "error" in r]
    assert not errors, errors[0]
    return reports


def test_use_counts_are_exact_across_two_processes(redis_server) -> None:
    name = f"ding-mp-{uuid.uuid4().hex[:8]}"
    reports = _run(redis_server.url, [(_pusher, (name,)), (_learner, (name,))], finished=True)
    returned: Counter[str] = Counter()
    for report in reports:
        returned.update(report["returned"])
    learner = next(r for r in reports if r["worker"] == "learner")
    assert learner["updated"] > 0
    client = redis.Redis.from_url(redis_server.url)
    keys = BufferKeys(name)
    present = {m.decode() for m in client.zrange(keys.order, 0, -1)}
    uses = {k.decode(): int(v) for k, v in client.hgetall(keys.uses).items()}
    gone = {f"{i:012d}" for i in range(1, PUSHES + 1)} - present
    for index in present:  # every draw of either process counted once, on the server
        assert uses.get(index, 0) == returned.get(index, 0) < MAX_USE, index
    for index in gone:  # removed by the draw that took it to max_use (one draw may
        assert returned[index] >= MAX_USE, index  # return it more than once, as DI-engine)
    assert gone  # some items did reach max_use
    meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    assert int(meta["sampled"]) == sum(returned.values())
    assert int(meta["retired"]) == len(gone)


ITEMS = 5
ROUNDS = 400


def _law_pusher(url: str, name: str, start, results) -> None:
    try:
        buffer = _buffer(url, name, None)
        for i in range(ITEMS):
            buffer.push({"i": i}, meta={"priority": float(i + 1)})
        start.wait(timeout=120)  # the learner updates, then both draw
        results.put({"worker": "pusher", "counts": _draws(buffer)})
    except BaseException:  # noqa: BLE001
        results.put({"worker": "pusher", "error": traceback.format_exc()})


def _law_learner(url: str, name: str, start, results) -> None:
    try:
        buffer = _buffer(url, name, None)
        import time

        while buffer.count() < ITEMS:
            time.sleep(0.01)
        for item in buffer:  # every item, oldest first
            if item.data["i"] in (0, 3):  # 1 -> 6, 4 -> 0.5, DI-engine adds 1e-5
                item.meta["priority"] = 6.0 if item.data["i"] == 0 else 0.5
                assert buffer.update(item.index, None, item.meta)
        start.wait(timeout=120)
        results.put({"worker": "learner", "counts": _draws(buffer)})
    except BaseException:  # noqa: BLE001
        results.put({"worker": "learner", "error": traceback.format_exc()})


def _draws(buffer) -> dict[int, int]:
    counts: Counter[int] = Counter()
    for _ in range(ROUNDS):
        counts.update(item.data["i"] for item in buffer.sample(3))
    return dict(counts)


def test_the_law_follows_both_processes_priorities(redis_server) -> None:
    name = f"ding-law-{uuid.uuid4().hex[:8]}"
    reports = _run(redis_server.url, [(_law_pusher, (name,)), (_law_learner, (name,))])
    counts: Counter[int] = Counter()
    for report in reports:
        counts.update({int(k): v for k, v in report["counts"].items()})
    priorities = [6.0 + 1e-5, 2.0, 3.0, 0.5 + 1e-5, 5.0]
    masses = [p**ALPHA for p in priorities]
    draws = 2 * ROUNDS * 3
    expected = {i: draws * m / sum(masses) for i, m in enumerate(masses)}
    assert sum(counts.values()) == draws
    stat = sum((counts.get(i, 0) - e) ** 2 / e for i, e in expected.items())
    assert stat < chi2_limit(ITEMS - 1), (dict(counts), expected)
