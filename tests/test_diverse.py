"""NormBasedDiversePrioritizedReplayBuffer: torchgfn 2.4.1's rule, checked against a
transcription of its add (torch.cdist on float32 tensors) over random batches, plus
conditions, refusals and several processes adding at once."""

from __future__ import annotations

import traceback
import uuid

import numpy as np
import pytest
import torch
from process_helpers import fresh_context
from test_bad_input import snapshot

from redisbuf import (
    BufferKeys,
    ManagerLink,
    NormBasedDiversePrioritizedReplayBuffer,
    ReplayBuffer,
    States,
    Trajectories,
    Transitions,
)
from redisbuf.control.ipc import MessageQueue
from redisbuf.errors import ConfigMismatchError, InvalidBatchError, SchemaError


class Reference:
    """torchgfn 2.4.1's NormBasedDiversePrioritizedReplayBuffer.add on (vector, reward,
    age) rows, with reward eviction oldest-first among equal rewards (torch's argsort
    leaves ties in an unspecified order)."""

    def __init__(self, capacity: int, cutoff: float, p: float) -> None:
        self.capacity, self.cutoff, self.p = capacity, cutoff, p
        self.rows: list[tuple[tuple[float, ...], float, int]] = []
        self.age = 0

    def _extend(self, vecs: np.ndarray, rewards: np.ndarray) -> None:
        for vec, reward in zip(vecs, rewards, strict=True):
            self.age += 1
            self.rows.append((tuple(vec.tolist()), float(reward), self.age))
        self.rows.sort(key=lambda row: (row[1], row[2]))
        self.rows = self.rows[-self.capacity :]

    def add(self, vecs: np.ndarray, rewards: np.ndarray) -> None:
        if len(self.rows) < self.capacity:
            self._extend(vecs, rewards)
            return
        pos = np.argsort(-rewards, kind="stable")  # batch positions, best first
        pos = pos[rewards[pos] >= min(row[1] for row in self.rows)]
        if not len(pos):
            return
        if self.cutoff >= 0:
            batch = torch.tensor(vecs[pos], dtype=torch.float32)
            dist = torch.cdist(batch[None], batch[None], p=self.p)[0]
            r, w = torch.triu_indices(*dist.shape)
            dist[r, w] = torch.finfo(dist.dtype).max
            pos = pos[(dist.min(-1)[0] > self.cutoff).numpy()]
            if len(pos):
                batch = torch.tensor(vecs[pos], dtype=torch.float32)
                stored = torch.tensor([row[0] for row in self.rows], dtype=torch.float32)
                dist = torch.cdist(batch[None], stored[None], p=self.p)[0]
                pos = pos[(dist.min(-1)[0] > self.cutoff).numpy()]
        # redisbuf inserts the survivors in batch order: ages (reward ties) follow it
        pos = np.sort(pos)
        self._extend(vecs[pos], rewards[pos])


def _stored(client, name: str) -> list[tuple[tuple[float, ...], float]]:
    keys = BufferKeys(name)
    vecs = {int(k): tuple(float(x) for x in v.decode().split(","))
            for k, v in client.hgetall(keys.vecs).items()}
    prio = {int(m): s for m, s in client.zrange(keys.prio, 0, -1, withscores=True)}
    assert set(vecs) == set(prio)
    return sorted((vecs[i], prio[i]) for i in prio)


@pytest.mark.parametrize(
    ("cutoff", "p"), [(0.0, 1.0), (1.0, 2.0), (1.5, 2.0), (2.0, float("inf")), (2.5, 0.5),
                      (0.0, 0.0), (1.0, 0.0), (1e-300, 1.0), (float("inf"), 2.0), (-1.0, 1.0)],
)
def test_matches_torchgfn_rule_on_random_batches(client, buffer_name, cutoff, p):
    rng = np.random.default_rng(abs(hash((cutoff, p))) % 1000)
    capacity = 8
    buffer = NormBasedDiversePrioritizedReplayBuffer(
        client, buffer_name, capacity=capacity, cutoff_distance=cutoff, p_norm_distance=p
    )
    reference = Reference(capacity, cutoff, p)
    dropped = 0
    for _ in range(40):
        n = int(rng.integers(1, 7))
        vecs = rng.integers(-2, 3, size=(n, 2)).astype(np.float32)
        rewards = rng.choice([-1.0, 0.0, 0.5, 1.0, 2.0, 3.0], size=n)
        result = buffer.add(States(vecs, log_rewards=rewards))
        reference.add(vecs, rewards)
        dropped += n - len(result.kept)
        assert len(result.ids) == len(result.kept)
        expected = sorted((tuple(float(x) for x in v), r) for v, r, _ in reference.rows)
        assert _stored(client, buffer_name) == expected
    assert dropped > 0


