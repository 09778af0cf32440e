"""Prioritized sampling without replacement (torchgfn's default when n <= len): the
distribution of drawn sequences matches torch.multinomial(softmax, n, replacement=False),
checked by chi-square on a small buffer, on fakeredis and on a real server."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from test_bad_input import snapshot
from test_sampling import assert_tree_consistent, chi2, chi2_limit, priorities, softmax

from redisbuf import BufferKeys, PrioritizedSampler, ReplayBuffer
from redisbuf.errors import SamplingError
from redisbuf.sampling.replica import replica_of

REWARDS = [0.0, 1.0, -0.5, 1.6, 0.3, -math.inf]  # ids 1..6; id 6 is never drawn


def _items(rewards, start: int = 0) -> dict:
    rewards = np.asarray(rewards, dtype=np.float64)
    return {"v": np.arange(start, start + len(rewards)), "log_rewards": rewards}


def _sequence_probabilities(p: dict[int, float], n: int) -> dict[tuple[int, ...], float]:
    """Probability of each ordered sequence of n distinct ids under successive draws."""
    support = [i for i, q in p.items() if q > 0]
    out = {}
    for sequence in itertools.permutations(support, n):
        probability, left = 1.0, 1.0
        for i in sequence:
            probability *= p[i] / left
            left -= p[i]
        out[sequence] = probability
    return out


def _without_stats(
    probs: dict[tuple[int, ...], float], counts: dict, trials: int
) -> tuple[float, int]:
    """(chi-square, degrees of freedom), cells expecting fewer than 5 pooled into one."""
    keys = sorted(probs)
    observed = np.array([counts.get(k, 0) for k in keys], dtype=float)
    assert sum(counts.values()) == observed.sum(), "drew a sequence of probability 0"
    expected = np.array([probs[k] for k in keys]) * trials
    small = expected < 5
    if small.any():
        observed = np.append(observed[~small], observed[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    return chi2(observed, expected), len(expected) - 1


def _drawn_sequences(
    buffer: ReplayBuffer, p: dict[int, float], n: int, trials: int
) -> dict[tuple[int, ...], int]:
    """How often each sequence of ids came out of ``trials`` draws of ``n``, checking that
    each draw's reported probability is conditional on the draws before it."""
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(trials):
        info = buffer.sample_with_info(n)
        sequence = tuple(info.ids.tolist())
        counts[sequence] = counts.get(sequence, 0) + 1
        left = 1.0
        for item_id, probability in zip(sequence, info.probabilities.tolist(), strict=True):
            assert probability == pytest.approx(p[item_id] / left, rel=1e-9)
            left -= p[item_id]
    return counts


def _assert_fits(probs: dict[tuple[int, ...], float], counts: dict, trials: int) -> None:
    statistic, df = _without_stats(probs, counts, trials)
    assert statistic < chi2_limit(df), (statistic, df)


def _prioritized(client, name: str, seed: int) -> ReplayBuffer:
    buffer = ReplayBuffer(client, name, capacity=10, prioritized_sampling=True, seed=seed)
    buffer.add(_items(REWARDS))
    return buffer


@pytest.mark.parametrize("n", [2, 3])
def test_drawn_sequences_follow_torch_multinomial(client, buffer_name, n):
    buffer = _prioritized(client, buffer_name, seed=11 + n)
    p = softmax(priorities(client, buffer_name))
    probs = _sequence_probabilities(p, n)
    trials = 3000
    ours = _drawn_sequences(buffer, p, n, trials)
    # torch's draws, from the same softmax (ids are positions + 1)
    generator = torch.Generator().manual_seed(n)
    weights = torch.softmax(torch.tensor(REWARDS, dtype=torch.float64), 0)
    theirs: dict[tuple[int, ...], int] = {}
    for _ in range(trials):
        drawn = torch.multinomial(weights, n, replacement=False, generator=generator)
        sequence = tuple((drawn + 1).tolist())
        theirs[sequence] = theirs.get(sequence, 0) + 1
    # both against the exact law of successive draws...
    _assert_fits(probs, ours, trials)
    _assert_fits(probs, theirs, trials)
    # ...and against each other (two-sample chi-square over sequences either one drew)
    keys = sorted(set(ours) | set(theirs))
    a = np.array([ours.get(k, 0) for k in keys], dtype=float)
    b = np.array([theirs.get(k, 0) for k in keys], dtype=float)
    sparse = a + b < 10  # pooled, as for the one-sample tests
    if sparse.any():
        a = np.append(a[~sparse], a[sparse].sum())
        b = np.append(b[~sparse], b[sparse].sum())
    assert float(((a - b) ** 2 / (a + b)).sum()) < chi2_limit(len(a) - 1)
    # the unordered subsets agree too
    subsets = {}
    for sequence, probability in probs.items():
        key = tuple(sorted(sequence))
        subsets[key] = subsets.get(key, 0.0) + probability
    ours_subsets: dict[tuple[int, ...], int] = {}
    for sequence, count in ours.items():
        key = tuple(sorted(sequence))
        ours_subsets[key] = ours_subsets.get(key, 0) + count
    _assert_fits(subsets, ours_subsets, trials)


