"""Reverb's ``StructuredWriter`` (``reverb.structured_writer``, ``reverb.structured``):
items made from static patterns over the last steps, when conditions hold.

A config names a table, a pattern (a nest of :class:`PatternNode`: a column of the step
and which of its last cells, ``ref[-1]`` one cell, ``ref[-3:]`` the last three), a
priority (a constant or the TD error of a column) and conditions on the step index, the
steps since the config was last applied, the history's length, the episode's end, or a
scalar of the step. After each append (and at ``end_episode``) every config whose
conditions hold, and whose cells all exist, makes one item (at most one per step); the
items go through a :class:`~redisbuf.buffers.step_writer.StepWriter`, so their steps are
stored once.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Sequence
from typing import Any

from ..buffers.step_writer import StepWriter
from ..buffers.steps import StepStore
from ..errors import WaitTimeoutError
from . import errors, nest
from .reverb_types import Message
from .tensor_spec import make_spec, numpy_dtype


class PatternNode(Message):
    """One column of a pattern: the cells of source column ``flat_source_index``; with
    ``start`` (< 0) the slice ``[start:stop:step]`` of its history, else the one cell
    ``[stop]`` (< 0)."""

    flat_source_index: int
    start: int
    stop: int
    step: int
    _defaults = {"flat_source_index": 0, "start": None, "stop": None, "step": None}

    def __init__(self, **fields: Any) -> None:
        super().__init__(**{k: v for k, v in fields.items() if v is not None})
        for name in ("start", "stop", "step"):
            if getattr(self, name) is None:
                object.__setattr__(self, name, 0)


class ModEq(Message):
    mod: int
    eq: int
    _defaults = {"mod": 0, "eq": 0}


class ConditionProto(Message):
    """A condition: ``left`` (one of ``step_index``, ``steps_since_applied``,
    ``buffer_length``, ``is_end_episode``, ``flat_source_index``) compared by ``eq``,
    ``ge`` or ``mod_eq``; ``inverse`` negates it."""

    step_index: bool
    steps_since_applied: bool
    buffer_length: bool
    is_end_episode: bool
    flat_source_index: int
    eq: int
    ge: int
    mod_eq: ModEq
    inverse: bool
    _defaults = {"step_index": False, "steps_since_applied": False, "buffer_length": False,
                 "is_end_episode": False, "flat_source_index": 0, "eq": 0, "ge": 0,
                 "mod_eq": ModEq, "inverse": False}
    _oneof = ()

    def left(self) -> str:
        for name in ("step_index", "steps_since_applied", "buffer_length", "is_end_episode"):
            if getattr(self, name):
                return name
        if self.HasField("flat_source_index"):
            return "flat_source_index"
        return ""

    def cmp(self) -> str:
        if self.HasField("mod_eq"):
            return "mod_eq"
        if self.HasField("ge"):
            return "ge"
        if self.HasField("eq") or self.is_end_episode:
            return "eq"
        return ""


class Priority(Message):
    """How an item's priority is computed: ``constant_fn`` (its ``value``) or
    ``td_error`` (``max_priority_weight``, ``flat_source_index``)."""

    class ConstantPriorityFn(Message):
        value: float
        _defaults = {"value": 0.0}

    class TDError(Message):
        max_priority_weight: float
        flat_source_index: int
        _defaults = {"max_priority_weight": 0.0, "flat_source_index": 0}

    constant_fn: ConstantPriorityFn
    td_error: TDError
    _defaults = {"constant_fn": ConstantPriorityFn, "td_error": TDError}
    _oneof = ("constant_fn", "td_error")

    def has_td_error(self) -> bool:
        return self.HasField("td_error")


class StructuredWriterConfig(Message):
    """A config: ``flat`` pattern nodes, ``pattern_structure`` (their nest), ``table``,
    ``priority``, ``conditions``."""

    flat: list[PatternNode]
    pattern_structure: Any
    table: str
    priority: Priority
    conditions: list[ConditionProto]
    _defaults = {"flat": list, "pattern_structure": None, "table": "",
                 "priority": Priority, "conditions": list}

    def __init__(self, **fields: Any) -> None:
        if "flat" in fields:
            fields["flat"] = list(fields["flat"])
        if "conditions" in fields:
            fields["conditions"] = list(fields["conditions"])
        super().__init__(**fields)

    def SerializeToString(self) -> bytes:  # noqa: N802 - the protocol buffers' name
        """The config as JSON bytes."""
        return json.dumps(repr(self)).encode()


Config = StructuredWriterConfig


class _RefNode:
    """A source column of a reference step: indexing it makes a :class:`PatternNode`."""

    def __init__(self, index: int) -> None:
        self._index = index

    def __getitem__(self, key: Any) -> PatternNode:
        if isinstance(key, int):
            key = slice(key)  # one cell: stop alone
        elif not isinstance(key, slice):
            raise ValueError(f"Key must be int or slice by got {key} (type {type(key)}).")
        return PatternNode(flat_source_index=self._index, start=key.start, stop=key.stop,
                           step=key.step)


def create_reference_step(step_structure: Any) -> Any:
    """The structure of a step with each leaf a reference column (index it to make a
    pattern node: ``ref['obs'][-2:]``)."""
    count = len(nest.flatten(step_structure))
    return nest.unflatten_as(step_structure, [_RefNode(i) for i in range(count)])


def pattern_from_transform(step_structure: Any, transform: Callable[[Any], Any]) -> Any:
    """The pattern ``transform`` makes of the reference step of ``step_structure``."""
    return transform(create_reference_step(step_structure))


def create_config(pattern: Any, table: str, conditions: Sequence[ConditionProto] = (),
                  priority: Priority | None = None) -> StructuredWriterConfig:
    """A config inserting ``pattern`` into ``table`` when ``conditions`` hold (priority
    1.0 unless given)."""
    structure = nest.map_structure(lambda _: None, pattern)
    return StructuredWriterConfig(
        flat=nest.flatten(pattern), pattern_structure=structure, table=table,
        priority=priority if priority is not None else constant_priority_fn(1.0),
        conditions=list(conditions))


def unpack_pattern(config: StructuredWriterConfig) -> Any:
    """The pattern of ``config`` in its structure."""
    if not config.HasField("pattern_structure"):
        return config.flat
    return nest.unflatten_as(config.pattern_structure, config.flat)


def infer_signature(configs: Sequence[StructuredWriterConfig], step_spec: Any) -> Any:
    """The signature of the items ``configs`` make of steps like ``step_spec``.

    Raises:
        ValueError: no config, configs of other structures or tables, or trajectories
            whose columns cannot share a spec (dtype, rank, trailing shape).
    """
    if not configs:
        raise ValueError("At least one config must be provided.")
    if any(c.pattern_structure != configs[0].pattern_structure for c in configs):
        raise ValueError("All configs must have exactly the same pattern_structure.")
    if any(c.table != configs[0].table for c in configs):
        raise ValueError(f"All configs must target the same table but provided configs "
                         f"included {', '.join(sorted({c.table for c in configs}))}.")
    flat_spec = nest.flatten(step_spec)

    def spec(path: tuple[Any, ...], *nodes: PatternNode) -> Any:
        dtypes = [numpy_dtype(flat_spec[node.flat_source_index].dtype) for node in nodes]
        if any(dtype != dtypes[0] for dtype in dtypes):
            raise ValueError(f"Configs produce trajectories with multiple dtypes at {path}. "
                             f"Got {dtypes}.")
        shapes = []
        for node in nodes:
            shape = list(flat_spec[node.flat_source_index].shape)
            if node.HasField("start"):
                shape = [(node.stop - node.start) // (node.step or 1), *shape]
            shapes.append(tuple(shape))
        if any(len(s) != len(shapes[0]) for s in shapes) or (
                len(shapes[0]) > 1 and any(s[1:] != shapes[0][1:] for s in shapes)):
            raise ValueError(f"Configs produce trajectories with incompatible shapes at "
                             f"{path}. Got {shapes}.")
        merged = shapes[0] if all(s == shapes[0] for s in shapes) else (None, *shapes[0][1:])
        return make_spec(list(merged), dtypes[0], "/".join(str(x) for x in path))

    patterns = [unpack_pattern(config) for config in configs]
    return nest.map_structure_with_path(spec, *patterns)


class _ConditionBuilder:
    def __init__(self, left: dict[str, Any], mod: int | None = None) -> None:
        self._left, self._mod = left, mod

    def _make(self, **cmp: Any) -> ConditionProto:
        return ConditionProto(**self._left, **cmp)

    def _equal(self, value: int, inverse: bool) -> ConditionProto:
        extra = {"inverse": True} if inverse else {}
        if self._mod:
            return self._make(mod_eq=ModEq(mod=self._mod, eq=value), **extra)
        return self._make(eq=value, **extra)

    def __mod__(self, mod: int) -> _ConditionBuilder:
        return _ConditionBuilder(self._left, mod)

    def __eq__(self, value: int) -> ConditionProto:  # type: ignore[override]
        return self._equal(value, inverse=False)

    def __ne__(self, value: int) -> ConditionProto:  # type: ignore[override]
        return self._equal(value, inverse=True)

    def __ge__(self, value: int) -> ConditionProto:
        return self._make(ge=value)

    def __gt__(self, value: int) -> ConditionProto:
        return self >= value + 1

    def __lt__(self, value: int) -> ConditionProto:
        return self <= value - 1

    def __le__(self, value: int) -> ConditionProto:
        return self._make(ge=value + 1, inverse=True)

    __hash__ = None  # type: ignore[assignment]


class Condition:
    """The conditions a config may require."""

    @staticmethod
    def step_index() -> _ConditionBuilder:
        """The index, in its episode, of the step appended last (0 first)."""
        return _ConditionBuilder({"step_index": True})

    @staticmethod
    def steps_since_applied() -> _ConditionBuilder:
        """The steps appended since the config last made an item."""
        return _ConditionBuilder({"steps_since_applied": True})

    @staticmethod
    def is_end_episode() -> ConditionProto:
        """True only when ``end_episode`` is called."""
        return ConditionProto(is_end_episode=True, eq=1)

    @staticmethod
    def data(step_structure: Any) -> Any:
        """The step's scalar ints or bools, by the step's structure."""
        count = len(nest.flatten(step_structure))
        return nest.unflatten_as(step_structure, [
            _ConditionBuilder({"flat_source_index": i}) for i in range(count)])


def constant_priority_fn(value: float) -> Priority:
    """A priority of ``value`` for every item."""
    return Priority(constant_fn=Priority.ConstantPriorityFn(value=value))


def td_error(max_priority_weight: float, step_structure: Any,
             get_field_from_step_fn: Callable[[Any], Any]) -> Priority:
    """The TD-error priority of the column ``get_field_from_step_fn`` picks:
    ``w * max|e| + (1 - w) * mean|e|`` over the item's cells of that column."""
    count = len(nest.flatten(step_structure))
    index = get_field_from_step_fn(nest.unflatten_as(step_structure, list(range(count))))
    return Priority(td_error=Priority.TDError(max_priority_weight=max_priority_weight,
                                              flat_source_index=index))


