"""msgpack encoding of items: numpy arrays and torch tensors as typed raw bytes.

An array travels as a msgpack ext value (code 1 for numpy, 2 for torch) whose payload is::

    dtype code (1 byte) | ndim (1 byte) | shape (ndim x uint64, little-endian) | raw bytes

The raw bytes are the C-contiguous, little-endian element data. Decoding wraps them with
``np.frombuffer`` / ``torch.frombuffer``: no copy, and no code is ever executed (no pickle).
Decoded arrays are read-only views of the blob.
"""

from __future__ import annotations

import gc
import math
import struct
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NamedTuple

import msgpack
import numpy as np

from ..errors import DecodeError
from . import _torch

if TYPE_CHECKING:
    import torch

EXT_NUMPY = 1
EXT_TORCH = 2
MAX_NDIM = 32

# code -> (numpy dtype, name of the torch dtype); bfloat16 has no numpy dtype and is
# torch-only. Names, not torch dtypes, so that importing the codec does not import torch.
_DTYPES: dict[int, tuple[np.dtype | None, str]] = {
    1: (np.dtype("bool"), "bool"),
    2: (np.dtype("<i1"), "int8"),
    3: (np.dtype("<i2"), "int16"),
    4: (np.dtype("<i4"), "int32"),
    5: (np.dtype("<i8"), "int64"),
    6: (np.dtype("u1"), "uint8"),
    7: (np.dtype("<f2"), "float16"),
    8: (None, "bfloat16"),
    9: (np.dtype("<f4"), "float32"),
    10: (np.dtype("<f8"), "float64"),
    11: (np.dtype("<u2"), "uint16"),  # torch >= 2.3
    12: (np.dtype("<u4"), "uint32"),
    13: (np.dtype("<u8"), "uint64"),
}
_NUMPY_CODE = {
    np_dtype.newbyteorder("<"): code
    for code, (np_dtype, _) in _DTYPES.items()
    if np_dtype is not None
}
# bytes-level numpy dtype used to move torch data in and out (bfloat16 as raw 2-byte words)
_TORCH_RAW = {"bfloat16": np.dtype("<u2")}
_torch_codes: dict[Any, int] = {}  # torch dtype -> code, filled once torch is in use


def _torch_dtype(code: int) -> torch.dtype | None:
    """The torch dtype of ``code``; None if this torch version lacks it. Imports torch."""
    return getattr(_torch.require(), _DTYPES[code][1], None)


def _torch_code(dtype: torch.dtype) -> int | None:
    if not _torch_codes:
        _torch_codes.update({_torch_dtype(c): c for c in _DTYPES if _torch_dtype(c) is not None})
    return _torch_codes.get(dtype)


_HEADER = struct.Struct("<BB")

_frombuffer_warned = False


def _torch_frombuffer(data: bytes, dtype: torch.dtype, count: int, offset: int) -> torch.Tensor:
    """``torch.frombuffer`` without its warning about read-only buffers: our decoded
    tensors are read-only views by design. torch warns once per process, so only the
    first call needs the (scoped: no process-wide filter) suppression."""
    global _frombuffer_warned
    torch = _torch.require()
    if _frombuffer_warned:
        return torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="The given buffer is not writable", category=UserWarning
        )
        tensor = torch.frombuffer(data, dtype=dtype, count=count, offset=offset)
    _frombuffer_warned = True
    return tensor


def dtype_name(array: np.ndarray | torch.Tensor) -> str:
    """A short, library-neutral name of an array's dtype (``float32``, ``bfloat16``...)."""
    if _torch.is_tensor(array):
        return str(array.dtype).removeprefix("torch.")
    return np.dtype(array.dtype).name


def _numpy_code(dtype: np.dtype) -> int:
    try:
        return _NUMPY_CODE[dtype.newbyteorder("<")]
    except KeyError:
        raise TypeError(
            f"unsupported numpy dtype {dtype}; supported: {supported_dtypes()}"
        ) from None


