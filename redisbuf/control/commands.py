"""Command-line subcommands of the control plane (``redisbuf manager ...``)."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Add the control-plane subcommands to the ``redisbuf`` parser."""
