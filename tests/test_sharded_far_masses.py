"""Sharded prioritized draws at the edges of floating point and of a shard's mass
(redisbuf/buffers/sharded_draws.py): totals that moved by more than a double's range
between the choice of shards and their commits, shards whose mass went to 0 meanwhile,
softmax masses that underflow beside each other, and the draws a global draw without
replacement commits but does not return. A second buffer object on its own connection
makes the change between this process's steps, on a real server."""

from __future__ import annotations

import warnings
from collections import Counter

import numpy as np
import pytest
import redis
from cluster_helpers import chi2, chi2_limit

from redisbuf import PERSampler, ShardedReplayBuffer
from redisbuf.errors import EmptyBufferError

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


@pytest.mark.parametrize("law", ["global", "shard_local"])
@pytest.mark.parametrize(("shard0", "shard1"), [((0.0, -800.0), (0.0, -800.0)),
                                                ((0.0, 0.0), (-800.0, -800.0))])
def test_softmax_draws_without_replacement_keep_masses_a_double_holds_as_0(
        redis_server, buffer_name, law, shard0, shard1):
    """Log-rewards 800 apart: beside an item of log-reward 0, one of -800 has mass
    e^-800, which a double holds as 0 (within a shard, or as a whole shard's total). A
    draw of 3 without replacement is torch.multinomial's: the two items of log-reward 0
    first (either order), then either item of -800 with probability 1/2 (chi-square over
    the 4 orders; the reported successive probabilities exact)."""
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=40, shards=2,
                                 seed=3, prioritized_sampling=True, batch_law=law)
    values = {}
    for k, log_rewards in enumerate((shard0, shard1)):
        buffer.shards[k].add({"v": np.array([10.0 * k, 10.0 * k + 1]),
                              "log_rewards": np.array(log_rewards)})
        values.update(zip((10 * k, 10 * k + 1), log_rewards, strict=True))
    top = sorted(v for v, r in values.items() if r == 0.0)
    low = sorted(v for v, r in values.items() if r < 0)
    orders: Counter[tuple[int, ...]] = Counter()
    draws = 200
    for _ in range(draws):
        info = buffer.sample_with_info(3, replacement=False)
        order = tuple(int(v) for v in info.batch["v"])
        assert sorted(order[:2]) == top and order[2] in low, order
        assert info.probabilities == pytest.approx([0.5, 1.0, 0.5], rel=1e-12)
        orders[order] += 1
    expected = {(*first, last): draws / 4 for first in (top, top[::-1]) for last in low}
    assert set(orders) <= set(expected)
    assert chi2(orders, expected) < chi2_limit(3), orders


def test_a_failure_while_replaying_the_sequences_records_nothing(
        redis_server, buffer_name, monkeypatch):
    """The shards' committed sequences are taken back when the replay over them fails:
    no ``sampled`` count and no use count moves."""
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=40, shards=2,
                                 seed=3, prioritized_sampling=True)
    for k in range(2):
        buffer.shards[k].add({"v": np.arange(3.0), "log_rewards": np.zeros(3)})
    client = redis.Redis.from_url(redis_server.url)

    def recorded():
        return [(client.hget(s.keys.meta, "sampled"), client.hgetall(s.keys.uses))
                for s in buffer.shards]

    before = recorded()

    def fails(*args):
        raise RuntimeError("the replay failed")

    monkeypatch.setattr(type(buffer), "_replayed", fails)
    with pytest.raises(RuntimeError, match="the replay failed"):
        buffer.sample(4, replacement=False)
    assert recorded() == before


def test_a_global_draw_without_replacement_records_only_the_items_it_returns(
        redis_server, buffer_name):
    """Every shard commits a successive draw of up to ``n`` and the replay returns ``n``
    of them: the others are taken back, so ``sampled`` moves by ``n`` a sample and each
    item's use count is how often it was returned."""
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=60, shards=3,
                                 seed=1, prioritized_sampling=True)
    for k in range(3):
        buffer.shards[k].add({"v": np.arange(10.0) + 10 * k, "log_rewards": np.zeros(10)})
    client = redis.Redis.from_url(redis_server.url)
    returned: Counter[int] = Counter()
    for _ in range(10):
        returned.update(buffer.sample_with_info(4, replacement=False).ids.tolist())
    assert sum(int(client.hget(s.keys.meta, "sampled")) for s in buffer.shards) == 40
    uses = {int(local) * 3 + k: int(count)
            for k, s in enumerate(buffer.shards)
            for local, count in client.hgetall(s.keys.uses).items()}
    assert uses == dict(returned)


def test_a_shard_emptied_before_its_sequence_commits_is_left_out(
        redis_server, buffer_name, monkeypatch):
    """Another process clears shard 1 after this process read the shards' masses for a
    global draw without replacement and before the shards commit their sequences: the
    sample is drawn again from the masses now, over shards 0 and 2 (the first item
    uniform over their 6 items, chi-square), and records only what it returns (the
    sequences committed before shard 1 failed are taken back)."""
    sampler, other = pair(redis_server.url, buffer_name, prioritized_sampling=True)
    for k in range(3):
        sampler.shards[k].add({"v": np.arange(3.0) + 10 * k, "log_rewards": np.zeros(3)})
    client = redis.Redis.from_url(redis_server.url)
    original = type(sampler)._masses_to_draw
    clearing = []

    def then_cleared(self, n):
        read = original(self, n)
        if clearing:  # once a sample, right after its first read
            other.shards[1].clear()
            clearing.clear()
        return read

    monkeypatch.setattr(type(sampler), "_masses_to_draw", then_cleared)
    firsts: Counter[float] = Counter()
    draws = 120
    for _ in range(draws):
        other.shards[1].add({"v": np.arange(3.0) + 10, "log_rewards": np.zeros(3)})
        sampled = [client.hget(s.keys.meta, "sampled") for s in sampler.shards]
        clearing.append(True)
        values = sampler.sample(3, replacement=False)["v"].tolist()
        assert not clearing  # the shard was cleared in this sample
        assert all(v // 10 in (0, 2) for v in values), values
        moved = [int(client.hget(s.keys.meta, "sampled") or 0) - int(b or 0)
                 for s, b in zip(sampler.shards, sampled, strict=True)]
        assert moved[0] + moved[2] == 3, moved
        # the clear set shard 1's count to 0: nothing was recorded there since
        assert int(client.hget(sampler.shards[1].keys.meta, "sampled")) == 0
        firsts[values[0]] += 1
    expected = {10.0 * k + i: draws / 6 for k in (0, 2) for i in range(3)}
    assert chi2(firsts, expected) < chi2_limit(5), firsts
