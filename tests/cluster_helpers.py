"""Shared by the sharded-buffer tests (fakeredis and the real cluster): an unevenly
filled sharded buffer and chi-square checks of its draws against the exact
distribution of an unsharded buffer."""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Any

import numpy as np

from redisbuf import ShardedReplayBuffer

# log-rewards of the items, in the order they are added (the value v is the item's field)
LOG_REWARDS = np.log(np.array([2.0, 3.0, 4.0, 5.0, 6.0, 7.0]))
BATCHES = (1, 2, 3)  # one batch per shard: the shards hold 1, 2 and 3 items
ITEMS = len(LOG_REWARDS)


def items(values: Any, log_rewards: Any = None) -> dict[str, np.ndarray]:
    """A batch of items with field ``v`` (log-rewards 0 unless given)."""
    values = np.asarray(values)
    rewards = np.zeros(len(values)) if log_rewards is None else np.asarray(log_rewards)
    return {"v": values, "log_rewards": rewards}


def chi2_limit(df: int, z: float = 5.0) -> float:
    """The chi-square quantile of ``df`` degrees of freedom at ``z`` standard deviations
    (Wilson-Hilferty): a test that fails by chance with probability ~3e-7."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def filled(client: Any, name: str, *, prioritized: bool, seed: int = 5) -> Any:
    """A 3-shard buffer holding items v = 0..5 (log-reward log(v + 2)), 1, 2 and 3 of
    them in the three shards."""
    buffer = ShardedReplayBuffer(
        client, name, capacity=30, shards=3, prioritized_sampling=prioritized, seed=seed
    )
    start = 0
    for size in BATCHES:
        values = np.arange(start, start + size)
        buffer.add({"v": values, "log_rewards": LOG_REWARDS[values]})
        start += size
    sizes = sorted(len(shard) for shard in buffer.shards)
    assert sizes == sorted(BATCHES)
    return buffer


def chi2(observed: Counter[Any], expected: dict[Any, float]) -> float:
    assert set(observed) <= set(expected), set(observed) - set(expected)
    return sum((observed.get(cell, 0) - e) ** 2 / e for cell, e in expected.items())


def check_uniform_subsets(buffer: Any, draws: int) -> None:
    """Without replacement every 2-subset is equally likely and the first draw is
    uniform over the items."""
    subsets: Counter[Any] = Counter()
    firsts: Counter[Any] = Counter()
    for _ in range(draws):
        values = buffer.sample(2)["v"].tolist()
        assert len(set(values)) == 2
        subsets[tuple(sorted(values))] += 1
        firsts[values[0]] += 1
    cells = list(itertools.combinations(range(ITEMS), 2))
    assert chi2(subsets, dict.fromkeys(cells, draws / len(cells))) < chi2_limit(len(cells) - 1)
    assert chi2(firsts, dict.fromkeys(range(ITEMS), draws / ITEMS)) < chi2_limit(ITEMS - 1)


def check_prioritized_pairs(buffer: Any, draws: int) -> None:
    """Without replacement the first two draws follow successive softmax draws
    (torch.multinomial's distribution): P(a, b) = p_a p_b / (1 - p_a); the reported
    probabilities are those conditional probabilities."""
    p = np.exp(LOG_REWARDS) / np.exp(LOG_REWARDS).sum()
    pairs: Counter[Any] = Counter()
    for _ in range(draws):
        info = buffer.sample_with_info(3)
        a, b, c = info.batch["v"].tolist()
        pairs[(a, b)] += 1
        expected = [p[a], p[b] / (1 - p[a]), p[c] / (1 - p[a] - p[b])]
        np.testing.assert_allclose(info.probabilities, expected, rtol=1e-9)
    cells = {
        (a, b): draws * p[a] * p[b] / (1 - p[a])
        for a in range(ITEMS)
        for b in range(ITEMS)
        if a != b
    }
    assert chi2(pairs, cells) < chi2_limit(len(cells) - 1)


def check_prioritized_with_replacement(buffer: Any, draws: int) -> None:
    """With replacement each draw is an independent softmax draw."""
    p = np.exp(LOG_REWARDS) / np.exp(LOG_REWARDS).sum()
    seen: Counter[Any] = Counter()
    for _ in range(draws):
        info = buffer.sample_with_info(4, replacement=True)
        values = info.batch["v"].tolist()
        seen.update(values)
        np.testing.assert_allclose(info.probabilities, p[values], rtol=1e-9)
    assert chi2(seen, {v: 4 * draws * p[v] for v in range(ITEMS)}) < chi2_limit(ITEMS - 1)


def per_priorities_by_field(client: Any, buffers: list[Any], field: str) -> dict[float, float]:
    """Every item's PER priority in ``buffers`` (a sharded buffer's shards, or one plain
    buffer), by the value of its ``field``: ids change on a load, values do not."""
    out = {}
    for buffer in buffers:
        ids = [int(m) for m in client.zrange(buffer.keys.order, 0, -1)]
        for item, priority in zip(ids, buffer.priorities(ids).tolist(), strict=True):
            out[float(buffer.get([item])[field][0])] = priority
    return out
