"""redisbuf.torchrl's RedisbufStorage against TorchRL's own Redis storage (StoreStorage,
on tensordict's TensorDictStore), both through TorchRL's API, in one run on one server.

Usage: python benchmarks/bench_torchrl.py [--url URL] [--rounds 3] [--seconds 2] [--quick]

Without --url an embedded server is started. For 4 KiB items (1,024 float32) and ~200 B
items (two 20-float observations, an action, a reward, a done flag), each storage backs a
``TensorDictReplayBuffer`` (TorchRL's default writer and RandomSampler on StoreStorage;
RedisbufWriter and RedisbufSampler on RedisbufStorage) of capacity 2x10^4, filled first;
then ``rb.extend(td)`` of 256 items and ``rb.sample()`` of 256 items are timed for
``--seconds`` each. The two storages alternate within every round (the order flips each
round), and the ratio printed is the median over rounds of redisbuf / StoreStorage.
Targets: extend >= 1.0x, sample >= 2.0x.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlparse

import torch
from _report import record
from rich.console import Console
from rich.table import Table
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import StoreStorage

from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.torchrl import RedisbufStorage

BATCH = 256
PRE = 8


def make(layout: str, n: int, seed: int) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    if layout == "4k":
        return TensorDict({"obs": torch.randn(n, 1024, generator=g)}, [n])
    return TensorDict({
        "obs": torch.randn(n, 20, generator=g), "next_obs": torch.randn(n, 20, generator=g),
        "action": torch.randint(0, 6, (n,), generator=g), "reward": torch.randn(n, generator=g),
        "done": torch.zeros(n),
    }, [n])


def rate(fn: Callable[[int], None], seconds: float) -> float:
    count, start = 0, time.perf_counter()
    while count < 3 or time.perf_counter() - start < seconds:
        fn(count)
        count += 1
    return count * BATCH / (time.perf_counter() - start)


def build(kind: str, url: str, capacity: int) -> TensorDictReplayBuffer:
    if kind == "StoreStorage":
        parsed = urlparse(url)
        storage = StoreStorage(capacity, host=parsed.hostname, port=parsed.port)
    else:
        storage = RedisbufStorage(url, f"bench-trl-{uuid.uuid4().hex[:8]}", capacity)
    return TensorDictReplayBuffer(storage=storage, batch_size=BATCH)


def measure(kind: str, url: str, layout: str, capacity: int, seconds: float) -> dict:
    rb = build(kind, url, capacity)
    fill = make(layout, 2000, 1)
    for _ in range(capacity // 2000):
        rb.extend(fill.clone())
    pre = [make(layout, BATCH, s) for s in range(PRE)]
    # extend writes "index" into its argument: give each call a fresh shallow copy
    add = rate(lambda i: rb.extend(pre[i % PRE].copy()), seconds)
    sample = rate(lambda i: rb.sample(), seconds)
    rb.empty()
    return {"extend": add, "sample": sample}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--quick", action="store_true", help="1 s per figure, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.seconds, args.rounds = 1.0, 2
    server = None if args.url else EmbeddedServer().__enter__()
    url = args.url or server.url
    kinds = ["RedisbufStorage", "StoreStorage"]
    results: dict[tuple[str, str], list[dict]] = {}
    try:
        for round_ in range(args.rounds):
            for layout in ("4k", "200b"):
                for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                    results.setdefault((layout, kind), []).append(
                        measure(kind, url, layout, 20_000, args.seconds))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    table = Table(title=f"TorchRL TensorDictReplayBuffer, capacity 2x10^4, batches of {BATCH}, "
                        f"median of {args.rounds} interleaved rounds (items/s)")
    for column in ("items", "op", "RedisbufStorage", "StoreStorage", "ratio", "per round",
                   "target"):
        table.add_column(column)
    for layout in ("4k", "200b"):
        for op, target in (("extend", 1.0), ("sample", 2.0)):
            ours = [r[op] for r in results[(layout, "RedisbufStorage")]]
            theirs = [r[op] for r in results[(layout, "StoreStorage")]]
            ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
            met = "met" if statistics.median(ratios) >= target else "MISSED"
            size = "4 KiB" if layout == "4k" else "~200 B"
            record(f"{op} of {BATCH}, {size} items", statistics.median(ours), "items/s",
                   baseline=statistics.median(theirs), baseline_name="StoreStorage",
                   ratio=statistics.median(ratios),
                   spread=f"{min(ratios):.2f}-{max(ratios):.2f}", target=f">= {target:.1f}",
                   key=f"{op}-{layout}")
            table.add_row(size, op,
                          f"{statistics.median(ours):,.0f}", f"{statistics.median(theirs):,.0f}",
                          f"{statistics.median(ratios):.2f}x",
                          ", ".join(f"{r:.2f}" for r in ratios),
                          f">= {target:.1f}x {met}")
    Console(width=160).print(table)


if __name__ == "__main__":
    main()
