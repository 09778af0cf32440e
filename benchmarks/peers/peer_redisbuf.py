"""redisbuf on its embedded server (the project's own venv): ``ReplayBuffer`` of plain
dicts of numpy arrays; uniform = the default sampler, prioritized = ``PERSampler`` with
``add(batch, priorities=...)``, ``sample(n)`` and ``update_priority(ids, priorities,
count=False)`` (one append to the mass log, as Reverb's ``mutate_priorities`` counting
nothing).
One server per group of figures; writer and sampler processes each open the buffer."""

from __future__ import annotations

from typing import Any

import numpy as np
from common import (
    ALPHA,
    APEX_SAMPLE,
    BATCH,
    BETA,
    batches,
    config_from_argv,
    emit,
    loop_until,
    priorities,
    rss_mb,
    run_processes,
    timed_loop,
)

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store.bounds import MAX_ADD_BYTES, MAX_ADD_ITEMS

PRE = 8  # pre-made batches cycled through by each writer
PATH = "ReplayBuffer.add / sample (dict of arrays), PERSampler + update_priority(count=False)"


def open_buffer(url: str, name: str, capacity: int, prio: bool) -> ReplayBuffer:
    sampler = PERSampler(alpha=ALPHA, beta=BETA) if prio else None
    return ReplayBuffer(url, name, capacity=capacity, sampler=sampler, seed=None)


