"""Changing stored items by id: records, remove, replace (compare and set), and PER
priorities that leave the running max alone."""

from __future__ import annotations

import numpy as np
import pytest
from replica_helpers import followed_masses

from redisbuf import BufferKeys, PERSampler, ReplayBuffer
from redisbuf.errors import InvalidBatchError, RequestTooLargeError, SchemaError
from redisbuf.store import bounds


def test_remove_takes_items_out_of_every_structure(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    buffer.add([{"i": i} for i in range(5)], priorities=[1.0, 2.0, 3.0, 4.0, 5.0])
    buffer.sample(20)  # uses, and a replica that follows the mass log
    assert buffer.remove([2, 4, 4, 99]) == 2
    keys = BufferKeys(buffer_name)
    for key in (keys.items, keys.per, keys.uses):
        assert not {b"000000000002", b"000000000004"} & set(client.hkeys(key))
    assert [int(m) for m in client.zrange(keys.order, 0, -1)] == [1, 3, 5]
    assert set(followed_masses(client, buffer_name, "per")) == {1, 3, 5}
    assert set(buffer.sample_with_info(200).ids.tolist()) <= {1, 3, 5}
    assert buffer.remove([2]) == 0 and len(buffer) == 3


def test_remove_in_commands_of_bounded_size(client, buffer_name, monkeypatch) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add({"x": np.arange(8.0)})
    monkeypatch.setattr(bounds, "MAX_ADD_ITEMS", 3)
    calls = []
    real = buffer._run
    buffer._run = lambda name, keys, args, read=False: calls.append(len(args)) or real(
        name, keys, args, read)
    assert buffer.remove(range(1, 8)) == 7
    assert calls == [3, 3, 1] and len(buffer) == 1


def test_replace_keeps_id_order_priority_and_uses(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    buffer.add([{"v": 1}, {"v": 2}, {"v": 3}], priorities=[1.0, 7.0, 2.0])
    buffer.sample(10)
    keys = BufferKeys(buffer_name)
    before = {k: client.dump(k) for k in (keys.order, keys.per, keys.uses, keys.prio)}
    assert buffer.replace([2, 9], [{"v": ("new",)}, {"v": 0}]).tolist() == [1, 0]
    assert buffer.get([1, 2, 3]) == [{"v": 1}, {"v": ("new",)}, {"v": 3}]
    assert {k: client.dump(k) for k in before} == before
    assert len(buffer) == 3


def test_replace_compare_and_set(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add([{"v": 1}, {"v": 2}])
    old = buffer.records([1, 2, 3])
    assert old[2] is None
    buffer.replace([2], [{"v": 22}])  # another process changed item 2 meanwhile
    result = buffer.replace([1, 2], [{"v": 10}, {"v": 20}], expected=old[:2])
    assert result.tolist() == [1, -1]
    assert buffer.get([1, 2]) == [{"v": 10}, {"v": 22}]


def test_replace_refuses_other_schemas_and_bad_arguments(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    with pytest.raises(SchemaError, match="holds no items"):
        buffer.replace([1], [1])
    buffer.add({"x": np.zeros((2, 3), np.float32)})
    snapshot = client.hgetall(BufferKeys(buffer_name).items)
    with pytest.raises(SchemaError, match="shape"):
        buffer.replace([1], {"x": np.zeros((1, 4), np.float32)})
    with pytest.raises(SchemaError, match="nest"):
        buffer.replace([1], [{"x": 1}])
    with pytest.raises(InvalidBatchError, match="2 ids for a batch of 1"):
        buffer.replace([1, 2], {"x": np.ones((1, 3), np.float32)})
    with pytest.raises(ValueError, match="positive"):
        buffer.replace([0], {"x": np.ones((1, 3), np.float32)})
    assert client.hgetall(BufferKeys(buffer_name).items) == snapshot
    buffer.replace([2], {"x": np.ones((1, 3), np.float32)})
    assert buffer.get([2])["x"].tolist() == [[1.0, 1.0, 1.0]]


def test_replace_is_bounded_like_an_add(client, buffer_name, monkeypatch) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add([0, 1, 2])
    monkeypatch.setattr(bounds, "MAX_ADD_ITEMS", 2)
    with pytest.raises(RequestTooLargeError):
        buffer.replace([1, 2, 3], [5, 6, 7])
    assert buffer.get([1, 2, 3]) == [0, 1, 2]


def test_given_priorities_may_leave_the_running_max(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10,
                          sampler=PERSampler(initial_priority=1.0, eps=0.0))
    buffer.add([0], priorities=[5.0], raise_running_max=False)
    buffer.add([1])  # gets max(initial 1.0, running max): 5.0 did not raise it
    assert buffer.priorities([1, 2]).tolist() == [5.0, 1.0]
    buffer.update_priority([2], [3.0])
    buffer.add([2])
    buffer.add([3], priorities=[9.0])
    buffer.add([4])
    assert buffer.priorities([3, 5]).tolist() == [3.0, 9.0]


def test_replace_sets_priorities_with_the_records(client, buffer_name) -> None:
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler(eps=0.0))
    buffer.add([{"v": 1}, {"v": 2}], priorities=[1.0, 1.0])
    buffer.sample(4)  # a replica that follows the mass log
    old = buffer.records([1, 2])
    result = buffer.replace([1, 2, 3], [{"v": 10}, {"v": 20}, {"v": 30}],
                            expected=[old[0], b"not it", b""], priorities=[5.0, 7.0, 9.0])
    assert result.tolist() == [1, -1, 0]
    # only the item replaced got its priority (no item 3 was stored)
    np.testing.assert_array_equal(buffer.priorities([1, 2, 3]), [5.0, 1.0, np.nan])
    assert followed_masses(client, buffer_name, "per")[1] == pytest.approx(5.0 ** 0.6)
    assert float(client.hget(BufferKeys(buffer_name).meta, "per_max")) == 5.0
    with pytest.raises(InvalidBatchError):
        buffer.replace([1], [{"v": 0}], priorities=[-1.0])
    plain = ReplayBuffer(client, buffer_name + "plain", capacity=10)
    plain.add([1])
    from redisbuf.errors import ConfigMismatchError

    with pytest.raises(ConfigMismatchError):
        plain.replace([1], [2], priorities=[1.0])
    assert buffer.get([1]) == [{"v": 10}] and plain.get([1]) == [1]
