"""The msgpack codec: typed raw-byte arrays and tensors, zero-copy decoding, no pickle,
and DecodeError (never anything else) for malformed blobs."""

from __future__ import annotations

import pickle
import struct
from pathlib import Path

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import redisbuf
from redisbuf.errors import DecodeError
from redisbuf.store import codec

# codec.py silences this torch warning at import; pytest's per-test warning capture undoes that
pytestmark = pytest.mark.filterwarnings("ignore:The given buffer is not writable")

FAST = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]
TORCH_DTYPES = [
    torch.bool,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.uint8,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
]


def _numpy_sample(dtype: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(bool)
    if np.issubdtype(np.dtype(dtype), np.integer):
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
    return np.asarray(rng.normal(size=shape) * 1000).astype(dtype)


def _torch_sample(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=gen) * 1000).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, generator=gen, dtype=dtype)


def _ext_payload(code: int, shape: tuple[int, ...], raw: bytes) -> bytes:
    return struct.pack("<BB", code, len(shape)) + struct.pack(f"<{len(shape)}Q", *shape) + raw


# -- round trips ------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3, 0), (5,), (2, 3, 4)])
def test_numpy_round_trip_is_exact(dtype, shape):
    array = _numpy_sample(dtype, shape)
    out = codec.unpackb(codec.packb(array))
    assert isinstance(out, np.ndarray)
    assert out.dtype == np.dtype(dtype)
    assert out.shape == shape
    assert out.tobytes() == array.tobytes()  # bit-exact, NaN payloads and -0.0 included


@pytest.mark.parametrize("dtype", TORCH_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(), (0,), (4, 0), (5,), (2, 3, 4)])
def test_torch_round_trip_is_exact(dtype, shape):
    tensor = _torch_sample(dtype, shape)
    out = codec.unpackb(codec.packb(tensor))
    assert isinstance(out, torch.Tensor)
    assert out.dtype == dtype
    assert tuple(out.shape) == shape
    assert torch.equal(out, tensor)


def test_numpy_and_torch_stay_distinct_inside_nested_structures():
    item = {
        "a": np.arange(3, dtype=np.int16),
        "b": torch.arange(3, dtype=torch.int16),
        "nested": [np.float32(1.5), {"c": torch.zeros(2, dtype=torch.bfloat16)}],
        "s": "text",
        "raw": b"\x00\x01",
    }
    out = codec.unpackb(codec.packb(item))
    assert isinstance(out["a"], np.ndarray) and out["a"].dtype == np.int16
    assert isinstance(out["b"], torch.Tensor) and out["b"].dtype == torch.int16
    assert out["nested"][0] == 1.5 and isinstance(out["nested"][0], float)
    assert out["nested"][1]["c"].dtype == torch.bfloat16
    assert out["s"] == "text" and out["raw"] == b"\x00\x01"


def test_special_float_values_survive():
    array = np.array([np.nan, np.inf, -np.inf, -0.0, 5e-324, np.finfo(np.float64).max])
    out = codec.unpackb(codec.packb(array))
    assert out.tobytes() == array.tobytes()
    tensor = torch.tensor([float("nan"), float("inf"), -0.0], dtype=torch.bfloat16)
    back = codec.unpackb(codec.packb(tensor))
    assert back.view(torch.int16).tolist() == tensor.view(torch.int16).tolist()


@pytest.mark.parametrize("dtype", ["int16", "int32", "int64", "float16", "float32", "float64"])
def test_big_endian_input_decodes_to_the_same_values(dtype):
    native = _numpy_sample(dtype, (4, 3), seed=1)
    big = native.astype(np.dtype(dtype).newbyteorder(">"))
    assert big.dtype.byteorder == ">"
    out = codec.unpackb(codec.packb(big))
    assert out.dtype == np.dtype(dtype)  # stored little-endian / native
    np.testing.assert_array_equal(out, native)
    # the wire format is little-endian: both inputs give the same blob
    assert codec.packb(big) == codec.packb(native)


