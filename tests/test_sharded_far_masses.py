"""Sharded prioritized draws at the edges of floating point and of a shard's mass
(redisbuf/buffers/sharded_draws.py): totals that moved by more than a double's range
between the choice of shards and their commits, shards whose mass went to 0 meanwhile,
softmax masses that underflow beside each other, and the draws a global draw without
replacement commits but does not return. A second buffer object on its own connection
makes the change between this process's steps, on a real server."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from redisbuf import ShardedReplayBuffer

pytestmark = pytest.mark.redis_server


def pair(url: str, name: str, **options) -> tuple[ShardedReplayBuffer, ShardedReplayBuffer]:
    """Two objects of one sharded buffer, each on its own connection: the sampler and the
    other process."""
    return (ShardedReplayBuffer(url, name, capacity=60, shards=3, seed=1, **options),
            ShardedReplayBuffer(url, name, capacity=60, shards=3, seed=2, **options))


@pytest.mark.parametrize("law", ["global", "shard_local"])
def test_a_total_that_grew_past_a_doubles_range_moves_every_draw_to_its_shard(
        redis_server, buffer_name, law):
    """Another process adds an item of log-reward 720 after this process's replicas were
    current: its shard's total grew by a factor of about e^718 (exp overflows), so at the
    commits that shard holds all but e^-716 of the mass and every draw that stands is from
    it; no overflow warning, every reported probability finite."""
    sampler, other = pair(redis_server.url, buffer_name, prioritized_sampling=True,
                          batch_law=law)
    for i in range(3):
        sampler.add({"v": np.arange(4.0) + 10 * i, "log_rewards": np.zeros(4)})
    sampler.sample_with_info(5, replacement=True)  # every shard's replica current
    new = int(other.add({"v": np.array([99.0]), "log_rewards": np.array([720.0])}).ids[0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow or a NaN would warn
        info = sampler.sample_with_info(200, replacement=True)
    assert np.isfinite(info.probabilities).all()
    assert (info.ids % 3 == new % 3).all(), np.bincount(info.ids % 3, minlength=3)


@pytest.mark.parametrize("law", ["global", "shard_local"])
def test_a_shard_whose_mass_went_to_0_since_the_replicas_is_not_drawn(
        redis_server, buffer_name, law):
    """Another process sets every PER priority of one shard to 0 after this process's
    replicas saw them at 1: that shard's commit finds no mass. The sample draws from the
    other shards by their masses at the commits (uniform over their 8 items, chi-square;
    the probabilities exact) and raises nothing; only a buffer with no mass left raises
    EmptyBufferError."""
    from cluster_helpers import chi2, chi2_limit

    from redisbuf import PERSampler
    from redisbuf.errors import EmptyBufferError

    sampler, other = pair(redis_server.url, buffer_name, batch_law=law,
                          sampler=PERSampler(alpha=1.0, eps=0.0))
    ids = [sampler.add({"v": np.arange(4.0) + 10 * i}).ids for i in range(3)]
    assert sorted(int(b[0]) % 3 for b in ids) == [0, 1, 2]  # one batch in each shard
    emptied = ids[1]
    seen: dict[int, int] = {}
    for _ in range(30):
        other.update_priority(emptied, np.ones(4))
        sampler.sample_with_info(8)  # the replicas hold the emptied shard's mass
        other.update_priority(emptied, np.zeros(4))
        info = sampler.sample_with_info(8)
        assert not np.isin(info.ids, emptied).any()
        assert np.allclose(info.probabilities, 1 / 8)
        for i in info.ids.tolist():
            seen[i] = seen.get(i, 0) + 1
    rest = [int(i) for b in (ids[0], ids[2]) for i in b]
    assert set(seen) <= set(rest)
    assert chi2(seen, dict.fromkeys(rest, 30.0)) < chi2_limit(7), seen
    for batch in (ids[0], ids[2]):
        other.update_priority(batch, np.zeros(4))
    with pytest.raises(EmptyBufferError):
        sampler.sample_with_info(8)
