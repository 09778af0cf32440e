"""save / load and state_dict / load_state_dict: items, priorities, order and counters
survive; files that cannot be trusted are refused and leave the buffer as it was."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from test_bad_input import snapshot
from test_sampling import assert_matches_softmax, assert_tree_consistent

from redisbuf import BufferKeys, ReplayBuffer, Trajectories
from redisbuf.buffers.checkpoint import SAVE_FORMAT_VERSION
from redisbuf.errors import ConfigMismatchError, DecodeError, SchemaError


def _content(client, name: str) -> list[tuple[float, bytes]]:
    """(priority, blob) of every item, in insertion order."""
    keys = BufferKeys(name)
    members = client.zrange(keys.order, 0, -1)
    if not members:
        return []
    blobs = client.hmget(keys.items, members)
    scores = client.zmscore(keys.prio, members)
    return list(zip(scores, blobs, strict=True))


def _counters(buffer: ReplayBuffer) -> tuple[int, int, int, int]:
    stats = buffer.stats()
    return stats["inserted"], stats["evicted"], stats["sampled"], stats["length"]


@pytest.fixture
def source(client, buffer_name):
    """A prioritized buffer that has evicted, been sampled, and holds -inf items."""
    buffer = ReplayBuffer(
        client, buffer_name, capacity=12, prioritized_capacity=True, seed=0
    )
    rng = np.random.default_rng(0)
    for start in range(0, 20, 5):
        rewards = rng.normal(size=5)
        rewards[0] = -np.inf if start else rewards[0]
        buffer.add({"x": np.arange(start, start + 5, dtype=np.int32)[:, None].repeat(3, 1),
                    "log_rewards": rewards})
    buffer.sample(7)
    return buffer


def _assert_same(client, original, restored, content, counters):
    assert _content(client, restored.name) == content
    assert _counters(restored) == counters
    assert restored.kind == original.kind
    stats = restored.stats()
    assert stats["inserted"] - stats["evicted"] == stats["length"]


def test_save_load_round_trip_into_a_new_buffer(client, source, tmp_path):
    content, counters = _content(client, source.name), _counters(source)
    assert counters == (20, 8, 7, 12)
    path = tmp_path / "buffer.rbuf"
    assert source.save(path) == 12
    restored = ReplayBuffer(client, source.name + "-copy", capacity=12, prioritized_capacity=True)
    assert restored.load(path) == 12
    _assert_same(client, source, restored, content, counters)
    assert [s for _, s in restored.top(12)] == [s for _, s in source.top(12)]


def test_load_replaces_the_current_items(client, source, tmp_path):
    content, counters = _content(client, source.name), _counters(source)
    path = tmp_path / "buffer.rbuf"
    source.save(path)
    last_id = source.stats()["last_id"]
    source.clear()
    source.add({"x": np.zeros((2, 3), np.int32), "log_rewards": np.zeros(2)})
    assert source.load(path) == 12
    _assert_same(client, source, source, content, counters)
    ids = [int(m) for m in client.zrange(source.keys.order, 0, -1)]
    assert min(ids) > last_id + 2  # restored items get new ids; ids are never reused


def test_state_dict_round_trip(client, source):
    content, counters = _content(client, source.name), _counters(source)
    state = source.state_dict()
    assert state["version"] == SAVE_FORMAT_VERSION and len(state["blobs"]) == 12
    assert state["priorities"] == [p for p, _ in content]
    packed = msgpack.packb(state, use_bin_type=True)  # plain data: no pickle needed
    restored = ReplayBuffer(client, source.name + "-sd", capacity=12, prioritized_capacity=True)
    restored.load_state_dict(msgpack.unpackb(packed, raw=False))
    _assert_same(client, source, restored, content, counters)


def test_round_trip_keeps_prioritized_sampling_right(client, source, tmp_path):
    path = tmp_path / "buffer.rbuf"
    source.save(path)
    restored = ReplayBuffer(
        client, source.name + "-p", capacity=12, prioritized_capacity=True,
        prioritized_sampling=True, seed=1,
    )
    restored.load(path)
    assert_tree_consistent(client, restored.name)
    assert_matches_softmax(client, restored, draws=10000)


def test_trajectories_round_trip(client, buffer_name, tmp_path):
    states = np.arange(4 * 3 * 2, dtype=np.float32).reshape(4, 3, 2)
    actions = np.arange(9, dtype=np.int64).reshape(3, 3)
    states[2:, 1] = -1.0  # padded as the output will be: lengths 3, 1, 0
    states[1:, 2] = -1.0
    batch = Trajectories(states, actions, np.array([3, 1, 0]), states_pad_value=-1.0)
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(batch)
    path = tmp_path / "t.rbuf"
    buffer.save(path)
    restored = ReplayBuffer(client, buffer_name + "-t", capacity=5)
    restored.load(path)
    out = restored.get([int(m) for m in client.zrange(restored.keys.order, 0, -1)])
    np.testing.assert_array_equal(out.terminating_idx, [3, 1, 0])
    np.testing.assert_array_equal(out.states, states)
    assert out.states_pad_value == -1.0


def test_empty_buffer_round_trip(client, buffer_name, tmp_path):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    path = tmp_path / "empty.rbuf"
    assert buffer.save(path) == 0
    other = ReplayBuffer(client, buffer_name + "-e", capacity=5)
    other.add({"x": np.zeros(1)})
    assert other.load(path) == 0
    assert len(other) == 0


# -- refused files ------------------------------------------------------------------------


def _rewrite_header(path, **changes):
    unpacker = msgpack.Unpacker(open(path, "rb"), raw=False)
    header = next(unpacker)
    rest = list(unpacker)
    header.update(changes)
    with open(path, "wb") as handle:
        handle.write(msgpack.packb(header, use_bin_type=True))
        for record in rest:
            handle.write(msgpack.packb(record, use_bin_type=True))


def test_newer_format_version_is_refused(client, source, tmp_path):
    path = tmp_path / "new.rbuf"
    source.save(path)
    _rewrite_header(path, version=SAVE_FORMAT_VERSION + 1)
    before = snapshot(client, source.name)
    with pytest.raises(DecodeError, match="newer") as info:
        source.load(path)
    assert f"version {SAVE_FORMAT_VERSION + 1}" in str(info.value) and "upgrade" in str(info.value)
    state = source.state_dict()
    state["version"] = 99
    with pytest.raises(DecodeError, match="newer"):
        source.load_state_dict(state)
    assert snapshot(client, source.name) == before


@pytest.mark.parametrize(
    "data",
    [b"", b"garbage", msgpack.packb({"format": "other", "version": 1}), msgpack.packb([1, 2])],
    ids=["empty", "garbage", "foreign-header", "not-a-header"],
)
def test_foreign_files_are_refused(client, source, tmp_path, data):
    path = tmp_path / "foreign.rbuf"
    path.write_bytes(data)
    before = snapshot(client, source.name)
    with pytest.raises(DecodeError):
        source.load(path)
    assert snapshot(client, source.name) == before


def test_truncated_header_is_refused(client, source, tmp_path):
    path = tmp_path / "cut.rbuf"
    source.save(path)
    data = path.read_bytes()
    header_size = len(msgpack.packb(next(msgpack.Unpacker(open(path, "rb"), raw=False)),
                                    use_bin_type=True))
    before = snapshot(client, source.name)
    for cut in range(1, header_size, 7):
        path.write_bytes(data[:cut])
        with pytest.raises(DecodeError):
            source.load(path)
    assert snapshot(client, source.name) == before


@pytest.mark.parametrize("where", ["mid-record", "record-boundary"])
def test_truncated_records_are_refused(client, source, tmp_path, where):
    path = tmp_path / "cut.rbuf"
    source.save(path)
    data = path.read_bytes()
    unpacker = msgpack.Unpacker(raw=False)
    unpacker.feed(data)
    boundaries = []
    for _ in unpacker:
        boundaries.append(unpacker.tell())
    # boundaries[-1] ends the trailer, [-2] the last record, [-3] the one before it
    cut = boundaries[-2] if where == "record-boundary" else boundaries[-3] + 10
    path.write_bytes(data[:cut])
    target = ReplayBuffer(client, source.name + "-cut", capacity=12, prioritized_capacity=True)
    target.add({"x": np.ones((1, 3), np.int32), "log_rewards": np.zeros(1)})
    before = snapshot(client, target.name)
    try:
        with pytest.raises(DecodeError):
            target.load(path)
    finally:
        assert snapshot(client, target.name) == before


def test_file_that_does_not_fit_is_refused(client, source, tmp_path):
    path = tmp_path / "buffer.rbuf"
    source.save(path)
    small = ReplayBuffer(client, source.name + "-small", capacity=5, prioritized_capacity=True)
    before = snapshot(client, small.name)
    with pytest.raises(ConfigMismatchError, match="capacity 5"):
        small.load(path)
    assert snapshot(client, small.name) == before
    other = ReplayBuffer(client, source.name + "-schema", capacity=20)
    other.add({"x": np.zeros((1, 3), np.float32)})  # float32, the file holds int32
    before = snapshot(client, other.name)
    with pytest.raises(SchemaError, match="int32"):
        other.load(path)
    assert snapshot(client, other.name) == before


def test_save_and_load_report_progress_per_chunk_of_1000(client, buffer_name, tmp_path):
    buffer = ReplayBuffer(client, buffer_name, capacity=3000)
    for start in (0, 1000, 2000):  # one add stores at most bounds.MAX_ADD_ITEMS items
        buffer.add({"x": np.arange(start, min(start + 1000, 2500), dtype=np.int64)})
    saved: list[tuple[int, int]] = []
    path = tmp_path / "big.rbuf"
    assert buffer.save(path, progress=lambda done, total: saved.append((done, total))) == 2500
    assert saved == [(1000, 2500), (2000, 2500), (2500, 2500)]
    loaded: list[tuple[int, int]] = []
    copy = ReplayBuffer(client, buffer_name + "-copy", capacity=3000)
    assert copy.load(path, progress=lambda done, total: loaded.append((done, total))) == 2500
    # three chunks built under the staging keys, then the swap
    assert loaded == [(1000, 2500), (2000, 2500), (2500, 2500), (2500, 2500)]
    ids = [int(i) for i in client.zrange(copy.keys.order, 0, -1)]
    assert copy.get(ids)["x"].tolist() == list(range(2500))
