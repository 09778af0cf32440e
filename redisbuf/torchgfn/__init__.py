"""Drop-in replacements for torchgfn's replay buffers, stored in Redis.

Change one import line of a torchgfn (2.4.1) script::

    from gfn.containers import ReplayBuffer          # before
    from redisbuf.torchgfn import ReplayBuffer       # after

The classes take torchgfn's arguments in torchgfn's order, plus keyword-only ``url=``,
``name=`` and ``seed=``; ``add`` accepts torchgfn's own ``Trajectories``, ``Transitions``
and ``StatesContainer`` and ``sample`` returns the same class, built for ``env`` (its
``States`` and ``Actions`` classes, conditions, sink state and dummy action as padding)
on the device of what was added. How each container is stored:

* ``Trajectories`` as redisbuf trajectories: states, actions, terminating index,
  log-rewards and one condition vector per trajectory (torchgfn keeps conditions constant
  along a trajectory; a batch where they vary is refused). Backward trajectories are
  refused (torchgfn gives them no log-rewards), and so are graph states.
* ``Transitions`` as redisbuf transitions (states, next states, actions,
  ``is_terminating``, log-rewards, conditions).
* ``StatesContainer`` as a dict kind (``states``, ``is_terminating``, ``log_rewards``,
  ``conditions``).

As in torchgfn 2.4.1, ``log_probs`` and ``estimator_outputs`` are not kept (they are
stale once replayed), and log-rewards are always stored (computed by ``env`` when the
container has none), so sampled containers carry them.

Randomness: without ``seed=``, every ``sample`` takes its random numbers from torch's
global generator, so ``torch.manual_seed`` / ``gfn.utils.common.set_seed`` make a run
reproducible; with ``seed=`` the buffer has its own generator.
"""

from __future__ import annotations

import uuid
import weakref
from typing import Any

import numpy as np

from .._extras import require as _require_extra
from ..buffers.replay import ReplayBuffer as _CoreBuffer
from ..control.remote import ManagerLink
from ..errors import EmptyBufferError, SchemaError

# torch and torchgfn come with the extra ``redisbuf[torchgfn]``: without either, importing
# this module raises MissingExtraError (an ImportError) naming it
_require_extra("torch", "torchgfn", "redisbuf.torchgfn")
_require_extra("gfn.containers", "torchgfn", "redisbuf.torchgfn", package="torchgfn")
import torch  # noqa: E402
from gfn.containers import StatesContainer, Trajectories, Transitions  # noqa: E402

from .containers import (  # noqa: E402
    _CLASS_OF_KIND,
    BufferEmptyError,
    ContainerTypeError,
    _kind_of,
    from_redisbuf,
    to_redisbuf,
)
from .manager import (  # noqa: E402
    DEFAULT_MANAGER_NAME,
    ReplayBufferManager,
    _drop_quietly,
    _worker_transport,
)

__all__ = [
    "DEFAULT_MANAGER_NAME",
    "BufferEmptyError",
    "ContainerTypeError",
    "NormBasedDiversePrioritizedReplayBuffer",
    "ReplayBuffer",
    "ReplayBufferManager",
    "StatesContainer",
    "TerminatingStateBuffer",
    "Trajectories",
    "Transitions",
    "from_redisbuf",
    "to_redisbuf",
]


# -- ReplayBuffer ---------------------------------------------------------------------


