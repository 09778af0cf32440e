"""Per-buffer ACL roles: the ``ACL SETUSER`` rules of a user confined to one buffer.

Redis ACLs restrict commands, key patterns (read and write apart: ``%R~`` / ``%W~``) and
Pub/Sub channels, and check every key a script or function touches against the calling
user. They cannot restrict which function ``FCALL`` runs (the function name is an
argument, not a subcommand) nor which script ``EVALSHA`` runs. So a role is enforced as:

* its keys: only the buffer's (``rb:{NAME}:*``) and its channels;
* which operations: every function of the library that changes a buffer checks, with
  ``redis.acl_check_cmd``, that its caller may PUBLISH on the buffer's grant channel for
  that kind of operation (:func:`grant_channel`; redisbuf/store/functions.py, GRANTS)
  and replies NOPERM before any write otherwise: the actor is granted ``add``, the
  learner ``sample`` and ``priority``, the admin all (``rb:{NAME}:*``). The Python
  package runs its scripts as those functions (redisbuf/store/scripts.py), so the roles
  hold for it, for the ``redisbuf`` command and for FCALL from any language; ``EVAL`` /
  ``EVALSHA`` are refused to all roles but the admin;
* what ACL cannot enforce: every command a function runs is checked against the calling
  user too, so a user allowed ``FCALL rb_add`` must be allowed HSET, ZADD, HINCRBY... on
  the buffer's keys, and can send them directly: actor and learner get the read and
  write commands (not the ``@dangerous`` ones such as FLUSHALL, KEYS) on their buffer's
  keys only, so a hand-written client can damage its own buffer's consistency but
  nothing else;
* the actor may not read the items themselves: its keys are its buffer's but for the
  hashes that hold items (:data:`PAYLOAD`, and a restore's staging keys), which it may
  only write (``%W~``: HSET, HDEL, HLEN, HEXISTS; not HGET, HMGET, HSCAN, RENAME...), and
  one ACL selector, ``(+fcall +fcall_ro ~rb:{NAME}:*)``, lets it call the library's
  functions, which declare every key of the buffer. A function runs its commands as the
  caller, so one that reads items (a draw, ``rb_sample_uniform_ro`` with blobs) is
  refused to the actor too; ``get``, ``redisbuf inspect`` (its top items) and
  ``redisbuf export`` with it;
* the operator reads only (keys granted read-only, native reads, ``FCALL_RO`` of the
  ``no-writes`` functions, MULTI/EXEC for consistent reads): ``inspect``, ``watch``,
  ``export``;
* the admin may do everything the Python package does on that buffer (native commands
  and scripts included) and nothing on other keys;
* nobody but the server's own administrator may load or delete the library
  (``FUNCTION LOAD`` runs code that other users' calls execute).
"""

from __future__ import annotations

from typing import Any

import redis

from ..store.keys import BufferKeys

ROLES = ("actor", "learner", "operator", "admin")

# commands every client library sends on connect (errors ignored by redis-py, node-redis)
_CONNECT = "+ping +hello +auth +client|setname +client|getname +client|id +client|setinfo +echo"
# rules that the oldest servers the roles support (Redis 7.0: selectors, %R~ / %W~,
# FUNCTION) refuse, with the first Redis version that knows them; every valkey does
NEWER: dict[str, tuple[int, int]] = {"+client|setinfo": (7, 2)}
OLDEST = (7, 0)

# the hashes that hold items (suffixes after rb:{NAME}:): the actor writes, never reads them
PAYLOAD = ("items", "quarantine", "seq:steps", "episodes:steps", "fragments:frags")
# key prefixes (after rb:{NAME}:) the actor has no business with at all: a restore's
# staged copy of the items (StagingKeys)
NOT_ACTORS = ("staging:",)
_NO_LIBRARY_CHANGES = (
    "-function|load -function|delete -function|flush -function|restore -script|flush "
    "-script|kill -function|kill"
)


def grant_channel(name: str, grant: str) -> str:
    """The channel whose PUBLISH permission the library's functions ask of a caller before
    an operation of kind ``grant`` (add, sample, priority, admin) on buffer ``name``
    (redisbuf/store/functions.py, GRANTS): a role is granted the channels of its kinds."""
    return BufferKeys(name).meta[: -len("meta")] + f"grant:{grant}"


# the operation kinds each writing role is granted (its grant channels)
GRANTED = {"actor": ("add",), "learner": ("sample", "priority")}


def complement(prefix: str, exact: tuple[str, ...], prefixes: tuple[str, ...] = ()) -> list[str]:
    """Glob patterns (Redis's: ``*``, ``?``, ``[^...]``) that together match every string
    ``prefix + s`` except where ``s`` is one of ``exact``, starts with one of ``prefixes``
    or is a proper beginning of one of them (``rb:{NAME}:ite``: no such key is made):
    ACL key patterns cannot exclude, so the rest is spelled out, one ``[^...]`` class per
    character of the excluded names. ``prefix`` and the names hold no glob character."""
    trie: dict[str, Any] = {}
    for text, whole in [(e, False) for e in exact] + [(p, True) for p in prefixes]:
        node = trie
        for char in text:
            node = node.setdefault(char, {})
        node["$all" if whole else "$end"] = True
    out: list[str] = []

    def walk(node: dict[str, Any], path: str) -> None:
        if node.get("$all"):
            return  # everything from here on is excluded
        chars = sorted(c for c in node if not c.startswith("$"))
        out.append(prefix + path + (f"[^{''.join(chars)}]*" if chars else "?*"))
        for char in chars:
            walk(node[char], path + char)

    walk(trie, "")
    return out


