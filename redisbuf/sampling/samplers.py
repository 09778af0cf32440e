"""Samplers: each chooses items, commits each draw in one Lua call and returns ids and blobs.

A sampler is one part with one job; adding a sampling mode means adding one class here
(and its script in ``lua/``), not editing the buffer.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, TypeVar, cast

import numpy as np

from ..errors import (
    EmptyBufferError,
    NoSuchBufferError,
    PrioritizedSamplingOffError,
    SamplingError,
)
from ..store import bounds, scripts
from ..store.connection import retrying
from . import commits
from .base import BufferView, Draw, IdRange, Sampler
from .uniforms import _pack_words, _uniform_words, packed_uniforms

# Two round trips (ids from the script, blobs by a native HMGET) cost the server about a
# tenth of returning blobs from Lua; an item evicted in between makes us draw again, and
# after a few such races the script fetches the blobs itself, atomically.
_FETCH_ATTEMPTS = 3

T = TypeVar("T")


def _draw_then_fetch(
    buffer: BufferView,
    script: str,
    keys: list[str],
    head: list[Any],
    n: int,
    uniforms: bytes,
    parse: Callable[[list[Any], int], tuple[list[bytes], np.ndarray | None, int]],
) -> Draw:
    # fetch_inline: the script may remove what it draws (max_use), so only it can read them
    first = _FETCH_ATTEMPTS if buffer.fetch_inline else 0
    for attempt in range(first, _FETCH_ATTEMPTS + 1):
        inline = attempt == _FETCH_ATTEMPTS
        reply = buffer.run(script, keys, [*head, int(inline), uniforms])
        members, probabilities, offset = parse(reply, n)
        pipe = buffer.client.pipeline(transaction=False)
        if not inline:
            pipe.hmget(buffer.keys.items, members)
        pipe.hget(buffer.keys.meta, "schema")
        *fetched, schema_json = pipe.execute()
        blobs = reply[offset : offset + n] if inline else fetched[0]
        if not inline and any(blob is None for blob in blobs):
            buffer.run("undo_draws", keys, members)  # not a real draw
            continue
        return Draw([int(m) for m in members], blobs, probabilities, schema_json)
    raise AssertionError("unreachable")


# Ids go to the guess-mode script 12 digits each (lua/_common.lua's id_str); from 10^12
# on they are wider, and the script draws them itself.
_ID_LIMIT = 10**12


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

    Args:
        replacement: draw with replacement.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer, UniformSampler
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=UniformSampler())
        >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
        >>> sorted(buffer.sample(3)["obs"])  # without replacement: each item once
        [0.0, 1.0, 2.0]
    """

    name = "uniform"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: BufferView) -> None:
        return None

    def draw(
        self,
        buffer: BufferView,
        n: int,
        rng: np.random.Generator,
        replacement: bool | None = None,
    ) -> Draw:
        """Draw ``n`` items; ``replacement`` (None: this sampler's) is this call's."""
        replace = self.replacement if replacement is None else bool(replacement)
        if n > bounds.MAX_ITEMS_PER_COMMAND:
            return _draw_chunked(buffer, n, rng, replace)
        keys = buffer.keys
        # the view's: the next draw of any sampler of this buffer object starts from it
        seen = buffer.id_range
        if seen is None:
            seen = buffer.id_range = IdRange()
        words = _uniform_words(rng, n)
        uniforms = _pack_words(words)
        head = [n, int(replace)]

        def note(reply: list[Any]) -> None:
            seen.length = int(reply[0])
            seen.first = int(reply[1]) if int(reply[1]) >= 0 else None

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], None, int]:
            note(reply)
            return reply[2 : 2 + n], None, 2 + n

        # max_use: the script may remove what it draws, so it must read the blobs itself
        guessing = not buffer.fetch_inline
        if guessing and seen.skip > 0:
            seen.skip -= 1
            guessing = False
        for _ in range(_FETCH_ATTEMPTS if guessing else 0):
            if seen.first is None or seen.first + seen.length > _ID_LIMIT:
                break
            draw = self._guess(buffer, n, words, seen, note, replace)
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
        buffer: BufferView,
        n: int,
        words: np.ndarray,
        seen: IdRange,
        note: Callable[[list[Any]], None],
        replacement: bool,
    ) -> Draw | None:
        """One pipeline: the script in guess mode, HMGET of the guessed ids, the schema.
        None when the guess was not recorded (or an item went missing before the HMGET,
        and the draw was taken back); ``seen`` then holds what the script saw."""
        keys = buffer.keys
        first, length = seen.first, seen.length
        replace = replacement or n > length
        ids = (_uniform_ranks(words, length, replace) + first).tolist()
        members = [b"%012d" % i for i in ids]
        all_keys = keys.all_keys()
        args = [n, int(replacement), 0, b"", first, length, b"".join(members)]

        def send(script: scripts.Script) -> list[Any]:
            pipe = buffer.client.pipeline(transaction=False)
            scripts.queue(pipe, buffer.client, script, all_keys, args)
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
        if scripts.missing(reply):
            scripts.reload(buffer.client, script)
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
            buffer.run("undo_draws", all_keys, members)  # not a real draw
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
    buffer: BufferView, n: int, rng: np.random.Generator, replacement: bool
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
    inline = bool(buffer.fetch_inline)
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
            reply = buffer.run("sample_uniform", keys, args)
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
                    buffer.run("undo_draws", buffer.keys.all_keys(), gone)
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
                buffer.run("undo_draws", buffer.keys.all_keys(),
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
    if inline:  # bytes: redisbuf's clients never decode replies (redis-py types say str too)
        schema_json = cast("bytes | None", buffer.client.hget(buffer.keys.meta, "schema"))
    if scanned:
        order = rng.permutation(len(ids)).tolist()
        ids = [ids[i] for i in order]
        blobs = [blobs[i] for i in order]
    return Draw(ids, blobs, None, schema_json)


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

    Args:
        replacement: draw with replacement.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import PrioritizedSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PrioritizedSampler())
        >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.array([0.0, 1.0, -np.inf])})
        >>> sorted(buffer.sample(2)["obs"])  # log-reward -inf: never drawn
        [0.0, 1.0]
    """

    name = "prioritized"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: BufferView) -> None:
        buffer.run("enable_softmax", buffer.keys.all_keys(), [0])
        _forget_replica(buffer, "softmax")

    def draw(
        self,
        buffer: BufferView,
        n: int,
        rng: np.random.Generator,
        replacement: bool | None = None,
    ) -> Draw:
        """Draw ``n`` items; ``replacement`` (None: this sampler's) is this call's."""
        replace = self.replacement if replacement is None else bool(replacement)
        drawn = _draw_turning_on(
            buffer, self.prepare, lambda: commits.replica_draw(buffer, "softmax", n, rng, replace))
        return Draw(drawn.ids, drawn.blobs, drawn.probabilities, drawn.schema_json,
                    after=drawn.after)


def _forget_replica(buffer: BufferView, rule: str) -> None:
    buffer.replicas.pop(rule, None)


# Draws of a prioritized sampler tried in one call while its rule is found off: each
# time after the sampler turned it on in a buffer made again, which another process then
# dropped once more before the draw committed
_TURN_ON_ATTEMPTS = 8


def _draw_turning_on(
    buffer: BufferView, prepare: Callable[[BufferView], None], draw: Callable[[], T]
) -> T:
    """``draw()``, turning the sampler's rule back on (``prepare``) and drawing again
    while it is found off in a buffer dropped and made again by another process; raises
    :class:`NoSuchBufferError` when the buffer is gone (no meta) as the rule is found off,
    or is dropped again after each of ``_TURN_ON_ATTEMPTS`` turnings on."""
    for _ in range(_TURN_ON_ATTEMPTS):
        try:
            return draw()
        except PrioritizedSamplingOffError:
            # a missing meta reads as "not on" to the scripts: it is a buffer dropped
            if not buffer.client.exists(buffer.keys.meta):
                raise NoSuchBufferError(
                    f"buffer {buffer.name!r} was dropped (meta {buffer.keys.meta} does not "
                    "exist)") from None
            prepare(buffer)  # made again without it: turn it on (RB_NOBUF: dropped again)
    raise NoSuchBufferError(
        f"buffer {buffer.name!r} was dropped and made again by another process after each "
        f"of {_TURN_ON_ATTEMPTS} times this sampler turned prioritized sampling on in it")


# (lua/enable_per.lua's fourth argument, unused since turning PER on is O(1): earlier
# versions gave the items present their priority this many a call)
PER_FILL_SLICE = 20_000


def turn_per_on(buffer: BufferView, alpha: float, eps: float, initial: float) -> None:
    """Turn PER on with lua/enable_per.lua (one O(1) call; it is called again while it
    answers 2, as a script of an earlier version might)."""
    args = [repr(alpha), repr(eps), repr(initial), PER_FILL_SLICE]
    while int(buffer.run("enable_per", buffer.keys.all_keys(), args)) == 2:
        pass


def finish_turning_per_on(buffer: BufferView) -> None:
    """Finish turning PER on with the settings stored in the buffer's meta (for a
    process that met RB_BUSY without a PERSampler of its own)."""
    alpha, eps, initial = buffer.client.hmget(buffer.keys.meta, "per_alpha", "per_eps",
                                              "per_initial")
    if alpha is None or eps is None or initial is None:
        raise PrioritizedSamplingOffError(
            f"buffer {buffer.name!r}: PER's settings are not in its meta (turned off meanwhile)")
    turn_per_on(buffer, float(alpha), float(eps), float(initial))


def _nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class PERSampler:
    """Prioritized experience replay (Schaul et al.; ALF, DI-engine, Reverb): with
    replacement, item ``i`` is drawn with probability ``(p_i + eps)^alpha / sum_j
    (p_j + eps)^alpha``, from this process's replica of the priorities (dense numpy
    arrays with the sums of blocks of items, :mod:`redisbuf.sampling.replica`); the server
    commits the draw, corrected to the law at the commit when the replica was behind
    (lua/sample_prioritized.lua).

    ``p_i`` is the item's PER priority (kept as the buffer's snapshot and mass log, which
    every sampling process's replica applies), set by :meth:`ReplayBuffer.update_priority`
    or ``add(..., priorities=...)``; a new item otherwise gets ``max(initial_priority,
    the highest priority given since PER was turned on or the buffer cleared)``: a running
    max (meta ``per_max``), which neither the eviction of the item that held it nor a
    lower update lowers. ``alpha``,
    ``eps`` and ``initial_priority`` are stored with the buffer: every process must use
    the same. ``beta`` (the exponent of the importance weights) is this object's own and
    may be changed between calls (annealing).

    With ``stratified``, the ``n`` draws of one call are stratified (DI-engine's and the
    PER paper's rule): draw ``j`` falls in the ``j``-th of ``n`` equal slices of the total
    mass, so an item of a ``k``-th of the mass is drawn about ``n / k`` times in every
    batch; each item's expected count is ``n P(i)`` either way, and ``probabilities`` and
    ``weights`` are the same. A draw the commit corrects (the replica was behind) is
    drawn again from the whole mass.

    Args:
        alpha: the priority exponent (>= 0).
        beta: the importance-weight exponent (>= 0).
        initial_priority: the least priority a new item gets (>= 0).
        eps: added to every priority (>= 0).
        stratified: stratify the draws of each call (this process's choice).

    Raises:
        ValueError: an argument that is not a finite number >= 0.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import PERSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo",
        ...                       sampler=PERSampler(alpha=1.0, eps=0.0), seed=0)
        >>> batch = {"obs": np.arange(2.0), "log_rewards": np.zeros(2)}
        >>> _ = buffer.add(batch, priorities=[1.0, 3.0])
        >>> info = buffer.sample_with_info(20)  # PER draws with replacement
        >>> sorted(set(zip(info.ids.tolist(), info.probabilities.tolist())))
        [(1, 0.25), (2, 0.75)]
    """

    name = "per"

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        initial_priority: float = 1.0,
        eps: float = 1e-6,
        stratified: bool = False,
    ) -> None:
        self.alpha = _nonnegative("alpha", alpha)
        self.beta = _nonnegative("beta", beta)
        self.initial_priority = _nonnegative("initial_priority", initial_priority)
        self.eps = _nonnegative("eps", eps)
        self.stratified = bool(stratified)

    def prepare(self, buffer: BufferView) -> None:
        """Turn PER on for the buffer (or check its settings): the items present get
        their initial priority by the new epoch's base, in one O(1) call (see
        lua/enable_per.lua)."""
        _forget_replica(buffer, "per")
        turn_per_on(buffer, self.alpha, self.eps, self.initial_priority)

    def draw(self, buffer: BufferView, n: int, rng: np.random.Generator) -> Draw:
        drawn = _draw_turning_on(
            buffer, self.prepare,
            lambda: commits.replica_draw(buffer, "per", n, rng, True, self.stratified))
        draw = Draw(drawn.ids, drawn.blobs, drawn.probabilities, drawn.schema_json,
                    after=drawn.after)
        # (N P(i))^-beta / max_j (N P(j))^-beta = (min_mass / mass_i)^beta: N and the total
        # cancel, and the largest weight belongs to the lowest non-zero mass present.
        draw.weights = (drawn.min_mass / drawn.masses) ** self.beta
        mean = drawn.per_sum / drawn.per_nonzero if drawn.per_nonzero > 0 else 0.0
        draw.importance_weights = (
            drawn.scores / mean if mean > 0 else np.ones(n, dtype=np.float64)
        )
        draw.priorities = np.asarray(drawn.scores, dtype=np.float64)
        return draw


__all__ = [
    "BufferView", "Draw", "PERSampler", "PrioritizedSampler", "Sampler", "UniformSampler",
]
