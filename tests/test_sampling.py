"""Sampling: uniform (with and without replacement) and prioritized (softmax of
log-rewards through the sum tree), checked statistically with fixed seeds, plus the sum
tree's invariants."""

from __future__ import annotations

import math
import uuid

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from replica_helpers import followed_masses

from redisbuf import BufferKeys, ReplayBuffer
from redisbuf.errors import EmptyBufferError

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# -- helpers --------------------------------------------------------------------------


def chi2_limit(df: int, z: float = 5.0) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) at about z sigmas (p ~ 3e-7)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(counts: np.ndarray, expected: np.ndarray) -> float:
    return float(((counts - expected) ** 2 / expected).sum())


def softmax(log_rewards: dict[int, float]) -> dict[int, float]:
    finite = [v for v in log_rewards.values() if v > -math.inf]
    top = max(finite)
    weights = {i: math.exp(v - top) if v > -math.inf else 0.0 for i, v in log_rewards.items()}
    total = sum(weights.values())
    return {i: w / total for i, w in weights.items()}


def priorities(client, name: str) -> dict[int, float]:
    return {
        int(m): s for m, s in client.zrange(BufferKeys(name).prio, 0, -1, withscores=True)
    }


def draw_counts(buffer: ReplayBuffer, draws: int, per_call: int = 1000) -> dict[int, int]:
    counts: dict[int, int] = {}
    for _ in range(draws // per_call):
        for item_id in buffer.sample_with_info(per_call).ids.tolist():
            counts[item_id] = counts.get(item_id, 0) + 1
    return counts


def assert_matches_softmax(client, buffer: ReplayBuffer, draws: int = 20000) -> None:
    """Empirical draw frequencies match softmax(log_rewards) of the items present."""
    probs = softmax(priorities(client, buffer.name))
    counts = draw_counts(buffer, draws)
    assert set(counts) <= set(probs), "drew an id that is not in the buffer"
    never = [i for i, p in probs.items() if p == 0.0 and counts.get(i)]
    assert never == [], f"items of log-reward -inf (or underflowing) were drawn: {never}"
    ids = sorted(i for i, p in probs.items() if p > 0)
    p = np.array([probs[i] for i in ids])
    observed = np.array([counts.get(i, 0) for i in ids], dtype=float)
    total_variation = 0.5 * np.abs(observed / draws - p).sum()
    assert total_variation < 0.04, (total_variation, dict(zip(ids, observed, strict=True)), probs)
    big = p * draws >= 5
    if big.sum() >= 2:
        rest_expected = (p[~big] * draws).sum()
        expected = np.append(p[big] * draws, rest_expected)
        got = np.append(observed[big], observed[~big].sum())
        if rest_expected < 5:
            expected, got = expected[:-1], got[:-1]
            expected = expected * got.sum() / expected.sum()
        assert chi2(got, expected) < chi2_limit(len(expected) - 1)


def assert_tree_consistent(client, name: str) -> None:
    """What a softmax sampler's replica sees of buffer ``name`` agrees with its
    log-rewards, whether it followed the mass log or read the buffer afresh (checked by
    followed_masses): exactly the items present, masses exp(log_reward - ref) for one
    ref, within 300 of the largest finite log-reward (+inf and -inf: mass 0)."""
    keys = BufferKeys(name)
    meta = {k.decode(): v.decode() for k, v in client.hgetall(keys.meta).items()}
    assert meta.get("masslog") == "1"
    masses = followed_masses(client, name, "softmax")
    prio = priorities(client, name)
    items = {int(k) for k in client.hkeys(keys.items)}
    assert set(prio) == items == set(masses)
    finite = {i: v for i, v in prio.items() if -math.inf < v < math.inf}
    for item_id in set(prio) - set(finite):
        assert masses[item_id] == 0.0
    if not finite:
        return
    top = max(finite, key=finite.get)
    assert masses[top] >= math.exp(-300)
    for item_id, value in finite.items():
        expected = masses[top] * math.exp(value - finite[top])
        assert masses[item_id] == pytest.approx(expected, rel=1e-12, abs=1e-300), item_id


def _items(rewards, start: int = 0) -> dict:
    rewards = np.asarray(rewards, dtype=np.float64)
    return {"v": np.arange(start, start + len(rewards)), "log_rewards": rewards}


# -- uniform ------------------------------------------------------------------------------


def test_uniform_without_replacement_has_no_duplicates(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=50, seed=0)
    buffer.add(_items(np.zeros(30)))
    for n in (1, 7, 29, 30):
        for _ in range(20):
            ids = buffer.sample_with_info(n).ids.tolist()
            assert len(ids) == n and len(set(ids)) == n
            assert set(ids) <= set(range(1, 31))
    info = buffer.sample_with_info(30)
    assert sorted(info.ids.tolist()) == list(range(1, 31))
    assert sorted(info.batch["v"].tolist()) == list(range(30))
    assert info.probabilities is None


def test_uniform_with_replacement_when_asked_or_when_n_exceeds_length(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=50, seed=1)
    buffer.add(_items(np.zeros(10)))
    big = buffer.sample_with_info(25)
    assert len(big.ids) == 25 and set(big.ids.tolist()) <= set(range(1, 11))
    duplicated = 0
    for _ in range(30):
        ids = buffer.sample_with_info(10, replacement=True).ids.tolist()
        assert set(ids) <= set(range(1, 11))
        duplicated += len(set(ids)) < 10
    assert duplicated >= 25  # P(no repeat in 10 of 10) = 10!/10^10 ~ 4e-4
    # the payload matches the id drawn
    info = buffer.sample_with_info(40, replacement=True)
    assert (info.batch["v"] + 1).tolist() == info.ids.tolist()


@pytest.mark.parametrize("holes", [False, True], ids=["contiguous", "with-holes"])
def test_uniform_marginals_are_uniform(client, buffer_name, holes):
    buffer = ReplayBuffer(client, buffer_name, capacity=20, prioritized_capacity=holes, seed=7)
    rng = np.random.default_rng(0)
    buffer.add(_items(rng.normal(size=20)))
    if holes:  # evict a scattered set of ids: the ids present are no longer a range
        buffer.add(_items(rng.normal(size=10) + 1.0, start=20))
    present = sorted(priorities(client, buffer_name))
    assert len(present) == 20
    if holes:
        assert present[-1] - present[0] + 1 > 20
    counts = dict.fromkeys(present, 0)
    calls = 2000
    for _ in range(calls):
        info = buffer.sample_with_info(4)
        assert len(set(info.ids.tolist())) == 4
        for item_id in info.ids.tolist():
            counts[item_id] += 1
    observed = np.array(list(counts.values()), dtype=float)
    expected = np.full(len(present), calls * 4 / len(present))
    assert chi2(observed, expected) < chi2_limit(len(present) - 1)


def test_uniform_without_replacement_gives_every_subset_equal_chance(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, seed=11)
    buffer.add(_items(np.zeros(5)))
    counts: dict[tuple[int, ...], int] = {}
    calls = 1500
    for _ in range(calls):
        key = tuple(sorted(buffer.sample_with_info(2).ids.tolist()))
        counts[key] = counts.get(key, 0) + 1
    assert len(counts) == 10
    observed = np.array(list(counts.values()), dtype=float)
    assert chi2(observed, np.full(10, calls / 10)) < chi2_limit(9)


def test_empty_buffer_raises_buffer_is_empty(client, buffer_name):
    uniform = ReplayBuffer(client, buffer_name, capacity=5)
    prioritized = ReplayBuffer(client, buffer_name, capacity=5, prioritized_sampling=True)
    for buffer in (uniform, prioritized):
        with pytest.raises(EmptyBufferError, match="buffer is empty"):
            buffer.sample(1)
    uniform.add(_items([-np.inf, -np.inf]))
    assert len(uniform.sample(2)["v"]) == 2  # uniform ignores rewards
    with pytest.raises(EmptyBufferError, match="buffer is empty"):
        prioritized.sample(1)  # nothing with a finite log-reward
    uniform.clear()
    with pytest.raises(EmptyBufferError, match=buffer_name):
        uniform.sample(1)


@pytest.mark.parametrize("n", [0, -1, 2.5, True, "3"])
def test_sample_size_must_be_a_positive_integer(client, buffer_name, n):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(_items([0.0]))
    with pytest.raises(ValueError, match="positive integer"):
        buffer.sample(n)


# -- prioritized --------------------------------------------------------------------------


def _rewards(n: int, seed: int, n_inf: int = 4) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rewards = rng.normal(scale=1.5, size=n)
    rewards[rng.choice(n, size=n_inf, replace=False)] = -np.inf
    return rewards


def test_prioritized_sampling_matches_softmax(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=40, prioritized_sampling=True, seed=3)
    buffer.add(_items(_rewards(20, 0)))
    buffer.add(_items(_rewards(15, 1), start=20))
    assert_matches_softmax(client, buffer)
    assert_tree_consistent(client, buffer_name)
    assert buffer.stats()["sampled"] == 20000
    assert buffer.stats()["prioritized_sampling_ready"] is True


def test_sample_with_info_probabilities_equal_softmax(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=40, prioritized_sampling=True, seed=5)
    buffer.add(_items(_rewards(30, 2)))
    probs = softmax(priorities(client, buffer_name))
    info = buffer.sample_with_info(500)
    assert info.probabilities.shape == (500,)
    for item_id, probability in zip(info.ids.tolist(), info.probabilities.tolist(), strict=True):
        assert probability == pytest.approx(probs[item_id], rel=1e-9)
    np.testing.assert_array_equal(info.batch["v"] + 1, info.ids)
    np.testing.assert_array_equal(
        info.batch["log_rewards"], [priorities(client, buffer_name)[i] for i in info.ids]
    )


def test_prioritized_sampling_after_clear(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=40, prioritized_sampling=True, seed=6)
    buffer.add(_items(_rewards(30, 3) + 50))
    buffer.clear()
    with pytest.raises(EmptyBufferError):
        buffer.sample(1)
    buffer.add(_items(_rewards(25, 4) - 3, start=100))
    assert_tree_consistent(client, buffer_name)
    assert min(draw_counts(buffer, 1000)) > 30  # none of the cleared ids
    assert_matches_softmax(client, buffer)


def test_prioritized_sampling_across_a_rebase(client, buffer_name):
    """Log-rewards far beyond exp()'s range force the tree to move its reference."""
    buffer = ReplayBuffer(client, buffer_name, capacity=25, prioritized_sampling=True, seed=8)
    buffer.add(_items(_rewards(10, 5, n_inf=2) + 500))
    buffer.add(_items(_rewards(10, 6, n_inf=2) + 500, start=10))
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, buffer, draws=10000)
    # everything at +500 evicted in one batch by items at -500: the tree must rebase
    buffer.add(_items(_rewards(25, 7, n_inf=3) - 500, start=20))
    assert len(buffer) == 25 and max(priorities(client, buffer_name).values()) < -490
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, buffer)
    # and up again, without eviction, after a clear
    buffer.clear()
    buffer.add(_items([800.0] * 5))
    buffer.add(_items([1600.0] * 5 + [0.0] * 5, start=5))
    assert_tree_consistent(client, buffer_name)
    info = buffer.sample_with_info(2000)
    top = {i for i, v in priorities(client, buffer_name).items() if v == 1600.0}
    assert len(top) == 5 and set(info.ids.tolist()) == top
    np.testing.assert_allclose(info.probabilities, 0.2, rtol=1e-12)


