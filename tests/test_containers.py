"""Batch containers through a real buffer: what goes in comes out, of the same kind,
with torchgfn's time-major padding for trajectories."""

from __future__ import annotations

import uuid

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf import ReplayBuffer, States, Trajectories, Transitions

pytestmark = pytest.mark.filterwarnings("ignore:The given buffer is not writable")

PROPERTY = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


def _to(lib: str, array: np.ndarray):
    return torch.from_numpy(np.ascontiguousarray(array)) if lib == "torch" else array


def _np(value) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    return np.asarray(value)


def _make_trajectories(lib: str, lengths: list[int], horizon: int, seed: int = 0, **extra):
    rng = np.random.default_rng(seed)
    n = len(lengths)
    states = rng.normal(size=(horizon + 1, n, 3)).astype(np.float32)
    actions = rng.integers(0, 4, size=(horizon, n, 1)).astype(np.int64)
    log_probs = rng.normal(size=(horizon, n)).astype(np.float32)
    for b, length in enumerate(lengths):  # torchgfn-style padding in the input
        states[length + 1 :, b] = 0.0
        actions[length:, b] = -1
        log_probs[length:, b] = 0.0
    return Trajectories(
        states=_to(lib, states),
        actions=_to(lib, actions),
        terminating_idx=_to(lib, np.array(lengths, dtype=np.int64)),
        log_rewards=_to(lib, rng.normal(size=n)),
        log_probs=_to(lib, log_probs),
        conditions=_to(lib, rng.normal(size=(n, 2)).astype(np.float32)),
        **extra,
    )


def _trajectory(tr: Trajectories, b: int) -> dict[str, np.ndarray]:
    """Trajectory ``b`` without padding."""
    length = int(_np(tr.terminating_idx)[b])
    return {
        "states": _np(tr.states)[: length + 1, b],
        "actions": _np(tr.actions)[:length, b],
        "log_probs": _np(tr.log_probs)[:length, b],
        "conditions": _np(tr.conditions)[b],
        "log_rewards": _np(tr.log_rewards)[b],
    }


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_trajectories_round_trip_and_padding(client, buffer_name, lib):
    lengths = [3, 0, 5, 1, 2]
    batch = _make_trajectories(lib, lengths, horizon=6, states_pad_value=-9.0, actions_pad_value=-5)
    buffer = ReplayBuffer(client, buffer_name, capacity=20)
    result = buffer.add(batch)
    assert result.ids.tolist() == [1, 2, 3, 4, 5]

    order = [3, 0, 4]  # lengths 1, 3, 2: padded to horizon 3, not the batch's 6
    out = buffer.get(result.ids[order])
    assert isinstance(out, Trajectories)
    array_type = torch.Tensor if lib == "torch" else np.ndarray
    for name in ("states", "actions", "terminating_idx", "log_probs", "conditions", "log_rewards"):
        assert isinstance(getattr(out, name), array_type), name
    assert _np(out.terminating_idx).tolist() == [1, 3, 2]
    assert tuple(out.states.shape) == (4, 3, 3)
    assert tuple(out.actions.shape) == (3, 3, 1)
    assert tuple(out.log_probs.shape) == (3, 3)
    assert out.states.dtype == batch.states.dtype and out.actions.dtype == batch.actions.dtype
    assert out.states_pad_value == -9.0 and out.actions_pad_value == -5
    for position, b in enumerate(order):
        want = _trajectory(batch, b)
        got = _trajectory(out, position)
        for name, value in want.items():
            np.testing.assert_array_equal(got[name], value, err_msg=name)
        length = lengths[b]
        assert (_np(out.states)[length + 1 :, position] == -9.0).all()
        assert (_np(out.actions)[length:, position] == -5).all()
        assert (_np(out.log_probs)[length:, position] == 0.0).all()


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_sampled_trajectories_are_whole_trajectories(client, buffer_name, lib):
    lengths = [4, 1, 0, 2, 3, 4]
    batch = _make_trajectories(lib, lengths, horizon=4, seed=3)
    buffer = ReplayBuffer(client, buffer_name, capacity=20, seed=1)
    buffer.add(batch)
    info = buffer.sample_with_info(6)
    out = info.batch
    assert isinstance(out, Trajectories)
    assert sorted(info.ids.tolist()) == [1, 2, 3, 4, 5, 6]
    assert out.max_length == max(lengths)
    for position, item_id in enumerate(info.ids.tolist()):
        want = _trajectory(batch, item_id - 1)
        got = _trajectory(out, position)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_trajectories_without_optional_fields(client, buffer_name):
    states = np.arange(4 * 2 * 1, dtype=np.int32).reshape(4, 2, 1)
    actions = np.array([[1, 2], [3, 4], [5, 6]])
    batch = Trajectories(states, actions, np.array([3, 1]))
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(batch)
    out = buffer.get([2])
    assert out.log_probs is None and out.conditions is None and out.log_rewards is None
    assert out.states[:, 0, 0].tolist() == [1, 3]
    assert out.actions[:, 0].tolist() == [2]
    assert out.actions_pad_value == -1.0 and out.states_pad_value == 0.0


