"""The ``redisbuf`` Redis Functions library: the buffer's operations for any client.

``FUNCTION LOAD`` (Redis >= 7, Valkey) installs a library that every client calls by
name with ``FCALL`` (``redis-cli``, Node, Go...), and through which the Python client runs
every script (redisbuf/store/scripts.py), because it is built here from the ``lua/``
files, Python only filling templates: the whole library is ``lua/_library.lua``; each
script, its includes expanded, becomes one Lua function ``OP.NAME(KEYS, ARGV,
RB_NO_WRITES)`` (``lua/_operation.lua``: the scripts' globals and top-level ``return``
keep their meaning; each operation's helpers are locals of a function of its own, run
once when the library loads, so that a call does not make its helpers' closures again,
and no limit on locals or upvalues is shared between operations), with ``ONCE.NAME``
around it (the
remembering variant, ``lua/_remember.lua``); each registered function is
``lua/_register.lua``. Registered: the public functions below, and
for Python each script's three variants under ``Script.function``
(``rbs_NAME[_ro|_once]_SHA``). Every registered function that changes a buffer first
checks its caller's grant (GRANTS below; the roles of redisbuf/ops/acl.py); one without
an entry there asks the admin's.

=====================  =========  ==============================  ========================
function               script     KEYS                            flags
=====================  =========  ==============================  ========================
rb_version             --         none                            no-writes
rb_init                init       meta, shards                    --
rb_add                 add        the 13 buffer keys              --
rb_sample_uniform      sample_    the 13 buffer keys              -- (counts uses)
                       uniform
rb_sample_uniform_ro   sample_    the 13 buffer keys              no-writes (counts
                       uniform                                    nothing)
rb_update_priority     update_    the 13 buffer keys              --
                       priority
rb_priority            priority_  meta, order, masslog, snap,     no-writes
                       read       perheap, per
rb_sample_per          sample_    the 13 buffer keys, snap        -- (counts uses)
                       per
rb_len                 len        meta, order                     no-writes
rb_stats               stats      meta, order                     no-writes
rb_add_apply           add_apply  the 13 buffer keys, applying,   -- (the next slice of a
                                  applying:blobs, applying:texts  large add; RB_APPLYING)
=====================  =========  ==============================  ========================

docs/wire-format.md documents every function's KEYS, ARGV, reply and error codes.
The library is versioned by a hash of its source (``rb_version``): an install replaces a
library of another version and leaves an identical one alone.
"""

from __future__ import annotations

import hashlib
import weakref
from functools import cache
from typing import Any

import redis
import redis.cluster

from . import bounds, scripts
from .connection import Guarded

LIBRARY = "redisbuf"

# function name -> (script in lua/, read-only variant?, flagged no-writes?)
_OPERATIONS: dict[str, tuple[str, bool]] = {
    "rb_init": ("init", False),
    "rb_sample_uniform": ("sample_uniform", False),
    "rb_sample_uniform_ro": ("sample_uniform", True),
    "rb_update_priority": ("update_priority", False),
    "rb_priority": ("priority_read", True),
    "rb_sample_per": ("sample_per", False),
    "rb_len": ("len", True),
    "rb_stats": ("stats", True),
    "rb_add_apply": ("add_apply", False),
}
READ_ONLY = frozenset({"rb_version", "rb_sample_uniform_ro", "rb_priority", "rb_len",
                       "rb_stats"})

