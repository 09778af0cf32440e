"""Live demo of the manager: one manager and N worker processes over the Redis backend.

:func:`run` starts a :class:`~redisbuf.control.manager.ReplayBufferManager` and ``workers``
worker processes (``spawn``), all on buffer ``name`` at ``url``. Each worker adds
``batches`` HyperGrid batches with baseline filtering; the manager scores each one and
replies with the baseline. The parent shows, live with rich, every worker's last score,
how many trajectories the baseline let through, and the buffer's fill and baseline. Only
small msgpack messages cross to the parent (:mod:`redisbuf.control.ipc`); batches travel
through Redis.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_module
import time
from typing import Any

import numpy as np
from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..control.ipc import MessageQueue
from ..errors import RedisBufError

_ENV = {"ndim": 2, "height": 12}
_BATCH = 32


class ManagerDemoError(RedisBufError):
    """A demo process failed or the demo ran past its deadline."""


def hypergrid_score(batch: Any, sender_rank: int = -1) -> dict[str, float]:
    """Mean log-reward of the batch's terminal cells and their count."""
    from ..envs import HyperGrid

    cells = np.asarray(batch.terminating_states)
    if not len(cells):
        return {"mean_log_reward": float("nan"), "scored": 0.0}
    log_rewards = HyperGrid(**_ENV).log_reward(cells)
    return {"mean_log_reward": float(log_rewards.mean()), "scored": float(len(cells))}


def _manager_main(url: str, name: str, workers: int, capacity: int, events: Any) -> None:
    from ..control.manager import ReplayBufferManager
    from ..store.connection import connect
    from .processes import exit_with_parent

    exit_with_parent()
    try:
        manager = ReplayBufferManager(
            connect(url), 0, workers, scoring_function=hypergrid_score, capacity=capacity,
            communication_backend="redis", name=name, heartbeat_interval=0.5,
            heartbeat_ttl=3.0, idle_timeout=60.0,
        )
        events.put(("manager-ready", None))
        manager.run()
        meta = manager.metadata()
        events.put(("manager-done", {k: meta[k] for k in (
            "length", "capacity", "baseline_log_reward", "baseline_source", "requests",
            "missing_items",
        )}))
    except Exception as exc:
        events.put(("error", f"manager: {type(exc).__name__}: {exc}"))
        raise


def _worker_main(
    url: str, name: str, index: int, batches: int, events: Any, batch_size: int = _BATCH
) -> None:
    from ..buffers.replay import ReplayBuffer
    from ..control.manager import ReplayBufferManager
    from ..control.redis import RedisWorkerTransport
    from ..control.remote import ManagerLink
    from ..envs import HyperGrid
    from ..store.connection import connect
    from .processes import exit_with_parent

    exit_with_parent()
    try:
        client = connect(url)
        transport = RedisWorkerTransport(
            client, name, connect_timeout=60.0, heartbeat_interval=0.5, heartbeat_ttl=3.0
        )
        transport.connect()  # waits for the manager, which creates the buffer first
        buffer = ReplayBuffer(
            client, name, capacity=None,
            manager=ManagerLink(0, backend=transport, baseline_filtering=True,
                                baseline_refresh_after=5),
        )
        env, rng = HyperGrid(**_ENV), np.random.default_rng(1000 + index)
        remote = buffer.remote
        assert remote is not None
        for _ in range(batches):
            score = buffer.add(env.sample_trajectories(batch_size, rng, tensors=False)).score
            events.put(("score", (index, transport.rank, score, remote.baseline_kept,
                                  remote.baseline_total)))
        ReplayBufferManager.send_termination_signal(0, buffer)
        events.put(("worker-done", index))
    except Exception as exc:
        events.put(("error", f"worker {index}: {type(exc).__name__}: {exc}"))
        raise


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.0f}" if value.is_integer() else f"{value:.4f}"
    return str(value)


def _table(name: str, rows: dict[int, dict[str, Any]], buffer_line: str) -> Table:
    table = Table(title=f"redisbuf manager demo: buffer {name!r}", caption=buffer_line)
    for column in ("worker", "rank", "batches", "scored", "kept / seen", "mean log R",
                   "baseline"):
        table.add_column(column, justify="right")
    for index in sorted(rows):
        row = rows[index]
        score = row.get("score") or {}
        table.add_row(
            str(index), _fmt(row.get("rank")), str(row.get("batches", 0)),
            _fmt(score.get("scored")), f"{row.get('kept', 0)} / {row.get('seen', 0)}",
            _fmt(score.get("mean_log_reward")), _fmt(score.get("baseline_log_reward")),
        )
    return table


