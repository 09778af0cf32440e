"""ReplayBuffer: one named buffer in Redis, shared by every process that opens the name."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..control.remote import ManagerLink, RemoteScorer
from ..errors import (
    ConfigMismatchError,
    EmptyBufferError,
    InvalidBatchError,
    ItemTooLargeError,
    NoSuchBufferError,
    RateLimitTimeoutError,
    ShardedBufferError,
    WaitTimeoutError,
)
from ..sampling import lifetime, limiters
from ..sampling.base import BufferView
from ..sampling.removers import Remover, remover_of
from ..sampling.samplers import (
    Draw,
    PERSampler,
    PrioritizedSampler,
    Sampler,
    UniformSampler,
)
from ..sampling.waiting import UNSET, Unset, wait_for
from ..sampling.windows import WindowSampler, joined, recent_batch_size
from ..store import functions, scripts
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
    kind_of,
    schema_to_json,
)
from ..store.keys import (
    BufferKeys,
    decode_meta,
)
from . import quarantine
from .checkpoint import Checkpointing
from .decoding import Decoding
from .editing import Editing
from .insert import AddResult, Inserting, check_add_bound
from .inspection import Inspecting
from .opening import FORMAT_VERSION, Opening, _Config  # noqa: F401
from .priorities import Prioritizing, _per_priorities

DEFAULT_MAX_ITEM_BYTES = 64 * 1024 * 1024
#: how long ``sample(..., block=True)`` waits when the call gives no ``timeout``
BLOCK_TIMEOUT = 30.0


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
        records: the drawn items' stored records, as :meth:`ReplayBuffer.records` reads
            them (what a compare and set of :meth:`ReplayBuffer.replace` expects).
        priorities: each drawn item's PER priority when it was drawn
            (:class:`PERSampler` only).

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
    records: list[bytes] | None = None
    priorities: np.ndarray | None = None


class ReplayBuffer(
    Opening, Inserting, Decoding, Prioritizing, Checkpointing, Inspecting, Editing
):
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
            ``dict``, or ``nest``: schemaless, a list of items of any nest, see
            :mod:`redisbuf.store.nest`); by default the first ``add`` fixes it.
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
        manager: a :class:`~redisbuf.control.remote.ManagerLink`: a
            :class:`~redisbuf.control.manager.ReplayBufferManager` scores what this worker
            adds (see :mod:`redisbuf.control.remote`), and ``add`` puts the score dict
            (what torchgfn's ``add`` returns) in ``AddResult.score``. This process's
            setting, not the buffer's.
        strict: raise :class:`~redisbuf.errors.ServerConfigError` instead of warning when
            the server's ``maxmemory-policy`` may evict the buffer's keys (``allkeys-*``).
        durability: ``None`` (``add`` returns once the server applied the batch),
            ``"aof"`` (also once WAITAOF confirms the server's append-only file has it:
            Redis >= 7.2 or valkey with ``appendonly yes``) or ``"replica"`` (once WAIT
            confirms a replica has it). Checked when the buffer is opened
            (:class:`~redisbuf.errors.ServerConfigError` where unsupported); an add not
            confirmed within ``durability_timeout`` seconds raises
            :class:`~redisbuf.errors.DurabilityError` (the batch is in the buffer).
        durability_timeout: seconds ``durability``'s confirmation is waited for (a
            client's ``socket_timeout``, if set, must exceed it by at least 1 s, else
            ``ValueError``).
        retry_window: seconds (at least, up to about twice that) for which the buffer
            remembers each add's batch id and reply, so that an add retried after a lost
            reply is not stored twice; fixed at creation (default 600), ``None`` adopts
            the stored one.
        remover: what leaves the buffer when it is full, a
            :mod:`redisbuf.sampling.removers` rule (Reverb's removers: FIFO, LIFO, uniform,
            prioritized, max / min heap by PER priority); fixed at creation, ``None``
            adopts the stored one (or, for a new buffer, FIFO, or lowest log-reward first
            with ``prioritized_capacity``).

    Raises:
        ValueError: an argument out of range (``capacity``, ``kind``, ``max_item_bytes``,
            ``recent_data_ratio``, ``recent_data_steps``, ``retry_window``, ``durability``),
            or both ``remover`` and ``prioritized_capacity``.
        TypeError: ``manager`` is not a :class:`~redisbuf.control.remote.ManagerLink`, or
            ``remover`` is not a :class:`~redisbuf.sampling.removers.Remover`.
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
        manager: ManagerLink | None = None,
        strict: bool = False,
        durability: str | None = None,
        durability_timeout: float = 10.0,
        max_use: int | None = None,
        max_staleness: int | None = None,
        rate_limiter: limiters.RateLimiter | None = None,
        retry_window: float | None = None,
        remover: Remover | None = None,
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
        if remover is not None and not isinstance(remover, Remover):
            raise TypeError(f"remover must be a Remover, got {type(remover).__name__}")
        if remover is not None and prioritized_capacity:
            raise ValueError("prioritized_capacity and remover both say what to evict: "
                             "give one")
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
        check_durability_support(self.client, durability, self.durability_timeout)
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
        if remover is not None:
            eviction = remover.eviction
        else:
            eviction = "reward" if prioritized_capacity else "fifo"
        self._config = self._open(capacity, eviction, retry_window)
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
        #: what leaves the buffer when it is full (None: ``prioritized_capacity``)
        self.remover = remover_of(self._config.eviction)
        if self.remover is not None:
            self.remover.prepare(self.view)
        if manager is not None and not isinstance(manager, ManagerLink):
            raise TypeError(f"manager must be a ManagerLink, got {type(manager).__name__}")
        #: this worker's link to its manager (None: no manager)
        self.manager = manager
        self.remote = None if manager is None else RemoteScorer(self.view, manager)

    @classmethod
    def open(cls, redis_or_url: Any, name: str, **kwargs: Any) -> ReplayBuffer:
        """Open an existing buffer with its stored configuration.

        Raises :class:`ConfigMismatchError` if no buffer called ``name`` exists.

        Args:
            redis_or_url: a ``redis.Redis`` client or a URL.
            name: the buffer's name.
            **kwargs: further :class:`ReplayBuffer` arguments (not ``capacity``,
                ``prioritized_capacity``: those are the stored ones).

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
                f"buffer {name!r} is sharded: open it with ShardedReplayBuffer(..., "
                "shards=N) or ShardedReplayBuffer.open (which save and load it whole); "
                "ReplayBuffer.open "
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
        # retried like reads when the script's header says a repeat is harmless (a draw is,
        # unless max_use counts it: see scripts.py on @retry)
        counted = getattr(self, "max_use", None) is not None
        if loaded.retry == "safe" or (loaded.retry == "draw" and not counted):
            return retrying(lambda: run(self.client, keys, args), name=self.client)
        return run(self.client, keys, args)

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
        blobs, log_rewards, schema = kind_of(batch).encode(batch)
        if self.kind is not None and schema["kind"] != self.kind:
            # the kind first: "buffer holds dict, batch is nest" says more than what the
            # batch lacks for this kind (checked again, against the server, by the add)
            self._check_schema(schema, schema_to_json(schema))
        if len(log_rewards) == 0:
            raise InvalidBatchError("batch is empty")
        if (self.prioritized_capacity or self.prioritized_sampling) and (
            "log_rewards" not in schema["fields"]
        ):
            raise InvalidBatchError(
                "this buffer ranks items by log-reward: the batch must carry log_rewards"
            )
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
        raise_running_max: bool = True,
    ) -> AddResult:
        """Insert every item of ``batch`` in one atomic step, then evict beyond capacity.

        ``model_version`` is recorded per item; a batch more than ``max_staleness`` behind
        the current version, or whose ``session_id`` is not the current session, is
        refused and counted (``rejected`` of the result says why; nothing is stored).

        Eviction removes the oldest items (FIFO), or with ``prioritized_capacity`` the
        lowest log-reward ones (oldest first among equal log-rewards; new items included),
        or what the buffer's ``remover`` chooses, one new item at a time.
        Log-rewards may be -inf or +inf (+inf items are evicted last; prioritized sampling
        refuses to draw while one is present, as the softmax is undefined).
        A batch that is rejected (wrong kind or schema, NaN log-rewards, an item
        over ``max_item_bytes``) raises and leaves the buffer unchanged.

        A batch of more than :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS` items or, with
        more than one item, more than :data:`~redisbuf.store.bounds.MAX_ADD_BYTES` of
        encoded items is a large add (redisbuf/buffers/staged.py): staged in slices,
        committed, then stored a slice per command, atomically all the same (every other
        call on the buffer waits until it is stored whole). With a remover that chooses
        at random it is refused (:class:`RequestTooLargeError`) instead.

        ``priorities`` (one finite number >= 0 per item) sets the items' PER priorities
        on a buffer using :class:`PERSampler`; without it they get
        ``max(initial_priority, the highest priority set since PER was turned on or the
        buffer cleared)``: a running max, which an item's eviction or a lower update does
        not lower; with ``raise_running_max=False`` these priorities leave it as it is
        (DI-engine's max priority counts priority updates only).

        With a remote manager, ``.score`` of the result is the manager's score dict for
        this batch (None when nothing was sent), or with ``async_score`` the previous
        send's (None on the first); see :mod:`redisbuf.control.remote`.

        Args:
            batch: a container of the buffer's kind: ``Trajectories``, ``Transitions``,
                ``States``, a dict of equally long columns (``log_rewards`` among them where
                items are ranked by log-reward), or a list of items of any nest
                (:class:`~redisbuf.store.containers.Items` to give them log-rewards).
            priorities: one PER priority per item, or ``None``.
            model_version: the model version that produced the batch, or ``None``.
            session_id: the session that produced the batch, or ``None``.
            raise_running_max: whether ``priorities`` may raise the running max.

        Returns:
            The new items' ids, how many items were evicted, the manager's score, and why the
            batch was rejected (``None`` when it was stored).

        Raises:
            InvalidBatchError: the batch is empty, malformed, or has NaN log-rewards.
            SchemaError: the batch's kind or fields differ from the buffer's.
            UnsupportedItemError: an item of a nest batch holds a value the nest codec
                does not store (a ``TypeError`` naming its path and type).
            ItemTooLargeError: an item encodes to more than ``max_item_bytes``.
            RequestTooLargeError: more items or bytes than one add may carry, with a
                remover that chooses at random.
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
        if self.remover is not None and self.remover.random:
            # the remover's choices (lua/_removers.lua) draw on this process's generator
            options["evict_u"] = self.rng.random(2 * len(blobs) + 8).tolist()
            # (a large add's slices would each need their own: not staged)
            remover = type(self.remover).__name__
            check_add_bound(self.name, blobs, f" (its remover, {remover}, chooses at random: "
                            "no add above that is stored a slice at a time)")
        if priorities is not None:
            checked = _per_priorities(priorities, len(blobs))
            options["per_priorities"] = list(map(repr, checked.tolist()))
            if not raise_running_max:
                options["per_keep_max"] = True
            # a buffer without PER refuses them in the reservation (ConfigMismatchError)
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
        if replacement is False and isinstance(self.sampler, PERSampler) \
                and sample_range is None:
            raise ValueError("PERSampler draws with replacement (as Reverb's and TorchRL's "
                             "prioritized samplers do); replacement=False is not available")
        limiter = self.rate_limiter
        if limiter is not None and getattr(self.sampler, "admits", False) and not block:
            return self._draw_self_admitted(n, timeout)
        if not block:
            if limiter is not None:
                limiters.acquire(self.view, limiter, "sample", n, timeout)
            return self._draw_admitted(n, replacement, sample_range)
        wait = BLOCK_TIMEOUT if timeout is UNSET else timeout
        if min_size is not None:
            need = int(min_size)
        elif limiter is not None and replacement is not False:
            # the limiter says when sampling may start (Reverb's min_size_to_sample), and
            # a batch larger than the buffer is drawn with replacement: waiting for n items
            # as well could wait for inserts the limiter holds back until this sample
            need = min(n, limiter.min_size_to_sample)
        else:
            need = n
        held_for: list[str] = []  # what the rate limiter waited for at the last attempt

        def attempt() -> Draw | None:
            held_for.clear()
            if len(self) < need:
                if not self.client.exists(self.keys.meta):  # dropped: not coming back
                    raise NoSuchBufferError(f"buffer meta {self.keys.meta} does not exist")
                return None
            admits = getattr(self.sampler, "admits", False)  # asks the limiter itself
            if limiter is not None and not admits:
                reason = limiters.refusal(self.view, limiter, "sample", n)
                if reason is not None:
                    held_for.append(reason)
                    return None
            try:
                drawn = self._draw_admitted(n, replacement, sample_range)
            except EmptyBufferError:
                return None  # e.g. every item has log-reward -inf: wait for a drawable one
            if not drawn.ids:
                held_for.append("the rate limiter to admit a sample")
                return None
            return drawn

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

    def _draw_self_admitted(self, n: int, timeout: float | None | Unset) -> Draw:
        """The draw of a sampler that asks the rate limiter itself (``admits``), waiting
        while it admits nothing, up to ``timeout`` (else the limiter's)."""
        limiter = self.rate_limiter
        assert limiter is not None

        def attempt() -> Draw | None:
            draw = self._draw_now(n, None, None)
            return draw if draw.ids else None

        wait = limiter.timeout if timeout is UNSET else timeout
        return wait_for(self.client, self.keys.meta, attempt, wait,
                        lambda: f"buffer {self.name!r}: sample({n}) waited {wait:g} s for the "
                        "rate limiter to admit a sample", error=RateLimitTimeoutError)

    def _draw_admitted(self, n: int, replacement: bool | None, sample_range: slice | None) -> Draw:
        """Draw, taking back the rate limiter's count when nothing is drawn (a sampler
        that asks the limiter itself counted nothing then)."""
        try:
            return self._draw_now(n, replacement, sample_range)
        except BaseException:
            if self.rate_limiter is not None and not getattr(self.sampler, "admits", False):
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
        (default ``n``; with a rate limiter and unless ``replacement=False``, its
        ``min_size_to_sample`` when smaller), the rate limiter (if any) admits the sample
        and a draw succeeds,
        waking when any process adds; after ``timeout`` seconds (default 30, ``None``: no
        limit) it raises :class:`WaitTimeoutError` (a ``TimeoutError``) naming the
        buffer, or :class:`RateLimitTimeoutError` naming what the limiter waited for when
        it held the sample back. Without ``block`` only a rate limiter makes it wait: up
        to ``timeout`` seconds when given, else the limiter's own ``timeout``.

        Sampling is without replacement unless ``replacement=True`` or ``n`` exceeds the
        length (torchgfn's rule); :class:`PERSampler` always draws with replacement, and
        ``replacement=False`` with it raises ``ValueError``. Uniform: every n-subset equally
        likely. Prioritized (``prioritized_sampling=True``): proportional to
        ``exp(log_reward)``, without replacement as successive draws among the items not
        drawn yet (torch.multinomial's distribution). Raises :class:`EmptyBufferError`
        ("buffer is empty") when there is nothing to draw, :class:`SamplingError` when
        prioritized sampling is undefined (a +inf log-reward; more draws without replacement
        than items of nonzero probability). ``sample_range`` (a slice over insertion order,
        e.g. ``slice(-10_000, None)`` for the newest 10 000; DI-engine's ``sample_range``)
        draws uniformly among those items instead, whatever the sampler.

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
            One batch of the buffer's kind holding the ``n`` drawn items (for a ``nest``
            buffer, a list of the items, in draw order).

        Raises:
            ValueError: ``n`` or ``min_size`` is not a positive integer, or
                ``replacement=False`` with :class:`PERSampler`.
            NoSuchBufferError: the buffer was dropped (while ``block`` waited, too).
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
            list(draw.blobs),
            draw.priorities,
        )
