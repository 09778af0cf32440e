"""The demo: several OS processes share one replay buffer in Redis.

Each worker process draws trajectories of a random policy on
:class:`~redisbuf.envs.HyperGrid`, ``add`` s them to the one buffer and ``sample`` s from
it. The parent only supervises: it creates the buffer, starts the workers (``spawn``
context, real processes), follows their progress through small msgpack messages
(:mod:`redisbuf.control.ipc`; no batch crosses a process boundary except through Redis), and
stops them all when one fails or when it is interrupted.

:func:`run_worker` is also the loop of ``redisbuf worker`` (one worker in the
foreground, e.g. one container of ``docker-compose.yml``).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_module
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from multiprocessing.connection import wait
from typing import Any

import numpy as np

from ..buffers.replay import ReplayBuffer
from ..control.ipc import MessageQueue
from ..control.remote import ManagerLink
from ..envs import HyperGrid
from ..errors import RedisBufError
from ..store.connection import as_client, connect
from ..store.keys import BufferKeys, validate_name

#: Called after each batch with (worker index, items added, items sampled) of that batch.
ProgressCallback = Callable[[int, int, int], None]
#: A worker's work: (config, index, on_batch) -> (items added, items sampled).
WorkFunction = Callable[["DemoConfig", int, ProgressCallback], tuple[int, int]]

_JOIN_TIMEOUT = 5.0
_MANAGER_WAIT = 60.0
_DRAIN_TIMEOUT = 1.0


class DemoError(RedisBufError):
    """The demo could not run to the end (a worker failed, bad settings...)."""


@dataclass(frozen=True)
class DemoConfig:
    """Settings of one demo run (shared by every worker; plain data, so it can be passed
    to a spawned process)."""

    url: str
    name: str = "demo"
    workers: int = 4
    batches: int = 25
    batch_size: int = 64
    sample_size: int = 64
    capacity: int = 10_000
    prioritized_sampling: bool = False
    prioritized_capacity: bool = False
    ndim: int = 2
    height: int = 8
    seed: int = 0
    #: score every add with the manager of buffer ``name`` over the Redis control plane
    #: (``redisbuf manager NAME``), and send it EXIT at the end; the buffer is the
    #: manager's (its capacity and eviction policy, not ``capacity`` above)
    manager: bool = False

    def validate(self) -> None:
        """Raise :class:`DemoError` naming the first bad setting."""
        try:
            validate_name(self.name)
        except ValueError as exc:
            raise DemoError(str(exc)) from None
        positive = {
            "workers": self.workers,
            "batch_size": self.batch_size,
            "sample_size": self.sample_size,
            "capacity": self.capacity,
        }
        for label, value in positive.items():
            if value < 1:
                raise DemoError(f"{label.replace('_', '-')} must be at least 1, got {value}")
        if self.batches < 0:
            raise DemoError(f"batches must be 0 (run until stopped) or more, got {self.batches}")
        if self.ndim < 1 or self.height < 2:
            raise DemoError(
                f"HyperGrid needs ndim >= 1 and height >= 2, got {self.ndim} and {self.height}"
            )

    @property
    def planned_items(self) -> int:
        """Items all workers will add together (0 when they run until stopped)."""
        return self.workers * self.batches * self.batch_size

    def open_buffer(self, redis_or_url: Any, seed: int | None = None) -> ReplayBuffer:
        """The demo buffer, created if missing (a different stored capacity or eviction
        policy raises :class:`~redisbuf.errors.ConfigMismatchError`). With ``manager``
        the manager owns the buffer: wait for it to exist and adopt its configuration."""
        if not self.manager:
            return ReplayBuffer(
                redis_or_url,
                self.name,
                capacity=self.capacity,
                prioritized_capacity=self.prioritized_capacity,
                prioritized_sampling=self.prioritized_sampling,
                seed=seed,
            )
        client = as_client(redis_or_url)
        wait_for_manager_buffer(client, self.name)
        return ReplayBuffer.open(
            client,
            self.name,
            prioritized_sampling=self.prioritized_sampling,
            seed=seed,
            manager=ManagerLink(0, backend="redis"),
        )


def wait_for_manager_buffer(client: Any, name: str) -> None:
    """Return once the manager of ``name`` has created its buffer; a :class:`DemoError`
    after :data:`_MANAGER_WAIT` seconds. Signal handlers that raise (Ctrl-C, the CLI's
    SIGTERM) end the wait at once: it polls with short sleeps."""
    deadline = time.monotonic() + _MANAGER_WAIT
    while not client.exists(BufferKeys(name).meta):
        if time.monotonic() > deadline:
            raise DemoError(
                f"no manager created buffer {name!r} within {_MANAGER_WAIT:.0f} s "
                f"(start `redisbuf manager {name} --workers N` first)"
            )
        time.sleep(0.1)


@dataclass
class DemoResult:
    """What a demo run did: the buffer's stats afterwards and the timings."""

    config: DemoConfig
    stats: dict[str, Any]
    added: int
    sampled: int
    wall_seconds: float
    loop_seconds: float

    @property
    def add_throughput(self) -> float:
        """Items added per second while the workers were adding (all workers together)."""
        return self.added / self.loop_seconds if self.loop_seconds > 0 else 0.0

    @property
    def sample_throughput(self) -> float:
        return self.sampled / self.loop_seconds if self.loop_seconds > 0 else 0.0


