"""A sharded prioritized draw (PER, and softmax with replacement) while another process
moves a shard's total mass between the choice of shards and their commits
(redisbuf/buffers/sharded_draws.py, ``_rounds``): at that moment, every time, a spawned
process sets shard 0's priorities (or its items' log-rewards) to the other of two
states. Each draw must follow the law of the buffer as it is at the commits (chi-square
of the shard drawn, and the reported probability exact), not of the totals the shards
were chosen from."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from cluster_helpers import chi2, chi2_limit
from process_helpers import fresh_context

from redisbuf import PERSampler, ShardedReplayBuffer
from redisbuf.buffers import sharded_draws

pytestmark = pytest.mark.redis_server

LOW, HIGH, OTHERS = 0.5, 8.0, 1.0  # shard 0's two states; every other item's priority


def toggler(url: str, name: str, ids: list[int], conn: Any) -> None:
    """Set shard 0's items to HIGH, LOW, HIGH, ... one change per message, acknowledged
    once written."""
    buffer = ShardedReplayBuffer.open(url, name, sampler=PERSampler(alpha=1.0, eps=0.0))
    state = LOW
    while conn.recv():
        state = HIGH if state == LOW else LOW
        buffer.update_priority(ids, [state] * len(ids))
        conn.send(state)
    conn.close()


def draws_while_flipped(
    monkeypatch: pytest.MonkeyPatch, flipper: Callable[..., None], args: tuple[Any, ...],
    sample: Callable[[], Any], draws: int = 240,
) -> list[tuple[float, Any]]:
    """``sample()`` ``draws`` times while a spawned ``flipper(*args, conn)`` flips shard 0
    at the worst moment: in the shards' parallel step where each sample's first round
    commits, once per sample, acknowledged before the commits go on. The state each
    sample saw its commits in, and its info."""
    context = fresh_context()
    parent, child = context.Pipe()
    worker = context.Process(target=flipper, args=(*args, child))
    worker.start()
    states: list[float] = []
    done: list[tuple[float, Any]] = []
    original = sharded_draws.ShardedSampling._in_parallel

    def at_the_worst_moment(self: Any, calls: Any) -> Any:
        if len(states) == len(done):  # once per sample: its first round
            parent.send(True)
            assert parent.poll(60), "the toggling process did not answer"
            states.append(parent.recv())
        return original(self, calls)

    monkeypatch.setattr(sharded_draws.ShardedSampling, "_in_parallel", at_the_worst_moment)
    try:
        for _ in range(draws):
            info = sample()
            done.append((states[-1], info))
    finally:
        parent.send(False)
        worker.join(30)
    return done


def check_law_at_the_commits(
    draws: list[tuple[float, Any]], shard_masses: Callable[[float], np.ndarray],
    item_mass: Callable[[float, int], float],
) -> None:
    """Each draw's reported probability is its item's mass over the buffer's in the state
    its commits saw, and the shards drawn in each state follow that state's masses
    (chi-square): the law of the masses before (the other state) gives shard 0 far less
    or far more."""
    counts: dict[float, Counter[int]] = defaultdict(Counter)
    for state, info in draws:
        masses = shard_masses(state)
        shard = int(info.ids[0]) % 3
        assert info.probabilities[0] == pytest.approx(
            item_mass(state, shard) / masses.sum(), rel=1e-9)
        counts[state][shard] += 1
    assert len(counts) == 2, counts  # both states were drawn in
    for state, seen in counts.items():
        masses = shard_masses(state)
        expected = {k: sum(seen.values()) * masses[k] / masses.sum() for k in range(3)}
        assert chi2(seen, expected) < chi2_limit(2), (state, seen, expected)


@pytest.mark.parametrize("law", ["global", "shard_local"])
def test_per_draws_follow_the_totals_at_the_commits(redis_server, buffer_name, monkeypatch, law):
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=60, shards=3, seed=3,
                                 batch_law=law, sampler=PERSampler(alpha=1.0, eps=0.0))
    ids: list[int] = []
    for _ in range(6):  # batches go whole to one shard each
        ids += buffer.add({"x": np.arange(4)}, priorities=np.full(4, OTHERS)).ids.tolist()
    sizes = np.array([sum(1 for i in ids if i % 3 == k) for k in range(3)])
    assert (sizes > 0).all(), sizes
    shard0 = [i for i in ids if i % 3 == 0]
    buffer.update_priority(shard0, [LOW] * len(shard0))
    draws = draws_while_flipped(monkeypatch, toggler, (redis_server.url, buffer_name, shard0),
                                lambda: buffer.sample_with_info(1))
    check_law_at_the_commits(draws, lambda state: sizes * np.array([state, OTHERS, OTHERS]),
                             lambda state, shard: state if shard == 0 else OTHERS)


def softmax_toggler(url: str, name: str, conn: Any) -> None:
    """Fill shard 0 (capacity 4, FIFO) with items of log-reward HIGH_LOG_REWARD, then 0,
    then HIGH_LOG_REWARD, ... one change per message, acknowledged once written."""
    buffer = ShardedReplayBuffer.open(url, name, prioritized_sampling=True)
    state = 0.0
    while conn.recv():
        state = HIGH_LOG_REWARD if state == 0.0 else 0.0
        buffer.shards[0].add({"x": np.arange(4), "log_rewards": np.full(4, state)})
        conn.send(state)
    conn.close()


HIGH_LOG_REWARD = float(np.log(16.0))


@pytest.mark.parametrize("law", ["global", "shard_local"])
def test_softmax_draws_follow_the_masses_at_the_commits(redis_server, buffer_name, monkeypatch,
                                                        law):
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=12, shards=3, seed=4,
                                 batch_law=law, prioritized_sampling=True)
    for k in range(3):  # 4 items of log-reward 0 in each shard
        buffer.shards[k].add({"x": np.arange(4), "log_rewards": np.zeros(4)})
    draws = draws_while_flipped(monkeypatch, softmax_toggler, (redis_server.url, buffer_name),
                                lambda: buffer.sample_with_info(1, replacement=True))
    check_law_at_the_commits(draws, lambda state: np.array([4 * np.exp(state), 4.0, 4.0]),
                             lambda state, shard: np.exp(state) if shard == 0 else 1.0)


@pytest.mark.parametrize("law", ["global", "shard_local"])
def test_softmax_draws_without_replacement_follow_the_masses_at_the_commits(
        redis_server, buffer_name, monkeypatch, law):
    """Without replacement too: the shards' successive draws are replayed (global) or the
    one shard is chosen (shard_local) by the masses at the commits."""
    buffer = ShardedReplayBuffer(redis_server.url, buffer_name, capacity=12, shards=3, seed=5,
                                 batch_law=law, prioritized_sampling=True)
    for k in range(3):
        buffer.shards[k].add({"x": np.arange(4), "log_rewards": np.zeros(4)})
    draws = draws_while_flipped(monkeypatch, softmax_toggler, (redis_server.url, buffer_name),
                                lambda: buffer.sample_with_info(1, replacement=False))
    check_law_at_the_commits(draws, lambda state: np.array([4 * np.exp(state), 4.0, 4.0]),
                             lambda state, shard: np.exp(state) if shard == 0 else 1.0)