def fill(buf: ReplayBuffer, layout: str, count: int, prio: bool) -> None:
    """Add ``count`` items in large batches (not timed)."""
    # one add is bounded in items and bytes (redisbuf/store/bounds.py)
    row = sum(v[0].nbytes for v in batches(layout, 1, n=1, seed=1)[0].values())
    chunk = max(1, min(MAX_ADD_ITEMS, MAX_ADD_BYTES // (2 * row)))
    rng = np.random.default_rng(1)
    template = batches(layout, 1, n=chunk, seed=1)[0]
    done = 0
    while done < count:
        n = min(chunk, count - done)
        part = {k: v[:n] for k, v in template.items()}
        buf.add(part, priorities=priorities(n, rng) if prio else None)
        done += n


def writer(url: str, name: str, capacity: int, layout: str, prio: bool, seed: int) -> Any:
    buf = open_buffer(url, name, capacity, prio)
    pre = batches(layout, PRE, seed=seed)
    rng = np.random.default_rng(seed)
    pris = [priorities(BATCH, rng) for _ in range(PRE)]

    def add(i: int) -> int:
        buf.add(pre[i % PRE], priorities=pris[i % PRE] if prio else None)
        return BATCH

    return lambda deadline: loop_until(deadline, add)


def sampler(url: str, name: str, capacity: int, prio: bool, n: int) -> Any:
    buf = open_buffer(url, name, capacity, prio)

    def sample(_: int) -> int:
        buf.sample(n)
        return n

    # the first prioritized draw reads the buffer's priorities into this process's replica
    # (redisbuf/sampling/replica.py), once: not timed, as Reverb's first dataset batch is not
    sample(0)
    return lambda deadline: loop_until(deadline, sample)


def group_single(cfg: dict[str, Any], figures: set[str], out: dict[str, Any]) -> None:
    seconds, cap4k, cap200 = cfg["seconds"], cfg["cap4k"], cfg["cap200"]
    with EmbeddedServer() as server:
        url = server.url
        rng = np.random.default_rng(0)
        pre4k = batches("4k", PRE)
        pris = [priorities(BATCH, rng) for _ in range(PRE)]
        for prio in (False, True):
            add_id = "add_4k_prio" if prio else "add_4k_uniform"
            smp_id = "sample_4k_prio" if prio else "sample_4k_uniform"
            if not {add_id, smp_id} & figures:
                continue
            buf = open_buffer(url, f"single-{prio}", cap4k, prio)
            fill(buf, "4k", cap4k, prio)
            if add_id in figures:

                def add(i: int, buf: ReplayBuffer = buf, prio: bool = prio) -> int:
                    buf.add(pre4k[i % PRE], priorities=pris[i % PRE] if prio else None)
                    return BATCH

                out[add_id] = timed_loop(add, seconds)
            if smp_id in figures:

                def sample(_: int, buf: ReplayBuffer = buf) -> int:
                    buf.sample(BATCH)
                    return BATCH

                out[smp_id] = timed_loop(sample, seconds)
            buf.drop()
        if "add_200b" in figures:
            buf = open_buffer(url, "small", cap200, False)
            fill(buf, "200b", cap200, False)
            pre = batches("200b", PRE)

            def add_small(i: int) -> int:
                buf.add(pre[i % PRE])
                return BATCH

            out["add_200b"] = timed_loop(add_small, seconds)
            buf.drop()
        if "update_small" in figures:
            out["update_small"] = updates(url, "upd-small", cfg["update_size"], seconds)


def updates(url: str, name: str, size: int, seconds: float, fill_first: bool = True) -> Any:
    buf = open_buffer(url, name, size, True)
    if fill_first:
        fill(buf, "200b", size, True)
    newest = int(buf.client.hget(buf.keys.meta, "last_id") or size)  # ids count up from 1
    rng = np.random.default_rng(2)
    calls = [
        (rng.integers(max(1, newest - size + 1), newest + 1, BATCH), priorities(BATCH, rng))
        for _ in range(64)
    ]

    def update(i: int) -> int:
        # as Reverb's mutate_priorities: the call, counting nothing; this process keeps no
        # replica (the samplers' replicas apply the update at their next catch-up, as
        # Reverb's server does in its own sum tree)
        buf.update_priority(*calls[i % len(calls)], count=False)
        return BATCH

    return timed_loop(update, seconds)


def group_4proc(cfg: dict[str, Any], out: dict[str, Any]) -> None:
    cap4k, seconds = cfg["cap4k"], cfg["seconds"]
    with EmbeddedServer() as server:
        buf = open_buffer(server.url, "four", cap4k, False)
        fill(buf, "4k", cap4k, False)
        res = run_processes(
            [(writer, (server.url, "four", cap4k, "4k", False, s)) for s in range(4)], seconds
        )
        out["add_4k_4proc"] = {"rate": sum(r["rate"] for r in res)}


def group_mixed(cfg: dict[str, Any], out: dict[str, Any]) -> None:
    cap4k, seconds = cfg["cap4k"], cfg["seconds"]
    with EmbeddedServer() as server:
        buf = open_buffer(server.url, "mixed", cap4k, True)
        fill(buf, "4k", cap4k, True)
        workers = [(writer, (server.url, "mixed", cap4k, "4k", True, s)) for s in range(4)]
        workers.append((sampler, (server.url, "mixed", cap4k, True, BATCH)))
        res = run_processes(workers, seconds)
        out["mixed_ins"] = {"rate": sum(r["rate"] for r in res[:4])}
        out["mixed_smp"] = {"rate": res[4]["rate"]}


def group_apex(cfg: dict[str, Any], figures: set[str], out: dict[str, Any]) -> None:
    size, seconds = cfg["apex_size"], cfg["seconds"]
    with EmbeddedServer() as server:
        buf = open_buffer(server.url, "apex", size, True)
        fill(buf, "200b", size, True)
        if figures & {"apex_ins", "apex_smp", "apex_add_ms", "apex_sample_ms"}:
            workers = [(writer, (server.url, "apex", size, "200b", True, s)) for s in range(2)]
            workers.append((sampler, (server.url, "apex", size, True, APEX_SAMPLE)))
            res = run_processes(workers, seconds)
            out["apex_ins"] = {"rate": sum(r["rate"] for r in res[:2])}
            out["apex_smp"] = {"rate": res[2]["rate"]}
            out["apex_add_ms"] = {"rate": float(np.median([r["ms"] for r in res[:2]]))}
            out["apex_sample_ms"] = {"rate": res[2]["ms"]}
        if "apex_memory" in figures:
            out["apex_memory"] = {"rate": rss_mb(server.pid)}
        if "update_apex" in figures:
            out["update_apex"] = updates(server.url, "apex", size, seconds, fill_first=False)


def main() -> None:
    cfg = config_from_argv()
    figures = set(cfg["figures"])
    out: dict[str, Any] = {}
    group_single(cfg, figures, out)
    if "add_4k_4proc" in figures:
        group_4proc(cfg, out)
    if figures & {"mixed_ins", "mixed_smp"}:
        group_mixed(cfg, out)
    if figures & {"apex_ins", "apex_smp", "apex_add_ms", "apex_sample_ms", "apex_memory",
                  "update_apex"}:
        group_apex(cfg, figures, out)
    emit({"path": PATH, "results": out})


if __name__ == "__main__":
    main()
