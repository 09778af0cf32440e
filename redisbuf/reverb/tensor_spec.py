"""Signatures without TensorFlow: :class:`TensorSpec`, and the JSON a table's signature is
kept as.

A table's ``signature`` may be any nest of specs with ``.shape`` and ``.dtype``
(``tf.TensorSpec`` when TensorFlow is installed, this module's :class:`TensorSpec`, an
``np.ndarray`` example is not a spec). It is stored as JSON with the table and read back
as ``tf.TensorSpec`` when TensorFlow is imported in the reading process (so that a
signature compares equal to the ``tf.TensorSpec`` it was made from), else as
:class:`TensorSpec`; this module never imports TensorFlow itself.
"""

from __future__ import annotations

import collections
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from . import nest


def numpy_dtype(dtype: Any) -> np.dtype:
    """A numpy dtype for a numpy, TensorFlow or Python dtype (``tf.string``: object)."""
    as_numpy = getattr(dtype, "as_numpy_dtype", None)
    if as_numpy is not None:
        dtype = as_numpy
    return np.dtype(dtype)


def shape_of(shape: Any) -> tuple[int | None, ...] | None:
    """A shape (tuple, list, TensorShape, ``tf.TensorShape``) as a tuple, or None for an
    unknown rank."""
    if shape is None:
        return None
    if isinstance(shape, TensorShape):
        return shape.dims
    as_list = getattr(shape, "as_list", None)
    if as_list is not None:
        if getattr(shape, "rank", 0) is None:
            return None
        shape = as_list()
    return tuple(None if d is None else int(d) for d in shape)


class TensorShape:
    """A shape: dimensions (``None``: any length), or ``None`` for any rank. A leaf of a
    nest (not a tuple), as ``tf.TensorShape`` is; equal to the tuple or list of its
    dimensions."""

    __slots__ = ("dims",)

    def __init__(self, dims: Sequence[int | None] | None) -> None:
        self.dims = shape_of(dims)

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def as_list(self) -> list[int | None]:
        if self.dims is None:
            raise ValueError("as_list() is not defined on an unknown shape")
        return list(self.dims)

    def __iter__(self) -> Any:
        return iter(self.dims or ())

    def __len__(self) -> int:
        return len(self.dims or ())

    def __getitem__(self, index: Any) -> Any:
        if self.dims is None:
            raise ValueError("an unknown shape has no dimensions")
        return self.dims[index]

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TensorShape):
            return other.dims == self.dims
        if isinstance(other, (tuple, list)):
            return self.dims == tuple(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.dims)

    def __repr__(self) -> str:
        return "TensorShape(None)" if self.dims is None else f"TensorShape({list(self.dims)})"


class TensorSpec:
    """The shape, dtype and name of a tensor (``tf.TensorSpec``'s fields, numpy dtypes).

    Args:
        shape: a sequence of dimensions (``None``: any length), or ``None`` (any rank).
        dtype: a numpy (or TensorFlow) dtype.
        name: an optional name.

    Examples:
        >>> import numpy as np
        >>> from redisbuf.reverb import TensorSpec
        >>> spec = TensorSpec([None, 3], np.float32, "obs")
        >>> spec.shape, spec.dtype, spec.is_compatible_with(np.zeros((5, 3), np.float32))
        (TensorShape([None, 3]), dtype('float32'), True)
    """

    __slots__ = ("dtype", "name", "shape")

    def __init__(self, shape: Sequence[int | None] | None, dtype: Any = np.float32,
                 name: str | None = None) -> None:
        self.shape = TensorShape(shape)
        self.dtype = numpy_dtype(dtype)
        self.name = name

    @classmethod
    def from_spec(cls, spec: Any, name: str | None = None) -> TensorSpec:
        """This class's spec of any object with ``.shape`` and ``.dtype``."""
        return cls(shape_of(spec.shape), numpy_dtype(spec.dtype),
                   name if name is not None else getattr(spec, "name", None))

    @classmethod
    def from_array(cls, array: Any, name: str | None = None) -> TensorSpec:
        array = np.asarray(array)
        return cls(array.shape, array.dtype, name)

    def is_compatible_with(self, value: Any) -> bool:
        """Whether an array (or spec) has this dtype and a shape this one allows."""
        other = value if hasattr(value, "shape") and hasattr(value, "dtype") \
            else np.asarray(value)
        if numpy_dtype(other.dtype) != self.dtype:
            return False
        return shapes_compatible(self.shape.dims, shape_of(other.shape))

    def __eq__(self, other: object) -> bool:
        if not (hasattr(other, "shape") and hasattr(other, "dtype")):
            return NotImplemented
        try:
            return (shape_of(other.shape) == self.shape.dims
                    and numpy_dtype(other.dtype) == self.dtype
                    and getattr(other, "name", None) == self.name)
        except TypeError:
            return False

    def __hash__(self) -> int:
        return hash((self.shape.dims, self.dtype.str, self.name))

    def __repr__(self) -> str:
        shape = "None" if self.shape.dims is None else list(self.shape.dims)
        return f"TensorSpec(shape={shape}, dtype={self.dtype.name}, name={self.name!r})"


