"""How :class:`~redisbuf.buffers.replay.ReplayBuffer` turns stored records back into
batches: the container kind of its schema, decoding blobs (records that do not decode
set aside, see buffers/quarantine.py) and joining items into one batch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..errors import (
    DecodeError,
    EmptyBufferError,
)
from ..store import codec
from ..store.containers import (
    KINDS,
    ContainerKind,
    RecordKind,
)

if TYPE_CHECKING:
    from .needs import DecodingNeeds as _DecodingNeeds
else:
    _DecodingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py


class Decoding(_DecodingNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``client``, ``keys``, ``name``, its schema cache and ``_stored_schema``."""

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
        if isinstance(kind, RecordKind):  # whole items, no fields to gather
            return kind.join_records(blobs)
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