def supported_dtypes() -> list[str]:
    """Names of the dtypes arrays may have (those of this torch version, if torch is loaded:
    a tensor's dtype can only be checked against a loaded torch)."""
    torch = _torch.imported()
    return [name for _, name in _DTYPES.values() if torch is None or hasattr(torch, name)]


def _pack_array(code: int, shape: tuple[int, ...], raw: bytes | memoryview) -> bytes:
    if len(shape) > MAX_NDIM:
        raise TypeError(f"arrays of more than {MAX_NDIM} dimensions are not supported")
    return b"".join((_HEADER.pack(code, len(shape)), struct.pack(f"<{len(shape)}Q", *shape), raw))


def encode_array(array: np.ndarray | torch.Tensor) -> msgpack.ExtType:
    """One array or tensor as a msgpack ext value (see the module docstring)."""
    data, code, ext = raw_numpy(array)
    raw = data.reshape(-1).view(np.uint8).data if data.size else b""
    return msgpack.ExtType(ext, _pack_array(code, data.shape, raw))


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray) or _torch.is_tensor(obj):
        return encode_array(obj)
    if isinstance(obj, np.generic):
        return obj.item()
    raise TypeError(f"cannot encode object of type {type(obj).__name__}")


def _parse_header(data: bytes) -> tuple[int, tuple[int, ...], int]:
    if len(data) < _HEADER.size:
        raise DecodeError("array payload shorter than its header")
    code, ndim = _HEADER.unpack_from(data, 0)
    if code not in _DTYPES:
        raise DecodeError(f"unknown dtype code {code}")
    if ndim > MAX_NDIM:
        raise DecodeError(f"array declares {ndim} dimensions (at most {MAX_NDIM})")
    end = _HEADER.size + 8 * ndim
    if len(data) < end:
        raise DecodeError("array payload truncated inside its shape")
    shape = struct.unpack_from(f"<{ndim}Q", data, _HEADER.size)
    return code, shape, end


def _checked_count(code: int, shape: tuple[int, ...], data: bytes, offset: int) -> int:
    count = 1
    for dim in shape:
        count *= dim
    np_dtype, torch_dtype = _DTYPES[code]
    itemsize = (np_dtype if np_dtype is not None else _TORCH_RAW[torch_dtype]).itemsize
    if count * itemsize != len(data) - offset:
        raise DecodeError(
            f"array of shape {shape} needs {count * itemsize} bytes, "
            f"payload has {len(data) - offset}"
        )
    return count


def _decode_numpy(data: bytes) -> np.ndarray:
    code, shape, offset = _parse_header(data)
    np_dtype = _DTYPES[code][0]
    if np_dtype is None:
        raise DecodeError(f"dtype code {code} exists only for torch tensors")
    count = _checked_count(code, shape, data, offset)
    return np.frombuffer(data, dtype=np_dtype, count=count, offset=offset).reshape(shape)


def _decode_torch(data: bytes) -> torch.Tensor:
    code, shape, offset = _parse_header(data)
    torch_dtype = _torch_dtype(code)
    if torch_dtype is None:
        raise DecodeError(f"dtype code {code} is not supported by this torch version")
    count = _checked_count(code, shape, data, offset)
    if count == 0:
        return _torch.require().empty(shape, dtype=torch_dtype)
    return _torch_frombuffer(data, torch_dtype, count, offset).reshape(shape)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_NUMPY:
        return _decode_numpy(data)
    if code == EXT_TORCH:
        return _decode_torch(data)
    raise DecodeError(f"unknown msgpack ext code {code}")


_packer_kwargs = {"default": _default, "use_bin_type": True}


def packb(obj: Any) -> bytes:
    """Encode ``obj`` (dicts, lists, numbers, strings, bytes, arrays, tensors) to msgpack."""
    return msgpack.packb(obj, **_packer_kwargs)


