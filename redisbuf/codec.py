"""msgpack encoding of items: numpy arrays and torch tensors as typed raw bytes.

An array travels as a msgpack ext value (code 1 for numpy, 2 for torch) whose payload is::

    dtype code (1 byte) | ndim (1 byte) | shape (ndim x uint64, little-endian) | raw bytes

The raw bytes are the C-contiguous, little-endian element data. Decoding wraps them with
``np.frombuffer`` / ``torch.frombuffer``: no copy, and no code is ever executed (no pickle).
Decoded arrays are read-only views of the blob.
"""

from __future__ import annotations

import struct
import warnings
from typing import Any

import msgpack
import numpy as np
import torch

from .errors import DecodeError

EXT_NUMPY = 1
EXT_TORCH = 2
MAX_NDIM = 32

# code -> (numpy dtype, torch dtype); bfloat16 has no numpy dtype and is torch-only.
_DTYPES: dict[int, tuple[np.dtype | None, torch.dtype | None]] = {
    1: (np.dtype("bool"), torch.bool),
    2: (np.dtype("<i1"), torch.int8),
    3: (np.dtype("<i2"), torch.int16),
    4: (np.dtype("<i4"), torch.int32),
    5: (np.dtype("<i8"), torch.int64),
    6: (np.dtype("u1"), torch.uint8),
    7: (np.dtype("<f2"), torch.float16),
    8: (None, torch.bfloat16),
    9: (np.dtype("<f4"), torch.float32),
    10: (np.dtype("<f8"), torch.float64),
    11: (np.dtype("<u2"), getattr(torch, "uint16", None)),
    12: (np.dtype("<u4"), getattr(torch, "uint32", None)),
    13: (np.dtype("<u8"), getattr(torch, "uint64", None)),
}
_NUMPY_CODE = {
    np_dtype.newbyteorder("<"): code for code, (np_dtype, _) in _DTYPES.items() if np_dtype is not None
}
_TORCH_CODE = {t: code for code, (_, t) in _DTYPES.items() if t is not None}
# bytes-level numpy dtype used to move torch data in and out (bfloat16 as raw 2-byte words)
_TORCH_RAW = {torch.bfloat16: np.dtype("<u2")}
_HEADER = struct.Struct("<BB")

# torch.frombuffer warns on read-only buffers; our decoded tensors are read-only views by design.
warnings.filterwarnings("ignore", message="The given buffer is not writable", category=UserWarning)


def dtype_name(array: np.ndarray | torch.Tensor) -> str:
    """A short, library-neutral name of an array's dtype (``float32``, ``bfloat16``...)."""
    if isinstance(array, torch.Tensor):
        return str(array.dtype).removeprefix("torch.")
    return np.dtype(array.dtype).name


def _numpy_code(dtype: np.dtype) -> int:
    try:
        return _NUMPY_CODE[dtype.newbyteorder("<")]
    except KeyError:
        raise TypeError(f"unsupported numpy dtype {dtype}; supported: {supported_dtypes()}") from None


def supported_dtypes() -> list[str]:
    return [str(t).removeprefix("torch.") for _, t in _DTYPES.values() if t is not None]


def _pack_array(code: int, shape: tuple[int, ...], raw: bytes | memoryview) -> bytes:
    if len(shape) > MAX_NDIM:
        raise TypeError(f"arrays of more than {MAX_NDIM} dimensions are not supported")
    return b"".join((_HEADER.pack(code, len(shape)), struct.pack(f"<{len(shape)}Q", *shape), raw))


def encode_numpy(array: np.ndarray) -> msgpack.ExtType:
    code = _numpy_code(array.dtype)
    if array.dtype.byteorder == ">":
        array = array.astype(array.dtype.newbyteorder("<"))
    data = np.ascontiguousarray(array)
    raw = data.data.cast("B") if data.size else b""
    return msgpack.ExtType(EXT_NUMPY, _pack_array(code, array.shape, raw))


def encode_torch(tensor: torch.Tensor) -> msgpack.ExtType:
    try:
        code = _TORCH_CODE[tensor.dtype]
    except KeyError:
        raise TypeError(
            f"unsupported torch dtype {tensor.dtype}; supported: {supported_dtypes()}"
        ) from None
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    raw_dtype = _TORCH_RAW.get(t.dtype)
    if raw_dtype is not None:
        data = t.view(torch.int16).numpy().view(raw_dtype)
    else:
        data = t.numpy()
    raw = data.tobytes() if data.size else b""
    return msgpack.ExtType(EXT_TORCH, _pack_array(code, tuple(t.shape), raw))


def _default(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return encode_numpy(obj)
    if isinstance(obj, torch.Tensor):
        return encode_torch(obj)
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
    itemsize = np_dtype.itemsize if np_dtype is not None else torch_dtype.itemsize
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
    torch_dtype = _DTYPES[code][1]
    if torch_dtype is None:
        raise DecodeError(f"dtype code {code} is not supported by this torch version")
    count = _checked_count(code, shape, data, offset)
    if count == 0:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(data, dtype=torch_dtype, count=count, offset=offset).reshape(shape)


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


def unpackb(blob: bytes) -> Any:
    """Decode a blob made by :func:`packb`; raise :class:`DecodeError` if it is malformed."""
    try:
        return msgpack.unpackb(blob, ext_hook=_ext_hook, raw=False, strict_map_key=False)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"malformed msgpack blob: {exc}") from exc
