"""The bound on one command's work (redisbuf/store/bounds.py): large requests split into
bounded commands with their law kept, and refusals above the bound, from Python and from
FCALL. The client-side bound is lowered here so that small buffers exercise the splits
(the scripts keep theirs: each chunk is under both)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import numpy as np
import pytest
import redis
from test_sampling import chi2, chi2_limit

from redisbuf import FifoSampler, ReplayBuffer
from redisbuf.errors import RequestTooLargeError
from redisbuf.sampling.removers import UniformRemover
from redisbuf.store import bounds, functions
from redisbuf.store.keys import format_id


def _items(k: int, start: int = 0) -> dict:
    return {"x": np.arange(start, start + k, dtype=np.int64),
            "log_rewards": np.zeros(k)}


@pytest.fixture
def small_bound(monkeypatch):
    monkeypatch.setattr(bounds, "MAX_ITEMS_PER_COMMAND", 2)


def _holed(client, name: str) -> ReplayBuffer:
    """8 items whose ids have holes (reward eviction took the low ones)."""
    buffer = ReplayBuffer(client, name, capacity=8, prioritized_capacity=True, seed=1)
    rewards = [0.0, -5, 0, -5, 0, 0, -5, 0, 0, -5, 0, 0]
    buffer.add({"x": np.arange(12, dtype=np.int64), "log_rewards": np.array(rewards)})
    ids = sorted(int(m) for m in client.zrange(buffer.keys.order, 0, -1))
    assert len(ids) == 8 and ids[-1] - ids[0] + 1 > 8
    return buffer


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("n", [3, 6])  # 3: rejection chunks; 6 > 8 / 2: the scan
def test_chunked_draw_without_replacement_is_a_uniform_subset(
    client, buffer_name, small_bound, n, holes
):
    if holes:
        buffer = _holed(client, buffer_name)
    else:
        buffer = ReplayBuffer(client, buffer_name, capacity=8, seed=1)
        buffer.add(_items(8))
    present = sorted(int(m) for m in client.zrange(buffer.keys.order, 0, -1))
    trials = 1200
    subsets: Counter = Counter()
    firsts: Counter = Counter()
    for _ in range(trials):
        ids = buffer.sample_with_info(n).ids.tolist()
        assert len(set(ids)) == n and set(ids) <= set(present)
        subsets[tuple(sorted(ids))] += 1
        firsts[ids[0]] += 1
    cells = list(itertools.combinations(present, n))
    observed = np.array([subsets[c] for c in cells], dtype=float)
    expected = np.full(len(cells), trials / math.comb(8, n))
    assert chi2(observed, expected) < chi2_limit(len(cells) - 1)
    # the order too: the first item is uniform over the 8
    observed = np.array([firsts[i] for i in present], dtype=float)
    assert chi2(observed, np.full(8, trials / 8)) < chi2_limit(7)
    meta = client.hgetall(buffer.keys.meta)
    assert int(meta[b"sampled"]) == trials * n  # each item recorded once
    assert not list(client.scan_iter(match=buffer.keys.drawing("*")))


def test_chunked_draw_counts_each_use_once(client, buffer_name, small_bound):
    buffer = ReplayBuffer(client, buffer_name, capacity=20, seed=2, max_use=1)
    buffer.add(_items(20))
    batch = buffer.sample(7)  # max_use: blobs read by the script, items removed
    assert len(set(batch["x"].tolist())) == 7
    assert len(buffer) == 13
    rest = buffer.sample(13)
    assert sorted(batch["x"].tolist() + rest["x"].tolist()) == list(range(20))
    assert len(buffer) == 0


def test_chunked_draw_with_replacement(client, buffer_name, small_bound):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, seed=3)
    buffer.add(_items(4))
    info = buffer.sample_with_info(9)  # n > length: with replacement, in 5 commands
    assert len(info.ids) == 9 and set(info.ids.tolist()) <= {1, 2, 3, 4}
    counts = Counter()
    for _ in range(300):
        counts.update(buffer.sample_with_info(5, replacement=True).ids.tolist())
    observed = np.array([counts[i] for i in (1, 2, 3, 4)], dtype=float)
    assert chi2(observed, np.full(4, 1500 / 4)) < chi2_limit(3)


def test_get_and_top_in_bounded_commands(client, buffer_name, small_bound):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add({"x": np.arange(10, dtype=np.int64), "log_rewards": np.arange(10.0)})
    ids = [7, 1, 10, 3, 3, 9, 2]
    assert buffer.get(ids)["x"].tolist() == [i - 1 for i in ids]
    with pytest.raises(KeyError, match="11"):
        buffer.get([1, 2, 3, 11])
    assert buffer.top(5) == [(10, 9.0), (9, 8.0), (8, 7.0), (7, 6.0), (6, 5.0)]
    assert len(buffer.top(100)) == 10


def test_an_add_above_the_bound_to_a_random_remover_is_refused_and_writes_nothing(
    client, buffer_name
):
    # (any other buffer stores it a slice at a time: tests/test_large_add.py)
    buffer = ReplayBuffer(client, buffer_name, capacity=10_000, remover=UniformRemover())
    buffer.add(_items(3))
    before = client.hgetall(buffer.keys.meta)
    with pytest.raises(RequestTooLargeError, match="UniformRemover, chooses at random"):
        buffer.add(_items(bounds.MAX_ADD_ITEMS + 1))
    assert client.hgetall(buffer.keys.meta) == before and len(buffer) == 3
    assert not [key for key in client.keys() if b":adding:" in key]  # nothing staged
    assert len(buffer.add(_items(bounds.MAX_ADD_ITEMS)).ids) == bounds.MAX_ADD_ITEMS


def test_window_and_selector_bounds(client, buffer_name, small_bound):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, seed=4)
    buffer.add(_items(10))
    info = buffer.sample_with_info(5, replacement=True, sample_range=slice(-3, None))
    assert len(info.ids) == 5 and set(info.ids.tolist()) <= {8, 9, 10}
    # more than the window holds: with replacement, as one command would (split)
    assert set(buffer.sample_with_info(5, sample_range=slice(-3, None)).ids.tolist()) <= {
        8, 9, 10}
    # without replacement above the bound: split, distinct (tests/test_bounds_split.py)
    assert len(set(buffer.sample_with_info(3, sample_range=slice(-4, None)).ids.tolist())) == 3
    fifo = ReplayBuffer(client, buffer_name, capacity=None, sampler=FifoSampler())
    assert fifo.sample(2)["x"].tolist() == [0, 1]
    with pytest.raises(RequestTooLargeError):
        fifo.sample(3)


@pytest.mark.redis_server
def test_scripts_and_functions_refuse_above_the_bound(real_client, buffer_name):
    buffer = ReplayBuffer(real_client, buffer_name, capacity=100)
    buffer.add(_items(10))
    functions.install(real_client)
    keys = buffer.keys.all_keys()
    n = bounds.MAX_ITEMS_PER_COMMAND + 1
    uniforms = b"\0" * (6 * n)
    for command in ("FCALL", "FCALL_RO"):
        name = "rb_sample_uniform" if command == "FCALL" else "rb_sample_uniform_ro"
        with pytest.raises(redis.ResponseError, match="RB_LIMIT.*at most 2048"):
            real_client.execute_command(command, name, len(keys), *keys, n, 0, 0, uniforms)
    args = ['{"kind":"dict","fields":{}}', n, ""]
    args += [b"x", "0"] * n
    with pytest.raises(redis.ResponseError, match="RB_LIMIT one add stores at most"):
        real_client.execute_command("FCALL", "rb_add", len(keys), *keys, *args)
    for script, argv in (("sample_select", [n, "fifo", "log_reward", 0, b""]),
                         ("sample_window", [n, 0, "", "", "", 0, uniforms])):
        with pytest.raises(RequestTooLargeError, match="at most 2048"):
            buffer._run(script, keys, argv)
    assert len(buffer) == 10 and int(real_client.hget(buffer.keys.meta, "sampled") or 0) == 0
    assert real_client.hget(buffer.keys.items, format_id(11)) is None


def test_episode_fragment_and_diverse_requests_above_the_bound_are_refused(client, buffer_name):
    """The other buffer kinds' commands are bounded too: an episode draw, a window read, a
    fragment fetch above the bound and a diverse add above the add bound are refused
    (RB_LIMIT, RequestTooLargeError) and change nothing."""
    from redisbuf import NormBasedDiversePrioritizedReplayBuffer, States
    from redisbuf.buffers.episodes import EpisodeBuffer
    from redisbuf.buffers.fragments import FragmentBuffer

    episodes = EpisodeBuffer(client, f"{buffer_name}-e", capacity_episodes=10, seed=0)
    episodes.push({"t": np.arange(4, dtype=np.int64)})
    with pytest.raises(RequestTooLargeError, match=str(bounds.MAX_ITEMS_PER_COMMAND)):
        episodes.sample(bounds.MAX_ITEMS_PER_COMMAND + 1, replace=True)
    with pytest.raises(RequestTooLargeError, match=str(bounds.MAX_ITEMS_PER_COMMAND)):
        episodes.sample_windows(bounds.MAX_ITEMS_PER_COMMAND // 2 + 1, 2)
    assert len(episodes.sample(2, replace=True)) == 2
    fragments = FragmentBuffer(client, f"{buffer_name}-f", max_chunks=5000,
                               fragments_per_chunk=1, max_staleness=0, max_reuse=1, seed=0)
    fragments.update_model_version("s", 0)
    fragments.add_fragment(b"x", 0, "s", "a")
    with pytest.raises(RequestTooLargeError, match=str(bounds.MAX_ITEMS_PER_COMMAND)):
        fragments.fetch(bounds.MAX_ITEMS_PER_COMMAND + 1, timeout=0)
    diverse = NormBasedDiversePrioritizedReplayBuffer(client, f"{buffer_name}-d", capacity=10)
    n = bounds.MAX_ADD_ITEMS + 1
    with pytest.raises(RequestTooLargeError, match=str(bounds.MAX_ADD_ITEMS)):
        diverse.add(States(np.arange(n, dtype=np.float64)[:, None], log_rewards=np.zeros(n)))
    assert len(diverse) == 0
