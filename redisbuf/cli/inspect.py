"""``redisbuf inspect NAME``: a buffer's configuration, counters, schema, top items, keys.

Everything read from the server (field names, dtypes, kinds, summaries) is printed
literally: it goes through :func:`safe`, never through rich markup.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..connection import redacted
from ._common import (
    add_json_argument,
    add_url_argument,
    connect_args,
    emit,
    format_bytes,
    log_reward_text,
    open_buffer,
    safe,
)

if TYPE_CHECKING:
    from ..buffer import ReplayBuffer


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show what a buffer holds: configuration, counters, top items, keys",
        description="Show a buffer's capacity, length, counters, schema, top items and keys.",
    )
    parser.add_argument("name", help="buffer name")
    add_url_argument(parser)
    parser.add_argument(
        "--top", type=int, default=10, help="items of highest log-reward to show (default: 10)"
    )
    add_json_argument(parser)
    parser.set_defaults(func=run)


def _short(value: Any, limit: int = 48) -> str:
    """A compact one-line rendering of an array, tensor or scalar."""
    data = value.tolist() if hasattr(value, "tolist") else value
    text = f"{data:.4g}" if isinstance(data, float) else str(data).replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 3] + "..."


def item_summaries(buffer: ReplayBuffer, ids: Sequence[int]) -> list[str]:
    """One short line per item saying what it is (e.g. a trajectory's terminal state)."""
    if not ids:
        return []
    batch = buffer.get(list(ids))
    kind = buffer.kind
    if kind == "trajectories":
        terminal = batch.terminating_states
        lengths = batch.terminating_idx
        return [
            f"terminal state {_short(terminal[i])}, {int(lengths[i])} actions"
            for i in range(len(ids))
        ]
    if kind == "states":
        return [f"state {_short(batch.states[i])}" for i in range(len(ids))]
    if kind == "transitions":
        return [
            f"{_short(batch.states[i], 24)} -> {_short(batch.next_states[i], 24)}"
            for i in range(len(ids))
        ]
    fields = [name for name in sorted(batch) if name != "log_rewards"]
    return [
        ", ".join(f"{name}={_short(batch[name][i], 24)}" for name in fields)[:96]
        for i in range(len(ids))
    ]


def top_items(buffer: ReplayBuffer, k: int) -> list[dict[str, Any]]:
    """The ``k`` items of highest log-reward: id, log-reward and a one-line summary."""
    top = buffer.top(k) if k > 0 else []
    summaries = item_summaries(buffer, [item_id for item_id, _ in top])
    return [
        {"id": item_id, "log_reward": score, "summary": summary}
        for (item_id, score), summary in zip(top, summaries, strict=True)
    ]


def redis_cli_lines(url: str, buffer: ReplayBuffer) -> list[str]:
    keys = buffer.keys
    base = f"redis-cli -u {redacted(url)}"
    return [
        f"{base} HGETALL '{keys.meta}'",
        f"{base} ZREVRANGE '{keys.prio}' 0 9 WITHSCORES",
        f"{base} ZCARD '{keys.order}'",
    ]


def _key_presence(buffer: ReplayBuffer) -> dict[str, bool]:
    pipe = buffer.client.pipeline(transaction=False)
    names = list(buffer.keys.describe())
    for key in names:
        pipe.exists(key)
    return {key: bool(found) for key, found in zip(names, pipe.execute(), strict=True)}


def inspect_report(buffer: ReplayBuffer, top: int) -> dict[str, Any]:
    """Everything ``redisbuf inspect`` shows, as plain JSON-able data."""
    stats = buffer.stats()
    meta = {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in buffer.client.hgetall(buffer.keys.meta).items()
    }
    schema = json.loads(meta["schema"]) if "schema" in meta else None
    present = _key_presence(buffer)
    return {
        "name": buffer.name,
        "capacity": stats["capacity"],
        "length": stats["length"],
        "counters": {k: stats[k] for k in ("inserted", "evicted", "sampled", "last_id")},
        "eviction": stats["eviction"],
        "kind": stats["kind"],
        "schema": schema,
        "prioritized_sampling_ready": stats["prioritized_sampling_ready"],
        "memory_bytes": stats["memory_bytes"],
        "created_at": int(meta["created_at"]) if "created_at" in meta else None,
        "top": [
            {**row, "log_reward": row["log_reward"] if math.isfinite(row["log_reward"]) else "-inf"}
            for row in top_items(buffer, top)
        ],
        "keys": {
            key: {"holds": what, "exists": present[key]}
            for key, what in buffer.keys.describe().items()
        },
    }


def run(args: argparse.Namespace) -> int:
    client, url = connect_args(args, "redisbuf inspect")
    try:
        buffer = open_buffer(client, args.name, url)
        report = inspect_report(buffer, max(args.top, 0))
        lines = redis_cli_lines(url, buffer)
    finally:
        client.close()
    return emit(
        args, {"url": redacted(url), **report}, lambda out: render(out, url, report, lines)
    )


def render(out: Console, url: str, report: dict[str, Any], cli_lines: list[str]) -> None:
    eviction = {
        "fifo": "fifo (oldest first)",
        "reward": "reward (lowest log-reward first, oldest among equals)",
    }.get(report["eviction"], str(report["eviction"]))
    fill = report["length"] / report["capacity"] if report["capacity"] else 0.0
    table = Table(
        title=f"Buffer '{safe(report['name'])}' at {safe(redacted(url))}", title_justify="left"
    )
    table.add_column("", style="bold")
    table.add_column("value")
    table.add_row("capacity", str(report["capacity"]))
    table.add_row("length", f"{report['length']} ({fill:.0%} full)")
    for name, value in report["counters"].items():
        table.add_row(name, str(value))
    table.add_row("eviction", safe(eviction))
    table.add_row("kind", safe(report["kind"] or "not fixed yet (no add so far)"))
    table.add_row(
        "prioritized sampling", "sum tree built" if report["prioritized_sampling_ready"] else "off"
    )
    table.add_row("memory in Redis", format_bytes(report["memory_bytes"]))
    if report["created_at"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_at"]))
        table.add_row("created", created)
    out.print(table)

    schema = report["schema"]
    if isinstance(schema, dict):
        fields = Table(title=f"Schema ({safe(schema.get('kind'))})", title_justify="left")
        for column in ("field", "dtype", "shape", "library"):
            fields.add_column(column)
        for name, spec in (schema.get("fields") or {}).items():
            spec = spec if isinstance(spec, dict) else {}
            fields.add_row(
                safe(name),
                safe(spec.get("dtype")),
                safe(tuple(spec.get("shape") or ())),
                safe(spec.get("lib")),
            )
        out.print(fields)

    if report["top"]:
        best = Table(title=f"Top {len(report['top'])} by log-reward", title_justify="left")
        best.add_column("id", justify="right")
        best.add_column("log-reward", justify="right")
        best.add_column("item")
        for row in report["top"]:
            value = row["log_reward"]
            text = value if isinstance(value, str) else log_reward_text(value)
            best.add_row(str(row["id"]), text, safe(row["summary"]))
        out.print(best)

    keys = Table(title="Redis keys", title_justify="left")
    for column in ("key", "exists", "holds"):
        keys.add_column(column)
    for key, info in report["keys"].items():
        keys.add_row(safe(key), "yes" if info["exists"] else "no", safe(info["holds"]))
    out.print(keys)
    out.print("Look with redis-cli:")
    for line in cli_lines:
        out.print(f"  {safe(line)}", soft_wrap=True)
