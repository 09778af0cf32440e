"""Prefetching readers for learners: batches drawn ahead by background threads.

A learner that calls ``buffer.sample_with_info(256)`` waits for the draw (a round trip,
the server's script, decoding) at every step. :class:`Prefetcher` keeps up to ``prefetch``
batches drawn ahead, by ``draw_threads`` background threads that each have one draw on
the wire at a time, as Reverb's ``TrajectoryDataset`` and TorchRL's
``ReplayBuffer(prefetch=k)`` do, so the learner's step and the next draws overlap, and
so do the draws' round trips with each other::

    with Prefetcher(buffer, 256, prefetch=2) as batches:
        for info in batches:                    # a SampleInfo per step
            td_errors = learn(info.batch, info.weights)
            batches.update_priority(info.ids, abs(td_errors))

**Staleness.** A batch is drawn when a slot is free: at most ``prefetch`` batches are
drawn and not yet handed out (queued or being drawn) at any time. When the learner takes
batch ``t``, batches ``t + 1 .. t + prefetch`` may already be drawn, so a priority it
then writes (``update_priority`` of batch ``t``'s ids) cannot affect them; it affects
batch ``t + prefetch + 1`` onwards, whether the learner calls ``buffer.update_priority``
itself or hands it over with :meth:`Prefetcher.update_priority` (the draw of batch
``t + prefetch + 1`` waits until the updates handed over before the ``next()`` that
returned batch ``t + 1`` are applied). That is the relaxation of Reverb's dataset and
TorchRL's prefetch. ``prefetch=0`` starts no thread: each ``next()`` draws then, in the
caller's thread, and every update made before it is seen (strict).

**Threads and connections.** ``draw_threads`` threads draw (2 by default, at most
``prefetch``): a thread draws whenever a slot is free, so with a server 2 ms away one
batch's round trip overlaps another's decoding, and batches are handed out in the order
their draws finish. One more thread, started by the first
:meth:`Prefetcher.update_priority`, applies the updates handed over, one at a time in
the order given, so that their round trips overlap the draws. All use the ``buffer``
object given: a redis-py client is thread-safe (each command borrows a connection of its
pool; one made from a URL keeps one a thread), so draws and updates run on different
connections, and a draw's per-process state
(the random generator, the uniform sampler's record of the ids it saw) is shared under
the buffer's locks, each draw keeping the sampling law. The replicas of PER and softmax
scores are the exception: a draw holds its replica's lock from the draw to the commit's
reply, so with several drawing threads each keeps a replica of its own
(:func:`~redisbuf.sampling.base.own_replicas`) and their draws overlap; the updating
thread then sends its updates without counting them (``count=False``). With one draw
thread, a seeded buffer's batches come in the order of its random stream; with several,
the threads interleave on that stream, so the batches depend on their timing. While a
prefetcher runs, leave drawing from that buffer object to it (another thread's ``sample``
would still be correct, but interleave with its random stream); ``add`` and
``update_priority`` from any thread are fine. A
:class:`~redisbuf.sampling.samplers.PERSampler`'s ``beta`` is read when a batch is drawn: an
annealed ``beta`` applies from the next draw, not to batches in flight.

**Errors.** An exception raised by a draw (``EmptyBufferError`` with ``block=False``, a
lost server, a dropped buffer) is raised by the ``next()`` that would have returned that
batch, after the batches whose draws finished before it (no draw starts after it; one
still on the wire then is dropped); the prefetcher is then closed and further
``next()`` calls raise ``StopIteration``. An error of an update handed over with
:meth:`Prefetcher.update_priority` is raised by the next ``next()``, :meth:`flush` or
:meth:`close`.

:class:`ReplayDataset` wraps a prefetcher as a ``torch.utils.data.IterableDataset`` (torch
is imported only when that class is first used).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from ..errors import (
    EmptyBufferError,
    InvalidBatchError,
    RateLimitTimeoutError,
    WaitTimeoutError,
)
from ..store import _torch
from .base import own_replicas

#: Longest single blocking wait of the background thread: close() interrupts a blocking
#: draw within about this long (a wait on the server cannot be cancelled from outside).
WAIT_SLICE = 0.25
#: Longest pause between two tries of a buffer that cannot block (ShardedReplayBuffer).
_POLL_MAX = 0.1


def _accepts(method: Callable[..., Any], name: str) -> bool:
    try:
        return name in inspect.signature(method).parameters
    except (TypeError, ValueError):
        return False


def _checked_update(ids: Any, priorities: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(ids, priorities)`` as arrays after the checks ``update_priority`` makes, so a bad
    update handed to the thread is refused in the caller, not at some later step."""
    try:
        id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(f"ids must be integers: {exc}") from None
    try:
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(f"priorities must be numbers: {exc}") from None
    if len(values) != len(id_array):
        raise InvalidBatchError(f"{len(values)} priorities for {len(id_array)} items")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad):
        raise InvalidBatchError(
            f"priority {bad[0]} is {values[bad[0]]!r}; priorities must be finite and >= 0"
        )
    return id_array.copy(), values.copy()


