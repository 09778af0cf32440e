"""``redisbuf metrics --port 9108 [NAME...]``: a Prometheus exporter for buffers."""

from __future__ import annotations

import argparse
import threading
from typing import Any

from .._extras import require as require_extra
from ..store.connection import redacted
from ._common import (
    CommandError,
    add_json_argument,
    add_url_argument,
    check_name,
    connect_args,
    print_json,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "metrics",
        help="serve Prometheus metrics of all or the named buffers (every class) over HTTP",
        description="Serve /metrics for Prometheus (prometheus_client): gauges "
        "redisbuf_length, redisbuf_capacity, redisbuf_memory_bytes, "
        "redisbuf_baseline_log_reward; counters redisbuf_inserted_total, "
        "redisbuf_evicted_total, redisbuf_sampled_total (labels buffer and class: "
        "buffer, sequence, episodes or fragments); redisbuf_up. Length, capacity and "
        "the counters are in the class's unit: items, steps, episodes or chunks. "
        "Buffers are read at each scrape. Runs until Ctrl-C / SIGTERM.",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help="buffers, each of every class it names (default: all buffers of every class)",
    )
    add_url_argument(parser)
    parser.add_argument("--port", type=int, default=9108, help="HTTP port (default: 9108)")
    parser.add_argument(
        "--addr", default="0.0.0.0", help="address to listen on (default: 0.0.0.0)"
    )
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    require_extra("prometheus_client", "metrics", "redisbuf metrics")
    from ..ops.metrics import serve

    for name in args.names:
        check_name(name)
    if not 0 <= args.port <= 65535:
        raise CommandError(f"--port must be 0-65535, got {args.port}")
    client, url = connect_args(args, "redisbuf metrics")
    try:
        server = serve(client, args.names, args.port, args.addr)
    except OSError as exc:
        client.close()
        raise CommandError(f"cannot listen on {args.addr}:{args.port}: {exc}") from None
    port = server.server_port
    endpoint = f"http://{args.addr}:{port}/metrics"
    what = ", ".join(args.names) if args.names else "all buffers of every class"
    if args.json:
        print_json({"url": redacted(url), "endpoint": endpoint, "port": port,
                    "buffers": args.names})
    else:
        print(f"serving metrics of {what} at {redacted(url)} on {endpoint} "
              "(Ctrl-C stops)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt as exc:
        if type(exc) is not KeyboardInterrupt:
            raise
    finally:
        server.shutdown()
        client.close()
    return 0
