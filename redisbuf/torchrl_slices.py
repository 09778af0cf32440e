"""TorchRL's slice sampling (``SliceSampler``) on a shared redisbuf
:class:`~redisbuf.buffers.sequence.SequenceBuffer`: a thin facade, the windows are the
sequence buffer's.

::

    storage = RedisbufSliceStorage(url, "traj", 100_000, num_environments=8)
    rb = TensorDictReplayBuffer(storage=storage,
                                sampler=RedisbufSliceSampler(slice_len=16),
                                batch_size=256)
    rb.extend(collector_batch)           # batch [8, T]: environment i's T steps
    sample = rb.sample()                 # 16 slices of 16 steps, slice by slice
    sample.reshape(-1, 16)               # [num_slices, slice_len]

* A trajectory is a run of consecutive steps of one environment's stream ending with a
  step whose ``done_key`` is true (or the stream's newest step). ``traj_key`` values are
  not read.
* A slice is ``slice_len`` consecutive steps of one trajectory: it never crosses a done
  step nor two environments. Trajectories shorter than ``slice_len`` are never drawn.
* A step's index is ``env * STEP_INDEX_BASE + position`` (its environment and its
  position in that environment's stream, which only grows), the same in every process.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from ._extras import require as _require_extra
from .buffers.sequence import SequenceBuffer, unflatten_fields
from .buffers.sequence_reads import BatchInfo
from .errors import ConfigMismatchError, EmptyBufferError, InvalidBatchError

_require_extra("torch", "torchrl", "redisbuf.torchrl_slices")
_require_extra("tensordict", "torchrl", "redisbuf.torchrl_slices")
_require_extra("torchrl.data", "torchrl", "redisbuf.torchrl_slices", package="torchrl")
import torch  # noqa: E402
from tensordict import TensorDict, is_tensor_collection  # noqa: E402
from torchrl.data.replay_buffers.samplers import (  # noqa: E402
    PrioritizedSliceSampler,
    Sampler,
    SliceSampler,
    SliceSamplerWithoutReplacement,
)
from torchrl.data.replay_buffers.storages import Storage  # noqa: E402
from torchrl.data.replay_buffers.writers import TensorDictRoundRobinWriter, Writer  # noqa: E402

from .torchrl import (  # noqa: E402
    EMPTY_STORAGE_MESSAGE,
    EmptyStorageError,
    _collate_id,
    _fields_of,
    _WriterStateOnServer,
)

__all__ = [
    "STEP_INDEX_BASE",
    "RedisbufPrioritizedSliceSampler",
    "RedisbufSliceSampler",
    "RedisbufSliceSamplerWithoutReplacement",
    "RedisbufSliceStorage",
    "RedisbufSliceWriter",
]

#: a step's index is ``env * STEP_INDEX_BASE + position``
STEP_INDEX_BASE = 10**12
#: the stored field holding each step's end flag (``done_key`` reduced to one bool)
_END_FIELD = "__end__"


def _key_tuple(key: Any) -> tuple[str, ...]:
    return (key,) if isinstance(key, str) else tuple(key)


def _replace_last(key: tuple[str, ...], last: str) -> tuple[str, ...]:
    return (*key[:-1], last)


def _tensordict(data: dict[str, Any], shape: tuple[int, ...], device: torch.device) -> Any:
    data = {k: v for k, v in data.items() if k != _END_FIELD}
    return TensorDict(data, batch_size=list(shape)).to(device)


def split_index(index: Any) -> tuple[np.ndarray, np.ndarray]:
    """(environments, positions) of step indices."""
    flat = torch.as_tensor(index).reshape(-1).cpu().numpy().astype(np.int64)
    if flat.size and flat.min() < 0:
        raise InvalidBatchError("step indices are >= 0")
    return flat // STEP_INDEX_BASE, flat % STEP_INDEX_BASE


class RedisbufSliceStorage(Storage):
    """TorchRL storage of steps on the redisbuf sequence buffer ``name`` at ``url``:
    ``num_environments`` streams, each keeping its newest ``max_size // num_environments``
    steps (older ones are evicted), shared by every process that opens the name.

    ``extend`` (through :class:`RedisbufSliceWriter`, what a TorchRL buffer on this
    storage writes with) takes a TensorDict of batch ``[N, T]``: row ``i``'s ``T`` steps
    are appended, in order, to environment ``env + i``; or of batch ``[T]``: the steps are
    appended to environment ``env``. Each time step ``t`` of ``[N, T]`` is one atomic add
    (N steps). It returns the steps' indices, shaped like the batch. Nested keys become
    field names joined by ``"."`` (as :mod:`redisbuf.torchrl`); the first ``extend`` fixes
    keys, dtypes and shapes for every process. ``done_key`` must be present: a step whose
    ``done_key`` entry has any true element ends its trajectory.

    Args:
        url: a Redis URL or a ``redis.Redis`` client.
        name: the buffer's name.
        max_size: steps kept over all environments (a multiple of ``num_environments``).
        num_environments: how many streams.
        env: the environment this handle's ``extend`` writes first (its attribute
            ``env`` may be changed); ``env + N`` must not exceed ``num_environments``.
        done_key: the key marking the last step of a trajectory.
        prioritized_sampling: keep step priorities (what
            :class:`RedisbufPrioritizedSliceSampler` needs; stored with the buffer).
        seed: seeds this process's draws.
        device: where read TensorDicts are put.
        **sequence_kwargs: further arguments of
            :class:`~redisbuf.buffers.sequence.SequenceBuffer` (``initial_priority``,
            ``num_earliest_frames_ignored``, ...).

    ``len()`` is the number of steps stored by every process. ``get(index)`` reads steps
    by index (``KeyError`` for a step no longer stored); right after a draw in this
    process, the drawn steps. ``_empty()`` deletes every step for every process.
    ``state_dict()`` holds the configuration only (the steps stay on the server), and
    ``load_state_dict``, ``dumps`` and ``loads`` raise ``NotImplementedError``.
    """

    ndim = 1

    def __init__(
        self,
        url: Any,
        name: str,
        max_size: int,
        *,
        num_environments: int = 1,
        env: int = 0,
        done_key: Any = ("next", "done"),
        prioritized_sampling: bool = False,
        seed: int | None = None,
        device: Any = "cpu",
        **sequence_kwargs: Any,
    ) -> None:
        for bad in ("done_field", "step_type_field", "allow_cross_episode", "max_length"):
            if bad in sequence_kwargs:
                raise TypeError(f"RedisbufSliceStorage sets {bad!r} itself")
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size < 1:
            raise ValueError(f"max_size must be a positive integer, got {max_size!r}")
        if not isinstance(num_environments, int) or num_environments < 1:
            raise ValueError(f"num_environments must be a positive integer, got "
                             f"{num_environments!r}")
        if max_size % num_environments:
            raise ValueError(f"max_size ({max_size}) must be a multiple of num_environments "
                             f"({num_environments}): each stream keeps max_size // "
                             "num_environments steps")
        self._url, self.name, self.seed = url, name, seed
        self.num_environments = num_environments
        self.env = env
        self.done_key = _key_tuple(done_key)
        self.prioritized_sampling = bool(prioritized_sampling)
        self._kwargs = dict(sequence_kwargs)
        self.device = torch.device(device)
        super().__init__(max_size=max_size)
        self._open()
        self._pending: tuple[torch.Tensor, Any] | None = None

    def _open(self) -> None:
        self.buffer = SequenceBuffer(
            self._url, self.name, self.num_environments,
            self.max_size // self.num_environments, done_field=_END_FIELD,
            prioritized_sampling=self.prioritized_sampling, seed=self.seed, **self._kwargs)
        self.buffer.prioritized_sampling = False  # the uniform handle (see _handle)
        self._prioritized: SequenceBuffer | None = None

    def _handle(self, prioritized: bool) -> SequenceBuffer:
        """The sequence buffer drawing uniformly, or by priority."""
        if not prioritized:
            return self.buffer
        if not self.prioritized_sampling:
            raise ConfigMismatchError(
                f"buffer {self.name!r} keeps no priorities: open it with "
                "RedisbufSliceStorage(..., prioritized_sampling=True)")
        if self._prioritized is None:
            seed = None if self.seed is None else self.seed + 1
            self._prioritized = SequenceBuffer(
                self.buffer.client, self.name, self.num_environments,
                self.buffer.max_length, done_field=_END_FIELD, prioritized_sampling=True,
                seed=seed, **self._kwargs)
        return self._prioritized

    # TorchRL wiring -------------------------------------------------------------------

    def attach(self, buffer: Any) -> None:
        """Called by TorchRL's ``ReplayBuffer`` while it builds itself (torchrl 0.14's
        pending ``_init_writer`` / ``_init_sampler`` / ``_init_collate_fn``): no writer
        (or TorchRL's round-robin one) becomes :class:`RedisbufSliceWriter`; TorchRL's
        ``SliceSampler`` becomes :class:`RedisbufSliceSampler`, its
        ``SliceSamplerWithoutReplacement`` a :class:`RedisbufSliceSamplerWithoutReplacement`
        and its ``PrioritizedSliceSampler`` a :class:`RedisbufPrioritizedSliceSampler`, with
        the same arguments (those these cannot honour raise ``ValueError``); any other
        writer or sampler, and no sampler, raise ``TypeError``."""
        super().attach(buffer)
        if not hasattr(buffer, "_init_writer"):
            return
        writer = buffer._init_writer
        if writer is None or (
            isinstance(writer, functools.partial) and writer.func is TensorDictRoundRobinWriter
        ):
            buffer._init_writer = RedisbufSliceWriter()
        elif not isinstance(writer, RedisbufSliceWriter):
            raise TypeError(f"RedisbufSliceStorage is written by RedisbufSliceWriter, not "
                            f"{type(writer).__name__}")
        buffer._init_sampler = _slice_sampler(buffer._init_sampler)
        if buffer._init_collate_fn is None:
            buffer._init_collate_fn = _collate_id

    # writing --------------------------------------------------------------------------

    def extend(self, data: Any) -> torch.Tensor:
        """Append a TensorDict of batch ``[N, T]`` or ``[T]`` (see the class); the steps'
        indices, shaped like the batch."""
        if not is_tensor_collection(data) or data.batch_dims not in (1, 2):
            shape = list(data.batch_size) if is_tensor_collection(data) else type(data).__name__
            raise InvalidBatchError(f"RedisbufSliceStorage extends TensorDicts of batch [N, T] "
                                    f"(N environments) or [T] (environment env), got {shape}")
        rows = data.unsqueeze(0) if data.batch_dims == 1 else data
        n, steps = rows.batch_size
        env = self.env
        if isinstance(env, bool) or not isinstance(env, int) or env < 0 or (
                env + n > self.num_environments):
            raise InvalidBatchError(f"environments {env}..{env + n - 1} are not all in "
                                    f"[0, {self.num_environments})")
        done = rows.get(self.done_key, None)
        if done is None:
            raise InvalidBatchError(f"the data has no done_key {self.done_key!r}")
        fields = _fields_of(rows.reshape(-1))
        fields[_END_FIELD] = torch.as_tensor(done).reshape(n * steps, -1).any(-1)
        ids = np.arange(env, env + n)
        out = torch.empty((n, steps), dtype=torch.long)
        for t in range(steps):
            at = torch.arange(n) * steps + t
            step = unflatten_fields({name: value[at] for name, value in fields.items()})
            positions = self.buffer.add_batch(step, env_ids=ids)
            out[:, t] = torch.as_tensor(ids * STEP_INDEX_BASE + positions)
        self._bump_mutation_revision()
        return out.reshape(data.batch_size)

    def set(self, cursor: Any, data: Any, *, set_cursor: bool = True) -> None:
        """Not supported: steps are appended (:meth:`extend`) and never overwritten."""
        raise TypeError("RedisbufSliceStorage appends steps to streams (extend); stored "
                        "steps cannot be overwritten")

    # reading --------------------------------------------------------------------------

    def keep(self, index: torch.Tensor, batch: Any) -> None:
        """Keep a drawn batch for the ``get`` of the same index in this process."""
        self._pending = (index, batch)

    def get(self, index: Any) -> Any:
        pending, self._pending = self._pending, None
        if pending is not None:
            ids, batch = pending
            if index is ids or (isinstance(index, torch.Tensor) and index.shape == ids.shape
                                and torch.equal(index.cpu(), ids)):
                return batch
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        scalar = isinstance(index, (int, np.integer)) or (
            isinstance(index, torch.Tensor) and index.ndim == 0)
        envs, positions = split_index(index)
        batch = _tensordict(self.buffer.get_steps(envs, positions), (len(envs),),
                            self.device)
        return batch[0] if scalar else batch

    def __len__(self) -> int:
        return self.buffer.total_size

    def contains(self, item: Any) -> Any:
        found = self.buffer.contains(*split_index(item))
        if isinstance(item, torch.Tensor) and item.ndim:
            return torch.as_tensor(found).reshape(item.shape)
        return bool(found[0])

    # lifecycle ------------------------------------------------------------------------

    def _empty(self) -> None:
        self.buffer.drop()
        self._open()
        self._bump_mutation_revision()

    def state_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_size": self.max_size,
                "num_environments": self.num_environments}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        raise NotImplementedError("RedisbufSliceStorage keeps its steps on the server")

    def dumps(self, path: Any) -> None:
        raise NotImplementedError("RedisbufSliceStorage keeps its steps on the server")

    def loads(self, path: Any) -> None:
        raise NotImplementedError("RedisbufSliceStorage keeps its steps on the server")

    def __getstate__(self) -> dict[str, Any]:
        if not isinstance(self._url, str):
            raise TypeError("a RedisbufSliceStorage opened on a client object cannot be "
                            "pickled: open it with a URL")
        return {"args": (self._url, self.name, self.max_size),
                "kwargs": {"num_environments": self.num_environments, "env": self.env,
                           "done_key": self.done_key, "seed": self.seed,
                           "prioritized_sampling": self.prioritized_sampling,
                           "device": str(self.device), **self._kwargs}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        type(self).__init__(self, *state["args"], **state["kwargs"])

    def __repr__(self) -> str:
        return (f"RedisbufSliceStorage(name={self.name!r}, max_size={self.max_size}, "
                f"num_environments={self.num_environments}, len={len(self)})")


class RedisbufSliceWriter(_WriterStateOnServer, Writer):
    """TorchRL writer of a :class:`RedisbufSliceStorage`: ``extend`` is the storage's
    :meth:`~RedisbufSliceStorage.extend`; ``add`` appends one step (a TensorDict of batch
    ``[]``) to environment ``env`` and returns its index. It keeps nothing in the process."""

    def __init__(self) -> None:
        super().__init__(compilable=False)

    def register_storage(self, storage: Storage) -> None:
        if not isinstance(storage, RedisbufSliceStorage):
            raise TypeError(f"RedisbufSliceWriter writes to a RedisbufSliceStorage, not "
                            f"{type(storage).__name__}")
        super().register_storage(storage)

    def _slice_storage(self) -> RedisbufSliceStorage:
        if not isinstance(self._storage, RedisbufSliceStorage):
            raise RuntimeError("RedisbufSliceWriter has no RedisbufSliceStorage registered")
        return self._storage

    def add(self, data: Any) -> int:
        return int(self._slice_storage().extend(data.unsqueeze(0))[0])

    def extend(self, data: Any) -> torch.Tensor:
        return self._slice_storage().extend(data)


# -- samplers -----------------------------------------------------------------------------


def _slice_sampler(sampler: Any) -> Sampler:
    """The sampler a RedisbufSliceStorage samples with, for the one given to TorchRL."""
    if isinstance(sampler, RedisbufSliceSampler):
        return sampler
    if type(sampler) in (SliceSampler, PrioritizedSliceSampler):
        for name, default in (("fragmented", False), ("pad_output", False),
                              ("end_keys", None)):
            if getattr(sampler, name, default) != default:
                raise ValueError(f"RedisbufSliceSampler has no {name}")
        if any(sampler.span) or "static-stop-and-length" in sampler._cache:
            raise ValueError("RedisbufSliceSampler takes neither span, ends nor trajectories")
        args = {"num_slices": sampler.num_slices, "slice_len": sampler.slice_len,
                "end_key": sampler.end_key, "traj_key": sampler.traj_key,
                "strict_length": sampler.strict_length,
                "truncated_key": sampler.truncated_key, "init_key": sampler.init_key}
        if type(sampler) is PrioritizedSliceSampler:
            return RedisbufPrioritizedSliceSampler(alpha=sampler._alpha, beta=sampler._beta,
                                                   eps=sampler._eps, **args)
        return RedisbufSliceSampler(**args)
    if type(sampler) is SliceSamplerWithoutReplacement:
        if getattr(sampler, "end_keys", None) is not None or any(sampler.span):
            raise ValueError("RedisbufSliceSamplerWithoutReplacement takes neither end_keys "
                             "nor span")
        return RedisbufSliceSamplerWithoutReplacement(
            num_slices=sampler.num_slices, slice_len=sampler.slice_len,
            end_key=sampler.end_key, traj_key=sampler.traj_key,
            strict_length=sampler.strict_length, truncated_key=sampler.truncated_key,
            init_key=sampler.init_key, drop_last=sampler.drop_last,
            shuffle=getattr(sampler, "shuffle", True))
    raise TypeError(
        f"RedisbufSliceStorage samples with RedisbufSliceSampler (TorchRL's SliceSampler), "
        f"RedisbufSliceSamplerWithoutReplacement (SliceSamplerWithoutReplacement) or "
        f"RedisbufPrioritizedSliceSampler (PrioritizedSliceSampler), not "
        f"{type(sampler).__name__ if sampler is not None else 'no sampler'}: pass "
        "sampler=RedisbufSliceSampler(slice_len=...) or (num_slices=...)")


def _slice_storage(storage: Any, who: str) -> RedisbufSliceStorage:
    if not isinstance(storage, RedisbufSliceStorage):
        raise TypeError(f"{who} samples a RedisbufSliceStorage, not {type(storage).__name__}")
    return storage


class RedisbufSliceSampler(Sampler):
    """TorchRL's ``SliceSampler`` on a :class:`RedisbufSliceStorage`: a batch of
    ``batch_size`` steps is ``num_slices`` slices of ``slice_len`` steps (one of them given,
    the other ``batch_size //`` it), ordered slice by slice, so ``sample.reshape(num_slices,
    -1)`` has one slice per row.

    A slice is ``slice_len`` consecutive stored steps of one environment inside one
    trajectory (no step but its last has a true ``done_key``), drawn by
    :meth:`SequenceBuffer.get_batch <redisbuf.buffers.sequence.SequenceBuffer.get_batch>`:
    uniformly over all such slices, distinct within a batch while enough exist. Slices are
    drawn and read in one step: the following ``get`` returns them.

    The sample's info (set into the sample by ``TensorDictReplayBuffer``), as TorchRL's:
    ``index`` (one step index per step, see :data:`STEP_INDEX_BASE`); when
    ``truncated_key`` is not None, ``truncated_key`` true at each slice's last step, its
    ``"done"`` sibling the stored ``done`` or ``truncated``, its ``"terminated"`` sibling
    the stored one (false when not stored), each shaped ``[batch_size, 1]``; when
    ``init_key`` is not None and the steps store it, ``init_key`` the stored flags or
    true at each slice's first step.

    Args:
        num_slices: slices per batch (exclusive with ``slice_len``).
        slice_len: steps per slice (exclusive with ``num_slices``).
        end_key: ``None`` or the storage's ``done_key`` (the storage decides where
            trajectories end).
        traj_key: accepted for TorchRL's signature, not read.
        strict_length: must be True (slices are always full length; trajectories shorter
            than a slice are never drawn).
        truncated_key: where the slice ends are marked (``None``: not marked).
        init_key: where the slice starts are marked (``None``: not marked).

    Raises:
        TypeError: both or neither of ``num_slices`` and ``slice_len``.
        ValueError: ``strict_length=False``, a size that is not a positive integer.
        RuntimeError: (at sampling) a batch size not divisible by ``num_slices`` or
            ``slice_len`` (TorchRL's message); ``end_key`` not the storage's ``done_key``.
        EmptyStorageError: (at sampling) no slice to draw.
    """

    _prioritized = False

    def __init__(
        self,
        num_slices: int | None = None,
        slice_len: int | None = None,
        *,
        end_key: Any = None,
        traj_key: Any = None,
        strict_length: bool = True,
        truncated_key: Any = ("next", "truncated"),
        init_key: Any = "is_init",
    ) -> None:
        if not ((num_slices is None) ^ (slice_len is None)):
            raise TypeError(
                "Either num_slices or slice_len must be not None, and not both. "
                f"Got num_slices={num_slices} and slice_len={slice_len}.")
        size = num_slices if slice_len is None else slice_len
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"num_slices / slice_len must be a positive integer, got {size!r}")
        if not strict_length:
            raise ValueError(
                "strict_length=False is not supported: a RedisbufSliceSampler's slices are "
                "always slice_len steps of one trajectory, and trajectories shorter than "
                "that are never drawn (strict_length=True)")
        self.num_slices, self.slice_len = num_slices, slice_len
        self.end_key = None if end_key is None else _key_tuple(end_key)
        self.traj_key = traj_key
        self.strict_length = True
        self.truncated_key = None if truncated_key is None else _key_tuple(truncated_key)
        self.init_key = init_key

    def _shape(self, batch_size: int) -> tuple[int, int]:
        """(num_slices, slice_len) of a batch of ``batch_size`` steps."""
        if self.num_slices is not None:
            if batch_size % self.num_slices:
                raise RuntimeError(
                    f"The batch-size must be divisible by the number of slices, got "
                    f"batch_size={batch_size} and num_slices={self.num_slices}.")
            return self.num_slices, batch_size // self.num_slices
        assert self.slice_len is not None
        if batch_size % self.slice_len:
            raise RuntimeError(
                f"The batch-size must be divisible by the slice length, got "
                f"batch_size={batch_size} and slice_len={self.slice_len}.")
        return batch_size // self.slice_len, self.slice_len

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        store = _slice_storage(storage, type(self).__name__)
        if self.end_key is not None and self.end_key != store.done_key:
            raise RuntimeError(f"end_key {self.end_key!r} is not the storage's done_key "
                               f"{store.done_key!r}, which marks where trajectories end")
        count, length = self._shape(int(batch_size))
        data, info = self._draw(store, count, length)
        count = len(info.env_ids)  # fewer at the end of an epoch (without replacement)
        starts = info.env_ids[:, None] * STEP_INDEX_BASE + info.positions[:, None]
        index = torch.as_tensor((starts + np.arange(length)).reshape(-1))
        batch = _tensordict(data, (count, length), store.device).reshape(-1)
        store.keep(index, batch)
        out: dict[Any, Any] = {}
        if self.truncated_key is not None:
            truncated = torch.zeros((count, length, 1), dtype=torch.bool)
            truncated[:, -1] = True
            truncated = truncated.reshape(-1, 1)
            done_key = _replace_last(self.truncated_key, "done")
            terminated_key = _replace_last(self.truncated_key, "terminated")
            done = batch.get(done_key, None)
            terminated = batch.get(terminated_key, None)
            out[self.truncated_key] = truncated
            out[done_key] = truncated if done is None else done.cpu() | truncated
            out[terminated_key] = (torch.zeros_like(truncated) if terminated is None
                                   else terminated.cpu())
        if self.init_key is not None:
            stored = batch.get(self.init_key, None)
            if stored is not None:
                marks = torch.zeros_like(stored.cpu()).reshape(count, length, -1)
                marks[:, 0] = True
                out[self.init_key] = marks.reshape(stored.shape) | stored.cpu()
        self._last_info = info
        self._add_weights(out, info, length)
        return index, out

    def _draw(self, store: RedisbufSliceStorage, count: int,
              length: int) -> tuple[dict[str, Any], BatchInfo]:
        """``count`` slices of ``length`` steps: their fields (``[count, length, ...]``)
        and where they start."""
        try:
            return store._handle(self._prioritized).get_batch(count, length)
        except EmptyBufferError as error:
            if len(store) == 0:
                raise EmptyStorageError(f"{EMPTY_STORAGE_MESSAGE} (redisbuf buffer "
                                        f"{store.name!r} holds no step)") from error
            raise EmptyStorageError(f"buffer {store.name!r}: no {count} slices of {length} "
                                    f"steps to draw ({error})") from error

    def _add_weights(self, out: dict[Any, Any], info: Any, length: int) -> None:
        return

    def _empty(self) -> None:
        return

    def dumps(self, path: Any) -> None:
        return

    def loads(self, path: Any) -> None:
        return

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_slices={self.num_slices}, "
                f"slice_len={self.slice_len})")


class RedisbufPrioritizedSliceSampler(RedisbufSliceSampler):
    """:class:`RedisbufSliceSampler` drawing each slice with probability proportional to
    the stored priority of its first step (independently, with replacement), on a
    :class:`RedisbufSliceStorage` made with ``prioritized_sampling=True``.

    ``update_priority(index, priority)`` stores ``(priority + eps) ** alpha`` for each step
    index (the server's, seen by every process; steps no longer stored are skipped); a
    new step gets ``max(initial_priority, largest priority ever stored)``. The sample's
    info adds ``priority_weight`` per step: ``(m / mean_m) ** -beta`` for its slice's
    first-step stored priority ``m`` and the mean ``mean_m`` of the non-zero stored
    priorities (TorchRL divides by the least priority instead of the mean).

    Args:
        num_slices, slice_len, end_key, traj_key, strict_length, truncated_key, init_key:
            as :class:`RedisbufSliceSampler`.
        alpha: the exponent of the stored priorities (>= 0).
        beta: the exponent of ``priority_weight`` (>= 0).
        eps: added to each priority before the exponent.
    """

    _prioritized = True

    def __init__(self, num_slices: int | None = None, slice_len: int | None = None, *,
                 alpha: float = 1.0, beta: float = 0.4, eps: float = 1e-8,
                 **kwargs: Any) -> None:
        super().__init__(num_slices, slice_len, **kwargs)
        if alpha < 0 or beta < 0:
            raise ValueError(f"alpha and beta must be >= 0, got {alpha}, {beta}")
        self.alpha, self.beta, self.eps = float(alpha), float(beta), float(eps)
        self._storage: RedisbufSliceStorage | None = None

    def sample(self, storage: Storage, batch_size: int) -> tuple[torch.Tensor, dict]:
        self._storage = _slice_storage(storage, type(self).__name__)
        return super().sample(storage, batch_size)

    def _add_weights(self, out: dict[Any, Any], info: Any, length: int) -> None:
        weights = np.asarray(info.importance_weights, dtype=np.float64) ** -self.beta
        out["priority_weight"] = torch.as_tensor(np.repeat(weights, length),
                                                 dtype=torch.float32)

    @torch.no_grad()
    def update_priority(self, index: Any, priority: Any, *,
                        storage: Storage | None = None) -> None:
        """Store ``(priority + eps) ** alpha`` for the steps ``index`` (one number, or one
        per index); steps no longer stored are skipped."""
        store = self._storage if storage is None else _slice_storage(storage,
                                                                     type(self).__name__)
        if store is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a "
                               "RedisbufSliceStorage")
        if isinstance(index, tuple) and len(index) == 1:
            index = index[0]
        envs, positions = split_index(index)
        values = torch.as_tensor(priority).detach().to("cpu", torch.float64).reshape(-1)
        if values.numel() == 1:
            values = values.expand(len(envs))
        if values.numel() != len(envs):
            raise InvalidBatchError(f"{values.numel()} priorities for {len(envs)} indices")
        masses = (values.numpy() + self.eps) ** self.alpha
        store._handle(True).update_priority(envs, positions, masses)

    def mark_update(self, index: Any, *, storage: Storage | None = None) -> None:
        return

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_slices={self.num_slices}, "
                f"slice_len={self.slice_len}, alpha={self.alpha}, beta={self.beta})")


class RedisbufSliceSamplerWithoutReplacement(RedisbufSliceSampler):
    """TorchRL's ``SliceSamplerWithoutReplacement`` on a :class:`RedisbufSliceStorage`:
    epochs in which no step is drawn twice, one epoch per process.

    An epoch starts with the trajectories stored at that moment (each environment's
    stored steps cut after each step whose ``done_key`` is true), each cut into
    consecutive non-overlapping slices of ``slice_len`` steps from its first stored step
    (the steps left over, fewer than ``slice_len``, are not drawn in it). A batch takes
    ``num_slices`` of the epoch's slices not drawn yet, in a random order (``shuffle``,
    with the TorchRL buffer's ``generator=`` when it has one) or in order (environment by
    environment, oldest first), at most one per trajectory, as TorchRL's; slices evicted
    meanwhile are skipped. With fewer left, the batch is shorter (``drop_last=False``) or
    dropped (``drop_last=True``), ``ran_out`` turns True with the epoch's last batch, and
    the next ``sample()`` starts a new epoch:
    steps added during an epoch wait for the next. Each process (each sampler) runs its
    own epochs; nothing is consumed on the server. Reading the trajectories takes one
    server call per trajectory at the start of an epoch. The epoch is not part of
    ``state_dict()``.

    Args:
        num_slices, slice_len, end_key, traj_key, strict_length, truncated_key, init_key:
            as :class:`RedisbufSliceSampler`.
        drop_last: drop an epoch's last batch when it is short.
        shuffle: draw the epoch's slices in a random order (else oldest first).
    """

    def __init__(self, num_slices: int | None = None, slice_len: int | None = None, *,
                 drop_last: bool = False, shuffle: bool = True, **kwargs: Any) -> None:
        super().__init__(num_slices, slice_len, **kwargs)
        self.drop_last, self.shuffle = bool(drop_last), bool(shuffle)
        self._ran_out = False
        self._epoch: list[tuple[int, int, int]] | None = None  # (env, start, trajectory)
        self._epoch_length: int | None = None

    def _trajectories(self, store: RedisbufSliceStorage) -> list[tuple[int, int, int]]:
        """(env, first stored position, last position) of every stored trajectory."""
        buffer, found = store.buffer, []
        for env in range(store.num_environments):
            position, end = buffer.env_range(env)
            while position < end:
                last = position + int(buffer.steps_to_episode_end([position], [env])[0])
                found.append((env, position, last))
                position = last + 1
        return found

    def _new_epoch(self, store: RedisbufSliceStorage, length: int) -> None:
        slices = [(env, first + k * length, number)
                  for number, (env, first, last) in enumerate(self._trajectories(store))
                  for k in range((last - first + 1) // length)]
        if self.shuffle:
            generator = getattr(self, "_rng", None)
            order = torch.randperm(len(slices), generator=generator
                                   if isinstance(generator, torch.Generator) else None)
            slices = [slices[i] for i in order.tolist()]
        self._epoch, self._epoch_length, self._ran_out = slices, length, False

    def _take(self, store: RedisbufSliceStorage, count: int) -> list[tuple[int, int, int]]:
        """Up to ``count`` of the epoch's slices not drawn yet, at most one a trajectory,
        taken out of the epoch; slices evicted meanwhile are dropped from it."""
        assert self._epoch is not None
        while True:
            picked: list[tuple[int, int, int]] = []
            rest: list[tuple[int, int, int]] = []
            seen: set[int] = set()
            for piece in self._epoch:
                if len(picked) < count and piece[2] not in seen:
                    picked.append(piece)
                    seen.add(piece[2])
                else:
                    rest.append(piece)
            stored = store.buffer.contains(*_columns(picked))  # FIFO: the first goes first
            if stored.all():
                self._epoch = rest
                return picked
            self._epoch = [piece for piece, keep in zip(picked, stored.tolist(), strict=True)
                           if keep] + rest

    def _draw(self, store: RedisbufSliceStorage, count: int,
              length: int) -> tuple[dict[str, Any], BatchInfo]:
        if self._epoch is None or self._ran_out or self._epoch_length != length:
            self._new_epoch(store, length)
        picked = self._take(store, count)
        if not picked or (self.drop_last and len(picked) < count):
            # an epoch that evictions emptied gives way to a new one
            self._new_epoch(store, length)
            picked = self._take(store, count)
        if not picked or (self.drop_last and len(picked) < count):
            raise EmptyStorageError(f"{EMPTY_STORAGE_MESSAGE} (redisbuf buffer {store.name!r} "
                                    f"holds no slice of {length} steps)"
                                    if len(store) == 0 else
                                    f"buffer {store.name!r}: no {count} slices of {length} "
                                    "steps in a trajectory to draw")
        if not self._epoch or (self.drop_last and len({p[2] for p in self._epoch}) < count):
            self._ran_out = True
        envs, starts = _columns(picked)
        offsets = np.arange(length)
        data = store.buffer.get_steps(np.repeat(envs, length),
                                      (starts[:, None] + offsets).reshape(-1))
        return (_shaped(data, (len(picked), length)),
                BatchInfo(envs, starts, np.ones(len(picked), dtype=np.float32)))

    @property
    def ran_out(self) -> bool:
        """Whether the last batch ended this process's epoch (TorchRL's ``ran_out``)."""
        return self._ran_out

    @ran_out.setter
    def ran_out(self, value: bool) -> None:
        self._ran_out = bool(value)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(num_slices={self.num_slices}, "
                f"slice_len={self.slice_len}, drop_last={self.drop_last})")


def _columns(slices: list[tuple[int, int, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(environments, first positions) of slices ``(env, start, trajectory)``."""
    table = np.array([piece[:2] for piece in slices], dtype=np.int64).reshape(-1, 2)
    return table[:, 0], table[:, 1]


def _shaped(data: dict[str, Any], shape: tuple[int, ...]) -> dict[str, Any]:
    """A nested dict of arrays ``[prod(shape), ...]`` with the leading dimension ``shape``."""
    return {key: _shaped(value, shape) if isinstance(value, dict)
            else value.reshape(*shape, *value.shape[1:]) for key, value in data.items()}
