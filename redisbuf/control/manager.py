"""ReplayBufferManager: the rank that scores what workers add and tells them the baseline.

Workers write their batches straight into the shared buffer in Redis (the data plane)
and send the manager a small control message naming the new items (see
:mod:`redisbuf.control.protocol`). The manager reads those items, copies them into its
own buffer when they live in another one, and computes a baseline log-reward, all in one
Lua call (``lua/manager_score.lua``); it then calls the scoring function on the decoded
items and replies with the score dict. It stops once every training rank has sent EXIT.

``store_locally``: with True the manager's buffer is the store that baselines read:
``min`` / ``percentile`` answer from it once it is full, and items a worker wrote to
*another* buffer (a private one) are copied into it. With False the manager keeps
nothing and every baseline comes from the EMA of incoming batch minima.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from redis.cluster import RedisCluster

from ..buffers.replay import ReplayBuffer
from ..errors import ConfigMismatchError, ControlTimeoutError, ProtocolError, SchemaError
from ..store import scripts
from ..store.containers import States, describe_schema_difference
from ..store.keys import format_id
from .protocol import (
    ANY_SOURCE,
    DATA_TAG,
    METADATA_TAG,
    OP_DATA,
    OP_ERROR,
    OP_EXIT,
    OP_METADATA,
    OP_SCORE,
    VERSION,
    Transport,
    decode,
    encode,
    expect_reply,
    get_transport,
    request,
)

log = logging.getLogger(__name__)

BASELINE_STRATEGIES = ("min", "percentile", "ema")
ScoringFunction = Callable[..., dict[str, float]]

__all__ = [
    "BASELINE_STRATEGIES",
    "DATA_TAG",
    "METADATA_TAG",
    "ReplayBufferManager",
    "default_scoring_function",
]


def default_scoring_function(batch: Any, sender_rank: int = -1) -> dict[str, float]:
    """The placeholder score: ``{"score": inf}``.

    Args:
        batch: the decoded items (unused).
        sender_rank: the worker's rank (unused).

    Returns:
        ``{"score": inf}``.

    Examples:
        >>> from redisbuf.control.manager import default_scoring_function
        >>> default_scoring_function(None)
        {'score': inf}
    """
    return {"score": math.inf}


@dataclass
class _RankStats:
    requests: int = 0
    bytes: int = 0
    recv: list[float] = field(default_factory=list)
    score: list[float] = field(default_factory=list)
    send: list[float] = field(default_factory=list)


def _is_cluster(client: Any) -> bool:
    """Whether ``client`` (or the client a redisbuf wrapper holds) talks to a Redis
    Cluster, where one script cannot touch keys of two buffers."""
    return isinstance(getattr(client, "unwrapped", client), RedisCluster)


def _priority_texts(log_rewards: np.ndarray) -> list[str]:
    # repr keeps every bit; Lua reads "inf" / "-inf" (to_number in _common.lua)
    return [repr(value) for value in log_rewards.tolist()]


def _mean_max(values: list[float]) -> tuple[float, float]:
    if not values:
        return 0.0, 0.0
    return sum(values) / len(values), max(values)


class ReplayBufferManager:
    """Scores batches for ``num_training_ranks`` workers and injects a baseline.

    Args:
        buffer: the manager's :class:`ReplayBuffer`, or a Redis client / URL together
            with ``name=``; a buffer of that name is opened if it exists, else created
            with ``capacity`` and prioritized capacity (lowest log-reward evicted first).
        rank: this process's rank (MPI: its rank in the communicator).
        num_training_ranks: how many workers must send EXIT before :meth:`run` returns.
        scoring_function: ``f(batch, sender_rank=r) -> dict[str, float]``; default
            :func:`default_scoring_function`.
        diverse_replay_buffer: not supported by redisbuf (raises NotImplementedError).
        capacity: capacity of a buffer created here.
        store_locally: see the module docstring.
        baseline_strategy: ``"min"`` (lowest finite log-reward of the full buffer),
            ``"percentile"`` (its ``baseline_percentile`` quantile) or ``"ema"``; the EMA
            (``alpha = baseline_ema_alpha``) answers whenever the buffer cannot.
        baseline_percentile: the quantile of ``"percentile"``, in [0, 1].
        baseline_ema_alpha: the EMA's weight of a new batch minimum, in (0, 1].
        communication_backend: ``"mpi"``, ``"redis"`` or a transport object.
        timing: print the per-rank timing summary when :meth:`run` ends.
        name: the buffer's name, when ``buffer`` is a client or URL.
        transport: a ready transport (overrides ``communication_backend``).
        heartbeat_interval: seconds between heartbeats (``"redis"`` backend; see
            :mod:`redisbuf.control.redis`).
        heartbeat_ttl: seconds a heartbeat lives (``"redis"`` backend).
        poll_interval: seconds between liveness checks of the workers while idle.
        idle_timeout: raise :class:`ControlTimeoutError` after this many seconds
            without any request (``None``: wait as long as workers are alive).

    A new manager resets the buffer's EMA (meta field ``baseline_ema``).

    Raises:
        ValueError: an argument out of range, an unknown backend, or ``buffer`` a
            client or URL without ``name``.
        NotImplementedError: ``diverse_replay_buffer=True``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBufferManager
        >>> manager = ReplayBufferManager(fakeredis.FakeRedis(), name="scores",
        ...                               capacity=100, communication_backend="redis")
        >>> manager.buffer.capacity, manager.buffer.prioritized_capacity
        (100, True)
        >>> manager.update_baseline(np.array([-3.0, -1.0]))  # buffer not full: the EMA
        -3.0
        >>> manager.transport.close()

        A manager serving workers (:meth:`run`) needs worker processes; see the
        control-plane guide.
    """

    def __init__(
        self,
        buffer: Any,
        rank: int = 0,
        num_training_ranks: int = 1,
        scoring_function: ScoringFunction | None = None,
        diverse_replay_buffer: bool = False,
        capacity: int = 10000,
        store_locally: bool = True,
        baseline_strategy: str = "min",
        baseline_percentile: float = 0.1,
        baseline_ema_alpha: float = 0.1,
        communication_backend: Any = "mpi",
        timing: bool = False,
        *,
        name: str | None = None,
        transport: Transport | None = None,
        heartbeat_interval: float = 1.0,
        heartbeat_ttl: float = 5.0,
        poll_interval: float = 1.0,
        idle_timeout: float | None = None,
    ) -> None:
        if baseline_strategy not in BASELINE_STRATEGIES:
            raise ValueError(
                f"unknown baseline_strategy {baseline_strategy!r}; choose from "
                f"{list(BASELINE_STRATEGIES)}"
            )
        if not 0.0 <= baseline_percentile <= 1.0:
            raise ValueError(f"baseline_percentile must lie in [0, 1], got {baseline_percentile}")
        if not 0.0 < baseline_ema_alpha <= 1.0:
            raise ValueError(f"baseline_ema_alpha must lie in (0, 1], got {baseline_ema_alpha}")
        if num_training_ranks < 1:
            raise ValueError(f"num_training_ranks must be >= 1, got {num_training_ranks}")
        if diverse_replay_buffer:
            raise NotImplementedError(
                "diverse_replay_buffer (norm-based diversity filtering) is not implemented "
                "by redisbuf's manager"
            )
        self.buffer = self._open_buffer(buffer, name, capacity)
        self.capacity = self.buffer.capacity
        self.rank = rank
        self.num_training_ranks = num_training_ranks
        self.scoring_function = scoring_function or default_scoring_function
        self.diverse_replay_buffer: bool = diverse_replay_buffer
        self.store_locally = store_locally
        self.baseline_strategy = baseline_strategy
        self.baseline_percentile = float(baseline_percentile)
        self.baseline_ema_alpha = float(baseline_ema_alpha)
        self.communication_backend = communication_backend
        self.timing = timing
        self.poll_interval = poll_interval
        self.idle_timeout = idle_timeout
        self.transport = transport or self._make_transport(
            communication_backend, heartbeat_interval, heartbeat_ttl
        )
        self.is_running = False
        self.exit_counter = 0
        self.exited: set[int] = set()
        self.missing_items = 0
        self.last_baseline: float | None = None
        self.last_baseline_source = "none"
        self._comm_stats: dict[int, _RankStats] = {}
        self._others: dict[str, ReplayBuffer] = {}
        self._baseline_script = scripts.load("baseline")
        self._score_script = scripts.load("manager_score")
        self.buffer.client.hdel(self.buffer.keys.meta, "baseline_ema")

    # -- construction -------------------------------------------------------------------

    @staticmethod
    def _open_buffer(buffer: Any, name: str | None, capacity: int) -> ReplayBuffer:
        if isinstance(buffer, ReplayBuffer):
            return buffer
        if name is None:
            raise ValueError("give a ReplayBuffer, or a Redis client or URL with name=")
        try:
            return ReplayBuffer.open(buffer, name)
        except ConfigMismatchError:
            return ReplayBuffer(buffer, name, capacity=capacity, prioritized_capacity=True)

    def _make_transport(self, backend: Any, interval: float, ttl: float) -> Transport:
        if backend == "mpi":
            from .mpi import MPITransport

            transport = MPITransport()
            if transport.rank != self.rank:
                raise ValueError(f"manager rank {self.rank} but this MPI rank is {transport.rank}")
            return transport
        if backend == "redis":
            from .redis import RedisManagerTransport

            return RedisManagerTransport(
                self.buffer.client, self.buffer.name, self.rank, interval, ttl
            )
        if isinstance(backend, str):
            raise ValueError(f"unknown communication_backend {backend!r}; use 'mpi' or 'redis'")
        return backend

    # -- the loop -----------------------------------------------------------------------

    def run(self) -> None:
        """Serve requests until every training rank has sent EXIT.

        Raises :class:`ControlTimeoutError` when a worker is found dead without EXIT (Redis
        backend) or nothing arrives for ``idle_timeout`` seconds.

        Raises:
            ControlTimeoutError: as above.
        """
        self.is_running = True
        start = getattr(self.transport, "start", None)
        if start is not None:
            start()
        last_message = last_check = time.monotonic()
        try:
            while len(self.exited) < self.num_training_ranks:
                began = time.perf_counter()
                try:
                    sender, payload = self.transport.recv(
                        ANY_SOURCE, DATA_TAG, timeout=self.poll_interval
                    )
                except ControlTimeoutError:
                    now = time.monotonic()
                    self.transport.check_peers(self.exited)
                    last_check = now
                    if self.idle_timeout is not None and now - last_message > self.idle_timeout:
                        raise ControlTimeoutError(
                            f"manager of buffer {self.buffer.name!r}: no request for "
                            f"{self.idle_timeout:.1f} s; {len(self.exited)} of "
                            f"{self.num_training_ranks} workers sent EXIT"
                        ) from None
                    continue
                waited = time.perf_counter() - began
                last_message = now = time.monotonic()
                self._handle(sender, payload, waited)
                if now - last_check > self.poll_interval:
                    # a busy manager never idles: check liveness on a clock as well
                    self.transport.check_peers(self.exited)
                    last_check = now
        finally:
            self.is_running = False
            self.transport.close()
            if self.timing:
                print(self.timing_summary(), flush=True)

    def _stats(self, rank: int) -> _RankStats:
        stats = self._comm_stats.get(rank)
        if stats is None:
            stats = self._comm_stats[rank] = _RankStats()
        return stats

    def _reply(self, sender: int, tag: int, message: dict[str, Any], stats: _RankStats) -> None:
        began = time.perf_counter()
        self.transport.send(sender, tag, encode(message))
        stats.send.append(time.perf_counter() - began)

    def _handle(self, sender: int, payload: bytes, waited: float) -> None:
        stats = self._stats(sender)
        stats.requests += 1
        stats.bytes += len(payload)
        stats.recv.append(waited)
        try:
            message = decode(payload)
        except ProtocolError as exc:
            log.warning("rank %d sent %s", sender, exc)
            self._reply(sender, DATA_TAG, {"op": OP_ERROR, "seq": None, "error": str(exc)}, stats)
            return
        op, seq = message["op"], message.get("seq")
        if message.get("v") != VERSION:
            error = f"protocol version {message.get('v')!r}, this manager speaks {VERSION}"
            self._reply(sender, DATA_TAG, {"op": OP_ERROR, "seq": seq, "error": error}, stats)
        elif op == OP_DATA:
            began = time.perf_counter()
            try:
                score = self.score_message(sender, message)
                reply = {"op": OP_SCORE, "seq": seq, "score": score}
            except Exception as exc:  # the worker gets the reason; the manager keeps serving
                log.exception("scoring a batch of rank %d failed", sender)
                reply = {"op": OP_ERROR, "seq": seq, "error": f"{type(exc).__name__}: {exc}"}
            stats.score.append(time.perf_counter() - began)
            self._reply(sender, DATA_TAG, reply, stats)
        elif op == OP_METADATA:
            reply = {"op": OP_METADATA, "metadata": self.metadata()}
            self._reply(sender, METADATA_TAG, reply, stats)
        elif op == OP_EXIT:
            if sender not in self.exited:
                self.exited.add(sender)
                self.exit_counter = len(self.exited)
        else:
            error = f"unknown op {op!r}"
            self._reply(sender, DATA_TAG, {"op": OP_ERROR, "seq": seq, "error": error}, stats)

    # -- scoring and baselines -------------------------------------------------------------

    def score_message(self, sender: int, message: dict[str, Any]) -> dict[str, float]:
        """Score one data message: the scoring function's dict plus
        ``baseline_log_reward`` whenever a baseline exists.

        Args:
            sender: the worker's rank.
            message: the decoded data message.

        Returns:
            The score dict.
        """
        log_rewards = np.asarray(message.get("log_rewards") or [], dtype=np.float64)
        inline = message.get("inline")
        if inline is not None:
            batch: Any = States(states=inline["states"], log_rewards=inline.get("log_rewards"))
            baseline = self.update_baseline(log_rewards)
        else:
            ids = [int(i) for i in message.get("ids") or []]
            source = self._source(message.get("buffer") or self.buffer.name)
            if self._one_call(source, ids, log_rewards):
                batch, baseline = self._load_and_baseline(source, ids, log_rewards)
            else:
                batch = self._load(source, ids)
                baseline = self.update_baseline(log_rewards)
        raw = self.scoring_function(batch, sender_rank=sender)
        score = {str(key): float(value) for key, value in dict(raw).items()}
        if baseline is not None:
            score["baseline_log_reward"] = baseline
        return score

    def _source(self, name: str) -> ReplayBuffer:
        if name == self.buffer.name:
            return self.buffer
        source = self._others.get(name)
        if source is None:
            source = self._others[name] = ReplayBuffer.open(self.buffer.client, name)
        return source

    def _copies(self, source: ReplayBuffer) -> bool:
        return source is not self.buffer and self.store_locally

    def _one_call(self, source: ReplayBuffer, ids: list[int], log_rewards: np.ndarray) -> bool:
        """Whether ``lua/manager_score.lua`` can serve this request alone: it reads, copies
        and computes the baseline in one script, which is only the same as
        :meth:`_load` + :meth:`update_baseline` when a copy is a plain add (no rate
        limiter, durability wait, diversity test or forwarding manager on this buffer)
        and both buffers' keys may meet in one script (not across Redis Cluster slots)."""
        if len(log_rewards) != len(ids):
            return False  # a malformed message: the general path reports it
        if not self._copies(source):
            return True
        buffer = self.buffer
        return (
            type(buffer).add is ReplayBuffer.add
            and buffer.rate_limiter is None
            and buffer.durability is None
            and buffer.remote is None
            and not _is_cluster(buffer.client)
        )

    def _load_and_baseline(
        self, source: ReplayBuffer, ids: list[int], log_rewards: np.ndarray
    ) -> tuple[Any, float | None]:
        """:meth:`_load` and :meth:`update_baseline` in one Lua call (see
        ``lua/manager_score.lua``): the items found, copied when they live in another
        buffer, and the baseline computed after the copy."""
        keys = self.buffer.keys
        args: list[Any] = [*self._baseline_args(log_rewards), "1" if self._copies(source) else "0",
                           len(ids)]
        for item_id, text in zip(ids, _priority_texts(log_rewards), strict=True):
            args.append(format_id(item_id))
            args.append(text)
        try:
            where, value, positions, blobs = self._score_script(
                self.buffer.client, [*keys.all_keys(), source.keys.meta, source.keys.items], args
            )
        except SchemaError:
            raise SchemaError(
                f"items of buffer {source.name!r} do not fit buffer {self.buffer.name!r}: "
                + describe_schema_difference(
                    self.buffer.stored_schema(refresh=True) or {},
                    source.stored_schema(refresh=True) or {},
                )
            ) from None
        self.missing_items += len(ids) - len(positions)
        batch = source.decode(blobs, [ids[p] for p in positions])
        return batch, self._set_baseline(where, value)

    def _load(self, source: ReplayBuffer, ids: list[int]) -> Any:
        """The items ``ids`` of buffer ``source`` as one batch, copied into this
        manager's buffer when ``source`` is another one and ``store_locally``. Items
        evicted since the worker wrote them are left out (and counted in
        ``missing_items``)."""
        blobs = source.client.hmget(source.keys.items, [format_id(i) for i in ids]) if ids else []
        present = [i for i, blob in enumerate(blobs) if blob is not None]
        self.missing_items += len(ids) - len(present)
        batch = source.decode([blobs[i] for i in present], [ids[i] for i in present])
        if self._copies(source) and present:
            self.buffer.add(batch)
        return batch

    def _baseline_args(self, log_rewards: np.ndarray) -> list[str]:
        finite = log_rewards[np.isfinite(log_rewards)]
        return [
            self.baseline_strategy,
            repr(self.baseline_percentile),
            repr(self.baseline_ema_alpha),
            "1" if self.store_locally else "0",
            repr(float(finite.min())) if finite.size else "",
        ]

    def _set_baseline(self, source: bytes, value: bytes) -> float | None:
        self.last_baseline_source = source.decode()
        self.last_baseline = None if self.last_baseline_source == "none" else float(value)
        return self.last_baseline

    def update_baseline(self, log_rewards: np.ndarray) -> float | None:
        """Fold the batch's finite minimum into the EMA and return the baseline of
        ``baseline_strategy`` (``None`` while there is none), in one Lua call.

        Args:
            log_rewards: the batch's log-rewards.

        Returns:
            The baseline, or ``None``.
        """
        keys = self.buffer.keys
        source, value = self._baseline_script(
            self.buffer.client,
            [keys.meta, keys.prio, keys.order],
            self._baseline_args(np.asarray(log_rewards, dtype=np.float64)),
        )
        return self._set_baseline(source, value)

    # -- metadata -------------------------------------------------------------------------

    def compute_metadata(self) -> dict[str, Any]:
        """Extra metadata for :meth:`get_metadata` replies; override to add your own
        (values must be msgpack-encodable: numbers, strings, lists, dicts, arrays).

        Returns:
            ``{}`` here; a subclass's own entries.
        """
        return {}

    def metadata(self) -> dict[str, Any]:
        """Buffer stats, baseline state and request counters, plus :meth:`compute_metadata`.

        Returns:
            A dict of those values.
        """
        stats = self.buffer.stats()
        ema = self.buffer.client.hget(self.buffer.keys.meta, "baseline_ema")
        stats.update(
            baseline_strategy=self.baseline_strategy,
            baseline_log_reward=self.last_baseline,
            baseline_source=self.last_baseline_source,
            baseline_ema=None if ema is None else float(ema),
            store_locally=self.store_locally,
            requests=sum(s.requests for s in self._comm_stats.values()),
            exits=len(self.exited),
            num_training_ranks=self.num_training_ranks,
            missing_items=self.missing_items,
        )
        stats.update(self.compute_metadata())
        return stats

    def timing_summary(self) -> str:
        """Per rank: requests, bytes received, and mean / max of the time spent waiting
        for and receiving a request (recv), scoring it (score) and replying (send).

        Returns:
            A table, one line per rank.
        """
        lines = [
            f"replay buffer manager {self.buffer.name!r}: timing per rank (ms, mean / max)",
            f"{'rank':>5} {'requests':>9} {'bytes':>11} {'recv':>17} {'score':>17} {'send':>17}",
        ]
        for rank in sorted(self._comm_stats):
            s = self._comm_stats[rank]
            cells = []
            for values in (s.recv, s.score, s.send):
                mean, peak = _mean_max(values)
                cells.append(f"{mean * 1e3:8.3f}/{peak * 1e3:8.3f}")
            lines.append(f"{rank:>5} {s.requests:>9} {s.bytes:>11} " + " ".join(cells))
        return "\n".join(lines)

    # -- worker-side helpers (torchgfn's static API) ----------------------------------------

    @staticmethod
    def get_metadata(manager_rank: int, backend: Any, timeout: float | None = 30.0) -> dict:
        """Ask the manager for its metadata; the reply comes on ``METADATA_TAG``, so a
        pending score on ``DATA_TAG`` is left for the next ``add`` / drain. ``backend``:
        ``"mpi"``, a worker transport, or a ReplayBuffer with a remote manager.

        Args:
            manager_rank: the manager's rank.
            backend: as above.
            timeout: seconds to wait for the reply (``None``: no limit).

        Returns:
            The manager's :meth:`metadata`.

        Raises:
            ControlTimeoutError: no reply within ``timeout``.
        """
        transport = get_transport(backend)
        transport.send(manager_rank, DATA_TAG, request(OP_METADATA))
        _, payload = transport.recv(manager_rank, METADATA_TAG, timeout)
        return expect_reply(payload, OP_METADATA)["metadata"]

    @staticmethod
    def send_termination_signal(manager_rank: int, backend: Any) -> None:
        """Send EXIT to the manager and release the worker's transport. Drain a pending
        async score first (``ReplayBuffer.drain_pending_score``).

        Args:
            manager_rank: the manager's rank.
            backend: as :meth:`get_metadata`.
        """
        transport = get_transport(backend)
        transport.send(manager_rank, DATA_TAG, request(OP_EXIT))
        transport.close()
