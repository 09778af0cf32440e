"""Samplers: each chooses items in one Lua call and returns their ids and blobs.

A sampler is one part with one job; adding a sampling mode means adding one class here
(and its script in ``lua/``), not editing the buffer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

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
    schema_json: bytes | None = None  # the meta's schema, read in the same round trip
    weights: np.ndarray | None = None  # PER importance-sampling weights (DI-engine's IS)
    importance_weights: np.ndarray | None = None  # ALF's priority / mean non-zero priority


class Sampler(Protocol):
    name: str

    def prepare(self, buffer: ReplayBuffer) -> None:
        """Create whatever server-side structure the sampler needs (idempotent)."""

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        """Draw ``n`` items. Raises EmptyBufferError when nothing can be drawn."""


# Two round trips (ids from the script, blobs by a native HMGET) cost the server about a
# tenth of returning blobs from Lua; an item evicted in between makes us draw again, and
# after a few such races the script fetches the blobs itself, atomically.
_FETCH_ATTEMPTS = 3


def packed_uniforms(rng: np.random.Generator, n: int) -> bytes:
    """``n`` uniforms in [0, 1) as 48-bit little-endian integers (read by ``uniform_at``
    in lua/_common.lua)."""
    words = rng.integers(0, 2**48, n, dtype=np.uint64).astype("<u8")
    return words.view(np.uint8).reshape(n, 8)[:, :6].tobytes()


def _draw_then_fetch(
    buffer: ReplayBuffer,
    script: str,
    keys: list[str],
    head: list[Any],
    n: int,
    uniforms: bytes,
    parse: Callable[[list[Any], int], tuple[list[bytes], np.ndarray | None, int]],
) -> Draw:
    # fetch_inline: the script may remove what it draws (max_use), so only it can read them
    first = _FETCH_ATTEMPTS if getattr(buffer, "fetch_inline", False) else 0
    for attempt in range(first, _FETCH_ATTEMPTS + 1):
        inline = attempt == _FETCH_ATTEMPTS
        reply = buffer._run(script, keys, [*head, int(inline), uniforms])
        members, probabilities, offset = parse(reply, n)
        pipe = buffer.client.pipeline(transaction=False)
        if not inline:
            pipe.hmget(buffer.keys.items, members)
        pipe.hget(buffer.keys.meta, "schema")
        *fetched, schema_json = pipe.execute()
        blobs = reply[offset : offset + n] if inline else fetched[0]
        if not inline and any(blob is None for blob in blobs):
            buffer._run("undo_draws", keys, members)  # not a real draw
            continue
        return Draw([int(m) for m in members], blobs, probabilities, schema_json)
    raise AssertionError("unreachable")


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

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], None, int]:
            return reply[:n], None, n

        return _draw_then_fetch(
            buffer,
            "sample_uniform",
            keys.all_keys(),
            [n, int(self.replacement)],
            n,
            packed_uniforms(rng, n),
            parse,
        )


class PrioritizedSampler:
    """Item ``i`` is drawn with probability ``exp(log_reward_i) / sum_j exp(log_reward_j)``
    (softmax of log-rewards; items with log-reward -inf are never drawn), through a sum
    tree in Redis, O(log capacity) per draw.

    Without replacement (the default, unless ``n`` exceeds the length) the draws are
    successive, each over the items not drawn yet, as torchgfn's
    ``torch.multinomial(softmax(log_rewards), n, replacement=n > len)``; asking for more
    draws than items of nonzero probability raises :class:`SamplingError`, as does any
    item of log-reward +inf (the softmax is undefined).
    """

    name = "prioritized"

    def __init__(self, replacement: bool = False) -> None:
        self.replacement = replacement

    def prepare(self, buffer: ReplayBuffer) -> None:
        keys = buffer.keys
        buffer._run(
            "enable_tree",
            [keys.meta, keys.prio, keys.tree, keys.tree_ids, keys.tree_slots, keys.tree_free],
            [0],
        )

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        keys = buffer.keys
        uniforms = packed_uniforms(rng, n)

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], np.ndarray, int]:
            probabilities = np.array([float(p) for p in reply[n + 1 : 2 * n + 1]])
            return reply[1 : n + 1], probabilities, 2 * n + 1

        def attempt() -> Draw:
            return _draw_then_fetch(
                buffer,
                "sample_prioritized",
                keys.all_keys(),
                [n, int(self.replacement)],
                n,
                uniforms,
                parse,
            )

        try:
            return attempt()
        except ConfigMismatchError as exc:
            if getattr(exc, "code", None) != "RB_NOTREE":
                raise
            self.prepare(buffer)  # the tree was dropped (drop / flush): build it again
            return attempt()


def _nonnegative(name: str, value: float) -> float:
    value = float(value)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
    return value


class PERSampler:
    """Prioritized experience replay (Schaul et al.; ALF, DI-engine, Reverb): with
    replacement, item ``i`` is drawn with probability ``(p_i + eps)^alpha / sum_j
    (p_j + eps)^alpha``, O(log capacity) per draw via the buffer's sum tree.

    ``p_i`` is the item's PER priority (the ``per`` sorted set), set by
    :meth:`ReplayBuffer.update_priority` or ``add(..., priorities=...)``; a new item
    otherwise gets ``max(initial_priority, highest priority present)``. ``alpha``,
    ``eps`` and ``initial_priority`` are stored with the buffer: every process must use
    the same. ``beta`` (the exponent of the importance weights) is this object's own and
    may be changed between calls (annealing).
    """

    name = "per"

    def __init__(
        self,
        alpha: float = 0.6,
        beta: float = 0.4,
        initial_priority: float = 1.0,
        eps: float = 1e-6,
    ) -> None:
        self.alpha = _nonnegative("alpha", alpha)
        self.beta = _nonnegative("beta", beta)
        self.initial_priority = _nonnegative("initial_priority", initial_priority)
        self.eps = _nonnegative("eps", eps)

    def prepare(self, buffer: ReplayBuffer) -> None:
        buffer._run(
            "enable_per",
            buffer.keys.all_keys(),
            [repr(self.alpha), repr(self.eps), repr(self.initial_priority)],
        )

    def draw(self, buffer: ReplayBuffer, n: int, rng: np.random.Generator) -> Draw:
        uniforms = packed_uniforms(rng, n)
        info: dict[str, Any] = {}

        def parse(reply: list[Any], n: int) -> tuple[list[bytes], np.ndarray, int]:
            total, min_mass = float(reply[0]), float(reply[1])
            info["length"] = int(reply[2])
            info["mean"] = float(reply[3]) / int(reply[4]) if int(reply[4]) > 0 else 0.0
            head = 5
            info["masses"] = np.array([float(m) for m in reply[head + n : head + 2 * n]])
            info["priorities"] = np.array([float(p) for p in reply[head + 2 * n : head + 3 * n]])
            info["min_mass"] = min_mass
            return reply[head : head + n], info["masses"] / total, head + 3 * n

        def attempt() -> Draw:
            return _draw_then_fetch(
                buffer, "sample_per", buffer.keys.all_keys(), [n], n, uniforms, parse
            )

        try:
            draw = attempt()
        except ConfigMismatchError as exc:
            if getattr(exc, "code", None) != "RB_NOTREE":
                raise
            self.prepare(buffer)  # the buffer was dropped and made again: turn PER back on
            draw = attempt()
        # (N P(i))^-beta / max_j (N P(j))^-beta = (min_mass / mass_i)^beta: N and the total
        # cancel, and the largest weight belongs to the lowest priority present.
        draw.weights = (info["min_mass"] / info["masses"]) ** self.beta
        mean = info["mean"]
        draw.importance_weights = (
            info["priorities"] / mean if mean > 0 else np.ones(n, dtype=np.float64)
        )
        return draw


__all__ = ["Draw", "PERSampler", "PrioritizedSampler", "Sampler", "UniformSampler"]
