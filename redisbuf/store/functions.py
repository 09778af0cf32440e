"""The ``redisbuf`` Redis Functions library: the buffer's operations for any client.

``FUNCTION LOAD`` (Redis >= 7, Valkey) installs a library that every client calls by
name with ``FCALL`` (``redis-cli``, Node, Go...), under the same atomicity and invariants
as the Python path, because it is built here from the same ``lua/`` files: each
operation's script, its ``-- @include`` lines expanded, becomes one local Lua function
taking ``(KEYS, ARGV)`` (so the scripts' globals and top-level ``return`` keep their
meaning, and each operation's helpers are locals of its own function: no limit on locals
or upvalues is shared between operations), registered under ``rb_NAME``.

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
  if extra == 0 then return rb_op_add(keys, args) end
  local window = tonumber(redis.call('HGET', keys[1], 'retry_window')) or DEFAULT_WINDOW
  local rkeys, rargs = {}, {}
  for i = 1, #keys do rkeys[i] = keys[i] end
  rkeys[#rkeys + 1] = keys[14]  -- batches
  rkeys[#rkeys + 1] = keys[15]  -- batches:old
  for i = 1, #args do rargs[i] = args[i] end
  rargs[#rargs + 1] = tostring(math.floor(window * 1000))
  return rb_op_add_once(rkeys, rargs)
end
"""


def _wrap(function: str, script: scripts.Script) -> str:
    """``script``'s source as a local Lua function of (KEYS, ARGV) called ``function``."""
    source = script.source.removeprefix("#!lua flags=no-writes\n")
    return f"local function {function}(KEYS, ARGV)\n{source}\nend\n"


def _register(name: str, callee: str) -> str:
    flags = ", flags = {'no-writes'}" if name in READ_ONLY else ""
    return (
        f"redis.register_function{{function_name = '{name}', "
        f"callback = function(keys, args) return {callee}(keys, args) end{flags}}}\n"
    )


@cache
def library_source() -> str:
    """The library's Lua source (``#!lua name=redisbuf``), built from lua/."""
    from ..buffers.replay import DEFAULT_RETRY_WINDOW

    parts = [
        f"local DEFAULT_WINDOW = {DEFAULT_RETRY_WINDOW!r}\n",
        f"local RB_MAX_ADD = {bounds.MAX_ADD_ITEMS}\n",
    ]
    add = scripts.load("add")
    parts.append(_wrap("rb_op_add", add))
    parts.append(_wrap("rb_op_add_once", add.remembering))
    parts.append(_ADD_ADAPTER)
    for name, (script, read_only) in _OPERATIONS.items():
        loaded = scripts.load(script)
        parts.append(_wrap(f"rb_op_{name[3:]}", loaded.read_only if read_only else loaded))
    body = "".join(parts)
    version = hashlib.sha1(body.encode()).hexdigest()[:16]
    registrations = [
        "redis.register_function{function_name = 'rb_version', callback = function() "
        f"return '{version}' end, flags = {{'no-writes'}}}}\n",
        _register("rb_add", "rb_add_checked"),
        *(_register(name, f"rb_op_{name[3:]}") for name in _OPERATIONS),
    ]
    return f"#!lua name={LIBRARY}\n-- redisbuf {version}\n{body}{''.join(registrations)}"


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
