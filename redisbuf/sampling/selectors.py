"""Reverb's selectors as samplers: items in a fixed order instead of at random.

``sample(n)`` returns the first ``n`` items of the order (the order repeats when ``n``
exceeds the length), chosen and counted as drawn in one Lua call (lua/sample_select.lua).
Nothing is removed: combine with a lifetime rule to consume items.

``successive=True`` makes the ``n`` selections as Reverb's table makes ``n`` samples, one
after the other: each takes the first item of the order as the earlier ones left it.
Without ``max_use`` all ``n`` are that item; with it, an item is selected until its uses
reach ``max_use`` (which removes it), then the next, and a draw asking more selections
than the items' uses left returns the ones left. ``admits=True`` (with ``successive``)
also asks the buffer's rate limiter in the selecting script, one step for both: the draw
takes as many selections as it admits (none: an empty draw) and counts them, so that no
insert can take the room of items counted as sampled and not yet removed (a queue: the
limiter keeps it from overflowing, and its remover never evicts an item unread). A
buffer with such a sampler does not ask its limiter before the draw.
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
    successive = False
    #: whether the selection asks the buffer's rate limiter itself (see the module)
    admits = False

    def __init__(self, successive: bool = False, admits: bool = False) -> None:
        if admits and not successive:
            raise ValueError("admits=True is for successive selections (successive=True)")
        self.successive, self.admits = bool(successive), bool(admits)

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
            if self.successive:  # fewer than n when the uses left are fewer
                n = len(reply) // 2 if buffer.fetch_inline else len(reply)
            return reply[:n], None, n

        def select() -> Draw:
            if self.admits:  # counted by the limiter in the script: blobs read there too
                reply = buffer.run("sample_select", buffer.keys.all_keys(),
                                   [n, self._order, self.by, 1, b"successive+admit"])
                k = len(reply) // 2
                return Draw([int(m) for m in reply[:k]], list(reply[k:]))
            # the samplers' uniforms slot (ARGV[5]) says "successive" to the script
            return _draw_then_fetch(buffer, "sample_select", buffer.keys.all_keys(),
                                    [n, self._order, self.by], n,
                                    b"successive" if self.successive else b"", parse)

        for _ in range(_HEAP_ATTEMPTS):
            try:
                return select()
            except HeapNotBuiltError:
                # by PER priority, the first time (or after a load reset the heap)
                build_heap(buffer)
        return select()


class FifoSampler(_Selector):
    """The oldest items first (insertion order); ``successive``: Reverb's successive
    selections, ``admits``: asking the rate limiter itself (see the module).

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
    """The newest items first; ``successive``: Reverb's successive selections,
    ``admits``: asking the rate limiter itself (see the module).

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
    def __init__(self, by: str = "log_reward", successive: bool = False,
                 admits: bool = False) -> None:
        super().__init__(successive, admits)
        if by not in _SCORES:
            raise ValueError(f"by must be one of {_SCORES}, got {by!r}")
        self.by = by


class MaxHeapSampler(_Heap):
    """The highest-scored items first, the oldest first among equals. ``by="log_reward"``
    ranks by log-reward; ``by="priority"`` by PER priority (a buffer using
    :class:`~redisbuf.sampling.samplers.PERSampler` in some process).

    Args:
        by: ``"log_reward"`` or ``"priority"``.
        successive: Reverb's successive selections (see the module).
        admits: the selection asks the rate limiter itself (see the module).

    Raises:
        ValueError: another ``by``, or ``admits`` without ``successive``.

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
        successive: Reverb's successive selections (see the module).
        admits: the selection asks the rate limiter itself (see the module).

    Raises:
        ValueError: another ``by``, or ``admits`` without ``successive``.

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
