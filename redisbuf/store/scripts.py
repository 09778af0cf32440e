"""Loads the Lua scripts of ``lua/`` by name and runs them: the one script runner.

A line ``-- @include NAME`` in a script or a helper names the helper ``lua/_NAME.lua`` it
uses. The loader resolves the whole include graph: every helper a script needs, directly
or through other helpers, is pasted once, after the helpers it includes, in place of the
script's first ``@include`` line, so every operation stays one self-contained script on
the server.

Each operation's header declares two contracts the runner enforces:
``-- @keys N`` (or ``N..M``, ``N..``: at least N) is how many KEYS it takes, checked
before every call (a call with another count raises ValueError and sends nothing), and
``-- @retry KIND`` whether a call may be sent again after a lost reply: ``safe``
(running it twice has the effect of once: a read, or set-if-absent then compare),
``draw`` (safe unless the buffer counts draws: ``max_use``, which a repeat would count
twice), ``remembered`` (only with a batch id, through the remembering variant, which
returns the first run's reply to a repeat; a call with a batch id of any other script
raises ValueError), ``never``.

Every line of Lua is in ``lua/``: the parts this module and the functions
library wrap around the scripts are templates there (``lua/_flag.lua``,
``lua/_limits.lua``, ``lua/_remember.lua``...), whose ``{{NAME}}`` places Python fills.

Where the server has Redis Functions (Redis >= 7, valkey) every script runs as a function
of the ``redisbuf`` library (redisbuf/store/functions.py), which holds each script's
three variants (plain, read-only, remembering) under a name ending in the variant's SHA1:
``FCALL``, or ``FCALL_RO`` for the read-only variant and for the scripts that only read
(``len``, ``stats``). That is what lets a per-buffer ACL role (redisbuf/ops/acl.py) run
the Python package: the roles refuse ``EVALSHA``, whose script no rule can restrict. The
library is installed on a client's first script call when this version is missing; where
it cannot be (fakeredis, Redis < 7, a user without ``FUNCTION LOAD`` on a server holding
another version) scripts run with ``EVALSHA``. A missing script or function (server
restart, ``SCRIPT FLUSH``, ``FUNCTION FLUSH``, another version's library loaded since) is
loaded again and the call retried once.
"""

from __future__ import annotations

import hashlib
import json
import re
import weakref
from functools import cache
from pathlib import Path
from typing import Any

import redis

from .. import errors
from . import bounds

_KEYS = re.compile(r"^-- @keys (\d+)(\.\.(\d*))?[ \t]*$", re.MULTILINE)
_RETRY = re.compile(r"^-- @retry (\S+)[ \t]*$", re.MULTILINE)
RETRY_KINDS = ("safe", "draw", "remembered", "never")
_INCLUDE = re.compile(r"^-- @include (\w+)[ \t]*(?:\n|$)", re.MULTILINE)


def lua_dir() -> Path:
    """The folder holding the .lua files: installed beside the package (``redisbuf/lua``),
    or the checkout's top-level ``lua/``."""
    here = Path(__file__).resolve().parent  # redisbuf/store
    for candidate in (here.parent / "lua", here.parent.parent / "lua"):
        if (candidate / "add.lua").is_file():
            return candidate
    raise FileNotFoundError(f"redisbuf's lua/ folder was not found near {here}")


def _includes(source: str) -> list[str]:
    """The helpers ``source`` names in its ``-- @include`` lines, in order."""
    return _INCLUDE.findall(source)


@cache
def _helper(name: str) -> str:
    path = lua_dir() / f"_{name}.lua"
    if not path.is_file():
        raise FileNotFoundError(f"lua include {name!r}: {path} does not exist")
    return path.read_text()


def _helpers(names: list[str]) -> list[str]:
    """Every helper ``names`` need, each once, each after the helpers it includes (a
    depth-first walk of the include graph, in the order the lines name them)."""
    order: list[str] = []
    state: dict[str, str] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == "done":
            return
        if state.get(name) == "open":
            raise ValueError(f"lua includes form a cycle: {' -> '.join((*chain, name))}")
        state[name] = "open"
        for dependency in _includes(_helper(name)):
            visit(dependency, (*chain, name))
        state[name] = "done"
        order.append(name)

    for name in names:
        visit(name, ())
    return order


