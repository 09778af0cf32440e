"""One logical replay buffer over several shards, each a :class:`ReplayBuffer` of its own.

``ReplayBuffer(url, name, capacity, shards=N)`` (or :class:`ShardedReplayBuffer` itself)
keeps shard ``k`` as the buffer ``name.shardK`` (``name.shardK.J`` when a suffix ``J`` is
needed to land it on the intended slot), with its own hash tag: on a Redis Cluster the
shards sit on different masters, and each shard's scripts stay atomic on its one slot.

* Layout: the hash ``rb:{name}:shards`` (field ``layout``, JSON) records the shard count,
  the shard names, the global capacity and the eviction policy, written once by the
  first process (HSETNX) and read by every later one; field ``schema`` fixes the items'
  schema for every shard at the first ``add``. A name holds a layout or a plain buffer's
  meta, never both: lua/shard_layout.lua refuses a layout beside a meta and lua/init.lua
  a meta beside a layout, so ``ReplayBuffer(url, name)`` (shards=1) on a sharded name
  raises and writes nothing. On a cluster client, shard ``k`` is named
  so that its slot belongs to master ``k mod M`` (masters ordered by their first slot);
  otherwise so that its slot is in the ``k``-th of ``N`` equal slot ranges.
* Capacity: the global ``capacity`` is split across the shards (``capacity // N``, the
  first ``capacity % N`` shards one more); each shard evicts on its own (FIFO or lowest
  log-reward), so the items kept are the newest (or best) of each shard.
* ``add``: a whole batch goes to one shard, the shards taken in turn from a random start
  (per process). Ids are global: item ``i`` of shard ``k`` is ``i * N + k``.
* ``len`` / ``stats`` / ``top`` aggregate over the shards.
* Sampling reproduces the unsharded distribution: uniform draws first choose how many
  items each shard gives (multinomial over the shards' sizes with replacement,
  multivariate hypergeometric without), then draw within the shards, then shuffle;
  prioritized draws with replacement choose the counts by multinomial over the shards'
  total softmax masses. Prioritized draws without replacement draw a successive
  (without-replacement) sequence of ``min(n, drawable items)`` from every shard, then
  replay the global successive draw over them: each step picks a shard with probability
  its remaining mass over the total remaining mass and takes that shard's next item,
  which is exactly torch.multinomial's distribution, at the cost of reading up to ``N``
  times ``n`` items. The shards are asked at once, one thread each.
* A shard whose server is lost raises :class:`~redisbuf.errors.ShardUnavailableError`
  naming the buffer, the shard and its node; the other shards keep working for
  operations that address only them (``add`` to them, ``get`` of their ids, their own
  ``shards[k]`` buffer). Sampling, ``len`` and ``stats`` address every shard.
* ``save`` / ``state_dict`` write the unsharded save format (version 2, ``per`` None)
  with global capacity and summed counters, plus the header's ``shards`` (count, each
  shard's capacity and counters); the records go shard by shard, oldest first within a
  shard, with global ids. Such a file loads into a plain :class:`ReplayBuffer` as well,
  and a plain buffer's file into a sharded one. ``load`` / ``load_state_dict`` check the
  whole file first (every shard's part as the unsharded load checks a file); then a
  sharded file of the same shard count gives every shard its own items and counters,
  any other file gives record ``j`` to shard ``j mod N`` and splits the counters as the
  capacity is split. Each shard is then restored by the unsharded machinery (staging
  keys, one swap script): atomic per shard, not across shards; a failure after some
  shards were restored raises :class:`~redisbuf.errors.PartialLoadError` naming them.
* PER (``sampler=PERSampler(...)``, the same settings on every shard): draws with
  replacement choose the counts per shard by multinomial over the shards' total PER
  masses, so item ``i`` is drawn with probability ``mass_i / sum of all masses``;
  ``weights`` and ``importance_weights`` are over the whole buffer. ``update_priority``
  routes each global id to its shard (atomic per shard). Prioritized draws read every
  shard's masses from this process's replicas (:mod:`redisbuf.sampling.replica`), caught up in one
  pipeline when the sample begins.
* ``sample(..., block=True)`` waits (polling) until the shards hold ``min_size`` items.
* Not supported: other custom samplers, ``max_use``, ``max_staleness``, rate limiters,
  remote managers, ``sample_range``.
"""

