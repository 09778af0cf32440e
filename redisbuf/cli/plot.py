"""``redisbuf plot NAME -o FILE``: log-reward histogram and insert / sample / eviction rate
history of a buffer, drawn with matplotlib (any format it writes: png, svg, pdf...).

The rate history is the capped series that the insert scripts of every buffer class
keep in its meta hash (10-second buckets, the last hour; ``lua/_history.lua``), in the
class's unit (items, steps, episodes or chunks: ``redisbuf.metrics.LAYOUTS``); the sample
rate there is the sampled counter as seen by the inserts of each bucket. Only a
ReplayBuffer has log-rewards: for the other classes the histogram panel says so.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from ..connection import redacted
from ..metrics import Histogram, history_rates, log_reward_histogram, snapshot
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
    try:
        import matplotlib
    except ImportError:
        raise CommandError("redisbuf plot needs matplotlib: pip install matplotlib") from None
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

    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 7), constrained_layout=True)
    label = "buffer" if buffer_class == "buffer" else f"{buffer_class} buffer"
    figure.suptitle(f"{label} {args.name}: {snap.length} / {snap.capacity} {snap.unit}")
    if hist.counts:
        widths = [hist.edges[i + 1] - hist.edges[i] for i in range(len(hist.counts))]
        top.bar(hist.edges[:-1], hist.counts, width=widths, align="edge", color="tab:blue")
    note = f" ({hist.minus_inf} items at -inf not shown)" if hist.minus_inf else ""
    if buffer_class != "buffer":
        note = f" (none: a {buffer_class} buffer keeps no log-rewards)"
    top.set_title("log-reward (priority) histogram" + note)
    top.set_xlabel("log-reward")
    top.set_ylabel("items")
    if rates:
        start = rates[0].t
        minutes = [(r.t - start) / 60 for r in rates]
        bottom.plot(minutes, [r.inserted for r in rates], label="inserted/s", marker=".")
        bottom.plot(minutes, [r.sampled for r in rates], label="sampled/s", marker=".")
        bottom.plot(minutes, [r.evicted for r in rates], label="evicted/s", marker=".")
        bottom.legend()
        bottom.set_xlabel("minutes since the first bucket of the history")
    else:
        bottom.text(0.5, 0.5, "no rate history yet (needs inserts in two 10-s buckets)",
                    ha="center", va="center", transform=bottom.transAxes)
    bottom.set_title("rates (10-second buckets, last hour)")
    bottom.set_ylabel(f"{snap.unit} per second")
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
