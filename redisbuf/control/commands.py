"""Command-line subcommands of the control plane (``redisbuf manager ...``).

``redisbuf manager NAME --workers N [--url URL]`` runs a :class:`ReplayBufferManager`
for buffer ``NAME`` over the Redis control plane until N workers have sent EXIT. Workers
elsewhere use ``ReplayBuffer(url, NAME, ..., remote_manager_rank=0,
communication_backend="redis")``. Exit status: 0 after all EXITs, 1 on a control-plane
error (a worker lost, no manager key...), 130 on Ctrl-C.

Also runnable alone: ``python -m redisbuf.control.commands manager NAME --workers N``.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import Any

from ..errors import RedisBufError


def _load_function(spec: str) -> Callable[..., Any]:
    """``package.module:function`` -> the function."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise argparse.ArgumentTypeError(f"expected MODULE:FUNCTION, got {spec!r}")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"cannot load scoring function {spec!r}: {exc}") from exc


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the control-plane subcommands to the ``redisbuf`` parser. Each sets
    ``func`` (called with the parsed namespace, returns the exit status)."""
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
    parser.add_argument("--url", default=None, help="Redis URL (default: $REDISBUF_URL)")
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
    parser.set_defaults(func=run_manager)


def run_manager(args: argparse.Namespace) -> int:
    from ..connection import connect
    from ..manager import ReplayBufferManager

    try:
        manager = ReplayBufferManager(
            connect(args.url),
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
        print(
            f"manager of buffer {args.name!r} waiting for {args.workers} worker(s)", flush=True
        )
        manager.run()
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (RedisBufError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    stats = manager.metadata()
    print(
        f"all {args.workers} worker(s) sent EXIT; buffer holds {stats['length']} of "
        f"{stats['capacity']}, baseline {stats['baseline_log_reward']}",
        flush=True,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="redisbuf")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
