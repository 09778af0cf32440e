"""The prioritized engine's commits: one place that commits, checks and corrects the draws
made from a process's replica of the scores (:mod:`redisbuf.sampling.replica`).

A draw is made in numpy from the replica, then sent to the server with the replica's log
version. The server commits it when the replica was current; a draw whose replica was
behind is corrected there to the law at the commit (lua/_correct.lua: each draw with
replacement on its own, draws without replacement as a race of exponential arrival
times); otherwise the reply carries the log entries the replica lacks, and the draw is
made again from the replica caught up. Every prioritized draw goes through
the loops here: a replay buffer's softmax and PER draws (:func:`replica_draw`, also each
shard's) and a sequence buffer's window starts, which describe their commit by a
:class:`CorrectedCommit` (the script, its arguments, what a reply that stands gives).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np
import redis

from ..errors import EmptyBufferError, RequestTooLargeError, SamplingError
from ..store import applying, bounds, scripts
from ..store.connection import retrying
from ..store.keys import pack_ids, split_ids
from .base import BufferView, CommitAfter
from .replica import MassReplica, replica_of
from .uniforms import packed_uniforms

# Attempts at committing a prioritized draw with replacement: each later one from a
# replica caught up by the previous reply. The server corrects such a draw to the current
# law itself, so more than one attempt is needed only when a draw's candidates (its own
# and the spares) were nearly all changed since the replica's version.
_COMMIT_ATTEMPTS = 64
# Draws without replacement stand only when the replica was current at the commit; under
# writers that change the buffer between every draw and its commit they are drawn again
# (one round trip each) for at most this long.
_EXACT_SECONDS = 30.0
# Spare draws sent with each draw with replacement of a replay buffer, for the server to
# use in its place when its item changed since the replica's version
# (lua/sample_prioritized.lua)
_SPARES = 2
# After this many commits in a row that found nothing changed (no writer between a draw
# and its commit, as while a learner only samples), a draw sends no spares: the server
# would unpack and the replica draw them for nothing. The first commit that finds changes
# then has its holes filled in one more round trip, and spares come back.
_QUIET_COMMITS = 8
# Arrivals past n sent with a draw without replacement (at least), for the server to use
# when candidates changed since the replica's version; a reply that named too few
# arrivals doubles them for the replica's next draws, a draw that stood lowers them
# slowly (_spares_without)
_SUCCESSIVE_SPARES = 4
_spares_without: weakref.WeakKeyDictionary[MassReplica, int] = weakref.WeakKeyDictionary()
# Uniforms sent with a draw without replacement for the fresh arrival times of the items
# changed since the replica's version (the server refuses to correct with too few: the
# replica catches up and the next draw sends twice the changes it saw, up to the max)
_POOL = 64
_POOL_MAX = 4096

T = TypeVar("T")


@dataclass
class ReplicaDraw:
    """A committed draw of a replay buffer (or one shard): the ids and blobs, each draw's
    probability, mass and score in the replica, the least non-zero mass, and the sum and
    count of the non-zero PER priorities in the replica at the commit (for the importance
    weights)."""

    ids: list[int]
    blobs: list[bytes]
    schema_json: bytes | None
    probabilities: np.ndarray
    masses: np.ndarray
    scores: np.ndarray
    min_mass: float
    per_sum: float
    per_nonzero: int
    after: CommitAfter | None = None  # see Draw.after


class CorrectedCommit(Generic[T]):
    """What differs between the prioritized draws with replacement that
    :func:`commit_corrected` commits: how many draws one commit carries, the script that
    commits them and its arguments, and what a reply that stands gives.

    Attributes:
        subject: how the errors name the buffer (``"buffer 'x'"``).
        least_spares: the fewest spare draws sent per draw (after a commit that needed
            more, the number comes back down to it slowly; one that found changes sends
            at least 2).
        limit: the most candidates (draws and spares) one commit carries, or None.
        strata: ``(first, count)``: the draws of a fresh commit are stratified, draw ``j``
            in slice ``first + j`` of ``count`` equal slices of the mass (DI-engine's
            PER); None: independent.
    """

    subject: str = "buffer"
    least_spares: int = _SPARES
    limit: int | None = None
    strata: tuple[int, int] | None = None

    def check(self, replica: MassReplica) -> None:
        """Raise EmptyBufferError or SamplingError when ``replica`` cannot draw (the
        engine syncs it once and asks again before the error stands)."""
        raise NotImplementedError

    def wanted(self) -> int:
        """How many draws the next commit of a fresh draw carries."""
        raise NotImplementedError

    def send(self, candidates: np.ndarray, spares: int, uniforms: bytes) -> list[Any]:
        """Send the commit of ``candidates`` (one row per draw: the draw, then ``spares``
        more draws of the replica) with two ``uniforms`` per draw; return the replies,
        the commit script's first (its layout that of lua/sample_prioritized.lua's
        "correct" mode: status 1 stands, 3 has holes, anything else is a catch-up)."""
        raise NotImplementedError

    def stood(self, replies: list[Any], draws: np.ndarray) -> T | None:
        """The result of a commit that stood (status 1), ``draws`` the draws sent (the
        first column of the candidates); None when it must be made again (the engine
        then draws afresh)."""
        raise NotImplementedError


def follow(buffer: BufferView, replica: MassReplica, head: Sequence[Any],
           entries: Sequence[Any]) -> bool:
    """Apply to ``replica`` the log ``entries`` a commit's reply carried, ``head`` the
    reply's epoch, version and stamp; a replica that cannot follow them is read again.
    Returns whether it followed them."""
    if replica._follow(buffer, [0, *head, *entries]) is None:
        replica.load(buffer)
        return False
    return True


def commit_corrected(
    buffer: BufferView,
    replica: MassReplica,
    rng: np.random.Generator,
    commit: CorrectedCommit[T],
) -> T:
    """Commit draws with replacement from ``replica`` (whose lock the caller holds) in
    "correct" mode: whatever changed since the replica's version, the server corrects the
    draw to the law at the commit (lua/_correct.lua) and returns the log entries the
    replica lacks, so a draw stands in one round trip however busy the writers are. A
    corrected draw with holes (a draw's candidates ran out) comes back for this process
    to fill each hole with a fresh draw (:func:`_fill_holes`) and send again; a reply
    that cannot correct is a catch-up, after which the draw is made afresh. The spare
    draws per draw follow how much changed (:func:`_spares_for`)."""
    synced = False
    spares = 0 if replica.quiet >= _QUIET_COMMITS else max(commit.least_spares,
                                                            replica.spares)
    limit = commit.limit
    carried: np.ndarray | None = None  # a draw of the replica as it is, to commit again
    for _ in range(_COMMIT_ATTEMPTS):
        if carried is None:
            try:
                commit.check(replica)
            except (EmptyBufferError, SamplingError):
                if synced:
                    raise
                replica.sync(buffer)  # it may be behind: decide on what the buffer holds now
                synced = True
                continue
            count = commit.wanted()
            if limit is not None:
                count = min(count, max(1, limit // (1 + spares)))
            if commit.strata is not None and count == commit.wanted():
                # stratified draws, independent spares (the commit corrects each draw to
                # the law at the commit; one not corrected keeps its slice)
                drawn = np.empty((count, 1 + spares), dtype=np.int64)
                slots, _, _ = replica.draw(count, rng, True, strata=commit.strata)
                drawn[:, 0] = replica.ids[slots]
                slots, _, _ = replica.draw(count * spares, rng, True)
                drawn[:, 1:] = replica.ids[slots].reshape(count, spares)
            else:
                slots, _, _ = replica.draw(count * (1 + spares), rng, True)
                drawn = replica.ids[slots].reshape(count, 1 + spares)
        else:
            count = len(carried)
            if limit is not None:
                spares = min(spares, max(0, limit // count - 1))
            drawn = np.empty((count, 1 + spares), dtype=np.int64)
            drawn[:, 0] = carried
            slots, _, _ = replica.draw(count * spares, rng, True)
            drawn[:, 1:] = replica.ids[slots].reshape(count, spares)
        replies = commit.send(drawn, spares, packed_uniforms(rng, 2 * count))
        reply = replies[0]
        status = int(reply[0])
        # (a commit that stood as sent names no corrected draw: nothing changed)
        replica.quiet = replica.quiet + 1 if status == 1 and not reply[4] else 0
        if status == 3:  # corrected, with holes to fill among the items not changed
            touched = replica._follow(buffer, [0, reply[1], reply[2], reply[3], *reply[5:]])
            if touched is None:  # (cannot happen: the reply carries every entry)
                replica.load(buffer)
                carried = None
                continue
            carried = _fill_holes(replica, reply[4], touched, rng)
            synced = True  # (carried None: nothing untouched holds mass; drawn afresh)
            spares = _spares_for(replica, set(np.concatenate(touched).tolist()), count)
            continue
        carried = None
        if status != 1:
            touched_ids = replica.catch_up(buffer, reply)
            synced = True
            if touched_ids:
                spares = _spares_for(replica, touched_ids, count)
            continue
        replica.spares = max(commit.least_spares, int(spares * 0.9))  # slowly back down
        result = commit.stood(replies, drawn[:, 0])
        if result is not None:
            return result
    raise SamplingError(
        f"{commit.subject}: a prioritized draw could not be committed in "
        f"{_COMMIT_ATTEMPTS} attempts"
    )


def _fill_holes(
    replica: MassReplica, packed: bytes, touched: list[np.ndarray], rng: np.random.Generator
) -> np.ndarray | None:
    """The draw a "correct" commit left with holes (packed ids, '' at each hole), each hole
    filled with a fresh draw of the replica, now at the commit's version: where the
    server's rounds (lua/_correct.lua) ran out of candidates, or ended on an item the log
    named but that was not stored, the draw has not ended yet, and what it would end on
    follows the law at that version. None when nothing has mass (the draw is then made
    afresh, and the replica says the buffer is empty). ``touched``: unused (the ids the
    entries named)."""
    parts = packed.split(b",")
    ids = np.array([int(p) if p else -1 for p in parts], dtype=np.int64)
    holes = np.flatnonzero(ids < 0)
    if not len(holes):
        return ids
    if not replica.total > 0:
        return None
    ids[holes] = replica.ids[replica._descend(rng, len(holes))]
    return ids


def _spares_for(replica: MassReplica, touched: set[int], n: int) -> int:
    """Spare draws per draw such that all 1 + spares of some draw's candidates fall on
    changed items with probability about 1%, if as much changes before the next commit
    as the share of the mass that ``touched`` holds now (at least 2, at most 64)."""
    slots = replica.slots_of(np.fromiter(touched, dtype=np.int64, count=len(touched)))
    share = float(replica.masses[slots[slots >= 0]].sum())
    total = replica.total
    share = min(max(share / total, 1e-9), 0.99) if total > 0 else 0.5
    needed = int(np.ceil(np.log(0.01 / n) / np.log(share))) - 1
    spares = min(64, max(_SPARES, needed))
    replica.spares = spares
    return spares


# -- a replay buffer's draws --------------------------------------------------------------


def replica_draw(
    buffer: BufferView, rule: str, n: int, rng: np.random.Generator, replacement: bool,
    stratified: bool = False,
) -> ReplicaDraw:
    """Draw ``n`` items from the buffer's replica for ``rule`` (``"softmax"`` or
    ``"per"``) and commit the draw with lua/sample_prioritized.lua, in the same round trip
    as the blob read; with ``stratified`` (and replacement) draw ``j`` of ``n`` falls in
    the ``j``-th of ``n`` equal slices of the mass."""
    replica = replica_of(buffer, rule)
    inline = bool(buffer.fetch_inline)  # max_use: the script reads
    script = scripts.load("sample_prioritized")
    with replica.lock:
        if not replacement:
            # with or without replacement is torchgfn's rule on the buffer's length as
            # this sample begins, not on this replica's (one round trip when current)
            replica.sync(buffer)
        if not (replacement or n > len(replica)):
            if n > bounds.MAX_ITEMS_PER_COMMAND:
                raise RequestTooLargeError(
                    f"buffer {buffer.name!r}: a prioritized draw of {n} without replacement "
                    f"is one command, of at most {bounds.MAX_ITEMS_PER_COMMAND} draws "
                    "(redisbuf/store/bounds.py); draw fewer, or with replacement")
            drawn = _commit_exact(buffer, rule, n, rng, replica, inline, script)
            if drawn is not None:
                return drawn
        # with replacement the draws are independent: a larger draw is several commits
        parts = [
            commit_corrected(buffer, replica, rng,
                             _DrawCommit(buffer, rule, stop - start, replica, inline, script,
                                         (start, n) if stratified else None))
            for start, stop in bounds.chunks(n)
        ]
        return parts[0] if len(parts) == 1 else ReplicaDraw(
            [i for p in parts for i in p.ids], [b for p in parts for b in p.blobs],
            parts[-1].schema_json, np.concatenate([p.probabilities for p in parts]),
            np.concatenate([p.masses for p in parts]),
            np.concatenate([p.scores for p in parts]), min(p.min_mass for p in parts),
            parts[-1].per_sum, parts[-1].per_nonzero)  # (no after: an id of two parts
        # has its uses after the later one, which the earlier part does not say)


def _draw_checked(
    buffer: BufferView, replica: MassReplica, n: int, replace: bool, synced: bool
) -> bool:
    """Whether the replica can draw ``n`` (False: it was synced now, ask again); raises
    when it cannot even after catching up with the buffer."""
    try:
        replica.check_drawable(buffer.name, n, replace)
        return True
    except (EmptyBufferError, SamplingError):
        if synced:
            raise
        replica.sync(buffer)  # it may be behind: decide on what the buffer holds now
        return False


def _commit_exact(
    buffer: BufferView,
    rule: str,
    n: int,
    rng: np.random.Generator,
    replica: MassReplica,
    inline: bool,
    script: scripts.Script,
) -> ReplicaDraw | None:
    """Successive draws (without replacement) of ``n``, committed as a race
    (lua/_correct.lua correct_successive): each item arrives at an exponential time of
    rate its mass and the draws are the first ``n`` arrivals, so the replica's first
    arrivals with their times (a few spares past ``n``) are corrected on the server to the
    law at the commit by the log entries since the replica's version: a changed item gets
    a fresh time, every other keeps its own. When fewer than ``n`` arrivals are known up to
    the last one sent, the reply names those known and this process, caught up, runs the
    race on (:func:`_race_on`) and commits again; a reply the log cannot correct is a
    catch-up, after which the draw is made afresh (whether it can does not depend on
    what was drawn). A softmax draw whose masses underflowed beside the items drawn
    (re-based within the draw) cannot be timed: it stands only when the replica was
    current ("exact"), as every draw without replacement did before. None when the buffer
    holds fewer than ``n`` items by then (the draw is then made with replacement)."""
    all_keys = buffer.keys.all_keys()
    deadline = time.monotonic() + _EXACT_SECONDS
    synced = False
    race: _Race | None = None  # arrivals to commit again, after a reply that named holes
    spares = max(_SUCCESSIVE_SPARES, _spares_without.get(replica, 0))
    pool = _POOL
    while True:
        if race is None:
            if n > len(replica):
                return None
            if not _draw_checked(buffer, replica, n, False, synced):
                synced = True
                continue
            more = min(spares, replica.positive - n, 2 * bounds.MAX_ITEMS_PER_COMMAND - n)
            race = _first_arrivals(replica, n, max(0, more), rng)
        if race.times is None:  # not timed: "exact"
            packed, width = pack_ids(race.ids[:n])
            args = [rule, replica.epoch, replica.version, replica.stamp, "exact", int(inline),
                    packed, width]
        else:
            packed, width = pack_ids(race.ids)
            args = [rule, replica.epoch, replica.version, replica.stamp, "successive",
                    int(inline), packed, width, n, packed_uniforms(rng, pool),
                    ",".join(map(repr, race.times.tolist())), repr(replica.ref)]
        members = split_ids(*pack_ids(race.ids[:n]))
        replies = _send_commit(buffer, script, args, None if inline else members)
        reply = replies[0]
        status = int(reply[0])
        if status != 1 and time.monotonic() > deadline:
            raise SamplingError(
                f"buffer {buffer.name!r}: a prioritized draw without replacement could "
                f"not be committed in {_EXACT_SECONDS:.0f} s: the buffer changed between "
                "every draw and its commit (draw with replacement, or slow the writers)")
        if status == 3:  # too few arrivals known: run the race on from the last one sent
            touched = replica._follow(buffer, [0, reply[1], reply[2], reply[3], *reply[5:]])
            synced = True
            if touched is None:  # (cannot happen: the reply carries every entry)
                replica.load(buffer)
                race = None
                continue
            arrivals = [part.split(b":") for part in reply[4].split(b",") if part]
            known = np.array([int(i) for i, _ in arrivals], dtype=np.int64)
            at = np.array([float(t) for _, t in arrivals])
            spares = min(2 * spares + 1, bounds.MAX_ITEMS_PER_COMMAND)
            _spares_without[replica] = spares
            last = float(race.times[-1]) if race.times is not None else math.inf
            race = _race_on(replica, known, at, last,
                            n + min(spares, bounds.MAX_ITEMS_PER_COMMAND), rng)
            if race is not None and len(race.ids) < n:
                race = None  # fewer items of non-zero mass than draws: decided afresh
            continue
        if status != 1:
            touched_ids = replica.catch_up(buffer, reply)
            synced = True
            if touched_ids:
                pool = min(max(pool, 2 * len(touched_ids)), _POOL_MAX)
            race = None
            continue
        count = int(reply[8])
        blobs = list(reply[9 : 9 + count]) if inline else list(replies[1])
        as_sent = not reply[4]
        if as_sent:
            ids = race.ids[:n]
        else:  # corrected: catch up with the entries it went by
            ids = np.array(reply[4].split(b","), dtype=np.int64)
            follow(buffer, replica, reply[5:8], reply[9 + count :])
            if not inline:  # the script read the blobs of the draws it moved (atomic)
                for position, blob in enumerate(reply[9 : 9 + count]):
                    if blob is not None:
                        blobs[position] = blob
        final = [b"%012d" % i for i in ids.tolist()]
        where = replica.slots_of(ids)
        if any(blob is None for blob in blobs) or (where < 0).any():
            buffer.run("undo_draws", all_keys, final)  # gone before the HMGET: no draw
            replica.sync(buffer)
            race = None
            continue
        if as_sent and race.probabilities is not None and race.masses is not None:
            probabilities, masses = race.probabilities, race.masses
        else:  # each draw's probability given the earlier ones, in the replica now
            masses = replica.masses[where]
            before = np.concatenate([[0.0], np.cumsum(masses)[:-1]])
            probabilities = masses / np.maximum(replica.total - before, masses)
        _spares_without[replica] = max(_SUCCESSIVE_SPARES, int(spares * 0.9))
        return ReplicaDraw(
            [int(i) for i in ids.tolist()], blobs, replies[-1], probabilities, masses,
            replica.scores[where], replica.min_mass, replica.score_sum, replica.nonzero,
        )


@dataclass
class _Race:
    """The first arrivals of a race over a replica's items (see :func:`_commit_exact`):
    their ids and times (ascending; None when they cannot be timed), and, for a fresh
    draw, the first ``n`` draws' probabilities and masses as the replica drew them."""

    ids: np.ndarray
    times: np.ndarray | None
    probabilities: np.ndarray | None = None
    masses: np.ndarray | None = None


