"""Loads the Lua scripts of ``lua/`` by name and runs them with EVALSHA.

A line ``-- @include NAME`` in a script is replaced by ``lua/_NAME.lua`` (shared helpers),
so every operation stays one self-contained script on the server. A NOSCRIPT reply
(server restart, SCRIPT FLUSH) loads the script again and retries once.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path
from typing import Any

import redis

from . import errors

_INCLUDE = re.compile(r"^-- @include (\w+)\s*$", re.MULTILINE)


def lua_dir() -> Path:
    """The folder holding the .lua files: installed beside the package, or the checkout's."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "lua", here.parent / "lua"):
        if (candidate / "add.lua").is_file():
            return candidate
    raise FileNotFoundError(f"redisbuf's lua/ folder was not found near {here}")


def _expand(source: str, seen: frozenset[str] = frozenset()) -> str:
    def include(match: re.Match[str]) -> str:
        name = match.group(1)
        if name in seen:
            return ""
        text = (lua_dir() / f"_{name}.lua").read_text()
        return _expand(text, seen | {name})

    return _INCLUDE.sub(include, source)


# Error codes a script puts first in its error reply -> exception raised in Python.
_ERROR_CODES: dict[str, type[Exception]] = {
    "RB_EMPTY": errors.EmptyBufferError,
    "RB_SCHEMA": errors.SchemaError,
    "RB_NOBUF": errors.ConfigMismatchError,
    "RB_NOTREE": errors.ConfigMismatchError,
    "RB_CONFIG": errors.ConfigMismatchError,
    "RB_INVALID": errors.InvalidBatchError,
    "RB_UNDEFINED": errors.SamplingError,
}
_ERROR_PATTERN = re.compile(r"\b(RB_[A-Z]+) ?(.*)", re.DOTALL)


class Script:
    """One Lua operation: its expanded source, its SHA1, and a call that survives NOSCRIPT."""

    def __init__(self, name: str, source: str) -> None:
        self.name = name
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            try:
                return client.evalsha(self.sha, len(keys), *keys, *args)
            except redis.exceptions.NoScriptError:
                client.script_load(self.source)
                return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.ResponseError as exc:
            raise translate(exc) from exc


def translate(exc: redis.exceptions.ResponseError) -> Exception:
    """Turn a script's coded error reply into the redisbuf exception for its code.

    The returned exception has ``code`` (e.g. ``"RB_EMPTY"``); replies without a code
    come back unchanged.
    """
    match = _ERROR_PATTERN.search(str(exc))
    if not match:
        return exc
    code, detail = match.group(1), match.group(2).strip()
    detail = re.sub(r"\s*script: \w+, on @user_script:\d+\.?$", "", detail)
    error = _ERROR_CODES.get(code, errors.RedisBufError)(detail)
    error.code = code  # type: ignore[attr-defined]
    return error


@cache
def load(name: str) -> Script:
    """The script ``lua/NAME.lua``, includes expanded."""
    path = lua_dir() / f"{name}.lua"
    return Script(name, _expand(path.read_text()))
