"""``redisbuf list``: every buffer in a Redis database, of every buffer class (a name may
appear once per class; length and capacity in the class's unit)."""

from __future__ import annotations

import argparse
import time
from typing import Any

from rich.console import Console
from rich.table import Table

from ..ops.metrics import every_buffer, snapshot
from ..store.connection import redacted
from ._common import add_json_argument, add_url_argument, connect_args, emit, format_bytes, safe


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "list",
        help="every buffer in a Redis database: class, kind, length / capacity, memory, "
        "last insert",
        description="List every buffer of every class (ReplayBuffer, SequenceBuffer, "
        "EpisodeBuffer, FragmentBuffer; SCAN over the meta keys) with its kind, length, "
        "capacity (in the class's unit), memory and the time of its last insert.",
    )
    add_url_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client, url = connect_args(args, "redisbuf list")
    try:
        rows = []
        for name, buffer_class in every_buffer(client):
            snap = snapshot(client, name, buffer_class=buffer_class)
            if snap is None:  # a meta hash without configuration (dropped while we read)
                continue
            rows.append(
                {
                    "name": name,
                    "buffer_class": buffer_class,
                    "unit": snap.unit,
                    "kind": snap.kind,
                    "length": snap.length,
                    "capacity": snap.capacity,
                    "memory_bytes": snap.memory_bytes,
                    "last_insert": snap.last_insert,
                }
            )
    finally:
        client.close()
    return emit(args, {"url": redacted(url), "buffers": rows}, lambda out: _render(out, url, rows))


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "never"
    ago = max(0.0, time.time() - timestamp)
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(timestamp))
    if ago < 120:
        return f"{stamp} ({ago:.0f} s ago)"
    if ago < 7200:
        return f"{stamp} ({ago / 60:.0f} min ago)"
    return stamp


def _render(out: Console, url: str, rows: list[dict[str, Any]]) -> None:
    if not rows:
        out.print(f"No buffers at {safe(redacted(url))}.")
        return
    table = Table(title=f"{len(rows)} buffer(s) at {safe(redacted(url))}", title_justify="left")
    for column in ("name", "class", "kind", "length / capacity", "memory", "last insert"):
        table.add_column(column, justify="right" if column not in ("name", "class") else "left")
    for row in rows:
        table.add_row(
            safe(row["name"]),
            row["buffer_class"],
            safe(row["kind"] or "-"),
            f"{row['length']} / {row['capacity']}"
            + ("" if row["unit"] == "items" else f" {row['unit']}"),
            format_bytes(row["memory_bytes"]),
            _when(row["last_insert"]),
        )
    out.print(table)