def _max_age(node: PatternNode) -> int:
    return abs(node.start if node.HasField("start") else node.stop)


def _check_config(index: int, config: StructuredWriterConfig) -> None:
    def bad(message: str) -> ValueError:
        return ValueError(f"Invalid configuration at position {index}: {message}")

    if not config.flat:
        raise bad("`flat` must not be empty.")
    if not config.table:
        raise bad("`table` must not be empty.")
    for node in config.flat:
        has_start, has_stop = node.HasField("start"), node.HasField("stop")
        if node.flat_source_index < 0:
            raise bad(f"`flat_source_index` must be >= 0 but got {node.flat_source_index}.")
        if not has_start and not has_stop:
            raise bad("At least one of `start` and `stop` must be specified.")
        if has_start and node.start >= 0:
            raise bad(f"`start` must be < 0 but got {node.start}.")
        if has_stop and node.stop > 0:
            raise bad(f"`stop` must be <= 0 but got {node.stop}.")
        if has_start and has_stop and node.start >= node.stop:
            raise bad(f"`stop` ({node.stop}) must be > `start` ({node.start}) when both are "
                      "specified.")
        if has_stop and not has_start and node.stop == 0:
            raise bad(f"`stop` must be < 0 when `start` isn't set but got {node.stop}.")
        if node.HasField("step") and (not has_start or node.step <= 0):
            raise bad("`step` must only be set when `start` is set, and be > 0.")
    for condition in config.conditions:
        if not condition.left():
            raise bad("Conditions must specify a value for `left`.")
        if not condition.cmp():
            raise bad("Conditions must specify a value for `cmp`.")
        if condition.cmp() == "mod_eq" and (condition.mod_eq.mod <= 0
                                            or condition.mod_eq.eq < 0):
            raise bad("`mod_eq.mod` must be > 0 and `mod_eq.eq` >= 0.")
        if condition.is_end_episode and (condition.eq != 1 or condition.inverse):
            raise bad("Condition must use `eq=1` when using `is_end_episode`.")


