"""NormBasedDiversePrioritizedReplayBuffer: torchgfn's diversity rule, applied in Redis.

Each item keeps a compact state vector (its terminating state, flattened, with its
conditions appended, as float32 values written as text) in the buffer's ``vecs`` hash;
``lua/add_diverse.lua`` compares a batch against them and inserts the survivors in the
same atomic step, so the rule holds whichever process adds.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import InvalidBatchError, SchemaError
from ..store.containers import KINDS, _to_numpy
from .insert import AddResult, _priority_text, check_add_bound
from .replay import ReplayBuffer
from .terminating import terminating_states_of


@dataclass
class DiverseAddResult(AddResult):
    """An :class:`AddResult` whose ``ids`` are those of the inserted items only; ``kept``
    holds their positions in the batch (ascending), the others having been dropped.

    Attributes:
        kept: positions in the batch of the inserted items (ascending, int64).
    """

    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def diversity_vectors(batch: Any) -> np.ndarray:
    """(B, d) float32: each item's terminating state, flattened, with its conditions
    (flattened) appended, as torchgfn 2.4.1's ``_diversity_repr`` (one state under two
    conditions gives two vectors). Transitions must all be terminating: one vector per
    stored item."""
    if isinstance(batch, dict):
        raise SchemaError("a diverse buffer compares terminating states: give Trajectories, "
                          "Transitions or States, not a dict")
    states = terminating_states_of(batch)
    if len(states) != len(batch):
        raise InvalidBatchError(
            f"{len(batch) - len(states)} of {len(batch)} transitions are not terminating: a "
            "diverse buffer needs a terminating state per item"
        )
    parts = [_to_numpy(states.states).reshape(len(states), -1)]
    if states.conditions is not None:
        parts.append(_to_numpy(states.conditions).reshape(len(states), -1))
    # + 0.0 turns -0.0 into 0.0: equal vectors must have equal texts (see add_diverse.lua)
    vectors = np.concatenate([part.astype(np.float32) for part in parts], axis=1) + np.float32(0)
    if vectors.shape[1] == 0:
        raise InvalidBatchError("terminating states (with conditions) have no components")
    if not np.isfinite(vectors).all():
        bad = np.flatnonzero(~np.isfinite(vectors).all(axis=1))[:5].tolist()
        raise InvalidBatchError(f"terminating states or conditions of items {bad} are not finite")
    return vectors


def _vector_text(row: np.ndarray) -> bytes:
    # 9 significant digits give back the float32 exactly; integers stay short ("3")
    return ",".join(f"{x:.9g}" for x in row.tolist()).encode()


class NormBasedDiversePrioritizedReplayBuffer(ReplayBuffer):
    """A prioritized-capacity :class:`ReplayBuffer` that keeps its items diverse, with
    torchgfn 2.4.1's rule: until the buffer is full a batch enters as usual; once full, the
    batch is ranked by log-reward (descending; batch order among ties), items below the
    lowest stored log-reward are dropped, and when ``cutoff_distance >= 0`` an item is
    dropped if its vector is at p-norm distance (``p_norm_distance``, ``torch.cdist``'s
    semantics) ``<= cutoff_distance`` of a higher-ranked batch item or of any stored item;
    the survivors are added with reward eviction. Vectors: see :func:`diversity_vectors`
    (compared in float64 from float32 values; torch computes in float32, so a distance
    within rounding of the cutoff may be decided differently).

    Takes :class:`ReplayBuffer`'s arguments except ``prioritized_capacity`` (always on) and
    the remote-manager ones (torchgfn's diverse ``add`` never contacts its manager).

    Args:
        redis_or_url: as :class:`ReplayBuffer`.
        name: as :class:`ReplayBuffer`.
        capacity: as :class:`ReplayBuffer`.
        cutoff_distance: an item this close to another is dropped; negative: no
            distance test.
        p_norm_distance: the ``p`` of the p-norm (>= 0, ``inf`` allowed).
        **kwargs: :class:`ReplayBuffer`'s other arguments.

    Raises:
        ValueError: ``prioritized_capacity=False``, a ``manager``, or a
            distance that is not a number.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import NormBasedDiversePrioritizedReplayBuffer, States
        >>> buffer = NormBasedDiversePrioritizedReplayBuffer(
        ...     fakeredis.FakeRedis(), "demo", capacity=2, cutoff_distance=0.5)
        >>> _ = buffer.add(States(np.array([[0.0], [5.0]]), np.array([1.0, 2.0])))
        >>> result = buffer.add(States(np.array([[5.2], [9.0]]), np.array([3.0, 3.0])))
        >>> result.kept.tolist(), sorted(buffer.sample(2).states.ravel().tolist())
        ([1], [5.0, 9.0])
    """

    def __init__(
        self,
        redis_or_url: Any = None,
        name: str = "default",
        capacity: int | None = 1000,
        cutoff_distance: float = 0.0,
        p_norm_distance: float = 1.0,
        **kwargs: Any,
    ) -> None:
        if kwargs.pop("prioritized_capacity", True) is not True:
            raise ValueError("a diverse buffer always evicts the lowest log-rewards "
                             "(prioritized_capacity=True)")
        if kwargs.get("manager") is not None:
            raise ValueError(
                "a manager is not supported by the diverse buffer: torchgfn "
                "2.4.1's diverse add never sends to its manager; use a ReplayBuffer for that"
            )
        if isinstance(cutoff_distance, bool) or not isinstance(cutoff_distance, (int, float)) \
                or math.isnan(cutoff_distance):
            raise ValueError(f"cutoff_distance must be a number, got {cutoff_distance!r}")
        if isinstance(p_norm_distance, bool) or not isinstance(p_norm_distance, (int, float)) \
                or not p_norm_distance >= 0:
            raise ValueError(f"p_norm_distance must be >= 0 (inf allowed), got {p_norm_distance!r}")
        super().__init__(redis_or_url, name, capacity, prioritized_capacity=True, **kwargs)
        self.cutoff_distance = float(cutoff_distance)
        self.p_norm_distance = float(p_norm_distance)

    def _restore_args(
        self, blobs: list[bytes], priorities: np.ndarray, schema_json: str
    ) -> tuple[str, list[Any]]:
        """Saved records go in as they are, their vectors recomputed from the decoded
        items. A restore never exceeds the capacity, so add_diverse takes its not-full
        path (cutoff -1: no distance test) and inserts every record."""
        schema = json.loads(schema_json)
        batch = self._decode(KINDS[schema["kind"]], schema, blobs, None)
        args = self._args(blobs, priorities, diversity_vectors(batch), -1.0)
        args[0] = schema_json
        return "add_diverse", args

    def _args(
        self, blobs: list[bytes], log_rewards: np.ndarray, vectors: np.ndarray, cutoff: float
    ) -> list[Any]:
        args: list[Any] = ["", len(blobs), "", repr(cutoff), repr(self.p_norm_distance)]
        for blob, priority, row in zip(blobs, log_rewards.tolist(), vectors, strict=True):
            args += [blob, _priority_text(priority), _vector_text(row)]
        return args

    def add(self, batch: Any) -> DiverseAddResult:  # type: ignore[override]  # torchgfn's add(batch)
        """Add what the diversity rule lets through, atomically with its tests; a rejected
        batch (see :meth:`ReplayBuffer.add`) leaves the buffer unchanged.

        Args:
            batch: :class:`Trajectories`, :class:`Transitions` (all terminating) or
                :class:`States`, with log-rewards.

        Returns:
            The inserted items' ids and their positions in the batch (``kept``).

        Raises:
            SchemaError: ``batch`` is a dict, or does not fit the buffer's schema.
            InvalidBatchError: a transition is not terminating, or a state is not finite.
        """
        # vectors first: "give Trajectories, not a dict" says more than the kind mismatch
        vectors = diversity_vectors(batch)
        blobs, log_rewards, schema = self.encode(batch)
        check_add_bound(self.name, blobs)
        args = self._args(blobs, log_rewards, vectors, self.cutoff_distance)
        reply = self._insert_with(schema, "add_diverse", args)
        first, count, evicted = (int(x) for x in reply[:3])
        return DiverseAddResult(
            np.arange(first, first + count, dtype=np.int64),
            evicted,
            kept=np.array([int(x) for x in reply[3:]], dtype=np.int64),
        )

    def __repr__(self) -> str:
        return (
            f"NormBasedDiversePrioritizedReplayBuffer(name={self.name!r}, "
            f"capacity={self.capacity}, cutoff_distance={self.cutoff_distance}, "
            f"p_norm_distance={self.p_norm_distance}, sampler={self.sampler.name!r})"
        )


__all__ = ["DiverseAddResult", "NormBasedDiversePrioritizedReplayBuffer", "diversity_vectors"]
