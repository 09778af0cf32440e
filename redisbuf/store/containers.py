"""Batch containers and how each kind splits into per-item records and joins back.

A batch is one of:

* :class:`Trajectories` -- torchgfn's layout, time-major: ``states`` (T+1, B, *state_shape),
  ``actions`` (T, B, *action_shape), ``terminating_idx`` (B,) = number of actions of each
  trajectory, optional ``log_rewards`` (B,), ``log_probs`` (T, B), ``conditions`` (B, ...).
  Trajectory ``b`` is ``states[:L+1, b]``, ``actions[:L, b]`` with ``L = terminating_idx[b]``;
  it is stored without padding and padded again (to the longest sampled one) on the way out.
* :class:`Transitions` -- one row per transition: ``states``, ``next_states``, ``actions``,
  ``is_terminating``, optional ``log_rewards``, ``log_probs``, ``conditions``.
* :class:`States` -- terminating states: ``states`` (B, *state_shape), optional
  ``log_rewards`` and ``conditions``.
* a plain ``dict`` of numpy arrays or torch tensors sharing the leading batch dimension
  (``obs``, ``action``, ``reward``, ``next_obs``, ``done``...); per-item log-rewards, if any,
  under the key ``log_rewards``.
* a ``list`` of items of any nest (:mod:`redisbuf.store.nest`), or :class:`Items` (such a
  list with one log-reward per item): the schemaless kind ``nest``; ``sample`` returns a
  list of items.

Arrays may be numpy or torch; a buffer's schema (kind, per-field dtype, trailing shape and
library) is fixed by its first batch, and ``sample`` returns the same kind of batch. A
``nest`` buffer's schema fixes only whether its items carry log-rewards.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import numpy as np

from ..errors import DecodeError, InvalidBatchError, SchemaError
from . import _torch, codec, nest
from .codec import dtype_name

if TYPE_CHECKING:
    import torch

# torch only loads where a tensor is given or asked for (see redisbuf.store._torch)
Array: TypeAlias = "np.ndarray | torch.Tensor"

# Field roles: how a field maps onto one item.
ROW = "row"  # array[b] is item b's value
STEPS = "steps"  # time-major: array[:L, b] (or [:L+1, b] for states) is item b's value


def _lib(array: Array) -> str:
    return "torch" if _torch.is_tensor(array) else "numpy"


def _as_array(value: Any, name: str) -> Array:
    if isinstance(value, np.ndarray) or _torch.is_tensor(value):
        return value
    try:
        return np.asarray(value)
    except Exception as exc:
        raise InvalidBatchError(f"field {name!r} is not an array: {exc}") from exc


def _to_numpy(array: Array) -> np.ndarray:
    if _torch.is_tensor(array):
        t = array.detach().cpu()
        if t.dtype == _torch.require().bfloat16:
            t = t.float()
        return t.numpy()
    return array


def _raw_dtype(dtype: str) -> np.dtype:
    """numpy dtype holding a field's elements (bfloat16 travels as raw uint16 words)."""
    return np.dtype("<u2") if dtype == "bfloat16" else np.dtype(dtype)


def _alloc(spec: dict[str, Any], shape: tuple[int, ...], fill: float) -> tuple[np.ndarray, Array]:
    """A new array for a field: (numpy view to write through, the array to return).

    Allocated with numpy (torch ops on small arrays pay for thread-pool wake-ups) and
    handed to torch without a copy.
    """
    dtype = _raw_dtype(spec["dtype"])
    if spec["dtype"] == "bfloat16":
        torch = _torch.require()
        fill = int(torch.tensor([fill], dtype=torch.bfloat16).view(torch.int16).item()) & 0xFFFF
    array = np.full(shape, fill, dtype=dtype)
    return array, codec.to_library(array, spec["lib"], spec["dtype"])


# Decoded values of one field across the items of a sample: one array of shape
# (n, *item_shape) (blobs of one layout, codec.decode_same_layout), the items' rows
# concatenated (codec.decode_ragged), or a list with one number or RawArray per item.
FieldValues = np.ndarray | codec.Ragged | list[Any]