def _expand(source: str, parts: tuple[str, str] | None = None) -> str:
    """``source`` with its helpers pasted in place of its first ``@include`` line (see the
    module docstring) and every other ``@include`` line removed; ``parts`` its
    :func:`_split` when already made."""
    first = _INCLUDE.search(source)
    if first is None:
        return source
    helpers, own = parts if parts is not None else _split(source)
    head = source[: first.start()]  # the header comments: own starts with them
    return head + helpers + own[len(head):]


def _split(source: str) -> tuple[str, str]:
    """``source`` as (its helpers, every one it needs pasted once, in order; its own text
    without its ``@include`` lines), the two parts the functions library places apart
    (lua/_operation.lua): :func:`_expand` pastes the first into the second where its
    first ``@include`` line was."""
    names = _includes(source)
    if not names:
        return "", source
    pasted = "".join(_ensure_newline(_INCLUDE.sub("", _helper(n))) for n in _helpers(names))
    first = _INCLUDE.search(source)
    assert first is not None
    return pasted, source[: first.start()] + _INCLUDE.sub("", source[first.end():])


def _ensure_newline(text: str) -> str:
    return text if text.endswith("\n") else text + "\n"


_PLACE = re.compile(r"\{\{([A-Z_]+)\}\}")


@cache
def _template_text(name: str) -> str:
    lines = _helper(name).splitlines(keepends=True)
    start = 0
    while start < len(lines) and lines[start].startswith("--"):
        start += 1  # the header says what the template is: not sent to the server
    return "".join(lines[start:])


def template(name: str, **values: Any) -> str:
    """The template ``lua/_NAME.lua`` without its header comment, every ``{{KEY}}`` place
    filled with ``values[KEY]`` (str() of it); a place without a value raises KeyError,
    a value without a place ValueError."""
    text = _template_text(name)
    places = set(_PLACE.findall(text))
    if places - set(values):
        raise KeyError(f"lua/_{name}.lua: no value for {sorted(places - set(values))}")
    if set(values) - places:
        raise ValueError(f"lua/_{name}.lua has no place for {sorted(set(values) - places)}")
    return _PLACE.sub(lambda match: str(values[match.group(1)]), text)


# Error codes a script puts first in its error reply -> exception raised in Python
# (one mapping, in redisbuf/errors.py).
_ERROR_CODES: dict[str, type[errors.RedisBufError]] = errors.SCRIPT_ERRORS
_ERROR_PATTERN = re.compile(r"\b(RB_[A-Z]+) ?(.*)", re.DOTALL)


# Every script starts with the flag RB_NO_WRITES (the read-only variant sets it, see
# Script) and the bounds of redisbuf/store/bounds.py, which scripts enforce.


def limits() -> str:
    """lua/_limits.lua, filled: also the functions library's (redisbuf/store/functions.py)."""
    return template(
        "limits",
        MAX_ITEMS=bounds.MAX_ITEMS_PER_COMMAND,
        MAX_ADD=bounds.MAX_ADD_ITEMS,
        MAX_ADD_BYTES=bounds.MAX_ADD_BYTES,
    )


def remembering_source(body: str, name: str) -> str:
    """lua/_remember.lua around ``body``, with script ``name``'s tag (see Script.__call__)."""
    return template("remember", BODY=body.rstrip("\n"), TAG=tag_of(name))


# The tag of a script's remembered replies (see lua/_remember.lua); "=" for the others.
_TAGS = {"add_reserve": "r", "add_commit": "c", "add_staged": "s"}


def tag_of(name: str) -> str:
    """The one-character tag the script ``name`` puts before the replies it remembers."""
    return _TAGS.get(name, "=")


def remembered(value: bytes | None, name: str) -> Any:
    """The reply of script ``name`` in a batch memory entry ``value``, or None when the
    entry is missing or another script's (see lua/_remember.lua)."""
    if value is None or value[:1] != tag_of(name).encode():
        return None
    return json.loads(value[1:])


def read_remembered(client: Any, memory: list[str], batch_id: str, name: str) -> Any:
    """Script ``name``'s reply remembered under ``batch_id`` in the batch memory keys
    ``memory`` (its generation, then the older one: one pipeline), or None."""
    pipe = client.pipeline(transaction=False)
    for key in memory:
        pipe.hget(key, batch_id)
    seen = [remembered(value, name) for value in pipe.execute()]
    return next((reply for reply in seen if reply is not None), None)

