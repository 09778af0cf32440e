"""Samplers: each chooses items, commits each draw in one Lua call and returns ids and blobs.

A sampler is one part with one job; adding a sampling mode means adding one class here
(and its script in ``lua/``), not editing the buffer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import redis

from ..errors import ConfigMismatchError, EmptyBufferError, SamplingError
from ..store import bounds, scripts
from ..store.connection import retrying
from .replica import MassReplica, replica_of

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer


@dataclass
class Draw:
    """What a sampler drew: ids, raw blobs, and each draw's probability when known."""

    ids: list[int]
    blobs: list[bytes]
    probabilities: np.ndarray | None = None
    schema_json: bytes | None = None  # the meta's schema, read in the same round trip
    weights: np.ndarray | None = None  # PER importance-sampling weights (DI-engine's IS)
    importance_weights: np.ndarray | None = None  # ALF's priority / mean non-zero priority


class Sampler(Protocol):
    name: str

    def prepare(self, buffer: ReplayBuffer) -> None:
        """Create whatever server-side structure the sampler needs (idempotent)."""

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Raises EmptyBufferError when nothing can be drawn."""


# Two round trips (ids from the script, blobs by a native HMGET) cost the server about a
# tenth of returning blobs from Lua; an item evicted in between makes us draw again, and
# after a few such races the script fetches the blobs itself, atomically.
_FETCH_ATTEMPTS = 3


def _uniform_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random 48-bit integers; word / 2**48 is a uniform in [0, 1)."""
    return rng.integers(0, 2**48, n, dtype=np.uint64)


def _pack_words(words: np.ndarray) -> bytes:
    """48-bit words as 6 little-endian bytes each (read by ``uniform_at`` in
    lua/_common.lua)."""
    return words.astype("<u8").view(np.uint8).reshape(len(words), 8)[:, :6].tobytes()


def packed_uniforms(rng: np.random.Generator, n: int) -> bytes:
    """``n`` uniforms in [0, 1) as 48-bit little-endian integers (read by ``uniform_at``
    in lua/_common.lua)."""
    return _pack_words(_uniform_words(rng, n))


def _draw_then_fetch(
    buffer: ReplayBuffer,
    script: str,
    keys: list[str],
    head: list[Any],
    n: int,
    uniforms: bytes,
    parse: Callable[[list[Any], int], tuple[list[bytes], np.ndarray | None, int]],
) -> Draw:
    # fetch_inline: the script may remove what it draws (max_use), so only it can read them
    first = _FETCH_ATTEMPTS if getattr(buffer, "fetch_inline", False) else 0
    for attempt in range(first, _FETCH_ATTEMPTS + 1):
        inline = attempt == _FETCH_ATTEMPTS
        reply = buffer._run(script, keys, [*head, int(inline), uniforms])
        members, probabilities, offset = parse(reply, n)
        pipe = buffer.client.pipeline(transaction=False)
        if not inline:
            pipe.hmget(buffer.keys.items, members)
        pipe.hget(buffer.keys.meta, "schema")
        *fetched, schema_json = pipe.execute()
        blobs = reply[offset : offset + n] if inline else fetched[0]
        if not inline and any(blob is None for blob in blobs):
            buffer._run("undo_draws", keys, members)  # not a real draw
            continue
        return Draw([int(m) for m in members], blobs, probabilities, schema_json)
    raise AssertionError("unreachable")


# Ids go to the guess-mode script 12 digits each (lua/_common.lua's id_str); from 10^12
# on they are wider, and the script draws them itself.
_ID_LIMIT = 10**12


class _IdRange:
    """What the last uniform draw saw of a buffer: ``length`` items with ids ``first ..
    first + length - 1`` (``first`` None when there are holes), and how the last guesses
    based on it fared."""

    __slots__ = ("first", "length", "misses", "skip")

    def __init__(self) -> None:
        self.first: int | None = None
        self.length = 0
        self.misses = 0  # guesses in a row that missed (another process changed the range)
        self.skip = 0  # draws left to make without guessing (backing off after misses)


