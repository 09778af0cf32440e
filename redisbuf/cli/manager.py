"""``redisbuf manager NAME --workers N``: a :class:`ReplayBufferManager` for buffer
``NAME`` over the Redis control plane, until N workers have sent EXIT.

Workers elsewhere use ``ReplayBuffer(url, NAME, ...,
manager=ManagerLink(0, backend="redis"))``. Exit status: 0 after all EXITs, 1 on a user or
control-plane error (one line on stderr, like every command), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from ..store.connection import redacted
from ._common import CommandError, add_json_argument, add_url_argument, connect_args, print_json


def _load_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot load scoring function {spec!r}: {exc}") from exc


def register(subparsers: Any) -> None:
    """Add ``manager`` to the ``redisbuf`` parser."""
    parser = subparsers.add_parser(
        "manager",
        help="run the replay-buffer manager of a buffer over the Redis control plane",
        description=(
            "Score what workers add to buffer NAME and reply with the baseline, until "
            "--workers workers have sent EXIT."
        ),
    )
    parser.add_argument("name", help="buffer name (created if missing)")
    parser.add_argument("--workers", type=int, required=True, help="training ranks to wait for")
    add_url_argument(parser)
    parser.add_argument("--capacity", type=int, default=10000, help="capacity if created")
    parser.add_argument(
        "--baseline", choices=["min", "percentile", "ema"], default="min",
        help="baseline strategy (default: min)",
    )
    parser.add_argument("--percentile", type=float, default=0.1, help="quantile for percentile")
    parser.add_argument("--alpha", type=float, default=0.1, help="EMA smoothing factor")
    parser.add_argument(
        "--no-store", action="store_true", help="store_locally=False: EMA baselines only"
    )
    parser.add_argument(
        "--scoring", type=_load_function, default=None, metavar="MODULE:FUNCTION",
        help="scoring function f(batch, sender_rank=r) -> dict (default: score inf)",
    )
    parser.add_argument("--heartbeat", type=float, default=1.0, help="heartbeat interval, s")
    parser.add_argument("--heartbeat-ttl", type=float, default=5.0, help="heartbeat expiry, s")
    parser.add_argument(
        "--idle-timeout", type=float, default=None, help="give up after this long without requests"
    )
    parser.add_argument("--timing", action="store_true", help="print the timing summary")
    add_json_argument(
        parser, "progress lines on stderr; at the end one JSON document on stdout"
    )
    parser.set_defaults(func=run_manager)


def run_manager(args: argparse.Namespace) -> int:
    from ..control.manager import ReplayBufferManager

    client, url = connect_args(args, "redisbuf manager")
    lines = sys.stderr if args.json else sys.stdout
    try:
        manager = ReplayBufferManager(
            client,
            0,
            args.workers,
            scoring_function=args.scoring,
            capacity=args.capacity,
            store_locally=not args.no_store,
            baseline_strategy=args.baseline,
            baseline_percentile=args.percentile,
            baseline_ema_alpha=args.alpha,
            communication_backend="redis",
            timing=args.timing,
            name=args.name,
            heartbeat_interval=args.heartbeat,
            heartbeat_ttl=args.heartbeat_ttl,
            idle_timeout=args.idle_timeout,
        )
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    print(f"manager of buffer {args.name!r} waiting for {args.workers} worker(s)", flush=True,
          file=lines)
    manager.run()
    stats = manager.metadata()
    print(
        f"all {args.workers} worker(s) sent EXIT; buffer holds {stats['length']} of "
        f"{stats['capacity']}, baseline {stats['baseline_log_reward']}",
        flush=True,
        file=lines,
    )
    if args.json:
        print_json({"url": redacted(url), "name": args.name, "workers": args.workers,
                    **stats})
    return 0
