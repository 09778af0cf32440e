"""A replica's first read of a buffer's scores when there is no snapshot to read
(redisbuf/sampling/replica.py, MassReplica.load): native HMGET / SCAN calls of bounded
cost that lua/replica_read.lua names, their replies parsed with numpy, several in flight
on one connection where the ids are known beforehand."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from ..store.connection import LOST, unavailable

if TYPE_CHECKING:
    from .base import BufferView

# Native calls of this many items each (an HMGET of that many ids, or a SCAN step of that
# COUNT: about 5 ms of server time at 2x10^6 items)
_SCAN_COUNT = 10_000
# HMGET calls in flight at once: the server answers the next while this process parses one
_DEPTH = 3
# "0000" .. "9999": a stored id's 12 digits are three of these
_DIGITS4 = np.frombuffer(b"".join(b"%04d" % i for i in range(10_000)),
                         dtype=np.uint8).reshape(-1, 4)


def read_scores(
    buffer: BufferView, version: int, pin_ms: int, holder: str, base: bool = False,
    read: bool = False,
) -> tuple[np.ndarray, np.ndarray, str | None]:
    """(ids, scores, base stamp) of every item present from log version ``version`` until
    the read ends; an item changed meanwhile may come with either score, one added or
    removed meanwhile may come or not, an id may come twice. lua/replica_read.lua says
    what to read and keeps the log's entries after ``version`` for ``pin_ms``
    milliseconds as the pin of reader ``holder`` (a token of letters and digits), renewed
    every ``pin_ms / 4`` while the read goes on; the reads are native commands of bounded
    cost, parsed with numpy, several in flight where the ids are known beforehand.

    With ``base`` (a replay buffer's PER, whose priorities are the snapshot and the log;
    no snapshot of the epoch: the caller tried it first) the scores are the epoch's base,
    as of its first entry (version 1, which ``version`` must then be): the ids present,
    each with the priority lua/replica_read.lua names, or the per hash of the earlier
    layout; the base stamp is that entry's stamp ("" when the log no longer holds it).
    Otherwise (softmax, a sequence buffer's priorities) the scores are as of the read and
    the base stamp is None. ``read``: with the script's read-only variant (no pin)."""
    all_keys = buffer.keys.all_keys()

    def pin() -> list[Any]:
        return buffer.run("replica_read", all_keys, [pin_ms, version, holder], read=read)

    plan = pin()
    how, key = plan[0].decode() if isinstance(plan[0], bytes) else str(plan[0]), plan[1]
    renewed = time.monotonic()

    def renew() -> None:
        nonlocal renewed
        if time.monotonic() - renewed > pin_ms / 4000:
            pin()
            renewed = time.monotonic()

    client = buffer.client
    stamp = _text(plan[-1]) if base else None
    if how == "ids":
        return (*_read_by_id(client, key, int(plan[2]), int(plan[3]), renew), stamp)
    command = "HSCAN" if how == "hash" else "ZSCAN"
    id_parts, score_parts = [], []
    for ids, scores in _scan(client, command, key, renew):
        id_parts.append(np.array(ids, dtype=np.int64) if ids else np.empty(0, np.int64))
        if how == "zero":  # no log-rewards stored: every item's is 0
            score_parts.append(np.zeros(len(ids)))
        elif how == "base":  # every item present at the epoch's start: its base priority
            score_parts.append(np.full(len(ids), float(plan[2])))
        else:
            score_parts.append(_floats(scores))
    return np.concatenate(id_parts), np.concatenate(score_parts), stamp


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _plain_pool(client: Any) -> Any:
    """The connection pool of a client of one server (commands can be sent ahead of
    their replies on one of its connections), None for another (a cluster's)."""
    plain = getattr(client, "unwrapped", client)  # a Guarded client (store/connection.py)
    return plain.connection_pool if isinstance(plain, redis.Redis) else None


def _scan(client: Any, command: str, key: bytes,
          renew: Callable[[], None]) -> Iterator[tuple[list[bytes], list[Any]]]:
    """The (members, scores) of each step of a full HSCAN / ZSCAN of ``key``. The next
    step is asked for before this one is handed on, so the server reads while the
    caller parses."""
    pool = _plain_pool(client)
    if pool is None:
        cursor: Any = 0
        while True:
            renew()
            if command == "HSCAN":
                cursor, found = client.hscan(key, cursor, count=_SCAN_COUNT)
                yield list(found.keys()), list(found.values())
            else:
                cursor, pairs = client.zscan(key, cursor, count=_SCAN_COUNT)
                yield [m for m, _ in pairs], [s for _, s in pairs]
            if int(cursor) == 0:
                return
    with _sending_ahead(client, pool) as connection:
        connection.send_command(command, key, 0, "COUNT", _SCAN_COUNT)
        while True:
            cursor, flat = connection.read_response()
            done = int(cursor) == 0
            if not done:
                renew()
                connection.send_command(command, key, cursor, "COUNT", _SCAN_COUNT)
            yield flat[0::2], flat[1::2]
            if done:
                return


@contextlib.contextmanager
def _sending_ahead(client: Any, pool: Any) -> Iterator[Any]:
    """A connection of ``pool`` to send commands on ahead of their replies: given back
    after; dropped when the block ends early (replies may still be on their way, so it
    is not reusable), a lost server raised as ServerUnavailableError."""
    connection = pool.get_connection()
    try:
        yield connection
    except LOST as exc:
        connection.disconnect()
        raise unavailable(client, exc) from None
    except BaseException:
        connection.disconnect()
        raise
    finally:
        pool.release(connection)


def _read_by_id(client: Any, key: bytes, first: int, last: int,
                renew: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, priorities) of the ids first .. last that ``key`` (the per hash) holds, by
    HMGET slices of ``_SCAN_COUNT`` ids, ``_DEPTH`` of them in flight at once."""
    ids = np.arange(first, last + 1, dtype=np.int64)
    scores = np.empty(len(ids))
    bounds = [(a, min(a + _SCAN_COUNT, len(ids))) for a in range(0, len(ids), _SCAN_COUNT)]
    pool = _plain_pool(client)
    if pool is None:
        for a, b in bounds:
            renew()
            scores[a:b] = _floats(client.hmget(key, [b"%012d" % i for i in ids[a:b].tolist()]))
    else:
        key_bytes = key if isinstance(key, bytes) else str(key).encode()
        head = b"$5\r\nHMGET\r\n$%d\r\n%s\r\n" % (len(key_bytes), key_bytes)
        with _sending_ahead(client, pool) as connection:
            sent = 0
            for k, (a, b) in enumerate(bounds):
                while sent < min(len(bounds), k + _DEPTH):
                    lo, hi = bounds[sent]
                    connection.send_packed_command(
                        [b"*%d\r\n" % (hi - lo + 2) + head, _id_fields(ids[lo:hi])])
                    sent += 1
                scores[a:b] = _floats(connection.read_response())
                renew()
    held = ~np.isnan(scores)
    return ids[held], scores[held]


def _id_fields(ids: np.ndarray) -> bytes:
    """Ids (below 10^12) as RESP bulk strings of their stored form (``%012d``), back to
    back, built without a Python loop."""
    rows = np.empty((len(ids), 19), dtype=np.uint8)
    rows[:, :5] = np.frombuffer(b"$12\r\n", dtype=np.uint8)
    rows[:, 5:9] = _DIGITS4[ids // 100_000_000]
    rows[:, 9:13] = _DIGITS4[(ids // 10_000) % 10_000]
    rows[:, 13:17] = _DIGITS4[ids % 10_000]
    rows[:, 17] = 13
    rows[:, 18] = 10
    return rows.tobytes()


def _floats(values: Sequence[Any]) -> np.ndarray:
    """Numbers as text (or floats; ``inf``, ``-inf``), None (absent) as NaN."""
    if None in values:
        values = [b"nan" if v is None else v for v in values]
    return np.array(values, dtype=np.float64) if len(values) else np.empty(0)


__all__ = ["read_scores"]
