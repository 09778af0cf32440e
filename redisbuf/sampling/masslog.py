"""The mass log's entries as a replica reads them (lua/_masslog.lua writes them): ``C``
entries set the items they name, ``U`` and ``V`` entries (PER priority updates, their ids
as text or binary) and the ``P`` entries of earlier versions re-score ids stored at that
point only, ``X`` starts a new epoch."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..store.keys import storable


def text(value: Any) -> str:
    """A reply field (bytes or text) as text."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _numbers(text: bytes, dtype: Any) -> np.ndarray:
    """Comma-separated numbers (``nan``, ``inf`` and ``-inf`` too) as an array."""
    if not text:
        return np.empty(0, dtype=dtype)
    return np.array(text.split(b","), dtype=dtype)


def parse_entry(entry: bytes) -> tuple[np.ndarray, np.ndarray, bool] | None:
    """(ids, new scores; NaN = removed, whether they apply only to ids held) of one
    mass-log entry, rows in order; None for an X entry (everything must be read again).
    A C entry sets what it names; a U or V entry (PER priorities, lua/update_priority.lua) and
    a P entry of earlier versions re-score ids stored at that point only."""
    kind = entry[:1]
    if kind == b"X":
        return None
    if kind in (b"U", b"V"):  # k ids (12 digits, or big-endian int64), k big-endian doubles
        _, count, _, payload = entry.split(b"|", 3)
        k = int(count)
        if kind == b"U":
            held, width = np.frombuffer(payload, dtype="S12", count=k).astype(np.int64), 12
        else:
            held, width = np.frombuffer(payload, dtype=">i8", count=k).astype(np.int64), 8
        scores = np.frombuffer(payload, dtype=">f8", count=k, offset=width * k).astype(
            np.float64)
        if width == 8:  # as lua/_masslog.lua id_at: a number no item has is skipped
            kept = storable(held)
            if not kept.all():
                held, scores = held[kept], scores[kept]
        return held, scores, True
    if kind == b"P":  # ids 12 digits each, then the new scores (old ones: bits)
        _, _, _, packed, new, _ = entry.split(b"|", 5)
        return (np.frombuffer(packed, dtype="S12").astype(np.int64), _numbers(new, np.float64),
                True)
    _, count, _, listed, _, new = entry.split(b"|", 5)
    k = int(count)
    scores = _numbers(new, np.float64) if new else np.full(k, np.nan)
    if len(scores) == 1 and k > 1:  # one value for every row
        scores = np.full(k, scores[0])
    return _numbers(listed, np.int64), scores, False


__all__ = ["parse_entry", "text"]