def actor_keys(name: str) -> list[str]:
    """The actor's key rules on buffer ``name``: read and write on every key of the buffer
    but the item hashes (:data:`PAYLOAD`) and staging keys, write only on the item
    hashes, and a selector for the library's functions (which declare every key)."""
    base = BufferKeys(name).meta[: -len("meta")]  # rb:{NAME}:
    rest = [f"~{p}" for p in complement(base, PAYLOAD, NOT_ACTORS)]
    return [*rest, *(f"%W~{base}{p}" for p in PAYLOAD),
            f"(+fcall +fcall_ro ~{BufferKeys(name).pattern})"]


def rules(name: str, role: str, version: tuple[int, int] | None = None) -> list[str]:
    """The ACL rules (after the user name) of ``role`` on buffer ``name``; the user is
    reset first (``reset``), so nothing granted before survives. No password: add one.

    They name every command the newest servers know (``client|setinfo``, Redis >= 7.2;
    :data:`NEWER`): for a Redis ``version`` (major, minor) the rules it would refuse are
    left out, and :func:`supported` drops those a given server does not know."""
    keys = BufferKeys(name)
    pattern = keys.pattern  # rb:{NAME}:*
    changed = keys.meta[: -len("meta")] + "changed"
    if role in GRANTED:
        channels = " ".join(f"&{grant_channel(name, grant)}" for grant in GRANTED[role])
        extra = " +subscribe +unsubscribe" if role == "learner" else ""
        key_rules = actor_keys(name) if role == "actor" else [f"~{pattern}"]
        text = (
            f"resetchannels &{changed} {channels} -@all {_CONNECT} "
            f"+fcall +fcall_ro +@read +@write +publish +multi +exec +time -@dangerous{extra} "
            f"{_NO_LIBRARY_CHANGES}"
        )
        return _for(["reset", "on", *key_rules[:-1], *text.split(), *key_rules[-1:]]
                    if role == "actor" else ["reset", "on", *key_rules, *text.split()],
                    version)
    elif role == "operator":
        text = (
            f"reset on %R~{pattern} resetchannels &{changed} -@all {_CONNECT} +@read "
            "-keys -scan -randomkey +fcall_ro +subscribe +unsubscribe +info "
            "+memory|usage +time +multi +exec"
        )
    elif role == "admin":
        text = (
            f"reset on ~{pattern} resetchannels &{pattern} -@all +@read +@write +@scripting "
            f"+@connection +@pubsub +info +memory|usage +time +multi +exec -keys -randomkey "
            f"-flushall -flushdb -swapdb -move -copy {_NO_LIBRARY_CHANGES}"
        )
    else:
        raise ValueError(f"unknown role {role!r}; choose from {', '.join(ROLES)}")
    return _for(text.split(), version)


def _for(rules: list[str], version: tuple[int, int] | None) -> list[str]:
    if version is None:
        return rules
    return [rule for rule in rules if NEWER.get(rule, OLDEST) <= version]


def works_on(rules: list[str]) -> str:
    """Which servers accept ``rules`` (as printed for no server in particular)."""
    newest = max((NEWER[r] for r in rules if r in NEWER), default=OLDEST)
    return (f"Redis >= {newest[0]}.{newest[1]} and valkey" if newest > OLDEST
            else f"Redis >= {OLDEST[0]}.{OLDEST[1]} and valkey")

def supported(client: Any, rules: list[str]) -> tuple[list[str], list[str]]:
    """``rules`` without the commands and subcommands (``+client|setinfo``) that
    ``client``'s server does not know, which ``ACL SETUSER`` would refuse whole (Redis 7.0
    has no ``client|setinfo``), asked with one ``COMMAND INFO``; and those dropped."""
    named = [rule for rule in rules if rule[:1] in "+-" and rule[1:2] != "@"]
    if not named:
        return list(rules), []
    # redis-py's parser of COMMAND INFO fails on the nil reply of an unknown command: a
    # client on the same connections without reply parsing
    raw = redis.Redis(connection_pool=_unwrapped(client).connection_pool)
    raw.response_callbacks.clear()
    replies = raw.execute_command("COMMAND", "INFO", *(rule[1:] for rule in named))
    unknown = {rule for rule, reply in zip(named, replies, strict=True) if reply is None}
    return [rule for rule in rules if rule not in unknown], [r for r in rules if r in unknown]


def _unwrapped(client: Any) -> Any:
    from ..store.functions import unwrapped

    return unwrapped(client)


def setuser_line(name: str, role: str, user: str, rules_: list[str] | None = None) -> str:
    """``ACL SETUSER USER RULES...`` as one line (without a password; redis-cli quoting):
    the role's :func:`rules`, or ``rules_``."""
    chosen = rules(name, role) if rules_ is None else rules_
    return "ACL SETUSER " + " ".join(
        [user, *(f"'{rule}'" if any(c in rule for c in "{ [") else rule for rule in chosen)])