class _ConfigState:
    def __init__(self, config: StructuredWriterConfig) -> None:
        self.config = config
        self.last_applied: tuple[int, int] | None = None
        self.last_checked: tuple[int, int] | None = None
        self.steps_since_applied = 0


class InternalStructuredWriter:
    """The internal writer of :class:`StructuredWriter` (Reverb's C++ one): the history
    of every column a pattern or condition reads, the configs' state, and a
    :class:`~redisbuf.buffers.step_writer.StepWriter` for the items."""

    def __init__(self, store: StepStore, configs: list[StructuredWriterConfig]) -> None:
        configs = [copy.deepcopy(config) for config in configs]
        keep = 1
        for index, config in enumerate(configs):
            age = max(_max_age(node) for node in config.flat) if config.flat else 0
            keep = max(keep, age)
            if not any(c.buffer_length and c.ge >= age for c in config.conditions):
                config.conditions.append(ConditionProto(buffer_length=True, ge=age))
            _check_config(index, config)
        self._history: list[int] = []  # per column: how many of its last cells a config reads
        for config in configs:
            for node in config.flat:
                self._need(node.flat_source_index, _max_age(node))
            for condition in config.conditions:
                if condition.left() == "flat_source_index":
                    self._need(condition.flat_source_index, 1)
        self._states = [_ConfigState(config) for config in configs]
        self._writer = StepWriter(store, keep)
        self._columns: list[list[Any]] = []
        self.step_is_open = False

    def _need(self, column: int, age: int) -> None:
        while len(self._history) <= column:
            self._history.append(0)
        self._history[column] = max(self._history[column], age)

    def Append(self, data: Sequence[Any]) -> None:  # noqa: N802 - Reverb's C++ names
        self._append(data, finalize=True)

    def AppendPartial(self, data: Sequence[Any]) -> None:  # noqa: N802
        self._append(data, finalize=False)

    def _append(self, data: Sequence[Any], finalize: bool) -> None:
        # columns no config reads are not stored
        used = [value if i < len(self._history) and self._history[i] else None
                for i, value in enumerate(data)]
        refs = self._writer.append(used, partial=not finalize)
        refs = list(refs) + [None] * (len(self._history) - len(refs))
        for i in range(len(self._history)):
            while i >= len(self._columns):
                self._columns.append([])
            column = self._columns[i]
            if not self.step_is_open:
                column.append(refs[i])
            elif refs[i] is not None:
                column[-1] = refs[i]
            if len(column) > self._history[i]:
                del column[0]
        self.step_is_open = not finalize
        self._apply(end_of_episode=False)

    def _current_step(self) -> tuple[int, int] | None:
        for column in self._columns:
            if column and column[-1] is not None:
                return column[-1].episode, column[-1].step
        return None

    def _holds(self, state: _ConfigState, condition: ConditionProto, step: tuple[int, int],
               end_of_episode: bool) -> bool:
        left_kind = condition.left()
        if left_kind == "step_index":
            left = step[1]
        elif left_kind == "steps_since_applied":
            left = state.steps_since_applied
        elif left_kind == "buffer_length":
            left = max((len(c) for c in self._columns), default=0)
        elif left_kind == "is_end_episode":
            left = 1 if end_of_episode else 0
        else:
            column = self._columns[condition.flat_source_index]
            if not column or column[-1] is None:
                return False
            value = column[-1].array
            if value.size != 1 or value.dtype.kind not in "iub":
                return False
            left = int(value.reshape(-1)[0])
        kind = condition.cmp()
        if kind == "eq":
            result = left == condition.eq
        elif kind == "ge":
            result = left >= condition.ge
        else:
            result = left % condition.mod_eq.mod == condition.mod_eq.eq
        return condition.inverse != result

    def _trajectory(self, config: StructuredWriterConfig) -> tuple[list[Any], list[bool],
                                                                   float] | None:
        columns, squeeze = [], []
        priority = config.priority.constant_fn.value \
            if config.priority.HasField("constant_fn") else 0.0
        for node in config.flat:
            column = self._columns[node.flat_source_index]
            has_start = node.HasField("start")
            offset = len(column) + (node.start if has_start else node.stop)
            length = node.stop - node.start if has_start else 1
            step = node.step if node.HasField("step") else 1
            if offset < 0:
                return None
            refs = [column[offset + i] if offset + i < len(column) else None
                    for i in range(0, length, step)]
            if any(ref is None for ref in refs):
                return None
            columns.append(refs)
            squeeze.append(not has_start and node.HasField("stop"))
            if config.priority.has_td_error() and \
                    config.priority.td_error.flat_source_index == node.flat_source_index:
                priority = _td_error(refs, config.priority.td_error.max_priority_weight)
        return columns, squeeze, priority

    def _apply(self, end_of_episode: bool) -> None:
        step = self._current_step()
        if step is None:
            return
        for state in self._states:
            if state.last_applied == step:
                continue
            if state.last_checked != step:
                state.steps_since_applied += 1
                state.last_checked = step
            if not all(self._holds(state, c, step, end_of_episode)
                       for c in state.config.conditions):
                continue
            made = self._trajectory(state.config)
            if made is None:
                continue
            columns, squeeze, priority = made
            self._writer.create_item(state.config.table, priority, columns, squeeze)
            state.last_applied = step
            state.steps_since_applied = 0

    def Flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None) -> None:  # noqa: N802
        self._writer.flush(block_until_num_items,
                           None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000)

    def EndEpisode(self, clear_buffers: bool = True, timeout_ms: int | None = None) -> None:  # noqa: N802
        self._apply(end_of_episode=True)
        try:
            self._writer.end_episode(
                clear_buffers, None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000)
        finally:
            if clear_buffers:
                self._columns = []
            self.step_is_open = False

    def Close(self) -> None:  # noqa: N802
        self._writer.close()


