"""Save, load and restore a sharded buffer (:class:`ShardedCheckpointing` of
ShardedReplayBuffer): the unsharded format (:mod:`redisbuf.buffers.checkpoint`) plus the
header's ``shards``, each shard restored by :class:`~redisbuf.buffers.checkpoint.Checkpointing`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import (
    ConfigMismatchError,
    DecodeError,
    PartialLoadError,
    SchemaError,
)
from ..store.containers import describe_schema_difference
from .savefile import (
    _COUNTERS,
    FILE_MAGIC,
    SAVE_FORMAT_VERSION,
    Progress,
    _read_save,
    _saved_counters,
    _saved_schema,
    _state_of,
    _state_records,
    _write_save,
    saved_shard_count,
)

if TYPE_CHECKING:
    from .needs import ShardedCheckpointingNeeds as _ShardedCheckpointingNeeds
else:  # for type checkers only: see redisbuf/buffers/needs.py
    _ShardedCheckpointingNeeds = object


def _offset_progress(progress: Progress, offset: int, total: int) -> Progress:
    """A shard's restore progress as the whole load's: ``offset`` items done before it."""
    return lambda done, _total: progress(offset + done, total)


class ShardedCheckpointing(_ShardedCheckpointingNeeds):
    """Save, load, ``state_dict`` and ``load_state_dict`` of
    :class:`~redisbuf.buffers.sharded.ShardedReplayBuffer`, in the unsharded format plus
    the header's ``shards``; each shard is restored by :class:`Checkpointing` (a mixin:
    the buffer provides ``client``, ``keys``, ``name``, ``count``, ``shards``,
    ``capacity`` and ``_on_shard``)."""

    #: the shards' schema as stored (None: read again at the next add)
    _schema_json: str | None

    def _header(self) -> dict[str, Any]:
        """The save header: the unsharded one's fields for the whole buffer (global
        capacity, counters summed over the shards, ``per``: the shards' PER settings, or
        None without PER) plus ``shards``: the shard count, each shard's capacity and
        each shard's counters."""
        headers = []
        for k, shard in enumerate(self.shards):
            with self._on_shard(k):
                headers.append(shard._header())
        raw = self.client.hget(self.keys.shards, "schema")
        schema = raw.decode() if raw is not None else None
        if schema is None:  # no add through the sharded buffer yet: a shard's, if any
            schema = next((h["schema"] for h in headers if h["schema"]), None)
        counters = [h["counters"] for h in headers]
        return {
            "format": FILE_MAGIC,
            "version": SAVE_FORMAT_VERSION,
            "name": self.name,
            "capacity": self.capacity,
            "eviction": "reward" if self.prioritized_capacity else "fifo",
            "schema": schema,
            "counters": {key: sum(c[key] for c in counters) for key in _COUNTERS},
            "per": next((h["per"] for h in headers if h["per"] is not None), None),
            "shards": {
                "count": self.count,
                "capacities": [shard.capacity for shard in self.shards],
                "counters": counters,
            },
        }

    def _uses_per(self) -> bool:
        """Whether the shards keep PER priorities (their stored configuration)."""
        with self._on_shard(0):
            return self.client.hget(self.shards[0].keys.meta, "mass") == b"per"

    def _records(self, per: bool = False) -> Iterator[tuple[int, float, bytes, Any, int]]:
        """Every shard's records (see :meth:`ReplayBuffer._records`: PER priorities only
        with ``per``), shard by shard, oldest first within a shard, with global ids."""
        for k, shard in enumerate(self.shards):
            with self._on_shard(k):
                for item_id, log_reward, blob, priority, uses in shard._records(per):
                    yield item_id * self.count + k, log_reward, blob, priority, uses

    def save(self, path: str | Path, *, progress: Progress | None = None) -> int:
        """Write the buffer to ``path`` in the format of :meth:`ReplayBuffer.save`
        (version 2, through the same temporary file, fsync and rename): the header
        (global capacity, counters summed over the shards, ``per`` the PER settings or
        None, plus ``shards``: ``count``, each shard's ``capacities`` and ``counters``),
        then every shard's items (with their PER priorities under PER), shard by shard,
        oldest first within a shard, with their global ids (``local_id * count +
        shard``), then the trailer. Returns the number
        of items written. The file loads into a plain :class:`ReplayBuffer` too (which
        ignores ``shards``). Not a snapshot if other processes write meanwhile, neither
        within a shard nor across shards. ``progress(done, total)`` as
        :meth:`ReplayBuffer.save`.

        Args:
            path: the file to write.
            progress: called as ``progress(done, total)``, or ``None``.

        Returns:
            The number of items written.

        Examples:
            >>> import fakeredis, numpy as np, os, tempfile
            >>> from redisbuf import ReplayBuffer, ShardedReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> buffer = ShardedReplayBuffer(client, "demo", shards=2)
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> path = os.path.join(tempfile.mkdtemp(), "demo.rbuf")
            >>> buffer.save(path)
            3
            >>> ReplayBuffer(client, "plain").load(path)
            3
        """
        total = len(self) if progress is not None else 0

        def stream() -> Iterator[Any]:
            header = self._header()
            yield header
            yield from self._records(header["per"] is not None)

        return _write_save(path, stream(), progress, total)

    def state_dict(self) -> dict[str, Any]:
        """The whole buffer as plain data: the header of :meth:`save` and the columns of
        :meth:`ReplayBuffer.state_dict` (``ids`` global, ``per_priorities`` None each
        without PER), in the order :meth:`save` writes the records.

        Returns:
            A dict of plain data (see :meth:`ReplayBuffer.state_dict`).
        """
        header = self._header()
        return _state_of(header, self._records(header["per"] is not None))

    def load(
        self,
        path: str | Path,
        *,
        drop_per_priorities: bool = False,
        progress: Progress | None = None,
    ) -> int:
        """Replace the buffer's items with those saved at ``path`` (by :meth:`save` or
        :meth:`ReplayBuffer.save`); returns their number.

        The whole file is read and checked first, every shard's part as
        :meth:`ReplayBuffer.load` checks a file (schema, also against this buffer's,
        capacity, counters, records), before anything is written. Where the records go:
        a file saved from a sharded buffer of the same shard count gives shard ``k``
        exactly its saved items (the records whose global id is ``k`` modulo the count)
        and its saved counters; any other file (a plain buffer's, or another shard
        count) gives record ``j`` (in file order) to shard ``j mod count``, and splits
        the counters as the capacity is split: the items evicted before the save
        (``inserted - length``) and ``sampled`` go ``// count`` to every shard, the first
        ``% count`` shards one more. Each shard's counters then follow the unsharded
        rule (``inserted`` at least its length, ``evicted = inserted - length``), so
        the totals are the file's. A shard's part over that shard's capacity raises
        :class:`ConfigMismatchError` naming the shard, before anything is written.
        Items keep their order within a shard, log-rewards and use counts, and get new
        ids (above every id their shard handed out before or during the load).

        Then each shard is restored in turn by the unsharded machinery (staging keys,
        then one swap script): each shard's swap is atomic, the whole is not. A failure
        part way (a lost shard, say) raises :class:`PartialLoadError` naming the shards
        already restored and the one that failed (which, and those after it, are as they
        were); a failure on the first shard raises its own error, every shard as it was.

        PER priorities follow :meth:`ReplayBuffer.load`'s rules in every shard: a file
        with them restores each item's into a buffer with PER (a file without them gives
        the items PER's initial priority); into a buffer without PER it raises
        :class:`ConfigMismatchError` unless ``drop_per_priorities=True``.
        ``progress(done, total)`` counts the items of all shards (``total`` the file's).

        Args:
            path: a file written by :meth:`save` or :meth:`ReplayBuffer.save`.
            drop_per_priorities: load a file with PER priorities without them.
            progress: called as ``progress(done, total)``, or ``None``.

        Returns:
            The number of items loaded.

        Raises:
            ConfigMismatchError: the file does not fit the buffer (schema, a shard's
                capacity, PER priorities).
            PartialLoadError: a shard after the first failed; names those restored.
        """
        header, records = _read_save(path)
        self._restore(header, records, drop_per_priorities, progress)
        return len(records)

    def load_state_dict(self, state: dict[str, Any], *, drop_per_priorities: bool = False) -> None:
        """Replace the buffer's items with those of ``state`` (from :meth:`state_dict` or
        :meth:`ReplayBuffer.state_dict`), as :meth:`load` does with a file.

        Args:
            state: a dict from :meth:`state_dict` or :meth:`ReplayBuffer.state_dict`.
            drop_per_priorities: as :meth:`load`.

        Raises:
            ConfigMismatchError: as :meth:`load`.
            PartialLoadError: as :meth:`load`.
        """
        self._restore(state, _state_records(state), drop_per_priorities)

    def _parts(
        self, header: dict[str, Any], records: list[tuple[Any, ...]]
    ) -> tuple[list[list[tuple[Any, ...]]], list[dict[str, int]]]:
        """Each shard's records and counters (see :meth:`load`)."""
        count = self.count
        saved_count = saved_shard_count(header)
        inserted, sampled = _saved_counters(header, len(records))  # checked, both cases
        if saved_count == count:
            parts: list[list[tuple[Any, ...]]] = [[] for _ in range(count)]
            for record in records:
                item_id = record[0]
                if isinstance(item_id, bool) or not isinstance(item_id, int):
                    raise DecodeError(f"saved record has id {item_id!r:.40}, not an integer")
                parts[item_id % count].append(record)
            counters = header["shards"]["counters"]
            for name in _COUNTERS:
                whole = header.get("counters", {}).get(name, 0)
                if sum(c.get(name, 0) for c in counters) != whole:
                    raise DecodeError(
                        f"saved shard counters {name} do not add up to the buffer's {whole}"
                    )
            return parts, [dict(c) for c in counters]
        parts = [records[k::count] for k in range(count)]
        evicted = inserted - len(records)
        shares = []
        for k, part in enumerate(parts):
            gone = evicted // count + (1 if k < evicted % count else 0)
            shares.append(
                {
                    "inserted": len(part) + gone,
                    "evicted": gone,
                    "sampled": sampled // count + (1 if k < sampled % count else 0),
                }
            )
        return parts, shares

    def _restore(
        self,
        header: dict[str, Any],
        records: list[tuple[Any, ...]],
        drop_per_priorities: bool = False,
        progress: Progress | None = None,
    ) -> None:
        schema_json = header.get("schema")
        if schema_json:
            raw = self.client.hget(self.keys.shards, "schema")
            if raw is not None and raw.decode() != schema_json:
                raise SchemaError(
                    f"saved items do not fit sharded buffer {self.name!r}: "
                    f"{describe_schema_difference(json.loads(raw), _saved_schema(schema_json))}"
                )
        if header.get("per") is not None and not drop_per_priorities and not self._uses_per():
            raise ConfigMismatchError(
                f"the saved items carry PER priorities and sharded buffer {self.name!r} "
                "has no PER: load with drop_per_priorities=True (redisbuf import "
                "--drop-per-priorities) to leave them out"
            )
        parts, counters = self._parts(header, records)
        spread = saved_shard_count(header) != self.count
        for k, part in enumerate(parts):
            if len(part) > self.shards[k].capacity:
                how = (
                    f"record j goes to shard j mod {self.count}"
                    if spread
                    else "each record goes back to its saved shard"
                )
                raise ConfigMismatchError(
                    f"saved buffer holds {len(part)} items for shard {k} of sharded buffer "
                    f"{self.name!r}, over that shard's capacity {self.shards[k].capacity} "
                    f"({len(records)} items in all, global capacity {self.capacity}; {how})"
                )
        plans = []
        for k, (shard, part) in enumerate(zip(self.shards, parts, strict=True)):
            with self._on_shard(k):
                plans.append(
                    shard._prepare_restore(
                        {**header, "counters": counters[k]}, part, drop_per_priorities
                    )
                )
        total, done = len(records), 0
        restored: list[int] = []
        for k, (shard, plan) in enumerate(zip(self.shards, plans, strict=True)):
            offset = done
            try:
                with self._on_shard(k):
                    shard._apply_restore(plan, None if progress is None
                                         else _offset_progress(progress, offset, total))
            except Exception as exc:
                if not restored:
                    raise
                raise PartialLoadError(
                    f"sharded buffer {self.name!r}: the load restored shard(s) "
                    f"{', '.join(map(str, restored))} of {self.count}, then failed on shard "
                    f"{k} ({exc}); shard {k} and those after it are as they were",
                    restored,
                    k,
                ) from exc
            restored.append(k)
            done += len(plan.records)
            if schema_json and len(restored) == 1:  # the shards now hold this schema
                self.client.hsetnx(self.keys.shards, "schema", schema_json)
        self._schema_json = None  # read again at the next add
