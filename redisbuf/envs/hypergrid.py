"""HyperGrid (Bengio et al., 2021): a ``height``^``ndim`` grid with a known reward.

A trajectory starts at the origin; each action either increments one coordinate
(action ``d`` for dimension ``d``, allowed while the coordinate is below ``height - 1``)
or terminates (action ``ndim``). The reward of the terminal cell ``x`` is::

    R(x) = R0 + R1 * prod_d [0.25 < |x_d / (height-1) - 0.5|]
              + R2 * prod_d [0.3 < |x_d / (height-1) - 0.5| < 0.4]
"""

from __future__ import annotations

import numpy as np

from ..store import _torch
from ..store.containers import Trajectories


class HyperGrid:
    def __init__(
        self, ndim: int = 2, height: int = 8, R0: float = 0.1, R1: float = 0.5, R2: float = 2.0
    ) -> None:
        if ndim < 1 or height < 2:
            raise ValueError("HyperGrid needs ndim >= 1 and height >= 2")
        self.ndim, self.height = ndim, height
        self.R0, self.R1, self.R2 = R0, R1, R2
        self.exit_action = ndim
        self.max_length = ndim * (height - 1) + 1  # every increment, then exit

    def log_reward(self, cells: np.ndarray) -> np.ndarray:
        """log R of integer cells of shape (..., ndim)."""
        scaled = np.abs(cells / (self.height - 1) - 0.5)
        ring = np.all(scaled > 0.25, axis=-1)
        band = np.all((scaled > 0.3) & (scaled < 0.4), axis=-1)
        return np.log(self.R0 + self.R1 * ring + self.R2 * band)

    def all_log_rewards(self) -> np.ndarray:
        """log R of every cell, in C order of the grid."""
        axes = np.meshgrid(*[np.arange(self.height)] * self.ndim, indexing="ij")
        return self.log_reward(np.stack(axes, axis=-1).reshape(-1, self.ndim))

    def sample_trajectories(
        self, n: int, rng: np.random.Generator, exit_probability: float | None = None,
        *, tensors: bool = True,
    ) -> Trajectories:
        """``n`` trajectories of a random policy: exit with ``exit_probability`` (default
        ``1 / (ndim + 1)``), else increment a uniformly chosen coordinate that can still
        grow. States are padded with -1 (the sink state), actions with -1. Their arrays
        are torch tensors, as torchgfn's (``tensors=False``: numpy arrays, without
        torch)."""
        p_exit = 1.0 / (self.ndim + 1) if exit_probability is None else exit_probability
        horizon = self.max_length
        states = np.full((horizon + 1, n, self.ndim), -1, dtype=np.int64)
        actions = np.full((horizon, n), -1, dtype=np.int64)
        log_probs = np.zeros((horizon, n), dtype=np.float32)
        lengths = np.zeros(n, dtype=np.int64)
        position = np.zeros((n, self.ndim), dtype=np.int64)
        states[0] = position
        alive = np.ones(n, dtype=bool)
        for t in range(horizon):
            if not alive.any():
                break
            can_grow = position < self.height - 1
            n_grow = can_grow.sum(axis=1)
            exits = alive & ((rng.random(n) < p_exit) | (n_grow == 0))
            grows = alive & ~exits
            choice_scores = rng.random((n, self.ndim)) * can_grow
            dims = choice_scores.argmax(axis=1)
            prob = np.where(
                n_grow == 0, 1.0, np.where(exits, p_exit, (1 - p_exit) / np.maximum(n_grow, 1))
            )
            actions[t, exits] = self.exit_action
            actions[t, grows] = dims[grows]
            log_probs[t, alive] = np.log(prob[alive])
            position[grows, dims[grows]] += 1
            states[t + 1, grows] = position[grows]
            lengths[exits] = t + 1
            alive &= ~exits
        terminal = states[lengths - 1, np.arange(n)]
        arrays = [states, actions, lengths, self.log_reward(terminal), log_probs]
        if tensors:
            torch = _torch.require()
            arrays = [torch.from_numpy(a) for a in arrays]
        return Trajectories(
            states=arrays[0],
            actions=arrays[1],
            terminating_idx=arrays[2],
            log_rewards=arrays[3],
            log_probs=arrays[4],
            states_pad_value=-1.0,
            actions_pad_value=-1.0,
        )
