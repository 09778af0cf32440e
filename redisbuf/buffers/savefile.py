"""The save format of :meth:`ReplayBuffer.save` / ``state_dict`` (and a sharded
buffer's): writing a save file whole or not at all, reading and checking one (header,
records, trailer) before anything is written to Redis, and the plain-data form of
``state_dict``. See redisbuf/buffers/checkpoint.py for the format itself."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import msgpack

from ..errors import DecodeError
from ..store.containers import KINDS, schema_to_json

#: Version of the save format (``save`` / ``state_dict``). 1: records ``[id, log_reward,
#: blob]``; 2: ``[id, log_reward, blob, per_priority, uses]`` and the header's ``per``.
SAVE_FORMAT_VERSION = 2
FILE_MAGIC = "redisbuf"
#: items a save reads from Redis per command, and between two calls of ``progress``
_READ_CHUNK = 1000
#: ``progress(done, total)`` of :meth:`ReplayBuffer.save` and :meth:`ReplayBuffer.load`.
Progress = Callable[[int, int], None]

# The counters a save header keeps, for the whole buffer and for each shard.
_COUNTERS = ("inserted", "evicted", "sampled")
_MAX_COUNTER = 2**53  # exact in Lua's doubles


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:  # not every platform opens directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _write_save(
    path: str | Path,
    stream: Iterator[Any],
    progress: Progress | None = None,
    total: int = 0,
) -> int:
    """Write a save file (see :meth:`ReplayBuffer.save`) from ``stream``: its first
    element the header map, then the records (lists or tuples); append the trailer
    ``{"end": count}``. The file is written beside ``path`` under a temporary name,
    fsynced, and renamed over ``path`` only when complete (a failure, or a crash, leaves
    the previous file as it was). ``progress(done, total)``, when given, is called after
    every 1,000 records and once at the end. Returns the number of records."""
    path = Path(path)
    handle = tempfile.NamedTemporaryFile(
        "wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp", delete=False
    )
    count = 0
    try:
        with handle:
            packer = msgpack.Packer(use_bin_type=True)
            handle.write(packer.pack(next(stream)))
            for record in stream:
                handle.write(packer.pack(list(record)))
                count += 1
                if progress is not None and count % _READ_CHUNK == 0:
                    progress(count, total)
            handle.write(packer.pack({"end": count}))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)  # the rename itself survives a crash
    if progress is not None:
        progress(count, max(total, count))
    return count


def _read_header(unpacker: msgpack.Unpacker, path: str | Path) -> dict[str, Any]:
    """The first object of a save file's stream, checked as its header; DecodeError for
    an empty file or one that is not a redisbuf file."""
    try:
        header = next(unpacker)
    except StopIteration:
        raise DecodeError(f"{path}: empty file") from None
    except Exception as exc:
        raise DecodeError(f"{path}: not a redisbuf file ({exc})") from exc
    _check_header(header)
    return header


def _read_save(path: str | Path) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The checked header and the records of the save file at ``path``, each record
    ``(id, log_reward, blob, per_priority, uses)`` (a format-1 record gets None and 0);
    DecodeError for an empty, corrupt or truncated file, a malformed record or data
    after the trailer. The records' values are checked by the restore."""
    with open(path, "rb") as handle:
        unpacker = msgpack.Unpacker(handle, raw=False, max_buffer_size=2**31 - 1)
        header = _read_header(unpacker, path)
        width = 3 if header["version"] == 1 else 5
        records: list[tuple[Any, ...]] = []
        trailer = None
        try:
            for entry in unpacker:
                if isinstance(entry, dict):
                    trailer = entry
                    break
                if not isinstance(entry, list) or len(entry) != width:
                    raise DecodeError(f"{path}: malformed record {entry!r:.80}")
                if not isinstance(entry[2], bytes):
                    raise DecodeError(f"{path}: record {entry[0]!r} has no blob")
                # format 1 kept no PER priority nor use count
                records.append(tuple(entry) if width == 5 else (*entry, None, 0))
            extra = next(unpacker, None)
        except DecodeError:
            raise
        except Exception as exc:
            raise DecodeError(f"{path}: corrupt record stream ({exc})") from exc
    if trailer is None or trailer.get("end") != len(records):
        raise DecodeError(
            f"{path}: truncated file: {len(records)} records read, "
            f"trailer {'missing' if trailer is None else trailer}"
        )
    if extra is not None:
        raise DecodeError(f"{path}: data after the trailer")
    return header, records


def _state_of(header: dict[str, Any], records: Iterable[tuple[Any, ...]]) -> dict[str, Any]:
    """A state as :meth:`ReplayBuffer.state_dict` returns it: ``header`` and the columns
    of ``records`` ``(id, log_reward, blob, per_priority, uses)``; see _state_records for
    the way back."""
    records = list(records)
    return {
        **header,
        "ids": [r[0] for r in records],
        "priorities": [r[1] for r in records],
        "blobs": [r[2] for r in records],
        "per_priorities": [r[3] for r in records],
        "uses": [r[4] for r in records],
    }


