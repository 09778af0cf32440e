"""Aggregate add throughput of several writer processes next to raw pipelines, one run.

Usage: python benchmarks/bench_writers.py [--url URL] [--writers 4] [--rounds 3]
       [--seconds 3]

Without --url an embedded server is started. Each round runs, one after the other (which
goes first alternates), ``--writers`` processes of each kind for ``--seconds`` seconds:

* redisbuf: ``ReplayBuffer.add`` of 256 items of ~4 KiB (a float32 row of 1,000 values
  and a log-reward; encoding included, as a user calls it) into one shared FIFO buffer
  that is at capacity, so every add also evicts;
* raw: a redis-py pipeline per batch writing the same pre-encoded bytes with HSET + 2 ZADD
  per item, its ids taken modulo the same capacity (so the raw store stays bounded by
  overwriting, which costs the server less than evicting);
* raw-bulk: the same with one HSET of all 256 blobs and one ZADD per zset (the least
  client work: the ceiling of raw redis-py).

Printed per kind: items/s of all writers together, and the server's CPU time per batch of
256 (INFO cpu, user + sys, over the phase: the bytes' parsing and the commands), with the
ratios redisbuf / raw of the same round. Medians over rounds, then the spread.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import numpy as np
import redis
from _report import record
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, ReplayBuffer, connect
from redisbuf.servers.embedded import EmbeddedServer

BATCH = 256
WIDTH = 1000  # float32 values per item: 4,000 bytes of data, ~4.1 KiB blobs
CAPACITY = 40 * BATCH
NAME = "bench-writers"
RAW = ("raw:w:items", "raw:w:prio", "raw:w:order")


def _batch(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((BATCH, WIDTH), dtype=np.float32),
        "log_rewards": rng.standard_normal(BATCH),
    }


def _writer(kind: str, url: str, index: int, seconds: float, start: Any, out: Any) -> None:
    batch = _batch(index)
    if kind == "redisbuf":
        buffer = ReplayBuffer(connect(url), NAME, capacity=CAPACITY)
        buffer.add(batch)  # scripts loaded, connection open

        def step() -> None:
            buffer.add(batch)
    else:
        client = redis.Redis.from_url(url)  # plain redis-py defaults (hiredis packer)
        blobs, log_rewards, _ = ReplayBuffer(
            connect(url), f"{NAME}-encoder", capacity=1
        ).encode(batch)
        rewards = log_rewards.tolist()
        counter = [index * 7919]

        def step() -> None:
            pipe = client.pipeline(transaction=False)
            for blob, reward in zip(blobs, rewards, strict=True):
                counter[0] += 1
                slot = counter[0] % CAPACITY
                member = b"%012d" % slot
                pipe.hset(RAW[0], member, blob)
                pipe.zadd(RAW[1], {member: reward})
                pipe.zadd(RAW[2], {member: counter[0]})
            pipe.execute()

        if kind == "raw-bulk":

            def step() -> None:
                members = []
                for _ in blobs:
                    counter[0] += 1
                    members.append(b"%012d" % (counter[0] % CAPACITY))
                pipe = client.pipeline(transaction=False)
                pipe.hset(RAW[0], mapping=dict(zip(members, blobs, strict=True)))
                pipe.zadd(RAW[1], dict(zip(members, rewards, strict=True)))
                pipe.zadd(RAW[2], {m: counter[0] - BATCH + i for i, m in enumerate(members)})
                pipe.execute()

        step()
    start.wait()
    done = 0
    begin = time.perf_counter()
    while time.perf_counter() - begin < seconds:
        step()
        done += 1
    out.put((done * BATCH, time.perf_counter() - begin))


def _cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def phase(kind: str, url: str, writers: int, seconds: float) -> tuple[float, float]:
    """(items/s of all writers together, server CPU ms per batch) of one phase."""
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Barrier(writers + 1), ctx.Queue()  # all warmed up, then go
    processes = [
        ctx.Process(target=_writer, args=(kind, url, index, seconds, start, out))
        for index in range(writers)
    ]
    for process in processes:
        process.start()
    client = redis.Redis.from_url(url)
    start.wait(timeout=300)
    cpu_before = _cpu(client)
    results = [out.get(timeout=seconds + 120) for _ in processes]
    cpu = _cpu(client) - cpu_before
    for process in processes:
        process.join(timeout=30)
    items = sum(count for count, _ in results)
    elapsed = max(took for _, took in results)
    return items / elapsed, cpu / (items / BATCH) * 1e3


def _fill(url: str) -> None:
    client = connect(url)
    client.delete(*BufferKeys(NAME).all_keys(), *RAW)
    buffer = ReplayBuffer(client, NAME, capacity=CAPACITY)
    batch = _batch(99)
    for _ in range(CAPACITY // BATCH):  # at capacity: every timed add evicts
        buffer.add(batch)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--writers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="1 round of 2 s")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.seconds = 1, 2.0
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    kinds = ("redisbuf", "raw", "raw-bulk")
    rows: dict[str, list[tuple[float, float]]] = {kind: [] for kind in kinds}
    ratios: dict[str, list[tuple[float, float]]] = {"raw": [], "raw-bulk": []}
    try:
        console.print(
            f"[bold]{args.writers} writer processes[/] on {url}, {args.rounds} rounds of "
            f"{args.seconds:g} s, batches of {BATCH} items of ~4 KiB"
        )
        _fill(url)
        for index in range(args.rounds):
            order = kinds if index % 2 == 0 else kinds[::-1]
            got = {kind: phase(kind, url, args.writers, args.seconds) for kind in order}
            for kind, value in got.items():
                rows[kind].append(value)
            for base in ratios:
                ratios[base].append(
                    (got["redisbuf"][0] / got[base][0], got["redisbuf"][1] / got[base][1])
                )
        table = Table(title=f"{args.writers} writers: redisbuf add vs raw pipelines (medians)")
        for column in ("writers", "items/s", "server CPU ms per batch", "spread items/s"):
            table.add_column(column, justify="right" if column != "writers" else "left")
        for kind, values in rows.items():
            rates = [rate for rate, _ in values]
            table.add_row(
                kind,
                f"{statistics.median(rates):,.0f}",
                f"{statistics.median(cpu for _, cpu in values):.2f}",
                f"{min(rates):,.0f}-{max(rates):,.0f}",
            )
        console.print(table)
        for base, pairs in ratios.items():
            rate_ratios = [r for r, _ in pairs]
            cpu_ratios = [c for _, c in pairs]
            console.print(
                f"redisbuf / {base}: throughput {statistics.median(rate_ratios):.2f} "
                f"({min(rate_ratios):.2f}-{max(rate_ratios):.2f}), target >= 0.80; server "
                f"CPU per batch {statistics.median(cpu_ratios):.2f} "
                f"({min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}), target <= 1.50"
            )
            spread = f"{min(rate_ratios):.2f}-{max(rate_ratios):.2f}"
            ours = statistics.median(rate for rate, _ in rows["redisbuf"])
            theirs = statistics.median(rate for rate, _ in rows[base])
            record(f"add, {args.writers} writer processes vs {base} pipelines", ours, "items/s",
                   baseline=theirs, baseline_name=base, ratio=statistics.median(rate_ratios),
                   spread=spread, target=">= 0.8", series="add, redisbuf", axis="processes",
                   x=args.writers)
            record(f"add server CPU per batch, {args.writers} writers vs {base}",
                   statistics.median(cpu_ratios), "x", target="<= 1.5",
                   spread=f"{min(cpu_ratios):.2f}-{max(cpu_ratios):.2f}")
    finally:
        client = redis.Redis.from_url(url)
        client.delete(*BufferKeys(NAME).all_keys(), *BufferKeys(f"{NAME}-encoder").all_keys(),
                      *RAW)
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
