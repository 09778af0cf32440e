"""cpprb 11.0.0 (in the Reverb venv), two ways: in-process ``ReplayBuffer`` /
``PrioritizedReplayBuffer`` (mode "inproc": one process, so no multi-process figures),
and the shared-memory ``MPReplayBuffer`` / ``MPPrioritizedReplayBuffer`` (mode "mp",
``SharedMemory`` backend, spawn context; writer and sampler processes get the buffer as a
process argument). ``add(**batch, priorities=...)`` of 256, ``sample(256)`` (prioritized:
``beta=0.4``), ``update_priorities(indexes, priorities)``. Memory: growth of the RSS
of the process holding the buffer from before it was made to after the fill."""

from __future__ import annotations

import multiprocessing as mp
import os
from typing import Any

import numpy as np
from common import (
    ALPHA,
    APEX_SAMPLE,
    BATCH,
    BETA,
    LAYOUTS,
    batches,
    config_from_argv,
    emit,
    loop_until,
    priorities,
    rss_mb,
    run_processes,
    timed_loop,
)

PRE = 8


def env_dict(layout: str) -> dict[str, Any]:
    return {
        k: {"shape": s if s else 1, "dtype": np.dtype(d)} for k, (s, d) in LAYOUTS[layout].items()
    }


def cpprb_batches(layout: str, count: int, seed: int, n: int = BATCH) -> list[dict[str, Any]]:
    """The shared batches with scalar fields as (n, 1) columns, as cpprb stores them."""
    out = []
    for batch in batches(layout, count, n=n, seed=seed):
        out.append({k: v.reshape(n, -1) for k, v in batch.items()})
    return out


def make(mode: str, layout: str, size: int, prio: bool) -> Any:
    import cpprb

    if mode == "mp":
        kw: dict[str, Any] = {"ctx": mp.get_context("spawn"), "backend": "SharedMemory"}
        cls = cpprb.MPPrioritizedReplayBuffer if prio else cpprb.MPReplayBuffer
    else:
        kw = {}
        cls = cpprb.PrioritizedReplayBuffer if prio else cpprb.ReplayBuffer
    if prio:
        kw["alpha"] = ALPHA
    return cls(size, env_dict(layout), **kw)


def fill(rb: Any, layout: str, size: int, prio: bool) -> None:
    chunk = min(size, 8192)
    (template,) = cpprb_batches(layout, 1, seed=1, n=chunk)
    rng = np.random.default_rng(1)
    done = 0
    while done < size:
        n = min(chunk, size - done)
        part = {k: v[:n] for k, v in template.items()}
        if prio:
            rb.add(**part, priorities=priorities(n, rng))
        else:
            rb.add(**part)
        done += n


def adder(rb: Any, layout: str, prio: bool, seed: int) -> Any:
    pre = cpprb_batches(layout, PRE, seed)
    rng = np.random.default_rng(seed)
    pris = [priorities(BATCH, rng) for _ in range(PRE)]

    def add(i: int) -> int:
        if prio:
            rb.add(**pre[i % PRE], priorities=pris[i % PRE])
        else:
            rb.add(**pre[i % PRE])
        return BATCH

    return add


def sampler(rb: Any, prio: bool, n: int) -> Any:
    def sample(_: int) -> int:
        if prio:
            rb.sample(n, beta=BETA)
        else:
            rb.sample(n)
        return n

    return sample


def updater(rb: Any, size: int) -> Any:
    rng = np.random.default_rng(2)
    calls = [(rng.integers(0, size, BATCH), priorities(BATCH, rng)) for _ in range(64)]

    def update(i: int) -> int:
        rb.update_priorities(*calls[i % len(calls)])
        return BATCH

    return update


def writer_proc(rb: Any, layout: str, prio: bool, seed: int) -> Any:
    os.environ["OMP_NUM_THREADS"] = "1"
    add = adder(rb, layout, prio, seed)
    return lambda deadline: loop_until(deadline, add)


def sampler_proc(rb: Any, prio: bool, n: int) -> Any:
    sample = sampler(rb, prio, n)
    return lambda deadline: loop_until(deadline, sample)


def main() -> None:
    cfg = config_from_argv()
    mode, figures, seconds = cfg["mode"], set(cfg["figures"]), cfg["seconds"]
    cap4k, cap200 = cfg["cap4k"], cfg["cap200"]
    out: dict[str, Any] = {}
    for prio in (False, True):
        add_id = "add_4k_prio" if prio else "add_4k_uniform"
        smp_id = "sample_4k_prio" if prio else "sample_4k_uniform"
        if not {add_id, smp_id} & figures:
            continue
        rb = make(mode, "4k", cap4k, prio)
        fill(rb, "4k", cap4k, prio)
        if add_id in figures:
            out[add_id] = timed_loop(adder(rb, "4k", prio, 0), seconds)
        if smp_id in figures:
            out[smp_id] = timed_loop(sampler(rb, prio, BATCH), seconds)
        del rb
    if "add_200b" in figures:
        rb = make(mode, "200b", cap200, False)
        fill(rb, "200b", cap200, False)
        out["add_200b"] = timed_loop(adder(rb, "200b", False, 0), seconds)
        del rb
    if "update_small" in figures:
        rb = make(mode, "200b", cfg["update_size"], True)
        fill(rb, "200b", cfg["update_size"], True)
        out["update_small"] = timed_loop(updater(rb, cfg["update_size"]), seconds)
        del rb
    if mode == "mp" and "add_4k_4proc" in figures:
        rb = make(mode, "4k", cap4k, False)
        fill(rb, "4k", cap4k, False)
        res = run_processes([(writer_proc, (rb, "4k", False, s)) for s in range(4)], seconds)
        out["add_4k_4proc"] = {"rate": sum(r["rate"] for r in res)}
        del rb
    if mode == "mp" and figures & {"mixed_ins", "mixed_smp"}:
        rb = make(mode, "4k", cap4k, True)
        fill(rb, "4k", cap4k, True)
        workers = [(writer_proc, (rb, "4k", True, s)) for s in range(4)]
        workers.append((sampler_proc, (rb, True, BATCH)))
        res = run_processes(workers, seconds)
        out["mixed_ins"] = {"rate": sum(r["rate"] for r in res[:4])}
        out["mixed_smp"] = {"rate": res[4]["rate"]}
        del rb
    apex = {"apex_ins", "apex_smp", "apex_add_ms", "apex_sample_ms", "apex_memory",
            "update_apex"}
    if figures & apex:
        size = cfg["apex_size"]
        base = rss_mb(os.getpid())
        rb = make(mode, "200b", size, True)
        fill(rb, "200b", size, True)
        if mode == "mp":
            workers = [(writer_proc, (rb, "200b", True, s)) for s in range(2)]
            workers.append((sampler_proc, (rb, True, APEX_SAMPLE)))
            res = run_processes(workers, seconds)
            out["apex_ins"] = {"rate": sum(r["rate"] for r in res[:2])}
            out["apex_smp"] = {"rate": res[2]["rate"]}
            out["apex_add_ms"] = {"rate": float(np.median([r["ms"] for r in res[:2]]))}
            out["apex_sample_ms"] = {"rate": res[2]["ms"]}
        out["apex_memory"] = {"rate": rss_mb(os.getpid()) - base, "via": "RSS growth"}
        if "update_apex" in figures:
            out["update_apex"] = timed_loop(updater(rb, size), seconds)
    emit({"path": __doc__.replace("\n", " "), "results": out})


if __name__ == "__main__":
    main()
