"""The drawing half of :class:`~redisbuf.sampling.replica.MassReplica`: draws in
proportion to the masses, down the replica's tree of sums (groups of ``FAN`` blocks of
``FAN`` slots), with replacement, stratified, or successively without replacement."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

from ..errors import EmptyBufferError, SamplingError

# A softmax replica keeps exp(log_reward - ref); it is re-based when a log-reward passes
# ref by this much (exp stays far from overflow) or the mass underflows.
REBASE = 300.0
UNDERFLOW = float(np.exp(-REBASE))
# Masses are summed (and their smallest non-zero value kept) per block of FAN slots, and
# those per group of FAN blocks: a draw reads FAN block sums and FAN masses.
FAN = 32


class _ReplicaDrawsNeeds(Protocol):
    """What :class:`ReplicaDraws` reads and changes of its :class:`MassReplica`."""

    rule: str
    infinite: int
    positive: int
    count: int
    ref: float
    scores: np.ndarray
    masses: np.ndarray
    block_sums: np.ndarray
    group_sums: np.ndarray

    @property
    def total(self) -> float: ...

    def masses_of(self, scores: np.ndarray) -> np.ndarray: ...

    def _refresh_slots(self, slots: np.ndarray) -> None: ...

    def _refresh_blocks(self, first: int, stop: int) -> None: ...


if not TYPE_CHECKING:  # for type checkers only, as redisbuf/buffers/needs.py
    _ReplicaDrawsNeeds = object  # noqa: F811


class ReplicaDraws(_ReplicaDrawsNeeds):
    """Draws of a :class:`~redisbuf.sampling.replica.MassReplica` (a mixin)."""

    ref: float  # declared here too: mypy cannot infer it across the import cycle

    def check_drawable(self, name: str, n: int, replace: bool) -> None:
        if self.rule == "softmax" and self.infinite > 0:
            raise SamplingError(
                f"buffer {name!r}: {self.infinite} item(s) have log-reward +inf: the softmax "
                "of log-rewards is undefined; sample uniformly or remove them"
            )
        if self.positive == 0 or self.total <= 0:
            what = "PER mass" if self.rule == "per" else "finite log-reward"
            raise EmptyBufferError(f"buffer is empty (no item with a non-zero {what})")
        if not replace and n > self.positive:
            raise SamplingError(
                f"buffer {name!r}: only {self.positive} item(s) have nonzero probability, "
                f"fewer than the {n} draws asked without replacement; draw fewer or pass "
                "replacement=True"
            )

    def _descend(self, rng: np.random.Generator, n: int,
                 strata: tuple[int, int] | None = None) -> np.ndarray:
        """``n`` slots, each drawn in proportion to its mass; with ``strata`` ``(first,
        count)``, slot ``j`` within slice ``first + j`` of ``count`` equal slices."""
        sums = self.group_sums
        cumulative = np.cumsum(sums)
        total = cumulative[-1]
        lanes = np.arange(FAN)
        slots = np.empty(n, dtype=np.int64)
        todo = np.arange(n)
        while len(todo):
            if strata is None:
                targets = rng.random(len(todo)) * total
            else:
                targets = (strata[0] + todo + rng.random(len(todo))) / strata[1] * total
            groups = np.minimum(np.searchsorted(cumulative, targets, side="right"),
                                len(sums) - 1)
            offsets = targets - (cumulative[groups] - sums[groups])
            chosen = groups
            for level in (self.block_sums, self.masses):  # within the group, then the block
                row = level[chosen[:, None] * FAN + lanes]
                row_cumulative = np.cumsum(row, axis=1)
                picks = np.minimum((row_cumulative <= offsets[:, None]).sum(axis=1), FAN - 1)
                offsets = offsets - (row_cumulative[np.arange(len(picks)), picks]
                                     - row[np.arange(len(picks)), picks])
                chosen = chosen * FAN + picks
            good = self.masses[chosen] > 0  # a target on a boundary, by rounding: again
            slots[todo[good]] = chosen[good]
            todo = todo[~good]
        return slots

    def draw(
        self, n: int, rng: np.random.Generator, replace: bool,
        strata: tuple[int, int] | None = None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(slots, probabilities, masses) of ``n`` draws: with replacement each from the
        whole distribution (``strata``: stratified, see :meth:`_descend`); without,
        successive draws among the items not drawn yet (the probability of each given
        the earlier ones)."""
        if replace:
            slots = self._descend(rng, n, strata)
            masses = self.masses[slots]
            return slots, masses / self.total, masses
        # Successive draws: draws with replacement, each kept unless its item was drawn
        # already, are exactly successive draws among the items not drawn yet; after each
        # round the drawn items' masses are zeroed (and restored at the end), so repeats
        # stay rare however concentrated the mass.
        chosen: list[int] = []
        taken: set[int] = set()
        probabilities: list[float] = []
        masses_out: list[float] = []
        zeroed: list[tuple[np.ndarray, np.ndarray]] = []
        ref: float = self.ref
        try:
            while len(chosen) < n:
                remaining = self.total
                if remaining < UNDERFLOW and self.rule == "softmax":
                    # the rest (nearly) underflowed beside what was drawn: re-base on them
                    self._rebase_without(np.array(sorted(taken), dtype=np.int64))
                    remaining = self.total
                batch = max(2 * (n - len(chosen)), 16)
                round_slots = []
                for slot in self._descend(rng, batch).tolist():
                    if slot in taken:
                        continue
                    mass = float(self.masses[slot])
                    taken.add(slot)
                    chosen.append(slot)
                    round_slots.append(slot)
                    probabilities.append(mass / remaining)
                    masses_out.append(mass * np.exp(self.ref - ref))
                    remaining -= mass
                    if len(chosen) == n:
                        break
                if len(chosen) < n and round_slots:
                    where = np.array(round_slots, dtype=np.int64)
                    zeroed.append((where, self.masses[where].copy()))
                    self.masses[where] = 0.0
                    self._refresh_slots(where)
        finally:
            if self.ref != ref:  # re-based on what was left: every mass as it was
                self.ref = ref
                self.masses[: self.count] = self.masses_of(self.scores[: self.count])
                self._refresh_blocks(0, len(self.group_sums))
            else:
                for where, masses in reversed(zeroed):
                    self.masses[where] = masses
                    self._refresh_slots(where)
        return (
            np.array(chosen, dtype=np.int64),
            np.array(probabilities),
            np.array(masses_out),
        )

    def _rebase_without(self, taken: np.ndarray) -> None:
        """Softmax, drawing without replacement: every mass left underflowed; re-base on
        the largest log-reward among the items not drawn yet (masses of drawn ones 0)."""
        scores = self.scores[: self.count].copy()
        scores[taken] = np.nan
        finite = scores[np.isfinite(scores)]
        self.ref = float(finite.max()) if len(finite) else self.ref
        self.masses[: self.count] = self.masses_of(scores)
        self._refresh_blocks(0, len(self.group_sums))
