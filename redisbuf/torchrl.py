"""TorchRL replay-buffer parts on a redisbuf buffer: one buffer that independent processes
share by URL and name, with TorchRL's own ``ReplayBuffer`` classes on top.

Switch a TorchRL (0.14.1) buffer by its storage argument::

    rb = TensorDictReplayBuffer(storage=LazyTensorStorage(10**5), batch_size=256)  # before
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(url, "dqn", 10**5), batch_size=256)

and a prioritized one by its class (TorchRL's builds a process-local priority tree)::

    from redisbuf.torchrl import TensorDictPrioritizedReplayBuffer
    rb = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5,
                                           storage=RedisbufStorage(url, "dqn", 100_000),
                                           batch_size=256)

What maps to what:

* :class:`RedisbufStorage` is TorchRL's ``Storage``: the items of a redisbuf
  :class:`~redisbuf.ReplayBuffer` called ``name`` at ``url``. Capacity (``max_size``),
  eviction (oldest first) and length live on the server, so they hold for every process
  that opens the name.
* **Indices are redisbuf item ids.** What ``extend`` / ``add`` return, the ``index`` of a
  sample and what ``update_priority`` takes is the id the server gave the item: unique
  in the buffer for its whole life (ids are never reused, not even after ``empty()``),
  the same in every process, and not a slot in ``[0, max_size)``. ``storage[ids]`` reads
  the items with these ids (``KeyError`` for an id no longer stored), a slice reads
  positions in insertion order (``rb[:]``: every item, oldest first), and a priority
  update of an evicted id is skipped, where a slot index would hit whatever item took
  the slot. After ``loads`` / ``load_state_dict`` the items have new ids.
* :class:`RedisbufWriter` replaces TorchRL's ``RoundRobinWriter``, whose cursor is a
  number in each process (two processes would write the same slots). Here the
  server's id counter is the cursor and eviction happens in the same atomic step as the
  insert. A TorchRL buffer built on a :class:`RedisbufStorage` without ``writer=`` gets
  it; any other writer is refused (:class:`TypeError`) but TorchRL's
  ``TensorDictMaxValueWriter``, which becomes a :class:`RedisbufMaxValueWriter`: the
  buffer keeps the ``max_size`` items of highest rank, evicting the lowest on the server
  (``prioritized_capacity``), with TorchRL's rules for what ``extend`` stores.
* :class:`RedisbufSampler` (the default sampler on a :class:`RedisbufStorage`) draws
  uniformly with replacement, as TorchRL's ``RandomSampler``, which also works (its
  random indices are drawn by the server). :class:`RedisbufPrioritizedSampler` is
  TorchRL's ``PrioritizedSampler`` on redisbuf's :class:`~redisbuf.PERSampler`:
  priorities live on the server, ``update_priority`` goes to the server, and every
  process draws by the priorities any process set. TorchRL's
  ``SamplerWithoutReplacement`` becomes a :class:`RedisbufSamplerWithoutReplacement`:
  epochs over a snapshot of the item ids, one epoch per process. Other TorchRL samplers
  pick storage positions and are refused.
* Sampling draws and reads in one round trip: the sampler's draw returns the items,
  which the storage hands to the following ``get`` of the same indices (in the same
  thread), so an item evicted between the draw and the read cannot be asked for.

Data: TensorDicts of batch size ``[N]`` (nested keys become field names joined by
``"."``, so a key may not contain ``"."``), plain tensors, or a mapping of tensors (read
back as a TensorDict); any dtype redisbuf stores (bool, integers, float16/32/64,
bfloat16). The first ``extend`` fixes keys, dtypes and shapes for every process. A key
``log_rewards`` is redisbuf's log-reward field (a float per item, no NaN). Non-tensor
entries and items with more than one batch dimension are refused.
"""

from __future__ import annotations

import functools
import heapq
import json
import math
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

import numpy as np
import redis.exceptions

from ._extras import require as _require_extra
from .buffers.replay import ReplayBuffer as _CoreBuffer
from .errors import ConfigMismatchError, EmptyBufferError, InvalidBatchError
from .sampling.samplers import PERSampler, UniformSampler
from .store import bounds
from .store.keys import format_id

# torch, tensordict and torchrl come with the extra ``redisbuf[torchrl]``: without one,
# importing this module raises MissingExtraError (an ImportError) naming it
_require_extra("torch", "torchrl", "redisbuf.torchrl")
_require_extra("tensordict", "torchrl", "redisbuf.torchrl")
_require_extra("torchrl.data", "torchrl", "redisbuf.torchrl", package="torchrl")
import torch  # noqa: E402
from tensordict import TensorDict, is_non_tensor, is_tensor_collection  # noqa: E402
from torchrl.data import ReplayBuffer as _TorchRLReplayBuffer  # noqa: E402
from torchrl.data import TensorDictReplayBuffer as _TorchRLTensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    PrioritizedSampler,
    RandomSampler,
    Sampler,
    SamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import Storage  # noqa: E402
from torchrl.data.replay_buffers.writers import (  # noqa: E402
    TensorDictMaxValueWriter,
    TensorDictRoundRobinWriter,
    Writer,
)

from .torchrl_trees import (  # noqa: E402
    KEY_SEPARATOR,
    ListStackError,
    check_key_part,
    fields_of_tree,
    flatten_leading,
    item_of,
    reshape_items,
    stack_items,
    tree_of,
)
from .torchrl_trees import batch_of_one as tree_batch_of_one  # noqa: E402

__all__ = [
    "KEY_SEPARATOR",
    "EmptyStorageError",
    "ListStackError",
    "PrioritizedReplayBuffer",
    "ROW_SHAPE_FIELD",
    "RedisbufMaxValueWriter",
    "RedisbufPrioritizedSampler",
    "RedisbufSampler",
    "RedisbufSamplerWithoutReplacement",
    "RedisbufStorage",
    "RedisbufWriter",
    "TensorDictPrioritizedReplayBuffer",
]

#: the field a plain tensor is stored under (``ReplayBuffer.extend(tensor)``)
TENSOR_FIELD = "__tensor__"
#: the buffer's meta field holding the row shape of a storage of ndim > 1 ("4" for [T=4])
ROW_SHAPE_FIELD = "torchrl_row_shape"


#: the text TorchRL's samplers raise (and its tests match) on an empty storage
EMPTY_STORAGE_MESSAGE = "Cannot sample from an empty storage."


class EmptyStorageError(EmptyBufferError, RuntimeError):
    """Sampling a :class:`RedisbufStorage` found no item to draw: redisbuf's
    :class:`~redisbuf.errors.EmptyBufferError` (also a ``LookupError`` and a ``ValueError``)
    that is also the ``RuntimeError`` TorchRL's samplers raise there. On a buffer that
    holds no item its message starts with TorchRL's ``"Cannot sample from an empty
    storage."``; a buffer whose items all have a PER priority (plus ``eps``) of 0 holds
    items but none can be drawn, and the message says so. Only the parts of this module
    raise it: :class:`redisbuf.ReplayBuffer` itself keeps raising ``EmptyBufferError``."""


def _empty_storage_error(storage: RedisbufStorage, cause: EmptyBufferError) -> EmptyStorageError:
    """The EmptyStorageError for ``cause``, a draw's EmptyBufferError on ``storage``."""
    length = len(storage.buffer)
    if length == 0:
        return EmptyStorageError(
            f"{EMPTY_STORAGE_MESSAGE} (redisbuf buffer {storage.name!r} holds no item)"
        )
    return EmptyStorageError(
        f"buffer {storage.name!r} holds {length} items, none of which can be drawn ({cause})"
    )


def _collate_id(batch: Any) -> Any:
    """The collate function of a TorchRL buffer on a RedisbufStorage: a draw already
    returns one stacked batch."""
    return batch


# -- TensorDicts <-> redisbuf batches -----------------------------------------------------