def _stack_rows(values: FieldValues, spec: dict[str, Any]) -> Array:
    """One field of a batch from its decoded per-item values."""
    shape = tuple(spec["shape"])
    dtype = _raw_dtype(spec["dtype"])
    if isinstance(values, np.ndarray):
        if values.shape[1:] != shape:
            raise DecodeError(f"stored items of shape {values.shape[1:]}, schema says {shape}")
        if not shape:  # numbers: a value conversion, not a reinterpretation of bytes
            if spec["lib"] == "torch":  # a copy: values may be a view of decode's scratch
                torch = _torch.require()
                return torch.from_numpy(np.array(values)).to(getattr(torch, spec["dtype"]))
            return values.astype(np.dtype(spec["dtype"]))
        if values.dtype != dtype:
            raise DecodeError(f"stored items of dtype {values.dtype}, schema says {dtype}")
        values = np.array(values, order="C")  # the one copy out of the blobs
        return codec.to_library(values, spec["lib"], spec["dtype"])
    if isinstance(values, codec.Ragged):
        if not shape or (values.rows != shape[0]).any() or values.flat.dtype != dtype:
            raise DecodeError(f"stored items do not have the schema's shape {shape}")
        # a copy: the rows may lie in decode's scratch area
        flat = np.array(values.flat.reshape(len(values.rows), *shape))
        return codec.to_library(flat, spec["lib"], spec["dtype"])
    if not shape:
        if spec["lib"] == "torch":
            torch = _torch.require()
            return torch.tensor(values, dtype=getattr(torch, spec["dtype"]))
        return np.array(values, dtype=dtype)
    if not values:
        return _alloc(spec, (0, *shape), 0)[1]
    for value in values:
        if isinstance(value, codec.RawArray) and value.shape != shape:
            raise DecodeError(f"stored array of shape {value.shape}, schema says {shape}")
    flat = codec.concat_raw([v._replace(shape=(1, *v.shape)) for v in values], dtype, shape)
    return codec.to_library(flat, spec["lib"], spec["dtype"])


def _rows(array: np.ndarray, lead: int) -> np.ndarray:
    """A view of ``array`` with the dimensions after the first ``lead`` as one opaque
    element (numpy copies a 64-byte row as one element several times faster than as 16
    floats); ``array`` itself when they are not C-contiguous or there are none."""
    trailing = array.shape[lead:]
    if not trailing or array.size == 0 or array.dtype.hasobject:
        return array
    size = array.dtype.itemsize
    for dim, stride in zip(reversed(trailing), reversed(array.strides[lead:]), strict=True):
        if dim != 1 and stride != size:
            return array
        size *= dim
    flat = array.reshape(*array.shape[:lead], -1)  # a view: the rows are contiguous
    return flat.view(np.dtype((np.void, size)))[..., 0]


def _row_views(
    dst: np.ndarray, src: np.ndarray, src_lead: int = 2
) -> tuple[np.ndarray, np.ndarray]:
    """``_rows`` of both arrays of a copy (``dst`` time-major: two leading dimensions),
    or both arrays as they are when one has no such view."""
    dst_rows, src_rows = _rows(dst, 2), _rows(src, src_lead)
    if dst_rows.dtype != src_rows.dtype:
        return dst, src
    return dst_rows, src_rows


