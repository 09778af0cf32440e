"""``redisbuf export NAME FILE`` and ``redisbuf import FILE NAME``: move a buffer between
servers through the save format of :meth:`ReplayBuffer.save` / :meth:`ReplayBuffer.load`.

``import`` checks the file's header (format marker, version) before touching anything,
creates a missing target with the saved capacity and eviction policy (and the saved PER
settings, when the file has PER priorities), and leaves the target as it was when the load
is refused (newer format, a schema that does not fit, too many items, a corrupt file, PER
priorities for a target without PER): a target it created is removed again. Both say what
the file carries per item: log-rewards and use counts, and PER priorities when saved from a
buffer with PER.

A sharded buffer (:class:`ShardedReplayBuffer`) is exported and imported whole, through
:meth:`ShardedReplayBuffer.save` / :meth:`ShardedReplayBuffer.load`; ``import`` creates a
missing target from a sharded file as a sharded buffer of the saved shard count (from a
plain file, a plain buffer). On a sharded target the load is atomic per shard, not across
shards (see the module docstring of :mod:`redisbuf.buffers.sharded`).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ..store.connection import redacted
from ..store.keys import BufferKeys
from ._common import (
    CommandError,
    add_json_argument,
    add_url_argument,
    check_name,
    confirm,
    connect_args,
    emit,
    error_console,
    open_buffer,
    safe,
)


def register(subparsers: Any) -> None:
    export = subparsers.add_parser(
        "export",
        help="write a buffer to a file (the save format), with a progress bar",
        description="Write the buffer NAME to FILE in the save format of ReplayBuffer.save "
        "(header, one record per item oldest first, trailer); a sharded buffer whole, "
        "shard by shard.",
    )
    export.add_argument("name", help="buffer name")
    export.add_argument("file", help="file to write (replaced when complete)")
    add_url_argument(export)
    add_json_argument(export)
    export.set_defaults(func=run_export)

    load = subparsers.add_parser(
        "import",
        help="load a file written by export / ReplayBuffer.save into a buffer",
        description="Load FILE into the buffer NAME, creating it with the saved capacity "
        "and eviction policy (a sharded file: as a sharded buffer of its shard count) "
        "if missing. A newer format, a schema that does not fit the "
        "target or a corrupt file is refused and the target is left unchanged. Replacing "
        "the items of a non-empty buffer asks first (or --yes). Items keep their "
        "log-rewards, use counts and (files saved with PER) PER priorities.",
    )
    load.add_argument("file", help="file written by `redisbuf export` or ReplayBuffer.save")
    load.add_argument("name", help="buffer name")
    add_url_argument(load)
    load.add_argument("--yes", action="store_true", help="replace a non-empty buffer's items")
    load.add_argument(
        "--drop-per-priorities", action="store_true",
        help="load a file with PER priorities into a buffer without PER, leaving them out",
    )
    add_json_argument(load)
    load.set_defaults(func=run_import)


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items"),
        TimeElapsedColumn(),
        console=error_console(),  # stdout stays for --json
        transient=False,
    )


@contextlib.contextmanager
def _progress_bar() -> Iterator[Progress]:
    """The progress bar, shown while the block runs; left out of the output on an error
    (the error line is all there is then)."""
    with _progress() as progress:
        try:
            yield progress
        except BaseException:
            progress.live.transient = True
            raise


def run_export(args: argparse.Namespace) -> int:
    client, url = connect_args(args, "redisbuf export")
    path = Path(args.file)
    if path.is_dir():
        raise CommandError(f"{path} is a directory; give a file name")
    if not path.parent.exists():
        raise CommandError(f"directory {path.parent} does not exist")
    try:
        buffer = _open_whole(client, args.name, url)
        with _progress_bar() as progress:
            task = progress.add_task(f"exporting {safe(args.name)}", total=len(buffer))
            count = buffer.save(
                path, progress=lambda done, total: progress.update(task, completed=done,
                                                                   total=total)
            )
    finally:
        client.close()
    from ..buffers.savefile import saved_shard_count

    header = read_header(path)
    per = header.get("per") is not None
    document = {
        "url": redacted(url), "name": args.name, "file": str(path), "items": count,
        "bytes": path.stat().st_size, "per_priorities": per,
        "shards": saved_shard_count(header),
    }
    return emit(
        args, document,
        lambda out: out.print(
            f"Exported {count} items of buffer {safe(args.name)} to {safe(path)} "
            f"({document['bytes']} bytes; per item: {_kept(per)})."
        ),
    )


def _open_whole(client: Any, name: str, url: str) -> Any:
    """The existing buffer ``name``: a sharded one whole, else as ``open_buffer``."""
    from ..buffers.sharded import ShardedReplayBuffer

    check_name(name)
    keys = BufferKeys(name)
    if not client.exists(keys.meta) and client.exists(keys.shards):
        return ShardedReplayBuffer.open(client, name)
    return open_buffer(client, name, url)


def _kept(per: bool) -> str:
    """What a save file keeps per item, in words."""
    return "log-reward, use count" + (", PER priority" if per else "")


def read_header(path: Path) -> dict[str, Any]:
    """The checked header of a save file (raises DecodeError / CommandError)."""
    from ..buffers.savefile import _read_header
    from ..errors import DecodeError

    if not path.is_file():
        raise CommandError(f"no file {path}")
    with open(path, "rb") as handle:
        unpacker = msgpack.Unpacker(handle, raw=False, max_buffer_size=64 * 2**20)
        header = _read_header(unpacker, path)
    try:
        int(header["capacity"]), str(header["eviction"])
    except (KeyError, TypeError, ValueError):
        raise DecodeError(f"{path}: header has no valid capacity / eviction") from None
    return header


def run_import(args: argparse.Namespace) -> int:
    from ..buffers.replay import ReplayBuffer
    from ..buffers.savefile import saved_shard_count
    from ..buffers.sharded import ShardedReplayBuffer
    from ..sampling.samplers import PERSampler

    path = Path(args.file)
    header = read_header(path)  # a newer format is refused before we connect
    shards = saved_shard_count(header)
    client, url = connect_args(args, "redisbuf import")
    created = False
    try:
        keys = BufferKeys(args.name)
        if client.exists(keys.meta) or client.exists(keys.shards):
            buffer = _open_whole(client, args.name, url)
            if len(buffer):
                confirm(
                    f"Replace the {len(buffer)} items of buffer {args.name!r} at "
                    f"{redacted(url)} with those of {path}?",
                    yes=args.yes,
                    refusal=f"buffer {args.name!r} holds {len(buffer)} items that import "
                    "would replace",
                )
        else:
            per = header.get("per")
            sampler = None if per is None else PERSampler(
                alpha=per["alpha"], eps=per["eps"], initial_priority=per["initial_priority"],
            )
            if shards is not None:
                check_name(args.name)
                buffer = ShardedReplayBuffer(
                    client, args.name, capacity=int(header["capacity"]),
                    prioritized_capacity=header["eviction"] == "reward", shards=shards,
                    sampler=sampler,
                )
            else:
                buffer = ReplayBuffer(
                    client, args.name, capacity=int(header["capacity"]),
                    prioritized_capacity=header["eviction"] == "reward", sampler=sampler,
                )
            created = True
        try:
            with _progress_bar() as progress:
                task = progress.add_task(f"importing {safe(args.name)}", total=None)
                count = buffer.load(
                    path,
                    drop_per_priorities=args.drop_per_priorities,
                    progress=lambda done, total: progress.update(task, completed=done,
                                                                 total=total),
                )
        except BaseException:
            if created:  # plain or sharded, drop() removes every key the buffer made
                buffer.drop()
            raise
        length = len(buffer)
    finally:
        client.close()
    per = header.get("per") is not None and not args.drop_per_priorities
    document = {
        "url": redacted(url), "name": args.name, "file": str(path), "items": count,
        "length": length, "created": created, "per_priorities": per,
        "shards": getattr(buffer, "count", None),
    }
    return emit(
        args, document,
        lambda out: out.print(
            f"Imported {count} items from {safe(path)} into "
            f"{'new ' if created else ''}buffer {safe(args.name)} "
            f"(per item: {_kept(per)})."
        ),
    )


__all__ = ["read_header", "register", "run_export", "run_import"]
