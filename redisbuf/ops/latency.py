"""Measuring how long one operation makes every other client of a server wait.

Redis runs one command at a time: while a command runs, every other client's commands
wait. :class:`LatencyProbe` is another process that PINGs the server every few
milliseconds and records how long each reply took; :meth:`LatencyProbe.window` gives the
worst reply seen while a block of code ran. :func:`slowest_command` reads the server's
own account (SLOWLOG) of the slowest command in the same window, which a loaded machine
does not inflate the way it inflates the probe's clock.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis


def _probe(url: str, interval: float, conn: Any, ready: Any) -> None:
    client = redis.Redis.from_url(url)
    client.ping()
    ready.set()
    worst = 0.0
    while True:
        if conn.poll():
            message = conn.recv()
            if message == "stop":
                return
            conn.send(worst)  # "read": the worst since the previous read
            worst = 0.0
        start = time.perf_counter()
        while True:
            try:
                client.ping()
                break
            except redis.exceptions.TimeoutError:
                continue  # the server is still busy: the reply is later still
        worst = max(worst, time.perf_counter() - start)
        time.sleep(interval)


@dataclass
class Window:
    """What a :meth:`LatencyProbe.window` saw: the probe's worst PING reply and the
    server's slowest command (SLOWLOG), both in seconds (filled when the window closes)."""

    probe_worst: float = 0.0
    server_worst: float = 0.0
    server_command: list[str] = field(default_factory=list)


class LatencyProbe:
    """A spawned process PINGing ``url`` every ``interval`` seconds (a context manager).

    Inside ``with probe.window() as seen:`` the operation runs; after the block,
    ``seen.probe_worst`` is the slowest PING reply in that time and ``seen.server_worst``
    the slowest command the server logged (it sets ``slowlog-log-slower-than`` to
    ``slowlog_threshold_us`` and keeps the previous setting to restore on exit)."""

    def __init__(self, url: str, interval: float = 0.002, slowlog_threshold_us: int = 1000):
        self.url = url
        self.interval = interval
        self.threshold = slowlog_threshold_us
        self.admin = redis.Redis.from_url(url)
        self._saved: dict[Any, Any] = {}
        self._process: Any = None
        self._conn: Any = None

    def __enter__(self) -> LatencyProbe:
        self._saved = {
            **self.admin.config_get("slowlog-log-slower-than"),
            **self.admin.config_get("slowlog-max-len"),
        }
        self.admin.config_set("slowlog-log-slower-than", self.threshold)
        self.admin.config_set("slowlog-max-len", 100_000)
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        ready = context.Event()
        self._process = context.Process(
            target=_probe, args=(self.url, self.interval, child, ready), daemon=True
        )
        self._process.start()
        if not ready.wait(60):
            raise RuntimeError("the latency probe did not start")
        return self

    def __exit__(self, *exc_info: object) -> None:
        try:
            self._conn.send("stop")
        finally:
            self._process.join(10)
            if self._process.is_alive():
                self._process.kill()
            for name, value in self._saved.items():
                self.admin.config_set(name, value)
            self.admin.close()

    def _read(self) -> float:
        self._conn.send("read")
        if not self._conn.poll(600):
            raise RuntimeError("the latency probe stopped answering")
        return float(self._conn.recv())

    @contextmanager
    def window(self) -> Iterator[Window]:
        seen = Window()
        self.admin.slowlog_reset()
        self._read()  # forget what came before
        try:
            yield seen
        finally:
            time.sleep(3 * self.interval)  # let a PING queued behind the last command return
            seen.probe_worst = self._read()
            seen.server_worst, seen.server_command = slowest_command(self.admin)


def slowest_command(client: Any) -> tuple[float, list[str]]:
    """The slowest command in the server's SLOWLOG (seconds, its first words)."""
    worst, command = 0.0, []
    for entry in client.slowlog_get(100_000):
        duration = entry["duration"] / 1e6
        if duration > worst:
            raw = entry.get("command", b"")
            text = raw.decode(errors="replace") if isinstance(raw, bytes) else str(raw)
            worst, command = duration, text.split(" ")[:3]
    return worst, command