def _padded_steps(values: FieldValues, spec: dict[str, Any], horizon: int, fill: float) -> Array:
    """Time-major (horizon, B, *trailing) array of variable-length items, padded with
    ``fill``: one concatenation and one scatter, whatever the number of items."""
    trailing = tuple(spec["shape"])
    n = len(values)
    dtype = _raw_dtype(spec["dtype"])
    if isinstance(values, np.ndarray):  # (n, rows, *trailing), every item of one length
        if values.shape[2:] != trailing or values.dtype != dtype or values.shape[1] > horizon:
            raise DecodeError(f"stored items of shape {values.shape[1:]} do not fit {trailing}")
        if values.shape[1] == horizon:  # nothing to pad: one transposing copy
            time_major = np.empty((horizon, n, *trailing), dtype=values.dtype)
            dst, src = _row_views(time_major, values)
            dst[...] = src.swapaxes(0, 1)
            return codec.to_library(time_major, spec["lib"], spec["dtype"])
        view, out = _alloc(spec, (horizon, n, *trailing), fill)
        dst, src = _row_views(view, values)
        dst[: values.shape[1]] = src.swapaxes(0, 1)
        return out
    if isinstance(values, codec.Ragged):
        if values.flat.shape[1:] != trailing or values.flat.dtype != dtype:
            shape = values.flat.shape[1:]
            raise DecodeError(f"stored items of shape {shape} do not fit {trailing}")
        flat: np.ndarray | None = values.flat
        rows = values.rows
        n = len(rows)
    else:
        flat = codec.concat_raw(values, dtype, trailing) if values else None
        rows = np.array([v.shape[0] for v in values], dtype=np.int64)
    view, out = _alloc(spec, (horizon, n, *trailing), fill)
    if n == 0:
        return out
    assert flat is not None  # None only for no items
    if rows.max(initial=0) > horizon:
        raise DecodeError(f"stored item has {rows.max()} steps, more than {horizon}")
    item_of_row = np.repeat(np.arange(n), rows)
    starts = np.cumsum(rows) - rows
    step_of_row = np.arange(len(flat)) - np.repeat(starts, rows)
    # one scatter of whole rows, by flat position in the (horizon, n) grid
    dst, src = _row_views(view, flat, 1)
    if dst is view:
        view[step_of_row, item_of_row] = flat
    else:
        dst.reshape(-1)[step_of_row * n + item_of_row] = src
    return out


def _field_spec(array: Array, trailing: tuple[int, ...]) -> dict[str, Any]:
    return {"dtype": dtype_name(array), "shape": list(trailing), "lib": _lib(array)}


def _column(name: str, array: Array, lengths: np.ndarray | None = None) -> codec.Column:
    try:
        return codec.Column(name, array, lengths)
    except TypeError as exc:
        raise SchemaError(f"field {name!r}: {exc}") from None


def _batch_major(array: Array) -> Array:
    """(T, B, ...) -> (B, T, ...), contiguous: item b's steps become one run of bytes."""
    if _torch.is_tensor(array):
        return array.detach().cpu().transpose(0, 1).contiguous()
    return np.ascontiguousarray(np.swapaxes(array, 0, 1))


