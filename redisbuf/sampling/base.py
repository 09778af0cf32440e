"""The interface between a buffer and its parts.

A buffer hands its parts (samplers, selectors, windows, rate limiters, lifetime rules,
replicas) one :class:`BufferView`: its name, client and keys, a way to run one of the
scripts of ``lua/`` on it, and the state its parts keep per buffer (the replicas of its
scores, the id range the last uniform draw saw). The parts see nothing else of a buffer,
so no module of ``redisbuf/sampling/`` imports ``redisbuf/buffers/``
(tests/test_architecture.py), as a TorchRL sampler sees only its storage.

:class:`Draw` (what a sampler returns) and the :class:`Sampler` protocol live here too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import redis

    from ..store.keys import BufferKeys
    from .replica import MassReplica

#: ``run(script, keys, args, read=False)``: see :meth:`BufferView.run`
Runner = Callable[..., Any]


class IdRange:
    """What the last uniform draw saw of a buffer: ``length`` items with ids ``first ..
    first + length - 1`` (``first`` None when there are holes), and how the last guesses
    based on it fared."""

    __slots__ = ("first", "length", "misses", "skip")

    def __init__(self) -> None:
        self.first: int | None = None
        self.length = 0
        self.misses = 0  # guesses in a row that missed (another process changed the range)
        self.skip = 0  # draws left to make without guessing (backing off after misses)


class BufferView:
    """What a buffer's parts see of it, one per buffer object (``ReplayBuffer.view``).

    Attributes:
        name: the buffer's name.
        client: the client of the server (on a cluster, of the master) holding its keys.
        keys: its key names (:class:`~redisbuf.store.keys.BufferKeys`; a sequence
            buffer's view of its step priorities has the subset a replica reads: ``meta``,
            ``snap``, ``snap_staging()``, ``all_keys()``).
        fetch_inline: whether a draw must read the blobs inside its drawing script (the
            buffer has ``max_use``, so that script may remove what it draws).
        replicas: this process's replicas of the buffer's scores, by mass rule
            (``"softmax"``, ``"per"``), made on first use by
            :func:`redisbuf.sampling.replica.replica_of`; shared by every thread using
            the buffer object, but a thread inside :func:`own_replicas`, which has its
            own.
        id_range: what the last uniform draw saw of the ids
            (:class:`~redisbuf.sampling.samplers.UniformSampler`), None before the first.
    """

    __slots__ = ("_replicas", "_runner", "client", "fetch_inline", "id_range", "keys", "name")

    def __init__(
        self,
        name: str,
        client: redis.Redis,
        keys: BufferKeys,
        run: Runner,
        fetch_inline: bool = False,
    ) -> None:
        self.name = name
        self.client = client
        self.keys = keys
        self._runner = run
        self.fetch_inline = fetch_inline
        self._replicas: dict[str, MassReplica] = {}
        self.id_range: IdRange | None = None

    @property
    def replicas(self) -> dict[str, MassReplica]:
        """The replicas this thread draws with (see the class): the buffer object's, or
        inside :func:`own_replicas` this thread's own."""
        own: dict[int, tuple[BufferView, dict[str, MassReplica]]] | None = getattr(
            _THREAD, "own", None)
        if own is None:
            return self._replicas
        held = own.get(id(self))
        if held is None:  # the view is kept with them: its id names no other view meanwhile
            held = own[id(self)] = (self, {})
        return held[1]

    @replicas.setter
    def replicas(self, replicas: dict[str, MassReplica]) -> None:
        """Make ``replicas`` the buffer object's (shared) replicas."""
        self._replicas = replicas

    def run(self, script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        """Run the script ``lua/<script>.lua`` on the buffer's server with ``keys`` and
        ``args`` and return its reply, as the buffer runs its own (errors translated to
        :mod:`redisbuf.errors`, the script loaded again when the server lost it).
        ``read=True`` says these arguments make the script write nothing, so it may run
        where writes are refused (a replica, a server at ``maxmemory``)."""
        if read:
            return self._runner(script, keys, args, read=True)
        return self._runner(script, keys, args)

    def __len__(self) -> int:
        """The number of items the buffer holds now (lua/len.lua: a ZCARD of its insertion
        order, after a large add being stored, whole or none of it)."""
        return int(self.run("len", [self.keys.meta, self.keys.order], [], read=True))

    def __repr__(self) -> str:
        return f"BufferView({self.name!r})"


_THREAD = threading.local()


@contextmanager
def own_replicas(enabled: bool = True) -> Iterator[None]:
    """Within it, this thread keeps replicas of its own of every buffer it draws from
    (``BufferView.replicas``), forgotten at its end; with ``enabled`` False it changes
    nothing. A replica's lock is held from a draw to its commit's reply, so threads
    sharing one take turns; with their own, their draws (and round trips) overlap, each
    replica following the buffer's log and costing its memory. Not reentrant."""
    if not enabled:
        yield
        return
    _THREAD.own = {}
    try:
        yield
    finally:
        _THREAD.own = None


@dataclass
class Draw:
    """What a sampler drew: ids, raw blobs, and each draw's probability when known."""

    ids: list[int]
    blobs: list[bytes]
    probabilities: np.ndarray | None = None
    schema_json: bytes | None = None  # the meta's schema, read in the same round trip
    weights: np.ndarray | None = None  # PER importance-sampling weights (DI-engine's IS)
    importance_weights: np.ndarray | None = None  # ALF's priority / mean non-zero priority
    priorities: np.ndarray | None = None  # PER: each drawn item's priority at the commit
    #: what the commit left, when it says: each draw's item's uses then (-1: the commit
    #: removed it, at max_use), the buffer's length, and its max_use (None: none)
    after: CommitAfter | None = None


#: see :attr:`Draw.after`
CommitAfter = tuple[list[int], int, "int | None"]


class Sampler(Protocol):
    """What a buffer needs of a sampler: a ``name`` (shown in the buffer's ``repr``),
    ``prepare(view)``, run once when the buffer object is made, and ``draw(view, n,
    rng)``. The built-in samplers keep what must outlive a call in the view
    (``replicas``, ``id_range``), not in themselves."""

    name: str

    def prepare(self, buffer: BufferView) -> None:
        """Create whatever server-side structure the sampler needs (idempotent)."""

    def draw(self, buffer: BufferView, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Raises EmptyBufferError when nothing can be drawn."""


__all__ = ["BufferView", "Draw", "IdRange", "Sampler", "own_replicas"]
