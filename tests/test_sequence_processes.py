"""Four actor processes write streams while two learners call get_batch (real server).

Every step carries its env id, position and episode number; learners check that no
window is torn: one environment, consecutive positions from BatchInfo's, one episode.
"""

from __future__ import annotations

import queue
import time
import traceback
import uuid

import numpy as np
import pytest
from process_helpers import fresh_context

from redisbuf import SequenceBuffer
from redisbuf.buffers.sequence import SequenceKeys
from redisbuf.control.ipc import MessageQueue
from redisbuf.errors import EmptyBufferError

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]

ACTORS, LEARNERS, ENVS_PER_ACTOR = 4, 2, 2
NUM_ENVS = ACTORS * ENVS_PER_ACTOR
MAX_LENGTH = 40
DURATION = 3.0
JOIN_TIMEOUT = 120.0


def _open(url: str, name: str, seed: int) -> SequenceBuffer:
    return SequenceBuffer(
        url, name, NUM_ENVS, MAX_LENGTH, done_field="done", prioritized_sampling=True, seed=seed
    )


def _actor(url: str, name: str, index: int, start, results) -> None:
    try:
        buf = _open(url, name, index)
        rng = np.random.default_rng(index)
        envs = np.arange(ENVS_PER_ACTOR) + ENVS_PER_ACTOR * index
        pos = np.zeros(ENVS_PER_ACTOR, dtype=np.int64)
        episode = np.zeros(ENVS_PER_ACTOR, dtype=np.int64)
        start.wait(timeout=60)
        deadline = time.monotonic() + DURATION
        while time.monotonic() < deadline:
            done = rng.random(ENVS_PER_ACTOR) < 0.1
            batch = {
                "env": envs,
                "pos": pos.copy(),
                "episode": episode.copy(),
                "done": done,
                "obs": (envs[:, None] * 1e6 + pos[:, None] + np.zeros((1, 8))).astype(np.float64),
            }
            got = buf.add_batch(batch, env_ids=envs)
            assert got.tolist() == pos.tolist()
            pos += 1
            episode += done
        results.put({"actor": index, "added": pos.tolist()})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"actor": index, "error": traceback.format_exc()})
        raise


def _learner(url: str, name: str, index: int, start, results) -> None:
    try:
        buf = _open(url, name, 100 + index)
        start.wait(timeout=60)
        deadline = time.monotonic() + DURATION
        windows = torn = 0
        while time.monotonic() < deadline:
            try:
                data, info = buf.get_batch(16, 4)
            except EmptyBufferError:
                continue
            for w in range(16):
                e, p = int(info.env_ids[w]), int(info.positions[w])
                ok = (
                    data["env"][w].tolist() == [e] * 4
                    and data["pos"][w].tolist() == list(range(p, p + 4))
                    and len(set(data["episode"][w].tolist())) == 1
                    and (data["obs"][w, :, 0] == e * 1e6 + np.arange(p, p + 4)).all()
                )
                torn += not ok
            windows += 16
            buf.update_priority(info.env_ids, info.positions, np.full(16, 0.5 + index))
        results.put({"learner": index, "windows": windows, "torn": torn})
    except BaseException:  # noqa: BLE001
        results.put({"learner": index, "error": traceback.format_exc()})
        raise


def test_no_window_is_torn(redis_server):
    name = f"seq-mp-{uuid.uuid4().hex[:8]}"
    _open(redis_server.url, name, 0)
    ctx = fresh_context()
    start = ctx.Barrier(ACTORS + LEARNERS)
    results = MessageQueue(ctx)
    processes = [
        ctx.Process(target=_actor, args=(redis_server.url, name, i, start, results))
        for i in range(ACTORS)
    ] + [
        ctx.Process(target=_learner, args=(redis_server.url, name, i, start, results))
        for i in range(LEARNERS)
    ]
    for process in processes:
        process.start()
    reports, deadline = [], time.monotonic() + JOIN_TIMEOUT
    while len(reports) < len(processes) and time.monotonic() < deadline:
        try:
            reports.append(results.get(timeout=1.0))
        except queue.Empty:
            if all(p.exitcode is not None for p in processes):
                break
    for process in processes:
        process.join(timeout=max(0.1, deadline - time.monotonic()))
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)
    buf = _open(redis_server.url, name, 0)
    try:
        errors = [r["error"] for r in reports if "error" in r]
        assert errors == [], "\n\n".join(errors)
        assert [p.exitcode for p in processes] == [0] * len(processes)
        learners = [r for r in reports if "learner" in r]
        assert len(learners) == LEARNERS
        assert all(r["windows"] > 0 for r in learners), learners
        assert sum(r["torn"] for r in learners) == 0, learners
        added = {}
        for r in reports:
            if "actor" in r:
                for k, count in enumerate(r["added"]):
                    added[ENVS_PER_ACTOR * r["actor"] + k] = count
        assert len(added) == NUM_ENVS
        for e, count in added.items():
            assert buf.env_range(e) == (max(0, count - MAX_LENGTH), count)
        assert len(buf) == sum(min(c, MAX_LENGTH) for c in added.values())
        print("learner windows:", [r["windows"] for r in learners], "steps added:", added)
    finally:
        buf.client.delete(*SequenceKeys(name).all_keys())
