"""The torchgfn drop-in's ``ReplayBufferManager`` and the worker transports that its
buffers and its static helpers share (see :mod:`redisbuf.torchgfn`)."""

from __future__ import annotations

import inspect
from typing import Any

from ..buffers.replay import ReplayBuffer as _CoreBuffer
from ..control.manager import ReplayBufferManager as _CoreManager
from ..control.remote import ManagerLink
from .containers import from_redisbuf

#: Buffer name of the manager's store (and of the Redis control plane) when none is given.
DEFAULT_MANAGER_NAME = "torchgfn-manager"


# -- the control plane as torchgfn names it -------------------------------------------

# torchgfn's static helpers take a backend *name*: they use the worker transport that
# this process's drop-in buffers opened last for that backend (one per manager name for
# "redis"), or open one.
_WORKER_TRANSPORTS: dict[tuple[str, str], Any] = {}
_LAST_TRANSPORT: dict[str, Any] = {}


def _worker_transport(backend: Any, url: Any = None, name: str | None = None) -> Any:
    if not isinstance(backend, str):
        return backend
    if backend not in ("mpi", "redis"):
        raise ValueError(f"unknown communication_backend {backend!r}; use 'mpi' or 'redis'")
    if backend == "mpi":
        name = ""
    elif name is None:
        last = _LAST_TRANSPORT.get(backend)
        if last is not None:
            return last
        name = DEFAULT_MANAGER_NAME
    transport = _WORKER_TRANSPORTS.get((backend, name))
    if transport is None:
        if backend == "mpi":
            from ..control.mpi import MPITransport

            transport = MPITransport()
        else:
            from ..control.redis import RedisWorkerTransport
            from ..store.connection import as_client

            transport = RedisWorkerTransport(as_client(url), name)
        _WORKER_TRANSPORTS[(backend, name)] = transport
    _LAST_TRANSPORT[backend] = transport
    return transport


def _forget_transport(transport: Any) -> None:
    tables: tuple[dict[Any, Any], ...] = (_WORKER_TRANSPORTS, _LAST_TRANSPORT)
    for table in tables:
        for key, value in list(table.items()):
            if value is transport:
                del table[key]


def _drop_quietly(client: Any, name: str) -> None:
    try:
        _CoreBuffer(client, name, capacity=None).drop()
    except Exception:  # the server may already be gone at interpreter exit
        pass


# -- ReplayBufferManager --------------------------------------------------------------


def _scorer(function: Any, env: Any) -> Any:
    """Wrap a torchgfn scoring function: it receives torchgfn containers, and
    ``sender_rank=`` only if it accepts it (torchgfn 2.4.1 passes one argument)."""
    try:
        parameters = inspect.signature(function).parameters
        takes_rank = "sender_rank" in parameters or any(
            p.kind is p.VAR_KEYWORD for p in parameters.values()
        )
    except (TypeError, ValueError):
        takes_rank = False

    def score(batch: Any, sender_rank: int = -1) -> dict[str, float]:
        container = from_redisbuf(batch, env)
        if takes_rank:
            return function(container, sender_rank=sender_rank)
        return function(container)

    return score


