"""Process-state checks shared by tests that kill servers and workers."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import signal
import time
from pathlib import Path

#: What the fresh processes' server imports once (a missing one is skipped): a spawned
#: child importing torch and torchrl costs ~7 s of CPU, tens of seconds on a busy machine
PRELOAD = ("numpy", "redis", "msgpack", "redisbuf", "torch", "tensordict", "torchrl",
           "redisbuf.torchrl", "redisbuf.ding")


#: The environment as the session began: the server is started in it, so that a test's
#: monkeypatched variable does not stay in every later test's processes
_SESSION_ENV = dict(os.environ)


def fresh_context() -> multiprocessing.context.BaseContext:
    """A context whose processes start as fresh as spawn's (forked from a server process
    that holds no state of this one: no connection, thread or cache), with the heavy
    modules of :data:`PRELOAD` already imported there, once per test process. Unlike
    spawn's, its processes see the session's environment, not the test's."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(list(PRELOAD))
    now = dict(os.environ)
    if now == _SESSION_ENV:
        multiprocessing.forkserver.ensure_running()
        return context
    os.environ.clear()
    os.environ.update(_SESSION_ENV)
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        os.environ.clear()
        os.environ.update(now)
    return context


def alive(pid: int) -> bool:
    """Whether a process exists and is neither a zombie nor dead (a killed child of init is reaped).

    A process can vanish between opening its ``/proc`` entry and reading it; that reads as gone.
    """
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def wait_dead(pid: int, timeout: float = 20.0) -> bool:
    """Whether process ``pid`` is gone (see :func:`alive`) within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.02)
    return not alive(pid)


def default_signals() -> None:
    """``preexec_fn`` for a child that a test signals: SIGHUP and SIGINT at their default
    dispositions. A runner started under ``nohup`` ignores SIGHUP, one started in the
    background by a shell ignores SIGINT, and a child inherits that; the product must
    not undo it (ignoring SIGHUP is what a user of ``nohup redisbuf demo`` asked for), so
    the test that means "a process killed by SIGHUP" sets it up here."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)