def _uniform_ranks(words: np.ndarray, length: int, replace: bool) -> np.ndarray:
    """The insertion ranks lua/sample_uniform.lua draws for these uniforms from ``length``
    items: the same float arithmetic, so the same ranks."""
    n = len(words)
    u = words.astype(np.float64) / 2.0**48
    if replace:
        return np.floor(u * length).astype(np.int64)
    steps = np.arange(n)
    js = (steps + np.floor(u * (length - steps)).astype(np.int64)).tolist()
    # sparse Fisher-Yates: swapped[k] is what rank position k holds after earlier swaps
    swapped: dict[int, int] = {}
    ranks = []
    for i, j in enumerate(js):
        ranks.append(swapped.get(j, j))
        swapped[j] = swapped.get(i, i)
    return np.array(ranks, dtype=np.int64)


class UniformSampler:
    """Uniform over the items present. Without replacement every n-subset is equally
    likely; with replacement (or when n exceeds the length) draws are independent.

    lua/sample_uniform.lua draws the ids from uniforms this process sends and records
    the draw. When the last draw showed the ids present to be one contiguous range (FIFO
    eviction, no removals), this process computes the ids those uniforms give for that
    range itself, with the script's arithmetic, and sends the script (which then only
    checks that the range is unchanged and records the draw) and the HMGET of those ids
    in one pipeline: one round trip, no drawing on the server. If the range moved
    meanwhile, the script records nothing and the draw is made again for the range it
    reports, so the ids are always those the script's own draw would give.

    A draw of more than :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` items is
    made as several commands of at most that many (``_draw_chunked``).
    """

    name = "uniform"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: ReplayBuffer) -> None:
        return None

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        if n > bounds.MAX_ITEMS_PER_COMMAND:
            return _draw_chunked(buffer, n, rng, self.replacement)
        keys = buffer.keys
        # kept on the buffer: a sampler made per call (replacement=...) shares it
        seen: _IdRange | None = getattr(buffer, "_uniform_ids", None)
        if seen is None:
            seen = buffer._uniform_ids = _IdRange()
        words = _uniform_words(rng, n)
        uniforms = _pack_words(words)
        head = [n, int(self.replacement)]

        def note(reply: list[Any]) -> None:
            seen.length = int(reply[0])
            seen.first = int(reply[1]) if int(reply[1]) >= 0 else None

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], None, int]:
            note(reply)
            return reply[2 : 2 + n], None, 2 + n

        # max_use: the script may remove what it draws, so it must read the blobs itself
        guessing = not getattr(buffer, "fetch_inline", False)
        if guessing and seen.skip > 0:
            seen.skip -= 1
            guessing = False
        for _ in range(_FETCH_ATTEMPTS if guessing else 0):
            if seen.first is None or seen.first + seen.length > _ID_LIMIT:
                break
            draw = self._guess(buffer, n, words, seen, note)
            if draw is not None:
                seen.misses = 0
                return draw
        else:
            if guessing:  # the range kept moving: other processes add often, guess less
                seen.misses += 1
                seen.skip = min(2**seen.misses, 64) - 1
        return _draw_then_fetch(
            buffer, "sample_uniform", keys.all_keys(), head, n, uniforms, parse
        )

    def _guess(
        self,
        buffer: ReplayBuffer,
        n: int,
        words: np.ndarray,
        seen: _IdRange,
        note: Callable[[list[Any]], None],
    ) -> Draw | None:
        """One pipeline: the script in guess mode, HMGET of the guessed ids, the schema.
        None when the guess was not recorded (or an item went missing before the HMGET,
        and the draw was taken back); ``seen`` then holds what the script saw."""
        keys = buffer.keys
        first, length = seen.first, seen.length
        replace = self.replacement or n > length
        ids = (_uniform_ranks(words, length, replace) + first).tolist()
        members = [b"%012d" % i for i in ids]
        all_keys = keys.all_keys()
        args = [n, int(self.replacement), 0, b"", first, length, b"".join(members)]

        def send(script: scripts.Script) -> list[Any]:
            pipe = buffer.client.pipeline(transaction=False)
            pipe.evalsha(script.sha, len(all_keys), *all_keys, *args)
            pipe.hmget(keys.items, members)
            pipe.hget(keys.meta, "schema")
            return pipe.execute(raise_on_error=False)

        script = scripts.load("sample_uniform")
        reply, blobs, schema_json = retrying(lambda: send(script), name=buffer.client)
        if isinstance(reply, scripts._REFUSED_WRITES):
            # a full server or a replica: the read-only variant, which records nothing,
            # as the plain path does (tried anew each draw: the server may recover)
            script = script.read_only
            reply, blobs, schema_json = retrying(lambda: send(script), name=buffer.client)
        if isinstance(reply, redis.exceptions.NoScriptError):
            buffer.client.script_load(script.source)
            reply, blobs, schema_json = retrying(lambda: send(script), name=buffer.client)
        if isinstance(reply, Exception):
            # NOSCRIPT, an empty buffer, any other error: the plain path runs the script
            # again and handles each (and loads it)
            seen.first = None
            return None
        note(reply)
        if not int(reply[2]):
            return None
        if isinstance(blobs, Exception) or any(blob is None for blob in blobs):
            buffer._run("undo_draws", all_keys, members)  # not a real draw
            if isinstance(blobs, Exception):
                raise blobs
            return None
        return Draw(ids, blobs, None, schema_json)


