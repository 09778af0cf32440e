"""Shared torchgfn fixtures-in-code for the tests/test_torchgfn_* files: environments and
containers sampled with torchgfn's own samplers (a random-initialised policy)."""

from __future__ import annotations

import torch
from gfn.containers import StatesContainer, Trajectories, Transitions
from gfn.estimators import DiscretePolicyEstimator
from gfn.gym import DiscreteEBM, HyperGrid
from gfn.gym.hypergrid import ConditionalHyperGrid
from gfn.preprocessors import IdentityPreprocessor, KHotPreprocessor
from gfn.samplers import Sampler
from gfn.utils.modules import MLP

ENVS = ("hypergrid", "conditional_hypergrid", "discrete_ebm")


def make_env(name: str):
    if name == "hypergrid":
        return HyperGrid(ndim=2, height=8)
    if name == "conditional_hypergrid":
        return ConditionalHyperGrid(ndim=2, height=8)
    if name == "discrete_ebm":
        return DiscreteEBM(ndim=4)
    raise ValueError(name)


def _sampler(env) -> Sampler:
    if isinstance(env, DiscreteEBM):
        pre = IdentityPreprocessor(output_dim=env.state_shape[-1])
    else:
        pre = KHotPreprocessor(env.height, env.ndim)
    module = MLP(pre.output_dim, env.n_actions)
    return Sampler(DiscretePolicyEstimator(module, env.n_actions, preprocessor=pre))


def trajectories(env, n: int, seed: int = 0, log_probs: bool = True) -> Trajectories:
    """``n`` forward trajectories of ``env`` (with log-probs and log-rewards set); for a
    conditional env, one random condition per trajectory, constant along it."""
    torch.manual_seed(seed)
    if isinstance(env, ConditionalHyperGrid):
        plain = HyperGrid(ndim=env.ndim, height=env.height)
        base = _sampler(plain).sample_trajectories(plain, n=n, save_logprobs=log_probs)
        conditions = env.sample_conditions(n)
        steps = base.states.tensor.shape[0]
        states = env.states_from_tensor(
            base.states.tensor, conditions.unsqueeze(0).expand(steps, n, 1).clone()
        )
        out = Trajectories(
            env,
            states=states,
            actions=env.actions_from_tensor(base.actions.tensor),
            terminating_idx=base.terminating_idx,
            log_probs=base.log_probs,
        )
    else:
        out = _sampler(env).sample_trajectories(env, n=n, save_logprobs=log_probs)
    out._log_rewards = out.log_rewards.detach()  # computed by torchgfn from env
    return out


def transitions(env, n: int, seed: int = 0) -> Transitions:
    return trajectories(env, n, seed).to_transitions()


def states_container(env, n: int, seed: int = 0) -> StatesContainer:
    return trajectories(env, n, seed).to_states_container()


def make(kind: str, env, n: int, seed: int = 0):
    return {"trajectories": trajectories, "transitions": transitions,
            "states": states_container}[kind](env, n, seed)
