"""EpisodeBuffer: whole variable-length episodes as units (DI-engine's ``EpisodeReplayBuffer``).

Every step of every episode is one msgpack blob; the steps of all episodes share one
growing position counter, so an episode is the position range ``[start, start + T)``.
Pushing, evicting and sampling are each one Lua script, so every process sees whole
episodes only: a sampled episode or window is never half-evicted or half-written.

===============================  ======  ================================================
key                              type    content
===============================  ======  ================================================
``rb:{name}:episodes:meta``      hash    capacity, schema, ``last_id``, ``next_pos``,
                                         ``steps`` (live), ``pushed`` / ``evicted`` /
                                         ``sampled`` counters, rate history
                                         (``hist:*``, ``last_insert``)
``rb:{name}:episodes:index``     zset    episode id -> position of its first step
``rb:{name}:episodes:lens``      hash    episode id -> number of steps
``rb:{name}:episodes:steps``     hash    step position -> msgpack blob of the step
===============================  ======  ================================================

Episode ids are 12-digit zero-padded decimals, as item ids of :mod:`redisbuf.store.keys`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import ConfigMismatchError, InvalidBatchError
from ..sampling.uniforms import packed_uniforms
from ..store import _torch, codec, scripts
from ..store.connection import as_client
from ..store.keys import PREFIX, decode_meta, validate_name

FORMAT_VERSION = 1
# Rejection draws per window before the exact (scan every episode) fallback.
WINDOW_TRIES = 16
# Draw-then-HMGET rounds before sample_windows reads the remaining windows inside Lua.
_FETCH_ATTEMPTS = 3
_STEPS_FORM = "steps"


@dataclass(frozen=True)
class EpisodeKeys:
    """The key names of the episode buffer called ``name``."""

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:episodes:{suffix}"

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def index(self) -> str:
        return self._key("index")

    @property
    def lens(self) -> str:
        return self._key("lens")

    @property
    def steps(self) -> str:
        return self._key("steps")

    def all_keys(self) -> list[str]:
        """In the order every episode script takes them."""
        return [self.meta, self.index, self.lens, self.steps]

    def describe(self) -> dict[str, str]:
        """Key name -> what it holds (the table of this module's docstring), for people
        reading the buffer with redis-cli."""
        return {
            self.meta: "hash: capacity, schema, last_id, next_pos, steps, counters "
            "(pushed, evicted, sampled: episodes)",
            self.index: "zset: episode id -> position of its first step",
            self.lens: "hash: episode id -> number of steps",
            self.steps: "hash: step position -> msgpack blob of the step",
        }


@dataclass
class EpisodeSample:
    """Whole episodes (each in the form it was pushed), their ids and the global position
    of each one's first step.

    Attributes:
        episodes: the episodes, in draw order.
        ids: their ids (int64).
        starts: the global position of each one's first step (int64).
    """

    episodes: list[Any]
    ids: np.ndarray
    starts: np.ndarray


@dataclass
class Windows:
    """Fixed-length windows of stored episodes.

    ``data`` is a dict of arrays shaped ``[n, length, ...]`` when episodes were pushed as
    dicts of arrays, else a list of ``n`` lists of ``length`` steps. ``episode_ids[i]``
    holds window ``i``; ``offsets[i]`` is the index of its first step in that episode.

    Attributes:
        data: the windows' steps, as above.
        episode_ids: the episode of each window (int64).
        offsets: each window's first step within its episode (int64).
    """

    data: Any
    episode_ids: np.ndarray
    offsets: np.ndarray


def _is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or _torch.is_tensor(value)


class EpisodeBuffer:
    """Episodes stored in Redis under ``name``, shared by every process that opens it.

    An episode is either a dict of arrays / tensors sharing a leading (time) dimension
    ``T >= 1``, or a sequence (list, tuple) of ``T >= 1`` steps of any msgpack-able value
    (numbers, strings, bytes, arrays, dicts and lists of them). The first push fixes the
    buffer's form and, for dicts, the field names, dtypes and trailing shapes.

    Args:
        redis_or_url: a ``redis.Redis`` client (``decode_responses=False``), a URL, or
            ``None`` for ``$REDISBUF_URL``.
        name: buffer name (letters, digits, ``_ . -``).
        capacity_episodes: most episodes kept; a push beyond it evicts the oldest whole
            episode. ``None`` adopts the stored value of an existing buffer; another
            value than the stored one raises :class:`ConfigMismatchError`.
        seed: seeds this process's sampling random numbers.

    Raises:
        ValueError: ``capacity_episodes`` is not a positive integer.
        ConfigMismatchError: another ``capacity_episodes`` than the stored one.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import EpisodeBuffer
        >>> buffer = EpisodeBuffer(fakeredis.FakeRedis(), "demo", capacity_episodes=2)
        >>> [buffer.push({"obs": np.arange(float(t))}) for t in (3, 4, 5)]
        [1, 2, 3]
        >>> buffer.stats()
        {'steps': 9, 'pushed': 3, 'evicted': 1, 'sampled': 0, 'episodes': 2}
        >>> buffer.sample_windows(3, length=4).data["obs"].shape
        (3, 4)
    """

    def __init__(
        self,
        redis_or_url: Any = None,
        name: str = "episodes",
        capacity_episodes: int | None = 1000,
        *,
        seed: int | None = None,
    ) -> None:
        if capacity_episodes is not None and (
            isinstance(capacity_episodes, bool)
            or not isinstance(capacity_episodes, int)
            or capacity_episodes <= 0
        ):
            raise ValueError(
                f"capacity_episodes must be a positive integer, got {capacity_episodes!r}"
            )
        self.client = as_client(redis_or_url)
        self.keys = EpisodeKeys(name)
        self.name = name
        self.rng = np.random.default_rng(seed)
        if capacity_episodes is None:
            meta = self._meta()
            if not meta:
                raise ConfigMismatchError(
                    f"episode buffer {name!r} does not exist; give capacity_episodes to create it"
                )
        else:
            reply = self._run("episode_init", [capacity_episodes, FORMAT_VERSION, int(time.time())])
            meta = {k.decode(): v.decode() for k, v in zip(reply[::2], reply[1::2], strict=True)}
        if meta.get("kind") != "episodes" or "capacity" not in meta:
            raise ConfigMismatchError(
                f"{self.keys.meta} is not an episode buffer's meta (fields: {sorted(meta)})"
            )
        stored = int(meta["capacity"])
        if capacity_episodes is not None and stored != capacity_episodes:
            raise ConfigMismatchError(
                f"episode buffer {name!r} has capacity_episodes={stored}, "
                f"not {capacity_episodes}"
            )
        self.capacity_episodes = stored

    # -- plumbing ---------------------------------------------------------------------

    def _run(self, script: str, args: list[Any], keys: list[str] | None = None) -> Any:
        if keys is None:
            keys = [self.keys.meta] if script == "episode_init" else self.keys.all_keys()
        return scripts.load(script)(self.client, keys, args)

    def _meta(self) -> dict[str, str]:
        raw = self.client.hgetall(self.keys.meta)
        return decode_meta(raw)

    @staticmethod
    def _encode(episode: Any) -> tuple[str, list[bytes]]:
        """(schema text, one blob per step) of an episode; raises on malformed input."""
        if isinstance(episode, Mapping):
            if not episode:
                raise InvalidBatchError("an episode dict needs at least one field")
            schema: dict[str, list[Any]] = {}
            columns = []
            length = None
            for key, value in episode.items():
                if not isinstance(key, str):
                    raise InvalidBatchError(f"episode field names must be str, got {key!r}")
                if not _is_array(value) or value.ndim < 1:
                    raise InvalidBatchError(
                        f"episode field {key!r} must be an array or tensor with a time "
                        f"dimension, got {type(value).__name__}"
                    )
                if length is None:
                    length = int(value.shape[0])
                elif int(value.shape[0]) != length:
                    raise InvalidBatchError(
                        f"episode field {key!r} has {value.shape[0]} steps, others {length}"
                    )
                lib = "torch" if _torch.is_tensor(value) else "numpy"
                try:
                    columns.append(codec.Column(key, value))
                except TypeError as exc:
                    raise InvalidBatchError(f"episode field {key!r}: {exc}") from exc
                schema[key] = [lib, codec.dtype_name(value), list(value.shape[1:])]
            if not length:
                raise InvalidBatchError("an episode needs at least one step")
            text = "columns:" + json.dumps(schema, sort_keys=True, separators=(",", ":"))
            return text, codec.encode_columns(columns, length)
        if isinstance(episode, Sequence) and not isinstance(episode, (str, bytes, bytearray)):
            if len(episode) == 0:
                raise InvalidBatchError("an episode needs at least one step")
            try:
                return _STEPS_FORM, [codec.packb(step) for step in episode]
            except (TypeError, ValueError, OverflowError) as exc:
                raise InvalidBatchError(f"an episode step cannot be encoded: {exc}") from exc
        raise InvalidBatchError(
            "an episode is a dict of arrays with a time dimension or a sequence of steps, "
            f"got {type(episode).__name__}"
        )

    @staticmethod
    def _decode_columns(schema: dict[str, list[Any]], blobs: list[bytes]) -> dict[str, Any]:
        """The steps ``blobs`` as field -> array of shape ``[len(blobs), ...]``."""
        columns = codec.decode_same_layout(blobs)
        if columns is None:
            steps = [codec.unpackb(blob) for blob in blobs]
            columns = {key: np.stack([np.asarray(s[key]) for s in steps]) for key in schema}
        out: dict[str, Any] = {}
        for key, (lib, dtype, _shape) in schema.items():
            array = columns[key]
            if lib == "torch":
                if dtype == "bfloat16" and array.dtype == np.uint16:
                    out[key] = codec.to_library(np.array(array), lib, dtype)
                else:
                    torch = _torch.require()
                    out[key] = torch.as_tensor(np.array(array)).to(getattr(torch, dtype))
            else:
                out[key] = np.array(array, dtype=np.dtype(dtype))
        return out

    def _decode(self, schema_text: str, blobs: list[bytes]) -> Any:
        if schema_text == _STEPS_FORM:
            return [codec.unpackb(blob) for blob in blobs]
        return self._decode_columns(json.loads(schema_text.removeprefix("columns:")), blobs)

    # -- public API -------------------------------------------------------------------

    def push(self, episode: Any) -> int:
        """Store ``episode`` as one unit and return its id (ids grow from 1).

        When more than ``capacity_episodes`` episodes are stored, the oldest whole
        episodes go, in the same atomic step. Raises :class:`InvalidBatchError` for a
        malformed episode and :class:`SchemaError` when its form or fields differ from the
        buffer's; nothing is written then.

        Args:
            episode: a dict of arrays or tensors with a leading time dimension, or a
                sequence of steps.

        Returns:
            The episode's id.

        Raises:
            InvalidBatchError: a malformed episode.
            SchemaError: its form or fields differ from the buffer's.
        """
        schema, blobs = self._encode(episode)
        reply = self._run("episode_push", [schema, *blobs])
        return int(reply[0])

    def sample_episodes(self, n: int, replace: bool = False) -> EpisodeSample:
        """``n`` whole episodes drawn uniformly (without replacement unless ``replace``),
        with their ids. Raises :class:`EmptyBufferError` when the buffer is empty, or holds
        fewer than ``n`` episodes and ``replace`` is false.

        Args:
            n: how many episodes.
            replace: draw with replacement.

        Returns:
            The episodes with their ids and first-step positions.

        Raises:
            EmptyBufferError: as above.

        Examples:
            >>> import fakeredis
            >>> from redisbuf import EpisodeBuffer
            >>> buffer = EpisodeBuffer(fakeredis.FakeRedis(), "demo")
            >>> _ = buffer.push(["a", "b"]), buffer.push(["c"])
            >>> sorted(buffer.sample_episodes(2).episodes)
            [['a', 'b'], ['c']]
        """
        n = _count(n, "n")
        for attempt in range(_FETCH_ATTEMPTS + 1):
            # as in sample_windows; an episode evicted before the HMGET makes the whole
            # draw start again (redrawing only it could repeat an episode), and the draw
            # thrown away is taken off the sampled count
            inline = attempt == _FETCH_ATTEMPTS
            reply = self._run(
                "episode_sample",
                [n, "1" if replace else "0", packed_uniforms(self.rng, n),
                 "1" if inline else "0", n if attempt else 0],
            )
            schema, entries = reply[0].decode(), reply[1:]
            if inline:
                steps = [entry[3:] for entry in entries]
                break
            fields = [int(e[1]) + j for e in entries for j in range(int(e[2]))]
            got = self.client.hmget(self.keys.steps, fields) if fields else []
            if all(blob is not None for blob in got):
                bounds = np.cumsum([0] + [int(e[2]) for e in entries])
                steps = [got[bounds[i] : bounds[i + 1]] for i in range(len(entries))]
                break
        return EpisodeSample(
            episodes=[self._decode(schema, blobs) for blobs in steps],
            ids=np.array([int(entry[0]) for entry in entries], dtype=np.int64),
            starts=np.array([int(entry[1]) for entry in entries], dtype=np.int64),
        )

    def sample(self, n: int, replace: bool = False) -> list[Any]:
        """``n`` whole episodes drawn uniformly, as DI-engine's ``sample(size)`` returns:
        a list (see :meth:`sample_episodes`).

        Args:
            n: how many episodes.
            replace: draw with replacement.

        Returns:
            The episodes.

        Raises:
            EmptyBufferError: as :meth:`sample_episodes`.
        """
        return self.sample_episodes(n, replace).episodes

    def sample_windows(self, n: int, length: int) -> Windows:
        """``n`` windows of ``length`` consecutive steps, each inside one stored episode,
        drawn independently and uniformly over all such windows (an episode of ``T``
        steps holds ``T - length + 1``). Raises :class:`EmptyBufferError` when no stored
        episode has ``length`` steps.

        Args:
            n: how many windows.
            length: steps per window.

        Returns:
            The windows, their episodes and offsets.

        Raises:
            EmptyBufferError: no stored episode has ``length`` steps.
        """
        n = _count(n, "n", 1)
        length = _count(length, "length", 1)
        ids = np.zeros(n, dtype=np.int64)
        offsets = np.zeros(n, dtype=np.int64)
        blobs: list[Any] = [None] * (n * length)
        todo = list(range(n))
        thrown = 0  # windows drawn and found evicted: taken off the sampled count
        for attempt in range(_FETCH_ATTEMPTS + 1):
            # draw where the windows are, then read them with a native HMGET (far cheaper
            # for the server than returning blobs from Lua); a window evicted in between
            # reads as None and is drawn again; the last attempt reads inside Lua
            inline = attempt == _FETCH_ATTEMPTS
            k = len(todo)
            reply = self._run(
                "episode_windows",
                [k, length, WINDOW_TRIES, packed_uniforms(self.rng, k * (WINDOW_TRIES + 1)),
                 "1" if inline else "0", thrown],
            )
            schema, entries = reply[0].decode(), reply[1:]
            if inline:
                got = [blob for entry in entries for blob in entry[3:]]
            else:
                fields = [int(e[2]) + j for e in entries for j in range(length)]
                got = self.client.hmget(self.keys.steps, fields)
            missing = []
            for slot, (i, entry) in enumerate(zip(todo, entries, strict=True)):
                part = got[slot * length : (slot + 1) * length]
                if any(blob is None for blob in part):
                    missing.append(i)
                    continue
                ids[i], offsets[i] = int(entry[0]), int(entry[1])
                blobs[i * length : (i + 1) * length] = part
            todo, thrown = missing, len(missing)
            if not todo:
                break
        if schema == _STEPS_FORM:
            data: Any = [
                [codec.unpackb(blob) for blob in blobs[i * length : (i + 1) * length]]
                for i in range(n)
            ]
        else:
            flat = self._decode_columns(json.loads(schema.removeprefix("columns:")), blobs)
            data = {key: value.reshape(n, length, *value.shape[1:]) for key, value in flat.items()}
        return Windows(data, ids, offsets)

    def count(self) -> int:
        """Number of stored episodes (DI-engine's ``count``).

        Returns:
            The number of episodes.
        """
        return int(self.client.zcard(self.keys.index))

    def __len__(self) -> int:
        return self.count()

    def num_steps(self) -> int:
        """Number of stored steps over all episodes.

        Returns:
            The number of steps.
        """
        return int(self.client.hget(self.keys.meta, "steps") or 0)

    def stats(self) -> dict[str, int]:
        """Counters: ``episodes``, ``steps``, ``pushed``, ``evicted``, ``sampled``.

        Returns:
            A dict of those counters.
        """
        meta = self._meta()
        out = {k: int(meta.get(k, 0)) for k in ("steps", "pushed", "evicted", "sampled")}
        out["episodes"] = self.count()
        return out

    def clear(self) -> int:
        """Remove every episode (the configuration and schema stay); returns how many.

        Returns:
            The number of episodes removed.
        """
        return int(self._run("episode_clear", []))

    def drop(self) -> None:
        """Delete every key of this buffer, configuration included."""
        self.client.delete(*self.keys.all_keys())


def _count(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
