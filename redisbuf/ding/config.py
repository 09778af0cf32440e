"""EasyDict-like configs for the worker buffers, without requiring ``easydict``.

:class:`EasyDict` is a ``dict`` whose keys are also attributes, nested dicts (also in
lists and tuples) becoming ``EasyDict`` too, as the ``easydict`` package's; a buffer's
``default_config()`` returns one, and a buffer takes any mapping (an ``easydict``
EasyDict, a plain dict), missing keys taking their defaults.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any


class EasyDict(dict):
    """A dict with attribute access (``cfg.replay_buffer_size``), nested mappings made
    EasyDicts as they are set.

    Examples:
        >>> from redisbuf.ding import EasyDict
        >>> cfg = EasyDict({"a": 1, "b": {"c": [{"d": 2}]}})
        >>> cfg.a, cfg.b.c[0].d, cfg["b"]["c"][0]["d"]
        (1, 2, 2)
        >>> cfg.e = {"f": 3}
        >>> type(cfg.e).__name__, cfg.e.f
        ('EasyDict', 3)
    """

    def __init__(self, mapping: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__()
        for key, value in {**(mapping or {}), **kwargs}.items():
            self[key] = value

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, _wrap(value))

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value

    def __delattr__(self, key: str) -> None:
        try:
            del self[key]
        except KeyError:
            raise AttributeError(key) from None

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        for key, value in dict(other, **kwargs).items():
            self[key] = value

    def setdefault(self, key: Any, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __deepcopy__(self, memo: dict[int, Any]) -> EasyDict:
        return EasyDict({key: copy.deepcopy(value, memo) for key, value in self.items()})

    def __reduce__(self) -> tuple[Any, ...]:
        return (EasyDict, (dict(self),))


def _wrap(value: Any) -> Any:
    if isinstance(value, EasyDict):
        return value
    if isinstance(value, Mapping):
        return EasyDict(value)
    if type(value) in (list, tuple):
        return type(value)(_wrap(item) for item in value)
    return value


def merged(defaults: Mapping[str, Any], given: Mapping[str, Any] | None) -> EasyDict:
    """``defaults`` updated with ``given``, recursively (sub-mappings merged key by key):
    what a buffer reads its config from."""
    out = EasyDict(copy.deepcopy(dict(defaults)))
    for key, value in (given or {}).items():
        held = out.get(key)
        if isinstance(held, Mapping) and isinstance(value, Mapping):
            out[key] = merged(held, value)
        else:
            out[key] = copy.deepcopy(value)
    return out