def _first_arrivals(replica: MassReplica, n: int, spares: int,
                    rng: np.random.Generator) -> _Race:
    """The replica's first ``n + spares`` arrivals: its successive draws, each timed by
    an exponential gap of rate the mass left before it (the time to the next arrival of
    a race does not depend on which item arrives)."""
    slots, probabilities, masses = replica.draw(n + spares, rng, False)
    ids = replica.ids[slots]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        left = masses / probabilities  # the mass left before each draw (original scale)
        times = np.cumsum(rng.standard_exponential(len(slots)) / left)
    timed = bool((masses > 0).all() and np.isfinite(times).all())
    return _Race(ids, times if timed else None, probabilities[:n], masses[:n])


def _race_on(replica: MassReplica, known: np.ndarray, at: np.ndarray, last: float,
             m: int, rng: np.random.Generator) -> _Race | None:
    """The first ``m`` arrivals of the race over the replica (caught up) whose arrivals
    ``known`` at times ``at`` the server named, every other item arriving after ``last``
    (memoryless: ``last`` plus an exponential of rate its mass); fewer when fewer items
    have mass. O(items held), needed only after a reply that named holes."""
    count = replica.count
    ids = replica.ids[:count]
    masses = replica.masses[:count]
    free = (masses > 0) & ~np.isin(ids, known)
    if not free.any() and not len(known):
        return None
    times = np.concatenate([
        last + rng.standard_exponential(int(free.sum())) / masses[free], at])
    everyone = np.concatenate([ids[free], known])
    arrived = np.isfinite(times)
    times, everyone = times[arrived], everyone[arrived]
    first = np.argsort(times, kind="stable")[:m]
    return _Race(everyone[first], times[first])


