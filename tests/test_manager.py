"""Manager and worker-side remote scoring, in one process over a loopback transport."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict, deque
from typing import Any

import numpy as np
import pytest
import torch

from redisbuf import ManagerLink, ReplayBuffer, States, Transitions
from redisbuf.control.manager import ReplayBufferManager, default_scoring_function
from redisbuf.control.protocol import DATA_TAG, METADATA_TAG, decode, request
from redisbuf.envs import HyperGrid
from redisbuf.errors import ControlTimeoutError, InvalidBatchError, ProtocolError
from redisbuf.store.codec import packb


class Hub:
    """In-memory message passing. With ``auto`` the manager handles each request as it
    is sent (deterministic, no threads); otherwise requests queue for ``run()``."""

    def __init__(self, auto: bool = True) -> None:
        self.auto = auto
        self.manager: ReplayBufferManager | None = None
        self.requests: deque[tuple[int, bytes]] = deque()
        self.replies: dict[tuple[int, int], deque[bytes]] = defaultdict(deque)

    def worker(self, rank: int) -> WorkerEnd:
        return WorkerEnd(self, rank)


class ManagerEnd:
    rank = 0

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.closed = False

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        self.hub.replies[(dest, tag)].append(payload)

    def recv(self, source: int, tag: int, timeout: float | None) -> tuple[int, bytes]:
        if not self.hub.requests:
            raise ControlTimeoutError("loopback: no request")
        return self.hub.requests.popleft()

    def check_peers(self, done: set[int]) -> None:
        return None

    def close(self) -> None:
        self.closed = True


class WorkerEnd:
    def __init__(self, hub: Hub, rank: int) -> None:
        self.hub, self.rank = hub, rank
        self.sent: list[dict[str, Any]] = []

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        try:
            self.sent.append(decode(payload))
        except ProtocolError:
            self.sent.append({"raw": payload})
        self.hub.requests.append((self.rank, payload))
        if self.hub.auto and self.hub.manager is not None:
            sender, message = self.hub.requests.popleft()
            self.hub.manager._handle(sender, message, 0.0)

    def recv(self, source: int, tag: int, timeout: float | None) -> tuple[int, bytes]:
        queue = self.hub.replies[(self.rank, tag)]
        if not queue:
            raise ControlTimeoutError("loopback: no reply")
        return 0, queue.popleft()

    def check_peers(self, done: set[int]) -> None:
        return None

    def close(self) -> None:
        return None


def _manager(hub: Hub, buffer: Any, workers: int = 1, **kwargs: Any) -> ReplayBufferManager:
    manager = ReplayBufferManager(buffer, 0, workers, transport=ManagerEnd(hub), **kwargs)
    hub.manager = manager
    return manager


def _worker(client: Any, name: str, end: WorkerEnd, capacity: int | None = None, **link: Any):
    return ReplayBuffer(
        client, name, capacity=capacity, prioritized_capacity=True,
        manager=ManagerLink(0, backend=end, **link),
    )


def _batch(values: list[float], offset: float = 0.0) -> dict[str, np.ndarray]:
    log_rewards = np.asarray(values, dtype=np.float64)
    return {"x": np.arange(len(values), dtype=np.float32) + offset, "log_rewards": log_rewards}


class Recorder:
    """A scoring function that remembers what it scored."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, int]] = []

    def __call__(self, batch: Any, sender_rank: int = -1) -> dict[str, float]:
        self.calls.append((batch, sender_rank))
        x = np.asarray(batch["x"])
        return {"n": float(len(x)), "sum_x": float(x.sum()), "rank": float(sender_rank)}


