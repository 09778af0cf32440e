"""Ape-X DQN (Horgan et al. 2018) on gymnasium's CartPole-v1 through one shared buffer.

    python -m redisbuf.examples.apex_dqn [--actors 3] [--minutes 10] [--seeds 0 1 2]

N actor processes play CartPole with the paper's per-actor epsilons
``eps_i = 0.4 ** (1 + 7 i / (N - 1))``, turn their steps into n-step transitions, compute
each one's initial priority (|n-step TD error| from their local copy of the network) and
``add`` them to one :class:`~redisbuf.PERSampler` buffer in batches. One learner process
samples with PER (alpha 0.6, beta annealed to 1), weights its double-DQN loss by the
importance weights, writes the new priorities back with ``update_priority`` after every
step, and publishes its parameters in the same Redis (raw float32 bytes in a msgpack map
under ``rb:{NAME}:apex:params``; nothing is pickled) for the actors to fetch every
``--refresh`` frames.

The parent starts the embedded server unless ``--url`` (or ``$REDISBUF_URL``) names one,
shows a live view (rich) and at the end writes the learning curve (``--out``, PNG) and a
JSON of the run. "Return" is the mean over the last 20 episodes of the greediest actor
(the last one; with one actor, eps = 0.4). A run stops when that reaches ``--target``
(475; 0: never), after ``--minutes``, or at the first Ctrl-C or SIGTERM (the files are
written all the same; a second one stops at once). ``redisbuf watch NAME --url URL`` shows
the buffer meanwhile.

An actor that dies (a signal, an exception, any exit) does not end the run: it is
restarted after ``--restart-delay`` seconds (doubled for each further restart of the same
actor), at most ``--max-restarts`` times (3); after that, or with ``--max-restarts 0``, the
other actors go on. The learner keeps training from the buffer meanwhile. A dead learner
ends the run (exit status 1). Deaths and restarts appear in the live view and in the JSON
(``actor_processes``); ``--status FILE`` keeps a JSON with every process's pid up to date.

Actors need only numpy (their forward pass is three matrix products); the learner uses
torch with one thread, as every process here shares the machine's cores.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, cast

import numpy as np

from redisbuf import BufferKeys, connect

# the roles and their settings; NStep, numpy_q, pack_params, unpack_params: importable here
from .apex_roles import (  # noqa: F401
    ENV_ID,
    MAX_RESTART_DELAY,
    ApexConfig,
    NStep,
    _open_buffer,
    numpy_q,
    pack_params,
    run_actor,
    run_learner,
    unpack_params,
)

#: episodes of the greediest actor that make the "mean return"
WINDOW = 20
#: seconds a process may be seen exited before its pipe ends; then its last words are lost
_EXIT_GRACE = 2.0

# -- processes ---------------------------------------------------------------------------


def _child_main(role: str, index: int, start: int, config: dict[str, Any], pipe: Any,
                stop: Any) -> None:
    """One child process. ``pipe`` is its own write end (msgpack messages to the parent)
    and ``stop`` a shared byte the parent sets to 1. Neither takes a lock shared with
    other processes, so a child killed at any instant cannot block the others."""
    from redisbuf.demos.processes import exit_with_parent
    from redisbuf.store.codec import packb

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    exit_with_parent()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    cfg = ApexConfig(**config)

    def report(message: list[Any]) -> None:
        # one write of a few bytes to a pipe of our own: whole, even if we die next
        pipe.send_bytes(packb(message))

    def should_stop() -> bool:
        return bool(stop.value)

    try:
        if role == "learner":
            run_learner(cfg, report, should_stop)
        else:
            run_actor(cfg, index, report, should_stop, start)
        report(["done", role, index])
    except BaseException as exc:
        with contextlib.suppress(OSError):
            report(["error", role, index, f"{type(exc).__name__}: {exc}"])
        raise SystemExit(1) from None


@dataclass
class ActorRecord:
    """One actor's life in a run (JSON-ready): its processes, deaths and restarts."""

    index: int
    #: pid of its current process (of its last one once it is dead)
    pid: int | None = None
    #: "running", "restarting" (dead, waiting for its restart) or "dead" (not restarted:
    #: restarts disabled or used up); the state when the run ended
    state: str = "running"
    restarts: int = 0
    #: transitions it added, in all its processes
    frames: int = 0
    #: transitions added by each of its processes: [first, after restart 1, ...]
    frames_per_start: list[int] = field(default_factory=list)
    #: one entry per death: ``at_s`` (seconds since the run started, the curve's clock),
    #: ``pid``, ``exitcode`` (negative: minus the signal's number), ``signal`` (its name, or
    #: None), ``error`` (the exception it reported, or None: a signal leaves no word),
    #: ``frames`` (added by that process) and ``restarted``
    deaths: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class RunResult:
    """One seed's run: its curve and summary numbers (all JSON-ready)."""

    seed: int
    actors: int
    #: [seconds since the actors started, env frames, mean return (last 20), episodes]
    curve: list[list[float]] = field(default_factory=list)
    time_to_target: float | None = None
    frames_to_target: int | None = None
    seconds: float = 0.0
    frames: int = 0
    episodes: int = 0
    #: from the first add to the end (process start-up left out)
    frames_per_s: float = 0.0
    learner_steps: int = 0
    learner_steps_per_s: float = 0.0
    #: time the training loop waited for a sampled batch / its time since the first step
    learner_wait_fraction: float = 0.0
    #: time the learner's buffer thread spent in sample_with_info and update_priority / the
    #: same total (it overlaps the training loop)
    learner_buffer_call_fraction: float = 0.0
    samples_per_insert: float = 0.0
    final_mean_return: float = 0.0
    best_mean_return: float = 0.0
    buffer_length: int = 0
    stats: dict[str, Any] = field(default_factory=dict)
    #: deaths of actor processes while the run went on, and restarts, over all actors
    actor_deaths: int = 0
    actor_restarts: int = 0
    #: one :class:`ActorRecord` (as a dict) per actor
    actor_processes: list[dict[str, Any]] = field(default_factory=list)
    #: the signal ("SIGINT", "SIGTERM") that ended the run before its target or time
    #: limit, or None
    stopped_by: str | None = None