def _send_commit(
    buffer: BufferView, script: scripts.Script, args: list[Any], members: list[bytes] | None
) -> list[Any]:
    """The commit script, then the HMGET of ``members`` (None: none) and the schema, in
    one plain pipeline (one round trip); the script's reply translated (the read-only
    variant on a server refusing writes).

    Not a MULTI: a server at ``maxmemory`` refuses every command queued in a transaction,
    reads too, and the reads must work there. The reads run after the commit on the same
    connection, so a blob read is that of the item the commit recorded (ids are never
    reused) unless another process removed the item in between: its blob then reads as
    None, and the callers take the draw back (lua/undo_draws.lua) and draw again, as for
    any item gone before its read. The blobs of the draws a correcting commit moved come
    from the script itself (atomic with the commit)."""
    keys = buffer.keys
    all_keys = keys.all_keys()

    def send() -> list[Any]:
        pipe = buffer.client.pipeline(transaction=False)
        scripts.queue(pipe, buffer.client, script, all_keys, args)
        if members is not None:
            pipe.hmget(keys.items, members)
        pipe.hget(keys.meta, "schema")
        return pipe.execute(raise_on_error=False)

    replies = retrying(send, name=buffer.client)
    if scripts.missing(replies[0]):
        scripts.reload(buffer.client, script)
        replies = retrying(send, name=buffer.client)
    while applying.refused(replies[0]):
        # refused before any read or write: once the large add is stored, the commit
        # corrects for it as for any change since the replica's version
        applying.finish(buffer.client, keys.meta)
        replies = retrying(send, name=buffer.client)
    reply = replies[0]
    if isinstance(reply, redis.exceptions.ResponseError):
        if isinstance(reply, scripts._REFUSED_WRITES):
            replies[0] = buffer.run("sample_prioritized", all_keys, args)  # read-only variant
        else:
            raise scripts.translate(reply)
    elif isinstance(reply, Exception):
        raise reply
    for read in replies[1:]:
        if isinstance(read, Exception):
            raise read
    return replies


