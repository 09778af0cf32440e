"""A PER learner loop through the prefetching reader against its step alone, in one run.

Usage: python benchmarks/bench_prefetch.py [--url URL] [--rounds 3] [--steps 200]
                                           [--quick] [--step sleep|matmul] [--batch 256]

Without --url an embedded server is started. A buffer of 10^5 transitions (10^4 with
--quick; two 32-float observations, an action and a reward, ~300 bytes each) is sampled
with ``PERSampler``. A learner step is ``info = next(batches)`` (``sample_with_info(256)``),
a 5 ms step (``--step sleep``: ``time.sleep(0.005)``, a GPU step leaving the CPU idle;
``--step matmul``: a one-thread torch matmul loop calibrated to 5 ms, a CPU step), then
``update_priority(info.ids, new priorities)``: either by the learner itself
(``buffer.update_priority``, in its thread) or handed to the prefetch thread
(``Prefetcher.update_priority``). Each is run with ``prefetch=0`` (draws on demand: the
loop without a reader), 1, 2 (the default) and 4.

The baseline is the 5 ms step alone; every round times it and each loop back to back
(``--steps`` steps each, after one untimed step), and the ratios printed are medians of
the per-round ratios (target: >= 0.9x the step alone). Each round also times
``sample_with_info(256)`` and ``update_priority(256)`` alone (20 calls each): one server
runs every script one at a time, so no reader can make the loop faster than one step per
(sample + update) of those, the "ceiling" column, and "x ceiling" is a loop's rate over
min(step alone, ceiling): how much of what the server allows the reader reaches.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import record
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, Prefetcher, ReplayBuffer, connect
from redisbuf.servers.embedded import EmbeddedServer

BATCH = 256
STEP_S = 0.005
OBS = 32
PREFETCH = (0, 1, 2, 4)
DEFAULT_PREFETCH = 2


def sleep_step() -> Callable[[], None]:
    return lambda: time.sleep(STEP_S)


def matmul_step() -> Callable[[], None]:
    """A torch matmul loop on one thread, its repeat count calibrated to take 5 ms."""
    import torch

    torch.set_num_threads(1)
    a = torch.randn(128, 128)

    def run(times: int) -> None:
        b = a
        for _ in range(times):
            b = torch.tanh(b @ a)

    times = 1
    while True:
        start = time.perf_counter()
        run(times)
        took = time.perf_counter() - start
        if took > STEP_S / 4:
            break
        times *= 2
    times = max(1, round(times * STEP_S / took))
    samples = []
    for _ in range(20):
        start = time.perf_counter()
        run(times)
        samples.append(time.perf_counter() - start)
    times = max(1, round(times * STEP_S / statistics.median(samples)))
    return lambda: run(times)


def fill(url: str, name: str, size: int) -> ReplayBuffer:
    client = connect(url)
    client.delete(*BufferKeys(name).all_keys())
    buffer = ReplayBuffer(client, name, capacity=size, sampler=PERSampler(), seed=1)
    rng = np.random.default_rng(size)
    chunk = 1000  # one add stores at most bounds.MAX_ADD_ITEMS items
    for start in range(0, size, chunk):
        count = min(chunk, size - start)
        buffer.add(
            {
                "obs": rng.standard_normal((count, OBS), dtype=np.float32),
                "next_obs": rng.standard_normal((count, OBS), dtype=np.float32),
                "action": rng.integers(0, 4, count),
                "reward": rng.standard_normal(count, dtype=np.float32),
            },
            priorities=rng.exponential(size=count),
        )
    # filling leaves Lua garbage the server's GC would sweep during the timed loops
    client.script_flush()
    buffer.sample_with_info(BATCH)
    return buffer


def step_alone(step: Callable[[], None], steps: int) -> float:
    step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return steps / (time.perf_counter() - start)


def learner(
    buffer: ReplayBuffer,
    step: Callable[[], None],
    steps: int,
    prefetch: int,
    handed: bool,
    priorities: list[np.ndarray],
) -> float:
    """Steps per second of the loop: next batch, step, update its priorities."""
    with Prefetcher(buffer, BATCH, prefetch=prefetch) as batches:
        update = batches.update_priority if handed else buffer.update_priority
        info = next(batches)  # untimed: the thread has started and the queue is filling
        update(info.ids, priorities[0])
        start = time.perf_counter()
        for i in range(steps):
            info = next(batches)
            step()
            update(info.ids, priorities[i % len(priorities)])
        took = time.perf_counter() - start
    return steps / took


def cost_ms(fn: Callable[[], Any], calls: int = 20) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def main() -> None:
    global BATCH
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200, help="timed steps per loop")
    parser.add_argument("--quick", action="store_true", help="10^4 items, 100 steps")
    parser.add_argument("--step", choices=("sleep", "matmul"), default="sleep")
    parser.add_argument("--batch", type=int, default=BATCH, help="items per sample / update")
    args = parser.parse_args()
    BATCH = args.batch
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    size = 10**4 if args.quick else 10**5
    steps = 100 if args.quick and args.steps == 200 else args.steps
    step = sleep_step() if args.step == "sleep" else matmul_step()
    try:
        buffer = fill(url, "bench-prefetch", size)
        rng = np.random.default_rng(0)
        priorities = [rng.exponential(size=BATCH) for _ in range(64)]
        ids = buffer.sample_with_info(BATCH).ids
        variants = [(k, handed) for handed in (False, True) for k in PREFETCH if k or not handed]
        alone: list[float] = []
        sample_ms: list[float] = []
        update_ms: list[float] = []
        step_ms: list[float] = []
        rates: dict[tuple[int, bool], list[float]] = {v: [] for v in variants}
        ratios: dict[tuple[int, bool], list[float]] = {v: [] for v in variants}
        for _ in range(args.rounds):
            sample_ms.append(cost_ms(lambda: buffer.sample_with_info(BATCH)))
            update_ms.append(cost_ms(lambda: buffer.update_priority(ids, priorities[0])))
            step_ms.append(cost_ms(step))
            for variant in variants:
                base = step_alone(step, steps)
                alone.append(base)
                rate = learner(buffer, step, steps, *variant, priorities)
                rates[variant].append(rate)
                ratios[variant].append(rate / base)
        base_rate = statistics.median(alone)
        sample_cost, update_cost = statistics.median(sample_ms), statistics.median(update_ms)
        ceiling = 1e3 / (sample_cost + update_cost)
        bound = min(base_rate, ceiling)
        table = Table(
            title=f"PER learner loop, {size:,} items, sample_with_info({BATCH}) + "
            f"{args.step} step of {STEP_S * 1e3:.0f} ms + update_priority({BATCH}) "
            f"(medians of {args.rounds} rounds x {steps} steps)"
        )
        for column in ("update_priority by", "prefetch", "steps/s", "x step alone", "x ceiling"):
            table.add_column(column, justify="left" if column.startswith("update") else "right")
        table.add_row("(step alone)", "-", f"{base_rate:,.1f}", "1.00", "")
        table.add_row("(ceiling)", "-", f"{ceiling:,.1f}", f"{ceiling / base_rate:.2f}", "")
        for variant in variants:
            k, handed = variant
            who = "prefetch thread" if handed else "learner"
            label = f"{k} (default)" if k == DEFAULT_PREFETCH else str(k)
            ratio = statistics.median(ratios[variant])
            rate = statistics.median(rates[variant])
            table.add_row(who, label, f"{rate:,.1f}", f"{ratio:.2f}", f"{rate / bound:.2f}")
            record(
                f"PER learner steps/s, batch {BATCH}, prefetch={k}, update by {who}, {size:,} "
                "items",
                rate,
                "steps/s",
                baseline=base_rate,
                baseline_name=f"{STEP_S * 1e3:.0f} ms step alone",
                ratio=ratio,
                spread=f"{min(ratios[variant]):.2f}-{max(ratios[variant]):.2f}",
                target=">= 0.9" if k else None,
            )
        console.print(table)
        console.print(
            f"alone: sample_with_info({BATCH}) {sample_cost:.2f} ms, update_priority({BATCH}) "
            f"{update_cost:.2f} ms, the step {statistics.median(step_ms):.2f} ms (medians "
            f"over rounds of the mean of 20 calls); ceiling {ceiling:,.1f} steps/s"
        )
        best = max(variants, key=lambda v: statistics.median(rates[v]))
        record(
            f"PER learner, batch {BATCH}, best reader loop / server ceiling, {size:,} items",
            statistics.median(rates[best]) / bound,
            "x",
            target=">= 0.8",
        )
        console.print(f"load average: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
        buffer.drop()
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
