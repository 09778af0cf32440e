"""A second, spawned process that acts on a buffer when the test says so: each command runs
to completion in the peer before the call returns, so a test places another process's
change at exactly the moment it means (between this process's draw and its commit, right
after a clear, ...)."""

from __future__ import annotations

from typing import Any

import numpy as np
from process_helpers import fresh_context


def serve_commands(conn: Any, handle: Any) -> None:
    """Answer the test's commands on ``conn`` until "stop": each is ``handle(command,
    args)``, run to completion; an exception goes back as an error the test fails on."""
    while True:
        command, args = conn.recv()
        if command == "stop":
            conn.send(("ok", None))
            return
        try:
            conn.send(("ok", handle(command, args)))
        except Exception as exc:  # reported to the test, which fails on it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _serve(url: str, name: str, options: dict[str, Any], conn: Any) -> None:
    from redisbuf import PERSampler, ReplayBuffer

    sampler = PERSampler(**options["per"]) if "per" in options else None

    def make() -> ReplayBuffer:
        return ReplayBuffer(url, name, capacity=options.get("capacity", 1000),
                            sampler=sampler, prioritized_sampling=options.get("softmax", False),
                            seed=11)

    buffer = make()

    def handle(command: str, args: dict[str, Any]) -> Any:
        nonlocal buffer
        if command == "add":
            log_rewards = np.asarray(args["log_rewards"], dtype=np.float64)
            return buffer.add({"x": np.arange(len(log_rewards)), "log_rewards": log_rewards},
                              priorities=args.get("priorities")).ids.tolist()
        if command == "update_priority":
            return buffer.update_priority(args["ids"], args["priorities"])
        if command == "sample":
            info = buffer.sample_with_info(args["n"], replacement=args.get("replacement"))
            return [int(i) for i in info.ids]
        if command == "clear":
            return buffer.clear()
        if command == "drop_and_create":
            buffer.drop()
            buffer = make()
            return None
        raise ValueError(f"unknown command {command!r}")

    serve_commands(conn, handle)


class Peer:
    """A spawned process holding its own buffer (and so its own replica) of ``name``:
    a ReplayBuffer, or what ``serve`` (a module-level function, as spawning needs) makes."""

    def __init__(self, url: str, name: str, serve: Any = _serve, **options: Any) -> None:
        ctx = fresh_context()
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=serve, args=(url, name, options, child), daemon=True)
        self.process.start()

    def __call__(self, command: str, **args: Any) -> Any:
        self._conn.send((command, args))
        if not self._conn.poll(120):
            raise TimeoutError(f"peer did not answer {command!r} in 120 s")
        status, value = self._conn.recv()
        if status != "ok":
            raise AssertionError(f"peer {command!r} failed: {value}")
        return value

    def stop(self) -> None:
        if self.process.is_alive():
            try:
                self("stop")
            except (TimeoutError, OSError, EOFError):
                pass
            self.process.join(10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(10)
