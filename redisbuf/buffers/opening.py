"""How :class:`~redisbuf.buffers.replay.ReplayBuffer` opens a buffer: creates it or
checks the stored configuration against the one asked for, refuses a name that holds a
sharded buffer, and keeps the schema the first batch fixed (cached per process, checked
against every batch)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import BufferShardedError, ConfigMismatchError, SchemaError
from ..store.containers import describe_schema_difference
from ..store.keys import DEFAULT_RETRY_WINDOW, decode_meta

if TYPE_CHECKING:
    from .needs import OpeningNeeds as _OpeningNeeds
else:
    _OpeningNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

#: Layout of a buffer's keys in Redis (meta ``format_version``).
FORMAT_VERSION = 1


@dataclass
class _Config:
    capacity: int
    eviction: str
    meta: dict[str, str] = field(default_factory=dict)
    retry_window: float = DEFAULT_RETRY_WINDOW


class Opening(_OpeningNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``client``, ``keys``, ``name``, ``_run`` (redisbuf/buffers/needs.py, OpeningNeeds) and
    sets the schema cache below to None before it opens."""

    #: the schema the first batch fixed, as stored (parsed, and its text), and its kind
    _schema: dict[str, Any] | None
    _schema_json: str | None
    kind: str | None

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
            f"open it with ShardedReplayBuffer(..., shards={count}) or "
            "ShardedReplayBuffer.open; nothing was written"
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
