"""Reverb's datasets without TensorFlow: ``TrajectoryDataset``, ``TimestepDataset`` and
``ReplayDataset`` as prefetching iterators of numpy (or torch) ``ReplaySample``\\ s.

Each has Reverb's constructor and ``from_table_signature``, and the few ``tf.data``
methods Acme-style code chains on them: ``batch(n, drop_remainder)``, ``prefetch(n)``,
``map(fn)``, ``take(n)``, ``as_numpy_iterator()``, and ``as_torch_iterator()`` (torch
tensors, the ``torch`` extra). A ``TrajectoryDataset`` yields one sample per item, its
data the item's trajectory in the structure of ``dtypes``; a ``TimestepDataset`` one per
step of each item. Batches stack every leaf (and the info fields, as arrays) along a new
first dimension. Unbatched, a dataset draws ``max_in_flight_samples_per_worker`` items
a call in the thread that iterates it; ``prefetch(n)`` moves the draws to a background
thread, at most ``n`` elements ahead. A batched ``TrajectoryDataset`` draws whole
batches in ``num_workers_per_iterator`` sampler processes (or threads). A draw the
table's rate limiter holds back longer than ``rate_limiter_timeout_ms`` (``-1``: no
limit) ends the iteration, as Reverb's datasets end; so does ``max_samples`` samples.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers import batch_processes, step_reads
from ..buffers.step_reads import SampledBatch, SampledItem
from ..errors import RateLimitTimeoutError
from ..sampling.base import own_replicas
from . import nest
from .client import Client
from .replay_sample import ReplaySample, SampleInfo
from .tensor_spec import TensorShape, numpy_dtype, shape_of, shapes_compatible

_DONE = object()  # one worker of a parallel iteration is done
_INFO_DTYPES = SampleInfo.tf_dtypes()


def _check(leaf_dtype: Any, leaf_shape: Any, value: np.ndarray, path: Any) -> np.ndarray:
    want = numpy_dtype(leaf_dtype)
    if value.dtype != want:
        raise ValueError(f"the sampled data at {path} is {value.dtype}, the dataset expects "
                         f"{want}")
    shape = shape_of(leaf_shape)
    if not shapes_compatible(shape, tuple(value.shape)):
        raise ValueError(f"the sampled data at {path} has shape {tuple(value.shape)}, the "
                         f"dataset expects {shape}")
    return value


class _Dataset:
    """What the datasets share: the iteration chain (batch, prefetch, map, take)."""

    def __init__(self, parent: _Dataset | None = None) -> None:
        self._parent = parent

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        raise NotImplementedError

    def __iter__(self) -> Iterator[Any]:
        return self._elements(None)

    def as_numpy_iterator(self) -> Iterator[Any]:
        """An iterator of the elements (numpy)."""
        return iter(self)

    def as_torch_iterator(self, device: Any = None) -> Iterator[Any]:
        """An iterator of the elements with torch tensors at the leaves (on ``device``)."""
        from .._extras import require

        torch = require("torch", "torch", "redisbuf.reverb datasets as torch tensors")

        def convert(value: Any) -> Any:
            tensor = torch.from_numpy(np.ascontiguousarray(value))
            return tensor if device is None else tensor.to(device)

        for element in self:
            yield nest.map_structure(convert, element)

    def batch(self, batch_size: int, drop_remainder: bool = False) -> _Dataset:
        """Elements stacked ``batch_size`` at a time (the last smaller unless
        ``drop_remainder``)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        return _Batched(self, batch_size, drop_remainder)

    def prefetch(self, buffer_size: int) -> _Dataset:
        """The same elements, at most ``buffer_size`` drawn ahead (-1: Reverb's AUTOTUNE,
        2)."""
        return _Prefetched(self, 2 if buffer_size is None or buffer_size < 1 else buffer_size)

    def map(self, fn: Callable[[Any], Any]) -> _Dataset:
        """``fn`` of each element."""
        return _Mapped(self, fn)

    def take(self, count: int) -> _Dataset:
        """The first ``count`` elements (``-1``: all)."""
        return _Taken(self, count)


