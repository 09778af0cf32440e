"""The nest codec (redisbuf.store.nest): any nest of containers, plain values, arrays and
tensors comes back with the same types, dtypes, shapes, key order and key types; anything
else is refused with a TypeError naming its path; malformed records raise DecodeError."""

from __future__ import annotations

import collections
import math
import pickle
from typing import Any, NamedTuple

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from redisbuf.errors import DecodeError, InvalidBatchError, UnsupportedItemError
from redisbuf.store import nest
from redisbuf.store.nest import decode_nest, encode_items, encode_nest

FAST = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])

NUMPY_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
                "uint64", "float16", "float32", "float64"]
TORCH_DTYPES = [torch.bool, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
                torch.float16, torch.bfloat16, torch.float32, torch.float64]


def assert_same(got: Any, want: Any, path: str = "item") -> None:
    """Exact equality: types, dtypes, shapes, values (NaN equal to NaN), key order."""
    assert type(got) is type(want), f"{path}: {type(got)} != {type(want)}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{path}: keys {list(got)} != {list(want)}"
        for (gk, gv), (wk, wv) in zip(got.items(), want.items(), strict=True):
            assert_same(gk, wk, f"{path} key")
            assert_same(gv, wv, f"{path}[{wk!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), path
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{path}[{index}]")
    elif isinstance(want, np.ndarray):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert np.array_equal(got, want, equal_nan=want.dtype.kind == "f"), path
        assert got.flags.writeable and got.flags.c_contiguous and got.flags.aligned, path
    elif isinstance(want, np.generic):
        assert got.dtype == want.dtype, path
        assert got == want or (np.isnan(got) and np.isnan(want)), path
    elif isinstance(want, torch.Tensor):
        assert got.dtype == want.dtype and got.shape == want.shape, path
        assert torch.equal(torch.nan_to_num(got.float()), torch.nan_to_num(want.float())), path
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), path
    else:
        assert got == want, path


def roundtrip(item: Any) -> Any:
    back = decode_nest(encode_nest(item))
    assert_same(back, item)
    return back


# -- round trips ----------------------------------------------------------------------


def test_plain_values_keep_their_types() -> None:
    for value in [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**64 - 1, 1.5, -0.0,
                  float("inf"), float("nan"), "", "héllo ☃", b"", b"\x00\xff"]:
        roundtrip(value)
    assert type(decode_nest(encode_nest(1))) is int
    assert type(decode_nest(encode_nest(1.0))) is float
    assert type(decode_nest(encode_nest(True))) is bool


