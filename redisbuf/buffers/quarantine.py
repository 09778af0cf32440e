"""Records that do not decode are set aside, so that one bad writer cannot stop learners.

``rb_add`` (FCALL) stores records without looking inside them (docs/wire-format.md), so
another client may store one that this package cannot decode. A sample that draws such a
record does not fail: :func:`decode_draw` finds each drawn record that does not decode on
its own and writes it to the buffer's quarantine hash (``rb:{name}:quarantine``, item
id -> blob) with lua/quarantine.lua, which removes the item as an eviction does (order,
priorities, PER, uses, the mass log that samplers' replicas follow; under ``max_use`` the
draw itself may have removed it) and counts it in meta ``quarantined``; a
:class:`~redisbuf.errors.QuarantinedRecordWarning` names it; and the sample draws again
as a sampler does for an item evicted before its blob was read: the draw is taken back
(lua/undo_draws.lua) and made anew, now without the records set aside. Under ``max_use``
a draw may have used items up (removed them), so it cannot be taken back: its decodable
items are kept and only the positions of the records set aside are drawn again (without
replacement, such a position may then repeat a kept item).

Only a record that fails on its own is set aside: a batch whose records each decode but
do not fit together raises :class:`~redisbuf.errors.DecodeError` as before, and so does a
failure of this process rather than of the data (an optional dependency missing, memory).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from ..errors import DecodeError, MissingExtraError, QuarantinedRecordWarning
from ..store import bounds
from ..store.keys import format_id

if TYPE_CHECKING:
    from ..sampling.samplers import Draw
    from .replay import ReplayBuffer

# Draws in a row that may meet records to set aside before a sample gives up: each round
# removes what it met, so more are needed only while writers store bad records as fast as
# they are drawn.
ROUNDS = 16

# Failures of this process, not of the record: never a reason to set a record aside.
_NOT_THE_RECORD = (MissingExtraError, ImportError, MemoryError, RecursionError)
# What a server that refuses every write answers (maxmemory under noeviction, a replica).
_REFUSED_WRITES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError)


def undecodable(buffer: ReplayBuffer, blobs: list[bytes]) -> list[tuple[int, Exception]]:
    """``(position, error)`` of each blob that does not decode on its own under the
    buffer's schema; empty when each does (or when decoding failed for a reason of this
    process, which says nothing of the records)."""
    kind, schema = buffer._container_kind()
    bad: list[tuple[int, Exception]] = []
    for position, blob in enumerate(blobs):
        if blob is None:
            continue
        try:
            buffer._join(kind, schema, [blob], None)
        except _NOT_THE_RECORD:
            return []
        except Exception as exc:  # noqa: BLE001 - any failure of a stored record
            bad.append((position, exc))
    return bad


def set_aside(buffer: ReplayBuffer, bad: list[tuple[int, bytes, Exception]]) -> bool:
    """Write the records ``(item id, blob, decode error)`` to the buffer's quarantine hash
    and remove those still stored from the buffer (lua/quarantine.lua), and warn naming
    each once (a draw with replacement may hold one twice). False when the server refuses
    writes: the records then stay where they are."""
    unique: dict[int, tuple[int, bytes, Exception]] = {}
    for record in bad:
        unique.setdefault(record[0], record)
    bad = list(unique.values())
    keys = [*buffer.keys.all_keys(), buffer.keys.quarantine]
    moved = True
    for start, stop in bounds.chunks(len(bad)):
        args: list[Any] = []
        for item, blob, _ in bad[start:stop]:
            args += [format_id(item), blob]
        try:
            buffer._run("quarantine", keys, args)
        except _REFUSED_WRITES:
            moved = False
            break
    where = (f"set aside in {buffer.keys.quarantine}" if moved
             else "left in place: the server refuses writes")
    for item, _, error in bad:
        warnings.warn(
            f"buffer {buffer.name!r}: item {item} does not decode "
            f"({type(error).__name__}: {error}); {where}",
            QuarantinedRecordWarning,
            stacklevel=5,  # the caller of sample / sample_with_info
        )
    return moved


def take_back(buffer: ReplayBuffer, ids: list[int]) -> None:
    """Undo the bookkeeping of draws not returned (lua/undo_draws.lua)."""
    for start, stop in bounds.chunks(len(ids)):
        buffer._run("undo_draws", buffer.keys.all_keys(),
                    [format_id(i) for i in ids[start:stop]])


def _refilled(draw: Draw, positions: list[int], part: Draw) -> Draw:
    """``draw`` with the draws at ``positions`` replaced by those of ``part``, in order."""
    ids, blobs = list(draw.ids), list(draw.blobs)
    for j, position in enumerate(positions):
        ids[position], blobs[position] = part.ids[j], part.blobs[j]

    def merged(kept: np.ndarray | None, new: np.ndarray | None) -> np.ndarray | None:
        if kept is None or new is None:
            return None
        out = np.array(kept, copy=True)
        out[positions] = new
        return out

    return dataclasses.replace(
        draw, ids=ids, blobs=blobs,
        probabilities=merged(draw.probabilities, part.probabilities),
        schema_json=part.schema_json or draw.schema_json,
        weights=merged(draw.weights, part.weights),
        importance_weights=merged(draw.importance_weights, part.importance_weights),
    )


def decode_draw(
    buffer: ReplayBuffer, draw: Draw, redraw: Callable[[int], Draw]
) -> tuple[Draw, Any]:
    """The draw and its batch, decoded; records that do not decode are set aside and
    drawn again (see the module's docstring) with ``redraw(count)``, a draw of ``count``
    items made as the first was. Raises :class:`DecodeError` when the records each decode
    but not together, when decoding failed for a reason of this process, and when
    ``ROUNDS + 1`` draws in a row met records that do not decode."""
    for _ in range(ROUNDS):
        try:
            return draw, buffer.decode(draw.blobs, draw.ids, draw.schema_json)
        except DecodeError as exc:
            failure = exc
        bad = undecodable(buffer, draw.blobs)
        if not bad:
            raise failure
        positions = [position for position, _ in bad]
        found = [(draw.ids[position], draw.blobs[position], error) for position, error in bad]
        if getattr(buffer, "fetch_inline", False):
            # max_use: the draw may have used items up, so its decodable part stands
            take_back(buffer, [item for item, _, _ in found])
            set_aside(buffer, found)
            draw = _refilled(draw, positions, redraw(len(positions)))
        else:
            take_back(buffer, draw.ids)
            set_aside(buffer, found)
            draw = redraw(len(draw.ids))
    try:
        return draw, buffer.decode(draw.blobs, draw.ids, draw.schema_json)
    except DecodeError as exc:
        raise DecodeError(
            f"buffer {buffer.name!r}: {ROUNDS + 1} draws in a row held records that do not "
            f"decode (those of the first {ROUNDS} were set aside in "
            f"{buffer.keys.quarantine}); the last: {exc}"
        ) from exc
