"""Rate limiters (Reverb's ``RateLimiter``): hold inserters or samplers back so that the
ratio of samples to inserts stays near a target, counted globally in Redis.

The state is the buffer's meta fields ``rl_inserts`` and ``rl_samples`` and its size; one
script (``lua/rate_limit.lua``) decides and counts each call atomically, so the rule
holds across every process sharing the buffer. With ``diff = inserts * samples_per_insert
- samples``:

- an insert is admitted while the size is below ``min_size_to_sample`` (after it) or
  ``diff + samples_per_insert <= max_diff``;
- a sample is admitted while ``size >= min_size_to_sample`` and ``diff - 1 >= min_diff``.

A call of ``n`` items is admitted when one more item would be, then counts all ``n``.
A side that is not admitted waits (woken by the other side's admissions, see
:mod:`redisbuf.sampling.waiting`) up to the call's ``timeout`` where the call gives one, else the
limiter's ``timeout`` seconds, then raises :class:`~redisbuf.errors.RateLimitTimeoutError`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import ConfigMismatchError, RateLimitTimeoutError
from .waiting import UNSET, Unset, wait_for

if TYPE_CHECKING:
    from .base import BufferView

DEFAULT_TIMEOUT = 60.0


@dataclass(frozen=True)
class RateLimiter:
    """Reverb's general limiter. ``timeout`` (seconds, None: no limit) is this process's
    own patience; the other fields are stored with the buffer and shared.

    Attributes:
        samples_per_insert: the target ratio of sampled to inserted items (> 0).
        min_size_to_sample: samples wait until the buffer holds this many items (>= 1).
        min_diff: a sample waits while it would lower ``inserts * samples_per_insert -
            samples`` below this.
        max_diff: an insert waits while it would raise that difference above this (not
            while the buffer holds fewer than ``min_size_to_sample`` items).
        timeout: as above.

    Raises:
        ValueError: a field out of range, or ``min_diff > max_diff``.

    Examples:
        >>> from redisbuf.limiters import RateLimiter
        >>> RateLimiter(1.0, 100, min_diff=10.0, max_diff=-10.0)
        Traceback (most recent call last):
        ...
        ValueError: min_diff 10.0 is above max_diff -10.0
    """

    samples_per_insert: float
    min_size_to_sample: int
    min_diff: float
    max_diff: float
    timeout: float | None = DEFAULT_TIMEOUT

    def __post_init__(self) -> None:
        spi = self.samples_per_insert
        if isinstance(spi, bool) or not isinstance(spi, (int, float)) or not (
            math.isfinite(spi) and spi > 0
        ):
            raise ValueError(f"samples_per_insert must be a finite number > 0, got {spi!r}")
        size = self.min_size_to_sample
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"min_size_to_sample must be an integer >= 1, got {size!r}")
        for name in ("min_diff", "max_diff"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
                raise ValueError(f"{name} must be a number, got {value!r}")
        if self.min_diff > self.max_diff:
            raise ValueError(f"min_diff {self.min_diff} is above max_diff {self.max_diff}")
        if self.timeout is not None and not self.timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, got {self.timeout!r}")

    def _fields(self) -> list[str]:
        return [repr(float(self.samples_per_insert)), str(self.min_size_to_sample),
                _text(self.min_diff), _text(self.max_diff)]


def SampleToInsertRatio(  # noqa: N802 - Reverb's name for a limiter constructor
    samples_per_insert: float,
    min_size_to_sample: int,
    error_buffer: float | tuple[float, float],
    timeout: float | None = DEFAULT_TIMEOUT,
) -> RateLimiter:
    """Keep ``samples / inserts`` near ``samples_per_insert`` once ``min_size_to_sample``
    items are in. ``error_buffer`` (a number, or ``(min_diff, max_diff)``) is the slack
    around ``samples_per_insert * min_size_to_sample``; as in Reverb, ``max_diff -
    min_diff`` must be at least ``2 * max(1, samples_per_insert)`` so neither side can be
    locked out.

    Args:
        samples_per_insert: the target ratio (> 0).
        min_size_to_sample: samples wait until the buffer holds this many items.
        error_buffer: the slack, as above.
        timeout: this process's patience in seconds (``None``: no limit).

    Returns:
        The limiter.

    Raises:
        ValueError: an argument out of range, or a slack that could lock a side out.

    Examples:
        >>> from redisbuf.limiters import SampleToInsertRatio
        >>> limiter = SampleToInsertRatio(2.0, min_size_to_sample=10, error_buffer=4.0)
        >>> limiter.min_diff, limiter.max_diff
        (16.0, 24.0)
    """
    if isinstance(error_buffer, tuple):
        min_diff, max_diff = error_buffer
    else:
        if isinstance(error_buffer, bool) or not isinstance(error_buffer, (int, float)):
            raise ValueError(f"error_buffer must be a number or a pair, got {error_buffer!r}")
        offset = float(samples_per_insert) * min_size_to_sample
        min_diff, max_diff = offset - error_buffer, offset + error_buffer
    limiter = RateLimiter(float(samples_per_insert), min_size_to_sample, float(min_diff),
                          float(max_diff), timeout)
    if not max_diff - min_diff >= 2 * max(1.0, limiter.samples_per_insert):
        raise ValueError(
            f"error_buffer {error_buffer!r} leaves max_diff - min_diff = {max_diff - min_diff:g}"
            f", below 2 * max(1, samples_per_insert) = "
            f"{2 * max(1.0, limiter.samples_per_insert):g}: a side could be locked out"
        )
    return limiter


def MinSize(n: int, timeout: float | None = DEFAULT_TIMEOUT) -> RateLimiter:  # noqa: N802
    """Samplers wait until the buffer holds ``n`` items; inserts are never held back.

    Args:
        n: the least number of items to sample from (>= 1).
        timeout: this process's patience in seconds (``None``: no limit).

    Returns:
        The limiter.

    Raises:
        ValueError: ``n`` is not an integer >= 1, or a negative ``timeout``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import RateLimitTimeoutError
        >>> from redisbuf.limiters import MinSize
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", rate_limiter=MinSize(2, timeout=0))
        >>> _ = buffer.add({"obs": np.zeros(1), "log_rewards": np.zeros(1)})
        >>> try:
        ...     buffer.sample(1)
        ... except RateLimitTimeoutError:
        ...     print("held back")
        held back
    """
    return RateLimiter(1.0, n, -math.inf, math.inf, timeout)


def Queue(size: int, timeout: float | None = DEFAULT_TIMEOUT) -> RateLimiter:  # noqa: N802
    """Reverb's ``Queue(size)`` limiter: with a FIFO sampler, a FIFO remover, ``max_use=1``
    and ``capacity=size`` the buffer is a bounded queue: a sample waits while it is empty,
    an insert while ``size`` items wait unread (``samples_per_insert=1``,
    ``min_size_to_sample=1``, ``min_diff=0``, ``max_diff=size``).

    Args:
        size: the most items waiting (>= 1).
        timeout: this process's patience in seconds (``None``: no limit).

    Returns:
        The limiter.

    Raises:
        ValueError: ``size`` is not an integer >= 1.

    Examples:
        >>> from redisbuf.limiters import Queue
        >>> limiter = Queue(10)
        >>> limiter.min_diff, limiter.max_diff, limiter.min_size_to_sample
        (0.0, 10.0, 1)
    """
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise ValueError(f"size must be an integer >= 1, got {size!r}")
    return RateLimiter(1.0, 1, 0.0, float(size), timeout)


def Stack(size: int, timeout: float | None = DEFAULT_TIMEOUT) -> RateLimiter:  # noqa: N802
    """Reverb's ``Stack(size)`` limiter: the same numbers as :func:`Queue`, for a buffer
    with a LIFO sampler and a LIFO remover (newest first).

    Args:
        size: the most items waiting (>= 1).
        timeout: this process's patience in seconds (``None``: no limit).

    Returns:
        The limiter.

    Raises:
        ValueError: ``size`` is not an integer >= 1.
    """
    return Queue(size, timeout)


def _text(value: float) -> str:
    if value == math.inf:
        return "inf"
    if value == -math.inf:
        return "-inf"
    return repr(float(value))


def _number(text: bytes | str) -> float:
    text = text.decode() if isinstance(text, bytes) else text
    return float(text)  # Python reads "inf" / "-inf" too


def configure(buffer: BufferView, limiter: RateLimiter | None) -> RateLimiter | None:
    """Store ``limiter`` on a new buffer, or check it against the stored one (None adopts
    the stored limiter, with the default timeout). Returns the limiter in force."""
    args = limiter._fields() if limiter is not None else ["", "", "", ""]
    reply = buffer.run("limiter_config", [buffer.keys.meta], args, read=limiter is None)
    if reply[0] in (b"", ""):
        if limiter is not None:
            raise ConfigMismatchError(
                f"buffer {buffer.name!r} already holds items without a rate limiter (a rate "
                "limiter is fixed when the buffer is created)"
            )
        return None
    stored = RateLimiter(_number(reply[0]), int(reply[1]), _number(reply[2]), _number(reply[3]),
                         DEFAULT_TIMEOUT if limiter is None else limiter.timeout)
    if limiter is not None and stored != limiter:
        raise ConfigMismatchError(
            f"buffer {buffer.name!r} exists with rate limiter {_describe(stored)}, not "
            f"{_describe(limiter)}"
        )
    return stored


def _describe(limiter: RateLimiter) -> str:
    return (f"(samples_per_insert={limiter.samples_per_insert}, min_size_to_sample="
            f"{limiter.min_size_to_sample}, min_diff={limiter.min_diff}, "
            f"max_diff={limiter.max_diff})")


def _call(buffer: BufferView, op: str, n: int) -> list[Any]:
    return buffer.run("rate_limit", [buffer.keys.meta, buffer.keys.order], [op, n])


def _waited_for(limiter: RateLimiter, side: str, reply: list[Any]) -> str:
    """What a refused call of ``side`` waits for, from the script's reply."""
    inserts, samples, size = int(reply[1]), int(reply[2]), int(reply[3])
    diff = inserts * limiter.samples_per_insert - samples
    if side == "insert":
        return (
            f"samplers to catch up: one more insert would make inserts*samples_per_insert"
            f" - samples = {diff + limiter.samples_per_insert:g}, above max_diff="
            f"{limiter.max_diff:g} (inserts={inserts}, samples={samples}, "
            f"samples_per_insert={limiter.samples_per_insert:g})"
        )
    if size < limiter.min_size_to_sample:
        return (
            f"inserts: the buffer holds {size} items, below min_size_to_sample="
            f"{limiter.min_size_to_sample}"
        )
    return (
        f"inserts: one more sample would make inserts*samples_per_insert - samples = "
        f"{diff - 1:g}, below min_diff={limiter.min_diff:g} (inserts={inserts}, "
        f"samples={samples}, samples_per_insert={limiter.samples_per_insert:g})"
    )