def _unpack(blob: bytes, ext_hook: Any) -> Any:
    try:
        return msgpack.unpackb(blob, ext_hook=ext_hook, raw=False, strict_map_key=False)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"malformed msgpack blob: {exc}") from exc


def unpackb(blob: bytes) -> Any:
    """Decode a blob made by :func:`packb`; raise :class:`DecodeError` if it is malformed."""
    return _unpack(blob, _ext_hook)


# -- batch encoding and raw decoding (the hot paths of add and sample) --------------------


def raw_numpy(array: np.ndarray | torch.Tensor) -> tuple[np.ndarray, int, int]:
    """(C-contiguous little-endian numpy data, dtype code, ext code) of an array.

    torch tensors come back as numpy views where possible (bfloat16 as raw uint16 words).
    """
    if _torch.is_tensor(array):
        code = _torch_code(array.dtype)
        if code is None:
            raise TypeError(
                f"unsupported torch dtype {array.dtype}; supported: {supported_dtypes()}"
            )
        t = array.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        raw_dtype = _TORCH_RAW.get(_DTYPES[code][1])
        if raw_dtype is not None:
            data = t.view(_torch.require().int16).numpy().view(raw_dtype)
        else:
            data = t.numpy()
        return data, code, EXT_TORCH
    code = _numpy_code(array.dtype)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    # not ascontiguousarray: it turns 0-d arrays into 1-d ones
    data = array if array.flags.c_contiguous else np.array(array, order="C")
    return data, code, EXT_NUMPY


def _ext_frame(ext_code: int, length: int) -> bytes:
    if length <= 0xFF:
        return struct.pack(">BBb", 0xC7, length, ext_code)
    if length <= 0xFFFF:
        return struct.pack(">BHb", 0xC8, length, ext_code)
    return struct.pack(">BIb", 0xC9, length, ext_code)


class Column:
    """One field of a batch, laid out for fast per-item encoding.

    ``data`` is batch-major and C-contiguous: item ``i``'s value is ``data[i]``, or, when
    ``lengths`` is given, its first ``lengths[i]`` rows ``data[i, :lengths[i]]``.
    A ``scalar`` column holds one number per item, encoded as a plain msgpack number of
    fixed width (float64, int64, uint64 or bool), so that every blob of a batch has the
    same layout and :func:`decode_same_layout` can read a sample without parsing blobs.
    """

    def __init__(
        self, key: str, array: np.ndarray | torch.Tensor, lengths: np.ndarray | None = None
    ) -> None:
        self.key = key
        self.packed_key = msgpack.packb(key)
        self.scalar = array.ndim == 1
        if self.scalar:
            if _torch.is_tensor(array):
                if array.dtype == _torch.require().bfloat16:
                    array = array.float()
                array = array.detach().cpu().numpy()
            self.values = _fixed_width_numbers(np.asarray(array))
            return
        self.data, self.code, self.ext = raw_numpy(array)
        self.lengths = lengths
        self.item_shape = tuple(self.data.shape[1:])
        self.row_bytes = self.data.dtype.itemsize * int(
            np.prod(self.data.shape[2:], dtype=np.int64)
        )
        self.item_bytes = self.row_bytes * self.data.shape[1]
        self.flat = self.data.reshape(-1).view(np.uint8).data if self.data.size else None
        self._frames: dict[int, bytes] = {}

    def _frame(self, rows: int | None) -> bytes:
        frame = self._frames.get(rows if rows is not None else -1)
        if frame is None:
            shape = self.item_shape if rows is None else (rows, *self.item_shape[1:])
            size = self.row_bytes * rows if rows is not None else self.item_bytes
            header = _HEADER.pack(self.code, len(shape)) + struct.pack(f"<{len(shape)}Q", *shape)
            frame = _ext_frame(self.ext, len(header) + size) + header
            self._frames[rows if rows is not None else -1] = frame
        return frame

    def parts(self, index: int) -> list[Any]:
        if self.scalar:
            return [self.packed_key, self.values[index]]
        start = index * self.item_bytes
        if self.lengths is None:
            size = self.item_bytes
            frame = self._frame(None)
        else:
            rows = int(self.lengths[index])
            size = rows * self.row_bytes
            frame = self._frame(rows)
        raw = self.flat[start : start + size] if self.flat is not None and size else b""
        return [self.packed_key, frame, raw]