class ApexError(RuntimeError):
    """The run cannot go on: its learner died, or every actor did and none may restart."""


def describe_exit(exitcode: int | None) -> str:
    """``"was killed by SIGKILL"`` / ``"exited with code 1"`` for a process's exit code."""
    if exitcode is None:
        return "is still running"
    if exitcode < 0:
        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"was killed by signal {-exitcode}"
    return f"exited with code {exitcode}"


def _signal_name(exitcode: int | None) -> str | None:
    if exitcode is None or exitcode >= 0:
        return None
    try:
        return signal.Signals(-exitcode).name
    except ValueError:
        return str(-exitcode)


@dataclass
class _Child:
    """One process the parent started, and the read end of its pipe (None at its end)."""

    role: str
    index: int
    #: 0 for an actor's first process, k for its k-th restart
    start: int
    process: Any
    reader: Any
    error: str | None = None
    #: when the parent first saw it exited; a death is handled once its pipe has ended
    exit_seen: float | None = None
    handled: bool = False


class _Monitor:
    """What the parent knows from the children's messages."""

    def __init__(self, config: ApexConfig) -> None:
        self.config = config
        self.greedy = config.actors - 1
        self.returns: deque[float] = deque(maxlen=WINDOW)
        self.last_return = float("nan")
        self.frames = 0
        self.episodes = 0
        self.inserted = 0
        # steps, sampled, seconds, blocked, buffer-thread busy, loss
        self.learner: list[Any] = [0, 0, 0.0, 0.0, 0.0, 0.0]
        self.learner_pid: int | None = None
        self.actors = [ActorRecord(i) for i in range(config.actors)]

    def handle(self, message: list[Any]) -> None:
        kind = message[0]
        if kind == "frames":
            self.inserted += message[2]
            record = self.actors[message[1]]
            record.frames += message[2]
            record.frames_per_start[message[3]] += message[2]
        elif kind == "episode":
            self.episodes += 1
            if message[1] == self.greedy:
                self.returns.append(message[2])
                self.last_return = message[2]
        elif kind == "learner":
            self.learner = message[1:]

    @property
    def mean_return(self) -> float:
        return float(np.mean(self.returns)) if self.returns else float("nan")

    def actor_summary(self) -> str:
        states = [r.state for r in self.actors]
        text = f"{states.count('running')} of {len(states)} running"
        for state in ("restarting", "dead"):
            if states.count(state):
                text += f", {states.count(state)} {state}"
        deaths = sum(len(r.deaths) for r in self.actors)
        restarts = sum(r.restarts for r in self.actors)
        return text + f"; {deaths} deaths, {restarts} restarts"

    def death_summary(self) -> str:
        parts = []
        for record in self.actors:
            if record.deaths:
                last = record.deaths[-1]
                how = last["signal"] or f"exit {last['exitcode']}"
                then = "restarted" if last["restarted"] else "not restarted"
                parts.append(f"#{record.index}: {len(record.deaths)} (last {how} at "
                             f"{last['at_s']:.0f} s, {then})")
        return "; ".join(parts)

    def status(self, seed: int, elapsed: float, finished: bool) -> dict[str, Any]:
        return {
            "seed": seed, "elapsed_s": round(elapsed, 2), "finished": finished,
            "frames": self.inserted, "episodes": self.episodes,
            "learner": {"pid": self.learner_pid, "steps": self.learner[0]},
            "actors": [asdict(r) for r in self.actors],
        }


