"""Calls to every shard of a :class:`~redisbuf.buffers.sharded.ShardedReplayBuffer`: one
pipeline over the shards, one thread per shard, and taking back the draws some shards
recorded when another failed."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import numpy as np
import redis

from ..errors import ServerUnavailableError
from ..store import applying, scripts
from ..store.connection import LOST

if TYPE_CHECKING:
    from .replay import ReplayBuffer

# Errors that mean a shard's server is gone or its slot has no master right now (CLUSTERDOWN
# while a restarted master rejoins, MASTERDOWN, TRYAGAIN while its slot migrates). A
# pipeline reply may be one of these instead of raising it: see _per_shard.
SHARD_LOST = (
    ServerUnavailableError,
    *LOST,
    redis.exceptions.ClusterDownError,  # MasterDownError is one
    redis.exceptions.TryAgainError,
    redis.exceptions.SlotNotCoveredError,
    redis.exceptions.MaxConnectionsError,
)


class ShardCalls:
    """A mixin of :class:`~redisbuf.buffers.sharded_draws.ShardedSampling`: the buffer
    provides ``client``, ``count``, ``shards``, ``parallel`` and ``_on_shard``."""

    if TYPE_CHECKING:
        client: Any
        count: int
        shards: list[ReplayBuffer]
        parallel: bool
        _pool: ThreadPoolExecutor | None
        _pool_pid: int

        def _on_shard(self, k: int) -> Any: ...

    def _sizes(self) -> np.ndarray:
        """The shards' sizes (lua/len.lua each, in one pipeline): a shard storing a large
        add answers once it is stored whole (through its runner)."""
        script = scripts.load("len").read_only

        def command(pipe: Any, shard: ReplayBuffer) -> None:
            scripts.queue(pipe, self.client, script, [shard.keys.meta, shard.keys.order], [])

        replies = self._per_shard(command)
        if any(scripts.missing(r) for r in replies):
            scripts.reload(self.client, script)  # every master
            replies = self._per_shard(command)
        sizes = []
        for k, reply in enumerate(replies):
            if applying.refused(reply):
                with self._on_shard(k):
                    reply = len(self.shards[k].view)
            if isinstance(reply, redis.exceptions.ResponseError):
                raise scripts.translate(reply)
            if isinstance(reply, Exception):
                raise reply
            sizes.append(int(reply))
        return np.array(sizes, dtype=np.int64)

    def _per_shard(self, command: Any, only: list[int] | None = None) -> list[Any]:
        """``command(pipe, shard)`` (one command) for every shard (or the shards ``only``)
        in one pipeline (a cluster client sends each master its part at once) and the
        replies in shard order. When a server is lost, the shards are asked one by one, so
        that the error names the shard that failed; a reply that is such an error (a
        cluster pipeline returns CLUSTERDOWN and the like as replies) raises it as its
        shard's ShardUnavailableError too."""
        asked = list(range(self.count)) if only is None else only
        pipe = self.client.pipeline(transaction=False)
        for k in asked:
            command(pipe, self.shards[k])
        try:
            replies = list(pipe.execute(raise_on_error=False))
        except SHARD_LOST:
            replies = []
            for k in asked:
                with self._on_shard(k):
                    alone = self.client.pipeline(transaction=False)
                    command(alone, self.shards[k])
                    replies += alone.execute(raise_on_error=False)
        for k, reply in zip(asked, replies, strict=True):
            if isinstance(reply, SHARD_LOST):
                with self._on_shard(k):
                    raise reply
        return replies

    def _undo(self, draws: dict[int, Any]) -> None:
        """Take back the draws the shards recorded (lua/undo_draws.lua: their counts and
        use counts)."""
        for k, draw in draws.items():
            if not hasattr(draw, "ids"):  # a size, not a draw
                continue
            members = [b"%012d" % i for i in draw.ids]
            with self._on_shard(k):
                self.shards[k]._run("undo_draws", self.shards[k].keys.all_keys(), members)

    def _take_back(self, items: dict[int, list[int]]) -> None:
        """Take back draws of shard ``k``'s ``items[k]`` (its local ids; none: nothing
        asked), the shards asked at once (lua/undo_draws.lua: counts and use counts)."""

        def undo(k: int, members: list[bytes]) -> None:
            with self._on_shard(k):
                self.shards[k]._run("undo_draws", self.shards[k].keys.all_keys(), members)

        calls = {k: (undo, (k, [b"%012d" % i for i in ids])) for k, ids in items.items() if ids}
        if calls:
            self._in_parallel(calls)

    def _all_or_none(self, calls: dict[int, tuple[Any, tuple[Any, ...]]]) -> dict[int, Any]:
        """Each shard's draw (see :meth:`_in_parallel`); when one fails, the draws the
        others committed are taken back (lua/undo_draws.lua: their counts and use counts)
        before the error is raised, so a failed sample records nothing anywhere."""
        done: dict[int, Any] = {}
        failures: list[BaseException] = []

        def attempt(k: int, fn: Any, args: tuple[Any, ...]) -> Any:
            try:
                done[k] = fn(*args)
            except BaseException as exc:  # kept, raised once the others are undone
                failures.append(exc)
            return None

        self._in_parallel({k: (attempt, (k, fn, args)) for k, (fn, args) in calls.items()})
        if failures:
            self._undo(done)
            raise failures[0]
        return {k: done[k] for k in calls}

    def _in_parallel(self, calls: dict[int, tuple[Any, tuple[Any, ...]]]) -> dict[int, Any]:
        """``fn(*args)`` for each shard ``k`` of ``calls[k] = (fn, args)``, one thread each."""
        if len(calls) == 1 or not self.parallel:
            return {k: fn(*args) for k, (fn, args) in calls.items()}
        if self._pool is None or self._pool_pid != os.getpid():  # none survives a fork
            self._pool = ThreadPoolExecutor(self.count, thread_name_prefix="redisbuf-shard")
            self._pool_pid = os.getpid()
        futures = {k: self._pool.submit(fn, *args) for k, (fn, args) in calls.items()}
        return {k: future.result() for k, future in futures.items()}
