"""What :class:`~redisbuf.buffers.sequence.SequenceBuffer` reads besides its sampled
windows: episode boundaries, one field at given positions, every stored step
(``gather_all``) and the oldest steps taken out (``dequeue``); and the batch description
(:class:`BatchInfo`) its reads return."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from ..errors import (
    InvalidBatchError,
    RequestTooLargeError,
    SamplingError,
)
from ..store import _torch, bounds

if TYPE_CHECKING:
    from .needs import SequenceReadingNeeds as _SequenceReadingNeeds
else:
    _SequenceReadingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

_DISCOUNTED_RETURN = "discounted_return"


class BatchInfo(NamedTuple):
    """Where the windows of a batch come from (ALF's ``BatchInfo``), shapes ``[B]``.

    ``importance_weights``: the window's first-step priority divided by the mean of the
    non-zero priorities of the stored steps, as ALF (1.0 under uniform sampling).

    Attributes:
        env_ids: each window's environment.
        positions: each window's first step position.
        importance_weights: as above.
    """

    env_ids: np.ndarray
    positions: np.ndarray
    importance_weights: np.ndarray


def _as_int_array(values: Any, name: str) -> np.ndarray:
    array = np.asarray(values.cpu() if _torch.is_tensor(values) else values)
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise InvalidBatchError(f"{name} must be a 1-D array of integers, got {array!r:.80}")
    return array.astype(np.int64)


class SequenceReading(_SequenceReadingNeeds):
    """A mixin of :class:`~redisbuf.buffers.sequence.SequenceBuffer`: the buffer provides
    ``client``, ``name``, ``_keys``, ``num_environments``, its options
    (``record_episodic_return``, ``default_return``, ``num_earliest_frames_ignored``) and
    ``_run``, ``_decode``, ``_read_steps``, ``_with_returns`` and ``_stored_schema``."""

    # -- episode queries ---------------------------------------------------------------

    def _episodes(self, pos: Any, env_ids: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = _as_int_array(env_ids, "env_ids")
        p = _as_int_array(pos, "pos")
        ids, p = np.broadcast_arrays(ids, p)
        args: list[Any] = [len(p)]
        for e, q in zip(ids.tolist(), p.tolist(), strict=True):
            args += [e, q]
        reply = np.asarray(self._run("seq_episode", self._keys, args), dtype=np.int64)
        return p, reply[0::2], reply[1::2]

    def get_episode_begin_position(self, pos: Any, env_ids: Any) -> np.ndarray:
        """Position of the first step of each step's episode (maybe no longer stored).

        Args:
            pos: the steps' positions.
            env_ids: the steps' environments.

        Returns:
            One position per step (int64).
        """
        return self._episodes(pos, env_ids)[1]

    def steps_to_episode_end(self, pos: Any, env_ids: Any) -> np.ndarray:
        """Steps from ``pos`` to the last stored step of its episode (its end once ended).

        Args:
            pos: the steps' positions.
            env_ids: the steps' environments.

        Returns:
            One count per step (int64).
        """
        p, _, last = self._episodes(pos, env_ids)
        return last - p

    def get_field(self, field_name: str, env_ids: Any, positions: Any) -> Any:
        """Field ``field_name`` ('.'-separated path, or ``discounted_return``) of stored steps,
        shaped like the broadcast of ``env_ids`` and ``positions``.

        Args:
            field_name: the field's path.
            env_ids: the steps' environments.
            positions: the steps' positions.

        Returns:
            The field's values.

        Raises:
            KeyError: no such field, or a step not stored.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import SequenceBuffer
            >>> buffer = SequenceBuffer(fakeredis.FakeRedis(), "demo", num_environments=2)
            >>> _ = buffer.add_batch({"s": {"x": np.array([1.0, 2.0])}})
            >>> buffer.get_field("s.x", [1, 0], 0).tolist()
            [2.0, 1.0]
        """
        ids = _as_int_array(np.ravel(env_ids), "env_ids")
        pos = _as_int_array(np.ravel(positions), "positions")
        shape = np.broadcast_shapes(np.shape(env_ids), np.shape(positions))
        ids, pos = (
            a.reshape(-1)
            for a in np.broadcast_arrays(
                ids.reshape(np.shape(env_ids)), pos.reshape(np.shape(positions))
            )
        )
        names = [f"{e}:{p}" for e, p in zip(ids.tolist(), pos.tolist(), strict=True)]
        if field_name == _DISCOUNTED_RETURN and self.record_episodic_return:
            blobs, raw = self._read_steps(names)
            self._missing(blobs, names)
            values = [self.default_return if r is None else float(r) for r in raw]
            return np.asarray(values, dtype=np.float32).reshape(shape)
        blobs = self._read_steps(names, with_returns=False)[0]
        self._missing(blobs, names)
        schema = self._stored_schema()
        if field_name not in schema:
            raise KeyError(f"no field {field_name!r}; fields: {sorted(schema)}")
        data: Any = self._decode(blobs, (len(names),))  # a nested field's dict, then its array
        for part in field_name.split("."):
            data = data[part]
        return data.reshape((*shape, *tuple(schema[field_name]["shape"])))

    def _step_names(self, env_ids: Any, positions: Any) -> list[str]:
        ids = _as_int_array(env_ids, "env_ids")
        pos = _as_int_array(positions, "positions")
        if ids.shape != pos.shape:
            raise InvalidBatchError(f"{ids.size} env_ids for {pos.size} positions")
        return [f"{e}:{p}" for e, p in zip(ids.tolist(), pos.tolist(), strict=True)]

    def get_steps(self, env_ids: Any, positions: Any) -> dict[str, Any]:
        """Every field of the steps ``(env_ids[i], positions[i])``, read in one command
        per :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` steps, shaped ``[n]``.

        Raises:
            KeyError: a step not stored (evicted, or never written).
            ValueError: no step asked for.
        """
        names = self._step_names(env_ids, positions)
        if not names:
            raise ValueError("no step to read")
        blobs, raw = self._read_steps(names)
        self._missing(blobs, names)
        data = self._decode(blobs, (len(names),))
        self._with_returns(data, raw, (len(names),))
        return data

    def contains(self, env_ids: Any, positions: Any) -> np.ndarray:
        """Whether each step ``(env_ids[i], positions[i])`` is stored now (bool, ``[n]``)."""
        names = self._step_names(env_ids, positions)
        blobs = self._read_steps(names, with_returns=False)[0]
        return np.array([blob is not None for blob in blobs], dtype=bool)

    @staticmethod
    def _missing(blobs: list[Any], names: list[str]) -> None:
        gone = [name for name, blob in zip(names, blobs, strict=True) if blob is None]
        if gone:
            raise KeyError(f"steps not stored (env:pos): {gone[:5]}")

    def _read(self, args: list[Any]) -> tuple[dict[str, Any], BatchInfo]:
        reply = self._run("seq_read", self._keys, args)
        count, b = int(reply[0]), int(reply[1])
        envs = np.asarray(reply[2 : 2 + b], dtype=np.int64)
        starts = np.asarray(reply[2 + b : 2 + 2 * b], dtype=np.int64)
        at = 2 + 2 * b
        data = self._decode(reply[at : at + b * count], (b, count))
        self._with_returns(data, reply[at + b * count :], (b, count))
        return data, BatchInfo(envs, starts, np.ones(b, dtype=np.float32))

    def gather_all(self, ignore_earliest_frames: bool = False) -> tuple[dict[str, Any], BatchInfo]:
        """Every stored step, shaped ``[num_environments, T, ...]`` (all environments must
        hold the same number of steps), with ``positions`` = each env's first returned
        step; ``ignore_earliest_frames`` leaves out the oldest
        ``num_earliest_frames_ignored`` steps of each environment (ALF).

        Up to :data:`~redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND` steps are read by one
        atomic command. A larger buffer is read in commands of at most that many steps
        (redisbuf/store/bounds.py): the environments' ranges first, then their steps. The
        result is the buffer as it was when the ranges were read (a field ``"e:p"`` only
        ever names one step and a stored step never changes; returns are those at the read
        of each environment's steps when they fit one command); when a step was evicted
        before it was read, the whole read is made again (3 tries, then
        :class:`~redisbuf.errors.SamplingError`).

        Args:
            ignore_earliest_frames: leave out ``num_earliest_frames_ignored`` steps.

        Returns:
            The fields and a :class:`BatchInfo` (one row per environment).

        Raises:
            InvalidBatchError: the environments hold different numbers of steps.
            SamplingError: 3 reads each lost a step to eviction.
        """
        skip = self.num_earliest_frames_ignored if ignore_earliest_frames else 0
        bound = bounds.MAX_ITEMS_PER_COMMAND
        for _ in range(3):
            starts, nexts = self._env_ranges(np.arange(self.num_environments))
            sizes = nexts - starts
            if (sizes != sizes[0]).any():
                e = int(np.flatnonzero(sizes != sizes[0])[0])
                raise InvalidBatchError(
                    f"environments hold different numbers of steps (env 0: {sizes[0]}, env "
                    f"{e}: {sizes[e]})"
                )
            skipped = min(skip, int(sizes[0]))
            count = int(sizes[0]) - skipped
            if self.num_environments <= bound and count * self.num_environments <= bound:
                try:
                    return self._read(["gather", skip])
                except RequestTooLargeError:
                    continue  # steps were added since the ranges were read
            first = starts + skipped
            names = [f"{e}:{p}" for e in range(self.num_environments)
                     for p in range(int(first[e]), int(first[e]) + count)]
            blobs, returns = self._read_steps(names, count)
            if any(blob is None for blob in blobs):
                continue  # evicted while read: read the ranges again
            shape = (self.num_environments, count)
            data = self._decode(blobs, shape)
            self._with_returns(data, returns, shape)
            info = BatchInfo(np.arange(self.num_environments, dtype=np.int64),
                             first.astype(np.int64),
                             np.ones(self.num_environments, dtype=np.float32))
            return data, info
        raise SamplingError(
            f"sequence buffer {self.name!r}: steps were evicted while gather_all read them, "
            "3 times"
        )

    def _env_ranges(self, env_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(oldest stored position, next position) of each environment, read in commands of
        at most the bound's fields (one pipeline)."""
        fields = [f"{kind}:{e}" for e in env_ids.tolist() for kind in ("start", "next")]
        pipe = self.client.pipeline(transaction=False)
        for start, stop in bounds.chunks(len(fields)):
            pipe.hmget(self._keys[2], fields[start:stop])
        raw = [value for reply in pipe.execute() for value in reply]
        values = np.array([int(v or 0) for v in raw], dtype=np.int64)
        return values[0::2], values[1::2]

    def dequeue(self, n: int = 1, env_ids: Any = None) -> dict[str, Any]:
        """Remove and return the oldest ``n`` steps of each environment in ``env_ids``
        (all when None), shaped ``[len(env_ids), n, ...]`` (ALF returns no BatchInfo
        here either), in one atomic command. Raises :class:`EmptyBufferError`, removing
        nothing, when one holds fewer than ``n``; :class:`RequestTooLargeError`, removing
        nothing, when ``n * len(env_ids)`` is above
        :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS` (removing a step costs the server
        what storing one does, and an atomic removal cannot be split: dequeue fewer
        environments per call).

        Args:
            n: steps per environment (positive).
            env_ids: the environments, or ``None`` for all.

        Returns:
            The removed steps' fields.

        Raises:
            ValueError: ``n`` is not a positive integer.
            EmptyBufferError: an environment holds fewer than ``n`` steps.
            RequestTooLargeError: ``n * len(env_ids)`` is above ``MAX_ADD_ITEMS``.

        Examples:
            >>> import fakeredis, numpy as np
            >>> from redisbuf import SequenceBuffer
            >>> buffer = SequenceBuffer(fakeredis.FakeRedis(), "demo", num_environments=2)
            >>> for t in range(3):
            ...     _ = buffer.add_batch({"obs": np.array([t, 10 + t])})
            >>> buffer.dequeue(2)["obs"].tolist()
            [[0, 1], [10, 11]]
            >>> buffer.env_range(0)
            (2, 3)
        """
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"n must be a positive integer, got {n!r}")
        ids = (
            np.arange(self.num_environments)
            if env_ids is None
            else _as_int_array(env_ids, "env_ids")
        )
        if n * len(ids) > bounds.MAX_ADD_ITEMS:
            raise RequestTooLargeError(
                f"one dequeue removes at most {bounds.MAX_ADD_ITEMS} steps (n * environments), "
                f"asked for {n} of {len(ids)} environments: pass env_ids in smaller groups"
            )
        return self._read(["dequeue", n, *ids.tolist()])[0]