from __future__ import annotations

import json
import math
import os
import time
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
    DecodeError,
    EmptyBufferError,
    SamplingError,
    SchemaError,
    ServerUnavailableError,
    ShardUnavailableError,
    WaitTimeoutError,
)
from ..sampling import samplers
from ..sampling.replica import MassReplica, replica_of
from ..sampling.samplers import Draw, PERSampler
from ..store import bounds, scripts
from ..store.connection import LOST, as_client, guarded, is_cluster
from ..store.containers import kind_of, schema_to_json
from ..store.keys import BufferKeys
from . import quarantine
from .checkpoint import ShardedCheckpointing, saved_shard_count
from .replay import AddResult, ReplayBuffer, SampleInfo

SLOTS = 16384
LAYOUT_VERSION = 1
# Options handed to every shard unchanged; anything else a ReplayBuffer takes is refused.
_SHARD_OPTIONS = (
    "kind", "max_item_bytes", "strict", "durability", "durability_timeout", "retry_window"
)
# Errors that mean a shard's server is gone or its slot has no master right now (CLUSTERDOWN
# while a restarted master rejoins, MASTERDOWN, TRYAGAIN while its slot migrates). A
# pipeline reply may be one of these instead of raising it: see _per_shard.
_SHARD_LOST = (
    ServerUnavailableError,
    *LOST,
    redis.exceptions.ClusterDownError,  # MasterDownError is one
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.MaxConnectionsError,
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


class ShardedReplayBuffer(ShardedCheckpointing):
    """A replay buffer of global ``capacity`` stored as ``shards`` buffers (see the
    module docstring for layout, sampling and failure semantics).

    Args: as :class:`ReplayBuffer` (``redis_or_url``, ``name``, ``capacity``,
    ``prioritized_capacity``, ``prioritized_sampling``, ``seed``, and ``kind``,
    ``max_item_bytes``, ``strict``, ``durability``, ``durability_timeout``, which every
    shard gets), plus ``shards``: the number of shards (>= 1, at most ``capacity``).
    Opening an existing sharded buffer with another shard count, capacity or eviction
    policy raises :class:`ConfigMismatchError`; ``capacity=None`` adopts the stored one.
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
        **options: Any,
    ) -> None:
        if isinstance(shards, bool) or not isinstance(shards, int) or shards < 1:
            raise ValueError(f"shards must be a positive integer, got {shards!r}")
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
        when there is none)."""
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
        where = f"{self.shard_names[k]!r}, slot {_slot(self.shard_names[k])}"
        if is_cluster(self.client):
            try:
                node = self.client.unwrapped.nodes_manager.get_node_from_slot(
                    _slot(self.shard_names[k])
                )
                where += f", node {node.name}"
            except redis.exceptions.RedisClusterException:
                where += ", no node serves it"
        return f"{where}; keys {meta.rsplit(':', 1)[0]}:*"

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
        _columns, _log_rewards, schema = kind_of(batch).split(batch)
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
        :class:`ShardUnavailableError` (the next add goes to the next shard)."""
        self._check_schema(batch)
        k = self._next
        self._next = (k + 1) % self.count
        with self._on_shard(k):
            result = self.shards[k].add(
                batch, priorities, model_version=model_version, session_id=session_id
            )
        result.ids = result.ids * self.count + k
        return result

    # -- reading ------------------------------------------------------------------------

    def __len__(self) -> int:
        return int(sum(self._sizes()))

    def _per_shard(self, command: Any) -> list[Any]:
        """``command(pipe, shard)`` (one command) for every shard in one pipeline (a cluster client
        sends each master its part at once) and the replies in shard order. When a
        server is lost, the shards are asked one by one, so that the error names the
        shard that failed; a reply that is such an error (a cluster pipeline returns
        CLUSTERDOWN and the like as replies) raises it as its shard's
        ShardUnavailableError too."""
        pipe = self.client.pipeline(transaction=False)
        for shard in self.shards:
            command(pipe, shard)
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except _SHARD_LOST:
            replies = []
            for k, shard in enumerate(self.shards):
                with self._on_shard(k):
                    alone = self.client.pipeline(transaction=False)
                    command(alone, shard)
                    replies += alone.execute(raise_on_error=False)
        for k, reply in enumerate(replies):
            if isinstance(reply, _SHARD_LOST):
                with self._on_shard(k):
                    raise reply
        return replies

    def _sizes(self) -> np.ndarray:
        replies = self._per_shard(lambda pipe, shard: pipe.zcard(shard.keys.order))
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return np.array([int(r) for r in replies], dtype=np.int64)

    def _replicas(self, rule: str) -> list[MassReplica]:
        """Every shard's replica for ``rule``, caught up now (one pipeline over the
        shards): the shards' masses as of this call, and draws from them that follow
        every change made before it."""
        script = scripts.load("masslog_read")
        replicas = [getattr(shard, "_replicas", {}).get(rule) for shard in self.shards]

        def command(pipe: Any, shard: ReplayBuffer) -> None:
            replica = replicas[self.shards.index(shard)]
            keys = shard.keys.all_keys()
            args = ([replica.epoch, replica.version, replica.stamp] if replica is not None
                    else ["", 0, ""])
            scripts.queue(pipe, self.client, script, keys, args)

        replies = self._per_shard(command)
        if any(scripts.missing(r) for r in replies):
            scripts.reload(self.client, script)  # every master (cluster: primaries)
            replies = self._per_shard(command)
        out = []
        for k, (shard, reply) in enumerate(zip(self.shards, replies, strict=True)):
            if isinstance(reply, redis.exceptions.ResponseError):
                raise scripts.translate(reply)
            if isinstance(reply, Exception):
                raise reply
            with self._on_shard(k):
                if int(reply[0]) == 2:  # not on in this shard (made again): turn it on
                    shard.sampler.prepare(shard)
                    replicas[k] = None
                if replicas[k] is None:
                    replica = replica_of(shard, rule)  # reads the shard
                else:
                    replica = replicas[k]
                    with replica.lock:
                        replica.catch_up(shard, reply)
            out.append(replica)
        return out

    def _masses(self, rule: str = "softmax") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sizes, drawable counts, log masses) of the shards, for prioritized draws, from
        their replicas (caught up now)."""
        replicas = self._replicas(rule)
        sizes = np.array([len(r) for r in replicas], dtype=np.int64)
        drawable = np.array([r.positive for r in replicas], dtype=np.int64)
        log_mass = np.full(self.count, -math.inf)
        for k, replica in enumerate(replicas):
            if replica.infinite > 0:
                raise SamplingError(
                    f"buffer {self.name!r}: shard {k} holds {replica.infinite} item(s) of "
                    "log-reward +inf: the softmax of log-rewards is undefined; sample "
                    "uniformly or remove them"
                )
            if replica.total > 0:
                log_mass[k] = math.log(replica.total) + replica.ref
        return sizes, drawable, log_mass

    def _shard_draw(self, k: int, n: int, replacement: bool) -> Draw:
        with self._on_shard(k):
            return self.shards[k]._draw(n, replacement)

    def _draw(self, n: int, replacement: bool | None) -> tuple[list[int], list[bytes], Any, Any]:
        """(global ids, blobs, probabilities or None, (shard, schema_json) to decode by)."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n <= 0:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        n = int(n)
        if self.per is not None:
            return self._draw_per(n)
        if self.prioritized_sampling:
            return self._draw_prioritized(n, bool(replacement))
        sizes = self._sizes()
        total = int(sizes.sum())
        if total == 0:
            raise EmptyBufferError(f"buffer {self.name!r}: buffer is empty")
        replace = bool(replacement) or n > total
        if replace:
            counts = self.rng.multinomial(n, sizes / total)
        else:
            counts = self.rng.multivariate_hypergeometric(sizes, n)
        ids, blobs, source = self._gather(counts, replace)
        order = self.rng.permutation(len(ids))  # a shard's draws are not a block
        return [ids[i] for i in order], [blobs[i] for i in order], None, source

    def _draws(self, wanted: dict[int, tuple[int, bool]]) -> dict[int, Draw]:
        """Shard ``k``'s draw of ``wanted[k] = (n, replacement)`` for each ``k``, the
        shards asked at once (one thread each: their round trips overlap)."""
        if len(wanted) == 1 or not self.parallel:
            return {k: self._shard_draw(k, n, r) for k, (n, r) in wanted.items()}
        if self._pool is None or self._pool_pid != os.getpid():  # none survives a fork
            self._pool = ThreadPoolExecutor(self.count, thread_name_prefix="redisbuf-shard")
            self._pool_pid = os.getpid()
        futures = {k: self._pool.submit(self._shard_draw, k, n, r) for k, (n, r) in wanted.items()}
        return {k: future.result() for k, future in futures.items()}

    def _gather(self, counts: np.ndarray, replace: bool) -> tuple[list[int], list[bytes], Any]:
        ids: list[int] = []
        blobs: list[bytes] = []
        source = None
        draws = self._draws({k: (c, replace) for k, c in enumerate(counts.tolist()) if c})
        for k, draw in draws.items():
            ids += [i * self.count + k for i in draw.ids]
            blobs += list(draw.blobs)
            source = source or (k, draw.schema_json)
        return ids, blobs, source

    def _draw_prioritized(
        self, n: int, replacement: bool
    ) -> tuple[list[int], list[bytes], Any, Any]:
        sizes, drawable, log_mass = self._masses()
        if int(sizes.sum()) == 0 or not np.isfinite(log_mass).any():
            raise EmptyBufferError(
                f"buffer {self.name!r}: buffer is empty (no item with a finite log-reward)"
            )
        top = log_mass.max()
        mass = np.exp(log_mass - top)  # relative shard masses, the largest 1
        share = mass / mass.sum()
        if replacement or n > int(sizes.sum()):
            counts = self.rng.multinomial(n, share)
            ids, blobs, source = [], [], None
            probabilities: list[float] = []
            draws = self._draws({k: (c, True) for k, c in enumerate(counts.tolist()) if c})
            for k, draw in draws.items():
                ids += [i * self.count + k for i in draw.ids]
                blobs += list(draw.blobs)
                probabilities += (np.asarray(draw.probabilities) * share[k]).tolist()
                source = source or (k, draw.schema_json)
            order = self.rng.permutation(len(ids))
            return (
                [ids[i] for i in order],
                [blobs[i] for i in order],
                np.array(probabilities)[order],
                source,
            )
        if n > int(drawable.sum()):
            raise SamplingError(
                f"buffer {self.name!r}: {n} draws without replacement but only "
                f"{int(drawable.sum())} items have nonzero probability"
            )
        # every shard's own successive draw, then the global successive draw over them
        sequences = self._draws(
            {
                k: (min(n, int(drawable[k])), False)
                for k in range(self.count)
                if mass[k] > 0 and drawable[k] > 0
            }
        )
        remaining = mass.copy()
        taken = dict.fromkeys(sequences, 0)
        ids, blobs, out = [], [], []
        for _ in range(n):
            live = remaining.clip(min=0)
            k = int(self.rng.choice(self.count, p=live / live.sum()))
            draw, j = sequences[k], taken[k]
            item_mass = float(draw.probabilities[j]) * remaining[k]  # type: ignore[index]
            out.append(item_mass / live.sum())
            remaining[k] = remaining[k] - item_mass if j + 1 < len(draw.ids) else 0.0
            taken[k] = j + 1
            ids.append(draw.ids[j] * self.count + k)
            blobs.append(draw.blobs[j])
        first = next(iter(sequences))
        return ids, blobs, np.array(out), (first, sequences[first].schema_json)

    def _draw_per(self, n: int) -> tuple[list[int], list[bytes], Any, Any]:
        """PER with replacement over all shards: item ``i`` with probability ``mass_i /
        sum of every shard's masses``; the counts per shard by multinomial over the
        shards' total masses, then each shard's draw, committed by that shard."""
        replicas = self._replicas("per")
        totals = np.array([r.total if r.positive else 0.0 for r in replicas])
        grand = float(totals.sum())
        if grand <= 0:
            raise EmptyBufferError(f"buffer {self.name!r}: buffer is empty (no item with a "
                                   "non-zero PER mass)")
        counts = self.rng.multinomial(n, totals / grand)

        def one(k: int, count: int) -> Any:
            with self._on_shard(k):
                return samplers._replica_draw(self.shards[k], "per", count, self.shards[k].rng,
                                              True)

        drawn = self._all_or_none(
            {k: (one, (k, c)) for k, c in enumerate(counts.tolist()) if c})
        ids: list[int] = []
        blobs: list[bytes] = []
        masses: list[np.ndarray] = []
        scores: list[np.ndarray] = []
        for k, draw in drawn.items():
            ids += [i * self.count + k for i in draw.ids]
            blobs += list(draw.blobs)
            masses.append(draw.masses)
            scores.append(draw.scores)
        first = next(iter(drawn))
        mass = np.concatenate(masses)
        priority = np.concatenate(scores)
        min_mass = min(r.min_mass for r in replicas)
        nonzero = sum(d.per_nonzero for d in drawn.values())
        mean = sum(d.per_sum for d in drawn.values()) / nonzero if nonzero else 0.0
        self._last_weights = (
            (min_mass / mass) ** self.per.beta,
            priority / mean if mean > 0 else np.ones(n),
        )
        order = self.rng.permutation(len(ids))
        self._last_weights = tuple(w[order] for w in self._last_weights)
        return (
            [ids[i] for i in order],
            [blobs[i] for i in order],
            (mass / grand)[order],
            (first, drawn[first].schema_json),
        )

    def _all_or_none(self, calls: dict[int, tuple[Any, tuple[Any, ...]]]) -> dict[int, Any]:
        """Each shard's draw (see :meth:`_in_parallel`); when one fails, the draws the
        others committed are taken back (lua/undo_draws.lua: their counts and use counts)
        before the error is raised, so a failed sample records nothing anywhere."""
        done: dict[int, Any] = {}
        failures: list[BaseException] = []

        def attempt(k: int, fn: Any, args: tuple[Any, ...]) -> Any:
            try:
                done[k] = fn(*args)
            except BaseException as exc:  # kept, raised once the others are undone
                failures.append(exc)
            return None

        self._in_parallel({k: (attempt, (k, fn, args)) for k, (fn, args) in calls.items()})
        if failures:
            for k, draw in done.items():
                members = [b"%012d" % i for i in draw.ids]
                with self._on_shard(k):
                    self.shards[k]._run("undo_draws", self.shards[k].keys.all_keys(), members)
            raise failures[0]
        return done

    def _in_parallel(self, calls: dict[int, tuple[Any, tuple[Any, ...]]]) -> dict[int, Any]:
        """``fn(*args)`` for each shard ``k`` of ``calls[k] = (fn, args)``, one thread each."""
        if len(calls) == 1 or not self.parallel:
            return {k: fn(*args) for k, (fn, args) in calls.items()}
        if self._pool is None or self._pool_pid != os.getpid():  # none survives a fork
            self._pool = ThreadPoolExecutor(self.count, thread_name_prefix="redisbuf-shard")
            self._pool_pid = os.getpid()
        futures = {k: self._pool.submit(fn, *args) for k, (fn, args) in calls.items()}
        return {k: future.result() for k, future in futures.items()}

    def update_priority(self, ids: Any, priorities: Any) -> int:
        """Set the PER priorities of items ``ids`` (global ids), each on its shard (see
        :meth:`ReplayBuffer.update_priority`; atomic per shard, not across shards).
        Returns how many distinct ids were updated."""
        if self.per is None:
            raise ConfigMismatchError(
                f"buffer {self.name!r} has no PER priorities (open it with sampler=PERSampler())"
            )
        id_array = np.asarray(ids, dtype=np.int64).reshape(-1)
        values = np.asarray(priorities, dtype=np.float64).reshape(-1)
        if len(values) != len(id_array):
            raise ValueError(f"{len(id_array)} ids but {len(values)} priorities")
        updated = 0
        for k in sorted(set((id_array % self.count).tolist())):
            mine = id_array % self.count == k
            with self._on_shard(k):
                updated += self.shards[k].update_priority(id_array[mine] // self.count,
                                                          values[mine])
        return updated

    def sample(
        self,
        n: int,
        replacement: bool | None = None,
        *,
        block: bool = False,
        timeout: float | None = 30.0,
        min_size: int | None = None,
    ) -> Any:
        """Draw ``n`` items over all shards with the distribution of an unsharded
        :meth:`ReplayBuffer.sample` (uniform, softmax of log-rewards with
        ``prioritized_sampling``, or PER with ``sampler=PERSampler(...)``; without
        replacement unless ``replacement=True`` or ``n`` exceeds the length, PER always
        with); one batch of the buffer's kind. ``block``, ``timeout`` and ``min_size``
        as :meth:`ReplayBuffer.sample`. A drawn record that does not decode is set aside in its
        shard's quarantine hash and the draw made again, as there."""
        return self.sample_with_info(
            n, replacement, block=block, timeout=timeout, min_size=min_size
        ).batch

    def sample_with_info(
        self,
        n: int,
        replacement: bool | None = None,
        *,
        block: bool = False,
        timeout: float | None = 30.0,
        min_size: int | None = None,
    ) -> SampleInfo:
        """Like :meth:`sample`, also returning the global ids and, for prioritized
        sampling, each draw's probability (given the earlier draws, without
        replacement); with PER also ``weights`` and ``importance_weights`` over the
        whole buffer (the lowest mass and the mean non-zero priority of every shard)."""
        if block:
            drawn = self._wait_and_draw(n, replacement, timeout, min_size)
        else:
            drawn = self._draw(n, replacement)
        (ids, _, probabilities, _), batch = self._decoded(drawn, n, replacement)
        if self.per is not None:
            weights, importance = self._last_weights
            return SampleInfo(batch, np.array(ids, dtype=np.int64), probabilities, weights,
                              importance)
        return SampleInfo(batch, np.array(ids, dtype=np.int64), probabilities)

    def _decoded(self, drawn: Any, n: int, replacement: bool | None) -> tuple[Any, Any]:
        """A draw of :meth:`_draw` and its batch. Records that do not decode are set aside
        in their shard's quarantine hash and the draw is taken back and made again, as
        :meth:`ReplayBuffer.sample` does (redisbuf/buffers/quarantine.py)."""
        for _ in range(quarantine.ROUNDS):
            ids, blobs, _, (k, schema_json) = drawn
            try:
                return drawn, self.shards[k].decode(blobs, ids, schema_json)
            except DecodeError as exc:
                failure = exc
            bad = quarantine.undecodable(self.shards[k], blobs)
            if not bad:
                raise failure
            local: dict[int, list[int]] = {}
            for item in ids:
                local.setdefault(item % self.count, []).append(item // self.count)
            for shard, items in local.items():
                with self._on_shard(shard):
                    quarantine.take_back(self.shards[shard], items)
            for position, error in bad:
                shard = ids[position] % self.count
                with self._on_shard(shard):
                    quarantine.set_aside(self.shards[shard], [
                        (ids[position] // self.count, blobs[position], error)])
            drawn = self._draw(n, replacement)
        ids, blobs, _, (k, schema_json) = drawn
        return drawn, self.shards[k].decode(blobs, ids, schema_json)

    def _wait_and_draw(
        self, n: int, replacement: bool | None, timeout: float | None, min_size: int | None
    ) -> tuple[list[int], list[bytes], Any, Any]:
        """Wait until the shards hold ``min_size`` (default ``n``) items and a draw
        succeeds, polling (5 ms doubling to 100 ms); WaitTimeoutError after ``timeout``."""
        need = n if min_size is None else int(min_size)
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            if len(self) >= need:
                try:
                    return self._draw(n, replacement)
                except EmptyBufferError:
                    pass
            if deadline is not None and time.monotonic() >= deadline:
                raise WaitTimeoutError(
                    f"buffer {self.name!r}: sample({n}) waited {timeout} s for {need} "
                    f"drawable items; it holds {len(self)}"
                )
            wait = pause if deadline is None else min(pause, max(deadline - time.monotonic(), 0))
            time.sleep(wait)
            pause = min(2 * pause, 0.1)

    def get(self, ids: Any) -> Any:
        """The items with these global ids, as one batch (KeyError names any id not
        present); only the shards holding them are addressed."""
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
        log_reward)``, highest first."""
        rows: list[tuple[int, float]] = []
        for index, shard in enumerate(self.shards):
            with self._on_shard(index):
                rows += [(i * self.count + index, s) for i, s in shard.top(k)]
        return sorted(rows, key=lambda row: -row[1])[: max(k, 0)]

    def stats(self) -> dict[str, Any]:
        """Totals over the shards (length, capacity, inserted, evicted, sampled,
        quarantined, memory) and each shard's own :meth:`ReplayBuffer.stats` under
        ``"shards"``."""
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
        """Clear every shard (see :meth:`ReplayBuffer.clear`); the number removed."""
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