def _fields_of(data: Any) -> dict[str, torch.Tensor]:
    """One redisbuf dict batch (field name -> tensor with the leading batch dimension)
    from a batch of TorchRL data: a TensorDict of batch size [N], a tensor, a mapping of
    tensors, or a list of items (stacked); or a pytree a TensorDict cannot hold
    (:mod:`redisbuf.torchrl_trees`)."""
    if isinstance(data, list):
        data = stack_items(data)
    tree = fields_of_tree(data)
    if tree is not None:
        return tree
    if isinstance(data, torch.Tensor) and not is_tensor_collection(data):
        if data.ndim == 0:
            raise InvalidBatchError("a tensor batch needs a leading batch dimension")
        return {TENSOR_FIELD: data.detach().cpu()}
    if isinstance(data, Mapping) and not is_tensor_collection(data):
        first = next(iter(data.values()), None)
        if not isinstance(first, torch.Tensor) or first.ndim == 0:
            raise InvalidBatchError("a mapping batch needs tensors with a leading batch dimension")
        data = TensorDict(dict(data), batch_size=first.shape[:1])
    if not is_tensor_collection(data):
        raise InvalidBatchError(
            f"RedisbufStorage stores TensorDicts, tensors or mappings of tensors, not "
            f"{type(data).__name__}"
        )
    if data.batch_dims != 1:
        raise InvalidBatchError(
            f"RedisbufStorage stores items with no batch dimension of their own: extend takes "
            f"a TensorDict of batch size [N], got {list(data.batch_size)} (reshape(-1) it)"
        )
    non_tensor = _non_tensor_keys(data)
    if non_tensor:
        raise InvalidBatchError(
            f"key {non_tensor[0]!r} holds non-tensor data (NonTensorData / NonTensorStack), "
            "which RedisbufStorage does not store: keep it out of the batch (nothing was "
            "written)")
    fields: dict[str, torch.Tensor] = {}
    for key, value in data.items(include_nested=True, leaves_only=True):
        parts = (key,) if isinstance(key, str) else tuple(key)
        for part in parts:
            check_key_part(part, key)
        if not isinstance(value, torch.Tensor) or is_tensor_collection(value):
            raise InvalidBatchError(f"key {key!r} holds {type(value).__name__}, not a tensor")
        fields[KEY_SEPARATOR.join(parts)] = value.detach().cpu().contiguous()
    if not fields:
        raise InvalidBatchError("the TensorDict has no tensor entries")
    return fields


def _non_tensor_keys(data: Any, prefix: tuple[str, ...] = ()) -> list[Any]:
    """The keys of the non-tensor entries of a tensor collection (TensorDict's own
    leaf iteration leaves them out, so they would be lost without a word)."""
    found: list[Any] = []
    for key, value in data.items():
        path = (*prefix, key)
        if is_non_tensor(value):
            found.append(path[0] if len(path) == 1 else path)
        elif is_tensor_collection(value):
            found += _non_tensor_keys(value, path)
    return found


def _batch_of_one(item: Any) -> Any:
    """A batch holding ``item`` (one item, no batch dimension): a tensor or TensorDict
    gains a leading dimension of 1, so does each leaf of a pytree a TensorDict cannot hold;
    another mapping becomes a TensorDict of batch size [1]."""
    tree = tree_batch_of_one(item)
    if tree is not None:
        return tree
    if isinstance(item, torch.Tensor) or is_tensor_collection(item):
        return item.unsqueeze(0)
    if isinstance(item, Mapping):
        return TensorDict(dict(item), batch_size=[]).unsqueeze(0)
    return item


def _tensordict_of(batch: Mapping[str, Any], n: int, device: torch.device) -> Any:
    """The TorchRL batch of ``n`` items decoded from a redisbuf dict batch: a tensor, the
    pytree stored (:mod:`redisbuf.torchrl_trees`) or a TensorDict."""
    if set(batch) == {TENSOR_FIELD}:
        return torch.as_tensor(batch[TENSOR_FIELD]).to(device)
    tree = tree_of(batch, device)
    if tree is not None:
        return tree
    out = TensorDict({}, batch_size=[n], device=device)
    for name, value in batch.items():
        out.set(tuple(name.split(KEY_SEPARATOR)), torch.as_tensor(value))
    return out


def _items_of_torchrl_state(state: Mapping[str, Any]) -> Any:
    """The stored items of a TorchRL storage's ``state_dict()`` (its first ``_len``
    slots), or None when it holds none."""
    stored, length = state["_storage"], state.get("_len")
    if not state.get("initialized", True) or stored is None:
        return None
    if isinstance(stored, list):  # ListStorage
        return stack_items(stored) if stored else None
    if isinstance(stored, torch.Tensor) or is_tensor_collection(stored):
        data = stored
    elif isinstance(stored, Mapping):  # a TensorDict's state_dict: nested keys joined by "."
        tensors = {key: value for key, value in stored.items()
                   if isinstance(value, torch.Tensor) and key != "index"}
        first = next(iter(tensors.values()), None)
        if first is None:
            return None
        data = _tensordict_of(tensors, len(first), torch.device("cpu"))
    else:
        raise KeyError(f"a TorchRL storage state whose '_storage' is a "
                       f"{type(stored).__name__}: not one RedisbufStorage can load")
    if is_tensor_collection(data) and "index" in data.keys():
        data = data.exclude("index")
    length = len(data) if length is None else int(length)
    return data[:length] if length else None


def _check_sampler(sampler: Any) -> None:
    """Refuse a TorchRL sampler that picks storage positions (a shared buffer has none)."""
    if isinstance(sampler, Sampler) and not isinstance(
        sampler, (RedisbufSampler, RedisbufPrioritizedSampler, RedisbufSamplerWithoutReplacement)
    ) and type(sampler) is not RandomSampler:
        raise TypeError(
            f"RedisbufStorage samples with RedisbufSampler, RandomSampler, "
            f"RedisbufSamplerWithoutReplacement (SamplerWithoutReplacement) or "
            f"RedisbufPrioritizedSampler, not {type(sampler).__name__} (it picks storage "
            "positions, which a shared buffer does not have)"
        )


# -- storage ------------------------------------------------------------------------------