def test_containers_keep_types_key_order_and_key_types() -> None:
    item = {
        "z": [1, (2, 3), [], ()],
        1: ("a", ("nested", (None,))),
        b"raw": {2.5: None, None: 0, True: "t", (1, "x", (2,)): [()]},
        np.int64(7): "numpy key",
        "a": {},
    }
    back = roundtrip(item)
    assert list(back) == ["z", 1, b"raw", np.int64(7), "a"]
    assert type(next(k for k in back if isinstance(k, np.generic))) is np.int64


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (3,), (2, 0, 3), (2, 3, 4)])
def test_numpy_arrays_keep_dtype_and_shape(dtype: str, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    array = (rng.standard_normal(shape) * 50).astype(dtype)
    roundtrip({"x": array})


@pytest.mark.parametrize("dtype", NUMPY_DTYPES)
def test_numpy_scalars_come_back_as_numpy_scalars(dtype: str) -> None:
    scalar = np.array(3, dtype=dtype)[()]
    back = roundtrip([scalar])
    assert type(back[0]) is type(scalar)


@pytest.mark.parametrize("dtype", TORCH_DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (4,), (2, 3)])
def test_torch_tensors_keep_dtype_and_shape(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    tensor = (torch.randn(shape) * 10).to(dtype)
    back = roundtrip((tensor,))
    back[0].add_(1) if dtype is not torch.bool else back[0].logical_not_()  # writable


def test_decoded_arrays_are_new_writable_and_independent() -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    blob = encode_nest({"a": array, "t": torch.arange(3)})
    first, second = decode_nest(blob), decode_nest(blob)
    first["a"][0, 0] = 100
    first["t"][0] = 100
    assert second["a"][0, 0] == 0 and second["t"][0] == 0 and array[0, 0] == 0


def test_views_and_odd_layouts_are_stored_by_value() -> None:
    base = np.arange(24, dtype=np.int32).reshape(4, 6)
    fortran = np.asfortranarray(base)
    strided = base[::2, 1::2]
    big_endian = base.astype(">i4")
    back = decode_nest(encode_nest([fortran, strided, big_endian, torch.arange(10)[::3]]))
    assert np.array_equal(back[0], base) and np.array_equal(back[1], strided)
    assert np.array_equal(back[2], base) and back[2].dtype == np.dtype("<i4")
    assert back[3].tolist() == [0, 3, 6, 9]


def test_tensors_come_back_on_cpu_without_grad() -> None:
    tensor = torch.ones(3, requires_grad=True)
    back = decode_nest(encode_nest(tensor * 2))
    assert back.device.type == "cpu" and not back.requires_grad and back.tolist() == [2.0] * 3


def test_shared_references_come_back_as_copies() -> None:
    inner = [1, 2]
    back = roundtrip([inner, inner])
    assert back[0] is not back[1]


def test_deep_nesting_within_the_limit() -> None:
    item: Any = "leaf"
    for depth in range(nest.MAX_DEPTH - 1):
        item = [item] if depth % 2 else (item,)
    roundtrip(item)


# hypothesis: arbitrary nests
_keys = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=5)
    | st.binary(max_size=5) | st.floats(allow_nan=False),
    lambda inner: st.tuples(inner, inner),
    max_leaves=4,
)
_arrays = st.sampled_from(NUMPY_DTYPES).flatmap(
    lambda dtype: hnp.arrays(np.dtype(dtype), hnp.array_shapes(min_dims=0, max_dims=3,
                                                              min_side=0, max_side=3)))
_leaves = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8) | _arrays
    | _arrays.map(lambda a: a.reshape(-1)[0] if a.size else np.float32(0))
    | _arrays.filter(lambda a: a.dtype.kind != "u" or a.dtype.itemsize == 1).map(
        lambda a: torch.from_numpy(np.array(a)))
)
_nests = st.recursive(
    _leaves,
    lambda inner: st.lists(inner, max_size=4) | st.lists(inner, max_size=4).map(tuple)
    | st.dictionaries(_keys, inner, max_size=4),
    max_leaves=20,
)


@FAST
@given(_nests)
def test_any_nest_round_trips_exactly(item: Any) -> None:
    roundtrip(item)


# -- refusals -------------------------------------------------------------------------


class Point(NamedTuple):
    x: int
    y: int


class Opaque:
    pass


@pytest.mark.parametrize(
    ("item", "path", "type_name"),
    [
        ({"obs": [1, {2, 3}]}, "item['obs'][1]", "set"),
        ([Point(1, 2)], "item[0]", "Point"),
        ({"a": collections.OrderedDict()}, "item['a']", "OrderedDict"),
        ((1, Opaque()), "item[1]", "Opaque"),
        ({"f": lambda: 0}, "item['f']", "function"),
        ([bytearray(b"x")], "item[0]", "bytearray"),
        ({"m": np.ones((1, 1)).view(np.matrix)}, "item['m']", "matrix"),
        ({"p": torch.nn.Parameter(torch.zeros(1))}, "item['p']", "Parameter"),
        ([1, 2.0j], "item[1]", "complex"),
    ],
)
def test_unsupported_types_are_refused_naming_path_and_type(
    item: Any, path: str, type_name: str
) -> None:
    with pytest.raises(TypeError) as info:
        encode_nest(item)
    assert info.type is UnsupportedItemError
    assert f"cannot store {path}:" in str(info.value)
    assert type_name in str(info.value)


