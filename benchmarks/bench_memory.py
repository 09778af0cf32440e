"""Server memory per item: redisbuf buffers against the same blobs stored raw, one run.

Usage: python benchmarks/bench_memory.py [--url URL] [--items 200000] [--large 20000]

Without --url an embedded server is started. For transitions of 200 bytes (--items of
them) and trajectories of about 4 KiB (--large of them) it fills, one after the other on
an otherwise idle server: a plain redisbuf buffer (uniform sampling), a PER buffer
(PERSampler: the PER priorities are the mass log and, once a sampler follows, its
snapshot; filled with no sampler, the log holds every add), the same PER buffer once a
sampler has drawn from it (its replica published a snapshot, and one more add trimmed
the log to what it keeps behind it), and the raw redis-py layout of the same blobs (one
hash, the same 12-digit ids as fields, the blobs read back from the buffer).
Each figure is the server's ``used_memory`` after the fill minus before it, from a fresh
Lua state (SCRIPT FLUSH) each time, divided by the number of items. Printed: bytes per
item, bytes per item beyond the blob, and the ratio to raw; targets: <= 250 B beyond the
blob for 200-byte transitions (<= 220 B with PER), <= 1.02x raw for 4 KiB items.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import numpy as np
from _report import record
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, connect
from redisbuf.servers.embedded import EmbeddedServer

FILL = 1000  # one add stores at most bounds.MAX_ADD_ITEMS items


def small(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Transitions of 200 bytes once encoded (as in bench_apex.py)."""
    return {
        "obs": rng.standard_normal((n, 16), dtype=np.float32),
        "next_obs": rng.standard_normal((n, 16), dtype=np.float32),
        "action": rng.integers(0, 18, n),
        "reward": rng.standard_normal(n).astype(np.float32),
    }


def large(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """Trajectories of about 4 KiB once encoded (float32[1000] states and a reward)."""
    return {
        "states": rng.standard_normal((n, 1000), dtype=np.float32),
        "log_rewards": rng.standard_normal(n),
    }


def used(client: Any) -> int:
    client.script_flush()
    return int(client.info("memory")["used_memory"])


def measure(client: Any, fill: Callable[[], None]) -> int:
    before = used(client)
    fill()
    return used(client) - before


def fill_buffer(client: Any, name: str, items: int, make: Any, sampler: Any,
                sampled: bool = False) -> None:
    buffer = ReplayBuffer(client, name, capacity=items, sampler=sampler)
    rng = np.random.default_rng(1)
    batch = make(rng, min(FILL, items))
    for done in range(0, items, FILL):
        count = min(FILL, items - done)
        buffer.add(
            batch
            if count == len(next(iter(batch.values())))
            else {k: v[:count] for k, v in batch.items()}
        )
    if sampled:  # a sampler's first read publishes a snapshot; the next add trims the log
        buffer.sample(1)
        part = {k: v[: min(FILL, items)] for k, v in batch.items()}
        buffer.add(part)
        buffer.view.replicas.clear()


def fill_raw(client: Any, source: str, target: str) -> None:
    """HSET into ``target`` every field of the hash ``source``, 1,000 per pipeline."""
    cursor = 0
    while True:
        cursor, part = client.hscan(source, cursor, count=1000)
        if part:
            client.hset(target, mapping=part)
        if cursor == 0:
            return


def sizes(client: Any, label: str, items: int, make: Any) -> list[tuple[str, float, float]]:
    """(layout, bytes per item, mean blob bytes) for one item shape."""
    tag = label.replace(" ", "")
    plain, per, raw = f"mem-{tag}-plain", f"mem-{tag}-per", f"mem-{tag}-raw"
    for name in (plain, per):
        client.delete(*BufferKeys(name).all_keys())
    client.delete(raw)
    rows = []
    plain_bytes = measure(client, lambda: fill_buffer(client, plain, items, make, None))
    items_key = BufferKeys(plain).items
    blob = sum(client.hstrlen(items_key, f) for f in client.hrandfield(items_key, 200)) / 200
    raw_bytes = measure(client, lambda: fill_raw(client, items_key, raw))
    client.delete(raw)
    client.delete(*BufferKeys(plain).all_keys())
    per_bytes = measure(client, lambda: fill_buffer(client, per, items, make, PERSampler()))
    client.delete(*BufferKeys(per).all_keys(), BufferKeys(per).snap)
    sampled_bytes = measure(client, lambda: fill_buffer(client, per, items, make, PERSampler(),
                                                        sampled=True))
    client.delete(*BufferKeys(per).all_keys(), BufferKeys(per).snap)
    rows.append(("raw redis-py hash", raw_bytes / items, blob))
    rows.append(("redisbuf, uniform", plain_bytes / items, blob))
    rows.append(("redisbuf, PER", per_bytes / items, blob))
    rows.append(("redisbuf, PER, sampled", sampled_bytes / items, blob))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--items", type=int, default=200_000, help="200-byte transitions")
    parser.add_argument("--large", type=int, default=20_000, help="4 KiB trajectories")
    parser.add_argument("--quick", action="store_true", help="5x10^4 and 5x10^3 items")
    args = parser.parse_args()
    if args.quick:
        args.items, args.large = 50_000, 5_000
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    try:
        client = connect(url)
        table = Table(title="Server memory per item (used_memory deltas, one run)")
        for column in ("items", "layout", "B per item", "beyond the blob", "ratio to raw"):
            table.add_column(column, justify="left" if column in ("items", "layout") else "right")
        for label, count, make in (("200 B", args.items, small), ("4 KiB", args.large, large)):
            rows = sizes(client, label, count, make)
            raw = rows[0][1]
            for layout, per_item, blob in rows:
                table.add_row(
                    f"{count:,} x {blob:.0f} B",
                    layout,
                    f"{per_item:.0f}",
                    f"{per_item - blob:.0f}",
                    f"{per_item / raw:.3f}",
                )
                if layout != rows[0][0]:
                    target = None
                    if label == "200 B":
                        target = "<= 220" if "PER" in layout else "<= 250"
                    record(f"memory, {label} items, {layout}: beyond the blob",
                           per_item - blob, "B", target=target)
                    if label == "4 KiB":
                        record(f"memory, 4 KiB items, {layout} vs raw", per_item, "B",
                               baseline=raw, baseline_name=rows[0][0], target="<= 1.02")
        console.print(table)
        console.print("targets: 200 B items <= 250 B beyond the blob (<= 220 B with PER); "
                      "4 KiB items <= 1.02x raw")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
