"""A sampling process's replica of a buffer's scores, for prioritized draws.

The server keeps the scores (log-rewards in the ``prio`` zset, PER priorities in the
``per`` zset) and, while prioritized sampling is on, a log of every change to them
(``lua/_masslog.lua``). A :class:`MassReplica` holds a copy of the scores with a sum tree
(and a min tree) over their masses in numpy, brought up to date from that log, so a draw
costs the server one check and the blob read however large the buffer is, and the
descent happens in the process that samples. ``lua/sample_prioritized.lua`` commits a
draw only when the replica was current (or, for a replica caught up after the sample
began, when every drawn item is still present): draws always follow every change made
before the sample began.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ConfigMismatchError, EmptyBufferError, SamplingError

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer

# A softmax replica keeps exp(log_reward - ref); it is re-based when a log-reward passes
# ref by this much (exp stays far from overflow) or the mass underflows.
_REBASE = 300.0
_UNDERFLOW = float(np.exp(-_REBASE))
_SCAN_COUNT = 5_000
_MIN_LEAVES = 1024


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _SumMinTree:
    """Binary sum tree and min tree over ``size`` (a power of two) leaf masses; the root is
    node 1 and leaf ``s`` is node ``size + s``. The min tree holds +inf for mass 0, so its
    root is the smallest non-zero mass."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.depth = size.bit_length() - 1
        self.sums = np.zeros(2 * size)
        self.mins = np.full(2 * size, np.inf)

    def rebuild(self, masses: np.ndarray) -> None:
        size = self.size
        self.sums[size:] = masses
        self.mins[size:] = np.where(masses > 0, masses, np.inf)
        width = size // 2
        while width >= 1:
            left = np.arange(2 * width, 4 * width, 2)
            self.sums[width : 2 * width] = self.sums[left] + self.sums[left + 1]
            self.mins[width : 2 * width] = np.minimum(self.mins[left], self.mins[left + 1])
            width //= 2

    def set(self, slots: np.ndarray, masses: np.ndarray) -> None:
        if len(slots) == 0:
            return
        nodes = slots + self.size
        self.sums[nodes] = masses
        self.mins[nodes] = np.where(masses > 0, masses, np.inf)
        # a parent listed twice is recomputed twice from the same children: no dedup needed
        for _ in range(self.depth):
            nodes >>= 1
            left = 2 * nodes
            self.sums[nodes] = self.sums[left] + self.sums[left + 1]
            self.mins[nodes] = np.minimum(self.mins[left], self.mins[left + 1])

    @property
    def total(self) -> float:
        return float(self.sums[1])

    @property
    def min_mass(self) -> float:
        return float(self.mins[1])

    def descend(self, targets: np.ndarray) -> np.ndarray:
        """The leaf each target (in [0, total)) falls in, all descents advancing together."""
        nodes = np.ones(len(targets), dtype=np.int64)
        targets = targets.copy()
        while nodes[0] < self.size:
            left = 2 * nodes
            left_mass = self.sums[left]
            right = targets >= left_mass
            targets -= np.where(right, left_mass, 0.0)
            nodes = left + right
        return nodes - self.size