# Errors a server gives scripts that may write when it refuses every write.
_REFUSED_WRITES = (redis.exceptions.ReadOnlyError, redis.exceptions.OutOfMemoryError)


class Script:
    """One Lua operation: its expanded source, its SHA1, its function in the library, and a
    call that survives a missing script or function (see the module docstring).

    Each script also has a read-only variant, derived here rather than kept as a copy:
    the same source under a ``#!lua flags=no-writes`` shebang with ``RB_NO_WRITES`` set,
    which makes ``record_draws`` skip its counter writes. When a server refuses writes
    (``maxmemory`` reached under ``noeviction``: OOM; a read-only replica: READONLY),
    a call is retried once with the variant: a script whose only writes are that
    bookkeeping (sampling) keeps working, any other raises the server's refusal.
    """

    def __init__(
        self, name: str, source: str, read_only: bool = False, remembering: bool = False,
        parts: tuple[str, str] | None = None,
    ) -> None:
        self.name = name
        # (its helpers, its own text): what the library makes once and what each call runs
        self.parts = parts if parts is not None else ("", source)
        # which of the three variants this is (the library registers each, see functions.py)
        self.variant = "ro" if read_only else "once" if remembering else "plain"
        flag = template("flag", NO_WRITES="true" if read_only else "false")
        body = flag + limits() + source
        if remembering:
            body = remembering_source(body, name)
        self.source = f"#!lua flags=no-writes\n{body}" if read_only else body
        self.sha = hashlib.sha1(self.source.encode()).hexdigest()
        # this variant's function in the ``redisbuf`` library (redisbuf/store/functions.py)
        suffix = {"plain": "", "ro": "_ro", "once": "_once"}[self.variant]
        self.function = f"rbs_{name}{suffix}_{self.sha[:12]}"
        self._expanded = source
        self.keys, self.retry = _contracts(name, source)
        self._read_only: Script | None = self if read_only else None
        self._remembering: Script | None = self if remembering else None

    def check_keys(self, keys: list[str]) -> None:
        """Raise ValueError unless ``keys`` (without the remembering variant's two memory
        keys) is a count the script's ``-- @keys`` line allows."""
        if self.keys is None:
            return
        low, high = self.keys
        count = len(keys) - (2 if self.variant == "once" else 0)
        if count < low or (high is not None and count > high):
            allowed = f"{low}" if high == low else f"{low}..{'' if high is None else high}"
            raise ValueError(
                f"lua/{self.name}.lua takes {allowed} keys (its header's @keys line), "
                f"a call passed {count}"
            )

    @property
    def remembering(self) -> Script:
        """The variant that remembers its reply under a batch id (see ``__call__``)."""
        if self._remembering is None:
            self._remembering = Script(self.name, self._expanded, remembering=True)
        return self._remembering

    @property
    def read_only(self) -> Script:
        """The no-writes variant of this script."""
        if self._read_only is None:
            self._read_only = Script(self.name, self._expanded, read_only=True)
        return self._read_only

    def read(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        """Run this script for arguments with which it writes nothing: as its read-only
        variant (``FCALL_RO``, which a user whose keys are read-only may call) where
        functions run, else as itself (EVALSHA: before Redis 7 no script is no-writes)."""
        return (self.read_only if uses_functions(client) else self)(client, keys, args)

    def _eval(self, client: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return client.execute_command(*command(client, self, keys, args))
        except redis.exceptions.ResponseError as exc:
            if not missing(exc):
                explained = _explained(client, exc)
                if explained is exc:
                    raise
                raise explained from exc
            reload(client, self)
            return client.execute_command(*command(client, self, keys, args))

    def _eval_then(
        self, client: Any, keys: list[str], args: list[Any], then: tuple[Any, ...]
    ) -> tuple[Any, Any]:
        """The script, then the command ``then`` on the same connection (one pipeline):
        WAIT and WAITAOF wait for the writes of their own connection only."""
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            queue(pipe, client, self, keys, args)
            pipe.execute_command(*then)
            reply, after = pipe.execute(raise_on_error=False)
            if missing(reply) and attempt == 0:
                reload(client, self)
                continue
            if isinstance(reply, Exception):
                raise _explained(client, reply)
            return reply, after
        raise AssertionError("unreachable")

    def __call__(
        self,
        client: Any,
        keys: list[str],
        args: list[Any],
        batch: tuple[str, list[str], float] | None = None,
        then: tuple[Any, ...] | None = None,
    ) -> Any:
        """Run the script. With ``batch = (batch_id, [memory_key, older_key],
        remember_seconds)`` it runs at most once per batch id: the reply is remembered
        (a hash field of ``memory_key``, moved to ``older_key`` with the rest of its
        generation, see lua/_remember.lua) for at least ``remember_seconds``, and a repeated call
        returns it without running the script, so a call retried after a lost reply does
        not insert twice. Error replies are not remembered, nor anything once the
        buffer's meta (KEYS[1]) is gone.

        With ``then`` (a command, e.g. ``("WAITAOF", 1, 0, 1000)``) it is sent right after
        the script on the same connection and ``(reply, its reply)`` is returned; its
        error reply is returned, not raised.

        A script that a large add being stored in the buffer refuses (``RB_APPLYING``,
        before any read or write) is called again once :func:`redisbuf.store.applying.finish`
        has stored the add's slices left."""
        if batch is not None:
            if self.retry not in (None, "remembered"):
                raise ValueError(
                    f"lua/{self.name}.lua is declared '@retry {self.retry}': it has no "
                    "remembering variant to run under a batch id"
                )
            batch_id, memory_keys, seconds = batch
            return self.remembering(
                client, [*keys, *memory_keys], [*args, batch_id, int(seconds * 1000)], then=then
            )
        while True:
            try:
                return self._run_once(client, keys, args, then)
            except errors.ApplyingError:
                from . import applying

                applying.finish(client, keys[0])

    def _run_once(
        self, client: Any, keys: list[str], args: list[Any], then: tuple[Any, ...] | None
    ) -> Any:
        try:
            if then is not None:
                return self._eval_then(client, keys, args, then)
            return self._eval(client, keys, args)
        except _REFUSED_WRITES as refused:
            # a remembering call exists to write (its reply, once): nothing to fall back to
            if self.read_only is self or self.variant == "once":
                raise
            try:
                return self.read_only._eval(client, keys, args)
            except redis.exceptions.ResponseError as exc:
                if _ERROR_PATTERN.search(str(exc)):
                    raise translate(exc) from exc
                raise refused from None  # the script writes more than bookkeeping
        except redis.exceptions.ResponseError as exc:
            raise translate(exc) from exc


def _contracts(
    name: str, source: str
) -> tuple[tuple[int, int | None] | None, str | None]:
    """The ``(low, high)`` key count (high None: no upper bound) and the retry kind that
    ``source``'s header declares (None where it has no such line: a script made
    elsewhere than lua/); ValueError for a malformed or repeated line."""
    counts = _KEYS.findall(source)
    kinds = _RETRY.findall(source)
    if len(counts) > 1 or len(kinds) > 1:
        raise ValueError(f"lua/{name}.lua declares @keys or @retry more than once")
    keys: tuple[int, int | None] | None = None
    if counts:
        low, dots, high = counts[0]
        keys = (int(low), int(high) if high else (None if dots else int(low)))
    if kinds and kinds[0] not in RETRY_KINDS:
        raise ValueError(f"lua/{name}.lua: '@retry {kinds[0]}' is not one of {RETRY_KINDS}")
    return keys, (kinds[0] if kinds else None)


def translate(exc: redis.exceptions.ResponseError) -> Exception:
    """Turn a script's coded error reply into the redisbuf exception for its code.

    The returned exception is an instance of the code's class in
    :data:`redisbuf.errors.SCRIPT_ERRORS` (its ``code``, e.g. ``"RB_EMPTY"``, a class
    attribute), or a plain ``RedisBufError`` carrying an unknown code; replies without a
    code come back unchanged.
    """
    match = _ERROR_PATTERN.search(str(exc))
    if not match:
        return exc
    code, detail = match.group(1), match.group(2).strip()
    detail = re.sub(r"\s*script: \w+, on @user_(?:script|function):\d+\.?$", "", detail)
    kind = _ERROR_CODES.get(code)
    if kind is None:
        error = errors.RedisBufError(detail)
        error.code = code
        return error
    return kind(detail)


# Scripts that never write: where functions run, they run as their read-only variant
# (FCALL_RO), which a user whose keys are read-only (the operator role) may call.
READS = frozenset({"len", "stats", "priority_read"})

# client (unwrapped) -> whether its server runs this version's library (see uses_functions)
_modes: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def uses_functions(client: Any) -> bool:
    """Whether scripts run on ``client`` as functions of the ``redisbuf`` library: found
    once per client, by checking the installed version and installing this one when it
    differs (False when that fails: no FUNCTION command, or a user not allowed to load)."""
    from . import functions

    target = functions.unwrapped(client)
    try:
        known = _modes.get(target)
    except TypeError:  # not weakly referenceable: ask every time
        return functions.available(target)
    if known is None:
        known = _modes[target] = functions.available(target)
    return known


def run_as_functions(client: Any, enabled: bool) -> None:
    """Make ``client``'s scripts run as functions (``enabled``, where the library loads: what
    :func:`uses_functions` finds) or with EVALSHA, from now on: for tests and benchmarks
    that compare the two."""
    from . import functions

    target = functions.unwrapped(client)
    _modes[target] = functions.available(target) if enabled else False


def command(client: Any, script: Script, keys: list[str], args: list[Any]) -> list[Any]:
    """The command that runs ``script`` on ``client``: ``FCALL`` / ``FCALL_RO`` of its
    function where the library is there (see :func:`uses_functions`) and holds it (every
    script of lua/ in each variant), else ``EVALSHA``."""
    from .functions import script_functions

    script.check_keys(keys)
    if script.function in script_functions() and uses_functions(client):
        if script.name in READS and script.variant == "plain":
            script = script.read_only
        verb = "FCALL_RO" if script.variant == "ro" else "FCALL"
        return [verb, script.function, len(keys), *keys, *args]
    return ["EVALSHA", script.sha, len(keys), *keys, *args]


def queue(pipe: Any, client: Any, script: Script, keys: list[str], args: list[Any]) -> None:
    """Queue ``script`` into ``pipe`` (a pipeline of ``client``); its reply is the script's.
    A reply for which :func:`missing` holds asks for :func:`reload` and a resend."""
    pipe.execute_command(*command(client, script, keys, args))


def missing(reply: Any) -> bool:
    """Whether ``reply`` (an exception or a reply) says the script or function is not on
    the server (NOSCRIPT; ``Function not found``): :func:`reload`, then send it again."""
    if isinstance(reply, redis.exceptions.NoScriptError):
        return True
    return isinstance(reply, redis.exceptions.ResponseError) and (
        "function not found" in str(reply).lower()
    )


def reload(client: Any, script: Script) -> None:
    """Put ``script`` back on ``client``'s server after a :func:`missing` reply: the
    library of this version (where functions run), else the script (SCRIPT LOAD; on a
    cluster client, on every primary). When the library cannot be loaded any more, the
    client's later calls use EVALSHA."""
    from . import functions

    target = functions.unwrapped(client)
    if script.function in functions.script_functions() and uses_functions(client):
        if functions.available(target):
            return
        try:
            _modes[target] = False
        except TypeError:
            pass
    client.script_load(script.source)


def _explained(client: Any, exc: Exception) -> Exception:
    """``exc``, or for EVALSHA refused by ACL, the same refusal saying how to get the
    library, which the per-buffer roles need."""
    if isinstance(exc, redis.exceptions.NoPermissionError) and "evalsha" in str(exc).lower():
        return redis.exceptions.NoPermissionError(
            f"{exc} (redisbuf runs its scripts as functions of the 'redisbuf' library where "
            "that library's version is on the server; it is not, and this user may not load "
            "it: run `redisbuf functions install` as an administrator)"
        )
    return exc


@cache
def load(name: str) -> Script:
    """The script ``lua/NAME.lua``, includes expanded."""
    text = (lua_dir() / f"{name}.lua").read_text()
    parts = _split(text)
    return Script(name, _expand(text, parts), parts=parts)
