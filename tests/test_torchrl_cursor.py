"""redisbuf.torchrl: the writers' ``_cursor``, TorchRL's slot cursor given a meaning on the
shared buffer (the server's insert count modulo max_size)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ReplayBuffer,
    RoundRobinWriter,
    TensorDictMaxValueWriter,
    TensorDictReplayBuffer,
)

from redisbuf.torchrl import RedisbufStorage  # noqa: E402


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def items(n: int, reward: float = 0.0) -> TensorDict:
    return TensorDict({"x": torch.arange(n), "next": {"reward": torch.full((n,), reward)}},
                      [n])


@pytest.mark.parametrize("capacity", [3, 5, 8])
def test_round_robin_cursor_matches_torchrls_on_the_same_writes(client, name, capacity):
    ours = ReplayBuffer(storage=RedisbufStorage(client, name, capacity))
    theirs = ReplayBuffer(storage=LazyTensorStorage(capacity), writer=RoundRobinWriter())
    for n in (2, 5, 1, 7, 3):
        ours.extend(torch.arange(n))
        theirs.extend(torch.arange(n))
        assert ours.writer._cursor == theirs.writer._cursor
    ours.empty()
    assert ours.writer._cursor == 0


def test_the_cursor_counts_every_processs_inserts(client, name):
    one = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 4))
    two = TensorDictReplayBuffer(storage=RedisbufStorage(client, name))
    one.extend(items(3))
    two.extend(items(2))
    assert one.writer._cursor == two.writer._cursor == 5 % 4
    assert one.writer._write_count == 5
    with pytest.raises(AttributeError, match="cannot be set"):
        one.writer._cursor = 0


def test_max_value_cursor_stops_at_zero_once_full(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 4),
                                writer=TensorDictMaxValueWriter())
    rb.extend(items(3, reward=1.0))
    assert rb.writer._cursor == 3
    rb.extend(items(1, reward=2.0))
    assert rb.writer._cursor == 0  # full
    rb.extend(items(3, reward=5.0))  # replacements: the cursor stays
    assert rb.writer._cursor == 0 and len(rb) == 4
    with pytest.raises(AttributeError, match="cannot be set"):
        rb.writer._cursor = 1