def _check_count(name: str, value: Any, least: int, what: str) -> None:
    """Raise ValueError unless ``value`` is an integer (not a bool) of at least ``least``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be {what}, got {value!r}")


class _Failed:
    """A draw's exception, queued in the place of the batch it would have been."""

    __slots__ = ("error",)

    def __init__(self, error: BaseException) -> None:
        self.error = error


class _Reader:
    """The state of a :class:`Prefetcher`, shared with its thread (the thread holds this,
    not the Prefetcher, so that dropping the last reference to a Prefetcher stops it)."""

    def __init__(
        self,
        buffer: Any,
        batch_size: int,
        prefetch: int,
        draw_threads: int,
        with_info: bool,
        replacement: bool | None,
        block: bool,
        timeout: float | None,
        max_batches: int | None,
        sample_kwargs: dict[str, Any],
    ) -> None:
        self.buffer = buffer
        self.batch_size = batch_size
        self.prefetch = prefetch
        self.block = block
        self.timeout = timeout
        self.max_batches = max_batches
        self._draw_method = buffer.sample_with_info if with_info else buffer.sample
        self._kwargs = dict(sample_kwargs)
        if replacement is not None:
            self._kwargs["replacement"] = replacement
        self._native_block = block and _accepts(self._draw_method, "block")
        # several drawing threads keep a replica each (PER, softmax: see own_replicas),
        # so that their draws overlap; updates need none (count=False: not counted)
        self._own_replicas = draw_threads > 1
        update = getattr(buffer, "update_priority", None)
        self._update_kwargs = {"count": False} if update is not None and _accepts(
            update, "count") else {}
        # set by a blocking draw that succeeded: later draws skip the wait's length check
        self._enough = False
        self._cond = threading.Condition()
        self._ready: deque[Any] = deque()  # drawn batches (or _Failed), oldest first
        self._in_flight = 0  # drawn or being drawn, not yet handed out
        self._drawn = 0  # draws started (counts toward max_batches)
        self._handed = 0
        self._updates: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._updates_handed = 0  # updates handed over so far
        self._updates_done = 0  # of those, applied (or failed) by the updater thread
        self._barrier = 0  # updates handed before the last next(): applied before a draw
        self._update_error: BaseException | None = None
        self._closed = False
        self._failed = False  # a draw failed: no draw starts after it
        self._threads: list[threading.Thread] = []
        self._updater: threading.Thread | None = None  # started by the first handed update
        name = getattr(buffer, "name", "")
        if prefetch > 0:
            self._threads = [
                threading.Thread(target=self._run, name=f"redisbuf-prefetch-{name}-{k}",
                                 daemon=True)
                for k in range(draw_threads)
            ]
            for thread in self._threads:
                thread.start()

    def stop(self) -> None:
        """Ask the threads to stop, without waiting for them."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- the background threads ---------------------------------------------------------

    def _run(self) -> None:
        """A drawing thread: a draw whenever a slot is free and the updates handed over
        before the last next() are applied; with its own replicas when there are several."""
        with own_replicas(self._own_replicas):
            self._draw_loop()

    def _draw_loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopping() and not self._may_draw():
                    self._cond.wait()
                if self._stopping():
                    return
                self._in_flight += 1
                self._drawn += 1
            result = self._draw_blocking()
            with self._cond:
                if self._failed:
                    self._in_flight -= 1  # drawn after a failure: never handed out
                else:
                    self._ready.append(result)
                    self._failed = isinstance(result, _Failed)
                self._cond.notify_all()

    def _stopping(self) -> bool:
        return self._closed or self._failed

    def _run_updates(self) -> None:
        """The updating thread: the updates handed over, one at a time, in order. Apart
        from the drawing thread so that an update's round trip overlaps the draws."""
        while True:
            with self._cond:
                while not self._updates and not self._closed:
                    self._cond.wait()
                if not self._updates:
                    return  # closed, and every update applied
                ids, priorities = self._updates[0]
            error = self._apply([(ids, priorities)])
            with self._cond:
                self._updates.popleft()
                self._updates_done += 1
                if error is not None and self._update_error is None:
                    self._update_error = error
                self._cond.notify_all()

    def _may_draw(self) -> bool:
        if self.max_batches is not None and self._drawn >= self.max_batches:
            return False
        return self._in_flight < self.prefetch and self._updates_done >= self._barrier

    def _apply(self, updates: list[tuple[np.ndarray, np.ndarray]]) -> BaseException | None:
        for ids, priorities in updates:
            try:
                self.buffer.update_priority(ids, priorities, **self._update_kwargs)
            except Exception as exc:  # surfaced in the consumer
                return exc
        return None

    def _draw_blocking(self) -> Any:
        try:
            return self._draw(stop=self._stopping)
        except BaseException as exc:  # every error goes to the consumer
            return _Failed(exc)

    def _draw_past_limiter(self, stop: Callable[[], bool]) -> Any:
        """One batch without ``block``: only a rate limiter makes it wait, for the
        limiter's own timeout in all, in slices so that ``stop()`` (close) ends the wait."""
        limiter = getattr(self.buffer, "rate_limiter", None)
        if limiter is None or "timeout" in self._kwargs:
            return self._draw_method(self.batch_size, **self._kwargs)
        deadline = None if limiter.timeout is None else time.monotonic() + limiter.timeout
        while True:
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            try:
                return self._draw_method(self.batch_size,
                                         timeout=max(min(WAIT_SLICE, remaining), 0.0),
                                         **self._kwargs)
            except RateLimitTimeoutError:
                if stop() or (deadline is not None and time.monotonic() >= deadline):
                    raise

    def _draw(self, stop: Callable[[], bool]) -> Any:
        """One batch; with ``block``, waits in slices so that ``stop()`` (close) ends the
        wait, raising WaitTimeoutError after ``timeout`` seconds in all."""
        if not self.block:
            return self._draw_past_limiter(stop)
        if self._enough and getattr(self.buffer, "rate_limiter", None) is None:
            # the buffer held enough items before: draw at once (one round trip, where
            # the blocking draw first reads the length); wait again once it holds none
            try:
                return self._draw_method(self.batch_size, **{
                    k: v for k, v in self._kwargs.items() if k != "min_size"})
            except EmptyBufferError:
                self._enough = False
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        pause = 0.005
        while True:
            remaining = math.inf if deadline is None else deadline - time.monotonic()
            try:
                if self._native_block:
                    drawn = self._draw_method(
                        self.batch_size,
                        block=True,
                        timeout=max(min(WAIT_SLICE, remaining), 0.0),
                        **self._kwargs,
                    )
                    self._enough = True
                    return drawn
                return self._draw_method(self.batch_size, **self._kwargs)
            except (WaitTimeoutError, EmptyBufferError) as exc:
                if not self._native_block and not isinstance(exc, EmptyBufferError):
                    raise
                remaining = math.inf if deadline is None else deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = type(exc) if isinstance(exc, WaitTimeoutError) else WaitTimeoutError
                    raise timed_out(
                        f"prefetching {self.batch_size} items from "
                        f"{getattr(self.buffer, 'name', self.buffer)!r}: no batch within "
                        f"timeout={self.timeout} s ({exc})"
                    ) from exc
                if stop():
                    raise _Stopped() from None
                if not self._native_block:
                    time.sleep(min(pause, remaining))
                    pause = min(pause * 2, _POLL_MAX)

    # -- the consumer -------------------------------------------------------------------

    def next(self) -> Any:
        if not self._threads:
            return self._next_on_demand()
        with self._cond:
            while True:
                if self._update_error is not None:
                    error, self._update_error = self._update_error, None
                    raise error
                if self._ready:
                    break
                if self._closed or (
                    self.max_batches is not None and self._handed >= self.max_batches
                ):
                    raise StopIteration
                self._cond.wait()
            result = self._ready.popleft()
            self._in_flight -= 1
            self._handed += 1
            # the draw this frees a slot for waits for the updates handed over until now
            self._barrier = self._updates_handed
            self._cond.notify_all()
        if isinstance(result, _Failed):
            self.close()
            if isinstance(result.error, _Stopped):
                raise StopIteration
            raise result.error
        return result

    def _next_on_demand(self) -> Any:
        if self._closed or (self.max_batches is not None and self._handed >= self.max_batches):
            raise StopIteration
        try:
            result = self._draw(stop=lambda: self._closed)
        except _Stopped:
            raise StopIteration from None
        except BaseException:
            self._closed = True
            raise
        self._handed += 1
        return result

    def update_priority(self, ids: Any, priorities: Any) -> None:
        ids, priorities = _checked_update(ids, priorities)
        if not self._threads:
            self.buffer.update_priority(ids, priorities)
            return
        with self._cond:
            if self._closed:
                raise RuntimeError("update_priority on a closed Prefetcher")
            self._updates.append((ids, priorities))
            self._updates_handed += 1
            if self._updater is None:
                self._updater = threading.Thread(
                    target=self._run_updates,
                    name=f"redisbuf-prefetch-updates-{getattr(self.buffer, 'name', '')}",
                    daemon=True,
                )
                self._updater.start()
            self._cond.notify_all()

    def flush(self) -> None:
        with self._cond:
            while self._updates:
                self._cond.wait()
            if self._update_error is not None:
                error, self._update_error = self._update_error, None
                raise error

    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for thread in [*self._threads, self._updater]:  # the updater applies what is left
            if thread is not None and thread is not threading.current_thread():
                thread.join()
        with self._cond:
            self._ready.clear()
            self._in_flight = 0
            error, self._update_error = self._update_error, None
        if error is not None:
            raise error