class _DrawCommit(CorrectedCommit[ReplicaDraw]):
    """A replay buffer's draw with replacement of ``n`` items by ``rule``, committed by
    lua/sample_prioritized.lua in one pipeline with the HMGET of the blobs (the script
    reads them itself with ``inline``)."""

    def __init__(self, buffer: BufferView, rule: str, n: int, replica: MassReplica,
                 inline: bool, script: scripts.Script,
                 strata: tuple[int, int] | None = None) -> None:
        self.buffer, self.rule, self.n, self.replica = buffer, rule, n, replica
        self.inline, self.script, self.strata = inline, script, strata
        self.subject = f"buffer {buffer.name!r}"
        self.members: list[bytes] = []

    def check(self, replica: MassReplica) -> None:
        replica.check_drawable(self.buffer.name, self.n, True)

    def wanted(self) -> int:
        return self.n

    def send(self, candidates: np.ndarray, spares: int, uniforms: bytes) -> list[Any]:
        replica = self.replica
        packed, width = pack_ids(candidates.reshape(-1))
        self.members = split_ids(*pack_ids(candidates[:, 0]))
        args = [self.rule, replica.epoch, replica.version, replica.stamp, "correct",
                int(self.inline), packed, width, spares, uniforms, repr(replica.total),
                repr(replica.ref)]
        return _send_commit(self.buffer, self.script, args,
                            None if self.inline else self.members)

    def stood(self, replies: list[Any], draws: np.ndarray) -> ReplicaDraw | None:
        buffer, replica, inline = self.buffer, self.replica, self.inline
        reply = replies[0]
        count = int(reply[8])
        blobs = list(reply[9 : 9 + count]) if inline else list(replies[1])
        final = self.members
        if reply[4]:  # corrected: catch up with the entries it went by
            ids = np.array(reply[4].split(b","), dtype=np.int64)
            final = [b"%012d" % i for i in ids.tolist()]
            follow(buffer, replica, reply[5:8], reply[9 + count :])
            if not inline:  # the script read the blobs of the draws it moved (atomic)
                for position, blob in enumerate(reply[9 : 9 + count]):
                    if blob is not None:
                        blobs[position] = blob
        else:
            ids = draws
        where = replica.slots_of(ids)
        if any(blob is None for blob in blobs) or (where < 0).any():
            buffer.run("undo_draws", buffer.keys.all_keys(), final)  # gone: not a draw
            replica.sync(buffer)
            return None
        masses = replica.masses[where]
        return ReplicaDraw(
            [int(i) for i in final], blobs, replies[-1], masses / replica.total, masses,
            replica.scores[where], replica.min_mass, replica.score_sum, replica.nonzero,
            _after(reply[2], reply[3], len(final)),
        )


def _after(uses: Any, state: Any, n: int) -> CommitAfter | None:
    """What a commit of ``n`` draws left (see :attr:`Draw.after`), from its reply's
    third and fourth entries; None where it recorded nothing (the read-only variant)."""
    if not isinstance(state, bytes) or b":" not in state:
        return None
    length, _, max_use = state.partition(b":")
    counts = [int(u) for u in uses.split(b",")] if n else []
    if len(counts) != n:
        return None
    return counts, int(length), int(max_use) if max_use else None


__all__ = ["CorrectedCommit", "ReplicaDraw", "commit_corrected", "follow", "replica_draw"]