def _joined(parts: list[Draw]) -> Draw:
    """One Draw of several draws' items, in order (their probabilities unknown)."""
    return Draw(
        [i for part in parts for i in part.ids],
        [blob for part in parts for blob in part.blobs],
        None,
        next((part.schema_json for part in reversed(parts) if part.schema_json), None),
    )


# Rounds in a row in which a chunk of a draw without replacement kept nothing before it
# concludes that the buffer no longer holds enough items it has not returned yet.
_IDLE_ROUNDS = 64


def _draw_chunked(
    buffer: ReplayBuffer, n: int, rng: np.random.Generator, replacement: bool
) -> Draw:
    """A uniform draw of more items than one command may take
    (:data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`), as successive commands.

    With replacement (or ``n`` above the length) each chunk is an independent uniform
    draw, so the whole is one. Without replacement every chunk draws among the items
    present when it runs that the earlier chunks did not return (lua/sample_uniform.lua's
    chunk modes, which keep the returned ids in a set of the draw's own): the ``n`` items
    are distinct, and when no other process changes the buffer during the call every
    ``n``-subset is equally likely, in uniformly random order. When ``n`` is at most half
    the length, each chunk keeps uniform candidates that are not in that set (rejection:
    fewer than 1.4 candidates per item); above, a scan of the insertion order keeps each
    item with probability (items still wanted) / (items not yet read) (selection
    sampling), then the result is shuffled."""
    limit = bounds.MAX_ITEMS_PER_COMMAND
    length = len(buffer)
    if length == 0:
        raise EmptyBufferError("buffer is empty")
    if replacement or n > length:
        sampler = UniformSampler(True)
        return _joined([sampler.draw(buffer, stop - start, rng)
                        for start, stop in bounds.chunks(n, limit)])
    drawn_key = buffer.keys.drawing(os.urandom(8).hex())
    keys = [*buffer.keys.all_keys(), drawn_key]
    inline = bool(getattr(buffer, "fetch_inline", False))
    ids: list[int] = []
    blobs: list[bytes] = []
    have: set[int] = set()
    schema_json: bytes | None = None
    scanned = scan = n > length // 2
    cursor, idle, per_read = 0, 0, limit
    try:
        while len(ids) < n:
            need = n - len(ids)
            if scan:
                count = per_read
                args: list[Any] = [need, 0, int(inline), packed_uniforms(rng, count), "scan",
                                   cursor]
            else:
                want = min(need, per_read)
                free = max(length - len(have), 1)
                count = min(limit, int(want * length / free * 1.2) + 16)
                args = [want, 0, int(inline), packed_uniforms(rng, count), "exclude"]
            reply = buffer._run("sample_uniform", keys, args)
            length = int(reply[0])
            body = reply[2:]
            k = len(body) // 2 if inline else len(body)
            members = list(body[:k])
            if scan:
                cursor = int(reply[1])
                scan = cursor >= 0  # the scan reached the end: the rest by rejection
            if inline:
                got = list(body[k:])
            elif members:
                pipe = buffer.client.pipeline(transaction=False)
                pipe.hmget(buffer.keys.items, members)
                pipe.hget(buffer.keys.meta, "schema")
                got, schema_json = pipe.execute()
                gone = [m for m, blob in zip(members, got, strict=True) if blob is None]
                if gone:  # evicted before the HMGET: not drawn
                    buffer._run("undo_draws", buffer.keys.all_keys(), gone)
            else:
                got = []
            kept = 0
            for member, blob in zip(members, got, strict=True):
                item = int(member)
                # the read-only variant cannot keep the set: its repeats are dropped here
                if blob is None or item in have:
                    continue
                have.add(item)
                ids.append(item)
                blobs.append(blob)
                kept += 1
            if kept and blobs:
                per_read = bounds.items_for_bytes(
                    sum(len(b) for b in blobs[-kept:]) / kept)
            idle = 0 if kept or scan else idle + 1
            if idle >= _IDLE_ROUNDS:
                raise SamplingError(
                    f"a draw of {n} items without replacement found only {len(ids)}: the "
                    "buffer lost items while it was being drawn from"
                )
    except BaseException:
        for start, stop in bounds.chunks(len(ids), limit):  # best effort: not a draw
            try:
                buffer._run("undo_draws", buffer.keys.all_keys(),
                            [b"%012d" % i for i in ids[start:stop]])
            except Exception:
                break
        raise
    finally:
        try:
            # UNLINK: freeing a set of 10^6 ids took 270 ms of the server's thread (DEL)
            buffer.client.unlink(drawn_key)
        except Exception:
            pass  # it expires by itself
    if inline:
        schema_json = buffer.client.hget(buffer.keys.meta, "schema")
    if scanned:
        order = rng.permutation(len(ids)).tolist()
        ids = [ids[i] for i in order]
        blobs = [blobs[i] for i in order]
    return Draw(ids, blobs, None, schema_json)