_NUMBER_FORMATS = {"f": (0xCB, ">f8"), "i": (0xD3, ">i8"), "u": (0xCF, ">u8")}


def _fixed_width_numbers(values: np.ndarray) -> list[Any]:
    """msgpack encodings of 1-D ``values``, one per item, all of the same width."""
    if values.dtype.kind == "b":
        return [b"\xc3" if value else b"\xc2" for value in values.tolist()]
    try:
        tag, dtype = _NUMBER_FORMATS[values.dtype.kind]
    except KeyError:
        raise TypeError(f"unsupported dtype {values.dtype} for a per-item number") from None
    table = np.empty((len(values), 9), dtype=np.uint8)
    table[:, 0] = tag
    table[:, 1:] = values.astype(dtype).view(np.uint8).reshape(-1, 8)
    flat = memoryview(table.tobytes())
    return [flat[9 * i : 9 * i + 9] for i in range(len(values))]


def encode_columns(columns: list[Column], n: int) -> list[bytes]:
    """Encode ``n`` items, item ``i`` being the map ``{column.key: column[i]}``.

    Each blob decodes to the same dict as :func:`packb`'s encoding of it, with one join per
    item instead of a Python hook per array. The bytes can differ: arrays are always ext
    8/16/32 (msgpack writes a fixext for payloads of 1, 2, 4, 8 or 16 bytes) and numbers
    always take 9 bytes.
    """
    if len(columns) >= 16:
        map_header = struct.pack(">BH", 0xDE, len(columns))
    else:
        map_header = bytes([0x80 | len(columns)])
    blobs = []
    for index in range(n):
        parts: list[Any] = [map_header]
        for column in columns:
            parts.extend(column.parts(index))
        blobs.append(b"".join(parts))
    return blobs


class RawArray(NamedTuple):
    """A decoded array not yet materialised: dtype, shape and a view of its bytes."""

    dtype: np.dtype
    shape: tuple[int, ...]
    data: memoryview


_header_cache: dict[bytes, tuple[np.dtype, tuple[int, ...], int, int]] = {}


def _raw_ext_hook(code: int, data: bytes) -> RawArray:
    if code != EXT_NUMPY and code != EXT_TORCH:
        raise DecodeError(f"unknown msgpack ext code {code}")
    if len(data) < 2:
        raise DecodeError("array payload shorter than its header")
    key = data[: 2 + 8 * data[1]]
    cached = _header_cache.get(key)
    if cached is None:
        dtype_code, shape, offset = _parse_header(data)
        np_dtype, torch_dtype = _DTYPES[dtype_code]
        if np_dtype is None:
            np_dtype = _TORCH_RAW[torch_dtype]
        count = 1
        for dim in shape:
            count *= dim
        cached = (np_dtype, shape, count * np_dtype.itemsize, offset)
        if len(_header_cache) < 4096:
            _header_cache[key] = cached
    np_dtype, shape, size, offset = cached
    if size != len(data) - offset:
        raise DecodeError(
            f"array of shape {shape} needs {size} bytes, payload has {len(data) - offset}"
        )
    return RawArray(np_dtype, shape, memoryview(data)[offset:])


def unpackb_raw(blob: bytes) -> Any:
    """Decode a blob leaving every array as a :class:`RawArray` (torch ones too), so a
    batch can be assembled with one copy per field by :func:`concat_raw`."""
    return _unpack(blob, _raw_ext_hook)


