"""StepStore: steps stored once, which items of any number of buffers reference (Reverb's
chunks, and its items in several tables with their data stored once).

A writer (:class:`~redisbuf.buffers.step_writer.StepWriter`) appends steps, column by
column, and makes items: each a nest of columns, each column some cells (steps) of one
column. Cells travel once, in *chunks* (``rb:{name}:steps:chunks``); an item is a small
record in an ordinary buffer (a :class:`~redisbuf.buffers.replay.ReplayBuffer` made by
:meth:`StepStore.table`, its schema kind ``steps``) naming the chunks and rows it reads,
so the buffer's sampler, remover, rate limiter, ``max_use`` and priorities apply to it
as to any item, and two items, in one buffer or in several, that take the same steps
share their storage. One insert (``lua/steps_insert.lua``) writes a writer's new chunks
and its items into every buffer they go to in one MULTI/EXEC.

A chunk is freed once no item references it: each insert records, on every chunk an
item reads, that item (``rb:{name}:steps:refs``), and the sweep
(``lua/steps_sweep.lua``, which writers run after each insert, over four times as many
chunks as they wrote) frees a chunk a grace period (:data:`GRACE_SECONDS`) after it
finds none of its items left in their buffers, whatever removed them (eviction,
``max_use``, ``remove``, ``clear``, ``drop``). A sampler reads an item's chunks right
after drawing it, so the grace period keeps them for a draw made just before the item
left.

The store and its buffers must live on one server (not a Redis Cluster): an insert's
script takes keys of several buffers.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from ..errors import ConfigMismatchError, ServerConfigError
from ..store import scripts
from ..store.connection import as_client, guarded, is_cluster, retrying
from ..store.keys import BufferKeys, StepKeys, decode_meta
from .replay import ReplayBuffer
from .step_records import Chunk, ItemRecord, decode_chunk, decode_item

#: How long a chunk found unreferenced is kept before it is freed (seconds).
GRACE_SECONDS = 10.0
#: How many chunks a sweep examines per chunk an insert wrote (and at least).
SWEEP_PER_CHUNK, SWEEP_MIN = 4, 4
#: What a StepStore object keeps decoded by default: chunks (bytes of their blobs), item
#: records (how many).
DEFAULT_CACHE_BYTES, DEFAULT_CACHE_RECORDS = 256 * 2**20, 100_000


def steps_schema(store: str) -> dict[str, Any]:
    """The schema of a buffer whose items reference the steps of store ``store``."""
    return {"kind": "steps", "fields": {}, "store": store}


def schema_text(store: str) -> str:
    """:func:`steps_schema` as the canonical JSON every writer sends."""
    return json.dumps(steps_schema(store), sort_keys=True, separators=(",", ":"))


@dataclass
class TableBatch:
    """What one insert stores in one buffer: item records, their PER priorities, the
    chunk keys each reads, and the insert's per-batch options (the remover's uniforms)."""

    buffer: ReplayBuffer
    records: list[bytes]
    priorities: list[float]
    refs: list[list[str]]
    options: dict[str, Any]
    #: per record: whether it is its episode's first in this buffer (meta episodes:NAME)
    first_of_episode: list[bool] = field(default_factory=list)


@dataclass
class InsertResult:
    """The ids the insert gave each buffer's items, how many each evicted, how many
    items it stored, and (with ``order``) the buffer whose rate limiter held the next
    one back (None: all were stored)."""

    ids: dict[str, list[int]]
    evicted: dict[str, int]
    stored: int = 0
    held: str | None = None


class StepStore:
    """Steps stored once, referenced by items of several buffers (see the module).

    Args:
        redis_or_url: a ``redis.Redis`` client (``decode_responses=False``) or a URL;
            ``None`` reads ``$REDISBUF_URL`` (else the embedded server).
        name: the store's name (its keys are ``rb:{name}:steps:*``).

    Raises:
        ServerConfigError: the client is a Redis Cluster's.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf.buffers.steps import StepStore
        >>> store = StepStore(fakeredis.FakeRedis(), "demo")
        >>> table = store.table("recent", capacity=100)
        >>> with store.writer(num_keep_alive_refs=4) as writer:
        ...     for t in range(3):
        ...         refs = writer.append([np.float32(t)])
        ...     writer.create_item([table.name], 1.0, [(0, [1, 2], False)])
        >>> [s.columns[0].tolist() for s in store.sample(table, 1)]
        [[1.0, 2.0]]
    """

    def __init__(self, redis_or_url: Any = None, name: str = "steps") -> None:
        client = as_client(redis_or_url)
        if is_cluster(client):
            raise ServerConfigError(
                f"step store {name!r}: its inserts write several buffers in one script, so "
                "the store and its buffers need one server, not a Redis Cluster"
            )
        self.client = guarded(client)
        self.name = name
        self.keys = StepKeys(name)
        self._tables: dict[str, ReplayBuffer] = {}
        self._registry: list[str] | None = None
        #: how many bytes of decoded chunks (their blobs' size) and how many decoded item
        #: records this object keeps for later reads
        self.cache_bytes, self.cache_records = DEFAULT_CACHE_BYTES, DEFAULT_CACHE_RECORDS
        self._chunk_cache: OrderedDict[str, Chunk] = OrderedDict()
        self._chunk_sizes: dict[str, int] = {}
        self._cached_bytes = 0
        self._record_cache: OrderedDict[bytes, ItemRecord] = OrderedDict()
        self._cache_lock = threading.Lock()  # datasets read from several threads

    # -- buffers ------------------------------------------------------------------------

    def table(self, name: str, **kwargs: Any) -> ReplayBuffer:
        """The buffer ``name`` whose items reference this store's steps: created with
        ``kwargs`` (:class:`ReplayBuffer`'s: ``capacity``, ``sampler``, ``remover``,
        ``rate_limiter``, ``max_use``...) when it does not exist, else opened and checked
        against them; without ``capacity`` it must exist. Cached per store object.

        Raises:
            ConfigMismatchError: the buffer holds other items, or another configuration.
        """
        if not kwargs and name in self._tables:
            return self._tables[name]
        if "capacity" in kwargs:
            buffer = ReplayBuffer(self.client, name, **kwargs)
        else:
            buffer = ReplayBuffer.open(self.client, name, **kwargs)
        stored = buffer.stored_schema()
        if stored is not None and stored != steps_schema(self.name):
            raise ConfigMismatchError(
                f"buffer {name!r} holds other items ({stored.get('kind')}), not references "
                f"to the steps of store {self.name!r}"
            )
        self._tables[name] = buffer
        return buffer

    def describe(self, table: str, description: dict[str, Any]) -> None:
        """Keep a JSON description of ``table`` (what a facade needs, e.g. a signature),
        read back by :meth:`descriptions`."""
        self.client.hset(self.keys.tables, table, json.dumps(description, sort_keys=True))

    def descriptions(self) -> dict[str, dict[str, Any]]:
        """Every table's description (:meth:`describe`), by name."""
        raw = self.client.hgetall(self.keys.tables)
        return {k.decode(): json.loads(v) for k, v in raw.items()}

    def forget(self, table: str) -> None:
        """Drop ``table``'s description (its buffer is left as it is)."""
        self.client.hdel(self.keys.tables, table)
        self._tables.pop(table, None)

    # -- writing ------------------------------------------------------------------------

    def writer(self, num_keep_alive_refs: int, **kwargs: Any) -> Any:
        """A :class:`~redisbuf.buffers.step_writer.StepWriter` appending to this store."""
        from .step_writer import StepWriter

        return StepWriter(self, num_keep_alive_refs, **kwargs)

    def insert(self, chunks: dict[str, bytes], batches: list[TableBatch],
               order: list[int] | None = None) -> InsertResult:
        """Write ``chunks`` (new chunk key -> blob) and each batch's items into its buffer
        in one MULTI/EXEC (``lua/steps_insert.lua``), exactly once (a retry after a lost
        reply gets the first reply back), and sweep in the same round trip. Without
        ``order`` every item is stored (the caller admitted them); with it (the index in
        ``batches`` of each item's batch, in the writer's order) the buffers' rate
        limiters admit the items one at a time in that order, and those up to the first
        one held back are stored (the chunks with them; nothing when none is).

        Raises:
            StepsGoneError: an item references a chunk the store no longer holds and
                ``chunks`` does not carry (nothing was written).
            NoSuchBufferError, SchemaError, InvalidBatchError: as an add (nothing was
                written).
        """
        schema = schema_text(self.name)
        keys = list(self.keys.all_keys())
        args: list[Any] = [len(batches), len(chunks), *chunks]
        if order is None:
            args.extend(["", ""])
        else:
            args.extend(["admit", " ".join(str(t + 1) for t in order)])
        for batch in batches:
            keys.extend(batch.buffer.keys.all_keys())
            n = len(batch.records)
            flags = batch.first_of_episode or [False] * n
            args.extend([batch.buffer.name, schema, n,
                         json.dumps(batch.options) if batch.options else "",
                         "".join("1" if flag else "0" for flag in flags)])
            args.extend(repr(float(p)) for p in batch.priorities)
            args.extend(batch.records)
            args.extend(" ".join(refs) for refs in batch.refs)
        reply = self._transaction(chunks, keys, args,
                                  SWEEP_PER_CHUNK * len(chunks) + SWEEP_MIN)
        stored, held = int(reply[0]), int(reply[1])
        reply = [*reply, *[0] * (2 + 3 * len(batches) - len(reply))]  # nothing stored: short
        ids: dict[str, list[int]] = {}
        evicted: dict[str, int] = {}
        for t, batch in enumerate(batches):
            first, count, gone = (int(v) for v in reply[2 + 3 * t : 5 + 3 * t])
            ids[batch.buffer.name] = list(range(first, first + count))
            evicted[batch.buffer.name] = gone
        return InsertResult(ids, evicted, stored,
                            batches[held - 1].buffer.name if held else None)

    def _transaction(self, chunks: dict[str, bytes], keys: list[str], args: list[Any],
                     sweep: int) -> Any:
        """The insert's MULTI/EXEC, then a sweep of ``sweep`` chunks, one round trip."""
        script = scripts.load("steps_insert").remembering
        sweeper = scripts.load("steps_sweep")
        names = self._registered()
        sweep_keys = [*self.keys.all_keys(),
                      *(BufferKeys(name).items if name else self.keys.meta for name in names)]
        sweep_args = [len(names), sweep, int(GRACE_SECONDS * 1000)]
        memory = [self.keys.batches, self.keys.batches_old]
        batch_id = os.urandom(12).hex()
        full_keys, full_args = [*keys, *memory], [*args, batch_id, 600_000]
        fields: list[Any] = []
        for key, blob in chunks.items():
            fields.extend((key, blob))
        sent = [False]

        def attempt() -> Any:
            if sent[0]:  # a lost reply: did it run?
                done = scripts.read_remembered(self.client, memory, batch_id, "steps_insert")
                if done is not None:
                    return done
            for load in (False, True):
                if load:
                    scripts.reload(self.client, script)
                pipe = self.client.pipeline(transaction=False)
                pipe.execute_command("MULTI")
                if fields:
                    pipe.execute_command("HSET", self.keys.chunks, *fields)
                scripts.queue(pipe, self.client, script, full_keys, full_args)
                pipe.execute_command("EXEC")
                scripts.queue(pipe, self.client, sweeper, sweep_keys, sweep_args)
                sent[0] = True
                replies = pipe.execute(raise_on_error=False)
                executed, swept = replies[-2], replies[-1]
                if isinstance(executed, Exception):
                    refused = [r for r in replies[:-2] if isinstance(r, Exception)]
                    raise (refused or [executed])[0]
                if isinstance(swept, list) and int(swept[0]) < 0:
                    self._registry = None  # the registry grew: read it at the next sweep
                elif scripts.missing(swept):
                    scripts.reload(self.client, sweeper)
                reply = executed[-1]
                if scripts.missing(reply) and not load:
                    if fields:  # the HSET ran without the script: take the blobs back
                        self._drop_unregistered(list(chunks))
                    continue
                if isinstance(reply, redis.exceptions.ResponseError):
                    raise scripts.translate(reply)
                return reply
            raise AssertionError("unreachable")

        return retrying(attempt, name=self.client)

    def _drop_unregistered(self, chunk_keys: list[str]) -> None:
        pipe = self.client.pipeline(transaction=False)
        for key in chunk_keys:
            pipe.zscore(self.keys.order, key)
        scores = pipe.execute()
        stray = [k for k, score in zip(chunk_keys, scores, strict=True) if score is None]
        if stray:
            self.client.hdel(self.keys.chunks, *stray)

    # -- freeing ------------------------------------------------------------------------

    def _registered(self, refresh: bool = False) -> list[str]:
        """The buffers of the registry, by index."""
        if self._registry is None or refresh:
            meta = decode_meta(self.client.hgetall(self.keys.meta))
            count = int(meta.get("tables", 0))
            self._registry = [meta.get(f"tname:{i}", "") for i in range(1, count + 1)]
        return self._registry

    def forget_registry(self) -> None:
        """Read the registry of buffers again at the next sweep."""
        self._registry = None

    def sweep(self, k: int, grace: float = GRACE_SECONDS) -> tuple[int, int]:
        """Examine up to ``3 * k`` chunks (up to ``k`` of the oldest not yet found
        unreferenced, stopping at the first referenced one; ``k`` after the cursor; ``k``
        found unreferenced more than ``grace`` seconds ago) and free those unreferenced
        for ``grace`` seconds. Returns (examined, freed)."""
        for refresh in (False, True):
            names = self._registered(refresh)
            keys = [*self.keys.all_keys(),
                    *(BufferKeys(name).items if name else self.keys.meta for name in names)]
            reply = scripts.load("steps_sweep")(self.client, keys,
                                                [len(names), k, int(grace * 1000)])
            if int(reply[0]) >= 0:
                return int(reply[0]), int(reply[1])
        return 0, 0

    def collect(self, grace: float = GRACE_SECONDS) -> int:
        """Sweep every chunk once (in bounded calls); returns how many were freed."""
        total = int(self.client.zcard(self.keys.order))
        examined = freed = 0
        while examined < total + 1:
            seen, gone = self.sweep(1000, grace)
            examined += max(seen, 1)
            freed += gone
        return freed

    # -- reading ------------------------------------------------------------------------

    def read(self, chunk_keys: Iterable[str]) -> dict[str, Chunk]:
        """The chunks held of ``chunk_keys``, decoded (missing ones are left out)."""
        pipe = self.client.pipeline(transaction=False)
        finish = self.chunks_into(pipe, chunk_keys)
        return finish(pipe.execute())

    def chunks_into(self, pipe: Any, chunk_keys: Iterable[str]
                    ) -> Callable[[list[Any]], dict[str, Chunk]]:
        """Queue on ``pipe`` the read of the chunks of ``chunk_keys`` this object does not
        hold decoded (one HMGET, or nothing); returns the function that, given the
        replies of what it queued (first in the list, the rest ignored), returns every
        chunk found by key. Chunks never change (a chunk key is written once), so the
        recent ones stay decoded here, up to :attr:`cache_bytes` of cells."""
        # one lookup a key: a batch names hundreds, each a cache entry cold in memory
        wanted = chunk_keys if isinstance(chunk_keys, dict) else dict.fromkeys(chunk_keys)
        cache = self._chunk_cache
        get, touch = cache.get, cache.move_to_end
        found: dict[str, Chunk] = {}
        missing: list[str] = []
        with self._cache_lock:
            for key in wanted:
                chunk = get(key)
                if chunk is None:
                    missing.append(key)
                else:
                    found[key] = chunk
                    touch(key)
        if missing:
            pipe.hmget(self.keys.chunks, missing)

        def finish(replies: list[Any]) -> dict[str, Chunk]:
            if missing:
                for key, blob in zip(missing, replies[0], strict=True):
                    if blob is not None:
                        chunk = decode_chunk(blob)
                        found[key] = chunk
                        with self._cache_lock:
                            self._remember(key, chunk, len(blob))
            return found

        return finish

    def _remember(self, key: str, chunk: Chunk, size: int) -> None:
        cache = self._chunk_cache
        if key not in cache:
            self._cached_bytes += size
        cache[key] = chunk
        self._chunk_sizes[key] = size
        while self._cached_bytes > self.cache_bytes and cache:
            old, _ = cache.popitem(last=False)
            self._cached_bytes -= self._chunk_sizes.pop(old)

    def record(self, blob: bytes) -> ItemRecord:
        """An item's record decoded (the recent ones are kept decoded, by their bytes)."""
        return self.records([blob])[0]

    def records(self, blobs: Iterable[bytes]) -> list[ItemRecord]:
        """:meth:`record` of each of ``blobs``, the cache locked once for them all."""
        cache = self._record_cache
        get = cache.get
        out = [get(blob) for blob in blobs]
        missing = [i for i, record in enumerate(out) if record is None]
        if missing:
            blobs = list(blobs) if not isinstance(blobs, list) else blobs
            decoded = [decode_item(blobs[i]) for i in missing]  # outside the lock
            with self._cache_lock:
                for i, record in zip(missing, decoded, strict=True):
                    out[i] = cache[blobs[i]] = record
                while len(cache) > self.cache_records:
                    cache.popitem(last=False)
        return out  # type: ignore[return-value]

    def sample(self, table: ReplayBuffer, n: int, **kwargs: Any) -> list[Any]:
        """``n`` items drawn from ``table`` with their data and sample info (see
        :func:`redisbuf.buffers.step_reads.sample`)."""
        from . import step_reads

        return step_reads.sample(self, table, n, **kwargs)

    def stats(self) -> dict[str, int]:
        """Chunks held, found unreferenced (to be freed), written and freed so far, and
        the bytes of the chunks hash (MEMORY USAGE)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.zcard(self.keys.order)
        pipe.zcard(self.keys.dead)
        pipe.hmget(self.keys.meta, "chunks_written", "chunks_freed")
        held, dead, (written, freed) = pipe.execute()
        try:
            memory = int(self.client.memory_usage(self.keys.chunks) or 0)
        except redis.exceptions.ResponseError:
            memory = 0
        return {"chunks": int(held), "unreferenced": int(dead),
                "chunks_written": int(written or 0), "chunks_freed": int(freed or 0),
                "memory_bytes": memory}

    def episodes_inserted(self, table: str) -> int:
        """How many episodes have had items inserted into ``table`` (since
        :meth:`reset_counts`)."""
        return int(self.client.hget(self.keys.meta, f"episodes:{table}") or 0)

    def reset_counts(self, table: str) -> None:
        """Forget ``table``'s count of episodes (its buffer was cleared)."""
        self.client.hdel(self.keys.meta, f"episodes:{table}")

    def episodes_present(self, table: ReplayBuffer) -> int:
        """How many distinct episodes the items of ``table`` reference now (a scan of its
        items, in slices)."""
        episodes: set[int] = set()
        cursor = 0
        while True:
            cursor, found = self.client.hscan(table.keys.items, cursor, count=1000)
            for blob in found.values():
                episodes.add(decode_item(blob).episode)
            if cursor == 0:
                return len(episodes)

    def drop(self) -> None:
        """Delete the store's keys (its chunks included); its buffers are left."""
        keys = [*self.keys.all_keys(), self.keys.batches, self.keys.batches_old]
        self.client.unlink(*keys)
        self._registry = None

    def __repr__(self) -> str:
        return f"StepStore({self.name!r})"


__all__ = ["GRACE_SECONDS", "InsertResult", "StepStore", "TableBatch", "schema_text",
           "steps_schema"]