def acquire(
    buffer: BufferView,
    limiter: RateLimiter,
    side: str,
    n: int,
    timeout: float | None | Unset = UNSET,
) -> tuple[int, int]:
    """Wait until ``side`` ("insert" or "sample") of ``n`` items is admitted and count it.
    Returns the counters ``(inserts, samples)`` right after. A given ``timeout`` (None:
    no limit) overrides the limiter's. Raises :class:`RateLimitTimeoutError` saying who
    waited for what."""
    last: list[Any] = []

    def attempt() -> tuple[int, int] | None:
        reply = _call(buffer, side, n)
        last[:] = reply
        if int(reply[0]) != 1:
            return None
        return int(reply[1]), int(reply[2])

    def describe() -> str:
        return (f"buffer {buffer.name!r}: {side} of {n} items waited {wait:g} s for "
                f"{_waited_for(limiter, side, last)}")

    wait = limiter.timeout if timeout is UNSET else timeout
    return wait_for(buffer.client, buffer.keys.meta, attempt, wait, describe,
                    error=RateLimitTimeoutError)


def acquire_upto(
    buffer: BufferView,
    limiter: RateLimiter,
    side: str,
    n: int,
    timeout: float | None | Unset = UNSET,
) -> int:
    """Wait until the limiter admits at least one item of ``side`` ("insert" or
    "sample"), then admit and count as many of the ``n`` as it admits one after the
    other (Reverb's arithmetic, an item at a time). Returns how many (1 to ``n``); the
    caller takes back with :func:`release` those it does not use. A given ``timeout``
    (None: no limit) overrides the limiter's; raises :class:`RateLimitTimeoutError`."""
    last: list[Any] = []

    def attempt() -> int | None:
        reply = _call(buffer, f"{side}_upto", n)
        last[:] = reply
        admitted = int(reply[0])
        return admitted if admitted > 0 else None

    def describe() -> str:
        return (f"buffer {buffer.name!r}: {side} waited {wait:g} s for "
                f"{_waited_for(limiter, side, last)}")

    wait = limiter.timeout if timeout is UNSET else timeout
    return wait_for(buffer.client, buffer.keys.meta, attempt, wait, describe,
                    error=RateLimitTimeoutError)


