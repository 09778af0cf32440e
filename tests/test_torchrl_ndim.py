"""redisbuf.torchrl: storages of ``ndim=2`` (TorchRL's multi-dimensional storages): a
collector's ``[N, T]`` batch stored as its items, row by row, the row shape the buffer's,
read back as whole rows, sampled as items."""

from __future__ import annotations

import uuid

import pytest
from process_helpers import fresh_context

pytest.importorskip("torchrl", reason="torchrl is not importable (pip install 'redisbuf[torchrl]')")

import torch  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torchrl.data import ReplayBuffer, TensorDictReplayBuffer  # noqa: E402
from torchrl.data.replay_buffers.writers import TensorDictMaxValueWriter  # noqa: E402

from redisbuf.errors import InvalidBatchError  # noqa: E402
from redisbuf.torchrl import ROW_SHAPE_FIELD, RedisbufStorage  # noqa: E402


@pytest.fixture
def name() -> str:
    return f"ndim-{uuid.uuid4().hex[:8]}"


def collected(envs: int, steps: int, start: int = 0) -> TensorDict:
    """A collector's batch [envs, steps]: step t of env e has x = start + 100 * e + t."""
    x = start + 100 * torch.arange(envs)[:, None] + torch.arange(steps)
    return TensorDict({"x": x, "next": {"obs": x[..., None] * torch.ones(2)}}, [envs, steps])


def test_a_collector_batch_reads_back_in_its_layout_and_samples_items(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 120, ndim=2),
                                batch_size=5)
    data = collected(3, 4)
    index = rb.extend(data)
    assert index.shape == (3, 4)  # ids in the layout of the data given
    assert len(rb) == 12
    assert torch.equal(rb[:]["x"], data["x"])  # TorchRL transposes the rows back
    assert torch.equal(rb.storage[index]["x"], data["x"])
    sample = rb.sample()
    assert sample.shape == (5,)
    by_id = dict(zip(index.reshape(-1).tolist(), data["x"].reshape(-1).tolist(), strict=True))
    assert sample["x"].tolist() == [by_id[i] for i in sample["index"].tolist()]
    # the rows the storage was given are time steps (dim_extend = ndim - 1): 3 items each
    assert client.hget(rb.storage.buffer.keys.meta, ROW_SHAPE_FIELD) == b"3"


def test_a_pytree_batch_of_two_dimensions(client, name):
    rb = ReplayBuffer(storage=RedisbufStorage(client, name, 60, ndim=2), batch_size=4)
    data = {"x": (torch.ones(3, 4, 2),), "y": [{"z": torch.arange(12.0).reshape(3, 4)}]}
    rb.extend(data)
    stored = rb[:]
    assert [leaf.shape for leaf in tree_flatten(stored)[0]] == [(3, 4, 2), (3, 4)]
    assert torch.equal(stored["y"][0]["z"], data["y"][0]["z"])
    assert [leaf.shape[0] for leaf in tree_flatten(rb.sample())[0]] == [4, 4]


def test_eviction_keeps_the_newest_items_and_a_slice_reads_whole_rows(client, name):
    # 10 items of capacity, rows of 3 items (3 environments): eviction goes item by item
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10, ndim=2))
    for start in (0, 1000):
        rb.extend(collected(3, 2, start))
    assert len(rb) == 10
    rows = rb[:]  # 3 whole rows of the 10 items; the oldest item, alone in its row, left out
    assert rows.shape == (3, 3)
    assert rows["x"].tolist() == [[1, 1000, 1001], [101, 1100, 1101], [201, 1200, 1201]]


def test_another_row_shape_is_refused_and_nothing_written(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 60, ndim=2))
    rb.extend(collected(3, 4))
    with pytest.raises(InvalidBatchError, match=r"rows of shape \[3\].*\[2\]"):
        rb.extend(collected(2, 4))
    with pytest.raises(InvalidBatchError, match="batches of 2 dimensions"):
        rb.storage._append(torch.zeros(5))
    assert len(rb) == 12


def test_a_refused_first_batch_leaves_no_row_shape(client, name):
    rb = TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 60, ndim=2))
    rb.extend(collected(3, 2))
    other = TensorDictReplayBuffer(storage=RedisbufStorage(client, f"{name}-b", 60, ndim=2))
    bad = TensorDict({"x": torch.zeros(2, 4, dtype=torch.int64),
                      "next": {"obs": torch.zeros(2, 4, 2)}, "y.z": torch.zeros(2, 4)}, [2, 4])
    with pytest.raises(InvalidBatchError, match="contains '.'"):
        other.extend(bad)
    meta = other.storage.buffer.keys.meta
    assert client.hget(meta, ROW_SHAPE_FIELD) is None and len(other) == 0


def test_constructor_and_writer_refusals(client, name):
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ndim"):
            RedisbufStorage(client, name, 10, ndim=bad)
    with pytest.raises(ValueError, match="more than one dimension"):
        TensorDictReplayBuffer(storage=RedisbufStorage(client, name, 10, ndim=2),
                               writer=TensorDictMaxValueWriter(rank_key="x")).extend(
                                   collected(2, 2))


def _extend_rows(url: str, name: str, envs: int, barrier, queue) -> None:
    try:
        rb = TensorDictReplayBuffer(storage=RedisbufStorage(url, name, 600, ndim=2))
        barrier.wait(timeout=120)
        rb.extend(collected(envs, 5))
        queue.put(("stored", envs))
    except InvalidBatchError as error:
        queue.put(("refused", envs, str(error)))
    except Exception as error:  # reported to the parent
        queue.put(("error", envs, repr(error)))


def test_two_processes_first_writing_other_rows_at_once(redis_server, name):
    """Both see no row shape, both claim theirs: exactly one wins, the other writes
    nothing, and a third process reads the winner's rows."""
    context = fresh_context()
    for attempt in range(3):
        buffer_name = f"{name}-{attempt}"
        barrier, queue = context.Barrier(2), context.Queue()
        workers = [context.Process(target=_extend_rows,
                                   args=(redis_server.url, buffer_name, envs, barrier, queue))
                   for envs in (2, 3)]
        for worker in workers:
            worker.start()
        outcomes = sorted(queue.get(timeout=180)[:2] for _ in workers)
        for worker in workers:
            worker.join(timeout=60)
        assert [kind for kind, _ in outcomes] == ["refused", "stored"], outcomes
        winner = [envs for kind, envs in outcomes if kind == "stored"][0]
        reader = TensorDictReplayBuffer(
            storage=RedisbufStorage(redis_server.url, buffer_name, ndim=2))
        assert len(reader) == 5 * winner
        assert reader[:].shape == (winner, 5)  # the winner's rows, in its layout
