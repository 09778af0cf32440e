"""redisbuf.torchrl: sampling an empty storage raises what TorchRL's samplers raise."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import RandomSampler, ReplayBuffer, TensorDictReplayBuffer  # noqa: E402

from redisbuf import ReplayBuffer as CoreBuffer  # noqa: E402
from redisbuf.errors import EmptyBufferError, RedisBufError  # noqa: E402
from redisbuf.torchrl import (  # noqa: E402
    EmptyStorageError,
    RedisbufStorage,
    TensorDictPrioritizedReplayBuffer,
)


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def items(n: int) -> TensorDict:
    return TensorDict({"x": torch.arange(n, dtype=torch.float32)}, [n])


def test_a_fresh_storage_raises_torchrls_runtime_error(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=4)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage") as caught:
        rb.sample()
    error = caught.value
    # still redisbuf's error, which torchgfn-style callers catch as ValueError
    assert isinstance(error, EmptyStorageError)
    assert isinstance(error, EmptyBufferError) and isinstance(error, ValueError)
    assert isinstance(error, RedisBufError) and error.code == "RB_EMPTY"
    assert name in str(error)


def test_empty_after_items_were_there_and_after_another_process_emptied(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    rb.extend(items(3))
    assert rb.sample().batch_size == torch.Size([2])
    rb.empty()
    with pytest.raises(EmptyStorageError, match="Cannot sample from an empty storage"):
        rb.sample()
    rb.extend(items(2))
    CoreBuffer.open(client, name).clear()  # another handle (process) empties it
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample()


def test_torchrls_random_sampler_and_prefetch_raise_it_too(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), sampler=RandomSampler(),
                      batch_size=2)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample()
    pre = TensorDictReplayBuffer(storage=RedisbufStorage(client, name + "p", 10),
                                 batch_size=2, prefetch=2)
    with pytest.raises(EmptyStorageError):
        pre.sample()


def test_prioritized_buffer_empty_and_all_zero_priorities(client, name):
    rb = TensorDictPrioritizedReplayBuffer(alpha=1.0, beta=0.5, eps=0.0,
                                           storage=RedisbufStorage(client, name, 10),
                                           batch_size=2)
    with pytest.raises(RuntimeError, match="Cannot sample from an empty storage"):
        rb.sample()
    index = rb.extend(items(3))
    rb.update_priority(index, torch.zeros(3))
    # items are stored but none has mass: no claim that the storage is empty
    with pytest.raises(EmptyStorageError, match="holds 3 items") as caught:
        rb.sample()
    assert "Cannot sample from an empty storage" not in str(caught.value)


def test_plain_redisbuf_callers_keep_the_plain_error(client, name):
    RedisbufStorage(client, name, 10)
    with pytest.raises(EmptyBufferError) as caught:
        CoreBuffer.open(client, name).sample(1)
    assert not isinstance(caught.value, RuntimeError)
