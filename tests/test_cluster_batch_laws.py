"""The batch laws of a sharded buffer (redisbuf/buffers/sharded_draws.py), on fakeredis and
on a real 3-master cluster: ``batch_law="shard_local"`` draws each batch from one shard
chosen by its mass, and every single draw follows the global law (chi-square: the shard
choice against the shards' masses, then the items within each shard against the shard's
own law, which together give every item its global probability); the global law's
uniform draws from the sizes the shards last reported; PER importance weights over the
whole buffer in both laws (exact)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter
from typing import Any

import numpy as np
import pytest
from cluster_helpers import (
    LOG_REWARDS,
    check_prioritized_pairs,
    check_uniform_subsets,
    chi2,
    chi2_limit,
    filled,
    items,
)

from redisbuf import PERSampler, ShardedReplayBuffer
from redisbuf.errors import EmptyBufferError, WaitTimeoutError
from redisbuf.sampling import commits


@pytest.fixture(params=["fake", pytest.param("cluster", marks=pytest.mark.redis_server)])
def where(request: pytest.FixtureRequest) -> Any:
    """A fakeredis client, or a client of the real 3-master cluster."""
    return request.getfixturevalue("fake_client" if request.param == "fake" else "cluster_client")


def uneven(client: Any, name: str, **options: Any) -> tuple[Any, list[int]]:
    """A shard-local buffer of capacity 15 (5 per shard) holding 5, 4 and 2 items (v = 0..10,
    the shard of item v is ``v``'s batch's), over half full: its uniform batches are made by
    the rejection path (a shard chosen uniformly, kept with probability size / 5). The
    buffer and the items' global ids."""
    buffer = ShardedReplayBuffer(client, name, capacity=15, shards=3, seed=11,
                          batch_law="shard_local", **options)
    start, ids = 0, []
    for size in (5, 4, 2):
        ids += buffer.add(items(np.arange(start, start + size))).ids.tolist()
        start += size
    assert sorted(shard_sizes(buffer).values()) == [2, 4, 5]
    return buffer, ids


def shard_sizes(buffer: Any) -> dict[int, int]:
    return {k: len(shard) for k, shard in enumerate(buffer.shards)}


def check_one_shard_law(
    batches: list[np.ndarray], shard_mass: dict[int, float], item_mass: dict[int, float],
    count: int,
) -> None:
    """Every batch's global ids share one shard; the shards were chosen in proportion to
    ``shard_mass``, and within each shard the draws follow ``item_mass`` (global id ->
    mass) restricted to it: P(item) = P(shard) P(item | shard) = the global law."""
    chosen: Counter[int] = Counter()
    within: dict[int, Counter[int]] = {k: Counter() for k in shard_mass}
    for ids in batches:
        shards = set((ids % count).tolist())
        assert len(shards) == 1, ids
        k = shards.pop()
        chosen[k] += 1
        within[k].update(ids.tolist())
    total = sum(shard_mass.values())
    expected = {k: len(batches) * m / total for k, m in shard_mass.items()}
    assert chi2(chosen, expected) < chi2_limit(len(shard_mass) - 1)
    statistic, df = 0.0, 0
    for k, seen in within.items():
        mine = {i: m for i, m in item_mass.items() if i % count == k}
        draws, mass = sum(seen.values()), sum(mine.values())
        if len(mine) > 1 and draws:
            statistic += chi2(seen, {i: draws * m / mass for i, m in mine.items()})
            df += len(mine) - 1
    assert statistic < chi2_limit(df)


def test_a_batch_law_other_than_the_two_is_refused(fake_client, buffer_name):
    with pytest.raises(ValueError, match="batch_law must be one of 'global', 'shard_local'"):
        ShardedReplayBuffer(fake_client, buffer_name, capacity=30, shards=3, batch_law="local")
    assert fake_client.keys("*") == []


def test_shard_local_uniform_draws_with_replacement(where, buffer_name):
    buffer, ids = uneven(where, buffer_name)
    asked = 0
    sizes = buffer._sizes

    def counted() -> Any:
        nonlocal asked
        asked += 1
        return sizes()

    buffer._sizes = counted
    batches = [buffer.sample_with_info(3, replacement=True).ids for _ in range(600)]
    # the rejection path made them: every shard's size was asked only at the first draw
    # and after 4 refused tries in a row (probability (4/15)^4 each)
    assert asked < 30
    check_one_shard_law(batches, {k: float(s) for k, s in shard_sizes(buffer).items()},
                        dict.fromkeys(ids, 1.0), 3)
    # refused tries were taken back: the counters hold exactly the draws returned
    assert buffer.stats()["sampled"] == 600 * 3
    uses = sum(int(v) for s in buffer.shards for v in where.hgetall(s.keys.uses).values())
    assert uses == 600 * 3


