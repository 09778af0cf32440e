"""Removers: which items leave a full buffer (the ``remover=`` of a buffer, Reverb's
remover selectors).

:class:`FifoRemover` (the default) evicts the oldest items of a batch's excess at once.
The others follow Reverb's table one new item at a time, in batch order: when the buffer
is full before item ``i`` enters, one item is removed first, chosen among the items
present then (the buffer's and the batch's items before ``i``, never ``i`` or a later
one), by lua/_removers.lua inside the add's own script, for every process. A remover is
fixed when the buffer is created (its meta ``eviction``). The removers by PER priority
(:class:`PrioritizedRemover`, :class:`MaxHeapRemover`, :class:`MinHeapRemover`) read the
priorities :class:`~redisbuf.sampling.samplers.PERSampler` keeps: the buffer must have
PER priorities on when it is opened, and keeps a heap of them on the server from then on
(its ``per_heap`` zset, built when the buffer is opened and kept through loads), as the
server keeps no other per-item copy of a PER priority.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..errors import ConfigMismatchError
from .selectors import build_heap

if TYPE_CHECKING:
    from .base import BufferView


def priority_exponent_of(priority_exponent: float) -> float:
    """``priority_exponent`` as a float, checked: a prioritized selector's or remover's
    ``e`` of ``priority^e``.

    Raises:
        ValueError: a negative or non-finite exponent.
    """
    value = float(priority_exponent)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"priority_exponent must be a finite number >= 0, got "
                         f"{priority_exponent!r}")
    return value


class Remover:
    """A removal rule: ``eviction`` is its text in the buffer's meta."""

    eviction = "fifo"
    #: whether the rule reads PER priorities
    needs_per = False
    #: whether its choices are random (each add then sends uniforms for them)
    random = False

    def prepare(self, buffer: BufferView) -> None:
        """Check the buffer can apply the rule and build what it reads (idempotent): a
        rule by PER priority reads the priority heap, kept in step with every change
        once built.

        Raises:
            ConfigMismatchError: a rule by PER priority on a buffer without them.
        """
        if not self.needs_per:
            return
        mass, heap = buffer.client.hmget(buffer.keys.meta, "mass", "per_heap")
        if mass != b"per":
            raise ConfigMismatchError(
                f"buffer {buffer.name!r}: {type(self).__name__} removes by PER priority, "
                "and the buffer has none: open it with sampler=PERSampler(...) first"
            )
        if heap != b"1":  # built once (a learner's grant); an actor then only reads meta
            build_heap(buffer)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Remover) and other.eviction == self.eviction

    def __hash__(self) -> int:
        return hash(self.eviction)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class FifoRemover(Remover):
    """The oldest items first (the default).

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.selectors import FifoRemover
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2,
        ...                       remover=FifoRemover())
        >>> _ = buffer.add({"obs": np.arange(3.0)})
        >>> sorted(buffer.sample(2)["obs"].tolist())
        [1.0, 2.0]
    """


class LifoRemover(Remover):
    """The newest item present first: in a full buffer each new item replaces the one
    that entered last (Reverb's ``Lifo`` remover, that of ``Table.stack``).

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.selectors import LifoRemover
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2,
        ...                       remover=LifoRemover())
        >>> _ = buffer.add({"obs": np.arange(4.0)})
        >>> sorted(buffer.sample(2)["obs"].tolist())
        [0.0, 3.0]
    """

    eviction = "lifo"


class UniformRemover(Remover):
    """An item present chosen uniformly at random (Reverb's ``Uniform`` remover)."""

    eviction = "uniform"
    random = True


class PrioritizedRemover(Remover):
    """An item present chosen with probability ``p^priority_exponent / sum p^e`` over the
    PER priorities ``p`` (``0^e = 0``; all zero: uniformly), as Reverb's ``Prioritized``
    remover. Drawn by rejection against the buffer's running maximum priority, then by
    an exact scan of the buffer after 4096 rejections (when that maximum is far above
    the priorities present).

    Args:
        priority_exponent: ``e`` (>= 0).

    Raises:
        ValueError: a negative or non-finite exponent.
    """

    needs_per = True
    random = True

    def __init__(self, priority_exponent: float) -> None:
        value = priority_exponent_of(priority_exponent)
        self.priority_exponent = value
        self.eviction = f"prioritized:{value!r}"

    def __repr__(self) -> str:
        return f"PrioritizedRemover({self.priority_exponent!r})"


class _HeapRemover(Remover):
    needs_per = True


class MaxHeapRemover(_HeapRemover):
    """The highest PER priority first, the oldest first among equals (Reverb's
    ``MaxHeap`` remover; Reverb breaks ties by the last insert or update instead)."""

    eviction = "max_heap"


class MinHeapRemover(_HeapRemover):
    """The lowest PER priority first, the oldest first among equals (Reverb's
    ``MinHeap`` remover; Reverb breaks ties by the last insert or update instead).

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import PERSampler, ReplayBuffer
        >>> from redisbuf.selectors import MinHeapRemover
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2, seed=0,
        ...                       sampler=PERSampler(), remover=MinHeapRemover())
        >>> _ = buffer.add({"obs": np.arange(3.0)}, priorities=[5.0, 1.0, 3.0])
        >>> sorted(set(buffer.sample(20)["obs"].tolist()))
        [0.0, 2.0]
    """

    eviction = "min_heap"


_BY_EVICTION: dict[str, type[Remover]] = {
    cls.eviction: cls for cls in (FifoRemover, LifoRemover, UniformRemover, MaxHeapRemover,
                                  MinHeapRemover)
}


def remover_of(eviction: str) -> Remover | None:
    """The remover whose meta ``eviction`` text is ``eviction``; None for "reward"
    (``prioritized_capacity``), which is not a remover of this module.

    Raises:
        ConfigMismatchError: an eviction this version does not know.
    """
    if eviction == "reward":
        return None
    if eviction.startswith("prioritized:"):
        return PrioritizedRemover(float(eviction.split(":", 1)[1]))
    cls = _BY_EVICTION.get(eviction)
    if cls is None:
        raise ConfigMismatchError(f"unknown eviction policy {eviction!r} (a newer redisbuf?)")
    return cls()


__all__ = [
    "FifoRemover", "LifoRemover", "MaxHeapRemover", "MinHeapRemover", "PrioritizedRemover",
    "Remover", "UniformRemover", "priority_exponent_of", "remover_of",
]
