"""Items of any nest, kept exactly and never pickled: the records of schemaless buffers.

A nest is ``None``, ``bool``, ``int`` (-2^63 <= i < 2^64), ``float``, ``str``, ``bytes``,
a numpy array or scalar, a torch tensor, or a ``dict`` / ``list`` / ``tuple`` of nests;
dict keys are ``str``, ``bytes``, ``int``, ``float``, ``bool``, ``None``, numpy scalars or
tuples of keys. Types are matched exactly (a subclass such as ``OrderedDict``, a
namedtuple, ``np.matrix`` or ``nn.Parameter`` is refused), so what comes back has the
types, dtypes, shapes, dict key order and key types that went in. Anything else raises
:class:`~redisbuf.errors.UnsupportedItemError` (a ``TypeError``) naming where it lies and
its type, before anything is written.

Other classes are stored through a registered type (:func:`register_type`): a tag and
two functions that turn an object into a nest and back. Built in: ``easydict.EasyDict``
and treetensor's trees (``treetensor.torch.Tensor``, ``treetensor.numpy.ndarray``,
DI-engine's transitions), matched by class name, so neither package is imported until a
record holds one.

One item is one msgpack value: containers and plain values as msgpack's own types
(``list`` an array, ``dict`` a map in its key order), arrays as the codec's ext values
(type 1 numpy, type 2 torch; see :mod:`redisbuf.store.codec`), and three ext types of
this module: 3, a tuple (payload: a msgpack array of its elements), 4, a numpy scalar
(payload: a 0-d array's, as type 1), and 5, a value of a registered type (payload: a
msgpack array of its tag and its nest). ``docs/wire-format.md`` gives the bytes.

Decoded arrays and tensors are new, writable, C-contiguous and aligned; tensors are on
the CPU and do not require grad; numpy byte order is native (little-endian).
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import msgpack
import numpy as np

from ..errors import DecodeError, UnsupportedItemError
from . import _torch, codec

EXT_TUPLE = 3
EXT_NUMPY_SCALAR = 4
EXT_TAGGED = 5

#: deepest nesting of containers an item may have (msgpack's own limit is 512)
MAX_DEPTH = 256

_SUPPORTED = (
    "dict, list, tuple, None, bool, int, float, str, bytes, numpy arrays and scalars "
    "and torch tensors"
)
_PLAIN = (type(None), bool, int, float, str, bytes)


def _tensor_type() -> type | None:
    torch = _torch.imported()
    return None if torch is None else torch.Tensor


# (dtype code, shape) -> the payload header: dtype code, ndim, shape as little-endian u64
_headers: dict[tuple[int, tuple[int, ...]], bytes] = {}
_numpy_codes: dict[np.dtype, int] = {}  # little-endian numpy dtype -> dtype code


def _header(code: int, shape: tuple[int, ...]) -> bytes:
    header = _headers.get((code, shape))
    if header is None:
        if len(shape) > codec.MAX_NDIM:
            raise TypeError(f"arrays of more than {codec.MAX_NDIM} dimensions are not supported")
        header = struct.pack(f"<BB{len(shape)}Q", code, len(shape), *shape)
        if len(_headers) < 4096:
            _headers[(code, shape)] = header
    return header


def _numpy_payload(array: np.ndarray) -> bytes:
    """The array payload of a numpy array (a C-contiguous little-endian copy if need be)."""
    code = _numpy_codes.get(array.dtype)
    if code is None or not array.flags.c_contiguous:
        data, code, _ = codec.raw_numpy(array)  # converts, or refuses the dtype
        if data.dtype.byteorder != ">":
            _numpy_codes.setdefault(data.dtype, code)
        array = data
    raw: Any = array.reshape(-1).view(np.uint8) if array.size else b""  # a buffer
    return b"".join((_header(code, array.shape), raw))


def _tensor_payload(tensor: Any) -> bytes:
    known = codec._torch_code(tensor.dtype)
    if known is None or tensor.requires_grad or not tensor.is_cpu or (
            not tensor.is_contiguous()) or tensor.dtype is _torch.require().bfloat16:
        data, code, _ = codec.raw_numpy(tensor)  # also refuses the dtype and layout
    else:
        data, code = tensor.numpy(), known
    raw: Any = data.reshape(-1).view(np.uint8) if data.size else b""  # a buffer
    return b"".join((_header(code, data.shape), raw))


class _Type(NamedTuple):
    tag: str
    to_nest: Callable[[Any], Any]
    from_nest: Callable[[Any], Any]


_by_class: dict[type, _Type] = {}  # registered classes
_by_class_name: dict[str, _Type] = {}  # built-in ones, by "module.qualname", not imported
_by_tag: dict[str, _Type] = {}


def register_type(
    cls: type, tag: str, to_nest: Callable[[Any], Any], from_nest: Callable[[Any], Any]
) -> None:
    """Store objects of exactly ``cls`` as ``[tag, to_nest(obj)]`` (ext type 5), read back as
    ``from_nest(nest)``; ``to_nest`` must return a nest (it may hold registered types).
    For facades whose users' data holds such objects (a tensordict, a tree of tensors).
    A process that reads such a record must have registered the tag too.

    Args:
        cls: the class (matched exactly, as every type of a nest).
        tag: the name records carry (unique: ``"package.Class"`` by convention).
        to_nest: object -> nest.
        from_nest: nest -> object.

    Raises:
        ValueError: ``tag`` or ``cls`` is registered already with other functions.

    Examples:
        >>> import fractions
        >>> from redisbuf.store.nest import decode_nest, encode_nest, register_type
        >>> register_type(fractions.Fraction, "fractions.Fraction",
        ...               lambda f: (f.numerator, f.denominator),
        ...               lambda pair: fractions.Fraction(*pair))
        >>> decode_nest(encode_nest({"p": fractions.Fraction(1, 3)}))
        {'p': Fraction(1, 3)}
    """
    entry = _Type(tag, to_nest, from_nest)
    for key, held in ((tag, _by_tag.get(tag)), (cls, _by_class.get(cls))):
        if held is not None and held != entry:
            raise ValueError(f"{key!r} is registered already (tag {held.tag!r})")
    _by_tag[tag] = _by_class[cls] = entry


def _tree_to_nest(tree: Any) -> dict[str, Any]:
    """A treevalue tree (treetensor's trees) as nested dicts of its leaves."""
    tree_class = sys.modules["treevalue"].TreeValue  # imported: a tree exists
    return {key: _tree_to_nest(value) if isinstance(value, tree_class) else value
            for key, value in tree.items()}


def _treetensor(module: str, name: str) -> Callable[[Any], Any]:
    def build(nest: Any) -> Any:
        try:
            package = __import__(module, fromlist=[name])
            from treevalue.tree.common import create_storage
        except ImportError as exc:
            raise DecodeError(f"a record holds a {module}.{name}, and {module} does not "
                              f"import here: {exc}") from None
        # from a storage: building from the dict formats every leaf (torch's repr),
        # 1.2 ms for a transition of a few tensors instead of a few microseconds
        return getattr(package, name)(create_storage(nest))
    return build


def _easydict(nest: Any) -> Any:
    try:
        from easydict import EasyDict
    except ImportError as exc:
        raise DecodeError(f"a record holds an easydict.EasyDict, and easydict does not "
                          f"import here: {exc}") from None
    return EasyDict(nest)


for _class_name, _entry in {
    "treetensor.torch.tensor.Tensor": _Type(
        "treetensor.torch.Tensor", _tree_to_nest, _treetensor("treetensor.torch", "Tensor")),
    "treetensor.numpy.array.ndarray": _Type(
        "treetensor.numpy.ndarray", _tree_to_nest, _treetensor("treetensor.numpy", "ndarray")),
    "easydict.EasyDict": _Type("easydict.EasyDict", dict, _easydict),
}.items():
    _by_class_name[_class_name] = _by_tag[_entry.tag] = _entry


def _registered(kind: type) -> _Type | None:
    entry = _by_class.get(kind)
    if entry is None and _by_class_name:
        entry = _by_class_name.get(f"{kind.__module__}.{kind.__qualname__}")
    return entry


def _default(obj: Any) -> msgpack.ExtType:
    """msgpack's hook for what it does not pack itself under ``strict_types``."""
    kind = type(obj)
    if kind is tuple:
        return msgpack.ExtType(EXT_TUPLE, _pack(list(obj)))
    if kind is np.ndarray:
        return msgpack.ExtType(codec.EXT_NUMPY, _numpy_payload(obj))
    if kind is _tensor_type():
        if obj.layout is not _torch.require().strided:
            raise TypeError(f"a {obj.layout} tensor")
        return msgpack.ExtType(codec.EXT_TORCH, _tensor_payload(obj))
    if isinstance(obj, np.generic):
        return msgpack.ExtType(EXT_NUMPY_SCALAR, _numpy_payload(np.asarray(obj)))
    entry = _registered(kind)
    if entry is not None:
        value = entry.to_nest(obj)
        if _loose(value, 0):
            raise TypeError("refused before packing")
        return msgpack.ExtType(EXT_TAGGED, _pack([entry.tag, value]))
    raise TypeError(kind.__name__)


def _pack(obj: Any) -> bytes:
    return msgpack.packb(obj, default=_default, use_bin_type=True, strict_types=True,
                         datetime=False)


def encode_nest(item: Any, where: str = "item") -> bytes:
    """One nest as one record (see the module docstring).

    Args:
        item: the nest.
        where: how the error names the item (``"items[3]"``).

    Returns:
        The record's bytes.

    Raises:
        UnsupportedItemError: ``item`` holds a value of a type not listed above, an ``int``
            outside 64 bits, a ``str`` that is not valid UTF-8, a container that holds
            itself or is nested deeper than :data:`MAX_DEPTH`, or an array or tensor of
            an unsupported dtype or layout; the message names the path (``item['obs'][2]``)
            and the type.

    Examples:
        >>> import numpy as np
        >>> from redisbuf.store.nest import decode_nest, encode_nest
        >>> item = {"obs": np.zeros(2, np.float32), 3: ("a", None), "r": np.float32(1)}
        >>> back = decode_nest(encode_nest(item))
        >>> list(back), back["obs"].dtype, back[3], type(back["r"]).__name__
        (['obs', 3, 'r'], dtype('float32'), ('a', None), 'float32')
    """
    try:
        if _loose(item, 0):
            raise TypeError("refused before packing")
        return _pack(item)
    except Exception as exc:  # noqa: BLE001 - msgpack, numpy and torch refuse in their own ways
        found = _locate(item, where, 0, set())
        if found is None:  # the walk finds every refusal msgpack makes; never seen otherwise
            raise UnsupportedItemError(f"cannot store {where}: {exc}") from None
        path, problem = found
        raise UnsupportedItemError(f"cannot store {path}: {problem}") from None


_LOOSE = (bytearray, memoryview)


def _loose(obj: Any, depth: int) -> bool:
    """Whether ``obj`` holds what msgpack would take but this codec refuses: a bytearray
    or memoryview (msgpack stores them as bytes, they would come back as ``bytes``), or
    containers nested :data:`MAX_DEPTH` deep."""
    kind = type(obj)
    if kind is dict:
        if depth >= MAX_DEPTH:
            return True
        for key, value in obj.items():
            if type(key) is memoryview or (type(key) is tuple and _loose(key, depth)):
                return True
            kind = type(value)
            if kind in _LOOSE or (kind in _CONTAINERS and _loose(value, depth + 1)):
                return True
        return False
    if kind is list or kind is tuple:
        if depth >= MAX_DEPTH:
            return True
        for value in obj:
            kind = type(value)
            if kind in _LOOSE or (kind in _CONTAINERS and _loose(value, depth + 1)):
                return True
        return False
    return kind in _LOOSE


_CONTAINERS = (dict, list, tuple)


def encode_items(items: Sequence[Any]) -> list[bytes]:
    """One record per item of ``items``, errors naming the item as ``items[i]``.

    Args:
        items: the nests.

    Returns:
        Their records, in order.

    Raises:
        UnsupportedItemError: as :func:`encode_nest`; nothing is returned for any item.
    """
    return [encode_nest(item, f"items[{index}]") for index, item in enumerate(items)]


def _unsupported(obj: Any) -> str:
    kind = type(obj)
    name = kind.__qualname__ if kind.__module__ == "builtins" else (
        f"{kind.__module__}.{kind.__qualname__}")
    return (f"a value of type {name} (a nest holds only {_SUPPORTED}, of exactly these "
            "types, and registered types: redisbuf.store.nest.register_type)")


def _array_problem(obj: Any) -> str | None:
    try:
        codec.encode_array(obj)
    except Exception as exc:  # noqa: BLE001 - torch refuses layouts with RuntimeError
        return f"a {type(obj).__name__} that cannot be stored ({exc})"
    return None


def _locate(obj: Any, path: str, depth: int, open_ids: set[int]) -> tuple[str, str] | None:
    """(path, problem) of the first value of ``obj`` that :func:`encode_nest` refuses."""
    kind = type(obj)
    if kind in _PLAIN:
        if kind is int and not -(2**63) <= obj < 2**64:
            return path, "an int outside the 64-bit range [-2**63, 2**64)"
        if kind is str:
            try:
                obj.encode("utf-8")
            except UnicodeEncodeError:
                return path, "a str that is not valid UTF-8 (it holds lone surrogates)"
        return None
    if kind is np.ndarray or kind is _tensor_type():
        problem = _array_problem(obj)
        return None if problem is None else (path, problem)
    if isinstance(obj, np.generic):
        problem = _array_problem(np.asarray(obj))
        return None if problem is None else (path, problem.replace("ndarray", kind.__name__))
    if kind not in (list, tuple, dict):
        entry = _registered(kind)
        if entry is None:
            return path, _unsupported(obj)
        try:
            value = entry.to_nest(obj)
        except Exception as exc:  # noqa: BLE001 - a registered type's own failure
            return path, f"a {kind.__name__} whose conversion failed ({exc})"
        return _locate(value, path, depth, open_ids)
    if id(obj) in open_ids:
        return path, f"a {kind.__name__} that contains itself"
    if depth >= MAX_DEPTH:
        return path, f"containers nested deeper than {MAX_DEPTH}"
    open_ids.add(id(obj))
    try:
        if kind is dict:
            for key, value in obj.items():
                found = _key_problem(key, path)
                if found is None:
                    found = _locate(value, f"{path}[{key!r}]", depth + 1, open_ids)
                if found is not None:
                    return found
            return None
        for index, value in enumerate(obj):
            found = _locate(value, f"{path}[{index}]", depth + 1, open_ids)
            if found is not None:
                return found
        return None
    finally:
        open_ids.discard(id(obj))


def _key_problem(key: Any, path: str) -> tuple[str, str] | None:
    kind = type(key)
    if kind is tuple:
        for part in key:
            found = _key_problem(part, path)
            if found is not None:
                return found
        return None
    if kind in _PLAIN or isinstance(key, np.generic):
        found = _locate(key, path, 0, set())
        return None if found is None else (path, f"a dict key that is {found[1]}")
    return path, f"a dict key of type {kind.__qualname__} (keys are str, bytes, int, float, " \
        "bool, None, numpy scalars or tuples of these)"


# -- decoding ---------------------------------------------------------------------------


# payload header -> (numpy dtype holding the data, shape, element count, data offset)
_parsed: dict[bytes, tuple[np.dtype, tuple[int, ...], int, int]] = {}


def _array(payload: bytes) -> np.ndarray:
    """A new aligned, writable numpy array of an array payload's dtype code, shape and
    data (bfloat16 as its raw uint16 words)."""
    key = payload[: 2 + 8 * payload[1]] if len(payload) >= 2 else payload
    parsed = _parsed.get(key)
    if parsed is None:
        code, shape, offset = codec._parse_header(payload)
        np_dtype, torch_name = codec._DTYPES[code]
        if np_dtype is None:
            np_dtype = codec._TORCH_RAW[torch_name]
        parsed = (np_dtype, shape, math.prod(shape), offset)
        if len(_parsed) < 4096:
            _parsed[key] = parsed
    np_dtype, shape, count, offset = parsed
    if count * np_dtype.itemsize != len(payload) - offset:
        raise DecodeError(f"array of shape {shape} needs {count * np_dtype.itemsize} bytes, "
                          f"payload has {len(payload) - offset}")
    return np.frombuffer(payload, np_dtype, count, offset).copy().reshape(shape)


def _ext_hook(code: int, payload: bytes) -> Any:
    if code == EXT_TAGGED:
        tagged = _unpack(payload)
        if type(tagged) is not list or len(tagged) != 2 or type(tagged[0]) is not str:
            raise DecodeError("a tagged value's payload is not [tag, nest]")
        entry = _by_tag.get(tagged[0])
        if entry is None:
            raise DecodeError(f"a record holds a value tagged {tagged[0]!r}, a type not "
                              "registered in this process (redisbuf.store.nest.register_type)")
        return entry.from_nest(tagged[1])
    if code == EXT_TUPLE:
        items = _unpack(payload)
        if type(items) is not list:
            raise DecodeError("a tuple's payload is not a msgpack array")
        return tuple(items)
    if code == codec.EXT_NUMPY or code == EXT_NUMPY_SCALAR:
        dtype_code = payload[0] if payload else 0
        if dtype_code in codec._DTYPES and codec._DTYPES[dtype_code][0] is None:
            raise DecodeError(f"dtype code {dtype_code} exists only for torch tensors")
        array = _array(payload)
        if code == codec.EXT_NUMPY:
            return array
        if array.ndim:
            raise DecodeError("a numpy scalar's payload has dimensions")
        return array[()]
    if code == codec.EXT_TORCH:
        dtype_code = payload[0] if payload else 0
        if dtype_code in codec._DTYPES and codec._torch_dtype(dtype_code) is None:
            raise DecodeError(f"dtype code {dtype_code} is not supported by this torch version")
        array = _array(payload)
        return codec.to_library(array, "torch", codec._DTYPES[dtype_code][1])
    raise DecodeError(f"unknown msgpack ext code {code}")


def _unpack(blob: bytes) -> Any:
    return msgpack.unpackb(blob, ext_hook=_ext_hook, raw=False, strict_map_key=False,
                           use_list=True, timestamp=0)


def decode_nest(blob: bytes) -> Any:
    """The nest a record of :func:`encode_nest` holds, with new writable arrays.

    Args:
        blob: the record.

    Returns:
        The nest.

    Raises:
        DecodeError: the record is not one (malformed msgpack, an unknown ext type or
            dtype code, an array whose shape and data disagree, a map key that is a list).
    """
    try:
        return _unpack(blob)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise DecodeError(f"malformed nest record: {type(exc).__name__}: {exc}") from exc