def test_new_items_enter_in_batch_order_and_report_their_positions(client, buffer_name):
    buffer = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=3)
    buffer.add(States(np.array([[0.0], [1.0], [2.0]]), log_rewards=np.array([1.0, 1.0, 1.0])))
    # ranks: 9 (pos 2), 5 (pos 0), 5 (pos 3, a duplicate of pos 0), 0.5 (pos 1, too low)
    result = buffer.add(States(np.array([[7.0], [8.0], [9.0], [7.0]]),
                               log_rewards=np.array([5.0, 0.5, 9.0, 5.0])))
    assert result.kept.tolist() == [0, 2] and result.ids.tolist() == [4, 5]
    assert result.evicted == 2
    assert buffer.get([4, 5]).states.tolist() == [[7.0], [9.0]]


def test_same_state_under_two_conditions_is_two_items(client, buffer_name):
    buffer = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=2)
    cond = np.array([[0.0], [1.0]], np.float32)
    buffer.add(States(np.array([[5.0, 5.0]] * 2, np.float32), np.array([0.0, 0.0]), cond))
    result = buffer.add(States(
        np.array([[3.0, 3.0]] * 3, np.float32), np.array([2.0, 1.0, 3.0]),
        np.array([[0.0], [1.0], [0.0]], np.float32),
    ))
    # (3,3|0) at 3.0 ranks first; (3,3|0) at 2.0 is its duplicate; (3,3|1) differs
    assert result.kept.tolist() == [1, 2]
    assert sorted(map(tuple, buffer.sample(2).conditions.tolist())) == [(0.0,), (1.0,)]
    assert client.hmget(buffer.keys.vecs, [b"%012d" % 3, b"%012d" % 4]) == [b"3,3,1", b"3,3,0"]


def test_until_full_everything_enters(client, buffer_name):
    buffer = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=5)
    batch = States(np.zeros((4, 2), np.float32), log_rewards=np.arange(4.0))
    assert buffer.add(batch).kept.tolist() == [0, 1, 2, 3]
    # one short of full: the batch enters whole, with reward eviction
    assert buffer.add(batch).kept.tolist() == [0, 1, 2, 3]
    assert len(buffer) == 5 and sorted(r for _, r in buffer.top(5)) == [1.0, 2.0, 2.0, 3.0, 3.0]
    assert buffer.add(batch).kept.tolist() == []  # full now: all duplicates


def test_trajectories_and_transitions_compare_terminating_states(client, buffer_name):
    buffer = NormBasedDiversePrioritizedReplayBuffer(client, f"{buffer_name}-t", capacity=1)
    states = torch.tensor([[[0.0]], [[4.0]], [[-1.0]]])  # (T+1=3, B=1, 1)
    traj = Trajectories(states, torch.zeros((2, 1, 1)), torch.tensor([2]), torch.tensor([1.0]))
    buffer.add(traj)
    assert client.hvals(buffer.keys.vecs) == [b"4"]
    assert buffer.add(traj).kept.tolist() == []
    transitions = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=2)
    batch = Transitions(np.array([[1.0], [2.0]]), np.full((2, 1), -1.0), np.zeros((2, 1)),
                        np.array([True, True]), np.array([0.0, 1.0]))
    transitions.add(batch)
    assert sorted(client.hvals(transitions.keys.vecs)) == [b"1", b"2"]
    before = snapshot(client, buffer_name)
    batch.is_terminating = np.array([True, False])
    with pytest.raises(InvalidBatchError, match="1 of 2 transitions are not terminating"):
        transitions.add(batch)
    with pytest.raises(SchemaError, match="not a dict"):
        transitions.add({"states": np.zeros((1, 1)), "log_rewards": np.zeros(1)})
    assert snapshot(client, buffer_name) == before


def test_what_it_refuses(client, buffer_name):
    with pytest.raises(ValueError, match="a manager is not supported"):
        NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, manager=ManagerLink(0))
    with pytest.raises(ValueError, match="prioritized_capacity=True"):
        NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, prioritized_capacity=False)
    with pytest.raises(ValueError, match="cutoff_distance must be a number"):
        NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, cutoff_distance=float("nan"))
    with pytest.raises(ValueError, match="p_norm_distance must be >= 0"):
        NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, p_norm_distance=-1.0)
    ReplayBuffer(client, f"{buffer_name}-fifo", capacity=2)
    with pytest.raises(ConfigMismatchError, match="prioritized_capacity or remover mismatch"):
        NormBasedDiversePrioritizedReplayBuffer(client, f"{buffer_name}-fifo", capacity=2)
    # filled by a plain writer: no vectors to compare against once full
    plain = ReplayBuffer(client, buffer_name, capacity=2, prioritized_capacity=True)
    plain.add(States(np.zeros((2, 1)), log_rewards=np.zeros(2)))
    diverse = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=2)
    before = snapshot(client, buffer_name)
    with pytest.raises(ConfigMismatchError, match="2 stored item.*no state vector"):
        diverse.add(States(np.ones((1, 1)), log_rewards=np.ones(1)))
    with pytest.raises(InvalidBatchError, match=r"items \[0\] are not finite"):
        diverse.add(States(np.full((1, 1), np.nan), log_rewards=np.ones(1)))
    assert snapshot(client, buffer_name) == before