class Prefetcher:
    """Iterate over batches of ``buffer`` drawn ahead by background threads.

    Args:
        buffer: a :class:`~redisbuf.ReplayBuffer`, :class:`~redisbuf.ShardedReplayBuffer`
            or any object with ``sample_with_info(n, ...)`` / ``sample(n, ...)``.
        batch_size: items per batch (``n``).
        prefetch: batches drawn ahead (drawn and not yet handed out, at most); 0 draws
            on demand in ``next()``, with no thread.
        draw_threads: threads drawing at once, each with one draw on the wire (the
            smaller of this and ``prefetch`` are started). Two hide a round trip of a
            few milliseconds behind the other draw's decoding; more help when the round
            trip is longer than a draw's own work. Batches are handed out in the order
            their draws finish. With more than one, each thread keeps its own replica of
            a prioritized buffer's scores (:func:`~redisbuf.sampling.base.own_replicas`:
            the memory of one replica a thread), so that their draws overlap instead of
            taking turns at one replica's lock; the updates handed over then go without
            counting (``update_priority(..., count=False)``).
        with_info: yield :class:`~redisbuf.SampleInfo` (``sample_with_info``: batch, ids,
            probabilities, PER weights); False yields plain batches (``sample``).
        replacement: passed to the draw (None: the buffer's rule).
        block: wait for the buffer to hold enough items (``sample(..., block=True)``)
            instead of raising :class:`~redisbuf.errors.EmptyBufferError`. Once a blocking
            draw has succeeded, later batches of a buffer without a rate limiter are drawn
            without the wait's length check (one round trip a batch instead of two), so a
            buffer that shrinks below ``batch_size`` (or ``min_size``) meanwhile is drawn
            as ``sample`` draws it; a draw that finds nothing to draw waits again. A
            buffer whose draw cannot block (``ShardedReplayBuffer``) is retried after an
            ``EmptyBufferError`` with pauses of up to 0.1 s.
        timeout: with ``block``, seconds one batch may wait (None: forever) before its
            ``next()`` raises :class:`~redisbuf.errors.WaitTimeoutError`.
        max_batches: stop after handing out this many batches (None: never).
        sample_kwargs: further arguments of the draw (``min_size``, ``sample_range``).

    Iterating yields batches until :meth:`close` (or ``max_batches``); use it as a
    context manager so the thread is stopped and joined. See the module docstring for
    the staleness of prefetched batches and how errors surface.

    Raises:
        ValueError: ``batch_size``, ``prefetch``, ``draw_threads``, ``timeout`` or
            ``max_batches`` out of range.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import Prefetcher, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> _ = buffer.add({"obs": np.arange(8.0), "log_rewards": np.zeros(8)})
        >>> with Prefetcher(buffer, batch_size=4, max_batches=3) as reader:
        ...     for info in reader:
        ...         print(info.batch["obs"].shape, len(set(info.ids.tolist())))
        (4,) 4
        (4,) 4
        (4,) 4
    """

    def __init__(
        self,
        buffer: Any,
        batch_size: int,
        *,
        prefetch: int = 2,
        draw_threads: int = 2,
        with_info: bool = True,
        replacement: bool | None = None,
        block: bool = True,
        timeout: float | None = None,
        max_batches: int | None = None,
        **sample_kwargs: Any,
    ) -> None:
        _check_count("batch_size", batch_size, 1, "a positive integer")
        _check_count("prefetch", prefetch, 0, "an integer >= 0")
        _check_count("draw_threads", draw_threads, 1, "an integer >= 1")
        if timeout is not None and not timeout >= 0:
            raise ValueError(f"timeout must be >= 0 or None, got {timeout!r}")
        if max_batches is not None and (
            isinstance(max_batches, bool) or not isinstance(max_batches, int) or max_batches < 0
        ):
            raise ValueError(f"max_batches must be an integer >= 0 or None, got {max_batches!r}")
        self.buffer = buffer
        self.batch_size = int(batch_size)
        self.prefetch = int(prefetch)
        self.draw_threads = min(int(draw_threads), self.prefetch)
        self.with_info = bool(with_info)
        self._reader = _Reader(
            buffer,
            self.batch_size,
            self.prefetch,
            self.draw_threads,
            self.with_info,
            replacement,
            bool(block),
            timeout,
            max_batches,
            sample_kwargs,
        )

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        return self._reader.next()

    def update_priority(self, ids: Any, priorities: Any) -> None:
        """Hand ``buffer.update_priority(ids, priorities)`` to a background thread and
        return at once. Updates are applied one at a time in the order given; one handed
        over before a ``next()`` is applied before the draw that ``next()`` frees a slot
        for (see the module docstring); the checks of ``update_priority`` (equal
        lengths, finite priorities >= 0) are made here and raise
        :class:`~redisbuf.errors.InvalidBatchError` at once; an error of the update itself
        (a lost server) is raised by the next ``next()``, :meth:`flush` or
        :meth:`close`. With ``prefetch=0`` the update is made here, before returning.

        Args:
            ids: as ``buffer.update_priority``.
            priorities: as ``buffer.update_priority``.

        Raises:
            InvalidBatchError: unequal lengths, or a priority not finite and >= 0.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import PERSampler, Prefetcher, ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PERSampler())
            >>> _ = buffer.add({"obs": np.arange(8.0), "log_rewards": np.zeros(8)})
            >>> with Prefetcher(buffer, batch_size=4, max_batches=2) as reader:
            ...     for info in reader:
            ...         reader.update_priority(info.ids, np.full(4, 2.0))
            ...     reader.flush()
            >>> buffer.stats()["priority_max"]
            2.0
        """
        self._reader.update_priority(ids, priorities)

    def flush(self) -> None:
        """Wait until every update handed over is applied; raise the first that failed.

        Raises:
            Exception: the error of the first update that failed (a lost server, say).
        """
        self._reader.flush()

    def in_flight(self) -> int:
        """Batches drawn (or being drawn) and not yet handed out; never above
        ``prefetch``.

        Returns:
            The number of batches.
        """
        return self._reader.in_flight()

    @property
    def closed(self) -> bool:
        return self._reader._closed

    def close(self) -> None:
        """Stop drawing, apply the updates handed over, join the threads; batches in flight
        are dropped. Raises the error of an update that failed and was not raised yet.
        Idempotent; iteration then ends (``StopIteration``).

        Raises:
            Exception: the error of an update that failed and was not raised yet.
        """
        self._reader.close()

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, exc_type: object, *exc_info: object) -> None:
        try:
            self.close()
        except Exception:
            if exc_type is None:  # do not hide the exception already leaving the block
                raise

    def __del__(self) -> None:
        # an abandoned prefetcher stops its thread (which holds the _Reader, not this)
        reader = getattr(self, "_reader", None)
        if reader is not None:
            reader.stop()

    def __repr__(self) -> str:
        return (
            f"Prefetcher({self.buffer!r}, batch_size={self.batch_size}, "
            f"prefetch={self.prefetch}, draw_threads={self.draw_threads}, "
            f"closed={self.closed})"
        )


