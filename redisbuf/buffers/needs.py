"""What each buffer mixin needs of the class it is mixed into, as Protocols (redis-py's
``CommandsProtocol`` style): a mixin names its protocol as its base for type checkers
only (``if TYPE_CHECKING: _Base = OpeningNeeds``), so that mypy checks every ``self.x``
of the mixin against the protocol and the concrete class against every protocol of its
mixins, while at run time the mixin stays a plain class (a protocol's stub methods never
shadow the real ones in the method resolution order).

For mypy they would: a mixin's protocol declares a method only when every class that
provides it comes before that mixin among the concrete class's bases; what a later base
provides (``__len__``, from ``Inspecting``) goes into the core protocol
(:class:`ReplayCore`), which every mixin's protocol extends and so comes last.

A mixin that starts to use another attribute or method of its buffer declares it here
(mypy reports ``"Opening" has no attribute "x"`` until it does). Nothing imports this
module at run time.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import numpy as np

    from ..errors import SchemaError
    from ..sampling.base import BufferView, Sampler
    from ..sampling.lifetime import RateMeter
    from ..store.containers import ContainerKind
    from ..store.keys import BufferKeys
    from .opening import _Config
    from .replay import ReplayBuffer


class ReplayCore(Protocol):
    """What every mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer` may use: the
    buffer's name, client, keys, parts' view and script runner."""

    name: str
    #: the client of the buffer's server (a ``Guarded`` redis-py client: any command)
    client: Any
    keys: BufferKeys
    view: BufferView
    capacity: int

    def _run(self, script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        ...

    def __len__(self) -> int: ...


class SchemaCache(Protocol):
    """The schema the first batch fixed, cached per process (``Opening``, which declares
    the cache's attributes: a mixin that assigns an attribute declares it in its own class
    body, since mypy types an attribute a protocol declares by the subclass's first
    assignment to it)."""

    def _stored_schema(self) -> dict[str, Any] | None: ...

    def _forget_schema(self) -> None: ...


class OpeningNeeds(ReplayCore, Protocol):
    """``Opening``: creating or checking the buffer, the schema cache."""


class InsertingNeeds(ReplayCore, SchemaCache, Protocol):
    """``Inserting``: the add transaction."""

    def _check_schema(self, schema: dict[str, Any], schema_json: str) -> None: ...

    def _schema_refusal(self, schema: dict[str, Any]) -> SchemaError: ...


class DecodingNeeds(ReplayCore, SchemaCache, Protocol):
    """``Decoding``: stored records into batches."""

    _schema_json: str | None


class PrioritizingNeeds(ReplayCore, Protocol):
    """``Prioritizing``: ``update_priority``."""


class CheckpointingNeeds(ReplayCore, SchemaCache, Protocol):
    """``Checkpointing``: save, load, state_dict."""

    max_use: int | None
    _schema_json: str | None

    def _decode(self, kind: ContainerKind, schema: dict[str, Any], blobs: list[bytes],
                ids: list[int] | None) -> Any: ...

    def _run_once(self, script: str, memory: BufferKeys, keys: list[str],
                  args: list[Any]) -> Any: ...

    def encode(self, batch: Any) -> tuple[list[bytes], np.ndarray, dict[str, Any]]: ...


class InspectingNeeds(ReplayCore, SchemaCache, Protocol):
    """``Inspecting``: get, len, top, stats, close, clear, drop."""

    sampler: Sampler
    _config: _Config
    _owns_client: bool
    _rates: RateMeter

    def decode(self, blobs: list[bytes], ids: list[int] | None = None,
               schema_json: bytes | None = None) -> Any: ...


class EditingNeeds(ReplayCore, SchemaCache, Protocol):
    """``Editing``: records, remove, replace."""

    def encode(self, batch: Any) -> tuple[list[bytes], np.ndarray, dict[str, Any]]: ...

    def _schema_refusal(self, schema: dict[str, Any]) -> SchemaError: ...


class ShardedCheckpointingNeeds(Protocol):
    """``ShardedCheckpointing``: save and load of a sharded buffer, shard by shard."""

    name: str
    client: Any
    keys: BufferKeys
    capacity: int
    count: int
    shards: list[ReplayBuffer]
    prioritized_capacity: bool

    def __len__(self) -> int: ...

    def _on_shard(self, k: int) -> AbstractContextManager[None]: ...


class SequenceCore(Protocol):
    """What both mixins of :class:`~redisbuf.buffers.sequence.SequenceBuffer` may use."""

    name: str
    client: Any
    _keys: list[str]
    num_environments: int
    num_earliest_frames_ignored: int
    record_episodic_return: bool
    prioritized_sampling: bool

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any: ...

    def _stored_schema(self) -> dict[str, Any]: ...

    def _decode(self, blobs: Sequence[bytes | None], shape: tuple[int, ...]) -> dict[str, Any]: ...

    def _with_returns(self, data: dict[str, Any], raw: list[Any],
                      shape: tuple[int, ...]) -> None: ...

    def _read_steps(self, names: list[str], group: int = 1,
                    with_returns: bool | None = None) -> tuple[list[Any], list[Any]]: ...


class SequenceReadingNeeds(SequenceCore, Protocol):
    """``SequenceReading``: episode queries, get_field, gather_all, dequeue."""

    default_return: float


class SequenceDrawingNeeds(SequenceCore, Protocol):
    """``SequenceDrawing``: get_batch and update_priority."""

    allow_cross_episode: bool
    with_replacement: bool
    recent_data_ratio: float
    recent_data_steps: int
    rng: np.random.Generator
    _priorities: BufferView
    _acceptance: dict[int, float]