class RedisbufStorage(Storage):
    """TorchRL storage on the redisbuf buffer ``name`` at ``url`` (created with capacity
    ``max_size`` if it does not exist; ``max_size=None`` adopts the stored capacity, and
    another capacity than the stored one raises :class:`~redisbuf.errors.ConfigMismatchError`).
    Opening never changes what is stored.

    Args:
        url: a Redis URL or a ``redis.Redis`` client (``None``: ``$REDISBUF_URL``).
        name: the buffer's name; every process that opens it shares its items.
        max_size: the buffer's capacity (items); when full, the oldest go first.
        seed: seeds this process's draws when the TorchRL buffer has no ``generator=``.
        device: where sampled TensorDicts are put (they are read on the CPU).
        ndim: the batch dimensions of what the storage is given (TorchRL's ``ndim``):
            with ``ndim=2`` a batch ``[R, C]`` is stored as its ``R * C`` items, row by
            row, and ``extend`` returns their ids shaped ``[R, C]``. TorchRL's buffers
            extend along ``dim_extend = ndim - 1`` by default, so a collector's batch
            ``[N, T]`` (N environments by T steps) arrives as ``[T, N]``: one row per time
            step. The row shape (``[C]``) is fixed for the buffer by the first such write
            (the meta field ``torchrl_row_shape``). Samples are of items; ``len`` and
            ``max_size`` count items; a slice (``rb[:]``) reads whole rows, shaped
            ``[rows, C]``, leaving out the oldest items that do not fill a row (when
            ``max_size`` is not a multiple of ``C``, eviction takes items one by one).
        **buffer_kwargs: further arguments of :class:`redisbuf.ReplayBuffer`
            (e.g. ``prioritized_capacity=True``, ``max_item_bytes``).

    ``len()`` is the number of items stored now, by every process; ``_empty()``
    (TorchRL's ``rb.empty()``) removes every item for every process. ``state_dict()``
    holds every item (redisbuf's ``ReplayBuffer.state_dict``) and ``load_state_dict``
    replaces the buffer's items with them; ``dumps(path)`` / ``loads(path)`` do the same
    through the file ``path/redisbuf.msgpack``. Pickling (a spawned process receiving the
    storage) reopens the buffer by URL and name; a storage opened on a client object
    cannot be pickled.
    """

    ndim = 1
    _buffer: _CoreBuffer | None = None
    _last_evicted = 0

    def __init__(
        self,
        url: Any = None,
        name: str = "torchrl",
        max_size: int | None = None,
        *,
        seed: int | None = None,
        device: Any = "cpu",
        ndim: int = 1,
        **buffer_kwargs: Any,
    ) -> None:
        if isinstance(ndim, bool) or not isinstance(ndim, int) or ndim < 1:
            raise ValueError(f"ndim must be a positive integer, got {ndim!r}")
        if "sampler" in buffer_kwargs or "prioritized_sampling" in buffer_kwargs:
            raise TypeError(
                "RedisbufStorage takes no redisbuf sampler: pass TorchRL's sampler= "
                "(RedisbufSampler, RedisbufPrioritizedSampler) to the TorchRL buffer"
            )
        self._url, self.name, self.seed = url, name, seed
        self._buffer_kwargs = dict(buffer_kwargs)
        self._buffer = _CoreBuffer(url, name, capacity=max_size, seed=seed,
                                   sampler=UniformSampler(), **buffer_kwargs)
        super().__init__(max_size=self._buffer.capacity)
        self.device = torch.device(device)
        self.ndim = ndim
        self._row_shape: tuple[int, ...] | None = None
        self._local = threading.local()

    @property
    def buffer(self) -> _CoreBuffer:
        """The redisbuf buffer holding the items (its uniform-sampling handle)."""
        assert self._buffer is not None
        return self._buffer

    # TorchRL wiring -------------------------------------------------------------------

    def attach(self, buffer: Any) -> None:
        """Called by TorchRL's ``ReplayBuffer`` while it builds itself, before it makes
        its writer, sampler and collate function: fills in this storage's defaults for
        those not given (:class:`RedisbufWriter`, :class:`RedisbufSampler`, a collate
        that returns the drawn batch), puts a :class:`RedisbufMaxValueWriter` with the
        same rank key and reduction in place of TorchRL's ``TensorDictMaxValueWriter``,
        and refuses a writer or sampler that would address storage slots of one process.
        Reads and sets the constructor's pending arguments (``_init_writer``,
        ``_init_sampler``, ``_init_collate_fn``) of torchrl 0.14."""
        super().attach(buffer)
        if not hasattr(buffer, "_init_writer"):
            return
        writer = buffer._init_writer
        if writer is None or (
            isinstance(writer, functools.partial) and writer.func is TensorDictRoundRobinWriter
        ):
            buffer._init_writer = RedisbufWriter()
        elif writer is TensorDictMaxValueWriter:  # given as a factory
            buffer._init_writer = RedisbufMaxValueWriter()
        elif type(writer) is TensorDictMaxValueWriter:
            # TorchRL's max-value writer keeps its heap of ranks in the process: ours, with
            # its rank key and reduction, keeps the ranks on the server
            buffer._init_writer = RedisbufMaxValueWriter(writer._rank_key, writer._reduction)
        elif isinstance(writer, functools.partial) and writer.func is TensorDictMaxValueWriter:
            buffer._init_writer = RedisbufMaxValueWriter(*writer.args, **writer.keywords)
        elif isinstance(writer, Writer) and not isinstance(
            writer, (RedisbufWriter, RedisbufMaxValueWriter)
        ):
            raise TypeError(
                f"RedisbufStorage takes RedisbufWriter or RedisbufMaxValueWriter, not "
                f"{type(writer).__name__}: TorchRL's writers keep their cursor in the process, "
                "so two processes would write the same slots; on a RedisbufStorage the "
                "server's id counter is the cursor and eviction is the server's"
            )
        sampler = buffer._init_sampler
        if sampler is None:
            buffer._init_sampler = RedisbufSampler()
        elif isinstance(sampler, RedisbufPrioritizedSampler):
            sampler._bind(self)
        elif sampler is SamplerWithoutReplacement:  # given as a factory
            buffer._init_sampler = RedisbufSamplerWithoutReplacement()
        elif type(sampler) is SamplerWithoutReplacement:
            # TorchRL's keeps a permutation of storage positions: ours, of item ids
            buffer._init_sampler = RedisbufSamplerWithoutReplacement(
                drop_last=sampler.drop_last, shuffle=sampler.shuffle)
        elif isinstance(sampler, functools.partial) and sampler.func is SamplerWithoutReplacement:
            buffer._init_sampler = RedisbufSamplerWithoutReplacement(*sampler.args,
                                                                     **sampler.keywords)
        else:
            _check_sampler(sampler)
        if buffer._init_collate_fn is None:
            buffer._init_collate_fn = _collate_id

    # writing --------------------------------------------------------------------------

    def _append(self, data: Any) -> torch.Tensor:
        """Add a batch of items; their ids (int64 tensor), in the batch's order, shaped
        like its first ``ndim`` dimensions."""
        if self.ndim == 1:
            return self._append_fields(_fields_of(data))
        if isinstance(data, list):
            raise InvalidBatchError(f"a RedisbufStorage of ndim={self.ndim} takes a batch of "
                                    f"{self.ndim} dimensions, not a list of items")
        flat, shape = flatten_leading(data, self.ndim)
        fields = _fields_of(flat)
        claimed = self._claim_row_shape(shape[1:])
        try:
            return self._append_fields(fields).reshape(shape)
        except Exception:
            if claimed:  # nothing stored: the row shape is not the buffer's either
                self.buffer.client.hdel(self.buffer.keys.meta, ROW_SHAPE_FIELD)
            raise

    def _in_given_layout(self, ids: torch.Tensor) -> torch.Tensor:
        """The ids of an extend in the layout of the data given to the TorchRL buffer,
        which swapped its dimensions 0 and ``dim_extend`` before writing."""
        for entity in self._attached_entities:
            dim = getattr(entity, "dim_extend", 0)
            if 0 < dim < ids.ndim:
                return ids.transpose(0, dim)
        return ids

    def _stored_row_shape(self) -> tuple[int, ...] | None:
        """The buffer's row shape (set by the first extend of a storage of ndim > 1)."""
        if self._row_shape is None:
            text = self.buffer.client.hget(self.buffer.keys.meta, ROW_SHAPE_FIELD)
            if text is not None:
                text = text.decode() if isinstance(text, bytes) else text
                self._row_shape = tuple(int(part) for part in text.split(",") if part)
        return self._row_shape

    def _claim_row_shape(self, row: tuple[int, ...]) -> bool:
        """Check ``row`` against the buffer's row shape, recording it when there is none;
        whether this call recorded it."""
        claimed = False
        if self._stored_row_shape() is None:
            text = ",".join(str(part) for part in row)
            claimed = bool(self.buffer.client.hsetnx(self.buffer.keys.meta, ROW_SHAPE_FIELD,
                                                     text))
            if claimed:
                self._row_shape = row
        if self._stored_row_shape() != row:
            raise InvalidBatchError(
                f"buffer {self.name!r} holds rows of shape {list(self._row_shape or ())}, "
                f"got a batch of rows of shape {list(row)}")
        return claimed

    def _append_fields(self, fields: dict[str, torch.Tensor]) -> torch.Tensor:
        """Add a redisbuf dict batch; the new items' ids. ``_last_evicted`` is then how
        many items the insert evicted (new ones included). A batch over the bounds of
        one add (:data:`~redisbuf.store.bounds.MAX_ADD_ITEMS` items,
        :data:`~redisbuf.store.bounds.MAX_ADD_BYTES`) is added as several atomic adds,
        in order; its items all have one layout, so when the first is stored the others
        fit too."""
        count = len(next(iter(fields.values())))
        # the encoded size of an item: its tensors' bytes, and room for names and headers
        per_item = 64 + sum(96 + len(name) + value[:1].nbytes for name, value in fields.items())
        parts = bounds.add_slices([per_item] * count)
        ids: list[Any] = []
        evicted = 0
        for start, stop in parts:
            part = fields if len(parts) == 1 else {
                name: value[start:stop] for name, value in fields.items()}
            result = self.buffer.add(part)
            if result.rejected is not None:
                raise InvalidBatchError(f"buffer {self.name!r} refused the batch "
                                        f"(items {start} on): {result.rejected}")
            ids.extend(result.ids)
            evicted += int(result.evicted)
        self._last_evicted = evicted
        self._bump_mutation_revision()
        return torch.as_tensor(np.asarray(ids, dtype=np.int64))

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """Give stored items new data in place (TorchRL's ``rb[index] = data``):
        ``cursor`` names them as :meth:`get` reads them (an id, ids, or a slice of
        positions in insertion order, oldest first), and item ``i`` of ``data`` replaces
        the ``i``-th (for one id, ``data`` is one item without a batch dimension). Each
        keeps its id, place in the order, priority and uses (redisbuf's
        ``ReplayBuffer.replace``: one atomic command per MAX_ADD_ITEMS items). An item
        evicted after the check that it is stored is left evicted. ``set_cursor`` is
        ignored: the writers' cursor is the server's insert count.

        Raises:
            KeyError: an id not stored now (nothing is written).
            InvalidBatchError: not one item of ``data`` per id.
            SchemaError: ``data`` has other keys, dtypes or shapes than the stored items
                (a stored item cannot gain a key; nothing is written).
        """
        if isinstance(cursor, slice):
            ids = self._ids_in_order()[cursor]
        elif isinstance(cursor, (int, np.integer)) or (
            isinstance(cursor, (torch.Tensor, np.ndarray)) and cursor.ndim == 0
        ):
            ids, data = [int(cursor)], _batch_of_one(data)
        else:
            ids = [int(i) for i in np.asarray(
                cursor.cpu() if isinstance(cursor, torch.Tensor) else list(cursor)
            ).reshape(-1)]
        fields = _fields_of(data)
        n = len(next(iter(fields.values())))
        if n != len(ids):
            raise InvalidBatchError(f"{n} items of data for {len(ids)} ids")
        missing = [i for i, stored in zip(ids, self._stored(ids), strict=True) if not stored]
        if missing:
            raise KeyError(f"ids not in buffer {self.name!r}: {missing[:10]}")
        step = bounds.MAX_ADD_ITEMS
        for start in range(0, len(ids), step):
            self.buffer.replace(ids[start : start + step],
                                {k: v[start : start + step] for k, v in fields.items()})
        self._bump_mutation_revision()

    def _ensure_rank_eviction(self) -> None:
        """Make sure the buffer evicts its lowest log-rewards first (what a
        :class:`RedisbufMaxValueWriter` needs). A buffer made with ``prioritized_capacity=True``
        has it. One made by this storage's default (no ``prioritized_capacity`` given) that
        was never written (no item ever inserted, no schema) is switched to it, atomically
        (a WATCH on its meta: a write by another process in between makes this raise
        instead). Anything else raises :class:`~redisbuf.errors.ConfigMismatchError`."""
        if self.buffer.prioritized_capacity:
            return
        meta = self.buffer.keys.meta
        refusal = ConfigMismatchError(
            f"buffer {self.name!r} evicts with {self.buffer.remover!r}, and a max-value "
            "writer needs the lowest ranks to go first: open a new buffer with "
            "RedisbufStorage(url, name, max_size, prioritized_capacity=True)"
        )
        if "prioritized_capacity" in self._buffer_kwargs or "remover" in self._buffer_kwargs:
            raise refusal
        with self.buffer.client.pipeline() as pipe:
            pipe.watch(meta)
            eviction, last_id, schema = pipe.hmget(meta, "eviction", "last_id", "schema")
            if eviction != b"fifo" or last_id not in (b"0", None) or schema is not None:
                pipe.reset()
                raise refusal
            pipe.multi()
            pipe.hset(meta, "eviction", "reward")
            try:
                pipe.execute()
            except redis.exceptions.WatchError:
                raise refusal from None
        self._buffer_kwargs["prioritized_capacity"] = True
        self._buffer = _CoreBuffer(self.buffer.client, self.name, capacity=self.max_size,
                                   seed=self.seed, sampler=UniformSampler(),
                                   **self._buffer_kwargs)

    def _inserted(self) -> int:
        """The server's count of items inserted by every process since the buffer was
        made or last cleared (one HGET of its meta)."""
        return int(self.buffer.client.hget(self.buffer.keys.meta, "inserted") or 0)

    def _lowest_ranks(self, k: int) -> tuple[int, list[tuple[float, int]]]:
        """The number of items stored and the ``k`` lowest ``(log-reward, id)`` pairs,
        lowest first, read in one transaction (``k`` at most MAX_ITEMS_PER_COMMAND)."""
        keys = self.buffer.keys
        pipe = self.buffer.client.pipeline(transaction=True)
        pipe.zcard(keys.order)
        pipe.zrange(keys.prio, 0, max(k, 1) - 1, withscores=True)
        length, rows = pipe.execute()
        return int(length), [(float(score), int(member)) for member, score in rows]

    def _stored(self, ids: list[int]) -> list[bool]:
        """Whether each of these ids is stored now."""
        out: list[bool] = []
        step = bounds.MAX_ITEMS_PER_COMMAND
        for start in range(0, len(ids), step):
            members = [format_id(i) for i in ids[start : start + step]]
            out += [score is not None
                    for score in self.buffer.client.zmscore(self.buffer.keys.order, members)]
        return out

    # reading --------------------------------------------------------------------------

    def draw_and_keep(
        self, handle: _CoreBuffer, n: int, replacement: bool
    ) -> tuple[torch.Tensor, Any]:
        """Draw ``n`` items with ``handle`` (this buffer, opened with some sampler), keep
        the decoded batch for the ``get`` of the same ids in this thread, and return the
        ids and redisbuf's SampleInfo. A buffer with nothing to draw raises
        :class:`EmptyStorageError`. When the TorchRL buffer has a ``generator=`` (set
        here as ``_rng``), the draw's random numbers come from it: the same generator
        state draws the same items from the same stored items."""
        generator = getattr(self, "_rng", None)
        if isinstance(generator, torch.Generator):
            seed = int(torch.randint(0, 2**62, (), generator=generator))
            handle.rng = np.random.default_rng(seed)
        try:
            info = handle.sample_with_info(int(n), replacement=replacement)
        except EmptyStorageError:
            raise
        except EmptyBufferError as error:
            raise _empty_storage_error(self, error) from error
        ids = torch.from_numpy(np.asarray(info.ids, dtype=np.int64))
        self._local.pending = (ids, _tensordict_of(info.batch, len(ids), self.device))
        return ids, info

    def _rand_given_ndim(self, batch_size: int) -> torch.Tensor:
        """TorchRL's ``RandomSampler`` asks the storage for random indices: a uniform
        draw with replacement made by the server (its items kept for ``get``)."""
        ids, _ = self.draw_and_keep(self.buffer, batch_size, replacement=True)
        return ids

    def get(self, index: Any) -> Any:
        """The items with ids ``index`` (an int: one item; a sequence or tensor: a
        batch in that order and shape; a slice: positions in insertion order, oldest
        first, read after reading every stored id; with ``ndim > 1``, a slice or a tuple
        holding one indexes the stored rows, see the class). Right after a draw in this
        thread, the drawn items."""
        pending = getattr(self._local, "pending", None)
        if pending is not None:
            self._local.pending = None
            ids, batch = pending
            if index is ids or (
                isinstance(index, torch.Tensor) and index.shape == ids.shape
                and torch.equal(index.cpu(), ids)
            ):
                return batch
        for entity in self._attached_entities:
            # a sampler given as a factory was not seen by attach(): one that picks
            # positions must not have them read as ids
            _check_sampler(getattr(entity, "_sampler", None))
        positional = isinstance(index, slice) or (
            isinstance(index, tuple) and any(isinstance(part, slice) for part in index))
        row = self._stored_row_shape() if positional and self.ndim > 1 else None
        if row is not None:
            ids = self._ids_in_order()
            ids = ids[len(ids) % math.prod(row):]  # the oldest, partly evicted row left out
            return self.get(torch.as_tensor(ids, dtype=torch.long).reshape(-1, *row)[index])
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        if isinstance(index, slice):
            return self.get(self._ids_in_order()[index])
        if isinstance(index, (int, np.integer)) or (
            isinstance(index, (torch.Tensor, np.ndarray)) and index.ndim == 0
        ):
            return item_of(self.get(torch.as_tensor([int(index)])), 0)
        index = torch.as_tensor(index)
        ids_list = index.reshape(-1).tolist()
        if not ids_list:
            raise ValueError("no ids to read")
        batch = _tensordict_of(self.buffer.get(ids_list), len(ids_list), self.device)
        return reshape_items(batch, tuple(index.shape)) if index.ndim > 1 else batch

    def _ids_in_order(self) -> list[int]:
        """The ids of the items stored now, oldest first: read from the server's order of
        the items (ids only), MAX_ITEMS_PER_COMMAND a command, so not one atomic read:
        an item evicted meanwhile may be listed, one added meanwhile may be."""
        order = self.buffer.keys.order
        step = bounds.MAX_ITEMS_PER_COMMAND
        ids: list[int] = []
        low: str = "-inf"
        while True:
            rows = self.buffer.client.zrangebyscore(order, low, "+inf", start=0, num=step,
                                                    withscores=True)
            ids += [int(member) for member, _ in rows]
            if len(rows) < step:
                return list(dict.fromkeys(ids))
            low = f"({rows[-1][1]!r}"

    def keep_records(self, ids: list[int], records: list[bytes]) -> torch.Tensor:
        """Decode the stored records of the items ``ids`` (read with ``buffer.records``),
        keep the batch for the ``get`` of these ids in this thread (as
        :meth:`draw_and_keep`) and return the ids (int64 tensor)."""
        out = torch.as_tensor(ids, dtype=torch.long)
        batch = self.buffer.decode(records, ids)
        self._local.pending = (out, _tensordict_of(batch, len(ids), self.device))
        return out

    def __iter__(self) -> Any:
        """The stored items one by one, oldest first (TorchRL's storages yield their
        slots in order): every stored id is read first, then the items, at most
        MAX_ITEMS_PER_COMMAND a read; items evicted meanwhile are skipped."""
        ids = self._ids_in_order()
        step = bounds.MAX_ITEMS_PER_COMMAND
        for start in range(0, len(ids), step):
            chunk = ids[start : start + step]
            found = [(i, blob) for i, blob in zip(chunk, self.buffer.records(chunk),
                                                  strict=True) if blob is not None]
            if not found:
                continue
            batch = _tensordict_of(self.buffer.decode([b for _, b in found],
                                                      [i for i, _ in found]),
                                   len(found), self.device)
            for position in range(len(found)):
                yield item_of(batch, position)

    def __len__(self) -> int:
        return len(self.buffer)

    def contains(self, item: Any) -> Any:
        """Whether the item with id ``item`` is stored (a bool tensor for a tensor)."""
        if isinstance(item, torch.Tensor) and item.ndim:
            return torch.tensor([bool(self.contains(int(i))) for i in item.reshape(-1)]).reshape(
                item.shape
            )
        try:
            self.buffer.get([int(item)])
        except KeyError:
            return False
        return True

    # lifecycle ------------------------------------------------------------------------

    def _empty(self) -> None:
        self.buffer.clear()
        self._bump_mutation_revision()

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_size": self.max_size, "redisbuf": self.buffer.state_dict()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Replace the buffer's items, for every process, with those of ``state_dict``:
        a RedisbufStorage's (``state_dict()``: order, log-rewards, priorities and uses
        kept), or a TorchRL tensor or list storage's (``LazyTensorStorage``,
        ``LazyMemmapStorage``, ``ListStorage``: its first ``_len`` slots, in slot order;
        the TensorDictReplayBuffer's stored ``"index"`` entry is left out). Either is one
        atomic swap; the items get new ids. Anything else raises ``KeyError``."""
        if "redisbuf" in state_dict:
            self.buffer.load_state_dict(state_dict["redisbuf"])
        elif "_storage" in state_dict:
            data = _items_of_torchrl_state(state_dict)
            if data is None:
                self.buffer.clear()
            else:
                if self.ndim > 1:
                    data = flatten_leading(data, self.ndim)[0]
                self.buffer.replace_items(_fields_of(data))
        else:
            raise KeyError(f"neither a RedisbufStorage's state (key 'redisbuf') nor a TorchRL "
                           f"storage's (key '_storage'): keys {sorted(map(str, state_dict))}")
        self._bump_mutation_revision()

    def dumps(self, path: Any) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.buffer.save(path / "redisbuf.msgpack")

    def loads(self, path: Any) -> None:
        self.buffer.load(Path(path) / "redisbuf.msgpack")
        self._bump_mutation_revision()

    def __getstate__(self) -> dict[str, Any]:
        if not isinstance(self._url, str) and self._url is not None:
            raise TypeError(
                "a RedisbufStorage opened on a client object cannot be pickled: open it "
                "with a URL, or open the buffer by name in the other process"
            )
        return {"url": self._url, "name": self.name, "max_size": self.max_size,
                "seed": self.seed, "device": str(self.device), "ndim": self.ndim,
                "kwargs": self._buffer_kwargs}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, state["url"], state["name"], state["max_size"],
                            seed=state["seed"], device=state["device"],
                            ndim=state.get("ndim", 1), **state["kwargs"])

    def __repr__(self) -> str:
        return (f"RedisbufStorage(name={self.name!r}, max_size={self.max_size}, "
                f"len={len(self)})")


# -- writer -------------------------------------------------------------------------------


class _WriterStateOnServer:
    """What the writers of a RedisbufStorage keep of their own: nothing. Their counters
    are the buffer's, on the server, so emptying, saving and loading are the storage's."""

    def _empty(self, empty_write_count: bool = True) -> None:
        return  # the storage's _empty clears the buffer (and its counters) on the server

    def dumps(self, path: Any) -> None:
        return

    def loads(self, path: Any) -> None:
        return

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return


class RedisbufWriter(_WriterStateOnServer, Writer):
    """TorchRL writer of a :class:`RedisbufStorage`: ``extend`` adds the batch in one
    atomic step on the server, which gives the items their ids (the shared cursor) and
    evicts beyond capacity; it returns the ids. ``add`` adds one item and returns its id.
    It keeps nothing in the process: its state is empty, ``write_count`` is the server's
    count of items inserted by every process since the last ``empty()``, and ``_cursor``
    (TorchRL's round-robin cursor) is that count modulo ``max_size``."""

    def __init__(self) -> None:
        super().__init__(compilable=False)

    def register_storage(self, storage: Storage) -> None:
        if not isinstance(storage, RedisbufStorage):
            raise TypeError(
                f"RedisbufWriter writes to a RedisbufStorage, not {type(storage).__name__}"
            )
        super().register_storage(storage)

    def _redisbuf_storage(self) -> RedisbufStorage:
        if not isinstance(self._storage, RedisbufStorage):
            raise RuntimeError("RedisbufWriter has no RedisbufStorage registered")
        return self._storage

    def add(self, data: Any) -> int:
        return int(self._redisbuf_storage()._append(_batch_of_one(data))[0])

    def extend(self, data: Any) -> torch.Tensor:
        storage = self._redisbuf_storage()
        return storage._in_given_layout(storage._append(data))

    @property
    def _write_count(self) -> int:
        return self._redisbuf_storage()._inserted()

    @property
    def _cursor(self) -> int:
        """TorchRL's ``RoundRobinWriter._cursor``, on the shared buffer: the server's
        count of items inserted by every process since the last ``empty()``, modulo
        ``max_size``. Were the items written round-robin into ``max_size`` slots, in the
        order the server inserted them, this is the slot the next item would take (and,
        once full, that of the oldest item, which it evicts). Read-only."""
        storage = self._redisbuf_storage()
        return storage._inserted() % storage.max_size

    @_cursor.setter
    def _cursor(self, value: int) -> None:
        raise AttributeError(
            "RedisbufWriter._cursor is the server's insert count modulo max_size, shared "
            "by every process: it cannot be set"
        )


_REDUCTIONS = ("max", "min", "mean", "median", "sum")
#: redisbuf's log-reward field, where a max-value writer stores each item's rank
RANK_FIELD = "log_rewards"


def _keep_top(
    length: int, lowest: list[tuple[float, int]], ranks: list[float], capacity: int
) -> list[bool]:
    """Which items of a batch with ``ranks`` TorchRL's ``TensorDictMaxValueWriter`` would
    store, in batch order, into a storage of ``capacity`` holding ``length`` items whose
    lowest ranks (and ids) are ``lowest``: while not full every item; when full one whose
    rank is above the lowest held (stored or of the batch), which it replaces (the oldest
    first among equal ranks, as the server evicts). An item of the batch replaced by a
    later one is not stored either."""
    heap: list[tuple[float, int, int]] = [(rank, item_id, -1) for rank, item_id in lowest]
    heapq.heapify(heap)
    stored = [False] * len(ranks)
    count = length
    for position, rank in enumerate(ranks):
        if count < capacity:
            count += 1
        elif heap and rank > heap[0][0]:
            _, _, replaced = heapq.heappop(heap)
            if replaced >= 0:
                stored[replaced] = False
        else:
            continue
        stored[position] = True
        # batch items are newer than every stored one, in batch order
        heapq.heappush(heap, (rank, 1 << 62 | position, position))
    return stored


class RedisbufMaxValueWriter(_WriterStateOnServer, TensorDictMaxValueWriter):
    """TorchRL's ``TensorDictMaxValueWriter`` on a :class:`RedisbufStorage`: the buffer
    keeps the ``max_size`` items of highest rank, for every process that writes to it.

    An item's rank is its ``rank_key`` entry (default ``("next", "reward")``), reduced
    over all its elements with ``reduction`` (``"sum"``, ``"max"``, ``"min"``, ``"mean"``,
    ``"median"``) when it has more than one, as TorchRL's. The rank is stored as the
    item's redisbuf log-reward (the ``log_rewards`` field, float64, which reads return
    too), and the buffer evicts the lowest log-rewards first, on the server, in the same
    atomic step as the insert (redisbuf's ``prioritized_capacity``). A TorchRL buffer on a
    RedisbufStorage given TorchRL's own ``TensorDictMaxValueWriter`` gets this writer
    with the same rank key and reduction.

    ``extend`` follows TorchRL's rule item by item: while the buffer is not full every
    item is stored; when full, an item is stored only if its rank is above the lowest
    one held, which it replaces (an item whose rank equals the lowest is not stored); it
    returns the new items' ids, and ``-1`` for items not stored (also for an item of the
    batch replaced by a later one of the same batch). ``add`` returns the id, or ``None``.
    The rule is applied to the buffer's lowest ranks read just before the insert; the
    insert itself keeps the ``max_size`` highest ranks whatever other processes wrote
    meanwhile (among equal ranks the oldest item goes first there), and an item that
    another process's higher ranks pushed out at once is returned as ``-1`` too.

    The buffer must evict by rank: a RedisbufStorage made with
    ``prioritized_capacity=True``, or one opened without ``prioritized_capacity`` that
    was never written, which this writer switches to lowest-rank eviction when it is
    registered; any other raises :class:`~redisbuf.errors.ConfigMismatchError`.

    Args:
        rank_key: the key to rank items by (default ``("next", "reward")``).
        reduction: how a rank entry of more than one element is reduced to one number.

    Raises:
        RuntimeError: ``add`` / ``extend`` of data that is not a TensorDict (TorchRL's
            message), or of a TensorDict of more than one batch dimension.
        KeyError: the data has no ``rank_key``.
        InvalidBatchError: a NaN rank, or data holding a ``log_rewards`` key that is not
            the rank key.
    """

    def __init__(self, rank_key: Any = None, reduction: str = "sum", **kwargs: Any) -> None:
        kwargs.pop("compilable", None)
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
        Writer.__init__(self, compilable=False)
        if kwargs:
            raise TypeError(f"RedisbufMaxValueWriter got unexpected arguments {sorted(kwargs)}")
        self._rank_key = ("next", "reward") if rank_key is None else rank_key
        self._reduction = reduction

    def register_storage(self, storage: Storage) -> None:
        if not isinstance(storage, RedisbufStorage):
            raise TypeError(
                f"RedisbufMaxValueWriter writes to a RedisbufStorage, not {type(storage).__name__}"
            )
        if storage.ndim > 1:
            raise ValueError("TensorDictMaxValueWriter is not compatible with storages with "
                             "more than one dimension.")
        storage._ensure_rank_eviction()
        Writer.register_storage(self, storage)

    def _redisbuf_storage(self) -> RedisbufStorage:
        if not isinstance(self._storage, RedisbufStorage):
            raise RuntimeError("RedisbufMaxValueWriter has no RedisbufStorage registered")
        return self._storage

    def _ranks(self, data: Any) -> torch.Tensor:
        """One rank per item of ``data`` (float64)."""
        if not is_tensor_collection(data):
            raise RuntimeError(
                f"{type(self)} expects data to be a tensor collection (tensordict or "
                f"tensorclass). Found a {type(data)} instead."
            )
        if data.batch_dims != 1:
            raise RuntimeError(
                "Expected input tensordict to have no more than 1 dimension, got"
                f"tensordict.batch_size = {data.batch_size}"
            )
        rank = data.get(self._rank_key, None)
        if rank is None:
            raise KeyError(f"Rank key {self._rank_key} not found in data.")
        rank = torch.as_tensor(rank).detach().cpu().reshape(data.batch_size[0], -1)
        if rank.shape[1] == 0:
            raise InvalidBatchError(f"rank key {self._rank_key!r} holds no element")
        if rank.shape[1] > 1:
            if self._reduction == "mean" or self._reduction == "median":
                rank = rank.to(torch.float64)
            reduced = getattr(rank, self._reduction)(dim=1)
            rank = reduced[0] if isinstance(reduced, tuple) else reduced
        else:
            rank = rank[:, 0]
        rank = rank.to(torch.float64)
        if bool(torch.isnan(rank).any()):
            bad = torch.nonzero(torch.isnan(rank)).reshape(-1).tolist()
            raise InvalidBatchError(f"rank key {self._rank_key!r} is NaN for items {bad[:10]}")
        return rank

    def extend(self, data: Any) -> torch.Tensor:
        storage = self._redisbuf_storage()
        ranks = self._ranks(data)
        fields = _fields_of(data)
        rank_names = {RANK_FIELD, (RANK_FIELD,)}
        if RANK_FIELD in fields and self._rank_key not in rank_names:
            raise InvalidBatchError(
                f"the data holds {RANK_FIELD!r}, where this writer stores each item's rank "
                f"(rank key {self._rank_key!r}): rename it, or rank by it"
            )
        fields[RANK_FIELD] = ranks
        n = len(ranks)
        out = torch.full((n,), -1, dtype=torch.long)
        length, lowest = storage._lowest_ranks(min(n, storage.max_size,
                                                   bounds.MAX_ITEMS_PER_COMMAND))
        keep = _keep_top(length, lowest, ranks.tolist(), storage.max_size)
        chosen = [i for i, kept in enumerate(keep) if kept]
        if not chosen:
            return out
        pick = torch.as_tensor(chosen)
        ids = storage._append_fields({key: value[pick] for key, value in fields.items()})
        result_ids = ids.tolist()
        if storage._last_evicted:
            # other processes' higher ranks may have pushed some of these out at once
            present = storage._stored(result_ids)
            result_ids = [i if here else -1 for i, here in zip(result_ids, present, strict=True)]
        out[pick] = torch.as_tensor(result_ids, dtype=torch.long)
        return out

    def add(self, data: Any) -> int | None:
        if is_tensor_collection(data) and data.batch_dims == 0:
            data = data.unsqueeze(0)
        elif is_tensor_collection(data):
            raise RuntimeError(
                f"add takes one item (a TensorDict of batch size []), got {list(data.batch_size)}"
            )
        index = int(self.extend(data)[0])
        return None if index < 0 else index

    def get_insert_index(self, data: Any) -> int:
        raise TypeError("RedisbufMaxValueWriter picks no slot: the server gives ids and evicts")

    @property
    def _write_count(self) -> int:
        return self._redisbuf_storage()._inserted()

    @_write_count.setter
    def _write_count(self, value: int) -> None:
        return  # the server counts the inserts

    @property
    def _cursor(self) -> int:
        """TorchRL's ``TensorDictMaxValueWriter._cursor``, on the shared buffer: the
        number of items stored now modulo ``max_size``, the slot the next item would
        fill while the buffer is not full, and 0 once it is full (TorchRL's stops there
        too: a full buffer's items are replaced, not appended). Read-only."""
        storage = self._redisbuf_storage()
        return len(storage) % storage.max_size

    @_cursor.setter
    def _cursor(self, value: int) -> None:
        raise AttributeError("RedisbufMaxValueWriter._cursor follows the shared buffer's "
                             "length: it cannot be set")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rng"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        return (f"RedisbufMaxValueWriter(rank_key={self._rank_key}, "
                f"reduction={self._reduction})")


# -- samplers -----------------------------------------------------------------------------


def _storage_of(storage: Any, who: str) -> RedisbufStorage:
    if not isinstance(storage, RedisbufStorage):
        raise TypeError(f"{who} samples a RedisbufStorage, not {type(storage).__name__}")
    return storage


class RedisbufSampler(Sampler):
    """Uniform draws on a :class:`RedisbufStorage`, made by the server together with the
    read: with replacement, as TorchRL's ``RandomSampler`` (the default of a TorchRL
    buffer on a RedisbufStorage); ``distinct=True``: no item twice within one batch
    (while the batch is not larger than the buffer). Nothing carries over between
    batches: for that, :class:`RedisbufSamplerWithoutReplacement`."""

    def __init__(self, distinct: bool = False) -> None:
        self.distinct = bool(distinct)

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        ids, _ = _storage_of(storage, "RedisbufSampler").draw_and_keep(
            storage.buffer, batch_size, replacement=not self.distinct
        )
        return ids, {}

    def _empty(self) -> None:
        return

    def dumps(self, path: Any) -> None:
        return

    def loads(self, path: Any) -> None:
        return

    def state_dict(self) -> dict[str, Any]:
        return {"distinct": self.distinct}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.distinct = bool(state_dict.get("distinct", self.distinct))

    def __repr__(self) -> str:
        return f"RedisbufSampler(distinct={self.distinct})"


class RedisbufSamplerWithoutReplacement(SamplerWithoutReplacement):
    """TorchRL's ``SamplerWithoutReplacement`` on a :class:`RedisbufStorage`: epochs over
    the buffer's items, each item once per epoch. A TorchRL buffer on a RedisbufStorage
    given TorchRL's ``SamplerWithoutReplacement`` gets this sampler with the same
    ``drop_last`` and ``shuffle``.

    **One epoch per process.** Each sampler runs its own epochs: an epoch starts with a
    snapshot of the ids stored then, in a random order (``shuffle=True``, drawn with
    ``torch.randperm`` and the TorchRL buffer's generator when it has one) or oldest first
    (``shuffle=False``), and each ``sample`` returns the next ``batch_size`` of them. So
    every process sees every item of its epoch's snapshot once, whatever other processes
    draw. Items evicted before their turn are skipped (the batch is filled from the
    following ids of the snapshot); items added during an epoch wait for the next one
    (TorchRL's starts a new permutation whenever the storage's length changes).

    ``ran_out`` turns True with the epoch's last batch (TorchRL's iteration over the
    buffer then stops) and the next ``sample`` starts a new epoch. Another process may
    evict every item the epoch has left after a batch was returned with ``ran_out``
    False: the next ``sample`` then starts a new epoch and returns its first batch, so
    an iteration over the buffer runs on into it. With ``drop_last=False``
    the last batch of an epoch may be short, as TorchRL's; with ``drop_last=True`` the
    ids left over that do not fill a batch are dropped, a batch that evictions left short
    is dropped too (the next epoch's first batch is returned in its place), and a
    snapshot smaller than ``batch_size`` raises ``ValueError`` as TorchRL's. An empty
    buffer raises :class:`EmptyStorageError`.

    Args:
        drop_last: drop the ids of an epoch that do not fill a batch.
        shuffle: a random order per epoch; ``False``: oldest first.
    """

    def __init__(self, drop_last: bool = False, shuffle: bool = True) -> None:
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self._epoch: torch.Tensor | None = None  # the epoch's ids, in drawing order
        self._position = 0
        self._ran_out = False
        self._remaining_batches = 0
        # TorchRL's attributes of the same meaning
        self._sample_list = None
        self.len_storage = 0

    def _start_epoch(self, storage: RedisbufStorage, batch_size: int) -> None:
        ids = torch.as_tensor(storage._ids_in_order(), dtype=torch.long)
        if ids.numel() == 0:
            raise EmptyStorageError(
                f"{EMPTY_STORAGE_MESSAGE} (redisbuf buffer {storage.name!r} holds no item)"
            )
        if self.drop_last and ids.numel() < batch_size:
            raise ValueError(
                f"The batch size ({batch_size}) is greater than the storage capacity "
                f"({ids.numel()}). This makes it impossible to return a sample without "
                "repeating indices. Consider changing the sampler class or turn the "
                "'drop_last' argument to False."
            )
        if self.shuffle:
            ids = ids[torch.randperm(ids.numel(), generator=self._rng)]
        self._epoch, self._position = ids, 0
        self.len_storage = ids.numel()

    def _left(self) -> int:
        return 0 if self._epoch is None else self._epoch.numel() - self._position

    def _count_batches(self, batch_size: int) -> None:
        left = self._left()
        self._remaining_batches = (left // batch_size if self.drop_last
                                   else -(left // -batch_size))

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        rb_storage = _storage_of(storage, type(self).__name__)
        if batch_size <= 0:
            raise ValueError(f"batch_size must be positive, got {batch_size}")
        for _ in range(3):  # a new epoch may find its items evicted before they are read
            if self._epoch is None or self._left() == 0:
                self._start_epoch(rb_storage, batch_size)
            assert self._epoch is not None
            ids: list[int] = []
            blobs: list[bytes] = []
            while len(ids) < batch_size and self._left() > 0:
                chunk = self._epoch[self._position : self._position + batch_size - len(ids)]
                self._position += chunk.numel()
                ids_now = chunk.tolist()
                for item_id, blob in zip(ids_now, rb_storage.buffer.records(ids_now),
                                         strict=True):
                    if blob is not None:  # else evicted since the epoch began: skipped
                        ids.append(item_id)
                        blobs.append(blob)
            if self.drop_last and self._left() < batch_size:
                self._position = self._epoch.numel()  # too few left for a batch: dropped
            end = self._left() == 0
            if ids and (not self.drop_last or len(ids) == batch_size):
                self._ran_out = end
                self._count_batches(batch_size)
                return rb_storage.keep_records(ids, blobs), {}
            self._epoch = None  # the epoch is over and left nothing to return: a new one
        raise EmptyStorageError(
            f"buffer {rb_storage.name!r}: three epochs in a row found their items evicted "
            "before they were read"
        )

    def can_sample(self, storage: Storage, batch_size: int) -> bool:
        return len(storage) >= batch_size if self.drop_last else len(storage) > 0

    @property
    def ran_out(self) -> bool:
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = bool(value)

    def _empty(self) -> None:
        self._epoch, self._position, self._ran_out = None, 0, False
        self._remaining_batches = 0
        self.len_storage = 0

    def state_dict(self) -> dict[str, Any]:
        return {"drop_last": self.drop_last, "shuffle": self.shuffle,
                "epoch": None if self._epoch is None else self._epoch.clone(),
                "position": self._position, "ran_out": self._ran_out}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.drop_last = bool(state_dict["drop_last"])
        self.shuffle = bool(state_dict.get("shuffle", self.shuffle))
        epoch = state_dict.get("epoch")
        self._epoch = None if epoch is None else torch.as_tensor(epoch, dtype=torch.long).clone()
        self._position = int(state_dict.get("position", 0))
        self._ran_out = bool(state_dict.get("ran_out", False))
        self.len_storage = 0 if self._epoch is None else self._epoch.numel()

    def dumps(self, path: Any) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        state["epoch"] = None if self._epoch is None else self._epoch.tolist()
        (path / "sampler.json").write_text(json.dumps(state))

    def loads(self, path: Any) -> None:
        self.load_state_dict(json.loads((Path(path) / "sampler.json").read_text()))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_rng"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __repr__(self) -> str:
        total = 0 if self._epoch is None else self._epoch.numel()
        done = 100.0 * self._position / total if total else 0.0
        return (f"RedisbufSamplerWithoutReplacement(drop_last={self.drop_last}, "
                f"shuffle={self.shuffle}, {done:.1f}% of the epoch sampled)")


class RedisbufPrioritizedSampler(PrioritizedSampler):
    """TorchRL's ``PrioritizedSampler`` (Schaul et al.'s PER) with the priorities on the
    server: redisbuf's :class:`~redisbuf.PERSampler` on the storage's buffer.

    Item ``i`` is drawn with probability ``(p_i + eps)^alpha / sum_j (p_j + eps)^alpha``,
    with replacement; ``priority_weight`` is ``(m_i / m_min)^-beta`` with ``m = (p +
    eps)^alpha`` and ``m_min`` over the whole buffer, as TorchRL's (but an item with
    ``p + eps`` 0 has mass 0 and ``m_min`` is over the non-zero masses: TorchRL gives it
    ``0^0 = 1`` at ``alpha=0``, and its zero ``m_min`` makes every weight 0). ``alpha``, ``eps``
    and ``initial_priority`` are the buffer's, fixed by the first process that samples it
    with PER (another value raises :class:`~redisbuf.errors.ConfigMismatchError`); ``beta`` is
    this sampler's and may change between draws.

    Differences from TorchRL's: a new item gets ``max(initial_priority, highest priority
    set since PER was turned on or the buffer cleared)`` from the server when it is
    inserted, a running max that every process's updates raise (TorchRL: the highest
    priority its process has seen). ``update_priority(index, priority)`` sends the update to the
    server, where every process's draws follow it; ids evicted meanwhile and negative
    indices (TorchRL's "skip" mark) are skipped, and so are NaN priorities:
    ``default_priority`` is NaN and means "keep the priority the server gave", which is
    how TorchRL's default-priority paths (the priorities its buffer writes at
    construction for the items already stored, ``add`` without a priority key) leave
    stored priorities unchanged. ``max_capacity`` is accepted for TorchRL's signature
    and not used (the storage's capacity applies); ``alpha`` cannot be changed once set.
    """

    def __init__(
        self,
        max_capacity: int | None = None,
        alpha: float = 0.6,
        beta: float = 0.4,
        eps: float = 1e-8,
        reduction: str = "max",
        *,
        initial_priority: float = 1.0,
    ) -> None:
        # PrioritizedSampler.__init__ builds TorchRL's C++ trees: not called on purpose
        if alpha < 0:
            raise ValueError(f"alpha must be >= 0, got {alpha}")
        if beta < 0:
            raise ValueError(f"beta must be >= 0, got {beta}")
        self._max_capacity = max_capacity
        self._alpha, self._beta, self._eps = float(alpha), float(beta), float(eps)
        self._initial_priority = float(initial_priority)
        self.reduction = reduction
        self.dtype = torch.float64
        self._max_priority_within_buffer = False
        self._device = None
        self._handle: _CoreBuffer | None = None
        self._storage: RedisbufStorage | None = None

    @property
    def alpha(self) -> float:
        return self._alpha

    @alpha.setter
    def alpha(self, value: float) -> None:
        if value != self._alpha:
            raise ValueError("alpha is the buffer's (stored on the server) and cannot change")

    @property
    def beta(self) -> float:
        return self._beta

    @beta.setter
    def beta(self, value: float) -> None:
        if value < 0:
            raise ValueError(f"beta must be >= 0, got {value}")
        self._beta = float(value)
        if self._handle is not None:
            cast(PERSampler, self._handle.sampler).beta = self._beta  # its own, made PER

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def default_priority(self) -> float:
        return math.nan

    def _bind(self, storage: RedisbufStorage) -> _CoreBuffer:
        """This sampler's PER handle on ``storage``'s buffer (opened on the storage's
        client; turning PER on for a buffer that has none gives the items present
        ``initial_priority``)."""
        if self._handle is None or self._storage is not storage:
            seed = None if storage.seed is None else storage.seed + 1
            self._handle = _CoreBuffer.open(
                storage.buffer.client, storage.name, seed=seed,
                sampler=PERSampler(alpha=self._alpha, beta=self._beta,
                                   initial_priority=self._initial_priority, eps=self._eps),
            )
            self._storage = storage
        return self._handle

    def _bound(self, storage: Any) -> _CoreBuffer:
        if storage is not None:
            return self._bind(_storage_of(storage, type(self).__name__))
        if self._handle is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a RedisbufStorage")
        return self._handle

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        handle = self._bound(storage)
        ids, info = self._storage.draw_and_keep(handle, batch_size, replacement=True)  # type: ignore[union-attr]
        weight = torch.as_tensor(np.asarray(info.weights, dtype=np.float32))
        return ids, {"priority_weight": weight}

    @torch.no_grad()
    def update_priority(
        self, index: Any, priority: Any, *, storage: Storage | None = None
    ) -> None:
        """Set the server's priorities of the items with ids ``index`` (one number, or
        one per id). Negative ids, NaN priorities and ids no longer stored are skipped;
        a negative or infinite priority raises :class:`~redisbuf.errors.InvalidBatchError` and
        changes nothing."""
        handle = self._bound(storage)
        if isinstance(index, tuple):
            raise TypeError("RedisbufStorage indices are one id per item, not tuples")
        ids = torch.as_tensor(index, dtype=torch.long).reshape(-1).cpu()
        values = torch.as_tensor(priority).detach().to("cpu", torch.float64)
        if values.numel() == 1:
            values = values.reshape(1).expand(ids.numel())
        values = values.reshape(-1)
        if values.numel() != ids.numel():
            raise InvalidBatchError(f"{values.numel()} priorities for {ids.numel()} indices")
        keep = (ids >= 0) & ~torch.isnan(values)
        if not bool(keep.any()):
            return
        handle.update_priority(ids[keep].numpy(), values[keep].numpy())

    def mark_update(self, index: Any, *, storage: Storage | None = None) -> None:
        return  # the server gives new items their priority when it inserts them

    def add(self, index: Any) -> None:
        return

    def extend(self, index: Any) -> None:
        return

    def _empty(self) -> None:
        return  # the storage's _empty clears the items and their priorities

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": self._alpha, "beta": self._beta, "eps": self._eps,
                "initial_priority": self._initial_priority}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for key in ("alpha", "eps", "initial_priority"):
            if float(state_dict[key]) != getattr(self, f"_{key}"):
                raise ConfigMismatchError(
                    f"state has {key}={state_dict[key]}, this sampler {getattr(self, f'_{key}')}"
                )
        self.beta = float(state_dict["beta"])

    def dumps(self, path: Any) -> None:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        (path / "sampler.json").write_text(json.dumps(self.state_dict()))

    def loads(self, path: Any) -> None:
        self.load_state_dict(json.loads((Path(path) / "sampler.json").read_text()))

    def __getstate__(self) -> dict[str, Any]:
        # the PER handle (a Redis client and a replica) is reopened where it is used
        state = dict(self.__dict__)
        state["_handle"] = state["_storage"] = None
        state["_rng"] = None
        return state

    def __repr__(self) -> str:
        return (f"RedisbufPrioritizedSampler(alpha={self._alpha}, beta={self._beta}, "
                f"eps={self._eps})")


# -- prioritized buffers --------------------------------------------------------------


def _prioritized_storage(storage: Any) -> RedisbufStorage:
    if not isinstance(storage, RedisbufStorage):
        raise TypeError(
            "this prioritized buffer keeps its priorities in a redisbuf buffer: pass "
            f"storage=RedisbufStorage(url, name, max_size), not {type(storage).__name__}"
        )
    return storage


class PrioritizedReplayBuffer(_TorchRLReplayBuffer):
    """TorchRL's ``PrioritizedReplayBuffer`` on a :class:`RedisbufStorage`: TorchRL's
    ``ReplayBuffer`` with a :class:`RedisbufPrioritizedSampler` (priorities on the
    server). Takes TorchRL's arguments; ``storage`` must be a RedisbufStorage."""

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        eps: float = 1e-8,
        storage: RedisbufStorage,
        reduction: str = "max",
        **kwargs: Any,
    ) -> None:
        sampler = RedisbufPrioritizedSampler(
            _prioritized_storage(storage).max_size, alpha, beta, eps, reduction
        )
        super().__init__(storage=storage, sampler=sampler, **kwargs)


class TensorDictPrioritizedReplayBuffer(_TorchRLTensorDictReplayBuffer):
    """TorchRL's ``TensorDictPrioritizedReplayBuffer`` on a :class:`RedisbufStorage`:
    samples carry ``index`` (item ids) and ``priority_weight``;
    ``update_tensordict_priority(td)`` sends ``td[priority_key]`` for ``td["index"]`` to
    the server, and ``extend`` of a TensorDict holding ``priority_key`` sets the new
    items' priorities from it. Takes TorchRL's arguments but ``sync``, ``sampler_device``
    and ``sample_unit`` (there is no process-local tree to keep in sync); ``storage``
    must be a RedisbufStorage."""

    def __init__(
        self,
        *,
        alpha: float,
        beta: float,
        priority_key: Any = "td_error",
        eps: float = 1e-8,
        storage: RedisbufStorage,
        reduction: str = "max",
        **kwargs: Any,
    ) -> None:
        sampler = RedisbufPrioritizedSampler(
            _prioritized_storage(storage).max_size, alpha, beta, eps, reduction
        )
        super().__init__(priority_key=priority_key, storage=storage, sampler=sampler, **kwargs)
