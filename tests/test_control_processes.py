"""Manager and workers as real processes over the Redis control plane (real server)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest

from redisbuf import ManagerLink, ReplayBuffer, connect
from redisbuf.control.ipc import MessageQueue
from redisbuf.control.manager import ReplayBufferManager
from redisbuf.control.redis import RedisWorkerTransport
from redisbuf.errors import ControlTimeoutError

pytestmark = [pytest.mark.redis_server, pytest.mark.multiprocess, pytest.mark.timeout(120)]

HB = {"heartbeat_interval": 0.2, "heartbeat_ttl": 1.0}
CTX = mp.get_context("spawn")


def rank_scorer(batch: Any, sender_rank: int = -1) -> dict[str, float]:
    """Echo the sender and the batch's first x: the worker checks both."""
    return {"rank": float(sender_rank), "first_x": float(np.asarray(batch["x"])[0])}


def run_manager(url: str, name: str, workers: int, events: Any) -> None:
    try:
        manager = ReplayBufferManager(
            connect(url), 0, workers, scoring_function=rank_scorer, name=name, capacity=1000,
            communication_backend="redis", idle_timeout=60.0, **HB,
        )
        manager.run()
        events.put(("manager", "ok", sorted(manager.exited)))
    except Exception as exc:
        events.put(("manager", "error", f"{type(exc).__name__}: {exc}"))


def _batch(rank: int, i: int) -> dict[str, np.ndarray]:
    x = np.arange(4, dtype=np.float64) + 1000 * rank + 10 * i
    return {"x": x, "log_rewards": np.full(4, float(i))}


def run_worker(url: str, name: str, rank: int, mode: str, events: Any) -> None:
    """mode: "sync" / "async" run 5 adds and exit; "hang" adds once then sleeps;
    "slow" adds once, reports, waits a little and adds again (the manager dies meanwhile)."""
    try:
        client = connect(url)
        transport = RedisWorkerTransport(client, name, rank=rank, connect_timeout=30.0, **HB)
        transport.connect()
        buffer = ReplayBuffer(client, name, capacity=None, manager=ManagerLink(
            0, backend=transport, async_score=mode == "async"))
        checks = []
        for i in range(5 if mode in ("sync", "async") else 1):
            score = buffer.add(_batch(rank, i)).score
            if mode == "async":
                if i == 0:
                    metadata = ReplayBufferManager.get_metadata(0, buffer)  # score pending
                    checks.append(("metadata", metadata["length"] >= 4))
                    assert score is None
                    continue
                i -= 1  # async: the score of the previous batch
            expected_x = 1000 * rank + 10 * i
            checks.append(("score", score["rank"] == rank, score["first_x"] == expected_x))
        if mode == "async":
            last = buffer.drain_pending_score(10.0)
            checks.append(("drain", last["first_x"] == 1000 * rank + 40))
        events.put(("worker", rank, checks))
        if mode == "hang":
            time.sleep(600)
        if mode == "slow":
            time.sleep(0.5)
            buffer.add(_batch(rank, 1))
        ReplayBufferManager.send_termination_signal(0, buffer)
        events.put(("worker", rank, "exited"))
    except ControlTimeoutError as exc:
        events.put(("worker", rank, f"timeout: {exc}"))
    except Exception as exc:
        events.put(("worker", rank, f"error: {type(exc).__name__}: {exc}"))


def _next(events: Any, timeout: float = 60.0) -> tuple:
    return tuple(events.get(timeout=timeout))


def _stop(*processes: mp.Process) -> None:
    for process in processes:
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join(timeout=5)


def test_scores_reach_the_right_worker_and_the_manager_exits(redis_server, buffer_name):
    events = MessageQueue(CTX)
    manager = CTX.Process(target=run_manager, args=(redis_server.url, buffer_name, 2, events))
    workers = [
        CTX.Process(target=run_worker, args=(redis_server.url, buffer_name, rank, mode, events))
        for rank, mode in ((3, "sync"), (5, "async"))
    ]
    for process in (manager, *workers):
        process.start()
    try:
        seen: dict[Any, Any] = {}
        while len(seen) < 5:
            kind, who, what = _next(events)
            seen[(kind, who, what if what == "exited" else "checks")] = what
        assert seen[("manager", "ok", "checks")] == [3, 5]
        for rank in (3, 5):
            checks = seen[("worker", rank, "checks")]
            assert checks and all(all(c[1:]) for c in checks), checks
        kinds = [c[0] for c in seen[("worker", 5, "checks")]]
        assert kinds[0] == "metadata" and kinds[-1] == "drain"
        manager.join(timeout=20)
        assert manager.exitcode == 0
        assert len(ReplayBuffer.open(redis_server.url, buffer_name)) == 40
    finally:
        _stop(manager, *workers)