class ContainerKind:
    """How one kind of batch is split into items and joined back.

    ``split`` validates a batch and returns its columns (one per field, ready for
    :func:`redisbuf.store.codec.encode_columns`), the per-item log-rewards (float64; 0.0 where
    the batch has none) and the batch's schema. ``join`` rebuilds a batch of ``n`` items
    from decoded field values (see ``FieldValues``) and the stored schema.
    """

    name: ClassVar[str]

    def split(self, batch: Any) -> tuple[list[codec.Column], np.ndarray, dict[str, Any]]:
        raise NotImplementedError

    def join(self, fields: Mapping[str, FieldValues], n: int, schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def encode(self, batch: Any) -> tuple[list[bytes], np.ndarray, dict[str, Any]]:
        """(one record per item, the items' log-rewards, the schema) of a batch."""
        columns, log_rewards, schema = self.split(batch)
        return codec.encode_columns(columns, len(log_rewards)), log_rewards, schema

    def schema(self, batch: Any) -> dict[str, Any]:
        """The schema of a batch, which is checked as :meth:`split` checks it."""
        return self.split(batch)[2]


class RecordKind(ContainerKind):
    """A kind whose records decode one by one into whole items (no fields to gather):
    ``join_records`` makes the batch of the blobs."""

    def join_records(self, blobs: list[bytes]) -> Any:
        raise NotImplementedError


def _log_rewards(value: Array | None, n: int, name: str = "log_rewards") -> np.ndarray:
    if value is None:
        return np.zeros(n, dtype=np.float64)
    arr = _to_numpy(value).astype(np.float64, copy=False).reshape(-1)
    if arr.shape[0] != n:
        raise InvalidBatchError(f"{name} has {arr.shape[0]} entries for a batch of {n} items")
    if np.isnan(arr).any():
        bad = np.flatnonzero(np.isnan(arr))[:5].tolist()
        raise InvalidBatchError(f"{name} contains NaN (items {bad})")
    return arr


class _RowKind(ContainerKind):
    """Kinds whose every field is one row per item (Transitions, States, dicts)."""

    required: ClassVar[tuple[str, ...]] = ()
    optional: ClassVar[tuple[str, ...]] = ()

    def _fields_of(self, batch: Any) -> dict[str, Array]:
        raise NotImplementedError

    def _make(self, arrays: dict[str, Array], schema: dict[str, Any]) -> Any:
        raise NotImplementedError

    def split(self, batch: Any) -> tuple[list[codec.Column], np.ndarray, dict[str, Any]]:
        arrays = self._fields_of(batch)
        for name in self.required:
            if arrays.get(name) is None:
                raise InvalidBatchError(f"{self.name} batch is missing field {name!r}")
        arrays = {k: _as_array(v, k) for k, v in arrays.items() if v is not None}
        if not arrays:
            raise InvalidBatchError("batch has no fields")
        sizes = {k: (v.shape[0] if v.ndim else None) for k, v in arrays.items()}
        if None in sizes.values():
            scalar = [k for k, s in sizes.items() if s is None]
            raise InvalidBatchError(f"fields {scalar} have no leading batch dimension")
        if len(set(sizes.values())) != 1:
            raise InvalidBatchError(f"fields disagree on the batch size: {sizes}")
        n = next(iter(sizes.values()))
        assert n is not None  # a field without a batch dimension was refused above
        log_rewards = _log_rewards(arrays.get("log_rewards"), n)
        schema = {
            "kind": self.name,
            "fields": {k: _field_spec(v, tuple(v.shape[1:])) for k, v in sorted(arrays.items())},
        }
        columns = [_column(k, arrays[k]) for k in sorted(arrays)]
        return columns, log_rewards, schema

    def join(self, fields: Mapping[str, FieldValues], n: int, schema: dict[str, Any]) -> Any:
        out = {name: _stack_rows(fields[name], spec) for name, spec in schema["fields"].items()}
        return self._make(out, schema)


@dataclass
class States:
    """Terminating states: ``states`` (B, *state_shape), optional ``log_rewards`` (B,)
    and ``conditions`` (B, *condition_shape).

    Attributes:
        states: the states, one row per item.
        log_rewards: one log-reward per item, or ``None``.
        conditions: one condition per item, or ``None``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer, States
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> _ = buffer.add(States(np.array([[1.0, 2.0], [3.0, 4.0]]), np.zeros(2)))
        >>> buffer.get([2])
        States(states=array([[3., 4.]]), log_rewards=array([0.]), conditions=None)
    """

    states: Array
    log_rewards: Array | None = None
    conditions: Array | None = None

    def __len__(self) -> int:
        return int(self.states.shape[0])


@dataclass
class Transitions:
    """One row per transition ``states -> next_states`` via ``actions``.

    Attributes:
        states: the states the transitions leave (B, *state_shape).
        next_states: the states they reach (B, *state_shape).
        actions: the actions taken (B, *action_shape).
        is_terminating: whether each next state is the sink (B,).
        log_rewards: one log-reward per transition, or ``None``.
        log_probs: one log-probability per transition, or ``None``.
        conditions: one condition per transition, or ``None``.

    Examples:
        >>> import numpy as np
        >>> from redisbuf import Transitions
        >>> batch = Transitions(states=np.array([[0.0], [1.0]]),
        ...                     next_states=np.array([[1.0], [-1.0]]), actions=np.array([0, 1]),
        ...                     is_terminating=np.array([False, True]))
        >>> len(batch), batch.terminating_states.tolist()
        (2, [[1.0]])
    """

    states: Array
    next_states: Array
    actions: Array
    is_terminating: Array
    log_rewards: Array | None = None
    log_probs: Array | None = None
    conditions: Array | None = None

    def __len__(self) -> int:
        return int(self.states.shape[0])

    @property
    def terminating_states(self) -> Array:
        """``states`` of the terminating transitions (those whose next state is the sink),
        as torchgfn's ``Transitions.terminating_states``."""
        mask = self.is_terminating
        return self.states[mask if _torch.is_tensor(mask) else np.asarray(mask)]


@dataclass
class Trajectories:
    """Variable-length trajectories in torchgfn's time-major layout.

    ``states`` (T+1, B, *state_shape), ``actions`` (T, B, *action_shape),
    ``terminating_idx`` (B,): trajectory ``b`` took ``L = terminating_idx[b]`` actions,
    its states are ``states[:L+1, b]`` and its actions ``actions[:L, b]``; the rest is
    padding (``states_pad_value`` / ``actions_pad_value`` / 0 for ``log_probs``).

    Attributes:
        states: as above.
        actions: as above.
        terminating_idx: as above.
        log_rewards: one log-reward per trajectory (B,), or ``None``.
        log_probs: per-action log-probabilities (T, B), or ``None``.
        conditions: one condition per trajectory, or ``None``.
        states_pad_value: the value of padded states.
        actions_pad_value: the value of padded actions.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer, Trajectories
        >>> batch = Trajectories(  # trajectory 0 took 1 action, trajectory 1 took 2
        ...     states=np.arange(6.0).reshape(3, 2, 1), actions=np.array([[0, 1], [-1, 0]]),
        ...     terminating_idx=np.array([1, 2]), log_rewards=np.array([0.0, 1.0]))
        >>> len(batch), batch.max_length, batch.terminating_states.ravel().tolist()
        (2, 2, [0.0, 3.0])
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> buffer.add(batch).ids.tolist(), buffer.get([2]).terminating_idx.tolist()
        ([1, 2], [2])
    """

    states: Array
    actions: Array
    terminating_idx: Array
    log_rewards: Array | None = None
    log_probs: Array | None = None
    conditions: Array | None = None
    states_pad_value: float = 0.0
    actions_pad_value: float = -1.0

    def __len__(self) -> int:
        return int(self.states.shape[1])

    @property
    def max_length(self) -> int:
        """``T``, the number of action steps (``actions.shape[0]``)."""
        return int(self.actions.shape[0])

    @property
    def terminating_states(self) -> Array:
        """The last state before the sink: ``states[L-1, b]`` for each trajectory."""
        idx = self.terminating_idx
        if _torch.is_tensor(self.states):
            torch = _torch.require()
            rows = torch.as_tensor(idx, dtype=torch.long) - 1
            return self.states[rows, torch.arange(len(self))]
        return self.states[np.asarray(idx) - 1, np.arange(len(self))]


class _DataclassKind(_RowKind):
    """A row kind whose batches are instances of the dataclass ``container``."""

    container: ClassVar[type]

    def _fields_of(self, batch: Any) -> dict[str, Array]:
        return {f.name: getattr(batch, f.name) for f in fields(self.container)}

    def _make(self, arrays: dict[str, Array], schema: dict[str, Any]) -> Any:
        return self.container(**arrays)


class StatesKind(_DataclassKind):
    name = "states"
    container = States
    required = ("states",)


class TransitionsKind(_DataclassKind):
    name = "transitions"
    container = Transitions
    required = ("states", "next_states", "actions", "is_terminating")


class DictKind(_RowKind):
    name = "dict"

    def _fields_of(self, batch: Mapping[str, Array]) -> dict[str, Array]:
        bad = [k for k in batch if not isinstance(k, str)]
        if bad:
            raise InvalidBatchError(f"dict batch keys must be strings, got {bad!r}")
        return dict(batch)

    def _make(self, arrays: dict[str, Array], schema: dict[str, Any]) -> dict[str, Array]:
        return arrays


class TrajectoriesKind(ContainerKind):
    name = "trajectories"

    def split(self, batch: Trajectories) -> tuple[list[codec.Column], np.ndarray, dict[str, Any]]:
        states = _as_array(batch.states, "states")
        actions = _as_array(batch.actions, "actions")
        if states.ndim < 2 or actions.ndim < 2:
            raise InvalidBatchError(
                "trajectories need states (T+1, B, ...) and actions (T, B, ...), got shapes "
                f"{tuple(states.shape)} and {tuple(actions.shape)}"
            )
        n = int(states.shape[1])
        horizon = int(actions.shape[0])
        if states.shape[0] != horizon + 1 or actions.shape[1] != n:
            raise InvalidBatchError(
                f"states {tuple(states.shape)} and actions {tuple(actions.shape)} disagree: "
                "expected states (T+1, B, ...) and actions (T, B, ...)"
            )
        lengths = _to_numpy(_as_array(batch.terminating_idx, "terminating_idx")).reshape(-1)
        if lengths.shape[0] != n or not np.issubdtype(lengths.dtype, np.integer):
            raise InvalidBatchError(
                f"terminating_idx must hold {n} integers, got {lengths.dtype} {lengths.shape}"
            )
        if n and (lengths.min() < 0 or lengths.max() > horizon):
            raise InvalidBatchError(f"terminating_idx must lie in [0, {horizon}]")
        log_rewards = _log_rewards(batch.log_rewards, n)
        log_probs = batch.log_probs
        if log_probs is not None:
            log_probs = _as_array(log_probs, "log_probs")
            if tuple(log_probs.shape[:2]) != (horizon, n):
                raise InvalidBatchError(
                    f"log_probs must be (T, B) = ({horizon}, {n}), got {tuple(log_probs.shape)}"
                )
        conditions = batch.conditions
        if conditions is not None:
            conditions = _as_array(conditions, "conditions")
            if conditions.ndim == 0 or conditions.shape[0] != n:
                raise InvalidBatchError(f"conditions must have a leading dimension of {n}")
        spec: dict[str, Any] = {
            "states": _field_spec(states, tuple(states.shape[2:])),
            "actions": _field_spec(actions, tuple(actions.shape[2:])),
        }
        if log_probs is not None:
            spec["log_probs"] = _field_spec(log_probs, tuple(log_probs.shape[2:]))
        if conditions is not None:
            spec["conditions"] = _field_spec(conditions, tuple(conditions.shape[1:]))
        if batch.log_rewards is not None:
            spec["log_rewards"] = _field_spec(_as_array(batch.log_rewards, "log_rewards"), ())
        schema = {
            "kind": self.name,
            "fields": spec,
            "pad": {
                "states": float(batch.states_pad_value),
                "actions": float(batch.actions_pad_value),
            },
        }
        columns = [
            _column("states", _batch_major(states), lengths + 1),
            _column("actions", _batch_major(actions), lengths),
        ]
        if log_probs is not None:
            columns.append(_column("log_probs", _batch_major(log_probs), lengths))
        if conditions is not None:
            columns.append(_column("conditions", conditions))
        if "log_rewards" in spec:
            columns.append(_column("log_rewards", log_rewards))
        return columns, log_rewards, schema

    def join(
        self, fields: Mapping[str, FieldValues], n: int, schema: dict[str, Any]
    ) -> Trajectories:
        spec = schema["fields"]
        pads = schema.get("pad", {})
        actions = fields["actions"]
        if isinstance(actions, np.ndarray):
            lengths = [int(actions.shape[1])] * n
        elif isinstance(actions, codec.Ragged):
            lengths = actions.rows.tolist()
        else:
            lengths = [int(value.shape[0]) for value in actions]
        horizon = max(lengths, default=0)

        def padded(name: str, extra: int, fill: float) -> Array:
            return _padded_steps(fields[name], spec[name], horizon + extra, fill)

        out = Trajectories(
            states=padded("states", 1, pads.get("states", 0.0)),
            actions=padded("actions", 0, pads.get("actions", -1.0)),
            terminating_idx=codec.to_library(
                np.array(lengths, dtype=np.int64), spec["states"]["lib"], "int64"
            ),
            states_pad_value=pads.get("states", 0.0),
            actions_pad_value=pads.get("actions", -1.0),
        )
        if "log_probs" in spec:
            out.log_probs = padded("log_probs", 0, 0.0)
        if "conditions" in spec:
            out.conditions = _stack_rows(fields["conditions"], spec["conditions"])
        if "log_rewards" in spec:
            out.log_rewards = _stack_rows(fields["log_rewards"], spec["log_rewards"])
        return out


@dataclass
class Items:
    """Items of any nest (see :mod:`redisbuf.store.nest`) with one log-reward each, for a
    schemaless buffer that ranks items by log-reward; a plain ``list`` is the same
    without log-rewards (each 0). A buffer's first add fixes which of the two it holds.

    Attributes:
        items: the items.
        log_rewards: one log-reward per item (not NaN), or ``None``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import Items, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", prioritized_capacity=True,
        ...                       capacity=2)
        >>> _ = buffer.add(Items([{"a": 1}, ("b",), None], log_rewards=[0.0, 2.0, 1.0]))
        >>> buffer.get([2, 3])
        [('b',), None]
    """

    items: list[Any]
    log_rewards: Any = None

    def __len__(self) -> int:
        return len(self.items)


_NEST_REWARD_FIELD = {"dtype": "float64", "lib": "numpy", "shape": []}


class NestKind(RecordKind):
    """A ``list`` of items (or :class:`Items`), each stored whole by the nest codec."""

    name = "nest"

    def encode(self, batch: Any) -> tuple[list[bytes], np.ndarray, dict[str, Any]]:
        items, rewards = (batch.items, batch.log_rewards) if isinstance(batch, Items) else (
            batch, None)
        if not isinstance(items, list):
            raise InvalidBatchError(
                f"a nest batch is a list of items, got {type(items).__name__}")
        if rewards is not None:
            rewards = _as_array(rewards, "log_rewards")
        log_rewards = _log_rewards(rewards, len(items))
        return nest.encode_items(items), log_rewards, self.schema(batch)

    def schema(self, batch: Any) -> dict[str, Any]:
        has_rewards = isinstance(batch, Items) and batch.log_rewards is not None
        fields = {"log_rewards": dict(_NEST_REWARD_FIELD)} if has_rewards else {}
        return {"kind": self.name, "fields": fields}

    def split(self, batch: Any) -> tuple[list[codec.Column], np.ndarray, dict[str, Any]]:
        raise TypeError("nest batches have no columns: use encode")

    def join(self, fields: Mapping[str, FieldValues], n: int, schema: dict[str, Any]) -> Any:
        raise TypeError("nest records are joined whole: use join_records")

    def join_records(self, blobs: list[bytes]) -> list[Any]:
        out = []
        for blob in blobs:
            if blob is None:
                raise DecodeError("no such item")
            out.append(nest.decode_nest(blob))
        return out


KINDS: dict[str, ContainerKind] = {
    kind.name: kind
    for kind in (TrajectoriesKind(), TransitionsKind(), StatesKind(), DictKind(), NestKind())
}


def kind_of(batch: Any) -> ContainerKind:
    """The :class:`ContainerKind` that handles ``batch``'s type."""
    if isinstance(batch, Trajectories):
        return KINDS["trajectories"]
    if isinstance(batch, Transitions):
        return KINDS["transitions"]
    if isinstance(batch, States):
        return KINDS["states"]
    if isinstance(batch, Mapping):
        return KINDS["dict"]
    if isinstance(batch, (list, Items)):
        return KINDS["nest"]
    raise SchemaError(
        f"unsupported batch type {type(batch).__name__}: use Trajectories, Transitions, "
        "States, a dict of arrays or a list of items (any nest)"
    )


def schema_to_json(schema: dict[str, Any]) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))


