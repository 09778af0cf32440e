"""A sampling process's replica of a PER buffer: its first read and its size.

Usage: python benchmarks/bench_replica.py [--url URL] [--sizes 1e5,1e6,2e6] [--writers 0]
                                         [--after-load]

Without --url an embedded server is started. For each size, a PER buffer of that many
small items (random priorities) is filled, then a fresh replica (what a new sampling
process builds on its first prioritized draw, ``MassReplica.load``) reads it, with
``--writers`` other processes adding meanwhile: first with no snapshot there (the
priorities read in native calls of bounded cost, after which it writes one), then again
(a new process's replica: the snapshot and the log after it). Printed per size: each
read's wall time and the commands the server ran meanwhile (SLOWLOG; the writers' too),
the server's CPU time during the first read (INFO cpu: commands, parsing and replies),
the time a snapshot write takes the writing process, the replica's bytes per item (its
arrays) and the first read's resident-memory growth
per item, and the longest command the server ran meanwhile. Targets (issue 31): <= 32 B
per item, <= 1 s at 2x10^6 items, no command over 100 ms.

With ``--after-load`` it measures instead what a restart from a checkpoint gives: the
filled buffer is saved to a file and loaded back (``load`` publishes a snapshot of what it
restored), then a fresh replica reads it. Printed per size: the save and load times, the
first read's time and calls, and the longest command the server ran during the load and
the read.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import tempfile
import time
from typing import Any

import numpy as np
from _report import key_of, load_average, record
from rich.console import Console
from rich.table import Table

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.sampling.replica import MassReplica
from redisbuf.servers.embedded import EmbeddedServer

FILL = 1000  # items per add (one add is bounded: redisbuf/store/bounds.py)


def _add_forever(url: str, name: str, stop: Any) -> None:
    buffer = ReplayBuffer(url, name, capacity=None)
    while not stop.is_set():
        buffer.add({"x": np.zeros(64, dtype=np.float32)}, priorities=np.random.rand(64))


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _server_cpu(client: Any) -> float:
    """Seconds of CPU the server has used (user and system, all its threads)."""
    info = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def _filled(url: str, name: str, size: int) -> ReplayBuffer:
    """A new PER buffer ``name`` of ``size`` small items with random priorities."""
    buffer = ReplayBuffer(url, name, capacity=size, sampler=PERSampler(), seed=0)
    buffer.drop()
    buffer = ReplayBuffer(url, name, capacity=size, sampler=PERSampler(), seed=0)
    for start in range(0, size, FILL):
        count = min(FILL, size - start)
        buffer.add({"x": np.zeros(count, dtype=np.float32)}, priorities=np.random.rand(count))
    return buffer


def measure(url: str, size: int, writers: int) -> dict[str, Any]:
    name = f"bench-replica-{size}"
    buffer = _filled(url, name, size)
    ctx = multiprocessing.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_add_forever, args=(url, name, stop)) for _ in range(writers)]
    for proc in procs:
        proc.start()
    time.sleep(2.0 if writers else 0.0)
    client = buffer.client
    max_len = client.config_get("slowlog-max-len")["slowlog-max-len"]
    client.config_set("slowlog-max-len", 1_000_000)  # every command of the reads is kept
    client.config_set("slowlog-log-slower-than", 0)
    client.slowlog_reset()
    before = _rss_bytes()
    replica = MassReplica("per")
    cpu = _server_cpu(client)
    started = time.perf_counter()
    replica.load(buffer.view)  # no snapshot yet: a scan, then it writes one
    scan_seconds = time.perf_counter() - started
    scan_cpu = _server_cpu(client) - cpu
    grown = _rss_bytes() - before
    logged = client.slowlog_get(1_000_000)
    scan_calls = len(logged)
    client.slowlog_reset()
    started = time.perf_counter()
    replica.write_snapshot(buffer.view)  # what a following sampler does every so often
    write_seconds = time.perf_counter() - started
    again = MassReplica("per")
    started = time.perf_counter()
    again.load(buffer.view)  # a new process's replica: the snapshot and the log after it
    seconds = time.perf_counter() - started
    logged += client.slowlog_get(1_000_000)
    calls = len(logged) - scan_calls
    logged = [e for e in logged  # not this benchmark's own SLOWLOG and CONFIG calls
              if _text(e["command"]).split(" ")[0].upper() not in ("SLOWLOG", "CONFIG")]
    slowest = max(logged, key=lambda e: e["duration"], default=None)
    longest = slowest["duration"] / 1000 if slowest else 0.0
    longest_name = _text(slowest["command"]).split(" ")[0] if slowest else ""
    client.config_set("slowlog-log-slower-than", 10_000)
    client.config_set("slowlog-max-len", max_len)
    stop.set()
    for proc in procs:
        proc.join(30)
    out = {
        "items": float(len(again)), "seconds": seconds, "scan_seconds": scan_seconds,
        "scan_calls": float(scan_calls), "scan_cpu": scan_cpu,
        "bytes_per_item": replica.nbytes / max(len(replica), 1),
        "rss_per_item": grown / max(len(replica), 1), "calls": float(calls),
        "longest_ms": longest, "longest_name": longest_name, "write_seconds": write_seconds,
    }
    buffer.drop()
    return out


def _slowest(client: Any) -> tuple[float, str]:
    logged = [e for e in client.slowlog_get(1_000_000)
              if _text(e["command"]).split(" ")[0].upper() not in ("SLOWLOG", "CONFIG")]
    slowest = max(logged, key=lambda e: e["duration"], default=None)
    if slowest is None:
        return 0.0, ""
    return slowest["duration"] / 1000, _text(slowest["command"]).split(" ")[0]


def measure_after_load(url: str, size: int) -> dict[str, Any]:
    name = f"bench-replica-load-{size}"
    buffer = _filled(url, name, size)
    client = buffer.client
    max_len = client.config_get("slowlog-max-len")["slowlog-max-len"]
    client.config_set("slowlog-max-len", 1_000_000)
    client.config_set("slowlog-log-slower-than", 10_000)  # the long ones only
    client.slowlog_reset()
    with tempfile.TemporaryDirectory() as folder:
        path = f"{folder}/buffer.rbuf"
        started = time.perf_counter()
        buffer.save(path)
        save_seconds = time.perf_counter() - started
        started = time.perf_counter()
        buffer.load(path)
        load_seconds = time.perf_counter() - started
    published = client.hget(buffer.keys.snap, "header") is not None
    load_longest = _slowest(client)
    client.slowlog_reset()
    client.config_set("slowlog-log-slower-than", 0)
    replica = MassReplica("per")
    started = time.perf_counter()
    replica.load(buffer.view)  # a new process's first read after the restart
    seconds = time.perf_counter() - started
    calls = len(client.slowlog_get(1_000_000))
    longest, longest_name = max(load_longest, _slowest(client))
    client.config_set("slowlog-log-slower-than", 10_000)
    client.config_set("slowlog-max-len", max_len)
    buffer.drop()
    return {"items": float(len(replica)), "save_seconds": save_seconds,
            "load_seconds": load_seconds, "published": published, "seconds": seconds,
            "calls": float(calls), "longest_ms": longest, "longest_name": longest_name}


def _after_load_table(url: str, sizes: list[int]) -> Table:
    table = Table(title="First read of a PER replica after a load from a checkpoint")
    for column in ("items", "save s", "load s", "snapshot published", "first read s",
                   "calls", "longest command ms (load and read)"):
        table.add_column(column, justify="right")
    for size in sizes:
        r = measure_after_load(url, size)
        n = f"{int(r['items']):,} items"
        for what, value, unit in (("save", r["save_seconds"], "s"),
                                  ("load", r["load_seconds"], "s"),
                                  ("first read after the load", r["seconds"], "s"),
                                  ("longest command, load and read", r["longest_ms"], "ms")):
            record(f"{what}, {n}", value, unit, key=f"after-load/{key_of(what)}/{size}")
        table.add_row(f"{int(r['items']):,}", f"{r['save_seconds']:.1f}",
                      f"{r['load_seconds']:.1f}", "yes" if r["published"] else "no",
                      f"{r['seconds']:.2f}", f"{int(r['calls'])}",
                      f"{r['longest_ms']:.1f} ({r['longest_name']})")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--sizes", default="1e5,1e6,2e6")
    parser.add_argument("--writers", type=int, default=0)
    parser.add_argument("--after-load", action="store_true")
    args = parser.parse_args()
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    try:
        if args.after_load:
            Console().print(_after_load_table(url, sizes))
            return
        table = Table(title=f"First read of a PER replica ({args.writers} writers meanwhile)")
        for column in ("items", "read s (snapshot)", "calls", "read s (scan)", "calls",
                       "server CPU s (scan)", "snapshot write s",
                       "B/item (arrays)", "B/item (RSS)", "longest command ms"):
            table.add_column(column, justify="right")
        for size in sizes:
            r = measure(url, size, args.writers)
            n = f"{int(r['items']):,} items"
            for what, value, unit in (
                ("first read from the snapshot", r["seconds"], "s"),
                ("first read without a snapshot", r["scan_seconds"], "s"),
                ("server CPU of the read without a snapshot", r["scan_cpu"], "s"),
                ("snapshot write", r["write_seconds"], "s"),
                ("replica arrays per item", r["bytes_per_item"], "B"),
                ("resident memory growth per item", r["rss_per_item"], "B"),
                ("longest command meanwhile", r["longest_ms"], "ms"),
            ):
                record(f"{what}, {n}, {args.writers} writers", value, unit,
                       key=f"{key_of(what)}/{size}")
            table.add_row(f"{int(r['items']):,}", f"{r['seconds']:.2f}", f"{int(r['calls'])}",
                          f"{r['scan_seconds']:.2f}", f"{int(r['scan_calls'])}",
                          f"{r['scan_cpu']:.2f}", f"{r['write_seconds']:.2f}",
                          f"{r['bytes_per_item']:.1f}", f"{r['rss_per_item']:.1f}",
                          f"{r['longest_ms']:.1f} ({r['longest_name']})")
        Console().print(table)
        print("load average:", load_average())
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