# A process killed while its queue feeder thread holds the queue's write lock would block
# every other writer of that queue: a process that gets killed has a queue of its own.


def test_a_killed_worker_is_reported_and_the_data_survives(redis_server, buffer_name):
    events, doomed_events = MessageQueue(CTX), MessageQueue(CTX)
    manager = CTX.Process(target=run_manager, args=(redis_server.url, buffer_name, 2, events))
    doomed = CTX.Process(target=run_worker,
                         args=(redis_server.url, buffer_name, 4, "hang", doomed_events))
    for process in (manager, doomed):
        process.start()
    try:
        assert _next(doomed_events)[:2] == ("worker", 4)  # it was scored once
        os.kill(doomed.pid, signal.SIGKILL)
        kind, status, detail = _next(events, timeout=120)
        assert (kind, status) == ("manager", "error")
        assert "ControlTimeoutError" in detail and "[4]" in detail and "without EXIT" in detail
        buffer = ReplayBuffer.open(redis_server.url, buffer_name)
        assert len(buffer) == 4
        assert sorted(np.asarray(buffer.sample(4)["x"]).tolist()) == [4000, 4001, 4002, 4003]
    finally:
        _stop(manager, doomed)


def test_a_killed_manager_gives_the_worker_a_timeout(redis_server, buffer_name):
    events, doomed_events = MessageQueue(CTX), MessageQueue(CTX)
    manager = CTX.Process(target=run_manager,
                          args=(redis_server.url, buffer_name, 1, doomed_events))
    worker = CTX.Process(target=run_worker,
                         args=(redis_server.url, buffer_name, 2, "slow", events))
    for process in (manager, worker):
        process.start()
    try:
        kind, rank, checks = _next(events)
        assert (kind, rank) == ("worker", 2) and all(all(c[1:]) for c in checks)
        os.kill(manager.pid, signal.SIGKILL)
        kind, rank, outcome = _next(events, timeout=30)
        assert outcome.startswith("timeout:") and "stopped" in outcome, outcome
        buffer = ReplayBuffer.open(redis_server.url, buffer_name)
        assert len(buffer) == 8  # both batches were stored before the score was awaited
        assert sorted(np.asarray(buffer.sample(8)["x"]).tolist())[:2] == [2000.0, 2001.0]
    finally:
        _stop(manager, worker)


def test_cli_manager_serves_until_exit(redis_server, buffer_name):
    command = [sys.executable, "-m", "redisbuf", "manager", buffer_name,
               "--workers", "1", "--url", redis_server.url, "--capacity", "100",
               "--heartbeat", "0.2", "--heartbeat-ttl", "1", "--idle-timeout", "60", "--timing"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    try:
        client = connect(redis_server.url)
        transport = RedisWorkerTransport(client, buffer_name, connect_timeout=30.0, **HB)
        transport.connect()
        buffer = ReplayBuffer(client, buffer_name, capacity=None,
                              manager=ManagerLink(0, backend=transport))
        score = buffer.add({"x": np.zeros(3), "log_rewards": np.array([1.0, 2.0, -np.inf])}).score
        assert score == {"score": float("inf"), "baseline_log_reward": 1.0}
        ReplayBufferManager.send_termination_signal(0, buffer)
        out, _ = process.communicate(timeout=30)
        assert process.returncode == 0, out
        assert "all 1 worker(s) sent EXIT" in out and "timing per rank" in out
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=5)


def test_queue_helper_times_out():
    with pytest.raises(queue.Empty):
        _next(MessageQueue(CTX), timeout=0.01)


def test_manager_demo_runs_and_reports(redis_server, buffer_name):
    from io import StringIO

    from rich.console import Console

    from redisbuf.demos import manager as demo

    console = Console(file=StringIO(), width=120)
    summary = demo.run(redis_server.url, buffer_name, workers=2, batches=4, console=console)
    assert summary["workers"] == 2 and 1 <= summary["round_trips"] <= 8
    assert summary["length"] == summary["capacity"] == 128
    assert summary["baseline_source"] == "buffer" and summary["baseline_log_reward"] is not None
    assert "manager finished" in console.file.getvalue()
