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

import inspect
import uuid
import weakref
from typing import Any

import numpy as np

from ._extras import require as _require_extra
from .buffers.replay import ReplayBuffer as _CoreBuffer
from .control.manager import ReplayBufferManager as _CoreManager
from .control.remote import ManagerLink
from .errors import EmptyBufferError, SchemaError
from .store import containers as rb

# torch and torchgfn come with the extra ``redisbuf[torchgfn]``: without either, importing
# this module raises MissingExtraError (an ImportError) naming it
_require_extra("torch", "torchgfn", "redisbuf.torchgfn")
_require_extra("gfn.containers", "torchgfn", "redisbuf.torchgfn", package="torchgfn")
import torch  # noqa: E402
from gfn.containers import StatesContainer, Trajectories, Transitions  # noqa: E402

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

#: Buffer name of the manager's store (and of the Redis control plane) when none is given.
DEFAULT_MANAGER_NAME = "torchgfn-manager"

ContainerUnion = Trajectories | Transitions | StatesContainer

#: the torchgfn class of each stored kind (the dict kind holds StatesContainers)
_CLASS_OF_KIND = {"trajectories": Trajectories, "transitions": Transitions, "dict": StatesContainer,
                  "states": StatesContainer}


class ContainerTypeError(SchemaError, TypeError, AssertionError):
    """Not a torchgfn container, or a container of another class than the one the buffer
    holds. An AssertionError, as torchgfn's ``ReplayBuffer.add`` raises for both; a
    TypeError, as its diverse and terminating-state buffers raise for a non-container
    (and as redisbuf raised before); a :class:`~redisbuf.errors.SchemaError`."""


class BufferEmptyError(EmptyBufferError, ValueError, AssertionError):
    """Nothing to sample, or ``device`` asked of an empty buffer. A ValueError (what
    torchgfn's ``sample`` raises) and an AssertionError (what its ``device`` raises)."""


# -- conversions ----------------------------------------------------------------------


def _constant(tensor: torch.Tensor) -> float | None:
    """The one value every element of ``tensor`` holds, or None."""
    flat = tensor.reshape(-1)
    if flat.numel() == 0 or not bool((flat == flat[0]).all()):
        return None
    return float(flat[0])


def _kind_of(container: Any) -> str:
    if isinstance(container, Trajectories):
        return "trajectories"
    if isinstance(container, Transitions):
        return "transitions"
    if isinstance(container, StatesContainer):
        return "states"
    raise ContainerTypeError(
        f"Must be a container type (torchgfn Trajectories, Transitions or "
        f"StatesContainer), got {type(container).__name__}"
    )


def _same_conditions(a: torch.Tensor | None, b: torch.Tensor | None, what: str) -> None:
    if (a is None) != (b is None) or (a is not None and not torch.equal(a, b)):
        raise ValueError(f"{what}: conditions differ; redisbuf stores one condition per item")


def _terminating_rows(container: Any) -> rb.States:
    """A StatesContainer's terminating rows as redisbuf States."""
    mask = container.is_terminating
    conditions = container.states.conditions
    return rb.States(
        states=container.states.tensor[mask],
        log_rewards=container.log_rewards[mask],
        conditions=None if conditions is None else conditions[mask],
    )


