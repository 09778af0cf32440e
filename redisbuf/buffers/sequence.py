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

Prioritized draws are made by the prioritized engine the replay buffer's PER uses
(docs/sampling.md, "How prioritized draws are made"): each process draws window starts in
proportion to their priority from its replica of the ``prio`` hash
(:class:`~redisbuf.sampling.replica.MassReplica`, rule ``"per"`` with alpha 1 and eps 0,
so a slot's mass is its priority), and ``lua/seq_sample.lua`` corrects the draws to the
priorities at the call when the replica was behind, then keeps those that start valid
windows.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

import numpy as np

from ..errors import (
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
    RequestTooLargeError,
)
from ..sampling.base import BufferView
from ..sampling.commits import CorrectedCommit, commit_corrected, follow
from ..sampling.replica import MassReplica, replica_of
from ..sampling.uniforms import packed_uniforms
from ..store import _torch, bounds, codec, scripts
from ..store.connection import as_client
from ..store.keys import PREFIX, pack_ids, validate_name
from .sequence_reads import _DISCOUNTED_RETURN, BatchInfo, SequenceReading, _as_int_array

# ALF's StepType values
FIRST, MID, LAST = 0, 1, 2
_TRIES = 4  # candidate draws per window and call before rejection gives up
_ROUNDS = 50  # draws before giving up on filling a batch (prioritized rejections, races)
# Prioritized draws: the fewest spare draws sent per draw (lua/seq_sample.lua uses them in
# place of a draw whose slot changed since the replica's version; the draws beyond those
# a batch needs serve too, so none are sent until a correction ran short of them), commits
# tried per call, and the most draws sent per window wanted (when few start valid windows)
_SPARES = 0
_MAX_DRAWS_PER_WINDOW = 8


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


def _unflatten(flat: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out




class SequenceBuffer(SequenceReading):
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
        for label, value, low in (
            ("num_environments", num_environments, 1),
            ("max_length", max_length, 1),
            ("recent_data_steps", recent_data_steps, 1),
            ("num_earliest_frames_ignored", num_earliest_frames_ignored, 0),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{label} must be an integer >= {low}, got {value!r}")
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

    def _decode(self, blobs: list[bytes | None], shape: tuple[int, ...]) -> dict[str, Any]:
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
        return _unflatten(out)

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

    # -- sampling --------------------------------------------------------------------

    def get_batch(self, batch_size: int, batch_length: int) -> tuple[dict[str, Any], BatchInfo]:
        """``batch_size`` windows of ``batch_length`` consecutive stored steps: arrays
        shaped ``[batch_size, batch_length, ...]`` and their :class:`BatchInfo`.

        Windows are chosen in one Lua call; their steps are then read with one HMGET. A
        step's field is never reused, so a window evicted in between reads as missing and
        is drawn again: no window is torn or holds an evicted step. Uniform draws are
        uniform over all valid windows (stored steps, at least
        ``num_earliest_frames_ignored`` after the oldest, inside one episode unless
        ``allow_cross_episode``). Prioritized draws are independent, each valid window
        drawn with probability proportional to its first step's priority at the Lua call
        that chose it (drawn from this process's replica of the priorities, corrected by
        that call when the replica was behind; a call whose draws cannot stand chooses
        nothing and the draw is made again). Raises :class:`EmptyBufferError` when no
        valid window exists, and when 50 calls do not fill the batch (prioritized: draws
        falling on invalid windows; also when no stored step has a non-zero priority).
        A ``batch_size`` above :data:`~redisbuf.store.bounds.MAX_WINDOWS_PER_DRAW`
        raises :class:`RequestTooLargeError` (one call draws the windows: draw such a
        batch in several calls).

        Args:
            batch_size: how many windows (positive).
            batch_length: steps per window (positive).

        Returns:
            The windows' fields, nested as added, and their :class:`BatchInfo`.

        Raises:
            ValueError: a size that is not a positive integer.
            RequestTooLargeError: ``batch_size`` above ``MAX_ITEMS_PER_COMMAND``.
            EmptyBufferError: no valid window, or 50 calls did not fill the batch.
        """
        for label, value in (("batch_size", batch_size), ("batch_length", batch_length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{label} must be a positive integer, got {value!r}")
        if batch_size > bounds.MAX_WINDOWS_PER_DRAW:
            raise RequestTooLargeError(
                f"get_batch draws at most {bounds.MAX_WINDOWS_PER_DRAW} windows per call "
                f"(redisbuf.store.bounds.MAX_WINDOWS_PER_DRAW), asked {batch_size}"
            )
        self._stored_schema()
        L = batch_length
        envs: list[int] = []
        positions: list[int] = []
        priorities: list[float] = []
        blobs: list[bytes] = []
        returns: list[Any] = []
        nonzero = 0
        total = 0.0
        wanted = batch_size
        recent_ratio = self.recent_data_ratio
        for _ in range(_ROUNDS):
            # uniforms for the uniform parts (a prioritized batch's is the recent one)
            uniform_part = not self.prioritized_sampling or recent_ratio > 0
            draws = wanted * (_TRIES + 1) if uniform_part else 0
            packed = packed_uniforms(self.rng, draws)
            args = [
                L,
                wanted,
                repr(float(recent_ratio)),
                self.recent_data_steps,
                int(self.allow_cross_episode),
                int(self.with_replacement),
                self.num_earliest_frames_ignored,
                int(self.prioritized_sampling),
                packed,
                _TRIES,
            ]
            if self.prioritized_sampling:
                reply = self._commit_prioritized(args, wanted, L)
            else:
                reply = self._run("seq_sample", self._keys, args)
            k = int(reply[1]) + int(reply[2])
            nonzero, total = int(reply[3]), float(reply[4])
            at = 10
            drawn_envs = [int(x) for x in reply[at : at + k]]
            drawn_positions = [int(x) for x in reply[at + k : at + 2 * k]]
            drawn_priorities = [float(x) for x in reply[at + 2 * k : at + 3 * k]]
            names = [
                f"{e}:{p + j}"
                for e, p in zip(drawn_envs, drawn_positions, strict=True)
                for j in range(L)
            ]
            got, got_returns = self._read_steps(names, L)
            for w in range(k):
                window = got[w * L : (w + 1) * L]
                if any(blob is None for blob in window):
                    continue  # evicted between the draw and the read: drawn again
                envs.append(drawn_envs[w])
                positions.append(drawn_positions[w])
                priorities.append(drawn_priorities[w])
                blobs += window
                returns += got_returns[w * L : (w + 1) * L]
            wanted = batch_size - len(envs)
            recent_ratio = 0.0  # the recent part is drawn in full by the first call
            if wanted == 0:
                break
        if wanted:
            raise EmptyBufferError(
                f"found only {batch_size - wanted} valid windows of {L} steps in {_ROUNDS} tries"
            )
        data = self._decode(blobs, (batch_size, L))
        self._with_returns(data, returns, (batch_size, L))
        weights = np.ones(batch_size, dtype=np.float32)
        if self.prioritized_sampling and total > 0 and nonzero > 0:
            # ALF: priority / mean non-zero priority (a zero excludes, never inflates)
            weights = np.asarray(priorities, dtype=np.float64) * nonzero / total
        info = BatchInfo(
            np.asarray(envs, dtype=np.int64),
            np.asarray(positions, dtype=np.int64),
            np.asarray(weights, dtype=np.float32),
        )
        return data, info

    def _draw_count(self, wanted: int, length: int) -> int:
        """Draws to send for ``wanted`` windows of ``length`` steps: enough that the share
        kept so far (draws starting valid windows) fills the batch in one call, mostly."""
        share = self._acceptance.get(length, 1.0)
        count = math.ceil(wanted * 1.2 / max(share, 1.0 / _MAX_DRAWS_PER_WINDOW)) + 2
        return min(count, wanted * _MAX_DRAWS_PER_WINDOW)

    def _commit_prioritized(self, head: list[Any], wanted: int, length: int) -> list[Any]:
        """One lua/seq_sample.lua call that stands, with window starts drawn from this
        process's replica of the step priorities and committed by the prioritized engine
        (:func:`~redisbuf.sampling.commits.commit_corrected`, as ``ReplayBuffer``'s PER
        draws): corrected by the server to the priorities at the call when the replica
        was behind (the replica then catches up with the entries it returns), or drawn
        again from the replica caught up by the reply when the draws could not stand."""
        source = self._priorities
        replica = replica_of(source, "per")
        with replica.lock:
            return commit_corrected(source, replica, self.rng,
                                    _WindowCommit(self, head, wanted, length, replica))

    def update_priority(self, env_ids: Any, positions: Any, priorities: Any) -> int:
        """Set the priorities of steps ``(env_ids[i], positions[i])``; steps no longer
        stored are skipped. Returns how many were set.

        Args:
            env_ids: the steps' environments.
            positions: the steps' positions.
            priorities: one priority per step, finite and >= 0.

        Returns:
            How many priorities were set.

        Raises:
            InvalidBatchError: the lengths differ, or a priority is not finite and >= 0.
            ConfigMismatchError: the buffer was made without ``prioritized_sampling``.
        """
        ids = _as_int_array(env_ids, "env_ids")
        pos = _as_int_array(positions, "positions")
        prio = np.asarray(
            priorities.detach().cpu() if _torch.is_tensor(priorities) else priorities,
            dtype=np.float64,
        ).reshape(-1)
        if not len(ids) == len(pos) == len(prio):
            raise InvalidBatchError("env_ids, positions and priorities differ in length")
        if not (np.isfinite(prio).all() and (prio >= 0).all()):
            raise InvalidBatchError("priorities must be finite and >= 0")
        args: list[Any] = [len(ids)]
        for e, p, q in zip(ids.tolist(), pos.tolist(), prio.tolist(), strict=True):
            args += [e, p, repr(q)]
        reply = self._run("seq_update_priority", self._keys, args)
        updated, epoch, before, after, stamp_before, stamp_after, slots, values = reply
        replica: MassReplica | None = self._priorities.replicas.get("per")
        if replica is not None and slots:
            with replica.lock:
                if (
                    replica.epoch == _str(epoch)
                    and replica.version == int(before)
                    and replica.stamp == _str(stamp_before)
                    and int(after) == int(before) + 1
                ):
                    # this call's entry is the only change since the replica's version
                    replica.set_scores(  # slots as 12-digit text, priorities as text
                        np.array(slots.split(b","), dtype=np.int64),
                        np.array(values.split(b","), dtype=np.float64),
                    )
                    replica.version = int(after)
                    replica.stamp = _str(stamp_after)
        return int(updated)

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


def _str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class _PrioritySource(BufferView):
    """A prioritized sequence buffer's step priorities as a
    :class:`~redisbuf.sampling.replica.MassReplica` reads a buffer's scores: a
    :class:`~redisbuf.sampling.base.BufferView` (``name``, ``client``, ``keys`` with
    ``meta`` and ``all_keys()``, ``run``) whose replica scripts are run as their
    sequence-buffer counterparts, which read the ``prio`` hash and the sequence buffer's
    mass log. The replica is kept here (``replicas``)."""

    __slots__ = ()

    _SCRIPTS = {"masslog_read": "seq_masslog_read", "replica_read": "seq_replica_read",
                "snapshot_commit": "snapshot_commit"}

    def __init__(self, buffer: SequenceBuffer) -> None:
        # SequenceKeys has what a replica reads (meta, snap, snap_staging, all_keys)
        super().__init__(buffer.name, buffer.client, buffer.keys,  # type: ignore[arg-type]
                         lambda *args: buffer._run(*args))  # _run as it is at each call

    def run(self, script: str, keys: list[str], args: list[Any], read: bool = False) -> Any:
        return self._runner(self._SCRIPTS[script], keys, args)


class _WindowCommit(CorrectedCommit[list[Any]]):
    """A prioritized sequence buffer's window starts for ``wanted`` windows of ``length``
    steps, committed by lua/seq_sample.lua (``head``: its arguments before the
    replica's); the reply that stands is the script's."""

    least_spares = _SPARES
    limit = bounds.MAX_ITEMS_PER_COMMAND  # one command's candidates (store/bounds.py)

    def __init__(self, buffer: SequenceBuffer, head: list[Any], wanted: int, length: int,
                 replica: MassReplica) -> None:
        self.buffer, self.head, self.length, self.replica = buffer, head, length, replica
        self.count = buffer._draw_count(wanted, length)
        self.subject = f"sequence buffer {buffer.name!r}"

    def check(self, replica: MassReplica) -> None:
        if replica.positive == 0 or replica.total <= 0:
            raise EmptyBufferError(
                f"{self.subject}: no stored step has a non-zero priority")

    def wanted(self) -> int:
        return self.count

    def send(self, candidates: np.ndarray, spares: int, uniforms: bytes) -> list[Any]:
        replica = self.replica
        packed, width = pack_ids(candidates.reshape(-1))
        args = [*self.head, replica.epoch, replica.version, replica.stamp, spares,
                uniforms, repr(replica.total), packed, width]
        return [self.buffer._run("seq_sample", self.buffer._keys, args)]

    def stood(self, replies: list[Any], draws: np.ndarray) -> list[Any]:
        reply = replies[0]
        k_recent, k_normal, examined = int(reply[1]), int(reply[2]), int(reply[9])
        acceptance = self.buffer._acceptance
        if examined:
            share = k_normal / examined
            previous = acceptance.get(self.length, share)
            acceptance[self.length] = 0.5 * previous + 0.5 * share
        if reply[8] in (b"1", "1"):  # corrected: catch up with the entries it went by
            follow(self.buffer._priorities, self.replica, reply[5:8],
                   reply[10 + 3 * (k_recent + k_normal) :])
        return reply


def _numpy_dtype(name: str) -> np.dtype:
    return np.dtype("<u2") if name == "bfloat16" else np.dtype(name)


__all__ = ["FIRST", "LAST", "MID", "BatchInfo", "SequenceBuffer", "SequenceKeys"]