def test_non_contiguous_numpy_input():
    base = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
    views = [base[:, ::2, 1:4], base.T, base[::-1], np.asfortranarray(base)]
    for view in views:
        out = codec.unpackb(codec.packb(view))
        assert out.shape == view.shape
        np.testing.assert_array_equal(out, view)
        assert out.flags.c_contiguous


def test_non_contiguous_torch_input():
    base = torch.arange(60, dtype=torch.float64).reshape(3, 4, 5)
    for view in [base[:, ::2, 1:4], base.transpose(0, 2), base.flip(0), base[:, 1]]:
        out = codec.unpackb(codec.packb(view))
        assert out.shape == view.shape
        assert torch.equal(out, view)


def test_torch_tensor_with_grad_is_encoded_detached():
    tensor = torch.arange(4, dtype=torch.float32, requires_grad=True) * 2
    out = codec.unpackb(codec.packb(tensor))
    assert not out.requires_grad
    assert torch.equal(out, tensor.detach())


@FAST
@given(
    hnp.arrays(
        dtype=st.sampled_from([np.dtype(d) for d in NUMPY_DTYPES]),
        shape=hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
    )
)
def test_numpy_round_trip_property(array):
    out = codec.unpackb(codec.packb(array))
    assert out.dtype == array.dtype and out.shape == array.shape
    assert out.tobytes() == np.ascontiguousarray(array).tobytes()


# -- zero copy, no pickle -------------------------------------------------------------


def test_decoding_is_a_read_only_view_of_the_blob():
    array = np.arange(1000, dtype=np.float64)
    out = codec.unpackb(codec.packb(array))
    assert not out.flags.writeable  # a view of immutable bytes, not a fresh copy
    assert not out.flags.owndata
    assert out.base is not None
    base = out.base
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, (bytes, memoryview))
    with pytest.raises(ValueError):
        out[0] = 1.0


def test_blob_is_plain_msgpack_with_typed_ext_values():
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    blob = codec.packb({"a": array, "t": torch.ones(2, dtype=torch.bfloat16)})
    plain = msgpack.unpackb(blob, raw=False)  # any msgpack reader can parse it
    ext = plain["a"]
    assert isinstance(ext, msgpack.ExtType) and ext.code == codec.EXT_NUMPY
    code, ndim = struct.unpack_from("<BB", ext.data)
    assert ndim == 2 and struct.unpack_from("<2Q", ext.data, 2) == (2, 3)
    assert ext.data[2 + 16 :] == array.astype("<i4").tobytes()
    assert plain["t"].code == codec.EXT_TORCH
    assert msgpack.unpackb(blob, ext_hook=codec._ext_hook, raw=False)["a"].tolist() == [
        [0, 1, 2],
        [3, 4, 5],
    ]


@pytest.mark.parametrize(
    "obj", [np.arange(3), {"a": [1, 2]}, (1, 2), object(), np.array(["x"], dtype=object)]
)
def test_pickle_payload_is_rejected(obj):
    try:
        payload = pickle.dumps(obj)
    except Exception:
        pytest.skip("cannot pickle")
    with pytest.raises(DecodeError):
        codec.unpackb(payload)


def test_object_arrays_and_unknown_types_are_not_encoded():
    with pytest.raises(TypeError):
        codec.packb(np.array([{"a": 1}], dtype=object))
    with pytest.raises(TypeError):
        codec.packb({"x": object()})
    with pytest.raises(TypeError):
        codec.packb(np.zeros(2, dtype=np.complex64))


def test_no_pickle_anywhere_in_the_package():
    root = Path(redisbuf.__file__).parent
    offenders = [
        str(path)
        for path in root.rglob("*.py")
        if "import pickle" in path.read_text() or "pickle.load" in path.read_text()
        or "torch.load" in path.read_text()
    ]
    assert offenders == []


# -- malformed input ----------------------------------------------------------------------


def test_truncated_blobs_raise_decode_error():
    blob = codec.packb({"x": np.arange(10, dtype=np.float32), "y": torch.ones(3)})
    for cut in range(len(blob)):
        with pytest.raises(DecodeError):
            codec.unpackb(blob[:cut])


