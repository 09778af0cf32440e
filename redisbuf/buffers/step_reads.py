"""Drawing items of a buffer whose items reference a step store's chunks
(redisbuf/buffers/steps.py), with what Reverb's ``SampleInfo`` reports of each.

A draw is the buffer's own (its sampler, rate limiter, ``max_use``); then one pipeline
reads the chunks the items name that this process does not hold decoded already (chunks
and item records never change, so the store keeps the recent ones, see
:class:`~redisbuf.buffers.steps.StepStore`), their PER priorities, their use counts and
the buffer's length (a prioritized draw's commit says the last two itself, and its
priorities: then only chunks are read, and nothing when every one is held), and each
item's flat columns are cut out of its chunks (for a batch,
each column of every item at once). What a sample reports, as Reverb's table reports it
for the samples of one request one after the other: ``times_sampled`` counts this draw
(the ``j``-th of ``c`` draws of one item in a batch reports ``uses - c + j``);
``table_size`` is the length before the draw removed what ``max_use`` removed at or
after it; ``probability`` is the draw's under a PER sampler, ``1 / table_size`` under a
uniform one and 1 under a selector; ``priority`` is the item's PER priority after the
draw, or, for an item the draw itself removed, the one it was inserted with.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EmptyBufferError, RateLimitTimeoutError, SamplingError
from ..sampling import limiters
from ..sampling.samplers import PERSampler, PrioritizedSampler, UniformSampler
from ..sampling.waiting import wait_for
from ..store.keys import format_id
from .step_records import Chunk, ItemRecord, assemble

if TYPE_CHECKING:
    from ..sampling.base import Draw
    from .replay import ReplayBuffer
    from .steps import StepStore

# Draws again of items whose chunks a sweep freed between the draw and the read (they
# left the buffer, then a grace period passed): after this many the sample fails.
_MISSING_ATTEMPTS = 3


@dataclass
class SampledItem:
    """One drawn item: its id, what Reverb's SampleInfo reports, and its flat columns."""

    key: int
    probability: float
    table_size: int
    priority: float
    times_sampled: int
    columns: list[np.ndarray]
    episode: int


#: the SampleInfo fields of a :class:`SampledBatch`, in order, one array each
INFO_FIELDS = ("keys", "probabilities", "table_sizes", "priorities", "times_sampled")


@dataclass
class SampledBatch:
    """Drawn items as arrays: the SampleInfo fields, one entry per item, and each flat
    column of every item stacked (``columns[i][j]`` is item ``j``'s column ``i``), or,
    when the items' columns differ in shape, ``None`` and ``items``."""

    keys: np.ndarray
    probabilities: np.ndarray
    table_sizes: np.ndarray
    priorities: np.ndarray
    times_sampled: np.ndarray
    columns: list[np.ndarray] | None
    items: list[SampledItem] | None = None

    def __len__(self) -> int:
        return len(self.keys)


class DrawStopped(Exception):
    """A draw through a closed :class:`DrawGate`: nothing was drawn."""


