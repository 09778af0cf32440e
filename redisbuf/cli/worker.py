"""``redisbuf worker``: one demo worker in the foreground (e.g. one container)."""

from __future__ import annotations

import argparse
import secrets
import signal
import time
from typing import Any

from ..demos.processes import _MANAGER_WAIT, wait_for_manager_buffer
from ..store.connection import redacted
from ..store.keys import BufferKeys
from ._common import (
    CommandError,
    add_json_argument,
    check_name,
    connect_args,
    console,
    error_console,
    print_json,
    safe,
)
from .demo import DEFAULT_CAPACITY, add_worker_options, demo_config


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "worker",
        help="one demo worker in the foreground (e.g. one container of docker-compose)",
        description=(
            "Add batches of HyperGrid trajectories to the buffer NAME and sample from it, "
            "until BATCHES batches are done (0: until SIGTERM / Ctrl-C). Creates the buffer "
            f"(capacity {DEFAULT_CAPACITY} unless --capacity) if it does not exist; an "
            "existing one keeps its capacity and eviction policy."
        ),
    )
    add_worker_options(parser, demo=False)
    parser.add_argument(
        "--report-every", type=float, default=10.0, help="seconds between progress lines"
    )
    parser.add_argument(
        "--manager", action="store_true",
        help="have every add scored by `redisbuf manager NAME` (Redis control plane) and "
        f"send it EXIT at the end; waits up to {_MANAGER_WAIT:.0f} s for the manager's "
        "buffer and adopts its capacity and eviction policy",
    )
    add_json_argument(
        parser, "progress lines on stderr; at the end one JSON document on stdout"
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..demos.processes import run_worker

    client, url = connect_args(args, "redisbuf worker")
    out = error_console() if args.json else console()
    try:
        check_name(args.name)
        stored = client.hmget(BufferKeys(args.name).meta, "capacity", "eviction")
        if args.manager and stored[0] is None:
            out.print(
                f"worker: waiting up to {_MANAGER_WAIT:.0f} s for `redisbuf manager "
                f"{safe(args.name)}` to create buffer {safe(args.name)} at "
                f"{safe(redacted(url))}",
                soft_wrap=True,
            )
            # before the graceful-stop handlers below: SIGTERM / Ctrl-C here end the
            # command at once (143 / 130), as there is nothing to finish yet
            wait_for_manager_buffer(client, args.name)
    finally:
        client.close()
    overrides: dict[str, Any] = {"workers": 1}
    overrides["seed"] = args.seed if args.seed is not None else secrets.randbits(31)
    if stored[0] is not None and not args.manager:
        # an existing buffer: adopt what was not asked for explicitly
        if args.capacity is None:
            overrides["capacity"] = int(stored[0])
        elif args.capacity != int(stored[0]):
            raise CommandError(
                f"buffer {args.name!r} exists with capacity {int(stored[0])}, not "
                f"{args.capacity} (capacity mismatch); leave out --capacity to adopt it"
            )
        if not args.prioritized_capacity:
            overrides["prioritized_capacity"] = stored[1] == b"reward"
    config = demo_config(args, url, **overrides)
    try:
        config.validate()
    except ValueError as exc:
        raise CommandError(str(exc)) from None
    stopping = False

    def stop(signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    totals = {"added": 0, "sampled": 0}
    last_report = time.monotonic()

    def on_batch(_index: int, added: int, sampled: int) -> None:
        nonlocal last_report
        totals["added"] += added
        totals["sampled"] += sampled
        if time.monotonic() - last_report >= args.report_every:
            last_report = time.monotonic()
            out.print(f"worker: {totals['added']} added, {totals['sampled']} sampled")

    out.print(f"worker: adding to buffer {safe(config.name)} at {safe(redacted(url))}")
    added, sampled = run_worker(config, 0, on_batch=on_batch, should_stop=lambda: stopping)
    out.print(f"worker: done, {added} added, {sampled} sampled")
    if args.json:
        print_json({"url": redacted(url), "name": config.name, "added": added,
                    "sampled": sampled})
    return 0

