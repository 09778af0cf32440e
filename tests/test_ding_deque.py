"""redisbuf.ding.DequeBuffer: DI-engine's DequeBuffer semantics on a shared buffer."""

from __future__ import annotations

import functools
from collections import Counter

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from redisbuf import ReplayBuffer
from redisbuf.ding import Buffer, BufferedData, DequeBuffer
from redisbuf.errors import ConfigMismatchError


@pytest.fixture
def deque(client, buffer_name):
    def make(size: int = 10, **kwargs) -> DequeBuffer:
        return DequeBuffer(size, url=client, name=buffer_name, **kwargs)
    return make


def values(items) -> list:
    return sorted(item.data for item in items)


def test_a_full_buffer_drops_its_oldest(deque) -> None:
    buffer = deque(10)
    pushed = [buffer.push(i) for i in range(15)]
    assert buffer.count() == len(buffer) == 10
    assert values(buffer.sample(10)) == list(range(5, 15))
    assert [p.data for p in pushed[:2]] == [0, 1] and pushed[0].meta == {}
    assert isinstance(buffer, Buffer) and isinstance(pushed[0], BufferedData)


def test_push_returns_the_data_and_meta_given_with_a_string_index(deque) -> None:
    buffer = deque()
    data, meta = {"obs": np.zeros(3, np.float32)}, {"env": 2}
    buffered = buffer.push(data, meta)
    assert buffered.data is data and buffered.meta is meta
    assert isinstance(buffered.index, str) and buffered.index == "000000000001"
    back = buffer.get_by_index(buffered.index)
    assert back.meta == {"env": 2} and back.data["obs"].dtype == np.float32
    assert back.data is not data  # a copy, as every read


def test_sample_without_replacement_and_insufficient_data(deque, caplog) -> None:
    buffer = deque()
    for i in range(3):
        buffer.push(i)
    assert values(buffer.sample(3)) == [0, 1, 2]
    with pytest.raises(ValueError, match="There are less than 4 records/groups in buffer\\(3\\)"):
        buffer.sample(4)
    assert buffer.sample(4, ignore_insufficient=True) == []  # DI-engine returns nothing
    assert "ignored due to data insufficient" in caplog.text
    assert len(buffer.sample(8, replace=True)) == 8


def test_an_empty_buffer_has_nothing_to_sample(deque) -> None:
    buffer = deque()
    with pytest.raises(ValueError):
        buffer.sample(1, replace=True)
    assert buffer.sample(1, replace=True, ignore_insufficient=True) == []


def test_argument_checks_are_dienignes_asserts(deque) -> None:
    buffer = deque()
    buffer.push(0)
    with pytest.raises(AssertionError, match="One of size and indices"):
        buffer.sample()
    with pytest.raises(AssertionError, match="Size and indices length"):
        buffer.sample(2, indices=["000000000001"])
    with pytest.raises(AssertionError, match="groupby and indice"):
        buffer.sample(indices=["000000000001"], groupby="env")
    with pytest.raises(AssertionError, match="unroll_len"):
        buffer.sample(1, unroll_len=2)


def test_sample_range_takes_positions_oldest_first(deque) -> None:
    buffer = deque()
    for i in range(10):
        buffer.push(i)
    for _ in range(10):
        assert values(buffer.sample(5, sample_range=slice(5, 10))) == [5, 6, 7, 8, 9]
    assert set(values(buffer.sample(2, sample_range=slice(0, 10, 5)))) == {0, 5}
    with pytest.raises(ValueError):
        buffer.sample(6, sample_range=slice(5, 10))
    with pytest.raises(ValueError, match="islice"):
        buffer.sample(1, sample_range=slice(-2, None))


def test_sample_by_indices_in_their_order_each_its_own_object(deque) -> None:
    buffer = deque()
    first = buffer.push({"key": "origin"})
    second = buffer.push({"key": "other"})
    got = buffer.sample(indices=[second.index, first.index, second.index])
    assert [g.data["key"] for g in got] == ["other", "origin", "other"]
    got[0].data["key"] = "new"
    assert got[2].data["key"] == "other"
    with pytest.raises(KeyError):
        buffer.sample(indices=["000000000099"])
    with pytest.raises(KeyError):
        buffer.sample(indices=[first.index], sample_range=slice(1, 2))