def concat_raw(values: list[RawArray], dtype: np.dtype, trailing: tuple[int, ...]) -> np.ndarray:
    """Concatenate raw arrays along their first axis into one new writable array of shape
    ``(total rows, *trailing)``; raise DecodeError if a value has another dtype or
    trailing shape."""
    rows = 0
    for value in values:
        if not isinstance(value, RawArray) or value.dtype != dtype:
            raise DecodeError(f"stored value {value!r:.80} is not a {dtype} array")
        if value.shape[1:] != trailing:
            raise DecodeError(
                f"stored array of shape {value.shape} does not have trailing shape {trailing}"
            )
        rows += value.shape[0]
    joined = bytearray().join([value.data for value in values])
    return np.frombuffer(joined, dtype=dtype).reshape((rows, *trailing))


def to_library(array: np.ndarray, lib: str, dtype: str) -> np.ndarray | torch.Tensor:
    """Hand a (writable) numpy array to the library named in the schema."""
    if lib != "torch":
        return array
    torch = _torch.require()
    tensor = torch.from_numpy(array)
    if dtype == "bfloat16":
        tensor = tensor.view(torch.bfloat16)
    return tensor


# -- decoding many blobs at once ---------------------------------------------------------


_BOOL = np.dtype("?")  # marks a msgpack true/false: the tag byte is the value
_NUMBER_TAGS = {0xCB: np.dtype(">f8"), 0xD3: np.dtype(">i8"), 0xCF: np.dtype(">u8")}
_EXT_TAGS = {0xC7: 1, 0xC8: 2, 0xC9: 4}  # ext 8/16/32: bytes of the length field


class _Segment(NamedTuple):
    """Where one map entry of a blob lies."""

    key: str
    key_start: int  # offset of the packed key
    tag_at: int  # offset of the value's msgpack tag byte
    start: int  # offset of the value's data
    size: int  # bytes of data
    dtype: np.dtype  # element dtype of the data (_BOOL for true/false)
    shape: tuple[int, ...] | None  # array shape; None for a number
    header_at: int = 0  # arrays: offset of the dtype code / ndim / shape header


def _blob_layout(blob: bytes) -> tuple[list[_Segment], list[tuple[int, int]]] | None:
    """Where each value of one blob lies, and the spans that must be identical in every
    blob of the same layout; None unless the blob is a map of str keys to arrays and
    fixed-width numbers (as :func:`encode_columns` writes them)."""
    view = memoryview(blob)
    if not view:
        return None
    first = view[0]
    if 0x80 <= first <= 0x8F:
        count, pos = first & 0x0F, 1
    elif first == 0xDE and len(view) >= 3:
        count, pos = struct.unpack_from(">H", view, 1)[0], 3
    else:
        return None
    segments: list[_Segment] = []
    fixed: list[tuple[int, int]] = [(0, pos)]
    try:
        for _ in range(count):
            key_start = pos
            tag = view[pos]
            if not 0xA0 <= tag <= 0xBF:
                return None
            key = bytes(view[pos + 1 : pos + 1 + (tag & 0x1F)]).decode()
            pos += 1 + (tag & 0x1F)
            tag = view[pos]
            if tag in (0xC2, 0xC3):
                fixed.append((key_start, pos))
                segments.append(_Segment(key, key_start, pos, pos, 1, _BOOL, None))
                pos += 1
                continue
            if tag in _NUMBER_TAGS:
                fixed.append((key_start, pos + 1))
                segments.append(_Segment(key, key_start, pos, pos + 1, 8, _NUMBER_TAGS[tag], None))
                pos += 9
                continue
            width = _EXT_TAGS.get(tag)
            if width is None:
                return None
            length = int.from_bytes(view[pos + 1 : pos + 1 + width], "big")
            ext_code = view[pos + 1 + width]
            header_at = pos + 2 + width
            if ext_code not in (EXT_NUMPY, EXT_TORCH):
                return None
            payload = bytes(view[header_at : header_at + length])
            dtype_code, shape, offset = _parse_header(payload)
            np_dtype, torch_dtype = _DTYPES[dtype_code]
            if np_dtype is None:
                np_dtype = _TORCH_RAW[torch_dtype]
            if math.prod(shape) * np_dtype.itemsize != length - offset:
                return None  # shape and payload disagree: the per-blob parse names the item
            fixed.append((key_start, header_at + offset))
            segments.append(
                _Segment(
                    key, key_start, pos, header_at + offset, length - offset, np_dtype, shape,
                    header_at,
                )
            )
            pos = header_at + length
    except (IndexError, DecodeError, UnicodeDecodeError):
        return None
    if pos != len(view):
        return None
    return segments, fixed


