"""Four torchgfn trainers share one replay buffer through a manager, over MPI.

    mpiexec -n 5 python -m redisbuf.examples.torchgfn_mpi_hypergrid [--n-iterations 200]

Rank 0 runs the drop-in ``ReplayBufferManager`` (torchgfn's constructor and ``run``);
ranks 1..N train trajectory balance on HyperGrid with torchgfn's code. Every trainer's
``ReplayBuffer`` names the manager's buffer (``name=``), so all of them add to and sample
from one prioritized buffer in Redis; the manager scores each batch (modes found so far)
and replies over MPI with the baseline. The only redisbuf-specific lines are the imports
and ``url=`` / ``name=``.

Redis: ``$REDISBUF_URL`` if set, else rank 0 starts a private server and tells the others
its URL. Needs ``pip install 'redisbuf[torchgfn,mpi]'``.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import torch
from gfn.estimators import DiscretePolicyEstimator
from gfn.gflownet import TBGFlowNet
from gfn.gym import HyperGrid
from gfn.preprocessors import KHotPreprocessor
from gfn.utils.common import set_seed
from gfn.utils.modules import MLP

from redisbuf.torchgfn import DEFAULT_MANAGER_NAME, ReplayBuffer, ReplayBufferManager


def make_scoring_function(env: HyperGrid) -> Any:
    """Score = mean log-reward of the batch and the number of distinct highest-reward
    cells the manager has seen."""
    best = float(env.log_reward(env.all_states).max())
    modes: set[tuple[int, ...]] = set()

    def score(container: Any, sender_rank: int = -1) -> dict[str, float]:
        states = container.terminating_states.tensor
        log_rewards = container.log_rewards
        for cell in states[log_rewards >= best - 1e-6].tolist():
            modes.add(tuple(cell))
        return {"mean_log_reward": float(log_rewards.mean()), "modes_found": float(len(modes))}

    return score


def trainer(env: HyperGrid, args: argparse.Namespace, url: str, rank: int) -> None:
    set_seed(args.seed + rank)
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
    replay_buffer = ReplayBuffer(
        env,
        capacity=args.capacity,
        prioritized_capacity=True,
        prioritized_sampling=True,
        remote_manager_rank=0,
        communication_backend="mpi",
        url=url,
        name=args.name,  # the manager's buffer: every trainer shares it
    )
    score: dict[str, float] | None = None
    for _ in range(args.n_iterations):
        trajectories = gflownet.sample_trajectories(env, n=args.batch_size)
        with torch.no_grad():
            score = replay_buffer.add(gflownet.to_training_samples(trajectories)) or score
            training_objects = replay_buffer.sample(n_samples=args.batch_size)
        optimizer.zero_grad()
        loss = gflownet.loss(env, training_objects, recalculate_all_logprobs=True)
        loss.backward()
        optimizer.step()
    print(
        f"[trainer {rank}] {args.n_iterations} iterations, loss {loss.item():.3f}, "
        f"shared buffer {len(replay_buffer)}/{args.capacity}, last score {score}",
        flush=True,
    )
    ReplayBufferManager.send_termination_signal(0, "mpi")


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI

    from redisbuf.control.mpi import broadcast_text
    from redisbuf.servers.embedded import EmbeddedServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default=DEFAULT_MANAGER_NAME)
    parser.add_argument("--n-iterations", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--height", type=int, default=8)
    args = parser.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        parser.error("run with mpiexec -n 2 or more: rank 0 manages, the others train")
    env = HyperGrid(ndim=2, height=args.height, store_all_states=True)
    server = None
    url = os.environ.get("REDISBUF_URL")
    if rank == 0 and not url:
        server = EmbeddedServer().start()
        url = server.url
    url = broadcast_text(url if rank == 0 else None, root=0, comm=comm)

    if rank == 0:
        manager = ReplayBufferManager(
            env, 0, size - 1, make_scoring_function(env), capacity=args.capacity,
            url=url, name=args.name,
        )
        comm.Barrier()  # the shared buffer exists: trainers may open it
        manager.run()
        meta = manager.metadata()
        print(
            f"[manager] {manager.exit_counter} EXITs; buffer {meta['length']}/"
            f"{meta['capacity']}; baseline {meta['baseline_log_reward']}",
            flush=True,
        )
    else:
        comm.Barrier()
        trainer(env, args, url, rank)
    comm.Barrier()  # every rank is done with Redis before the server goes
    if server is not None:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