def test_repeated_draws_are_independent_objects(deque) -> None:
    buffer = deque(1)
    buffer.push({"key": "origin"})
    got = buffer.sample(2, replace=True)
    got[0].data["key"] = "new"
    assert got[1].data["key"] == "origin"


def test_update_changes_data_and_meta_for_every_process(deque, client, buffer_name) -> None:
    buffer = deque()
    buffered = buffer.push({"data": 0}, {"meta": 0})
    [item] = buffer.sample(1)
    item.data["new_prop"] = "any"
    assert buffer.update(item.index, item.data, item.meta)
    other = DequeBuffer(10, url=client, name=buffer_name)
    assert other.sample(1)[0].data == {"data": 0, "new_prop": "any"}
    assert buffer.update(buffered.index, meta={"meta": 5})  # data kept
    assert other.get(0).data == {"data": 0, "new_prop": "any"} and other.get(0).meta == {"meta": 5}
    assert buffer.update(buffered.index, data={"data": 9})  # meta kept
    assert other.get(0).data == {"data": 9} and other.get(0).meta == {"meta": 5}
    assert buffer.update(buffered.index)  # nothing to change: true, as DI-engine
    assert not buffer.update("invalidindex", {}, None)
    assert not buffer.update("000000000777", {}, None)


def test_update_after_another_process_changed_the_item(deque, client, buffer_name) -> None:
    buffer = deque()
    index = buffer.push({"v": 0}, {"m": 0}).index
    buffer.sample(1)  # this process remembers the record it drew
    DequeBuffer(10, url=client, name=buffer_name).update(index, {"v": 1})
    assert buffer.update(index, meta={"m": 1})  # compares, reads again, keeps v=1
    assert (buffer.get(0).data, buffer.get(0).meta) == ({"v": 1}, {"m": 1})


def test_delete_and_positions(deque) -> None:
    buffer = deque(100)
    for i in range(40):
        buffer.push(i)
    gone = [item.index for item in buffer.sample(20)]
    buffer.delete(gone)
    buffer.delete("000000000999")  # not there: skipped
    for i in range(10):
        buffer.push(100 + i)
    assert len(buffer) == len(buffer.indices) == len(buffer.storage) == 30
    for position in range(30):
        assert buffer.indices.get(buffer.storage[position].index) == position
    assert buffer.get(-1).data == 109 and buffer[0].data == min(
        i for i in range(40) if f"{i + 1:012d}" not in gone)
    assert not buffer.indices.has(gone[0]) and buffer.indices.has(buffer.get(0).index)
    with pytest.raises(IndexError):
        buffer.get(30)
    with pytest.raises(KeyError):
        buffer.get_by_index(gone[0])


def test_clear_keeps_indices_growing(deque) -> None:
    buffer = deque()
    buffer.push(0)
    buffer.clear()
    assert buffer.count() == 0 and buffer.push(1).index == "000000000002"


def test_groupby_returns_a_list_per_group(deque) -> None:
    buffer = deque(3)
    buffer.push("a", {"group": 1})
    buffer.push("b", {"group": 2})
    buffer.push("c", {"group": 2})
    groups = buffer.sample(2, groupby="group")
    assert sorted(sorted(item.data for item in group) for group in groups) == [["a"], ["b", "c"]]
    buffer.push("d", {"group": 2})  # a leaves: one group left
    [group] = buffer.sample(1, groupby="group")
    assert [item.data for item in group] == ["b", "c", "d"]  # oldest first
    with pytest.raises(ValueError, match="less than 2 groups"):
        buffer.sample(2, groupby="group")
    first = buffer.get(0)
    buffer.update(first.index, first.data, {"group": 1})
    assert len(buffer.sample(2, groupby="group")) == 2
    assert buffer.meta_index == {"group": [1, 2, 2]}


def test_unroll_len_gives_consecutive_items_of_one_group(deque) -> None:
    buffer = deque(100)
    for env, count in zip("ABC", (3, 4, 5), strict=True):
        for i in range(count):
            buffer.push(i, {"env": env})
    with pytest.raises(ValueError, match="There are less than"):
        buffer.sample(3, groupby="env", unroll_len=4)
    for groups in (buffer.sample(3, groupby="env", unroll_len=4, replace=True),
                   buffer.sample(2, groupby="env", unroll_len=4)):
        for group in groups:
            assert len(group) == 4 and len({item.meta["env"] for item in group}) == 1
            assert functools.reduce(lambda a, b: a and a.data + 1 == b.data and b, group)
    with pytest.raises(ValueError):  # no group of 6: nothing, which is too few
        buffer.sample(1, groupby="env", unroll_len=6)
    assert buffer.sample(1, groupby="env", unroll_len=6, ignore_insufficient=True) == []