def _numbers(data: np.ndarray, segment: _Segment) -> np.ndarray:
    """Per-item numbers from their raw bytes (n, size), as float64 / int64 / uint64 / bool."""
    if segment.dtype is _BOOL:
        tags = data[:, 0]
        if not np.isin(tags, (0xC2, 0xC3)).all():
            raise DecodeError(f"field {segment.key!r}: not a boolean in every item")
        return tags == 0xC3
    return data.view(segment.dtype).reshape(-1).astype(segment.dtype.newbyteorder("="))


class Scratch:
    """A reusable byte area that blobs are copied into for decoding. A sample's blobs
    joined into a new 1 MiB bytes object every call cost more than the copy itself: the
    allocator hands the memory back to the system after each call and takes ~250 page
    faults to get it again. Not shared between threads (see :func:`take_scratch`)."""

    __slots__ = ("data", "parts")

    def __init__(self) -> None:
        self.data = bytearray()
        self.parts: list[np.ndarray] = []  # decode_ragged's per-field rows

    def part(self, index: int, size: int) -> np.ndarray:
        """The ``index``-th extra area, at least ``size`` bytes (a writable uint8 array),
        valid until its next use."""
        while len(self.parts) <= index:
            self.parts.append(np.empty(0, dtype=np.uint8))
        if len(self.parts[index]) < size:
            self.parts[index] = np.empty(max(size, 2 * len(self.parts[index])), dtype=np.uint8)
        return self.parts[index][:size]

    def join(self, blobs: list[bytes], total: int) -> np.ndarray:
        """The blobs one after another, ``total`` bytes: a read-only uint8 view of this
        area, valid until its next ``join``."""
        if len(self.data) < total:
            self.data = bytearray(max(total, 2 * len(self.data)))
        try:
            area = memoryview(self.data)
            pos = 0
            for blob in blobs:
                end = pos + len(blob)
                area[pos:end] = blob
                pos = end
        finally:
            area.release()  # a bytearray with a live view could not grow
        table = np.frombuffer(self.data, dtype=np.uint8, count=total)
        table.flags.writeable = False
        return table


# Areas not in use. list.pop / append are atomic, so threads never share one.
_scratch_pool: list[Scratch] = []


def take_scratch() -> Scratch:
    """A scratch area for this caller alone; hand it back with :func:`give_back`."""
    try:
        return _scratch_pool.pop()
    except IndexError:
        return Scratch()


def give_back(area: Scratch) -> None:
    if len(_scratch_pool) < 4:
        _scratch_pool.append(area)


def decode_same_layout(
    blobs: list[bytes], scratch: Scratch | None = None
) -> dict[str, np.ndarray] | None:
    """Decode blobs that share one layout (same keys, dtypes, shapes, number formats)
    without a per-blob parse: field -> array of shape (n, *item_shape).

    Array fields are read-only views into one joined copy of the blobs: a new bytes
    object, or ``scratch`` (then valid only until its next use: copy them out first).
    Numbers are new arrays. Fixed-shape items (dict batches, transitions, states,
    trajectories of one length) take this path; for others it returns None and
    :func:`unpackb_raw` decodes the blobs one by one.
    """
    if not blobs:
        return None
    size = len(blobs[0])
    for blob in blobs:
        if blob is None or len(blob) != size:
            return None
    layout = _blob_layout(blobs[0])
    if layout is None:
        return None
    segments, fixed = layout
    if scratch is not None:
        table = scratch.join(blobs, size * len(blobs)).reshape(len(blobs), size)
    else:
        table = np.frombuffer(b"".join(blobs), dtype=np.uint8).reshape(len(blobs), size)
    for start, end in fixed:
        block = table[:, start:end]
        if not (block == block[0]).all():
            return None
    columns: dict[str, np.ndarray] = {}
    for segment in segments:
        data = table[:, segment.start : segment.start + segment.size]
        if segment.shape is None:
            columns[segment.key] = _numbers(data, segment)
        else:
            # strided read-only views into the joined blobs: the container's join makes
            # the one copy, straight into the batch's layout
            columns[segment.key] = data.view(segment.dtype).reshape(len(blobs), *segment.shape)
    return columns