def shapes_compatible(want: tuple[int | None, ...] | None,
                      got: tuple[int | None, ...] | None) -> bool:
    """Whether shape ``got`` fits ``want`` (``None`` dimensions and ranks fit anything)."""
    if want is None or got is None:
        return True
    return len(want) == len(got) and all(w is None or g is None or w == g
                                         for w, g in zip(want, got, strict=True))


def is_spec(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(
        value, np.ndarray)


def _dtype_text(dtype: np.dtype) -> str:
    return "string" if dtype.kind in "OSU" else dtype.name


def to_json(signature: Any) -> Any:
    """A nest of specs as plain JSON data (containers tagged, leaves as shape, dtype,
    name).

    Raises:
        ValueError: a leaf that is not a spec.
    """
    if isinstance(signature, Mapping):
        return {"dict": [[key, to_json(value)] for key, value in signature.items()]}
    if isinstance(signature, tuple) and hasattr(signature, "_fields"):
        return {"namedtuple": type(signature).__name__,
                "fields": [[name, to_json(getattr(signature, name))]
                           for name in signature._fields]}
    if isinstance(signature, (list, tuple)):
        return {"list" if isinstance(signature, list) else "tuple":
                [to_json(value) for value in signature]}
    if not is_spec(signature):
        raise ValueError(f"Unsupported signature spec: {signature}")
    spec = TensorSpec.from_spec(signature)
    return {"shape": None if spec.shape.dims is None else list(spec.shape.dims),
            "dtype": _dtype_text(spec.dtype), "name": spec.name}


def _make_spec(shape: Any, dtype: str, name: str | None) -> Any:
    tf = sys.modules.get("tensorflow")
    if tf is not None and hasattr(tf, "TensorSpec"):
        return tf.TensorSpec(shape=shape, dtype=getattr(tf, dtype), name=name)
    return TensorSpec(shape, object if dtype == "string" else dtype, name)


def make_spec(shape: Any, dtype: Any, name: str | None = None) -> Any:
    """A spec: ``tf.TensorSpec`` when TensorFlow is imported, else :class:`TensorSpec`."""
    return _make_spec(shape, _dtype_text(numpy_dtype(dtype)), name)


def from_json(data: Any) -> Any:
    """The nest :func:`to_json` wrote, its leaves ``tf.TensorSpec`` when TensorFlow is
    imported, else :class:`TensorSpec`."""
    if "dict" in data:
        return {key if not isinstance(key, list) else tuple(key): from_json(value)
                for key, value in data["dict"]}
    if "namedtuple" in data:
        names = [name for name, _ in data["fields"]]
        cls = collections.namedtuple(data["namedtuple"], names)  # type: ignore[misc]
        return cls(*(from_json(value) for _, value in data["fields"]))
    if "list" in data:
        return [from_json(value) for value in data["list"]]
    if "tuple" in data:
        return tuple(from_json(value) for value in data["tuple"])
    return _make_spec(data["shape"], data["dtype"], data.get("name"))


def flat_specs(signature: Any) -> list[TensorSpec]:
    """The leaves of a signature as this module's specs."""
    return [TensorSpec.from_spec(leaf) for leaf in nest.flatten(signature)]


def spec_text(specs: Sequence[TensorSpec]) -> str:
    """Reverb's listing of flat specs: ``0: Tensor<name: 'x', dtype: int64, shape: []>``."""
    from ..buffers.step_writer import dtype_name, shape_text

    return ", ".join(
        f"{i}: Tensor<name: '{s.name or ''}', dtype: {dtype_name(s.dtype)}, shape: "
        f"{'<unknown>' if s.shape.dims is None else shape_text(s.shape.dims)}>"
        for i, s in enumerate(specs))


__all__ = ["TensorShape", "TensorSpec", "flat_specs", "from_json", "is_spec", "make_spec",
           "numpy_dtype", "shape_of", "shapes_compatible", "spec_text", "to_json"]
