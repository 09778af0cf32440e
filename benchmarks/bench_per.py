"""Prioritized experience replay cost against buffer size, measured in one run.

Usage: python benchmarks/bench_per.py [--url URL] [--rounds 5] [--quick | --big N]

Without --url an embedded server is started. For 10^4 and 10^6 items (10^5 with
--quick, N with --big) holding random PER priorities, it times ``update_priority`` of
256 random ids and ``PERSampler`` ``sample(256)`` (small items, so the tree walk and
the script dominate, not decoding), as medians over rounds of 20 calls, with the
server's own time per script call. The 10^4 figures are the baseline: the printed
ratios are cost at the large size / cost at 10^4 (targets: <= 3 for the update, <= 2
for the sample), then the update rate against 0.25x Reverb's (issue 18). Each size is
timed from a fresh Lua state (SCRIPT FLUSH after filling), so the one-off fill's
garbage is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import record
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, connect
from redisbuf.server import EmbeddedServer

BATCH = 256
CALLS = 20
REVERB_UPDATES = 1_240_000  # Reverb's mutate_priorities, 256 a call (issue 18)


def timed(client: Any, fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """(median ms per call, median server ms per script call) over ``rounds``."""
    times, server = [], []
    for _ in range(rounds):
        client.config_resetstat()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - start) / CALLS * 1e3)
        stats = client.info("commandstats").get("cmdstat_evalsha", {})
        server.append(stats.get("usec_per_call", float("nan")) / 1e3)
    return statistics.median(times), statistics.median(server)


def bench_size(url: str, size: int, rounds: int) -> dict[str, tuple[float, float]]:
    client = connect(url)
    name = f"bench-per-{size}"
    client.delete(*BufferKeys(name).all_keys())
    filler = ReplayBuffer(client, name, capacity=size)
    rng = np.random.default_rng(size)
    chunk = 10_000
    for start in range(0, size, chunk):
        count = min(chunk, size - start)
        filler.add({"x": np.arange(start, start + count, dtype=np.int32).reshape(-1, 1)})
    buffer = ReplayBuffer(client, name, capacity=size, sampler=PERSampler(), seed=1)
    ids = np.arange(1, size + 1)
    for start in range(0, size, chunk):
        part = ids[start : start + chunk]
        buffer.update_priority(part, rng.exponential(size=len(part)))
    # Filling and turning PER on for 10^6 items leaves hundreds of MB of Lua garbage that
    # the server's incremental GC would sweep during the timed calls: start them from a
    # fresh Lua state (SCRIPT FLUSH), as a long-running buffer would be in steady state.
    client.script_flush()
    buffer.sample(BATCH)  # scripts loaded

    # ids and priorities drawn before timing: choosing 256 of 10^6 ids in numpy costs
    # more than the call itself
    calls = [
        (rng.choice(ids, BATCH, replace=False), rng.exponential(size=BATCH))
        for _ in range(rounds * CALLS)
    ]
    pending = iter(calls)

    def update() -> None:
        buffer.update_priority(*next(pending))

    out = {
        "update_priority(256)": timed(client, update, rounds),
        "PER sample(256)": timed(client, lambda: buffer.sample(BATCH), rounds),
    }
    buffer.drop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10^5 instead of 10^6 items")
    parser.add_argument("--big", type=float, help="the large size (default 10^6)")
    args = parser.parse_args()
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    big = int(args.big) if args.big else 10**5 if args.quick else 10**6
    try:
        small_rows = bench_size(url, 10**4, args.rounds)
        big_rows = bench_size(url, big, args.rounds)
        table = Table(title=f"PER cost vs buffer size (medians of {args.rounds} x {CALLS} calls)")
        for column in ("operation", "items", "ms per call", "server ms per call"):
            table.add_column(column, justify="left" if column == "operation" else "right")
        for label in small_rows:
            for size, rows in ((10**4, small_rows), (big, big_rows)):
                ms, server_ms = rows[label]
                table.add_row(label, f"{size:,}", f"{ms:.2f}", f"{server_ms:.2f}")
        console.print(table)
        targets = {"update_priority(256)": 3.0, "PER sample(256)": 2.0}
        for label in small_rows:
            ratio = big_rows[label][0] / small_rows[label][0]
            server_ratio = big_rows[label][1] / small_rows[label][1]
            for size, rows in ((10**4, small_rows), (big, big_rows)):
                record(f"{label}, {size:,} items", BATCH / rows[label][0] * 1e3, "items/s",
                       series=f"PER {label}".replace("PER PER", "PER"), axis="items", x=size)
            record(f"{label} cost, {big:,} / 10^4 items", ratio, "x", target="<= 3")
            console.print(
                f"{label}: cost at {big:,} / cost at 10,000 = {ratio:.2f} "
                f"(server time {server_ratio:.2f}); target <= {targets[label]:.2f}"
            )
        for size, rows in ((10**4, small_rows), (big, big_rows)):
            rate = BATCH / rows["update_priority(256)"][0] * 1e3
            console.print(
                f"update_priority at {size:,} items: {rate:,.0f} updates/s; target >= "
                f"{REVERB_UPDATES * 0.25:,.0f} (0.25x Reverb's mutate_priorities, "
                f"{REVERB_UPDATES:,}/s in issue 18)"
            )
        with open("/proc/loadavg") as f:
            console.print(f"load average: {' '.join(f.read().split()[:3])}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
