"""Reverb's ``TrajectoryWriter`` (``reverb.trajectory_writer``): append steps of any nest,
take columns of them from ``history``, and make items of any nest of those columns.

The writer keeps Reverb's Python layer (columns by path, ``history``, partial steps,
``TrajectoryColumn``) over an internal writer with the interface of Reverb's C++ one
(``Append``, ``AppendPartial``, ``CreateItem``, ``Flush``, ``EndEpisode``, ``Close``,
``ConfigureChunker``, ``max_num_keep_alive_refs``, ``episode_steps``):
:class:`InternalWriter`, over redisbuf's
:class:`~redisbuf.buffers.step_writer.StepWriter`. Steps travel once, in chunks, and an
item's record names the chunks and rows it reads (:mod:`redisbuf.buffers.steps`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from ..buffers.step_writer import StepWriter, dtype_name, shape_text
from ..errors import WaitTimeoutError
from . import errors, nest, pybind
from .tensor_spec import TensorSpec, shapes_compatible, spec_text


class InternalWriter:
    """The internal writer of :class:`TrajectoryWriter` (the part Reverb writes in C++):
    a :class:`~redisbuf.buffers.step_writer.StepWriter` and, with ``signatures``, the
    check of every item against its table's signature (Reverb's ``validate_items``).

    Args:
        writer: the step writer.
        signatures: table name -> flat signature (a list of
            :class:`~redisbuf.reverb.tensor_spec.TensorSpec`, or None for a table without
            one); None checks nothing. A callable returning it is called again when an
            item names a table it lacks.
    """

    def __init__(self, writer: StepWriter, signatures: Any = None) -> None:
        self._writer = writer
        self._signatures = signatures
        self._known: dict[str, list[TensorSpec] | None] | None = None
        self._plain: dict[str, tuple[list[TensorSpec], list[tuple[Any, Any]]]] = {}

    @property
    def max_num_keep_alive_refs(self) -> int:
        return self._writer.num_keep_alive_refs

    @property
    def episode_steps(self) -> int:
        return self._writer.episode_steps

    @property
    def step_is_open(self) -> bool:
        return self._writer.step_is_open

    def Append(self, data: Sequence[Any]) -> list[Any]:  # noqa: N802 - Reverb's C++ names
        return self._writer.append(data)

    def AppendPartial(self, data: Sequence[Any]) -> list[Any]:  # noqa: N802
        return self._writer.append(data, partial=True)

    def ConfigureChunker(self, column: int, options: Any) -> None:  # noqa: N802
        # one chunk length for the writer: the shortest constant one asked of any column
        # (an auto-tuned one leaves the writer's own choice)
        length = getattr(options, "max_chunk_length", None)
        if length is not None:
            self._writer.set_chunk_length(min(self._writer.chunk_length, int(length)))

    def _table_signature(self, table: str) -> tuple[bool, list[TensorSpec] | None]:
        if self._signatures is None:
            return True, None
        for refresh in (False, True):
            if self._known is None or refresh:
                source = self._signatures
                self._known = source() if callable(source) else dict(source)
            if table in self._known:
                return True, self._known[table]
            if not callable(self._signatures):
                break
        return False, None

    def CreateItem(self, table: str, priority: float, columns: Sequence[Sequence[Any]],  # noqa: N802
                   squeeze: Sequence[bool]) -> None:
        found, signature = self._table_signature(table)
        if not found:
            raise ValueError(f"Unable to create item in table '{table}' since the table "
                             "could not be found.")
        if signature is not None and not self._fits(table, signature, columns, squeeze):
            got = [TensorSpec((*refs[0].shape,) if sq else (len(refs), *refs[0].shape),
                              refs[0].dtype) for refs, sq in zip(columns, squeeze, strict=True)]
            _check_signature(table, signature, got)
        self._writer.create_item(table, priority, columns, squeeze)

    def _fits(self, table: str, signature: list[TensorSpec], columns: Sequence[Sequence[Any]],
              squeeze: Sequence[bool]) -> bool:
        """Whether the item's columns fit the table's flat signature (the quick check;
        the error, when not, comes from :func:`_check_signature`)."""
        if len(signature) != len(columns):
            return False
        plain = self._plain.get(table)
        if plain is None or plain[0] is not signature:  # each spec's dtype and dims, once
            plain = self._plain[table] = (
                signature, [(spec.dtype, spec.shape.dims) for spec in signature])
        for (dtype, dims), refs, squeezed in zip(plain[1], columns, squeeze, strict=True):
            first = refs[0]
            if first.dtype != dtype:
                return False
            shape = tuple(first.shape) if squeezed else (len(refs), *first.shape)
            if shape != dims and not shapes_compatible(dims, shape):
                return False
        return True

    def Flush(self, block_until_num_items: int = 0, timeout_ms: int = -1) -> None:  # noqa: N802
        self._writer.flush(block_until_num_items,
                           None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000)

    def EndEpisode(self, clear_buffers: bool = True, timeout_ms: int | None = None) -> None:  # noqa: N802
        self._writer.end_episode(
            clear_buffers, None if timeout_ms is None or timeout_ms < 0 else timeout_ms / 1000)

    def Close(self) -> None:  # noqa: N802
        self._writer.close()


def _check_signature(table: str, want: list[TensorSpec], got: list[TensorSpec]) -> None:
    """Reverb's refusal of an item that does not fit its table's signature."""
    if len(want) != len(got):
        raise ValueError(
            f"Unable to create item in table '{table}' since the provided trajectory is "
            f"inconsistent with the table signature. The trajectory has {len(got)} columns "
            f"but the table signature has {len(want)} columns.\n\nThe table signature is:"
            f"\n\t{spec_text(want)}\n\nThe provided trajectory signature was:\n\t"
            f"{spec_text(got)}.\n")
    for i, (w, g) in enumerate(zip(want, got, strict=True)):
        if w.dtype != g.dtype or not shapes_compatible(w.shape.dims, g.shape.dims):
            raise ValueError(
                f"Unable to create item in table '{table}' since the provided trajectory "
                f"is inconsistent with the table signature. The table expects column {i} "
                f"to be a {dtype_name(w.dtype)} {shape_text(w.shape.dims or ())} tensor but "
                f"got a {dtype_name(g.dtype)} {shape_text(g.shape.dims or ())} tensor.\n\n"
                f"The table signature is:\n\t{spec_text(want)}\n\nThe provided trajectory "
                f"signature is:\n\t{spec_text(got)}.\n")


class TrajectoryWriter:
    """Writes items of any nest of columns of the steps it was given (Reverb's).

    Made by :meth:`redisbuf.reverb.Client.trajectory_writer`. ``append`` takes a step (any
    nest; fields may come and go from one step to the next), ``history`` gives its
    columns by the step's structure (``history['obs'][-3:]``), ``create_item`` makes an
    item of a nest of such columns, which is sent once ``flush`` (or the writer's own
    chunking) says so, without blocking; ``end_episode`` sends everything and begins a
    new episode. As a context manager it flushes on the way out unless a
    :class:`~redisbuf.reverb.errors.ReverbError` is raised.
    """

    def __init__(self, internal_writer: Any) -> None:
        self._writer = internal_writer
        self._structure: Any = None  # the union of the steps' structures, leaves = column
        self._column_history: list[_ColumnHistory] = []
        self._path_to_column_index: dict[tuple[Any, ...], int] = {}
        self._path_to_column_config: dict[tuple[Any, ...], Any] = {}
        self._last_step_is_open = False
        self._history_view: Any = None

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if exc_type is None or not issubclass(exc_type, errors.ReverbError):
            self.flush()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - a finalizer must not raise
            pass

    @property
    def history(self) -> Any:
        """The references to the data appended, by column, structured as the steps: a
        column's ``[i]``, ``[a:b]`` and ``[[i, j]]`` are :class:`TrajectoryColumn`\\ s.

        Raises:
            RuntimeError: nothing was appended yet.
        """
        if not self._column_history:
            raise RuntimeError(
                "history cannot be accessed before `append` is called at least once.")
        if self._history_view is None:  # the columns change in place; the shape on _grow
            self._history_view = self._unflatten(self._column_history)
        return self._history_view

    @property
    def episode_steps(self) -> int:
        """The (complete) steps appended since the last ``end_episode``."""
        return self._writer.episode_steps

    def configure(self, path: tuple[Any, ...], *, num_keep_alive_refs: int,
                  max_chunk_length: int | None) -> None:
        """Set the chunking of the column at ``path`` (applied once the column exists).

        Raises:
            ValueError: ``num_keep_alive_refs < 1``, or a ``max_chunk_length`` below 1
                or above ``num_keep_alive_refs``.
        """
        if num_keep_alive_refs < 1:
            raise ValueError(f"num_keep_alive_refs ({num_keep_alive_refs}) must be a positive "
                             "integer")
        if max_chunk_length is not None and not 1 <= max_chunk_length <= num_keep_alive_refs:
            raise ValueError(f"max_chunk_length ({max_chunk_length}) must be None or a "
                             f"positive integer <= num_keep_alive_refs ({num_keep_alive_refs})")
        if max_chunk_length is None:
            options: Any = pybind.AutoTunedChunkerOptions(
                num_keep_alive_refs=num_keep_alive_refs, throughput_weight=1.0)
        else:
            options = pybind.ConstantChunkerOptions(
                max_chunk_length=max_chunk_length, num_keep_alive_refs=num_keep_alive_refs)
        if path in self._path_to_column_index:
            self._writer.ConfigureChunker(self._path_to_column_index[path], options)
        else:
            self._path_to_column_config[path] = options

    def append(self, data: Any, *, partial_step: bool = False) -> None:
        """Append a step (or, with ``partial_step``, part of one: the next append adds to
        the same step). Fields not seen before become new columns (``None`` in the
        earlier steps).

        Raises:
            ValueError: a field given twice in one step, or a value whose dtype or shape
                differs from its column's.
        """
        flat = self._flat_dict(data)  # the common step: a dict of leaves seen before
        if flat is None:
            if self._structure is None:
                self._grow(nest.map_structure(lambda _: None, data))
            with_paths = nest.flatten_with_path(data)
            if any(path not in self._path_to_column_index for path, _ in with_paths):
                self._grow(_union(self._structure, nest.map_structure(lambda _: None, data)))
            flat = [None] * len(self._path_to_column_index)
            for path, value in with_paths:
                flat[self._path_to_column_index[path]] = value
        if self._last_step_is_open:
            for index, (column, value) in enumerate(zip(self._column_history, flat,
                                                        strict=True)):
                if value is not None and not column.last_is_empty():
                    raise ValueError(
                        f"Field {self._column_history[index].path()} has already been set "
                        "in the active step by previous (partial) append call and thus must "
                        f"be omitted or set to None but got: {value}")
        try:
            refs = (self._writer.AppendPartial(flat) if partial_step
                    else self._writer.Append(flat))
        except ValueError as error:
            found = re.findall(r" for column (\d+)", str(error))
            if len(found) != 1:
                raise
            path = self._column_history[int(found[0])].path()
            raise ValueError(str(error).replace(f"for column {found[0]}",
                                                f"for column {path}")) from error
        for column, ref in zip(self._column_history, refs, strict=False):
            if not self._last_step_is_open:
                column.append(ref)
            elif ref is not None:
                column.set_last(ref)
        self._last_step_is_open = partial_step

    def _flat_dict(self, data: Any) -> list[Any] | None:
        """``data``'s values in column order when it is a dict of leaves (arrays,
        numbers, None) whose every key is a column already; else None."""
        if type(data) is not dict or self._structure is None:
            return None
        index = self._path_to_column_index
        flat: list[Any] = [None] * len(index)
        for key, value in data.items():
            column = index.get((key,))
            if column is None or nest.is_nested(value):
                return None
            flat[column] = value
        return flat

    def create_item(self, table: str, priority: float, trajectory: Any) -> None:
        """Make an item of ``table`` with ``priority`` whose data is ``trajectory``, a
        nest of :class:`TrajectoryColumn` (flattened for the table). It never blocks;
        call ``flush`` to bound what waits unsent.

        Raises:
            TypeError: a leaf that is not a :class:`TrajectoryColumn`.
            ValueError: an expired reference, or (``validate_items``) a table that does
                not exist or whose signature the trajectory does not fit.
        """
        flat = nest.flatten(trajectory)
        for column in flat:
            if not isinstance(column, TrajectoryColumn):
                raise TypeError(f"All leaves of `trajectory` must be `TrajectoryColumn` but "
                                f"got {trajectory}")
        self._writer.CreateItem(table, priority, [column.references for column in flat],
                                [column.is_squeezed for column in flat])

    def flush(self, block_until_num_items: int = 0, timeout_ms: int | None = None) -> None:
        """Send items until at most ``block_until_num_items`` are unconfirmed, waiting up
        to ``timeout_ms`` (None: no limit); the sends go on after a timeout.

        Raises:
            ValueError: ``block_until_num_items < 0``.
            DeadlineExceededError: the timeout passed first.
        """
        if block_until_num_items < 0:
            raise ValueError(
                f"block_until_num_items must be >= 0, got {block_until_num_items}")
        try:
            self._writer.Flush(block_until_num_items, -1 if timeout_ms is None else timeout_ms)
        except WaitTimeoutError:
            raise errors.writer_deadline("Flush", timeout_ms) from None

    def end_episode(self, clear_buffers: bool = True, timeout_ms: int | None = None) -> None:
        """Send every item and begin a new episode (with ``clear_buffers``, the history
        is emptied; the new episode begins even when the wait times out).

        Raises:
            DeadlineExceededError: the timeout passed first.
        """
        try:
            self._writer.EndEpisode(clear_buffers, timeout_ms)
        except WaitTimeoutError:
            raise errors.writer_deadline("End episode", timeout_ms) from None
        finally:
            if clear_buffers:
                for column in self._column_history:
                    column.reset()

    def close(self) -> None:
        """Stop the writer: items not sent yet are dropped (``flush`` first)."""
        self._writer.Close()

    def _unflatten(self, columns: list[Any]) -> Any:
        ordered = [columns[index] for index in nest.flatten(self._structure)]
        return nest.unflatten_as(self._structure, ordered)

    def _grow(self, structure: Any) -> None:
        """Make ``structure`` (a superset of the current one) the writer's: new fields get
        new columns, at the end, padded with ``None`` for the steps before."""
        columns = []
        for path, index in nest.flatten_with_path(structure):
            if index is None:
                index = len(self._column_history)
                self._path_to_column_index[path] = index
                padding = len(self._column_history[0]) if self._column_history else 0
                self._column_history.append(_ColumnHistory(
                    path, self._writer.max_num_keep_alive_refs, padding))
                if path in self._path_to_column_config:
                    self._writer.ConfigureChunker(index, self._path_to_column_config[path])
            columns.append(index)
        self._structure = nest.unflatten_as(structure, columns)
        self._history_view = None


def _union(a: Any, b: Any) -> Any:
    """The union of two structures whose leaves are column indices or None (``a``'s
    indices win)."""
    if a is None or isinstance(a, int):
        return a
    if isinstance(a, tuple) and hasattr(a, "_fields"):
        return type(a)(**_union(a._asdict(), b._asdict()))  # type: ignore[attr-defined]
    if isinstance(a, (list, tuple)):
        return type(a)(_union(x, y) for x, y in itertools.zip_longest(a, b))
    merged = dict(a)
    for key, value in b.items():
        merged[key] = _union(a[key], value) if key in a else value
    try:
        return type(a)(merged)
    except TypeError:  # a mapping type that takes no mapping
        return merged


class _ColumnHistory:
    """One column's references, indexable as if it held every step of the episode (the
    ones that left its keep-alive window are None)."""

    def __init__(self, path: tuple[Any, ...], buffer_size: int, history_padding: int = 0
                 ) -> None:
        self._path = path
        self._buffer_size = buffer_size
        kept = min(buffer_size, history_padding)
        self._data_references: list[Any] = [None] * kept
        self._offset = history_padding - kept

    def path(self) -> tuple[Any, ...]:
        return self._path

    def append(self, ref: Any) -> None:
        self._data_references.append(ref)
        if len(self._data_references) > self._buffer_size:
            del self._data_references[0]
            self._offset += 1

    def reset(self) -> None:
        self._data_references = []
        self._offset = 0

    def set_last(self, ref: Any) -> None:
        if not self._data_references:
            raise RuntimeError("set_last called on empty history column")
        if self._data_references[-1] is not None:
            raise RuntimeError("set_last called on already set cell")
        self._data_references[-1] = ref

    def last_is_empty(self) -> bool:
        return bool(self._data_references) and self._data_references[-1] is None

    @property
    def can_set_last(self) -> bool:
        return self.last_is_empty()

    def _at(self, index: int) -> Any:
        length = len(self)
        if index >= 0:
            index -= length
        if index >= 0 or index < -length:
            raise IndexError("list index out of range")
        kept = len(self._data_references)
        return None if index < -kept else self._data_references[index]

    def _range(self, where: slice) -> list[Any]:
        length = len(self)
        start, stop, step = where.indices(length)
        kept = self._data_references
        first_kept = length - len(kept)  # the index of kept[0]
        if step == 1 and start >= first_kept:  # the common slice: kept cells only
            return kept[start - first_kept : max(start, stop) - first_kept]
        return [self._at(i) for i in range(start, stop, step)]

    def __len__(self) -> int:
        return len(self._data_references) + self._offset

    def __iter__(self) -> Iterator[Any]:
        yield from itertools.repeat(None, self._offset)
        yield from self._data_references

    def __getitem__(self, where: Any) -> TrajectoryColumn:
        path = (*self._path, where)
        if isinstance(where, int):
            return TrajectoryColumn([self._at(where)], squeeze=True, path=path)
        if isinstance(where, slice):
            return TrajectoryColumn(self._range(where), path=path)
        if isinstance(where, list):
            return TrajectoryColumn([self._at(i) for i in where], path=path)
        raise TypeError(f"_ColumnHistory indices must be integers or slices, not {type(where)}")

    def __str__(self) -> str:
        return f"{type(self).__module__}.{type(self).__name__}(path={self._path}, " \
               f"refs={self._data_references})"


class TrajectoryColumn:
    """A column of an item: references to cells of one column, in order; ``squeeze``:
    the one cell without a time dimension.

    Raises:
        ValueError: ``squeeze`` with other than one reference, or a ``None`` reference
            (a step the column has no cell for, or one that left its window).
    """

    def __init__(self, data_references: Sequence[Any], *, squeeze: bool = False,
                 path: tuple[Any, ...] | None = None) -> None:
        if squeeze and len(data_references) != 1:
            raise ValueError(f"Columns must contain exactly one data reference when squeeze "
                             f"set, got {len(data_references)}")
        if any(ref is None for ref in data_references):
            raise ValueError(f"TrajectoryColumns cannot contain any None data references: "
                             f"TrajectoryColumn at path {path} got {list(data_references)}.")
        self._data_references = tuple(data_references)
        self.is_squeezed = squeeze

    def __len__(self) -> int:
        return len(self._data_references)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._data_references)

    @property
    def references(self) -> list[Any]:
        """The column's references, in order."""
        return list(self._data_references)

    def __getitem__(self, where: Any) -> TrajectoryColumn:
        if isinstance(where, int):
            return TrajectoryColumn([self._data_references[where]], squeeze=True)
        if isinstance(where, slice):
            return TrajectoryColumn(self._data_references[where])
        if isinstance(where, list):
            return TrajectoryColumn([self._data_references[i] for i in where])
        raise TypeError(f"TrajectoryColumn indices must be integers or slices, not "
                        f"{type(where)}")

    @property
    def shape(self) -> tuple[int | None, ...]:
        first = tuple(self._data_references[0].shape)
        return first if self.is_squeezed else (len(self._data_references), *first)

    @property
    def dtype(self) -> np.dtype:
        return self._data_references[0].dtype

    def numpy(self) -> np.ndarray:
        """The referenced cells stacked (a squeezed column: its one cell).

        Raises:
            RuntimeError: a reference has expired.
        """
        if any(ref.expired for ref in self._data_references):
            raise RuntimeError("Cannot convert TrajectoryColumn with expired data references "
                               "to numpy array.")
        if self.is_squeezed:
            return self._data_references[0].numpy()
        return np.stack([ref.numpy() for ref in self._data_references])


__all__ = ["InternalWriter", "TrajectoryColumn", "TrajectoryWriter"]
