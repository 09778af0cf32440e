"""What a call does when a large add is being stored in its buffer (``RB_APPLYING``).

A large add (more than one add's bound, redisbuf/buffers/staged.py) is stored a slice at a
time after its commit, and until its last slice is in every script on the buffer refuses
before any read or write (lua/_apply.lua). The runner (Script.__call__) then calls
:func:`finish`, which stores the slices left itself (``add_apply``: any writing role may,
so a writer that died after its commit blocks nobody), and calls again. A caller that may
not write (a read-only replica, the operator role) waits instead, polling the flag.
"""

from __future__ import annotations

import time
from typing import Any

import redis

from ..errors import ApplyingError
from . import scripts
from .connection import retrying
from .keys import BufferKeys

#: Seconds a caller that may not store the slices itself waits for another caller to.
APPLY_WAIT = 120.0
_POLL = 0.005  # seconds between its looks at the flag

# what a server answers a caller that may not write
_MAY_NOT_WRITE = (*scripts._REFUSED_WRITES, redis.exceptions.NoPermissionError)


def refused(reply: Any) -> bool:
    """Whether a script's pipelined ``reply`` is its refusal while a large add is being
    stored (``RB_APPLYING``, before any read or write): call :func:`finish`, then again."""
    return isinstance(reply, redis.exceptions.ResponseError) and isinstance(
        scripts.translate(reply), ApplyingError)


def keys_of(meta_key: str) -> list[str]:
    """The KEYS of ``add_apply`` for the buffer whose meta key is ``meta_key``."""
    text = meta_key.decode() if isinstance(meta_key, bytes) else str(meta_key)
    name = text[text.index("{") + 1 : text.rindex("}")]
    keys = BufferKeys(name)
    return [*keys.all_keys(), *keys.applying_keys()]


def finish(client: Any, meta_key: str, wait: float = APPLY_WAIT) -> list[int]:
    """Store what is left of the large add being stored in the buffer of ``meta_key``, a
    slice a call; a caller the server does not let write waits (at most ``wait`` seconds)
    until another has. Returns the last step's reply ``[done, first id, n, evicted so
    far]`` (``[1, 0, 0, 0]``: nothing left, or only waited)."""
    script = scripts.load("add_apply")
    keys = keys_of(meta_key)
    while True:
        try:
            reply = retrying(lambda: script(client, keys, []), name=client)
        except _MAY_NOT_WRITE:
            _wait_out(client, keys[0], wait)
            return [1, 0, 0, 0]
        if int(reply[0]) == 1:
            return [int(value) for value in reply]


def _wait_out(client: Any, meta_key: str, wait: float) -> None:
    deadline = time.monotonic() + wait
    while retrying(lambda: client.hexists(meta_key, "applying"), name=client):
        if time.monotonic() > deadline:
            raise ApplyingError(
                f"{meta_key} has been storing a large add for over {wait:.0f} s and this "
                "client may not store its slices (read-only, or a role without a writing "
                "grant); call again later")
        time.sleep(_POLL)
