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
functions     :mod:`redisbuf.cli.functions` (the FCALL library)
acl           :mod:`redisbuf.cli.acl` (per-buffer ACL roles)
============  ===================================================================

Shared by all (:mod:`redisbuf.cli._common`): ``--url`` (default ``$REDISBUF_URL``),
``--json`` (one JSON document on stdout, nothing else there), and errors: a user error
is one red line on stderr and exit code 1; Ctrl-C exits 130 and SIGTERM 143.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

if TYPE_CHECKING:
    from ._common import CommandError

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT
EXIT_TERMINATED = 143  # 128 + SIGTERM

#: every command, in ``redisbuf --help`` order: its module in this package and the one
#: line that help shows. Only the module of the command being run is imported (the
#: modules import redis, numpy, rich), so ``redisbuf --help`` imports none of them.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "several worker processes add to and sample from one shared buffer"),
    "inspect": (
        "inspect",
        "show what a buffer of any class holds: configuration, counters, top items, keys",
    ),
    "list": (
        "listing",
        "every buffer in a Redis database: class, kind, length / capacity, memory, last insert",
    ),
    "watch": (
        "watch",
        "a live view of a buffer: fill, rates, manager, log-reward histogram, top items",
    ),
    "plot": ("plot", "plot a buffer's log-reward histogram and rate history to an image file"),
    "export": ("transfer", "write a buffer to a file (the save format), with a progress bar"),
    "import": ("transfer", "load a file written by export / ReplayBuffer.save into a buffer"),
    "drop": ("drop", "delete a buffer (asks first unless --yes)"),
    "metrics": (
        "metrics",
        "serve Prometheus metrics of all or the named buffers (every class) over HTTP",
    ),
    "functions": (
        "functions",
        "install the FCALL library (rb_add, rb_sample_uniform...) for clients in any language",
    ),
    "acl": ("acl", "print (or apply) the ACL SETUSER line of a per-buffer role"),
    "worker": (
        "worker",
        "one demo worker in the foreground (e.g. one container of docker-compose)",
    ),
    "manager": (
        "manager",
        "run the replay-buffer manager of a buffer over the Redis control plane",
    ),
}

__all__ = [
    "COMMANDS",
    "EXIT_ERROR",
    "EXIT_INTERRUPTED",
    "EXIT_TERMINATED",
    "CommandError",
    "build_parser",
    "main",
]


def __getattr__(name: str) -> Any:
    if name == "CommandError":  # imported on use: it needs redisbuf.errors, hence redis
        from ._common import CommandError

        return CommandError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def build_parser(commands: Collection[str] | None = None) -> argparse.ArgumentParser:
    """The ``redisbuf`` argument parser. The modules of ``commands`` (default: all)
    register their full parsers; every other command gets a stub that only lists it
    with its one-line help, enough for ``redisbuf --help``."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="redisbuf",
        description="A replay buffer shared by many processes, stored in Redis.",
    )
    parser.add_argument("--version", action="version", version=f"redisbuf {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    full = {module for name, (module, _) in COMMANDS.items()
            if commands is None or name in commands}
    for name, (module, summary) in COMMANDS.items():
        if name in subparsers.choices:
            continue  # registered with another command of its module (export / import)
        if module in full:
            importlib.import_module(f".{module}", __name__).register(subparsers)
        else:
            subparsers.add_parser(name, help=summary, add_help=False)
    return parser


def command_in(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not an option; the top-level
    options take no value), or None (``--help``, ``--version``, nothing)."""
    return next((word for word in argv if not word.startswith("-")), None)


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
    from rich.markup import escape

    from ._common import error_console

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
    argv = sys.argv[1:] if argv is None else list(argv)
    command = command_in(argv)
    parser = build_parser(() if command is None else (command,))
    args = parser.parse_args(argv)
    # SIGTERM stops workers and the embedded server like Ctrl-C (`worker` overrides it)
    signal.signal(signal.SIGTERM, _on_sigterm)
    import redis

    from ..errors import RedisBufError
    from ._common import error_console, resolve_url

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
