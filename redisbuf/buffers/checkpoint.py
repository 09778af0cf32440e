"""Save, load and restore a buffer: the save format, and the methods that write and read it
(:class:`Checkpointing` of ReplayBuffer; a sharded buffer's in
:mod:`redisbuf.buffers.sharded_checkpoint`).

A save is a msgpack stream: a header map (``format``, ``version``, ``name``, ``capacity``,
``eviction``, ``schema``, ``counters``, ``per``; a sharded buffer's also ``shards``), one
``[id, log_reward, blob, per_priority, uses]`` record per item, then the trailer
``{"end": count}``; ``state_dict`` holds the same as plain data. A load reads and checks
the whole file before it writes anything, builds the items under staging keys and swaps
them in with one script (``lua/restore.lua``).
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import (
    ConfigMismatchError,
    DecodeError,
    PrioritizedSamplingOffError,
    SamplingError,
    SchemaError,
    ServerUnavailableError,
)
from ..sampling import replica as replica_module
from ..sampling import snapshots
from ..store import bounds, codec
from ..store.connection import retrying
from ..store.containers import KINDS, describe_schema_difference, schema_to_json
from ..store.keys import StagingKeys, decode_meta, format_id, keeps_rewards
from .insert import _priority_text
from .savefile import (
    _MAX_COUNTER,
    _READ_CHUNK,
    FILE_MAGIC,
    SAVE_FORMAT_VERSION,
    Progress,
    _read_save,
    _saved_counters,
    _saved_schema,
    _state_of,
    _state_records,
    _write_save,
)

if TYPE_CHECKING:
    from .needs import CheckpointingNeeds as _CheckpointingNeeds
else:  # for type checkers only: see redisbuf/buffers/needs.py
    _CheckpointingNeeds = object

# Items per staging add of a load: lua/add.lua takes the blobs through Lua, which costs the
# server more than an add's native HSET: 1000 items took 32 ms of its time on a quiet
# 2-core machine (benchmarks/bench_latency.py --only load), 500 about half
_STAGE_CHUNK = 500
# A staged key lives this long after the load's last staging call (renewed by each)
_STAGED_SECONDS = 600


@dataclass
class _Restore:
    """A checked restore (see ReplayBuffer._prepare_restore): the records, the schema
    and the swap script's arguments."""

    records: list[tuple[Any, ...]]
    schema_json: str | None
    inserted: int
    sampled: int
    carry_per: bool
    most_used: int



