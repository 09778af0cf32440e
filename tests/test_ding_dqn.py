"""redisbuf/examples/ding_dqn.py: DI-engine's DQN example with the buffer switched by its
import, collector and learner in two processes. Needs DI-engine 0.5.3 (not installed by
CI: it pins numpy<2 and gym 0.25.1); skipped without it."""

from __future__ import annotations

import pytest

pytest.importorskip("ding")
pytest.importorskip("dizoo")

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]


def test_two_processes_train_on_one_shared_buffer(redis_server, tmp_path) -> None:
    from redisbuf.examples.ding_dqn import run_two_processes

    curve = run_two_processes(0, 160, str(tmp_path), redis_server.url)
    assert curve, "the learner evaluated nothing"
    assert curve[0]["train_iter"] == 0
    steps = [point["env_step"] for point in curve]
    iters = [point["train_iter"] for point in curve]
    assert steps == sorted(steps) and iters == sorted(iters) and iters[-1] > 0
    # the learner trained on what the other process collected, at the example's ratio
    assert all(point["train_iter"] <= point["env_step"] * 5 / 8 + 5 for point in curve)
