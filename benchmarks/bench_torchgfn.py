"""The torchgfn drop-in against torchgfn 2.4.1's own buffer and manager, in one run.

1. Per-iteration overhead: one ``add`` of a batch of HyperGrid trajectories plus one
   ``sample`` of the same size, with ``gfn.containers.ReplayBuffer`` (in process) and with
   ``redisbuf.torchgfn.ReplayBuffer`` (Redis), prioritized capacity and sampling, capacity
   1000; next to the time of one trajectory-balance training iteration without a buffer.
2. Manager path: add + score round trips per second, batches of 64 and 512 HyperGrid
   trajectories, 1 and 2 trainers: torchgfn's ``ReplayBufferManager`` (torch.distributed
   gloo, the batch pickled to the manager) against the drop-in manager (the batch written
   to Redis, its ids sent over MPI, or over Redis lists with ``communication_backend=
   "redis"``). Target: the drop-in at least 5x torchgfn's.

    python benchmarks/bench_torchgfn.py [--rounds 30] [--repeats 3] [--skip-manager]
        [--skip-overhead] [--batches 64,512] [--trainers 1,2]

Every process uses one torch thread. Medians over alternating rounds; on a shared machine
compare the ratios, not the absolute figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from _report import record

HERE = Path(__file__).resolve()
WARMUP = 3
CAPACITY = 10_000
# torchgfn's manager, then the drop-in with each control backend
MODES = ("torchgfn", "redisbuf", "redisbuf-redis")


def _env(height: int = 16) -> Any:
    from gfn.gym import HyperGrid

    return HyperGrid(ndim=2, height=height)


def _trajectories(env: Any, n: int, count: int, seed: int = 0) -> list[Any]:
    import torch
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.preprocessors import KHotPreprocessor
    from gfn.samplers import Sampler
    from gfn.utils.modules import MLP

    torch.manual_seed(seed)
    pre = KHotPreprocessor(env.height, env.ndim)
    sampler = Sampler(DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions),
                                              env.n_actions, preprocessor=pre))
    out = []
    with torch.no_grad():
        for _ in range(count):
            batch = sampler.sample_trajectories(env, n=n)
            batch._log_rewards = batch.log_rewards.detach()
            out.append(batch)
    return out


def score(container: Any, sender_rank: int = -1) -> dict[str, float]:
    """The same scoring work on both sides: the mean log-reward of the batch."""
    return {"score": float(container.log_rewards.mean()) if len(container) else 0.0}


# -- 1. per-iteration overhead ------------------------------------------------------------


def _tb_iteration_ms(env: Any, batch: int, repeats: int) -> float:
    import torch
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gflownet import TBGFlowNet
    from gfn.preprocessors import KHotPreprocessor
    from gfn.utils.modules import MLP

    pre = KHotPreprocessor(env.height, env.ndim)
    pf = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions,
                                 preprocessor=pre)
    pb = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions - 1), env.n_actions,
                                 preprocessor=pre, is_backward=True)
    gflownet = TBGFlowNet(pf=pf, pb=pb)
    optimizer = torch.optim.Adam(gflownet.parameters(), lr=1e-3)
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        trajectories = gflownet.sample_trajectories(env, n=batch, save_logprobs=True)
        optimizer.zero_grad()
        gflownet.loss(env, trajectories, recalculate_all_logprobs=False).backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    return 1e3 * statistics.median(times)


def bench_overhead(url: str, rounds: int) -> None:
    from gfn.containers import ReplayBuffer as Theirs

    from redisbuf.torchgfn import ReplayBuffer as Ours

    env = _env(8)
    print("1. add + sample per iteration (HyperGrid 8x8, prioritized, capacity 1000), ms")
    print(f"{'batch':>6} {'torchgfn':>9} {'redisbuf':>9} {'extra':>7} {'TB iteration':>13} "
          f"{'extra / iteration':>18}")
    for batch in (16, 64):
        data = _trajectories(env, batch, 8)
        theirs = Theirs(env, 1000, prioritized_capacity=True, prioritized_sampling=True)
        ours = Ours(env, 1000, prioritized_capacity=True, prioritized_sampling=True, url=url)
        for _ in range(1000 // batch + 1):  # fill both to capacity first
            for buffer in (theirs, ours):
                buffer.add(data[0])
        times: dict[str, list[float]] = {"torchgfn": [], "redisbuf": []}
        for i in range(rounds):
            for label, buffer in (("torchgfn", theirs), ("redisbuf", ours)):
                began = time.perf_counter()
                buffer.add(data[i % len(data)])
                buffer.sample(batch)
                times[label].append(time.perf_counter() - began)
        ours.close()
        t = 1e3 * statistics.median(times["torchgfn"])
        r = 1e3 * statistics.median(times["redisbuf"])
        iteration = _tb_iteration_ms(env, batch, max(5, rounds // 4))
        print(f"{batch:>6} {t:>9.2f} {r:>9.2f} {r - t:>7.2f} {iteration:>13.1f} "
              f"{(r - t) / iteration:>17.1%}", flush=True)
        record(f"drop-in add + sample, batch {batch}", r, "ms", baseline=t,
               baseline_name="torchgfn's")


# -- 2. the manager path (children under mpiexec) ------------------------------------------


def _report(rank: int, rounds: int, elapsed: float) -> None:
    print("RESULT " + json.dumps({"rank": rank, "rounds": rounds, "elapsed": elapsed}), flush=True)


def child(mode: str, url: str, name: str, rounds: int, batch: int, port: int) -> None:
    import torch

    torch.set_num_threads(1)
    rank, size = int(os.environ["PMI_RANK"]), int(os.environ["PMI_SIZE"])
    env = _env()
    if mode == "torchgfn":
        import torch.distributed as dist
        from gfn.containers import ReplayBuffer
        from gfn.containers.replay_buffer_manager import ReplayBufferManager

        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=size)
        if rank == 0:
            ReplayBufferManager(env, 0, size - 1, scoring_function=score,
                                capacity=CAPACITY).run()
        else:
            data = _trajectories(env, batch, 4, seed=rank)
            buffer = ReplayBuffer(env, CAPACITY, prioritized_capacity=True,
                                  remote_manager_rank=0)
            _rounds(buffer, data, rounds, rank)
            ReplayBufferManager.send_termination_signal(0)
        dist.barrier()
        dist.destroy_process_group()
        return
    from mpi4py import MPI

    from redisbuf.torchgfn import ReplayBuffer, ReplayBufferManager

    comm = MPI.COMM_WORLD
    backend = "redis" if mode == "redisbuf-redis" else "mpi"
    if rank == 0:
        manager = ReplayBufferManager(env, 0, size - 1, score, capacity=CAPACITY, url=url,
                                      name=name, communication_backend=backend)
        if backend == "redis":
            manager.transport.start()  # workers wait for the manager's key
        comm.Barrier()
        manager.run()
    else:
        data = _trajectories(env, batch, 4, seed=rank)
        comm.Barrier()
        buffer = ReplayBuffer(env, CAPACITY, True, remote_manager_rank=0, url=url,
                              communication_backend=backend, manager_name=name)
        _rounds(buffer, data, rounds, rank)
        ReplayBufferManager.send_termination_signal(0, backend)
        buffer.close()
    comm.Barrier()


def _timed_adds(buffer: Any, data: list[Any], rounds: int, scored: bool) -> float:
    """Seconds ``rounds`` adds of ``data`` (cycled) take after WARMUP untimed ones, whose
    results must carry a manager's score when ``scored``."""
    for i in range(WARMUP):
        result = buffer.add(data[i % len(data)])
        if scored:
            assert "score" in result
    began = time.perf_counter()
    for i in range(rounds):
        buffer.add(data[i % len(data)])
    return time.perf_counter() - began


