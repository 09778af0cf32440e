"""redisbuf.torchrl: pytrees (dicts, lists and tuples of tensors a TensorDict cannot hold)
stored exactly, read back as the same nest by every process, refused whole otherwise."""

from __future__ import annotations

import json
import uuid

import pytest
from process_helpers import fresh_context

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torch.utils._pytree import tree_flatten, tree_map  # noqa: E402
from torchrl.data import ReplayBuffer  # noqa: E402

from redisbuf.errors import InvalidBatchError, SchemaError  # noqa: E402
from redisbuf.torchrl import ListStackError, RedisbufStorage  # noqa: E402


@pytest.fixture
def name() -> str:
    return f"trees-{uuid.uuid4().hex[:8]}"


def tree(n: int, start: int = 0) -> dict:
    """Leaves in tree_flatten order: b (int key first), a, c.[0] ... c.[10], c.[11].(0)."""
    rows = torch.arange(start, start + n)
    return {
        "b": rows[:, None] * 1.0,
        30: rows.to(torch.int16),
        "a": {"c": [rows[:, None] + i for i in range(11)] + [(rows.to(torch.bool),)]},
    }


def same_tree(got, want) -> None:
    got_leaves, got_spec = tree_flatten(got)
    want_leaves, want_spec = tree_flatten(want)
    assert got_spec == want_spec
    for g, w in zip(got_leaves, want_leaves, strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_a_pytree_reads_back_as_the_same_nest_in_the_same_order(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 100), batch_size=4)
    index = rb.extend(tree(6))
    assert len(rb) == 6
    same_tree(rb[index[[4, 1]]], tree_map(lambda leaf: leaf[[4, 1]], tree(6)))
    sample, info = rb.sample(return_info=True)
    rows = (info["index"] - int(index[0])).tolist()
    same_tree(sample, tree_map(lambda leaf: leaf[rows], tree(6)))
    rb.add(tree_map(lambda leaf: leaf[0], tree(1, start=6)))
    same_tree(rb[[int(index[-1]) + 1]], tree(1, start=6))


def test_a_tuple_root_and_its_fields_on_the_server(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    obs, act = torch.randn(3, 4), torch.tensor([0, 1, 1])
    index = rb.extend((obs, [act]))
    got = rb[index]
    assert isinstance(got, tuple) and isinstance(got[1], list)
    assert torch.equal(got[0], obs) and torch.equal(got[1][0], act)
    # a person reading the buffer with redis-cli sees each leaf's number and path
    schema = json.loads(client.hget(rb.storage.buffer.keys.meta, "schema"))
    assert sorted(schema["fields"]) == ["0.(0)", "1.(1).[0]"]


def test_a_mapping_with_string_keys_only_still_reads_as_a_tensordict(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    index = rb.extend({"x": torch.arange(3), "next": {"r": torch.ones(3)}})
    got = rb[index]
    assert isinstance(got, TensorDict) and got["next", "r"].tolist() == [1.0] * 3


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"a": torch.zeros(3), 1.5: torch.zeros(3)}, "strings or ints"),
        ({"a": torch.zeros(3), "b": [torch.zeros(2)]}, "same leading batch dimension"),
        ({"a": torch.zeros(3), "b": ()}, "empty tuple"),
        ({"a": torch.zeros(3), "b": [None]}, "NoneType"),
        ({"a": torch.zeros(3), 2: {"x.y": torch.zeros(3)}}, "contains '.'"),
        ({"a": torch.zeros(3), 2: {"[0]": torch.zeros(3)}}, "list index"),
        ({"a": torch.zeros(3), "b": (torch.zeros(()),)}, "same leading batch dimension"),
    ],
)
def test_a_tree_that_cannot_be_stored_is_refused_and_nothing_written(client, name, data, message):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    with pytest.raises(InvalidBatchError, match=message):
        rb.extend(data)
    assert len(rb) == 0


def test_a_tensordict_key_shaped_like_a_list_index_is_refused(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    with pytest.raises(InvalidBatchError, match="int key"):
        rb.extend(TensorDict({"<3>": torch.zeros(2)}, [2]))
    assert len(rb) == 0


def test_another_nest_than_the_stored_one_is_refused(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    rb.extend(tree(2))
    with pytest.raises(SchemaError):
        rb.extend({"b": torch.zeros(2, 1), 30: torch.zeros(2, dtype=torch.int16),
                   "a": {"c": (torch.zeros(2, 1),)}})  # a tuple where a list was stored
    assert len(rb) == 2


def _write_tree(url: str, name: str, queue) -> None:
    try:
        ReplayBuffer(storage=RedisbufStorage(url, name)).extend(tree(5, start=100))
        queue.put("ok")
    except Exception as error:  # reported to the parent
        queue.put(repr(error))


def test_a_tree_written_by_another_process_reads_back_here(redis_server, name):
    url = redis_server.url
    rb = ReplayBuffer(storage=RedisbufStorage(url, name, 50), batch_size=5)
    context = fresh_context()
    queue = context.Queue()
    writer = context.Process(target=_write_tree, args=(url, name, queue))
    writer.start()
    assert queue.get(timeout=120) == "ok"
    writer.join(timeout=60)
    same_tree(rb[:], tree(5, start=100))


def test_one_id_and_iteration_give_items_without_the_batch_dimension(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 10), batch_size=2)
    index = rb.extend(tree(3))
    same_tree(rb[int(index[1])], tree_map(lambda leaf: leaf[1], tree(3)))
    items = list(rb.storage)
    assert len(items) == 3
    for row, item in enumerate(items):
        same_tree(item, tree_map(lambda leaf, row=row: leaf[row], tree(3)))


def test_a_list_of_pytree_items_is_stacked_into_one_batch(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 20), batch_size=4)
    items = [(torch.full((2,), i), {"a": torch.tensor(i)}, [torch.full((3,), i)])
             for i in range(6)]
    index = rb.extend(items)
    got = rb[index]
    assert isinstance(got, tuple) and isinstance(got[2], list)
    assert got[1]["a"].tolist() == list(range(6)) and got[2][0][:, 0].tolist() == list(range(6))


def test_a_list_that_cannot_be_stacked_raises_torchrls_runtime_error(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 20), batch_size=4)
    with pytest.raises(ListStackError, match="Stacking the elements of the list") as raised:
        rb.extend([torch.zeros(4), torch.zeros(1)])
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, InvalidBatchError)
    with pytest.raises(ListStackError):
        rb.extend([{"a": torch.zeros(2), 3: torch.zeros(1)}, {"a": torch.zeros(2)}])
    assert len(rb) == 0