def can(buffer: BufferView, side: str, n: int) -> bool:
    """Whether ``side`` ("insert" or "sample") of ``n`` items would be admitted now by
    Reverb's ``can_insert(n)`` / ``can_sample(n)``: ``size + n <= min_size_to_sample``
    or ``(inserts + n) * samples_per_insert - samples <= max_diff``; ``size >=
    min_size_to_sample`` and ``inserts * samples_per_insert - samples - n >= min_diff``.
    Counts nothing; True on a buffer without a limiter."""
    return int(_call(buffer, f"can_{side}", n)[0]) == 1


def counts(buffer: BufferView) -> tuple[int, int]:
    """The counters ``(inserts, samples)`` the limiter has counted (0, 0 without one)."""
    inserts, samples = buffer.client.hmget(buffer.keys.meta, "rl_inserts", "rl_samples")
    return int(inserts or 0), int(samples or 0)


def set_counts(buffer: BufferView, inserts: int, samples: int) -> None:
    """Set the counters (a checkpoint's, restored with the buffer's items)."""
    buffer.client.hset(buffer.keys.meta, mapping={"rl_inserts": int(inserts),
                                                  "rl_samples": int(samples)})


def refusal(buffer: BufferView, limiter: RateLimiter, side: str, n: int) -> str | None:
    """Admit and count ``side`` of ``n`` items if the limiter allows it now (None); else,
    without waiting, what the call would wait for (e.g. ``"inserts: the buffer holds 2
    items, below min_size_to_sample=5"``)."""
    reply = _call(buffer, side, n)
    return None if int(reply[0]) == 1 else _waited_for(limiter, side, reply)


def release(buffer: BufferView, side: str, n: int) -> None:
    """Take back an admitted call whose operation then failed (nothing inserted/drawn)."""
    _call(buffer, "unsert" if side == "insert" else "unsample", n)


__all__ = [
    "MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack", "acquire",
    "acquire_upto", "can", "configure", "counts", "refusal", "release", "set_counts",
]