class _Batched(_Dataset):
    def __init__(self, parent: _Dataset, size: int, drop_remainder: bool) -> None:
        super().__init__(parent)
        self._size, self._drop = size, drop_remainder

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        batch: list[Any] = []
        for element in self._parent._elements(self._size):  # type: ignore[union-attr]
            batch.append(element)
            if len(batch) == self._size:
                yield _stack(batch)
                batch = []
        if batch and not self._drop:
            yield _stack(batch)


def _stack(elements: list[Any]) -> Any:
    def stack(*leaves: Any) -> np.ndarray:
        return np.stack([np.asarray(leaf) for leaf in leaves])

    first = elements[0]
    if isinstance(first, ReplaySample):
        info = SampleInfo(*(np.asarray([getattr(e.info, f) for e in elements], dtype=d)
                            for f, d in zip(SampleInfo._fields, _INFO_DTYPES, strict=True)))
        data = nest.map_structure(stack, *[e.data for e in elements])
        return ReplaySample(info, data)
    return nest.map_structure(stack, *elements)


class _Prefetched(_Dataset):
    def __init__(self, parent: _Dataset, depth: int) -> None:
        super().__init__(parent)
        self._depth = depth

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        parent = self._parent
        assert parent is not None
        yield from _parallel(lambda _stop: parent._elements(chunk), 1, self._depth,
                             name="redisbuf-reverb-prefetch")


class _Mapped(_Dataset):
    def __init__(self, parent: _Dataset, fn: Callable[[Any], Any]) -> None:
        super().__init__(parent)
        self._fn = fn

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        for element in self._parent._elements(chunk):  # type: ignore[union-attr]
            yield self._fn(element)


class _Taken(_Dataset):
    def __init__(self, parent: _Dataset, count: int) -> None:
        super().__init__(parent)
        self._count = count

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        if self._count == 0:
            return
        for done, element in enumerate(self._parent._elements(chunk), start=1):  # type: ignore[union-attr]
            yield element
            if done == self._count:
                return


def _split(parts: list[SampledBatch], size: int, keep_last: bool) -> Iterator[SampledBatch]:
    """Batches of ``size`` items of ``parts`` (the last smaller when ``keep_last``)."""
    if not parts:
        return
    joined = {name: np.concatenate([getattr(p, name) for p in parts])
              for name in step_reads.INFO_FIELDS}
    ragged = any(p.columns is None for p in parts)
    items = [item for p in parts for item in _items_of(p)] if ragged else None
    columns = None if ragged else [
        np.concatenate(leaves) if len(leaves) > 1 else leaves[0]
        for leaves in zip(*(p.columns or () for p in parts), strict=True)]
    total = len(joined["keys"])
    for start in range(0, total, size):
        stop = min(start + size, total)
        if stop - start < size and not keep_last:
            return
        yield SampledBatch(
            joined["keys"][start:stop], joined["probabilities"][start:stop],
            joined["table_sizes"][start:stop], joined["priorities"][start:stop],
            joined["times_sampled"][start:stop],
            None if columns is None else [c[start:stop] for c in columns],
            None if items is None else items[start:stop])


def _items_of(part: SampledBatch) -> list[SampledItem]:
    """The items of ``part`` one by one (a stacked batch's with episode -1: it keeps
    none), to be stacked with those of a batch whose columns differ in shape."""
    if part.columns is None:
        return part.items or []
    return [SampledItem(int(part.keys[j]), float(part.probabilities[j]),
                        int(part.table_sizes[j]), float(part.priorities[j]),
                        int(part.times_sampled[j]), [c[j] for c in part.columns], -1)
            for j in range(len(part))]


