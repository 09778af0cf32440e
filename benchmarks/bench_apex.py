"""Ape-X-shaped prioritized replay on one PER buffer: writers and a learner at once.

Usage: python benchmarks/bench_apex.py [--url URL] [--items 2000000] [--seconds 20]
       [--writers 2]

Without --url an embedded server is started. The buffer (capacity --items, PERSampler) is
filled with transitions of 200 bytes (msgpack of obs and next_obs float32[16], an int64
action and a float32 reward) in batches of 10,000 with random priorities (the fast path:
few large adds), from a fresh Lua state afterwards (SCRIPT FLUSH). Then, for --seconds,
--writers processes each loop ``add(256, priorities=...)`` (every add evicts 256) while
one learner process loops ``sample(512)`` and ``update_priority`` of the 512 drawn ids,
as Ape-X's actors and learner do (Horgan et al. 2018: 12.5k inserts/s and 9.7k sampled
transitions/s on their machine; those are the targets printed).

Printed: inserts/s and sampled items/s of the concurrent phase with each process's median
call time, the server's CPU time over it, then each operation's server time per call
measured alone (20 calls, nothing else running; wall-clock time inside the server from
commandstats and the server's CPU time, which a loaded machine does not inflate), and the
server memory per item. Last, the same adds with the mass log switched off (the
buffer is dropped afterwards): the difference is the log's upkeep per add(256),
target <= 5 ms.
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from typing import Any

import numpy as np
from _report import record, script_stats
from rich.console import Console
from rich.table import Table

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, connect
from redisbuf.servers.embedded import EmbeddedServer

NAME = "bench-apex"
ADD, SAMPLE, FILL = 256, 512, 1000  # FILL: at most bounds.MAX_ADD_ITEMS an add
TARGET_INSERTS, TARGET_SAMPLES = 12_500, 9_700


def transitions(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """n transitions of 200 bytes each once encoded."""
    return {
        "obs": rng.standard_normal((n, 16), dtype=np.float32),
        "next_obs": rng.standard_normal((n, 16), dtype=np.float32),
        "action": rng.integers(0, 18, n),
        "reward": rng.standard_normal(n).astype(np.float32),
    }


def open_buffer(url: str, items: int, seed: int) -> ReplayBuffer:
    return ReplayBuffer(connect(url), NAME, capacity=items, sampler=PERSampler(), seed=seed)


def fill(url: str, items: int) -> float:
    """Fill the buffer to capacity; returns the seconds it took."""
    client = connect(url)
    buffer = open_buffer(url, items, 0)
    rng = np.random.default_rng(0)
    batch = transitions(rng, FILL)
    start = time.perf_counter()
    for done in range(0, items, FILL):
        count = min(FILL, items - done)
        part = batch if count == FILL else {k: v[:count] for k, v in batch.items()}
        buffer.add(part, priorities=rng.exponential(size=count))
    elapsed = time.perf_counter() - start
    # the fill's Lua garbage would otherwise be swept during the timed phase
    client.script_flush()
    return elapsed


def writer(url: str, items: int, seed: int, start: Any, stop_at: Any, out: Any) -> None:
    buffer = open_buffer(url, items, seed)
    rng = np.random.default_rng(seed)
    batches = [transitions(rng, ADD) for _ in range(8)]
    priorities = [rng.exponential(size=ADD) for _ in range(8)]
    start.wait()
    calls: list[float] = []
    while time.time() < stop_at.value:
        t = time.perf_counter()
        buffer.add(batches[len(calls) % 8], priorities=priorities[len(calls) % 8])
        calls.append(time.perf_counter() - t)
    out.put(("writer", len(calls) * ADD, calls))


def learner(url: str, items: int, seed: int, start: Any, stop_at: Any, out: Any) -> None:
    buffer = open_buffer(url, items, seed)
    rng = np.random.default_rng(seed)
    start.wait()
    samples: list[float] = []
    updates: list[float] = []
    while time.time() < stop_at.value:
        t = time.perf_counter()
        info = buffer.sample_with_info(SAMPLE)
        u = time.perf_counter()
        buffer.update_priority(info.ids, rng.exponential(size=len(info.ids)))
        samples.append(u - t)
        updates.append(time.perf_counter() - u)
    out.put(("learner", len(samples) * SAMPLE, samples, updates))


def concurrent(url: str, items: int, seconds: float, writers: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    stop_at = context.Value("d", 0.0)
    procs = [
        context.Process(target=writer, args=(url, items, 10 + i, start, stop_at, out))
        for i in range(writers)
    ]
    procs.append(context.Process(target=learner, args=(url, items, 99, start, stop_at, out)))
    for proc in procs:
        proc.start()
    client = connect(url)
    time.sleep(3.0)  # let every process import and open the buffer
    cpu_before = server_cpu(client)
    stop_at.value = time.time() + seconds
    begin = time.time()
    start.set()
    reports = [out.get(timeout=seconds + 120) for _ in procs]
    elapsed = time.time() - begin
    cpu_after = server_cpu(client)
    for proc in procs:
        proc.join()
    used = cpu_after - cpu_before
    inserted = sum(r[1] for r in reports if r[0] == "writer")
    learner_report = next(r for r in reports if r[0] == "learner")
    add_calls = [c for r in reports if r[0] == "writer" for c in r[2]]

    def median_ms(calls: list[float]) -> float:
        return statistics.median(calls) * 1e3 if calls else float("nan")

    return {
        "inserts": inserted / elapsed,
        "samples": learner_report[1] / elapsed,
        "add_ms": median_ms(add_calls),
        "sample_ms": median_ms(learner_report[2]),
        "update_ms": median_ms(learner_report[3]),
        "server_cpu": used / elapsed,
    }


def server_cpu(client: Any) -> float:
    """Seconds of CPU the server has used (user + system)."""
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def solo_server_ms(url: str, items: int) -> dict[str, tuple[float, float]]:
    """Per script call of each operation alone (20 calls): (server ms from commandstats,
    server CPU ms). Commandstats time is wall-clock inside the server, so on a loaded
    machine it includes time the server waited for a core; CPU time does not."""
    client = connect(url)
    buffer = open_buffer(url, items, 5)
    rng = np.random.default_rng(5)
    batch = transitions(rng, ADD)
    last_ids: list[Any] = [None]

    def sample() -> None:
        last_ids[0] = buffer.sample_with_info(SAMPLE).ids

    def update() -> None:
        buffer.update_priority(last_ids[0], rng.exponential(size=len(last_ids[0])))

    out = {}
    for label, fn in (
        ("add(256)", lambda: buffer.add(batch, priorities=rng.exponential(size=ADD))),
        ("sample(512)", sample),
        ("update_priority(512)", update),
    ):
        fn()
        client.config_resetstat()
        cpu = server_cpu(client)
        for _ in range(20):
            fn()
        cpu = (server_cpu(client) - cpu) / 20 * 1e3
        stats = script_stats(client)
        out[label] = (stats.get("usec_per_call", float("nan")) / 1e3, cpu)
    # The same adds with the mass log off (meta masslog = 0: add appends no log entry;
    # the buffer is dropped afterwards, its log no longer matching): the difference is
    # the log's upkeep.
    client.hset(BufferKeys(NAME).meta, "masslog", 0)
    client.config_resetstat()
    cpu = server_cpu(client)
    for _ in range(20):
        buffer.add(batch, priorities=rng.exponential(size=ADD))
    cpu = (server_cpu(client) - cpu) / 20 * 1e3
    stats = script_stats(client)
    unlogged = stats.get("usec_per_call", float("nan")) / 1e3
    out["add(256) mass log upkeep"] = (out["add(256)"][0] - unlogged, out["add(256)"][1] - cpu)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--items", type=float, default=2e6)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--writers", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="2x10^5 items, 8 s")
    args = parser.parse_args()
    if args.quick:
        args.items, args.seconds = 2e5, 8.0
    items = int(args.items)
    console = Console()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    try:
        client = connect(url)
        client.delete(*BufferKeys(NAME).all_keys())
        client.script_flush()
        memory_before = client.info("memory")["used_memory"]
        fill_s = fill(url, items)
        memory = client.info("memory")["used_memory"] - memory_before
        console.print(
            f"filled {items:,} items in {fill_s:.0f} s ({items / fill_s:,.0f} items/s); "
            f"server memory {memory / 1e9:.2f} GB, {memory / items:.0f} B per item "
            f"(blob 200 B); load average {_load()}"
        )
        run = concurrent(url, items, args.seconds, args.writers)
        table = Table(title=f"Ape-X shape: {args.writers} writers + 1 learner, {items:,} items")
        for column in ("figure", "value", "target"):
            table.add_column(column, justify="left" if column == "figure" else "right")
        table.add_row("inserts/s", f"{run['inserts']:,.0f}", f">= {TARGET_INSERTS:,}")
        table.add_row("sampled items/s", f"{run['samples']:,.0f}", f">= {TARGET_SAMPLES:,}")
        table.add_row("add(256) median call, ms", f"{run['add_ms']:.1f}", "")
        table.add_row("sample(512) median call, ms", f"{run['sample_ms']:.1f}", "")
        table.add_row("update_priority(512) median call, ms", f"{run['update_ms']:.1f}", "")
        table.add_row("server CPU, s per s", f"{run['server_cpu']:.2f}", "")
        table.add_row(
            "server CPU per inserted + sampled item, us",
            f"{run['server_cpu'] / (run['inserts'] + run['samples']) * 1e6:.1f}",
            "",
        )
        solo = solo_server_ms(url, items)
        for label, (ms, cpu) in solo.items():
            target = "<= 5.0" if label.endswith("maintenance") else ""
            table.add_row(f"{label} alone: server ms / CPU ms", f"{ms:.1f} / {cpu:.1f}", target)
        console.print(table)
        console.print(f"load average after: {_load()}")
        record(f"Ape-X inserts/s, {items:,} PER items", run["inserts"], "items/s",
               target=f">= {TARGET_INSERTS}", series="Ape-X inserts", axis="items", x=items)
        record(f"Ape-X sampled items/s, {items:,} PER items", run["samples"], "items/s",
               target=f">= {TARGET_SAMPLES}", series="Ape-X samples", axis="items", x=items)
        record(f"Ape-X server memory per item, {items:,} items", memory / items, "B")
        for label, (ms, _cpu) in solo.items():
            if label.endswith("maintenance"):
                record(f"Ape-X {label}, server ms", ms, "ms", target="<= 5")
        connect(url).delete(*BufferKeys(NAME).all_keys())
    finally:
        if server is not None:
            server.stop()


def _load() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


if __name__ == "__main__":
    main()