class _Stopped(Exception):
    """A blocking draw given up because the prefetcher was closed."""


# -- torch ----------------------------------------------------------------------------------


def to_torch(value: Any) -> Any:
    """``value`` with every numpy array turned into a torch tensor (sharing memory where
    the array is writable, copied where it is not), through dicts, lists, tuples and
    dataclasses (``SampleInfo``, ``Transitions``...); everything else as is."""
    torch = _torch.require()
    if isinstance(value, np.ndarray):
        if value.dtype == object:
            return value
        if not value.flags.writeable:
            value = value.copy()
        return torch.from_numpy(value)
    if isinstance(value, dict):
        return {key: to_torch(item) for key, item in value.items()}
    if isinstance(value, list):
        return [to_torch(item) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(to_torch(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        changes = {
            f.name: to_torch(getattr(value, f.name)) for f in dataclasses.fields(value) if f.init
        }
        return dataclasses.replace(value, **changes)
    return value


def _open_buffer(url: str, name: str, kwargs: dict[str, Any]) -> Any:
    """The buffer ``name`` at ``url``, sharded or not, with its stored configuration."""
    # the reader is a client of the buffers' public API, as a user's code is: it opens a
    # buffer through the package's public names, not the buffer modules
    import redisbuf

    from ..errors import ShardedBufferError

    try:
        return redisbuf.ReplayBuffer.open(url, name, **kwargs)
    except ShardedBufferError:
        return redisbuf.ShardedReplayBuffer.open(url, name, **kwargs)


_DATASET_CLASS: type | None = None


def _dataset_class() -> type:
    """ReplayDataset, made on first use: it subclasses torch's IterableDataset, and
    ``import redisbuf`` must not import torch."""
    global _DATASET_CLASS
    if _DATASET_CLASS is not None:
        return _DATASET_CLASS
    torch = _torch.require()
    base: Any = torch.utils.data.IterableDataset  # torch is imported here, not above

    class ReplayDataset(base):
        """A ``torch.utils.data.IterableDataset`` of prefetched batches, as Reverb's
        ``ReplayDataset``: each ``__iter__`` runs a :class:`Prefetcher` and yields its
        batches with every numpy array made a torch tensor (:func:`to_torch`). Use it
        with ``DataLoader(dataset, batch_size=None)``: the batches are batched already.

        Args:
            source: a buffer object, or the URL of the server holding buffer ``name``.
            batch_size: items per batch.
            name: the buffer's name, with a URL ``source``.
            buffer_kwargs: arguments of ``ReplayBuffer.open`` with a URL ``source`` (the
                sampler is this process's, not stored: pass ``{"sampler": PERSampler()}``
                for PER; ``seed`` is offset by the worker id, so workers draw apart).
            num_batches: batches in all (split among DataLoader workers); None: endless.
            prefetch, with_info and the rest: those of :class:`Prefetcher`.

        With ``num_workers=0`` it iterates in the caller's process (a buffer object or a
        URL). With ``num_workers > 0`` every worker process opens the buffer itself from
        ``source`` and ``name`` (a connection of its own) and prefetches on its own, so
        the loader's batches are the workers' interleaved; a buffer object cannot cross
        into a worker (its connections are this process's), so that takes a URL.
        DataLoader moves each batch from the worker to the main process with torch's
        own transport (the tensors through shared memory).
        """

        def __init__(
            self,
            source: Any,
            batch_size: int,
            *,
            name: str | None = None,
            buffer_kwargs: dict[str, Any] | None = None,
            num_batches: int | None = None,
            **prefetcher_kwargs: Any,
        ) -> None:
            super().__init__()
            if isinstance(source, str):
                if name is None:
                    raise ValueError("ReplayDataset with a URL needs the buffer's name=")
            elif name is not None or buffer_kwargs:
                raise ValueError(
                    "name= and buffer_kwargs= go with a URL source, not a buffer object"
                )
            if num_batches is not None and (
                isinstance(num_batches, bool) or not isinstance(num_batches, int) or num_batches < 0
            ):
                raise ValueError(
                    f"num_batches must be an integer >= 0 or None, got {num_batches!r}"
                )
            if "max_batches" in prefetcher_kwargs:
                raise ValueError("ReplayDataset takes num_batches=, not max_batches=")
            self.source = source
            self.batch_size = batch_size
            self.name = name
            self.buffer_kwargs = dict(buffer_kwargs or {})
            self.num_batches = num_batches
            self.prefetcher_kwargs = prefetcher_kwargs

        def __iter__(self) -> Iterator[Any]:
            worker = torch.utils.data.get_worker_info()
            worker_id, workers = (0, 1) if worker is None else (worker.id, worker.num_workers)
            count = self.num_batches
            if count is not None:  # the first count % workers workers take one more
                count = count // workers + (1 if worker_id < count % workers else 0)
            owned = None
            if isinstance(self.source, str):
                kwargs = dict(self.buffer_kwargs)
                if kwargs.get("seed") is not None:
                    kwargs["seed"] = int(kwargs["seed"]) + worker_id
                owned = _open_buffer(self.source, self.name, kwargs)  # type: ignore[arg-type]
                buffer = owned
            elif worker is not None:
                raise RuntimeError(
                    "ReplayDataset was given a buffer object, which cannot be used in a "
                    "DataLoader worker process (num_workers > 0): give it the server's "
                    "URL and name= so each worker opens its own connection"
                )
            else:
                buffer = self.source
            return self._batches(buffer, owned, count)

        def _batches(self, buffer: Any, owned: Any, count: int | None) -> Iterator[Any]:
            try:
                with Prefetcher(
                    buffer, self.batch_size, max_batches=count, **self.prefetcher_kwargs
                ) as batches:
                    for batch in batches:
                        yield to_torch(batch)
            finally:
                if owned is not None:
                    owned.close()

    # pickled by reference (a spawned DataLoader worker), found by the module __getattr__
    ReplayDataset.__module__ = __name__
    ReplayDataset.__qualname__ = "ReplayDataset"
    _DATASET_CLASS = ReplayDataset
    return ReplayDataset


def __getattr__(name: str) -> Any:
    if name == "ReplayDataset":
        return _dataset_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ReplayDataset is left out: a star import would import torch to make it
__all__ = ["Prefetcher", "to_torch"]
