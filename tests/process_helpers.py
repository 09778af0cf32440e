"""Process-state checks shared by tests that kill servers and workers."""

from __future__ import annotations

import signal
import time
from pathlib import Path


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
