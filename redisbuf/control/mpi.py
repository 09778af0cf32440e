"""MPI control backend: protocol messages as raw bytes over mpi4py's buffer API.

Messages go with ``comm.Send`` of a byte buffer and arrive through ``Probe`` /
``Get_count`` / ``Recv`` into a buffer of the right size, so nothing is pickled (the
lower-case ``send`` / ``recv`` of mpi4py would pickle). Receiving polls ``Iprobe`` with short
sleeps instead of blocking in ``Probe``: it honours a timeout, and a waiting rank sleeps
instead of spinning on a shared core.

MPI itself reports a rank that crashes: the launcher (``mpiexec``) aborts the whole job.
A peer that merely stops talking is caught by the receive timeout.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import ControlTimeoutError
from .protocol import ANY_SOURCE

# A receive sleeps between polls instead of blocking in MPI: MPICH's blocking receive spins,
# and on a machine with fewer cores than busy processes (ranks plus the Redis server) a
# spinning rank takes the core from the very process it waits for. The first
# _QUICK_SECONDS of a wait poll every _QUICK_SLEEP (a score usually arrives within them);
# later polls back off to _MAX_SLEEP, so a long-idle rank costs next to nothing.
_QUICK_SLEEP = 0.00002
_QUICK_SECONDS = 0.005
_MAX_SLEEP = 0.001


#: Seconds a receive without its own timeout waits (a worker waiting for its score):
#: a manager that never runs or hangs must not hold a worker forever.
DEFAULT_TIMEOUT = 300.0


class MPITransport:
    """A :class:`~redisbuf.control.protocol.Transport` over an MPI communicator
    (``MPI.COMM_WORLD`` by default). A receive given no timeout waits at most
    ``default_timeout`` seconds (``None``: forever), then raises ControlTimeoutError."""

    def __init__(self, comm: Any = None, default_timeout: float | None = DEFAULT_TIMEOUT) -> None:
        from mpi4py import MPI  # imported here: importing mpi4py initializes MPI

        self._mpi = MPI
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.default_timeout = default_timeout

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        self.comm.Send([payload, self._mpi.BYTE], dest=dest, tag=tag)

    def recv(self, source: int, tag: int, timeout: float | None = None) -> tuple[int, bytes]:
        MPI = self._mpi
        timeout = self.default_timeout if timeout is None else timeout
        src = MPI.ANY_SOURCE if source == ANY_SOURCE else source
        status = MPI.Status()
        deadline = None if timeout is None else time.monotonic() + timeout
        began = time.monotonic()
        pause = _QUICK_SLEEP
        while not self.comm.Iprobe(source=src, tag=tag, status=status):
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                who = "any rank" if source == ANY_SOURCE else f"rank {source}"
                raise ControlTimeoutError(
                    f"no MPI message from {who} on tag {tag} within {timeout:.1f} s"
                )
            if now - began > _QUICK_SECONDS:
                pause = min(pause * 2, _MAX_SLEEP)
            time.sleep(pause)
        count = status.Get_count(MPI.BYTE)
        sender = status.Get_source()
        buf = bytearray(count)
        self.comm.Recv([buf, MPI.BYTE], source=sender, tag=tag)
        return int(sender), bytes(buf)

    def check_peers(self, done: set[int]) -> None:
        return None  # mpiexec aborts the job when a rank dies

    def close(self) -> None:
        return None


def broadcast_text(text: str | None, root: int = 0, comm: Any = None) -> str:
    """Broadcast a short string from ``root`` to every rank, as bytes (no pickle)."""
    from mpi4py import MPI

    comm = comm if comm is not None else MPI.COMM_WORLD
    data = (text or "").encode()
    size = bytearray(8)
    if comm.Get_rank() == root:
        size[:] = len(data).to_bytes(8, "little")
    comm.Bcast([size, MPI.BYTE], root=root)
    buf = bytearray(data) if comm.Get_rank() == root else bytearray(int.from_bytes(size, "little"))
    comm.Bcast([buf, MPI.BYTE], root=root)
    return buf.decode()