def to_redisbuf(container: Any, env: Any, states_kind: str = "dict") -> Any:
    """A torchgfn container as the redisbuf batch the drop-in stores (see the module
    docstring). Raises TypeError for anything else, ValueError for backward trajectories.
    ``states_kind="states"``: a StatesContainer becomes redisbuf States of its
    terminating rows (what the diverse and terminating-state buffers store).

    Args:
        container: a torchgfn ``Trajectories``, ``Transitions`` or ``StatesContainer``.
        env: its environment.
        states_kind: ``"dict"`` or ``"states"``, for a ``StatesContainer``.

    Returns:
        A redisbuf batch.

    Raises:
        ContainerTypeError: not a torchgfn container.
        TypeError: states that are not one tensor.
        ValueError: backward trajectories.

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
        >>> from redisbuf.torchgfn import from_redisbuf, to_redisbuf
        >>> batch = to_redisbuf(trajectories, env)
        >>> type(batch).__module__, len(batch)
        ('redisbuf.store.containers', 4)
        >>> back = from_redisbuf(batch, env)
        >>> bool((back.terminating_idx == trajectories.terminating_idx).all())
        True
    """
    kind = _kind_of(container)
    if not isinstance(container.states.tensor, torch.Tensor):
        raise TypeError(
            f"{type(container.states).__name__} are not stored by redisbuf.torchgfn: it "
            "keeps states that are one tensor (graph states are not supported)"
        )
    if getattr(container, "is_backward", False):
        raise ValueError(
            "backward trajectories/transitions have no log-rewards in torchgfn; reverse them "
            "(Trajectories.reverse_backward_trajectories) before adding"
        )
    log_rewards = container.log_rewards
    if kind == "trajectories":
        states = container.states
        conditions = states.conditions
        if conditions is not None:
            first = conditions[0]
            if not bool((conditions == first.unsqueeze(0)).all()):
                raise ValueError(
                    "trajectory conditions vary along time; redisbuf stores one condition "
                    "vector per trajectory (as torchgfn's samplers produce)"
                )
            conditions = first
        sf = _constant(env.sf) if isinstance(env.sf, torch.Tensor) else None
        dummy = _constant(env.dummy_action) if isinstance(env.dummy_action, torch.Tensor) else None
        return rb.Trajectories(
            states=states.tensor,
            actions=container.actions.tensor,
            terminating_idx=container.terminating_idx,
            log_rewards=log_rewards,
            conditions=conditions,
            states_pad_value=0.0 if sf is None else sf,
            actions_pad_value=-1.0 if dummy is None else dummy,
        )
    if kind == "transitions":
        conditions = container.states.conditions
        _same_conditions(conditions, container.next_states.conditions, "states and next_states")
        return rb.Transitions(
            states=container.states.tensor,
            next_states=container.next_states.tensor,
            actions=container.actions.tensor,
            is_terminating=container.is_terminating,
            log_rewards=log_rewards,
            conditions=conditions,
        )
    if states_kind == "states":
        return _terminating_rows(container)
    batch = {
        "states": container.states.tensor,
        "is_terminating": container.is_terminating,
        "log_rewards": log_rewards,
    }
    if container.states.conditions is not None:
        batch["conditions"] = container.states.conditions
    return batch


def _pad_from_env(tensor: torch.Tensor, lengths: torch.Tensor, fill: torch.Tensor, first: int):
    """Overwrite time steps ``t >= lengths + first`` of a (T, B, ...) tensor with ``fill``."""
    steps = torch.arange(tensor.shape[0], device=tensor.device).unsqueeze(1)
    pad = steps >= (lengths.to(tensor.device).unsqueeze(0) + first)
    if bool(pad.any()):
        tensor = tensor.clone()
        tensor[pad] = fill.to(tensor.device, tensor.dtype)
    return tensor


def _states(env: Any, tensor: torch.Tensor, conditions: torch.Tensor | None) -> Any:
    if conditions is not None:
        conditions = conditions.to(tensor.device, torch.get_default_dtype())
    return env.states_from_tensor(tensor, conditions)


