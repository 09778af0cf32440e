"""Worker side of remote scoring: what a ReplayBuffer with a remote manager does on ``add``.

Every ``add`` writes the whole batch into the worker's buffer in Redis first (as
torchgfn's worker keeps everything in its local buffer); this module then decides what
the manager hears about:

* the new items accumulate; every ``buffer_freq``-th ``add`` sends them at once;
* with ``baseline_filtering`` only items with ``log_reward >= baseline`` are sent (the
  baseline is the last ``baseline_log_reward`` the manager replied, -inf before any);
  a send left empty by the filter is skipped, and after ``baseline_refresh_after``
  such skips in a row the next batch goes out unfiltered so the baseline can refresh;
* the message names the items by id (the manager reads them from Redis); with
  ``scoring_only`` it carries their terminating states and log-rewards instead, for a
  manager that needs only those to score (nothing is read from Redis then);
* ``add`` returns the score of its own send, or with ``async_score`` the score of the
  previous send (None on the first), collected just before this call's send.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ..errors import ControlTimeoutError, InvalidBatchError
from ..store import _torch
from .protocol import DATA_TAG, OP_DATA, OP_SCORE, Transport, decode, expect_reply, request

if TYPE_CHECKING:
    from ..sampling.base import BufferView

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ManagerLink:
    """How a worker buffer reports what it adds to a
    :class:`~redisbuf.control.manager.ReplayBufferManager`: the ``manager=`` of
    :class:`~redisbuf.ReplayBuffer`. The settings are torchgfn's remote-manager arguments
    (``remote_manager_rank`` is ``rank``, ``remote_buffer_freq`` is ``buffer_freq``,
    ``communication_backend`` is ``backend``); the module docstring says what each does.

    Args:
        rank: the manager's rank (MPI: its rank in ``COMM_WORLD``; ``"redis"``: the
            manager serving the buffer's name answers, whatever the rank).
        buffer_freq: every ``buffer_freq``-th ``add`` sends the items accumulated since
            the last send (>= 1).
        async_score: ``add`` returns the previous send's score (None on the first)
            instead of waiting for its own.
        baseline_filtering: send only items with ``log_reward >=`` the manager's last
            ``baseline_log_reward``.
        baseline_refresh_after: after this many sends in a row left empty by the filter,
            the next one goes out unfiltered (>= 1).
        scoring_only: the message carries the items' terminating states and log-rewards
            instead of their ids.
        backend: ``"mpi"``, ``"redis"`` or a transport object (with ``send`` and
            ``recv``).
        timing: record the duration of each send and receive.

    Raises:
        ValueError: ``rank`` not an integer >= 0, ``buffer_freq`` or
            ``baseline_refresh_after`` below 1, or an unknown ``backend`` name.
        TypeError: ``backend`` neither a name nor a transport.

    Examples:
        >>> from redisbuf import ManagerLink
        >>> link = ManagerLink(0, buffer_freq=4, backend="redis")
        >>> link.rank, link.buffer_freq, link.async_score
        (0, 4, False)
        >>> ManagerLink(0, buffer_freq=0)
        Traceback (most recent call last):
        ...
        ValueError: buffer_freq must be an integer >= 1, got 0
    """

    rank: int
    buffer_freq: int = 1
    async_score: bool = False
    baseline_filtering: bool = False
    baseline_refresh_after: int = 10
    scoring_only: bool = False
    backend: Any = "mpi"
    timing: bool = False

    def __post_init__(self) -> None:
        for field, least in (("rank", 0), ("buffer_freq", 1), ("baseline_refresh_after", 1)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{field} must be an integer >= {least}, got {value!r}")
        if isinstance(self.backend, str):
            if self.backend not in ("mpi", "redis"):
                raise ValueError(
                    f"unknown communication_backend {self.backend!r}; use 'mpi' or 'redis'"
                )
        elif not (hasattr(self.backend, "send") and hasattr(self.backend, "recv")):
            raise TypeError(f"not a control transport: {self.backend!r}")


def make_transport(buffer: BufferView, backend: Any) -> Transport:
    """A worker transport: ``"mpi"`` (COMM_WORLD), ``"redis"`` (the buffer's Redis and
    name, rank handed out by the manager) or a ready transport object."""
    if backend == "mpi":
        from .mpi import MPITransport

        return MPITransport()
    if backend == "redis":
        from .redis import RedisWorkerTransport

        return RedisWorkerTransport(buffer.client, buffer.name)
    if isinstance(backend, str):
        raise ValueError(f"unknown communication_backend {backend!r}; use 'mpi' or 'redis'")
    if not (hasattr(backend, "send") and hasattr(backend, "recv")):
        raise TypeError(f"not a control transport: {backend!r}")
    return backend


def _concat(parts: list[Any]) -> Any:
    if len(parts) == 1:
        return parts[0]
    if _torch.is_tensor(parts[0]):
        return _torch.require().cat(parts)
    return np.concatenate(parts)


def _select(array: Any, mask: np.ndarray) -> Any:
    if _torch.is_tensor(array):
        return array[_torch.require().from_numpy(mask)]
    return array[mask]


class RemoteScorer:
    """The remote-manager state of one worker buffer (``ReplayBuffer.remote``), made
    from the buffer's view (its name and client) and its :class:`ManagerLink`."""

    def __init__(self, buffer: BufferView, link: ManagerLink) -> None:
        self.link = link
        self.buffer_name = buffer.name
        self.manager_rank = link.rank
        self.remote_buffer_freq = link.buffer_freq
        self.async_score = link.async_score
        self.baseline_filtering = link.baseline_filtering
        self.baseline_refresh_after = link.baseline_refresh_after
        self.scoring_only = link.scoring_only
        self.timing = link.timing
        self.transport = make_transport(buffer, link.backend)
        self.baseline_log_reward = -np.inf
        self.last_score: dict[str, float] | None = None
        # counters, named as torchgfn's
        self.add_counter = 0
        self.sends = 0
        self.baseline_total = 0
        self.baseline_kept = 0
        self.baseline_skipped_sends = 0
        self.consecutive_filtered_empty = 0
        self.timing_data: dict[str, list[float]] = defaultdict(list)
        self._seq = 0
        self._pending_seq: int | None = None
        self._ids: list[np.ndarray] = []
        self._log_rewards: list[np.ndarray] = []
        self._inline: list[dict[str, Any]] = []

    @property
    def pending_score(self) -> bool:
        """True while an async send's score has not been collected."""
        return self._pending_seq is not None

    # -- add --------------------------------------------------------------------------

    def after_add(
        self, batch: Any, ids: np.ndarray, log_rewards: np.ndarray, schema: dict[str, Any]
    ) -> dict[str, float] | None:
        """Account for items just written; send every ``remote_buffer_freq``-th call.
        Returns the score dict that ``add`` returns (see the module docstring)."""
        if self.baseline_filtering:
            if schema["kind"] == "transitions":
                raise InvalidBatchError(
                    "baseline_filtering does not support Transitions: their log-rewards are "
                    "per transition (-inf on non-terminal rows), so filtering rows breaks them"
                )
            if "log_rewards" not in schema["fields"]:
                raise InvalidBatchError("baseline_filtering needs batches with log_rewards")
        if self.scoring_only:
            self._inline.append(self._scoring_payload(batch, schema))
        self._ids.append(np.asarray(ids, dtype=np.int64))
        self._log_rewards.append(np.asarray(log_rewards, dtype=np.float64))
        self.add_counter += 1
        if self.add_counter % self.remote_buffer_freq:
            return None
        previous = self._collect(None) if self.async_score and self.pending_score else None
        self._send_pending()
        if self.async_score or not self.pending_score:
            return previous
        return self._collect(None)

    @staticmethod
    def _scoring_payload(batch: Any, schema: dict[str, Any]) -> dict[str, Any]:
        kind = schema["kind"]
        if kind == "trajectories":
            states = batch.terminating_states
        elif kind == "states":
            states = batch.states
        else:
            raise InvalidBatchError(
                f"scoring_only sends terminating states: it needs Trajectories or States, "
                f"not {kind}"
            )
        payload = {"states": states}
        if batch.log_rewards is not None:
            payload["log_rewards"] = batch.log_rewards
        return payload

    def _filter(self, log_rewards: np.ndarray) -> np.ndarray | None:
        """Boolean mask of the items to send, or None to skip this send."""
        self.baseline_total += len(log_rewards)
        everything = np.ones(len(log_rewards), dtype=bool)
        if not self.baseline_filtering:
            return everything
        if self.consecutive_filtered_empty >= self.baseline_refresh_after:
            self.consecutive_filtered_empty = 0
            self.baseline_kept += len(log_rewards)
            return everything
        mask = log_rewards >= self.baseline_log_reward
        if not mask.any():
            self.consecutive_filtered_empty += 1
            self.baseline_skipped_sends += 1
            return None
        self.consecutive_filtered_empty = 0
        self.baseline_kept += int(mask.sum())
        return mask

    def _send_pending(self) -> None:
        ids, log_rewards = np.concatenate(self._ids), np.concatenate(self._log_rewards)
        inline = None
        if self._inline:
            inline = {k: _concat([p[k] for p in self._inline]) for k in self._inline[0]}
        self._ids, self._log_rewards, self._inline = [], [], []
        mask = self._filter(log_rewards)
        if mask is None:
            return
        if not mask.all():
            ids, log_rewards = ids[mask], log_rewards[mask]
            if inline is not None:
                inline = {k: _select(v, mask) for k, v in inline.items()}
        self._seq += 1
        began = time.perf_counter()
        payload = request(
            OP_DATA,
            seq=self._seq,
            buffer=self.buffer_name,
            ids=ids.tolist(),
            log_rewards=log_rewards.tolist(),
            inline=inline,
        )
        self.transport.send(self.manager_rank, DATA_TAG, payload)
        if self.timing:
            self.timing_data["send"].append(time.perf_counter() - began)
        self.sends += 1
        self._pending_seq = self._seq

    def _collect(self, timeout: float | None) -> dict[str, float]:
        began = time.perf_counter()
        seq = self._pending_seq
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            # one deadline for the whole wait, however many stale replies come first
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            _, payload = self.transport.recv(self.manager_rank, DATA_TAG, left)
            stale = decode(payload).get("seq")
            # a reply that arrived after its drain timed out: its score is lost, skip it
            if not (isinstance(stale, int) and seq is not None and stale < seq):
                break
        self._pending_seq = None
        score = expect_reply(payload, OP_SCORE, seq)["score"]
        if self.timing:
            self.timing_data["recv"].append(time.perf_counter() - began)
        if "baseline_log_reward" in score:
            self.baseline_log_reward = float(score["baseline_log_reward"])
        self.last_score = score
        return score

    def drain_pending_score(self, timeout_sec: float = 30.0) -> dict[str, float] | None:
        """Collect an outstanding async score, waiting at most ``timeout_sec`` seconds.
        Returns None when nothing is pending or on timeout (the score is then lost)."""
        if not self.pending_score:
            return None
        try:
            return self._collect(timeout_sec)
        except ControlTimeoutError as exc:
            self._pending_seq = None
            log.warning("pending score dropped: %s", exc)
            return None

    def timing_log(self) -> str:
        """Mean and total seconds of the worker's sends and score waits."""
        parts = []
        for name, values in sorted(self.timing_data.items()):
            if values:
                parts.append(
                    f"{name}: n={len(values)} mean={1e3 * sum(values) / len(values):.3f} ms "
                    f"total={sum(values):.3f} s"
                )
        return "; ".join(parts) or "no timing recorded"
