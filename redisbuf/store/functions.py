"""The ``redisbuf`` Redis Functions library: the buffer's operations for any client.

``FUNCTION LOAD`` (Redis >= 7, Valkey) installs a library that every client calls by
name with ``FCALL`` (``redis-cli``, Node, Go...), and through which the Python client runs
every script (redisbuf/store/scripts.py), because it is built here from the ``lua/``
files: each script, its ``-- @include`` lines expanded, becomes one Lua function
``OP.NAME(KEYS, ARGV, RB_NO_WRITES)`` (so the scripts' globals and top-level ``return``
keep their meaning, and each operation's helpers are locals of its own function: no limit
on locals or upvalues is shared between operations), with ``ONCE.NAME`` around it (the
remembering variant, scripts._REMEMBER). Registered: the public functions below, and
for Python each script's three variants under ``Script.function``
(``rbs_NAME[_ro|_once]_SHA``). Every registered function that changes a buffer first
checks its caller's grant (GRANTS below; the roles of redisbuf/ops/acl.py).

=====================  =========  ==============================  ========================
function               script     KEYS                            flags
=====================  =========  ==============================  ========================
rb_version             --         none                            no-writes
rb_init                init       meta, shards                    --
rb_add                 add        the 16 buffer keys              --
rb_sample_uniform      sample_    the 16 buffer keys              -- (counts uses)
                       uniform
rb_sample_uniform_ro   sample_    the 16 buffer keys              no-writes (counts
                       uniform                                    nothing)
rb_update_priority     update_    the 16 buffer keys              --
                       priority
rb_len                 len        meta, order                     no-writes
rb_stats               stats      meta, order                     no-writes
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
    "rb_len": ("len", True),
    "rb_stats": ("stats", True),
}
READ_ONLY = frozenset({"rb_version", "rb_sample_uniform_ro", "rb_len", "rb_stats"})

# What a writing function asks of its caller (redisbuf/ops/acl.py): PUBLISH permission on
# the channel rb:{NAME}:grant:GRANT of the buffer its KEYS[1] belongs to. ACL has no
# per-function rule, so the functions check it themselves (redis.acl_check_cmd); a user
# with every channel (the default user) or the buffer's (rb:{NAME}:*, the admin role)
# passes every check. Read-only variants and the scripts of scripts.READS ask nothing.
# "rate": rate_limit.lua admits inserts (actor) and samples (learner): ARGV[1] says which.
# "config": the settings every opening process passes (lifetime, rate limiter): "admin"
# when one is given (each is stored only on a new buffer), nothing when none is.
# "create": opening with a capacity: "admin" when the buffer does not exist yet.
GRANTS: dict[str, str] = {
    **dict.fromkeys(("add", "add_reserve", "add_commit", "add_release", "add_diverse",
                     "episode_push", "fragment_add", "seq_add", "seq_episode"), "add"),
    # a sampler's own set-up (PER, the softmax mass log) is its drawer's: the learner's
    **dict.fromkeys(("sample_uniform", "sample_prioritized", "sample_select", "sample_window",
                     "undo_draws", "episode_sample", "episode_windows", "fragment_fetch",
                     "masslog_read", "replica_read", "seq_read", "seq_sample",
                     "seq_masslog_read", "seq_replica_read", "enable_per", "enable_tree",
                     # a learner's replica publishes snapshots; its draws set aside
                     # records that do not decode
                     "snapshot_commit", "quarantine", "heap_build"),
                    "sample"),
    **dict.fromkeys(("update_priority", "seq_update_priority", "per_raise_max"), "priority"),
    "rate_limit": "rate",
    **dict.fromkeys(("lifetime_config", "limiter_config"), "config"),
    # "create": init.lua makes a buffer (admin) or, when it exists, only reads its meta
    "init": "create",
    **dict.fromkeys(("baseline", "clear", "drop", "episode_clear", "episode_init",
                     "fragment_clear", "fragment_init", "fragment_stats",
                     "fragment_update_version", "manager_score", "restore",
                     "restore_items", "restore_stage", "seq_init", "shard_layout",
                     "update_model_version"), "admin"),
}

_GRANT_CHECK = """
local RB_GRANT_VERBS = {add = 'add to', sample = 'sample from',
  priority = 'update the priorities of', admin = 'configure, clear or restore'}