# What a writing function asks of its caller (redisbuf/ops/acl.py): PUBLISH permission on
# the channel rb:{NAME}:grant:GRANT of the buffer its KEYS[1] belongs to, checked by
# lua/_grant.lua (which says what "rate", "config" and "create" mean). Only the read-only
# variants (flagged no-writes: the server refuses any write in them) ask nothing. A script
# missing here is the administrator's only (DEFAULT_GRANT: closed by default);
# tests/test_grants.py fails for it, naming the line to add. A sampler's own set-up (PER,
# the softmax mass log) is its drawer's: the learner's.
GRANTS: dict[str, str] = {
    **dict.fromkeys(("add", "add_reserve", "add_commit", "add_release", "add_diverse",
                     "add_stage", "add_staged",
                     "episode_push", "fragment_add", "seq_add", "seq_episode",
                     # a step store's writers insert, and sweep what they made
                     "steps_insert", "steps_sweep",
                     # rewriting a stored record (a writer's correction, DI-engine's update)
                     "replace"), "add"),
    **dict.fromkeys(("sample_uniform", "sample_prioritized", "sample_per", "sample_select",
                     "sample_window",
                     "undo_draws", "episode_sample", "episode_windows", "fragment_fetch",
                     "masslog_read", "replica_read", "seq_read", "seq_sample",
                     "seq_masslog_read", "seq_replica_read", "enable_per", "enable_softmax",
                     # a learner's replica publishes snapshots; its draws set aside
                     # records that do not decode
                     "snapshot_commit", "quarantine", "heap_build"),
                    "sample"),
    **dict.fromkeys(("update_priority", "seq_update_priority", "per_raise_max",
                     # deletes by id (Reverb's mutate_priorities, DI-engine's delete):
                     # the learner's, who changes priorities
                     "remove"), "priority"),
    "rate_limit": "rate",
    # storing the rest of a large add another writer committed: any writing role's
    "add_apply": "apply",
    **dict.fromkeys(("lifetime_config", "limiter_config"), "config"),
    # "create": init.lua makes a buffer (admin) or, when it exists, only reads its meta
    "init": "create",
    **dict.fromkeys(("baseline", "clear", "drop", "episode_clear", "episode_init",
                     "fragment_clear", "fragment_init", "fragment_stats",
                     "fragment_update_version", "manager_score", "restore",
                     "restore_items", "restore_stage", "seq_init", "shard_layout",
                     "update_model_version"), "admin"),
}

# the grant of a writing script without an entry in GRANTS: nobody's but the admin's
DEFAULT_GRANT = "admin"


def grant_of(name: str) -> str:
    """The grant the writing variants of script ``name`` ask of their caller: its entry
    in :data:`GRANTS`, else :data:`DEFAULT_GRANT` (``"admin"``), so that a script added
    without one refuses every role but the buffer's administrator."""
    return GRANTS.get(name, DEFAULT_GRANT)


def script_names() -> list[str]:
    """Every operation script of lua/ (the files not starting with ``_``), sorted."""
    return sorted(path.stem for path in scripts.lua_dir().glob("[a-z]*.lua"))


def _operation(name: str) -> str:
    """Script ``name`` as ``OP.name(KEYS, ARGV, RB_NO_WRITES)`` and its remembering variant
    as ``ONCE.name(KEYS, ARGV)`` (lua/_operation.lua): the library's functions of its
    three variants call these."""
    once = scripts.remembering_source(f"return OP.{name}(KEYS, ARGV, false)", name)
    helpers, own = scripts.load(name).parts
    return scripts.template(
        "operation", NAME=name, LIMITS=scripts.limits(), HELPERS=helpers,
        SCRIPT=own.rstrip("\n"), ONCE=once.rstrip("\n"),
    )


def _register(
    name: str, call: str, grant: str | None, read_only: bool,
    keys: tuple[int, int | None] | None, extra: int = 0,
) -> str:
    """One registered function; ``keys`` the (low, high) key count of its script's
    ``@keys`` line (None: any count), ``extra`` keys its variant adds (the remembering
    variant's two batch-memory keys)."""
    low, high = keys if keys is not None else (0, None)
    low, high = low + extra, None if high is None else high + extra
    takes = f"{low}" if high == low else f"{low}..{'' if high is None else high}"
    return scripts.template(
        "register", NAME=name, FLAGS="{'no-writes'}" if read_only else "{}",
        GRANT="nil" if grant is None else f"'{grant}'", CALL=call,
        LOW=low, HIGH="math.huge" if high is None else high, TAKES=takes,
    )


