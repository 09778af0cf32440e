"""SequenceBuffer.get_batch(64, 32) next to a raw redis-py read of the same bytes.

Usage: python benchmarks/bench_sequence.py [--url URL] [--rounds 5] [--quick]

Without --url an embedded server is started. The buffer holds 10^6 steps (100
environments x 10^4 steps; --quick: 10^5) of ~100-byte blobs (obs float32[16], reward,
done, env, pos), episodes ending with probability 0.01 per step. Each round times
``get_batch(64, 32)`` (choose windows in Lua, read 2,048 blobs atomically, decode into
[64, 32, ...] arrays) and, back to back, one HMGET of the same 2,048 step fields of
windows chosen beforehand (no choice, no decode). Printed: medians of windows per second
and of the per-round ratio, for windows inside one episode, windows that may cross
episodes, and prioritized windows.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _report import record, script_stats
from rich.console import Console
from rich.table import Table

from redisbuf import SequenceBuffer, connect
from redisbuf.buffers.sequence import SequenceKeys
from redisbuf.servers.embedded import EmbeddedServer

NUM_ENVS = 100
BATCH, LENGTH = 64, 32


def fill(buf: SequenceBuffer, steps: int) -> None:
    rng = np.random.default_rng(0)
    envs = np.arange(NUM_ENVS)
    for t in range(steps):
        buf.add_batch(
            {
                "env": envs,
                "pos": np.full(NUM_ENVS, t),
                "obs": rng.standard_normal((NUM_ENVS, 16), dtype=np.float32),
                "reward": rng.standard_normal(NUM_ENVS).astype(np.float32),
                "done": rng.random(NUM_ENVS) < 0.01,
            }
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10, help="calls per timed run")
    parser.add_argument("--quick", action="store_true", help="10^5 steps instead of 10^6")
    args = parser.parse_args()
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    client = connect(url)
    steps = (10**5 if args.quick else 10**6) // NUM_ENVS
    name = "bench-seq"
    try:
        client.delete(*SequenceKeys(name).all_keys())
        start = time.perf_counter()
        filler = SequenceBuffer(
            client, name, NUM_ENVS, steps, done_field="done", prioritized_sampling=True
        )
        fill(filler, steps)
        console.print(
            f"filled {len(filler):,} steps in {time.perf_counter() - start:.0f} s "
            f"({len(filler) / (time.perf_counter() - start):,.0f} steps/s)"
        )
        table = Table(title=f"get_batch({BATCH}, {LENGTH}) vs raw HMGET of the same bytes")
        for column in ("windows", "redisbuf windows/s", "raw windows/s", "ratio", "server ms"):
            table.add_column(column, justify="right" if column != "windows" else "left")
        for label, cross, prioritized in (
            ("inside one episode", False, False),
            ("may cross episodes", True, False),
            ("prioritized", False, True),
        ):
            buf = SequenceBuffer(
                client,
                name,
                NUM_ENVS,
                steps,
                done_field="done",
                prioritized_sampling=True,
                allow_cross_episode=cross,
                seed=1,
            )
            buf.prioritized_sampling = prioritized  # one stored buffer, both kinds of draws
            _, info = buf.get_batch(BATCH, LENGTH)
            fields = [
                f"{e}:{p + j}"
                for e, p in zip(info.env_ids.tolist(), info.positions.tolist(), strict=True)
                for j in range(LENGTH)
            ]
            steps_key = SequenceKeys(name).all_keys()[1]
            ours, raw, ratios, server_ms = [], [], [], []
            for _ in range(args.rounds):
                client.config_resetstat()
                t0 = time.perf_counter()
                for _ in range(args.repeat):
                    buf.get_batch(BATCH, LENGTH)
                a = BATCH * args.repeat / (time.perf_counter() - t0)
                stats = script_stats(client)
                server_ms.append(stats.get("usec_per_call", float("nan")) / 1e3)
                t0 = time.perf_counter()
                for _ in range(args.repeat):
                    client.hmget(steps_key, fields)
                b = BATCH * args.repeat / (time.perf_counter() - t0)
                ours.append(a)
                raw.append(b)
                ratios.append(a / b)
            table.add_row(
                label,
                f"{statistics.median(ours):,.0f}",
                f"{statistics.median(raw):,.0f}",
                f"{statistics.median(ratios):.2f}",
                f"{statistics.median(server_ms):.2f}",
            )
            record(f"get_batch({BATCH}, {LENGTH}), {label}", statistics.median(ours),
                   "windows/s", baseline=statistics.median(raw), baseline_name="HMGET",
                   ratio=statistics.median(ratios), spread=f"{min(ratios):.2f}-{max(ratios):.2f}")
        console.print(table)
    finally:
        client.delete(*SequenceKeys(name).all_keys())
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