def _write_json(path: Path, document: Any) -> None:
    """Replace ``path`` at once (a reader never sees half a file)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_finite(document), indent=1) + "\n")
    os.replace(tmp, path)


def run(config: ApexConfig, live: bool = True, console: Any = None,
        status: Path | None = None,
        stop_requested: Callable[[], str | None] | None = None) -> RunResult:
    """One seed: reset buffer ``config.name``, start the learner and the actors, follow
    them until the target or the time limit, stop them and return the result. The
    buffer is left in place (``redisbuf watch`` / inspection afterwards).

    An actor that dies while the run goes on (any exit, a signal included) is restarted
    after ``config.restart_delay`` seconds, doubled for each further restart of that actor
    (at most :data:`MAX_RESTART_DELAY`), up to ``config.max_restarts`` times; then it stays
    dead and the others go on. What it added stays in the buffer, and the learner keeps
    sampling meanwhile. Raises :class:`ApexError` when the learner dies or when no actor
    is left running or waiting for a restart. ``status``: a JSON file rewritten every
    second with the actors' pids, frames, deaths and restarts (the learner's pid too).
    ``stop_requested``: polled a few times a second; a non-empty answer (the reason, which
    goes to ``stopped_by``) ends the run as its time limit would.
    """
    import multiprocessing as mp
    from multiprocessing.connection import Connection, wait

    from rich.console import Console

    from redisbuf.demos.processes import _stop, reset_buffer
    from redisbuf.store.codec import unpackb

    console = console or Console()
    client = connect(config.url)
    reset_buffer(client, config.name)
    client.delete(config.params_key)
    buffer = _open_buffer(config)
    ctx = mp.get_context("spawn")
    # a plain shared byte: reading it takes no lock that a killed child could hold
    stop = ctx.RawValue("b", 0)
    plain = asdict(config)
    monitor = _Monitor(config)
    result = RunResult(seed=config.seed, actors=config.actors)
    children: list[_Child] = []
    restart_at: dict[int, float] = {}  # actor index -> time of its next start
    frame_count = 0
    started = time.time()

    first_add: tuple[float, int] | None = None  # (time, frames) of the first add

    def spawn(role: str, index: int, start: int) -> None:
        # one pipe per process: no lock shared between children, and the end of the pipe
        # tells the parent it has read every word of a dead process
        reader, writer = ctx.Pipe(duplex=False)
        name = "apex-learner" if role == "learner" else f"apex-actor-{index}"
        process = ctx.Process(target=_child_main, args=(role, index, start, plain, writer, stop),
                              name=name, daemon=True)
        process.start()
        writer.close()
        children.append(_Child(role, index, start, process, reader))
        if role == "learner":
            monitor.learner_pid = process.pid
        else:
            record = monitor.actors[index]
            record.pid, record.state = process.pid, "running"
            record.frames_per_start.append(0)

    def receive(child: _Child, message: list[Any]) -> None:
        nonlocal frame_count, first_add
        if message[0] == "error":
            child.error = message[3]
            return
        if message[0] == "done":
            return
        monitor.handle(message)
        if first_add is None and message[0] == "frames":
            first_add = (time.time(), monitor.inserted)
        # frames played, less the few not yet added (each frame is one transition)
        frame_count = monitor.inserted

    def pump(timeout: float) -> None:
        """Read what the children sent within ``timeout`` seconds."""
        readers = {c.reader: c for c in children if c.reader is not None}
        if not readers:
            time.sleep(timeout)
            return
        for reader in cast("list[Connection]", wait(list(readers), timeout)):
            child = readers[reader]
            try:
                for _ in range(1000):
                    receive(child, unpackb(reader.recv_bytes()))
                    if not reader.poll():
                        break
            except (EOFError, OSError):
                reader.close()
                child.reader = None

    def handle_exits(now: float) -> None:
        for child in children:
            if child.handled or child.process.exitcode is None:
                continue
            if child.reader is not None:
                # its last words (an error) may still be in its pipe
                child.exit_seen = child.exit_seen or now
                if now - child.exit_seen < _EXIT_GRACE:
                    continue
            child.handled = True
            code, pid = child.process.exitcode, child.process.pid
            why = describe_exit(code) + (f" ({child.error})" if child.error else "")
            if child.role == "learner":
                raise ApexError(f"the learner (pid {pid}) {why}: the run cannot go on "
                                "without it")
            record = monitor.actors[child.index]
            restart = record.restarts < config.max_restarts
            record.deaths.append({
                "at_s": round(now - started, 2), "pid": pid, "exitcode": code,
                "signal": _signal_name(code), "error": child.error,
                "frames": record.frames_per_start[child.start], "restarted": restart,
            })
            if restart:
                delay = min(config.restart_delay * 2**record.restarts, MAX_RESTART_DELAY)
                restart_at[child.index] = now + delay
                record.state = "restarting"
                console.print(f"apex-actor-{child.index} (pid {pid}) {why} at "
                              f"{now - started:.1f} s; restarting it in {delay:g} s (restart "
                              f"{record.restarts + 1} of {config.max_restarts})", soft_wrap=True)
            else:
                record.state = "dead"
                console.print(f"apex-actor-{child.index} (pid {pid}) {why} at "
                              f"{now - started:.1f} s; not restarted (--max-restarts "
                              f"{config.max_restarts}), the other actors go on",
                              soft_wrap=True)
            if all(r.state == "dead" for r in monitor.actors):
                raise ApexError("every actor has died and none may be restarted (--max-restarts "
                                f"{config.max_restarts}): {monitor.death_summary()}")

    def restart_due(now: float) -> None:
        for index, when in list(restart_at.items()):
            if now >= when:
                del restart_at[index]
                monitor.actors[index].restarts += 1
                spawn("actor", index, monitor.actors[index].restarts)

    rates = {"fps": 0.0, "sps": 0.0}
    previous = (time.time(), 0, 0)

    def view() -> Any:
        from rich.table import Table

        table = Table(title=f"Ape-X DQN on {ENV_ID}: seed {config.seed}, {config.actors} "
                      f"actors, buffer {config.name}", show_header=False)
        steps, sampled, seconds, blocked, io_busy, loss = monitor.learner
        elapsed = time.time() - started
        rows = [
            ("elapsed", f"{elapsed:,.0f} s of {config.minutes * 60:,.0f}"),
            ("episode return (greediest actor)",
             f"last {monitor.last_return:.0f}, mean of last {len(monitor.returns)} "
             f"{monitor.mean_return:.1f}"),
            ("episodes (all actors)", f"{monitor.episodes:,}"),
            ("env frames/s", f"{rates['fps']:,.0f} ({monitor.inserted:,} transitions)"),
            ("learner steps/s", f"{rates['sps']:,.1f} ({steps:,} steps, loss {loss:.4f})"),
            ("learner blocked on the buffer", f"{100 * blocked / seconds if seconds else 0:.1f} %"
             f" (its buffer thread busy {100 * io_busy / seconds if seconds else 0:.0f} %)"),
            ("samples per insert", f"{sampled / max(monitor.inserted, 1):.2f}"),
            ("buffer length", f"{length:,} / {config.capacity:,}"),
            ("actors", monitor.actor_summary()),
        ]
        if any(r.deaths for r in monitor.actors):
            rows.append(("actor deaths", monitor.death_summary()))
        for label, value in rows:
            table.add_row(label, value)
        return table

    length = 0
    last_point = 0.0
    deadline_s = config.minutes * 60
    try:
        started = time.time()  # times count from here: process start-up included
        spawn("learner", 0, 0)
        for i in range(config.actors):
            spawn("actor", i, 0)
        live_view = None
        if live:
            from rich.live import Live

            live_view = Live(view(), console=console, refresh_per_second=2)
            live_view.start()
        last_tick = time.time()
        try:
            while True:
                pump(0.2)
                now = time.time()
                handle_exits(now)
                restart_due(now)
                elapsed = now - started
                reached = (len(monitor.returns) == WINDOW and config.target > 0
                           and monitor.mean_return >= config.target)
                if elapsed - last_point >= 1.0 or reached:
                    last_point = elapsed
                    result.curve.append([round(elapsed, 2), frame_count,
                                         monitor.mean_return, monitor.episodes])
                if now - last_tick >= 1.0:
                    t_prev, f_prev, s_prev = previous
                    rates["fps"] = (frame_count - f_prev) / (now - t_prev)
                    rates["sps"] = (monitor.learner[0] - s_prev) / (now - t_prev)
                    previous = (now, frame_count, monitor.learner[0])
                    last_tick = now
                    length = len(buffer)
                    if status is not None:
                        _write_json(status, monitor.status(config.seed, elapsed, False))
                    if live_view is not None:
                        live_view.update(view())
                    elif int(elapsed) % 10 == 0:
                        console.print(
                            f"[{elapsed:5.0f} s] return {monitor.mean_return:6.1f} "
                            f"frames/s {rates['fps']:6.0f} learner steps/s {rates['sps']:5.1f} "
                            f"buffer {length} actors {monitor.actor_summary()}"
                        )
                if reached:
                    result.time_to_target = round(elapsed, 2)
                    result.frames_to_target = frame_count
                    break
                if elapsed >= deadline_s:
                    break
                if stop_requested is not None and (reason := stop_requested()):
                    result.stopped_by = reason
                    break
        finally:
            if live_view is not None:
                live_view.update(view())
                live_view.stop()
        stop.value = 1
        ended = time.time()
        seconds = ended - started
        # let the processes send their last reports and end (their pipes end)
        deadline = time.monotonic() + 5.0
        while any(c.reader is not None for c in children) and time.monotonic() < deadline:
            pump(0.2)
    finally:
        stop.value = 1
        _stop([c.process for c in children])
        for child in children:
            if child.reader is not None:
                child.reader.close()
    steps, sampled, busy, blocked, io_busy, _ = monitor.learner
    stats = buffer.stats()
    result.seconds = round(seconds, 2)
    result.frames = frame_count
    result.episodes = monitor.episodes
    if first_add is not None and ended > first_add[0]:
        # while acting: from the first add on, without the processes' start-up
        result.frames_per_s = (frame_count - first_add[1]) / (ended - first_add[0])
    result.learner_steps = int(steps)
    result.learner_steps_per_s = steps / busy if busy else 0.0
    result.learner_wait_fraction = blocked / busy if busy else 0.0
    result.learner_buffer_call_fraction = io_busy / busy if busy else 0.0
    result.samples_per_insert = sampled / max(stats["inserted"], 1)
    result.final_mean_return = monitor.mean_return
    result.best_mean_return = max((p[2] for p in result.curve if not math.isnan(p[2])),
                                  default=float("nan"))
    result.buffer_length = stats["length"]
    result.stats = {k: stats[k] for k in ("length", "capacity", "inserted", "evicted",
                                          "sampled", "memory_bytes")}
    result.actor_deaths = sum(len(r.deaths) for r in monitor.actors)
    result.actor_restarts = sum(r.restarts for r in monitor.actors)
    result.actor_processes = [asdict(r) for r in monitor.actors]
    if status is not None:
        _write_json(status, monitor.status(config.seed, seconds, True))
    buffer.close()
    client.close()
    return result


def _finite(value: Any) -> Any:
    """``value`` with NaN and infinities as None: JSON has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def plot(results: list[RunResult], path: Path, target: float) -> None:
    """Mean return against wall-clock and against frames, one line per seed."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_time, by_frames) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for result in results:
        curve = np.array(result.curve, dtype=float).reshape(-1, 4)
        label = f"seed {result.seed}" + (
            f" ({target:g} at {result.time_to_target:.0f} s)" if result.time_to_target else "")
        by_time.plot(curve[:, 0], curve[:, 2], label=label)
        by_frames.plot(curve[:, 1], curve[:, 2], label=label)
    for axis, xlabel in ((by_time, "wall-clock seconds"), (by_frames, "environment frames")):
        axis.set_xlabel(xlabel)
        axis.grid(alpha=0.3)
        if target > 0:
            axis.axhline(target, color="grey", linestyle="--", linewidth=1)
    by_time.set_ylabel(f"mean return, last {WINDOW} episodes (greediest actor)")
    by_time.legend(loc="lower right")
    actors = results[0].actors if results else 0
    fig.suptitle(f"Ape-X DQN, {ENV_ID}, {actors} actors + 1 learner, one redisbuf PER buffer")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    parser = argparse.ArgumentParser(
        prog="python -m redisbuf.examples.apex_dqn", description=__doc__.split("\n")[0])
    parser.add_argument("--actors", type=int, default=3)
    parser.add_argument("--minutes", type=float, default=10.0,
                        help="time limit per seed (default: 10)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0],
                        help="one run per seed, one after the other (default: 0)")
    parser.add_argument("--capacity", type=int, default=100_000, help="buffer size")
    parser.add_argument("--target", type=float, default=475.0,
                        help="stop when the mean return reaches this (0: run the full time)")
    parser.add_argument("--name", default="apex", help="buffer name (default: apex)")
    parser.add_argument("--url", default=None,
                        help="Redis URL (default: $REDISBUF_URL, else an embedded server)")
    parser.add_argument("--out", default="apex_dqn",
                        help="writes OUT.png (learning curve) and OUT.json (default: apex_dqn)")
    parser.add_argument("--no-live", action="store_true",
                        help="print a line every 10 s instead of the live view")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="restarts of each actor after it dies (0: a dead actor stays "
                        "dead and the others go on; default: 3)")
    parser.add_argument("--restart-delay", type=float, default=1.0,
                        help="seconds before an actor's first restart, doubled for each "
                        f"further one, at most {MAX_RESTART_DELAY:g} (default: 1)")
    parser.add_argument("--status", default=None, metavar="FILE",
                        help="rewrite FILE every second with a JSON of the run so far: the "
                        "learner's and actors' pids, frames, deaths and restarts")
    args = parser.parse_args(argv)
    if args.actors < 1:
        parser.error(f"--actors must be at least 1, got {args.actors}")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be 0 or more, got {args.max_restarts}")
    if not (args.restart_delay >= 0 and math.isfinite(args.restart_delay)):
        parser.error(f"--restart-delay must be 0 or more seconds, got {args.restart_delay}")
    BufferKeys(args.name)  # validates the name before anything starts
    if args.status:
        Path(args.status).parent.mkdir(parents=True, exist_ok=True)

    console = Console()
    url = args.url or os.environ.get("REDISBUF_URL")
    server = None
    if url is None:
        from redisbuf.servers.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    previous: dict[int, Any] = {}
    try:
        console.print(f"Buffer [bold]{args.name}[/] at {url}"
                      f"{' (embedded server, stops with this run)' if server else ''}; "
                      f"watch it with: redisbuf watch {args.name} --url {url}", soft_wrap=True)
        results = []
        requested: list[str] = []

        def request_stop(signum: int, frame: Any) -> None:
            if requested:  # the second one: no more waiting
                raise KeyboardInterrupt
            requested.append(signal.Signals(signum).name)

        # the first Ctrl-C (or SIGTERM) ends the run as its time limit would: results are
        # written; the second stops at once
        previous.update({sig: signal.signal(sig, request_stop)
                         for sig in (signal.SIGINT, signal.SIGTERM)})
        started = time.time()  # the run's date and load go into OUT.json
        load_before = os.getloadavg()
        for seed in args.seeds:
            config = ApexConfig(url=url, name=args.name, actors=args.actors, seed=seed,
                                minutes=args.minutes, target=args.target,
                                capacity=args.capacity, max_restarts=args.max_restarts,
                                restart_delay=args.restart_delay)
            try:
                result = run(config, live=not args.no_live and console.is_terminal,
                             console=console,
                             status=Path(args.status) if args.status else None,
                             stop_requested=lambda: requested[0] if requested else None)
            except ApexError as exc:
                console.print(f"[bold red]seed {seed} failed:[/] {exc}", soft_wrap=True)
                return 1
            results.append(result)
            console.print(
                f"seed {seed}: "
                + (f"mean return {args.target:g} at {result.time_to_target:.0f} s "
                   f"({result.frames_to_target:,} frames); " if result.time_to_target
                   else f"target not reached in {result.seconds:.0f} s; ")
                + f"best mean {result.best_mean_return:.1f}, {result.frames_per_s:,.0f} "
                f"frames/s, {result.learner_steps_per_s:.1f} learner steps/s, learner "
                f"waited on the buffer {100 * result.learner_wait_fraction:.1f} % of its time "
                f"(buffer calls {100 * result.learner_buffer_call_fraction:.0f} %), "
                f"{result.samples_per_insert:.2f} samples per insert"
                + (f"; {result.actor_deaths} actor deaths, {result.actor_restarts} restarts"
                   if result.actor_deaths else "")
                + (f"; stopped by {result.stopped_by}" if result.stopped_by else ""),
                soft_wrap=True,
            )
            if result.stopped_by:
                break
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        plot(results, out.with_suffix(".png"), args.target)
        document = {"env": ENV_ID, "command": [
            "python", "-m", "redisbuf.examples.apex_dqn", *sys.argv[1:]], "config": {
            k: v for k, v in asdict(config).items() if k not in ("url", "seed")},
            "runs": [asdict(r) for r in results],
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(started)),
            "load": {"before": [round(x, 2) for x in load_before],
                     "after": [round(x, 2) for x in os.getloadavg()]}}
        out.with_suffix(".json").write_text(json.dumps(_finite(document), indent=1) + "\n")
        console.print(f"wrote {out.with_suffix('.png')} and {out.with_suffix('.json')}")
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if server is not None:
            server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