class Checkpointing(_CheckpointingNeeds):
    """Save, load, ``state_dict`` and ``load_state_dict`` of
    :class:`~redisbuf.buffers.replay.ReplayBuffer` (a mixin: the buffer provides
    ``client``, ``keys``, ``name``, ``capacity``, ``max_use``, ``_run``, ``_run_once``, its
    schema cache, ``_decode`` and ``encode``)."""

    def _header(self) -> dict[str, Any]:
        meta = decode_meta(self.client.hgetall(self.keys.meta))
        if "capacity" not in meta:
            raise ConfigMismatchError(f"buffer {self.name!r} does not exist (dropped?)")
        per = None
        if meta.get("mass") == "per":
            per = {
                "alpha": float(meta["per_alpha"]),
                "eps": float(meta["per_eps"]),
                "initial_priority": float(meta["per_initial"]),
            }
        return {
            "format": FILE_MAGIC,
            "version": SAVE_FORMAT_VERSION,
            "name": self.name,
            "capacity": int(meta["capacity"]),
            "eviction": meta["eviction"],
            "schema": meta.get("schema"),
            "counters": {k: int(meta.get(k, 0)) for k in ("inserted", "evicted", "sampled")},
            "per": per,
        }

    def _records(self, per: bool = False) -> Iterator[tuple[int, float, bytes, float | None, int]]:
        """(id, log-reward, blob, PER priority, use count) of every item, oldest first,
        read in chunks, each chunk in one plain pipeline (not a MULTI, which a server at
        ``maxmemory`` refuses, reads too) whose blob read comes last: an item whose blob
        it finds was present at the chunk's earlier reads (ids are never reused), and one
        evicted while we read is left out. The PER priority is None unless ``per``; then
        it is this process's replica's (the priorities have no per-item copy on the
        server), caught up after the chunk's reads, and an item it does not hold (PER was
        turned on or off meanwhile, or it was evicted) is left out too."""
        start = 0
        # without log-rewards stored (every item's is 0), order answers "present" instead
        kept = keeps_rewards(self.client, self.keys)
        # this process's replica, or one of the save's own that writes nothing
        replica = replica_module.readable_replica(self.view, "per", keep=False) if per else None
        while True:
            members = self.client.zrange(self.keys.order, start, start + _READ_CHUNK - 1)
            if not members:
                return
            pipe = self.client.pipeline(transaction=False)
            pipe.zmscore(self.keys.prio if kept else self.keys.order, members)
            pipe.hmget(self.keys.uses, members)
            pipe.hmget(self.keys.items, members)
            scores, uses, blobs = pipe.execute()
            pers: list[Any] = [None] * len(members)
            if replica is not None:
                with replica.lock:
                    replica.sync(self.view)
                    slots = replica.slots_of(np.array([int(m) for m in members], dtype=np.int64))
                    pers = [None if slot < 0 else float(replica.scores[slot])
                            for slot in slots.tolist()]
            for member, blob, score, used, priority in zip(
                members, blobs, scores, uses, pers, strict=True
            ):
                if blob is None or score is None or (per and priority is None):
                    continue  # evicted while we read
                yield (int(member), float(score) if kept else 0.0, blob,
                       None if priority is None else float(priority), int(used or 0))
            start += len(members)

    def state_dict(self) -> dict[str, Any]:
        """The whole buffer as plain data: the header (its ``per``: the PER settings, or
        None without PER), then per item, oldest first: ``ids``, ``priorities``
        (log-rewards), ``blobs``, ``per_priorities`` (None each without PER) and ``uses``
        (times sampled).

        Returns:
            A dict of plain data (no pickle needed to store it).

        Raises:
            ConfigMismatchError: the buffer does not exist (dropped).
        """
        header = self._header()
        return _state_of(header, self._records(header["per"] is not None))

    def load_state_dict(self, state: dict[str, Any], *, drop_per_priorities: bool = False) -> None:
        """Replace the buffer's items with those of ``state`` (from :meth:`state_dict`),
        keeping their order, log-rewards, PER priorities and use counts (they get new
        ids); see :meth:`load` for what is checked, the PER rules and how the replacement
        is atomic. A version-1 state (no ``per_priorities`` / ``uses``) loads as a
        version-1 file.

        Args:
            state: a dict from :meth:`state_dict`.
            drop_per_priorities: as :meth:`load`.

        Raises:
            ConfigMismatchError: as :meth:`load`.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> source = ReplayBuffer(client, "source")
            >>> _ = source.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> copy = ReplayBuffer(client, "copy")
            >>> copy.load_state_dict(source.state_dict())
            >>> sorted(copy.sample(3)["obs"])
            [0.0, 1.0, 2.0]
        """
        self._restore(state, _state_records(state), drop_per_priorities)

    def replace_items(self, batch: Any) -> None:
        """Replace the buffer's items with those of ``batch`` (a container of the
        buffer's kind, see :meth:`add`), in its order, never sampled, in one atomic swap
        as :meth:`load_state_dict` (every process sees the old items or the new ones).
        Checked first, writing nothing when refused: as :meth:`add` (the schema, the
        size of each item) and the capacity.

        Raises:
            InvalidBatchError, SchemaError, ItemTooLargeError: as :meth:`add`.
            ConfigMismatchError: more items than the capacity.
        """
        blobs, log_rewards, schema = self.encode(batch)
        header = {**self._header(), "schema": schema_to_json(schema), "per": None,
                  "counters": {"inserted": len(blobs), "evicted": 0, "sampled": 0}}
        records = [(number, float(reward), blob, None, 0) for number, (reward, blob)
                   in enumerate(zip(log_rewards.tolist(), blobs, strict=True), start=1)]
        self._restore(header, records)

    def save(self, path: str | Path, *, progress: Progress | None = None) -> int:
        """Write the buffer to ``path`` as a msgpack stream: a header map (its ``per``:
        the PER settings ``alpha``, ``eps``, ``initial_priority``, or None without PER),
        one ``[id, log_reward, blob, per_priority, uses]`` record per item (oldest first;
        ``per_priority`` None without PER, ``uses`` the times the item was sampled), then
        a trailer map ``{"end": count}`` so a truncated file is detected. Returns the
        number of items written. Not a consistent snapshot if other processes write
        meanwhile.

        The file is written beside ``path`` under a temporary name, fsynced, and renamed
        over ``path`` only when complete: a save that fails (or a crash) leaves the
        previous file as it was.

        ``progress(done, total)``, when given, is called after every 1,000 records written
        and once at the end, with ``total`` the length when the save began.

        Args:
            path: the file to write.
            progress: called as ``progress(done, total)``, or ``None``.

        Returns:
            The number of items written.

        Raises:
            ConfigMismatchError: the buffer does not exist (dropped).

        Examples:
            >>> import fakeredis, numpy as np, os, tempfile
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> buffer = ReplayBuffer(client, "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> path = os.path.join(tempfile.mkdtemp(), "demo.rbuf")
            >>> buffer.save(path)
            3
            >>> restored = ReplayBuffer(client, "restored")
            >>> restored.load(path), restored.stats()["inserted"]
            (3, 3)
        """
        total = len(self) if progress is not None else 0

        def stream() -> Iterator[dict[str, Any] | tuple[Any, ...]]:  # the header, records
            header = self._header()
            yield header
            yield from self._records(header["per"] is not None)

        return _write_save(path, stream(), progress, total)

    def load(
        self,
        path: str | Path,
        *,
        drop_per_priorities: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """Replace the buffer's items with those saved at ``path``; returns their number.

        The file is read and checked whole (records, schema, capacity, counters: integers
        in [0, 2**53]; PER priorities: finite numbers >= 0; use counts: integers in [0,
        2**53]) before anything is written. The items are then built under staging keys
        and swapped in by one script: other processes see the old buffer or the restored
        one, never a part. Every command of the load is bounded (redisbuf/store/bounds.py):
        the items are staged up to 500 at a time, and the swap costs the server the same
        whatever their number (each key is unlinked, freed in the background, and its
        staged twin renamed in its place; the sums it needs were kept while staging).
        Counters: ``inserted`` is the saved one (at least the length),
        ``evicted = inserted - length``, ``sampled`` the saved one. Restored items get new
        ids, above every id handed out before or during the load, and keep their order,
        log-rewards and use counts (``max_use`` counts on from them; a count at or over
        this buffer's ``max_use`` raises :class:`ConfigMismatchError`).

        With prioritized sampling or PER, a load of 50,000 items or more then reads the
        restored scores once and publishes them as the buffer's snapshot
        (``rb:{name}:snap``): samplers' first draws after the load read that, not every
        item.

        PER: a file saved from a buffer with PER restores each item's PER priority, and
        so the sampling probabilities and weights (this buffer's ``alpha``, ``eps`` and
        ``initial_priority`` apply). Loading it into a buffer without PER raises
        :class:`ConfigMismatchError` unless ``drop_per_priorities=True``, which loads the
        items without them. A file without PER priorities (saved without PER, or in
        format 1) loaded into a PER buffer gives every item ``initial_priority``, the
        new-item rule with nothing else present.

        A file saved from a sharded buffer (:meth:`ShardedReplayBuffer.save`) loads as
        any other: its records in file order (shard by shard), its summed counters; the
        header's ``shards`` is not used.

        ``progress(done, total)``, when given, is called as the items built under the
        staging keys pass each multiple of 1,000 (exactly there unless large items made a
        staging add smaller), after the last, and once more after the swap.

        Args:
            path: a file written by :meth:`save` (or :meth:`ShardedReplayBuffer.save`).
            drop_per_priorities: load a file with PER priorities into a buffer without PER,
                without them.
            progress: called as ``progress(done, total)``, or ``None``.

        Returns:
            The number of items loaded.

        Raises:
            ConfigMismatchError: the file does not fit the buffer (schema, capacity, PER
                priorities without PER, a use count at or over ``max_use``).
            DecodeError: the file is malformed or truncated.
        """
        header, records = _read_save(path)
        self._restore(header, records, drop_per_priorities, progress)
        return len(records)

    def _check_records(
        self, records: list[tuple[Any, ...]], schema: dict[str, Any], per: bool
    ) -> None:
        """Refuse saved records that ``add`` would refuse: ids that are not integers,
        priorities that are not numbers or are NaN, blobs that do not decode to
        items of ``schema``; PER priorities that are not finite numbers >= 0 (``per``: the
        file keeps them) or that are there when the file has no PER settings; use counts
        that are not integers in [0, 2**53]."""
        for item_id, priority, blob, per_priority, uses in records:
            if isinstance(item_id, bool) or not isinstance(item_id, int):
                raise DecodeError(f"saved record has id {item_id!r}, not an integer")
            if isinstance(priority, bool) or not isinstance(priority, (int, float)):
                raise DecodeError(f"saved record {item_id} has priority {priority!r}, not a number")
            if math.isnan(priority):
                raise DecodeError(f"saved record {item_id} has priority NaN")
            if not isinstance(blob, bytes):
                raise DecodeError(f"saved record {item_id} has no blob")
            if not per and per_priority is not None:
                raise DecodeError(
                    f"saved record {item_id} has PER priority {per_priority!r:.40} but the "
                    "header has no PER settings"
                )
            if per and (
                isinstance(per_priority, bool)
                or not isinstance(per_priority, (int, float))
                or not (0 <= per_priority < math.inf)
            ):
                raise DecodeError(
                    f"saved record {item_id} has PER priority {per_priority!r:.40}; PER "
                    "priorities must be finite numbers >= 0"
                )
            if isinstance(uses, bool) or not isinstance(uses, int) or not (
                0 <= uses <= _MAX_COUNTER
            ):
                raise DecodeError(
                    f"saved record {item_id} has use count {uses!r:.40}; use counts must be "
                    "integers in [0, 2**53]"
                )
        if schema.get("kind") == "steps":  # references to a step store's chunks
            from .step_records import decode_item

            for record in records:
                decode_item(record[2])
            return
        kind_name = schema.get("kind")
        kind = KINDS.get(kind_name) if isinstance(kind_name, str) else None
        if kind is None:
            raise DecodeError(f"saved schema names an unknown kind {schema.get('kind')!r}")
        for start in range(0, len(records), _READ_CHUNK):
            chunk = records[start : start + _READ_CHUNK]
            with codec.gc_paused():
                self._decode(kind, schema, [r[2] for r in chunk], [r[0] for r in chunk])

    def _restore_args(
        self, blobs: list[bytes], priorities: np.ndarray, schema_json: str
    ) -> tuple[str, list[Any]]:
        """The inserting script and its ARGV that store saved records as they are (a
        buffer class that keeps more per item derives it here from the records)."""
        args: list[Any] = [schema_json, len(blobs), ""]
        for blob, priority in zip(blobs, priorities.tolist(), strict=True):
            args += [blob, _priority_text(priority)]
        return "add", args

    def _restore(
        self,
        header: dict[str, Any],
        records: Any,
        drop_per_priorities: bool = False,
        progress: Progress | None = None,
    ) -> None:
        self._apply_restore(self._prepare_restore(header, records, drop_per_priorities), progress)

    def _prepare_restore(
        self, header: dict[str, Any], records: Any, drop_per_priorities: bool = False
    ) -> _Restore:
        """Check saved ``records`` against ``header`` and this buffer (schema, capacity,
        records, counters, PER, ``max_use``) and return what :meth:`_apply_restore`
        writes; writes nothing."""
        records = list(records)
        schema_json = header.get("schema")
        if records and not schema_json:
            raise DecodeError("saved buffer has items but no schema")
        if schema_json:
            saved = _saved_schema(schema_json)
            stored = self._stored_schema()
            if stored is not None and schema_json != self._schema_json:
                raise SchemaError(
                    f"saved items do not fit buffer {self.name!r}: "
                    f"{describe_schema_difference(stored, saved)}"
                )
        if len(records) > self.capacity:
            raise ConfigMismatchError(
                f"saved buffer holds {len(records)} items, over this buffer's capacity "
                f"{self.capacity}"
            )
        saved_per = header.get("per") is not None
        if records:
            assert schema_json  # refused above when items come without a schema
            self._check_records(records, json.loads(schema_json), saved_per)
        inserted, sampled = _saved_counters(header, len(records))
        carry_per = saved_per and not drop_per_priorities
        if carry_per and self.client.hget(self.keys.meta, "mass") != b"per":
            raise ConfigMismatchError(
                f"the saved items carry PER priorities and buffer {self.name!r} does not use "
                "PER: open it with sampler=PERSampler(...), or load with "
                "drop_per_priorities=True (redisbuf import --drop-per-priorities) to leave "
                "the priorities out"
            )
        most_used = max((record[4] for record in records), default=0)
        if self.max_use is not None and most_used >= self.max_use:
            raise ConfigMismatchError(
                f"a saved item was sampled {most_used} times, at or over max_use="
                f"{self.max_use} of buffer {self.name!r}"
            )
        return _Restore(records, schema_json, inserted, sampled, carry_per, most_used)

    def _apply_restore(self, plan: _Restore, progress: Progress | None = None) -> None:
        """Build the checked ``plan``'s items under staging keys and swap them in with one
        script of bounded cost, whatever the number of items (lua/restore.lua: UNLINK and
        RENAME per key, sums kept while staging; see :meth:`load`)."""
        records, schema_json, carry_per = plan.records, plan.schema_json, plan.carry_per
        staging = StagingKeys(self.name, uuid.uuid4().hex[:16])
        # under PER every staged item gets its priority (saved, else the new-item one), in
        # a staged snapshot the swap makes the buffer's: the swap then iterates no item
        mass, alpha, eps = self.client.hmget(self.keys.meta, "mass", "per_alpha", "per_eps")
        per = mass == b"per"
        staged_keys = [*staging.all_keys(), staging.snap]
        staged_ids: list[np.ndarray] = []
        staged_priorities: list[np.ndarray] = []

        def keep_staged() -> None:
            # the staged keys expire unless the load goes on: a load killed halfway (no
            # finally runs) leaves no copy of the data behind; the swap PERSISTs them
            pipe = self.client.pipeline(transaction=False)
            for key in staged_keys:
                pipe.expire(key, _STAGED_SECONDS)
            pipe.execute()

        try:
            self._run("restore_stage", [self.keys.meta, staging.meta], [len(records)])
            default = self.client.hget(staging.meta, "per_default")
            keep_staged()
            # up to _STAGE_CHUNK items a chunk, and no more than one add may store (bytes)
            slices = [
                (start + a, start + b)
                for start, stop in bounds.chunks(len(records), _STAGE_CHUNK)
                for a, b in bounds.add_slices([len(r[2]) for r in records[start:stop]])
            ]
            mark = _READ_CHUNK
            for start, stop in slices:
                chunk = records[start:stop]
                assert schema_json is not None  # items come with a schema (_prepare_restore)
                script, args = self._restore_args(
                    [record[2] for record in chunk],
                    np.array([record[1] for record in chunk], dtype=np.float64),
                    schema_json,
                )
                reply = self._run_once(script, staging, staging.all_keys(), args)
                if any(record[4] for record in chunk):
                    self._run("restore_items", staging.all_keys(),
                              [int(reply[0]), *(str(record[4]) for record in chunk)])
                if per:
                    staged_ids.append(np.arange(int(reply[0]), int(reply[0]) + len(chunk)))
                    staged_priorities.append(np.array(
                        [record[3] if carry_per and record[3] is not None
                         else float(default or 1.0) for record in chunk], dtype=np.float64))
                keep_staged()
                if progress is not None and (stop >= mark or stop == len(records)):
                    progress(stop, len(records))  # as each 1,000 items are passed
                    mark = (stop // _READ_CHUNK + 1) * _READ_CHUNK
            extra: list[Any] = []
            if per:
                extra = self._staged_snapshot(staging, staged_ids, staged_priorities,
                                              float(alpha), float(eps))
                if self.client.hget(staging.meta, "per_heap") in (b"1", "1"):
                    self._staged_heap(staging, staged_ids, staged_priorities)
                keep_staged()
            self._run_once(
                "restore",
                self.keys,
                [*self.keys.all_keys(), *staging.all_keys(), self.keys.snap, staging.snap],
                [plan.inserted, plan.sampled, schema_json or "", int(carry_per),
                 plan.most_used, *extra],
            )
            if progress is not None:
                progress(len(records), len(records))
        finally:
            try:  # nothing left after a failure (DEL may repeat: retried)
                retrying(lambda: self.client.delete(*staged_keys), name=self.client)
            except ServerUnavailableError:
                pass  # the server is gone; the staging keys are only garbage
            self._forget_schema()
        self._stored_schema()
        if not per and len(records) >= replica_module._SNAP_MIN_ITEMS:
            self._publish_snapshot()

    def _staged_snapshot(self, staging: StagingKeys, ids: list[np.ndarray],
                         priorities: list[np.ndarray], alpha: float, eps: float) -> list[Any]:
        """Write the staged items' PER priorities as a snapshot under ``staging.snap``
        (:func:`~redisbuf.sampling.snapshots.stage`), which lua/restore.lua makes
        the buffer's; returns its arguments for that swap (count, largest priority,
        header but for epoch, version and stamp)."""
        all_ids = np.concatenate(ids) if ids else np.empty(0, np.int64)
        scores = np.concatenate(priorities) if priorities else np.empty(0)
        order = np.argsort(all_ids, kind="stable")
        all_ids, scores = all_ids[order], scores[order]
        masses = replica_module.MassReplica("per")
        masses.alpha, masses.eps = alpha, eps
        mass = masses.masses_of(scores)
        header = snapshots.stage(self.client, staging.snap, all_ids, scores, mass,
                                 replica_module._SNAP_CHUNK, rule="per",
                                 total=float(mass.sum()))
        top = repr(float(scores.max())) if len(scores) else ""
        return [len(all_ids), top, json.dumps(header)]

    def _staged_heap(self, staging: StagingKeys, ids: list[np.ndarray],
                     priorities: list[np.ndarray]) -> None:
        """Write the staged items' PER priorities into the staged heap (``per_heap``), for
        a buffer whose remover reads it (lua/restore_stage.lua marks such a staging):
        lua/restore.lua swaps it in with the rest, so the heap is whole from the load on."""
        pipe = self.client.pipeline(transaction=False)
        for chunk_ids, chunk_priorities in zip(ids, priorities, strict=True):
            for start, stop in bounds.chunks(len(chunk_ids)):
                pipe.zadd(staging.per_heap, {
                    format_id(int(item)): float(priority) for item, priority in
                    zip(chunk_ids[start:stop], chunk_priorities[start:stop], strict=True)})
        pipe.execute()

    def _publish_snapshot(self) -> None:
        """Read the restored scores once and publish them as the buffer's snapshot
        (:meth:`~redisbuf.sampling.replica.MassReplica.write_snapshot`). The restore
        started a new mass-log epoch: without this, every sampler that draws before one
        of them has published would read every item itself (2.6-4.7 s at 2x10^6 PER
        items) instead of the snapshot's few large replies. A snapshot is a shortcut:
        prioritized sampling turned off, or the buffer cleared at every attempt of the
        read, leaves the load done without one."""
        logged, mass = self.client.hmget(self.keys.meta, "masslog", "mass")
        if logged not in (b"1", "1"):
            return
        replica = replica_module.MassReplica("per" if mass in (b"per", "per") else "softmax")
        try:
            with replica.lock:
                replica.load(self.view)  # a first read publishes what it read
        except (PrioritizedSamplingOffError, SamplingError):
            pass
