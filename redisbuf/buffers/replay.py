"""ReplayBuffer: one named buffer in Redis, shared by every process that opens the name."""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import redis

from ..control.remote import RemoteScorer
from ..errors import (
    BufferShardedError,
    ConfigMismatchError,
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
    ItemTooLargeError,
    PerBusyError,
    RateLimitTimeoutError,
    RequestTooLargeError,
    SchemaError,
    ShardedBufferError,
    WaitTimeoutError,
)
from ..sampling import lifetime, limiters
from ..sampling.base import BufferView
from ..sampling.samplers import (
    Draw,
    PrioritizedSampler,
    Sampler,
    UniformSampler,
    finish_turning_per_on,
)
from ..sampling.waiting import UNSET, Unset, wait_for
from ..sampling.windows import WindowSampler, joined, recent_batch_size
from ..store import bounds, codec, functions, scripts
from ..store.connection import (
    as_client,
    check_durability_support,
    check_eviction_policy,
    guarded,
    retrying,
    slot_client,
)
from ..store.containers import (
    KINDS,
    ContainerKind,
    describe_schema_difference,
    kind_of,
)
from ..store.keys import (  # DEFAULT_RETRY_WINDOW: importable from here too
    DEFAULT_RETRY_WINDOW,
    BufferKeys,
    decode_meta,
    format_id,
    keeps_rewards,
    pack_ids,
)
from . import quarantine

# FILE_MAGIC, SAVE_FORMAT_VERSION, Progress: importable from here as from redisbuf.buffer
from .checkpoint import FILE_MAGIC, SAVE_FORMAT_VERSION, Checkpointing, Progress  # noqa: F401
from .insert import AddResult, Inserting

#: Layout of a buffer's keys in Redis (meta ``format_version``).
FORMAT_VERSION = 1
DEFAULT_MAX_ITEM_BYTES = 64 * 1024 * 1024
#: how long ``sample(..., block=True)`` waits when the call gives no ``timeout``
BLOCK_TIMEOUT = 30.0
# Scripts that may run twice with the same effect (set-if-absent, then compare; samplers
# retry by name, "sample*", unless max_use makes a draw count): retried like reads.
_REPEATABLE_SCRIPTS = frozenset(
    {"init", "enable_tree", "enable_per", "lifetime_config", "limiter_config", "restore_items"}
)


def _check_add_bound(name: str, blobs: list[bytes]) -> None:
    """Refuse a batch one add command may not store (redisbuf/store/bounds.py): an add is
    atomic, so it is refused, not split."""
    refusal = bounds.add_refusal(len(blobs), sum(len(blob) for blob in blobs))
    if refusal is not None:
        raise RequestTooLargeError(
            f"buffer {name!r}: {refusal}, so that no command stalls the server: add it in "
            "several batches (redisbuf.store.bounds.add_slices); nothing was written"
        )


@dataclass
class SampleInfo:
    """A sampled batch with the ids of its items and, for prioritized sampling, the
    probability with which each draw picked its item. With :class:`PERSampler`,
    ``weights`` are the importance-sampling weights ``(N * P(i))^-beta / max_j
    (N * P(j))^-beta`` (N the length, the max over the whole buffer, as DI-engine) and
    ``importance_weights`` are ALF's ``priority_i / mean non-zero priority`` (1 when every
    priority is zero).

    Attributes:
        batch: the drawn items, one batch of the buffer's kind.
        ids: the drawn items' ids, in batch order (int64).
        probabilities: each draw's probability of picking its item; ``None`` for uniform
            draws, ``sample_range`` and batches with recent data.
        weights: PER importance-sampling weights (:class:`PERSampler` only).
        importance_weights: ALF's importance weights (:class:`PERSampler` only).

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import PERSampler, ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PERSampler())
        >>> _ = buffer.add({"obs": np.arange(4.0), "log_rewards": np.zeros(4)})
        >>> info = buffer.sample_with_info(2)
        >>> info.ids.dtype, info.weights.tolist()
        (dtype('int64'), [1.0, 1.0])
    """

    batch: Any
    ids: np.ndarray
    probabilities: np.ndarray | None = None
    weights: np.ndarray | None = None
    importance_weights: np.ndarray | None = None


@dataclass
class _Config:
    capacity: int
    eviction: str
    meta: dict[str, str] = field(default_factory=dict)
    retry_window: float = DEFAULT_RETRY_WINDOW