# Attempts at committing a prioritized draw: the first from the replica as it is, each
# later one from a replica caught up by the previous reply (a round trip each); many
# suffice only while writers change the buffer between every draw and its commit.
_COMMIT_ATTEMPTS = 64


@dataclass
class _ReplicaDraw:
    ids: list[int]
    blobs: list[bytes]
    schema_json: bytes | None
    probabilities: np.ndarray
    masses: np.ndarray
    scores: np.ndarray
    min_mass: float
    per_sum: float
    per_nonzero: int


def _replica_draw(
    buffer: ReplayBuffer, rule: str, n: int, rng: np.random.Generator, replacement: bool
) -> _ReplicaDraw:
    """Draw ``n`` items from the buffer's replica for ``rule`` and commit the draw with
    lua/sample_prioritized.lua, in the same round trip as the blob read. A replica that
    was behind is caught up from the script's reply (read after the sample began) and
    draws again; its draw then stands if its items are still present."""
    replica = replica_of(buffer, rule)
    inline = bool(getattr(buffer, "fetch_inline", False))  # max_use: the script reads
    script = scripts.load("sample_prioritized")
    with replica.lock:
        try:
            return _commit_attempts(buffer, rule, n, rng, replacement, replica, inline, script)
        except BaseException:
            replica.fresh = False  # caught up for this sample, not for a later one
            raise


def _commit_attempts(
    buffer: ReplayBuffer,
    rule: str,
    n: int,
    rng: np.random.Generator,
    replacement: bool,
    replica: MassReplica,
    inline: bool,
    script: scripts.Script,
) -> _ReplicaDraw:
    """Draws with replacement are committed only when the replica is current ("exact"):
    a draw found stale is corrected to the law of the state the script reported
    (MassReplica.correct changes only the draws the changes concern) and sent again, so
    under concurrent writers each attempt costs one round trip and a few redraws. Draws
    without replacement (successive draws) are drawn again in full, and committed by
    presence once the replica was caught up after the sample began."""
    if rule == "per" and replacement:
        return _commit_corrected(buffer, n, rng, replica, inline, script)
    keys = buffer.keys
    all_keys = keys.all_keys()
    ids: np.ndarray | None = None
    draw_probabilities: np.ndarray | None = None
    for _ in range(_COMMIT_ATTEMPTS):
        replace = replacement or n > len(replica)
        if ids is None or not replace:
            mode = "present" if replica.fresh and not replace else "exact"
            replica.fresh = False
            try:
                replica.check_drawable(buffer.name, n, replace)
            except (EmptyBufferError, SamplingError):
                if mode == "present":
                    raise
                replica.sync(buffer)  # it may be behind: decide on what the buffer holds now
                ids = None
                replica.fresh = not replace
                if replace:
                    replica.check_drawable(buffer.name, n, replace)
                continue
            slots, draw_probabilities, _ = replica.draw(n, rng, replace)
            ids = replica.ids[slots]
        else:
            mode = "exact"
        members = [b"%012d" % i for i in ids.tolist()]
        args = [rule, replica.epoch, replica.version, mode, int(inline), *members]
        replies = _send_commit(buffer, script, args, None if inline else members)
        reply = replies[0]
        touched: set[int] | None = None
        if int(reply[0]) != 1:
            touched = replica.catch_up(buffer, reply)
        else:
            blobs = reply[8 : 8 + int(reply[7])] if inline else replies[1]
            if all(blob is not None for blob in blobs):
                slots = np.array([replica.slot_of[i] for i in ids.tolist()], dtype=np.int64)
                masses = replica.tree.sums[slots + replica.tree.size]
                probabilities = (
                    masses / replica.tree.total if replace else draw_probabilities
                )
                return _ReplicaDraw(
                    ids.tolist(), list(blobs), replies[-1], probabilities, masses,
                    replica.scores[slots], replica.tree.min_mass, float(reply[2]),
                    int(reply[3]),
                )
            buffer._run("undo_draws", all_keys, members)  # gone before the HMGET: no draw
            touched = replica.sync(buffer)
        if replace and touched is not None and replica.positive > 0:
            ids = replica.correct(ids, touched, rng)
        else:
            ids = None
    raise SamplingError(
        f"buffer {buffer.name!r}: a prioritized draw could not be committed in "
        f"{_COMMIT_ATTEMPTS} attempts (the buffer changed before every commit)"
    )