class Ragged(NamedTuple):
    """One array field of many items whose first dimensions differ: the items' rows
    concatenated and the number of rows of each item."""

    flat: np.ndarray
    rows: np.ndarray


def decode_ragged(
    blobs: list[bytes], scratch: Scratch | None = None
) -> dict[str, np.ndarray | Ragged] | None:
    """Decode blobs with the same keys, dtypes and trailing shapes but arrays of varying
    first dimension (variable-length trajectories), reading every header with a few
    vectorised numpy operations per field instead of a msgpack parse per blob.

    Numbers come back as new arrays of shape (n,), arrays as :class:`Ragged`: with
    ``scratch``, their rows lie in it (valid only until its next use: copy them out
    first), else in new arrays. Returns None when the blobs do not fit the first blob's
    structure.
    """
    if not blobs or any(blob is None for blob in blobs):
        return None
    layout = _blob_layout(blobs[0])
    if layout is None:
        return None
    segments, fixed = layout
    n = len(blobs)
    template = np.frombuffer(blobs[0], dtype=np.uint8)
    lengths = np.fromiter(map(len, blobs), dtype=np.int64, count=n)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    if scratch is not None:
        table = scratch.join(blobs, int(ends[-1]))
    else:
        table = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    view = table.data  # a memoryview (numpy's stubs give ndarray no __buffer__ before 3.12)

    def gather(at: np.ndarray, width: int) -> np.ndarray | None:
        index = at[:, None] + np.arange(width)
        if width and (index[:, -1] >= ends).any():
            return None
        return table[index]

    def same_as_template(at: np.ndarray, span: tuple[int, int]) -> bool:
        got = gather(at, span[1] - span[0])
        return got is not None and bool((got == template[span[0] : span[1]]).all())

    if not same_as_template(starts, fixed[0]):
        return None
    at = starts + fixed[0][1]
    columns: dict[str, np.ndarray | Ragged] = {}
    for segment, span in zip(segments, fixed[1:], strict=True):
        # the key, and for numbers the tag, must match; arrays may use ext 8, 16 or 32
        is_number = segment.shape is None
        if not same_as_template(
            at, (span[0], segment.tag_at + (is_number and segment.dtype is not _BOOL))
        ):
            return None
        value_at = at + (segment.tag_at - segment.key_start)
        if is_number:
            data = gather(value_at + (segment.start - segment.tag_at), segment.size)
            if data is None:
                return None
            columns[segment.key] = _numbers(data, segment)
            at = value_at + (segment.start - segment.tag_at) + segment.size
            continue
        assert segment.shape is not None  # a number's segment went on above
        ndim = len(segment.shape)
        if ndim == 0:
            return None
        trailing = segment.shape[1:]
        found = _same_frame_headers(gather, template, segment, value_at, n)
        if found is None:
            found = _any_frame_headers(gather, template, segment, value_at, n)
            if found is None:
                return None
        length, header_at, first_dims = found
        if (first_dims < 0).any():
            return None
        row_bytes = segment.dtype.itemsize * int(np.prod(trailing, dtype=np.int64))
        sizes = first_dims * row_bytes
        data_at = header_at + 2 + 8 * ndim
        if not (sizes == length - 2 - 8 * ndim).all() or (data_at + sizes > ends).any():
            return None
        if scratch is not None:
            # the rows go into a scratch area (no new memory): one copy per item
            area = scratch.part(len(columns), int(sizes.sum()))
            target = area.data
            pos = 0
            for start, size in zip(data_at.tolist(), sizes.tolist(), strict=True):
                target[pos : pos + size] = view[start : start + size]
                pos += size
            target.release()
            array = area.view(segment.dtype).reshape(-1, *trailing)
        else:
            flat = bytearray().join(
                [view[o : o + s] for o, s in zip(data_at.tolist(), sizes.tolist(), strict=True)]
            )
            array = np.frombuffer(flat, dtype=segment.dtype).reshape(-1, *trailing)
        columns[segment.key] = Ragged(array, first_dims)
        at = data_at + sizes
    if not (at == ends).all():
        return None
    return columns


