"""redisbuf.torchrl: what TorchRL users bring from TorchRL's own storages (their state
dicts), TorchRL's ``generator=``, and non-tensor entries (refused, never lost)."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import NonTensorData, TensorDict  # noqa: E402
from torchrl.data import (  # noqa: E402
    LazyTensorStorage,
    ListStorage,
    ReplayBuffer,
    TensorDictReplayBuffer,
)

from redisbuf.errors import InvalidBatchError, SchemaError  # noqa: E402
from redisbuf.torchrl import RedisbufStorage, TensorDictPrioritizedReplayBuffer  # noqa: E402


@pytest.fixture
def name() -> str:
    return f"trl-state-{uuid.uuid4().hex[:8]}"


def frames(values) -> TensorDict:
    x = torch.as_tensor(values)
    return TensorDict({"x": x, "next": {"r": x[:, None] * 0.5}}, [len(x)])


def test_a_lazy_tensor_storage_state_loads_for_every_process(client, name):
    source = TensorDictReplayBuffer(storage=LazyTensorStorage(10), batch_size=2)
    source.extend(frames([3, 1, 4]))
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50), batch_size=2)
    rb.extend(frames([9, 9]))
    rb.load_state_dict(source.state_dict())
    other = TensorDictReplayBuffer(storage=RedisbufStorage(client, name))
    assert other[:]["x"].tolist() == [3, 1, 4]  # the slots in order, nothing else
    assert other[:]["next", "r"][:, 0].tolist() == [1.5, 0.5, 2.0]
    assert "index" not in other[:].keys()


def test_tensor_and_list_storage_states_load(client, name):
    tensors = ReplayBuffer(storage=LazyTensorStorage(8))
    tensors.extend(torch.arange(5) * 2)
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 20))
    rb.load_state_dict(tensors.state_dict())
    assert rb[:].tolist() == [0, 2, 4, 6, 8]
    listed = ReplayBuffer(storage=ListStorage(8))
    listed.extend([torch.tensor([1, 2]), torch.tensor([3, 4])])
    rb2 = ReplayBuffer(storage=RedisbufStorage(client, f"{name}-list", 20))
    rb2.load_state_dict(listed.state_dict())
    assert rb2[:].tolist() == [[1, 2], [3, 4]]
    empty = ReplayBuffer(storage=LazyTensorStorage(8))
    rb2.load_state_dict(empty.state_dict())
    assert len(rb2) == 0


def test_a_state_that_does_not_fit_leaves_the_buffer_as_it_was(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 50), batch_size=2)
    rb.extend(frames([5, 6]))
    other = TensorDictReplayBuffer(storage=LazyTensorStorage(10))
    other.extend(TensorDict({"y": torch.zeros(3)}, [3]))
    with pytest.raises(SchemaError):
        rb.load_state_dict(other.state_dict())
    with pytest.raises(KeyError, match="neither a RedisbufStorage"):
        rb.storage.load_state_dict({"something": 1})
    assert rb[:]["x"].tolist() == [5, 6]


def test_the_generator_makes_draws_repeatable(client, name):
    generator = torch.Generator()
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 100), batch_size=8,
                      generator=generator)
    rb.extend(torch.arange(60))
    generator.manual_seed(7)
    first = rb.sample().tolist()
    generator.manual_seed(7)
    assert rb.sample().tolist() == first
    assert rb.sample().tolist() != first  # the generator moved on
    per_generator = torch.Generator()
    per = TensorDictPrioritizedReplayBuffer(alpha=0.7, beta=0.5, batch_size=8,
                                            storage=RedisbufStorage(client, f"{name}-per", 100),
                                            generator=per_generator)
    per.extend(frames(list(range(60))))
    per_generator.manual_seed(3)
    first = per.sample()["x"].tolist()
    per_generator.manual_seed(3)
    assert per.sample()["x"].tolist() == first


def test_non_tensor_entries_are_refused_not_lost(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10))
    data = frames([1, 2, 3])
    data["note"] = TensorDict({"text": NonTensorData("hello", batch_size=[3])}, [3])
    with pytest.raises(InvalidBatchError, match=r"\('note', 'text'\).*non-tensor"):
        rb.extend(data)
    assert len(rb) == 0


def test_an_extend_over_one_adds_bounds_is_stored_whole_in_order(client, name):
    from redisbuf.store import bounds

    count = bounds.MAX_ADD_ITEMS * 2 + 7  # a collector's batch of 2,055 frames
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 3 * count))
    index = rb.extend(frames(list(range(count))))
    assert len(rb) == count and index.tolist() == list(range(1, count + 1))
    assert rb[:]["x"].tolist() == list(range(count))
