"""Reverb's exceptions (``reverb.errors``): what the API raises where Reverb raises them.

Other failures are redisbuf's own (:mod:`redisbuf.errors`: a lost server is
:class:`~redisbuf.errors.ServerUnavailableError`), and bad arguments raise ``ValueError``
or ``TypeError`` as in Reverb.
"""

from __future__ import annotations

import datetime


class ReverbError(Exception):
    """The base of Reverb's errors."""


class DeadlineExceededError(ReverbError):
    """A call did not complete within its timeout (``flush(timeout_ms=...)``,
    ``server_info(timeout=...)``, a dataset's ``rate_limiter_timeout_ms``)."""


def writer_deadline(call: str, timeout_ms: int | None) -> DeadlineExceededError:
    """A writer's ``call`` ("Flush", "End episode") timed out after ``timeout_ms``: the
    error with Reverb's message."""
    return DeadlineExceededError(
        f"{call} call did not complete within provided timeout of "
        f"{datetime.timedelta(milliseconds=timeout_ms or 0)}")


__all__ = ["DeadlineExceededError", "ReverbError"]
