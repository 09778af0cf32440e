"""``redisbuf functions install|show|version``: the FCALL library (redisbuf/store/functions.py)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import redis

from ..store import functions
from ..store.connection import redacted
from ._common import CommandError, add_json_argument, add_url_argument, connect_args, emit


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "functions",
        help="install the FCALL library (rb_add, rb_sample_uniform...) for clients in any language",
        description="install: FUNCTION LOAD the redisbuf library (every primary of a "
        "cluster) unless this version is there; show: print its Lua source (for FUNCTION "
        "LOAD by hand); version: this version and the server's. docs/wire-format.md "
        "documents each function.",
    )
    parser.add_argument("action", choices=["install", "show", "version"])
    add_url_argument(parser)
    add_json_argument(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.action == "show":
        sys.stdout.write(functions.library_source())
        return 0
    client, url = connect_args(args, f"redisbuf functions {args.action}")
    try:
        if args.action == "install":
            try:
                loaded = functions.install(client)
            except redis.exceptions.ResponseError as exc:
                raise CommandError(
                    f"the server at {redacted(url)} refused FUNCTION LOAD: {exc} (it needs "
                    "Redis >= 7 or Valkey, and a user allowed FUNCTION)"
                ) from None
            document = {"url": redacted(url), "library": functions.LIBRARY,
                        "version": functions.version(), "loaded": loaded}
            what = "installed" if loaded else "already installed"
            return emit(args, document, lambda out: out.print(
                f"Library {functions.LIBRARY} {functions.version()} {what} at {redacted(url)}."
            ))
        installed = functions.installed_version(functions.unwrapped(client))
        document = {"url": redacted(url), "version": functions.version(), "installed": installed}
        return emit(args, document, lambda out: out.print(
            f"this redisbuf: {functions.version()}; server: {installed or 'not installed'}"
        ))
    finally:
        client.close()
