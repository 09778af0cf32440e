"""Throughput of add and sample next to raw redis-py on the same bytes, measured in one run.

Usage: python benchmarks/bench_buffer.py [--url URL] [--rounds 7] [--quick]
                                         [--add-only | --no-prioritized | --runners]

Without --url an embedded server is started. Every figure is the median over rounds, and
each round measures redisbuf and its baseline back to back, so the printed ratios hold
on a noisy shared machine even when the absolute numbers move.

* add: ``ReplayBuffer.add`` of 256 trajectories of ~4 KiB (encode, a Lua call that
  reserves ids, then one MULTI/EXEC of a native HSET of the blobs and a Lua call that
  stores the rest and evicts at capacity) vs a redis-py pipeline writing the same
  pre-encoded blobs with HSET + 2 ZADD per item (no encoding, no eviction): items/s, and
  the server's CPU time per batch (user + sys of the server process).
* sample: ``ReplayBuffer.sample(256)`` uniform (ids computed by this process for the FIFO
  id range and checked and recorded by a script in the same round trip as the HMGET of
  their blobs, then decoded into a padded batch) vs one bare HMGET of 256 random known ids
  of the same blobs (no choice, no bookkeeping, no decode); also the draw alone (ids,
  bookkeeping and blobs, left undecoded) against the same HMGET.
* prioritized: cost of ``sample`` with ``prioritized_sampling=True`` at 10^4 and 10^6 items,
  without replacement (the default) and with.
* ``--runners`` (only): add and sample with the scripts run as functions of the library
  (FCALL, the default where it loads) against EVALSHA, paired round by round.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis
import torch
from _report import record, script_stats
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, Trajectories, connect
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import scripts

BATCH = 256
HORIZON = 60  # states (61, 16) float32 + actions (60,) int8 + log_reward: 4036-byte blobs
STATE_DIM = 16


def trajectories(rng: np.random.Generator, variable: bool) -> Trajectories:
    lengths = (
        rng.integers(HORIZON // 2, HORIZON + 1, BATCH) if variable else np.full(BATCH, HORIZON)
    )
    return Trajectories(
        states=torch.from_numpy(rng.standard_normal((HORIZON + 1, BATCH, STATE_DIM), np.float32)),
        actions=torch.from_numpy(rng.integers(0, 5, (HORIZON, BATCH), dtype=np.int8)),
        terminating_idx=torch.from_numpy(lengths),
        log_rewards=torch.from_numpy(rng.standard_normal(BATCH)),
    )


def rate(fn: Callable[[], Any], items: int, repeat: int) -> float:
    """Items per second of ``fn`` (called ``repeat`` times, ``items`` items each)."""
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return items * repeat / (time.perf_counter() - start)


# (label, ours CPU ms, raw CPU ms, median of the per-round ratios) of add, per batch;
# filled by bench_add_and_sample
SERVER_ROWS: list[tuple[str, float, float, float]] = []


def label_of(variable: bool) -> str:
    return "variable-length" if variable else "fixed-length"


def server_time(client: redis.Redis, fn: Callable[[], Any], repeat: int) -> float:
    """Server CPU ms (user + sys of the server process, INFO cpu) per call of ``fn``, over
    ``repeat`` calls: it includes reading and parsing the requests, and unlike INFO
    commandstats it neither counts the commands inside a script or a MULTI/EXEC twice nor
    the time the server was descheduled while running one."""

    def total() -> float:
        cpu = client.info("cpu")
        return float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])

    before = total()
    for _ in range(repeat):
        fn()
    return (total() - before) / repeat * 1e3


def paired(
    ours: Callable[[], float], raw: Callable[[], float], rounds: int
) -> tuple[float, float, float]:
    """Median of each rate and of the per-round ratio, alternating which goes first."""
    ours_rates, raw_rates, ratios = [], [], []
    for index in range(rounds):
        if index % 2:
            b, a = raw(), ours()
        else:
            a, b = ours(), raw()
        ours_rates.append(a)
        raw_rates.append(b)
        ratios.append(a / b)
    return statistics.median(ours_rates), statistics.median(raw_rates), statistics.median(ratios)


def bench_add_and_sample(
    url: str, rounds: int, repeat: int, variable: bool, add_only: bool = False
) -> list[tuple[str, float, float, float]]:
    rng = np.random.default_rng(0)
    client = connect(url)
    raw_client = redis.Redis.from_url(url)  # plain redis-py defaults (hiredis packer)
    name = "bench-var" if variable else "bench"
    client.delete(*BufferKeys(name).all_keys(), "raw:items", "raw:prio", "raw:order")
    capacity = 20 * BATCH
    buffer = ReplayBuffer(client, name, capacity=capacity, seed=1)
    batch = trajectories(rng, variable)
    blobs, log_rewards, _ = buffer.encode(batch)
    for _ in range(capacity // BATCH + 1):  # reach capacity so every add evicts
        buffer.add(batch)
    counter = [0]

    def raw_add() -> None:
        pipe = raw_client.pipeline(transaction=False)
        for blob, log_reward in zip(blobs, log_rewards.tolist(), strict=True):
            counter[0] += 1
            member = b"%012d" % counter[0]
            pipe.hset("raw:items", member, blob)
            pipe.zadd("raw:prio", {member: log_reward})
            pipe.zadd("raw:order", {member: counter[0]})
        pipe.execute()

    add = paired(
        lambda: rate(lambda: buffer.add(batch), BATCH, repeat),
        lambda: rate(raw_add, BATCH, repeat),
        rounds,
    )
    # server CPU time per batch, alternating as above
    times: dict[str, list[float]] = {"ours": [], "raw": []}
    for index in range(rounds):
        pair = (("ours", lambda: buffer.add(batch)), ("raw", raw_add))
        for kind, fn in pair if index % 2 == 0 else pair[::-1]:
            times[kind].append(server_time(raw_client, fn, repeat))
    cpu_ratio = statistics.median(
        a / b for a, b in zip(times["ours"], times["raw"], strict=True)
    )
    SERVER_ROWS.append((label_of(variable), statistics.median(times["ours"]),
                        statistics.median(times["raw"]), cpu_ratio))
    if add_only:
        buffer.drop()
        client.delete("raw:items", "raw:prio", "raw:order")
        return [(f"add, {label_of(variable)} (items/s)", *add)]
    known = [b"%012d" % i for i in range(1, counter[0] + 1)]

    def raw_sample() -> None:
        picks = rng.integers(0, len(known), BATCH)
        raw_client.hmget("raw:items", [known[i] for i in picks])

    sample = paired(
        lambda: rate(lambda: buffer.sample(BATCH), BATCH, repeat),
        lambda: rate(raw_sample, BATCH, repeat),
        rounds,
    )
    # the same draw without decoding: what choosing ids in Lua costs over a bare HMGET
    draw = paired(
        lambda: rate(lambda: buffer._draw(BATCH, None), BATCH, repeat),
        lambda: rate(raw_sample, BATCH, repeat),
        rounds,
    )
    buffer.drop()
    client.delete("raw:items", "raw:prio", "raw:order")
    label = label_of(variable)
    return [
        (f"add, {label} (items/s)", *add),
        (f"sample uniform, {label} (items/s)", *sample),
        (f"  of which ids + blobs, no decode, {label}", *draw),
    ]


def bench_runners(url: str, rounds: int, repeat: int) -> list[tuple[str, float, float, float]]:
    """add, uniform sample(256) and PER sample(256) of fixed-length trajectories with the
    scripts run as functions of the library (FCALL) against the same calls with EVALSHA,
    paired round by round on one buffer (redisbuf/store/scripts.py, run_as_functions)."""
    rng = np.random.default_rng(0)
    client = connect(url)
    name = "bench-runners"
    client.delete(*BufferKeys(name).all_keys())
    capacity = 20 * BATCH
    buffer = ReplayBuffer(client, name, capacity=capacity, seed=1)
    batch = trajectories(rng, False)
    for _ in range(capacity // BATCH + 1):  # reach capacity so every add evicts
        buffer.add(batch)
    # the same items drawn by PER priority (its draws commit through lua/sample_prioritized)
    per = ReplayBuffer.open(client, name, sampler=PERSampler(), seed=2)
    per.update_priority(np.arange(1, 1 + capacity) + BATCH, rng.exponential(size=capacity))

    def with_runner(functions: bool, fn: Callable[[], Any]) -> float:
        scripts.run_as_functions(client, functions)
        return rate(fn, BATCH, repeat)

    rows = []
    for label, fn in (("add", lambda: buffer.add(batch)),
                      ("sample uniform", lambda: buffer.sample(BATCH)),
                      ("sample by PER priority", lambda: per.sample(BATCH))):
        rows.append((f"{label} (items/s)",
                     *paired(lambda fn=fn: with_runner(True, fn),
                             lambda fn=fn: with_runner(False, fn), rounds)))
    scripts.run_as_functions(client, True)
    buffer.drop()
    return rows


def bench_prioritized(
    url: str, sizes: list[int], rounds: int
) -> list[tuple[int, float, float, float, float]]:
    """(size, ms per sample(256) call, server ms per call, the same two with replacement)
    with prioritized sampling (without replacement by default, as 256 <= size)."""
    client = connect(url)
    out = []
    for size in sizes:
        name = f"bench-prio-{size}"
        client.delete(*BufferKeys(name).all_keys())
        filler = ReplayBuffer(client, name, capacity=size)
        rng = np.random.default_rng(size)
        chunk = 1000  # one add stores at most bounds.MAX_ADD_ITEMS items
        for start in range(0, size, chunk):
            count = min(chunk, size - start)
            filler.add(
                {
                    "x": np.arange(start, start + count, dtype=np.int32).reshape(-1, 1),
                    "log_rewards": rng.standard_normal(count),
                }
            )
        buffer = ReplayBuffer(client, name, capacity=size, prioritized_sampling=True, seed=2)
        buffer.sample(BATCH)  # warm: script loaded
        row: list[float] = [size]
        for replacement in (None, True):
            times, server = [], []
            for _ in range(rounds):
                client.config_resetstat()
                start = time.perf_counter()
                for _ in range(20):
                    buffer.sample(BATCH, replacement=replacement)
                times.append((time.perf_counter() - start) / 20 * 1e3)
                stats = script_stats(client)
                server.append(stats.get("usec_per_call", float("nan")) / 1e3)
            row += [statistics.median(times), statistics.median(server)]
        out.append(tuple(row))
        buffer.drop()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--repeat", type=int, default=10, help="calls per timed run")
    parser.add_argument("--quick", action="store_true", help="10^5 instead of 10^6 items")
    parser.add_argument("--add-only", action="store_true",
                        help="only the add figures (throughput and server time)")
    parser.add_argument(
        "--no-prioritized", action="store_true", help="only the add and sample table"
    )
    parser.add_argument("--runners", action="store_true",
                        help="only add and sample run as FCALL against EVALSHA")
    args = parser.parse_args()
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    try:
        console.print(f"[bold]redisbuf benchmarks[/] on {url}, {args.rounds} rounds, batch {BATCH}")
        if args.runners:
            table = Table(title="scripts as functions (FCALL) vs EVALSHA, fixed-length (medians)")
            for column in ("operation", "FCALL", "EVALSHA", "ratio"):
                table.add_column(column, justify="right" if column != "operation" else "left")
            for label, fcall, evalsha, ratio in bench_runners(url, args.rounds, args.repeat):
                table.add_row(label, f"{fcall:,.0f}", f"{evalsha:,.0f}", f"{ratio:.2f}")
                record(f"{label} FCALL vs EVALSHA", fcall, "items/s", baseline=evalsha,
                       ratio=ratio)
            console.print(table)
            return
        rows = bench_add_and_sample(url, args.rounds, args.repeat, False, args.add_only)
        rows += bench_add_and_sample(url, args.rounds, args.repeat, True, args.add_only)
        table = Table(title="redisbuf vs raw redis-py on the same bytes (medians)")
        for column in ("operation", "redisbuf", "raw redis-py", "ratio", "target"):
            table.add_column(column, justify="right" if column != "operation" else "left")
        for label, ours, raw, ratio in rows:
            table.add_row(label, f"{ours:,.0f}", f"{raw:,.0f}", f"{ratio:.2f}", ">= 0.80")
            record(label.strip(), ours, "items/s", baseline=raw, ratio=ratio, target=">= 0.8")
        console.print(table)
        table = Table(title=f"add: server CPU ms per batch of {BATCH} (medians)")
        for column in ("items", "redisbuf", "raw redis-py", "ratio", "target"):
            table.add_column(column, justify="right" if column != "items" else "left")
        for label, ours, raw, ratio in SERVER_ROWS:
            table.add_row(label, f"{ours:.2f}", f"{raw:.2f}", f"{ratio:.2f}", "<= 1.50")
        console.print(table)
        if args.add_only or args.no_prioritized:
            return
        big = 10**5 if args.quick else 10**6
        prio = bench_prioritized(url, [10**4, big], max(3, args.rounds // 2))
        table = Table(title=f"prioritized sample({BATCH}) cost vs buffer size")
        for column in ("items", "ms per call", "server ms per call", "with replacement: ms",
                       "server ms"):
            table.add_column(column, justify="right")
        for size, ms, server_ms, ms_with, server_with in prio:
            table.add_row(f"{size:,}", f"{ms:.2f}", f"{server_ms:.2f}", f"{ms_with:.2f}",
                          f"{server_with:.2f}")
        console.print(table)
        ratio = prio[1][1] / prio[0][1]
        server_ratio = prio[1][2] / prio[0][2]
        for size, ms, _, ms_with, _ in prio:
            for label, call_ms in (("", ms), (", replacement", ms_with)):
                series = f"prioritized sample({BATCH}{label})"
                record(f"{series}, {size:,} items", BATCH / call_ms * 1e3, "items/s",
                       series=series, axis="items", x=size)
        record(f"prioritized sample({BATCH}) cost, {big:,} / 10^4 items", ratio, "x",
               target="<= 2")
        console.print(
            f"cost at {big:,} / cost at 10,000: {ratio:.2f} (server time {server_ratio:.2f}); "
            "target <= 3.00"
        )
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
