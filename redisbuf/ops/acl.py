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


def rules(name: str, role: str) -> list[str]:
    """The ACL rules (after the user name) of ``role`` on buffer ``name``; the user is
    reset first (``reset``), so nothing granted before survives. No password: add one.

    They name every command the newest servers know (``client|setinfo``, Redis >= 7.2);
    :func:`supported` drops those a given server does not."""
    keys = BufferKeys(name)
    pattern = keys.pattern  # rb:{NAME}:*
    changed = keys.meta[: -len("meta")] + "changed"
    if role in GRANTED:
        channels = " ".join(f"&{grant_channel(name, grant)}" for grant in GRANTED[role])
        extra = " +subscribe +unsubscribe" if role == "learner" else ""
        text = (
            f"reset on ~{pattern} resetchannels &{changed} {channels} -@all {_CONNECT} "
            f"+fcall +fcall_ro +@read +@write +publish +multi +exec +time -@dangerous{extra} "
            f"{_NO_LIBRARY_CHANGES}"
        )
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
    return text.split()


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
    raw.response_callbacks = {}
    replies = raw.execute_command("COMMAND", "INFO", *(rule[1:] for rule in named))
    unknown = {rule for rule, reply in zip(named, replies, strict=True) if reply is None}
    return [rule for rule in rules if rule not in unknown], [r for r in rules if r in unknown]


def _unwrapped(client: Any) -> Any:
    from ..store.functions import unwrapped

    return unwrapped(client)


def setuser_line(name: str, role: str, user: str) -> str:
    """``ACL SETUSER USER RULES...`` as one line (without a password; redis-cli quoting)."""
    return "ACL SETUSER " + " ".join([user, *(f"'{rule}'" if "{" in rule else rule
                                               for rule in rules(name, role))])