def test_unknown_ext_code_raises_decode_error():
    payload = _ext_payload(9, (2,), np.zeros(2, np.float32).tobytes())
    assert isinstance(codec.unpackb(msgpack.packb(msgpack.ExtType(1, payload))), np.ndarray)
    for code in (0, 3, 7, 127):
        with pytest.raises(DecodeError, match="ext code"):
            codec.unpackb(msgpack.packb(msgpack.ExtType(code, payload)))


@pytest.mark.parametrize("ext", [codec.EXT_NUMPY, codec.EXT_TORCH])
@pytest.mark.parametrize(
    "payload",
    [
        b"",  # no header
        b"\x09",  # half a header
        struct.pack("<BB", 0, 1) + struct.pack("<Q", 1) + b"\x00",  # dtype code 0
        struct.pack("<BB", 200, 0) + b"\x00",  # unknown dtype code
        struct.pack("<BB", 9, 33) + b"\x00" * (33 * 8),  # too many dimensions
        struct.pack("<BB", 9, 2) + struct.pack("<Q", 4),  # shape truncated
        _ext_payload(9, (3,), b"\x00" * 11),  # one byte short
        _ext_payload(9, (3,), b"\x00" * 13),  # one byte long
        _ext_payload(10, (2**32, 2**32), b"\x00" * 8),  # huge declared shape
        _ext_payload(10, (2**63, 2), b""),  # overflowing element count
        _ext_payload(9, (0, 2**64 - 1), b""),  # zero elements, absurd dimension
        _ext_payload(4, (3,), b"\x00" * 6),  # int32 with int16-sized data
    ],
)
def test_malformed_array_payloads_raise_decode_error(ext, payload):
    with pytest.raises(DecodeError):
        codec.unpackb(msgpack.packb(msgpack.ExtType(ext, payload)))


def test_bfloat16_is_refused_as_a_numpy_array():
    payload = _ext_payload(8, (2,), b"\x00" * 4)
    with pytest.raises(DecodeError, match="torch"):
        codec.unpackb(msgpack.packb(msgpack.ExtType(codec.EXT_NUMPY, payload)))
    assert codec.unpackb(msgpack.packb(msgpack.ExtType(codec.EXT_TORCH, payload))).dtype == (
        torch.bfloat16
    )


def test_garbage_and_trailing_bytes_raise_decode_error():
    blob = codec.packb({"x": np.arange(3)})
    for bad in [blob + b"\x00", b"\xc1", b"\xff" * 8, b"\xdf\xff\xff\xff\xff"]:
        with pytest.raises(DecodeError):
            codec.unpackb(bad)


@FAST
@given(st.binary(max_size=200))
def test_fuzz_random_bytes_never_raise_anything_but_decode_error(data):
    try:
        codec.unpackb(data)
    except DecodeError:
        pass


@FAST
@given(
    ext=st.sampled_from([codec.EXT_NUMPY, codec.EXT_TORCH]),
    code=st.integers(0, 255),
    shape=st.lists(st.integers(0, 2**64 - 1) | st.integers(0, 6), max_size=5),
    raw=st.binary(max_size=64),
)
def test_fuzz_array_headers(ext, code, shape, raw):
    blob = msgpack.packb(msgpack.ExtType(ext, _ext_payload(code, tuple(shape), raw)))
    try:
        out = codec.unpackb(blob)
    except DecodeError:
        return
    # whatever decodes must be consistent with what the header declared
    assert tuple(out.shape) == tuple(shape)
    size = out.nbytes if isinstance(out, np.ndarray) else out.numel() * out.element_size()
    assert size == len(raw)


@FAST
@given(data=st.data())
def test_fuzz_corrupted_valid_blobs(data):
    array = data.draw(
        hnp.arrays(
            dtype=st.sampled_from([np.dtype(d) for d in ("int8", "float32", "float64")]),
            shape=hnp.array_shapes(min_dims=0, max_dims=3, max_side=4),
        )
    )
    blob = bytearray(codec.packb({"x": array, "t": torch.from_numpy(array.copy())}))
    position = data.draw(st.integers(0, len(blob) - 1))
    blob[position] = data.draw(st.integers(0, 255))
    try:
        codec.unpackb(bytes(blob))
    except DecodeError:
        pass