def run_worker(
    config: DemoConfig,
    index: int,
    on_batch: ProgressCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> tuple[int, int]:
    """Add ``config.batches`` batches of HyperGrid trajectories (forever when 0, or until
    ``should_stop()``), sampling ``config.sample_size`` items after each add. With
    ``config.manager`` each add is scored by the buffer's manager, which gets EXIT once the
    loop ends. Returns (items added, items sampled)."""
    buffer = config.open_buffer(config.url, seed=config.seed * 1_000_003 + index)
    env = HyperGrid(ndim=config.ndim, height=config.height)
    rng = np.random.default_rng([config.seed, index])
    added = sampled = 0
    done = 0
    while config.batches == 0 or done < config.batches:
        if should_stop is not None and should_stop():
            break
        # numpy trajectories: a worker needs no torch (importing it costs seconds a process)
        batch = env.sample_trajectories(config.batch_size, rng, tensors=False)
        buffer.add(batch)
        drawn = buffer.sample(config.sample_size)
        added += len(batch)
        sampled += len(drawn)
        done += 1
        if on_batch is not None:
            on_batch(index, len(batch), len(drawn))
    if buffer.remote is not None:
        from ..control.manager import ReplayBufferManager

        buffer.drain_pending_score()
        ReplayBufferManager.send_termination_signal(buffer.remote.manager_rank, buffer)
    return added, sampled


def worker_main(
    index: int, config: dict[str, Any], messages: Any, work: WorkFunction = run_worker
) -> None:
    """Entry point of one spawned worker process: runs ``work`` and reports on ``messages``
    with small tuples: ``("start", i, t)``, ``("batch", i, added, sampled)``, ``("done",
    i, t, added, sampled)`` or ``("error", i, text)``, then exits non-zero on error.
    """
    # Ctrl-C in a terminal reaches the whole process group: let the parent stop us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    exit_with_parent()
    try:
        cfg = DemoConfig(**config)
        messages.put(("start", index, time.time()))
        added, sampled = work(cfg, index, lambda i, a, s: messages.put(("batch", i, a, s)))
        messages.put(("done", index, time.time(), added, sampled))
    except BaseException as exc:  # report everything, then exit non-zero
        messages.put(("error", index, f"{type(exc).__name__}: {exc}"))
        raise SystemExit(1) from None


def exit_with_parent() -> None:
    """Exit this (multiprocessing) child at once when its parent dies, even by SIGKILL.

    A daemon thread waits on the parent's sentinel (a pipe that reaches EOF when the
    parent is gone); nothing else would stop a worker blocked on Redis or looping forever.
    """
    parent = mp.parent_process()
    if parent is None:
        return

    def watch() -> None:
        wait([parent.sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="redisbuf-parent-watch", daemon=True).start()


def reset_buffer(client: Any, name: str) -> bool:
    """Delete the buffer ``name`` if it exists; returns whether it did."""
    keys = BufferKeys(name)
    return bool(client.delete(*keys.all_keys()))


def run_demo(
    config: DemoConfig,
    on_batch: ProgressCallback | None = None,
    work: WorkFunction = run_worker,
) -> DemoResult:
    """Run the demo against ``config.url``: reset the buffer ``config.name``, start
    ``config.workers`` processes, wait for them, and return the buffer's stats.

    ``work`` is what each worker process runs (a module-level function, so that a spawned
    process can import it). Raises :class:`DemoError` naming the worker when one fails
    (the others are stopped first). On KeyboardInterrupt the workers are stopped before
    it propagates.
    """
    config.validate()
    if config.batches == 0:
        raise DemoError("the demo needs a finite number of batches (use `redisbuf worker`)")
    client = connect(config.url)
    try:
        reset_buffer(client, config.name)
        buffer = config.open_buffer(client)
        return _supervise(config, buffer, on_batch, work)
    finally:
        client.close()


def _supervise(
    config: DemoConfig,
    buffer: ReplayBuffer,
    on_batch: ProgressCallback | None,
    work: WorkFunction,
) -> DemoResult:
    ctx = mp.get_context("spawn")
    messages = MessageQueue(ctx)
    processes = {
        i: ctx.Process(
            target=worker_main,
            args=(i, asdict(config), messages, work),
            name=f"redisbuf-demo-worker-{i}",
            daemon=True,
        )
        for i in range(config.workers)
    }
    started = time.time()
    starts: dict[int, float] = {}
    finished: dict[int, dict[str, float]] = {}
    failures: dict[int, str] = {}
    added = sampled = 0

    def handle(message: tuple[Any, ...]) -> None:
        nonlocal added, sampled
        kind, index = message[0], message[1]
        if kind == "start":
            starts[index] = message[2]
        elif kind == "batch":
            added += message[2]
            sampled += message[3]
            if on_batch is not None:
                on_batch(index, message[2], message[3])
        elif kind == "done":
            end = message[2]
            finished[index] = {"start": starts.get(index, end), "end": end}
        elif kind == "error":
            failures[index] = message[2]

    def drain(timeout: float) -> bool:
        try:
            handle(messages.get(timeout=timeout))
            return True
        except queue_module.Empty:
            return False

    interrupted = False
    try:
        for process in processes.values():
            process.start()
        while len(finished) < len(processes) and not failures:
            if drain(0.1):
                continue
            for index, process in processes.items():
                if index in finished or process.exitcode is None:
                    continue
                # it exited: its last messages may still be in the pipe
                deadline = time.monotonic() + _DRAIN_TIMEOUT
                while index not in finished and index not in failures:
                    if not drain(max(0.0, deadline - time.monotonic())):
                        break
                if index not in finished and index not in failures:
                    failures[index] = f"exited with code {process.exitcode} without reporting"
    except KeyboardInterrupt:
        interrupted = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not break cleanup
        raise
    finally:
        _stop(processes.values())
        messages.close()
        if interrupted:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    if failures:
        index = min(failures)
        others = f" ({len(failures) - 1} more failed)" if len(failures) > 1 else ""
        raise DemoError(f"worker {index} failed: {failures[index]}{others}")
    wall = time.time() - started
    loop = max(f["end"] for f in finished.values()) - min(f["start"] for f in finished.values())
    return DemoResult(config, buffer.stats(), added, sampled, wall, max(loop, 1e-9))


def _stop(processes: Any) -> None:
    """Terminate the processes still running and reap all of them."""
    processes = list(processes)
    for process in processes:
        if process.pid is not None and process.exitcode is None:
            process.terminate()
    deadline = time.monotonic() + _JOIN_TIMEOUT
    for process in processes:
        if process.pid is None:
            continue
        process.join(max(0.0, deadline - time.monotonic()))
        if process.exitcode is None:
            process.kill()
            process.join(_JOIN_TIMEOUT)


__all__ = [
    "DemoConfig",
    "DemoError",
    "DemoResult",
    "ProgressCallback",
    "WorkFunction",
    "exit_with_parent",
    "reset_buffer",
    "run_demo",
    "run_worker",
    "worker_main",
]