def test_without_replacement_is_the_default_and_writes_nothing_back(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=1000, prioritized_sampling=True, seed=4)
    rng = np.random.default_rng(0)
    buffer.add(_items(rng.normal(scale=3.0, size=900)))
    keys = BufferKeys(buffer_name)
    before = snapshot(client, buffer_name)
    ids = buffer.sample_with_info(600).ids.tolist()
    assert len(set(ids)) == 600
    after = snapshot(client, buffer_name)
    # only the counters moved (meta, and the per-item use counts of lua/_items.lua's
    # record_draws): the tree was changed in the script only
    counters = (keys.meta, keys.uses)
    assert {k: v for k, v in after.items() if k not in counters} == {
        k: v for k, v in before.items() if k not in counters
    }
    assert client.hlen(keys.uses) == 600
    assert_tree_consistent(client, buffer_name)
    assert buffer.stats()["sampled"] == 600
    # every item of nonzero probability: a permutation of them
    assert sorted(buffer.sample_with_info(900).ids.tolist()) == list(range(1, 901))


def test_replacement_true_or_n_over_length_draws_with_replacement(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, prioritized_sampling=True, seed=5)
    buffer.add(_items([10.0, 0.0, 0.0, 0.0]))
    assert len(buffer.sample_with_info(50).ids) == 50  # n > len: torchgfn's replacement=True
    repeats = [len(set(buffer.sample_with_info(3, replacement=True).ids.tolist())) < 3
               for _ in range(20)]
    assert all(repeats)  # id 1 holds 99.99% of the mass
    firsts = [buffer.sample_with_info(3).ids.tolist() for _ in range(20)]
    assert all(len(set(ids)) == 3 for ids in firsts)
    assert sum(ids[0] == 1 for ids in firsts) >= 19
    with_sampler = ReplayBuffer(client, buffer_name, capacity=10, seed=5,
                                sampler=PrioritizedSampler(replacement=True))
    assert all(len(set(with_sampler.sample_with_info(4).ids.tolist())) < 4 for _ in range(5))


def test_more_draws_than_items_of_nonzero_probability_is_refused(client, buffer_name):
    buffer = _prioritized(client, buffer_name, seed=6)  # 5 of its 6 items can be drawn
    before = snapshot(client, buffer_name)
    with pytest.raises(SamplingError, match="only 5 item.*6 draws.*replacement=True") as info:
        buffer.sample(6)
    assert isinstance(info.value, ValueError)
    assert snapshot(client, buffer_name) == before
    assert len(buffer.sample(6, replacement=True)["v"]) == 6
    assert sorted(buffer.sample(5)["v"].tolist()) == [0, 1, 2, 3, 4]


