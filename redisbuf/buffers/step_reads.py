"""Drawing items of a buffer whose items reference a step store's chunks
(redisbuf/buffers/steps.py), with what Reverb's ``SampleInfo`` reports of each.

A draw is the buffer's own (its sampler, rate limiter, ``max_use``); then one pipeline
reads the chunks the items name that this process does not hold decoded already (chunks
and item records never change, so the store keeps the recent ones, see
:class:`~redisbuf.buffers.steps.StepStore`), their PER priorities, their use counts and
the buffer's length, and each item's flat columns are cut out of its chunks (for a batch,
each column of every item at once). What a sample reports, as Reverb's table reports it
for the samples of one request one after the other: ``times_sampled`` counts this draw
(the ``j``-th of ``c`` draws of one item in a batch reports ``uses - c + j``);
``table_size`` is the length before the draw removed what ``max_use`` removed at or
after it; ``probability`` is the draw's under a PER sampler, ``1 / table_size`` under a
uniform one and 1 under a selector; ``priority`` is the item's PER priority after the
draw, or, for an item the draw itself removed, the one it was inserted with.
"""

from __future__ import annotations

import collections
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


def _draw(table: ReplayBuffer, n: int, timeout: float | None) -> Draw:
    """The buffer's draw of up to ``n`` items once its rate limiter admits (an item at a
    time, as Reverb's table: fewer than ``n`` when it admits fewer) and it holds one,
    waiting up to ``timeout`` seconds (None: no limit)."""
    limiter = table.rate_limiter
    if limiter is not None and getattr(table.sampler, "admits", False):
        limiter = None  # the selection asks the limiter itself, in its script

    def attempt() -> Draw | None:
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
    """What the pipeline after a draw read: the records, chunks, and info sources."""

    records: list[ItemRecord]
    chunks: dict[str, Chunk]
    priorities: list[Any]
    uses: list[Any]
    size_after: int
    max_use: int | None


def _fetch(store: StepStore, table: ReplayBuffer, draw: Draw) -> _Fetched:
    records = [store.record(blob) for blob in draw.blobs]
    ids = [format_id(i) for i in draw.ids]
    pipe = table.client.pipeline(transaction=False)
    chunks = store.chunks_into(pipe, (key for record in records for key in record.chunks))
    pipe.hmget(table.keys.uses, ids)
    pipe.zcard(table.keys.order)
    pipe.hmget(table.keys.meta, "max_use", "mass")
    *read, uses, size_after, (max_use, mass) = pipe.execute()
    # each item's priority now: a PER draw's, at its commit; under another sampler of a
    # buffer with PER, from this process's replica of the priorities (the server keeps no
    # per-item copy); else (None) the record's own
    priorities: list[Any] = [None] * len(draw.ids)
    if draw.priorities is not None:
        priorities = list(draw.priorities)
    elif mass == b"per":
        priorities = table.priorities(draw.ids, follow=True).tolist()
    return _Fetched(records, chunks(read), priorities, uses, int(size_after),
                    int(max_use) if max_use is not None else None)


def _info(table: ReplayBuffer, draw: Draw, fetched: _Fetched
          ) -> tuple[list[float], list[int], list[float], list[int]]:
    """Each draw's probability, table size, priority and times sampled."""
    ids, uses, max_use = draw.ids, fetched.uses, fetched.max_use
    counts = collections.Counter(ids)
    last_at = {item: position for position, item in enumerate(ids)}
    removals_after = np.zeros(len(ids) + 1, dtype=np.int64)  # what table_size adds back
    if max_use is not None:
        for item, count in zip(ids, uses, strict=True):
            if count is None:
                removals_after[: last_at[item] + 1] += 1
                last_at[item] = -1  # counted once
    sizes = (removals_after[: len(ids)] + fetched.size_after).tolist()
    sampler = table.sampler
    if draw.probabilities is not None and isinstance(sampler, (PERSampler,
                                                               PrioritizedSampler)):
        probabilities = np.asarray(draw.probabilities, dtype=np.float64).tolist()
    elif isinstance(sampler, UniformSampler):
        probabilities = [1.0 / max(size, 1) for size in sizes]
    else:
        probabilities = [1.0] * len(ids)
    priorities = [float(p) if p is not None and p == p else record.priority
                  for p, record in zip(fetched.priorities, fetched.records, strict=True)]
    seen: collections.Counter[int] = collections.Counter()
    times = []
    for item, count in zip(ids, uses, strict=True):
        seen[item] += 1
        total = int(count) if count is not None else (max_use or counts[item])
        times.append(total - counts[item] + seen[item])
    return probabilities, sizes, priorities, times


