"""Pytrees on a :class:`~redisbuf.torchrl.RedisbufStorage`: nests of dicts, lists and
tuples of tensors that a TensorDict cannot hold (a list, a tuple, a key that is not a
string), stored exactly and read back as the same nest.

Each leaf is one stored field, named by its number in ``tree_flatten`` order and its
path from the root, parts joined by ``"."``: a string key as itself, an int key ``n`` as
``<n>``, list index ``i`` as ``[i]``, tuple index ``i`` as ``(i)``.
``{"a": t, "b": {"c": [t, (t,)]}, 30: t}`` is stored as the fields ``0.a``,
``1.b.c.[0]``, ``2.b.c.[1].(0)`` and ``3.<30>``; the numbers give back the dicts' key
order (the stored schema sorts field names), and the schema fixes the nest for every
process. A string key shaped like a typed part (``"[0]"``) is refused anywhere, so no
TensorDict key reads back as a list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch
from tensordict import TensorDict, is_tensor_collection
from torch.utils._pytree import tree_flatten, tree_map

from .errors import InvalidBatchError

__all__ = [
    "batch_of_one", "check_key_part", "fields_of_tree", "flatten_leading", "item_of",
    "reshape_items", "stack_items", "tree_of", "ListStackError",
]

#: joins the parts of a nested key (or a pytree path) into one redisbuf field name
KEY_SEPARATOR = "."
_TYPED_PART = re.compile(r"^(?:\[(\d+)\]|\((\d+)\)|<(-?\d+)>)$")


class ListStackError(InvalidBatchError, RuntimeError):
    """The items of a list given to ``extend`` cannot be stacked into one batch (shapes,
    dtypes or nests differ): redisbuf's :class:`~redisbuf.errors.InvalidBatchError` that
    is also the ``RuntimeError`` TorchRL's storages raise there, with their message."""


def stack_items(items: list[Any]) -> Any:
    """One batch of the items of a list (tensors, TensorDicts, mappings or pytrees,
    each without a batch dimension), stacked along a new first dimension."""
    if not items:
        raise InvalidBatchError("extend got an empty list")
    try:
        if isinstance(items[0], torch.Tensor) and not is_tensor_collection(items[0]):
            return torch.stack(items)
        if _is_tree(items[0]):
            return tree_map(lambda *leaves: torch.stack(leaves), items[0], *items[1:])
        return torch.stack([item if is_tensor_collection(item) else
                            TensorDict(item, batch_size=[]) for item in items])
    except (RuntimeError, ValueError, TypeError) as error:
        raise ListStackError(f"Stacking the elements of the list resulted in an error: "
                             f"{error}") from error


def check_key_part(part: str, key: Any) -> None:
    """Refuse a string key part that the field names use for another purpose."""
    if KEY_SEPARATOR in part:
        raise InvalidBatchError(
            f"key {key!r}: {part!r} contains {KEY_SEPARATOR!r}, which joins the parts of "
            "nested keys into field names"
        )
    if _TYPED_PART.match(part):
        raise InvalidBatchError(
            f"key {key!r}: {part!r} is how a stored field names a list index ([i]), a "
            "tuple index ((i)) or an int key (<n>)"
        )


def _is_tree(data: Any) -> bool:
    """Whether ``data`` is a nest a TensorDict cannot hold (a tuple, a list inside it, a
    key that is not a string)."""
    if isinstance(data, tuple):
        return True
    if isinstance(data, Mapping) and not is_tensor_collection(data):
        return any(not isinstance(key, str) or isinstance(value, (list, tuple)) or
                   _is_tree(value) for key, value in data.items())
    return False


def _leaves(node: Any, path: tuple[str, ...], out: dict[str, torch.Tensor]) -> None:
    if isinstance(node, torch.Tensor) and not is_tensor_collection(node):
        out[KEY_SEPARATOR.join(path)] = node.detach().cpu().contiguous()
        return
    if isinstance(node, Mapping) and not is_tensor_collection(node):
        items = [(_dict_part(key, path), value) for key, value in node.items()]
    elif type(node) is list:
        items = [(f"[{i}]", value) for i, value in enumerate(node)]
    elif type(node) is tuple:
        items = [(f"({i})", value) for i, value in enumerate(node)]
    else:
        where = KEY_SEPARATOR.join(path) or "the root"
        raise InvalidBatchError(
            f"a pytree stored by RedisbufStorage holds dicts, lists, tuples and tensors; "
            f"{where} is a {type(node).__name__}"
        )
    if not items:
        where = KEY_SEPARATOR.join(path) or "the root"
        raise InvalidBatchError(f"{where} is an empty {type(node).__name__}: it holds no "
                                "tensor to store")
    for part, value in items:
        _leaves(value, (*path, part), out)


def _dict_part(key: Any, path: tuple[str, ...]) -> str:
    if isinstance(key, str):
        check_key_part(key, (*path, key))
        return key
    if isinstance(key, int) and not isinstance(key, bool):
        return f"<{key}>"
    where = KEY_SEPARATOR.join(path) or "the root"
    raise InvalidBatchError(f"a pytree's dict keys are strings or ints, got {key!r} "
                            f"({type(key).__name__}) under {where}")