# Spare draws sent with each PER draw, for the server to use in its place when its item
# changed since the replica's version (lua/sample_prioritized.lua, "correct" mode)
_SPARES = 2


def _send_commit(
    buffer: ReplayBuffer, script: scripts.Script, args: list[Any], members: list[bytes] | None
) -> list[Any]:
    """The commit script, the HMGET of ``members`` (None: none) and the schema, in one
    pipeline; the script's reply translated (the read-only variant on a server refusing
    writes)."""
    keys = buffer.keys
    all_keys = keys.all_keys()

    def send() -> list[Any]:
        pipe = buffer.client.pipeline(transaction=False)
        pipe.evalsha(script.sha, len(all_keys), *all_keys, *args)
        if members is not None:
            pipe.hmget(keys.items, members)
        pipe.hget(keys.meta, "schema")
        return pipe.execute(raise_on_error=False)

    replies = retrying(send, name=buffer.client)
    if isinstance(replies[0], redis.exceptions.NoScriptError):
        buffer.client.script_load(script.source)
        replies = retrying(send, name=buffer.client)
    reply = replies[0]
    if isinstance(reply, redis.exceptions.ResponseError):
        if isinstance(reply, scripts._REFUSED_WRITES):
            replies[0] = buffer._run("sample_prioritized", all_keys, args)  # read-only variant
        else:
            raise scripts.translate(reply)
    elif isinstance(reply, Exception):
        raise reply
    return replies


