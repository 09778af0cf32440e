"""A real 3-rank MPI job: rank 0 manages, ranks 1 and 2 train (run by mpiexec).

The job is this file run as a script under ``mpiexec -n 3``; the test checks its output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest


def _score(batch: Any, sender_rank: int = -1) -> dict[str, float]:
    return {"rank": float(sender_rank), "first_x": float(np.asarray(batch["x"])[0])}


def _batch(rank: int, i: int) -> dict[str, np.ndarray]:
    x = np.arange(3, dtype=np.float64) + 1000 * rank + 10 * i
    return {"x": x, "log_rewards": np.full(3, float(i))}


def job(name: str) -> None:
    from mpi4py import MPI

    from redisbuf import BufferKeys, ManagerLink, ReplayBuffer, connect
    from redisbuf.control.manager import ReplayBufferManager

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    url = os.environ["REDISBUF_URL"]
    if rank == 0:
        connect(url).delete(*BufferKeys(name).all_keys())
        manager = ReplayBufferManager(url, 0, comm.Get_size() - 1, scoring_function=_score,
                                      name=name, capacity=100, communication_backend="mpi")
        comm.Barrier()
        manager.run()
        print(f"MANAGER exited after EXITs from {sorted(manager.exited)}", flush=True)
    else:
        comm.Barrier()
        asynchronous = rank == 2
        buffer = ReplayBuffer(url, name, capacity=None,
                              manager=ManagerLink(0, backend="mpi", async_score=asynchronous))
        for i in range(4):
            score = buffer.add(_batch(rank, i)).score
            if asynchronous and i == 0:
                assert score is None
                # a score is pending on DATA_TAG; metadata must come on METADATA_TAG
                metadata = ReplayBufferManager.get_metadata(0, "mpi")
                assert metadata["length"] >= 3 and "baseline_strategy" in metadata
                print(f"METADATA rank {rank} while pending: length {metadata['length']}",
                      flush=True)
                continue
            expected_batch = i - 1 if asynchronous else i
            assert score["rank"] == rank, score
            assert score["first_x"] == 1000 * rank + 10 * expected_batch, score
        if asynchronous:
            assert buffer.drain_pending_score(10.0)["first_x"] == 1000 * rank + 30
        ReplayBufferManager.send_termination_signal(0, "mpi")
        print(f"WORKER {rank} scores ok", flush=True)
    comm.Barrier()


def _mpiexec() -> str | None:
    beside_python = Path(sys.executable).parent / "mpiexec"
    if beside_python.exists():
        return str(beside_python)
    return shutil.which("mpiexec")


def _run_three_ranks(url: str, *command: str) -> str:
    """Run ``command`` under ``mpiexec -n 3`` against ``url``; return its output."""
    mpiexec = _mpiexec()
    if mpiexec is None:
        pytest.skip("mpiexec is not installed")
    run = subprocess.run(
        [mpiexec, "-n", "3", sys.executable, *command],
        capture_output=True, text=True, timeout=90, env={**os.environ, "REDISBUF_URL": url},
    )
    out = run.stdout + run.stderr
    assert run.returncode == 0, out
    return out


@pytest.mark.mpi
@pytest.mark.redis_server
@pytest.mark.timeout(120)
def test_three_rank_mpi_job(redis_server, buffer_name):
    out = _run_three_ranks(redis_server.url, __file__, buffer_name)
    assert "WORKER 1 scores ok" in out and "WORKER 2 scores ok" in out
    assert "METADATA rank 2 while pending" in out
    assert "MANAGER exited after EXITs from [1, 2]" in out



@pytest.mark.mpi
@pytest.mark.redis_server
@pytest.mark.timeout(120)
def test_mpi_hypergrid_example_runs(redis_server, buffer_name):
    out = _run_three_ranks(
        redis_server.url, "-m", "redisbuf.examples.mpi_hypergrid",
        "--name", buffer_name, "--iterations", "5", "--capacity", "100",
    )
    assert "[worker 1] sent" in out and "[worker 2] sent" in out
    assert "[manager] 2 EXITs; buffer 100/100" in out


if __name__ == "__main__":
    job(sys.argv[1])