def _state_records(state: dict[str, Any]) -> list[tuple[Any, ...]]:
    """The records ``(id, log_reward, blob, per_priority, uses)`` of a state from
    :meth:`ReplayBuffer.state_dict`, its header checked; a version-1 state (no
    ``per_priorities`` / ``uses``) gets None and 0, as a version-1 file."""
    _check_header(state)
    columns = ["ids", "priorities", "blobs"]
    if state["version"] >= 2:
        columns += ["per_priorities", "uses"]
    lists: list[Any] = [state.get(column) for column in columns]
    for column, values in zip(columns, lists, strict=True):
        if not isinstance(values, list):
            raise DecodeError(f"saved state's {column!r} is not a list")
        if len(values) != len(lists[0]):
            raise DecodeError(
                f"saved state has {len(values)} {column!r} for {len(lists[0])} ids"
            )
    if len(lists) == 3:
        lists += [[None] * len(lists[0]), [0] * len(lists[0])]
    return list(zip(*lists, strict=True))


def _saved_schema(schema_json: Any) -> dict[str, Any]:
    """The schema of a saved header, or DecodeError when it is not one redisbuf writes."""
    try:
        schema = json.loads(schema_json) if isinstance(schema_json, str) else None
    except ValueError:
        schema = None
    if (
        not isinstance(schema, dict)
        or schema.get("kind") not in KINDS
        or not isinstance(schema.get("fields"), dict)
        or schema_to_json(schema) != schema_json
    ):
        raise DecodeError(f"saved schema {schema_json!r:.80} is not a redisbuf schema")
    return schema


def _saved_counters(header: dict[str, Any], length: int) -> tuple[int, int]:
    """(inserted, sampled) of a saved header, checked: integers in [0, 2**53] (a file's
    ``evicted`` is checked too but not used: the restore derives it from the length)."""
    counters = header.get("counters", {})
    if not isinstance(counters, dict):
        raise DecodeError(f"saved counters {counters!r:.80} are not a map")
    values = {}
    for name in ("inserted", "evicted", "sampled"):
        value = counters.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, int) or not (
            0 <= value <= _MAX_COUNTER
        ):
            raise DecodeError(
                f"saved counter {name}={value!r:.40} is not an integer in [0, 2**53]"
            )
        values[name] = value
    return max(values["inserted"], length), values["sampled"]


def _check_header(header: Any) -> None:
    """Refuse a header that is not redisbuf's, of a newer save format, or (format 2) whose
    ``per`` is neither None nor the PER settings (finite numbers >= 0)."""
    if not isinstance(header, dict) or header.get("format") != FILE_MAGIC:
        raise DecodeError("not a redisbuf save (missing format marker)")
    version = header.get("version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise DecodeError(f"saved with format version {version!r:.40}, not one redisbuf writes")
    if version > SAVE_FORMAT_VERSION:
        raise DecodeError(
            f"saved with format version {version}, newer than this redisbuf reads "
            f"({SAVE_FORMAT_VERSION}); upgrade redisbuf"
        )
    if version == 1:
        if header.get("per") is not None:
            raise DecodeError("a format 1 save has no PER settings, this header has some")
        return
    per = header.get("per")
    if per is None:
        return
    if not isinstance(per, dict) or set(per) != {"alpha", "eps", "initial_priority"}:
        raise DecodeError(
            f"saved PER settings {per!r:.80} are not a map of alpha, eps, initial_priority"
        )
    for name, value in per.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            0 <= value < math.inf
        ):
            raise DecodeError(f"saved PER setting {name}={value!r:.40} is not a finite number >= 0")


def saved_shard_count(header: dict[str, Any]) -> int | None:
    """The shard count a save header (or state) records, None for a plain buffer's;
    DecodeError when its ``shards`` is not one :meth:`ShardedReplayBuffer.save` writes
    (a count >= 1 and that many capacities and counter maps, each counter an integer
    in [0, 2**53])."""
    layout = header.get("shards")
    if layout is None:
        return None
    count = layout.get("count") if isinstance(layout, dict) else None
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise DecodeError(f"saved shard layout {layout!r:.80} has no valid shard count")
    capacities, counters = layout.get("capacities"), layout.get("counters")
    if (
        not isinstance(capacities, list)
        or not isinstance(counters, list)
        or len(capacities) != count
        or len(counters) != count
    ):
        raise DecodeError(
            f"saved shard layout {layout!r:.80} does not have {count} capacities and counters"
        )
    for shard_counters in counters:
        _saved_counters({"counters": shard_counters}, 0)
    return count