def fields_of_tree(data: Any) -> dict[str, torch.Tensor] | None:
    """The fields (path -> leaf with the leading batch dimension) of a batch that is a
    pytree a TensorDict cannot hold; ``None`` for any other data."""
    if not _is_tree(data):
        return None
    leaves: dict[str, torch.Tensor] = {}
    _leaves(data, (), leaves)
    fields = {f"{number}{KEY_SEPARATOR}{path}": leaf
              for number, (path, leaf) in enumerate(leaves.items())}
    sizes = {name: (value.shape[0] if value.ndim else None) for name, value in fields.items()}
    if None in sizes.values() or len(set(sizes.values())) != 1:
        raise InvalidBatchError(
            f"every leaf of a pytree batch needs the same leading batch dimension, got "
            f"{ {name: size for name, size in sizes.items()} }"
        )
    return fields


def batch_of_one(item: Any) -> Any | None:
    """``item`` (one pytree item) with a leading dimension of 1 on every leaf; ``None``
    when ``item`` is not such a pytree."""
    if not _is_tree(item):
        return None
    return tree_map(lambda leaf: leaf.unsqueeze(0) if isinstance(leaf, torch.Tensor) else leaf,
                    item)


def item_of(batch: Any, position: int) -> Any:
    """Item ``position`` of a batch read back: ``batch[position]`` of a tensor or
    TensorDict, that row of every leaf of a pytree."""
    if isinstance(batch, torch.Tensor) or is_tensor_collection(batch):
        return batch[position]
    return tree_map(lambda leaf: leaf[position], batch)


def _leading_shape(data: Any, ndim: int) -> tuple[int, ...]:
    if is_tensor_collection(data):
        shape = tuple(data.batch_size)
    elif isinstance(data, torch.Tensor):
        shape = tuple(data.shape)
    else:
        leaves = [leaf for leaf in tree_flatten(data)[0] if isinstance(leaf, torch.Tensor)]
        shapes = {tuple(leaf.shape[:ndim]) for leaf in leaves if leaf.ndim >= ndim}
        if len(shapes) != 1 or any(leaf.ndim < ndim for leaf in leaves):
            raise InvalidBatchError(
                f"a storage of ndim={ndim} takes data whose leaves share their first {ndim} "
                f"dimensions, got {sorted({tuple(leaf.shape) for leaf in leaves})}")
        shape = shapes.pop()
    if len(shape) < ndim:
        raise InvalidBatchError(f"a storage of ndim={ndim} takes batches of {ndim} dimensions "
                                f"(N, T, ...), got batch shape {list(shape)}")
    return shape[:ndim]


def flatten_leading(data: Any, ndim: int) -> tuple[Any, tuple[int, ...]]:
    """``data`` with its first ``ndim`` batch dimensions flattened into one, and their
    shape: a TensorDict, a tensor, or a nest (mapping, tuple) of tensors."""
    shape = _leading_shape(data, ndim)
    if is_tensor_collection(data):
        return data.reshape(-1), shape
    if isinstance(data, torch.Tensor):
        return data.reshape(-1, *data.shape[ndim:]), shape
    return tree_map(lambda leaf: leaf.reshape(-1, *leaf.shape[ndim:]), data), shape


def reshape_items(batch: Any, shape: tuple[int, ...]) -> Any:
    """A batch read back (a tensor, TensorDict or pytree of ``prod(shape)`` items) with
    its batch dimension shaped ``shape``."""
    if is_tensor_collection(batch):
        return batch.reshape(*shape)
    if isinstance(batch, torch.Tensor):
        return batch.reshape(*shape, *batch.shape[1:])
    return tree_map(lambda leaf: leaf.reshape(*shape, *leaf.shape[1:]), batch)


def tree_of(batch: Mapping[str, Any], device: torch.device) -> Any | None:
    """The pytree whose fields ``batch`` holds (see the module), its leaves as tensors on
    ``device``; ``None`` when no field name has a list, tuple or int-key part."""
    parsed = {name: name.split(KEY_SEPARATOR) for name in batch}
    if not any(_TYPED_PART.match(part) for parts in parsed.values() for part in parts[1:]):
        return None
    root: dict[Any, Any] = {}
    for name, parts in sorted(parsed.items(), key=lambda field: int(field[1][0])):
        node = root
        keys = [_key_of(part) for part in parts[1:]]
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = torch.as_tensor(batch[name]).to(device)
    return _build(root)


def _key_of(part: str) -> Any:
    """A field name part -> ("list" | "tuple", index), int key, or the string key."""
    typed = _TYPED_PART.match(part)
    if typed is None:
        return part
    listed, tupled, keyed = typed.groups()
    if listed is not None:
        return ("list", int(listed))
    if tupled is not None:
        return ("tuple", int(tupled))
    return int(keyed)


def _build(node: Any) -> Any:
    """The nest of dicts keyed by parsed parts -> dicts, lists and tuples."""
    if not isinstance(node, dict):
        return node
    keys = list(node)
    if keys and all(isinstance(key, tuple) for key in keys):
        values = [_build(node[key]) for key in sorted(keys, key=lambda key: key[1])]
        return tuple(values) if keys[0][0] == "tuple" else values
    return {key: _build(value) for key, value in node.items()}
