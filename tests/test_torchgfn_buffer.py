"""The drop-in ``redisbuf.torchgfn.ReplayBuffer`` against the real torchgfn 2.4.1:
round trips of every container class on three environments, and the equivalent of each
case of torchgfn's own replay-buffer tests."""

from __future__ import annotations

import collections
import math

import pytest

pytest.importorskip("gfn")

import torch  # noqa: E402
from gfn.containers import ReplayBuffer as TorchgfnBuffer  # noqa: E402
from gfn.containers import StatesContainer, Trajectories, Transitions  # noqa: E402
from torchgfn_helpers import ENVS, make, make_env, trajectories  # noqa: E402

from redisbuf.errors import EmptyBufferError  # noqa: E402
from redisbuf.torchgfn import (  # noqa: E402
    BufferEmptyError,
    ContainerTypeError,
    ReplayBuffer,
    from_redisbuf,
    to_redisbuf,
)

KINDS = {"trajectories": Trajectories, "transitions": Transitions, "states": StatesContainer}


@pytest.fixture(scope="module")
def envs():
    return {name: make_env(name) for name in ENVS}


def _equal_states(a, b) -> None:
    assert type(a) is type(b)
    assert torch.equal(a.tensor, b.tensor)
    assert (a.conditions is None) == (b.conditions is None)
    if a.conditions is not None:
        assert torch.equal(a.conditions, b.conditions)
    assert torch.equal(a.forward_masks, b.forward_masks)
    assert torch.equal(a.backward_masks, b.backward_masks)


def assert_same(a, b) -> None:
    """Two torchgfn containers hold the same items in the same order."""
    assert type(a) is type(b)
    assert len(a) == len(b)
    _equal_states(a.states, b.states)
    assert torch.equal(a.log_rewards, b.log_rewards)
    if isinstance(a, Trajectories):
        assert torch.equal(a.actions.tensor, b.actions.tensor)
        assert torch.equal(a.terminating_idx, b.terminating_idx)
    elif isinstance(a, Transitions):
        assert torch.equal(a.actions.tensor, b.actions.tensor)
        assert torch.equal(a.is_terminating, b.is_terminating)
        _equal_states(a.next_states, b.next_states)
    else:
        assert torch.equal(a.is_terminating, b.is_terminating)


# -- round trips ----------------------------------------------------------------------


@pytest.mark.parametrize("env_name", ENVS)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_round_trip(client, buffer_name, envs, env_name, kind):
    env = envs[env_name]
    original = make(kind, env, 24, seed=3)
    buffer = ReplayBuffer(env, capacity=10_000, url=client, name=buffer_name)
    buffer.add(original)
    back = buffer.training_container
    expected = original[torch.arange(len(original))]  # drops log_probs, re-pads
    expected.log_probs = None
    assert_same(back, expected)
    assert back.env is env
    sampled = buffer.sample(len(original))
    assert type(sampled) is KINDS[kind] and len(sampled) == len(original)
    if kind == "trajectories":
        # padding comes from env: the sink state and the dummy action
        steps = torch.arange(back.states.tensor.shape[0]).unsqueeze(1)
        pad = steps > back.terminating_idx.unsqueeze(0)
        assert bool((back.states.tensor[pad] == env.sf).all())
        assert bool(back.states[pad].is_sink_state.all())
        dummy = steps[:-1] >= back.terminating_idx.unsqueeze(0)
        assert bool(back.actions[dummy].is_dummy.all())


def test_conditions_survive_and_feed_log_rewards(fake_client, buffer_name, envs):
    env = envs["conditional_hypergrid"]
    original = trajectories(env, 16, seed=5)
    buffer = ReplayBuffer(env, url=fake_client, name=buffer_name)
    buffer.add(original)
    back = buffer.training_container
    assert back.states.conditions.shape == (*back.states.batch_shape, 1)
    # the env computes the same log-rewards from the rebuilt states and conditions
    assert torch.allclose(env.log_reward(back.terminating_states), original.log_rewards)


