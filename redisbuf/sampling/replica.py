"""A sampling process's replica of a buffer's scores, for prioritized draws.

The server keeps the log-rewards in the ``prio`` zset and, while prioritized sampling is
on, a log of every change to the scores (``lua/_masslog.lua``); PER priorities have no
per-item copy on the server: they are the newest snapshot (``rb:{name}:snap``, written by
following replicas) and the log after it, whose priority updates (U entries) the
replicas apply in order, skipping ids not stored at that point of the log. A
:class:`MassReplica` holds a copy of the scores in dense numpy arrays sorted by item id
(ids, scores, masses: 24 bytes an item) with the sum and the smallest non-zero mass of
every block of 32 items and of every group of 32 blocks (under PER also the sum of the
priorities, for ALF's importance weights), brought up to date from that log with
vectorised numpy, so a draw costs the server one check and the blob read however large
the buffer is. ``lua/sample_prioritized.lua`` commits a draw only when the replica
was current, or corrects a draw with replacement to the law at the commit: draws always
follow every change made before the commit.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from ..errors import PrioritizedSamplingOffError, SamplingError
from ..store.keys import last_of_each
from . import snapshots
from .first_read import read_scores
from .masslog import parse_entry
from .masslog import text as _text
from .replica_draws import FAN as _FAN
from .replica_draws import REBASE as _REBASE
from .replica_draws import UNDERFLOW as _UNDERFLOW
from .replica_draws import ReplicaDraws

if TYPE_CHECKING:
    from .base import BufferView

_LARGEST = 2.0**990  # a mass's cap: 2^32 such masses sum to a finite number
_BLOCK = _FAN * _FAN  # slots per group; arrays are a whole number of groups
_ONES = np.ones(_FAN)
# A first read without a snapshot (first_read.py): the log's entries after the version it
# began at are kept for the reader this long, renewed every _PIN_MS / 4 while it reads.
_PIN_MS = 10_000
_LOAD_ATTEMPTS = 20
# The meta fields that say whether the log is kept and how scores become masses
_SETTINGS = ("masslog", "mass", "per_alpha", "per_eps", "log_truth")
# A snapshot holds this many items a page (two fields: the ids as runs of consecutive ids,
# the scores as float64: 8 bytes an item, 32 KiB), and a replica writes a new one after
# applying max(_SNAP_ROWS, an eighth of its length) logged rows, unless another process
# published one since half as many: the log keeps at least max(10,000, capacity / 4)
# rows (lua/_masslog.lua), so the newest snapshot stays within its reach and a new
# replica reads it rather than every item. Under PER the log is trimmed only behind the
# snapshot (the priorities have no other copy), so one is written at any size.
_SNAP_CHUNK = 4_096
_SNAP_ROWS = 5_000
# Below this many items a scan is a few calls: no softmax snapshot is written (nor read)
_SNAP_MIN_ITEMS = 50_000
# U entries' counts kept (log version -> ids the entry updated), for update_priority
_HELD_KEPT = 256
# A PER priority counts in the sum of priorities (ALF's mean) as at most this, as a mass
_SUM_CAP = 2.0**990
# What a server that refuses every write answers one (redisbuf/store/scripts.py)
_REFUSED_WRITES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


class MassReplica(ReplicaDraws):
    """Scores of one buffer's items under one mass rule, ``"softmax"`` (mass
    ``exp(log_reward)``) or ``"per"`` (mass ``(priority + eps) ** alpha``), as of log
    version ``version`` (entry stamp ``stamp``) of epoch ``epoch``.

    Items live in slots in id order (``ids``, ``scores``, ``masses``); a removed item
    leaves a hole (score NaN, mass 0) until the arrays are compacted."""

    def __init__(self, rule: str) -> None:
        if rule not in ("softmax", "per"):
            raise ValueError(f"unknown mass rule {rule!r}")
        self.rule = rule
        #: held while drawing from or changing the replica: threads of one process (a
        #: prefetching reader and the learner) share the buffer's replica
        self.lock = threading.RLock()
        self.epoch = ""
        self.version = 0
        self.stamp = ""
        #: spare draws the last PER commits needed (redisbuf/sampling/samplers.py)
        self.spares = 0
        #: commits in a row that found nothing changed since the replica's version
        #: (redisbuf/sampling/commits.py: after _QUIET_COMMITS, they send no spares)
        self.quiet = 0
        self.alpha = 1.0
        self.eps = 0.0
        self.ref: float = 0.0
        self.rows_applied = 0  # log rows applied since the last snapshot read or written
        self.snap_mark = 0  # the log version at which this replica last wrote or skipped one
        #: log version of each U entry applied lately -> how many ids it updated
        self.held_counts: dict[int, int] = {}
        #: the buffer's scores are the snapshot and the log (PER of a ReplayBuffer: meta
        #: log_truth), read at the first read
        self.log_truth = False
        #: reads only (the scripts' read-only variants: no pin of the log, no snapshot
        #: written), for a user who may not sample (redisbuf/ops/acl.py)
        self.read_only = False
        self._last_held: int | None = None
        self._set_arrays(np.empty(0, np.int64), np.empty(0))

    # -- storage ------------------------------------------------------------------------

    def _set_arrays(self, ids: np.ndarray, scores: np.ndarray) -> None:
        """Hold exactly these items (ids ascending, scores finite or +-inf)."""
        count = len(ids)
        size = max(_BLOCK, -(-int(count * 1.25 + _BLOCK) // _BLOCK) * _BLOCK)
        self.ids = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
        self.scores = np.full(size, np.nan)
        self.masses = np.zeros(size)
        self.count = count  # slots in use (items and holes)
        self.live = count
        self.ids[:count] = ids
        self.scores[:count] = scores
        self._new_levels(size)
        self.positive = 0  # drawable items (finite log-reward; PER: mass > 0)
        self.infinite = 0  # items of log-reward +inf (softmax only)
        self.nonzero = 0  # PER: items of priority > 0
        self._count_scores(self.scores[:count], +1)
        if self.rule == "softmax":
            finite = scores[np.isfinite(scores)]
            self.ref = float(finite.max()) if len(finite) else 0.0
        self.masses[:count] = self.masses_of(scores)
        self._refresh_blocks(0, len(self.group_sums))

    def __len__(self) -> int:
        return self.live

    @property
    def nbytes(self) -> int:
        """Bytes held by the replica's arrays."""
        return sum(a.nbytes for a in (self.ids, self.scores, self.masses, self.block_sums,
                                      self.block_mins, self.group_sums, self.group_mins,
                                      self.score_block_sums, self.score_group_sums))

    def masses_of(self, scores: np.ndarray) -> np.ndarray:
        if self.rule == "per":  # (priority + eps) ** alpha; 0 where not above 0 or NaN
            base = scores + self.eps
            out = np.zeros(len(base))
            with np.errstate(over="ignore"):
                np.power(base, self.alpha, out=out, where=base > 0)
            return np.minimum(out, _LARGEST, out=out)  # above it (or inf): counts as it
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            out = np.where(np.isfinite(scores), np.exp(scores - self.ref), 0.0)
        return np.nan_to_num(out, nan=0.0)

    def _count_scores(self, scores: np.ndarray, sign: int) -> None:
        scores = scores[~np.isnan(scores)]
        if self.rule == "per":
            drawable = scores + self.eps > 0
            self.nonzero += sign * int(np.count_nonzero(scores > 0))
        else:
            drawable = np.isfinite(scores)
            self.infinite += sign * int(np.count_nonzero(scores == np.inf))
        self.positive += sign * int(np.count_nonzero(drawable))

    def _new_levels(self, size: int) -> None:
        self.block_sums = np.zeros(size // _FAN)
        self.block_mins = np.full(size // _FAN, np.inf)
        self.group_sums = np.zeros(size // _BLOCK)
        self.group_mins = np.full(size // _BLOCK, np.inf)
        # PER: the priorities' sums (capped; holes count 0), kept as the masses' are
        levels = size if self.rule == "per" else 0
        self.score_block_sums = np.zeros(levels // _FAN)
        self.score_group_sums = np.zeros(levels // _BLOCK)

    def _capped(self, scores: np.ndarray) -> np.ndarray:
        """Priorities as the sum of priorities counts them: NaN (holes) as 0, capped
        (fmax drops a NaN; PER priorities are >= 0)."""
        return np.minimum(np.fmax(scores, 0.0), _SUM_CAP)

    def _refresh_blocks(self, first: int, stop: int) -> None:
        """Recompute the sums and minimums of groups first .. stop - 1 (of _BLOCK slots)."""
        if stop <= first:
            return
        view = self.masses[first * _BLOCK : stop * _BLOCK].reshape(-1, _FAN)
        blocks = slice(first * _FAN, stop * _FAN)
        self.block_sums[blocks] = view.sum(axis=1)
        self.block_mins[blocks] = np.where(view > 0, view, np.inf).min(axis=1)
        self.group_sums[first:stop] = self.block_sums[blocks].reshape(-1, _FAN).sum(axis=1)
        self.group_mins[first:stop] = self.block_mins[blocks].reshape(-1, _FAN).min(axis=1)
        if self.rule == "per":
            scores = self._capped(self.scores[first * _BLOCK : stop * _BLOCK]).reshape(-1, _FAN)
            self.score_block_sums[blocks] = scores.sum(axis=1)
            self.score_group_sums[first:stop] = \
                self.score_block_sums[blocks].reshape(-1, _FAN).sum(axis=1)

    def _refresh_slots(self, slots: np.ndarray) -> None:
        """Recompute the block and group sums and minimums over these slots."""
        # (sums as products with ones and minimums along the first axis: numpy's
        # reductions of many short rows cost several times more)
        blocks = np.unique(slots >> 5)  # _FAN = 32
        view = self.masses.reshape(-1, _FAN)[blocks]
        self.block_sums[blocks] = view @ _ONES
        view = view.T
        self.block_mins[blocks] = np.where(view > 0, view, np.inf).min(axis=0)
        groups = blocks >> 5  # sorted: the first of each run
        if len(groups) > 1:
            groups = groups[np.concatenate(([True], groups[1:] != groups[:-1]))]
        self.group_sums[groups] = self.block_sums.reshape(-1, _FAN)[groups] @ _ONES
        self.group_mins[groups] = self.block_mins.reshape(-1, _FAN)[groups].T.min(axis=0)
        if self.rule == "per":
            scores = self._capped(self.scores.reshape(-1, _FAN)[blocks])
            self.score_block_sums[blocks] = scores @ _ONES
            self.score_group_sums[groups] = self.score_block_sums.reshape(-1, _FAN)[groups] @ _ONES

    @property
    def total(self) -> float:
        return float(self.group_sums.sum())

    @property
    def score_sum(self) -> float:
        """PER: the sum of the priorities held (each capped at 2^990), exact as the
        masses' total: recomputed from the scores of every changed block."""
        return float(self.score_group_sums.sum())

    @property
    def min_mass(self) -> float:
        return float(self.group_mins.min()) if len(self.group_mins) else float("inf")

    def _rebase(self) -> None:
        """Softmax: ref = the largest finite log-reward, every mass recomputed."""
        scores = self.scores[: self.count]
        finite = scores[np.isfinite(scores)]
        self.ref = float(finite.max()) if len(finite) else 0.0
        self.masses[: self.count] = self.masses_of(scores)
        self._refresh_blocks(0, len(self.group_sums))

    # -- changes ------------------------------------------------------------------------

    def slots_of(self, ids: np.ndarray) -> np.ndarray:
        """The slot of each id, -1 for an id not held. Ids usually count up without gaps
        from the first slot's (a FIFO buffer's holes keep their ids until compacted):
        each is first looked for there, one read, and searched for only when not found."""
        if self.count == 0 or len(ids) == 0:
            return np.full(len(ids), -1, dtype=np.int64)
        where = np.clip(ids - self.ids[0], 0, self.count - 1)
        missed = self.ids[where] != ids
        if missed.any():
            where[missed] = np.minimum(
                np.searchsorted(self.ids[: self.count], ids[missed]), self.count - 1)
        found = (self.ids[where] == ids) & ~np.isnan(self.scores[where])
        return np.where(found, where, -1)

    def _insert(self, ids: np.ndarray, scores: np.ndarray) -> None:
        """Add items not held (ids distinct). Usually they follow every id held and are
        appended; ids reserved by one writer and committed after another's go in place,
        moving only the slots after them."""
        order = np.argsort(ids, kind="stable")
        ids, scores = ids[order], scores[order]
        start = int(np.searchsorted(self.ids[: self.count], ids[0]))
        needed = self.count + len(ids)
        if needed > len(self.ids):
            self._compact(extra=len(ids))
            start = int(np.searchsorted(self.ids[: self.count], ids[0]))
        tail_ids = self.ids[start : self.count].copy()
        tail_scores = self.scores[start : self.count].copy()
        merged_ids = np.concatenate([tail_ids, ids])
        merged_scores = np.concatenate([tail_scores, scores])
        if len(tail_ids):
            order = np.argsort(merged_ids, kind="stable")
            merged_ids, merged_scores = merged_ids[order], merged_scores[order]
        stop = start + len(merged_ids)
        self.ids[start:stop] = merged_ids
        self.scores[start:stop] = merged_scores
        self.masses[start:stop] = self.masses_of(merged_scores)
        self.count = stop
        self.live += len(ids)
        self._count_scores(scores, +1)
        self._refresh_blocks(start // _BLOCK, -(-stop // _BLOCK))

    def _compact(self, extra: int = 0) -> None:
        """Drop the holes (and make room for ``extra`` more items)."""
        keep = ~np.isnan(self.scores[: self.count])
        ids, scores = self.ids[: self.count][keep], self.scores[: self.count][keep]
        ref = self.ref
        count = len(ids)
        size = max(_BLOCK, -(-int((count + extra) * 1.25 + _BLOCK) // _BLOCK) * _BLOCK)
        self.ids = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
        self.scores = np.full(size, np.nan)
        self.masses = np.zeros(size)
        self.ids[:count], self.scores[:count] = ids, scores
        self.ref = ref
        self.masses[:count] = self.masses_of(scores)
        self.count = count
        self._new_levels(size)
        self._refresh_blocks(0, len(self.group_sums))

    def apply_own(self, reply: Sequence[Any], ids: np.ndarray, scores: np.ndarray,
                  slots: np.ndarray | None = None) -> None:
        """Apply a change this process has just made, without a round trip, when its log
        entry is the only one since this replica's version; else leave it to the next
        catch-up. ``reply``: ``(log_epoch, log_version before, log_version after,
        log_stamp before, log_stamp after)`` as the changing script returned them;
        ``ids`` and their new ``scores`` (a repeated id: the last wins; ids not held are
        left out, as the script skipped them). ``slots``: their slots when read (ids
        distinct), used if every id still lies there, held (a catch-up since moves some)."""
        epoch, before, after, stamp_before, stamp_after = reply
        with self.lock:
            at = (_text(epoch), int(before), _text(stamp_before))
            if (self.epoch, self.version, self.stamp) != at or int(after) != int(before) + 1:
                return
            if slots is None or (slots < 0).any() or not np.array_equal(self.ids[slots], ids) \
                    or np.isnan(self.scores[slots]).any():
                last = last_of_each(ids)
                ids, scores, slots = ids[last], scores[last], self.slots_of(ids[last])
            held = slots >= 0
            self._rescore(slots[held], scores[held])
            self.version = int(after)
            self.stamp = _text(stamp_after)

    def set_scores(self, ids: np.ndarray, scores: np.ndarray) -> None:
        """Items ``ids`` (distinct; new or held) now have ``scores`` (NaN: removed)."""
        if len(ids) == 0:
            return
        slots = self.slots_of(ids)
        held = slots >= 0
        gone = np.isnan(scores)
        self._rescore(slots[held], scores[held])
        fresh = ~held & ~gone
        if fresh.any():
            self._insert(ids[fresh], scores[fresh])
        if self.rule == "softmax":
            finite = scores[np.isfinite(scores)]
            if len(finite) and float(finite.max()) > self.ref + _REBASE:
                self._rebase()
            elif self.positive > 0 and self.total < _UNDERFLOW:
                self._rebase()
        if self.count - self.live > max(self.live, _BLOCK):
            self._compact()

    def _rescore(self, slots: np.ndarray, scores: np.ndarray) -> None:
        """Items held at ``slots`` (distinct) now have ``scores`` (NaN: removed)."""
        if not len(slots):
            return
        self._count_scores(self.scores[slots], -1)
        self.scores[slots] = scores
        self.masses[slots] = self.masses_of(scores)
        self._count_scores(scores, +1)
        self.live -= int(np.count_nonzero(np.isnan(scores)))
        self._refresh_slots(slots)

    def apply(self, entry: bytes) -> np.ndarray | None:
        """Apply one log entry and return the ids it names; None for an X entry. A U
        entry's count of ids updated (those held) is left in ``_last_held``."""
        parsed = parse_entry(entry)
        if parsed is None:
            return None
        ids, scores, held_only = parsed
        self.rows_applied += len(ids)
        # an id named twice in one entry (added, then evicted at once; updated twice): its
        # last row wins
        last = last_of_each(ids)
        if held_only:
            self._last_held = self.rescore_held(ids[last], scores[last])
        else:
            self._last_held = None
            self.set_scores(ids[last], scores[last])
        return ids

    def rescore_held(self, ids: np.ndarray, scores: np.ndarray) -> int:
        """Re-score the items ``ids`` (distinct) that the replica holds with PER
        priorities ``scores`` (finite and >= 0: checked by the update's sender and its
        script), skipping the others (not stored at this point of the log); returns how
        many it held."""
        slots = self.slots_of(ids)
        held = slots >= 0
        if not held.all():
            slots, scores = slots[held], scores[held]
        if not len(slots):
            return 0
        if self.rule != "per":
            self._rescore(slots, scores)
            return len(slots)
        # _rescore for known priorities: nothing removed, counts by difference, masses
        # without the checks masses_of makes for any score
        gained = int(np.count_nonzero(scores)) - int(np.count_nonzero(self.scores[slots]))
        self.nonzero += gained
        if not self.eps > 0:  # drawable is non-zero then (with eps > 0: every item)
            self.positive += gained
        self.scores[slots] = scores
        if self.alpha > 0:
            masses = np.power(np.minimum(scores + self.eps, self._base_cap), self.alpha)
        else:  # 0^0 would be 1: a zero base has no mass
            masses = (scores + self.eps > 0).astype(np.float64)
        self.masses[slots] = np.minimum(masses, _LARGEST, out=masses)
        self._refresh_slots(slots)
        return len(slots)

    @property
    def _base_cap(self) -> float:
        """The base above which (base)^alpha passes the mass cap: bases are clipped to it
        first, so the power never overflows (the cap is applied after)."""
        if not self.alpha > 990 / 1023:  # then base^alpha <= base: no overflow
            return np.inf
        return 2.0 ** (990 / self.alpha + 1)

    def _note_held(self, version: int) -> None:
        """Keep the count of the U entry just applied as that of log version ``version``
        (the newest _HELD_KEPT of them)."""
        if self._last_held is None:
            return
        self.held_counts[version] = self._last_held
        self._last_held = None
        if len(self.held_counts) > _HELD_KEPT:
            for old in sorted(self.held_counts)[: len(self.held_counts) - _HELD_KEPT]:
                del self.held_counts[old]

    def apply_update(self, buffer: BufferView, reply: Sequence[Any], ids: np.ndarray,
                     scores: np.ndarray, sent: tuple[str, int, str]) -> int | None:
        """After this process's lua/update_priority.lua of ``ids`` (distinct) and their
        ``scores``, sent with this replica at ``sent`` (epoch, version, stamp): bring the
        replica up to the version after it and return how many ids the update found
        stored at its point of the log, as this replica applies it. ``reply``: the
        script's (epoch, version and stamp before and after, then the entries after
        ``sent`` when the log had moved on). The caller holds no lock: another thread may
        have moved the replica meanwhile. None when that cannot be told (the replica read
        everything again, or the count is no longer kept)."""
        epoch, before, after = _text(reply[0]), int(reply[1]), int(reply[2])
        if not epoch:  # the log was not kept (cannot happen under PER)
            return None
        stamp_before, stamp_after = _text(reply[3]), _text(reply[4])
        with self.lock:
            here = (self.epoch, self.version, self.stamp)
            if here == sent == (epoch, before, stamp_before) and after == before + 1:
                held = self.rescore_held(ids, scores)  # the only change since: no parse
                self.rows_applied += len(ids)
                self.version, self.stamp = after, stamp_after
                self._last_held = held
                self._note_held(after)
                return held
            if self.epoch == epoch and self.version >= after:
                return self.held_counts.get(after)  # another thread applied it
            if here == sent:  # the log had moved on: the entries since, this one's last
                if self._follow(buffer, [0, epoch, after, stamp_after, *reply[5:]]) is None:
                    self.load(buffer)
                    return None
            elif self.sync(buffer) is None:  # another thread moved it meanwhile
                return None
            return self.held_counts.get(after) if self.epoch == epoch else None

    # -- reading the buffer -------------------------------------------------------------

    def catch_up(self, buffer: BufferView, reply: Sequence[Any]) -> set[int] | None:
        """Bring the replica up to date from a masslog_behind reply ``{0, epoch, version,
        stamp, entries...}``, asking for more while the reply stops short, and reading
        everything when the log cannot bring it up to date. Returns the ids the entries
        named (added, re-scored or removed), or None when it read everything."""
        touched = self._follow(buffer, reply)
        if touched is None:
            self.load(buffer)
            return None
        return set(np.concatenate(touched).tolist()) if touched else set()

    def _follow(self, buffer: BufferView, reply: Sequence[Any],
                holder: str | None = None) -> list[np.ndarray] | None:
        """Apply a masslog_behind reply's entries, and the log's next ones while replies
        stop short of the version they report. The ids each entry named; None when the
        log cannot bring the replica up to date (another epoch or history, an X entry,
        entries no longer held). ``holder``: each further read also keeps the entries
        after the replica's version for ``_PIN_MS`` as that reader's pin (a first read
        catching up, however many entries were written while it read)."""
        touched: list[np.ndarray] = []
        while True:
            epoch, version, stamp = _text(reply[1]), int(reply[2]), _text(reply[3])
            if epoch == self.epoch and version == self.version and stamp == self.stamp:
                return touched
            entries = reply[4:]
            if epoch != self.epoch or not entries:
                return None
            for entry in entries:
                ids = self.apply(entry)
                if ids is None:
                    return None
                touched.append(ids)
                self.version += 1
                self.stamp = _text(entry.split(b"|", 3)[2])
                self._note_held(self.version)
            if self.version >= version:  # as of the reply (the caller's moment)
                if self.rows_applied > max(_SNAP_ROWS, self.live // 8):
                    self._renew_snapshot(buffer)
                return touched
            reply = self._read_log(buffer, *(("pin_at", _PIN_MS, holder) if holder else ()))
            if int(reply[0]) == 2:
                raise _NotOn(self.rule, self.rule == "per")

    def _read_log(self, buffer: BufferView, *extra: Any) -> list[Any]:
        return buffer.run("masslog_read", buffer.keys.all_keys(),
                          [self.epoch, self.version, self.stamp, *extra], read=self.read_only)

    def sync(self, buffer: BufferView) -> set[int] | None:
        """Catch up with the buffer now (one round trip when current or close behind);
        what :meth:`catch_up` returns."""
        reply = self._read_log(buffer)
        if int(reply[0]) == 2:
            raise _NotOn(self.rule, self.rule == "per")
        if _text(reply[1]) == self.epoch and int(reply[2]) == self.version \
                and _text(reply[3]) == self.stamp:
            return set()
        return self.catch_up(buffer, reply)

    def load(self, buffer: BufferView) -> None:
        """Read every score, then the log entries written meanwhile: the buffer's
        snapshot when there is a usable one, else the scores themselves in native
        calls of bounded cost (HMGET slices of ids, or SCAN steps: lua/replica_read.lua
        says which), while the server keeps the log's entries after the version read
        first, so the read finishes however fast writers change the buffer; only a clear
        (a new epoch) makes it start again."""
        keys = buffer.keys
        all_keys = keys.all_keys()
        holder = os.urandom(8).hex()  # this read's pins, apart from other readers'
        for _ in range(_LOAD_ATTEMPTS):
            conf = buffer.client.hmget(keys.meta, *_SETTINGS)
            logged, mass, alpha, eps, truth = conf
            self.log_truth = truth in (b"1", "1")
            per = mass in (b"per", "per")
            if logged not in (b"1", "1") or (self.rule == "per") != per:
                raise _NotOn(self.rule, per)
            if per:
                assert alpha is not None and eps is not None  # stored when PER was turned on
                self.alpha, self.eps = float(alpha), float(eps)
            if self._load_snapshot(buffer, holder):
                if self._settings_held(buffer, conf):
                    return
                continue
            start = buffer.run("masslog_read", all_keys, ["", 0, "", "pin", _PIN_MS, holder],
                               read=self.read_only)
            if int(start[0]) == 2:
                raise _NotOn(self.rule, per)
            epoch, version, stamp = _text(start[1]), int(start[2]), _text(start[3])
            if self.log_truth:  # no snapshot of this epoch: its base, as of its first entry
                version = 1
            ids, scores, base_stamp = read_scores(buffer, version, _PIN_MS, holder,
                                                  self.log_truth, self.read_only)
            if base_stamp is not None:
                if not base_stamp:  # the log no longer holds the epoch's first entry
                    self._unpin(buffer, holder)
                    continue
                stamp = base_stamp
            if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):
                ids, first = np.unique(ids, return_index=True)  # SCAN may return one twice
                scores = scores[first]
            self._set_arrays(ids, scores)
            self.epoch, self.version, self.stamp = epoch, version, stamp
            # the pin stays until the replica has caught up: a reply carries at most
            # MASSLOG_REPLY_ROWS rows, and the writers' next adds would trim the rest
            try:
                reply = self._read_log(buffer, "pin_at", _PIN_MS, holder)
                if int(reply[0]) == 2:
                    raise _NotOn(self.rule, per)
                followed = self._follow(buffer, reply, holder) is not None
            finally:
                self._unpin(buffer, holder)
            if followed and self._settings_held(buffer, conf):
                self.write_snapshot(buffer)  # the next replica reads that instead
                return
        raise SamplingError(
            f"buffer {buffer.name!r}: its scores could not be read in {_LOAD_ATTEMPTS} "
            "attempts: each time the log no longer reached back to the version the read "
            "began at, or the mass rule changed (the buffer was cleared or re-created, or "
            f"a read stalled past its {_PIN_MS} ms pin)")

    def _settings_held(self, buffer: BufferView, conf: list[Any]) -> bool:
        """Whether the log is still of this replica's epoch and the buffer's mass rule
        settings are still ``conf``, read before that epoch was fixed: a drop and
        re-create with another alpha or eps in between gives the new epoch's scores,
        whose masses need the new settings."""
        *now, epoch = buffer.client.hmget(buffer.keys.meta, *_SETTINGS, "log_epoch")
        return now == list(conf) and epoch is not None and _text(epoch) == self.epoch

    def _unpin(self, buffer: BufferView, holder: str) -> None:
        """Drop reader ``holder``'s pin of the log; other readers' stay
        (lua/_replica_reads.lua)."""
        buffer.run("masslog_read", buffer.keys.all_keys(), ["", 0, "", "unpin", holder],
                   read=self.read_only)

    # -- snapshots ----------------------------------------------------------------------

    def _renew_snapshot(self, buffer: BufferView) -> None:
        """Write a snapshot unless another process published one of this epoch in the
        later half of the log versions since this replica last wrote or skipped one."""
        published = buffer.client.hmget(buffer.keys.meta, "snap_epoch", "snap_version")
        if _text(published[0] or b"") == self.epoch and published[1] is not None \
                and 2 * int(published[1]) >= self.snap_mark + self.version:
            self.rows_applied, self.snap_mark = 0, self.version
            return
        self.write_snapshot(buffer)

    def write_snapshot(self, buffer: BufferView) -> bool:
        """Publish this replica's scores as the buffer's snapshot (a softmax replica only
        when it holds at least ``_SNAP_MIN_ITEMS``; under PER at any size: the log is
        trimmed only behind it), in pages of ``_SNAP_CHUNK`` items
        (:func:`~redisbuf.sampling.snapshots.publish`). Whether it was published: not when
        the server refuses writes (``maxmemory`` reached under ``noeviction``, a read-only
        replica), where the snapshot is skipped and the draw goes on."""
        self.rows_applied, self.snap_mark = 0, self.version
        if self.read_only or (not self.log_truth and self.live < _SNAP_MIN_ITEMS):
            return False
        held = ~np.isnan(self.scores[: self.count])
        masses = self.masses[: self.count][held] if self.log_truth else None
        try:
            return snapshots.publish(
                buffer, self.ids[: self.count][held], self.scores[: self.count][held], masses,
                {"epoch": self.epoch, "version": self.version, "stamp": self.stamp,
                 "rule": self.rule, "total": self.total if self.log_truth else None},
                _SNAP_CHUNK, self.log_truth)
        except _REFUSED_WRITES:
            return False  # a part written before the refusal expires with the staging key

    def _load_snapshot(self, buffer: BufferView, holder: str | None = None) -> bool:
        """Read the buffer's snapshot and the log entries after it; False when there is
        none of this rule, or the log no longer reaches back to it. ``holder``: the
        reader's token its pin of the log goes by (a new one when None)."""
        holder = holder or os.urandom(8).hex()
        keys = buffer.keys
        header_text = buffer.client.hget(keys.snap, "header")
        if header_text is None:
            return False
        header = json.loads(header_text)
        if header["rule"] != self.rule:
            return False
        epoch, version, stamp = header["epoch"], int(header["version"]), header["stamp"]
        reply = buffer.run("masslog_read", keys.all_keys(),
                           [epoch, version, stamp, "pin_at", _PIN_MS, holder],
                           read=self.read_only)
        if int(reply[0]) == 2:
            raise _NotOn(self.rule, self.rule == "per")
        try:  # whatever the outcome, the pin goes (one left below log_first stops trimming)
            return self._read_snapshot(buffer, header, reply, holder)
        finally:
            self._unpin(buffer, holder)

    def _read_snapshot(self, buffer: BufferView, header: dict, reply: Sequence[Any],
                       holder: str) -> bool:
        """:meth:`_load_snapshot`'s read of the chunks and catch-up, the log pinned at the
        snapshot's version (``reply``: the pinning masslog_read's)."""
        epoch, version, stamp = header["epoch"], int(header["version"]), header["stamp"]
        current = (_text(reply[1]), int(reply[2]), _text(reply[3])) == (epoch, version, stamp)
        if not current and len(reply) == 4:
            return False
        read = snapshots.read(buffer, header)
        if read is None:
            return False  # replaced by a newer snapshot meanwhile: read it again
        ids, scores = read
        self._set_arrays(ids.astype(np.int64), scores.astype(np.float64))
        self.epoch, self.version, self.stamp = epoch, version, stamp
        self.rows_applied = 0
        return current or self._follow(buffer, reply, holder) is not None


class _NotOn(PrioritizedSamplingOffError):
    """Prioritized sampling by this rule is not on (the sampler turns it on)."""

    def __init__(self, rule: str, per: bool) -> None:
        super().__init__(
            "prioritized experience replay is not enabled" if rule == "per"
            else "prioritized sampling is not enabled"
        )
        self.per = per


_CREATING = threading.Lock()


def replica_of(buffer: BufferView, rule: str) -> MassReplica:
    """The buffer's replica for ``rule``, made (and read) on first use."""
    with _CREATING:  # one replica per buffer and rule, whichever thread asks first
        replicas = buffer.replicas
        replica = replicas.get(rule)
        if replica is None:
            replica = replicas[rule] = MassReplica(rule)
    with replica.lock:
        if not replica.epoch:
            try:
                replica.load(buffer)
            except BaseException:
                replicas.pop(rule, None)
                raise
    return replica


def readable_replica(buffer: BufferView, rule: str, keep: bool = True) -> MassReplica:
    """A replica to read the buffer's scores with (stats, a save): the buffer's own for
    ``rule`` (:func:`replica_of`, made and kept when ``keep``), or one of this call's
    own that reads with the scripts' read-only variants (no pin of the log, no snapshot
    written: the read changes nothing), when ``keep`` is False and this process has none,
    or for a user who may not sample (its ACL role refuses the pins: redisbuf/ops/acl.py).
    Under PER the log is trimmed only behind the newest snapshot, so an unpinned read
    that meets a newer snapshot reads that one."""
    if keep or rule in buffer.replicas:
        try:
            return replica_of(buffer, rule)
        except redis.exceptions.NoPermissionError:
            pass
    replica = MassReplica(rule)
    replica.read_only = True
    replica.load(buffer)
    return replica


__all__ = ["MassReplica", "parse_entry", "readable_replica", "replica_of"]
