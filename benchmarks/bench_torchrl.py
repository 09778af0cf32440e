"""redisbuf.torchrl's RedisbufStorage against TorchRL's own Redis storage (StoreStorage,
on tensordict's TensorDictStore) and its in-process LazyTensorStorage, all through
TorchRL's API, in one run on one server; and slice sampling (redisbuf.torchrl_slices)
against TorchRL's SliceSampler on a LazyTensorStorage.

Usage: python benchmarks/bench_torchrl.py [--url URL] [--rounds 3] [--seconds 2] [--quick]

Without --url an embedded server is started. For 4 KiB items (1,024 float32) and ~200 B
items (two 20-float observations, an action, a reward, a done flag), each storage backs a
``TensorDictReplayBuffer`` (TorchRL's default writer and RandomSampler on StoreStorage;
RedisbufWriter and RedisbufSampler on RedisbufStorage) of capacity 2x10^4, filled first;
then ``rb.extend(td)`` of 256 items and ``rb.sample()`` of 256 items are timed for
``--seconds`` each. The two storages alternate within every round (the order flips each
round), and the ratio printed is the median over rounds of redisbuf / StoreStorage, and
of redisbuf / LazyTensorStorage (a buffer of one process: the price of sharing, no
target). Targets: extend >= 1.0x, sample >= 2.0x StoreStorage.

Slices: 2x10^4 steps of ~200 B from 8 environments, episodes of 100 steps;
``sample()`` of 256 steps as 16 slices of 16 (``SliceSampler(slice_len=16)``): TorchRL's
on a ``LazyTensorStorage`` (trajectories found from ``("next", "done")``) against
``RedisbufSliceStorage`` (one stream per environment, windows drawn by the server).
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
from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
from torchrl.data.replay_buffers import StoreStorage
from torchrl.data.replay_buffers.samplers import SliceSampler

from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.torchrl import RedisbufStorage
from redisbuf.torchrl_slices import RedisbufSliceStorage

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
    elif kind == "LazyTensorStorage":
        storage = LazyTensorStorage(capacity)
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


ENVS, EPISODE, SLICE = 8, 100, 16


def steps(seed: int) -> TensorDict:
    """A collector's batch [ENVS, 2,500] of ~200 B steps, an episode ending every 100."""
    td = make("200b", ENVS * 2500, seed).reshape(ENVS, 2500)
    step = torch.arange(2500).expand(ENVS, 2500)
    td["next", "done"] = ((step + 1) % EPISODE == 0).unsqueeze(-1)
    return td


def measure_slices(kind: str, url: str, seconds: float) -> float:
    data = steps(3)
    if kind == "RedisbufSliceStorage":
        storage = RedisbufSliceStorage(url, f"bench-trl-slices-{uuid.uuid4().hex[:8]}",
                                       ENVS * 2500, num_environments=ENVS)
        rb = TensorDictReplayBuffer(storage=storage, sampler=SliceSampler(slice_len=SLICE),
                                    batch_size=BATCH)
        rb.extend(data)
    else:
        rb = TensorDictReplayBuffer(storage=LazyTensorStorage(ENVS * 2500),
                                    sampler=SliceSampler(slice_len=SLICE,
                                                         end_key=("next", "done")),
                                    batch_size=BATCH)
        rb.extend(data.reshape(-1))  # each environment's steps in order, one after another
    sampled = rate(lambda i: rb.sample(), seconds)
    if kind == "RedisbufSliceStorage":
        storage.buffer.drop()
    return sampled


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
    kinds = ["RedisbufStorage", "StoreStorage", "LazyTensorStorage"]
    slice_kinds = ["RedisbufSliceStorage", "LazyTensorStorage"]
    results: dict[tuple[str, str], list[dict]] = {}
    slices: dict[str, list[float]] = {}
    try:
        for round_ in range(args.rounds):
            for layout in ("4k", "200b"):
                for kind in kinds if round_ % 2 == 0 else kinds[::-1]:
                    results.setdefault((layout, kind), []).append(
                        measure(kind, url, layout, 20_000, args.seconds))
            for kind in slice_kinds if round_ % 2 == 0 else slice_kinds[::-1]:
                slices.setdefault(kind, []).append(measure_slices(kind, url, args.seconds))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    table = Table(title=f"TorchRL TensorDictReplayBuffer, capacity 2x10^4, batches of {BATCH}, "
                        f"median of {args.rounds} interleaved rounds (items/s)")
    for column in ("items", "op", "redisbuf", "baseline", "items/s", "baseline items/s",
                   "ratio", "per round", "target"):
        table.add_column(column)

    def row(label: str, op: str, ours: list[float], theirs: list[float], baseline: str,
            key: str, target: float | None, ours_name: str = "RedisbufStorage") -> None:
        ratios = [a / b for a, b in zip(ours, theirs, strict=True)]
        median = statistics.median(ratios)
        record(f"{op}, {label}, {ours_name} vs {baseline}", statistics.median(ours),
               "items/s", baseline=statistics.median(theirs), baseline_name=baseline,
               ratio=median, spread=f"{min(ratios):.2f}-{max(ratios):.2f}",
               target=None if target is None else f">= {target:.1f}", key=key)
        verdict = "-" if target is None else (
            f">= {target:.1f}x {'met' if median >= target else 'MISSED'}")
        table.add_row(label, op, ours_name, baseline, f"{statistics.median(ours):,.0f}",
                      f"{statistics.median(theirs):,.0f}", f"{median:.2f}x",
                      ", ".join(f"{r:.2f}" for r in ratios), verdict)

    for layout in ("4k", "200b"):
        size = "4 KiB items" if layout == "4k" else "~200 B items"
        for op, target in (("extend", 1.0), ("sample", 2.0)):
            ours = [r[op] for r in results[(layout, "RedisbufStorage")]]
            for baseline in ("StoreStorage", "LazyTensorStorage"):
                theirs = [r[op] for r in results[(layout, baseline)]]
                suffix = "" if baseline == "StoreStorage" else "-lts"
                row(size, f"{op} of {BATCH}", ours, theirs, baseline,
                    f"{op}-{layout}{suffix}", target if baseline == "StoreStorage" else None)
    row(f"{BATCH // SLICE} slices of {SLICE} steps, ~200 B", f"sample of {BATCH}",
        slices["RedisbufSliceStorage"], slices["LazyTensorStorage"],
        "LazyTensorStorage + SliceSampler", "sample-slices-lts", None,
        ours_name="RedisbufSliceStorage")
    Console(width=180).print(table)


if __name__ == "__main__":
    main()
