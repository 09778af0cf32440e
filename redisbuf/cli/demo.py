"""``redisbuf demo``: several worker processes add to and sample from one buffer."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from ..store.connection import URL_ENV, connect, redacted
from ..store.keys import BufferKeys
from ._common import (
    CommandError,
    add_json_argument,
    check_name,
    confirm,
    console,
    error_console,
    format_bytes,
    log_reward_text,
    print_json,
    resolve_url,
    safe,
)
from .inspect import redis_cli_lines, top_items

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer
    from ..demos.processes import DemoConfig, DemoResult

DEFAULT_CAPACITY = 10_000


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="several worker processes add to and sample from one shared buffer",
        description=(
            "Start WORKERS processes that each add BATCHES batches of HyperGrid trajectories "
            "(random policy) to one buffer and sample from it, then print a summary. "
            f"Without --url / ${URL_ENV} it runs on an embedded Redis server that stops "
            "when the demo ends. An existing buffer NAME is deleted first, after asking "
            "(or with --yes)."
        ),
    )
    add_worker_options(parser, demo=True)
    parser.add_argument(
        "--top", type=int, default=5, help="items of highest log-reward to show (default: 5)"
    )
    parser.add_argument(
        "--yes", action="store_true", help="delete an existing buffer NAME without asking"
    )
    add_json_argument(parser, "the summary as one JSON document on stdout (progress on stderr)")
    parser.add_argument(
        "--manager", action="store_true",
        help="run the manager demo instead (redisbuf.demos.manager: scoring by a manager); "
        "takes --workers, --batches, --batch-size and --capacity",
    )
    parser.set_defaults(func=run)


def add_worker_options(parser: argparse.ArgumentParser, *, demo: bool) -> None:
    """Options shared by ``demo`` and ``worker``."""
    from ._common import add_url_argument

    add_url_argument(parser)
    parser.add_argument("--name", default="demo", help="buffer name (default: demo)")
    if demo:
        parser.add_argument(
            "--workers", type=int, default=4, help="worker processes (default: 4)"
        )
        parser.add_argument(
            "--batches", type=int, default=50, help="batches per worker (default: 50)"
        )
    else:
        parser.add_argument(
            "--batches", type=int, default=0,
            help="batches to add, 0 = until stopped (default: 0)",
        )
    parser.add_argument(
        "--batch-size", type=int, default=64, help="trajectories per batch (default: 64)"
    )
    parser.add_argument(
        "--sample-size", type=int, default=None,
        help="items sampled after each add (default: the batch size)",
    )
    parser.add_argument(
        "--capacity", type=int, default=None,
        help=f"buffer capacity (default: {DEFAULT_CAPACITY}"
        + ("; the manager demo sizes it from the work)" if demo else
           "; an existing buffer keeps its own)"),
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
    parser.add_argument(
        "--seed", type=int, default=0 if demo else None,
        help="random seed (default: " + ("0)" if demo else "random)"),
    )


def demo_config(args: argparse.Namespace, url: str, **overrides: Any) -> DemoConfig:
    from ..demos.processes import DemoConfig

    values = {
        "url": url,
        "name": args.name,
        "workers": getattr(args, "workers", 1),
        "batches": args.batches,
        "batch_size": args.batch_size,
        "sample_size": args.sample_size if args.sample_size is not None else args.batch_size,
        "capacity": args.capacity if args.capacity is not None else DEFAULT_CAPACITY,
        "prioritized_sampling": args.prioritized,
        "prioritized_capacity": args.prioritized_capacity,
        "ndim": args.ndim,
        "height": args.height,
        "seed": args.seed if args.seed is not None else 0,
        "manager": args.manager,
        **overrides,
    }
    return DemoConfig(**values)


def _check(args: argparse.Namespace) -> None:
    """Every refusal that needs no server, before one is started."""
    check_name(args.name)
    if args.workers < 1:
        raise CommandError(f"workers must be at least 1, got {args.workers}")
    if args.batches < 1:
        raise CommandError(
            f"the demo needs --batches >= 1, got {args.batches} (for a worker that runs "
            "until stopped, use `redisbuf worker --batches 0`)"
        )
    if args.manager:
        ignored = [
            flag for flag, given in (
                ("--prioritized", args.prioritized),
                ("--prioritized-capacity", args.prioritized_capacity),
                ("--sample-size", args.sample_size is not None),
            ) if given
        ]
        if ignored:
            raise CommandError(
                f"demo --manager does not take {', '.join(ignored)}: its workers only add, "
                "and the manager keeps the buffer"
            )
        if args.batch_size < 1 or (args.capacity is not None and args.capacity < 1):
            raise CommandError("--batch-size and --capacity must be >= 1")
    else:
        try:
            demo_config(args, "").validate()
        except ValueError as exc:
            raise CommandError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    from ..servers.embedded import EmbeddedServer

    _check(args)
    out = error_console() if args.json else console()
    url = resolve_url(args)
    if url is not None:
        return _demo_on(args, url, out, embedded=False)
    with EmbeddedServer() as server:
        out.print(
            f"Embedded Redis: {safe(os.path.basename(server.binary))} pid {server.pid} at "
            f"{server.url} (stops with the demo)",
            soft_wrap=True,
        )
        return _demo_on(args, server.url, out, embedded=True)


def _demo_on(args: argparse.Namespace, url: str, out: Console, *, embedded: bool) -> int:
    client = connect(url)  # an unreachable URL fails here, before any output
    try:
        keys = BufferKeys(args.name)
        if client.exists(keys.meta):
            length = client.zcard(keys.order)
            confirm(
                f"Buffer {args.name!r} at {redacted(url)} exists with {length} items; delete "
                "it and start the demo afresh?",
                yes=args.yes,
                refusal=f"buffer {args.name!r} already exists at {redacted(url)} "
                f"({length} items) and the demo would delete it",
            )
    finally:
        client.close()
    if args.manager:
        return _manager_demo(args, url, out)
    return _run_demo(
        demo_config(args, url), args.top, out, embedded=embedded, as_json=args.json
    )


def _manager_demo(args: argparse.Namespace, url: str, out: Console) -> int:
    try:
        from ..demos.manager import run as run_manager_demo
    except ImportError as exc:
        raise CommandError(f"the manager demo is not available in this install: {exc}") from None
    summary = run_manager_demo(
        url, args.name, args.workers, args.batches, out,
        capacity=args.capacity, batch_size=args.batch_size,
    )
    if args.json:
        print_json({"url": redacted(url), "name": args.name, **summary})
    return 0


def _run_demo(
    config: DemoConfig, top: int, out: Console, *, embedded: bool, as_json: bool = False
) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from ..buffers.replay import ReplayBuffer
    from ..demos.processes import run_demo

    sampling = "prioritized" if config.prioritized_sampling else "uniform"
    eviction = "lowest-reward" if config.prioritized_capacity else "FIFO"
    out.print(
        f"Demo: {config.workers} workers x {config.batches} batches x {config.batch_size} "
        f"HyperGrid trajectories -> buffer [bold]{safe(config.name)}[/] (capacity "
        f"{config.capacity}, {eviction} eviction, {sampling} sampling) at "
        f"{safe(redacted(config.url))}"
    )
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("items added"),
        TimeElapsedColumn(),
        console=out,
    )
    with progress:
        task = progress.add_task("adding", total=config.planned_items)
        result = run_demo(
            config, on_batch=lambda _index, added, _sampled: progress.advance(task, added)
        )
    buffer = ReplayBuffer.open(config.url, config.name)
    try:
        if as_json:
            print_json({
                "url": redacted(config.url), "name": config.name, "embedded": embedded,
                "stats": result.stats, "added": result.added, "sampled": result.sampled,
                "add_items_per_s": result.add_throughput,
                "sample_items_per_s": result.sample_throughput,
                "loop_seconds": result.loop_seconds, "wall_seconds": result.wall_seconds,
                "top": top_items(buffer, top),
            })
        else:
            _print_summary(out, result, buffer, top, embedded=embedded)
    finally:
        buffer.client.close()
    return 0


def _print_summary(
    out: Console, result: DemoResult, buffer: ReplayBuffer, top: int, *, embedded: bool
) -> None:
    stats = result.stats
    consistent = stats["inserted"] - stats["evicted"] == stats["length"]
    table = Table(title=f"Buffer '{safe(buffer.name)}' after the demo", title_justify="left")
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
    table.add_row("memory in Redis", format_bytes(stats["memory_bytes"]))
    out.print(table)

    rows = top_items(buffer, top)
    if rows:
        best = Table(title=f"Top {len(rows)} log-rewards", title_justify="left")
        best.add_column("id", justify="right")
        best.add_column("log-reward", justify="right")
        best.add_column("item")
        for row in rows:
            best.add_row(str(row["id"]), log_reward_text(row["log_reward"]), safe(row["summary"]))
        out.print(best)

    out.print("Inspect the buffer with redis-cli:")
    for line in redis_cli_lines(result.config.url, buffer):
        out.print(f"  {safe(line)}", soft_wrap=True)
    if embedded:
        out.print(
            "The embedded server stops now; run the demo with --url (or "
            f"${URL_ENV}) to keep the buffer, then `redisbuf inspect {safe(buffer.name)}`."
        )
    else:
        out.print(
            f"More: redisbuf inspect {safe(buffer.name)} --url {safe(redacted(result.config.url))}",
            soft_wrap=True,
        )