def _shapes_like(dtypes: Any, shapes: Any) -> Any:
    """``shapes`` in the structure of ``dtypes``, a shape where ``dtypes`` has a leaf
    (a tuple or list of dimensions there is a shape, not a nest: no TensorFlow needed).

    Raises:
        ValueError: the two do not nest alike above the leaves of ``dtypes``.
    """
    flat: list[Any] = []

    def walk(d: Any, s: Any, path: tuple[Any, ...]) -> None:
        if not nest.is_nested(d):
            flat.append(TensorShape(shape_of(s)))
            return
        if not nest.is_nested(s) or isinstance(d, dict) != isinstance(s, dict):
            raise ValueError(f"dtypes and shapes differ at {path}: {d!r} and {s!r}")
        keys = sorted(d) if isinstance(d, dict) else list(range(len(d)))
        other = sorted(s) if isinstance(s, dict) else list(range(len(s)))
        if keys != other:
            raise ValueError(f"dtypes and shapes differ at {path}: {d!r} and {s!r}")
        for key in keys:
            walk(d[key], s[key], (*path, key))

    walk(dtypes, shapes, ())
    return nest.unflatten_as(dtypes, flat)


@dataclass
class _Source:
    """A trajectory dataset's table and settings."""

    client: Client
    table: str
    dtypes: Any
    shapes: Any
    per_worker: int
    workers: int
    timeout: float | None
    max_samples: int
    processes: bool
    cache_bytes: int | None = None

    def store(self) -> Any:
        """The client's step store, keeping ``cache_bytes`` of decoded chunks if set."""
        return _bounded(self.client.store(), self.cache_bytes)


def _bounded(store: Any, cache_bytes: int | None) -> Any:
    if cache_bytes is not None:
        store.cache_bytes = cache_bytes
    return store


class _Budget:
    """The samples left to give (``max_samples``; -1: no end), shared by workers."""

    def __init__(self, total: int) -> None:
        self._left, self._lock = total, threading.Lock()

    def take(self, want: int) -> int:
        with self._lock:
            if self._left < 0:
                return want
            got = min(want, self._left)
            self._left -= got
            return got


def _parallel(make: Callable[[threading.Event], Iterator[Any]], workers: int,
              depth: int = 2, name: str = "redisbuf-reverb-dataset",
              on_end: Callable[[], None] | None = None) -> Generator[Any, None, None]:
    """The elements of ``workers`` threads (named ``name``) each iterating ``make(stop)``,
    as they come, at most ``depth`` per thread queued; the iteration ends when every one
    has ended (then ``on_end()``, in the consumer's thread, as when the consumer stops).
    Several threads keep a replica each of a prioritized table's priorities
    (:func:`~redisbuf.sampling.base.own_replicas`), so that their draws overlap instead
    of taking turns at one replica."""
    out: queue.Queue[Any] = queue.Queue(maxsize=depth * workers)
    stop = threading.Event()

    def produce() -> None:
        for element in make(stop):
            while not stop.is_set():
                try:
                    out.put(element, timeout=0.25)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        out.put(_DONE)

    def run() -> None:
        try:
            with own_replicas(workers > 1):
                produce()
        except BaseException as exc:  # noqa: BLE001 - raised on the consumer's side
            out.put(exc)

    threads = [threading.Thread(target=run, daemon=True, name=name)
               for _ in range(workers)]
    for thread in threads:
        thread.start()
    done = 0
    try:
        while done < workers:
            element = out.get()
            if element is _DONE:
                done += 1
                continue
            if isinstance(element, BaseException):
                raise element
            yield element
    finally:
        stop.set()
        if on_end is not None:
            on_end()