def _commit_corrected(
    buffer: ReplayBuffer,
    n: int,
    rng: np.random.Generator,
    replica: MassReplica,
    inline: bool,
    script: scripts.Script,
) -> _ReplicaDraw:
    """PER draws (with replacement) committed in "correct" mode: whatever changed since
    the replica's version, the server corrects the draw to the law at the commit
    (lua/sample_prioritized.lua, correct_draw) and returns the log entries the replica
    lacks, so a draw stands in one round trip however busy the writers are; the blobs of
    the few draws it replaced are read in a second."""
    keys = buffer.keys
    all_keys = keys.all_keys()
    synced = replica.fresh  # read after this sample began
    spares = max(_SPARES, replica.spares)
    for _ in range(_COMMIT_ATTEMPTS):
        replica.fresh = False
        try:
            replica.check_drawable(buffer.name, n, True)
        except (EmptyBufferError, SamplingError):
            if synced:
                raise
            replica.sync(buffer)  # it may be behind: decide on what the buffer holds now
            synced = True
            continue
        slots, _, _ = replica.draw(n * (1 + spares), rng, True)
        candidates = replica.ids[slots].reshape(n, 1 + spares)
        primary = candidates[:, 0]
        primary_slots = slots.reshape(n, 1 + spares)[:, 0]
        packed = _id_text(candidates.reshape(-1))
        members = [packed[k : k + 12] for k in range(0, len(packed), 12 * (1 + spares))]
        uniforms = packed_uniforms(rng, 2 * n)
        args = ["per", replica.epoch, replica.version, "correct", int(inline), packed,
                spares, uniforms]
        replies = _send_commit(buffer, script, args, None if inline else members)
        reply = replies[0]
        if int(reply[0]) != 1:
            touched = replica.catch_up(buffer, reply)
            synced = True
            if touched:  # some draw had every candidate changed: send more candidates
                spares = _spares_for(replica, touched, n)
            continue
        replica.spares = max(_SPARES, int(spares * 0.9))  # slowly back to the default
        count = int(reply[7])
        blobs = list(reply[8 : 8 + count]) if inline else list(replies[1])
        if reply[4]:  # corrected: catch up with the entries it went by
            ids = np.frombuffer(reply[4], dtype="S12").astype(np.int64)
            entries = reply[8 + count :]
            replica.catch_up(buffer, [0, reply[5], reply[6], 0, *entries])
            if not inline:
                moved = np.flatnonzero(ids != primary)
                if len(moved):
                    fetched = buffer.client.hmget(keys.items, [
                        b"%012d" % i for i in ids[moved].tolist()])
                    for position, blob in zip(moved.tolist(), fetched, strict=True):
                        blobs[position] = blob
        else:
            ids = primary
        final = members if ids is primary else [b"%012d" % i for i in ids.tolist()]
        if any(blob is None for blob in blobs):  # gone before the HMGET: not a draw
            buffer._run("undo_draws", all_keys, final)
            replica.sync(buffer)
            continue
        if replica.epoch != _text(reply[5]) or replica.version != int(reply[6]):
            replica.sync(buffer)  # (a reload meanwhile) the masses as of now
        if ids is primary:
            where = primary_slots
        else:
            where = np.array([replica.slot_of.get(i, -1) for i in ids.tolist()],
                             dtype=np.int64)
        if (where < 0).any():
            buffer._run("undo_draws", all_keys, final)
            continue
        masses = replica.tree.sums[where + replica.tree.size]
        return _ReplicaDraw(
            ids.tolist(), blobs, replies[-1], masses / replica.tree.total, masses,
            replica.scores[where], replica.tree.min_mass, float(reply[2]), int(reply[3]),
        )
    raise SamplingError(
        f"buffer {buffer.name!r}: a prioritized draw could not be committed in "
        f"{_COMMIT_ATTEMPTS} attempts"
    )


def _spares_for(replica: MassReplica, touched: set[int], n: int) -> int:
    """Spare draws per draw such that all 1 + spares of some draw's candidates fall on
    changed items with probability about 1%, if as much changes before the next commit
    as the share of the mass that ``touched`` holds now (at most 64)."""
    where = [replica.slot_of[i] for i in touched if i in replica.slot_of]
    share = float(replica.tree.sums[np.array(where, dtype=np.int64) + replica.tree.size].sum())
    share = min(max(share / replica.tree.total, 1e-9), 0.99) if replica.tree.total > 0 else 0.5
    needed = int(np.ceil(np.log(0.01 / n) / np.log(share))) - 1
    spares = min(64, max(_SPARES, needed))
    replica.spares = spares
    return spares


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


_DIGITS = 10 ** np.arange(11, -1, -1, dtype=np.int64)


def _id_text(ids: np.ndarray) -> bytes:
    """Ids (< 10^12) as 12-digit text, back to back (lua/_common.lua's id_str), without a
    Python loop. The mass log packs ids 12 characters wide too (as the earlier sum tree's
    slot maps did): prioritized sampling stops at id 10^12."""
    if len(ids) and int(ids.max()) >= _ID_LIMIT:
        raise SamplingError(f"prioritized sampling packs ids in 12 digits; id {int(ids.max())}")
    digits = (ids.astype(np.int64)[:, None] // _DIGITS) % 10 + 48
    return digits.astype(np.uint8).tobytes()


class PrioritizedSampler:
    """Item ``i`` is drawn with probability ``exp(log_reward_i) / sum_j exp(log_reward_j)``
    (softmax of log-rewards; items with log-reward -inf are never drawn).

    Without replacement (the default, unless ``n`` exceeds the length) the draws are
    successive, each over the items not drawn yet, as torchgfn's
    ``torch.multinomial(softmax(log_rewards), n, replacement=n > len)``; asking for more
    draws than items of nonzero probability raises :class:`SamplingError`, as does any
    item of log-reward +inf (the softmax is undefined). The draw is made in this process
    from its replica of the log-rewards (:mod:`redisbuf.sampling.replica`) and committed by the
    server only if it follows every change made before the sample began.
    """

    name = "prioritized"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: ReplayBuffer) -> None:
        buffer._run("enable_tree", buffer.keys.all_keys(), [0])
        _forget_replica(buffer, "softmax")

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        try:
            drawn = _replica_draw(buffer, "softmax", n, rng, self.replacement)
        except ConfigMismatchError as exc:
            if getattr(exc, "code", None) != "RB_NOTREE":
                raise
            self.prepare(buffer)  # turned off (dropped and made again): turn it back on
            drawn = _replica_draw(buffer, "softmax", n, rng, self.replacement)
        return Draw(drawn.ids, drawn.blobs, drawn.probabilities, drawn.schema_json)


