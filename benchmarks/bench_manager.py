"""add + score round trips per second with 1, 2 and 4 workers and one manager.

Compared in the same run:

* ``pickle-mpi``: the seed system's exchange (torchgfn): each worker pickles its whole
  batch to the manager with mpi4py's ``comm.send``; the manager unpickles it, scores it,
  keeps it in memory (FIFO), updates an EMA baseline and ``comm.send`` s the score dict.
* ``redisbuf-mpi``: ``ReplayBuffer.add`` with a remote manager over MPI: the batch goes into
  the shared Redis buffer (one Lua call), a small msgpack message names the new ids, the
  manager reads them back and computes the baseline in one Lua call, scores them, replies.
* ``redisbuf-redis``: the same, with the control messages through Redis lists instead of
  MPI (processes that mpiexec did not start).

One round trip = one batch of ``--batch`` HyperGrid trajectories added and its score
received. Rate = all workers' round trips / the slowest worker's time, after a warm-up.

    python benchmarks/bench_manager.py [--rounds 100] [--batch 64]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from _report import record

HERE = Path(__file__).resolve()
WARMUP = 5
CAPACITY = 10000


def _batches(batch: int, seed: int) -> list[Any]:
    from redisbuf.envs import HyperGrid

    env, rng = HyperGrid(ndim=2, height=16), np.random.default_rng(seed)
    return [env.sample_trajectories(batch, rng) for _ in range(8)]


def score_batch(batch: Any, sender_rank: int = -1) -> dict[str, float]:
    """The same scoring work on both sides: mean log-reward of the batch."""
    return {"score": float(np.asarray(batch.log_rewards).mean()) if len(batch) else 0.0}


def _report(rank: int, rounds: int, elapsed: float) -> None:
    print("RESULT " + json.dumps({"rank": rank, "rounds": rounds, "elapsed": elapsed}), flush=True)


# -- children under mpiexec ------------------------------------------------------------------


def child_mpi(mode: str, url: str, name: str, rounds: int, batch: int) -> None:
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    workers = comm.Split(0 if rank else MPI.UNDEFINED, rank)
    if rank == 0:
        if mode == "pickle":
            _pickle_manager(comm, size - 1)
        else:
            from redisbuf.control.manager import ReplayBufferManager

            manager = ReplayBufferManager(url, 0, size - 1, scoring_function=score_batch,
                                          capacity=CAPACITY, name=name)
            comm.Barrier()
            manager.run()
        return
    batches = _batches(batch, rank)
    if mode == "pickle":
        def exchange(b: Any) -> Any:
            comm.send(b, dest=0, tag=0)  # pickles the whole batch (the seed's approach)
            return comm.recv(source=0, tag=0)
    else:
        from redisbuf import ManagerLink, ReplayBuffer

        comm.Barrier()
        buffer = ReplayBuffer(url, name, capacity=None, manager=ManagerLink(0, backend="mpi"))

        def exchange(b: Any) -> Any:
            return buffer.add(b).score
    for i in range(WARMUP):
        exchange(batches[i % len(batches)])
    workers.Barrier()
    began = time.perf_counter()
    for i in range(rounds):
        assert exchange(batches[i % len(batches)]) is not None
    elapsed = time.perf_counter() - began
    workers.Barrier()
    _report(rank, rounds, elapsed)
    if mode == "pickle":
        comm.send("EXIT", dest=0, tag=0)
    else:
        from redisbuf.control.manager import ReplayBufferManager

        ReplayBufferManager.send_termination_signal(0, "mpi")


def _pickle_manager(comm: Any, workers: int) -> None:
    """A stand-in for torchgfn's manager loop: recv (unpickle), score, store, reply."""
    from collections import deque

    from mpi4py import MPI

    stored: deque[Any] = deque(maxlen=max(1, CAPACITY // 64))
    ema, exits, status = None, 0, MPI.Status()
    while exits < workers:
        obj = comm.recv(source=MPI.ANY_SOURCE, tag=0, status=status)
        if isinstance(obj, str) and obj == "EXIT":
            exits += 1
            continue
        score = score_batch(obj)
        stored.append(obj)
        finite = np.asarray(obj.log_rewards)[np.isfinite(np.asarray(obj.log_rewards))]
        if finite.size:
            low = float(finite.min())
            ema = low if ema is None else 0.1 * low + 0.9 * ema
            score["baseline_log_reward"] = ema
        comm.send(score, dest=status.Get_source(), tag=0)


# -- children over the Redis control plane ---------------------------------------------------


def child_redis(role: str, index: int, workers: int, url: str, name: str, rounds: int,
                batch: int) -> None:
    from redisbuf import ManagerLink, ReplayBuffer, connect
    from redisbuf.control.manager import ReplayBufferManager
    from redisbuf.control.redis import RedisWorkerTransport

    client = connect(url)
    if role == "manager":
        ReplayBufferManager(client, 0, workers, scoring_function=score_batch,
                            capacity=CAPACITY, name=name, communication_backend="redis").run()
        return
    batches = _batches(batch, index)
    transport = RedisWorkerTransport(client, name, connect_timeout=60.0)
    transport.connect()
    buffer = ReplayBuffer(client, name, capacity=None, manager=ManagerLink(0, backend=transport))
    for i in range(WARMUP):
        buffer.add(batches[i % len(batches)])
    gate = f"bench:{name}:gate"
    client.incr(gate)
    while int(client.get(gate)) < workers:  # start together, like the MPI barrier
        time.sleep(0.001)
    began = time.perf_counter()
    for i in range(rounds):
        assert buffer.add(batches[i % len(batches)]).score is not None
    elapsed = time.perf_counter() - began
    _report(index, rounds, elapsed)
    ReplayBufferManager.send_termination_signal(0, buffer)


# -- parent --------------------------------------------------------------------------------


def _rate(output: str) -> float:
    # mpiexec may splice the lines of several ranks together: find each record itself
    results = [json.loads(m) for m in re.findall(r"RESULT (\{[^{}]*\})", output)]
    if not results:
        raise RuntimeError(f"no results in child output:\n{output[-2000:]}")
    return sum(r["rounds"] for r in results) / max(r["elapsed"] for r in results)


def _mpiexec() -> str:
    beside = Path(sys.executable).parent / "mpiexec"
    return str(beside) if beside.exists() else "mpiexec"


def run_mpi(mode: str, workers: int, url: str, rounds: int, batch: int) -> float:
    name = f"bench-{mode}-{workers}-{os.getpid()}"
    command = [_mpiexec(), "-n", str(workers + 1), sys.executable, str(HERE), "--child", mode,
               "--url", url, "--name", name, "--rounds", str(rounds), "--batch", str(batch)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"{mode} job failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return _rate(done.stdout)


def run_redis(workers: int, url: str, rounds: int, batch: int) -> float:
    name = f"bench-redis-{workers}-{os.getpid()}"
    base = [sys.executable, str(HERE), "--child", "redis", "--url", url, "--name", name,
            "--rounds", str(rounds), "--batch", str(batch), "--workers", str(workers)]
    manager = subprocess.Popen([*base, "--role", "manager"])
    children = [
        subprocess.Popen([*base, "--role", "worker", "--index", str(i + 1)],
                         stdout=subprocess.PIPE, text=True)
        for i in range(workers)
    ]
    try:
        output = "".join(child.communicate(timeout=300)[0] for child in children)
        manager.wait(timeout=60)
    finally:
        for process in (manager, *children):
            if process.poll() is None:
                process.kill()
    return _rate(output)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers-list", default="1,2,4")
    parser.add_argument("--modes", default="pickle,redisbuf,redis",
                        help="which of pickle, redisbuf (over MPI), redis to run")
    parser.add_argument("--child", choices=["pickle", "redisbuf", "redis"], default=None)
    parser.add_argument("--role", default="worker")
    parser.add_argument("--index", type=int, default=1)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--url", default=None)
    parser.add_argument("--name", default="bench")
    args = parser.parse_args()
    if args.child == "redis":
        child_redis(args.role, args.index, args.workers, args.url, args.name, args.rounds,
                    args.batch)
        return
    if args.child is not None:
        child_mpi(args.child, args.url, args.name, args.rounds, args.batch)
        return

    from redisbuf.servers.embedded import EmbeddedServer

    server = None
    url = os.environ.get("REDISBUF_URL")
    if not url:
        server = EmbeddedServer().start()
        url = server.url
    print(f"add+score round trips/s, batches of {args.batch} HyperGrid trajectories, "
          f"{args.rounds} rounds per worker, {os.cpu_count()} cores")
    print(f"{'workers':>7} {'pickle-mpi':>11} {'redisbuf-mpi':>13} {'ratio':>6} "
          f"{'redisbuf-redis':>15} {'ratio':>6}")
    modes = set(args.modes.split(","))
    try:
        for workers in [int(w) for w in args.workers_list.split(",")]:
            nan = float("nan")
            pickled = run_mpi("pickle", workers, url, args.rounds, args.batch) \
                if "pickle" in modes else nan
            over_mpi = run_mpi("redisbuf", workers, url, args.rounds, args.batch) \
                if "redisbuf" in modes else nan
            over_redis = run_redis(workers, url, args.rounds, args.batch) \
                if "redis" in modes else nan
            print(f"{workers:>7} {pickled:>11.0f} {over_mpi:>13.0f} {over_mpi / pickled:>6.2f} "
                  f"{over_redis:>15.0f} {over_redis / pickled:>6.2f}", flush=True)
            for series, rate in (("pickle over MPI", pickled), ("redisbuf, MPI control",
                                 over_mpi), ("redisbuf, Redis control", over_redis)):
                record(f"manager {series}, workers: {workers}", rate, "round trips/s",
                       series=f"manager: {series}", axis="processes", x=workers)
            record(f"manager MPI control vs Redis control, workers: {workers}", over_mpi,
                   "round trips/s", baseline=over_redis, baseline_name="Redis", target=">= 1")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
