"""PER priorities of :class:`~redisbuf.buffers.replay.ReplayBuffer`: ``update_priority``
(checked, sliced into bounded commands, sent with what this process's replica holds for
the ids, and applied to that replica at once when nothing else changed the buffer)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    InvalidBatchError,
    PerBusyError,
)
from ..sampling.samplers import (
    finish_turning_per_on,
)
from ..store import bounds
from ..store.keys import (
    ID_WIDTH,
    last_of_each,
    pack_ids,
)

if TYPE_CHECKING:
    from .needs import PrioritizingNeeds as _PrioritizingNeeds
else:
    _PrioritizingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

if TYPE_CHECKING:
    from ..sampling.replica import MassReplica


# A priority counts in the server's per_sum as at most this (PER_SUM_CAP in
# lua/_common.lua): 2^32 items sum to a finite number, sums of capped ones exactly
PER_SUM_CAP = 2.0**990

class Prioritizing(_PrioritizingNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``client``, ``keys``, ``_run`` and its replicas."""

    def update_priority(self, ids: Any, priorities: Any) -> int:
        """Set the PER priorities of items ``ids`` (:class:`PERSampler`), atomically for
        the whole call when it names at most
        :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` ids (a larger call is one
        atomic command per slice of that many, in order). Ids no longer stored (evicted)
        are skipped; for a repeated id the last priority wins (across slices too, as they
        apply in order). Returns how many distinct ids were updated. A priority that is
        NaN, negative or not finite raises :class:`InvalidBatchError` and changes nothing.
        The server's work is constant per id whatever the buffer's size (one HSET of the
        ``per`` hash and one log entry, after one HMGET of it unless this process's
        replica is current: the replica then says which ids are present and what they
        held); samplers re-weigh the items in their replicas when they next draw (this
        process's replica at once, when nothing else changed the buffer since it was
        current).

        Args:
            ids: the items' ids.
            priorities: one priority per id, finite and >= 0.

        Returns:
            How many distinct ids were updated.

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
        values = _per_priorities(priorities, len(id_array))
        if not len(id_array):
            return 0
        if len(id_array) > bounds.MAX_ITEMS_PER_COMMAND:  # one command per slice
            last = last_of_each(id_array)  # distinct ids: the slices' counts add up
            id_array, values = id_array[last], values[last]
            return sum(self.update_priority(id_array[start:stop], values[start:stop])
                       for start, stop in bounds.chunks(len(id_array)))
        replica = self.view.replicas.get("per")
        slots = None
        # the "@" form sends ids in their stored width only
        if replica is not None and 0 <= int(id_array.min()) and int(id_array.max()) < 10**ID_WIDTH:
            id_array, values, slots, args = _from_replica(replica, id_array, values)
        else:
            packed, width = pack_ids(id_array)
            args = [packed, width, ",".join(map(repr, values.tolist()))]
        try:
            reply = self._run("update_priority", self.keys.all_keys(), args)
        except PerBusyError:
            finish_turning_per_on(self.view)  # another process began turning PER on
            reply = self._run("update_priority", self.keys.all_keys(), args)
        if replica is not None:
            replica.apply_own(reply[1:], id_array, values, slots)
        return int(reply[0])


def _from_replica(
    replica: MassReplica, ids: np.ndarray, values: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[Any]]:
    """The "@" form of lua/update_priority.lua's arguments: the ids (the last of a
    repeated one), those the replica holds first, with what it holds for them, so that the
    server reads no item when the replica is current. Returns the ids and priorities in
    the order sent, their slots in the replica as it was read (-1: not held), and the
    arguments."""
    last = last_of_each(ids)
    ids, values = ids[last], values[last]
    with replica.lock:
        slots = replica.slots_of(ids)
        order = np.argsort(slots < 0, kind="stable")  # the held ones first
        ids, values, slots = ids[order], values[order], slots[order]
        before = replica.scores[slots[slots >= 0]]
        head = [replica.epoch, replica.version, replica.stamp]
    packed, _ = pack_ids(ids)
    return ids, values, slots, [
        "@", *head, packed, ",".join(map(repr, values.tolist())),
        before.astype(">f8").tobytes().hex(),
        repr(math.fsum(np.minimum(before, PER_SUM_CAP).tolist())),
        int(np.count_nonzero(before)),
    ]


def _per_priorities(priorities: Any, n: int) -> np.ndarray:
    """PER priorities as float64, after checking there are ``n`` finite numbers >= 0."""
    try:
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(f"priorities must be numbers: {exc}") from None
    if len(values) != n:
        raise InvalidBatchError(f"{len(values)} priorities for {n} items")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad):
        raise InvalidBatchError(
            f"priority {bad[0]} is {values[bad[0]]!r}; priorities must be finite and >= 0"
        )
    return values
