"""The control protocol between training workers and the replay-buffer manager.

The same messages travel over every backend (MPI, Redis); a backend only moves opaque
bytes tagged with a sender rank and a tag. Every message is one msgpack map (encoded with
:func:`redisbuf.store.codec.packb`, never pickle).

Worker -> manager, always on :data:`DATA_TAG`::

    {"v": 1, "op": "data", "seq": n, "buffer": name, "ids": [...], "log_rewards": [...],
     "inline": None | {"states": array, "log_rewards": array}}
    {"v": 1, "op": "metadata"}
    {"v": 1, "op": "exit"}

``ids`` name items already written to buffer ``buffer`` in Redis (the data plane);
``inline`` carries a small States batch (terminating states and log-rewards) for workers
with ``scoring_only=True``, which the manager scores without reading Redis.
``log_rewards`` are the sent items' log-rewards (``-inf`` allowed), for the EMA baseline.

Manager -> worker::

    {"op": "score", "seq": n, "score": {name: float}}   on DATA_TAG
    {"op": "metadata", "metadata": {...}}                on METADATA_TAG
    {"op": "error", "seq": n, "error": text}             on the tag of the request

A metadata reply travels on its own tag, so a worker waiting for metadata never consumes
a pending (async) score, and the other way round.
"""

from __future__ import annotations

from typing import Any, Protocol

from ..errors import DecodeError, ProtocolError
from ..store.codec import packb, unpackb

DATA_TAG = 0
METADATA_TAG = 1
VERSION = 1

#: Accepted as ``source`` by :meth:`Transport.recv`: a message from any rank.
ANY_SOURCE = -1

OP_DATA = "data"
OP_METADATA = "metadata"
OP_EXIT = "exit"
OP_SCORE = "score"
OP_ERROR = "error"


class Transport(Protocol):
    """Moves tagged byte messages between ranks. One object per process and role."""

    @property
    def rank(self) -> int:
        """This process's rank."""

    def send(self, dest: int, tag: int, payload: bytes) -> None:
        """Deliver ``payload`` to rank ``dest`` under ``tag`` (returns once handed over).

        Args:
            dest: the receiving rank.
            tag: the message tag.
            payload: the message bytes.
        """

    def recv(self, source: int, tag: int, timeout: float | None) -> tuple[int, bytes]:
        """The next message with ``tag`` from ``source`` (or :data:`ANY_SOURCE`), as
        ``(sender, payload)``. Raises :class:`~redisbuf.errors.ControlTimeoutError` after
        ``timeout`` seconds (``None``: no limit) or when the peer is known to be gone.

        Args:
            source: the sending rank, or :data:`ANY_SOURCE`.
            tag: the message tag.
            timeout: seconds to wait (``None``: no limit).

        Returns:
            ``(sender, payload)``.

        Raises:
            ControlTimeoutError: as above.
        """

    def check_peers(self, done: set[int]) -> None:
        """Raise :class:`~redisbuf.errors.ControlTimeoutError` if a peer not in ``done``
        (ranks that sent EXIT) is known to be dead. Backends that cannot tell do nothing.

        Args:
            done: the ranks that sent EXIT.

        Raises:
            ControlTimeoutError: as above.
        """

    def close(self) -> None:
        """Release what the transport holds (heartbeats, keys). Idempotent."""


def encode(message: dict[str, Any]) -> bytes:
    return packb(message)


def decode(payload: bytes) -> dict[str, Any]:
    """Decode one message; raise :class:`ProtocolError` if it is not a protocol map."""
    try:
        message = unpackb(bytes(payload))
    except DecodeError as exc:
        raise ProtocolError(f"undecodable control message: {exc}") from exc
    if not isinstance(message, dict) or not isinstance(message.get("op"), str):
        raise ProtocolError(f"control message is not a map with an 'op': {message!r:.200}")
    return message


def request(op: str, **fields: Any) -> bytes:
    return encode({"v": VERSION, "op": op, **fields})


def expect_reply(payload: bytes, op: str, seq: int | None = None) -> dict[str, Any]:
    """Decode a manager reply, raising :class:`ProtocolError` for an error reply, another
    op, or a score for another request than ``seq``."""
    message = decode(payload)
    if message["op"] == OP_ERROR:
        raise ProtocolError(f"manager refused the request: {message.get('error')}")
    if message["op"] != op:
        raise ProtocolError(f"expected a {op!r} reply, got {message['op']!r}")
    if seq is not None and message.get("seq") != seq:
        raise ProtocolError(
            f"score reply for request {message.get('seq')} while waiting for request {seq}"
        )
    return message


def get_transport(backend: Any) -> Transport:
    """A worker-side transport from ``backend``: a transport object, a ReplayBuffer (or
    anything) whose ``remote.transport`` is one, or ``"mpi"`` (MPI.COMM_WORLD)."""
    if backend == "mpi":
        from .mpi import MPITransport

        return MPITransport()
    if isinstance(backend, str):
        raise ValueError(
            f"communication backend {backend!r} needs a transport object; pass the "
            "worker's ReplayBuffer or its RedisWorkerTransport"
        )
    remote = getattr(backend, "remote", None)
    if remote is not None:
        return remote.transport
    if hasattr(backend, "send") and hasattr(backend, "recv"):
        return backend
    raise TypeError(f"not a control transport: {backend!r}")
