"""redisbuf.examples.torchrl_dqn: the two-process DQN on the shared buffer runs TorchRL's
schedule (a short run: plumbing, not learning)."""

from __future__ import annotations

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")
pytest.importorskip("gymnasium", reason="gymnasium is not importable (redisbuf[examples])")

from redisbuf.examples import torchrl_dqn  # noqa: E402


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_collector_and_learner_processes_share_the_buffer(redis_server):
    curve = torchrl_dqn.run_redisbuf(3000, seed=0, url=redis_server.url)
    # updates after each 1,000-frame batch from the first (init_random = 1,000 here), an
    # evaluation after each: the learner saw every batch the collector process inserted
    assert [frames for frames, _ in curve] == [1000, 2000, 3000]
    assert all(1 <= ret <= 500 for _, ret in curve)
