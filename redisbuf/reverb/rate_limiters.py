"""Reverb's rate limiters (``reverb.rate_limiters``): how a table holds inserts and
samples back, as redisbuf's :class:`~redisbuf.sampling.limiters.RateLimiter` applies it
for every process sharing the table (Reverb's arithmetic, an item at a time).

A call held back waits as long as Reverb's would (without limit, unless the call has a
timeout: ``flush(timeout_ms=...)``, a dataset's ``rate_limiter_timeout_ms``).
"""

from __future__ import annotations

import logging
import sys

from ..sampling import limiters as engine

_log = logging.getLogger(__name__)


class RateLimiter:
    """Reverb's general limiter.

    Args:
        samples_per_insert: the target ratio of samples to inserts.
        min_size_to_sample: samples wait until the table holds this many items.
        min_diff: a sample waits while it would bring ``inserts * samples_per_insert -
            samples`` below this.
        max_diff: an insert waits while it would bring that difference above this
            (once the table holds ``min_size_to_sample`` items).

    Raises:
        ValueError: ``samples_per_insert <= 0``, ``min_size_to_sample < 1`` or
            ``min_diff > max_diff``.
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 min_diff: float, max_diff: float) -> None:
        self._samples_per_insert = samples_per_insert
        self._min_size_to_sample = min_size_to_sample
        self._min_diff = min_diff
        self._max_diff = max_diff
        #: the redisbuf limiter the table enforces
        self.internal_limiter = engine.RateLimiter(
            float(samples_per_insert), int(min_size_to_sample), float(min_diff),
            float(max_diff), timeout=None)

    def __repr__(self) -> str:
        return (f"RateLimiter(samples_per_insert={self._samples_per_insert}, "
                f"min_diff={self._min_diff}, max_diff={self._max_diff}, "
                f"min_size_to_sample={self._min_size_to_sample})")


class MinSize(RateLimiter):
    """Samples wait until the table holds ``min_size_to_sample`` items; inserts never
    wait.

    Raises:
        ValueError: ``min_size_to_sample < 1``.
    """

    def __init__(self, min_size_to_sample: int) -> None:
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({min_size_to_sample}) must be a positive "
                             "integer")
        super().__init__(1.0, min_size_to_sample, -sys.float_info.max, sys.float_info.max)


class SampleToInsertRatio(RateLimiter):
    """Keep ``samples / inserts`` near ``samples_per_insert`` once the table holds
    ``min_size_to_sample`` items. ``error_buffer`` is the allowed range of ``inserts *
    samples_per_insert - samples``: a pair ``(min_diff, max_diff)``, or a number ``e``
    for ``samples_per_insert * min_size_to_sample -/+ e``.

    Raises:
        ValueError: ``samples_per_insert <= 0``, ``min_size_to_sample < 1``, a range
            narrower than ``2 * max(1, samples_per_insert)`` (a side could be locked
            out), or one whose lower end is above ``samples_per_insert *
            min_size_to_sample`` (a deadlock once that many items are in).
    """

    def __init__(self, samples_per_insert: float, min_size_to_sample: int,
                 error_buffer: float | tuple[float, float]) -> None:
        if isinstance(error_buffer, (int, float)):
            offset = samples_per_insert * min_size_to_sample
            min_diff, max_diff = offset - error_buffer, offset + error_buffer
        else:
            min_diff, max_diff = error_buffer
        if samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0")
        if max_diff - min_diff < 2 * max(1.0, samples_per_insert):
            raise ValueError(
                f"error_buffer {error_buffer!r} leaves max_diff - min_diff = "
                f"{max_diff - min_diff:g}, below 2 * max(1, samples_per_insert) = "
                f"{2 * max(1.0, samples_per_insert):g}: samples or inserts could be "
                "blocked for good")
        if max_diff < samples_per_insert * min_size_to_sample:
            _log.warning(
                "the range of error_buffer is below samples_per_insert * "
                "min_size_to_sample: unless samples run concurrently with inserts, "
                "inserts block for good once min_size_to_sample items are in")
        if min_diff > samples_per_insert * min_size_to_sample:
            raise ValueError(
                f"the range of error_buffer starts at {min_diff:g}, above "
                f"samples_per_insert * min_size_to_sample = "
                f"{samples_per_insert * min_size_to_sample:g}: samples would block for "
                "good once min_size_to_sample items are in")
        if min_size_to_sample < 1:
            raise ValueError(f"min_size_to_sample ({min_size_to_sample}) must be a positive "
                             "integer")
        super().__init__(samples_per_insert, min_size_to_sample, min_diff, max_diff)


class Queue(RateLimiter):
    """The limiter of :meth:`Table.queue <redisbuf.reverb.server.Table.queue>`: with FIFO
    sampler and remover and ``max_times_sampled=1``, a queue of ``size`` items (samples
    wait while it is empty, inserts while it is full)."""

    def __init__(self, size: int) -> None:
        super().__init__(1.0, 1, 0.0, size)


class Stack(RateLimiter):
    """The limiter of :meth:`Table.stack <redisbuf.reverb.server.Table.stack>` (LIFO
    sampler and remover): the numbers of :class:`Queue`."""

    def __init__(self, size: int) -> None:
        super().__init__(1.0, 1, 0.0, size)


__all__ = ["MinSize", "Queue", "RateLimiter", "SampleToInsertRatio", "Stack"]
