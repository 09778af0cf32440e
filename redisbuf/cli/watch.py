"""``redisbuf watch NAME``: a live view of one buffer, refreshed every second (rich Live).

Rates are differences of the buffer's counters between two refreshes (the sampled
counter included, so sampling needs no write of its own), in the buffer class's unit
(items, steps, episodes or chunks: ``redisbuf.ops.metrics.LAYOUTS``); every buffer class is
shown, log-rewards, top items, use counts and model versions only for a ReplayBuffer.
``q`` (at a terminal) or Ctrl-C quits with exit code 0. ``--count N`` stops after N
refreshes; with ``--json`` the N frames are printed as one JSON document at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from ..errors import RedisBufError
from ..ops.metrics import (
    Histogram,
    Snapshot,
    log_reward_histogram,
    rate_between,
    snapshot,
    uses_summary,
    versions_summary,
)
from ..store.connection import redacted
from ._common import (
    CommandError,
    add_class_argument,
    add_json_argument,
    add_url_argument,
    connect_args,
    console,
    format_bytes,
    log_reward_text,
    open_buffer,
    print_json,
    resolve_class,
)
from .inspect import top_items


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "watch",
        help="a live view of a buffer: fill, rates, manager, log-reward histogram, top items",
        description="Show buffer NAME live, refreshed every --interval seconds: length / "
        "capacity, insert, sample and eviction rates over the last interval, the manager's "
        "baseline and connected workers, use counts and model versions when the buffer "
        "keeps them, a histogram of log-rewards and the top items. q or Ctrl-C quits.",
    )
    parser.add_argument("name", help="buffer name")
    add_url_argument(parser)
    add_class_argument(parser)
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between refreshes (default: 1)"
    )
    parser.add_argument(
        "--count", type=int, default=None,
        help="stop after this many refreshes (default: until q / Ctrl-C; 2 with --json)",
    )
    parser.add_argument("--top", type=int, default=5, help="top items shown (default: 5)")
    parser.add_argument("--bins", type=int, default=12, help="histogram bins (default: 12)")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def frame(
    client: Any, name: str, previous: Snapshot | None, top: int, bins: int,
    buffer_class: str = "buffer",
) -> dict:
    """One refresh: the snapshot, rates since ``previous`` and the summaries (log-rewards,
    top items, uses and versions only for a ReplayBuffer, ``buffer_class`` "buffer")."""
    snap = snapshot(client, name, buffer_class=buffer_class)
    if snap is None:
        raise CommandError(f"buffer {name!r} no longer exists (dropped?)")
    rates = rate_between(previous, snap) if previous is not None else None
    if buffer_class != "buffer":
        return {
            "snapshot": snap, "rates": rates, "histogram": Histogram([], [], 0),
            "uses": None, "versions": None, "top": [],
        }
    histogram = log_reward_histogram(client, name, bins)
    best: list[dict[str, Any]] = []
    if top > 0 and snap.kind is not None and snap.length:
        try:
            best = top_items(open_buffer(client, name, ""), top)
        except RedisBufError:
            best = []  # dropped or changed between two reads: show it next time
    return {
        "snapshot": snap,
        "rates": rates,
        "histogram": histogram,
        "uses": uses_summary(client, name),
        "versions": versions_summary(client, name),
        "top": best,
    }


def frame_json(data: dict[str, Any]) -> dict[str, Any]:
    snap: Snapshot = data["snapshot"]
    rates = data["rates"]
    hist = data["histogram"]
    document = snap.as_dict()
    document.pop("history")
    return {
        **document,
        "rates": None if rates is None else {
            "inserted_per_s": rates.inserted, "evicted_per_s": rates.evicted,
            "sampled_per_s": rates.sampled,
        },
        "histogram": {"edges": hist.edges, "counts": hist.counts, "minus_inf": hist.minus_inf},
        "uses": data["uses"],
        "versions": data["versions"],
        "top": data["top"],
    }


def render(data: dict[str, Any], url: str, interval: float) -> Group:
    snap: Snapshot = data["snapshot"]
    rates = data["rates"]
    fill = snap.length / snap.capacity if snap.capacity else 0.0
    width = 30
    bar = "█" * int(round(fill * width)) + "·" * (width - int(round(fill * width)))
    table = Table(
        title=Text(f"redisbuf watch {snap.name} at {redacted(url)}   "
                   f"{time.strftime('%H:%M:%S')}   (q or Ctrl-C quits)"),
        title_justify="left", show_header=False,
    )
    table.add_column(style="bold")
    table.add_column()
    table.add_row(
        "length / capacity",
        Text(f"{snap.length} / {snap.capacity} {snap.unit} {bar} {fill:.0%}"),
    )
    table.add_row("kind, eviction", Text(f"{snap.kind or '-'}, {snap.eviction or '-'}"))
    if rates is None:
        table.add_row("rates", "measuring...")
    else:
        table.add_row(
            f"rates (last {interval:g} s, {snap.unit})",
            f"{rates.inserted:,.1f} inserted/s   {rates.sampled:,.1f} sampled/s   "
            f"{rates.evicted:,.1f} evicted/s",
        )
    table.add_row(
        "counters", f"{snap.inserted} inserted, {snap.evicted} evicted, {snap.sampled} sampled"
    )
    table.add_row("memory", format_bytes(snap.memory_bytes))
    if snap.buffer_class == "buffer":  # the other classes have no manager
        manager = "running" if snap.manager_running else "none"
        if snap.baseline is not None:
            manager += f", baseline {snap.baseline:.4f}"
        table.add_row("manager", f"{manager}, {snap.workers_alive} worker(s) connected")
    if data["uses"]:
        uses = data["uses"]
        table.add_row(
            "use counts", f"mean {uses['mean']:.2f}, max {uses['max']} (over {uses['items']})"
        )
    if data["versions"]:
        versions = data["versions"]
        table.add_row(
            "model versions",
            f"oldest {versions['oldest']:g}, newest {versions['newest']:g} "
            f"(spread {versions['newest'] - versions['oldest']:g})",
        )
    parts: list[Any] = [table]
    if snap.buffer_class == "buffer":
        parts.append(histogram_text(data["histogram"]))
    if data["top"]:
        best = Table(title="top items", title_justify="left")
        best.add_column("id", justify="right")
        best.add_column("log-reward", justify="right")
        best.add_column("item")
        for row in data["top"]:
            best.add_row(
                str(row["id"]), log_reward_text(row["log_reward"]), Text(row["summary"])
            )
        parts.append(best)
    return Group(*parts)


def histogram_text(hist: Any, width: int = 40) -> Text:
    """A small text histogram of log-rewards."""
    if not hist.counts:
        note = f" ({hist.minus_inf} at -inf)" if hist.minus_inf else ""
        return Text(f"log-rewards: no finite values{note}")
    peak = max(max(hist.counts), 1)
    lines = ["log-reward histogram:"]
    for i, count in enumerate(hist.counts):
        bar = "█" * int(round(count / peak * width))
        lines.append(f"  {hist.edges[i]:>10.3f} .. {hist.edges[i + 1]:<10.3f} {bar} {count}")
    if hist.minus_inf:
        lines.append(f"  {'-inf':>24} {hist.minus_inf}")
    return Text("\n".join(lines))


@contextlib.contextmanager
def _keys() -> Iterator[Any]:
    """A function waiting up to t seconds for a key press (None if none); cbreak mode at a
    terminal, plain sleeping elsewhere."""
    if not sys.stdin.isatty():
        yield lambda t: time.sleep(t)
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)

    def wait(t: float) -> str | None:
        ready, _, _ = select.select([fd], [], [], t)
        return os.read(fd, 1).decode(errors="replace") if ready else None

    try:
        yield wait
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def run(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise CommandError(f"--interval must be positive, got {args.interval}")
    count = args.count if args.count is not None else (2 if args.json else None)
    if count is not None and count < 1:
        raise CommandError(f"--count must be at least 1, got {count}")
    client, url = connect_args(args, "redisbuf watch")
    frames: list[dict[str, Any]] = []
    try:
        # a missing buffer is a clear error
        args.buffer_class = resolve_class(client, args.name, url, args.buffer_class)
        previous: Snapshot | None = None
        if args.json:
            for i in range(count or 1):
                if i:
                    time.sleep(args.interval)
                data = frame(
                    client, args.name, previous, args.top, args.bins, args.buffer_class
                )
                previous = data["snapshot"]
                frames.append(frame_json(data))
            print_json({"url": redacted(url), "name": args.name, "frames": frames})
            return 0
        return _live(client, args, url, count)
    except KeyboardInterrupt as exc:
        if type(exc) is not KeyboardInterrupt:  # SIGTERM: exit 143 as everywhere
            raise
        return 0
    finally:
        client.close()


def _live(client: Any, args: argparse.Namespace, url: str, count: int | None) -> int:
    out: Console = console()
    data = frame(client, args.name, None, args.top, args.bins, args.buffer_class)
    done = 1
    with _keys() as wait_key, Live(
        render(data, url, args.interval), console=out, auto_refresh=False
    ) as live:
        live.refresh()
        while count is None or done < count:
            deadline = time.monotonic() + args.interval
            while (left := deadline - time.monotonic()) > 0:
                key = wait_key(left)
                if key in ("q", "Q"):
                    return 0
            data = frame(
                client, args.name, data["snapshot"], args.top, args.bins, args.buffer_class
            )
            live.update(render(data, url, args.interval), refresh=True)
            done += 1
    return 0