class ReplayBuffer:
    """torchgfn's ``ReplayBuffer`` (2.4.1 signature and the documented remote options),
    stored in Redis.

    Args:
        env: the torchgfn environment of the containers.
        capacity: as torchgfn.
        prioritized_capacity: as torchgfn.
        prioritized_sampling: as torchgfn. Sampling draws without replacement whenever
            ``n <= len``, as torchgfn does.
        remote_manager_rank: as torchgfn 2.4.1; with the remote settings below it makes
            the :class:`~redisbuf.control.remote.ManagerLink` of the buffer in Redis.
        remote_buffer_freq: as torchgfn 2.4.1.
        communication_backend: as on torchgfn's main branch (2.4.1 has none: its remote
            manager runs over torch.distributed with gloo): ``"mpi"`` or ``"redis"``
            (torch.distributed is not used).
        timing: as on torchgfn's main branch (not in 2.4.1).
        async_score: as on torchgfn's main branch (not in 2.4.1).
        async_comm: ``True`` means ``async_score=True`` (sends never block here).
        lazy_sort: accepted and changes nothing: every add is sorted into Redis at once.
        baseline_filtering: as on torchgfn's main branch (not in 2.4.1).
        scoring_only: as on torchgfn's main branch (not in 2.4.1).
        baseline_refresh_after: as on torchgfn's main branch (not in 2.4.1).
        url: Redis URL or client (None: ``$REDISBUF_URL``).
        name: buffer name; processes that give the same name share one buffer. None
            (the default): a private buffer under a fresh name, dropped by :meth:`close`,
            when this object is garbage-collected, or at interpreter exit.
        seed: this buffer's own random generator; None: torch's global one.
        manager_name: the manager's buffer name, used by the ``"redis"`` backend.

    Raises:
        ValueError: an argument out of range (as :class:`redisbuf.ReplayBuffer`).

    Examples:

        >>> import fakeredis
        >>> from gfn.estimators import DiscretePolicyEstimator
        >>> from gfn.gym import HyperGrid
        >>> from gfn.preprocessors import KHotPreprocessor
        >>> from gfn.samplers import Sampler
        >>> from gfn.utils.modules import MLP
        >>> env = HyperGrid(ndim=2, height=8)
        >>> pre = KHotPreprocessor(env.height, env.ndim)
        >>> policy = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions,
        ...                                  preprocessor=pre)
        >>> trajectories = Sampler(policy).sample_trajectories(env, n=4)
        >>> from redisbuf.torchgfn import ReplayBuffer
        >>> buffer = ReplayBuffer(env, capacity=10, url=fakeredis.FakeRedis())
        >>> buffer.add(trajectories)  # None: no remote manager
        >>> len(buffer), type(buffer.sample(2)).__name__
        (4, 'Trajectories')
        >>> buffer.close()
    """

    def __init__(
        self,
        env: Any,
        capacity: int = 1000,
        prioritized_capacity: bool = False,
        prioritized_sampling: bool = False,
        remote_manager_rank: int | None = None,
        remote_buffer_freq: int = 1,
        communication_backend: str = "mpi",
        timing: bool = False,
        async_score: bool = False,
        async_comm: bool = False,
        lazy_sort: bool = False,
        baseline_filtering: bool = False,
        scoring_only: bool = False,
        baseline_refresh_after: int = 10,
        *,
        url: Any = None,
        name: str | None = None,
        seed: int | None = None,
        manager_name: str = DEFAULT_MANAGER_NAME,
    ) -> None:
        self.env = env
        self.capacity = capacity
        self.prioritized_capacity = prioritized_capacity
        self.prioritized_sampling = prioritized_sampling
        self.remote_manager_rank = remote_manager_rank
        self.remote_buffer_freq = remote_buffer_freq
        self.communication_backend = communication_backend
        self.timing = timing
        self.async_score = async_score or async_comm
        self.async_comm = async_comm
        self.lazy_sort = lazy_sort
        self.baseline_filtering = baseline_filtering
        self.scoring_only = scoring_only
        self.baseline_refresh_after = baseline_refresh_after
        self.seed = seed
        private = name is None
        self.name: str = f"torchgfn-{uuid.uuid4().hex[:16]}" if name is None else name
        options: dict[str, Any] = {"seed": seed}
        if remote_manager_rank is not None:
            # torchgfn's lazy_sort defers a per-add sort that redisbuf does not do (eviction
            # is incremental), and its async_comm is async_score here (the data is in Redis
            # when the insert returns): neither reaches the core buffer
            options["manager"] = ManagerLink(
                remote_manager_rank,
                buffer_freq=remote_buffer_freq,
                async_score=self.async_score,
                baseline_filtering=baseline_filtering,
                baseline_refresh_after=baseline_refresh_after,
                scoring_only=scoring_only,
                backend=_worker_transport(communication_backend, url, manager_name),
                timing=timing,
            )
        self._buffer = self._open(url, options)
        self._device: torch.device | None = None
        self._container_class: type | None = None
        self._finalizer = (
            weakref.finalize(self, _drop_quietly, self._buffer.client, self.name)
            if private
            else None
        )

    def _open(self, url: Any, options: dict[str, Any]) -> _CoreBuffer:
        return _CoreBuffer(
            url,
            self.name,
            capacity=self.capacity,
            prioritized_capacity=self.prioritized_capacity,
            prioritized_sampling=self.prioritized_sampling,
            **options,
        )

    def _convert(self, container: Any) -> Any:
        return to_redisbuf(container, self.env)

    # -- torchgfn's API ---------------------------------------------------------------

    @property
    def buffer(self) -> _CoreBuffer:
        """The underlying :class:`redisbuf.ReplayBuffer`."""
        return self._buffer

    @property
    def device(self) -> torch.device:
        """The device of the containers added (``env.device`` for items added by other
        processes). Raises :class:`BufferEmptyError` (an AssertionError, as torchgfn)
        on an empty buffer."""
        if self._device is not None:
            return self._device
        if len(self._buffer) == 0:
            raise BufferEmptyError("Buffer is empty, it has no device!")
        return torch.device(self.env.device)

    def __len__(self) -> int:
        return len(self._buffer)

    def _class_name(self) -> str:
        """The container class held, as torchgfn's repr names it ("empty": none yet)."""
        held = self._container_class or _CLASS_OF_KIND.get(self._buffer.kind or "")
        return "empty" if held is None else held.__name__

    def __repr__(self) -> str:
        # torchgfn's text exactly, "ReplayBuffer" for every class included; the Redis
        # name is the attribute ``name``
        return (
            f"ReplayBuffer(capacity={self.capacity}, containing {len(self)} "
            f"{self._class_name()})"
        )

    def _check_class(self, container: Any) -> None:
        _kind_of(container)
        if self._container_class is not None and type(container) is not self._container_class:
            raise ContainerTypeError(
                f"buffer {self.name!r} holds {self._container_class.__name__}, "
                f"got {type(container).__name__}"
            )

    def add(self, training_container: Any) -> dict[str, float] | None:
        """Add a container (TypeError for anything else); return the manager's score
        dict when a remote manager is set and this add sent, else None.

        Args:
            training_container: a torchgfn ``Trajectories``, ``Transitions`` or
                ``StatesContainer``, of the class the buffer holds.

        Returns:
            The score dict, or ``None``.

        Raises:
            ContainerTypeError: not a container, or another class than the buffer holds.
        """
        self._check_class(training_container)
        if len(training_container) == 0:
            return None
        batch = self._convert(training_container)
        try:
            result = self._buffer.add(batch)
        except SchemaError as exc:
            if self._buffer.kind is not None and self._buffer.kind != _kind_of(training_container):
                raise ContainerTypeError(str(exc)) from None
            raise
        self._container_class = type(training_container)
        if self._device is None:
            self._device = training_container.device
        return result.score

    def _reseed(self) -> None:
        if self.seed is None:  # torch's generator: reproducible under torch.manual_seed
            word = int(torch.randint(0, 2**62, (1,)).item())
            self._buffer.rng = np.random.default_rng(word)

    def sample(self, n_samples: int) -> Any:
        """``n_samples`` items as a container of the class added; without replacement
        when ``n_samples <= len(self)``, else with replacement (torchgfn 2.4.1's uniform
        sample returns the ``len(self)`` items held instead). An empty buffer raises
        :class:`BufferEmptyError` (a ValueError, as torchgfn).

        Args:
            n_samples: how many items.

        Returns:
            A container of the class added.

        Raises:
            BufferEmptyError: the buffer is empty.
        """
        self._reseed()
        try:
            batch = self._buffer.sample(n_samples)
        except EmptyBufferError as exc:
            # torchgfn's text when nothing was ever added (its tests match it)
            raise BufferEmptyError(
                "Buffer is empty" if len(self._buffer) == 0 else str(exc)
            ) from None
        return from_redisbuf(batch, self.env, self._device)

    @property
    def training_container(self) -> Any:
        """Everything the buffer holds as one container (None if empty), in torchgfn's
        order: ascending log-reward with ``prioritized_capacity`` (so the top k are
        ``training_container[-k:]``; equal log-rewards oldest first), else oldest first."""
        keys = self._buffer.keys
        ordering = keys.prio if self.prioritized_capacity else keys.order
        ids = [int(i) for i in self._buffer.client.zrange(ordering, 0, -1)]
        if not ids:
            return None
        return from_redisbuf(self._buffer.get(ids), self.env, self._device)

    def initialize(self, training_container: Any) -> Any:
        """An empty container of ``training_container``'s class (torchgfn's helper).

        Args:
            training_container: a torchgfn container.

        Returns:
            An empty container for ``env``.
        """
        return type(training_container)(self.env)

    def save(self, path: str) -> None:
        """Write the buffer to ``path`` (redisbuf's msgpack format, not torchgfn's .pt).

        Args:
            path: the file to write.
        """
        self._buffer.save(path)

    def load(self, path: str) -> None:
        """Replace the buffer's items with those saved at ``path``.

        Args:
            path: a file written by :meth:`save`.
        """
        self._buffer.load(path)

    def drain_pending_score(self, timeout_sec: float = 30.0) -> dict[str, float] | None:
        """Collect an outstanding async score (None when nothing is pending or on timeout).

        Args:
            timeout_sec: the longest wait, in seconds.

        Returns:
            The score dict, or ``None``.
        """
        return self._buffer.drain_pending_score(timeout_sec)

    def close(self) -> None:
        """Drop a private buffer (``name=None``) now; a named one is left as it is."""
        if self._finalizer is not None:
            self._finalizer()

    def timing_log(self) -> str:
        """Count, mean and total time of this worker's sends to its manager and score
        waits (with ``timing=True``).

        Returns:
            One line; ``"no timing recorded"`` without a manager or timings.
        """
        remote = self._buffer.remote
        return remote.timing_log() if remote is not None else "no timing recorded"


