"""The ``redisbuf`` command (also ``python -m redisbuf``): one module per command.

============  ===================================================================
command       module
============  ===================================================================
demo          :mod:`redisbuf.cli.demo` (processes sharing a buffer)
worker        :mod:`redisbuf.cli.worker` (one demo worker in the foreground)
manager       :mod:`redisbuf.cli.manager` (the control plane's manager)
inspect       :mod:`redisbuf.cli.inspect`
list          :mod:`redisbuf.cli.listing`
watch         :mod:`redisbuf.cli.watch` (live view)
plot          :mod:`redisbuf.cli.plot` (matplotlib)
export/import :mod:`redisbuf.cli.transfer`
drop          :mod:`redisbuf.cli.drop`
metrics       :mod:`redisbuf.cli.metrics` (Prometheus exporter)
============  ===================================================================

Shared by all (:mod:`redisbuf.cli._common`): ``--url`` (default ``$REDISBUF_URL``),
``--json`` (one JSON document on stdout, nothing else there), and errors: a user error
is one red line on stderr and exit code 1; Ctrl-C exits 130 and SIGTERM 143.
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
from rich.markup import escape

from ..errors import RedisBufError
from . import demo, drop, inspect, listing, manager, metrics, plot, transfer, watch, worker
from ._common import (
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_TERMINATED,
    CommandError,
    error_console,
)

COMMANDS = (demo, inspect, listing, watch, plot, transfer, drop, metrics, worker, manager)

__all__ = [
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "CommandError",
    "build_parser",
    "main",
]


def build_parser() -> argparse.ArgumentParser:
    """The ``redisbuf`` argument parser with every subcommand."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="redisbuf",
        description="A replay buffer shared by many processes, stored in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"redisbuf {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMANDS:
        module.register(subparsers)
    return parser


def _secrets(url: str | None) -> set[str]:
    """Passwords in ``url`` (userinfo or ``?password=``), raw and percent-decoded."""
    if not url:
        return set()
    try:
        parts = urlsplit(url)
        found = {parts.password or ""}
        found.update(parse_qs(parts.query).get("password", []))
    except ValueError:
        found = {url.split("@", 1)[0].rsplit(":", 1)[-1]} if "@" in url else set()
    return {s for secret in found if secret for s in (secret, unquote(secret)) if len(s) > 0}


def _fail(message: str, url: str | None = None) -> int:
    """One red line on stderr; any password of ``url`` is masked whoever wrote it."""
    text = str(message)
    for secret in sorted(_secrets(url), key=len, reverse=True):
        text = text.replace(secret, "***")
    one_line = " ".join(text.split())
    error_console().print(f"[bold red]error:[/] [red]{escape(one_line)}[/]", soft_wrap=True)
    return EXIT_ERROR


class _Terminated(KeyboardInterrupt):
    """Raised by the SIGTERM handler, so SIGTERM cleans up like Ctrl-C does."""


def _on_sigterm(signum: int, _frame: Any) -> None:
    raise _Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``redisbuf`` command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # SIGTERM stops workers and the embedded server like Ctrl-C (`worker` overrides it)
    signal.signal(signal.SIGTERM, _on_sigterm)
    from ._common import resolve_url

    url = resolve_url(args)
    try:
        result = args.func(args)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        error_console().print(f"[yellow]{'terminated' if terminated else 'interrupted'}[/]")
        return EXIT_TERMINATED if terminated else EXIT_INTERRUPTED
    except (RedisBufError, redis.exceptions.RedisError) as exc:
        return _fail(str(exc), url)
    except (OSError, ValueError) as exc:
        return _fail(f"{type(exc).__name__}: {exc}", url)
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