@cache
def library_source() -> str:
    """The library's Lua source (``#!lua name=redisbuf``), built from lua/: the public
    functions (docs/wire-format.md) and, for the Python client (scripts.command), every
    script's plain, read-only and remembering variants under ``Script.function``."""
    from .keys import DEFAULT_RETRY_WINDOW

    names = script_names()
    body = "".join([
        scripts.template("grant"),
        *(_operation(name) for name in names),
        scripts.template("add_checked"),
    ])
    registrations = [_register("rb_add", "rb_add_checked(keys, args)", "add", False,
                               scripts.load("add").keys)]
    for public, (name, read_only) in _OPERATIONS.items():
        grant = None if public in READ_ONLY else grant_of(name)
        call = f"OP.{name}(keys, args, {'true' if read_only else 'false'})"
        registrations.append(
            _register(public, call, grant, public in READ_ONLY, scripts.load(name).keys))
    for name in names:
        script = scripts.load(name)
        # a script of scripts.READS runs as its read-only variant: its plain one may
        # write, so it asks a grant like any other (the admin's, as it has no entry)
        grant = grant_of(name)
        registrations += [
            _register(script.function, f"OP.{name}(keys, args, false)", grant, False,
                      script.keys),
            _register(script.read_only.function, f"OP.{name}(keys, args, true)", None, True,
                      script.keys),
            # remembering writes the batch memory even around a read: not for every caller
            _register(script.remembering.function, f"ONCE.{name}(keys, args)",
                      grant, False, script.keys, extra=2),
        ]
    values = {
        "LIBRARY": LIBRARY, "DEFAULT_WINDOW": repr(DEFAULT_RETRY_WINDOW),
        "MAX_ADD": bounds.MAX_ADD_ITEMS, "BODY": body, "REGISTRATIONS": "".join(registrations),
    }
    # the version is a hash of the library with every place but the version filled
    unversioned = scripts.template("library", **values, VERSION="{{VERSION}}")
    version = hashlib.sha1(unversioned.encode()).hexdigest()[:16]
    return scripts.template("library", **values, VERSION=version)


@cache
def script_functions() -> frozenset[str]:
    """The names (``Script.function``) of the script variants the library holds; a script
    made otherwise (not from lua/) runs with EVALSHA."""
    out = set()
    for name in script_names():
        script = scripts.load(name)
        out |= {script.function, script.read_only.function, script.remembering.function}
    return frozenset(out)


def version() -> str:
    """The version ``rb_version`` of this library returns (a hash of its source)."""
    return library_source().split("\n", 2)[1].removeprefix("-- redisbuf ")


def installed_version(client: Any) -> str | None:
    """The version of the library on ``client``'s server, or None when none is there."""
    try:
        reply = client.execute_command("FCALL_RO", "rb_version", 0)
    except redis.exceptions.ResponseError as exc:
        if "not found" in str(exc).lower() or "unknown command" in str(exc).lower():
            return None
        raise
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def install(client: Any) -> bool:
    """Load the library on ``client``'s server (on a ``RedisCluster``, on every primary it
    reaches: one that is down gets it when a call there next finds it missing, as after a
    restart) unless this version is there already. Returns whether it loaded it."""
    client = unwrapped(client)
    if isinstance(client, redis.cluster.RedisCluster):
        loaded = False
        for node in client.get_primaries():
            try:
                loaded |= install(client.get_redis_connection(node))
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                continue  # its slots fail with an error naming them (a shard, a key)
        return loaded
    if installed_version(client) == version():
        return False
    client.execute_command("FUNCTION", "LOAD", "REPLACE", library_source())
    return True


def available(client: Any) -> bool:
    """Whether this version of the library is on ``client``'s server, installed now if
    another version or none is there. False where it cannot be: no FUNCTION command
    (fakeredis, Redis < 7) or a user not allowed to load it (then only an administrator's
    ``redisbuf functions install`` makes it available)."""
    try:
        install(client)
    except redis.exceptions.ResponseError:
        return False
    return True


def unwrapped(client: Any) -> Any:
    """The redis-py client inside redisbuf's :class:`Guarded` wrapper."""
    while isinstance(client, Guarded):
        client = client._client
    return client


# clients known to have this version (install checked once per client)
_checked: weakref.WeakSet[Any] = weakref.WeakSet()


def ensure_installed(client: Any) -> None:
    """Best effort, for ReplayBuffer: install the library once per client, and say nothing
    on servers that cannot take it (no FUNCTION before Redis 7; an ACL user without
    FUNCTION; a read-only replica; a full server): the Python path does not need it."""
    target = unwrapped(client)
    try:
        if target in _checked:
            return
    except TypeError:  # not weakly referenceable: check every time
        pass
    try:
        install(target)
    except redis.exceptions.ResponseError:
        return
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
        return  # a lost connection: not checked, so the next buffer opened tries again
    try:
        _checked.add(target)
    except TypeError:
        pass
