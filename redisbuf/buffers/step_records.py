"""The records of a step store (redisbuf/buffers/steps.py): chunks of steps, and the items
that reference them, as msgpack blobs (arrays as dtype text, shape and raw bytes; no
pickle).

A *chunk* holds cells of one writer's episode: for each column it holds, the steps it has
a cell for (ascending, as int64 bytes) and those cells stacked in one array. An *item*
names the chunks it reads and, for each of its flat columns, the runs ``(chunk index,
first row, rows)`` of the cells it takes, in order, and whether the column is squeezed
(one cell, without the leading time dimension).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

import msgpack
import numpy as np

from ..errors import DecodeError


def encode_array(array: np.ndarray) -> list[Any]:
    """``[dtype text, shape, raw bytes]`` of a fixed-width array (C order, native bytes)."""
    array = np.ascontiguousarray(array)
    _refuse_objects(array.dtype)
    return [array.dtype.str, list(array.shape), array.tobytes()]


def _refuse_objects(dtype: np.dtype) -> None:
    if dtype.hasobject:
        raise TypeError(f"arrays of dtype {dtype} (Python objects) cannot be stored")


def decode_array(value: list[Any]) -> np.ndarray:
    dtype, shape, raw = value
    return np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)


@dataclass
class Chunk:
    """Decoded chunk: its episode, and by column index its stacked cells, (as raw int64
    bytes, see :meth:`steps_of`) the steps they belong to, and the kind of its cells
    (``kinds``: dtype and cell shape as text; a batch's gather joins only cells of one
    kind).

    A store keeps thousands of decoded chunks and records (redisbuf/buffers/steps.py), so
    they hold no object the garbage collector must visit but their own (bytes, arrays,
    text, plain tuples; no memoryview, no list): each full collection visits every object
    kept, and with memoryviews and lists in them it took ~100 ms, a quarter of a 4 KiB
    batch read's client time."""

    episode: int
    columns: dict[int, np.ndarray]
    steps: dict[int, bytes]
    kinds: dict[int, str]

    def steps_of(self, column: int) -> np.ndarray:
        """The steps of ``column``'s cells, ascending."""
        return np.frombuffer(self.steps[column], dtype="<i8")


#: by a column's dtype text and cell shape, its dtype and kind (see :class:`Chunk`)
_KINDS: dict[tuple[Any, ...], tuple[np.dtype, str]] = {}
_MAX_KINDS = 4096


def encode_chunk(episode: int, columns: dict[int, tuple[list[int], np.ndarray]]) -> bytes:
    """A chunk's blob: ``columns`` maps a column index to its steps and stacked cells."""
    body = [[col, _steps_bytes(steps), *encode_array(cells)]
            for col, (steps, cells) in columns.items()]
    return _chunk_blob(episode, body)


def _steps_bytes(steps: list[int]) -> bytes:
    return np.asarray(steps, dtype="<i8").tobytes()


def _chunk_blob(episode: int, body: list[list[Any]]) -> bytes:
    return msgpack.packb({"e": episode, "c": body}, use_bin_type=True)


def encode_chunk_cells(episode: int,
                       columns: dict[int, tuple[list[int], list[np.ndarray]]]) -> bytes:
    """:func:`encode_chunk` of each column's cells as a list of contiguous arrays of one
    dtype and shape: their bytes are joined, not stacked first (one copy less, and no
    per-call cost of ``np.stack``, which a writer of large steps pays per chunk)."""
    body = []
    for col, (steps, cells) in columns.items():
        first = cells[0]
        _refuse_objects(first.dtype)
        raw = b"".join([cell.data if cell.flags.c_contiguous else cell.tobytes()
                        for cell in cells])
        body.append([col, _steps_bytes(steps), first.dtype.str, [len(cells), *first.shape],
                     raw])
    return _chunk_blob(episode, body)