def _signature_of(server_address: str, table: str,
                  timeout_secs: int | None) -> tuple[Any, Any]:
    """(dtypes, shapes) of ``table``'s signature, as nests, asked of the server.

    Raises:
        ValueError: the server has no such table, or it has no signature.
    """
    info = Client(server_address).server_info(timeout_secs)
    if table not in info:
        raise ValueError(f"Server at {server_address} does not contain any table named "
                         f"{table}. Found: {', '.join(sorted(info))}.")
    signature = info[table].signature
    if not signature:
        raise ValueError(f"Table {table} at {server_address} does not have a signature.")
    return (nest.map_structure(lambda spec: spec.dtype, signature),
            nest.map_structure(lambda spec: spec.shape, signature))


class TrajectoryDataset(_Dataset):
    """Samples of ``table``, one per item: ``ReplaySample(info, data)``, ``data`` the
    item's trajectory in the structure of ``dtypes`` (checked against ``dtypes`` and
    ``shapes``, which nest alike).

    Args:
        server_address: the server (``host:port`` or a Redis URL).
        table: the table.
        dtypes: the trajectory's dtypes (a nest; numpy or TensorFlow dtypes).
        shapes: its shapes (the same nest; ``None`` dimensions match any length).
        max_in_flight_samples_per_worker: items drawn per call, unbatched (>= 1).
        num_workers_per_iterator: how many workers draw a batched dataset's batches at
            once (-1: 2; an unbatched dataset draws in the thread that iterates it).
        max_samples_per_stream: accepted (-1 or >= 1).
        rate_limiter_timeout_ms: how long a draw may wait on the rate limiter before the
            iteration ends (-1: no limit).
        max_samples: the iteration ends after this many samples (-1: never).
        sampler_processes: (redisbuf's) a batched dataset's workers are processes
            (:mod:`redisbuf.buffers.batch_processes`), whose draws run on as many cores
            as there are workers; False: threads of this process, which take turns at
            its GIL (but start at once).
        cache_bytes: (redisbuf's) how many bytes of decoded chunks each sampler process
            (or, with threads, this process) keeps for later draws; None: the store's
            default (:data:`~redisbuf.buffers.steps.DEFAULT_CACHE_BYTES`, 256 MiB).

    Raises:
        ValueError: as Reverb's (structures that differ, an argument out of range).
    """

    def __init__(self, server_address: str, table: str, dtypes: Any, shapes: Any,
                 max_in_flight_samples_per_worker: int, num_workers_per_iterator: int = -1,
                 max_samples_per_stream: int = -1, rate_limiter_timeout_ms: int = -1,
                 max_samples: int = -1, *, sampler_processes: bool = True,
                 cache_bytes: int | None = None) -> None:
        super().__init__()
        shapes = _shapes_like(dtypes, shapes)
        if max_in_flight_samples_per_worker < 1:
            raise ValueError(f"max_in_flight_samples_per_worker "
                             f"({max_in_flight_samples_per_worker}) must be a positive integer")
        if num_workers_per_iterator < 1 and num_workers_per_iterator != -1:
            raise ValueError(f"num_workers_per_iterator ({num_workers_per_iterator}) must be "
                             "a positive integer or -1")
        if max_samples_per_stream < 1 and max_samples_per_stream != -1:
            raise ValueError(f"max_samples_per_stream ({max_samples_per_stream}) must be a "
                             "positive integer or -1")
        if rate_limiter_timeout_ms < -1:
            raise ValueError(f"rate_limiter_timeout_ms ({rate_limiter_timeout_ms}) must be an "
                             "integer >= -1")
        if max_samples < 1 and max_samples != -1:
            raise ValueError(f"max_samples ({max_samples}) must be a positive integer or -1")
        if cache_bytes is not None and (isinstance(cache_bytes, bool) or
                                        not isinstance(cache_bytes, int) or cache_bytes < 0):
            raise ValueError(f"cache_bytes ({cache_bytes!r}) must be None or an integer >= 0")
        #: what the dataset draws from and how (read by its batched form too)
        self.source = _Source(
            Client(server_address), table, dtypes, shapes, max_in_flight_samples_per_worker,
            2 if num_workers_per_iterator == -1 else num_workers_per_iterator,
            None if rate_limiter_timeout_ms < 0 else rate_limiter_timeout_ms / 1000,
            max_samples, sampler_processes, cache_bytes)

    @classmethod
    def from_table_signature(cls, server_address: str, table: str,
                             max_in_flight_samples_per_worker: int,
                             num_workers_per_iterator: int = -1,
                             max_samples_per_stream: int = -1,
                             rate_limiter_timeout_ms: int = -1,
                             get_signature_timeout_secs: int | None = None,
                             max_samples: int = -1, *, sampler_processes: bool = True,
                             cache_bytes: int | None = None) -> Any:
        """The dataset of ``table`` with its signature's dtypes and shapes.

        Raises:
            ValueError: the server has no such table, or it has no signature.
            DeadlineExceededError: the server did not answer within
                ``get_signature_timeout_secs``.
        """
        dtypes, shapes = _signature_of(server_address, table, get_signature_timeout_secs)
        return cls(server_address=server_address, table=table,
                   shapes=shapes, dtypes=dtypes,
                   max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
                   num_workers_per_iterator=num_workers_per_iterator,
                   max_samples_per_stream=max_samples_per_stream,
                   rate_limiter_timeout_ms=rate_limiter_timeout_ms, max_samples=max_samples,
                   sampler_processes=sampler_processes, cache_bytes=cache_bytes)

    def batch(self, batch_size: int, drop_remainder: bool = False) -> _Dataset:
        """Samples stacked ``batch_size`` at a time, each batch drawn at once and cut
        out of the chunks column by column (see :func:`redisbuf.buffers.step_reads.
        sample_batch`); ``drop_remainder`` drops a last smaller batch (at
        ``max_samples`` or a rate-limiter timeout)."""
        if type(self) is not TrajectoryDataset:
            return super().batch(batch_size, drop_remainder)
        if batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size}")
        return _BatchedTrajectories(self, batch_size, drop_remainder)

    @property
    def element_spec(self) -> ReplaySample:
        """``ReplaySample(info dtypes, (dtypes, shapes))`` of an element."""
        return ReplaySample(_INFO_DTYPES, (self.source.dtypes, self.source.shapes))

    def _items(self, chunk: int | None) -> Iterator[Any]:
        """The sampled items, drawn ``chunk`` (or max_in_flight) at a time."""
        store = self.source.store()
        buffer = self.source.client.table(self.source.table)
        count = chunk or self.source.per_worker
        given = 0
        most = self.source.max_samples
        while most < 0 or given < most:
            want = count if most < 0 else min(count, most - given)
            try:
                items = store.sample(buffer, want, timeout=self.source.timeout)
            except RateLimitTimeoutError:
                return  # Reverb's datasets end when the rate limiter times out
            for item in items:
                given += 1
                yield item

    def _data(self, item: Any) -> Any:
        flat_dtypes = nest.flatten(self.source.dtypes)
        flat_shapes = nest.flatten(self.source.shapes)
        if len(item.columns) != len(flat_dtypes):
            raise ValueError(f"the sampled item has {len(item.columns)} columns, the dataset "
                             f"expects {len(flat_dtypes)}")
        checked = [_check(d, s, c, i) for i, (d, s, c)
                   in enumerate(zip(flat_dtypes, flat_shapes, item.columns, strict=True))]
        return nest.unflatten_as(self.source.dtypes, checked)

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        for item in self._items(chunk):
            yield ReplaySample(_info(item), self._data(item))