def describe_schema_difference(stored: dict[str, Any], given: dict[str, Any]) -> str:
    """A short human sentence naming how ``given`` differs from ``stored``."""
    if stored.get("kind") != given.get("kind"):
        return f"buffer holds {stored.get('kind')}, batch is {given.get('kind')}"
    parts = []
    s_fields, g_fields = stored.get("fields", {}), given.get("fields", {})
    for name in sorted(set(s_fields) | set(g_fields)):
        if name not in g_fields:
            parts.append(f"field {name!r} missing from batch")
        elif name not in s_fields:
            parts.append(f"field {name!r} not in buffer schema")
        elif s_fields[name] != g_fields[name]:
            s, g = s_fields[name], g_fields[name]
            if not (isinstance(s, dict) and isinstance(g, dict)):  # e.g. a corrupt file
                parts.append(f"field {name!r}: {s!r} expected, got {g!r}")
                continue
            diffs = [
                f"{key} {s.get(key)!r} expected, got {g.get(key)!r}"
                for key in ("dtype", "shape", "lib")
                if s.get(key) != g.get(key)
            ]
            parts.append(f"field {name!r}: " + (", ".join(diffs) or "differs"))
    if stored.get("pad") != given.get("pad"):
        parts.append(f"padding values {stored.get('pad')} expected, got {given.get('pad')}")
    return "; ".join(parts) or "schemas differ"
