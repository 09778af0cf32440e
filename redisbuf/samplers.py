"""Samplers: each chooses items in one Lua call and returns their ids and blobs.

A sampler is one part with one job; adding a sampling mode means adding one class here
(and its script in ``lua/``), not editing the buffer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from .errors import ConfigMismatchError

if TYPE_CHECKING:
    from .buffer import ReplayBuffer


@dataclass
class Draw:
    """What a sampler drew: ids, raw blobs, and each draw's probability when known."""

    ids: list[int]
    blobs: list[bytes]
    probabilities: np.ndarray | None = None


class Sampler(Protocol):
    name: str

    def prepare(self, buffer: ReplayBuffer) -> None:
        """Create whatever server-side structure the sampler needs (idempotent)."""

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Raises EmptyBufferError when nothing can be drawn."""


def _split(reply: list[bytes], n: int, offset: int = 0) -> tuple[list[int], list[bytes]]:
    ids = [int(x) for x in reply[offset : offset + n]]
    return ids, reply[offset + n : offset + 2 * n]


class UniformSampler:
    """Uniform over the items present. Without replacement every n-subset is equally
    likely; with replacement (or when n exceeds the length) draws are independent."""

    name = "uniform"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: ReplayBuffer) -> None:
        return None

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        keys = buffer.keys
        reply = buffer._run(
            "sample_uniform",
            [keys.meta, keys.items, keys.order],
            [n, int(self.replacement), *rng.random(n).tolist()],
        )
        ids, blobs = _split(reply, n)
        return Draw(ids, blobs)


class PrioritizedSampler:
    """With replacement; item ``i`` is drawn with probability
    ``exp(log_reward_i) / sum_j exp(log_reward_j)`` (softmax of log-rewards; items with
    log-reward -inf are never drawn). O(log capacity) per draw via a sum tree in Redis."""

    name = "prioritized"

    def prepare(self, buffer: ReplayBuffer) -> None:
        keys = buffer.keys
        buffer._run(
            "enable_tree",
            [keys.meta, keys.prio, keys.tree, keys.tree_ids, keys.tree_slots, keys.tree_free],
            [0],
        )

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        keys = buffer.keys
        args = [n, *rng.random(n).tolist()]
        call_keys = [keys.meta, keys.items, keys.tree, keys.tree_ids]
        try:
            reply = buffer._run("sample_prioritized", call_keys, args)
        except ConfigMismatchError as exc:
            if getattr(exc, "code", None) != "RB_NOTREE":
                raise
            self.prepare(buffer)
            reply = buffer._run("sample_prioritized", call_keys, args)
        total = float(reply[0])
        ids = [int(x) for x in reply[1 : n + 1]]
        weights = np.array([float(w) for w in reply[n + 1 : 2 * n + 1]])
        return Draw(ids, reply[2 * n + 1 : 3 * n + 1], weights / total)


__all__ = ["Draw", "PrioritizedSampler", "Sampler", "UniformSampler"]