def test_trained_loss_is_the_same_on_the_rebuilt_trajectories(fake_client, buffer_name, envs):
    from gfn.estimators import DiscretePolicyEstimator
    from gfn.gflownet import TBGFlowNet
    from gfn.preprocessors import KHotPreprocessor
    from gfn.utils.modules import MLP

    env = envs["hypergrid"]
    torch.manual_seed(0)
    pre = KHotPreprocessor(env.height, env.ndim)
    pf = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions), env.n_actions,
                                 preprocessor=pre)
    pb = DiscretePolicyEstimator(MLP(pre.output_dim, env.n_actions - 1), env.n_actions,
                                 preprocessor=pre, is_backward=True)
    gflownet = TBGFlowNet(pf=pf, pb=pb)
    original = gflownet.sample_trajectories(env, n=32)
    buffer = ReplayBuffer(env, url=fake_client, name=buffer_name)
    buffer.add(original)
    back = buffer.training_container
    a = gflownet.loss(env, original, recalculate_all_logprobs=True)
    b = gflownet.loss(env, back, recalculate_all_logprobs=True)
    assert torch.allclose(a, b)


def test_conversion_refuses_what_it_cannot_store(envs):
    env = envs["conditional_hypergrid"]
    batch = trajectories(env, 4)
    conditions = batch.states.conditions.clone()
    conditions[1:, 0] += 0.5  # conditions that change along trajectory 0
    batch.states.conditions = conditions
    with pytest.raises(ValueError, match="vary along time"):
        to_redisbuf(batch, env)
    with pytest.raises(TypeError, match="Must be a container"):
        to_redisbuf({"states": torch.zeros(3)}, env)
    with pytest.raises(TypeError):
        from_redisbuf(object(), env)


# -- torchgfn 2.4.1's replay-buffer test cases ------------------------------------------


def test_init(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, capacity=10, prioritized_capacity=True,
                          prioritized_sampling=True, url=fake_client, name=buffer_name)
    assert (buffer.env, buffer.capacity) == (env, 10)
    assert buffer.prioritized_capacity and buffer.prioritized_sampling
    assert len(buffer) == 0 and buffer.training_container is None
    assert buffer.remote_manager_rank is None


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_add(fake_client, buffer_name, envs, kind):
    env = envs["hypergrid"]
    batch = make(kind, env, 10)
    buffer = ReplayBuffer(env, capacity=1000, url=fake_client, name=buffer_name)
    assert buffer.add(batch) is None
    assert len(buffer) == len(batch)
    assert isinstance(buffer.training_container, KINDS[kind])
    buffer.add(batch)
    assert len(buffer) == 2 * len(batch)


def test_capacity_limit(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, capacity=15, url=fake_client, name=buffer_name)
    buffer.add(trajectories(env, 10, seed=1))
    buffer.add(trajectories(env, 10, seed=2))
    assert len(buffer) == 15


