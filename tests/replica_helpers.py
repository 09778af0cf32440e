"""Reading prioritized-sampling state back in tests: what a sampler's replica
(redisbuf/sampling/replica.py) sees of a buffer, both when it follows the mass log and when it
reads the buffer afresh, which must agree."""

from __future__ import annotations

from typing import Any

import numpy as np

from redisbuf import ReplayBuffer
from redisbuf.sampling.base import BufferView
from redisbuf.sampling.replica import MassReplica

_followers: dict[tuple[int, str, str], MassReplica] = {}


def _buffer(client: Any, name: str) -> BufferView:
    return ReplayBuffer(client, name, capacity=None).view


def fresh_replica(client: Any, name: str, rule: str) -> MassReplica:
    """A replica that reads the buffer itself (a scan), not a snapshot of it; under PER,
    where the snapshot and the log after it are the priorities, a new replica's read
    (the snapshot, else the epoch's base, and the log)."""
    replica = MassReplica(rule)
    if rule != "per":
        replica._load_snapshot = lambda buffer, holder=None: False  # type: ignore[method-assign]
    replica.load(_buffer(client, name))
    return replica


def _held(replica: MassReplica) -> np.ndarray:
    return np.flatnonzero(~np.isnan(replica.scores[: replica.count]))


def replica_scores(replica: MassReplica) -> dict[int, float]:
    slots = _held(replica)
    return dict(zip(replica.ids[slots].tolist(), replica.scores[slots].tolist(), strict=True))


def replica_masses(replica: MassReplica) -> dict[int, float]:
    slots = _held(replica)
    return dict(zip(replica.ids[slots].tolist(), replica.masses[slots].tolist(), strict=True))


def assert_tree_sums(replica: MassReplica) -> None:
    """Every block's and group's sum (and smallest non-zero mass) is that of its slots, holes and
    unused slots hold no mass, and the ids in use are in ascending order."""
    blocks = replica.masses.reshape(-1, 32)
    np.testing.assert_allclose(replica.block_sums, blocks.sum(axis=1), rtol=1e-12,
                               atol=1e-300)
    assert (replica.block_mins == np.where(blocks > 0, blocks, np.inf).min(axis=1)).all()
    np.testing.assert_allclose(replica.group_sums, replica.block_sums.reshape(-1, 32).sum(1),
                               rtol=1e-12, atol=1e-300)
    assert (replica.group_mins == replica.block_mins.reshape(-1, 32).min(axis=1)).all()
    holes = np.isnan(replica.scores)
    assert (replica.masses[holes] == 0).all()
    assert (np.diff(replica.ids[: replica.count]) > 0).all()
    assert len(replica) == len(_held(replica))


def followed_replica(client: Any, name: str, rule: str) -> MassReplica:
    """The replica :func:`followed_masses` keeps for buffer ``name`` (as of its last call)."""
    return _followers[(id(client), name, rule)]


def followed_masses(client: Any, name: str, rule: str) -> dict[int, float]:
    """Item id -> mass as seen by a replica that has followed buffer ``name``'s mass log
    since the first call for it (made then by reading the buffer), after checking that
    it holds exactly the scores a replica reading the buffer now gets."""
    key = (id(client), name, rule)
    follower = _followers.get(key)
    if follower is None:
        follower = _followers[key] = fresh_replica(client, name, rule)
    else:
        follower.sync(_buffer(client, name))
    fresh = fresh_replica(client, name, rule)
    assert replica_scores(follower) == replica_scores(fresh)
    assert follower.positive == fresh.positive and follower.infinite == fresh.infinite
    assert follower.nonzero == fresh.nonzero
    assert_tree_sums(follower)
    assert_tree_sums(fresh)
    return replica_masses(follower)


def stored_priorities(client: Any, name: str) -> dict[int, float]:
    """Item id -> its PER priority as the server reads it now (lua/priority_read.lua, from
    the mass log and the snapshot behind it), for every item stored."""
    buffer = ReplayBuffer(client, name, capacity=None)
    ids = [int(m) for m in client.zrange(buffer.keys.order, 0, -1)]
    return dict(zip(ids, buffer.priorities(ids).tolist(), strict=True))