def _present(draw: Draw, fetched: _Fetched) -> list[int]:
    """The positions of the drawn items whose chunks were all read."""
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
        probabilities, sizes, priorities, times = _info(table, draw, fetched)
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


def sample_batch(store: StepStore, table: ReplayBuffer, n: int,
                 timeout: float | None = None) -> SampledBatch:
    """As :func:`sample`, as arrays: each flat column of every item cut out of the chunks
    at once (one gather per column) when the items' columns agree in shape."""
    if n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    draw = _draw(table, n, timeout)
    fetched = _fetch(store, table, draw)
    present = _present(draw, fetched)
    attempts = 0
    while len(present) < len(draw.ids):  # chunks freed since the draw: draw those again
        attempts += 1
        if attempts > _MISSING_ATTEMPTS:
            raise SamplingError(f"buffer {table.name!r}: the chunks of drawn items were "
                                f"freed before they were read, {_MISSING_ATTEMPTS} times")
        more = _draw(table, len(draw.ids) - len(present), timeout)
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
    columns = _gather(fetched.records, fetched.chunks)
    items = None
    if columns is None:
        items = [SampledItem(int(draw.ids[i]), probabilities[i], sizes[i], priorities[i],
                             times[i], assemble(r, fetched.chunks), r.episode)
                 for i, r in enumerate(fetched.records)]
    return SampledBatch(np.asarray(draw.ids, dtype=np.uint64),
                        np.asarray(probabilities, dtype=np.float64),
                        np.asarray(sizes, dtype=np.int64),
                        np.asarray(priorities, dtype=np.float64),
                        np.asarray(times, dtype=np.int32), columns, items)


def _gather(records: list[ItemRecord], chunks: dict[str, Chunk]) -> list[np.ndarray] | None:
    """Each flat column of every record stacked, copied run by run from the chunks into
    one array per column; None when the records' columns differ (in number, source
    column, length, squeezing, or cell dtype and shape)."""
    first = records[0]
    width = len(first.columns)
    if any(len(record.columns) != width for record in records):
        return None
    out = []
    for position in range(width):
        model = first.columns[position]
        length = sum(rows for _, _, rows in model.runs)
        source = model.column
        copies: list[tuple[int, int, np.ndarray, int, int]] = []  # item, at, cells, start, n
        kind: tuple[Any, ...] | None = None
        for j, record in enumerate(records):
            column = record.columns[position]
            if column.column != source or column.squeeze != model.squeeze:
                return None
            at = 0
            for index, start, rows in column.runs:
                cells = chunks[record.chunks[index]].columns[source]
                if kind is None:
                    kind = (cells.dtype, cells.shape[1:])
                elif cells.dtype != kind[0] or cells.shape[1:] != kind[1]:
                    return None
                copies.append((j, at, cells, start, rows))
                at += rows
            if at != length:
                return None
        assert kind is not None
        stacked = np.empty((len(records), length, *kind[1]), dtype=kind[0])
        for j, at, cells, start, rows in copies:
            stacked[j, at : at + rows] = cells[start : start + rows]
        out.append(stacked[:, 0] if model.squeeze else stacked)
    return out


def read_all(store: StepStore, table: ReplayBuffer, ids: list[int]) -> dict[int, Any]:
    """The flat columns of the items ``ids`` present (for checkpoints and inspection)."""
    blobs = table.client.hmget(table.keys.items, [format_id(i) for i in ids])
    records = {i: store.record(b) for i, b in zip(ids, blobs, strict=True) if b is not None}
    chunks = store.read(key for record in records.values() for key in record.chunks)
    return {i: assemble(record, chunks) for i, record in records.items()}


__all__ = ["SampledBatch", "SampledItem", "read_all", "sample", "sample_batch"]