def _rounds(buffer: Any, data: list[Any], rounds: int, rank: int) -> None:
    _report(rank, rounds, _timed_adds(buffer, data, rounds, scored=True))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_manager(mode: str, trainers: int, url: str, rounds: int, batch: int) -> float:
    beside = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(beside) if beside.exists() else "mpiexec"
    name = f"bench-torchgfn-{os.getpid()}-{time.monotonic_ns()}"
    command = [mpiexec, "-n", str(trainers + 1), sys.executable, str(HERE), "--child", mode,
               url, name, str(rounds), str(batch), str(_free_port())]
    run = subprocess.run(command, capture_output=True, text=True, timeout=1200)
    out = run.stdout + run.stderr
    if run.returncode != 0:
        raise RuntimeError(f"{mode} failed:\n{out[-3000:]}")
    records = [json.loads(m) for m in re.findall(r"RESULT (\{[^}]*\})", out)]
    if len(records) != trainers:
        raise RuntimeError(f"{mode}: expected {trainers} results:\n{out[-3000:]}")
    return sum(r["rounds"] for r in records) / max(r["elapsed"] for r in records)


def _add_alone_rate(url: str, rounds: int, batch: int) -> float:
    """Adds per second of one drop-in worker with no manager (same trajectories, buffer
    and warm-up as a trainer): the part of a round trip the worker spends before it
    sends, so 5x torchgfn's rate is out of reach when this is not well above it."""
    from redisbuf.torchgfn import ReplayBuffer

    env = _env()
    data = _trajectories(env, batch, 4, seed=1)
    buffer = ReplayBuffer(env, CAPACITY, True, url=url)
    try:
        return rounds / _timed_adds(buffer, data, rounds, scored=False)
    finally:
        buffer.buffer.drop()
        buffer.close()