class MassReplica:
    """Scores of one buffer's items under one mass rule, ``"softmax"`` (mass
    ``exp(log_reward)``) or ``"per"`` (mass ``(priority + eps) ** alpha``), as of log
    version ``version`` of epoch ``epoch``."""

    def __init__(self, rule: str) -> None:
        if rule not in ("softmax", "per"):
            raise ValueError(f"unknown mass rule {rule!r}")
        self.rule = rule
        #: held while drawing from or changing the replica: threads of one process (a
        #: prefetching reader and the learner) share the buffer's replica
        self.lock = threading.RLock()
        self.epoch = ""
        self.version = 0
        # True once caught up after the current sample began: its draw may be committed
        # by presence alone (see lua/sample_prioritized.lua)
        self.fresh = False
        #: spare draws the last PER commits needed (redisbuf/sampling/samplers.py _commit_corrected)
        self.spares = 0
        self.alpha = 1.0
        self.eps = 0.0
        self.ref = 0.0
        self._reset(_MIN_LEAVES)

    def _reset(self, size: int) -> None:
        self.slot_of: dict[int, int] = {}
        self.ids = np.full(size, -1, dtype=np.int64)
        self.scores = np.zeros(size)
        self.free: list[int] = []
        self.next_slot = 0
        self.tree = _SumMinTree(size)
        self.positive = 0  # items of nonzero mass
        self.infinite = 0  # items of log-reward +inf (softmax only)

    def __len__(self) -> int:
        return len(self.slot_of)

    # -- masses -------------------------------------------------------------------------

    def masses_of(self, scores: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
            if self.rule == "per":
                base = scores + self.eps
                out = np.where(base > 0, np.power(np.maximum(base, 0.0), self.alpha), 0.0)
            else:
                out = np.where(np.isfinite(scores), np.exp(scores - self.ref), 0.0)
        return out

    def _rebase(self) -> None:
        """Softmax: ref = the largest finite log-reward, every mass recomputed."""
        used = self.ids >= 0
        finite = used & np.isfinite(self.scores)
        self.ref = float(self.scores[finite].max()) if finite.any() else 0.0
        self.tree.rebuild(np.where(used, self.masses_of(self.scores), 0.0))

    # -- changes ------------------------------------------------------------------------

    def _grow(self, needed: int) -> None:
        size = self.tree.size
        while size < needed:
            size *= 2
        if size == self.tree.size:
            return
        ids, scores = self.ids, self.scores
        self.ids = np.full(size, -1, dtype=np.int64)
        self.ids[: len(ids)] = ids
        self.scores = np.zeros(size)
        self.scores[: len(scores)] = scores
        self.tree = _SumMinTree(size)
        used = self.ids >= 0
        self.tree.rebuild(np.where(used, self.masses_of(self.scores), 0.0))

    def _count(self, scores: np.ndarray, sign: int) -> None:
        if self.rule == "per":
            drawable = scores + self.eps > 0
        else:
            drawable = np.isfinite(scores)
        self.positive += sign * int(np.count_nonzero(drawable))
        if self.rule == "softmax":
            self.infinite += sign * int(np.count_nonzero(scores == np.inf))

    def set_scores(self, ids: Sequence[int], scores: np.ndarray) -> None:
        """Items ``ids`` (new or present) now have ``scores``; a later duplicate wins."""
        if len(ids) == 0:
            return
        slots = np.empty(len(ids), dtype=np.int64)
        for j, item in enumerate(ids):
            slot = self.slot_of.get(item)
            if slot is None:
                if self.free:
                    slot = self.free.pop()
                else:
                    slot = self.next_slot
                    self.next_slot += 1
                self.slot_of[item] = slot
            slots[j] = slot
        if self.next_slot > self.tree.size:
            self._grow(self.next_slot)
        known = self.ids[slots] >= 0  # before this call (a repeated new id counts as new)
        self._count(self.scores[np.unique(slots[known])], -1)
        self.ids[slots] = np.asarray(ids, dtype=np.int64)
        slots, last = np.unique(slots[::-1], return_index=True)  # the later duplicate wins
        scores = np.asarray(scores, dtype=np.float64)[::-1][last]
        self._count(scores, +1)
        self.scores[slots] = scores
        if self.rule == "softmax":
            finite = scores[np.isfinite(scores)]
            if len(finite) and float(finite.max()) > self.ref + _REBASE:
                self._rebase()
                return
        self.tree.set(slots, self.masses_of(scores))
        self._underflow_check()

    def remove(self, ids: Iterable[int]) -> None:
        slots = [self.slot_of.pop(item) for item in ids if item in self.slot_of]
        if not slots:
            return
        where = np.array(slots, dtype=np.int64)
        self._count(self.scores[where], -1)
        self.ids[where] = -1
        self.scores[where] = 0.0
        self.free.extend(slots)
        self.tree.set(where, np.zeros(len(where)))
        self._underflow_check()

    def _underflow_check(self) -> None:
        """Softmax: re-base when the largest mass may have fallen below exp(-300)."""
        if self.rule == "softmax" and self.positive > 0 and self.tree.total < _UNDERFLOW:
            self._rebase()

    def apply(self, entry: bytes) -> list[int] | None:
        """Apply one log entry and return the ids it names; None for an X entry
        (everything must be read again)."""
        kind, _, rest = entry.partition(b"|")
        _, _, rest = rest.partition(b"|")
        packed, _, scores = rest.partition(b"|")
        if kind == b"X":
            return None
        ids = np.frombuffer(packed, dtype="S12").astype(np.int64).tolist()
        if kind == b"S":
            self.set_scores(ids, np.array(scores.split(b","), dtype=np.float64))
        elif kind == b"R":
            self.remove(ids)
        return ids

    # -- reading the buffer -------------------------------------------------------------

    def catch_up(self, buffer: ReplayBuffer, reply: Sequence[Any]) -> set[int] | None:
        """Bring the replica up to date from a masslog_behind reply ``{0, epoch, version,
        first, entries...}`` (read everything when it cannot). Returns the ids the
        entries named (added, re-scored or removed), or None when it read everything."""
        epoch, version = _text(reply[1]), int(reply[2])
        entries = reply[4:]
        if epoch != self.epoch or len(entries) != version - self.version:
            self.load(buffer)
            return None
        touched: set[int] = set()
        for entry in entries:
            ids = self.apply(entry)
            if ids is None:
                self.load(buffer)
                return None
            touched.update(ids)
        self.version = version
        self.fresh = True
        return touched

    def sync(self, buffer: ReplayBuffer) -> set[int] | None:
        """Catch up with the buffer now (one round trip when current or close behind);
        what :meth:`catch_up` returns."""
        reply = buffer._run("masslog_read", buffer.keys.all_keys(), [self.epoch, self.version])
        if int(reply[0]) == 2:
            raise _NotOn(self.rule, self.rule == "per")
        return self.catch_up(buffer, reply)

    def load(self, buffer: ReplayBuffer) -> None:
        """Read every score and the mass rule, then the log entries written meanwhile.
        Never one long server command: the scores are read by ZSCAN, a few thousand a call."""
        keys = buffer.keys
        client = buffer.client
        for _ in range(20):
            pipe = client.pipeline(transaction=True)
            pipe.hmget(keys.meta, "tree", "tree_mass", "log_epoch", "log_version",
                       "per_alpha", "per_eps")
            (conf,) = pipe.execute()
            tree, mass, epoch, version, alpha, eps = conf
            per = mass in (b"per", "per")
            if tree not in (b"1", "1") or epoch is None or (self.rule == "per") != per:
                raise _NotOn(self.rule, per)
            self.epoch, self.version = _text(epoch), int(version)
            if per:
                self.alpha, self.eps = float(alpha), float(eps)
            source = keys.per if per else keys.prio
            members: list[int] = []
            values: list[float] = []
            for member, score in client.zscan_iter(source, count=_SCAN_COUNT):
                members.append(int(member))
                values.append(score)
            size = _MIN_LEAVES
            while size < len(members):
                size *= 2
            self._reset(size)
            self.ref = 0.0
            if members:
                scores = np.array(values, dtype=np.float64)
                if self.rule == "softmax":
                    finite = scores[np.isfinite(scores)]
                    self.ref = float(finite.max()) if len(finite) else 0.0
                count = len(members)
                self.slot_of = dict(zip(members, range(count), strict=True))
                self.ids[:count] = members
                self.scores[:count] = scores
                self.next_slot = count
                self._count(scores, +1)
                masses = np.zeros(size)
                masses[:count] = self.masses_of(scores)
                self.tree.rebuild(masses)
            reply = buffer._run("masslog_read", keys.all_keys(), [self.epoch, self.version])
            if int(reply[0]) == 2:
                raise _NotOn(self.rule, per)
            if _text(reply[1]) != self.epoch:
                continue
            entries = reply[4:]
            if len(entries) != int(reply[2]) - self.version:
                continue  # the log moved on past what it holds while we read: again
            if all(self.apply(entry) is not None for entry in entries):
                self.version = int(reply[2])
                self.fresh = True
                return
        raise RuntimeError(f"buffer {buffer.name!r}: its scores kept changing faster than "
                           "they could be read (prioritized sampling replica)")

    # -- drawing ------------------------------------------------------------------------

    def check_drawable(self, name: str, n: int, replace: bool) -> None:
        if self.rule == "softmax" and self.infinite > 0:
            raise SamplingError(
                f"buffer {name!r}: {self.infinite} item(s) have log-reward +inf: the softmax "
                "of log-rewards is undefined; sample uniformly or remove them"
            )
        if self.positive == 0 or self.tree.total <= 0:
            what = "PER mass" if self.rule == "per" else "finite log-reward"
            raise EmptyBufferError(f"buffer is empty (no item with a non-zero {what})")
        if not replace and n > self.positive:
            raise SamplingError(
                f"buffer {name!r}: only {self.positive} item(s) have nonzero probability, "
                f"fewer than the {n} draws asked without replacement; draw fewer or pass "
                "replacement=True"
            )

    def draw(
        self, n: int, rng: np.random.Generator, replace: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, probabilities, masses) of ``n`` draws: with replacement each from the
        whole distribution; without, successive draws among the items not drawn yet (the
        probability of each given the earlier ones)."""
        tree = self.tree
        if replace:
            slots = self._descend(rng, n)
            masses = tree.sums[slots + tree.size]
            return slots, masses / tree.total, masses
        # Successive draws: draws with replacement, each kept unless its item was drawn
        # already, are exactly successive draws among the items not drawn yet; after each
        # round the drawn items' masses are zeroed (and restored at the end), so repeats
        # stay rare however concentrated the mass.
        chosen: list[int] = []
        taken: set[int] = set()
        probabilities: list[float] = []
        masses_out: list[float] = []
        saved_slots: list[np.ndarray] = []
        saved_masses: list[np.ndarray] = []
        try:
            while len(chosen) < n:
                remaining = tree.total
                batch = max(2 * (n - len(chosen)), 16)
                slots = self._descend(rng, batch).tolist()
                round_slots = []
                for slot in slots:
                    if slot in taken:
                        continue
                    mass = float(tree.sums[slot + tree.size])
                    taken.add(slot)
                    chosen.append(slot)
                    round_slots.append(slot)
                    probabilities.append(mass / remaining)
                    masses_out.append(mass)
                    remaining -= mass
                    if len(chosen) == n:
                        break
                if len(chosen) < n and round_slots:
                    where = np.array(round_slots, dtype=np.int64)
                    saved_slots.append(where)
                    saved_masses.append(tree.sums[where + tree.size].copy())
                    tree.set(where, np.zeros(len(where)))
        finally:
            for where, masses in zip(reversed(saved_slots), reversed(saved_masses), strict=True):
                tree.set(where, masses)
        return (
            np.array(chosen, dtype=np.int64),
            np.array(probabilities),
            np.array(masses_out),
        )

    def correct(
        self, ids: np.ndarray, touched: set[int], rng: np.random.Generator
    ) -> np.ndarray:
        """Turn ``ids``, a draw with replacement from this replica as it was before the
        changes to ``touched`` (items added, re-scored or removed since), into a draw
        from the replica as it is now, changing only what must change. Each draw is
        independently: with probability (mass now of the touched items present) / (total
        now), an item drawn among the touched ones in proportion to their masses; else
        the old draw if its item was not touched (its mass is unchanged, and so is its
        share among the untouched items), or a new draw among the untouched items. Both
        laws are the current one restricted to the two parts, so the result is exactly
        a draw from the current distribution."""
        ids = np.array(ids, dtype=np.int64)
        changed = [self.slot_of[i] for i in touched if i in self.slot_of]
        changed_slots = np.array(changed, dtype=np.int64)
        changed_mass = self.tree.sums[changed_slots + self.tree.size]
        share = float(changed_mass.sum()) / self.tree.total
        take_changed = rng.random(len(ids)) < share
        if take_changed.any():
            cumulative = np.cumsum(changed_mass)
            picks = np.searchsorted(
                cumulative, rng.random(int(take_changed.sum())) * cumulative[-1], side="right"
            )
            picks = np.minimum(picks, len(changed_slots) - 1)
            ids[take_changed] = self.ids[changed_slots[picks]]
        touched_array = np.fromiter(touched, dtype=np.int64, count=len(touched))
        redraw = ~take_changed & np.isin(ids, touched_array)
        while redraw.any():
            slots = self._descend(rng, int(redraw.sum()))
            candidates = self.ids[slots]
            fine = ~np.isin(candidates, touched_array)
            where = np.flatnonzero(redraw)[fine]
            ids[where] = candidates[fine]
            redraw[where] = False
        return ids

    def _descend(self, rng: np.random.Generator, n: int) -> np.ndarray:
        tree = self.tree
        slots = tree.descend(rng.random(n) * tree.total)
        bad = tree.sums[slots + tree.size] <= 0  # a target on a boundary, by rounding
        while bad.any():
            slots[bad] = tree.descend(rng.random(int(bad.sum())) * tree.total)
            bad = tree.sums[slots + tree.size] <= 0
        return slots


class _NotOn(ConfigMismatchError):
    """Prioritized sampling by this rule is not on (the sampler turns it on)."""

    code = "RB_NOTREE"

    def __init__(self, rule: str, per: bool) -> None:
        super().__init__(
            "prioritized experience replay is not enabled" if rule == "per"
            else "prioritized sampling is not enabled"
        )
        self.per = per


_CREATING = threading.Lock()


def replica_of(buffer: ReplayBuffer, rule: str) -> MassReplica:
    """The buffer's replica for ``rule``, made (and read) on first use."""
    with _CREATING:  # one replica per buffer and rule, whichever thread asks first
        replicas: dict[str, MassReplica] | None = getattr(buffer, "_replicas", None)
        if replicas is None:
            replicas = buffer._replicas = {}
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


__all__ = ["MassReplica", "replica_of"]