class ReplayBufferManager(_CoreManager):
    """torchgfn's ``ReplayBufferManager`` with redisbuf's control plane.

    Takes torchgfn's arguments in its order (``env, rank, num_training_ranks,
    scoring_function, diverse_replay_buffer, capacity, remote_manager_rank,
    communication_backend, timing, store_locally, baseline_strategy,
    baseline_percentile, baseline_ema_alpha``) plus keyword-only ``url=`` and ``name=``
    (the manager's buffer, default :data:`DEFAULT_MANAGER_NAME`; a new manager empties
    it). Like torchgfn's, the manager's buffer (prioritized capacity) holds what workers
    sent to it and nothing else: each drop-in worker writes to its own buffer, and the
    manager copies the items named in a message into its own. The scoring function gets
    torchgfn containers built for ``env``. ``remote_manager_rank`` (forwarding to a
    higher manager) works over MPI: what this manager stores it sends on.
    ``diverse_replay_buffer=True`` makes the manager's buffer a
    :class:`redisbuf.buffers.diverse.NormBasedDiversePrioritizedReplayBuffer` (default cutoff
    0, p = 1, as torchgfn's), for Trajectories and terminating Transitions.

    Args:
        env: the torchgfn environment of the containers.
        rank: as :class:`redisbuf.ReplayBufferManager`.
        num_training_ranks: as :class:`redisbuf.ReplayBufferManager`.
        scoring_function: ``f(container)`` or ``f(container, sender_rank=r)`` returning
            a score dict; default :meth:`default_scoring_function`.
        diverse_replay_buffer: as above.
        capacity: the manager's buffer's capacity.
        remote_manager_rank: as above (MPI only).
        communication_backend: ``"mpi"`` or ``"redis"``.
        timing: as :class:`redisbuf.ReplayBufferManager`.
        store_locally: as :class:`redisbuf.ReplayBufferManager`.
        baseline_strategy: as :class:`redisbuf.ReplayBufferManager`.
        baseline_percentile: as :class:`redisbuf.ReplayBufferManager`.
        baseline_ema_alpha: as :class:`redisbuf.ReplayBufferManager`.
        url: a Redis URL or client (``None``: ``$REDISBUF_URL``).
        name: the manager's buffer name.
        **options: further :class:`redisbuf.ReplayBufferManager` keywords.

    Raises:
        ValueError: ``remote_manager_rank`` with the ``"redis"`` backend or with
            ``diverse_replay_buffer``.
    """

    def __init__(
        self,
        env: Any,
        rank: int,
        num_training_ranks: int,
        scoring_function: Any = None,
        diverse_replay_buffer: bool = False,
        capacity: int = 10000,
        remote_manager_rank: int | None = None,
        communication_backend: str = "mpi",
        timing: bool = False,
        store_locally: bool = True,
        baseline_strategy: str = "min",
        baseline_percentile: float = 0.1,
        baseline_ema_alpha: float = 0.1,
        *,
        url: Any = None,
        name: str = DEFAULT_MANAGER_NAME,
        **options: Any,
    ) -> None:
        if remote_manager_rank is not None and communication_backend != "mpi":
            raise ValueError(
                "remote_manager_rank on a manager forwards over MPI only; with the redis "
                "backend run the upper manager on its own buffer name"
            )
        self.env = env
        from ..store.connection import as_client

        client = as_client(url)
        # a new manager starts empty, as torchgfn's: drop what an earlier run left
        # (items, and the schema its containers fixed)
        _CoreBuffer(client, name, capacity=capacity, prioritized_capacity=True).drop()
        if diverse_replay_buffer:
            if remote_manager_rank is not None:
                raise ValueError(
                    "remote_manager_rank with diverse_replay_buffer: the diverse buffer "
                    "never sends to a manager (torchgfn's manager ignores it there)"
                )
            from ..buffers.diverse import NormBasedDiversePrioritizedReplayBuffer as _CoreDiverse

            buffer: _CoreBuffer = _CoreDiverse(client, name, capacity=capacity)
        else:
            buffer = _CoreBuffer(
                client,
                name,
                capacity=capacity,
                prioritized_capacity=True,
                manager=None if remote_manager_rank is None else ManagerLink(
                    remote_manager_rank, backend=communication_backend
                ),
            )
        self.remote_manager_rank = remote_manager_rank
        super().__init__(
            buffer,
            rank,
            num_training_ranks,
            scoring_function=_scorer(scoring_function or self.default_scoring_function, env),
            diverse_replay_buffer=False,  # the buffer above is the diverse one
            capacity=capacity,
            store_locally=store_locally,
            baseline_strategy=baseline_strategy,
            baseline_percentile=baseline_percentile,
            baseline_ema_alpha=baseline_ema_alpha,
            communication_backend=communication_backend,
            timing=timing,
            **options,
        )
        self.diverse_replay_buffer = diverse_replay_buffer

    @property
    def replay_buffer(self) -> _CoreBuffer:
        """The manager's buffer (torchgfn's attribute name)."""
        return self.buffer

    def default_scoring_function(self, obj: Any, sender_rank: int = -1) -> dict[str, float]:
        """Default score function if none provided, placeholder: ``{"score": inf}``.

        Args:
            obj: the container (unused).
            sender_rank: the worker's rank (unused).

        Returns:
            ``{"score": inf}``.
        """
        return {"score": float("inf")}

    def run(self, async_send: bool = True) -> None:
        """Serve until every training rank has sent EXIT. ``async_send`` is accepted for
        torchgfn compatibility: replies are small control messages, sent either way.

        Args:
            async_send: accepted, changes nothing.

        Raises:
            ControlTimeoutError: as :meth:`redisbuf.ReplayBufferManager.run`.
        """
        super().run()

    @staticmethod
    def get_metadata(manager_rank: int, backend: Any = "mpi", timeout: float | None = 30.0) -> dict:
        """Ask the manager for its metadata over ``backend`` (``"mpi"``, ``"redis"``,
        or a transport); ``"redis"`` uses the worker transport of this process's latest
        drop-in buffer with a remote manager, or opens one to
        :data:`DEFAULT_MANAGER_NAME` at ``$REDISBUF_URL``.

        Args:
            manager_rank: the manager's rank.
            backend: as above.
            timeout: seconds to wait for the reply (``None``: no limit).

        Returns:
            The manager's metadata.
        """
        return _CoreManager.get_metadata(manager_rank, _worker_transport(backend), timeout)

    @staticmethod
    def send_termination_signal(manager_rank: int, backend: Any = "mpi") -> None:
        """Send EXIT to the manager over ``backend`` and release this process's
        transport for it.

        Args:
            manager_rank: the manager's rank.
            backend: as :meth:`get_metadata`.
        """
        transport = _worker_transport(backend)
        _CoreManager.send_termination_signal(manager_rank, transport)
        _forget_transport(transport)
