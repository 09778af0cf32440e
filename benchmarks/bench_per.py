"""Prioritized experience replay cost against buffer size, measured in one run.

Usage: python benchmarks/bench_per.py [--url URL] [--rounds 5] [--quick | --big N]
                                      [--against REF]

Without --url an embedded server is started. For 10^4 and 10^6 items (10^5 with
--quick, N with --big) holding random PER priorities, it times ``update_priority`` of
256 random ids and ``PERSampler`` ``sample(256)`` (small items, so the draw and the
script dominate, not decoding), as medians over rounds of 20 calls, with the server's
own time per script call. The 10^4 figures are the baseline: the printed ratios are
cost at the large size / cost at 10^4 (target <= 1.5 for both, issue 23), then the
update rate (benchmarks/peers/run.py sets it beside Reverb's). Each size is
timed from a fresh Lua state (SCRIPT FLUSH after filling), so the one-off fill's
garbage is not counted.

``--against REF`` also runs the same measurements, on the same server and in the same
run, with the package as of git revision REF (checked out in a temporary worktree and put
first on PYTHONPATH of a child process), and prints each figure's ratio new / REF: how a
design change moved the cost, measured side by side rather than against old numbers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import record, script_stats
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, connect
from redisbuf.servers.embedded import EmbeddedServer

BATCH = 256
CALLS = 20


def timed(client: Any, fn: Callable[[], Any], rounds: int) -> tuple[float, float]:
    """(median ms per call, median server ms per script call) over ``rounds``."""
    times, server = [], []
    for _ in range(rounds):
        client.config_resetstat()
        start = time.perf_counter()
        for _ in range(CALLS):
            fn()
        times.append((time.perf_counter() - start) / CALLS * 1e3)
        stats = script_stats(client)
        server.append(stats.get("usec_per_call", float("nan")) / 1e3)
    return statistics.median(times), statistics.median(server)


def bench_size(url: str, size: int, rounds: int) -> dict[str, tuple[float, float]]:
    client = connect(url)
    name = f"bench-per-{size}"
    client.delete(*BufferKeys(name).all_keys())
    filler = ReplayBuffer(client, name, capacity=size)
    rng = np.random.default_rng(size)
    chunk = 1000  # one add stores at most bounds.MAX_ADD_ITEMS items
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


def measure(url: str, big: int, rounds: int) -> dict[int, dict[str, tuple[float, float]]]:
    return {10**4: bench_size(url, 10**4, rounds), big: bench_size(url, big, rounds)}


def measure_at(ref: str, url: str, big: int, rounds: int) -> dict[int, dict[str, Any]]:
    """The same measurements with the package of git revision ``ref`` (a child process)."""
    root = subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True,
                          capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        tree = os.path.join(tmp, "tree")
        subprocess.run(["git", "-C", root, "worktree", "add", "--detach", tree, ref],
                       check=True, capture_output=True)
        try:
            env = {**os.environ, "PYTHONPATH": tree}
            out = subprocess.run(
                [sys.executable, __file__, "--url", url, "--big", str(big), "--rounds",
                 str(rounds), "--json"],
                check=True, capture_output=True, text=True, env=env, cwd=tmp,
            ).stdout
        finally:
            subprocess.run(["git", "-C", root, "worktree", "remove", "--force", tree],
                           check=False, capture_output=True)
    return {int(size): rows for size, rows in json.loads(out.strip().splitlines()[-1]).items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="10^5 instead of 10^6 items")
    parser.add_argument("--big", type=float, help="the large size (default 10^6)")
    parser.add_argument("--against", metavar="REF", help="also measure git revision REF")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    big = int(args.big) if args.big else 10**5 if args.quick else 10**6
    try:
        if args.json:
            print(json.dumps(measure(url, big, args.rounds)))
            return
        results = measure(url, big, args.rounds)
        before = measure_at(args.against, url, big, args.rounds) if args.against else None
        small_rows, big_rows = results[10**4], results[big]
        title = f"PER cost vs buffer size (medians of {args.rounds} x {CALLS} calls)"
        table = Table(title=title)
        columns = ["operation", "items", "ms per call", "server ms per call"]
        if before:
            columns += [f"ms at {args.against}", f"server ms at {args.against}", "new / old"]
        for column in columns:
            table.add_column(column, justify="left" if column == "operation" else "right")
        for label in small_rows:
            for size, rows in ((10**4, small_rows), (big, big_rows)):
                ms, server_ms = rows[label]
                cells = [label, f"{size:,}", f"{ms:.2f}", f"{server_ms:.2f}"]
                if before:
                    old_ms, old_server = before[size][label]
                    cells += [f"{old_ms:.2f}", f"{old_server:.2f}", f"{ms / old_ms:.2f}"]
                table.add_row(*cells)
        console.print(table)
        targets = {"update_priority(256)": 1.5, "PER sample(256)": 1.5}
        for label in small_rows:
            ratio = big_rows[label][0] / small_rows[label][0]
            server_ratio = big_rows[label][1] / small_rows[label][1]
            for size, rows in ((10**4, small_rows), (big, big_rows)):
                record(f"{label}, {size:,} items", BATCH / rows[label][0] * 1e3, "items/s",
                       series=f"PER {label}".replace("PER PER", "PER"), axis="items", x=size)
            record(f"{label} cost, {big:,} / 10^4 items", ratio, "x", target="<= 1.5")
            console.print(
                f"{label}: cost at {big:,} / cost at 10,000 = {ratio:.2f} "
                f"(server time {server_ratio:.2f}); target <= {targets[label]:.2f}"
            )
        for size, rows in ((10**4, small_rows), (big, big_rows)):
            rate = BATCH / rows["update_priority(256)"][0] * 1e3
            console.print(
                f"update_priority at {size:,} items: {rate:,.0f} updates/s; target >= "
                f"Reverb's mutate_priorities (benchmarks/peers/run.py measures both)"
            )
        with open("/proc/loadavg") as f:
            console.print(f"load average: {' '.join(f.read().split()[:3])}")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