def test_shard_local_uniform_draws_without_replacement(where, buffer_name):
    """Distinct items from one shard: every pair of a shard equally likely given the
    shard, the shard chosen by its size, so every item's chance to be in a batch is
    n / len, as in the global law."""
    buffer, _ = uneven(where, buffer_name)
    sizes = shard_sizes(buffer)
    chosen: Counter[int] = Counter()
    pairs: dict[int, Counter[Any]] = {k: Counter() for k in sizes}
    firsts: Counter[int] = Counter()
    values = {}
    for _ in range(600):
        info = buffer.sample_with_info(2)
        ids = info.ids.tolist()
        assert len(set(ids)) == 2 and len({i % 3 for i in ids}) == 1
        k = ids[0] % 3
        chosen[k] += 1
        pairs[k][tuple(sorted(ids))] += 1
        firsts[ids[0]] += 1
        values.update(zip(ids, info.batch["v"].tolist(), strict=True))
    total = sum(sizes.values())
    assert chi2(chosen, {k: 600 * s / total for k, s in sizes.items()}) < chi2_limit(2)
    statistic, df = 0.0, 0
    for k, seen in pairs.items():
        ids = sorted({i for pair in seen for i in pair})
        assert len(ids) == sizes[k]
        cells = list(itertools.combinations(ids, 2))
        statistic += chi2(seen, dict.fromkeys(cells, chosen[k] / len(cells)))
        df += len(cells) - 1
    assert statistic < chi2_limit(df)
    # the first draw of a batch is uniform over the whole buffer
    assert chi2(firsts, dict.fromkeys(values, 600 / total)) < chi2_limit(total - 1)


def test_shard_local_batches_larger_than_a_shard_keep_the_marginal_law(where, buffer_name):
    """n = 3 without replacement, one shard holding 2 items: a batch from it is drawn with
    replacement there (as a buffer of 2 items draws 3); each position of every batch is
    still uniform over the whole buffer."""
    buffer, _ = uneven(where, buffer_name)
    positions: list[Counter[int]] = [Counter(), Counter(), Counter()]
    for _ in range(500):
        values = buffer.sample(3)["v"].tolist()
        if len(set(values)) < 3:
            assert set(values) <= {9, 10}  # only the shard of 2 items repeats
        for counter, value in zip(positions, values, strict=True):
            counter[value] += 1
    for counter in positions:
        assert chi2(counter, dict.fromkeys(range(11), 500 / 11)) < chi2_limit(10)


def test_shard_local_below_half_full_asks_the_sizes(where, buffer_name):
    """Below half full the shard is chosen from every shard's size, asked each time."""
    buffer = filled(where, buffer_name, prioritized=False)
    buffer.batch_law = "shard_local"
    batches = [buffer.sample_with_info(4, replacement=True).ids for _ in range(300)]
    assert buffer._fill.mean() < 0.5
    seen = {int(i) for ids in batches for i in ids}
    assert len(seen) == 6
    check_one_shard_law(batches, {k: float(s) for k, s in shard_sizes(buffer).items()},
                        dict.fromkeys(seen, 1.0), 3)


def test_shard_local_prioritized_draws_with_replacement(where, buffer_name):
    """Softmax: a shard by its mass, the draws within it by their softmax; each draw's
    reported probability is its mass over the whole buffer's."""
    buffer = filled(where, buffer_name, prioritized=True)
    buffer.batch_law = "shard_local"
    p = np.exp(LOG_REWARDS) / np.exp(LOG_REWARDS).sum()
    batches, mass_of = [], {}
    for _ in range(400):
        info = buffer.sample_with_info(4, replacement=True)
        values = info.batch["v"]
        np.testing.assert_allclose(info.probabilities, p[values], rtol=1e-9)
        batches.append(info.ids)
        mass_of.update(zip(info.ids.tolist(), p[values].tolist(), strict=True))
    assert len(mass_of) == 6
    shard_mass = {k: sum(m for i, m in mass_of.items() if i % 3 == k) for k in range(3)}
    check_one_shard_law(batches, shard_mass, mass_of, 3)