def test_terminating_states_match_torchgfn_convention():
    batch = _make_trajectories("numpy", [2, 3], horizon=3)
    np.testing.assert_array_equal(batch.terminating_states[0], batch.states[1, 0])
    np.testing.assert_array_equal(batch.terminating_states[1], batch.states[2, 1])


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_transitions_round_trip(client, buffer_name, lib):
    rng = np.random.default_rng(0)
    n = 7
    batch = Transitions(
        states=_to(lib, rng.normal(size=(n, 2)).astype(np.float32)),
        next_states=_to(lib, rng.normal(size=(n, 2)).astype(np.float32)),
        actions=_to(lib, rng.integers(0, 5, size=n)),
        is_terminating=_to(lib, rng.integers(0, 2, size=n).astype(bool)),
        log_rewards=_to(lib, np.where(rng.random(n) < 0.5, -np.inf, rng.normal(size=n))),
        log_probs=_to(lib, rng.normal(size=n).astype(np.float32)),
    )
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    ids = buffer.add(batch).ids
    out = buffer.get(ids[::-1])
    assert isinstance(out, Transitions)
    assert out.conditions is None
    for name in ("states", "next_states", "actions", "is_terminating", "log_rewards", "log_probs"):
        got, want = getattr(out, name), getattr(batch, name)
        assert type(got) is type(want), name
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(_np(got), _np(want)[::-1], err_msg=name)
    np.testing.assert_array_equal(_np(out.terminating_states), _np(batch.terminating_states)[::-1])


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_states_round_trip(client, buffer_name, lib):
    states = np.arange(24, dtype=np.int64).reshape(6, 2, 2)
    batch = States(
        states=_to(lib, states),
        log_rewards=_to(lib, np.linspace(-1, 1, 6).astype(np.float32)),
        conditions=_to(lib, np.arange(6, dtype=np.int16)),
    )
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add(batch)
    out = buffer.get([6, 1])
    assert isinstance(out, States)
    np.testing.assert_array_equal(_np(out.states), states[[5, 0]])
    np.testing.assert_array_equal(_np(out.log_rewards), _np(batch.log_rewards)[[5, 0]])
    np.testing.assert_array_equal(_np(out.conditions), [5, 0])
    assert out.conditions.dtype == batch.conditions.dtype


@pytest.mark.parametrize("lib", ["numpy", "torch"])
def test_dict_batches_round_trip_every_dtype(client, buffer_name, lib):
    n = 5
    rng = np.random.default_rng(0)
    batch = {
        "obs": _to(lib, rng.normal(size=(n, 3, 2)).astype(np.float16)),
        "action": _to(lib, rng.integers(-100, 100, size=n).astype(np.int8)),
        "reward": _to(lib, rng.normal(size=n).astype(np.float64)),
        "done": _to(lib, rng.integers(0, 2, size=(n, 1)).astype(bool)),
        "pixels": _to(lib, rng.integers(0, 255, size=(n, 4)).astype(np.uint8)),
        "count": _to(lib, rng.integers(-(2**40), 2**40, size=n)),
        "i32": _to(lib, rng.integers(-5, 5, size=(n, 2)).astype(np.int32)),
        "i16": _to(lib, rng.integers(-5, 5, size=n).astype(np.int16)),
    }
    if lib == "torch":
        batch["bf16"] = torch.randn(n, 2).to(torch.bfloat16)
        batch["bf16_scalar"] = torch.randn(n).to(torch.bfloat16)
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add(batch)
    out = buffer.get([3, 1, 5])
    assert isinstance(out, dict) and set(out) == set(batch)
    for name, want in batch.items():
        got = out[name]
        assert type(got) is type(want), name
        assert got.dtype == want.dtype, name
        assert tuple(got.shape) == (3, *want.shape[1:]), name
        if lib == "torch":
            assert torch.equal(got, want[[2, 0, 4]]), name
        else:
            np.testing.assert_array_equal(got, want[[2, 0, 4]], err_msg=name)