class DrawGate:
    """The draws of one reader (a dataset's workers), which it can end: once
    :meth:`close` has returned, no draw through the gate is under way and none starts
    (each attempt of a waiting draw raises :class:`DrawStopped`), so a reader that has
    gone takes nothing more, not even from a queue. Draws through it run at once."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._active = 0
        self.closed = False

    def begin(self) -> bool:
        """Count an attempt that starts (False, counting nothing, once closed)."""
        with self._cond:
            if self.closed:
                return False
            self._active += 1
            return True

    def end(self) -> None:
        with self._cond:
            self._active -= 1
            self._cond.notify_all()

    def close(self) -> None:
        """Refuse new attempts, then wait for those under way (a few round trips)."""
        with self._cond:
            self.closed = True
            while self._active:
                self._cond.wait()


def _draw(table: ReplayBuffer, n: int, timeout: float | None,
          gate: DrawGate | None = None) -> Draw:
    """The buffer's draw of up to ``n`` items once its rate limiter admits (an item at a
    time, as Reverb's table: fewer than ``n`` when it admits fewer) and it holds one,
    waiting up to ``timeout`` seconds (None: no limit); each attempt through ``gate``
    (:class:`DrawStopped` once it is closed)."""
    limiter = table.rate_limiter
    if limiter is not None and getattr(table.sampler, "admits", False):
        limiter = None  # the selection asks the limiter itself, in its script

    def attempt() -> Draw | None:
        if gate is None:
            return attempt_once()
        if not gate.begin():
            raise DrawStopped(f"buffer {table.name!r}: the reader has ended its draws")
        try:
            return attempt_once()
        finally:
            gate.end()

    def attempt_once() -> Draw | None:
        admitted = n
        if limiter is not None:
            try:
                admitted = limiters.acquire_upto(table.view, limiter, "sample", n, timeout=0)
            except RateLimitTimeoutError:
                return None
        try:
            draw = table._draw_admitted(admitted, True, None)
        except EmptyBufferError:
            return None
        if limiter is not None and len(draw.ids) < admitted:  # selections ran out of uses
            limiters.release(table.view, "sample", admitted - len(draw.ids))
        return draw if draw.ids else None

    def describe() -> str:
        if table.rate_limiter is not None and limiter is None:
            return f"buffer {table.name!r}: a sample waited {timeout:g} s for the rate limiter"
        if limiter is not None:
            why = limiters.refusal(table.view, limiter, "sample", 1)
            if why is None:
                limiters.release(table.view, "sample", 1)
                why = "a drawable item"
        else:
            why = "an item"
        return f"buffer {table.name!r}: a sample waited {timeout:g} s for {why}"

    return wait_for(table.client, table.keys.meta, attempt, timeout, describe,
                    error=RateLimitTimeoutError)


@dataclass
class _Fetched:
    """What the pipeline after a draw read (or its commit said): the records, chunks,
    and info sources."""

    records: list[ItemRecord]
    chunks: dict[str, Chunk]
    priorities: list[Any]
    uses: list[int]  # each draw's item's uses after the draw (-1: the draw removed it)
    size_after: int
    max_use: int | None
    complete: bool = False  # every chunk the records name was read


def _fetch(store: StepStore, table: ReplayBuffer, draw: Draw) -> _Fetched:
    records = store.records(draw.blobs)
    pipe = table.client.pipeline(transaction=False)
    named = {key: None for record in records for key in record.chunks}
    chunks = store.chunks_into(pipe, named)
    if draw.after is not None and draw.priorities is not None:
        # the commit said what it left, and each draw's priority: only chunks to read (no
        # round trip when every one is held)
        uses, size_after, max_use = draw.after
        found = chunks(pipe.execute())  # (an empty pipeline sends nothing)
        return _Fetched(records, found, list(draw.priorities), uses, size_after, max_use,
                        len(found) == len(named))
    ids = [b"%012d" % i for i in draw.ids]  # format_id, inline: a batch names hundreds
    pipe.hmget(table.keys.uses, ids)
    pipe.zcard(table.keys.order)
    pipe.hmget(table.keys.meta, "max_use", "mass")
    *read, read_uses, read_size, (read_max_use, mass) = pipe.execute()
    # each item's priority now: a PER draw's, at its commit; under another sampler of a
    # buffer with PER, from this process's replica of the priorities (the server keeps no
    # per-item copy); else (None) the record's own
    priorities: list[Any] = [None] * len(draw.ids)
    if draw.priorities is not None:
        priorities = list(draw.priorities)
    elif mass == b"per":
        priorities = table.priorities(draw.ids, follow=True).tolist()
    found = chunks(read)
    return _Fetched(records, found, priorities,
                    [-1 if u is None else int(u) for u in read_uses], int(read_size),
                    int(read_max_use) if read_max_use is not None else None,
                    len(found) == len(named))


def _info(table: ReplayBuffer, draw: Draw, fetched: _Fetched
          ) -> tuple[np.ndarray, np.ndarray, list[float], np.ndarray]:
    """Each draw's probability, table size, priority and times sampled (arrays, but the
    priorities)."""
    ids = np.asarray(draw.ids, dtype=np.int64)
    n = len(ids)
    # each draw's place among the draws of its id (1 = first) and how many there are
    order = np.argsort(ids, kind="stable")
    ordered = ids[order]
    new_id = np.empty(n, dtype=bool)
    new_id[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new_id[1:])
    starts = np.flatnonzero(new_id)
    group = np.cumsum(new_id) - 1
    seen, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64)
    seen[order] = np.arange(n) - starts[group] + 1
    counts[order] = np.diff(np.append(starts, n))[group]
    uses = np.asarray(fetched.uses, dtype=np.int64)
    removed = uses < 0  # no use count left: this draw removed the item (max_use)
    max_use = fetched.max_use
    sizes = np.full(n, fetched.size_after, dtype=np.int64)
    if max_use is not None:
        # an item the draw removed was in the table for the draws up to its last one
        last_of_removed = (removed & (seen == counts)).astype(np.int64)
        sizes += np.cumsum(last_of_removed[::-1])[::-1]
    sampler = table.sampler
    if draw.probabilities is not None and isinstance(sampler, (PERSampler,
                                                               PrioritizedSampler)):
        probabilities = np.asarray(draw.probabilities, dtype=np.float64)
    elif isinstance(sampler, UniformSampler):
        probabilities = 1.0 / np.maximum(sizes, 1)
    else:
        probabilities = np.ones(n, dtype=np.float64)
    priorities = [float(p) if p is not None and p == p else record.priority
                  for p, record in zip(fetched.priorities, fetched.records, strict=True)]
    totals = np.where(removed, max_use if max_use else counts, uses)
    times = totals - counts + seen
    return probabilities, sizes, priorities, times


def _present(draw: Draw, fetched: _Fetched) -> list[int]:
    """The positions of the drawn items whose chunks were all read."""
    if fetched.complete:
        return list(range(len(fetched.records)))
    return [i for i, record in enumerate(fetched.records)
            if all(key in fetched.chunks for key in record.chunks)]


def sample(store: StepStore, table: ReplayBuffer, n: int, timeout: float | None = None
           ) -> list[SampledItem]:
    """Draw up to ``n`` items of ``table`` (see the module); fewer when the rate limiter
    admits fewer now or a selector's items hold fewer uses. Waits while nothing can be
    drawn, up to ``timeout`` seconds (None: no limit), then raises
    :class:`~redisbuf.errors.RateLimitTimeoutError`."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    out: list[SampledItem] = []
    for _ in range(_MISSING_ATTEMPTS):
        draw = _draw(table, n - len(out), timeout)
        fetched = _fetch(store, table, draw)
        chances, table_sizes, priorities, uses = _info(table, draw, fetched)
        probabilities, sizes, times = chances.tolist(), table_sizes.tolist(), uses.tolist()
        present = _present(draw, fetched)
        for i in present:
            record = fetched.records[i]
            out.append(SampledItem(int(draw.ids[i]), probabilities[i], sizes[i],
                                   priorities[i], times[i],
                                   assemble(record, fetched.chunks), record.episode))
        if len(present) == len(draw.ids):
            return out
    raise SamplingError(f"buffer {table.name!r}: the chunks of drawn items were freed before "
                        f"they were read, {_MISSING_ATTEMPTS} times")


