"""The drop-in ``redisbuf.torchgfn.ReplayBufferManager``: a real 3-rank MPI job (rank 0
manages, ranks 1 and 2 train with drop-in buffers), and the Redis control plane with a
manager thread (get_metadata(0, "redis"), what the manager's buffer holds).

The MPI job is this file run as a script under ``mpiexec -n 3``; the test reads its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("gfn")

HERE = Path(__file__).resolve().parent


def _score(container: Any, sender_rank: int = -1) -> dict[str, float]:
    from gfn.containers import Trajectories

    return {
        "is_trajectories": float(isinstance(container, Trajectories)),
        "n": float(len(container)),
        "rank": float(sender_rank),
        "sum_log_rewards": float(container.log_rewards.sum()),
    }


def job(name: str) -> None:
    import torch
    from mpi4py import MPI

    sys.path.insert(0, str(HERE))
    from torchgfn_helpers import make_env, trajectories

    from redisbuf.torchgfn import ReplayBuffer, ReplayBufferManager

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    url = os.environ["REDISBUF_URL"]
    env = make_env("hypergrid")
    if rank == 0:
        # torchgfn's positional order: env, rank, num_training_ranks, scoring_function,
        # diverse_replay_buffer, capacity, remote_manager_rank, communication_backend
        manager = ReplayBufferManager(env, 0, 2, _score, False, 1000, None, "mpi",
                                      url=url, name=name)
        comm.Barrier()
        manager.run(async_send=False)
        meta = manager.metadata()
        print(f"MANAGER holds {meta['length']} missing {meta['missing_items']} "
              f"exits {sorted(manager.exited)}", flush=True)
    else:
        comm.Barrier()
        buffer = ReplayBuffer(env, 50, True, True, 0, 1, "mpi", url=url,
                              async_score=rank == 2, baseline_filtering=rank == 2)
        sent = 0
        for i in range(4):
            batch = trajectories(env, 8, seed=100 * rank + i)
            score = buffer.add(batch)
            if rank == 2:
                if i == 0:
                    assert score is None
                    metadata = ReplayBufferManager.get_metadata(0, "mpi")
                    assert metadata["baseline_strategy"] == "min"
                    print(f"METADATA rank {rank} while pending", flush=True)
                continue
            assert score["is_trajectories"] == 1.0 and score["n"] == 8, score
            assert score["rank"] == rank, score
            expected = float(batch.log_rewards.sum())
            assert abs(score["sum_log_rewards"] - expected) < 1e-4, (score, expected)
            sent += 8
        if rank == 2:
            assert buffer.drain_pending_score(30.0)["n"] > 0
            sent = buffer.buffer.remote.baseline_kept
        torch.manual_seed(rank)
        assert len(buffer.sample(10)) == 10
        print(f"WORKER {rank} sent {sent} holds {len(buffer)}", flush=True)
        ReplayBufferManager.send_termination_signal(0, "mpi")
        buffer.close()
    comm.Barrier()


def chain_job(name: str) -> None:
    """Rank 0: top manager; rank 1: a manager that forwards what it stores to rank 0
    (remote_manager_rank=0, diverse off); rank 2: a worker of rank 1."""
    from mpi4py import MPI

    sys.path.insert(0, str(HERE))
    from torchgfn_helpers import make_env, trajectories

    from redisbuf.torchgfn import ReplayBuffer, ReplayBufferManager

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    url = os.environ["REDISBUF_URL"]
    env = make_env("hypergrid")
    if rank in (0, 1):
        manager = ReplayBufferManager(env, rank, 1, _score, capacity=100, url=url,
                                      remote_manager_rank=None if rank == 0 else 0,
                                      name=f"{name}-{rank}")
        comm.Barrier()
        manager.run()
        print(f"MANAGER {rank} holds {manager.metadata()['length']}", flush=True)
        if rank == 1:
            ReplayBufferManager.send_termination_signal(0, "mpi")
    else:
        comm.Barrier()
        buffer = ReplayBuffer(env, 100, url=url, remote_manager_rank=1)
        for i in range(3):
            assert buffer.add(trajectories(env, 8, seed=i))["n"] == 8
        ReplayBufferManager.send_termination_signal(1, "mpi")
        buffer.close()
    comm.Barrier()


def _mpiexec() -> str | None:
    beside_python = Path(sys.executable).parent / "mpiexec"
    if beside_python.exists():
        return str(beside_python)
    import shutil

    return shutil.which("mpiexec")


def _run_three_ranks(url: str, *arguments: str) -> str:
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec is not installed")
    run = subprocess.run(
        [mpiexec, "-n", "3", sys.executable, *arguments],
        capture_output=True, text=True, timeout=200, env={**os.environ, "REDISBUF_URL": url},
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    return out


@pytest.mark.mpi
@pytest.mark.redis_server
@pytest.mark.timeout(240)
def test_manager_forwards_to_a_higher_manager(redis_server, buffer_name):
    out = _run_three_ranks(redis_server.url, __file__, "chain", buffer_name)
    assert "MANAGER 1 holds 24" in out and "MANAGER 0 holds 24" in out, out


@pytest.mark.mpi
@pytest.mark.redis_server
@pytest.mark.timeout(240)
def test_torchgfn_mpi_example_runs(redis_server, buffer_name):
    out = _run_three_ranks(redis_server.url, "-m", "redisbuf.examples.torchgfn_mpi_hypergrid",
                           "--name", buffer_name, "--n-iterations", "20", "--capacity", "100")
    assert "[trainer 1] 20 iterations" in out and "[trainer 2] 20 iterations" in out, out
    assert "[manager] 2 EXITs; buffer 100/100" in out, out


@pytest.mark.mpi
@pytest.mark.redis_server
@pytest.mark.timeout(240)
def test_three_rank_mpi_job_with_drop_in_classes(redis_server, buffer_name):
    out = _run_three_ranks(redis_server.url, __file__, "job", buffer_name)
    assert "METADATA rank 2 while pending" in out
    workers = {}
    for line in out.splitlines():
        if line.startswith("WORKER"):
            _, rank, _, sent, _, holds = line.split()
            workers[int(rank)] = (int(sent), int(holds))
    assert workers[1] == (32, 32), out  # a worker's own buffer holds all it added
    assert workers[2][1] == 32 and 8 <= workers[2][0] <= 32, out
    # the manager's buffer holds exactly what the workers sent, as torchgfn's
    assert f"MANAGER holds {workers[1][0] + workers[2][0]} missing 0 exits [1, 2]" in out, out


def _manager_thread(manager) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def serve() -> None:
        try:
            manager.run()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return thread, errors


@pytest.mark.redis_server
@pytest.mark.timeout(120)
def test_redis_backend_metadata_and_what_the_manager_holds(redis_server, buffer_name):
    from torchgfn_helpers import make_env, trajectories

    import redisbuf.torchgfn as drop_in

    env = make_env("hypergrid")
    url = redis_server.url
    manager = drop_in.ReplayBufferManager(env, 0, 1, _score, capacity=1000,
                                          communication_backend="redis", url=url,
                                          name=buffer_name, poll_interval=0.2)
    thread, errors = _manager_thread(manager)
    try:
        # a FIFO worker buffer of capacity 4: a batch of 10 leaves 4 for the manager to
        # read. torchgfn would send all 10; the difference is documented in
        # docs/coming-from/torchgfn.md.
        worker = drop_in.ReplayBuffer(env, capacity=4, url=url, remote_manager_rank=0,
                                      communication_backend="redis", manager_name=buffer_name)
        score = worker.add(trajectories(env, 10, seed=1))
        assert score["is_trajectories"] == 1.0 and score["n"] == 4.0
        score = worker.add(trajectories(env, 3, seed=2))
        assert score["n"] == 3.0
        metadata = drop_in.ReplayBufferManager.get_metadata(0, "redis")
        assert metadata["length"] == 7 and metadata["missing_items"] == 6
        assert len(worker) == 4
        # async_comm means async_score: the first add returns None, the score comes later
        # (a second buffer of this process: it shares the process's transport, its rank)
        later = drop_in.ReplayBuffer(env, capacity=10, url=url, remote_manager_rank=0,
                                     communication_backend="redis", manager_name=buffer_name,
                                     async_comm=True, lazy_sort=True)
        assert later.async_score and later.add(trajectories(env, 2, seed=3)) is None
        assert later.drain_pending_score(30.0)["n"] == 2.0
        later.close()
        drop_in.ReplayBufferManager.send_termination_signal(0, "redis")
        thread.join(30)
        assert not thread.is_alive() and not errors, errors
        # the manager's buffer holds what was sent, rebuilt as torchgfn containers
        held = drop_in.ReplayBuffer(env, capacity=1000, prioritized_capacity=True, url=url,
                                    name=buffer_name).training_container
        assert len(held) == 9 and held.states.tensor.shape[1] == 9
        worker.close()
    finally:
        if thread.is_alive():
            manager.transport.close()


@pytest.mark.redis_server
@pytest.mark.timeout(120)
def test_diverse_manager_buffer_rejects_duplicates(redis_server, buffer_name):
    import torch
    from torchgfn_helpers import make_env, trajectories

    import redisbuf.torchgfn as drop_in
    from redisbuf.buffers.diverse import NormBasedDiversePrioritizedReplayBuffer

    env = make_env("hypergrid")
    url = redis_server.url
    manager = drop_in.ReplayBufferManager(env, 0, 1, _score, True, 8,
                                          communication_backend="redis", url=url,
                                          name=buffer_name, poll_interval=0.2)
    assert isinstance(manager.buffer, NormBasedDiversePrioritizedReplayBuffer)
    assert manager.diverse_replay_buffer
    thread, errors = _manager_thread(manager)
    try:
        worker = drop_in.ReplayBuffer(env, capacity=100, url=url, remote_manager_rank=0,
                                      communication_backend="redis", manager_name=buffer_name)
        batch = trajectories(env, 8, seed=3)  # fills the manager's buffer
        batch._log_rewards = torch.arange(8, dtype=torch.float32)
        worker.add(batch)
        first = sorted(manager.buffer.client.zrange(manager.buffer.keys.prio, 0, -1))
        assert len(first) == 8
        batch._log_rewards = batch._log_rewards + 100.0  # same states, higher rewards
        assert worker.add(batch)["n"] == 8  # scored, then refused by the diversity rule
        assert sorted(manager.buffer.client.zrange(manager.buffer.keys.prio, 0, -1)) == first
        drop_in.ReplayBufferManager.send_termination_signal(0, "redis")
        thread.join(30)
        assert not thread.is_alive() and not errors, errors
        worker.close()
    finally:
        if thread.is_alive():
            manager.transport.close()


def test_manager_signature_follows_torchgfn():
    import inspect

    from redisbuf.torchgfn import ReplayBufferManager

    names = list(inspect.signature(ReplayBufferManager).parameters)
    assert names[:13] == [
        "env", "rank", "num_training_ranks", "scoring_function", "diverse_replay_buffer",
        "capacity", "remote_manager_rank", "communication_backend", "timing",
        "store_locally", "baseline_strategy", "baseline_percentile", "baseline_ema_alpha",
    ]
    assert "async_send" in inspect.signature(ReplayBufferManager.run).parameters


if __name__ == "__main__":
    {"job": job, "chain": chain_job}[sys.argv[1]](sys.argv[2])