def test_save_and_load_keep_the_vectors(client, buffer_name, tmp_path):
    buffer = NormBasedDiversePrioritizedReplayBuffer(client, buffer_name, capacity=3)
    cond = np.array([[1.0], [2.0], [3.0]], np.float32)
    buffer.add(States(np.arange(6.0).reshape(3, 2), np.array([0.0, 1.0, 2.0]), cond))
    vectors = sorted(client.hvals(buffer.keys.vecs))
    assert buffer.save(tmp_path / "d.rbuf") == 3
    copy = NormBasedDiversePrioritizedReplayBuffer(client, f"{buffer_name}-c", capacity=3)
    assert copy.load(tmp_path / "d.rbuf") == 3
    assert sorted(client.hvals(copy.keys.vecs)) == vectors == [b"0,1,1", b"2,3,2", b"4,5,3"]
    # the loaded buffer is full and checks against what it loaded
    assert copy.add(States(np.array([[2.0, 3.0]]), np.array([5.0]), cond[1:2])).kept.size == 0
    copy.load_state_dict(buffer.state_dict())
    assert sorted(client.hvals(copy.keys.vecs)) == vectors


def test_prioritized_sampling_on_a_diverse_buffer(client, buffer_name):
    buffer = NormBasedDiversePrioritizedReplayBuffer(
        client, buffer_name, capacity=4, prioritized_sampling=True, seed=0
    )
    buffer.add(States(np.arange(4.0)[:, None], log_rewards=np.array([0.0, 1.0, 2.0, 3.0])))
    assert sorted(buffer.sample(4).states[:, 0].tolist()) == [0.0, 1.0, 2.0, 3.0]


# -- several processes at once (real server) ------------------------------------------------

WORKERS, ROUNDS, CAPACITY, CUTOFF = 4, 30, 40, 1.0


def _worker(url: str, name: str, index: int, start, results) -> None:
    try:
        buffer = NormBasedDiversePrioritizedReplayBuffer(
            url, name, capacity=CAPACITY, cutoff_distance=CUTOFF, p_norm_distance=1.0
        )
        rng = np.random.default_rng(index)
        start.wait(timeout=60)
        for _ in range(ROUNDS):
            # every worker proposes states from the same small grid: collisions are likely
            states = rng.integers(0, 12, size=(8, 2)).astype(np.float32)
            buffer.add(States(states, log_rewards=rng.normal(size=8) + 5.0))
        results.put({"worker": index})
    except BaseException:  # noqa: BLE001 - reported to the parent as text
        results.put({"worker": index, "error": traceback.format_exc()})


@pytest.mark.multiprocess
@pytest.mark.redis_server
def test_processes_adding_at_once_keep_the_buffer_diverse(real_client, redis_server):
    name = f"div-{uuid.uuid4().hex[:8]}"
    seed = NormBasedDiversePrioritizedReplayBuffer(real_client, name, capacity=CAPACITY,
                                                   cutoff_distance=CUTOFF)
    # full of pairwise-distant states of low reward first, so every later add is checked
    grid = np.array([[100.0 + 3 * i, 0.0] for i in range(CAPACITY)], np.float32)
    seed.add(States(grid, log_rewards=np.zeros(CAPACITY)))
    ctx = fresh_context()
    start, results = ctx.Barrier(WORKERS), MessageQueue(ctx)
    processes = [ctx.Process(target=_worker, args=(redis_server.url, name, i, start, results))
                 for i in range(WORKERS)]
    for process in processes:
        process.start()
    reports = [results.get(timeout=120) for _ in range(WORKERS)]
    for process in processes:
        process.join(timeout=30)
    assert [r.get("error") for r in reports] == [None] * WORKERS
    stored = np.array([vec for vec, _ in _stored(real_client, name)])
    assert len(stored) == CAPACITY
    dist = np.abs(stored[:, None, :] - stored[None, :, :]).sum(-1)
    np.fill_diagonal(dist, np.inf)
    assert dist.min() > CUTOFF, "two processes stored states within the cutoff"
    assert (stored[:, 0] < 100).sum() > 10  # the workers' states did get in