_Headers = tuple[np.ndarray, np.ndarray, np.ndarray]  # ext length, header offset, first dim


def _same_frame_headers(
    gather: Any, template: np.ndarray, segment: _Segment, value_at: np.ndarray, n: int
) -> _Headers | None:
    """The common case of :func:`decode_ragged`: every item's ext frame of this field has
    the template's width, so its whole frame and header (tag, length, ext code, dtype
    code, ndim, dims) is one span that must equal the template's except for the length
    and the first dimension. Reads it with one gather; None when that does not hold."""
    width = segment.header_at - segment.tag_at - 2
    ndim = len(segment.shape or ())
    span = 4 + width + 8 * ndim
    head = gather(value_at, span)
    if head is None:
        return None
    varying = np.zeros(span, dtype=bool)
    varying[1 : 1 + width] = True  # the ext length
    varying[4 + width : 12 + width] = True  # the first dimension
    expected = template[segment.tag_at : segment.tag_at + span]
    if not (head[:, ~varying] == expected[~varying]).all():
        return None
    length = np.ascontiguousarray(head[:, 1 : 1 + width]).view(f">u{width}")[:, 0]
    first = np.ascontiguousarray(head[:, 4 + width : 12 + width]).view("<u8")[:, 0]
    return length.astype(np.int64), value_at + 2 + width, first.astype(np.int64)


def _any_frame_headers(
    gather: Any, template: np.ndarray, segment: _Segment, value_at: np.ndarray, n: int
) -> _Headers | None:
    """Like :func:`_same_frame_headers` for frames of mixed widths (ext 8, 16 or 32)."""
    ndim = len(segment.shape or ())
    frame = gather(value_at, 5)  # tag, then up to 4 length bytes
    if frame is None:
        return None
    tags = frame[:, 0]
    width = np.select([tags == 0xC7, tags == 0xC8, tags == 0xC9], [1, 2, 4], 0)
    if not width.all():
        return None
    big_endian = frame[:, 1:].astype(np.int64)
    length = np.select(
        [width == 1, width == 2],
        [big_endian[:, 0], big_endian[:, 0] * 256 + big_endian[:, 1]],
        ((big_endian[:, 0] * 256 + big_endian[:, 1]) * 256 + big_endian[:, 2]) * 256
        + big_endian[:, 3],
    )
    header_at = value_at + 2 + width
    codes = gather(header_at - 1, 3)  # ext code, dtype code, ndim
    dims = gather(header_at + 2, 8 * ndim)
    if codes is None or dims is None:
        return None
    if not (codes == template[segment.header_at - 1 : segment.header_at + 2]).all():
        return None
    dims = np.ascontiguousarray(dims).view("<u8").reshape(n, ndim).astype(np.int64)
    trailing = np.array(segment.shape[1:], dtype=np.int64)  # type: ignore[index]
    if not (dims[:, 1:] == trailing).all():
        return None
    return length, header_at, dims[:, 0]


@contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic GC: decoding a batch allocates thousands of small objects, none
    of them cyclic, and collections triggered by them doubled the decode time."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
