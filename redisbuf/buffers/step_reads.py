"""Drawing items of a buffer whose items reference a step store's chunks
(redisbuf/buffers/steps.py), with what Reverb's ``SampleInfo`` reports of each.

A draw is the buffer's own (its sampler, rate limiter, ``max_use``); then one pipeline
reads the chunks the items name, their PER priorities, their use counts and the
buffer's length, and each item's flat columns are cut out of its chunks. What a sample
reports, as Reverb's table reports it for the samples of one request one after the
other: ``times_sampled`` counts this draw (the ``j``-th of ``c`` draws of one item in a
batch reports ``uses - c + j``); ``table_size`` is the length before the draw removed
what ``max_use`` removed at or after it; ``probability`` is the draw's under a PER
sampler, ``1 / table_size`` under a uniform one and 1 under a selector; ``priority`` is
the item's PER priority after the draw, or, for an item the draw itself removed, the one
it was inserted with.
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
from .step_records import assemble, decode_chunk, decode_item

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


def _draw(table: ReplayBuffer, n: int, timeout: float | None) -> Draw:
    """The buffer's draw of up to ``n`` items once its rate limiter admits (an item at a
    time, as Reverb's table: fewer than ``n`` when it admits fewer) and it holds one,
    waiting up to ``timeout`` seconds (None: no limit)."""
    limiter = table.rate_limiter

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
        got, missing = _resolve(store, table, draw)
        out.extend(got)
        if not missing:
            return out
    raise SamplingError(f"buffer {table.name!r}: the chunks of drawn items were freed before "
                        f"they were read, {_MISSING_ATTEMPTS} times")


def _resolve(store: StepStore, table: ReplayBuffer, draw: Draw) -> tuple[list[SampledItem], int]:
    records = [decode_item(blob) for blob in draw.blobs]
    wanted = list(dict.fromkeys(key for record in records for key in record.chunks))
    ids = [format_id(i) for i in draw.ids]
    pipe = table.client.pipeline(transaction=False)
    pipe.hmget(store.keys.chunks, wanted)
    pipe.hmget(table.keys.per, ids)
    pipe.hmget(table.keys.uses, ids)
    pipe.zcard(table.keys.order)
    pipe.hget(table.keys.meta, "max_use")
    blobs, priorities, uses, size_after, max_use = pipe.execute()
    chunks = {key: decode_chunk(blob) for key, blob in zip(wanted, blobs, strict=True)
              if blob is not None}
    max_use = int(max_use) if max_use is not None else None
    counts = collections.Counter(draw.ids)
    last_at = {item: position for position, item in enumerate(draw.ids)}
    removed = {item for item, count in zip(draw.ids, uses, strict=True) if count is None
               and max_use is not None}
    # removals at or after each position: what table_size adds back
    removals_after = np.zeros(len(draw.ids) + 1, dtype=np.int64)
    for item in removed:
        removals_after[: last_at[item] + 1] += 1
    seen: dict[int, int] = collections.Counter()
    sampler = table.sampler
    out, missing = [], 0
    for position, (item, record) in enumerate(zip(draw.ids, records, strict=True)):
        seen[item] += 1
        try:
            columns = assemble(record, chunks)
        except KeyError:
            missing += 1
            continue
        total = int(uses[position]) if uses[position] is not None else (max_use or counts[item])
        size = int(size_after) + int(removals_after[position])
        if draw.probabilities is not None and isinstance(sampler, (PERSampler,
                                                                   PrioritizedSampler)):
            probability = float(draw.probabilities[position])
        elif isinstance(sampler, UniformSampler):
            probability = 1.0 / max(size, 1)
        else:
            probability = 1.0
        priority = float(priorities[position]) if priorities[position] is not None \
            else record.priority
        out.append(SampledItem(int(item), probability, size, priority,
                               total - counts[item] + seen[item], columns, record.episode))
    return out, missing


def read_all(store: StepStore, table: ReplayBuffer, ids: list[int]) -> dict[int, Any]:
    """The flat columns of the items ``ids`` present (for checkpoints and inspection)."""
    blobs = table.client.hmget(table.keys.items, [format_id(i) for i in ids])
    records = {i: decode_item(b) for i, b in zip(ids, blobs, strict=True) if b is not None}
    chunks = store.read(key for record in records.values() for key in record.chunks)
    return {i: assemble(record, chunks) for i, record in records.items()}


__all__ = ["SampledItem", "read_all", "sample"]