class ReplayBuffer(Inserting, Checkpointing):
    """A replay buffer stored in Redis under ``name``, shared by all processes using it.

    Args:
        redis_or_url: a ``redis.Redis`` client (``decode_responses=False``) or a URL;
            ``None`` reads ``$REDISBUF_URL``.
        name: buffer name (letters, digits, ``_ . -``); all keys share the tag ``{name}``.
        capacity: the most items kept. Opening an existing buffer with another capacity
            raises :class:`ConfigMismatchError`; ``None`` adopts the stored one.
        prioritized_capacity: when full, evict the lowest log-reward first (oldest first
            among equals) instead of the oldest. Fixed at creation, like ``capacity``.
        prioritized_sampling: ``sample`` draws item ``i`` with probability
            ``softmax(log_rewards)_i`` (without replacement when ``n <= len``, as
            torchgfn); otherwise uniformly. See :meth:`sample`.
        kind: expected container kind (``trajectories``, ``transitions``, ``states``,
            ``dict``); by default the first ``add`` fixes it.
        max_item_bytes: largest encoded item accepted by ``add``.
        seed: seeds this process's sampling random numbers.
        sampler: a custom :class:`~redisbuf.sampling.samplers.Sampler` (overrides
            ``prioritized_sampling``).
        max_use: remove an item once it has been sampled this many times (see
            :mod:`redisbuf.sampling.lifetime`); fixed at creation, ``None`` adopts the stored one.
        max_staleness: refuse and remove items whose model version is more than this
            behind the current one (see :meth:`update_model_version`); fixed at creation.
        rate_limiter: a :mod:`redisbuf.sampling.limiters` limiter (``SampleToInsertRatio``,
            ``MinSize``) enforced for every process; fixed at creation, ``None`` adopts
            the stored one.
        recent_data_ratio: ALF's recent data: ``ceil(n * recent_data_ratio)`` draws of
            every ``sample(n)`` come uniformly from the newest ``recent_data_steps`` items,
            the rest from the sampler. This process's setting, not the buffer's.
        recent_data_steps: how many of the newest items ``recent_data_ratio``'s draws
            come from.
        remote_manager_rank: rank of a :class:`~redisbuf.control.manager.ReplayBufferManager`
            that scores what this worker adds; the other remote arguments below follow
            torchgfn and are described in :mod:`redisbuf.control.remote`. ``add`` then puts
            the score dict (what torchgfn's ``add`` returns) in ``AddResult.score``.
        remote_buffer_freq: every ``remote_buffer_freq``-th ``add`` sends the items
            accumulated since the last send.
        async_score: ``add`` returns the previous send's score (None on the first)
            instead of waiting for its own.
        baseline_filtering: send only items with ``log_reward >=`` the manager's last
            ``baseline_log_reward``.
        baseline_refresh_after: after this many sends in a row left empty by the
            filter, the next one goes out unfiltered.
        scoring_only: the message carries the items' terminating states and log-rewards
            instead of their ids.
        communication_backend: ``"mpi"``, ``"redis"`` or a transport object.
        timing: record the duration of each send and receive.
        lazy_sort: accepted for torchgfn compatibility; changes nothing: eviction is
            already incremental, so there is no per-add sort to defer.
        async_comm: torchgfn's non-blocking send with the score collected on the next
            ``add``; here the same as ``async_score`` (the data is in Redis already).
        strict: raise :class:`~redisbuf.errors.ServerConfigError` instead of warning when
            the server's ``maxmemory-policy`` may evict the buffer's keys (``allkeys-*``).
        durability: ``None`` (``add`` returns once the server applied the batch),
            ``"aof"`` (also once WAITAOF confirms the server's append-only file has it:
            Redis >= 7.2 or valkey with ``appendonly yes``) or ``"replica"`` (once WAIT
            confirms a replica has it). Checked when the buffer is opened
            (:class:`~redisbuf.errors.ServerConfigError` where unsupported); an add not
            confirmed within ``durability_timeout`` seconds raises
            :class:`~redisbuf.errors.DurabilityError` (the batch is in the buffer).
        durability_timeout: seconds ``durability``'s confirmation is waited for.
        retry_window: seconds (at least, up to about twice that) for which the buffer
            remembers each add's batch id and reply, so that an add retried after a lost
            reply is not stored twice; fixed at creation (default 600), ``None`` adopts
            the stored one.
        shards: with ``N > 1``, the constructor returns a
            :class:`~redisbuf.buffers.sharded.ShardedReplayBuffer`: one logical buffer of the
            global ``capacity`` over ``N`` shards (on a Redis Cluster, on different
            masters); fixed at creation.

    Raises:
        ValueError: an argument out of range (``capacity``, ``kind``, ``max_item_bytes``,
            ``recent_data_ratio``, ``recent_data_steps``, ``retry_window``, ``durability``).
        ConfigMismatchError: the stored buffer was made with another configuration.
        ServerConfigError: ``strict`` and an evicting ``maxmemory-policy``, or a
            ``durability`` the server cannot confirm.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=3)
        >>> buffer.add({"obs": np.arange(4.0), "log_rewards": np.zeros(4)}).evicted
        1
        >>> len(buffer), sorted(buffer.sample(3)["obs"])
        (3, [1.0, 2.0, 3.0])
    """

    def __init__(
        self,
        redis_or_url: Any = None,
        name: str = "default",
        capacity: int | None = 1000,
        prioritized_capacity: bool = False,
        prioritized_sampling: bool = False,
        *,
        kind: str | None = None,
        max_item_bytes: int = DEFAULT_MAX_ITEM_BYTES,
        seed: int | None = None,
        sampler: Sampler | None = None,
        recent_data_ratio: float = 0.0,
        recent_data_steps: int = 1,
        remote_manager_rank: int | None = None,
        remote_buffer_freq: int = 1,
        async_score: bool = False,
        baseline_filtering: bool = False,
        baseline_refresh_after: int = 10,
        scoring_only: bool = False,
        communication_backend: Any = "mpi",
        timing: bool = False,
        lazy_sort: bool = False,
        async_comm: bool = False,
        strict: bool = False,
        durability: str | None = None,
        durability_timeout: float = 10.0,
        max_use: int | None = None,
        max_staleness: int | None = None,
        rate_limiter: limiters.RateLimiter | None = None,
        retry_window: float | None = None,
        shards: int = 1,
    ) -> None:
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity <= 0
        ):
            raise ValueError(f"capacity must be a positive integer, got {capacity!r}")
        if kind is not None and kind not in KINDS:
            raise ValueError(f"unknown container kind {kind!r}; choose from {sorted(KINDS)}")
        if max_item_bytes <= 0:
            raise ValueError(f"max_item_bytes must be positive, got {max_item_bytes}")
        if not 0.0 <= recent_data_ratio <= 1.0:
            raise ValueError(f"recent_data_ratio must be in [0, 1], got {recent_data_ratio!r}")
        if isinstance(recent_data_steps, bool) or not isinstance(recent_data_steps, int) or (
            recent_data_steps < 1
        ):
            raise ValueError(
                f"recent_data_steps must be a positive integer, got {recent_data_steps!r}"
            )
        if retry_window is not None and (
            isinstance(retry_window, bool)
            or not isinstance(retry_window, (int, float))
            or not 0 < retry_window < math.inf
        ):
            raise ValueError(
                f"retry_window must be a positive number of seconds, got {retry_window!r}"
            )
        self.recent_data_ratio = float(recent_data_ratio)
        self.recent_data_steps = recent_data_steps
        self._owns_client = redis_or_url is None or isinstance(redis_or_url, str)
        # on a cluster, the client of the master of the buffer's slot (see SlotClient)
        self.client = guarded(slot_client(as_client(redis_or_url), BufferKeys(name).meta))
        check_eviction_policy(self.client, strict)
        # the FCALL library for clients in other languages (redisbuf/store/functions.py): best
        # effort, checked once per client
        functions.ensure_installed(self.client)
        self.durability, self.durability_timeout = durability, float(durability_timeout)
        check_durability_support(self.client, durability)
        self.keys = BufferKeys(name)
        self.name = name
        self.max_item_bytes = max_item_bytes
        self.rng = np.random.default_rng(seed)
        #: what the buffer's parts (sampler, limiter, lifetime rules, replicas) see of it;
        #: its runner looks ``_run`` up at each call, so that a runner wrapped on this
        #: object (tests count or race its calls) is the parts' too
        self.view = BufferView(name, self.client, self.keys,
                               lambda *args, **kwargs: self._run(*args, **kwargs))
        self._schema: dict[str, Any] | None = None
        self._schema_json: str | None = None
        self._config = self._open(
            capacity, "reward" if prioritized_capacity else "fifo", retry_window
        )
        self.retry_window = self._config.retry_window
        self.capacity = self._config.capacity
        self.prioritized_capacity = self._config.eviction == "reward"
        self.prioritized_sampling = prioritized_sampling
        stored_kind = self._config.meta.get("kind")
        if kind is not None and stored_kind is not None and kind != stored_kind:
            raise ConfigMismatchError(
                f"buffer {name!r} holds {stored_kind}, not {kind} (container kind mismatch)"
            )
        self.kind = kind or stored_kind
        self.max_use, self.max_staleness = lifetime.configure(
            self.view, max_use, max_staleness)
        # an item's last use removes it inside the drawing script: fetch blobs there too
        self.fetch_inline = self.view.fetch_inline = self.max_use is not None
        self._rates = lifetime.RateMeter()
        self.rate_limiter = limiters.configure(self.view, rate_limiter)
        if sampler is None:
            sampler = PrioritizedSampler() if prioritized_sampling else UniformSampler()
        self.sampler = sampler
        self.sampler.prepare(self.view)
        # torchgfn's lazy_sort defers its per-add sort and truncation to a flush at twice
        # the capacity. Eviction here is incremental (sorted sets, O(log capacity) per
        # item), so there is no sort to defer, and the items kept are those a flush keeps.
        self.lazy_sort = bool(lazy_sort)
        # torchgfn's async_comm sends the data without blocking and collects the score on
        # the next add. Here the data is in Redis when the insert returns and the message
        # carries only ids, so async_comm is async_score.
        self.async_comm = bool(async_comm)
        async_score = async_score or self.async_comm
        self.remote: RemoteScorer | None = None
        if remote_manager_rank is not None:
            self.remote = RemoteScorer(
                self.view, remote_manager_rank, remote_buffer_freq, async_score, baseline_filtering,
                baseline_refresh_after, scoring_only, communication_backend, timing,
            )

    def __new__(cls, *args: Any, shards: int = 1, **kwargs: Any) -> Any:
        """Constructor dispatch, the only place where a constructor call picks another
        class than the one called: ``ReplayBuffer(..., shards=N)`` with any ``shards``
        but the integer 1 returns ``ShardedReplayBuffer(..., shards=N)`` built from the
        same arguments (it validates ``N``). That object is not a ReplayBuffer, so Python
        does not run ``ReplayBuffer.__init__`` on it. Subclasses take no ``shards``.

        The class is chosen from the argument, before the server is asked what the name
        holds: ``shards=1`` on a sharded name builds a plain buffer, whose creation
        lua/init.lua refuses (see :meth:`_refuse_sharded`); :meth:`open` refuses a
        sharded name likewise (``ShardedReplayBuffer.open`` opens one)."""
        if shards == 1 and not isinstance(shards, bool):
            return super().__new__(cls)
        if cls is not ReplayBuffer:
            raise ValueError(f"shards= is supported by ReplayBuffer, not {cls.__name__}")
        from .sharded import ShardedReplayBuffer  # imports this module: not at the top

        return ShardedReplayBuffer(*args, shards=shards, **kwargs)

    @classmethod
    def open(cls, redis_or_url: Any, name: str, **kwargs: Any) -> ReplayBuffer:
        """Open an existing buffer with its stored configuration.

        Raises :class:`ConfigMismatchError` if no buffer called ``name`` exists.

        Args:
            redis_or_url: a ``redis.Redis`` client or a URL.
            name: the buffer's name.
            **kwargs: further :class:`ReplayBuffer` arguments (not ``capacity``,
                ``prioritized_capacity`` nor ``shards``: those are the stored ones).

        Returns:
            The buffer, with the stored capacity and eviction.

        Raises:
            ConfigMismatchError: no buffer called ``name`` exists.
            ShardedBufferError: ``name`` is a sharded buffer (open it with
                :meth:`ShardedReplayBuffer.open`).

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> _ = ReplayBuffer(client, "demo", capacity=5)
            >>> ReplayBuffer.open(client, "demo").capacity
            5
        """
        client = guarded(as_client(redis_or_url))
        meta = decode_meta(client.hgetall(BufferKeys(name).meta))
        if not meta and client.exists(BufferKeys(name).shards):
            raise ShardedBufferError(
                f"buffer {name!r} is sharded: open it with ReplayBuffer(..., shards=N) or "
                "ShardedReplayBuffer.open (which save and load it whole); ReplayBuffer.open "
                "and the command line other than export / import work on its shards "
                "(buffers of their own), not on the whole"
            )
        if not meta:
            raise ConfigMismatchError(f"no buffer named {name!r} exists in this Redis")
        return cls(
            client,
            name,
            capacity=None,
            prioritized_capacity=meta.get("eviction") == "reward",
            **kwargs,
        )

    # -- plumbing ---------------------------------------------------------------------

    def _run(self, script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        # read: these arguments make the script write nothing (Script.read)
        loaded = scripts.load(script)
        run = loaded.read if read else loaded
        # a draw counts uses under max_use (and may remove items): a repeat is not harmless
        repeatable_draw = script.startswith("sample") and getattr(self, "max_use", None) is None
        if repeatable_draw or script in _REPEATABLE_SCRIPTS:
            return retrying(lambda: run(self.client, keys, args), name=self.client)
        return run(self.client, keys, args)

    def _open(self, capacity: int | None, eviction: str, retry_window: float | None) -> _Config:
        if capacity is None:
            meta = decode_meta(self.client.hgetall(self.keys.meta))
            if not meta:
                self._refuse_sharded()
                raise ConfigMismatchError(
                    f"buffer {self.name!r} does not exist; give a capacity to create it"
                )
        else:
            window = DEFAULT_RETRY_WINDOW if retry_window is None else retry_window
            try:
                reply = self._run(
                    "init",
                    [self.keys.meta, self.keys.shards],
                    [capacity, eviction, FORMAT_VERSION, int(time.time()), repr(float(window))],
                )
            except BufferShardedError:
                self._refuse_sharded()
                raise
            meta = decode_meta(dict(zip(reply[::2], reply[1::2], strict=True)))
        if "capacity" not in meta or "eviction" not in meta:
            raise ConfigMismatchError(
                f"buffer meta {self.keys.meta} has no configuration (fields: {sorted(meta)}); "
                "drop the buffer to reuse the name"
            )
        stored = _Config(
            int(meta["capacity"]),
            meta["eviction"],
            meta,
            float(meta.get("retry_window", DEFAULT_RETRY_WINDOW)),
        )
        if int(meta.get("format_version", FORMAT_VERSION)) > FORMAT_VERSION:
            raise ConfigMismatchError(
                f"buffer {self.name!r} was written by a newer redisbuf "
                f"(format {meta['format_version']}, this one reads {FORMAT_VERSION})"
            )
        if capacity is not None and stored.capacity != capacity:
            raise ConfigMismatchError(
                f"buffer {self.name!r} exists with capacity {stored.capacity}, "
                f"not {capacity} (capacity mismatch)"
            )
        if capacity is not None and stored.eviction != eviction:
            raise ConfigMismatchError(
                f"buffer {self.name!r} exists with eviction policy {stored.eviction!r}, "
                f"not {eviction!r} (prioritized_capacity mismatch)"
            )
        if retry_window is not None and stored.retry_window != float(retry_window):
            raise ConfigMismatchError(
                f"buffer {self.name!r} exists with retry_window {stored.retry_window:g} s, "
                f"not {float(retry_window):g} s (retry_window mismatch)"
            )
        if "schema" in meta:
            self._schema_json = meta["schema"]
            self._schema = json.loads(meta["schema"])
        return stored

    def _refuse_sharded(self) -> None:
        """Raise ConfigMismatchError if ``name`` is a sharded buffer's: a plain buffer of
        that name would hide it from every process (see lua/init.lua)."""
        raw = self.client.hget(self.keys.shards, "layout")
        if raw is None:
            return
        count = json.loads(raw).get("shards")
        raise ConfigMismatchError(
            f"buffer {self.name!r} is sharded ({count} shards), not 1 (shards mismatch): "
            f"open it with shards={count} or ShardedReplayBuffer.open; nothing was written"
        )

    def _stored_schema(self) -> dict[str, Any] | None:
        if self._schema is None:
            raw = self.client.hget(self.keys.meta, "schema")
            if raw is not None:
                self._schema_json = raw.decode()
                self._schema = json.loads(self._schema_json)
                self.kind = self._schema["kind"]
        return self._schema

    def stored_schema(self, refresh: bool = False) -> dict[str, Any] | None:
        """The schema the buffer holds (its container kind and fields, fixed by the first
        add and kept in its meta), None while none is stored. Once read it is remembered
        (it changes only when the buffer is dropped and made again); ``refresh=True``
        reads it from the server again (another process may have dropped the buffer and
        made it again with other data)."""
        if refresh:
            self._forget_schema()
        return self._stored_schema()

    def _schema_refusal(self, schema: dict[str, Any]) -> SchemaError:
        """The error for a batch the server refused by its schema: another process may have
        fixed the schema first, so it is described against the stored one."""
        self._forget_schema()
        stored = self._stored_schema() or {}
        return SchemaError(
            f"batch does not fit buffer {self.name!r}: "
            f"{describe_schema_difference(stored, schema)}"
        )

    def _forget_schema(self) -> None:
        self._schema = self._schema_json = None
        self.kind = None

    def _check_schema(self, schema: dict[str, Any], schema_json: str) -> None:
        stored = self._stored_schema()
        if stored is not None and schema_json != self._schema_json:
            self._forget_schema()  # another process may have dropped and recreated the buffer
            stored = self._stored_schema()
        if stored is not None and schema_json != self._schema_json:
            raise SchemaError(
                f"batch does not fit buffer {self.name!r}: "
                f"{describe_schema_difference(stored, schema)}"
            )
        if self.kind is not None and schema["kind"] != self.kind:
            raise SchemaError(
                f"batch does not fit buffer {self.name!r}: buffer holds {self.kind}, "
                f"batch is {schema['kind']}"
            )

    # -- writing ------------------------------------------------------------------------

    def encode(self, batch: Any) -> tuple[list[bytes], np.ndarray, dict[str, Any]]:
        """Validate ``batch`` and encode it: (blobs, log-rewards, schema). Writes nothing.

        Args:
            batch: a container of the buffer's kind (see :meth:`add`).

        Returns:
            One encoded blob per item, the items' log-rewards, and the batch's schema.

        Raises:
            InvalidBatchError: the batch is empty, or lacks ``log_rewards`` on a buffer that
                ranks items by log-reward.
            ItemTooLargeError: an item encodes to more than ``max_item_bytes``.
        """
        columns, log_rewards, schema = kind_of(batch).split(batch)
        if len(log_rewards) == 0:
            raise InvalidBatchError("batch is empty")
        if (self.prioritized_capacity or self.prioritized_sampling) and (
            "log_rewards" not in schema["fields"]
        ):
            raise InvalidBatchError(
                "this buffer ranks items by log-reward: the batch must carry log_rewards"
            )
        blobs = codec.encode_columns(columns, len(log_rewards))
        for index, blob in enumerate(blobs):
            if len(blob) > self.max_item_bytes:
                raise ItemTooLargeError(
                    f"item {index} encodes to {len(blob)} bytes, over max_item_bytes="
                    f"{self.max_item_bytes}"
                )
        return blobs, log_rewards, schema

    def add(
        self,
        batch: Any,
        priorities: Any = None,
        *,
        model_version: int | None = None,
        session_id: str | None = None,
    ) -> AddResult:
        """Insert every item of ``batch`` in one atomic step, then evict beyond capacity.

        ``model_version`` is recorded per item; a batch more than ``max_staleness`` behind
        the current version, or whose ``session_id`` is not the current session, is
        refused and counted (``rejected`` of the result says why; nothing is stored).

        Eviction removes the oldest items (FIFO), or with ``prioritized_capacity`` the
        lowest log-reward ones (oldest first among equal log-rewards; new items included).
        Log-rewards may be -inf or +inf (+inf items are evicted last; prioritized sampling
        refuses to draw while one is present, as the softmax is undefined).
        A batch that is rejected (wrong kind or schema, NaN log-rewards, an item
        over ``max_item_bytes``, more than :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS`
        items or, with more than one item, more than
        :data:`~redisbuf.store.bounds.MAX_ADD_BYTES` of encoded items:
        :class:`RequestTooLargeError`) raises and leaves the buffer unchanged.

        ``priorities`` (one finite number >= 0 per item) sets the items' PER priorities
        on a buffer using :class:`PERSampler`; without it they get
        ``max(initial_priority, highest priority present)``.

        With a remote manager, ``.score`` of the result is the manager's score dict for
        this batch (None when nothing was sent), or with ``async_score`` the previous
        send's (None on the first); see :mod:`redisbuf.control.remote`.

        Args:
            batch: a container of the buffer's kind: ``Trajectories``, ``Transitions``,
                ``States`` or a dict of equally long columns (``log_rewards`` among them where
                items are ranked by log-reward).
            priorities: one PER priority per item, or ``None``.
            model_version: the model version that produced the batch, or ``None``.
            session_id: the session that produced the batch, or ``None``.

        Returns:
            The new items' ids, how many items were evicted, the manager's score, and why the
            batch was rejected (``None`` when it was stored).

        Raises:
            InvalidBatchError: the batch is empty, malformed, or has NaN log-rewards.
            SchemaError: the batch's kind or fields differ from the buffer's.
            ItemTooLargeError: an item encodes to more than ``max_item_bytes``.
            RequestTooLargeError: more items or bytes than one add may carry.
            ConfigMismatchError: ``priorities`` on a buffer without :class:`PERSampler`.
            DurabilityError: ``durability`` was not confirmed in time (the batch is stored).
            ServerFullError: the server is at ``maxmemory`` (nothing is stored).

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2)
            >>> result = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> result.ids.tolist(), result.evicted, result.rejected
            ([1, 2, 3], 1, None)
        """
        options = lifetime.add_options(model_version, session_id)
        blobs, log_rewards, schema = self.encode(batch)
        _check_add_bound(self.name, blobs)
        if priorities is not None:
            options["per_priorities"] = _per_priority_texts(priorities, len(blobs))
            if self.client.hget(self.keys.meta, "tree_mass") != b"per":
                raise ConfigMismatchError(
                    f"buffer {self.name!r} has no PER priorities: priorities= needs PERSampler"
                )
        limiter = self.rate_limiter
        if limiter is not None:
            limiters.acquire(self.view, limiter, "insert", len(blobs))
        try:
            result = self._insert(blobs, log_rewards, schema, options)
        except BaseException:
            if limiter is not None:
                limiters.release(self.view, "insert", len(blobs))
            raise
        if limiter is not None and result.rejected is not None:
            limiters.release(self.view, "insert", len(blobs))
        if self.remote is not None:
            result.score = self.remote.after_add(batch, result.ids, log_rewards, schema)
        return result

    def drain_pending_score(self, timeout_sec: float = 30.0) -> dict[str, float] | None:
        """Collect an outstanding async score before EXIT, waiting at most
        ``timeout_sec``; None when nothing is pending, on timeout, or without a manager.

        Args:
            timeout_sec: the longest wait, in seconds.

        Returns:
            The manager's score dict, or ``None``.
        """
        return None if self.remote is None else self.remote.drain_pending_score(timeout_sec)

    # -- reading ------------------------------------------------------------------------

    def _container_kind(self) -> tuple[ContainerKind, dict[str, Any]]:
        schema = self._stored_schema()
        if schema is None:
            raise EmptyBufferError(f"buffer {self.name!r} is empty")
        return KINDS[schema["kind"]], schema

    def decode(
        self, blobs: list[bytes], ids: list[int] | None = None, schema_json: bytes | None = None
    ) -> Any:
        """Join stored blobs into one batch of this buffer's kind. ``schema_json`` is the
        meta's schema read together with the blobs: when it differs from the cached one
        (the buffer was dropped and recreated meanwhile), the cache is refreshed first.

        Args:
            blobs: stored item blobs, as :meth:`encode` made them.
            ids: the items' ids, named by a :class:`DecodeError`; or ``None``.
            schema_json: the meta's ``schema`` field read with the blobs, or ``None``.

        Returns:
            One batch of the buffer's kind.

        Raises:
            EmptyBufferError: the buffer has no schema yet (nothing was ever added).
            DecodeError: a blob does not decode, naming the first offending id.
        """
        if schema_json is not None and schema_json.decode() != self._schema_json:
            self._forget_schema()
        kind, schema = self._container_kind()
        with codec.gc_paused():
            return self._decode(kind, schema, blobs, ids)

    def _decode(
        self, kind: ContainerKind, schema: dict[str, Any], blobs: list[bytes], ids: list[int] | None
    ) -> Any:
        """Every way a batch can fail to decode ends here as a DecodeError naming the
        buffer, its items key and the first offending id (found by decoding the items
        one by one, which costs nothing on the success path)."""
        try:
            return self._join(kind, schema, blobs, ids)
        except Exception as exc:  # noqa: BLE001 - any failure of stored data is a DecodeError
            culprit, detail = (0, exc) if len(blobs) == 1 else (None, exc)
            for position in range(len(blobs) if culprit is None else 0):
                try:
                    self._join(kind, schema, blobs[position : position + 1], None)
                except Exception as single:  # noqa: BLE001
                    culprit, detail = position, single
                    break
            if culprit is None:  # each item decodes alone; together they do not fit
                where = f"ids {(ids or [])[:10]}"
            else:
                where = f"id {ids[culprit]}" if ids else f"position {culprit}"
            raise DecodeError(
                f"buffer {self.name!r}, key {self.keys.items}, {where}: "
                f"{type(detail).__name__}: {detail}"
            ) from exc

    def _join(
        self, kind: ContainerKind, schema: dict[str, Any], blobs: list[bytes], ids: list[int] | None
    ) -> Any:
        scratch = codec.take_scratch()
        try:
            return self._join_with(kind, schema, blobs, scratch)
        finally:
            codec.give_back(scratch)

    def _join_with(
        self, kind: ContainerKind, schema: dict[str, Any], blobs: list[bytes],
        scratch: codec.Scratch,
    ) -> Any:
        names = set(schema["fields"])
        # array fields may be views of scratch: the container's join copies them out
        fields: dict[str, Any] | None = codec.decode_same_layout(blobs, scratch)
        if fields is None or set(fields) != names:
            fields = codec.decode_ragged(blobs, scratch)
        if fields is None or set(fields) != names:
            items = []
            for blob in blobs:
                if blob is None:
                    raise DecodeError("no such item")
                item = codec.unpackb_raw(blob)
                if not isinstance(item, dict) or set(item) != names:
                    raise DecodeError("fields do not match the buffer schema")
                items.append(item)
            fields = {name: [item[name] for item in items] for name in names}
        return kind.join(fields, len(blobs), schema)

    def _draw(
        self,
        n: int,
        replacement: bool | None,
        sample_range: slice | None = None,
        block: bool = False,
        timeout: float | None | Unset = UNSET,
        min_size: int | None = None,
    ) -> Draw:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        if min_size is not None and (
            isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer))
            or min_size < 1
        ):
            raise ValueError(f"min_size must be a positive integer or None, got {min_size!r}")
        n = int(n)
        limiter = self.rate_limiter
        if not block:
            if limiter is not None:
                limiters.acquire(self.view, limiter, "sample", n, timeout)
            return self._draw_admitted(n, replacement, sample_range)
        wait = BLOCK_TIMEOUT if timeout is UNSET else timeout
        need = n if min_size is None else int(min_size)
        held_for: list[str] = []  # what the rate limiter waited for at the last attempt

        def attempt() -> Draw | None:
            held_for.clear()
            if len(self) < need:
                return None
            if limiter is not None:
                reason = limiters.refusal(self.view, limiter, "sample", n)
                if reason is not None:
                    held_for.append(reason)
                    return None
            try:
                return self._draw_admitted(n, replacement, sample_range)
            except EmptyBufferError:
                return None  # e.g. every item has log-reward -inf: wait for a drawable one

        try:
            return wait_for(
                self.client,
                self.keys.meta,
                attempt,
                wait,
                lambda: f"buffer {self.name!r}: sample({n}) waited {wait:g} s for {need} "
                f"drawable items; it holds {len(self)}",
                error=WaitTimeoutError,
            )
        except WaitTimeoutError:
            if held_for:
                # the items were there: name what the limiter waited for instead
                raise RateLimitTimeoutError(
                    f"buffer {self.name!r}: sample({n}) waited {wait:g} s; the rate limiter "
                    f"held the sample back, waiting for {held_for[0]}"
                ) from None
            raise

    def _draw_admitted(self, n: int, replacement: bool | None, sample_range: slice | None) -> Draw:
        """Draw, taking back the rate limiter's count when nothing is drawn."""
        try:
            return self._draw_now(n, replacement, sample_range)
        except BaseException:
            if self.rate_limiter is not None:
                limiters.release(self.view, "sample", n)
            raise

    def _draw_now(self, n: int, replacement: bool | None, sample_range: slice | None) -> Draw:
        sampler: Sampler = self.sampler
        view, rng = self.view, self.rng

        def draw(count: int) -> Draw:
            # this call's replacement is an argument of these samplers' draws (their state,
            # e.g. the id range of uniform draws, is the view's); any other sampler keeps
            # its own setting
            if replacement is not None and isinstance(
                sampler, (UniformSampler, PrioritizedSampler)
            ):
                return sampler.draw(view, count, rng, replacement=replacement)
            return sampler.draw(view, count, rng)

        try:
            if sample_range is not None:
                return WindowSampler(sample_range, bool(replacement)).draw(view, n, rng)
            recent = recent_batch_size(n, self.recent_data_ratio)
            if recent == 0:
                return draw(n)
            window = WindowSampler(slice(-self.recent_data_steps, None), bool(replacement))
            recent_draw = window.draw(view, recent, rng)
            rest = draw(n - recent) if n > recent else None
            return joined(recent_draw, rest)
        except EmptyBufferError as exc:
            raise EmptyBufferError(f"buffer {self.name!r}: {exc}") from None

    def sample(
        self,
        n: int,
        replacement: bool | None = None,
        sample_range: slice | None = None,
        *,
        block: bool = False,
        timeout: float | None | Unset = UNSET,
        min_size: int | None = None,
    ) -> Any:
        """Draw ``n`` items and return them as one batch of the buffer's kind.

        With ``block=True`` it first waits until the buffer holds ``min_size`` items
        (default ``n``), the rate limiter (if any) admits the sample and a draw succeeds,
        waking when any process adds; after ``timeout`` seconds (default 30, ``None``: no
        limit) it raises :class:`WaitTimeoutError` (a ``TimeoutError``) naming the
        buffer, or :class:`RateLimitTimeoutError` naming what the limiter waited for when
        it held the sample back. Without ``block`` only a rate limiter makes it wait: up
        to ``timeout`` seconds when given, else the limiter's own ``timeout``.

        Sampling is without replacement unless ``replacement=True`` or ``n`` exceeds the
        length (torchgfn's rule). Uniform: every n-subset equally likely. Prioritized
        (``prioritized_sampling=True``): proportional to ``exp(log_reward)``, without
        replacement as successive draws among the items not drawn yet (torch.multinomial's
        distribution). Raises :class:`EmptyBufferError` ("buffer is empty") when there is
        nothing to draw, :class:`SamplingError` when prioritized sampling is undefined
        (a +inf log-reward; more draws without replacement than items of nonzero
        probability). ``sample_range`` (a slice over insertion order, e.g.
        ``slice(-10_000, None)`` for the newest 10 000; DI-engine's ``sample_range``) draws
        uniformly among those items instead, whatever the sampler.

        No command holds the server for long (:mod:`redisbuf.store.bounds`): a uniform
        draw of more than ``MAX_ITEMS_PER_COMMAND`` (2048) items, ``sample_range``'s
        included, is made as several commands, one atomic draw each; without replacement
        the items are still distinct, each command drawing uniformly among the items
        present then (in the window as it is then) that the earlier ones did not return,
        so every n-subset is equally likely when no other process changes the buffer
        meanwhile. A selector's draw of more than that many raises
        :class:`RequestTooLargeError`.

        A drawn record that does not decode (another client stored it) is set aside in
        the buffer's quarantine hash (``rb:{name}:quarantine``), counted in
        ``stats()["quarantined"]``, named in a
        :class:`~redisbuf.errors.QuarantinedRecordWarning`, and the draw is made again
        without it (:mod:`redisbuf.buffers.quarantine`).

        Args:
            n: how many items to draw (a positive integer).
            replacement: ``True`` draws with replacement, ``False`` without; ``None`` follows
                the rule above.
            sample_range: a slice over insertion order to draw uniformly from, or ``None``.
            block: wait as described above.
            timeout: the longest wait in seconds (``None``: no limit).
            min_size: with ``block``, the length to wait for (default ``n``).

        Returns:
            One batch of the buffer's kind holding the ``n`` drawn items.

        Raises:
            ValueError: ``n`` or ``min_size`` is not a positive integer.
            EmptyBufferError: there is nothing to draw.
            SamplingError: prioritized sampling is undefined.
            RequestTooLargeError: a selector's draw of more than ``MAX_ITEMS_PER_COMMAND``.
            WaitTimeoutError: ``block`` and ``timeout`` passed first.
            RateLimitTimeoutError: the rate limiter held the sample back past ``timeout``.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", seed=0)
            >>> _ = buffer.add({"obs": np.arange(5.0), "log_rewards": np.zeros(5)})
            >>> batch = buffer.sample(3)
            >>> batch["obs"].shape, len(set(batch["obs"]))
            ((3,), 3)
            >>> sorted(buffer.sample(2, sample_range=slice(-2, None))["obs"])
            [3.0, 4.0]
        """
        return self._sample(n, replacement, sample_range, block, timeout, min_size)[1]

    def _sample(
        self,
        n: int,
        replacement: bool | None,
        sample_range: slice | None,
        block: bool,
        timeout: float | None | Unset,
        min_size: int | None,
    ) -> tuple[Draw, Any]:
        """A draw and its decoded batch, records that do not decode set aside."""
        draw = self._draw(n, replacement, sample_range, block, timeout, min_size)
        return quarantine.decode_draw(
            self, draw, lambda count: self._draw_now(count, replacement, sample_range))

    def sample_with_info(
        self,
        n: int,
        replacement: bool | None = None,
        sample_range: slice | None = None,
        *,
        block: bool = False,
        timeout: float | None | Unset = UNSET,
        min_size: int | None = None,
    ) -> SampleInfo:
        """Like :meth:`sample`, also returning item ids and draw probabilities (None for
        ``sample_range`` and for batches with recent data).

        Args:
            n: as :meth:`sample`.
            replacement: as :meth:`sample`.
            sample_range: as :meth:`sample`.
            block: as :meth:`sample`.
            timeout: as :meth:`sample`.
            min_size: as :meth:`sample`.

        Returns:
            The batch with its items' ids, draw probabilities and PER weights.

        Raises:
            EmptyBufferError: as :meth:`sample`, which lists the others.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import PrioritizedSampler, ReplayBuffer
            >>> buffer = ReplayBuffer(
            ...     fakeredis.FakeRedis(), "demo", sampler=PrioritizedSampler(), seed=0)
            >>> _ = buffer.add({"obs": np.arange(2.0), "log_rewards": np.log([1.0, 3.0])})
            >>> info = buffer.sample_with_info(50, replacement=True)
            >>> sorted(set(zip(info.ids.tolist(), info.probabilities.round(2).tolist())))
            [(1, 0.25), (2, 0.75)]
        """
        draw, batch = self._sample(n, replacement, sample_range, block, timeout, min_size)
        return SampleInfo(
            batch,
            np.array(draw.ids, dtype=np.int64),
            draw.probabilities,
            draw.weights,
            draw.importance_weights,
        )

    def update_priority(self, ids: Any, priorities: Any) -> int:
        """Set the PER priorities of items ``ids`` (:class:`PERSampler`), atomically for
        the whole call when it names at most
        :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` ids (a larger call is one
        atomic command per slice of that many, in order). Ids no longer stored (evicted)
        are skipped; for a repeated id the last priority wins (across slices too, as they
        apply in order). Returns how many distinct ids were updated. A priority that is
        NaN, negative or not finite raises :class:`InvalidBatchError` and changes nothing.
        The server's work is constant per id whatever the buffer's size (one HMGET and
        one HSET of the ``per`` hash, one log entry); samplers re-weigh the items in their
        replicas when they next draw (this process's replica at once, when nothing else
        changed the buffer since it was current).

        Args:
            ids: the items' ids.
            priorities: one priority per id, finite and >= 0.

        Returns:
            How many distinct ids were updated.

        Raises:
            InvalidBatchError: a priority is NaN, negative or not finite, or the lengths
                differ.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import PERSampler, ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PERSampler())
            >>> ids = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)}).ids
            >>> buffer.update_priority(ids, [0.5, 2.0, 2.0])
            3
        """
        id_list = np.asarray(ids, dtype=np.int64).reshape(-1).tolist()
        texts = _per_priority_texts(priorities, len(id_list))
        if not id_list:
            return 0
        if len(id_list) > bounds.MAX_ITEMS_PER_COMMAND:  # one command per slice
            return sum(self.update_priority(id_list[start:stop], texts[start:stop])
                       for start, stop in bounds.chunks(len(id_list)))
        packed, width = pack_ids(np.array(id_list, dtype=np.int64))
        args: list[Any] = [packed, width, ",".join(texts)]
        try:
            reply = self._run("update_priority", self.keys.all_keys(), args)
        except PerBusyError:
            finish_turning_per_on(self.view)  # another process began turning PER on
            reply = self._run("update_priority", self.keys.all_keys(), args)
        updated, epoch, before, after, stamp_before, stamp_after = reply
        replica = self.view.replicas.get("per")
        if replica is not None:
            with replica.lock:
                if (
                    replica.epoch == _text(epoch)
                    and replica.version == int(before)
                    and replica.stamp == _text(stamp_before)
                    and int(after) == int(before) + 1
                ):
                    # this call's entry is the only change since the replica's version
                    id_array = np.array(id_list, dtype=np.int64)
                    values = np.array(texts, dtype=np.float64)
                    last = len(id_array) - 1 - np.unique(id_array[::-1], return_index=True)[1]
                    id_array, values = id_array[last], values[last]
                    held = replica.slots_of(id_array) >= 0
                    replica.set_scores(id_array[held], values[held])
                    replica.version = int(after)
                    replica.stamp = _text(stamp_after)
        return int(updated)

    def get(self, ids: list[int] | np.ndarray) -> Any:
        """The items with these ids, as one batch (KeyError names any id not present).

        Read by HMGETs of at most :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`
        ids (and about :data:`~redisbuf.store.bounds.MAX_REPLY_BYTES` of blobs) each, so
        a large call never holds the server for long; it is then not one atomic read:
        an item evicted between two of them is named by the KeyError.

        Args:
            ids: the items' ids.

        Returns:
            One batch of the buffer's kind, in the order of ``ids``.

        Raises:
            KeyError: an id is not in the buffer.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> ids = buffer.add({"obs": np.array([7.0, 8.0]), "log_rewards": np.zeros(2)}).ids
            >>> buffer.get([ids[1], ids[0]])["obs"].tolist()
            [8.0, 7.0]
        """
        ids = [int(i) for i in ids]
        members = [format_id(i) for i in ids]
        step = bounds.MAX_ITEMS_PER_COMMAND
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.items, members[:step])
        pipe.hget(self.keys.meta, "schema")
        blobs, schema_json = pipe.execute()
        start = len(blobs)
        while start < len(members):
            present = [len(blob) for blob in blobs if blob is not None]
            step = bounds.items_for_bytes(sum(present) / len(present) if present else 0)
            blobs += self.client.hmget(self.keys.items, members[start : start + step])
            start += step
        missing = [i for i, blob in zip(ids, blobs, strict=True) if blob is None]
        if missing:
            raise KeyError(f"ids not in buffer {self.name!r}: {missing[:10]}")
        return self.decode(blobs, ids, schema_json)

    def close(self) -> None:
        """Release the connections of a client this buffer made (from a URL); a client
        passed in stays open (its owner closes it). The buffer's data stays in Redis.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> with ReplayBuffer(client, "demo") as buffer:  # leaving it calls close()
            ...     _ = buffer.add({"obs": [1.0], "log_rewards": [0.0]})
            >>> client.ping(), len(ReplayBuffer.open(client, "demo"))  # both still there
            (True, 1)
        """
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> ReplayBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return int(self.client.zcard(self.keys.order))

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(name={self.name!r}, capacity={self.capacity}, "
            f"eviction={self._config.eviction!r}, sampler={self.sampler.name!r})"
        )

    def top(self, k: int = 10) -> list[tuple[int, float]]:
        """The ``k`` items of highest log-reward (priority) as ``(id, log_reward)``.

        Read :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` ranks per command: a
        ``k`` above that is not one atomic read (items added or evicted meanwhile shift
        the later ranks).

        Args:
            k: how many items.

        Returns:
            ``(id, log_reward)`` pairs, highest log-reward first; ``[]`` when ``k <= 0``.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", prioritized_capacity=True)
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.array([0.5, 2.0, 1.0])})
            >>> buffer.top(2)
            [(2, 2.0), (3, 1.0)]
        """
        if k <= 0:
            return []
        kept = keeps_rewards(self.client, self.keys)  # else all 0: the newest first
        rows: list[Any] = []
        step = bounds.MAX_ITEMS_PER_COMMAND
        while len(rows) < k:
            start = len(rows)
            part = self.client.zrevrange(self.keys.prio if kept else self.keys.order, start,
                                         min(start + step, k) - 1, withscores=True)
            rows += part
            if len(part) < min(step, k - start):
                break
        return [(int(member), float(score) if kept else 0.0) for member, score in rows]

    def stats(self) -> dict[str, Any]:
        """Counters, length, capacity and configuration, plus Redis memory of the keys;
        data lifetime (:func:`redisbuf.sampling.lifetime.lifetime_stats`: mean use count of present
        and removed items, mean staleness of sampled items, refused adds), priority
        min / mean / max, and insert / sample rates (items per second since this
        process's previous ``stats()``, or since creation on the first).

        Returns:
            A dict keyed by name (``length``, ``capacity``, ``inserted``, ``evicted``,
            ``sampled``, ``quarantined``, ...).

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2)
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> stats = buffer.stats()
            >>> stats["length"], stats["inserted"], stats["evicted"]
            (2, 3, 1)
        """
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.meta)
        pipe.zcard(self.keys.order)
        meta_raw, length = pipe.execute()
        meta = decode_meta(meta_raw)
        return {
            "name": self.name,
            "capacity": int(meta.get("capacity", self.capacity)),
            "length": int(length),
            "inserted": int(meta.get("inserted", 0)),
            "evicted": int(meta.get("evicted", 0)),
            "sampled": int(meta.get("sampled", 0)),
            "last_id": int(meta.get("last_id", 0)),
            "kind": meta.get("kind"),
            "eviction": meta.get("eviction"),
            "prioritized_sampling_ready": meta.get("tree") == "1",
            "quarantined": int(meta.get("quarantined", 0)),
            "memory_bytes": self.memory_usage(),
            **lifetime.lifetime_stats(meta, int(length)),
            **lifetime.priority_stats(self.view, meta),
            **self._rates.rates(meta),
        }

    def update_model_version(self, session_id: str, model_version: int) -> int:
        """Make ``model_version`` of ``session_id`` current, for every process (MineStudio's
        argument order). A new session removes every item; with ``max_staleness``, items
        whose version is below ``model_version - max_staleness`` are removed, lowest
        versions first, in commands of at most :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS`
        items each (redisbuf/store/bounds.py): until the last of them, other processes may
        still draw an item being removed, and a version another process makes current
        meanwhile governs the removals left. Later adds are checked against these. Returns
        the number of items removed.

        Args:
            session_id: the session whose version this is.
            model_version: the version made current.

        Returns:
            The number of items removed.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", max_staleness=1)
            >>> batch = {"obs": np.arange(2.0), "log_rewards": np.zeros(2)}
            >>> _ = buffer.add(batch, model_version=0, session_id="run")
            >>> buffer.update_model_version("run", 2)
            2
            >>> buffer.add(batch, model_version=0, session_id="run").rejected
            'stale'
        """
        return lifetime.update_model_version(self.view, session_id, model_version)

    def memory_usage(self) -> int | None:
        """Bytes Redis reports for this buffer's keys (None if the server cannot say):
        its estimate from :data:`~redisbuf.store.bounds.MEMORY_USAGE_SAMPLES` elements of
        each key, exact for keys of no more elements (counting every element of a key of
        millions would hold the server for hundreds of milliseconds).

        Returns:
            Bytes, or ``None``.
        """
        total = 0
        try:
            for key in self.keys.all_keys():
                used = self.client.memory_usage(key, samples=bounds.MEMORY_USAGE_SAMPLES)
                total += int(used or 0)
        except redis.exceptions.ResponseError:
            return None
        return total

    # -- lifecycle ----------------------------------------------------------------------

    def clear(self) -> int:
        """Remove every item, reset the counters; keep capacity, kind and schema.
        Ids are never reused. Returns the number of items removed.

        Returns:
            The number of items removed.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> buffer.clear(), len(buffer)
            (3, 0)
            >>> buffer.add({"obs": np.zeros(1), "log_rewards": np.zeros(1)}).ids.tolist()
            [4]
        """
        return int(self._run("clear", self.keys.all_keys(), []))

    def drop(self) -> None:
        """Delete the buffer entirely, configuration included: every key under its tag
        (``rb:{name}:*``: its own, the control plane's, a load's staging keys) but those of
        an EpisodeBuffer, SequenceBuffer or FragmentBuffer of the same name and a sharded
        buffer's layout (see :meth:`BufferKeys.owns`).

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> buffer = ReplayBuffer(client, "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> buffer.drop()
            >>> client.keys("rb:{demo}:*")
            []
        """
        found = {
            key.decode() if isinstance(key, bytes) else key
            for key in self.client.scan_iter(match=self.keys.pattern, count=1000)
        }
        extra = sorted(key for key in found - set(self.keys.all_keys()) if self.keys.owns(key))
        # one script (lua/drop.lua): the buffer's own keys and whatever else of it the SCAN
        # found go together, and the server frees large values in the background
        self._run("drop", [*self.keys.all_keys(), *extra], [])
        self._forget_schema()

def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _per_priority_texts(priorities: Any, n: int) -> list[str]:
    """PER priorities as exact text, after checking there are ``n`` finite numbers >= 0."""
    try:
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError) as exc:
        raise InvalidBatchError(f"priorities must be numbers: {exc}") from None
    if len(values) != n:
        raise InvalidBatchError(f"{len(values)} priorities for {n} items")
    bad = np.flatnonzero(~np.isfinite(values) | (values < 0))
    if len(bad):
        raise InvalidBatchError(
            f"priority {bad[0]} is {values[bad[0]]!r}; priorities must be finite and >= 0"
        )
    return list(map(repr, values.tolist()))


