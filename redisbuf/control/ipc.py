"""Small messages from worker processes to their parent, as msgpack over a pipe.

``multiprocessing.Queue`` pickles what it carries; this queue carries msgpack bytes
(numbers, strings, lists, dicts; tuples come back as lists), so nothing crossing a
process boundary is pickled. Replay data never travels here: it goes through Redis.
"""

from __future__ import annotations

import queue
from typing import Any

from ..store.codec import packb, unpackb


class MessageQueue:
    """Many writers, one reader. Create it in the parent from a multiprocessing context
    and pass it to the children as a ``Process`` argument."""

    def __init__(self, context: Any) -> None:
        self._reader, self._writer = context.Pipe(duplex=False)
        # send_bytes may take several writes: one writer at a time keeps frames whole
        self._lock = context.Lock()

    def put(self, message: Any) -> None:
        data = packb(message)
        with self._lock:
            self._writer.send_bytes(data)

    def get(self, timeout: float | None = None) -> Any:
        """The next message; raises ``queue.Empty`` after ``timeout`` seconds without one."""
        if not self._reader.poll(timeout):
            raise queue.Empty
        return unpackb(self._reader.recv_bytes())

    def close(self) -> None:
        """Close this process's ends of the pipe."""
        self._reader.close()
        self._writer.close()
