"""redisbuf.torchrl: in-place writes (``rb[index] = data``, the storage's ``set``) by id or
by position, seen by every storage on the buffer, refused whole when they cannot be made."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torchrl.data import ReplayBuffer, TensorDictReplayBuffer  # noqa: E402

from redisbuf.errors import InvalidBatchError, SchemaError  # noqa: E402
from redisbuf.torchrl import RedisbufPrioritizedSampler, RedisbufStorage  # noqa: E402


@pytest.fixture
def name() -> str:
    return f"trl-{uuid.uuid4().hex[:8]}"


def steps(values: list[int]) -> TensorDict:
    n = len(values)
    return TensorDict({"x": torch.tensor(values), "next": {"r": torch.tensor(values) * 10.0}},
                      [n])


def stored(rb: ReplayBuffer) -> list[int]:
    return rb[:]["x"].tolist()


def test_a_slice_of_positions_is_replaced_in_place(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10))
    ids = rb.extend(steps([0, 1, 2, 3, 4]))
    rb[1:3] = steps([-1, -2])
    assert stored(rb) == [0, -1, -2, 3, 4]
    assert rb[1:3]["next", "r"].tolist() == [-10.0, -20.0]
    assert len(rb) == 5
    assert rb.writer._cursor == 5
    assert rb.storage._ids_in_order() == ids.tolist()  # ids and order kept


def test_ids_name_the_items_replaced_and_an_int_takes_one_item(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10))
    ids = rb.extend(steps([0, 1, 2, 3]))
    rb[ids[[3, 0]]] = steps([30, 0])
    rb[int(ids[1])] = TensorDict({"x": torch.tensor(11), "next": {"r": torch.tensor(1.5)}}, [])
    assert stored(rb) == [0, 11, 2, 30]
    assert rb[int(ids[1])]["next", "r"].item() == 1.5


def test_a_plain_tensor_buffer_is_replaced_by_position(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 8))
    rb.extend(torch.arange(6))
    rb[2:4] = torch.tensor([20, 30])
    assert rb[:].tolist() == [0, 1, 20, 30, 4, 5]


def test_another_storage_on_the_buffer_reads_the_new_data(client, name):
    writer = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10))
    reader = TensorDictReplayBuffer(storage=RedisbufStorage(client, name))
    writer.extend(steps([0, 1, 2]))
    writer[0:1] = steps([7])
    assert stored(reader) == [7, 1, 2]


def test_an_id_not_stored_refuses_the_whole_write(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 3))
    ids = rb.extend(steps([0, 1, 2, 3]))  # the oldest is evicted
    with pytest.raises(KeyError, match=str(int(ids[0]))):
        rb[ids[[3, 0]]] = steps([33, 0])
    assert stored(rb) == [1, 2, 3]


def test_data_that_does_not_fit_the_stored_items_is_refused_and_nothing_written(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10))
    rb.extend(steps([0, 1, 2]))
    with_new_key = steps([5]).set("d", torch.ones(1))
    with pytest.raises(SchemaError):
        rb[0:1] = with_new_key
    with pytest.raises(SchemaError):
        rb[0:1] = TensorDict({"x": torch.tensor([5.0]), "next": {"r": torch.tensor([1.0])}}, [1])
    with pytest.raises(InvalidBatchError, match="2 items of data for 1 ids"):
        rb[0:1] = steps([5, 6])
    assert stored(rb) == [0, 1, 2]


def test_a_replaced_item_keeps_its_priority(client, name):
    storage = RedisbufStorage(client, name, 10)
    rb = TensorDictReplayBuffer(storage=storage,
                                sampler=RedisbufPrioritizedSampler(10, alpha=1.0, beta=1.0))
    ids = rb.extend(steps([0, 1, 2]))
    rb.update_priority(ids, torch.tensor([1.0, 5.0, 2.0]))
    rb[1:2] = steps([-1])
    assert stored(rb) == [0, -1, 2]
    assert storage.buffer.priorities(ids.tolist()).tolist() == [1.0, 5.0, 2.0]
