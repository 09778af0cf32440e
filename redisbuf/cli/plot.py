"""``redisbuf plot NAME -o FILE``: log-reward histogram and insert / sample / eviction rate
history of a buffer, drawn with matplotlib (any format it writes: png, svg, pdf...).

The rate history is the capped series that the insert scripts of every buffer class
keep in its meta hash (10-second buckets, the last hour; ``lua/_history.lua``), in the
class's unit (items, steps, episodes or chunks: ``redisbuf.ops.metrics.LAYOUTS``); the sample
rate there is the sampled counter as seen by the inserts of each bucket. Only a
ReplayBuffer has log-rewards: for the other classes the histogram panel says so.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._extras import require as require_extra
from ..ops.metrics import Histogram, Rate, history_rates, log_reward_histogram, snapshot
from ..store.connection import redacted
from ._common import (
    CommandError,
    add_class_argument,
    add_json_argument,
    add_url_argument,
    connect_args,
    emit,
    require_url,
    resolve_class,
    safe,
)

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "plot",
        help="plot a buffer's log-reward histogram and rate history to an image file",
        description="Draw the histogram of log-rewards (priorities) of buffer NAME and its "
        "insert / sample / eviction rates over the last hour to FILE (matplotlib; the "
        "format follows the extension).",
    )
    parser.add_argument("name", help="buffer name")
    parser.add_argument("-o", "--output", required=True, help="image file, e.g. buffer.png")
    add_url_argument(parser)
    add_class_argument(parser)
    parser.add_argument("--bins", type=int, default=40, help="histogram bins (default: 40)")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_url(args, "redisbuf plot")  # before the slow matplotlib import
    matplotlib = require_extra("matplotlib", "plot", "redisbuf plot")
    matplotlib.use("Agg")  # files only: no display needed
    from matplotlib import pyplot as plt

    output = Path(args.output)
    if not output.parent.exists():
        raise CommandError(f"directory {output.parent} does not exist")
    if args.bins < 1:
        raise CommandError(f"--bins must be at least 1, got {args.bins}")
    supported = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if output.suffix.lstrip(".").lower() not in supported:
        raise CommandError(
            f"cannot write {output.suffix or 'a file without extension'}: use one of "
            f"{', '.join('.' + s for s in sorted(supported))}"
        )
    client, url = connect_args(args, "redisbuf plot")
    try:
        buffer_class = resolve_class(client, args.name, url, args.buffer_class)
        snap = snapshot(client, args.name, memory=False, buffer_class=buffer_class)
        if snap is None:
            raise CommandError(f"buffer {args.name!r} disappeared (dropped?)")
        if buffer_class == "buffer":
            hist = log_reward_histogram(client, args.name, args.bins)
        else:
            hist = Histogram([], [], 0)  # only a ReplayBuffer keeps log-rewards
    finally:
        client.close()
    rates = history_rates(snap.history)

    label = "buffer" if buffer_class == "buffer" else f"{buffer_class} buffer"
    note = f" ({hist.minus_inf} items at -inf not shown)" if hist.minus_inf else ""
    if buffer_class != "buffer":
        note = f" (none: a {buffer_class} buffer keeps no log-rewards)"
    figure = draw(
        plt, f"{label} {args.name}: {snap.length} / {snap.capacity} {snap.unit}", hist, note,
        rates, snap.unit,
    )
    figure.savefig(output)
    plt.close(figure)

    document = {
        "url": redacted(url),
        "name": args.name,
        "buffer_class": buffer_class,
        "unit": snap.unit,
        "file": str(output),
        "histogram": {"edges": hist.edges, "counts": hist.counts, "minus_inf": hist.minus_inf},
        "history": [
            {"t": p.t, "inserted": p.inserted, "evicted": p.evicted, "sampled": p.sampled}
            for p in snap.history
        ],
        "rates": [
            {"t": r.t, "inserted_per_s": r.inserted, "sampled_per_s": r.sampled,
             "evicted_per_s": r.evicted}
            for r in rates
        ],
    }
    return emit(
        args, document,
        lambda out: out.print(
            f"Wrote {safe(output)}: histogram of {sum(hist.counts)} log-rewards, "
            f"{len(rates)} rate points."
        ),
    )


#: (line style, marker) of each rate: with a full buffer every insert evicts, and the
#: evicted line would hide the inserted one drawn in the same style
_RATE_STYLES = {
    "inserted": ("-", "o"),
    "sampled": (":", "^"),
    "evicted": ("--", "x"),
}


def draw(
    plt: Any, title: str, hist: Histogram, note: str, rates: Sequence[Rate], unit: str
) -> Figure:
    """The figure of ``redisbuf plot``: the log-reward histogram above, the rates below
    against clock time (this machine's time zone)."""
    from matplotlib import dates as mdates

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), constrained_layout=True)
    figure.suptitle(title)
    if hist.counts:
        widths = [hist.edges[i + 1] - hist.edges[i] for i in range(len(hist.counts))]
        top.bar(hist.edges[:-1], hist.counts, width=widths, align="edge", color="tab:blue")
        if len(hist.counts) == 1:  # one log-reward: its bar in the middle of the axis
            value, width = (hist.edges[0] + hist.edges[1]) / 2, widths[0]
            top.set_xlim(value - 2 * width, value + 2 * width)
            top.set_ylim(0, hist.counts[0] * 1.2)
            top.text(0.5, 0.95, f"all {hist.counts[0]} at log-reward {value:g}",
                     ha="center", va="top", transform=top.transAxes)
    top.set_title("log-reward (priority) histogram" + note)
    top.set_xlabel("log-reward")
    top.set_ylabel("items")
    if rates:
        zone = datetime.now().astimezone().tzinfo
        times = [datetime.fromtimestamp(r.t, tz=zone) for r in rates]
        for order, name in enumerate(("inserted", "sampled", "evicted")):
            style, marker = _RATE_STYLES[name]
            bottom.plot(times, [getattr(r, name) for r in rates], label=f"{name}/s",
                        linestyle=style, marker=marker, linewidth=2.5 - order * 0.5,
                        zorder=2 + order)
        bottom.legend()
        bottom.xaxis.set_major_locator(mdates.AutoDateLocator(tz=zone))
        bottom.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=zone))
        bottom.set_xlabel(f"time ({datetime.now(zone).strftime('%Z') or zone})")
    else:
        bottom.text(0.5, 0.5, "no rate history yet (needs inserts in two 10-s buckets)",
                    ha="center", va="center", transform=bottom.transAxes)
    bottom.set_title("rates (10-second buckets, last hour)")
    bottom.set_ylabel(f"{unit} per second")
    return figure