def _open_table(server_address: str, table: str, cache_bytes: int | None = None
                ) -> tuple[Any, Any]:
    """The step store (keeping ``cache_bytes`` of decoded chunks if set) and buffer of
    ``table`` (a sampler process's opener)."""
    client = Client(server_address)
    return _bounded(client.store(), cache_bytes), client.table(table)


class _BatchedTrajectories(_Dataset):
    """A TrajectoryDataset's batches, each drawn whole (fewer items a draw only when the
    rate limiter admits fewer), by ``num_workers_per_iterator`` workers at once (2 for
    -1): sampler processes, whose draws run in parallel, or threads, whose round trips
    to the server overlap."""

    def __init__(self, parent: TrajectoryDataset, size: int, drop_remainder: bool) -> None:
        super().__init__(parent)
        self._source, self._size, self._drop = parent.source, size, drop_remainder

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        source = self._source
        flat_dtypes = nest.flatten(source.dtypes)
        flat_shapes = [shape_of(s) for s in nest.flatten(source.shapes)]
        budget = _Budget(source.max_samples)
        # a draw takes max_in_flight_samples_per_worker items (whole batches of them)
        per_draw = self._size * max(1, source.per_worker // self._size)
        if source.processes:
            draws = batch_processes.draws_in_processes(
                f"{__name__}:_open_table",
                [source.client.server_address, source.table, source.cache_bytes],
                source.workers, lambda: budget.take(per_draw), source.timeout)
        else:
            draws = self._from_threads(budget, per_draw)
        # the draws' items in batches of the dataset's size, as they come: a draw cut
        # short (max_samples, the rate limiter) leaves its rest for the next, and only
        # the iteration's last batch may be smaller
        carry: list[SampledBatch] = []
        try:
            for parts, ended in draws:
                carry.extend(parts)
                whole = list(_split(carry, self._size, keep_last=True))
                carry = [whole.pop()] if whole and len(whole[-1]) < self._size else []
                for batch in whole:
                    yield self._sample(batch, flat_dtypes, flat_shapes)
                if ended:  # Reverb's datasets end when the rate limiter times out
                    break
        finally:
            draws.close()  # no worker draws any more: not even what nobody would receive
        if carry and not self._drop:
            yield self._sample(carry[0], flat_dtypes, flat_shapes)

    def _from_threads(self, budget: _Budget, per_draw: int
                      ) -> Generator[tuple[list[SampledBatch], bool], None, None]:
        """As :func:`~redisbuf.buffers.batch_processes.draws_in_processes`, by threads."""
        source = self._source
        store = source.store()
        buffer = source.client.table(source.table)
        # closed when the iteration ends: then no worker draws any more (not even a
        # queue's next item, which nobody would receive)
        gate = step_reads.DrawGate()

        def draws(stop: threading.Event) -> Iterator[tuple[list[SampledBatch], bool]]:
            while not stop.is_set():
                size = budget.take(per_draw)
                if size == 0:
                    return
                parts: list[SampledBatch] = []
                have = 0
                try:
                    while have < size:
                        part = step_reads.sample_batch(store, buffer, size - have,
                                                       timeout=source.timeout, gate=gate)
                        parts.append(part)
                        have += len(part)
                except step_reads.DrawStopped:
                    return  # the iteration ended: a wait under way draws nothing more
                except RateLimitTimeoutError:
                    yield parts, True
                    return
                yield parts, False

        return _parallel(draws, source.workers, on_end=gate.close)

    def _sample(self, batch: SampledBatch, dtypes: list[Any], shapes: list[Any]
                ) -> ReplaySample:
        info = SampleInfo(batch.keys, batch.probabilities, batch.table_sizes,
                          batch.priorities, batch.times_sampled)
        columns = batch.columns
        if columns is None:  # items whose columns differ in shape: stacked one by one
            items = batch.items or []
            columns = [np.stack([item.columns[i] for item in items])
                       for i in range(len(dtypes))]
        if len(columns) != len(dtypes):
            raise ValueError(f"the sampled items have {len(columns)} columns, the dataset "
                             f"expects {len(dtypes)}")
        checked = [_check(d, None if s is None else (None, *s), c, i)
                   for i, (d, s, c) in enumerate(zip(dtypes, shapes, columns, strict=True))]
        return ReplaySample(info, nest.unflatten_as(self._source.dtypes, checked))


def _info(item: Any) -> SampleInfo:
    return SampleInfo(key=np.uint64(item.key), probability=np.float64(item.probability),
                      table_size=np.int64(item.table_size), priority=np.float64(item.priority),
                      times_sampled=np.int32(item.times_sampled))


class TimestepDataset(TrajectoryDataset):
    """Samples of ``table``, one per step of each item: every column of an item has the
    same number of steps, and ``shapes`` are a step's shapes (Reverb's
    ``TimestepDataset``)."""

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        return _timesteps(self, self._items(chunk))


def _timesteps(dataset: TrajectoryDataset, items: Iterator[Any]) -> Iterator[Any]:
    """One sample per step of each item, checked against the dataset's (step) specs."""
    source = dataset.source
    flat_dtypes, flat_shapes = nest.flatten(source.dtypes), nest.flatten(source.shapes)
    for item in items:
        lengths = {len(column) for column in item.columns}
        if len(lengths) != 1:
            raise ValueError("Can't split non timestep trajectory into timesteps.")
        info = _info(item)
        for step in range(lengths.pop()):
            leaves = [_check(d, s, np.asarray(c[step]), i) for i, (d, s, c)
                      in enumerate(zip(flat_dtypes, flat_shapes, item.columns, strict=True))]
            yield ReplaySample(info, nest.unflatten_as(dataset.source.dtypes, leaves))


class ReplayDataset(TrajectoryDataset):
    """Reverb's ``ReplayDataset`` (removed in Reverb 0.8.0, kept here for code written
    before it): samples of every step of each item (``emit_timesteps``, ``shapes`` a
    step's), or of whole items whose every column has ``sequence_length`` steps of
    ``shapes`` (when given; else any length)."""

    def __init__(self, server_address: str, table: str, dtypes: Any, shapes: Any,
                 max_in_flight_samples_per_worker: int, num_workers_per_iterator: int = -1,
                 max_samples_per_stream: int = -1, sequence_length: int | None = None,
                 emit_timesteps: bool = True, rate_limiter_timeout_ms: int = -1) -> None:
        if not emit_timesteps:
            length = sequence_length
            shapes = nest.map_structure(
                lambda shape: TensorShape((length, *(shape_of(shape) or ()))), shapes)
        super().__init__(server_address, table, dtypes, shapes,
                         max_in_flight_samples_per_worker, num_workers_per_iterator,
                         max_samples_per_stream, rate_limiter_timeout_ms)
        self._emit_timesteps = emit_timesteps

    @classmethod
    def from_table_signature(cls, server_address: str, table: str,  # type: ignore[override]
                             max_in_flight_samples_per_worker: int,
                             num_workers_per_iterator: int = -1,
                             max_samples_per_stream: int = -1,
                             sequence_length: int | None = None, emit_timesteps: bool = True,
                             rate_limiter_timeout_ms: int = -1,
                             get_signature_timeout_secs: int | None = None) -> ReplayDataset:
        """The dataset of ``table`` with its signature's dtypes and shapes (a step's).

        Raises:
            ValueError: the server has no such table, or it has no signature.
        """
        dtypes, shapes = _signature_of(server_address, table, get_signature_timeout_secs)
        return cls(server_address, table,
                   dtypes=dtypes, shapes=shapes,
                   max_in_flight_samples_per_worker=max_in_flight_samples_per_worker,
                   num_workers_per_iterator=num_workers_per_iterator,
                   max_samples_per_stream=max_samples_per_stream,
                   sequence_length=sequence_length, emit_timesteps=emit_timesteps,
                   rate_limiter_timeout_ms=rate_limiter_timeout_ms)

    def _elements(self, chunk: int | None) -> Iterator[Any]:
        if self._emit_timesteps:
            return _timesteps(self, self._items(chunk))
        return TrajectoryDataset._elements(self, chunk)


__all__ = ["ReplayDataset", "TimestepDataset", "TrajectoryDataset"]
