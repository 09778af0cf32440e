"""Reading prioritized-sampling state back in tests: what a sampler's replica
(redisbuf/sampling/replica.py) sees of a buffer, both when it follows the mass log and when it
reads the buffer afresh, which must agree."""

from __future__ import annotations

from typing import Any

import numpy as np

from redisbuf import ReplayBuffer
from redisbuf.sampling.replica import MassReplica

_followers: dict[tuple[int, str, str], MassReplica] = {}


def _buffer(client: Any, name: str) -> ReplayBuffer:
    return ReplayBuffer(client, name, capacity=None)


def fresh_replica(client: Any, name: str, rule: str) -> MassReplica:
    replica = MassReplica(rule)
    replica.load(_buffer(client, name))
    return replica


def replica_scores(replica: MassReplica) -> dict[int, float]:
    return {item: float(replica.scores[slot]) for item, slot in replica.slot_of.items()}


def replica_masses(replica: MassReplica) -> dict[int, float]:
    return {
        item: float(replica.tree.sums[slot + replica.tree.size])
        for item, slot in replica.slot_of.items()
    }


def assert_tree_sums(replica: MassReplica) -> None:
    """Every internal node of the replica's trees is the sum (min) of its children, and
    free leaves hold no mass."""
    tree = replica.tree
    size = tree.size
    left = np.arange(2, 2 * size, 2)
    np.testing.assert_allclose(tree.sums[1:size], tree.sums[left] + tree.sums[left + 1],
                               rtol=1e-12, atol=1e-300)
    assert (tree.mins[1:size] == np.minimum(tree.mins[left], tree.mins[left + 1])).all()
    unused = replica.ids < 0
    assert (tree.sums[size:][unused] == 0).all()
    assert set(replica.ids[~unused].tolist()) == set(replica.slot_of)


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
    assert_tree_sums(follower)
    assert_tree_sums(fresh)
    return replica_masses(follower)
