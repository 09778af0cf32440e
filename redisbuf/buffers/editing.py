"""Changing stored items of a :class:`~redisbuf.buffers.replay.ReplayBuffer` by id:
reading their raw records, removing them, replacing their records (DI-engine's
``delete`` and ``update``; every facade's removal and rewrite by id)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import InvalidBatchError, RequestTooLargeError, SchemaError
from ..store import bounds
from ..store.containers import schema_to_json
from ..store.keys import format_id
from .priorities import _per_priorities

if TYPE_CHECKING:
    from .needs import EditingNeeds as _EditingNeeds
else:
    _EditingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py


def _id_list(ids: Sequence[int] | np.ndarray) -> list[int]:
    out = []
    for item_id in np.asarray(ids, dtype=object).reshape(-1).tolist():
        if isinstance(item_id, bool) or not isinstance(item_id, (int, np.integer)) or (
                item_id < 1):
            raise ValueError(f"item ids are positive integers, got {item_id!r}")
        out.append(int(item_id))
    return out


class Editing(_EditingNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``client``, ``keys``, ``name``, ``_run``, ``encode`` and its schema cache
    (``_stored_schema``, ``_schema_json``, ``_schema_refusal``)."""

    def records(self, ids: Sequence[int] | np.ndarray) -> list[bytes | None]:
        """The stored records (the encoded items, as :meth:`encode` made them) of these
        ids, ``None`` for an id not stored; read as :meth:`get` reads, in bounded HMGETs.

        Args:
            ids: the items' ids.

        Returns:
            One record or ``None`` per id, in order.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.add([("a", 1)])
            >>> buffer.records([1, 2])
            [b'\\xd6\\x03\\x92\\xa1a\\x01', None]
        """
        members = [format_id(i) for i in _id_list(ids)]
        out: list[bytes | None] = []
        step = bounds.MAX_ITEMS_PER_COMMAND
        while len(out) < len(members):
            out += self.client.hmget(self.keys.items, members[len(out) : len(out) + step])
            present = [len(blob) for blob in out if blob is not None]
            step = bounds.items_for_bytes(sum(present) / len(present) if present else 0)
        return out

    def remove(self, ids: Sequence[int] | np.ndarray) -> int:
        """Remove these items, as an eviction removes them (their priorities, uses and
        versions go too, and every process's samplers stop drawing them). Ids not stored
        are skipped. Atomic per command of at most
        :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS` ids.

        Args:
            ids: the items' ids.

        Returns:
            How many items were removed.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0)})
            >>> buffer.remove([2, 2, 9]), len(buffer)
            (1, 2)
        """
        members = [format_id(i) for i in _id_list(ids)]
        removed = 0
        for start in range(0, len(members), bounds.MAX_ADD_ITEMS):
            removed += int(self._run(
                "remove", self.keys.all_keys(), members[start : start + bounds.MAX_ADD_ITEMS]))
        return removed

    def replace(
        self, ids: Sequence[int] | np.ndarray, batch: Any,
        expected: Sequence[bytes] | None = None, priorities: Any = None,
    ) -> np.ndarray:
        """Give stored items new records: item ``ids[i]`` gets item ``i`` of ``batch`` (a
        batch of the buffer's kind, the same schema) and keeps its id, place in the
        insertion order, log-reward, PER priority, uses and version. One atomic command.

        Args:
            ids: the items' ids, one per item of ``batch``.
            batch: the new items.
            expected: optional, one record per id (as :meth:`records` read them): an item
                whose record is no longer that one is left as it is (compare and set).
            priorities: optional, one PER priority per id (finite, >= 0), set with the
                record of each item replaced, as :meth:`update_priority` sets it (a
                buffer with :class:`PERSampler`).

        Returns:
            One int8 per id: 1 replaced, 0 not stored, -1 not the expected record.

        Raises:
            SchemaError: the batch's schema is not the buffer's (or it holds none yet).
            InvalidBatchError: not one id per item, ``expected`` or ``priorities`` of
                another length, or a priority that is NaN, negative or not finite.
            ConfigMismatchError: ``priorities`` on a buffer without PER.
            RequestTooLargeError: more than one add may carry.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.add([{"v": 1}, {"v": 2}])
            >>> buffer.replace([2, 5], [{"v": 20}, {"v": 50}]).tolist(), buffer.get([1, 2])
            ([1, 0], [{'v': 1}, {'v': 20}])
        """
        members = [format_id(i) for i in _id_list(ids)]
        blobs, _log_rewards, schema = self.encode(batch)
        if len(blobs) != len(members):
            raise InvalidBatchError(f"{len(members)} ids for a batch of {len(blobs)} items")
        if expected is not None and len(expected) != len(members):
            raise InvalidBatchError(f"{len(expected)} expected records for {len(members)} ids")
        refusal = bounds.add_refusal(len(blobs), sum(len(blob) for blob in blobs))
        if refusal is not None:
            raise RequestTooLargeError(
                f"buffer {self.name!r}: {refusal}; replace fewer items at a time, nothing "
                "was written")
        stored = self._stored_schema()
        schema_json = schema_to_json(schema)
        if stored is None:
            raise SchemaError(f"buffer {self.name!r} holds no items yet: nothing to replace")
        texts = None
        if priorities is not None:
            texts = [repr(float(p)) for p in _per_priorities(priorities, len(members))]
        flags = ("" if expected is None else "e") + ("" if texts is None else "p")
        args: list[Any] = [schema_json, flags]
        for position, (member, blob) in enumerate(zip(members, blobs, strict=True)):
            args += [member, blob]
            if expected is not None:
                args.append(expected[position])
            if texts is not None:
                args.append(texts[position])
        try:
            reply = self._run("replace", self.keys.all_keys(), args)
        except SchemaError:
            raise self._schema_refusal(schema) from None
        return np.array([int(v) for v in reply], dtype=np.int8)
