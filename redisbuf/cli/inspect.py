"""``redisbuf inspect NAME``: a buffer's configuration, counters, schema, top items, keys.

Every buffer class (``redisbuf.ops.metrics.LAYOUTS``) is shown; ``--class`` picks one when a
name holds several. Sequence, episode and fragment buffers have no log-rewards, so no top
items; their length, capacity and counters are in their unit (steps, episodes, chunks).

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

from ..ops.metrics import LAYOUTS, class_keys, snapshot
from ..store.connection import redacted
from ._common import (
    CommandError,
    add_class_argument,
    add_json_argument,
    add_url_argument,
    connect_args,
    emit,
    format_bytes,
    log_reward_text,
    open_buffer,
    resolve_class,
    safe,
)

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show what a buffer of any class holds: configuration, counters, top items, keys",
        description="Show a buffer's capacity, length, counters, schema, top items and keys; "
        "for a sequence, episode or fragment buffer its configuration, length, capacity "
        "and counters in its unit (steps, episodes, chunks), memory and keys.",
    )
    parser.add_argument("name", help="buffer name")
    add_url_argument(parser)
    parser.add_argument(
        "--top", type=int, default=10,
        help="items of highest log-reward to show (default: 10; ReplayBuffers only)",
    )
    parser.add_argument(
        "--priority", type=int, nargs="+", metavar="ID", default=[],
        help="show these items' current PER priorities (read on the server, as FCALL_RO "
        "rb_priority does; ReplayBuffers with PER only)",
    )
    add_class_argument(parser)
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
    if k <= 0:
        return []
    for _attempt in range(5):
        top = buffer.top(k)
        try:
            summaries = item_summaries(buffer, [item_id for item_id, _ in top])
            break
        except KeyError:  # evicted between the two reads by a concurrent add: read again
            continue
    else:
        return []
    return [
        {"id": item_id, "log_reward": score, "summary": summary}
        for (item_id, score), summary in zip(top, summaries, strict=True)
    ]


def redis_cli_lines(url: str, buffer: ReplayBuffer) -> list[str]:
    keys = buffer.keys
    base = f"redis-cli -u {redacted(url)}"
    lines = [
        f"{base} HGETALL '{keys.meta}'",
        f"{base} ZREVRANGE '{keys.prio}' 0 9 WITHSCORES",
        f"{base} ZCARD '{keys.order}'",
    ]
    if buffer.client.hget(keys.meta, "mass") in (b"per", "per"):  # item 1's PER priority
        reader = " ".join(f"'{k}'" for k in (keys.meta, keys.order, keys.masslog, keys.snap,
                                             keys.per_heap, keys.per))
        lines.append(f"{base} FCALL_RO rb_priority 6 {reader} 1")
    return lines


def _key_presence(buffer: ReplayBuffer) -> dict[str, bool]:
    pipe = buffer.client.pipeline(transaction=False)
    names = list(buffer.keys.describe())
    for key in names:
        pipe.exists(key)
    return {key: bool(found) for key, found in zip(names, pipe.execute(), strict=True)}


def priority_rows(buffer: ReplayBuffer, ids: Sequence[int]) -> list[dict[str, Any]]:
    """Each id's current PER priority (None: not stored), read on the server
    (:meth:`~redisbuf.buffers.replay.ReplayBuffer.priorities`)."""
    if not ids:
        return []
    if buffer.client.hget(buffer.keys.meta, "mass") not in (b"per", "per"):
        raise CommandError(f"buffer {buffer.name!r} has no PER priorities (no PERSampler)")
    values = buffer.priorities(list(ids)).tolist()
    return [{"id": int(i), "priority": None if math.isnan(v) else v}
            for i, v in zip(ids, values, strict=True)]


def inspect_report(buffer: ReplayBuffer, top: int,
                   priorities: Sequence[int] = ()) -> dict[str, Any]:
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
        "buffer_class": "buffer",
        "unit": "items",
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
        "priorities": priority_rows(buffer, priorities),
        "keys": {
            key: {"holds": what, "exists": present[key]}
            for key, what in buffer.keys.describe().items()
        },
    }


# Meta fields of each other class shown beside the three LAYOUTS counters: its
# configuration (shown as the constructor argument -> meta field), then counters and
# state (in the order shown; absent ones are skipped).
_CONFIG_FIELDS = {
    "sequence": {"num_environments": "num_environments", "max_length": "max_length"},
    "episodes": {"capacity_episodes": "capacity"},
    "fragments": {f: f for f in (
        "max_chunks", "fragments_per_chunk", "max_staleness", "max_reuse")},
}
_EXTRA_FIELDS = {
    "sequence": (),
    "episodes": ("steps", "last_id"),
    "fragments": (
        "fragments_added", "fragments_discarded", "chunks_discarded", "chunks_used_up",
        "version", "session",
    ),
}


def _number(value: str) -> Any:
    try:
        return int(value)
    except ValueError:
        return value


def class_report(client: Any, name: str, buffer_class: str) -> dict[str, Any]:
    """What ``redisbuf inspect`` shows of a sequence, episode or fragment buffer, as
    plain JSON-able data: length, capacity and the counters ``inserted``, ``evicted``,
    ``sampled`` in the class's unit (the meta fields :data:`LAYOUTS` names, given in
    ``counter_fields``), its other counters and state, configuration, memory, keys."""
    layout = LAYOUTS[buffer_class]
    snap = snapshot(client, name, buffer_class=buffer_class)
    if snap is None:
        raise CommandError(f"{buffer_class} buffer {name!r} has no configuration in its meta")
    keys = class_keys(buffer_class, name)
    meta = {
        k.decode(errors="replace"): v.decode(errors="replace")
        for k, v in client.hgetall(keys.meta).items()
    }
    configuration = {
        option: _number(meta[field])
        for option, field in _CONFIG_FIELDS[buffer_class].items()
        if field in meta
    }
    if buffer_class == "sequence" and "config" in meta:
        # every other option it was created with (stored for the mismatch check)
        for option, value in json.loads(meta["config"]).items():
            configuration.setdefault(option, value)
    schema: Any = meta.get("schema")
    if schema is not None and schema.startswith("{"):
        schema = json.loads(schema)
    holds = keys.describe()
    pipe = client.pipeline(transaction=False)
    for key in holds:
        pipe.exists(key)
    present = pipe.execute()
    return {
        "name": name,
        "buffer_class": buffer_class,
        "unit": layout.unit,
        "capacity": snap.capacity,
        "length": snap.length,
        "configuration": configuration,
        "counters": {
            "inserted": snap.inserted,
            "evicted": snap.evicted,
            "sampled": snap.sampled,
            **{f: _number(meta[f]) for f in _EXTRA_FIELDS[buffer_class] if f in meta},
        },
        "counter_fields": {
            "inserted": layout.inserted, "evicted": layout.evicted, "sampled": layout.sampled
        },
        "eviction": "fifo",
        "schema": schema,
        "memory_bytes": snap.memory_bytes,
        "created_at": int(meta["created_at"]) if "created_at" in meta else None,
        "keys": {
            key: {"holds": what, "exists": bool(found)}
            for (key, what), found in zip(holds.items(), present, strict=True)
        },
    }


def run(args: argparse.Namespace) -> int:
    client, url = connect_args(args, "redisbuf inspect")
    try:
        buffer_class = resolve_class(client, args.name, url, args.buffer_class)
        if buffer_class == "buffer":
            buffer = open_buffer(client, args.name, url)
            report = inspect_report(buffer, max(args.top, 0), args.priority)
            lines = redis_cli_lines(url, buffer)
        else:
            report = class_report(client, args.name, buffer_class)
            meta = class_keys(buffer_class, args.name).meta
            lines = [f"redis-cli -u {redacted(url)} HGETALL '{meta}'"]
    finally:
        client.close()
    show = render if buffer_class == "buffer" else render_class
    return emit(args, {"url": redacted(url), **report}, lambda out: show(out, url, report, lines))


def _schema_table(schema: Any, title: str) -> Table | None:
    """A field / dtype / shape / library table of a schema ``{field: spec}``."""
    if not isinstance(schema, dict) or not schema:
        return None
    fields = Table(title=title, title_justify="left")
    for column in ("field", "dtype", "shape", "library"):
        fields.add_column(column)
    for name, spec in schema.items():
        spec = spec if isinstance(spec, dict) else {}
        fields.add_row(
            safe(name),
            safe(spec.get("dtype")),
            safe(tuple(spec.get("shape") or ())),
            safe(spec.get("lib")),
        )
    return fields


def _keys_table(out: Console, report: dict[str, Any], cli_lines: list[str]) -> None:
    keys = Table(title="Redis keys", title_justify="left")
    for column in ("key", "exists", "holds"):
        keys.add_column(column)
    for key, info in report["keys"].items():
        keys.add_row(safe(key), "yes" if info["exists"] else "no", safe(info["holds"]))
    out.print(keys)
    out.print("Look with redis-cli:")
    for line in cli_lines:
        out.print(f"  {safe(line)}", soft_wrap=True)


def render_class(out: Console, url: str, report: dict[str, Any], cli_lines: list[str]) -> None:
    """The text view of :func:`class_report`."""
    unit = report["unit"]
    fill = report["length"] / report["capacity"] if report["capacity"] else 0.0
    table = Table(
        title=f"{report['buffer_class'].capitalize()} buffer '{safe(report['name'])}' at "
        f"{safe(redacted(url))}",
        title_justify="left",
    )
    table.add_column("", style="bold")
    table.add_column("value")
    table.add_row("capacity", f"{report['capacity']} {unit}")
    table.add_row("length", f"{report['length']} {unit} ({fill:.0%} full)")
    for name, value in report["configuration"].items():
        table.add_row(safe(name), safe(json.dumps(value)))
    fields = report["counter_fields"]
    for name, value in report["counters"].items():
        if name in fields:  # the meta field it is read from, where its name differs
            label = name if fields[name] == name else f"{name} ({safe(fields[name])})"
            table.add_row(label, f"{value} {unit}")
        else:
            table.add_row(safe(name), safe(value))
    table.add_row("eviction", f"fifo (oldest {unit} first)")
    table.add_row("memory in Redis", format_bytes(report["memory_bytes"]))
    if report["created_at"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_at"]))
        table.add_row("created", created)
    schema = report["schema"]
    if schema is not None and not isinstance(schema, dict):
        table.add_row("schema", safe(schema))
    out.print(table)
    fields_table = _schema_table(schema, "Schema")
    if fields_table is not None:
        out.print(fields_table)
    _keys_table(out, report, cli_lines)


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
        "prioritized sampling",
        "on (changes logged for samplers' replicas)" if report["prioritized_sampling_ready"]
        else "off",
    )
    table.add_row("memory in Redis", format_bytes(report["memory_bytes"]))
    if report["created_at"]:
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(report["created_at"]))
        table.add_row("created", created)
    out.print(table)

    schema = report["schema"]
    if isinstance(schema, dict):
        fields = _schema_table(schema.get("fields") or {}, f"Schema ({safe(schema.get('kind'))})")
        if fields is not None:
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

    if report["priorities"]:
        rows = Table(title="PER priorities now", title_justify="left")
        rows.add_column("id", justify="right")
        rows.add_column("priority", justify="right")
        for row in report["priorities"]:
            value = row["priority"]
            rows.add_row(str(row["id"]), "not stored" if value is None else repr(value))
        out.print(rows)

    _keys_table(out, report, cli_lines)