def test_shard_local_prioritized_draws_without_replacement(where, buffer_name):
    """The first item of a batch has the global law; the later ones are the shard's
    successive draws, reported as the shard's share times the shard's probability. A
    shard of nonzero mass with fewer drawable items than n makes that batch a global one
    (successive softmax draws over every shard, exactly)."""
    buffer = filled(where, buffer_name, prioritized=True)
    buffer.batch_law = "shard_local"
    p = np.exp(LOG_REWARDS) / np.exp(LOG_REWARDS).sum()
    firsts: Counter[int] = Counter()
    for _ in range(300):
        info = buffer.sample_with_info(1)
        firsts[int(info.batch["v"][0])] += 1
        np.testing.assert_allclose(info.probabilities, p[info.batch["v"]], rtol=1e-9)
    assert chi2(firsts, {v: 300 * p[v] for v in range(6)}) < chi2_limit(5)
    check_prioritized_pairs(buffer, 300)  # n = 3 > the smallest shard: global batches
    # shards of 2, 2 and 2 items: n = 2 stays in one shard
    two = ShardedReplayBuffer(where, buffer_name + "-2", capacity=30, shards=3, seed=3,
                       prioritized_sampling=True, batch_law="shard_local")
    for start in (0, 2, 4):
        two.add(items([start, start + 1], LOG_REWARDS[[start, start + 1]]))
    shard_of = {v: k for k, shard in enumerate(two.shards)
                for v in shard.sample(2)["v"].tolist()}
    for _ in range(50):
        info = two.sample_with_info(2)
        a, b = info.batch["v"].tolist()
        assert shard_of[a] == shard_of[b] and a != b
        share = p[a] + p[b]
        np.testing.assert_allclose(info.probabilities, [p[a], share * p[b] / (share - p[a])],
                                   rtol=1e-9)


def per_buffer(client: Any, name: str, law: str) -> tuple[Any, dict[int, float]]:
    """A 3-shard PER buffer (alpha 0.7, eps 0.05) of 24 items with known priorities, one
    of them zero; the priorities by global id."""
    buffer = ShardedReplayBuffer(client, name, capacity=60, shards=3, seed=5, batch_law=law,
                          sampler=PERSampler(alpha=0.7, eps=0.05))
    rng = np.random.default_rng(1)
    priorities: dict[int, float] = {}
    for _ in range(4):
        values = rng.uniform(0, 4, 6)
        result = buffer.add({"x": np.arange(6)}, priorities=values)
        priorities.update(zip(result.ids.tolist(), values.tolist(), strict=True))
    zero = min(priorities)
    priorities[zero] = 0.0
    buffer.update_priority([zero], [0.0])
    return buffer, priorities


def check_per_weights(info: Any, priorities: dict[int, float], beta: float) -> None:
    """PER weights over the whole buffer: probability mass / total mass, weights
    (lowest mass / mass)^beta, importance weights priority / mean non-zero priority."""
    ids = sorted(priorities)
    mass = {i: (priorities[i] + 0.05) ** 0.7 for i in ids}
    total, lowest = sum(mass.values()), min(mass.values())
    drawn = info.ids.tolist()
    np.testing.assert_allclose(info.probabilities, [mass[i] / total for i in drawn], rtol=1e-9)
    np.testing.assert_allclose(info.weights, [(lowest / mass[i]) ** beta for i in drawn],
                               rtol=1e-9)
    nonzero = [v for v in priorities.values() if v > 0]
    mean = sum(nonzero) / len(nonzero)
    np.testing.assert_allclose(info.importance_weights, [priorities[i] / mean for i in drawn],
                               rtol=1e-9)


def test_shard_local_per_draws_follow_the_global_law(where, buffer_name):
    buffer, priorities = per_buffer(where, buffer_name, "shard_local")
    mass = {i: (p + 0.05) ** 0.7 for i, p in priorities.items()}
    batches = []
    for _ in range(300):
        info = buffer.sample_with_info(20)
        check_per_weights(info, priorities, 0.4)  # one shard drawn, weights still global
        batches.append(info.ids)
    shard_mass = {k: sum(m for i, m in mass.items() if i % 3 == k) for k in range(3)}
    check_one_shard_law(batches, shard_mass, mass, 3)


def test_global_per_importance_weights_are_over_the_whole_buffer(where, buffer_name):
    """A global PER draw of one item commits on one shard; its importance weight still
    divides by the whole buffer's mean non-zero priority."""
    buffer, priorities = per_buffer(where, buffer_name, "global")
    for _ in range(20):
        check_per_weights(buffer.sample_with_info(1), priorities, 0.4)
    check_per_weights(buffer.sample_with_info(50), priorities, 0.4)


def test_a_failed_shard_local_per_draw_records_nothing(where, buffer_name, monkeypatch):
    buffer, _ = per_buffer(where, buffer_name, "shard_local")
    buffer.sample(4)
    before = [(where.hget(s.keys.meta, "sampled"), where.hgetall(s.keys.uses))
              for s in buffer.shards]

    def fails(*args: Any, **kwargs: Any) -> Any:
        raise EmptyBufferError("emptied between the shard choice and its commit")

    monkeypatch.setattr(commits, "replica_draw", fails)
    with pytest.raises(EmptyBufferError, match="emptied"):
        buffer.sample(4)
    assert [(where.hget(s.keys.meta, "sampled"), where.hgetall(s.keys.uses))
            for s in buffer.shards] == before


