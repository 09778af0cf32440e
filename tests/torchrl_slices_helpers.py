"""Spawned workers of tests/test_torchrl_slices.py (importable by a spawned process)."""

from __future__ import annotations

from typing import Any

ENVS, STEPS, PER_WRITER = 4, 30, 2


def steps_of(first_env: int, n: int, steps: int, done_every: int = 10) -> Any:
    """A collector-like batch [n, steps]: env, step counter, obs, done every done_every."""
    import torch
    from tensordict import TensorDict

    step = torch.arange(steps).expand(n, steps).clone()
    env = (first_env + torch.arange(n))[:, None].expand(n, steps).clone()
    done = ((step + 1) % done_every == 0).unsqueeze(-1)
    return TensorDict({"env": env, "step": step, "obs": {"x": step.unsqueeze(-1) * 1.0},
                       "next": {"done": done}}, [n, steps])


def writer(url: str, name: str, first_env: int, results: Any) -> None:
    """Write environments first_env, first_env + 1 (30 steps each) through TorchRL."""
    try:
        from torchrl.data import TensorDictReplayBuffer

        from redisbuf.torchrl_slices import RedisbufSliceSampler, RedisbufSliceStorage

        storage = RedisbufSliceStorage(url, name, 400, num_environments=ENVS, env=first_env)
        rb = TensorDictReplayBuffer(storage=storage, sampler=RedisbufSliceSampler(slice_len=5))
        rb.extend(steps_of(first_env, PER_WRITER, STEPS))
        results.put({"src": first_env})
    except Exception as error:  # reported to the parent
        results.put({"src": first_env, "error": repr(error)})


def slice_reader(url: str, name: str, results: Any) -> None:
    """Sample 20 batches of 8 slices of 5 steps; report each slice's (env, steps, dones)."""
    try:
        from torchrl.data import TensorDictReplayBuffer

        from redisbuf.torchrl_slices import RedisbufSliceSampler, RedisbufSliceStorage

        storage = RedisbufSliceStorage(url, name, 400, num_environments=ENVS, seed=3)
        rb = TensorDictReplayBuffer(storage=storage, sampler=RedisbufSliceSampler(num_slices=8),
                                    batch_size=40)
        slices = []
        for _ in range(20):
            sample = rb.sample().reshape(8, -1)
            for row in range(8):
                slices.append((sample["env"][row].tolist(), sample["step"][row].tolist()))
        results.put({"src": "reader", "slices": slices})
    except Exception as error:  # reported to the parent
        results.put({"src": "reader", "error": repr(error)})


def epoch_reader(url: str, name: str, seed: int, barrier: Any, results: Any) -> None:
    """Once both readers are ready, sample one epoch without replacement (slices of 5);
    report each slice's (env, first step)."""
    try:
        from torchrl.data import TensorDictReplayBuffer

        from redisbuf.torchrl_slices import (
            RedisbufSliceSamplerWithoutReplacement,
            RedisbufSliceStorage,
        )

        storage = RedisbufSliceStorage(url, name, 400, num_environments=ENVS, seed=seed)
        rb = TensorDictReplayBuffer(
            storage=storage, batch_size=20,
            sampler=RedisbufSliceSamplerWithoutReplacement(slice_len=5))
        barrier.wait(timeout=120)
        drawn = []
        for batch in rb:
            rows = batch.reshape(-1, 5)
            drawn += [(int(rows["env"][r, 0]), int(rows["step"][r, 0]))
                      for r in range(rows.shape[0])]
        results.put({"src": seed, "slices": drawn})
    except Exception as error:  # reported to the parent
        results.put({"src": seed, "error": repr(error)})
