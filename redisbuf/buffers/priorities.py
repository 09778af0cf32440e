"""PER priorities of :class:`~redisbuf.buffers.replay.ReplayBuffer`: ``update_priority``,
one bounded append to the mass log per call (lua/update_priority.lua), checked and sliced
into bounded commands here, and applied to this process's replica, which counts the ids
it updated."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidBatchError, PrioritizedSamplingOffError
from ..sampling.replica import replica_of
from ..store import bounds
from ..store.keys import last_of_each, storable

if TYPE_CHECKING:
    from .needs import PrioritizingNeeds as _PrioritizingNeeds
else:
    _PrioritizingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

# A priority counts in a replica's sum of priorities as at most this (as its masses do):
# 2^32 items sum to a finite number, sums of capped ones exactly
PER_SUM_CAP = 2.0**990


class Prioritizing(_PrioritizingNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``view`` (its client, keys and replicas) and ``_run``."""

    def update_priority(self, ids: Any, priorities: Any, *, count: bool = True) -> int | None:
        """Set the PER priorities of items ``ids`` (:class:`PERSampler`), atomically for
        the whole call when it names at most
        :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` ids (a larger call is one
        atomic command per slice of that many, in order). The call is one append to the
        buffer's mass log: the server looks none of the ids up, whatever the buffer's
        size; every sampling process applies it to its replica in the log's order,
        skipping ids no longer stored at that point (evicted), so draws that begin after
        this call returned follow it. For a repeated id the last priority wins (across
        slices too, as they apply in order). A priority that is NaN, negative or not
        finite raises :class:`InvalidBatchError` and changes nothing.

        Returns how many distinct ids were updated (stored at the update's point of the
        log), as this process's replica of the priorities applies it; the replica is
        made (read) on first use unless ``count=False``, which returns None when this
        process has none (Reverb's ``mutate_priorities`` returns nothing) and skips its
        upkeep. None too in the rare case the replica had to read everything again meanwhile.

        Args:
            ids: the items' ids.
            priorities: one priority per id, finite and >= 0.
            count: whether to count the ids updated (with this process's replica).

        Returns:
            How many distinct ids were updated, or None (not counted).

        Raises:
            InvalidBatchError: a priority is NaN, negative or not finite, or the lengths
                differ.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import PERSampler, ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PERSampler())
            >>> ids = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)}).ids
            >>> buffer.update_priority(ids, [0.5, 2.0, 2.0])
            3
        """
        id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
        values = _per_priorities(priorities, len(id_array)) + 0.0  # -0.0 is 0
        if not len(id_array):
            return 0
        replica = self.view.replicas.get("per")
        if replica is None and count:
            try:
                replica = replica_of(self.view, "per")
            except PrioritizedSamplingOffError:
                replica = None  # no PER: the script says so (RB_CONFIG)
        if replica is not None:  # counted by the replica, which takes distinct ids
            # an id that cannot be stored (ids are 1 .. 10^12 - 1) is skipped, as an
            # evicted one
            last = last_of_each(id_array)
            last = last[storable(id_array)[last]]
            id_array, values = id_array[last], values[last]
        # else sent as given: the log's readers skip ids no item has and let the last of a
        # repeated id win (lua/_masslog.lua)
        counts = [self._update_slice(id_array[start:stop], values[start:stop], replica)
                  for start, stop in bounds.chunks(len(id_array))]
        if replica is None:
            return None
        known = [c for c in counts if c is not None]
        return sum(known) if len(known) == len(counts) else None

    def _update_slice(self, ids: np.ndarray, values: np.ndarray, replica: Any) -> int | None:
        """One atomic append of ``ids`` (distinct and storable with a replica) and their
        ``values``, both binary (a V entry); the count of ids updated, by ``replica``
        (None without one)."""
        if not len(ids):
            return 0 if replica is not None else None
        # the largest's position lets the server check one byte of each priority
        # (lua/update_priority.lua ARGV[6])
        args: list[Any] = [ids.astype(">i8").tobytes(), values.astype(">f8").tobytes()]
        largest = int(values.argmax()) + 1
        if replica is None:
            self._run("update_priority", self.keys.all_keys(), [*args, "", "", "", largest])
            return None
        with replica.lock:
            sent = (replica.epoch, replica.version, replica.stamp)
        reply = self._run("update_priority", self.keys.all_keys(), [*args, *sent, largest])
        return replica.apply_update(self.view, reply, ids, values, sent)


def _per_priorities(priorities: Any, n: int) -> np.ndarray:
    """PER priorities as float64, after checking there are ``n`` finite numbers >= 0."""
    try:
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(f"priorities must be numbers: {exc}") from None
    if len(values) != n:
        raise InvalidBatchError(f"{len(values)} priorities for {n} items")
    if not n or (values.min() >= 0 and values.max() < np.inf):  # false for NaN
        return values
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad):
        raise InvalidBatchError(
            f"priority {bad[0]} is {values[bad[0]]!r}; priorities must be finite and >= 0"
        )
    return values