@pytest.mark.parametrize("per", [False, True])
def test_shard_local_blocking_draws_wait_for_items(where, buffer_name, per):
    buffer = ShardedReplayBuffer(where, buffer_name, capacity=30, shards=3, batch_law="shard_local",
                          sampler=PERSampler() if per else None)
    started = time.monotonic()
    with pytest.raises(WaitTimeoutError, match="waited 0.2 s"):
        buffer.sample(2, block=True, timeout=0.2)
    assert time.monotonic() - started >= 0.2
    adder = threading.Timer(0.1, lambda: buffer.add(items([7, 8, 9])))
    adder.start()
    try:
        info = buffer.sample_with_info(2, block=True, timeout=10)
    finally:
        adder.join()
    assert len({i % 3 for i in info.ids.tolist()}) == 1
    assert set(info.batch["v"].tolist()) <= {7, 8, 9}


def test_global_uniform_draws_taken_back_when_the_sizes_moved(where, buffer_name):
    """The global law draws from the sizes the shards last reported and takes the draw
    back when they moved: with adds between draws, the buffer records exactly the draws
    it returned, and the subsets stay uniform."""
    buffer = ShardedReplayBuffer(where, buffer_name, capacity=300, shards=3, seed=2)
    returned = 0
    for step in range(60):
        buffer.add(items(np.arange(step * 3, step * 3 + 3)))
        ids = buffer.sample_with_info(2).ids
        assert len(set(ids.tolist())) == 2
        returned += 2
    assert buffer.stats()["sampled"] == returned
    check_uniform_subsets(filled(where, buffer_name + "-f", prioritized=False), 300)


def test_global_uniform_draws_from_sizes_that_moved_are_made_again(where, buffer_name):
    """Sizes the shards reported earlier (here 1, 1, 1) that no longer hold (10, 1, 1):
    the draw made from them is taken back and made again from the sizes asked now, so
    each item keeps probability 1 / 12."""
    buffer = ShardedReplayBuffer(where, buffer_name, capacity=300, shards=3, seed=4)
    ids = []
    for batch in ([0], [1], [2], list(range(3, 12))):
        ids += buffer.add(items(batch)).ids.tolist()
    assert sorted(shard_sizes(buffer).values()) == [1, 1, 10]
    seen: Counter[int] = Counter()
    for _ in range(360):
        buffer._known = (np.ones(3, dtype=np.int64), 0, 0)  # stale, as after other adds
        seen.update(buffer.sample_with_info(1).ids.tolist())
    assert chi2(seen, dict.fromkeys(ids, 30.0)) < chi2_limit(11)
    assert buffer.stats()["sampled"] == 360


def test_a_cleared_shard_local_buffer_is_empty_and_fills_again(where, buffer_name):
    buffer, _ = uneven(where, buffer_name)
    buffer.sample(2)
    buffer.clear()
    with pytest.raises(EmptyBufferError, match="empty"):
        buffer.sample(2)
    assert buffer._fill.mean() < 0.5  # the sizes are asked again
    buffer.add(items([20, 21]))
    assert sorted(buffer.sample(2)["v"].tolist()) == [20, 21]


def test_a_shard_local_per_draw_catches_up_only_the_shards_it_did_not_draw_from(
    where, buffer_name, monkeypatch
):
    """The drawn shard's commit brought its replica up to date; the other two are asked
    for their masses once the commit is made (lua/masslog_read.lua), and nothing else is."""
    from redisbuf.buffers.replay import ReplayBuffer
    from redisbuf.store import scripts

    buffer, priorities = per_buffer(where, buffer_name, "shard_local")
    buffer.sample(4)  # every replica read once
    asked: list[str] = []
    queue, run = scripts.queue, ReplayBuffer._run

    def queued(pipe: Any, client: Any, script: Any, keys: list[str], args: list[Any]) -> None:
        if script is scripts.load("masslog_read"):
            asked.append(keys[0])
        queue(pipe, client, script, keys, args)

    def ran(self: Any, script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        if script == "masslog_read":
            asked.append(keys[0])
        return run(self, script, keys, args, read)

    monkeypatch.setattr(scripts, "queue", queued)
    monkeypatch.setattr(ReplayBuffer, "_run", ran)
    for _ in range(6):
        asked.clear()
        info = buffer.sample_with_info(4)
        check_per_weights(info, priorities, 0.4)
        (drawn,) = set((info.ids % 3).tolist())
        assert sorted(asked) == sorted(shard.keys.meta for k, shard in enumerate(buffer.shards)
                                       if k != drawn)