def decode_chunk(blob: bytes) -> Chunk:
    try:
        record = msgpack.unpackb(blob, raw=False)
        columns, steps, kinds = {}, {}, {}
        for col, raw_steps, dtype, shape, raw in record["c"]:
            # a store decodes a chunk per cache miss, a hundred a batch: each kind of
            # cells gets its dtype and kind text once, and chunks share the text
            kind_key = (dtype, *shape[1:])
            known_kind = _KINDS.get(kind_key)
            if known_kind is None:
                if len(_KINDS) >= _MAX_KINDS:  # cells of ever new shapes: start again
                    _KINDS.clear()
                known = np.dtype(dtype)
                known_kind = _KINDS[kind_key] = (known, f"{known.str}{tuple(shape[1:])}")
            columns[col] = np.frombuffer(raw, dtype=known_kind[0]).reshape(shape)
            steps[col] = raw_steps
            kinds[col] = known_kind[1]
        return Chunk(int(record["e"]), columns, steps, kinds)
    except Exception as exc:  # noqa: BLE001 - any malformed chunk is a DecodeError
        raise DecodeError(f"a chunk of steps does not decode: {type(exc).__name__}: {exc}") \
            from exc


class ItemColumn(NamedTuple):
    """One flat column of an item: its source column, its runs ``(chunk index, first row,
    rows)`` of cells and whether it is squeezed."""

    column: int
    runs: tuple[tuple[int, int, int], ...]
    squeeze: bool


@dataclass
class ItemRecord:
    """Decoded item: its episode, the chunk keys it reads, its flat columns (each
    ``(column, runs, squeeze)`` as :class:`ItemColumn` names them, as a plain tuple: see
    :class:`Chunk`) and the priority it was inserted with (its current one is the
    buffer's, see :meth:`~redisbuf.buffers.replay.ReplayBuffer.priorities`)."""

    episode: int
    chunks: tuple[str, ...]
    columns: tuple[tuple[int, tuple[tuple[int, int, int], ...], bool], ...]
    priority: float = 0.0
    #: each flat column's source column, whether it is squeezed, and its rows: items of
    #: one layout stack column by column (worked out once per decoded record)
    layout: tuple[tuple[int, bool, int], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.chunks = tuple(self.chunks)
        self.columns = tuple(
            (int(column), tuple((int(i), int(first), int(rows)) for i, first, rows in runs),
             bool(squeeze))
            for column, runs, squeeze in self.columns)
        self.layout = tuple((column, squeeze, sum(rows for _, _, rows in runs))
                            for column, runs, squeeze in self.columns)


def encode_item(episode: int, chunks: list[str], columns: list[ItemColumn],
                priority: float) -> bytes:
    return encode_item_raw(episode, chunks, [(c.column, c.runs, c.squeeze) for c in columns],
                           priority)


def encode_item_raw(episode: int, chunks: list[str], columns: list[tuple[int, Any, bool]],
                    priority: float) -> bytes:
    """:func:`encode_item` of columns given as ``(column, runs, squeeze)`` tuples."""
    return _pack({"e": episode, "k": chunks, "t": columns, "p": float(priority)})


_pack = msgpack.Packer(use_bin_type=True).pack


def decode_item(blob: bytes) -> ItemRecord:
    try:
        record = msgpack.unpackb(blob, raw=False, use_list=False)
        return ItemRecord(int(record["e"]), record["k"], record["t"],
                          float(record.get("p", 0.0)))
    except Exception as exc:  # noqa: BLE001
        raise DecodeError(f"an item of a step store does not decode: {type(exc).__name__}: "
                          f"{exc}") from exc


def assemble(item: ItemRecord, chunks: dict[str, Chunk]) -> list[np.ndarray]:
    """The item's flat columns: each the concatenation of its runs (a squeezed column:
    its one cell). Raises KeyError naming a chunk ``chunks`` lacks."""
    out = []
    for column, runs, squeeze in item.columns:
        parts = []
        for index, first, rows in runs:
            cells = chunks[item.chunks[index]].columns[column]
            parts.append(cells[first : first + rows])
        data = parts[0].copy() if len(parts) == 1 else np.concatenate(parts)
        out.append(data[0] if squeeze else data)
    return out


__all__ = [
    "Chunk", "ItemColumn", "ItemRecord", "assemble", "decode_array", "decode_chunk",
    "decode_item", "encode_array", "encode_chunk", "encode_chunk_cells", "encode_item",
    "encode_item_raw",
]
