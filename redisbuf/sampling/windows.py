"""Sampling among some positions of the insertion order: DI-engine's ``sample_range``
and ALF's recent data (``recent_data_ratio`` of a batch from the newest
``recent_data_steps`` items)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import RequestTooLargeError
from ..store import bounds
from .samplers import Draw, _draw_then_fetch, _joined, packed_uniforms

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer


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

    def prepare(self, buffer: ReplayBuffer) -> None:
        return None

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Above :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`,
        draws with replacement are made as several independent commands (the same law);
        without replacement such a draw raises :class:`RequestTooLargeError` (one
        command resolves the window and keeps the draws distinct)."""
        limit = bounds.MAX_ITEMS_PER_COMMAND
        if n > limit:
            if not self.replacement:
                raise RequestTooLargeError(
                    f"sample_range draws without replacement take at most {limit} items "
                    f"per call (redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND), asked {n}: "
                    "draw in several calls, or with replacement=True"
                )
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