@pytest.mark.parametrize(
    ("item", "path", "words"),
    [
        ({"big": 2**64}, "item['big']", "64-bit"),
        ([-(2**63) - 1], "item[0]", "64-bit"),
        ({"s": "\udc80"}, "item['s']", "UTF-8"),
        ({"a": np.array(["text"])}, "item['a']", "dtype"),
        ({"a": np.zeros(2, dtype=object)}, "item['a']", "dtype"),
        ({"a": np.zeros(2, dtype=np.complex64)}, "item['a']", "dtype"),
        ({"d": np.datetime64("2020-01-01")}, "item['d']", "datetime64"),
        ({"t": torch.zeros(2, dtype=torch.complex64)}, "item['t']", "dtype"),
        ({"t": torch.zeros(2).to_sparse()}, "item['t']", "Tensor"),
        ({frozenset(): 1}, "item", "frozenset"),
        ({(1, [2]): 1} if False else {(1, Opaque()): 1}, "item", "Opaque"),
    ],
)
def test_unsupported_values_are_refused(item: Any, path: str, words: str) -> None:
    with pytest.raises(UnsupportedItemError) as info:
        encode_nest(item)
    assert f"cannot store {path}:" in str(info.value) and words in str(info.value)


def test_self_containing_and_too_deep_nests_are_refused() -> None:
    loop: list[Any] = [1]
    loop.append({"back": loop})
    with pytest.raises(UnsupportedItemError, match=r"item\[1\]\['back'\]: a list that contains"):
        encode_nest(loop)
    deep: Any = 0
    for _ in range(nest.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(UnsupportedItemError, match="nested deeper"):
        encode_nest(deep)


def test_encode_items_names_the_item_and_returns_nothing() -> None:
    with pytest.raises(UnsupportedItemError, match=r"cannot store items\[2\]\['x'\]"):
        encode_items([{"x": 1}, {"x": 2}, {"x": {3}}])
    assert issubclass(UnsupportedItemError, InvalidBatchError)
    assert len(encode_items([1, "a", None])) == 3


# -- the bytes ------------------------------------------------------------------------


def test_record_bytes_follow_the_wire_format() -> None:
    # as docs/wire-format.md spells them
    assert encode_nest({"a": (1, None)}) == bytes.fromhex("81a161" "c70303" "9201c0")
    assert encode_nest(()) == bytes.fromhex("d403" "90")  # msgpack's fixext 1
    assert encode_nest(np.float32(1.0)) == bytes.fromhex("c706040900" + "0000803f")
    array = encode_nest(np.array([1, 2], dtype=np.int16))
    assert array == bytes.fromhex("c70e010301" + "0200000000000000" + "01000200")
    assert encode_nest(torch.tensor([1.0]))[2] == 2  # ext type 2


def test_records_decode_with_a_plain_msgpack_reader() -> None:
    """A reader in another language needs only msgpack and the ext payloads."""
    blob = encode_nest({"obs": np.array([0.5, 1.5]), "t": ("x", 1)})
    raw = msgpack.unpackb(blob, raw=False)
    assert raw["obs"].code == 1 and raw["t"].code == nest.EXT_TUPLE
    assert msgpack.unpackb(raw["t"].data) == ["x", 1]
    payload = raw["obs"].data
    assert payload[0] == 10 and payload[1] == 1  # float64, one dimension
    assert np.frombuffer(payload[10:], "<f8").tolist() == [0.5, 1.5]


def test_no_pickle_anywhere() -> None:
    blob = encode_nest({"x": np.arange(3), "t": torch.zeros(2), "n": np.int8(1)})
    assert b"numpy.core" not in blob and b"torch._utils" not in blob
    with pytest.raises(DecodeError):
        decode_nest(pickle.dumps({"x": 1}))


@pytest.mark.parametrize(
    "blob",
    [
        b"\xc1",  # never used
        b"\x92\x01",  # truncated array
        msgpack.packb(msgpack.ExtType(9, b"")),  # unknown ext
        msgpack.packb(msgpack.ExtType(1, b"\x63\x00")),  # unknown dtype code
        msgpack.packb(msgpack.ExtType(1, b"\x09\x01" + (5).to_bytes(8, "little") + b"1234")),
        msgpack.packb(msgpack.ExtType(nest.EXT_TUPLE, msgpack.packb({"a": 1}))),
        msgpack.packb(msgpack.ExtType(nest.EXT_NUMPY_SCALAR, b"\x09\x01" + bytes(8) )),
        msgpack.packb(msgpack.ExtType(1, b"\x08\x00\x00\x00")),  # bfloat16 as numpy
        b"\x81\x91\x01\x02",  # a map keyed by a list
    ],
)
def test_malformed_records_raise_decode_error(blob: bytes) -> None:
    with pytest.raises(DecodeError):
        decode_nest(blob)


# -- registered types -----------------------------------------------------------------


class Money:
    def __init__(self, cents: int, currency: str) -> None:
        self.cents, self.currency = cents, currency


nest.register_type(Money, "tests.Money", lambda m: (m.cents, m.currency),
                   lambda pair: Money(*pair))


def test_registered_types_round_trip_inside_nests() -> None:
    back = decode_nest(encode_nest({"price": [Money(150, "EUR")], "n": 1}))
    assert type(back["price"][0]) is Money
    assert (back["price"][0].cents, back["price"][0].currency) == (150, "EUR")
    raw = msgpack.unpackb(encode_nest(Money(1, "X")))
    assert raw.code == nest.EXT_TAGGED and msgpack.unpackb(raw.data)[0] == "tests.Money"


def test_registered_types_are_matched_exactly_and_checked() -> None:
    class Cheap(Money):
        pass

    with pytest.raises(UnsupportedItemError, match=r"item\[0\]: a value of type .*Cheap"):
        encode_nest([Cheap(1, "EUR")])
    with pytest.raises(UnsupportedItemError, match=r"item\['m'\]\[1\]: a value of type set"):
        encode_nest({"m": Money(1, {"not", "a nest"})})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="registered already"):
        nest.register_type(Money, "tests.Other", str, str)
    nest.register_type(Money, "tests.Money", *nest._by_tag["tests.Money"][1:])  # same: fine


