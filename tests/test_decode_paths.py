"""The three ways a sample is decoded agree: blobs of one layout (vectorised copy),
blobs of one structure with varying lengths (vectorised header reads), and the per-blob
msgpack parse that handles anything. Also under corruption: a fast path never returns
data the per-blob parse would not."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from redisbuf import ReplayBuffer, Trajectories
from redisbuf.errors import DecodeError
from redisbuf.store import codec
from redisbuf.store.keys import format_id

SETTINGS = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _per_blob_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codec, "decode_same_layout", lambda blobs, scratch=None: None)
    monkeypatch.setattr(codec, "decode_ragged", lambda blobs, scratch=None: None)


def _equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, Trajectories):
        fields = ("states", "actions", "terminating_idx", "log_rewards", "log_probs", "conditions")
        return all(_equal(getattr(a, f), getattr(b, f)) for f in fields)
    if a is None or b is None:
        return a is b
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return (
        isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b, equal_nan=True)
    )


def _decode_all_ways(buffer: ReplayBuffer, blobs: list[bytes], monkeypatch) -> tuple:
    outcomes = []
    for per_blob in (False, True):
        with monkeypatch.context() as patch:
            if per_blob:
                _per_blob_only(patch)
            try:
                outcomes.append(buffer.decode(blobs))
            except DecodeError:
                outcomes.append(DecodeError)
    return tuple(outcomes)


def _stored(client, buffer: ReplayBuffer, count: int) -> list[bytes]:
    return client.hmget(buffer.keys.items, [format_id(i) for i in range(1, count + 1)])


def _trajectories(rng: np.random.Generator, n: int, horizon: int, lib: str, varied: bool):
    lengths = rng.integers(1, horizon + 1, n) if varied else np.full(n, horizon)
    states = rng.standard_normal((horizon + 1, n, 3)).astype(np.float32)
    actions = rng.integers(0, 4, (horizon, n))
    log_probs = rng.standard_normal((horizon, n)).astype(np.float32)
    conditions = rng.standard_normal((n, 2))
    log_rewards = rng.standard_normal(n)
    convert = torch.from_numpy if lib == "torch" else (lambda x: x)
    return Trajectories(
        states=convert(states),
        actions=convert(actions),
        terminating_idx=convert(lengths),
        log_rewards=convert(log_rewards),
        log_probs=convert(log_probs),
        conditions=convert(conditions),
    )


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 40),
    horizon=st.integers(1, 70),
    lib=st.sampled_from(["numpy", "torch"]),
    varied=st.booleans(),
)
def test_trajectories_decode_the_same_every_way(
    fake_client, monkeypatch, seed, n, horizon, lib, varied
):
    name = f"paths-{seed}-{n}-{horizon}-{lib}-{varied}"
    buffer = ReplayBuffer(fake_client, name, capacity=100)
    batch = _trajectories(np.random.default_rng(seed), n, horizon, lib, varied)
    buffer.add(batch)
    fast, slow = _decode_all_ways(buffer, _stored(fake_client, buffer, n), monkeypatch)
    assert fast is not DecodeError and _equal(fast, slow)
    buffer.drop()


@SETTINGS
@given(seed=st.integers(0, 2**16), n=st.integers(1, 40))
def test_dict_with_numbers_of_every_kind_decodes_the_same_every_way(
    fake_client, monkeypatch, seed, n
):
    rng = np.random.default_rng(seed)
    batch = {
        "obs": rng.standard_normal((n, 4)).astype(np.float32),
        "action": rng.integers(-(2**40), 2**40, n),
        "count": rng.integers(0, 255, n).astype(np.uint8),
        "done": rng.random(n) < 0.5,
        "reward": rng.standard_normal(n).astype(np.float16),
        "log_rewards": rng.standard_normal(n),
    }
    buffer = ReplayBuffer(fake_client, f"dict-{seed}-{n}", capacity=100)
    buffer.add(batch)
    blobs = _stored(fake_client, buffer, n)
    assert codec.decode_same_layout(blobs) is not None  # fixed-width numbers: one layout
    fast, slow = _decode_all_ways(buffer, blobs, monkeypatch)
    assert _equal(fast, slow) and _equal(fast, batch)
    buffer.drop()


def test_variable_lengths_take_the_ragged_path(fake_client):
    buffer = ReplayBuffer(fake_client, "ragged", capacity=100)
    # lengths on both sides of the ext 8 / ext 16 boundary (255 payload bytes)
    batch = _trajectories(np.random.default_rng(0), 30, 40, "torch", varied=True)
    buffer.add(batch)
    blobs = _stored(fake_client, buffer, 30)
    assert codec.decode_same_layout(blobs) is None
    fields = codec.decode_ragged(blobs)
    assert fields is not None
    assert fields["actions"].rows.tolist() == batch.terminating_idx.tolist()


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    varied=st.booleans(),
    flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(1, 255)), min_size=1, max_size=3),
)
def test_corrupted_blobs_never_decode_differently_on_a_fast_path(
    fake_client, monkeypatch, seed, varied, flips
):
    name = f"corrupt-{seed}-{varied}"
    buffer = ReplayBuffer(fake_client, name, capacity=100)
    buffer.add(_trajectories(np.random.default_rng(seed), 6, 12, "numpy", varied))
    blobs = [bytearray(b) for b in _stored(fake_client, buffer, 6)]
    for position, xor in flips:
        blob = blobs[position % len(blobs)]
        blob[(position // len(blobs)) % len(blob)] ^= xor
    fast, slow = _decode_all_ways(buffer, [bytes(b) for b in blobs], monkeypatch)
    if slow is DecodeError:
        assert fast is DecodeError
    else:
        assert fast is not DecodeError and _equal(fast, slow)
    buffer.drop()