def _td_error(refs: list[Any], weight: float) -> float:
    values = []
    for ref in refs:
        value = ref.array
        if value.size != 1 or value.dtype.kind not in "iuf":
            raise ValueError("TD Error expects a scalar double/float/int tensor")
        values.append(abs(float(value.reshape(-1)[0])))
    return weight * max(values) + (1 - weight) * (sum(values) / len(values))


class StructuredWriter:
    """Appends steps (every step of one structure; leaves may be ``None``) and makes
    the items its configs say (see the module). Made by
    :meth:`redisbuf.reverb.Client.structured_writer`."""

    def __init__(self, cpp_writer: Any) -> None:
        self._writer = cpp_writer
        self._data_structure: Any = None
        self._flat_data_length: int | None = None

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Append a step (``partial_step``: part of one) and make the items due.

        Raises:
            ValueError: a structure of another number of leaves than the first step's, or
                a value whose dtype or shape differs from its column's.
        """
        flat = nest.flatten(data)
        if self._flat_data_length is None:
            self._flat_data_length = len(flat)
            self._data_structure = nest.map_structure(lambda _: None, data)
        if len(flat) != self._flat_data_length:
            raise ValueError(f"Flattened data has an unexpected length, got {len(flat)} but "
                             f"wanted {self._flat_data_length}.")
        try:
            if partial_step:
                self._writer.AppendPartial(flat)
            else:
                self._writer.Append(flat)
        except ValueError as error:
            parts = str(error).split(" for column ")
            if len(parts) != 2:
                raise
            index, rest = parts[1].split(". ", 1)
            path = nest.flatten_with_path(self._data_structure)[int(index)][0]
            raise ValueError(f"{parts[0]} for column {index} (path={path}). {rest}") from error

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None) -> None:
        """Send items until at most ``block_until_num_items`` are unconfirmed.

        Raises:
            ValueError: ``block_until_num_items < 0``.
            DeadlineExceededError: ``timeout_ms`` passed first.
        """
        if block_until_num_items < 0:
            raise ValueError(
                f"block_until_num_items must be >= 0, got {block_until_num_items}")
        try:
            self._writer.Flush(block_until_num_items, timeout_ms)
        except WaitTimeoutError:
            raise errors.writer_deadline("Flush", timeout_ms) from None

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None) -> None:
        """Make the items due at the episode's end, send everything, begin a new episode.

        Raises:
            DeadlineExceededError: ``timeout_ms`` passed first.
        """
        try:
            self._writer.EndEpisode(clear_buffers, timeout_ms)
        except WaitTimeoutError:
            raise errors.writer_deadline("End episode", timeout_ms) from None

    @property
    def step_is_open(self) -> bool:
        """Whether the last append was partial."""
        return self._writer.step_is_open

    def __del__(self) -> None:
        try:
            self._writer.Close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass


__all__ = [
    "Condition", "ConditionProto", "Config", "PatternNode", "Priority", "StructuredWriter",
    "StructuredWriterConfig", "constant_priority_fn", "create_config",
    "create_reference_step", "infer_signature", "pattern_from_transform", "td_error",
    "unpack_pattern",
]
