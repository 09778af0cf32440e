"""Shapes, sizes and timing shared by every peer's script (numpy and the standard library
only: each peer runs this module in its own virtual environment).

A peer script is run as ``PYTHON peer_NAME.py CONFIG_JSON`` and prints one JSON object
(figure id -> result) on its last line of output; ``run.py`` collects them.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

BATCH = 256  # items per add and per sample, every figure but the Ape-X sampler's
APEX_SAMPLE = 512
ALPHA, BETA = 0.6, 0.4  # PER exponents, the same for every prioritized peer

# item layouts, identical for every peer: field -> (shape of one item, dtype)
LAYOUTS: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {
    # 4096 bytes per item
    "4k": {"obs": ((1024,), "float32")},
    # 176 bytes of payload per transition (about 200 B with each peer's framing)
    "200b": {
        "obs": ((20,), "float32"),
        "next_obs": ((20,), "float32"),
        "action": ((), "int64"),
        "reward": ((), "float32"),
        "done": ((), "float32"),
    },
}

# figure id -> (row label, what is counted, how it is read)
FIGURES: dict[str, tuple[str, str]] = {
    "add_4k_uniform": ("add 4 KiB, 1 writer, uniform", "items/s"),
    "add_4k_prio": ("add 4 KiB, 1 writer, prioritized", "items/s"),
    "add_200b": ("add ~200 B, 1 writer, uniform", "items/s"),
    "add_4k_4proc": ("add 4 KiB, 4 writer processes, one buffer", "items/s"),
    "sample_4k_uniform": ("sample 256 x 4 KiB, uniform", "items/s"),
    "sample_4k_prio": ("sample 256 x 4 KiB, prioritized", "items/s"),
    "update_small": ("priority updates, 256 a call, 10^5 items", "updates/s"),
    "mixed_ins": ("4 writers + 1 sampler, prioritized 4 KiB: inserts", "items/s"),
    "mixed_smp": ("4 writers + 1 sampler, prioritized 4 KiB: samples", "items/s"),
    "apex_ins": ("Ape-X: 2 writers + 1 sampler of 512: inserts", "items/s"),
    "apex_smp": ("Ape-X: 2 writers + 1 sampler of 512: samples", "items/s"),
    "apex_add_ms": ("Ape-X per call: add(256)", "ms"),
    "apex_sample_ms": ("Ape-X per call: sample(512)", "ms"),
    "update_apex": ("priority updates, 256 a call, Ape-X size", "updates/s"),
    "apex_memory": ("Ape-X server memory (RSS)", "MB"),
}
LOWER_IS_BETTER = {"apex_add_ms", "apex_sample_ms", "apex_memory"}


def config_from_argv() -> dict[str, Any]:
    """The run's configuration, passed by ``run.py`` as one JSON argument."""
    return json.loads(sys.argv[1])


def make_batch(layout: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``n`` random items of ``layout`` as one array per field (leading dimension n)."""
    out = {}
    for field, (shape, dtype) in LAYOUTS[layout].items():
        if np.dtype(dtype).kind == "f":
            out[field] = rng.standard_normal((n, *shape), dtype=np.float32).astype(dtype)
        else:
            out[field] = rng.integers(0, 6, (n, *shape)).astype(dtype)
    return out


def batches(layout: str, count: int, n: int = BATCH, seed: int = 0) -> list[dict[str, Any]]:
    """``count`` pre-made batches (made before timing: generating 1 MiB of random floats
    costs about as much as some peers' add)."""
    rng = np.random.default_rng(seed)
    return [make_batch(layout, n, rng) for _ in range(count)]


def priorities(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.exponential(size=n) + 0.01


def timed_loop(fn: Callable[[int], int], seconds: float, min_calls: int = 3) -> dict[str, float]:
    """Call ``fn(call_index)`` (returning items handled) until ``seconds`` have passed and
    at least ``min_calls`` calls were made: items per second and median ms per call."""
    durations, items = [], 0
    start = time.perf_counter()
    index = 0
    while True:
        t0 = time.perf_counter()
        items += fn(index)
        durations.append(time.perf_counter() - t0)
        index += 1
        if index >= min_calls and time.perf_counter() - start >= seconds:
            break
    elapsed = time.perf_counter() - start
    return {"rate": items / elapsed, "ms": statistics.median(durations) * 1e3, "calls": index}


def rss_mb(pid: int) -> float:
    """Resident set size of process ``pid`` in MB (10^6 bytes), from /proc."""
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024 / 1e6
    raise RuntimeError(f"no VmRSS for process {pid}")


def _worker_main(
    target: Callable[..., Any], args: tuple[Any, ...], barrier: Any, stop_at: Any, queue: Any
) -> None:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = target(*args)  # set-up (connect, open, pre-made batches) before the barrier
    barrier.wait()
    queue.put(work(stop_at))


def run_processes(
    workers: list[tuple[Callable[..., Any], tuple[Any, ...]]], seconds: float
) -> list[dict[str, float]]:
    """Start one spawned process per ``(factory, args)``; each ``factory(*args)`` does its
    set-up and returns ``work(deadline)``, which runs until ``time.time() >=
    deadline.value`` and returns its counts (see :func:`loop_until`). All start their
    timed part together (a barrier); results come back in the order given."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(len(workers) + 1)
    stop_at = ctx.Value("d", 0.0)
    queues = [ctx.Queue() for _ in workers]
    procs = [
        ctx.Process(target=_worker_main, args=(target, args, barrier, stop_at, queue))
        for (target, args), queue in zip(workers, queues, strict=True)
    ]
    for proc in procs:
        proc.start()
    # the deadline is set before the barrier releases anyone, so every worker reads it
    stop_at.value = time.time() + 1e9
    barrier.wait(timeout=600)
    stop_at.value = time.time() + seconds
    results = [queue.get(timeout=seconds + 600) for queue in queues]
    for proc in procs:
        proc.join(timeout=60)
    return results


def loop_until(deadline_ref: Any, fn: Callable[[int], int]) -> dict[str, float]:
    """A worker's timed loop: call ``fn(i)`` until the shared deadline passes; items and
    per-call times (the deadline is re-read each call: it is set after the barrier)."""
    durations, items, index = [], 0, 0
    start = time.perf_counter()
    while time.time() < deadline_ref.value:
        t0 = time.perf_counter()
        items += fn(index)
        durations.append(time.perf_counter() - t0)
        index += 1
    elapsed = time.perf_counter() - start
    return {
        "rate": items / elapsed if elapsed > 0 else 0.0,
        "ms": statistics.median(durations) * 1e3 if durations else float("nan"),
        "calls": index,
    }


def emit(results: dict[str, Any]) -> None:
    """Hand the results to ``run.py``: one JSON object on the last line of stdout."""
    sys.stdout.flush()
    print(json.dumps(results), flush=True)