def from_redisbuf(batch: Any, env: Any, device: torch.device | str | None = None) -> Any:
    """The torchgfn container for a batch that :func:`to_redisbuf` produced (as stored
    and sampled), on ``device`` (default ``env.device``), padded with ``env``'s sink state
    and dummy action.

    Args:
        batch: a batch :func:`to_redisbuf` produced.
        env: the torchgfn environment.
        device: the tensors' device (``None``: ``env.device``).

    Returns:
        A torchgfn container.
    """
    device = torch.device(device if device is not None else env.device)

    def tensor(value: Any) -> torch.Tensor | None:
        if value is None:
            return None
        return torch.as_tensor(value).to(device)

    if isinstance(batch, rb.Trajectories):
        states, actions = tensor(batch.states), tensor(batch.actions)
        lengths = tensor(batch.terminating_idx).to(torch.long)
        # padding comes from env (the sink state may not be one number): step L of
        # trajectory b holds its stored sink state, later steps are padding
        states = _pad_from_env(states, lengths, env.sf, 1)
        actions = _pad_from_env(actions, lengths, env.dummy_action, 0)
        conditions = tensor(batch.conditions)
        if conditions is not None:
            conditions = conditions.unsqueeze(0).expand(states.shape[0], *conditions.shape)
        return Trajectories(
            env,
            states=_states(env, states, conditions),
            actions=env.actions_from_tensor(actions),
            terminating_idx=lengths,
            log_rewards=tensor(batch.log_rewards),
        )
    if isinstance(batch, rb.Transitions):
        conditions = tensor(batch.conditions)
        return Transitions(
            env,
            states=_states(env, tensor(batch.states), conditions),
            actions=env.actions_from_tensor(tensor(batch.actions)),
            is_terminating=tensor(batch.is_terminating).to(torch.bool),
            next_states=_states(env, tensor(batch.next_states), conditions),
            log_rewards=tensor(batch.log_rewards),
        )
    if isinstance(batch, dict):
        return StatesContainer(
            env,
            states=_states(env, tensor(batch["states"]), tensor(batch.get("conditions"))),
            is_terminating=tensor(batch["is_terminating"]).to(torch.bool),
            log_rewards=tensor(batch["log_rewards"]),
        )
    if isinstance(batch, rb.States):  # inline terminating states (scoring_only workers)
        states = tensor(batch.states)
        return StatesContainer(
            env,
            states=_states(env, states, tensor(batch.conditions)),
            is_terminating=torch.ones(states.shape[0], dtype=torch.bool, device=device),
            log_rewards=tensor(batch.log_rewards),
        )
    raise TypeError(f"not a batch of the torchgfn drop-in: {type(batch).__name__}")


# -- the control plane as torchgfn names it -------------------------------------------

# torchgfn's static helpers take a backend *name*: they use the worker transport that
# this process's drop-in buffers opened last for that backend (one per manager name for
# "redis"), or open one.
_WORKER_TRANSPORTS: dict[tuple[str, str], Any] = {}
_LAST_TRANSPORT: dict[str, Any] = {}


def _worker_transport(backend: Any, url: Any = None, name: str | None = None) -> Any:
    if not isinstance(backend, str):
        return backend
    if backend not in ("mpi", "redis"):
        raise ValueError(f"unknown communication_backend {backend!r}; use 'mpi' or 'redis'")
    if backend == "mpi":
        name = ""
    elif name is None:
        last = _LAST_TRANSPORT.get(backend)
        if last is not None:
            return last
        name = DEFAULT_MANAGER_NAME
    transport = _WORKER_TRANSPORTS.get((backend, name))
    if transport is None:
        if backend == "mpi":
            from .control.mpi import MPITransport

            transport = MPITransport()
        else:
            from .control.redis import RedisWorkerTransport
            from .store.connection import as_client

            transport = RedisWorkerTransport(as_client(url), name)
        _WORKER_TRANSPORTS[(backend, name)] = transport
    _LAST_TRANSPORT[backend] = transport
    return transport


def _forget_transport(transport: Any) -> None:
    for table in (_WORKER_TRANSPORTS, _LAST_TRANSPORT):
        for key, value in list(table.items()):
            if value is transport:
                del table[key]


def _drop_quietly(client: Any, name: str) -> None:
    try:
        _CoreBuffer(client, name, capacity=None).drop()
    except Exception:  # the server may already be gone at interpreter exit
        pass


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
        remote_manager_rank: as torchgfn 2.4.1.
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
        self.name = f"torchgfn-{uuid.uuid4().hex[:16]}" if private else name
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
        when ``n_samples <= len(self)``. An empty buffer raises :class:`BufferEmptyError`
        (a ValueError, as torchgfn).

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
        from .buffers.diverse import NormBasedDiversePrioritizedReplayBuffer as _CoreDiverse

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
        from .buffers.terminating import TerminatingStateBuffer as _CoreTerminating

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


