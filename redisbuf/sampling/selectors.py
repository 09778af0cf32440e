"""Reverb's selectors as samplers: items in a fixed order instead of at random.

``sample(n)`` returns the first ``n`` items of the order (the order repeats when ``n``
exceeds the length), chosen and counted as drawn in one Lua call (lua/sample_select.lua).
Nothing is removed: combine with a lifetime rule to consume items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import HeapNotBuiltError, RequestTooLargeError
from ..store import bounds
from ..store.keys import pack_ids
from .samplers import Draw, _draw_then_fetch

if TYPE_CHECKING:
    from .base import BufferView

_SCORES = ("log_reward", "priority")
# a heap built, then reset by another process's load (lua/restore.lua) before the draw
_HEAP_ATTEMPTS = 3


def build_heap(buffer: BufferView) -> int:
    """Build the buffer's priority heap (the ``perheap`` zset the selectors by PER
    priority read) from this process's replica of the priorities, in bounded slices
    (lua/heap_build.lua): no command holds the server long, and changes made meanwhile
    are kept. Returns the number of calls it took."""
    from .replica import replica_of

    keys, calls = buffer.keys.all_keys(), 0
    while True:
        calls += 1
        start = buffer.run("heap_build", keys, ["start"])
        if int(start[0]) == 1:
            return calls
        epoch = start[1].decode() if isinstance(start[1], bytes) else str(start[1])
        replica = replica_of(buffer, "per")
        with replica.lock:
            replica.sync(buffer)  # at or after the start: changes since are in the heap
            held = ~np.isnan(replica.scores[: replica.count])
            ids = replica.ids[: replica.count][held]
            scores = replica.scores[: replica.count][held]
            ready = replica.epoch == epoch
        done = ready
        for first, stop in bounds.chunks(len(ids)):
            if not done:
                break
            calls += 1
            done = bool(int(buffer.run("heap_build", keys, [
                "slice", epoch, pack_ids(ids[first:stop])[0],
                scores[first:stop].astype(">f8").tobytes()])))
        if done:
            calls += 1
            if int(buffer.run("heap_build", keys, ["finish", epoch])):
                return calls


class _Selector:
    name = ""
    _order = ""
    by = "log_reward"

    def prepare(self, buffer: BufferView) -> None:
        return None

    def draw(self, buffer: BufferView, n: int, rng: np.random.Generator) -> Draw:
        """The first ``n`` items of the order (repeating it when ``n`` exceeds the
        length), read by one command: ``n`` above
        :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` raises
        :class:`RequestTooLargeError`."""
        if n > bounds.MAX_ITEMS_PER_COMMAND:
            raise RequestTooLargeError(
                f"{self.name} selection takes at most {bounds.MAX_ITEMS_PER_COMMAND} items "
                f"per call (redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND), asked {n}"
            )

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], None, int]:
            return reply[:n], None, n

        def select() -> Draw:
            return _draw_then_fetch(buffer, "sample_select", buffer.keys.all_keys(),
                                    [n, self._order, self.by], n, b"", parse)

        for _ in range(_HEAP_ATTEMPTS):
            try:
                return select()
            except HeapNotBuiltError:
                # by PER priority, the first time (or after a load reset the heap)
                build_heap(buffer)
        return select()


class FifoSampler(_Selector):
    """The oldest items first (insertion order).

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import FifoSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=FifoSampler())
        >>> _ = buffer.add({"obs": np.arange(4.0), "log_rewards": np.zeros(4)})
        >>> buffer.sample(2)["obs"].tolist()
        [0.0, 1.0]
    """

    name, _order = "fifo", "fifo"


class LifoSampler(_Selector):
    """The newest items first.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import LifoSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=LifoSampler())
        >>> _ = buffer.add({"obs": np.arange(4.0), "log_rewards": np.zeros(4)})
        >>> buffer.sample(2)["obs"].tolist()
        [3.0, 2.0]
    """

    name, _order = "lifo", "lifo"


class _Heap(_Selector):
    def __init__(self, by: str = "log_reward") -> None:
        if by not in _SCORES:
            raise ValueError(f"by must be one of {_SCORES}, got {by!r}")
        self.by = by


class MaxHeapSampler(_Heap):
    """The highest-scored items first, the oldest first among equals. ``by="log_reward"``
    ranks by log-reward; ``by="priority"`` by PER priority (a buffer using
    :class:`~redisbuf.sampling.samplers.PERSampler` in some process).

    Args:
        by: ``"log_reward"`` or ``"priority"``.

    Raises:
        ValueError: another ``by``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import MaxHeapSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=MaxHeapSampler())
        >>> _ = buffer.add({"obs": np.arange(4.0), "log_rewards": np.array([0.0, 3.0, 1.0, 2.0])})
        >>> buffer.sample(2)["obs"].tolist()
        [1.0, 3.0]
    """

    name, _order = "max_heap", "max"


class MinHeapSampler(_Heap):
    """The lowest-scored items first, the oldest first among equals; ``by`` as for
    :class:`MaxHeapSampler`.

    Args:
        by: ``"log_reward"`` or ``"priority"``.

    Raises:
        ValueError: another ``by``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import MinHeapSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=MinHeapSampler())
        >>> _ = buffer.add({"obs": np.arange(4.0), "log_rewards": np.array([0.0, 3.0, 1.0, 2.0])})
        >>> buffer.sample(2)["obs"].tolist()
        [0.0, 2.0]
    """

    name, _order = "min_heap", "min"


__all__ = ["FifoSampler", "LifoSampler", "MaxHeapSampler", "MinHeapSampler"]
