"""The control plane's command (``redisbuf manager``); it lives in
:mod:`redisbuf.cli.manager` with the other commands. Kept so that
``python -m redisbuf.control.commands manager NAME --workers N`` still works."""

from __future__ import annotations

import sys

from ..cli.manager import register, run_manager

__all__ = ["main", "register", "run_manager"]


def main(argv: list[str] | None = None) -> int:
    """``redisbuf`` with these arguments (e.g. ``["manager", NAME, "--workers", "4"]``)."""
    from ..cli import main as cli_main

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
