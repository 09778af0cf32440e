"""The uniforms a process sends its drawing scripts: 48-bit integers, 6 little-endian bytes
each, which ``uniform_at`` in lua/_common.lua reads as word / 2**48 in [0, 1)."""

from __future__ import annotations

import numpy as np


def _uniform_words(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` random 48-bit integers; word / 2**48 is a uniform in [0, 1)."""
    return rng.integers(0, 2**48, n, dtype=np.uint64)


def _pack_words(words: np.ndarray) -> bytes:
    """48-bit words as 6 little-endian bytes each (read by ``uniform_at`` in
    lua/_common.lua)."""
    return words.astype("<u8").view(np.uint8).reshape(len(words), 8)[:, :6].tobytes()


def packed_uniforms(rng: np.random.Generator, n: int) -> bytes:
    """``n`` uniforms in [0, 1) as 48-bit little-endian integers (read by ``uniform_at``
    in lua/_common.lua)."""
    return _pack_words(_uniform_words(rng, n))


__all__ = ["packed_uniforms"]