#: makes an uninitialized array of a shape and dtype (as ``np.empty``), for a batch's columns
Allocator = Callable[[tuple[int, ...], np.dtype], np.ndarray]


def sample_batch(store: StepStore, table: ReplayBuffer, n: int,
                 timeout: float | None = None,
                 gate: DrawGate | None = None, empty: Allocator | None = None
                 ) -> SampledBatch:
    """As :func:`sample`, as arrays: each flat column of every item cut out of the chunks
    at once (one gather per column, into an array of ``empty``, ``np.empty`` by default)
    when the items' columns agree in shape. Through ``gate``, a closed gate raises
    :class:`DrawStopped` instead of drawing."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    draw = _draw(table, n, timeout, gate)
    fetched = _fetch(store, table, draw)
    present = _present(draw, fetched)
    attempts = 0
    while len(present) < len(draw.ids):  # chunks freed since the draw: draw those again
        attempts += 1
        if attempts > _MISSING_ATTEMPTS:
            raise SamplingError(f"buffer {table.name!r}: the chunks of drawn items were "
                                f"freed before they were read, {_MISSING_ATTEMPTS} times")
        more = _draw(table, len(draw.ids) - len(present), timeout, gate)
        extra = _fetch(store, table, more)
        keep = _present(more, extra)
        probabilities = None if draw.probabilities is None else np.concatenate(
            [np.asarray(draw.probabilities)[present], np.asarray(more.probabilities)[keep]])
        draw = type(draw)([draw.ids[i] for i in present] + [more.ids[i] for i in keep],
                          [draw.blobs[i] for i in present] + [more.blobs[i] for i in keep],
                          probabilities)
        fetched = _Fetched([fetched.records[i] for i in present]
                           + [extra.records[i] for i in keep],
                           {**fetched.chunks, **extra.chunks},
                           [fetched.priorities[i] for i in present]
                           + [extra.priorities[i] for i in keep],
                           [fetched.uses[i] for i in present] + [extra.uses[i] for i in keep],
                           extra.size_after, extra.max_use)
        present = list(range(len(draw.ids)))
    probabilities, sizes, priorities, times = _info(table, draw, fetched)
    columns = _gather(fetched.records, fetched.chunks, empty)
    items = None
    if columns is None:
        items = [SampledItem(int(draw.ids[i]), float(probabilities[i]), int(sizes[i]),
                             priorities[i], int(times[i]), assemble(r, fetched.chunks),
                             r.episode)
                 for i, r in enumerate(fetched.records)]
    return SampledBatch(np.asarray(draw.ids, dtype=np.uint64),
                        np.asarray(probabilities, dtype=np.float64),
                        np.asarray(sizes, dtype=np.int64),
                        np.asarray(priorities, dtype=np.float64),
                        np.asarray(times, dtype=np.int32), columns, items)


def _gather(records: list[ItemRecord], chunks: dict[str, Chunk],
            empty: Allocator | None = None) -> list[np.ndarray] | None:
    """Each flat column of every record stacked: the runs' cells (views of the chunks'
    arrays) joined, one copy per column, into an array of ``empty`` (``np.empty`` when
    None); None when the records' columns differ (in number, source column, rows or
    squeezing: :attr:`ItemRecord.layout`) or the cells a column reads differ in dtype or
    cell shape from chunk to chunk. Views, not bytes slices: an array is no object the
    garbage collector tracks, and a batch makes one per run (a memoryview, tracked, made
    collections run several times as often)."""
    layout = records[0].layout
    if [record.layout for record in records].count(layout) != len(records):  # in C
        return None
    out = []
    for position, (source, squeeze, length) in enumerate(layout):
        parts: list[np.ndarray] = []
        append = parts.append
        kind = None
        # each chunk's cells of ``source``, looked up (and its kind checked) once per batch
        # rather than once per run: a batch reads a few runs of each chunk
        cells_of: dict[str, np.ndarray] = {}
        cells = None
        for record in records:
            keys = record.chunks
            for index, start, rows in record.columns[position][1]:
                key = keys[index]
                cells = cells_of.get(key)
                if cells is None:
                    chunk = chunks[key]
                    cells_kind = chunk.kinds[source]
                    if kind is None:
                        kind = cells_kind
                    elif cells_kind != kind:  # cells of several kinds do not join
                        return None
                    cells = cells_of[key] = chunk.columns[source]
                append(cells[start : start + rows])
        if kind is None or cells is None:  # no cell at all
            return None
        # every run is of one kind, and every record (one layout) has ``length`` rows
        shape = (len(records) * length, *cells.shape[1:])
        stacked = np.concatenate(parts, out=(empty or np.empty)(shape, cells.dtype))
        stacked = stacked.reshape(len(records), length, *stacked.shape[1:])
        out.append(stacked[:, 0] if squeeze else stacked)
    return out


def read_all(store: StepStore, table: ReplayBuffer, ids: list[int]) -> dict[int, Any]:
    """The flat columns of the items ``ids`` present (for checkpoints and inspection)."""
    blobs = table.client.hmget(table.keys.items, [format_id(i) for i in ids])
    records = {i: store.record(b) for i, b in zip(ids, blobs, strict=True) if b is not None}
    chunks = store.read(key for record in records.values() for key in record.chunks)
    return {i: assemble(record, chunks) for i, record in records.items()}


__all__ = ["INFO_FIELDS", "SampledBatch", "SampledItem", "read_all", "sample", "sample_batch"]
