"""FragmentBuffer: chunks of consecutive fragments (MineStudio's ``ReplayBufferActor``).

Actors add fixed-length fragments of their streams; ``fragments_per_chunk`` consecutive
fragments of one stream become a chunk; learners ``fetch`` random chunks. A model version
and a session id (set by :meth:`FragmentBuffer.update_model_version`) decide which data is
still fresh. Every operation is one Lua script, so any number of processes share one
buffer and each sees MineStudio's single-actor behaviour.

=================================  ======  ==============================================
key                                type    content
=================================  ======  ==============================================
``rb:{name}:fragments:meta``       hash    configuration, current ``version`` and
                                           ``session``, id counters, counters, metric
                                           sums, rate history (``hist:*``,
                                           ``last_insert``)
``rb:{name}:fragments:frags``      hash    fragment id -> msgpack blob (stored once)
``rb:{name}:fragments:finfo``      hash    fragment id -> JSON [stream, index, version,
                                           session]
``rb:{name}:fragments:refs``       hash    fragment id -> references (pending list, chunk)
``rb:{name}:fragments:pending``    hash    stream id -> JSON list of fragment ids not yet
                                           in a chunk
``rb:{name}:fragments:streams``    hash    stream id -> fragments added (next index)
``rb:{name}:fragments:chunks``     zset    chunk id -> chunk id (age order)
``rb:{name}:fragments:cinfo``      hash    chunk id -> JSON {stream, version, session,
                                           uses, fragments, indices}
``rb:{name}:fragments:cversions``  zset    chunk id -> model version
=================================  ======  ==============================================

A fragment's bytes are deleted in the same script that drops its last reference. Fetches
wait on the pub/sub channel ``rb:{name}:fragments:changed`` (the meta key with ``meta``
replaced by ``changed``), which ``fragment_add`` publishes to whenever it stores a chunk:
a message reaches every waiting process (a token popped with BLPOP would wake one).
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigMismatchError, FetchTimeoutError, InvalidBatchError
from ..sampling.uniforms import packed_uniforms
from ..sampling.waiting import wait_for
from ..store import codec, scripts
from ..store.connection import as_client
from ..store.keys import PREFIX, decode_meta, validate_name

FORMAT_VERSION = 1
_CONFIG = ("max_chunks", "fragments_per_chunk", "max_staleness", "max_reuse")


@dataclass(frozen=True)
class FragmentKeys:
    """The key names (and wake-up channel) of the fragment buffer called ``name``."""

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:fragments:{suffix}"

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def chunks(self) -> str:
        return self._key("chunks")

    @property
    def pending(self) -> str:
        return self._key("pending")

    @property
    def frags(self) -> str:
        return self._key("frags")

    @property
    def refs(self) -> str:
        return self._key("refs")

    @property
    def changed(self) -> str:
        """Pub/sub channel (not a key) told when a chunk is stored."""
        return self._key("changed")

    def all_keys(self) -> list[str]:
        """In the order every fragment script takes them (see lua/_fragments.lua)."""
        return [
            self._key(suffix)
            for suffix in (
                "meta", "frags", "finfo", "refs", "pending", "streams", "chunks", "cinfo",
                "cversions",
            )
        ]

    def describe(self) -> dict[str, str]:
        """Key name -> what it holds (the table of this module's docstring), for people
        reading the buffer with redis-cli; in the order of :meth:`all_keys`."""
        return dict(zip(self.all_keys(), (
            "hash: configuration, model version and session, id counters, counters "
            "(chunks_added, chunks_evicted, fetched: chunks), metric sums",
            "hash: fragment id -> msgpack blob (stored once)",
            "hash: fragment id -> JSON [stream, index, version, session]",
            "hash: fragment id -> references (pending list, chunk)",
            "hash: stream id -> JSON list of fragment ids not yet in a chunk",
            "hash: stream id -> fragments added (next index)",
            "zset: chunk id -> chunk id (age order)",
            "hash: chunk id -> JSON {stream, version, session, uses, fragments, indices}",
            "zset: chunk id -> model version",
        ), strict=True))


@dataclass
class AddedFragment:
    """What one ``add_fragment`` did: the fragment's id and index in its stream, the id of
    the chunk it completed (``None`` if none), chunks evicted to make room, and pending
    fragments of the stream discarded as too stale or of another session."""

    fragment_id: int
    index: int
    chunk_id: int | None
    evicted: int
    discarded: int


@dataclass
class Chunk:
    """One fetched chunk: ``fragments_per_chunk`` consecutive fragments of one stream.

    ``indices`` are the fragments' positions in their stream (MineStudio's
    ``FragmentIndex.fid_in_worker``); ``model_version`` and ``session_id`` are those of
    its first fragment; ``use_count`` includes this fetch; ``staleness`` is the current
    model version minus ``model_version`` at the fetch.

    Attributes:
        chunk_id: the chunk's id.
        stream_id: its stream.
        model_version: as above.
        session_id: as above.
        use_count: as above.
        staleness: as above.
        fragment_ids: the fragments' ids.
        indices: as above.
        fragments: the fragments, as added.
    """

    chunk_id: int
    stream_id: str
    model_version: int
    session_id: str
    use_count: int
    staleness: int
    fragment_ids: list[int]
    indices: list[int]
    fragments: list[Any]


def _int_at_least(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


class FragmentBuffer:
    """MineStudio's replay buffer of chunks, stored in Redis under ``name``.

    Args:
        redis_or_url: a ``redis.Redis`` client (``decode_responses=False``), a URL, or
            ``None`` for ``$REDISBUF_URL``.
        name: buffer name (letters, digits, ``_ . -``).
        max_chunks: most chunks kept; storing one more evicts the oldest.
        fragments_per_chunk: consecutive fragments of one stream that make a chunk.
        max_staleness: a fragment or chunk of model version ``v`` is fresh while
            ``current_version - v <= max_staleness``.
        max_reuse: a chunk is dropped once fetched this many times.
        seed: seeds this process's sampling random numbers.

    The configuration is fixed at creation; opening an existing buffer with other values
    raises :class:`ConfigMismatchError` (``None`` everywhere adopts the stored ones). The
    current model version starts at -1 and the session at ``""``, as in MineStudio, so
    fragments are discarded until :meth:`update_model_version` names their session.

    Raises:
        ValueError: some but not all of the four settings given, or one out of range.
        ConfigMismatchError: the stored configuration differs, or none is stored and
            none was given.

    Examples:
        >>> import fakeredis
        >>> from redisbuf import FragmentBuffer
        >>> buffer = FragmentBuffer(fakeredis.FakeRedis(), "demo", max_chunks=4,
        ...                         fragments_per_chunk=2, max_staleness=1, max_reuse=2)
        >>> buffer.update_model_version("run", 0)
        0
        >>> [buffer.add_fragment(step, 0, "run", "w0").chunk_id for step in ("a", "b")]
        [None, 1]
        >>> chunk, = buffer.fetch(1)
        >>> chunk.fragments, chunk.use_count
        (['a', 'b'], 1)
    """

    def __init__(
        self,
        redis_or_url: Any = None,
        name: str = "fragments",
        max_chunks: int | None = None,
        fragments_per_chunk: int | None = None,
        max_staleness: int | None = None,
        max_reuse: int | None = None,
        *,
        seed: int | None = None,
    ) -> None:
        asked = dict(zip(_CONFIG, (max_chunks, fragments_per_chunk, max_staleness, max_reuse),
                         strict=True))
        given = {k: v for k, v in asked.items() if v is not None}
        for key, value in given.items():
            _int_at_least(value, key, 0 if key == "max_staleness" else 1)
        if given and len(given) != len(_CONFIG):
            raise ValueError(
                f"give all of {', '.join(_CONFIG)} to create a fragment buffer, or none to "
                f"open one; missing: {sorted(set(_CONFIG) - set(given))}"
            )
        self.client = as_client(redis_or_url)
        self.keys = FragmentKeys(name)
        self.name = name
        self.rng = np.random.default_rng(seed)
        if given:
            reply = self._run(
                "fragment_init",
                [*(given[k] for k in _CONFIG), FORMAT_VERSION, int(time.time())],
                [self.keys.meta],
            )
            meta = _pairs(reply)
        else:
            raw = self.client.hgetall(self.keys.meta)
            meta = decode_meta(raw)
            if not meta:
                raise ConfigMismatchError(
                    f"fragment buffer {name!r} does not exist; give its configuration"
                )
        if meta.get("kind") != "fragments":
            raise ConfigMismatchError(
                f"{self.keys.meta} is not a fragment buffer's meta (fields: {sorted(meta)})"
            )
        stored = {k: int(meta[k]) for k in _CONFIG}
        differ = {k: (stored[k], v) for k, v in given.items() if stored[k] != v}
        if differ:
            raise ConfigMismatchError(
                f"fragment buffer {name!r} has "
                + ", ".join(f"{k}={s} (asked {a})" for k, (s, a) in differ.items())
            )
        self.max_chunks = stored["max_chunks"]
        self.fragments_per_chunk = stored["fragments_per_chunk"]
        self.max_staleness = stored["max_staleness"]
        self.max_reuse = stored["max_reuse"]

    def _run(self, script: str, args: list[Any], keys: list[str] | None = None) -> Any:
        return scripts.load(script)(self.client, keys or self.keys.all_keys(), args)

    # -- writing ---------------------------------------------------------------------

    def add_fragment(
        self, fragment: Any, model_version: int, session_id: str, stream_id: str
    ) -> AddedFragment:
        """Add the next fragment of ``stream_id`` (MineStudio's ``worker_uuid``).

        Fragments of a stream are numbered 0, 1, 2... in the order they arrive. The
        stream's pending fragments are first trimmed from the front while too stale or of
        another session than the current one; ``fragments_per_chunk`` pending fragments
        then become a chunk with the first one's version and session, evicting the oldest
        chunk when ``max_chunks`` are stored. ``fragment`` is any msgpack-able value
        (arrays, tensors, dicts, lists, numbers, strings, bytes); a value that cannot be
        encoded raises :class:`InvalidBatchError` and writes nothing.

        Args:
            fragment: any msgpack-able value.
            model_version: the version that produced it.
            session_id: the session that produced it.
            stream_id: its stream.

        Returns:
            Its id and index, the chunk it completed, chunks evicted and fragments
            discarded.

        Raises:
            InvalidBatchError: ``fragment`` cannot be encoded, ``model_version`` is not an
                integer below ``10**12`` in magnitude, or an id is not a str.
        """
        version = _version(model_version)
        if not isinstance(session_id, str) or not isinstance(stream_id, str):
            raise InvalidBatchError("session_id and stream_id must be str")
        try:
            blob = codec.packb(fragment)
        except (TypeError, ValueError, OverflowError) as exc:
            raise InvalidBatchError(f"the fragment cannot be encoded: {exc}") from exc
        reply = self._run(
            "fragment_add", [blob, version, session_id, stream_id, self.keys.changed]
        )
        return AddedFragment(
            fragment_id=int(reply[0]),
            index=int(reply[1]),
            chunk_id=int(reply[2]) if reply[2] else None,
            evicted=int(reply[3]),
            discarded=int(reply[4]),
        )

    def update_model_version(self, session_id: str, model_version: int) -> int:
        """Make ``model_version`` of ``session_id`` current and drop every chunk now too
        stale, or every chunk when the session changed. Returns how many were dropped.
        (Unlike MineStudio, which stops at the first fresh chunk, stale chunks anywhere
        in the buffer go.)

        Args:
            session_id: the session whose version this is.
            model_version: the version made current.

        Returns:
            How many chunks were dropped.
        """
        if not isinstance(session_id, str):
            raise InvalidBatchError("session_id must be str")
        return int(self._run("fragment_update_version", [session_id, _version(model_version)]))

    # -- reading ---------------------------------------------------------------------

    def _try_fetch(self, n_chunks: int) -> list[Chunk] | None:
        reply = self._run("fragment_fetch", [n_chunks, packed_uniforms(self.rng, n_chunks)])
        if len(reply) == 1:
            return None
        chunks = []
        for entry in reply[1:]:
            info = json.loads(entry[1])
            current = int(entry[2])
            chunks.append(
                Chunk(
                    chunk_id=int(entry[0]),
                    stream_id=info["stream"],
                    model_version=int(info["version"]),
                    session_id=info["session"],
                    use_count=int(info["uses"]),
                    staleness=current - int(info["version"]),
                    fragment_ids=[int(f) for f in info["fragments"]],
                    indices=[int(i) for i in info["indices"]],
                    fragments=[codec.unpackb(blob) for blob in entry[3:]],
                )
            )
        return chunks

    def fetch(self, n_chunks: int, timeout: float | None = None) -> list[Chunk]:
        """``n_chunks`` distinct chunks drawn uniformly, waiting until that many are
        stored (MineStudio's ``fetch_fragments`` for ``n_chunks * fragments_per_chunk``
        fragments).

        Each fetched chunk counts one use; a chunk reaching ``max_reuse`` uses is dropped
        (its fragments were read in the same atomic step). Stale chunks are dropped first.
        The wait sleeps on a pub/sub channel told by every stored chunk (no polling; a
        re-check every 2 s covers a message lost to a dropped connection);
        ``timeout`` seconds (``None``: no limit) without enough chunks raises
        :class:`FetchTimeoutError`.

        Args:
            n_chunks: how many chunks (at most ``max_chunks``).
            timeout: the longest wait in seconds, or ``None``.

        Returns:
            The chunks.

        Raises:
            ValueError: ``n_chunks`` is not positive or exceeds ``max_chunks``.
            FetchTimeoutError: ``timeout`` passed without enough chunks.
        """
        n_chunks = _int_at_least(n_chunks, "n_chunks", 1)
        if n_chunks > self.max_chunks:
            raise ValueError(f"n_chunks={n_chunks} exceeds max_chunks={self.max_chunks}")
        return wait_for(
            self.client,
            self.keys.meta,  # its change channel is keys.changed, told by fragment_add
            lambda: self._try_fetch(n_chunks),
            timeout,
            lambda: f"fragment buffer {self.name!r}: fewer than {n_chunks} chunks "
            f"after {timeout} s",
            error=FetchTimeoutError,
        )

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """MineStudio's metrics and the buffer's counters.

        ``avg_reuse``: the mean use count of chunks that left the buffer (evicted,
        discarded as stale or of another session, or used up at ``max_reuse``), pending
        fragments discarded on arrival counting 0, each weighted by
        ``fragments_per_chunk`` as MineStudio's ``MeanMetric`` updates are.
        ``avg_staleness``: the mean of ``current version - chunk version`` over chunks
        used up at ``max_reuse``. Both are NaN before their first update and cover
        everything since the last ``stats(reset=True)``, which zeroes them atomically
        with the read (MineStudio resets after each fetch's report). Also: ``chunks``,
        ``pending_streams``, ``model_version``, ``session_id`` and the counters
        ``fragments_added``, ``fragments_discarded``, ``chunks_added``,
        ``chunks_evicted``, ``chunks_discarded``, ``chunks_used_up``, ``fetched``.

        Args:
            reset: zero ``avg_reuse`` and ``avg_staleness`` with the read.

        Returns:
            A dict of those values.
        """
        reply = self._run(
            "fragment_stats",
            ["1" if reset else "0"],
            [self.keys.meta, self.keys.chunks, self.keys.pending],
        )
        meta = _pairs(reply[0])

        def mean(name: str) -> float:
            weight = float(meta.get(f"{name}_weight", 0))
            return float(meta[f"{name}_sum"]) / weight if weight else math.nan

        out: dict[str, Any] = {
            "avg_reuse": mean("reuse"),
            "avg_staleness": mean("staleness"),
            "chunks": int(reply[1]),
            "pending_streams": int(reply[2]),
            "model_version": int(meta["version"]),
            "session_id": meta["session"],
        }
        for key in (
            "fragments_added", "fragments_discarded", "chunks_added", "chunks_evicted",
            "chunks_discarded", "chunks_used_up", "fetched",
        ):
            out[key] = int(meta[key])
        return out

    def __len__(self) -> int:
        """Number of stored chunks."""
        return int(self.client.zcard(self.keys.chunks))

    def num_fragments(self) -> int:
        """Number of fragments whose bytes are stored (in chunks or pending).

        Returns:
            The number of fragments.
        """
        return int(self.client.hlen(self.keys.frags))

    def clear(self) -> int:
        """Remove every chunk and fragment (configuration, version, session and
        counters stay); returns the number of chunks removed.

        Returns:
            The number of chunks removed.
        """
        return int(self._run("fragment_clear", []))

    def drop(self) -> None:
        """Delete every key of this buffer, configuration included."""
        self.client.delete(*self.keys.all_keys())


def _version(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InvalidBatchError(f"model_version must be an integer, got {value!r}")
    if abs(int(value)) >= 10**12:
        raise InvalidBatchError(f"model_version {value} is out of range (|v| < 10**12)")
    return int(value)


def _pairs(reply: list[Any]) -> dict[str, str]:
    return {
        k.decode(): v.decode() for k, v in zip(reply[::2], reply[1::2], strict=True)
    }