def _forget_replica(buffer: ReplayBuffer, rule: str) -> None:
    replicas = getattr(buffer, "_replicas", None)
    if replicas:
        replicas.pop(rule, None)


# Items given their initial PER priority per call when PER is turned on over a full buffer:
# each call stays in the tens of milliseconds (lua/enable_per.lua)
PER_FILL_SLICE = 20_000


def turn_per_on(buffer: ReplayBuffer, alpha: float, eps: float, initial: float) -> None:
    """Call lua/enable_per.lua until PER is on (it works in slices; any process may
    finish what another began)."""
    args = [repr(alpha), repr(eps), repr(initial), PER_FILL_SLICE]
    while int(buffer._run("enable_per", buffer.keys.all_keys(), args)) == 2:
        pass


def finish_turning_per_on(buffer: ReplayBuffer) -> None:
    """Finish turning PER on with the settings stored in the buffer's meta (for a
    process that met RB_BUSY without a PERSampler of its own)."""
    alpha, eps, initial = buffer.client.hmget(buffer.keys.meta, "per_alpha", "per_eps",
                                              "per_initial")
    turn_per_on(buffer, float(alpha), float(eps), float(initial))


def _nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class PERSampler:
    """Prioritized experience replay (Schaul et al.; ALF, DI-engine, Reverb): with
    replacement, item ``i`` is drawn with probability ``(p_i + eps)^alpha / sum_j
    (p_j + eps)^alpha``, from this process's replica of the priorities (a sum tree in
    numpy, :mod:`redisbuf.sampling.replica`); the server commits the draw, corrected to the law
    at the commit when the replica was behind (lua/sample_prioritized.lua).

    ``p_i`` is the item's PER priority (the ``per`` sorted set), set by
    :meth:`ReplayBuffer.update_priority` or ``add(..., priorities=...)``; a new item
    otherwise gets ``max(initial_priority, highest priority present)``. ``alpha``,
    ``eps`` and ``initial_priority`` are stored with the buffer: every process must use
    the same. ``beta`` (the exponent of the importance weights) is this object's own and
    may be changed between calls (annealing).
    """

    name = "per"

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        initial_priority: float = 1.0,
        eps: float = 1e-6,
    ) -> None:
        self.alpha = _nonnegative("alpha", alpha)
        self.beta = _nonnegative("beta", beta)
        self.initial_priority = _nonnegative("initial_priority", initial_priority)
        self.eps = _nonnegative("eps", eps)

    def prepare(self, buffer: ReplayBuffer) -> None:
        """Turn PER on for the buffer (or check its settings), giving the items present
        their initial priority a slice at a time (see lua/enable_per.lua)."""
        _forget_replica(buffer, "per")
        turn_per_on(buffer, self.alpha, self.eps, self.initial_priority)

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        try:
            drawn = _replica_draw(buffer, "per", n, rng, True)
        except ConfigMismatchError as exc:
            if getattr(exc, "code", None) != "RB_NOTREE":
                raise
            self.prepare(buffer)  # the buffer was dropped and made again: turn PER back on
            drawn = _replica_draw(buffer, "per", n, rng, True)
        draw = Draw(drawn.ids, drawn.blobs, drawn.probabilities, drawn.schema_json)
        # (N P(i))^-beta / max_j (N P(j))^-beta = (min_mass / mass_i)^beta: N and the total
        # cancel, and the largest weight belongs to the lowest non-zero mass present.
        draw.weights = (drawn.min_mass / drawn.masses) ** self.beta
        mean = drawn.per_sum / drawn.per_nonzero if drawn.per_nonzero > 0 else 0.0
        draw.importance_weights = (
            drawn.scores / mean if mean > 0 else np.ones(n, dtype=np.float64)
        )
        return draw


__all__ = ["Draw", "PERSampler", "PrioritizedSampler", "Sampler", "UniformSampler"]
