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


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_the_slice_variant_trains_on_slices_the_collector_process_appended(redis_server):
    curve = torchrl_dqn.run_redisbuf(2000, seed=0, url=redis_server.url, slices=True)
    assert [frames for frames, _ in curve] == [1000, 2000]
    assert all(1 <= ret <= 500 for _, ret in curve)


def test_the_slice_learner_sees_one_slice_per_row(client):
    """What the learner trains on: [16, 8] of consecutive steps of one episode, the last
    step of each row marked truncated (TD(lambda) bootstraps there)."""
    import torch
    from tensordict import TensorDict

    rb = torchrl_dqn.shared_buffer(client, "dqn-slices", seed=0, slices=True)
    step = torch.arange(40)
    rb.extend(TensorDict({"observation": torch.randn(40, 4), "step": step,
                          "next": {"done": ((step + 1) % 20 == 0).unsqueeze(-1)}}, [40]))
    batch = rb.sample(torchrl_dqn.BATCH_SIZE).reshape(-1, torchrl_dqn.SLICE_LEN)
    assert batch.shape == (16, 8)
    assert (batch["step"].diff(dim=1) == 1).all()
    assert (batch["step"][:, 0] // 20 == batch["step"][:, -1] // 20).all()  # one episode
    assert batch["next", "truncated"][:, -1].all() and not batch["next", "truncated"][:, :-1].any()
