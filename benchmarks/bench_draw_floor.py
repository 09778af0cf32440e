"""What one master spends per draw call, by batch size: the floor under sharded draws.

Usage: python benchmarks/bench_draw_floor.py [--calls 400] [--rounds 3] [--items 4000] [--quick]

Starts a one-master Redis Cluster on loopback (redisbuf.servers.cluster.LocalCluster, as
bench_cluster.py does: the server $REDISBUF_SERVER_BIN names, else redis-server on PATH,
else the bundled valkey). It times, in server CPU (INFO cpu, user + sys of the main thread,
which runs every command) per call:

* a PING and an HGET, one command a round trip: what reading a request and writing its
  reply cost the server, whatever the command;
* ``sample(n)`` from a buffer of ``--items`` items of ~4 KiB (a float32 array of 1024),
  uniform (without replacement) and ``PERSampler`` (with replacement), for n = 1, 85 and
  256, each with the commands it ran (INFO commandstats; a script's own calls are counted
  as commands too, and in the script's time).

A 3-shard ``sample(256)`` asks each master for about 85 draws, so "85 vs 256", the cost
of a call of 85 over one of 256, is what one of 3 masters spends against one shard alone
when nothing else differs (ideal: 1/3, when a call costs nothing but its items). Each
figure is the median over ``--rounds`` rounds of ``--calls`` calls; the sizes alternate
within a round.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

import numpy as np
import redis
from _report import load_average, record, server_cpu
from rich.console import Console
from rich.table import Table

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.servers.cluster import LocalCluster
from redisbuf.store.connection import connect

SIZES = (1, 85, 256)
WIDTH = 1024  # float32: 4 KiB of payload per item


def _commands(node: redis.Redis) -> dict[str, int]:
    """Each command's calls so far (INFO commandstats)."""
    return {name.removeprefix("cmdstat_"): int(v["calls"])
            for name, v in node.info("commandstats").items()}


def _timed(node: redis.Redis, calls: int, call: Any) -> tuple[float, dict[str, float]]:
    """(server CPU us per call, commands per call) over ``calls`` calls of ``call``."""
    before, cpu = _commands(node), server_cpu(node)
    for _ in range(calls):
        call()
    spent = (server_cpu(node) - cpu) / calls * 1e6
    ran = {name: (count - before.get(name, 0)) / calls
           for name, count in _commands(node).items() if name != "info"}
    return spent, {name: count for name, count in ran.items() if count > 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--items", type=int, default=4000)
    parser.add_argument("--quick", action="store_true", help="1 round of 100 calls")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.calls = 1, 100
    rng = np.random.default_rng(0)
    with LocalCluster(masters=1) as cluster:
        client = connect(cluster.urls[0])
        node = redis.Redis(port=cluster.ports[0])
        node.hset("{floor}h", "f", "1")
        per_call: dict[str, list[float]] = {}
        ran: dict[str, dict[str, float]] = {}
        buffers = {
            "uniform": ReplayBuffer(client, "floor-uniform", capacity=args.items),
            "PER": ReplayBuffer(client, "floor-per", capacity=args.items,
                                sampler=PERSampler()),
        }
        for buffer in buffers.values():
            for _ in range(-(-args.items // 64)):
                buffer.add({"x": rng.standard_normal((64, WIDTH), dtype=np.float32),
                            "log_rewards": rng.standard_normal(64)})
            for n in SIZES:
                buffer.sample(n)  # the scripts loaded, the replica read
        for _ in range(args.rounds):
            for label, call in (("PING", node.ping), ("HGET", lambda: node.hget("{floor}h", "f"))):
                spent, _ = _timed(node, args.calls, call)
                per_call.setdefault(label, []).append(spent)
            for name, buffer in buffers.items():
                for n in SIZES:
                    spent, commands = _timed(node, args.calls,
                                             lambda b=buffer, n=n: b.sample(n))
                    per_call.setdefault(f"{name}/{n}", []).append(spent)
                    ran[f"{name}/{n}"] = commands
        for buffer in buffers.values():
            buffer.drop()
        node.close()
        client.close()
    median = {key: statistics.median(values) for key, values in per_call.items()}
    table = Table(title=f"Server CPU per call, one master, {args.items:,} items of 4 KiB "
                        f"(median of {args.rounds} x {args.calls} calls)")
    table.add_column("call")
    table.add_column("us per call", justify="right")
    table.add_column("commands per call", justify="left")
    for label in ("PING", "HGET"):
        table.add_row(label, f"{median[label]:.1f}", "1")
        record(f"server CPU per round trip: {label}", median[label], "us",
               key=label.lower())
    for name in buffers:
        for n in SIZES:
            key = f"{name}/{n}"
            commands = ", ".join(f"{c} {k:.0f}" for c, k in sorted(ran[key].items()))
            table.add_row(f"{name} sample({n})", f"{median[key]:.1f}", commands)
            record(f"server CPU per call: {name} sample({n})", median[key], "us",
                   key=f"{name.lower()}/{n}")
        ratios = [a / b for a, b in zip(per_call[f"{name}/85"], per_call[f"{name}/256"],
                                        strict=True)]
        record(f"server CPU per call: {name} sample(85) vs sample(256)",
               statistics.median(ratios), "x",
               spread=f"{min(ratios):.2f}-{max(ratios):.2f}",
               key=f"{name.lower()}/85-vs-256")
        table.add_row(f"{name}: 85 vs 256", f"{statistics.median(ratios):.2f}x "
                      f"({min(ratios):.2f}-{max(ratios):.2f})", "")
    Console().print(table)
    print("load average:", load_average())


if __name__ == "__main__":
    main()
