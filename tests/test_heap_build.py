"""The priority heap of the MaxHeap / MinHeap selectors by PER priority is built from a
replica of the priorities a bounded slice a call (lua/heap_build.lua); changes made
between the slices (updates, adds, evictions) are kept, so the built heap is exactly the
priorities the server reads."""

from __future__ import annotations

import numpy as np
from replica_helpers import stored_priorities

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.sampling.selectors import MaxHeapSampler, MinHeapSampler, build_heap
from redisbuf.store import bounds

N = 3 * bounds.MAX_ITEMS_PER_COMMAND + 500


def _heap(client, keys) -> dict[int, float]:
    return {int(m): s for m, s in client.zrange(keys.per_heap, 0, -1, withscores=True)}


def _per(client, keys) -> dict[int, float]:
    return stored_priorities(client, keys.name)


def test_changes_between_slices_are_kept(client, buffer_name) -> None:
    rng = np.random.default_rng(5)
    buffer = ReplayBuffer(client, buffer_name, capacity=N, sampler=PERSampler())
    for start in range(0, N, 1000):
        n = min(1000, N - start)
        buffer.add({"x": np.zeros((n, 1), np.float32)}, priorities=rng.random(n))
    keys = buffer.keys
    writer = ReplayBuffer(client, buffer_name, capacity=N, sampler=PERSampler())
    run, steps = buffer._run, []

    def changing(name, keys_, args, *rest):
        reply = run(name, keys_, args, *rest)
        if name == "heap_build" and args[0] in ("start", "slice"):
            steps.append(args[0])
            # after the start and between two slices another process re-prioritises items
            # (some copied already, some not), adds items (which evict the oldest): none
            # of it may be lost
            ids = [int(m) for m in client.zrange(keys.order, 0, -1)]
            chosen = rng.choice(ids, 300, replace=False)
            writer.update_priority(chosen, rng.random(300) * 10)
            writer.add({"x": np.zeros((50, 1), np.float32)}, priorities=rng.random(50) + 20)
            assert client.hget(keys.meta, "per_heap") == b"b"
        return reply

    buffer._run = changing
    build_heap(buffer.view)
    buffer._run = run
    assert steps.count("slice") >= 2  # sliced: N is over the per-command bound
    assert client.hget(keys.meta, "per_heap") == b"1"
    assert _heap(client, keys) == _per(client, keys)
    writer.update_priority([int(client.zrange(keys.order, 0, 0)[0])], [99.0])  # kept now
    assert _heap(client, keys) == _per(client, keys)


def test_selectors_build_it_on_first_use(client, buffer_name) -> None:
    rng = np.random.default_rng(6)
    buffer = ReplayBuffer(client, buffer_name, capacity=N, sampler=PERSampler())
    priorities = rng.random(N)
    for start in range(0, N, 1000):
        part = priorities[start : start + 1000]
        buffer.add({"x": np.arange(start, start + len(part), dtype=np.int64)[:, None]},
                   priorities=part)
    top = ReplayBuffer(client, buffer_name, capacity=N, sampler=MaxHeapSampler("priority"))
    assert top.sample(5)["x"][:, 0].tolist() == np.argsort(-priorities)[:5].tolist()
    low = ReplayBuffer(client, buffer_name, capacity=N, sampler=MinHeapSampler("priority"))
    assert low.sample(5)["x"][:, 0].tolist() == np.argsort(priorities)[:5].tolist()
    assert build_heap(buffer.view) == 1  # built once, kept since

