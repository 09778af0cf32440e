"""A buffer's snapshot of the scores its prioritized samplers draw by (``rb:{name}:snap``):
written by a following replica (:meth:`~redisbuf.sampling.replica.MassReplica.write_snapshot`)
or by a load, read by a new replica instead of every item, and under PER the priorities'
only copy besides the mass log after it (the log is trimmed only behind it). Read on the
server too (lua/_snapshot.lua: ``rb_priority``, ``rb_sample_per``).

Layout (format 2), a hash, every field but ``header`` led by the snapshot's 8-byte token:
``header`` (JSON: format, token, epoch, version, stamp, rule, count, chunks, page, total),
``f`` (each page's first id, little-endian int64), under PER ``w`` (each page's total and
largest mass, little-endian float64), and per page ``k`` of ``page`` items in id order:
``i<k>`` (its ids as runs of consecutive ids, start and length, little-endian int64: one
run for a FIFO buffer's dense ids) and ``s<k>`` (its scores, little-endian float64): about
8 bytes an item. Format 1 (earlier versions: chunks ``c<k>`` of ids and scores) is read
too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from .base import BufferView

# Fields one HSET / HMGET carries (a few MiB at most)
_FIELDS_PER_CALL = 512


def fields(token: bytes, ids: np.ndarray, scores: np.ndarray, masses: np.ndarray | None,
           page: int) -> list[tuple[str, bytes]]:
    """The fields (but ``header``) of a snapshot of ``ids`` (ascending) with their
    ``scores`` and, under PER, their ``masses``, in pages of ``page`` items."""
    pages = -(-len(ids) // page)
    starts = np.arange(pages) * page
    out = [("f", token + ids[starts].astype("<i8").tobytes())]
    if masses is not None:
        totals = np.add.reduceat(masses, starts) if pages else np.empty(0)
        largest = np.maximum.reduceat(masses, starts) if pages else np.empty(0)
        out.append(("w", token + np.column_stack([totals, largest]).astype("<f8").tobytes()))
    for k, start in enumerate(starts.tolist()):
        part = ids[start : start + page]
        breaks = np.flatnonzero(np.diff(part) != 1) + 1
        runs = np.column_stack([part[np.r_[0, breaks]], np.diff(np.r_[0, breaks, len(part)])])
        out.append((f"i{k}", token + runs.astype("<i8").tobytes()))
        out.append((f"s{k}", token + scores[start : start + page].astype("<f8").tobytes()))
    return out


def arrays(values: Sequence[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of a snapshot's page fields ``i0, s0, i1, s1, ...`` (tokens first)."""
    id_parts, score_parts = [], []
    for runs_field, scores_field in zip(values[0::2], values[1::2], strict=True):
        runs = np.frombuffer(runs_field, dtype="<i8", offset=8).reshape(-1, 2)
        lengths = runs[:, 1]
        offsets = np.repeat(np.cumsum(lengths) - lengths, lengths)
        id_parts.append(np.repeat(runs[:, 0], lengths) + np.arange(int(lengths.sum())) - offsets)
        score_parts.append(np.frombuffer(scores_field, dtype="<f8", offset=8))
    if not id_parts:
        return np.empty(0, np.int64), np.empty(0)
    return np.concatenate(id_parts), np.concatenate(score_parts)


def stage(client: Any, key: str, ids: np.ndarray, scores: np.ndarray,
          masses: np.ndarray | None, page: int, **header: Any) -> dict[str, Any]:
    """Write a snapshot's fields under ``key`` (a staging key) with a new token, in a few
    pipelined HSETs; returns its header (``header``'s items plus format, token, count,
    chunks and page), which the caller writes when it swaps the snapshot in."""
    token = os.urandom(8)
    pipe = client.pipeline(transaction=False)
    written = fields(token, ids, scores, masses, page)
    for start in range(0, len(written), _FIELDS_PER_CALL):
        pipe.hset(key, mapping=dict(written[start : start + _FIELDS_PER_CALL]))
    pipe.expire(key, 600)  # gone if the writer dies before the swap
    pipe.execute()
    return {"format": 2, "token": token.hex(), "count": len(ids), "chunks": -(-len(ids) // page),
            "page": page, **header}


def publish(buffer: BufferView, ids: np.ndarray, scores: np.ndarray,
            masses: np.ndarray | None, header: dict[str, Any], page: int,
            log_truth: bool = False) -> bool:
    """Write a replica's snapshot (``header``: its epoch, version, stamp, rule, total)
    under a staging key and swap it in with lua/snapshot_commit.lua when it is newer than
    the one there (which also unlinks an earlier layout's per hash when ``log_truth``: a
    replay buffer's PER). Whether it was published; redis-py's errors of a server
    refusing writes propagate."""
    keys = buffer.keys
    token_key = keys.snap_staging(os.urandom(8).hex())
    full = stage(buffer.client, token_key, ids, scores, masses, page, **header)
    commit_keys = [keys.meta, token_key, keys.snap, *([keys.per] if log_truth else [])]
    return bool(int(buffer.run("snapshot_commit", commit_keys,
                               [json.dumps(full), header["epoch"], header["version"]])))


def read(buffer: BufferView, header: dict[str, Any]) -> tuple[np.ndarray, np.ndarray] | None:
    """(ids, scores) of the snapshot whose ``header`` was read; None when a field is
    missing or of another snapshot (replaced meanwhile: read it again)."""
    chunks = int(header["chunks"])
    token = bytes.fromhex(header["token"])
    two = int(header.get("format", 1)) >= 2
    names = ([f"{kind}{k}" for k in range(chunks) for kind in ("i", "s")] if two
             else [f"c{k}" for k in range(chunks)])
    pipe = buffer.client.pipeline(transaction=False)
    for start in range(0, len(names), _FIELDS_PER_CALL):
        pipe.hmget(buffer.keys.snap, names[start : start + _FIELDS_PER_CALL])
    values = [v for part in pipe.execute() for v in part]
    if any(v is None or v[:8] != token for v in values):
        return None
    if two:
        return arrays(values)
    id_parts, score_parts = [], []
    for chunk in values:  # format 1: the ids, then the scores
        k = (len(chunk) - 8) // 16
        id_parts.append(np.frombuffer(chunk, dtype="<i8", count=k, offset=8))
        score_parts.append(np.frombuffer(chunk, dtype="<f8", count=k, offset=8 + 8 * k))
    if not id_parts:
        return np.empty(0, np.int64), np.empty(0)
    return np.concatenate(id_parts), np.concatenate(score_parts)


__all__ = ["arrays", "fields", "publish", "read", "stage"]