class NormBasedDiversePrioritizedReplayBuffer(ReplayBuffer):
    """torchgfn's ``NormBasedDiversePrioritizedReplayBuffer``: prioritized capacity, and
    once full a batch's items enter only if their terminating state (conditions
    appended) is farther than ``cutoff_distance`` (p-norm ``p_norm_distance``) from every
    higher-ranked item of the batch and every stored item; the test runs in Redis,
    atomically with the insert
    (:class:`redisbuf.buffers.diverse.NormBasedDiversePrioritizedReplayBuffer`).

    Takes torchgfn's arguments (``env, capacity, cutoff_distance, p_norm_distance,
    remote_manager_rank, ...``) plus ``url=``, ``name=``, ``seed=`` and
    ``prioritized_sampling=``. ``remote_manager_rank`` is refused, as torchgfn 2.4.1's
    diverse ``add`` never sends to a manager. Transitions must all be terminating, and a
    StatesContainer must hold terminating states only: each item needs one state to
    compare.

    Args:
        env: the torchgfn environment of the containers.
        capacity: as :class:`ReplayBuffer`.
        cutoff_distance: as above.
        p_norm_distance: as above.
        remote_manager_rank: must be ``None``.
        remote_buffer_freq: as :class:`ReplayBuffer`.
        communication_backend: as :class:`ReplayBuffer`.
        timing: as :class:`ReplayBuffer`.
        async_score: as :class:`ReplayBuffer`.
        async_comm: as :class:`ReplayBuffer`.
        lazy_sort: as :class:`ReplayBuffer`.
        baseline_filtering: as :class:`ReplayBuffer`.
        scoring_only: as :class:`ReplayBuffer`.
        baseline_refresh_after: as :class:`ReplayBuffer`.
        url: as :class:`ReplayBuffer`.
        name: as :class:`ReplayBuffer`.
        seed: as :class:`ReplayBuffer`.
        prioritized_sampling: as :class:`ReplayBuffer`.

    Raises:
        ValueError: ``remote_manager_rank`` given.
    """

    def __init__(
        self,
        env: Any,
        capacity: int = 1000,
        cutoff_distance: float = 0.0,
        p_norm_distance: float = 1.0,
        remote_manager_rank: int | None = None,
        remote_buffer_freq: int = 1,
        communication_backend: str = "mpi",
        timing: bool = False,
        async_score: bool = False,
        async_comm: bool = False,
        lazy_sort: bool = False,
        baseline_filtering: bool = False,
        scoring_only: bool = False,
        baseline_refresh_after: int = 10,
        *,
        url: Any = None,
        name: str | None = None,
        seed: int | None = None,
        prioritized_sampling: bool = False,
    ) -> None:
        if remote_manager_rank is not None:
            raise ValueError(
                "remote_manager_rank is not supported by the diverse buffer: torchgfn "
                "2.4.1's diverse add never sends to its manager; use a ReplayBuffer for that"
            )
        self.cutoff_distance = cutoff_distance
        self.p_norm_distance = p_norm_distance
        super().__init__(
            env, capacity, True, prioritized_sampling, None, remote_buffer_freq,
            communication_backend, timing, async_score, async_comm, lazy_sort,
            baseline_filtering, scoring_only, baseline_refresh_after,
            url=url, name=name, seed=seed,
        )

    def _open(self, url: Any, options: dict[str, Any]) -> _CoreBuffer:
        from ..buffers.diverse import NormBasedDiversePrioritizedReplayBuffer as _CoreDiverse

        return _CoreDiverse(
            url,
            self.name,
            capacity=self.capacity,
            cutoff_distance=self.cutoff_distance,
            p_norm_distance=self.p_norm_distance,
            prioritized_sampling=self.prioritized_sampling,
            **options,
        )

    def _convert(self, container: Any) -> Any:
        if isinstance(container, StatesContainer) and not bool(container.is_terminating.all()):
            raise ValueError(
                "a diverse buffer compares terminating states: this StatesContainer holds "
                f"{int((~container.is_terminating).sum())} non-terminating states"
            )
        return to_redisbuf(container, self.env, states_kind="states")


