"""``redisbuf drop NAME``: delete a buffer, after asking (or with ``--yes``)."""

from __future__ import annotations

import argparse
from typing import Any

from ..store.connection import redacted
from ._common import (
    add_json_argument,
    add_url_argument,
    confirm,
    connect_args,
    emit,
    open_buffer,
    safe,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "drop",
        help="delete a buffer (asks first unless --yes)",
        description="Delete the buffer NAME: its items, counters and configuration. Asks "
        "for confirmation at a terminal; elsewhere it needs --yes.",
    )
    parser.add_argument("name", help="buffer name")
    add_url_argument(parser)
    parser.add_argument("--yes", action="store_true", help="do not ask")
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    client, url = connect_args(args, "redisbuf drop")
    try:
        buffer = open_buffer(client, args.name, url)
        length = len(buffer)
        confirm(
            f"Delete buffer {args.name!r} ({length} items) at {redacted(url)}?",
            yes=args.yes,
            refusal=f"not dropping buffer {args.name!r} ({length} items)",
        )
        buffer.drop()
    finally:
        client.close()
    document = {"url": redacted(url), "dropped": args.name, "items": length}
    return emit(
        args, document,
        lambda out: out.print(f"Dropped buffer {safe(args.name)} ({length} items)."),
    )