def test_prioritized_sampling_enabled_by_a_second_object(client, buffer_name):
    creator = ReplayBuffer(client, buffer_name, capacity=60)
    creator.add(_items(_rewards(30, 9)))
    assert creator.stats()["prioritized_sampling_ready"] is False
    with pytest.raises(EmptyBufferError):
        ReplayBuffer(client, f"{buffer_name}-x", capacity=5, prioritized_sampling=True).sample(1)
    sampler = ReplayBuffer(client, buffer_name, capacity=60, prioritized_sampling=True, seed=2)
    assert creator.stats()["prioritized_sampling_ready"] is True
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, sampler, draws=10000)
    # the creator keeps adding with its uniform sampler: the tree follows
    creator.add(_items(_rewards(20, 10) + 1.0, start=30))
    assert_tree_consistent(client, buffer_name)
    assert_matches_softmax(client, sampler)
    # the creator's own sampling stays uniform
    assert creator.sample_with_info(5).probabilities is None


def test_seeded_buffers_draw_reproducibly(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=50).add(_items(_rewards(40, 12)))
    for prioritized in (False, True):
        runs = []
        for seed in (42, 42, 43):
            buffer = ReplayBuffer(
                client, buffer_name, capacity=50, prioritized_sampling=prioritized, seed=seed
            )
            runs.append([buffer.sample_with_info(10).ids.tolist() for _ in range(3)])
        assert runs[0] == runs[1]
        assert runs[0] != runs[2]