local function rb_refused(keys, args, grant)
  if grant == 'rate' then
    grant = (args[1] == 'insert' or args[1] == 'unsert') and 'add' or 'sample'
  elseif grant == 'config' then
    -- every process opening the buffer calls it; with nothing asked it only reads
    local asked = false
    for i = 1, #args do asked = asked or args[i] ~= '' end
    if not asked then return nil end
    grant = 'admin'
  elseif grant == 'create' then
    -- every process opening the buffer with a capacity calls it; on an existing buffer it
    -- only reads (the caller compares the settings)
    if redis.call('EXISTS', keys[1]) == 1 then return nil end
    grant = 'admin'
  end
  local prefix = string.match(tostring(keys[1]), '^rb:{[^}]*}:')
  if not prefix then
    return redis.error_reply('RB_INVALID KEYS[1] must be a key of a buffer (rb:{NAME}:...)')
  end
  local channel = prefix .. 'grant:' .. grant
  -- a server without ACL checks in Lua (fakeredis) has no users to tell apart
  if not redis.acl_check_cmd or redis.acl_check_cmd('PUBLISH', channel, '') then return nil end
  return redis.error_reply('NOPERM this user may not ' .. RB_GRANT_VERBS[grant] .. ' buffer '
    .. string.sub(prefix, 5, -3) .. ' (its ACL role grants no PUBLISH on ' .. channel
    .. ', see redisbuf acl)')