class TerminatingStateBuffer(ReplayBuffer):
    """torchgfn's ``TerminatingStateBuffer``: ``add`` takes Trajectories, Transitions or
    a StatesContainer and keeps their terminating states with log-rewards (and
    conditions); ``sample`` returns a StatesContainer whose states are all terminating.
    Takes torchgfn's ``(env, capacity, **kwargs)`` with :class:`ReplayBuffer`'s keywords.

    Args:
        env: the torchgfn environment of the containers.
        capacity: as :class:`ReplayBuffer`.
        **kwargs: :class:`ReplayBuffer`'s other arguments.

    Examples:

        >>> import fakeredis
        >>> from gfn.estimators import DiscretePolicyEstimator
        >>> from gfn.gym import HyperGrid
        >>> from gfn.preprocessors import KHotPreprocessor
        >>> from gfn.samplers import Sampler
        >>> from gfn.utils.modules import MLP
        >>> env = HyperGrid(ndim=2, height=8)
        >>> pre = KHotPreprocessor(env.height, env.ndim)
        >>> policy = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions,
        ...                                  preprocessor=pre)
        >>> trajectories = Sampler(policy).sample_trajectories(env, n=4)
        >>> from redisbuf.torchgfn import TerminatingStateBuffer
        >>> buffer = TerminatingStateBuffer(env, url=fakeredis.FakeRedis())
        >>> _ = buffer.add(trajectories)
        >>> sample = buffer.sample(2)
        >>> type(sample).__name__, bool(sample.is_terminating.all())
        ('StatesContainer', True)
        >>> buffer.close()
    """

    def __init__(self, env: Any, capacity: int = 1000, **kwargs: Any) -> None:
        super().__init__(env, capacity, **kwargs)

    def _open(self, url: Any, options: dict[str, Any]) -> _CoreBuffer:
        from ..buffers.terminating import TerminatingStateBuffer as _CoreTerminating

        return _CoreTerminating(
            url,
            self.name,
            capacity=self.capacity,
            prioritized_capacity=self.prioritized_capacity,
            prioritized_sampling=self.prioritized_sampling,
            **options,
        )

    def _check_class(self, container: Any) -> None:
        # any container class: all become terminating states
        if not isinstance(container, (Trajectories, Transitions, StatesContainer)):
            raise ContainerTypeError(  # torchgfn's words, though it takes all three
                f"Must be a StatesContainer, Trajectories or Transitions (torchgfn "
                f"containers), got {type(container).__name__}"
            )

    def _class_name(self) -> str:
        return "StatesContainer"  # torchgfn's starts with an empty StatesContainer

    def _convert(self, container: Any) -> Any:
        return to_redisbuf(container, self.env, states_kind="states")

    def add(self, training_container: Any) -> dict[str, float] | None:
        """Add the terminating states of a ``Trajectories``, ``Transitions`` or
        ``StatesContainer``; later samples are ``StatesContainer``.

        Args:
            training_container: the container.

        Returns:
            The manager's score dict, or ``None`` (as :meth:`ReplayBuffer.add`).

        Raises:
            ContainerTypeError: not one of those containers.
        """
        score = super().add(training_container)
        self._container_class = StatesContainer
        return score
