"""What every ``redisbuf`` subcommand shares: ``--url``, ``--json``, errors and output.

A subcommand module has ``register(subparsers)``, which adds its parser(s) and sets
``func`` (called with the parsed namespace; returns the exit code, ``None`` meaning 0).
User errors are raised as :class:`CommandError` (or any :class:`RedisBufError`) and
printed by :func:`redisbuf.cli.main` as one line on stderr with exit code 1. With
``--json`` a command prints exactly one JSON document on stdout and nothing else there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis
from rich.console import Console
from rich.markup import escape

from ..errors import RedisBufError
from ..ops.metrics import LAYOUTS, buffer_classes, buffer_names, every_buffer
from ..store.connection import URL_ENV, connect, redacted
from ..store.keys import PREFIX, BufferKeys

if TYPE_CHECKING:
    from ..buffers.replay import ReplayBuffer

from . import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_TERMINATED  # noqa: F401 - re-exported


class CommandError(RedisBufError):
    """A user error found by the command line itself (e.g. no URL given)."""


def add_url_argument(parser: argparse.ArgumentParser) -> None:
    """The ``--url`` option every subcommand takes (default ``$REDISBUF_URL``)."""
    parser.add_argument(
        "--url",
        default=None,
        help=f"Redis URL, e.g. redis://127.0.0.1:6379/0, redis://user:pass@host:6379/0 or "
        f"rediss://host:6380/0 (default: ${URL_ENV})",
    )


def add_json_argument(
    parser: argparse.ArgumentParser, help: str = "print one JSON document on stdout instead"
) -> None:
    parser.add_argument("--json", action="store_true", help=help)


def resolve_url(args: argparse.Namespace) -> str | None:
    """``--url``, else ``$REDISBUF_URL``, else None."""
    return getattr(args, "url", None) or os.environ.get(URL_ENV) or None


def require_url(args: argparse.Namespace, what: str) -> str:
    """The URL, or a :class:`CommandError` worded the same way for every command."""
    url = resolve_url(args)
    if url is None:
        raise CommandError(
            f"{what} needs a Redis server: pass --url redis://HOST:PORT/DB or set ${URL_ENV}"
        )
    return url


def connect_args(args: argparse.Namespace, what: str) -> tuple[redis.Redis, str]:
    """A checked client for the command's URL, and the URL."""
    url = require_url(args, what)
    return connect(url), url


def console() -> Console:
    return Console(highlight=False)


def error_console() -> Console:
    return Console(stderr=True, highlight=False)


def safe(value: Any) -> str:
    """``value`` as text that rich prints literally (anything read from a server)."""
    return escape(str(value))


def print_json(document: Any) -> None:
    """The one JSON document of a ``--json`` run, on stdout."""
    sys.stdout.write(json.dumps(jsonable(document), indent=2, allow_nan=False, default=str) + "\n")
    sys.stdout.flush()


def jsonable(value: Any) -> Any:
    """``value`` with non-finite floats as the strings ``"inf"``, ``"-inf"``, ``"nan"``."""
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return value


def emit(args: argparse.Namespace, document: Any, render: Callable[[Console], None]) -> int:
    """Print ``document`` as JSON with ``--json``, else call ``render`` with a console."""
    if getattr(args, "json", False):
        print_json(document)
    else:
        render(console())
    return 0


def format_bytes(count: int | None) -> str:
    if count is None:
        return "unknown"
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


def log_reward_text(value: float) -> str:
    return "-inf" if value == -math.inf else f"{value:.4f}"


def missing_buffer_error(
    client: redis.Redis, name: str, url: str, every_class: bool = False
) -> CommandError:
    """'no buffer named X' with every buffer that does exist (counted when many): every
    ReplayBuffer, or with ``every_class`` the buffers of every class (the others marked
    with their class, e.g. ``s (sequence)``)."""
    if every_class:
        others = [n if c == "buffer" else f"{n} ({c})" for n, c in every_buffer(client)]
    else:
        others = buffer_names(client)
    if not others:
        hint = "; it holds no buffer"
    elif len(others) <= 20:
        hint = f"; buffers there: {', '.join(others)}"
    else:
        hint = (
            f"; {len(others)} buffers there: {', '.join(others[:20])} and "
            f"{len(others) - 20} more (see `redisbuf list`)"
        )
    return CommandError(f"no buffer named {name!r} at {redacted(url)}{hint}")


def check_name(name: str) -> None:
    """A :class:`CommandError` for a name no buffer can have."""
    from ..store.keys import validate_name

    try:
        validate_name(name)
    except ValueError as exc:
        raise CommandError(str(exc)) from None


def open_buffer(client: redis.Redis, name: str, url: str, **kwargs: Any) -> ReplayBuffer:
    """The existing buffer ``name``, or a :class:`CommandError` listing those that exist."""
    from ..buffers.replay import ReplayBuffer
    from ..errors import ConfigMismatchError

    check_name(name)
    try:
        return ReplayBuffer.open(client, name, **kwargs)
    except ConfigMismatchError:
        if client.exists(f"{PREFIX}:{{{name}}}:meta"):
            raise
        raise missing_buffer_error(client, name, url) from None


def add_class_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--class", dest="buffer_class", choices=list(LAYOUTS), default=None,
        help="which buffer class NAME means when several share the name (default: the "
        "only one there)",
    )


def resolve_class(client: redis.Redis, name: str, url: str, wanted: str | None) -> str:
    """The buffer class (a key of :data:`redisbuf.ops.metrics.LAYOUTS`) of the buffer
    ``name``: ``wanted`` when that exists, else the only one there; a
    :class:`CommandError` when none is, or when several are and ``wanted`` is None. A
    plain buffer is also opened, so a damaged one raises its own error."""
    check_name(name)
    found = buffer_classes(client, name)
    if not found and client.exists(BufferKeys(name).shards):
        open_buffer(client, name, url)  # raises ShardedBufferError: what to open instead
    if wanted is not None and wanted not in found:
        if not found:
            raise missing_buffer_error(client, name, url, every_class=True)
        raise CommandError(
            f"no {wanted} buffer named {name!r} at {redacted(url)}; that name holds "
            f"buffers of class {', '.join(found)}"
        )
    if wanted is None:
        if not found:
            raise missing_buffer_error(client, name, url, every_class=True)
        if len(found) > 1:
            raise CommandError(
                f"{name!r} names {len(found)} buffers at {redacted(url)} (classes "
                f"{', '.join(found)}): choose one with --class"
            )
        wanted = found[0]
    if wanted == "buffer":
        open_buffer(client, name, url)
    return wanted


def confirm(question: str, *, yes: bool, refusal: str) -> None:
    """Go on if ``yes``, or if a person at a terminal answers y; else raise
    :class:`CommandError` with ``refusal`` (never blocks on a non-terminal stdin)."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise CommandError(f"{refusal}; pass --yes to do it without asking")
    error_console().print(safe(f"{question} [y/N] "), end="")
    try:
        answer = input()
    except EOFError:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        raise CommandError(f"{refusal}: not confirmed")
