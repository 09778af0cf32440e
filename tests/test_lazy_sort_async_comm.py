"""torchgfn's lazy_sort and async_comm: accepted, with what they mean here."""

from __future__ import annotations

import numpy as np
from test_manager import Hub, Recorder, _batch, _manager, _worker

from redisbuf import ReplayBuffer


def test_lazy_sort_keeps_what_eager_eviction_keeps(client, buffer_name):
    rng = np.random.default_rng(0)
    lazy = ReplayBuffer(client, f"{buffer_name}-l", capacity=10, prioritized_capacity=True,
                        lazy_sort=True)
    eager = ReplayBuffer(client, f"{buffer_name}-e", capacity=10, prioritized_capacity=True)
    assert lazy.lazy_sort is True and eager.lazy_sort is False
    for _ in range(12):
        batch = {"x": rng.normal(size=(4, 2)), "log_rewards": rng.normal(size=4)}
        lazy.add(batch)
        eager.add(batch)
        assert len(lazy) <= 10  # no overshoot between flushes: there are none
        assert lazy.top(10) == eager.top(10)


def test_async_comm_collects_the_score_on_the_next_add(fake_client, buffer_name):
    hub, recorder = Hub(), Recorder()
    _manager(hub, fake_client, name=buffer_name, scoring_function=recorder)
    worker = _worker(fake_client, buffer_name, hub.worker(1), async_comm=True)
    assert worker.async_comm is True and worker.remote.async_score is True
    scores = [worker.add(_batch([1.0, 1.0], offset=100.0 * i)).score for i in range(3)]
    assert scores[0] is None
    assert [s["sum_x"] for s in scores[1:]] == [1.0, 201.0]
    assert worker.drain_pending_score(1.0)["sum_x"] == 401.0
