"""What :class:`~redisbuf.buffers.replay.ReplayBuffer` offers besides adding, drawing and
priorities: reading items by id, inspecting (length, ``top``, ``stats``, memory), the data
lifetime's model version, and the lifecycle (``remove``, ``close``, ``clear``, ``drop``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Self

import numpy as np
import redis

from ..sampling import lifetime
from ..store import applying, bounds
from ..store.keys import decode_meta, format_id, keeps_rewards

if TYPE_CHECKING:
    from .needs import InspectingNeeds as _InspectingNeeds
else:
    _InspectingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

# Ids one lua/priority_read.lua call reads (RB_PRIORITY_IDS there)
PRIORITY_READ_IDS = 16



class Inspecting(_InspectingNeeds):
    """A mixin of :class:`~redisbuf.buffers.replay.ReplayBuffer`: the buffer provides
    ``client``, ``keys``, ``name``, ``capacity``, ``sampler``, ``_config``, ``_rates``,
    ``_owns_client``, ``_run``, ``decode`` and ``_forget_schema``."""

    def get(self, ids: list[int] | np.ndarray) -> Any:
        """The items with these ids, as one batch (KeyError names any id not present).

        Read by HMGETs of at most :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`
        ids (and about :data:`~redisbuf.store.bounds.MAX_REPLY_BYTES` of blobs) each, so
        a large call never holds the server for long; it is then not one atomic read:
        an item evicted between two of them is named by the KeyError.

        Args:
            ids: the items' ids.

        Returns:
            One batch of the buffer's kind, in the order of ``ids``.

        Raises:
            KeyError: an id is not in the buffer.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> ids = buffer.add({"obs": np.array([7.0, 8.0]), "log_rewards": np.zeros(2)}).ids
            >>> buffer.get([ids[1], ids[0]])["obs"].tolist()
            [8.0, 7.0]
        """
        ids = [int(i) for i in ids]
        members = [format_id(i) for i in ids]
        step = bounds.MAX_ITEMS_PER_COMMAND
        pipe = self.client.pipeline(transaction=False)
        pipe.hmget(self.keys.items, members[:step])
        pipe.hget(self.keys.meta, "schema")
        blobs, schema_json = pipe.execute()
        start = len(blobs)
        while start < len(members):
            present = [len(blob) for blob in blobs if blob is not None]
            step = bounds.items_for_bytes(sum(present) / len(present) if present else 0)
            blobs += self.client.hmget(self.keys.items, members[start : start + step])
            start += step
        missing = [i for i, blob in zip(ids, blobs, strict=True) if blob is None]
        if missing:
            raise KeyError(f"ids not in buffer {self.name!r}: {missing[:10]}")
        return self.decode(blobs, ids, schema_json)

    def priorities(self, ids: list[int] | np.ndarray, *, follow: bool = False) -> np.ndarray:
        """The current PER priority of each of ``ids`` (NaN for an id not stored), read on
        the server from where the priorities are (the mass log and the snapshot behind
        it) by lua/priority_read.lua, the script FCALL ``rb_priority`` runs: no replica
        is made. Each command of at most 16 ids is one atomic read; its cost grows with
        the log's length (see docs/wire-format.md). Above 64 ids, or where this process
        holds a replica of the priorities, they are read from that replica (or one made
        for the call, read-only), caught up now: the same values, in a few large reads.

        Args:
            ids: the items' ids.
            follow: read them from this process's replica, made now and kept when it has
                none (later calls only catch it up): for a process that reads priorities
                on every draw (Reverb's sample info under any sampler).

        Returns:
            float64 priorities, in the order of ``ids``.

        Raises:
            ConfigMismatchError: the buffer has no PER priorities.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import PERSampler, ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", sampler=PERSampler())
            >>> ids = buffer.add({"obs": np.arange(2.0), "log_rewards": np.zeros(2)}).ids
            >>> _ = buffer.update_priority([ids[1]], [2.5])
            >>> buffer.priorities([ids[0], ids[1], 99]).tolist()
            [1.0, 2.5, nan]
        """
        wanted = [int(i) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
        keys = self.keys
        if follow or len(wanted) > 4 * PRIORITY_READ_IDS or "per" in self.view.replicas:
            return self._priorities_from_replica(np.array(wanted, dtype=np.int64), follow)
        out = np.full(len(wanted), np.nan)
        for start in range(0, len(wanted), PRIORITY_READ_IDS):
            part = wanted[start : start + PRIORITY_READ_IDS]
            reply = self._run("priority_read", [keys.meta, keys.order, keys.masslog,
                                                keys.snap, keys.per_heap, keys.per], part)
            out[start : start + len(part)] = [np.nan if v is None else float(v) for v in reply]
        return out

    def _priorities_from_replica(self, ids: np.ndarray, keep: bool) -> np.ndarray:
        """:meth:`priorities` of many ids (or with this process's replica): from a
        replica caught up now, this process's (made and kept when ``keep``) or, without
        one, a read-only one of this call's own (``readable_replica``: no pin, no snapshot
        written)."""
        from ..errors import ConfigMismatchError
        from ..sampling.replica import readable_replica

        if self.client.hget(self.keys.meta, "mass") not in (b"per", "per"):
            raise ConfigMismatchError(
                f"buffer {self.name!r} has no PER priorities (use PERSampler)")
        replica = readable_replica(self.view, "per", keep=keep)
        with replica.lock:
            replica.sync(self.view)
            slots = replica.slots_of(ids)
            out = np.where(slots >= 0, replica.scores[np.maximum(slots, 0)], np.nan)
        return out

    def close(self) -> None:
        """Release the connections of a client this buffer made (from a URL); a client
        passed in stays open (its owner closes it). The buffer's data stays in Redis.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> with ReplayBuffer(client, "demo") as buffer:  # leaving it calls close()
            ...     _ = buffer.add({"obs": [1.0], "log_rewards": [0.0]})
            >>> client.ping(), len(ReplayBuffer.open(client, "demo"))  # both still there
            (True, 1)
        """
        if self._owns_client:
            self.client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __len__(self) -> int:
        return len(self.view)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(name={self.name!r}, capacity={self.capacity}, "
            f"eviction={self._config.eviction!r}, sampler={self.sampler.name!r})"
        )

    def top(self, k: int = 10) -> list[tuple[int, float]]:
        """The ``k`` items of highest log-reward (priority) as ``(id, log_reward)``.

        Read :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` ranks per command: a
        ``k`` above that is not one atomic read (items added or evicted meanwhile shift
        the later ranks).

        Args:
            k: how many items.

        Returns:
            ``(id, log_reward)`` pairs, highest log-reward first; ``[]`` when ``k <= 0``.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", prioritized_capacity=True)
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.array([0.5, 2.0, 1.0])})
            >>> buffer.top(2)
            [(2, 2.0), (3, 1.0)]
        """
        if k <= 0:
            return []
        kept = keeps_rewards(self.client, self.keys)  # else all 0: the newest first
        rows: list[Any] = []
        step = bounds.MAX_ITEMS_PER_COMMAND
        while len(rows) < k:
            start = len(rows)
            part = self.client.zrevrange(self.keys.prio if kept else self.keys.order, start,
                                         min(start + step, k) - 1, withscores=True)
            rows += part
            if len(part) < min(step, k - start):
                break
        return [(int(member), float(score) if kept else 0.0) for member, score in rows]

    def stats(self) -> dict[str, Any]:
        """Counters, length, capacity and configuration, plus Redis memory of the keys;
        data lifetime (:func:`redisbuf.sampling.lifetime.lifetime_stats`: mean use count of present
        and removed items, mean staleness of sampled items, refused adds), priority
        min / mean / max, and insert / sample rates (items per second since this
        process's previous ``stats()``, or since creation on the first).

        Returns:
            A dict keyed by name (``length``, ``capacity``, ``inserted``, ``evicted``,
            ``sampled``, ``sampled_unique`` (items sampled at least once), ``deleted``
            (removed by :meth:`remove`), ``quarantined``, ...).

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", capacity=2)
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> stats = buffer.stats()
            >>> stats["length"], stats["inserted"], stats["evicted"]
            (2, 3, 1)
        """
        while True:
            pipe = self.client.pipeline(transaction=False)
            pipe.hgetall(self.keys.meta)
            pipe.zcard(self.keys.order)
            meta_raw, length = pipe.execute()
            meta = decode_meta(meta_raw)
            if "applying" not in meta:
                break
            applying.finish(self.client, self.keys.meta)  # counters of the whole add
        return {
            "name": self.name,
            "capacity": int(meta.get("capacity", self.capacity)),
            "length": int(length),
            "inserted": int(meta.get("inserted", 0)),
            "evicted": int(meta.get("evicted", 0)),
            "sampled": int(meta.get("sampled", 0)),
            "sampled_unique": int(meta.get("sampled_unique", 0)),
            "deleted": int(meta.get("deleted", 0)),
            "last_id": int(meta.get("last_id", 0)),
            "kind": meta.get("kind"),
            "eviction": meta.get("eviction"),
            "prioritized_sampling_ready": meta.get("masslog") == "1",
            "quarantined": int(meta.get("quarantined", 0)),
            "memory_bytes": self.memory_usage(),
            **lifetime.lifetime_stats(meta, int(length)),
            **lifetime.priority_stats(self.view, meta),
            **self._rates.rates(meta),
        }

    def update_model_version(self, session_id: str, model_version: int) -> int:
        """Make ``model_version`` of ``session_id`` current, for every process (MineStudio's
        argument order). A new session removes every item; with ``max_staleness``, items
        whose version is below ``model_version - max_staleness`` are removed, lowest
        versions first, in commands of at most :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS`
        items each (redisbuf/store/bounds.py): until the last of them, other processes may
        still draw an item being removed, and a version another process makes current
        meanwhile governs the removals left. Later adds are checked against these. Returns
        the number of items removed.

        Args:
            session_id: the session whose version this is.
            model_version: the version made current.

        Returns:
            The number of items removed.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", max_staleness=1)
            >>> batch = {"obs": np.arange(2.0), "log_rewards": np.zeros(2)}
            >>> _ = buffer.add(batch, model_version=0, session_id="run")
            >>> buffer.update_model_version("run", 2)
            2
            >>> buffer.add(batch, model_version=0, session_id="run").rejected
            'stale'
        """
        return lifetime.update_model_version(self.view, session_id, model_version)

    def memory_usage(self) -> int | None:
        """Bytes Redis reports for this buffer's keys (None if the server cannot say):
        its estimate from :data:`~redisbuf.store.bounds.MEMORY_USAGE_SAMPLES` elements of
        each key, exact for keys of no more elements (counting every element of a key of
        millions would hold the server for hundreds of milliseconds).

        Returns:
            Bytes, or ``None``.
        """
        total = 0
        try:
            for key in self.keys.all_keys():
                used = self.client.memory_usage(key, samples=bounds.MEMORY_USAGE_SAMPLES)
                total += int(used or 0)
        except redis.exceptions.ResponseError:
            return None
        return total

    # -- lifecycle ----------------------------------------------------------------------

    def clear(self) -> int:
        """Remove every item, reset the counters; keep capacity, kind and schema.
        Ids are never reused. Returns the number of items removed.

        Returns:
            The number of items removed.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> buffer.clear(), len(buffer)
            (3, 0)
            >>> buffer.add({"obs": np.zeros(1), "log_rewards": np.zeros(1)}).ids.tolist()
            [4]
        """
        return int(self._run("clear", self.keys.all_keys(), []))

    def drop(self) -> None:
        """Delete the buffer entirely, configuration included: every key under its tag
        (``rb:{name}:*``: its own, the control plane's, a load's staging keys) but those of
        an EpisodeBuffer, SequenceBuffer or FragmentBuffer of the same name and a sharded
        buffer's layout (see :meth:`BufferKeys.owns`).

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import ReplayBuffer
            >>> client = fakeredis.FakeRedis()
            >>> buffer = ReplayBuffer(client, "demo")
            >>> _ = buffer.add({"obs": np.arange(3.0), "log_rewards": np.zeros(3)})
            >>> buffer.drop()
            >>> client.keys("rb:{demo}:*")
            []
        """
        found = {
            key.decode() if isinstance(key, bytes) else key
            for key in self.client.scan_iter(match=self.keys.pattern, count=1000)
        }
        extra = sorted(key for key in found - set(self.keys.all_keys()) if self.keys.owns(key))
        # one script (lua/drop.lua): the buffer's own keys and whatever else of it the SCAN
        # found go together, and the server frees large values in the background
        self._run("drop", [*self.keys.all_keys(), *extra], [])
        self._forget_schema()
