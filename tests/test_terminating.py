"""TerminatingStateBuffer: terminating states of trajectories and transitions, with their
log-rewards and conditions, under the usual capacity and sampling rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_bad_input import snapshot

from redisbuf import ReplayBuffer, States, TerminatingStateBuffer, Trajectories, Transitions
from redisbuf.errors import InvalidBatchError, SchemaError


def _trajectories(lengths, log_rewards, conditions=True) -> Trajectories:
    """Trajectories whose states are (step, trajectory) pairs, so each state says where
    it came from; the state after the last action is the sink (-1, -1)."""
    horizon = max(lengths)
    n = len(lengths)
    states = torch.full((horizon + 1, n, 2), -1.0)
    for b, length in enumerate(lengths):
        for t in range(length):
            states[t, b] = torch.tensor([t, b], dtype=torch.float32)
    return Trajectories(
        states=states,
        actions=torch.zeros((horizon, n, 1), dtype=torch.int64),
        terminating_idx=torch.tensor(lengths),
        log_rewards=torch.tensor(log_rewards, dtype=torch.float32),
        conditions=torch.arange(n, dtype=torch.float32)[:, None] * 10 if conditions else None,
    )


def test_trajectories_keep_their_last_state_before_the_sink(client, buffer_name):
    buffer = TerminatingStateBuffer(client, buffer_name, capacity=10)
    batch = _trajectories([3, 1, 2], [0.5, -1.0, 2.0])
    ids = buffer.add(batch).ids
    out = buffer.get(ids)
    assert isinstance(out, States)
    assert out.states.tolist() == [[2.0, 0.0], [0.0, 1.0], [1.0, 2.0]]
    assert out.states.tolist() == batch.terminating_states.tolist()
    assert out.log_rewards.tolist() == [0.5, -1.0, 2.0]
    assert out.conditions.tolist() == [[0.0], [10.0], [20.0]]
    assert buffer.kind == "states"


def test_transitions_keep_the_states_of_terminating_rows(client, buffer_name):
    buffer = TerminatingStateBuffer(client, buffer_name, capacity=10)
    batch = Transitions(
        states=torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 1.0], [2.0, 2.0]]),
        next_states=torch.tensor([[1.0, 0.0], [-1.0, -1.0], [2.0, 2.0], [-1.0, -1.0]]),
        actions=torch.zeros((4, 1), dtype=torch.int64),
        is_terminating=torch.tensor([False, True, False, True]),
        log_rewards=torch.tensor([-float("inf"), 1.5, -float("inf"), 0.25]),
        conditions=torch.tensor([[7.0], [8.0], [9.0], [6.0]]),
    )
    out = buffer.get(buffer.add(batch).ids)
    assert out.states.tolist() == [[1.0, 0.0], [2.0, 2.0]]
    assert out.log_rewards.tolist() == [1.5, 0.25]
    assert out.conditions.tolist() == [[8.0], [6.0]]
    # trajectories and transitions of the same environment share the buffer
    traj = _trajectories([1], [3.0])
    traj.conditions = torch.tensor([[5.0]])
    buffer.add(traj)
    assert len(buffer) == 3
    # a batch without a terminating transition adds nothing
    before = snapshot(client, buffer_name)
    none = Transitions(
        batch.states[:1], batch.next_states[:1], batch.actions[:1], batch.is_terminating[:1],
        batch.log_rewards[:1], conditions=batch.conditions[:1],
    )
    result = buffer.add(none)
    assert result.ids.tolist() == [] and result.evicted == 0
    assert snapshot(client, buffer_name) == before


def test_numpy_states_pass_through(client, buffer_name):
    buffer = TerminatingStateBuffer(client, buffer_name, capacity=4)
    states = States(np.arange(6.0).reshape(3, 2), log_rewards=np.array([1.0, 2.0, 3.0]))
    out = buffer.get(buffer.add(states).ids)
    np.testing.assert_array_equal(out.states, states.states)


def test_prioritized_capacity_and_sampling(client, buffer_name):
    buffer = TerminatingStateBuffer(
        client, buffer_name, capacity=3, prioritized_capacity=True, prioritized_sampling=True,
        seed=0,
    )
    buffer.add(_trajectories([1, 1, 1], [0.0, 5.0, 1.0], conditions=False))
    buffer.add(_trajectories([2, 2], [3.0, -2.0], conditions=False))
    # the lowest log-rewards went: 0.0 and -2.0
    assert sorted(r for _, r in buffer.top(5)) == [1.0, 3.0, 5.0]
    drawn = buffer.sample(3)  # without replacement: every stored state once
    assert sorted(drawn.log_rewards.tolist()) == [1.0, 3.0, 5.0]
    reopened = TerminatingStateBuffer.open(client, buffer_name, prioritized_sampling=True)
    assert len(reopened) == 3 and isinstance(reopened.sample(5), States)


def test_what_it_refuses(client, buffer_name):
    buffer = TerminatingStateBuffer(client, buffer_name, capacity=4)
    buffer.add(_trajectories([1], [0.0]))
    before = snapshot(client, buffer_name)
    with pytest.raises(SchemaError, match="Trajectories, Transitions or States, not dict"):
        buffer.add({"states": np.zeros((1, 2))})
    with pytest.raises(InvalidBatchError, match=r"trajectories \[1\] took no action"):
        buffer.add(_trajectories([2, 0], [0.0, 1.0]))
    assert snapshot(client, buffer_name) == before
    with pytest.raises(ValueError, match="holds states, not 'trajectories'"):
        TerminatingStateBuffer(client, buffer_name, capacity=4, kind="trajectories")
    # a buffer of trajectories under the same name is not a terminating-state buffer
    ReplayBuffer(client, f"{buffer_name}-t", capacity=4).add(_trajectories([1], [0.0]))
    with pytest.raises(ValueError, match="holds trajectories, not states"):
        TerminatingStateBuffer(client, f"{buffer_name}-t", capacity=4)