def bench_manager(url: str, rounds: int, repeats: int, batches: list[int],
                  trainer_counts: list[int]) -> None:
    print("2. manager path: add + score round trips per second (HyperGrid 16x16, "
          f"capacity {CAPACITY}, medians of {repeats})")
    print(f"{'batch':>6} {'trainers':>8} {'torchgfn (gloo)':>16} {'redisbuf (MPI)':>15} "
          f"{'ratio':>6} {'redisbuf (Redis)':>17} {'ratio':>6}")
    alone: dict[int, float] = {}
    for batch in batches:
        n = rounds if batch == 64 else max(5, rounds // 4)
        alone[batch] = statistics.median(_add_alone_rate(url, n, batch) for _ in range(repeats))
        for trainers in trainer_counts:
            n = rounds if batch == 64 else max(5, rounds // 4)
            rates: dict[str, list[float]] = {mode: [] for mode in MODES}
            for _ in range(repeats):
                for mode in MODES:
                    rates[mode].append(run_manager(mode, trainers, url, n, batch))
            t, m, r = (statistics.median(rates[mode]) for mode in MODES)
            print(f"{batch:>6} {trainers:>8} {t:>16.1f} {m:>15.1f} {m / t:>6.2f} {r:>17.1f} "
                  f"{r / t:>6.2f}", flush=True)
            for backend, value in (("MPI", m), ("Redis", r)):
                record(f"drop-in manager over {backend}, batch {batch}, trainers: {trainers}",
                       value, "round trips/s", baseline=t, baseline_name="torchgfn gloo",
                       target=">= 5")
            if trainers == 1:
                record(f"drop-in worker's add alone (no manager), batch {batch}", alone[batch],
                       "adds/s", baseline=t, baseline_name="torchgfn gloo round trips")
    for batch, rate in alone.items():
        print(f"one drop-in worker's add alone, no manager, batch {batch}: {rate:.1f} adds/s")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        mode, url, name, rounds, batch, port = sys.argv[2:8]
        child(mode, url, name, int(rounds), int(batch), int(port))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=os.environ.get("REDISBUF_URL"))
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--batches", default="64,512", help="manager path batch sizes")
    parser.add_argument("--trainers", default="1,2", help="manager path trainer counts")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--skip-manager", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    server = None
    url = args.url
    if url is None:
        from redisbuf.servers.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    try:
        if not args.skip_overhead:
            bench_overhead(url, args.rounds)
        if not args.skip_manager:
            bench_manager(url, args.rounds, args.repeats,
                          [int(b) for b in args.batches.split(",")],
                          [int(t) for t in args.trainers.split(",")])
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
