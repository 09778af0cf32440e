"""torchgfn's trajectory-balance training on HyperGrid with a replay buffer, where the
buffer is redisbuf's: the script is plain torchgfn 2.4.1 code except for one import.

    python -m redisbuf.examples.torchgfn_hypergrid [--n-iterations 300] [--seed 0]

Redis comes from ``$REDISBUF_URL`` (or ``--url``). Needs ``pip install 'redisbuf[torchgfn]'``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch
from gfn.estimators import DiscretePolicyEstimator
from gfn.gflownet import TBGFlowNet
from gfn.gym import HyperGrid
from gfn.preprocessors import KHotPreprocessor
from gfn.utils.common import set_seed
from gfn.utils.modules import MLP

from redisbuf.torchgfn import (
    ReplayBuffer,  # was: from gfn.containers import ReplayBuffer
)


def train(
    seed: int = 0,
    ndim: int = 2,
    height: int = 8,
    batch_size: int = 16,
    n_iterations: int = 300,
    replay_buffer_size: int = 1000,
    prioritized: bool = True,
    n_validation_samples: int = 20_000,
    buffer_class: type = ReplayBuffer,
    **buffer_kwargs: Any,
) -> dict[str, float]:
    """Train, then return ``{"l1_dist": ..., "seconds": ...}`` (L1 distance between the
    sampler's empirical terminating-state distribution and the true one)."""
    set_seed(seed)
    env = HyperGrid(ndim=ndim, height=height, calculate_partition=True, store_all_states=True)
    preprocessor = KHotPreprocessor(height=env.height, ndim=env.ndim)
    module_pf = MLP(input_dim=preprocessor.output_dim, output_dim=env.n_actions)
    module_pb = MLP(
        input_dim=preprocessor.output_dim, output_dim=env.n_actions - 1, trunk=module_pf.trunk
    )
    pf = DiscretePolicyEstimator(module_pf, env.n_actions, preprocessor=preprocessor)
    pb = DiscretePolicyEstimator(
        module_pb, env.n_actions, preprocessor=preprocessor, is_backward=True
    )
    gflownet = TBGFlowNet(pf=pf, pb=pb, init_logZ=0.0)
    optimizer = torch.optim.Adam(gflownet.pf_pb_parameters(), lr=1e-3)
    optimizer.add_param_group({"params": gflownet.logz_parameters(), "lr": 1e-1})

    replay_buffer = buffer_class(
        env,
        capacity=replay_buffer_size,
        prioritized_capacity=prioritized,
        prioritized_sampling=prioritized,
        **buffer_kwargs,
    )
    began = time.perf_counter()
    for _ in range(n_iterations):
        trajectories = gflownet.sample_trajectories(env, n=batch_size, save_logprobs=False)
        training_samples = gflownet.to_training_samples(trajectories)
        with torch.no_grad():
            replay_buffer.add(training_samples)
            training_objects = replay_buffer.sample(n_samples=batch_size)
        optimizer.zero_grad()
        loss = gflownet.loss(env, training_objects, recalculate_all_logprobs=True)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - began
    close = getattr(replay_buffer, "close", None)
    if close is not None:
        close()
    metrics, _ = env.validate(gflownet, n_validation_samples=n_validation_samples)
    return {"l1_dist": float(metrics["l1_dist"]), "seconds": seconds, "loss": loss.item()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ndim", type=int, default=2)
    parser.add_argument("--height", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--n-iterations", type=int, default=300)
    parser.add_argument("--replay-buffer-size", type=int, default=1000)
    parser.add_argument("--url", default=None, help="Redis URL (default: $REDISBUF_URL)")
    args = parser.parse_args(argv)
    extra = {} if args.url is None else {"url": args.url}
    result = train(
        seed=args.seed, ndim=args.ndim, height=args.height, batch_size=args.batch_size,
        n_iterations=args.n_iterations, replay_buffer_size=args.replay_buffer_size, **extra,
    )
    print(
        f"{args.n_iterations} iterations in {result['seconds']:.1f} s; final loss "
        f"{result['loss']:.4f}; L1 distance to the true distribution {result['l1_dist']:.4f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
