"""The server's own account of the work an operation asks of it, read with MONITOR: every
command the server ran while the operation ran, those clients sent and those their
scripts ran, with how many items each one named or asked for. It does not depend on how
loaded the machine is (no clock): a command whose work grows with the buffer shows as a
command over the bound however fast the machine.

Items of a command: a range by index asks for its span (a range open at one end, such
as ``0 -1``, for everything: unbounded), a range by score for its LIMIT (none:
unbounded), a SCAN step for its COUNT, a command reading a whole key (HGETALL, SMEMBERS,
...) for everything but of a meta hash (a fixed set of fields); any other command names
its arguments after the key (field and value pairs count once)."""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import redis

_QUOTED = re.compile(rb'"((?:[^"\\]|\\.)*)"')
_WHOLE = {"HGETALL", "HKEYS", "HVALS", "SMEMBERS", "KEYS", "SINTER", "SUNION", "SDIFF"}
_BY_INDEX = {"ZRANGE", "ZREVRANGE", "LRANGE"}
_BY_SCORE = {"ZRANGEBYSCORE", "ZREVRANGEBYSCORE", "ZRANGEBYLEX", "ZREVRANGEBYLEX"}
_SCANS = {"SCAN", "HSCAN", "ZSCAN", "SSCAN"}
_PAIRS = {"HSET", "HMSET", "MSET", "ZADD"}
# removals of a range whose size the command does not say (insertion-time entries of old
# adds, lua/_items.lua trim_times): counted as one
_REMOVE_RANGE = {"ZREMRANGEBYSCORE", "ZREMRANGEBYRANK", "ZREMRANGEBYLEX", "LTRIM"}


def items_of(args: list[str]) -> float:
    """How many items one command (name, then its arguments) names or asks for."""
    name, rest = args[0].upper(), args[1:]
    upper = [a.upper() for a in rest]
    if name in _WHOLE:
        # a meta hash holds a fixed set of fields (configuration and counters)
        return 1 if rest and rest[0].endswith(":meta") else math.inf
    if name in _BY_INDEX:
        if "BYSCORE" in upper or "BYLEX" in upper:
            return _limit(upper)
        start, stop = int(rest[1]), int(rest[2])
        if (start >= 0) != (stop >= 0):
            return math.inf
        return max(0, stop - start + 1)
    if name in _BY_SCORE:
        return _limit(upper)
    if name in _SCANS:
        return int(upper[upper.index("COUNT") + 1]) if "COUNT" in upper else 10
    if name in _REMOVE_RANGE:
        return 1
    if name in _PAIRS:
        return max(1, (len(rest) - 1) // 2)
    return max(1, len(rest) - 1)


def _limit(upper: list[str]) -> float:
    if "LIMIT" not in upper:
        return math.inf
    at = upper.index("LIMIT")
    offset, count = int(upper[at + 1]), int(upper[at + 2])
    return math.inf if count < 0 else offset + count


@dataclass
class Work:
    """What the server ran in a :func:`watched` window: per command sent by a client, its
    arguments and the commands its script ran (``(arguments, from a script)`` pairs in the
    order run)."""

    commands: list[tuple[list[str], bool]] = field(default_factory=list)

    def most_items(self) -> tuple[float, list[str]]:
        """The most items one command named or asked for, and that command (cut short)."""
        worst: tuple[float, list[str]] = (0, [])
        for args, _ in self.commands:
            items = items_of(args)
            if items > worst[0]:
                worst = (items, args[:4])
        return worst

    def most_items_per_call(self) -> tuple[float, list[str]]:
        """The most items the commands run for one client command (it and those its script
        ran) named or asked for in all, and that command (cut short)."""
        worst: tuple[float, list[str]] = (0, [])
        total, head = 0.0, []
        for args, scripted in [*self.commands, (["PING"], False)]:
            if not scripted:
                if total > worst[0]:
                    worst = (total, head)
                total, head = 0.0, args[:3]
            total += items_of(args)
        return worst


@contextmanager
def watched(url: str) -> Iterator[Work]:
    """Record every command the server at ``url`` runs while the block runs (MONITOR on a
    connection of its own; the block's own commands and those of its scripts)."""
    work = Work()
    marker = f"command-work-end-{id(work)}"
    connection = redis.Redis.from_url(url).connection_pool.get_connection()
    connection.send_command("MONITOR")
    assert connection.read_response() in (b"OK", "OK")

    def read() -> None:
        while True:
            line = connection.read_response(disable_decoding=True)
            bracket = line.index(b"]")
            source = line[line.index(b"[") + 1 : bracket]
            args = [_unescaped(a) for a in _QUOTED.findall(line[bracket:])]
            if args[:2] == ["ECHO", marker]:
                return
            work.commands.append((args, source.split()[-1] == b"lua"))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        yield work
    finally:
        client = redis.Redis.from_url(url)
        client.echo(marker)
        reader.join(60)
        client.close()
        connection.disconnect()
    assert not reader.is_alive(), "MONITOR never saw the end of the window"


def _unescaped(raw: bytes) -> str:
    return raw.decode("latin-1").encode("latin-1").decode("unicode_escape", errors="replace")