def test_fifo_keeps_newest(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    first, second = trajectories(env, 10, seed=1), trajectories(env, 10, seed=2)
    buffer = ReplayBuffer(env, capacity=15, url=fake_client, name=buffer_name)
    buffer.add(first)
    buffer.add(second)
    kept = buffer.training_container
    expected = torch.cat([first.log_rewards[5:], second.log_rewards])
    assert torch.equal(kept.log_rewards, expected)
    assert torch.equal(kept.terminating_idx, torch.cat([first.terminating_idx[5:],
                                                        second.terminating_idx]))


def test_prioritized_capacity_evicts_lowest_rewards(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    batches = [trajectories(env, 12, seed=s) for s in range(4)]
    ours = ReplayBuffer(env, capacity=10, prioritized_capacity=True, url=fake_client,
                        name=buffer_name)
    theirs = TorchgfnBuffer(env, capacity=10, prioritized_capacity=True)
    for batch in batches:
        ours.add(batch)
        theirs.add(batch)
    everything = torch.cat([b.log_rewards for b in batches])
    kept = ours.training_container.log_rewards
    assert len(kept) == 10
    assert torch.equal(kept.sort().values, everything.sort().values[-10:])
    assert torch.equal(kept.sort().values, theirs.training_container.log_rewards.sort().values)


def test_sample(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, capacity=100, url=fake_client, name=buffer_name, seed=1)
    buffer.add(trajectories(env, 20))
    drawn = buffer.sample(10)
    assert isinstance(drawn, Trajectories) and len(drawn) == 10
    assert drawn.log_probs is None and drawn.estimator_outputs is None
    assert drawn.device == buffer.device == torch.device("cpu")
    # more than held: with replacement (torchgfn 2.4.1's uniform sample returns the 20
    # held; docs/coming-from/torchgfn.md lists the difference)
    assert len(buffer.sample(30)) == 30


def test_save_load(fake_client, buffer_name, envs, tmp_path):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, capacity=100, url=fake_client, name=buffer_name)
    buffer.add(trajectories(env, 20))
    path = str(tmp_path / "buffer.rbuf")
    buffer.save(path)
    other = ReplayBuffer(env, capacity=100, url=fake_client, name=buffer_name + "-copy")
    other.load(path)
    assert len(other) == 20
    assert_same(other.training_container, buffer.training_container)


def test_type_error_and_mismatched_containers(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, url=fake_client, name=buffer_name)
    with pytest.raises(TypeError, match="Must be a container"):
        buffer.add("not a container")
    buffer.add(trajectories(env, 5))
    with pytest.raises(TypeError, match="holds Trajectories"):
        buffer.add(make("transitions", env, 5))
    # a second process's view of the same buffer: the stored kind is checked too
    other = ReplayBuffer(env, url=fake_client, name=buffer_name)
    with pytest.raises(ContainerTypeError):
        other.add(make("states", env, 5))
    assert len(buffer) == 5


def _prioritized(client, name, env):
    batch = trajectories(env, 6, seed=4)
    # distinct log-rewards make every item recognisable by its log-reward
    batch._log_rewards = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 2.5])
    buffer = ReplayBuffer(env, capacity=10, prioritized_sampling=True, url=client,
                          name=name, seed=7)
    buffer.add(batch)
    return buffer, batch


def _without_replacement_in_core() -> bool:
    import inspect

    from redisbuf.sampling.samplers import PrioritizedSampler

    return "replacement" in inspect.signature(PrioritizedSampler).parameters


@pytest.mark.skipif(not _without_replacement_in_core(),
                    reason="prioritized sampling without replacement is not in the core yet")
def test_prioritized_sampling_without_replacement(fake_client, buffer_name, envs):
    buffer, batch = _prioritized(fake_client, buffer_name, envs["hypergrid"])
    for _ in range(20):
        values = buffer.sample(4).log_rewards.tolist()
        assert len(set(values)) == 4  # n <= len: without replacement, as torchgfn
    assert len(set(buffer.sample(6).log_rewards.tolist())) == 6


def test_prioritized_sampling_with_replacement(fake_client, buffer_name, envs):
    buffer, batch = _prioritized(fake_client, buffer_name, envs["hypergrid"])
    big = buffer.sample(12)  # n > len: with replacement
    assert len(big) == 12 and set(big.log_rewards.tolist()) <= set(batch.log_rewards.tolist())
    # the first draw follows the softmax of the log-rewards
    probs = torch.softmax(batch.log_rewards, 0)
    counts = collections.Counter(buffer.sample(1).log_rewards.item() for _ in range(1500))
    for value, p in zip(batch.log_rewards.tolist(), probs.tolist(), strict=True):
        assert abs(counts[value] / 1500 - p) < 4 * math.sqrt(p * (1 - p) / 1500) + 0.01


