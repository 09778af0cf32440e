"""TerminatingStateBuffer: keeps only the terminating states (with log-rewards and
conditions) of the trajectories or transitions it is given, as torchgfn's buffer of the
same name does."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import InvalidBatchError, SchemaError
from ..store import _torch
from ..store.containers import Array, States, Trajectories, Transitions
from .insert import AddResult
from .replay import ReplayBuffer


def _rows(array: Array | None, mask: Array) -> Array | None:
    if array is None:
        return None
    if _torch.is_tensor(array):
        torch = _torch.require()
        return array[torch.as_tensor(mask, dtype=torch.bool, device=array.device)]
    return np.asarray(array)[np.asarray(mask, dtype=bool)]


def terminating_states_of(batch: Any) -> States:
    """The terminating states of ``batch`` as :class:`States`, with their log-rewards and
    conditions: ``states[L-1, b]`` of each trajectory (``L = terminating_idx[b] >= 1``),
    ``states`` of each terminating transition, or ``batch`` itself for States."""
    if isinstance(batch, States):
        return batch
    if isinstance(batch, Trajectories):
        lengths = np.asarray(
            batch.terminating_idx.cpu() if _torch.is_tensor(batch.terminating_idx)
            else batch.terminating_idx
        ).reshape(-1)
        if len(lengths) and lengths.min() < 1:
            bad = np.flatnonzero(lengths < 1)[:5].tolist()
            raise InvalidBatchError(
                f"trajectories {bad} took no action (terminating_idx 0): they have no "
                "terminating state"
            )
        return States(batch.terminating_states, batch.log_rewards, batch.conditions)
    if isinstance(batch, Transitions):
        mask = batch.is_terminating
        return States(
            batch.terminating_states, _rows(batch.log_rewards, mask), _rows(batch.conditions, mask)
        )
    raise SchemaError(
        f"a terminating-state buffer takes Trajectories, Transitions or States, not "
        f"{type(batch).__name__}"
    )


class TerminatingStateBuffer(ReplayBuffer):
    """A :class:`ReplayBuffer` of :class:`States` fed with trajectories, transitions or
    states: ``add`` keeps the terminating states of its batch (see
    :func:`terminating_states_of`), with their log-rewards and conditions, under the same
    capacity, eviction and sampling rules; ``sample`` returns :class:`States`. Takes every
    argument of :class:`ReplayBuffer` (``kind`` is always ``"states"``).

    Args:
        *args: :class:`ReplayBuffer`'s positional arguments.
        **kwargs: :class:`ReplayBuffer`'s keyword arguments.

    Raises:
        ValueError: a ``kind`` other than ``"states"``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import TerminatingStateBuffer, Transitions
        >>> buffer = TerminatingStateBuffer(fakeredis.FakeRedis(), "demo")
        >>> batch = Transitions(
        ...     states=np.array([[0.0], [1.0], [2.0]]),
        ...     next_states=np.array([[1.0], [2.0], [-1.0]]),
        ...     actions=np.array([0, 0, 1]), is_terminating=np.array([False, False, True]),
        ...     log_rewards=np.array([0.0, 0.0, 1.5]))
        >>> buffer.add(batch).ids.tolist()
        [1]
        >>> buffer.sample(1)
        States(states=array([[2.]]), log_rewards=array([1.5]), conditions=None)
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kind = kwargs.pop("kind", "states")
        if kind != "states":
            raise ValueError(f"a TerminatingStateBuffer holds states, not {kind!r}")
        super().__init__(*args, kind="states", **kwargs)

    def add(self, batch: Any) -> AddResult:  # type: ignore[override]  # torchgfn's add(batch)
        """Add the terminating states of ``batch``. Transitions without a terminating
        one add nothing (an empty result), as in torchgfn.

        Args:
            batch: :class:`Trajectories`, :class:`Transitions` or :class:`States`.

        Returns:
            The stored states' ids and the number evicted.

        Raises:
            SchemaError: ``batch`` is not one of those containers.
        """
        states = terminating_states_of(batch)
        if len(states) == 0 and not isinstance(batch, States):
            return AddResult(np.zeros(0, dtype=np.int64), 0)
        return super().add(states)


__all__ = ["TerminatingStateBuffer", "terminating_states_of"]