end
"""

# rb_add checks what a non-Python caller may get wrong before add.lua's first write
# (add.lua trusts its ARGV: ReplayBuffer builds it), then runs add.lua, or with a batch id
# its remembering variant (scripts._REMEMBER), which takes the two batch-memory keys and
# the id and window off the ends of KEYS and ARGV.
_ADD_ADAPTER = """
local function rb_add_checked(keys, args)
  if #keys ~= 16 then
    return redis.error_reply('RB_INVALID rb_add takes the 16 buffer keys, got ' .. #keys)
  end
  local n = tonumber(args[2])
  if n == nil or n < 1 or n ~= math.floor(n) then
    return redis.error_reply('RB_INVALID ARGV[2] must be the number of items (>= 1), got '
      .. tostring(args[2]))
  end
  if n > RB_MAX_ADD then
    return redis.error_reply('RB_LIMIT one add stores at most ' .. RB_MAX_ADD
      .. ' items, got ' .. n .. ' (send several batches)')
  end
  local extra = #args - (3 + 2 * n)
  if extra ~= 0 and extra ~= 1 then
    return redis.error_reply('RB_INVALID expected ' .. (3 + 2 * n) .. ' or ' .. (4 + 2 * n)
      .. ' arguments (schema, n, options, n blob / log-reward pairs, [batch id]), got ' .. #args)
  end
  local ok, schema = pcall(cjson.decode, args[1])
  if not ok or type(schema) ~= 'table' or type(schema['kind']) ~= 'string'
      or type(schema['fields']) ~= 'table' then
    return redis.error_reply('RB_SCHEMA ARGV[1] must be a schema: canonical JSON with kind '
      .. 'and fields')
  end
  if args[3] ~= '' then
    local okopt, options = pcall(cjson.decode, args[3])
    if not okopt or type(options) ~= 'table' then
      return redis.error_reply('RB_INVALID ARGV[3] must be "" or a JSON object')
    end
  end
  if extra == 0 then return OP.add(keys, args, false) end
  local window = tonumber(redis.call('HGET', keys[1], 'retry_window')) or DEFAULT_WINDOW
  local rkeys, rargs = {}, {}
  for i = 1, #keys do rkeys[i] = keys[i] end
  rkeys[#rkeys + 1] = keys[14]  -- batches
  rkeys[#rkeys + 1] = keys[15]  -- batches:old
  for i = 1, #args do rargs[i] = args[i] end
  rargs[#rargs + 1] = tostring(math.floor(window * 1000))
  return ONCE.add(rkeys, rargs)
end
"""


def script_names() -> list[str]:
    """Every operation script of lua/ (the files not starting with ``_``), sorted."""
    return sorted(path.stem for path in scripts.lua_dir().glob("[a-z]*.lua"))


def _operation(name: str) -> str:
    """Script ``name`` as ``OP.name(KEYS, ARGV, RB_NO_WRITES)`` and its remembering variant
    as ``ONCE.name(KEYS, ARGV)`` (the body of scripts._REMEMBER around a call of the first):
    the library's functions of its three variants call these."""
    script = scripts.load(name)
    limits = scripts.LIMITS
    once = scripts._REMEMBER.replace("BODY\n", f"return OP.{name}(KEYS, ARGV, false)\n")
    once = once.replace("'TAG'", repr(scripts.tag_of(name)))
    return (f"OP.{name} = function(KEYS, ARGV, RB_NO_WRITES)\n{limits}{script._expanded}\nend\n"
            f"ONCE.{name} = function(KEYS, ARGV)\n{once}end\n")


def _callback(body: str, grant: str | None) -> str:
    check = ""
    if grant is not None:
        check = (f"local refused = rb_refused(keys, args, '{grant}') "
                 "if refused then return refused end ")
    return f"function(keys, args) {check}return {body} end"


def _register(name: str, callback: str, read_only: bool) -> str:
    flags = ", flags = {'no-writes'}" if read_only else ""
    return (f"redis.register_function{{function_name = '{name}', "
            f"callback = {callback}{flags}}}\n")


@cache
def library_source() -> str:
    """The library's Lua source (``#!lua name=redisbuf``), built from lua/: the public
    functions (docs/wire-format.md) and, for the Python client (scripts.command), every
    script's plain, read-only and remembering variants under ``Script.function``."""
    from ..buffers.replay import DEFAULT_RETRY_WINDOW

    names = script_names()
    unclassified = [n for n in names if n not in GRANTS and n not in scripts.READS]
    if unclassified:
        raise RuntimeError(f"lua scripts without a grant in functions.GRANTS: {unclassified}")
    parts = [
        f"local DEFAULT_WINDOW = {DEFAULT_RETRY_WINDOW!r}\n",
        f"local RB_MAX_ADD = {bounds.MAX_ADD_ITEMS}\n",
        "local OP, ONCE = {}, {}\n",
        _GRANT_CHECK,
        *(_operation(name) for name in names),
        _ADD_ADAPTER,
    ]
    body = "".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    registrations = [
        "redis.register_function{function_name = 'rb_version', callback = function() "
        f"return '{version}' end, flags = {{'no-writes'}}}}\n",
        _register("rb_add", _callback("rb_add_checked(keys, args)", "add"), False),
    ]
    for public, (name, read_only) in _OPERATIONS.items():
        grant = None if public in READ_ONLY else GRANTS[name]
        call = f"OP.{name}(keys, args, {'true' if read_only else 'false'})"
        registrations.append(_register(public, _callback(call, grant), public in READ_ONLY))
    for name in names:
        script = scripts.load(name)
        grant = GRANTS.get(name)
        registrations += [
            _register(script.function, _callback(f"OP.{name}(keys, args, false)", grant),
                      False),
            _register(script.read_only.function,
                      _callback(f"OP.{name}(keys, args, true)", None), True),
            # remembering writes the batch memory even around a read: not for every caller
            _register(script.remembering.function,
                      _callback(f"ONCE.{name}(keys, args)", grant or "admin"), False),
        ]
    return f"#!lua name={LIBRARY}\n-- redisbuf {version}\n{body}{''.join(registrations)}"


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
    """Load the library on ``client``'s server (on a ``RedisCluster``, on every primary)
    unless this version is there already. Returns whether it loaded it."""
    client = unwrapped(client)
    if isinstance(client, redis.cluster.RedisCluster):
        loaded = False
        for node in client.get_primaries():
            loaded |= install(client.get_redis_connection(node))
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
    try:
        _checked.add(target)
    except TypeError:
        pass