def run(
    url: str,
    name: str,
    workers: int,
    batches: int,
    console: Console,
    *,
    capacity: int | None = None,
    batch_size: int = _BATCH,
) -> dict:
    """Run the demo to the end and return a summary: ``workers``, ``batches``,
    ``round_trips`` (scores received), ``elapsed_s``, ``round_trips_per_s`` and the
    manager's final ``length``, ``capacity``, ``baseline_log_reward``,
    ``baseline_source``. ``capacity`` defaults to a quarter of what the workers add (at
    least four batches). Raises :class:`ManagerDemoError` if a process fails."""
    from ..control.redis import ControlKeys
    from ..store.connection import connect
    from ..store.keys import BufferKeys

    if workers < 1 or batches < 1 or batch_size < 1:
        raise ValueError("workers, batches and batch_size must be >= 1")
    if capacity is not None and capacity < 1:
        raise ValueError("capacity must be >= 1")
    client = connect(url)
    if client.get(ControlKeys(name).manager) is not None:
        raise ManagerDemoError(f"a manager is already running for buffer {name!r}")
    client.delete(*BufferKeys(name).all_keys())  # a fresh buffer for each demo run
    if capacity is None:
        capacity = max(4 * batch_size, workers * batches * batch_size // 4)
    context = mp.get_context("spawn")
    events = MessageQueue(context)
    processes = [context.Process(
        target=_manager_main, args=(url, name, workers, capacity, events), daemon=True
    )]
    processes += [
        context.Process(
            target=_worker_main, args=(url, name, i, batches, events, batch_size), daemon=True
        )
        for i in range(workers)
    ]
    rows: dict[int, dict[str, Any]] = {i: {} for i in range(workers)}
    summary: dict[str, Any] = {"workers": workers, "batches": batches, "round_trips": 0}
    deadline = time.monotonic() + 120.0 + 0.5 * workers * batches
    began = time.monotonic()
    done_workers = 0
    buffer_line = "starting processes..."
    for process in processes:
        process.start()
    try:
        with Live(_table(name, rows, buffer_line), console=console, refresh_per_second=8) as live:
            while "length" not in summary:
                if time.monotonic() > deadline:
                    raise ManagerDemoError("the demo ran past its deadline")
                try:
                    kind, payload = events.get(timeout=0.25)
                except queue_module.Empty:
                    dead = [p for p in processes if p.exitcode not in (None, 0)]
                    if dead:
                        raise ManagerDemoError(
                            f"a demo process exited with status {dead[0].exitcode}"
                        ) from None
                    continue
                if kind == "error":
                    raise ManagerDemoError(payload)
                if kind == "score":
                    index, rank, score, kept, seen = payload
                    row = rows[index]
                    row.update(rank=rank, kept=kept, seen=seen)
                    row["batches"] = row.get("batches", 0) + 1
                    if score is not None:
                        row["score"] = score
                        summary["round_trips"] += 1
                elif kind == "worker-done":
                    done_workers += 1
                elif kind == "manager-done":
                    summary.update(payload)
                meta = client.hmget(BufferKeys(name).meta, "baseline_ema")
                length = client.zcard(BufferKeys(name).order)
                ema = None if meta[0] is None else float(meta[0])
                buffer_line = (
                    f"buffer {length}/{capacity} items   EMA baseline {_fmt(ema)}   "
                    f"workers done {done_workers}/{workers}"
                )
                live.update(_table(name, rows, buffer_line))
    finally:
        for process in processes:
            process.join(timeout=5.0)
            if process.is_alive():
                process.terminate()
                process.join(timeout=5.0)
    elapsed = time.monotonic() - began
    summary["elapsed_s"] = elapsed
    summary["round_trips_per_s"] = summary["round_trips"] / elapsed if elapsed > 0 else 0.0
    console.print(
        f"manager finished: buffer {summary['length']}/{summary['capacity']}, baseline "
        f"{_fmt(summary['baseline_log_reward'])} ({summary['baseline_source']}), "
        f"{summary['round_trips']} scores in {elapsed:.1f} s"
    )
    return summary
