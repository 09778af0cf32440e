"""Waiting until a buffer changes, across processes, without polling the server.

Every script that changes what a waiter may be waiting for (items stored, a rate
limiter's counters) publishes on the buffer's *change channel*: its meta key with
``:meta`` replaced by ``:changed`` (``notify_changed`` in ``lua/_common.lua``, or
:func:`notify` from Python). A waiter subscribes first, then checks its condition, then
blocks on the subscription's socket until a message arrives, so a change that lands
between the check and the wait still wakes it.

Why Pub/Sub and not a wake-up list popped with BLPOP: a pushed token wakes one waiter,
so with several processes waiting an adder would have to know how many tokens to push,
and the list is state that outlives its waiters. A published message reaches every
subscriber, leaves nothing behind and costs nothing when nobody listens. A message can
be lost only when the subscriber's connection drops (redis-py subscribes again on its
own); the waiter re-checks every ``recheck`` seconds to cover that, which is not
busy polling. Each wait is a socket wait of at most ``recheck`` seconds, and Ctrl-C
interrupts it (KeyboardInterrupt propagates; the subscription is closed on the way out).
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

from ..errors import WaitTimeoutError

T = TypeVar("T")

DEFAULT_RECHECK = 2.0


class Unset(enum.Enum):
    """The type of :data:`UNSET`."""

    UNSET = "unset"


#: a ``timeout`` argument the caller left out: ``None`` already means "no limit", so
#: "not given" needs its own value for a per-call timeout to win wherever one is given
UNSET: Final = Unset.UNSET


def changed_channel(meta_key: str) -> str:
    """The change channel of the buffer whose meta key is ``meta_key``
    (``rb:{name}:meta`` -> ``rb:{name}:changed``); same rule as the Lua helper."""
    if not meta_key.endswith(":meta"):
        raise ValueError(f"{meta_key!r} is not a meta key (it must end with ':meta')")
    return meta_key[: -len("meta")] + "changed"


def notify(client: Any, meta_key: str) -> int:
    """Wake every process waiting on this buffer; returns how many subscribers heard."""
    return int(client.publish(changed_channel(meta_key), b"1"))


class ChangeSubscription:
    """A subscription to one buffer's change channel (use as a context manager)."""

    def __init__(self, client: Any, meta_key: str) -> None:
        self.channel = changed_channel(meta_key)
        # subscribe confirmations are filtered in wait(): redis-py's own filter returns
        # None for them, which would end a wait early
        self._pubsub = client.pubsub()

    def __enter__(self) -> ChangeSubscription:
        self._pubsub.subscribe(self.channel)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        # closing the connection ends the subscription; no UNSUBSCRIBE round trip that
        # could fail on a broken connection and hide the exception being handled
        self._pubsub.close()

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for a change; True if one was announced.
        Messages already queued are all consumed (one re-check covers them all)."""
        deadline = time.monotonic() + max(timeout, 0.0)
        while True:
            message = self._pubsub.get_message(timeout=max(deadline - time.monotonic(), 0.0))
            if message is None:
                return False
            if message.get("type") == "message":
                break
        while message is not None:
            message = self._pubsub.get_message(timeout=0.0)
        return True


def wait_for(
    client: Any,
    meta_key: str,
    check: Callable[[], T | None],
    timeout: float | None,
    describe: Callable[[], str],
    error: type[WaitTimeoutError] = WaitTimeoutError,
    recheck: float | None = None,
) -> T:
    """Return the first non-None ``check()``, calling it again after each change of the
    buffer (and at least every ``recheck`` seconds, default ``DEFAULT_RECHECK``).
    ``timeout=None`` waits forever; otherwise after ``timeout`` seconds raise
    ``error(describe())``. The first check runs before subscribing, so a call that need
    not wait costs no subscription."""
    if timeout is not None and timeout < 0:
        raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
    result = check()
    if result is not None:
        return result
    recheck = DEFAULT_RECHECK if recheck is None else recheck
    deadline = None if timeout is None else time.monotonic() + timeout
    with ChangeSubscription(client, meta_key) as subscription:
        while True:
            result = check()  # after subscribing: a change from now on is not missed
            if result is not None:
                return result
            slice_ = recheck
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise error(describe())
                slice_ = min(slice_, remaining)
            subscription.wait(slice_)


__all__ = ["UNSET", "ChangeSubscription", "Unset", "changed_channel", "notify", "wait_for"]