def test_stale_fields_cleared_on_add(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    batch = trajectories(env, 8, log_probs=True)
    batch.estimator_outputs = torch.zeros(*batch.actions.batch_shape, env.n_actions)
    assert batch.log_probs is not None
    buffer = ReplayBuffer(env, url=fake_client, name=buffer_name)
    buffer.add(batch)
    back = buffer.training_container
    assert back.log_probs is None and back.estimator_outputs is None
    transitions = make("transitions", env, 8)
    assert transitions.log_probs is not None
    other = ReplayBuffer(env, url=fake_client, name=buffer_name + "-t")
    other.add(transitions)
    assert other.sample(4).log_probs is None


def test_repeated_add_cycles_keep_capacity(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    for prioritized in (False, True):
        buffer = ReplayBuffer(env, capacity=20, prioritized_capacity=prioritized,
                              url=fake_client, name=f"{buffer_name}-{prioritized}")
        for cycle in range(6):
            buffer.add(trajectories(env, 8, seed=cycle))
            assert len(buffer) == min(20, 8 * (cycle + 1))
            assert len(buffer.sample(5)) == 5


def test_device_and_sample_on_an_empty_buffer_raise(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, url=fake_client, name=buffer_name)
    with pytest.raises(AssertionError, match="no device"):
        _ = buffer.device
    with pytest.raises(ValueError, match="empty"):  # torchgfn raises ValueError
        buffer.sample(3)
    with pytest.raises(EmptyBufferError):
        buffer.sample(3)
    assert issubclass(BufferEmptyError, ValueError)


# -- what torchgfn's buffer does not do --------------------------------------------------


def test_seeded_runs_reproduce_through_torch_generator(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, capacity=100, prioritized_sampling=True, url=fake_client,
                          name=buffer_name)
    buffer.add(trajectories(env, 50))

    def draws():
        torch.manual_seed(123)
        return [buffer.sample(8).log_rewards for _ in range(3)]

    first, second = draws(), draws()
    assert all(torch.equal(a, b) for a, b in zip(first, second, strict=True))
    torch.manual_seed(124)
    assert not torch.equal(buffer.sample(8).log_rewards, first[0]) or not torch.equal(
        buffer.sample(8).log_rewards, first[1]
    )


def test_two_processes_share_a_named_buffer(client, buffer_name, envs):
    env = envs["hypergrid"]
    a = ReplayBuffer(env, capacity=50, url=client, name=buffer_name)
    b = ReplayBuffer(env, capacity=50, url=client, name=buffer_name)
    a.add(trajectories(env, 10, seed=1))
    b.add(trajectories(env, 10, seed=2))
    assert len(a) == len(b) == 20
    assert isinstance(b.sample(5), Trajectories)


def test_private_buffer_is_dropped_on_close(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    buffer = ReplayBuffer(env, url=fake_client)
    named = ReplayBuffer(env, url=fake_client, name=buffer_name)
    for each in (buffer, named):
        each.add(trajectories(env, 4))
    assert fake_client.exists(f"rb:{{{buffer.name}}}:meta")
    buffer.close()
    named.close()
    assert not fake_client.exists(f"rb:{{{buffer.name}}}:meta")
    assert len(named) == 4


# -- the diverse and terminating-state buffers, against torchgfn's own -------------------


def _rows(container) -> list[tuple]:
    """(terminating state, conditions, log-reward) of every item, sorted."""
    states = container.terminating_states
    conditions = states.conditions
    rows = []
    for i in range(len(states)):
        cond = () if conditions is None else tuple(conditions[i].tolist())
        rows.append((tuple(states.tensor[i].tolist()), cond,
                     round(float(container.log_rewards[i]), 5)))
    return sorted(rows)


def _distinct_rewards(batch, seed):
    generator = torch.Generator().manual_seed(seed)
    batch._log_rewards = torch.randn(len(batch), generator=generator)
    return batch


@pytest.mark.parametrize("cutoff, p", [(0.0, 1.0), (1.5, 1.0), (2.0, 2.0), (-1.0, 1.0)])
def test_diverse_buffer_matches_torchgfn(fake_client, buffer_name, envs, cutoff, p):
    from gfn.containers import NormBasedDiversePrioritizedReplayBuffer as Theirs

    from redisbuf.torchgfn import NormBasedDiversePrioritizedReplayBuffer

    env = envs["hypergrid"]
    ours = NormBasedDiversePrioritizedReplayBuffer(env, 12, cutoff, p, url=fake_client,
                                                   name=buffer_name)
    theirs = Theirs(env, 12, cutoff, p)
    for seed in range(6):
        batch = _distinct_rewards(trajectories(env, 10, seed=seed), seed)
        ours.add(batch)
        theirs.add(batch)
        assert _rows(ours.training_container) == _rows(theirs.training_container), seed
    # copies of stored items with higher log-rewards: rejected as duplicates of stored
    # states, unless the check is skipped (cutoff < 0)
    before = _rows(ours.training_container)
    copies = ours.training_container
    copies._log_rewards = copies.log_rewards + 100.0
    ours.add(copies)
    theirs.add(copies)
    after = _rows(ours.training_container)
    assert after == _rows(theirs.training_container)
    assert (after == before) == (cutoff >= 0)


def test_diverse_buffer_same_state_under_two_conditions(fake_client, buffer_name, envs):
    from gfn.containers import NormBasedDiversePrioritizedReplayBuffer as Theirs

    from redisbuf.torchgfn import NormBasedDiversePrioritizedReplayBuffer

    env = envs["conditional_hypergrid"]
    ours = NormBasedDiversePrioritizedReplayBuffer(env, 6, 0.0, url=fake_client,
                                                   name=buffer_name)
    theirs = Theirs(env, 6, 0.0)
    first = _distinct_rewards(trajectories(env, 6, seed=1), 1)
    for buffer in (ours, theirs):
        buffer.add(first)  # fills the buffer
    # the same states under other conditions, with higher log-rewards
    again = Trajectories(
        env,
        states=env.states_from_tensor(first.states.tensor, 1.0 - first.states.conditions),
        actions=first.actions,
        terminating_idx=first.terminating_idx,
        log_rewards=first.log_rewards + 10.0,
    )
    assert not torch.equal(again.states.conditions, first.states.conditions)
    for buffer in (ours, theirs):
        buffer.add(again)
    assert _rows(ours.training_container) == _rows(theirs.training_container)
    kept = _rows(ours.training_container)
    assert {row[1] for row in kept} == {row[1] for row in _rows(again)}  # all new ones


def test_diverse_buffer_refuses_a_manager_and_non_terminating_states(fake_client, buffer_name,
                                                                     envs):
    from redisbuf.torchgfn import NormBasedDiversePrioritizedReplayBuffer

    env = envs["hypergrid"]
    with pytest.raises(ValueError, match="never sends"):
        NormBasedDiversePrioritizedReplayBuffer(env, 10, remote_manager_rank=0,
                                                url=fake_client, name=buffer_name)
    buffer = NormBasedDiversePrioritizedReplayBuffer(env, 10, url=fake_client, name=buffer_name)
    with pytest.raises(ValueError, match="non-terminating"):
        buffer.add(make("states", env, 6))
    assert len(buffer) == 0


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_terminating_state_buffer_matches_torchgfn(fake_client, buffer_name, envs, kind):
    from gfn.containers import TerminatingStateBuffer as Theirs

    from redisbuf.torchgfn import TerminatingStateBuffer

    env = envs["hypergrid"]
    ours = TerminatingStateBuffer(env, 30, url=fake_client, name=buffer_name)
    theirs = Theirs(env, 30)
    for seed in range(3):
        batch = make(kind, env, 16, seed=seed)
        ours.add(batch)
        if kind == "trajectories":  # torchgfn 2.4.1 pairs all log-rewards with the
            theirs.add(batch)       # terminating states: only trajectories line up
    if kind == "trajectories":
        assert torch.equal(ours.training_container.states.tensor,
                           theirs.training_container.states.tensor)
        assert torch.equal(ours.training_container.log_rewards,
                           theirs.training_container.log_rewards)
    drawn = ours.sample(5)
    assert isinstance(drawn, StatesContainer) and bool(drawn.is_terminating.all())
    assert len(ours) == 30


# -- the same text, order and exception types as torchgfn 2.4.1's ReplayBuffer ----------


def _both(client, name, env, cls_name="ReplayBuffer", **kwargs):
    import gfn.containers

    import redisbuf.torchgfn as ours

    theirs = getattr(gfn.containers, cls_name)(env, **kwargs)
    return getattr(ours, cls_name)(env, url=client, name=name, **kwargs), theirs


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_repr_is_torchgfns(fake_client, buffer_name, envs, kind):
    env = envs["hypergrid"]
    ours, theirs = _both(fake_client, buffer_name, env, capacity=7)
    assert repr(ours) == repr(theirs) == "ReplayBuffer(capacity=7, containing 0 empty)"
    batch = make(kind, env, 3)
    ours.add(batch)
    theirs.add(batch)
    assert repr(ours) == repr(theirs)
    held = min(7, len(batch))
    assert repr(ours) == f"ReplayBuffer(capacity=7, containing {held} {KINDS[kind].__name__})"
    # another process's view of the same buffer names the stored class too
    other = ReplayBuffer(env, capacity=7, url=fake_client, name=buffer_name)
    assert repr(other) == repr(theirs)


@pytest.mark.parametrize("cls_name", ["NormBasedDiversePrioritizedReplayBuffer",
                                      "TerminatingStateBuffer"])
def test_repr_of_the_other_buffers_is_torchgfns(fake_client, buffer_name, envs, cls_name):
    env = envs["hypergrid"]
    ours, theirs = _both(fake_client, buffer_name, env, cls_name, capacity=9)
    assert repr(ours) == repr(theirs)  # torchgfn prints "ReplayBuffer(" for every class
    batch = trajectories(env, 4)
    ours.add(batch)
    theirs.add(batch)
    assert repr(ours) == repr(theirs)


@pytest.mark.parametrize("prioritized", [False, True])
def test_training_container_order_is_torchgfns(fake_client, buffer_name, envs, prioritized):
    env = envs["hypergrid"]
    ours, theirs = _both(fake_client, buffer_name, env, capacity=10,
                         prioritized_capacity=prioritized)
    for seed in range(4):
        batch = trajectories(env, 6, seed=seed)
        ours.add(batch)
        theirs.add(batch)
        assert torch.equal(ours.training_container.log_rewards,
                           theirs.training_container.log_rewards)
    if prioritized:  # ascending: the top k are training_container[-k:]
        top = ours.training_container[-3:]
        assert torch.equal(top.log_rewards, theirs.training_container[-3:].log_rewards)
        assert torch.equal(top.terminating_idx,
                           theirs.training_container[-3:].terminating_idx)


def test_empty_buffer_message_is_torchgfns(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    ours, theirs = _both(fake_client, buffer_name, env)
    with pytest.raises(ValueError, match="Buffer is empty") as mine:
        ours.sample(1)
    with pytest.raises(ValueError, match="Buffer is empty") as reference:
        theirs.sample(1)
    assert str(mine.value) == str(reference.value)
    assert isinstance(mine.value, EmptyBufferError)  # still catchable as redisbuf's


def test_wrong_type_and_second_kind_raise_what_torchgfn_raises(fake_client, buffer_name, envs):
    env = envs["hypergrid"]
    ours, theirs = _both(fake_client, buffer_name, env)
    for buffer in (ours, theirs):
        with pytest.raises(AssertionError, match="Must be a container type"):
            buffer.add("not a container")
        buffer.add(trajectories(env, 3))
        with pytest.raises(AssertionError):
            buffer.add(make("transitions", env, 3))
        assert len(buffer) == 3
    # still what redisbuf raised before: a TypeError and a redisbuf SchemaError
    from redisbuf.errors import SchemaError

    with pytest.raises(ContainerTypeError) as info:
        ours.add(make("states", env, 3))
    assert isinstance(info.value, TypeError) and isinstance(info.value, SchemaError)
    with pytest.raises(TypeError, match="Must be a container type"):
        ours.add(42)


@pytest.mark.parametrize(("cls_name", "message"), [
    ("NormBasedDiversePrioritizedReplayBuffer", "Must be a container type"),
    ("TerminatingStateBuffer", "Must be a StatesContainer"),
])
def test_the_other_buffers_refuse_a_non_container_as_torchgfn(fake_client, buffer_name, envs,
                                                              cls_name, message):
    ours, theirs = _both(fake_client, buffer_name, envs["hypergrid"], cls_name)
    for buffer in (ours, theirs):
        with pytest.raises(TypeError, match=message):
            buffer.add("not a container")


def test_torchgfns_containers_are_re_exported():
    import gfn.containers

    import redisbuf.torchgfn as ours

    for name in ("Trajectories", "Transitions", "StatesContainer"):
        assert name in ours.__all__
        assert getattr(ours, name) is getattr(gfn.containers, name)