def test_successive_draws_over_sparse_masses(client, buffer_name):
    """Six items of nonzero mass among 300 (the rest -inf), far apart in a replica's tree
    of 512 leaves, keep the law of successive draws."""
    rewards = np.full(300, -np.inf)
    positions = [0, 17, 100, 255, 256, 299]
    rewards[positions] = [0.5, -0.3, 1.2, 0.0, 0.8, -1.0]
    buffer = ReplayBuffer(client, buffer_name, capacity=300, prioritized_sampling=True, seed=9)
    buffer.add(_items(rewards))
    p = softmax(priorities(client, buffer_name))
    probs = _sequence_probabilities(p, 3)
    trials = 3000
    counts: dict[tuple[int, ...], int] = {}
    for _ in range(trials):
        sequence = tuple(buffer.sample_with_info(3).ids.tolist())
        counts[sequence] = counts.get(sequence, 0) + 1
    _assert_fits(probs, counts, trials)
    assert sorted(buffer.sample_with_info(6).ids.tolist()) == [i + 1 for i in positions]


class _Uniforms:
    """An rng whose random(k) hands out the given uniforms in order, then zeros."""

    def __init__(self, values: list[float]) -> None:
        self.values = list(values)

    def random(self, k: int) -> np.ndarray:
        out = (self.values + [0.0] * k)[:k]
        self.values = self.values[k:]
        return np.array(out)


def _replica_draw(buffer: ReplayBuffer, n: int, uniforms: list[float]) -> tuple[list, list]:
    """The softmax replica's draw without replacement with these uniforms (exact binary
    fractions): (ids, probabilities)."""
    replica = replica_of(buffer.view, "softmax")
    slots, probabilities, _ = replica.draw(n, _Uniforms(uniforms), replace=False)
    return replica.ids[slots].tolist(), probabilities.tolist()


def test_a_round_of_draws_keeps_first_occurrences_and_replaces_repeats(client, buffer_name):
    """Masses 1, 1, 2 (ids 1..3, total 4): a round is draws with replacement over the
    round's masses, each kept unless its item was drawn already; the next round draws
    over the mass left."""
    buffer = ReplayBuffer(client, buffer_name, capacity=10, prioritized_sampling=True, seed=1)
    buffer.add(_items(np.log([1.0, 1.0, 2.0])))
    # 0.125 * 4 -> id 1, 0.875 * 4 -> id 3; the rest are not read
    for rest in ([0.0, 0.0, 0.0, 0.0], [0.5, 0.75, 0.25, 0.5]):
        ids, probabilities = _replica_draw(buffer, 2, [0.125, 0.875, *rest])
        assert ids == [1, 3]
        assert probabilities == pytest.approx([0.25, 2 / 3], rel=1e-12)
    # 0.125 and 0.1875 both give id 1: the repeat is skipped and the third uniform picks
    # among the rest: 0.25 * 4 -> id 2 (1 of the 3 left), 0.5 * 4 -> id 3 (2 of 3)
    for third, expected, p in ((0.25, 2, 1 / 3), (0.5, 3, 2 / 3)):
        ids, probabilities = _replica_draw(buffer, 2, [0.125, 0.1875, third])
        assert ids == [1, expected]
        assert probabilities == pytest.approx([0.25, p], rel=1e-12)
    # three draws: id 1, a repeat, id 3, a repeat, then only repeats (zeros) for the rest
    # of the round; the next round draws over masses 0, 1, 0
    ids, probabilities = _replica_draw(buffer, 3, [0.125, 0.125, 0.625, 0.9])
    assert ids == [1, 3, 2]
    assert probabilities == pytest.approx([0.25, 2 / 3, 1.0], rel=1e-12)
    # the replica's tree is as before the draws
    replica = replica_of(buffer.view, "softmax")
    assert replica.total == pytest.approx(2.0)  # masses relative to the largest


def test_repeats_replaced_in_rounds_keep_the_law_of_successive_draws(client, buffer_name):
    """Two items hold nearly all the mass and 4 of the 5 drawable items are asked: most
    draws of the first round repeat, and the later rounds replace them."""
    rewards = [6.0, 5.0, 0.0, -1.0, 0.5, -math.inf]
    buffer = ReplayBuffer(client, buffer_name, capacity=10, prioritized_sampling=True, seed=21)
    buffer.add(_items(rewards))
    p = softmax(priorities(client, buffer_name))
    n = 4
    probs = _sequence_probabilities(p, n)
    trials = 2000
    counts = _drawn_sequences(buffer, p, n, trials)
    _assert_fits(probs, counts, trials)
    assert sorted(buffer.sample_with_info(5).ids.tolist()) == [1, 2, 3, 4, 5]
