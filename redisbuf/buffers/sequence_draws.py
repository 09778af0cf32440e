"""How :class:`~redisbuf.buffers.sequence.SequenceBuffer` draws its windows
(``get_batch``) and sets its step priorities (``update_priority``).

Uniform windows are drawn by lua/seq_sample.lua alone. Prioritized window starts are drawn
by the prioritized engine the replay buffer's PER uses (docs/sampling.md, "How
prioritized draws are made"): each process draws them in proportion to their priority
from its replica of the ``prio`` hash (:class:`~redisbuf.sampling.replica.MassReplica`,
rule ``"per"`` with alpha 1 and eps 0, so a slot's mass is its priority, read through
:class:`_PrioritySource`), and :func:`~redisbuf.sampling.commits.commit_corrected`
commits them with lua/seq_sample.lua (:class:`_WindowCommit`), which corrects them to the
priorities at the call when the replica was behind and keeps those that start valid
windows.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import EmptyBufferError, InvalidBatchError, RequestTooLargeError
from ..sampling.base import BufferView
from ..sampling.commits import CorrectedCommit, commit_corrected, follow
from ..sampling.replica import MassReplica, replica_of
from ..sampling.uniforms import packed_uniforms
from ..store import _torch, bounds
from ..store.keys import pack_ids
from .sequence_reads import BatchInfo, _as_int_array

if TYPE_CHECKING:
    from .needs import SequenceDrawingNeeds as _SequenceDrawingNeeds
else:
    _SequenceDrawingNeeds = object  # for type checkers only: see redisbuf/buffers/needs.py

if TYPE_CHECKING:
    from .sequence import SequenceBuffer

_TRIES = 4  # candidate draws per window and call before rejection gives up
_ROUNDS = 50  # draws before giving up on filling a batch (prioritized rejections, races)
# Prioritized draws: the fewest spare draws sent per draw (lua/seq_sample.lua uses them in
# place of a draw whose slot changed since the replica's version; the draws beyond those
# a batch needs serve too, so none are sent until a correction ran short of them), and the
# most draws sent per window wanted (when few start valid windows)
_SPARES = 0
_MAX_DRAWS_PER_WINDOW = 8


class SequenceDrawing(_SequenceDrawingNeeds):
    """A mixin of :class:`~redisbuf.buffers.sequence.SequenceBuffer`: the buffer provides
    ``client``, ``name``, ``keys``, ``_keys``, ``rng``, its sampling options
    (``prioritized_sampling``, ``recent_data_ratio``, ``recent_data_steps``,
    ``allow_cross_episode``, ``with_replacement``, ``num_earliest_frames_ignored``), the
    ``_priorities`` source and ``_acceptance`` (window length -> share of prioritized
    draws that started valid windows), and ``_run``, ``_stored_schema``, ``_read_steps``,
    ``_decode`` and ``_with_returns``."""

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
        slots, values = reply[6], reply[7]
        replica: MassReplica | None = self._priorities.replicas.get("per")
        if replica is not None and slots:
            replica.apply_own(  # slots as 12-digit text, priorities as text
                reply[1:6], np.array(slots.split(b","), dtype=np.int64),
                np.array(values.split(b","), dtype=np.float64),
            )
        return int(reply[0])


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

    def __init__(self, buffer: SequenceDrawing, head: list[Any], wanted: int, length: int,
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


__all__ = ["SequenceDrawing"]
