"""One logical replay buffer over several shards, each a :class:`ReplayBuffer` of its own.

``ShardedReplayBuffer(url, name, capacity, shards=N)`` keeps shard ``k`` as the buffer
``name.shardK`` (``name.shardK.J`` when a suffix ``J`` is needed to land it on the
intended slot), with its own hash tag: on a Redis Cluster the
shards sit on different masters, and each shard's scripts stay atomic on its one slot.

* Layout: the hash ``rb:{name}:shards`` (field ``layout``, JSON) records the shard count,
  the shard names, the global capacity and the eviction policy, written once by the
  first process (HSETNX) and read by every later one; field ``schema`` fixes the items'
  schema for every shard at the first ``add``. A name holds a layout or a plain buffer's
  meta, never both: lua/shard_layout.lua refuses a layout beside a meta and lua/init.lua
  a meta beside a layout, so ``ReplayBuffer(url, name)`` on a sharded name
  raises and writes nothing. On a cluster client, shard ``k`` is named
  so that its slot belongs to master ``k mod M`` (masters ordered by their first slot);
  otherwise so that its slot is in the ``k``-th of ``N`` equal slot ranges.
* Capacity: the global ``capacity`` is split across the shards (``capacity // N``, the
  first ``capacity % N`` shards one more); each shard evicts on its own (FIFO or lowest
  log-reward), so the items kept are the newest (or best) of each shard.
* ``add``: a whole batch goes to one shard, the shards taken in turn from a random start
  (per process). Ids are global: item ``i`` of shard ``k`` is ``i * N + k``.
* ``len`` / ``stats`` / ``top`` aggregate over the shards.
* Sampling: by the buffer's ``batch_law``, ``"global"`` (the default: the distribution
  of an unsharded buffer over every shard's items) or ``"shard_local"`` (each batch whole
  from one shard chosen by its mass, every draw's marginal law the global one): see
  :mod:`redisbuf.buffers.sharded_draws`.
* A shard whose server is lost raises :class:`~redisbuf.errors.ShardUnavailableError`
  naming the buffer, the shard and its node; the other shards keep working for
  operations that address only them (``add`` to them, ``get`` of their ids, their own
  ``shards[k]`` buffer). Sampling, ``len`` and ``stats`` address every shard.
* ``save`` / ``state_dict`` write the unsharded save format (version 2; ``per`` the PER
  settings and every record's PER priority under PER) with global capacity and summed
  counters, plus the header's ``shards`` (count, each
  shard's capacity and counters); the records go shard by shard, oldest first within a
  shard, with global ids. Such a file loads into a plain :class:`ReplayBuffer` as well,
  and a plain buffer's file into a sharded one. ``load`` / ``load_state_dict`` check the
  whole file first (every shard's part as the unsharded load checks a file); then a
  sharded file of the same shard count gives every shard its own items and counters,
  any other file gives record ``j`` to shard ``j mod N`` and splits the counters as the
  capacity is split. Each shard is then restored by the unsharded machinery (staging
  keys, one swap script): atomic per shard, not across shards; a failure after some
  shards were restored raises :class:`~redisbuf.errors.PartialLoadError` naming them.
* PER (``sampler=PERSampler(...)``, the same settings on every shard): item ``i`` is
  drawn with probability ``mass_i / sum of all masses`` in either batch law;
  ``weights`` and ``importance_weights`` are over the whole buffer. ``update_priority``
  routes each global id to its shard (atomic per shard). Prioritized draws read every
  shard's masses from this process's replicas (:mod:`redisbuf.sampling.replica`),
  caught up in one pipeline (with replacement, and PER: after the commits, see
  :mod:`redisbuf.buffers.sharded_draws`).
* ``sample(..., block=True)`` waits (polling) until the shards hold ``min_size`` items.
* Not supported: other custom samplers, ``max_use``, ``max_staleness``, rate limiters,
  remote managers, ``sample_range``.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import numpy as np
import redis
import redis.crc

from ..errors import (
    BufferNotShardedError,
    ConfigMismatchError,
    SchemaError,
    ServerUnavailableError,
    ShardUnavailableError,
)
from ..sampling.samplers import PERSampler
from ..store import bounds, scripts
from ..store.connection import as_client, guarded, is_cluster
from ..store.containers import kind_of, schema_to_json
from ..store.keys import BufferKeys
from .insert import AddResult
from .replay import ReplayBuffer
from .savefile import saved_shard_count
from .shard_calls import SHARD_LOST as _SHARD_LOST
from .sharded_checkpoint import ShardedCheckpointing
from .sharded_draws import BATCH_LAWS, ShardedSampling

SLOTS = 16384
LAYOUT_VERSION = 1
# Options handed to every shard unchanged; anything else a ReplayBuffer takes is refused.
_SHARD_OPTIONS = (
    "kind", "max_item_bytes", "strict", "durability", "durability_timeout", "retry_window"
)
def _slot(tag: str) -> int:
    return int(redis.crc.key_slot(tag.encode()))


def _masters(client: Any) -> list[tuple[int, str]] | None:
    """(first slot, "host:port") of each master of a cluster client, by first slot;
    None for a client of one server."""
    if not is_cluster(client):
        return None
    cache = getattr(client, "unwrapped", client).nodes_manager.slots_cache
    first: dict[str, int] = {}
    for slot, nodes in cache.items():
        if nodes:
            first[nodes[0].name] = min(slot, first.get(nodes[0].name, slot))
    return sorted((slot, name) for name, slot in first.items())


def shard_names(client: Any, name: str, shards: int) -> list[str]:
    """The names of the ``shards`` shards of buffer ``name`` for a new layout: shard ``k``
    lands on master ``k mod M`` of a cluster client, or in the ``k``-th of ``shards``
    equal slot ranges otherwise (see the module docstring)."""
    masters = _masters(client)
    owner: dict[int, str] = {}
    if masters:
        cache = getattr(client, "unwrapped", client).nodes_manager.slots_cache
        owner = {slot: nodes[0].name for slot, nodes in cache.items() if nodes}
    names = []
    for k in range(shards):
        for j in range(100_000):
            candidate = f"{name}.shard{k}" if j == 0 else f"{name}.shard{k}.{j}"
            slot = _slot(candidate)
            if masters:
                fits = owner.get(slot) == masters[k % len(masters)][1]
            else:
                fits = k * SLOTS // shards <= slot < (k + 1) * SLOTS // shards
            if fits:
                names.append(candidate)
                break
        else:  # pragma: no cover - 100 000 tries miss a 1/N range with probability ~0
            raise AssertionError(f"no name found for shard {k} of {name!r}")
    return names


class ShardedReplayBuffer(ShardedCheckpointing, ShardedSampling):
    """A replay buffer of global ``capacity`` stored as ``shards`` buffers (see the
    module docstring for layout, sampling and failure semantics).

    Opening an existing sharded buffer with another shard count, capacity or eviction
    policy raises :class:`ConfigMismatchError`; ``capacity=None`` adopts the stored one.

    Args:
        redis_or_url: as :class:`ReplayBuffer`.
        name: as :class:`ReplayBuffer`.
        capacity: the global capacity, as :class:`ReplayBuffer`'s.
        prioritized_capacity: as :class:`ReplayBuffer`.
        prioritized_sampling: as :class:`ReplayBuffer`.
        shards: the number of shards (>= 1, at most ``capacity``).
        seed: as :class:`ReplayBuffer`.
        batch_law: ``"global"`` (each batch has the law of an unsharded buffer's) or
            ``"shard_local"`` (each batch from one shard chosen by its mass; every
            draw's marginal law exact; see :mod:`redisbuf.buffers.sharded_draws`). This
            object's own (not stored); may be changed between calls.
        **options: ``sampler`` (a :class:`PERSampler` only) and the
            :class:`ReplayBuffer` arguments every shard gets: ``kind``,
            ``max_item_bytes``, ``strict``, ``durability``, ``durability_timeout``,
            ``retry_window``.

    Raises:
        ValueError: an argument out of range, or an option a sharded buffer does not
            support.
        ConfigMismatchError: the stored layout differs.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ShardedReplayBuffer
        >>> buffer = ShardedReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=4, shards=2)
        >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
        >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
        >>> len(buffer), buffer.stats()["evicted"], buffer.sample(4)["obs"].shape
        (4, 2, (4,))
    """

    def __init__(
        self,
        redis_or_url: Any = None,
        name: str = "default",
        capacity: int | None = 1000,
        prioritized_capacity: bool = False,
        prioritized_sampling: bool = False,
        *,
        shards: int,
        seed: int | None = None,
        batch_law: str = "global",
        **options: Any,
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive integer, got {shards!r}")
        if batch_law not in BATCH_LAWS:
            raise ValueError(
                f"batch_law must be one of {', '.join(map(repr, BATCH_LAWS))}, got "
                f"{batch_law!r}"
            )
        #: "global" or "shard_local" (see redisbuf.buffers.sharded_draws)
        self.batch_law = batch_law
        sampler = options.pop("sampler", None)
        if sampler is not None and not isinstance(sampler, PERSampler):
            raise ValueError(
                f"a sharded buffer samples uniformly, by softmax (prioritized_sampling) or "
                f"by PER (sampler=PERSampler(...)), not with {type(sampler).__name__}"
            )
        unsupported = sorted(k for k, v in options.items() if k not in _SHARD_OPTIONS and v)
        if unsupported:
            raise ValueError(
                f"a sharded buffer does not support {', '.join(unsupported)} (supported: "
                f"{', '.join(_SHARD_OPTIONS)}, seed, prioritized_capacity, "
                "prioritized_sampling)"
            )
        if capacity is not None and (
            isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < shards
        ):
            raise ValueError(
                f"capacity must be an integer >= shards ({shards}), got {capacity!r}"
            )
        self._owns_client = redis_or_url is None or isinstance(redis_or_url, str)
        self.client = guarded(as_client(redis_or_url))
        self.name = name
        self.keys = BufferKeys(name)
        self.prioritized_sampling = bool(prioritized_sampling)
        #: the PER settings every shard uses (None: no PER)
        self.per: PERSampler | None = sampler
        if sampler is not None and self.prioritized_sampling:
            raise ValueError("choose prioritized_sampling or sampler=PERSampler(...), not both")
        eviction = "reward" if prioritized_capacity else "fifo"
        layout = self._layout(shards, capacity, eviction)
        self.count = shards
        self.capacity = int(layout["capacity"])
        self.prioritized_capacity = layout["eviction"] == "reward"
        self.shard_names: list[str] = list(layout["names"])
        seeds = np.random.SeedSequence(seed).spawn(shards + 1)
        self.rng = np.random.default_rng(seeds[0])
        self.shards: list[ReplayBuffer] = []
        for k, shard_name in enumerate(self.shard_names):
            share = self.capacity // shards + (1 if k < self.capacity % shards else 0)
            with self._on_shard(k):
                self.shards.append(
                    ReplayBuffer(
                        self.client,
                        shard_name,
                        capacity=share,
                        prioritized_capacity=self.prioritized_capacity,
                        prioritized_sampling=self.prioritized_sampling,
                        sampler=None if sampler is None else PERSampler(
                            sampler.alpha, sampler.beta, sampler.initial_priority, sampler.eps
                        ),
                        seed=int(seeds[k + 1].generate_state(1)[0]),
                        **options,
                    )
                )
        self._next = int(self.rng.integers(shards))
        self._schema_json: str | None = None
        #: draw from the shards at once, one thread each (see _draws)
        self.parallel = True
        self._pool: ThreadPoolExecutor | None = None
        self._pool_pid = 0
        self._known: tuple[np.ndarray | None, int, int] = (None, 0, 0)
        self._fill = np.zeros(shards)
        self._last_weights = (np.empty(0), np.empty(0))

    # -- layout -------------------------------------------------------------------------

    def _layout(self, shards: int, capacity: int | None, eviction: str) -> dict[str, Any]:
        layout = ""
        if capacity is not None:
            layout = json.dumps({
                "version": LAYOUT_VERSION,
                "shards": shards,
                "names": shard_names(self.client, self.name, shards),
                "capacity": capacity,
                "eviction": eviction,
            })
        # one script writes the layout (first writer wins) unless a plain buffer has the
        # name, so no process can put a layout beside a plain buffer (nor, lua/init.lua,
        # the reverse); everyone then checks against what is stored
        try:
            raw = scripts.load("shard_layout")(
                self.client, [self.keys.shards, self.keys.meta], [layout]
            )
        except _SHARD_LOST as exc:
            raise ServerUnavailableError(
                f"sharded buffer {self.name!r}: its layout ({self.keys.shards}, "
                f"{self._node_of(self.name)}) cannot be read: {exc}") from None
        except BufferNotShardedError:
            raise ConfigMismatchError(
                f"buffer {self.name!r} exists unsharded; it cannot be opened with shards= "
                "(shards mismatch); nothing was written"
            ) from None
        if raw is None:
            raise ConfigMismatchError(
                f"sharded buffer {self.name!r} does not exist; give a capacity to create it"
            )
        stored = json.loads(raw)
        if int(stored.get("version", 0)) > LAYOUT_VERSION:
            raise ConfigMismatchError(
                f"sharded buffer {self.name!r} was written by a newer redisbuf (layout "
                f"{stored['version']}, this one reads {LAYOUT_VERSION})"
            )
        for what, asked, have in (
            ("shards", shards, stored["shards"]),
            ("capacity", capacity, stored["capacity"]),
            ("eviction policy", eviction if capacity is not None else None, stored["eviction"]),
        ):
            if asked is not None and asked != have:
                raise ConfigMismatchError(
                    f"sharded buffer {self.name!r} exists with {what} {have!r}, not {asked!r} "
                    f"({what} mismatch)"
                )
        return dict(stored)

    @classmethod
    def open(cls, redis_or_url: Any, name: str, **kwargs: Any) -> ShardedReplayBuffer:
        """Open an existing sharded buffer with its stored layout (ConfigMismatchError
        when there is none).

        Args:
            redis_or_url: a ``redis.Redis`` client or a URL.
            name: the buffer's name.
            **kwargs: further :class:`ShardedReplayBuffer` arguments (not ``capacity``,
                ``prioritized_capacity`` nor ``shards``: those are the stored ones).

        Returns:
            The buffer, with its stored shard count, capacity and eviction.

        Raises:
            ConfigMismatchError: no sharded buffer called ``name`` exists.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer, ShardedReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> _ = ShardedReplayBuffer(client, "demo", capacity=10, shards=2)
            >>> ShardedReplayBuffer.open(client, "demo").count
            2
        """
        client = guarded(as_client(redis_or_url))
        raw = client.hget(BufferKeys(name).shards, "layout")
        if raw is None:
            raise ConfigMismatchError(f"no sharded buffer named {name!r} exists in this Redis")
        stored = json.loads(raw)
        return cls(
            client,
            name,
            capacity=None,
            prioritized_capacity=stored["eviction"] == "reward",
            shards=int(stored["shards"]),
            **kwargs,
        )

    # -- failures -----------------------------------------------------------------------

    def _where(self, k: int) -> str:
        """Shard ``k``'s name, slot and (on a cluster, as last known) node."""
        meta = self.keys.meta.replace(f"{{{self.name}}}", f"{{{self.shard_names[k]}}}")
        where = f"{self.shard_names[k]!r}, {self._node_of(self.shard_names[k])}"
        return f"{where}; keys {meta.rsplit(':', 1)[0]}:*"

    def _node_of(self, tag: str) -> str:
        """The slot of hash tag ``tag`` and (on a cluster, as last known) its node."""
        where = f"slot {_slot(tag)}"
        if is_cluster(self.client):
            try:
                node = self.client.unwrapped.nodes_manager.get_node_from_slot(_slot(tag))
                where += f", node {node.name}"
            except redis.exceptions.RedisClusterException:
                where += ", no node serves it"
        return where

    @contextmanager
    def _on_shard(self, k: int) -> Iterator[None]:
        """Turn a lost server while working on shard ``k`` into a ShardUnavailableError
        naming the buffer and the shard."""
        try:
            yield
        except ShardUnavailableError:
            raise
        except _SHARD_LOST as exc:
            raise ShardUnavailableError(
                f"buffer {self.name!r}: shard {k} of {self.count} ({self._where(k)}) is "
                f"unavailable: {exc}",
                k,
            ) from None

    # -- writing ------------------------------------------------------------------------

    def _check_schema(self, batch: Any) -> None:
        """Fix the schema of every shard at the first add, and refuse a batch that does
        not fit it (each shard checks only its own items, so the check is global here)."""
        schema = kind_of(batch).schema(batch)
        schema_json = schema_to_json(schema)
        if self._schema_json is None:
            self.client.hsetnx(self.keys.shards, "schema", schema_json)
            raw = self.client.hget(self.keys.shards, "schema")
            self._schema_json = raw.decode() if raw is not None else None
        if self._schema_json is not None and schema_json != self._schema_json:
            stored = self._schema_json
            self._schema_json = None  # dropped and made again meanwhile? re-read next time
            raise SchemaError(
                f"batch does not fit sharded buffer {self.name!r}: its schema is "
                f"{schema_json}, the buffer's {stored}"
            )

    def add(
        self,
        batch: Any,
        priorities: Any = None,
        *,
        model_version: int | None = None,
        session_id: str | None = None,
    ) -> AddResult:
        """Insert the whole ``batch`` into one shard (the next in this process's turn),
        atomically there, as :meth:`ReplayBuffer.add` (``priorities``: the items' PER
        priorities, with PER); ids in the result are global. A lost shard raises
        :class:`ShardUnavailableError` (the next add goes to the next shard).

        Args:
            batch: as :meth:`ReplayBuffer.add`.
            priorities: as :meth:`ReplayBuffer.add`.
            model_version: as :meth:`ReplayBuffer.add`.
            session_id: as :meth:`ReplayBuffer.add`.

        Returns:
            As :meth:`ReplayBuffer.add`, with global ids.

        Raises:
            SchemaError: the batch does not fit the buffer's schema.
            ShardUnavailableError: the shard's server is lost.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ShardedReplayBuffer
            >>> buffer = ShardedReplayBuffer(fakeredis.FakeRedis(), "demo", shards=2)
            >>> batch = {"obs": np.arange(2.0), "log_rewards": np.zeros(2)}
            >>> shards = [set(buffer.add(batch).ids % 2) for _ in range(2)]  # id mod 2: shard
            >>> sorted(map(sorted, shards))  # each batch in one shard, the next in the other
            [[0], [1]]
        """
        self._check_schema(batch)
        k = self._next
        self._next = (k + 1) % self.count
        with self._on_shard(k):
            result = self.shards[k].add(
                batch, priorities, model_version=model_version, session_id=session_id
            )
        result.ids = result.ids * self.count + k
        if priorities is not None and len(result.ids):
            self._share_max(np.asarray(priorities, dtype=np.float64).reshape(-1))
        return result

    def _share_max(self, values: np.ndarray) -> None:
        """Raise every shard's running max priority (what new items get) to the highest
        of ``values`` just set, so the shards share one running max: a new item on any
        shard gets the highest priority set on any of them, as in an unsharded buffer.
        The shards' maxima are read every time: a clear or a load (by any process) resets
        them, so what this process shared before says nothing of them now."""
        finite = values[np.isfinite(values)]
        if not len(finite):
            return
        # the shards' own running maxima (an id skipped as evicted raised none)
        replies = self._per_shard(lambda pipe, shard: pipe.hget(shard.keys.meta, "per_max"))
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        maxima = [-math.inf if r is None else float(r) for r in replies]
        top = max(maxima)
        for k, shard in enumerate(self.shards):
            if maxima[k] < top:
                with self._on_shard(k):
                    shard._run("per_raise_max", shard.keys.all_keys(), [repr(top)])

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(sum(self._sizes()))

    def update_priority(self, ids: Any, priorities: Any, *, count: bool = True) -> int | None:
        """Set the PER priorities of items ``ids`` (global ids), each on its shard (see
        :meth:`ReplayBuffer.update_priority`: one append to the shard's mass log; atomic
        per shard, not across shards). Returns how many distinct ids were updated, as
        this process's replicas of the shards count them (None with ``count=False``
        where they are not kept, or where a shard could not tell).

        Args:
            ids: global item ids.
            priorities: one priority per id, finite and >= 0.
            count: as :meth:`ReplayBuffer.update_priority`.

        Returns:
            How many distinct ids were updated, or None (not counted).

        Raises:
            ConfigMismatchError: the buffer has no PER.
            ValueError: the lengths differ.
            InvalidBatchError: a priority is NaN, negative or not finite.
        """
        if self.per is None:
            raise ConfigMismatchError(
                f"buffer {self.name!r} has no PER priorities (open it with sampler=PERSampler())"
            )
        id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(values) != len(id_array):
            raise ValueError(f"{len(id_array)} ids but {len(values)} priorities")
        counts = []
        for k in sorted(set((id_array % self.count).tolist())):
            mine = id_array % self.count == k
            with self._on_shard(k):
                counts.append(self.shards[k].update_priority(
                    id_array[mine] // self.count, values[mine], count=count))
        if len(values):
            self._share_max(values)
        if not counts:
            return 0
        return None if any(c is None for c in counts) else int(sum(counts))

    def priorities(self, ids: Any) -> np.ndarray:
        """The current PER priority of each of the global ``ids`` (NaN for one not
        stored), each read on its shard (:meth:`ReplayBuffer.priorities`).

        Args:
            ids: global item ids.

        Returns:
            float64 priorities, in the order of ``ids``.

        Raises:
            ConfigMismatchError: the buffer has no PER.
        """
        id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
        out = np.full(len(id_array), np.nan)
        for k in sorted(set((id_array % self.count).tolist())):
            mine = id_array % self.count == k
            with self._on_shard(k):
                out[mine] = self.shards[k].priorities(id_array[mine] // self.count)
        return out

    def get(self, ids: Any) -> Any:
        """The items with these global ids, as one batch (KeyError names any id not
        present); only the shards holding them are addressed.

        Args:
            ids: global item ids.

        Returns:
            One batch of the buffer's kind, in the order of ``ids``.

        Raises:
            KeyError: an id is not in the buffer.
        """
        ids = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
        if not ids:
            raise ValueError("get() needs at least one id")
        blobs: list[Any] = [None] * len(ids)
        schema_json = None
        for k in sorted({i % self.count for i in ids}):
            positions = [p for p, i in enumerate(ids) if i % self.count == k]
            shard = self.shards[k]
            members = [b"%012d" % (ids[p] // self.count) for p in positions]
            with self._on_shard(k):
                pipe = shard.client.pipeline(transaction=False)
                # HMGETs of at most MAX_ITEMS_PER_COMMAND ids: none holds the server long
                for start, stop in bounds.chunks(len(members)):
                    pipe.hmget(shard.keys.items, members[start:stop])
                pipe.hget(shard.keys.meta, "schema")
                *parts, schema_json = pipe.execute()
            found = [blob for part in parts for blob in part]
            for p, blob in zip(positions, found, strict=True):
                blobs[p] = blob
            decoder = k
        missing = [i for i, blob in zip(ids, blobs, strict=True) if blob is None]
        if missing:
            raise KeyError(f"ids not in buffer {self.name!r}: {missing[:10]}")
        return self.shards[decoder].decode(blobs, ids, schema_json)

    def top(self, k: int = 10) -> list[tuple[int, float]]:
        """The ``k`` items of highest log-reward over all shards, as ``(global id,
        log_reward)``, highest first.

        Args:
            k: how many items.

        Returns:
            ``(global id, log_reward)`` pairs.
        """
        rows: list[tuple[int, float]] = []
        for index, shard in enumerate(self.shards):
            with self._on_shard(index):
                rows += [(i * self.count + index, s) for i, s in shard.top(k)]
        return sorted(rows, key=lambda row: -row[1])[: max(k, 0)]

    def stats(self) -> dict[str, Any]:
        """Totals over the shards (length, capacity, inserted, evicted, sampled,
        quarantined, memory) and each shard's own :meth:`ReplayBuffer.stats` under
        ``"shards"``.

        Returns:
            A dict: ``name``, ``shard_count``, ``kind``, ``eviction``, the totals, and
            ``shards``, the list of the shards' stats.
        """
        per_shard = []
        for k, shard in enumerate(self.shards):
            with self._on_shard(k):
                per_shard.append(shard.stats())
        memory = [s["memory_bytes"] for s in per_shard]
        return {
            "name": self.name,
            "shard_count": self.count,
            "capacity": sum(int(s["capacity"]) for s in per_shard),
            **{
                key: sum(int(s[key]) for s in per_shard)
                for key in ("length", "inserted", "evicted", "sampled", "quarantined")
            },
            "kind": next((s["kind"] for s in per_shard if s["kind"]), None),
            "eviction": per_shard[0]["eviction"],
            "memory_bytes": None if None in memory else sum(memory),
            "shards": per_shard,
        }

    # -- lifecycle ----------------------------------------------------------------------

    def clear(self) -> int:
        """Clear every shard (see :meth:`ReplayBuffer.clear`); the number removed.

        Returns:
            The number of items removed.
        """
        removed = 0
        for k, shard in enumerate(self.shards):
            with self._on_shard(k):
                removed += shard.clear()
        return removed

    def drop(self) -> None:
        """Delete every shard and the layout."""
        for k, shard in enumerate(self.shards):
            with self._on_shard(k):
                shard.drop()
        self.client.delete(self.keys.shards)
        self._schema_json = None

    def close(self) -> None:
        """Release the connections of a client this buffer made from a URL (and the
        threads that draw from the shards)."""
        if self._pool is not None and self._pool_pid == os.getpid():
            self._pool.shutdown(wait=False)
            self._pool = None
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> ShardedReplayBuffer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"ShardedReplayBuffer(name={self.name!r}, shards={self.count}, "
            f"capacity={self.capacity})"
        )


__all__ = ["ShardedReplayBuffer", "saved_shard_count", "shard_names"]