@pytest.mark.parametrize(
    "make",
    [
        lambda: {"x": np.arange(4.0)},
        lambda: {"x": torch.arange(4.0)},
        lambda: States(np.zeros((4, 2))),
        lambda: Transitions(np.zeros((4, 1)), np.ones((4, 1)), np.arange(4), np.ones(4, bool)),
        lambda: _make_trajectories("torch", [1, 2, 0, 3], horizon=3),
    ],
    ids=["dict-numpy", "dict-torch", "states", "transitions", "trajectories"],
)
def test_sample_returns_the_kind_that_was_added(client, buffer_name, make):
    batch = make()
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add(batch)
    out = buffer.sample(3)
    assert type(out) is type(batch)
    assert len(out if not isinstance(out, dict) else out["x"]) == 3
    assert ReplayBuffer.open(client, buffer_name).kind == buffer.kind


# -- property: add then get returns exactly what was added ------------------------------

FIELD_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "float16", "float32", "float64"]


@st.composite
def dict_batches(draw):
    lib = draw(st.sampled_from(["numpy", "torch"]))
    n_fields = draw(st.integers(1, 3))
    fields = {}
    for index in range(n_fields):
        dtype = draw(st.sampled_from(FIELD_DTYPES))
        trailing = tuple(draw(st.lists(st.integers(0, 3), max_size=2)))
        fields[f"f{index}"] = (dtype, trailing)
    with_rewards = draw(st.booleans())
    sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    seed = draw(st.integers(0, 2**32 - 1))
    return lib, fields, with_rewards, sizes, seed


def _random_batch(lib, fields, with_rewards, n, rng):
    batch = {}
    for name, (dtype, trailing) in fields.items():
        shape = (n, *trailing)
        if dtype == "bool":
            value = rng.integers(0, 2, size=shape).astype(bool)
        elif np.issubdtype(np.dtype(dtype), np.integer):
            info = np.iinfo(dtype)
            value = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        else:
            value = (rng.normal(size=shape) * 100).astype(dtype)
        batch[name] = _to(lib, value)
    if with_rewards:
        rewards = rng.normal(size=n)
        rewards[rng.random(n) < 0.2] = -np.inf
        batch["log_rewards"] = _to(lib, rewards)
    return batch


@PROPERTY
@given(spec=dict_batches())
def test_property_add_then_get_returns_exactly_the_items(client, spec):
    lib, fields, with_rewards, sizes, seed = spec
    rng = np.random.default_rng(seed)
    buffer = ReplayBuffer(client, f"prop-{uuid.uuid4().hex[:8]}", capacity=sum(sizes))
    added = []
    for n in sizes:
        batch = _random_batch(lib, fields, with_rewards, n, rng)
        result = buffer.add(batch)
        assert result.evicted == 0
        added.append((result.ids, batch))
    all_ids = np.concatenate([ids for ids, _ in added])
    assert all_ids.tolist() == list(range(1, sum(sizes) + 1))
    assert len(buffer) == sum(sizes)
    permutation = rng.permutation(all_ids)
    out = buffer.get(permutation)
    for name in added[0][1]:
        want = np.concatenate([_np(batch[name]) for _, batch in added])[permutation - 1]
        got = out[name]
        assert type(got) is type(added[0][1][name])
        assert got.dtype == added[0][1][name].dtype
        assert _np(got).tobytes() == want.tobytes(), name
    buffer.drop()


@PROPERTY
@given(
    lengths=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    lib=st.sampled_from(["numpy", "torch"]),
    seed=st.integers(0, 1000),
)
def test_property_trajectories_add_then_get(client, lengths, lib, seed):
    horizon = max(lengths) + 1
    batch = _make_trajectories(lib, lengths, horizon=horizon, seed=seed)
    buffer = ReplayBuffer(client, f"prop-{uuid.uuid4().hex[:8]}", capacity=10)
    ids = buffer.add(batch).ids
    pick = np.random.default_rng(seed).permutation(len(lengths))
    out = buffer.get(ids[pick])
    assert out.max_length == max(lengths[p] for p in pick)
    for position, b in enumerate(pick):
        want, got = _trajectory(batch, b), _trajectory(out, position)
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    buffer.drop()
