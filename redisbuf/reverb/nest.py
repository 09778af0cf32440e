"""Nested structures as Reverb handles them (dm-tree's rules), without dm-tree.

A structure is a leaf or a container of structures: a ``dict`` (any mapping), a
``list``, a ``tuple`` or a named tuple. Flattening visits a mapping's values by sorted
key (the key order of the mapping itself is kept when one is rebuilt), sequences in
order; ``None`` is a leaf, as in dm-tree. Paths are tuples of keys and indices (a named
tuple's fields by name).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np


def _is_namedtuple(value: Any) -> bool:
    return isinstance(value, tuple) and hasattr(value, "_fields")


_CONTAINERS = (dict, list, tuple)
_LEAVES = (np.ndarray, np.generic, int, float, bool, str, bytes, type(None))


def is_nested(value: Any) -> bool:
    """Whether ``value`` is a container (not a leaf)."""
    kind = type(value)
    if kind in _CONTAINERS:
        return True
    if kind in _LEAVES:
        return False
    return isinstance(value, (Mapping, list, tuple))


def _children(value: Any) -> list[tuple[Any, Any]]:
    """(path element, child) of a container, in flattening order."""
    kind = type(value)
    if kind is dict:
        return [(key, value[key]) for key in sorted(value)]
    if kind is list or kind is tuple:
        return list(enumerate(value))
    if isinstance(value, Mapping):
        return [(key, value[key]) for key in sorted(value)]
    if _is_namedtuple(value):
        return [(name, getattr(value, name)) for name in value._fields]
    return list(enumerate(value))


def _rebuild(template: Any, children: list[Any]) -> Any:
    """A container like ``template`` holding ``children`` (in flattening order)."""
    if isinstance(template, Mapping):
        by_key = dict(zip(sorted(template), children, strict=True))
        items = [(key, by_key[key]) for key in template]
        try:
            return type(template)(items)  # type: ignore[call-arg]
        except TypeError:  # a mapping type that takes no pairs
            return dict(items)
    if _is_namedtuple(template):
        return type(template)(*children)
    if isinstance(template, tuple):
        return tuple(children)
    return list(children)


# The walks below are module functions, not closures: a closure that calls itself is a
# reference cycle, which would hold the leaves it saw (a batch's arrays) until the garbage
# collector runs, not until the caller lets them go.


def _paths_into(value: Any, path: tuple[Any, ...], out: list[tuple[tuple[Any, ...], Any]]
                ) -> None:
    if not is_nested(value):
        out.append((path, value))
        return
    for key, child in _children(value):
        _paths_into(child, (*path, key), out)


def _leaves_into(value: Any, out: list[Any]) -> None:
    if not is_nested(value):
        out.append(value)
        return
    for _, child in _children(value):
        _leaves_into(child, out)


def _built(template: Any, leaves: Iterator[Any]) -> Any:
    if not is_nested(template):
        return next(leaves)
    return _rebuild(template, [_built(child, leaves) for _, child in _children(template)])


def _same(x: Any, y: Any, path: tuple[Any, ...], check_types: bool) -> None:
    if is_nested(x) != is_nested(y):
        raise ValueError(f"the structures differ at {path}: {x!r} and {y!r}")
    if not is_nested(x):
        return
    if check_types and type(x) is not type(y):
        raise TypeError(f"the structures differ at {path}: {type(x).__name__} and "
                        f"{type(y).__name__}")
    cx, cy = _children(x), _children(y)
    if [k for k, _ in cx] != [k for k, _ in cy]:
        raise ValueError(f"the structures differ at {path}: keys {[k for k, _ in cx]} "
                         f"and {[k for k, _ in cy]}")
    for (key, vx), (_, vy) in zip(cx, cy, strict=True):
        _same(vx, vy, (*path, key), check_types)


def flatten_with_path(structure: Any) -> list[tuple[tuple[Any, ...], Any]]:
    """Every leaf with its path, in flattening order."""
    out: list[tuple[tuple[Any, ...], Any]] = []
    _paths_into(structure, (), out)
    return out


def flatten(structure: Any) -> list[Any]:
    """The leaves of ``structure`` in flattening order.

    Examples:
        >>> from redisbuf.reverb.nest import flatten
        >>> flatten({"b": 1, "a": [2, (3, None)]})
        [2, 3, None, 1]
    """
    out: list[Any] = []
    _leaves_into(structure, out)
    return out


def unflatten_as(structure: Any, flat: list[Any]) -> Any:
    """``flat`` (leaves in flattening order) put into the shape of ``structure``.

    Raises:
        ValueError: ``flat`` holds another number of leaves.
    """
    flat = list(flat)
    count = len(flatten(structure))
    if count != len(flat):
        raise ValueError(f"the structure has {count} leaves, {len(flat)} were given")
    return _built(structure, iter(flat))


def assert_same_structure(a: Any, b: Any, check_types: bool = True) -> None:
    """Raise ``ValueError`` unless ``a`` and ``b`` nest alike (``TypeError`` when
    ``check_types`` and a container differs in type)."""
    _same(a, b, (), check_types)


def map_structure(fn: Callable[..., Any], *structures: Any) -> Any:
    """``fn`` applied to the leaves of ``structures`` (which nest alike), in the shape
    of the first."""
    for other in structures[1:]:
        assert_same_structure(structures[0], other, check_types=False)
    flats = [flatten(s) for s in structures]
    return unflatten_as(structures[0], [fn(*leaves) for leaves in zip(*flats, strict=True)])


def map_structure_with_path(fn: Callable[..., Any], *structures: Any) -> Any:
    """As :func:`map_structure`, ``fn`` taking the leaf's path first."""
    for other in structures[1:]:
        assert_same_structure(structures[0], other, check_types=False)
    paths = [p for p, _ in flatten_with_path(structures[0])]
    flats = [flatten(s) for s in structures]
    return unflatten_as(structures[0], [fn(path, *leaves) for path, *leaves
                                        in zip(paths, *flats, strict=True)])


def leaves(structure: Any) -> Iterator[Any]:
    """The leaves, lazily."""
    yield from flatten(structure)


__all__ = ["assert_same_structure", "flatten", "flatten_with_path", "is_nested", "leaves",
           "map_structure", "map_structure_with_path", "unflatten_as"]