def test_score_of_the_added_items_comes_back_to_the_sender(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    _manager(hub, fake_client, name=buffer_name, capacity=1000, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(3))
    result = worker.add(_batch([0.5, 1.0, 2.0], offset=10.0))
    assert result.score == {"n": 3.0, "sum_x": 33.0, "rank": 3.0, "baseline_log_reward": 0.5}
    batch, sender = recorder.calls[0]
    assert sender == 3
    np.testing.assert_array_equal(np.asarray(batch["x"]), [10.0, 11.0, 12.0])
    np.testing.assert_array_equal(np.asarray(batch["log_rewards"]), [0.5, 1.0, 2.0])
    assert len(result.ids) == 3 and len(worker) == 3  # the data went through Redis


def test_default_scoring_function_scores_inf():
    assert default_scoring_function(None, sender_rank=1) == {"score": math.inf}


def test_every_kth_add_sends_what_accumulated(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    _manager(hub, fake_client, name=buffer_name, scoring_function=recorder)
    end = hub.worker(1)
    worker = _worker(fake_client, buffer_name, end, buffer_freq=3)
    assert worker.add(_batch([1.0, 2.0])).score is None
    assert worker.add(_batch([3.0])).score is None
    assert end.sent == []
    score = worker.add(_batch([4.0, 5.0, 6.0])).score
    assert score["n"] == 6.0 and len(end.sent) == 1
    assert end.sent[0]["log_rewards"] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]


def test_async_score_returns_the_previous_sends_score(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    _manager(hub, fake_client, name=buffer_name, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_score=True)
    scores = [worker.add(_batch([1.0, 1.0], offset=100.0 * i)).score for i in range(4)]
    assert scores[0] is None
    # batch i has x = [100 i, 100 i + 1]; add i + 1 returns batch i's score
    assert [s["sum_x"] for s in scores[1:]] == [1.0, 201.0, 401.0]
    assert worker.drain_pending_score(1.0)["sum_x"] == 601.0
    assert worker.drain_pending_score(1.0) is None


def test_metadata_arrives_on_its_tag_while_a_score_is_pending(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    _manager(hub, fake_client, name=buffer_name, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_score=True)
    assert worker.add(_batch([1.0, 2.0])).score is None
    assert len(hub.replies[(1, DATA_TAG)]) == 1  # the score waits, uncollected
    metadata = ReplayBufferManager.get_metadata(0, worker)
    assert metadata["length"] == 2 and metadata["requests"] == 2
    assert metadata["baseline_log_reward"] == 1.0
    assert len(hub.replies[(1, DATA_TAG)]) == 1  # metadata did not consume it
    assert worker.drain_pending_score(1.0)["n"] == 2.0


def test_compute_metadata_is_merged_into_the_reply(fake_client, buffer_name):
    class Custom(ReplayBufferManager):
        def compute_metadata(self) -> dict[str, Any]:
            return {"modes": 7}

    hub = Hub()
    hub.manager = Custom(fake_client, 0, 1, name=buffer_name, transport=ManagerEnd(hub))
    metadata = ReplayBufferManager.get_metadata(0, hub.worker(1))
    assert metadata["modes"] == 7 and metadata["capacity"] == 10000


def test_baseline_filtering_and_refresh(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    # alpha = 1: the baseline is the smallest finite log-reward of the last batch sent
    _manager(hub, fake_client, name=buffer_name, scoring_function=recorder,
             baseline_strategy="ema", baseline_ema_alpha=1.0)
    end = hub.worker(1)
    worker = _worker(fake_client, buffer_name, end, baseline_filtering=True,
                     baseline_refresh_after=2)
    remote = worker.remote
    assert worker.add(_batch([0.0, 1.0, 2.0, 3.0])).score["baseline_log_reward"] == 0.0
    score = worker.add(_batch([-1.0, 0.5, 0.0, 2.0])).score
    assert end.sent[-1]["log_rewards"] == [0.5, 0.0, 2.0]  # >= baseline, ties included
    assert score["n"] == 3.0 and remote.baseline_log_reward == 0.0
    assert worker.add(_batch([-5.0, -4.0])).score is None  # fully filtered: no send
    assert worker.add(_batch([-5.0])).score is None
    assert len(end.sent) == 2 and remote.baseline_skipped_sends == 2
    assert len(worker) == 4 + 4 + 2 + 1  # filtering limits what is sent, not what is stored
    score = worker.add(_batch([-6.0, -7.0])).score  # refresh: sent whole
    assert end.sent[-1]["log_rewards"] == [-6.0, -7.0]
    assert score["baseline_log_reward"] == -7.0 and remote.baseline_log_reward == -7.0
    assert remote.consecutive_filtered_empty == 0
    assert (remote.baseline_kept, remote.baseline_total) == (4 + 3 + 2, 4 + 4 + 2 + 1 + 2)


def test_filtering_needs_log_rewards_and_refuses_transitions(fake_client, buffer_name):
    hub = Hub()
    _manager(hub, fake_client, name=buffer_name + "m")
    worker = ReplayBuffer(fake_client, buffer_name, capacity=10, manager=ManagerLink(
        0, backend=hub.worker(1), baseline_filtering=True))
    with pytest.raises(InvalidBatchError, match="log_rewards"):
        worker.add({"x": np.zeros(2)})
    transitions = Transitions(states=np.zeros((2, 1)), next_states=np.ones((2, 1)),
                              actions=np.zeros(2), is_terminating=np.ones(2, dtype=bool),
                              log_rewards=np.zeros(2))
    other = ReplayBuffer(fake_client, buffer_name + "t", capacity=10, manager=ManagerLink(
        0, backend=hub.worker(2), baseline_filtering=True))
    with pytest.raises(InvalidBatchError, match="Transitions"):
        other.add(transitions)


def test_scoring_only_sends_terminating_states_inline(fake_client, buffer_name):
    hub, seen = Hub(), []
    _manager(hub, fake_client, name=buffer_name,
             scoring_function=lambda batch, sender_rank: seen.append(batch) or {"n": len(batch)})
    end = hub.worker(1)
    worker = _worker(fake_client, buffer_name, end, scoring_only=True, buffer_freq=2)
    env, rng = HyperGrid(2, 6), np.random.default_rng(0)
    first, second = env.sample_trajectories(5, rng), env.sample_trajectories(3, rng)
    assert worker.add(first).score is None
    assert worker.add(second).score["n"] == 8.0
    assert end.sent[0]["inline"] is not None
    (states,) = seen
    assert isinstance(states, States)
    expected = torch.cat([first.terminating_states, second.terminating_states])
    assert torch.equal(torch.as_tensor(states.states), expected)
    assert torch.equal(torch.as_tensor(states.log_rewards),
                       torch.cat([first.log_rewards, second.log_rewards]))


def test_store_locally_copies_from_a_private_worker_buffer(fake_client, buffer_name):
    for store in (True, False):
        hub, recorder = Hub(), Recorder()
        manager = _manager(hub, fake_client, name=f"{buffer_name}-{store}", capacity=100,
                           scoring_function=recorder, store_locally=store)
        worker = ReplayBuffer(fake_client, f"{buffer_name}-w{store}", capacity=50,
                              manager=ManagerLink(0, backend=hub.worker(1)))
        assert worker.add(_batch([1.0, 2.0, 3.0])).score["n"] == 3.0
        assert len(manager.buffer) == (3 if store else 0)


def test_items_evicted_before_scoring_are_left_out(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    manager = _manager(hub, fake_client, name=buffer_name, capacity=4, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(1), capacity=4)
    score = worker.add(_batch([5.0, 0.0, 4.0, 1.0, 3.0, 2.0])).score
    assert score["n"] == 4.0 and manager.missing_items == 2
    np.testing.assert_array_equal(np.sort(np.asarray(recorder.calls[0][0]["log_rewards"])),
                                  [2.0, 3.0, 4.0, 5.0])
    assert score["baseline_log_reward"] == 2.0  # full: min of the buffer


def test_run_stops_after_one_exit_per_rank(fake_client, buffer_name, capsys):
    hub = Hub(auto=False)
    manager = _manager(hub, fake_client, workers=2, name=buffer_name, timing=True,
                       poll_interval=0.01, idle_timeout=2.0)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_score=True)
    ids = worker.add(_batch([1.0])).ids  # a send of rank 1, queued (auto is off)
    hub.requests.extend([(1, request("exit")), (1, request("exit")), (2, request("metadata"))])
    hub.requests.append((2, request("exit")))
    manager.run()
    assert manager.exit_counter == 2 and manager.exited == {1, 2}
    assert not manager.is_running and manager.transport.closed
    assert decode(hub.replies[(1, DATA_TAG)][0])["score"] == {"score": math.inf,
                                                             "baseline_log_reward": 1.0}
    assert decode(hub.replies[(2, METADATA_TAG)][0])["op"] == "metadata"
    assert len(ids) == 1
    out = capsys.readouterr().out
    assert "timing per rank" in out and "\n    1         3" in out


def test_run_gives_up_when_idle_past_the_timeout(fake_client, buffer_name):
    hub = Hub(auto=False)
    manager = _manager(hub, fake_client, name=buffer_name, poll_interval=0.01,
                       idle_timeout=0.2)
    with pytest.raises(ControlTimeoutError, match="0 of 1 workers sent EXIT"):
        manager.run()


def test_scoring_errors_and_bad_requests_reach_the_worker(fake_client, buffer_name):
    def broken(batch: Any, sender_rank: int = -1) -> dict[str, float]:
        raise RuntimeError("scorer exploded")

    hub = Hub()
    _manager(hub, fake_client, name=buffer_name, scoring_function=broken)
    end = hub.worker(1)
    worker = _worker(fake_client, buffer_name, end)
    with pytest.raises(ProtocolError, match="scorer exploded"):
        worker.add(_batch([1.0]))
    end.send(0, DATA_TAG, request("dance"))
    assert "unknown op" in decode(hub.replies[(1, DATA_TAG)].popleft())["error"]
    end.send(0, DATA_TAG, packb({"v": 99, "op": "metadata"}))
    assert "protocol version" in decode(hub.replies[(1, DATA_TAG)].popleft())["error"]
    end.send(0, DATA_TAG, b"\xc1")
    assert "undecodable" in decode(hub.replies[(1, DATA_TAG)].popleft())["error"]


def test_drain_pending_score_times_out_instead_of_hanging(fake_client, buffer_name):
    hub = Hub(auto=False)  # nobody answers
    _manager(hub, fake_client, name=buffer_name)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_score=True)
    assert worker.add(_batch([1.0])).score is None
    assert worker.remote.pending_score
    assert worker.drain_pending_score(0.05) is None
    assert not worker.remote.pending_score


def test_a_late_reply_after_a_timed_out_drain_is_skipped(fake_client, buffer_name):
    hub, recorder = Hub(auto=False), Recorder()
    manager = _manager(hub, fake_client, name=buffer_name, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_score=True)
    worker.add(_batch([1.0], offset=1.0))
    assert worker.drain_pending_score(0.01) is None
    manager._handle(*hub.requests.popleft(), 0.0)  # the late reply of send 1
    hub.auto = True
    worker.add(_batch([1.0], offset=7.0))
    assert worker.drain_pending_score(1.0)["sum_x"] == 7.0


def test_unsupported_and_misconfigured_managers_raise(fake_client, buffer_name):
    with pytest.raises(NotImplementedError, match="diverse"):
        ReplayBufferManager(fake_client, 0, 1, name=buffer_name, diverse_replay_buffer=True,
                            transport=ManagerEnd(Hub()))
    with pytest.raises(ValueError, match="name="):
        ReplayBufferManager(fake_client, 0, 1, transport=ManagerEnd(Hub()))
    with pytest.raises(ValueError, match="communication_backend"):
        ReplayBufferManager(fake_client, 0, 1, name=buffer_name, communication_backend="tcp")
    with pytest.raises(ValueError, match="communication_backend"):
        ManagerLink(0, backend="gloo")
    for field, value in (("rank", -1), ("buffer_freq", 0), ("baseline_refresh_after", 0),
                         ("rank", True)):
        with pytest.raises(ValueError, match=f"{field} must be an integer"):
            ManagerLink(**{"rank": 0, field: value})
    with pytest.raises(TypeError, match="not a control transport"):
        ManagerLink(0, backend=object())
    with pytest.raises(TypeError, match="ManagerLink"):
        ReplayBuffer(fake_client, buffer_name + "w", capacity=4, manager=0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        ManagerLink(0).rank = 1  # type: ignore[misc]


def _copy_run(client: Any, name: str, one_call: bool, monkeypatch: Any) -> dict[str, Any]:
    """A private worker buffer (capacity 5) feeding a manager buffer (capacity 6, reward
    eviction) with percentile baselines; returns what each side ended with."""
    hub, recorder = Hub(), Recorder()
    manager = _manager(hub, client, name=f"{name}-m", capacity=6, scoring_function=recorder,
                       baseline_strategy="percentile", baseline_percentile=0.3)
    if not one_call:
        monkeypatch.setattr(manager, "_one_call", lambda *args: False)
    worker = _worker(client, f"{name}-w", hub.worker(2), capacity=5)
    rng = np.random.default_rng(7)
    scores = []
    for step in range(6):
        values = rng.normal(0.0, 2.0, int(rng.integers(1, 8))).tolist()
        if step == 2:
            values[0] = math.inf
        scores.append(worker.add(_batch(values, offset=10.0 * step)).score)
    stored = manager.buffer.client.zrange(manager.buffer.keys.prio, 0, -1, withscores=True)
    return {
        "scores": scores,
        "scored_x": [np.asarray(batch["x"]).tolist() for batch, _ in recorder.calls],
        "stored": [score for _, score in stored],
        "x": sorted(np.asarray(manager.buffer.sample(len(manager.buffer))["x"]).tolist())
        if len(manager.buffer) else [],
        "missing": manager.missing_items,
        "ema": manager.buffer.client.hget(manager.buffer.keys.meta, "baseline_ema"),
        "stats": {k: v for k, v in manager.buffer.stats().items()
                  if k in ("length", "inserted", "evicted", "last_id")},
    }


def test_one_call_copy_and_baseline_match_the_step_by_step_path(client, buffer_name, monkeypatch):
    # lua/manager_score.lua must do what HMGET + decode + add + baseline.lua did
    fast = _copy_run(client, f"{buffer_name}-a", True, monkeypatch)
    slow = _copy_run(client, f"{buffer_name}-b", False, monkeypatch)
    assert fast == slow
    assert fast["missing"] > 0  # batches over the worker's capacity were part of the run
    assert fast["stats"]["evicted"] > 0 and math.inf in fast["stored"]


def test_a_request_costs_the_manager_one_server_call(real_client, buffer_name):
    hub = Hub()
    manager = _manager(hub, real_client, name=f"{buffer_name}-m", capacity=100)
    worker = _worker(real_client, f"{buffer_name}-w", hub.worker(1), capacity=100)
    worker.add(_batch([1.0]))  # the first add fixes the schemas and opens the source
    real_client.config_resetstat()
    assert worker.add(_batch([1.0, 2.0, 3.0])).score["baseline_log_reward"] == 1.0
    stats = real_client.info("commandstats")
    # the worker's add (a reserve call, then the commit inside MULTI/EXEC) and one call
    # for the manager's read + copy + baseline
    assert stats["cmdstat_fcall"]["calls"] == 3
    assert stats["cmdstat_exec"]["calls"] == 1
    assert len(manager.buffer) == 4


def test_a_copy_that_does_not_fit_the_manager_buffer_writes_nothing(client, buffer_name):
    hub = Hub()
    manager = _manager(hub, client, name=f"{buffer_name}-m", capacity=100)
    manager.buffer.add({"y": np.zeros(2, dtype=np.int64), "log_rewards": np.zeros(2)})
    counters = ("length", "inserted", "evicted", "last_id")
    before = {k: manager.buffer.stats()[k] for k in counters}
    ema_before = client.hget(manager.buffer.keys.meta, "baseline_ema")
    worker = _worker(client, f"{buffer_name}-w", hub.worker(1), capacity=100)
    with pytest.raises(ProtocolError, match="do not fit buffer"):
        worker.add(_batch([1.0, 2.0]))
    assert {k: manager.buffer.stats()[k] for k in counters} == before
    assert client.hget(manager.buffer.keys.meta, "baseline_ema") == ema_before