def test_an_unregistered_tag_does_not_decode() -> None:
    blob = msgpack.packb(msgpack.ExtType(nest.EXT_TAGGED, msgpack.packb(["no.Such", 1])))
    with pytest.raises(DecodeError, match="no.Such"):
        decode_nest(blob)
    with pytest.raises(DecodeError, match="tag"):
        decode_nest(msgpack.packb(msgpack.ExtType(nest.EXT_TAGGED, msgpack.packb([1]))))


def test_easydict_round_trips() -> None:
    easydict = pytest.importorskip("easydict")
    config = easydict.EasyDict({"a": 1, "b": {"c": [1, {"d": 2}]}})
    back = decode_nest(encode_nest(config))
    assert type(back) is easydict.EasyDict and type(back.b) is easydict.EasyDict
    assert back == config and back.b.c[1].d == 2


def test_treetensor_trees_round_trip() -> None:
    ttorch = pytest.importorskip("treetensor.torch")
    tree = ttorch.as_tensor({"obs": torch.randn(4), "done": False, "info": {"a": torch.ones(2)}})
    tree.env_data_id = ttorch.as_tensor([3])
    back = decode_nest(encode_nest([tree]))[0]
    assert type(back) is type(tree) and type(back.info) is type(tree)
    assert sorted(back.keys()) == sorted(tree.keys())
    assert torch.equal(back.obs, tree.obs) and back.env_data_id.item() == 3
    assert back.done.dtype == torch.bool
