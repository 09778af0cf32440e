"""Checkpoints of a step store and its buffers (Reverb's ``client.checkpoint()``): one
directory holding the store's chunks and table descriptions (``steps.msgpack``) and a
save file of each buffer (:meth:`ReplayBuffer.save <redisbuf.buffers.replay.ReplayBuffer.save>`),
with a ``DONE`` file written last; a directory without it is not a checkpoint.

A load restores the chunks, then each buffer (whose items get new ids, in their order),
then rebuilds the chunks' references from the restored items themselves, so the ids
need not be the saved ones.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack

from ..errors import DecodeError
from ..sampling import limiters
from .replay import ReplayBuffer
from .step_records import decode_item
from .steps import StepStore

_FORMAT = "redisbuf-steps"
_VERSION = 1
_SLICE = 1000


def save(store: StepStore, buffers: dict[str, ReplayBuffer], root: str | Path,
         keep_latest: int = 1) -> str:
    """Write a checkpoint of ``store`` and ``buffers`` in a new directory under ``root``
    (named by the UTC time), keep the newest ``keep_latest``; returns its path."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + f"{time.time() % 1:.6f}"[1:]
    directory = root / stamp
    directory.mkdir()
    client, keys = store.client, store.keys
    chunks: list[tuple[bytes, bytes]] = []
    for start in range(0, int(client.zcard(keys.order)), _SLICE):
        names = client.zrange(keys.order, start, start + _SLICE - 1)
        blobs = client.hmget(keys.chunks, names) if names else []
        chunks.extend((n, b) for n, b in zip(names, blobs, strict=True) if b is not None)
    counters = {}
    for name, buffer in buffers.items():
        inserts, samples = limiters.counts(buffer.view)
        counters[name] = {"episodes": store.episodes_inserted(name),
                          "rl_inserts": inserts, "rl_samples": samples}
        buffer.save(directory / f"{name}.rbsave")
    header = {"format": _FORMAT, "version": _VERSION, "store": store.name,
              "descriptions": store.descriptions(), "counters": counters,
              "chunks": chunks}
    (directory / "steps.msgpack").write_bytes(msgpack.packb(header, use_bin_type=True))
    (directory / "DONE").write_text("")
    done = sorted(p for p in root.iterdir() if (p / "DONE").exists())
    for old in done[: max(0, len(done) - keep_latest)]:
        shutil.rmtree(old, ignore_errors=True)
    return str(directory.resolve())


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or None."""
    root = Path(root)
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if (p / "DONE").exists())
    return done[-1] if done else None


def load(store: StepStore, directory: str | Path,
         open_buffer: Callable[[str, dict[str, Any]], ReplayBuffer]) -> dict[str, ReplayBuffer]:
    """Restore the checkpoint in ``directory`` into ``store``: its chunks, then each
    table's buffer as ``open_buffer(name, description)`` makes it, loaded from its save
    file; then the references. Returns the buffers by name.

    Raises:
        DecodeError: the directory holds no complete checkpoint of a step store.
    """
    directory = Path(directory)
    try:
        header = msgpack.unpackb((directory / "steps.msgpack").read_bytes(), raw=False)
    except (OSError, ValueError, msgpack.UnpackException) as exc:
        raise DecodeError(f"{directory} holds no step store checkpoint: {exc}") from exc
    if header.get("format") != _FORMAT or not (directory / "DONE").exists():
        raise DecodeError(f"{directory} holds no complete step store checkpoint")
    client, keys = store.client, store.keys
    store.drop()
    chunks = header["chunks"]
    for start in range(0, len(chunks), _SLICE):
        part = chunks[start : start + _SLICE]
        pipe = client.pipeline(transaction=False)
        pipe.hset(keys.chunks, mapping=dict(part))
        seq = client.hincrby(keys.meta, "seq", len(part)) - len(part)
        pipe.zadd(keys.order, {name: seq + i + 1 for i, (name, _) in enumerate(part)})
        pipe.execute()
    buffers = {}
    for name, description in header["descriptions"].items():
        store.describe(name, description)
        buffer = open_buffer(name, description)
        path = directory / f"{name}.rbsave"
        if path.exists():
            buffer.load(path)
        counters = header["counters"].get(name, {})
        limiters.set_counts(buffer.view, counters.get("rl_inserts", 0),
                            counters.get("rl_samples", 0))
        if counters.get("episodes"):
            client.hset(keys.meta, f"episodes:{name}", counters["episodes"])
        buffers[name] = buffer
    rebuild_refs(store, buffers)
    return buffers


def rebuild_refs(store: StepStore, buffers: dict[str, ReplayBuffer]) -> None:
    """Register ``buffers`` in the store and write every chunk's references anew from
    the buffers' items."""
    client, keys = store.client, store.keys
    client.unlink(keys.refs)
    words: dict[str, list[str]] = {}
    for index, (name, buffer) in enumerate(sorted(buffers.items()), start=1):
        client.hset(keys.meta, mapping={f"table:{name}": index, f"tname:{index}": name})
        cursor = 0
        while True:
            cursor, found = client.hscan(buffer.keys.items, cursor, count=_SLICE)
            for item, blob in found.items():
                for chunk in decode_item(blob).chunks:
                    words.setdefault(chunk, []).append(f"{index}:{item.decode()}")
            if cursor == 0:
                break
    client.hset(keys.meta, "tables", len(buffers))
    names = list(words)
    for start in range(0, len(names), _SLICE):
        client.hset(keys.refs, mapping={n: " ".join(words[n]) for n in names[start:start + _SLICE]})
    store.forget_registry()


__all__ = ["latest", "load", "rebuild_refs", "save"]
