"""Per-environment streams of steps (ALF's ``ReplayBuffer``), sampled as windows.

Each environment appends one step at a time; its steps get positions 0, 1, 2, ... that
only grow (``pos`` in ALF's terms), and the newest ``max_length`` of them are kept.
``get_batch(batch_size, batch_length)`` draws windows of consecutive stored steps.

Keys (all share the hash tag ``{name}``, so one Lua script may touch all of them):

===============================  ======  ==================================================
key                              type    content
===============================  ======  ==================================================
``rb:{name}:seq:meta``           hash    configuration, schema, counters (``size``,
                                         ``added``, ``evicted``, ``sampled``: steps),
                                         max priority, rate history (``hist:*``,
                                         ``last_insert``; see redisbuf/ops/metrics.py)
``rb:{name}:seq:steps``          hash    ``"env:pos"`` -> msgpack blob of one step
``rb:{name}:seq:envs``           hash    ``next:e``, ``start:e``, ``cur:e``, ``first:e``,
                                         ``ended:e``: the stream state of environment e
``rb:{name}:seq:episodes``       zset    episode member -> number of its steps stored
``rb:{name}:seq:begins``         zset    episode members, score 0 (lex order = env, begin)
``rb:{name}:seq:rewards``        hash    ``"env:pos"`` -> reward (record_episodic_return)
``rb:{name}:seq:returns``        hash    ``"env:pos"`` -> discounted return of ended episodes
``rb:{name}:seq:prio``           hash    slot -> priority of the stored step there
                                         (prioritized), slot ``env * max_length +
                                         pos % max_length`` in 12 digits, as item ids
``rb:{name}:seq:masslog``        list    the mass log of priority changes (prioritized;
                                         lua/_masslog.lua, ids = slots)
``rb:{name}:seq:snap``           hash    a replica's snapshot of the priorities (header,
                                         chunks c0, c1, ...), read by new replicas
===============================  ======  ==================================================

An episode member is ``"%06d:%015d" % (env, begin position)``.

This module holds the keys, the constructor, ``add_batch``, the decoding of steps and
the inspection; the windows drawn (``get_batch``) and the step priorities
(``update_priority``) are in :mod:`redisbuf.buffers.sequence_draws`, the other reads in
:mod:`redisbuf.buffers.sequence_reads`. Prioritized draws are made by the prioritized
engine the replay buffer's PER uses (docs/sampling.md, "How prioritized draws are made"):
each process draws window starts in proportion to their priority from its replica of the
``prio`` hash (:class:`~redisbuf.sampling.replica.MassReplica`, rule ``"per"`` with alpha
1 and eps 0, so a slot's mass is its priority), and ``lua/seq_sample.lua`` corrects the
draws to the priorities at the call when the replica was behind, then keeps those that
start valid windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from ..errors import (
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
)
from ..store import _torch, bounds, codec, scripts
from ..store.connection import as_client
from ..store.keys import PREFIX, validate_name
from .sequence_draws import SequenceDrawing, _PrioritySource
from .sequence_reads import _DISCOUNTED_RETURN, BatchInfo, SequenceReading, _as_int_array

# ALF's StepType values
FIRST, MID, LAST = 0, 1, 2


@dataclass(frozen=True)
class SequenceKeys:
    """The key names of the sequence buffer called ``name``."""

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:seq:{suffix}"

    def all_keys(self) -> list[str]:
        """meta, steps, envs, episodes, begins, rewards, returns, prio, masslog, snap (the
        Lua order)."""
        return [
            self._key(s)
            for s in ("meta", "steps", "envs", "episodes", "begins", "rewards", "returns",
                      "prio", "masslog", "snap")
        ]

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def snap(self) -> str:
        """A replica's snapshot of the step priorities, which a new replica reads instead
        of scanning the ``prio`` hash (redisbuf/sampling/replica.py)."""
        return self._key("snap")

    def snap_staging(self, token: str) -> str:
        """Where a snapshot is written before it replaces :attr:`snap`."""
        return self._key(f"snap:staging:{token}")

    def describe(self) -> dict[str, str]:
        """Key name -> what it holds (the table of this module's docstring), for people
        reading the buffer with redis-cli; in the order of :meth:`all_keys`."""
        return dict(zip(self.all_keys(), (
            "hash: configuration, schema, counters (size, added, evicted, sampled: steps)",
            "hash: 'env:pos' -> msgpack blob of one step",
            "hash: next/start/cur/first/ended:e -> stream state of environment e",
            "zset: episode (env, begin) -> number of its steps stored",
            "zset: episode members, score 0 (lex order = env, begin)",
            "hash: 'env:pos' -> reward (record_episodic_return)",
            "hash: 'env:pos' -> discounted return of ended episodes",
            "hash: slot (env * max_length + pos % max_length) -> step priority"
            " (prioritized_sampling)",
            "list: mass log of priority changes, read by samplers' replicas"
            " (prioritized_sampling)",
            "hash: a replica's snapshot of the step priorities, for new replicas"
            " (prioritized_sampling)",
        ), strict=True))




def _flatten(batch: Any, prefix: str = "") -> dict[str, Any]:
    """Field path ('.'-joined) -> array, from a dict, dataclass or NamedTuple nest."""
    if is_dataclass(batch) and not isinstance(batch, type):
        batch = {f.name: getattr(batch, f.name) for f in fields(batch)}
    elif hasattr(batch, "_asdict"):
        batch = batch._asdict()
    if not isinstance(batch, Mapping):
        raise InvalidBatchError(
            f"a batch must be a dict of arrays (or a dataclass / NamedTuple), got {type(batch)}"
        )
    out: dict[str, Any] = {}
    for key, value in batch.items():
        if not isinstance(key, str) or "." in key or not key:
            raise InvalidBatchError(f"field names must be non-empty str without '.', got {key!r}")
        path = prefix + key
        if (
            isinstance(value, Mapping)
            or hasattr(value, "_asdict")
            or (is_dataclass(value) and not isinstance(value, type))
        ):
            out.update(_flatten(value, path + "."))
        else:
            if not (isinstance(value, np.ndarray) or _torch.is_tensor(value)):
                value = np.asarray(value)
            out[path] = value
    return out


def unflatten_fields(flat: dict[str, Any]) -> dict[str, Any]:
    """Field path ('.'-joined) -> value, back to the nested dict ``add_batch`` takes."""
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out




class SequenceBuffer(SequenceDrawing, SequenceReading):
    """Per-environment ring buffers of steps in Redis, shared by every process using them.

    Args:
        redis_or_url: a ``redis.Redis`` client (``decode_responses=False``) or a URL.
        name: buffer name (letters, digits, ``_ . -``).
        num_environments: environments 0..num_environments-1 each own one stream.
        max_length: steps kept per environment; older ones are evicted.
        step_type_field: field holding ALF step types (FIRST=0, MID=1, LAST=2): a FIRST
            step begins an episode, a LAST step ends one.
        done_field: alternatively, a field that is true on the last step of an episode.
            With neither, a stream is one episode (until dequeue empties it).
        allow_cross_episode: ``get_batch`` windows may span episode boundaries.
        prioritized_sampling: keep per-step priorities (stored with the buffer);
            ``get_batch`` then draws valid windows with probability proportional to their
            first step's priority, independently. New steps get
            ``max(initial_priority, largest priority ever set)``. Setting the attribute
            ``prioritized_sampling`` to False on one instance makes its draws uniform.
        with_replacement: uniform draws may repeat a window; otherwise a batch holds
            distinct windows whenever enough exist.
        initial_priority: the least priority a new step gets (see
            ``prioritized_sampling``).
        recent_data_ratio: as ALF, ``ceil(batch_size * recent_data_ratio)`` windows start
            among the last ``recent_data_steps`` possible starts of their environment
            (drawn uniformly), when the average stream is long enough to need it.
        recent_data_steps: how many of the last possible starts ``recent_data_ratio``'s
            windows start among.
        num_earliest_frames_ignored: windows start at least this many steps after the
            oldest stored step of their environment.
        record_episodic_return: when an episode ends, each of its stored steps t except
            the last gets ``G(t) = clip(r(t+1)) + gamma * G(t+1)`` (``G(last) = 0`` in
            the recursion); returned as field ``discounted_return``, ``default_return``
            until then.
        gamma: the discount of ``record_episodic_return``'s ``G(t)``.
        default_return: ``discounted_return`` of a step whose episode has not ended.
        reward_field: the field holding ``r(t)``.
        reward_clip: ``(low, high)`` bounds of ``clip``; ``None`` clips nothing.
        seed: seeds this process's sampling random numbers.

    Configuration other than the sampling options is stored with the buffer; opening it
    with other values raises :class:`ConfigMismatchError`.

    Raises:
        ValueError: an argument out of range.
        ConfigMismatchError: the stored buffer was made with another configuration.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import SequenceBuffer
        >>> buffer = SequenceBuffer(fakeredis.FakeRedis(), "demo", num_environments=2)
        >>> for t in range(3):  # one step of each environment per call
        ...     _ = buffer.add_batch({"obs": np.array([t, 10 + t])})
        >>> batch, info = buffer.get_batch(batch_size=4, batch_length=2)
        >>> batch["obs"].shape, info.env_ids.shape
        ((4, 2), (4,))
        >>> (batch["obs"][:, 1] - batch["obs"][:, 0]).tolist()  # consecutive steps
        [1, 1, 1, 1]
    """

    def __init__(
        self,
        redis_or_url: Any,
        name: str,
        num_environments: int,
        max_length: int = 1024,
        *,
        step_type_field: str | None = None,
        done_field: str | None = None,
        allow_cross_episode: bool = False,
        prioritized_sampling: bool = False,
        initial_priority: float = 1.0,
        with_replacement: bool = False,
        recent_data_ratio: float = 0.0,
        recent_data_steps: int = 1,
        num_earliest_frames_ignored: int = 0,
        record_episodic_return: bool = False,
        gamma: float = 0.99,
        default_return: float = -1000.0,
        reward_field: str = "reward",
        reward_clip: tuple[float, float] | None = None,
        seed: int | None = None,
    ) -> None:
        for label, value, least in (
            ("num_environments", num_environments, 1),
            ("max_length", max_length, 1),
            ("recent_data_steps", recent_data_steps, 1),
            ("num_earliest_frames_ignored", num_earliest_frames_ignored, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{label} must be an integer >= {least}, got {value!r}")
        if num_environments >= 10**6:
            raise ValueError("num_environments must be below 10**6")
        if step_type_field is not None and done_field is not None:
            raise ValueError("give step_type_field or done_field, not both")
        if not 0.0 <= recent_data_ratio <= 1.0:
            raise ValueError(f"recent_data_ratio must be in [0, 1], got {recent_data_ratio}")
        if not (math.isfinite(initial_priority) and initial_priority > 0):
            raise ValueError(f"initial_priority must be finite and > 0, got {initial_priority}")
        if not (math.isfinite(gamma) and math.isfinite(default_return)):
            raise ValueError("gamma and default_return must be finite")
        low, high = reward_clip if reward_clip is not None else (-math.inf, math.inf)
        if not low <= high:
            raise ValueError(f"reward_clip must be (min, max) with min <= max, got {reward_clip}")
        self.client = as_client(redis_or_url)
        self.name = name
        self.keys = SequenceKeys(name)
        self._keys = self.keys.all_keys()
        self.num_environments = num_environments
        self.max_length = max_length
        self.step_type_field = step_type_field
        self.done_field = done_field
        self.allow_cross_episode = allow_cross_episode
        self.prioritized_sampling = prioritized_sampling
        self.with_replacement = with_replacement
        self.recent_data_ratio = recent_data_ratio
        self.recent_data_steps = recent_data_steps
        self.num_earliest_frames_ignored = num_earliest_frames_ignored
        self.record_episodic_return = record_episodic_return
        self.reward_field = reward_field
        self.default_return = float(default_return)
        self.rng = np.random.default_rng(seed)
        self._schema: dict[str, Any] | None = None
        config = {
            "num_environments": num_environments,
            "max_length": max_length,
            "step_type_field": step_type_field,
            "done_field": done_field,
            "prioritized": prioritized_sampling,
            "initial_priority": float(initial_priority),
            "record_episodic_return": record_episodic_return,
            "gamma": float(gamma),
            "default_return": float(default_return),
            "reward_field": reward_field,
            "reward_clip": [float(low), float(high)] if reward_clip is not None else None,
        }
        stored = [
            "num_environments",
            num_environments,
            "max_length",
            max_length,
            "returns",
            int(record_episodic_return),
            "gamma",
            repr(float(gamma)),
            "default_return",
            repr(float(default_return)),
            "clip_low",
            _text(low),
            "clip_high",
            _text(high),
            "prioritized",
            int(prioritized_sampling),
            "initial_priority",
            repr(float(initial_priority)),
            # the mass log keeps max(10 000, capacity / 4) rows (lua/_masslog.lua)
            "capacity",
            num_environments * max_length,
        ]
        self._run("seq_init", self._keys, [json.dumps(config, sort_keys=True), *stored])
        self._priorities = _PrioritySource(self)
        self._acceptance: dict[int, float] = {}  # window length -> share of draws kept

    def _run(self, script: str, keys: list[str], args: list[Any]) -> Any:
        return scripts.load(script)(self.client, keys, args)

    # -- adding ----------------------------------------------------------------------

    def _env_ids(self, env_ids: Any, n: int) -> np.ndarray:
        if env_ids is None:
            if n != self.num_environments:
                raise InvalidBatchError(
                    f"without env_ids a batch needs {self.num_environments} steps (one per "
                    f"environment), got {n}"
                )
            return np.arange(n, dtype=np.int64)
        ids = _as_int_array(env_ids, "env_ids")
        if len(ids) != n:
            raise InvalidBatchError(f"{len(ids)} env_ids for a batch of {n} steps")
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_environments):
            raise InvalidBatchError(f"env_ids must be in [0, {self.num_environments})")
        if len(np.unique(ids)) != len(ids):
            raise InvalidBatchError("env_ids must not repeat within one batch")
        return ids

    def add_batch(self, batch: Any, env_ids: Any = None) -> np.ndarray:
        """Append ``batch[i]`` to environment ``env_ids[i]`` (all environments when
        ``env_ids`` is None); return the positions the steps got.

        Args:
            batch: a dict (or dataclass, NamedTuple; nested allowed) of arrays with one row
                per step.
            env_ids: the environment of each row, or ``None``.

        Returns:
            The positions the steps got (int64).

        Raises:
            InvalidBatchError: a malformed batch (no field, rows of unequal lengths, a
                missing or non-finite reward or step-type field).
            SchemaError: the fields differ from the stored steps'.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import SequenceBuffer
            >>> buffer = SequenceBuffer(fakeredis.FakeRedis(), "demo", num_environments=2)
            >>> buffer.add_batch({"obs": np.array([1.0, 2.0])}).tolist()
            [0, 0]
            >>> buffer.add_batch({"obs": np.array([3.0])}, env_ids=[1]).tolist()
            [1]
        """
        flat = _flatten(batch)
        if not flat:
            raise InvalidBatchError("a batch needs at least one field")
        sizes = {tuple(v.shape[:1]) for v in flat.values()}
        if len(sizes) != 1 or () in sizes:
            raise InvalidBatchError(
                "every field needs the same leading dimension (the number of env ids): "
                + ", ".join(f"{k}: {tuple(v.shape)}" for k, v in flat.items())
            )
        n = next(iter(sizes))[0]
        ids = self._env_ids(env_ids, n)
        if n == 0:
            return np.zeros(0, dtype=np.int64)
        schema = {
            key: {
                "dtype": codec.dtype_name(value),
                "shape": list(value.shape[1:]),
                "lib": "torch" if _torch.is_tensor(value) else "numpy",
            }
            for key, value in sorted(flat.items())
        }
        flags = np.zeros(n, dtype=np.int64)
        if self.step_type_field is not None:
            step_type = self._scalar_field(flat, self.step_type_field)
            flags += (step_type == FIRST) + 2 * (step_type == LAST)
        elif self.done_field is not None:
            flags += 2 * (self._scalar_field(flat, self.done_field) != 0)
        if self.record_episodic_return:
            rewards = self._scalar_field(flat, self.reward_field).astype(np.float64)
            if not np.isfinite(rewards).all():
                raise InvalidBatchError(f"field {self.reward_field!r} holds a non-finite reward")
            reward_text = [repr(float(r)) for r in rewards]
        else:
            reward_text = [""] * n
        columns = [codec.Column(key, flat[key]) for key in schema]
        blobs = codec.encode_columns(columns, n)
        args: list[Any] = [json.dumps(schema, sort_keys=True), n]
        for i in range(n):
            args += [int(ids[i]), blobs[i], int(flags[i]), reward_text[i]]
        positions = self._run("seq_add", self._keys, args)
        self._schema = schema
        return np.asarray(positions, dtype=np.int64)

    @staticmethod
    def _scalar_field(flat: dict[str, Any], name: str) -> np.ndarray:
        if name not in flat:
            raise InvalidBatchError(f"the batch has no field {name!r} (fields: {sorted(flat)})")
        value = flat[name]
        value = value.detach().cpu().numpy() if _torch.is_tensor(value) else value
        if value.ndim != 1:
            raise InvalidBatchError(f"field {name!r} must hold one number per step")
        return np.asarray(value)

    # -- decoding --------------------------------------------------------------------

    def _stored_schema(self) -> dict[str, Any]:
        if self._schema is None:
            raw = self.client.hget(self.keys.meta, "schema")
            if raw is None:
                raise EmptyBufferError(f"sequence buffer {self.name!r} holds no step")
            self._schema = json.loads(raw)
        return self._schema

    def _decode(self, blobs: Sequence[bytes | None], shape: tuple[int, ...]) -> dict[str, Any]:
        """Blobs of ``prod(shape)`` steps -> nested dict of arrays shaped ``shape + item``."""
        schema = self._stored_schema()
        count = int(np.prod(shape))
        if count == 0:
            columns: dict[str, Any] = {}
        else:
            if any(blob is None for blob in blobs):
                raise DecodeError("a step read in one atomic call is missing")
            columns = codec.decode_same_layout(blobs) or {}  # type: ignore[arg-type]
            if not columns:
                items = [codec.unpackb(blob) for blob in blobs]  # type: ignore[arg-type]
                columns = {key: np.stack([np.asarray(i[key]) for i in items]) for key in schema}
        out: dict[str, Any] = {}
        for key, spec in schema.items():
            item_shape = tuple(spec["shape"])
            if count == 0:
                array = np.zeros((*shape, *item_shape), dtype=_numpy_dtype(spec["dtype"]))
            elif spec["dtype"] == "bfloat16" and not item_shape:
                # a per-step bfloat16 number travels as a float64 msgpack number
                torch = _torch.require()
                values = torch.from_numpy(np.asarray(columns[key], dtype=np.float32))
                out[key] = values.to(torch.bfloat16).reshape(shape)
                continue
            else:
                array = np.array(columns[key], dtype=_numpy_dtype(spec["dtype"]))
                array = array.reshape((*shape, *item_shape))
            out[key] = codec.to_library(array, spec["lib"], spec["dtype"])
        return unflatten_fields(out)

    def _with_returns(self, data: dict[str, Any], raw: list[Any], shape: tuple[int, ...]) -> None:
        if self.record_episodic_return:
            default = self.default_return
            values = [default if r is None else float(r) for r in raw]
            data[_DISCOUNTED_RETURN] = np.array(values, dtype=np.float32).reshape(shape)

    def _read_steps(
        self, names: list[str], group: int = 1, with_returns: bool | None = None
    ) -> tuple[list[Any], list[Any]]:
        """Blobs (None when not stored) and, when recorded (and ``with_returns`` is not
        False), discounted returns of steps.

        The read is split into commands of at most
        :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` fields
        (redisbuf/store/bounds.py), sent in one pipeline. ``names`` is made of groups of
        ``group`` consecutive steps (windows); a part holds whole groups unless one group
        alone is longer than the bound. A part's returns are read in one command before
        its blobs: a field ``"e:p"`` only ever names one step and a stored blob never
        changes, so a blob found by the later command was stored at the earlier one, and
        a group within one part reads as it was at that moment (returns included); a
        step evicted in between reads as missing."""
        if not names:
            return [], []
        if with_returns is None:
            with_returns = self.record_episodic_return
        bound = bounds.MAX_ITEMS_PER_COMMAND
        size = bound if group > bound else group * (bound // group)
        parts = bounds.chunks(len(names), size)
        if not with_returns and len(parts) == 1:
            return self.client.hmget(self._keys[1], names), []
        # plain pipelines, returns first (a MULTI is refused at maxmemory, reads too):
        # a step whose blob the later read finds was stored at the earlier one (step
        # names are never reused); a step evicted in between reads as missing, and is
        # drawn again
        pipe = self.client.pipeline(transaction=False)
        for start, stop in parts:
            if with_returns:
                pipe.hmget(self._keys[6], names[start:stop])
            pipe.hmget(self._keys[1], names[start:stop])
        replies = pipe.execute()
        if not with_returns:
            return [blob for reply in replies for blob in reply], []
        returns = [value for reply in replies[0::2] for value in reply]
        blobs = [blob for reply in replies[1::2] for blob in reply]
        return blobs, returns

    # -- inspection --------------------------------------------------------------------

    def env_range(self, env_id: int) -> tuple[int, int]:
        """(oldest stored position, next position) of one environment.

        Args:
            env_id: the environment.

        Returns:
            ``(start, next)``; ``(0, 0)`` before any step.
        """
        start, nxt = self.client.hmget(self._keys[2], f"start:{env_id}", f"next:{env_id}")
        return int(start or 0), int(nxt or 0)

    @property
    def total_size(self) -> int:
        """Steps stored over all environments."""
        return int(self.client.hget(self.keys.meta, "size") or 0)

    def __len__(self) -> int:
        return self.total_size

    def drop(self) -> None:
        """Delete every key of the buffer (and any snapshot a replica was writing)."""
        staged = list(self.client.scan_iter(match=self.keys.snap_staging("*"), count=1000))
        self.client.delete(*self._keys, *staged)


def _text(value: float) -> str:
    if value == math.inf:
        return "inf"
    if value == -math.inf:
        return "-inf"
    return repr(float(value))


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype("<u2") if name == "bfloat16" else np.dtype(name)


__all__ = ["FIRST", "LAST", "MID", "BatchInfo", "SequenceBuffer", "SequenceKeys"]
