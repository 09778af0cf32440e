"""One manager and N workers sharing a HyperGrid replay buffer, over MPI.

    mpiexec -n 5 python -m redisbuf.examples.mpi_hypergrid [--iterations 50]

Rank 0 runs the :class:`~redisbuf.control.manager.ReplayBufferManager`; every other rank draws
trajectories of a random policy, ``add`` s them to the shared buffer in Redis (the data
plane) and gets back the manager's score and baseline over MPI (the control plane: small
msgpack messages, no pickle). Workers filter by the baseline, so once the buffer is full
they only report trajectories that would survive its prioritized eviction.

Redis: ``$REDISBUF_URL`` if set, else rank 0 starts a private server and tells the others
its URL.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np

from redisbuf import BufferKeys, ManagerLink, ReplayBuffer, connect
from redisbuf.control.manager import ReplayBufferManager
from redisbuf.envs import HyperGrid


def make_scoring_function(env: HyperGrid) -> Any:
    """Score = mean log-reward of the batch, plus how many distinct modes (cells of the
    highest reward) the manager has seen so far."""
    best = float(env.all_log_rewards().max())
    modes: set[tuple[int, ...]] = set()

    def score(batch: Any, sender_rank: int = -1) -> dict[str, float]:
        cells = np.asarray(batch.terminating_states)
        log_rewards = env.log_reward(cells) if len(cells) else np.zeros(0)
        for cell in cells[log_rewards >= best - 1e-9]:
            modes.add(tuple(int(x) for x in cell))
        return {
            "mean_log_reward": float(log_rewards.mean()) if len(cells) else float("nan"),
            "modes_found": float(len(modes)),
            "scored": float(len(cells)),
        }

    return score


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI

    from redisbuf.control.mpi import broadcast_text
    from redisbuf.servers.embedded import EmbeddedServer

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--name", default="mpi-hypergrid")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--capacity", type=int, default=1000)
    parser.add_argument("--baseline", choices=["min", "percentile", "ema"], default="min")
    parser.add_argument("--async-score", action="store_true")
    parser.add_argument("--ndim", type=int, default=2)
    parser.add_argument("--height", type=int, default=16)
    parser.add_argument("--timing", action="store_true")
    args = parser.parse_args(argv)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    if size < 2:
        parser.error("run with mpiexec -n 2 or more: rank 0 manages, the others train")
    env = HyperGrid(ndim=args.ndim, height=args.height)
    server = None
    url = os.environ.get("REDISBUF_URL")
    if rank == 0 and not url:
        server = EmbeddedServer().start()
        url = server.url
    url = broadcast_text(url if rank == 0 else None, root=0, comm=comm)

    if rank == 0:
        # a fresh run: forget a previous run's items and configuration
        connect(url).delete(*BufferKeys(args.name).all_keys())
        manager = ReplayBufferManager(
            url, 0, size - 1, scoring_function=make_scoring_function(env),
            capacity=args.capacity, baseline_strategy=args.baseline, timing=args.timing,
            name=args.name,
        )
        comm.Barrier()  # the buffer exists: workers may open it
        manager.run()
        meta = manager.metadata()
        print(
            f"[manager] {manager.exit_counter} EXITs; buffer {meta['length']}/"
            f"{meta['capacity']}, baseline {meta['baseline_log_reward']:.4f} "
            f"({meta['baseline_source']}), best {manager.buffer.top(1)[0][1]:.4f}",
            flush=True,
        )
    else:
        comm.Barrier()
        rng = np.random.default_rng(rank)
        buffer = ReplayBuffer(
            url, args.name, capacity=None,
            manager=ManagerLink(0, backend="mpi", async_score=args.async_score,
                                baseline_filtering=True, timing=args.timing),
        )
        score: dict[str, float] | None = None
        for _ in range(args.iterations):
            result = buffer.add(env.sample_trajectories(args.batch_size, rng))
            score = result.score or score
        score = buffer.drain_pending_score(30.0) or score
        remote = buffer.remote
        assert remote is not None
        print(
            f"[worker {rank}] sent {remote.sends}/{args.iterations} batches, kept "
            f"{remote.baseline_kept}/{remote.baseline_total} trajectories; last score {score}",
            flush=True,
        )
        ReplayBufferManager.send_termination_signal(0, buffer)
    comm.Barrier()  # every worker is done with Redis before the server goes
    if server is not None:
        server.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
