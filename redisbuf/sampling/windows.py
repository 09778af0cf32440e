"""Sampling among some positions of the insertion order: DI-engine's ``sample_range``
and ALF's recent data (``recent_data_ratio`` of a batch from the newest
``recent_data_steps`` items)."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from ..errors import SamplingError
from ..store import bounds
from .samplers import _IDLE_ROUNDS, Draw, _draw_then_fetch, _joined
from .uniforms import packed_uniforms

if TYPE_CHECKING:
    from .base import BufferView


def _slice_part(value: Any, what: str) -> str:
    if value is None:
        return ""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"sample_range {what} must be an integer or None, got {value!r}")
    return str(int(value))


class WindowSampler:
    """Uniform over the items at positions ``window`` (any Python slice over insertion
    order, 0 = the oldest item present, -1 = the newest), resolved atomically with the
    draw. Without replacement every n-subset of the window is equally likely (when n
    does not exceed its size); with replacement draws are independent."""

    name = "window"

    def __init__(self, window: slice, replacement: bool = False) -> None:
        if not isinstance(window, slice):
            raise ValueError(f"sample_range must be a slice, got {window!r}")
        self._bounds = [
            _slice_part(window.start, "start"),
            _slice_part(window.stop, "stop"),
            _slice_part(window.step, "step"),
        ]
        if self._bounds[2] == "0":
            raise ValueError("sample_range step cannot be zero")
        self.window = window
        self.replacement = replacement

    def prepare(self, buffer: BufferView) -> None:
        return None

    def draw(self, buffer: BufferView, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Above :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`,
        draws with replacement (or of more items than the window holds) are made as
        several independent commands (the same law); without replacement, as several
        commands each drawing uniformly among the window's items then that the earlier
        ones did not return (:meth:`_draw_chunked`)."""
        limit = bounds.MAX_ITEMS_PER_COMMAND
        if n > limit:
            size = len(range(*self.window.indices(len(buffer))))
            if not self.replacement and n <= size:
                return self._draw_chunked(buffer, n, rng, size)
            part = WindowSampler(self.window, True)
            return _joined([part.draw(buffer, stop - start, rng)
                            for start, stop in bounds.chunks(n, limit)])

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], None, int]:
            return reply[:n], None, n

        return _draw_then_fetch(
            buffer,
            "sample_window",
            buffer.keys.all_keys(),
            [n, int(self.replacement), *self._bounds],
            n,
            packed_uniforms(rng, n),
            parse,
        )


    def _draw_chunked(
        self, buffer: BufferView, n: int, rng: np.random.Generator, size: int
    ) -> Draw:
        """``n`` distinct items of the window, in commands of at most the bound
        (lua/sample_window.lua's chunk mode): each command resolves the window as it is
        then and keeps uniform candidates of it that are not in the draw's set of
        returned ids (rejection), so each kept item is uniform among the window's items
        not returned yet; when no other process changes the buffer during the call,
        every ``n``-subset of the window is equally likely, in uniformly random order.
        Raises :class:`~redisbuf.errors.SamplingError` (taking the draws back) when the
        window stops yielding new items for many commands in a row (it lost items)."""
        limit = bounds.MAX_ITEMS_PER_COMMAND
        drawn_key = buffer.keys.drawing(os.urandom(8).hex())
        keys = [*buffer.keys.all_keys(), drawn_key]
        inline = buffer.fetch_inline
        ids: list[int] = []
        blobs: list[bytes] = []
        have: set[int] = set()
        # the last items of a large window take many candidates: enough idle commands
        # that one item left goes unseen with probability about e^-16
        patience = max(_IDLE_ROUNDS, 16 * math.ceil(size / limit))
        idle = 0
        try:
            while len(ids) < n:
                want = min(n - len(ids), limit)
                free = max(size - len(have), 1)
                count = min(limit, int(want * size / free * 1.2) + 16)
                reply = buffer.run(
                    "sample_window", keys,
                    [want, 0, *self._bounds, int(inline), packed_uniforms(rng, count),
                     "exclude"])
                size = int(reply[0])
                body = reply[1:]
                k = len(body) // 2 if inline else len(body)
                members = list(body[:k])
                if inline:
                    got = list(body[k:])
                elif members:
                    got = buffer.client.hmget(buffer.keys.items, members)
                    gone = [m for m, blob in zip(members, got, strict=True) if blob is None]
                    if gone:  # evicted before the HMGET: not drawn
                        buffer.run("undo_draws", buffer.keys.all_keys(), gone)
                else:
                    got = []
                kept = 0
                for member, blob in zip(members, got, strict=True):
                    item = int(member)
                    if blob is None or item in have:
                        continue
                    have.add(item)
                    ids.append(item)
                    blobs.append(blob)
                    kept += 1
                idle = 0 if kept else idle + 1
                if idle >= patience:
                    raise SamplingError(
                        f"a sample_range draw of {n} items without replacement found only "
                        f"{len(ids)}: the window lost items while it was being drawn from"
                    )
        except BaseException:
            for start, stop in bounds.chunks(len(ids), limit):  # best effort: not a draw
                try:
                    buffer.run("undo_draws", buffer.keys.all_keys(),
                                [b"%012d" % i for i in ids[start:stop]])
                except Exception:
                    break
            raise
        finally:
            try:
                buffer.client.unlink(drawn_key)
            except Exception:
                pass  # it expires by itself
        # bytes: redisbuf's clients never decode replies (redis-py types say str too)
        schema_json = cast("bytes | None", buffer.client.hget(buffer.keys.meta, "schema"))
        return Draw(ids, blobs, None, schema_json)


def recent_batch_size(n: int, ratio: float) -> int:
    """How many of ``n`` draws come from the recent window: ``ceil(n * ratio)`` (ALF)."""
    return min(n, math.ceil(n * ratio))


def joined(recent: Draw, rest: Draw | None) -> Draw:
    """The recent draws followed by the rest; per-draw probabilities and weights are
    dropped, as the two parts draw by different rules."""
    if rest is None:
        return Draw(recent.ids, recent.blobs, None, recent.schema_json)
    return Draw(recent.ids + rest.ids, list(recent.blobs) + list(rest.blobs), None,
                rest.schema_json or recent.schema_json)


__all__ = ["WindowSampler", "joined", "recent_batch_size"]
