"""The ``redisbuf`` command (also ``python -m redisbuf``).

Subcommands: ``demo`` (several processes sharing one buffer, on an embedded Redis unless
``--url`` / ``$REDISBUF_URL`` is given), ``inspect`` (what a buffer holds), ``worker``
(one demo worker in the foreground, e.g. in a container), and whatever
:func:`redisbuf.control.commands.register` adds (``manager``).

A subcommand registers its handler with ``parser.set_defaults(func=handler)``; the
handler takes the parsed ``argparse.Namespace`` and returns an exit code (``None`` means
0). Errors a user can cause (unreachable server, missing buffer, bad settings) are printed
as one red line on stderr with exit code 1; Ctrl-C exits with 130.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import secrets
import signal
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import redis
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from .connection import URL_ENV, connect, redacted
from .errors import RedisBufError

if TYPE_CHECKING:
    from .buffer import ReplayBuffer
    from .demo import DemoConfig, DemoResult

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM


class CommandError(RedisBufError):
    """A user error found by the command line itself (e.g. no URL given)."""


# -- shared helpers --------------------------------------------------------------------


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """Add the ``--url`` option every subcommand takes (default ``$REDISBUF_URL``)."""
    parser.add_argument(
        "--url",
        default=None,
        help=f"Redis URL, e.g. redis://127.0.0.1:6379/0 (default: ${URL_ENV})",
    )


def resolve_url(args: argparse.Namespace) -> str | None:
    """``--url``, else ``$REDISBUF_URL``, else None."""
    return getattr(args, "url", None) or os.environ.get(URL_ENV) or None


def require_url(args: argparse.Namespace, what: str) -> str:
    url = resolve_url(args)
    if url is None:
        raise CommandError(
            f"{what} needs a Redis server: pass --url redis://HOST:PORT/DB or set ${URL_ENV}"
        )
    return url


def _console() -> Console:
    return Console(highlight=False)


def _error_console() -> Console:
    return Console(stderr=True, highlight=False)


def _format_bytes(count: int | None) -> str:
    if count is None:
        return "unknown"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def _short(value: Any, limit: int = 48) -> str:
    """A compact one-line rendering of an array, tensor or scalar."""
    data = value.tolist() if hasattr(value, "tolist") else value
    if isinstance(data, float):
        text = f"{data:.4g}"
    else:
        text = str(data).replace("\n", " ")
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


def _log_reward_text(value: float) -> str:
    return "-inf" if value == -math.inf else f"{value:.4f}"


def _redis_cli_lines(url: str, buffer: ReplayBuffer) -> list[str]:
    keys = buffer.keys
    base = f"redis-cli -u {redacted(url)}"
    return [
        f"{base} HGETALL '{keys.meta}'",
        f"{base} ZREVRANGE '{keys.prio}' 0 9 WITHSCORES",
        f"{base} ZCARD '{keys.order}'",
    ]


def _keys_table(buffer: ReplayBuffer, present: dict[str, bool]) -> Table:
    table = Table(title="Redis keys", title_justify="left")
    table.add_column("key")
    table.add_column("exists")
    table.add_column("holds")
    for key, what in buffer.keys.describe().items():
        table.add_row(escape(key), "yes" if present.get(key) else "no", what)
    return table


def _key_presence(buffer: ReplayBuffer) -> dict[str, bool]:
    pipe = buffer.client.pipeline(transaction=False)
    names = list(buffer.keys.describe())
    for key in names:
        pipe.exists(key)
    return {key: bool(found) for key, found in zip(names, pipe.execute(), strict=True)}


# -- demo ------------------------------------------------------------------------------


def _add_demo_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="several worker processes add to and sample from one shared buffer",
        description=(
            "Start WORKERS processes that each add BATCHES batches of HyperGrid trajectories "
            "(random policy) to one buffer and sample from it, then print a summary. "
            f"Without --url / ${URL_ENV} it runs on an embedded Redis server that stops "
            "when the demo ends. The buffer NAME is deleted and created afresh."
        ),
    )
    add_url_argument(parser)
    parser.add_argument("--name", default="demo", help="buffer name (default: demo)")
    parser.add_argument("--workers", type=int, default=4, help="worker processes (default: 4)")
    parser.add_argument("--batches", type=int, default=50, help="batches per worker (default: 50)")
    parser.add_argument(
        "--batch-size", type=int, default=64, help="trajectories per batch (default: 64)"
    )
    parser.add_argument(
        "--sample-size", type=int, default=None,
        help="items sampled after each add (default: the batch size)",
    )
    parser.add_argument(
        "--capacity", type=int, default=10_000, help="buffer capacity (default: 10000)"
    )
    parser.add_argument(
        "--prioritized", action="store_true",
        help="prioritized sampling: draw with probability proportional to the reward",
    )
    parser.add_argument(
        "--prioritized-capacity", action="store_true",
        help="when full, evict the lowest log-reward items instead of the oldest",
    )
    parser.add_argument("--ndim", type=int, default=2, help="HyperGrid dimensions (default: 2)")
    parser.add_argument("--height", type=int, default=8, help="HyperGrid side (default: 8)")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    parser.add_argument(
        "--top", type=int, default=5, help="items of highest log-reward to show (default: 5)"
    )
    parser.add_argument(
        "--manager", action="store_true",
        help="run the manager demo instead (redisbuf.control.demo: scoring by a manager)",
    )
    parser.set_defaults(func=_demo)


def _demo_config(args: argparse.Namespace, url: str) -> DemoConfig:
    from .demo import DemoConfig

    return DemoConfig(
        url=url,
        name=args.name,
        workers=args.workers,
        batches=args.batches,
        batch_size=args.batch_size,
        sample_size=args.sample_size if args.sample_size is not None else args.batch_size,
        capacity=args.capacity,
        prioritized_sampling=args.prioritized,
        prioritized_capacity=args.prioritized_capacity,
        ndim=args.ndim,
        height=args.height,
        seed=args.seed,
        manager=args.manager,
    )


def _demo(args: argparse.Namespace) -> int:
    from .server import EmbeddedServer

    console = _console()
    url = resolve_url(args)
    if not args.manager:
        _demo_config(args, url or "").validate()  # before starting anything
    if url is not None:
        return _demo_on(args, url, console, embedded=False)
    with EmbeddedServer() as server:
        _announce_server(console, server)
        return _demo_on(args, server.url, console, embedded=True)


def _demo_on(args: argparse.Namespace, url: str, console: Console, *, embedded: bool) -> int:
    if args.manager:
        return _manager_demo(args, url, console)
    return _run_demo(_demo_config(args, url), args.top, console, embedded=embedded)


def _announce_server(console: Console, server: Any) -> None:
    pid = server.process.pid if server.process is not None else "?"
    console.print(
        f"Embedded Redis: {escape(os.path.basename(server.binary))} pid {pid} at {server.url} "
        "(stops with the demo)",
        soft_wrap=True,
    )


def _manager_demo(args: argparse.Namespace, url: str, console: Console) -> int:
    try:
        from .control.demo import run as run_manager_demo
    except ImportError as exc:
        raise CommandError(f"the manager demo is not available in this install: {exc}") from None
    result = run_manager_demo(url, args.name, args.workers, args.batches, console)
    return result if isinstance(result, int) else 0


def _run_demo(config: DemoConfig, top: int, console: Console, *, embedded: bool) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from .buffer import ReplayBuffer
    from .demo import run_demo

    connect(config.url).close()  # an unreachable URL fails here, before any output
    sampling = "prioritized" if config.prioritized_sampling else "uniform"
    eviction = "lowest-reward" if config.prioritized_capacity else "FIFO"
    console.print(
        f"Demo: {config.workers} workers x {config.batches} batches x {config.batch_size} "
        f"HyperGrid trajectories -> buffer [bold]{config.name}[/] (capacity {config.capacity}, "
        f"{eviction} eviction, {sampling} sampling) at {escape(redacted(config.url))}"
    )
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items added"),
        TimeElapsedColumn(),
        console=console,
    )
    with progress:
        task = progress.add_task("adding", total=config.planned_items)
        result = run_demo(
            config, on_batch=lambda _index, added, _sampled: progress.advance(task, added)
        )
    buffer = ReplayBuffer.open(config.url, config.name)
    try:
        _print_demo_summary(console, result, buffer, top, embedded=embedded)
    finally:
        buffer.client.close()
    return 0


def _print_demo_summary(
    console: Console, result: DemoResult, buffer: ReplayBuffer, top: int, *, embedded: bool
) -> None:
    stats = result.stats
    consistent = stats["inserted"] - stats["evicted"] == stats["length"]
    table = Table(title=f"Buffer '{buffer.name}' after the demo", title_justify="left")
    table.add_column("", style="bold")
    table.add_column("value", justify="right")
    table.add_row("items added", str(stats["inserted"]))
    table.add_row("items evicted", str(stats["evicted"]))
    table.add_row("items sampled", str(stats["sampled"]))
    table.add_row(
        "length / capacity",
        f"{stats['length']} / {stats['capacity']} "
        f"({'consistent' if consistent else 'INCONSISTENT'}: added - evicted = "
        f"{stats['inserted'] - stats['evicted']})",
    )
    table.add_row(
        "throughput", f"{result.add_throughput:,.0f} items/s added, "
        f"{result.sample_throughput:,.0f} items/s sampled",
    )
    table.add_row(
        "time", f"{result.loop_seconds:.2f} s adding+sampling, {result.wall_seconds:.2f} s "
        "with process start-up",
    )
    table.add_row("memory in Redis", _format_bytes(stats["memory_bytes"]))
    console.print(table)

    rows = top_items(buffer, top)
    if rows:
        best = Table(title=f"Top {len(rows)} log-rewards", title_justify="left")
        best.add_column("id", justify="right")
        best.add_column("log-reward", justify="right")
        best.add_column("item")
        for row in rows:
            best.add_row(str(row["id"]), _log_reward_text(row["log_reward"]), row["summary"])
        console.print(best)

    console.print("Inspect the buffer with redis-cli:")
    for line in _redis_cli_lines(result.config.url, buffer):
        console.print(f"  {escape(line)}", soft_wrap=True)
    if embedded:
        console.print(
            "The embedded server stops now; run the demo with --url (or "
            f"${URL_ENV}) to keep the buffer, then `redisbuf inspect {buffer.name}`."
        )
    else:
        console.print(
            f"More: redisbuf inspect {buffer.name} --url {escape(redacted(result.config.url))}",
            soft_wrap=True,
        )


# -- worker ----------------------------------------------------------------------------


def _add_worker_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="one demo worker in the foreground (e.g. one container of docker-compose)",
        description=(
            "Add batches of HyperGrid trajectories to the buffer NAME and sample from it, "
            "until BATCHES batches are done (0: until SIGTERM / Ctrl-C). Creates the buffer "
            "if it does not exist."
        ),
    )
    add_url_argument(parser)
    parser.add_argument("--name", default="demo", help="buffer name (default: demo)")
    parser.add_argument(
        "--batches", type=int, default=0, help="batches to add, 0 = until stopped (default: 0)"
    )
    parser.add_argument("--batch-size", type=int, default=64, help="trajectories per batch")
    parser.add_argument("--sample-size", type=int, default=None, help="items sampled per add")
    parser.add_argument("--capacity", type=int, default=10_000, help="buffer capacity")
    parser.add_argument("--prioritized", action="store_true", help="prioritized sampling")
    parser.add_argument(
        "--prioritized-capacity", action="store_true", help="evict the lowest log-reward first"
    )
    parser.add_argument("--ndim", type=int, default=2, help="HyperGrid dimensions")
    parser.add_argument("--height", type=int, default=8, help="HyperGrid side")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument(
        "--report-every", type=float, default=10.0, help="seconds between progress lines"
    )
    parser.add_argument(
        "--manager", action="store_true",
        help="have every add scored by `redisbuf manager NAME` (Redis control plane) and "
        "send it EXIT at the end; waits for the manager's buffer and adopts its "
        "capacity and eviction policy",
    )
    parser.set_defaults(func=_worker)


def _worker(args: argparse.Namespace) -> int:
    from .demo import run_worker

    url = require_url(args, "redisbuf worker")
    seed = args.seed if args.seed is not None else secrets.randbits(31)
    config = _demo_config(argparse.Namespace(**{**vars(args), "workers": 1, "seed": seed}), url)
    config.validate()
    connect(url).close()  # fail fast, with the URL in the message
    console = _console()
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    totals = {"added": 0, "sampled": 0}
    last_report = time.monotonic()

    def on_batch(_index: int, added: int, sampled: int) -> None:
        nonlocal last_report
        totals["added"] += added
        totals["sampled"] += sampled
        if time.monotonic() - last_report >= args.report_every:
            last_report = time.monotonic()
            console.print(f"worker: {totals['added']} added, {totals['sampled']} sampled")

    console.print(f"worker: adding to buffer {config.name} at {escape(redacted(url))}")
    added, sampled = run_worker(config, 0, on_batch=on_batch, should_stop=lambda: stopping)
    console.print(f"worker: done, {added} added, {sampled} sampled")
    return 0


# -- inspect ---------------------------------------------------------------------------


def _add_inspect_parser(subparsers: Any) -> None:
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
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.set_defaults(func=_inspect)


def existing_buffers(client: redis.Redis, limit: int = 20) -> list[str]:
    """Names of (up to ``limit``) buffers in this Redis database, found by their meta key."""
    names = []
    for key in client.scan_iter(match="rb:{*}:meta", count=1000):
        text = key.decode() if isinstance(key, bytes) else key
        names.append(text[len("rb:{") : -len("}:meta")])
        if len(names) >= limit:
            break
    return sorted(names)


def inspect_report(buffer: ReplayBuffer, top: int) -> dict[str, Any]:
    """Everything ``redisbuf inspect`` shows, as plain JSON-able data."""
    stats = buffer.stats()
    meta = {
        k.decode(): v.decode() for k, v in buffer.client.hgetall(buffer.keys.meta).items()
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


def _inspect(args: argparse.Namespace) -> int:
    from .buffer import ReplayBuffer
    from .errors import ConfigMismatchError

    url = require_url(args, "redisbuf inspect")
    client = connect(url)
    try:
        try:
            buffer = ReplayBuffer.open(client, args.name)
        except ConfigMismatchError:
            others = existing_buffers(client)
            hint = f"; buffers there: {', '.join(others)}" if others else "; it holds no buffer"
            raise CommandError(
                f"no buffer named {args.name!r} at {redacted(url)}{hint}"
            ) from None
        report = inspect_report(buffer, max(args.top, 0))
    finally:
        client.close()
    if args.json:
        print(json.dumps({"url": redacted(url), **report}, indent=2))
        return 0
    _print_inspect(_console(), url, buffer, report)
    return 0


def _print_inspect(
    console: Console, url: str, buffer: ReplayBuffer, report: dict[str, Any]
) -> None:
    eviction = {
        "fifo": "fifo (oldest first)",
        "reward": "reward (lowest log-reward first, oldest among equals)",
    }.get(report["eviction"], str(report["eviction"]))
    fill = report["length"] / report["capacity"] if report["capacity"] else 0.0
    table = Table(title=f"Buffer '{report['name']}' at {escape(redacted(url))}",
                  title_justify="left")
    table.add_column("", style="bold")
    table.add_column("value")
    table.add_row("capacity", str(report["capacity"]))
    table.add_row("length", f"{report['length']} ({fill:.0%} full)")
    for name, value in report["counters"].items():
        table.add_row(name, str(value))
    table.add_row("eviction", eviction)
    table.add_row("kind", str(report["kind"] or "not fixed yet (no add so far)"))
    table.add_row(
        "prioritized sampling", "sum tree built" if report["prioritized_sampling_ready"] else "off"
    )
    table.add_row("memory in Redis", _format_bytes(report["memory_bytes"]))
    if report["created_at"]:
        table.add_row("created", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(
            report["created_at"])))
    console.print(table)

    schema = report["schema"]
    if schema:
        fields = Table(title=f"Schema ({schema['kind']})", title_justify="left")
        for column in ("field", "dtype", "shape", "library"):
            fields.add_column(column)
        for name, spec in schema["fields"].items():
            fields.add_row(name, spec["dtype"], str(tuple(spec["shape"])), spec["lib"])
        console.print(fields)

    if report["top"]:
        best = Table(title=f"Top {len(report['top'])} by log-reward", title_justify="left")
        best.add_column("id", justify="right")
        best.add_column("log-reward", justify="right")
        best.add_column("item")
        for row in report["top"]:
            value = row["log_reward"]
            text = value if isinstance(value, str) else _log_reward_text(value)
            best.add_row(str(row["id"]), text, escape(row["summary"]))
        console.print(best)

    present = {key: info["exists"] for key, info in report["keys"].items()}
    console.print(_keys_table(buffer, present))
    console.print("Look with redis-cli:")
    for line in _redis_cli_lines(url, buffer):
        console.print(f"  {escape(line)}", soft_wrap=True)


# -- entry point -----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The ``redisbuf`` argument parser, control-plane subcommands included."""
    from . import __version__
    from .control import commands

    parser = argparse.ArgumentParser(
        prog="redisbuf",
        description="A replay buffer shared by many processes, stored in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"redisbuf {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    _add_demo_parser(subparsers)
    _add_inspect_parser(subparsers)
    _add_worker_parser(subparsers)
    commands.register(subparsers)
    return parser


def _fail(message: str) -> int:
    one_line = " ".join(str(message).split())
    _error_console().print(f"[bold red]error:[/] [red]{escape(one_line)}[/]", soft_wrap=True)
    return EXIT_ERROR


class _Terminated(KeyboardInterrupt):
    """Raised by the SIGTERM handler, so SIGTERM cleans up like Ctrl-C does."""


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redisbuf`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM stops workers and the embedded server like Ctrl-C (`worker` overrides it)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        result = args.func(args)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        _error_console().print(f"[yellow]{'terminated' if terminated else 'interrupted'}[/]")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except (RedisBufError, redis.exceptions.RedisError) as exc:
        return _fail(str(exc))
    except (OSError, ValueError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}")
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