# -- the sum tree -------------------------------------------------------------------------


@PROPERTY
@given(
    capacity=st.integers(1, 9),
    batches=st.lists(
        st.lists(st.sampled_from([-np.inf, -2.0, 0.0, 0.0, 1.5, 4.0]), min_size=1, max_size=5),
        min_size=1,
        max_size=4,
    ),
)
def test_tree_consistent_without_eviction(client, capacity, batches):
    name = f"tree-{uuid.uuid4().hex[:8]}"
    total = sum(len(b) for b in batches)
    buffer = ReplayBuffer(client, name, capacity=max(capacity, total), prioritized_sampling=True)
    for index, rewards in enumerate(batches):
        buffer.add(_items(rewards))
        assert_tree_consistent(client, name)
        if index == 1:
            buffer.clear()
            assert_tree_consistent(client, name)
    buffer.drop()


@settings(PROPERTY, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # no shrinking
@given(
    capacity=st.integers(1, 9),
    prioritized_capacity=st.booleans(),
    batches=st.lists(
        st.lists(st.sampled_from([-np.inf, -2.0, 0.0, 0.0, 1.5, 4.0]), min_size=1, max_size=5),
        min_size=1,
        max_size=8,
    ),
)
def test_tree_consistent_after_random_adds_and_evictions(
    client, capacity, prioritized_capacity, batches
):
    name = f"tree-{uuid.uuid4().hex[:8]}"
    buffer = ReplayBuffer(
        client, name, capacity=capacity, prioritized_capacity=prioritized_capacity,
        prioritized_sampling=True,
    )
    for rewards in batches:
        buffer.add(_items(rewards))
        assert_tree_consistent(client, name)
    buffer.drop()


def test_new_item_reusing_an_evicted_slot_can_be_drawn(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_sampling=True, seed=0)
    buffer.add(_items([0.0, 0.0, 0.0]))
    buffer.add(_items([1.0], start=3))  # evicts id 1, id 4 takes its slot
    assert 4 in buffer.sample_with_info(500).ids.tolist()


@pytest.mark.parametrize("prioritized_capacity", [False, True])
def test_prioritized_sampling_after_evictions(client, buffer_name, prioritized_capacity):
    buffer = ReplayBuffer(
        client, buffer_name, capacity=30, prioritized_capacity=prioritized_capacity,
        prioritized_sampling=True, seed=4,
    )
    for index in range(8):
        buffer.add(_items(_rewards(9, 20 + index, n_inf=1), start=9 * index))
    assert len(buffer) == 30
    assert_matches_softmax(client, buffer)


_CHILD_PROBE = """
local text, mass = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local target = tonumber(ARGV[i])
  local forward = chunk_child(chunk_entry, text, target)
  local lazy = chunk_child(chunk_entry, text, target, mass)
  local whole = chunk_child(parsed_entry, tree_parse(text), target, mass)
  out[#out + 1] = forward .. ' ' .. lazy .. ' ' .. whole
end
return out
"""


