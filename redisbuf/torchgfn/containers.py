"""The torchgfn drop-in's conversions: torchgfn containers to the redisbuf batches it
stores and back (see :mod:`redisbuf.torchgfn`), and its two exception classes."""

from __future__ import annotations

from typing import Any

import torch
from gfn.containers import StatesContainer, Trajectories, Transitions

from ..errors import EmptyBufferError, SchemaError
from ..store import containers as rb

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
    if (a is None) != (b is None) or (a is not None and b is not None and not torch.equal(a, b)):
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


def _pad_from_env(
    tensor: torch.Tensor, lengths: torch.Tensor, fill: torch.Tensor, first: int
) -> torch.Tensor:
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

    def tensor(value: Any) -> torch.Tensor:
        return torch.as_tensor(value).to(device)

    def maybe(value: Any) -> torch.Tensor | None:  # conditions and log-rewards may be absent
        return None if value is None else tensor(value)

    if isinstance(batch, rb.Trajectories):
        states, actions = tensor(batch.states), tensor(batch.actions)
        lengths = tensor(batch.terminating_idx).to(torch.long)
        # padding comes from env (the sink state may not be one number): step L of
        # trajectory b holds its stored sink state, later steps are padding
        states = _pad_from_env(states, lengths, env.sf, 1)
        actions = _pad_from_env(actions, lengths, env.dummy_action, 0)
        conditions = maybe(batch.conditions)
        if conditions is not None:
            conditions = conditions.unsqueeze(0).expand(states.shape[0], *conditions.shape)
        return Trajectories(
            env,
            states=_states(env, states, conditions),
            actions=env.actions_from_tensor(actions),
            terminating_idx=lengths,
            log_rewards=maybe(batch.log_rewards),
        )
    if isinstance(batch, rb.Transitions):
        conditions = maybe(batch.conditions)
        return Transitions(
            env,
            states=_states(env, tensor(batch.states), conditions),
            actions=env.actions_from_tensor(tensor(batch.actions)),
            is_terminating=tensor(batch.is_terminating).to(torch.bool),
            next_states=_states(env, tensor(batch.next_states), conditions),
            log_rewards=maybe(batch.log_rewards),
        )
    if isinstance(batch, dict):
        return StatesContainer(
            env,
            states=_states(env, tensor(batch["states"]), maybe(batch.get("conditions"))),
            is_terminating=tensor(batch["is_terminating"]).to(torch.bool),
            log_rewards=maybe(batch["log_rewards"]),
        )
    if isinstance(batch, rb.States):  # inline terminating states (scoring_only workers)
        states = tensor(batch.states)
        return StatesContainer(
            env,
            states=_states(env, states, maybe(batch.conditions)),
            is_terminating=torch.ones(states.shape[0], dtype=torch.bool, device=device),
            log_rewards=maybe(batch.log_rewards),
        )
    raise TypeError(f"not a batch of the torchgfn drop-in: {type(batch).__name__}")