# -- ReplayBufferManager --------------------------------------------------------------


def _scorer(function: Any, env: Any) -> Any:
    """Wrap a torchgfn scoring function: it receives torchgfn containers, and
    ``sender_rank=`` only if it accepts it (torchgfn 2.4.1 passes one argument)."""
    try:
        parameters = inspect.signature(function).parameters
        takes_rank = "sender_rank" in parameters or any(
            p.kind is p.VAR_KEYWORD for p in parameters.values()
        )
    except (TypeError, ValueError):
        takes_rank = False

    def score(batch: Any, sender_rank: int = -1) -> dict[str, float]:
        container = from_redisbuf(batch, env)
        if takes_rank:
            return function(container, sender_rank=sender_rank)
        return function(container)

    return score


class ReplayBufferManager(_CoreManager):
    """torchgfn's ``ReplayBufferManager`` with redisbuf's control plane.

    Takes torchgfn's arguments in its order (``env, rank, num_training_ranks,
    scoring_function, diverse_replay_buffer, capacity, remote_manager_rank,
    communication_backend, timing, store_locally, baseline_strategy,
    baseline_percentile, baseline_ema_alpha``) plus keyword-only ``url=`` and ``name=``
    (the manager's buffer, default :data:`DEFAULT_MANAGER_NAME`; a new manager empties
    it). Like torchgfn's, the manager's buffer (prioritized capacity) holds what workers
    sent to it and nothing else: each drop-in worker writes to its own buffer, and the
    manager copies the items named in a message into its own. The scoring function gets
    torchgfn containers built for ``env``. ``remote_manager_rank`` (forwarding to a
    higher manager) works over MPI: what this manager stores it sends on.
    ``diverse_replay_buffer=True`` makes the manager's buffer a
    :class:`redisbuf.buffers.diverse.NormBasedDiversePrioritizedReplayBuffer` (default cutoff
    0, p = 1, as torchgfn's), for Trajectories and terminating Transitions.

    Args:
        env: the torchgfn environment of the containers.
        rank: as :class:`redisbuf.ReplayBufferManager`.
        num_training_ranks: as :class:`redisbuf.ReplayBufferManager`.
        scoring_function: ``f(container)`` or ``f(container, sender_rank=r)`` returning
            a score dict; default :meth:`default_scoring_function`.
        diverse_replay_buffer: as above.
        capacity: the manager's buffer's capacity.
        remote_manager_rank: as above (MPI only).
        communication_backend: ``"mpi"`` or ``"redis"``.
        timing: as :class:`redisbuf.ReplayBufferManager`.
        store_locally: as :class:`redisbuf.ReplayBufferManager`.
        baseline_strategy: as :class:`redisbuf.ReplayBufferManager`.
        baseline_percentile: as :class:`redisbuf.ReplayBufferManager`.
        baseline_ema_alpha: as :class:`redisbuf.ReplayBufferManager`.
        url: a Redis URL or client (``None``: ``$REDISBUF_URL``).
        name: the manager's buffer name.
        **options: further :class:`redisbuf.ReplayBufferManager` keywords.

    Raises:
        ValueError: ``remote_manager_rank`` with the ``"redis"`` backend or with
            ``diverse_replay_buffer``.
    """

    def __init__(
        self,
        env: Any,
        rank: int,
        num_training_ranks: int,
        scoring_function: Any = None,
        diverse_replay_buffer: bool = False,
        capacity: int = 10000,
        remote_manager_rank: int | None = None,
        communication_backend: str = "mpi",
        timing: bool = False,
        store_locally: bool = True,
        baseline_strategy: str = "min",
        baseline_percentile: float = 0.1,
        baseline_ema_alpha: float = 0.1,
        *,
        url: Any = None,
        name: str = DEFAULT_MANAGER_NAME,
        **options: Any,
    ) -> None:
        if remote_manager_rank is not None and communication_backend != "mpi":
            raise ValueError(
                "remote_manager_rank on a manager forwards over MPI only; with the redis "
                "backend run the upper manager on its own buffer name"
            )
        self.env = env
        from .store.connection import as_client

        client = as_client(url)
        # a new manager starts empty, as torchgfn's: drop what an earlier run left
        # (items, and the schema its containers fixed)
        _CoreBuffer(client, name, capacity=capacity, prioritized_capacity=True).drop()
        if diverse_replay_buffer:
            if remote_manager_rank is not None:
                raise ValueError(
                    "remote_manager_rank with diverse_replay_buffer: the diverse buffer "
                    "never sends to a manager (torchgfn's manager ignores it there)"
                )
            from .buffers.diverse import NormBasedDiversePrioritizedReplayBuffer as _CoreDiverse

            buffer: _CoreBuffer = _CoreDiverse(client, name, capacity=capacity)
        else:
            buffer = _CoreBuffer(
                client,
                name,
                capacity=capacity,
                prioritized_capacity=True,
                manager=None if remote_manager_rank is None else ManagerLink(
                    remote_manager_rank, backend=communication_backend
                ),
            )
        self.remote_manager_rank = remote_manager_rank
        super().__init__(
            buffer,
            rank,
            num_training_ranks,
            scoring_function=_scorer(scoring_function or self.default_scoring_function, env),
            diverse_replay_buffer=False,  # the buffer above is the diverse one
            capacity=capacity,
            store_locally=store_locally,
            baseline_strategy=baseline_strategy,
            baseline_percentile=baseline_percentile,
            baseline_ema_alpha=baseline_ema_alpha,
            communication_backend=communication_backend,
            timing=timing,
            **options,
        )
        self.diverse_replay_buffer = diverse_replay_buffer

    @property
    def replay_buffer(self) -> _CoreBuffer:
        """The manager's buffer (torchgfn's attribute name)."""
        return self.buffer

    def default_scoring_function(self, obj: Any, sender_rank: int = -1) -> dict[str, float]:
        """Default score function if none provided, placeholder: ``{"score": inf}``.

        Args:
            obj: the container (unused).
            sender_rank: the worker's rank (unused).

        Returns:
            ``{"score": inf}``.
        """
        return {"score": float("inf")}

    def run(self, async_send: bool = True) -> None:  # type: ignore[override]
        """Serve until every training rank has sent EXIT. ``async_send`` is accepted for
        torchgfn compatibility: replies are small control messages, sent either way.

        Args:
            async_send: accepted, changes nothing.

        Raises:
            ControlTimeoutError: as :meth:`redisbuf.ReplayBufferManager.run`.
        """
        super().run()

    @staticmethod
    def get_metadata(manager_rank: int, backend: Any = "mpi", timeout: float | None = 30.0) -> dict:
        """Ask the manager for its metadata over ``backend`` (``"mpi"``, ``"redis"``,
        or a transport); ``"redis"`` uses the worker transport of this process's latest
        drop-in buffer with a remote manager, or opens one to
        :data:`DEFAULT_MANAGER_NAME` at ``$REDISBUF_URL``.

        Args:
            manager_rank: the manager's rank.
            backend: as above.
            timeout: seconds to wait for the reply (``None``: no limit).

        Returns:
            The manager's metadata.
        """
        return _CoreManager.get_metadata(manager_rank, _worker_transport(backend), timeout)

    @staticmethod
    def send_termination_signal(manager_rank: int, backend: Any = "mpi") -> None:
        """Send EXIT to the manager over ``backend`` and release this process's
        transport for it.

        Args:
            manager_rank: the manager's rank.
            backend: as :meth:`get_metadata`.
        """
        transport = _worker_transport(backend)
        _CoreManager.send_termination_signal(manager_rank, transport)
        _forget_transport(transport)
