"""Schemaless ReplayBuffers (kind ``nest``): add takes a list of items of any nest, sample
returns items; ids, PER, eviction, max_use, sample_range, get, save / load and the
quarantine work as for dict batches; a refused item writes nothing."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from cluster_helpers import chi2_limit
from test_nest import assert_same

from redisbuf import BufferKeys, Items, PERSampler, ReplayBuffer
from redisbuf.errors import (
    InvalidBatchError,
    SchemaError,
    UnsupportedItemError,
)


def items(count: int, start: int = 0) -> list:
    return [
        {"step": i, "obs": np.full((2,), i, np.float32), "info": ("ok", None),
         "t": torch.tensor([i], dtype=torch.int16)}
        for i in range(start, start + count)
    ]


def test_items_of_different_shapes_share_one_buffer(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    mixed = [1, "two", {"obs": np.zeros((3, 4), np.uint8)}, [torch.ones(2)], None, b"raw",
             {"obs": np.zeros(7)}]
    result = buffer.add(mixed)
    assert result.ids.tolist() == [1, 2, 3, 4, 5, 6, 7]
    assert buffer.kind == "nest" and buffer.stored_schema() == {"kind": "nest", "fields": {}}
    assert_same(buffer.get(result.ids.tolist()), mixed)
    reopened = ReplayBuffer.open(client, buffer_name)
    assert_same(reopened.get([3, 7]), [mixed[2], mixed[6]])


def test_sample_returns_items_with_ids(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10, kind="nest", seed=1)
    stored = items(6)
    buffer.add(stored)
    info = buffer.sample_with_info(6, replacement=False)
    assert isinstance(info.batch, list) and sorted(info.ids.tolist()) == [1, 2, 3, 4, 5, 6]
    for item_id, item in zip(info.ids.tolist(), info.batch, strict=True):
        assert_same(item, stored[item_id - 1])
    assert len(buffer.sample(20)) == 20  # with replacement beyond the length, as dict batches
    window = buffer.sample(4, sample_range=slice(-2, None))
    assert {item["step"] for item in window} <= {4, 5}


def test_eviction_is_fifo(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    buffer.add(items(3))
    assert buffer.add(items(3, start=3)).evicted == 2
    assert sorted(item["step"] for item in buffer.sample(4, replacement=False)) == [2, 3, 4, 5]


def test_prioritized_capacity_with_item_log_rewards(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=2, prioritized_capacity=True)
    buffer.add(Items([{"a": 0}, ("b",), None], log_rewards=np.array([0.0, 2.0, 1.0])))
    assert buffer.get([2, 3]) == [("b",), None] and len(buffer) == 2
    with pytest.raises(InvalidBatchError, match="log_rewards"):
        buffer.add([1])  # this buffer ranks by log-reward
    with pytest.raises(InvalidBatchError, match="NaN"):
        buffer.add(Items([1], log_rewards=[float("nan")]))


def test_a_nest_buffer_refuses_other_kinds_and_the_reverse(client, buffer_name) -> None:
    nests = ReplayBuffer(client, buffer_name, capacity=4)
    nests.add([1])
    with pytest.raises(SchemaError, match="nest"):
        nests.add({"x": np.zeros(2)})
    dicts = ReplayBuffer(client, buffer_name + "d", capacity=4)
    dicts.add({"x": np.zeros(2)})
    with pytest.raises(SchemaError):
        dicts.add([{"x": 1.0}])
    with pytest.raises(InvalidBatchError, match="empty"):
        nests.add([])


def test_a_refused_item_writes_nothing(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    buffer.add([0])
    before = {key: client.dump(key) for key in BufferKeys(buffer_name).all_keys()}
    with pytest.raises(TypeError, match=r"items\[1\]\['bad'\]: a value of type set"):
        buffer.add([1, {"bad": {1}}, 3])
    assert {key: client.dump(key) for key in BufferKeys(buffer_name).all_keys()} == before
    with pytest.raises(UnsupportedItemError):
        buffer.add(Items([object()]))
    assert len(buffer) == 1


def test_per_draws_by_priority_and_updates(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=8, seed=3,
                          sampler=PERSampler(alpha=1.0, beta=1.0, eps=0.0))
    buffer.add([("a",), ("b",), ("c",)], priorities=[1.0, 1.0, 1.0])
    assert buffer.update_priority([1, 2, 3], [1.0, 2.0, 5.0]) == 3
    info = buffer.sample_with_info(4000)
    counts = np.bincount(info.ids, minlength=4)[1:]
    expected = 4000 * np.array([1, 2, 5]) / 8
    assert ((counts - expected) ** 2 / expected).sum() < chi2_limit(2)
    assert {item for (item,) in info.batch} == {"a", "b", "c"}
    by_id = dict(zip(info.ids.tolist(), info.weights.tolist(), strict=True))
    assert by_id[3] == pytest.approx(1 / 5) and by_id[1] == pytest.approx(1.0)


def test_max_use_removes_items_on_their_last_use(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=8, max_use=2)
    buffer.add(items(3))
    first = buffer.sample(3, replacement=False)
    second = buffer.sample(3, replacement=False)
    assert sorted(i["step"] for i in first) == sorted(i["step"] for i in second) == [0, 1, 2]
    assert len(buffer) == 0


def test_save_and_load_keep_items_exactly(client, buffer_name, tmp_path) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=8, sampler=PERSampler())
    stored = items(4)
    buffer.add(stored, priorities=[1.0, 2.0, 3.0, 4.0])
    path = tmp_path / "nests.rb"
    buffer.save(path)
    copy = ReplayBuffer(client, buffer_name + "copy", capacity=8, sampler=PERSampler())
    copy.load(path)
    assert_same(copy.get([1, 2, 3, 4]), stored)


def test_a_record_that_does_not_decode_is_quarantined(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=4, seed=0)
    buffer.add([{"a": 1}, {"a": 2}])
    client.hset(BufferKeys(buffer_name).items, "000000000001", b"\xc1")
    with pytest.warns(Warning, match="does not decode"):
        drawn = buffer.sample(3, replacement=True)
    assert drawn == [{"a": 2}] * 3


def test_a_sharded_buffer_holds_nests(client, buffer_name) -> None:
    from redisbuf import ShardedReplayBuffer

    buffer = ShardedReplayBuffer(client, buffer_name, capacity=12, shards=2, seed=0)
    first = buffer.add(items(3)).ids.tolist()
    second = buffer.add(items(3, start=3)).ids.tolist()
    stored = items(6)
    assert_same(buffer.get(first + second), stored)
    drawn = buffer.sample(6, replacement=False)
    assert sorted(item["step"] for item in drawn) == list(range(6))
    with pytest.raises(SchemaError):
        buffer.add({"x": np.zeros(1)})
