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


# Every script starts with this flag; the read-only variant sets it (see Script).
_FLAG = "local RB_NO_WRITES = {}\n"
# Errors a server gives scripts that may write when it refuses every write.
_REFUSED_WRITES = (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError)


class Script:
    """One Lua operation: its expanded source, its SHA1, and a call that survives NOSCRIPT.

    Each script also has a read-only variant, derived here rather than kept as a copy:
    the same source under a ``#!lua flags=no-writes`` shebang with ``RB_NO_WRITES`` set,
    which makes ``record_draws`` skip its counter writes. When a server refuses writes
    (``maxmemory`` reached under ``noeviction``: OOM; a read-only replica: READONLY),
    a call is retried once with the variant: a script whose only writes are that
    bookkeeping (sampling) keeps working, any other raises the server's refusal.
    """

    def __init__(self, name: str, source: str, read_only: bool = False) -> None:
        self.name = name
        body = _FLAG.format("true" if read_only else "false") + source
        self.source = f"#!lua flags=no-writes\n{body}" if read_only else body
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        self._expanded = source
        self._read_only: Script | None = self if read_only else None

    @property
    def read_only(self) -> Script:
        """The no-writes variant of this script."""
        if self._read_only is None:
            self._read_only = Script(self.name, self._expanded, read_only=True)
        return self._read_only

    def _eval(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except redis.exceptions.NoScriptError:
            client.script_load(self.source)
            return client.evalsha(self.sha, len(keys), *keys, *args)

    def __call__(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return self._eval(client, keys, args)
        except _REFUSED_WRITES as refused:
            if self.read_only is self:
                raise
            try:
                return self.read_only._eval(client, keys, args)
            except redis.exceptions.ResponseError as exc:
                if _ERROR_PATTERN.search(str(exc)):
                    raise translate(exc) from exc
                raise refused from None  # the script writes more than bookkeeping
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
