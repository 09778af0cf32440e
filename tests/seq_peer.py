"""A second, spawned process holding its own SequenceBuffer of a name, acting when the test
says so (each command runs to completion before the call returns), so a test places another
process's change at the moment it means: between this process's draw and its commit."""

from __future__ import annotations

import functools
from typing import Any

from peer_process import Peer, serve_commands


def _serve(url: str, name: str, options: dict[str, Any], conn: Any) -> None:
    import numpy as np

    from redisbuf import SequenceBuffer

    buffer = SequenceBuffer(url, name, **options)

    def handle(command: str, args: dict[str, Any]) -> Any:
        if command == "add":
            envs = np.asarray(args["envs"])
            return buffer.add_batch({"env": envs, "done": np.zeros(len(envs), bool)},
                                    env_ids=envs).tolist()
        if command == "update_priority":
            return buffer.update_priority(args["envs"], args["positions"], args["priorities"])
        raise ValueError(f"unknown command {command!r}")

    serve_commands(conn, handle)


#: A spawned process with its own SequenceBuffer ``name`` (keyword options as the
#: constructor's after the name).
SequencePeer = functools.partial(Peer, serve=_serve)
