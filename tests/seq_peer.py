"""A second, spawned process holding its own SequenceBuffer of a name, acting when the test
says so (each command runs to completion before the call returns), so a test places another
process's change at the moment it means: between this process's draw and its commit."""

from __future__ import annotations

import multiprocessing
from typing import Any


def _serve(url: str, name: str, options: dict[str, Any], conn: Any) -> None:
    import numpy as np

    from redisbuf import SequenceBuffer

    buffer = SequenceBuffer(url, name, **options)
    while True:
        command, args = conn.recv()
        try:
            if command == "stop":
                conn.send(("ok", None))
                return
            if command == "add":
                envs = np.asarray(args["envs"])
                positions = buffer.add_batch({"env": envs, "done": np.zeros(len(envs), bool)},
                                             env_ids=envs)
                conn.send(("ok", positions.tolist()))
            elif command == "update_priority":
                conn.send(("ok", buffer.update_priority(args["envs"], args["positions"],
                                                        args["priorities"])))
            else:
                conn.send(("error", f"unknown command {command!r}"))
        except Exception as exc:  # reported to the test, which fails on it
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


class SequencePeer:
    """A spawned process with its own SequenceBuffer ``name`` (keyword ``options`` as the
    constructor's after the name)."""

    def __init__(self, url: str, name: str, **options: Any) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_serve, args=(url, name, options, child), daemon=True)
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
