"""PERSampler(stratified=True): the n draws of one call fall one in each of n equal
slices of the mass (DI-engine's PER), with the same per-item expected counts."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from cluster_helpers import chi2_limit

from redisbuf import PERSampler, ReplayBuffer


def test_equal_priorities_give_every_item_once(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=64, seed=2,
                          sampler=PERSampler(alpha=1.0, eps=0.0, stratified=True))
    buffer.add(list(range(10)))
    for _ in range(20):
        assert sorted(buffer.sample(10)) == list(range(10))
    unstratified = ReplayBuffer(client, buffer_name, sampler=PERSampler(alpha=1.0, eps=0.0),
                                capacity=64, seed=2)
    repeats = sum(len(set(unstratified.sample(10))) < 10 for _ in range(20))
    assert repeats > 10  # independent draws repeat items (P(no repeat) = 10!/10^10)


def test_each_draw_stays_in_its_slice(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=64, seed=3,
                          sampler=PERSampler(alpha=1.0, eps=0.0, stratified=True))
    buffer.add(["a", "b", "c"], priorities=[2.0, 1.0, 1.0])  # slices: a a b c of 4
    for _ in range(50):
        info = buffer.sample_with_info(4)
        assert info.batch == ["a", "a", "b", "c"]
        assert info.probabilities.tolist() == [0.5, 0.5, 0.25, 0.25]


@pytest.mark.parametrize("n", [3, 7])
def test_expected_counts_follow_the_priorities(client, buffer_name, n) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=64, seed=4,
                          sampler=PERSampler(alpha=0.5, eps=0.0, stratified=True))
    priorities = np.array([1.0, 4.0, 9.0, 16.0, 0.25])
    buffer.add(list(range(5)), priorities=priorities.tolist())
    counts: Counter[int] = Counter()
    rounds = 1500
    for _ in range(rounds):
        counts.update(buffer.sample(n))
    law = np.sqrt(priorities) / np.sqrt(priorities).sum()
    expected = rounds * n * law
    observed = np.array([counts[i] for i in range(5)])
    # stratified counts vary less than multinomial ones: the multinomial bound holds
    assert ((observed - expected) ** 2 / expected).sum() < chi2_limit(4)