def test_sliced_windows_start_on_multiples_of_unroll_len(client, buffer_name) -> None:
    buffer = DequeBuffer(100, sliced=True, url=client, name=buffer_name)
    for i in range(10):
        for env in "ABC":
            buffer.push(i, {"env": env})
    starts: Counter[int] = Counter()
    for _ in range(20):
        for group in buffer.sample(3, groupby="env", unroll_len=4):
            assert [item.data for item in group] == list(range(group[0].data,
                                                             group[0].data + 4))
            starts[group[0].data] += 1
    assert set(starts) <= {0, 4, 6}


def test_a_view_shares_the_items_not_the_middleware(deque) -> None:
    buffer = deque()
    buffer.push(1)
    calls = []
    view = buffer.view().use(lambda action, chain, *a, **k: calls.append(action) or chain(*a, **k))
    view.push(2)
    assert buffer.count() == 2 and calls == ["push"] and buffer._middleware == []


def test_a_user_middleware_runs_in_the_caller_and_may_stop_the_chain(deque) -> None:
    def add_10(action, chain, *args, **kwargs):
        if action == "sample":
            return [BufferedData(i.data + 10, i.index, i.meta) for i in chain(*args, **kwargs)]
        if action == "push" and args[0] < 0:
            return None  # refused: nothing stored
        return chain(*args, **kwargs)

    buffer = deque().use(add_10)
    assert buffer.push(-1) is None
    buffer.push(1)
    assert [i.data for i in buffer.sample(1)] == [11] and buffer.count() == 1


def test_iteration_and_dataloader(deque) -> None:
    buffer = deque()
    for i in range(10):
        buffer.push(i)
    assert [item.data for item in buffer] == list(range(10))
    loader = DataLoader(buffer, batch_size=6, shuffle=True, collate_fn=lambda batch: batch)
    sizes = [len(batch) for batch in loader]
    assert sorted(sizes) == [4, 6]
    assert sorted(i.data for batch in loader for i in batch) == list(range(10))


def test_save_and_load_data(deque, client, tmp_path) -> None:
    buffer = deque()
    for i in range(5):
        buffer.push({"t": torch.tensor([i])}, meta={"label": i})
    path = tmp_path / "sub" / "data.hkl"
    buffer.save_data(str(path))
    copy = DequeBuffer(10, url=client)
    copy.load_data(str(path))
    assert [(i.data["t"].item(), i.meta["label"]) for i in copy] == [(i, i) for i in range(5)]
    copy.meta_index = {"label": []}
    assert copy.meta_index == {"label": [0, 1, 2, 3, 4]}


def test_export_and_import(deque, client) -> None:
    buffer = deque()
    buffer.import_data([(1, {"a": 1}), ((2, 3), {})])
    assert [(i.data, i.meta) for i in buffer.export_data()] == [(1, {"a": 1}), ((2, 3), {})]


def test_shared_by_name_and_size_is_checked(deque, client, buffer_name) -> None:
    buffer = deque(10)
    buffer.push("x")
    assert DequeBuffer(10, url=client, name=buffer_name).sample(1)[0].data == "x"
    with pytest.raises(ConfigMismatchError):
        DequeBuffer(20, url=client, name=buffer_name)
    records = ReplayBuffer.open(client, buffer_name).get([1])
    assert records == [{"meta": {}, "data": "x"}]  # what other clients read


def test_a_private_buffer_is_dropped_with_its_last_object(client) -> None:
    buffer = DequeBuffer(4, url=client)
    view = buffer.view()
    name = buffer.name
    buffer.push(1)
    del buffer
    assert client.exists(f"rb:{{{name}}}:meta")
    del view
    import gc
    gc.collect()
    assert not client.keys(f"rb:{{{name}}}:*")


def test_unsupported_data_is_refused_and_nothing_stored(deque) -> None:
    buffer = deque()
    with pytest.raises(TypeError, match=r"\['data'\]\['x'\]: a value of type set"):
        buffer.push({"x": {1, 2}})
    assert buffer.count() == 0
