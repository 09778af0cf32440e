"""save / load / state_dict / load_state_dict of a ShardedReplayBuffer (fakeredis): each
shard's items, order, log-rewards, use counts and counters come back; files cross
between sharded and plain buffers and between shard counts; a file that cannot be
loaded changes no shard; a failure part way names the shards already restored. The
real-cluster round trip is in test_cluster.py."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest
from cluster_helpers import items, per_priorities_by_field
from test_bad_input import snapshot

from redisbuf import ReplayBuffer
from redisbuf.buffers.checkpoint import SAVE_FORMAT_VERSION
from redisbuf.buffers.sharded import ShardedReplayBuffer
from redisbuf.errors import (
    ConfigMismatchError,
    DecodeError,
    PartialLoadError,
    SchemaError,
    ServerUnavailableError,
)
from redisbuf.sampling.samplers import PERSampler
from redisbuf.store.keys import BufferKeys


def content(buffer) -> list[tuple[int, float, bytes, int]]:
    """(local id, log-reward, blob, use count) of every item of a plain buffer (or a
    shard), oldest first."""
    return [(i, s, b, u) for i, s, b, _per, u in buffer._records()]


def rows(buffer) -> list[tuple[float, bytes, int]]:
    """content() without the ids."""
    return [row[1:] for row in content(buffer)]


def counters(buffer) -> tuple[int, int, int, int]:
    stats = buffer.stats()
    return stats["inserted"], stats["evicted"], stats["sampled"], stats["length"]


def every_key(client, buffer) -> dict:
    """Every key of every shard and the layout hash, with content."""
    state = {}
    for shard in buffer.shards:
        state.update(snapshot(client, shard.name))
    state["layout"] = sorted(client.hgetall(BufferKeys(buffer.name).shards).items())
    return state


@pytest.fixture
def source(fake_client, buffer_name):
    """A 3-shard buffer (capacity 12, so 4 per shard) that has evicted, been sampled
    (use counts > 0) and holds -inf log-rewards."""
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=12, shards=3, seed=7)
    rng = np.random.default_rng(0)
    for start in range(0, 33, 3):
        rewards = rng.normal(size=3)
        rewards[1] = -np.inf
        buffer.add(items(np.arange(start, start + 3), rewards))
    for _ in range(3):
        buffer.sample(5)
    assert len(buffer) == 12 and buffer.stats()["evicted"] > 0
    assert any(u for shard in buffer.shards for *_, u in content(shard))
    return buffer


def test_round_trip_gives_every_shard_exactly_its_items_and_counters(
    fake_client, source, tmp_path
):
    path = tmp_path / "s.rb"
    before = [content(shard) for shard in source.shards]
    shard_counters = [counters(shard) for shard in source.shards]
    assert source.save(path) == 12
    with open(path, "rb") as handle:
        header, *records, trailer = list(msgpack.Unpacker(handle, raw=False))
    assert header["version"] == SAVE_FORMAT_VERSION and header["per"] is None
    assert header["capacity"] == 12 and header["shards"]["count"] == 3
    assert header["shards"]["capacities"] == [4, 4, 4]
    assert (*header["counters"].values(),) == counters(source)[:3]
    assert trailer == {"end": 12}
    # shard by shard, oldest first, global ids
    assert [r[0] for r in records] == [
        i * 3 + k for k, shard in enumerate(before) for i, *_ in shard
    ]

    copy = ShardedReplayBuffer(fake_client, "copy", capacity=12, shards=3)
    copy.add(items([100, 101]))  # replaced
    assert copy.load(path) == 12
    for k in range(3):
        assert rows(copy.shards[k]) == [row[1:] for row in before[k]]
        assert counters(copy.shards[k]) == shard_counters[k]
    assert counters(copy) == counters(source)
    # new ids, above every id the shard handed out: the global ids stay k mod 3
    ids = copy.state_dict()["ids"]
    assert [i % 3 for i in ids] == [r[0] % 3 for r in records]
    assert min(i for i, *_ in content(copy.shards[0])) > 0
    sample = copy.sample(12)
    assert sorted(sample["v"].tolist()) == sorted(source.sample(12)["v"].tolist())
    np.testing.assert_array_equal(copy.get(ids)["v"], source.get([r[0] for r in records])["v"])

    # back into the same buffer: ids above the ones it handed out
    last = {k: max(i for i, *_ in content(shard)) for k, shard in enumerate(source.shards)}
    assert source.load(path) == 12
    for k, shard in enumerate(source.shards):
        assert rows(shard) == [row[1:] for row in before[k]]
        assert min(i for i, *_ in content(shard)) > last[k]


def test_sharded_file_loads_into_a_plain_buffer_and_back(fake_client, source, tmp_path):
    path = tmp_path / "s.rb"
    source.save(path)
    everything = [row for shard in source.shards for row in rows(shard)]
    plain = ReplayBuffer(fake_client, "plain", capacity=12)
    assert plain.load(path) == 12
    assert rows(plain) == everything  # shard by shard, oldest first within a shard
    assert counters(plain) == counters(source)
    state = source.state_dict()
    other = ReplayBuffer(fake_client, "plain2", capacity=20)
    other.load_state_dict(state)
    assert rows(other) == everything and counters(other) == counters(source)

    # plain -> sharded: record j to shard j mod N, the totals the file's
    plain.save(tmp_path / "p.rb")
    again = ShardedReplayBuffer(fake_client, "again", capacity=12, shards=3)
    assert again.load(tmp_path / "p.rb") == 12
    for k in range(3):
        assert rows(again.shards[k]) == everything[k::3]
    assert counters(again) == counters(plain)
    for shard in again.shards:
        inserted, evicted, _sampled, length = counters(shard)
        assert inserted - evicted == length


def test_another_shard_count_spreads_the_records_in_order(fake_client, source, tmp_path):
    path = tmp_path / "s.rb"
    source.save(path)
    saved = [row for shard in source.shards for row in rows(shard)]
    inserted, evicted, sampled, _ = counters(source)
    for count in (2, 5):
        other = ShardedReplayBuffer(fake_client, f"n{count}", capacity=15, shards=count)
        assert other.load(path) == 12
        for k in range(count):
            assert rows(other.shards[k]) == saved[k::count]
        assert counters(other) == (inserted, evicted, sampled, 12)
        split = [counters(shard) for shard in other.shards]
        # evicted and sampled split as the capacity is: // count, the first % count one more
        assert [c[1] for c in split] == [
            evicted // count + (k < evicted % count) for k in range(count)
        ]
        assert [c[2] for c in split] == [
            sampled // count + (k < sampled % count) for k in range(count)
        ]
    # the same through state_dict
    one = ShardedReplayBuffer(fake_client, "one", capacity=12, shards=2)
    one.load_state_dict(source.state_dict())
    assert [rows(s) for s in one.shards] == [saved[0::2], saved[1::2]]


def test_a_shard_part_over_its_capacity_is_refused_and_changes_nothing(
    fake_client, source, tmp_path
):
    path = tmp_path / "s.rb"
    source.save(path)
    # 12 items into 3 shards of capacity 3, 3, 3 (4 each would go back)
    small = ShardedReplayBuffer(fake_client, "small", capacity=9, shards=3)
    small.add(items([1, 2]))
    before = every_key(fake_client, small)
    with pytest.raises(ConfigMismatchError, match="12 items in all, global capacity 9"):
        small.load(path)
    # the global capacity holds the items, one shard's saved part does not: 6 + 2 + 2
    # items back into shards of capacity 4 each
    lopsided = ShardedReplayBuffer(fake_client, "lopsided", capacity=30, shards=3, seed=2)
    for size in (6, 2, 2):
        lopsided.add(items(np.arange(size)))
    big = max(range(3), key=lambda k: len(lopsided.shards[k]))
    lopsided.save(path)
    uneven = ShardedReplayBuffer(fake_client, "uneven", capacity=12, shards=3)
    uneven.add(items([7]))
    uneven_before = every_key(fake_client, uneven)
    with pytest.raises(
        ConfigMismatchError, match=f"6 items for shard {big} .* capacity 4 .*its saved shard"
    ):
        uneven.load(path)
    with pytest.raises(ConfigMismatchError, match=f"for shard {big}"):
        uneven.load_state_dict(lopsided.state_dict())
    # spread over another shard count, a part never exceeds its shard when the whole fits
    spread = ShardedReplayBuffer(fake_client, "spread", capacity=10, shards=4)
    assert spread.load(path) == 10
    assert [len(s) for s in spread.shards] == [s.capacity for s in spread.shards] == [3, 3, 2, 2]
    assert every_key(fake_client, small) == before
    assert every_key(fake_client, uneven) == uneven_before


def _rewrite(path, change_header=None, change_records=None):
    with open(path, "rb") as handle:
        header, *records, trailer = list(msgpack.Unpacker(handle, raw=False))
    if change_header:
        change_header(header)
    if change_records:
        change_records(records)
    with open(path, "wb") as handle:
        for entry in (header, *records, trailer):
            handle.write(msgpack.packb(entry, use_bin_type=True))


def test_a_corrupt_or_truncated_file_changes_no_shard(fake_client, source, tmp_path):
    path = tmp_path / "s.rb"
    source.save(path)
    data = path.read_bytes()
    target = ShardedReplayBuffer(fake_client, "target", capacity=12, shards=3, seed=1)
    for start in range(0, 9, 3):
        target.add(items(np.arange(start, start + 3)))
    before = every_key(fake_client, target)

    def refused(error, match):
        with pytest.raises(error, match=match):
            target.load(path)
        assert every_key(fake_client, target) == before

    for cut in (len(data) - 1, len(data) // 2, 10):
        path.write_bytes(data[:cut])
        refused(DecodeError, "truncated|corrupt|not a redisbuf")
    path.write_bytes(b"")
    refused(DecodeError, "empty file")

    def bad_last_blob(records):
        records[-1][2] = b"\x00garbage"  # the last shard's part: checked before shard 0 is written

    for header_change, record_change, match in (
        (None, bad_last_blob, "target.shard2.*malformed"),
        (lambda h: h["shards"].update(count=0), None, "no valid shard count"),
        (lambda h: h["shards"].update(counters=[]), None, "does not have 3"),
        (lambda h: h["shards"]["counters"][1].update(sampled=-1), None, "sampled=-1"),
        (lambda h: h["counters"].update(inserted=h["counters"]["inserted"] + 1), None,
         "do not add up"),
        (None, lambda r: r[0].__setitem__(0, "x"), "not an integer"),
        (None, lambda r: r[-1].__setitem__(1, float("nan")), "NaN"),
    ):
        path.write_bytes(data)
        _rewrite(path, header_change, record_change)
        refused(DecodeError, match)
    # a schema that does not fit the buffer's
    path.write_bytes(data)
    other = ReplayBuffer(fake_client, "w", capacity=3)
    other.add({"w": np.arange(2.0), "log_rewards": np.zeros(2)})
    other.save(path)
    refused(SchemaError, "do not fit sharded buffer")


def test_randomly_corrupted_files_are_refused_whole_or_load_whole(
    fake_client, source, tmp_path
):
    """Bytes flipped at random: the load raises with every shard as it was, or (a
    corruption the checks cannot see, e.g. inside a log-reward) loads every shard."""
    path = tmp_path / "s.rb"
    source.save(path)
    data = bytearray(path.read_bytes())
    target = ShardedReplayBuffer(fake_client, "target", capacity=12, shards=3, seed=1)
    target.add(items([1, 2, 3]))
    rng = np.random.default_rng(3)
    refused = 0
    for _ in range(60):
        corrupt = bytearray(data)
        for position in rng.integers(0, len(data), size=int(rng.integers(1, 4))):
            corrupt[position] = int(rng.integers(256))
        path.write_bytes(bytes(corrupt))
        before = every_key(fake_client, target)
        try:
            target.load(path)
        except (DecodeError, SchemaError, ConfigMismatchError):
            refused += 1
            assert every_key(fake_client, target) == before
        else:
            assert [len(s) for s in target.shards] == [4, 4, 4]
    assert refused > 0


def test_per_priorities_are_refused_unless_dropped(fake_client, buffer_name, tmp_path):
    per = ReplayBuffer(fake_client, "per", capacity=6, sampler=PERSampler())
    per.add(items([1, 2, 3]), priorities=[1.0, 2.0, 3.0])
    per.save(tmp_path / "per.rb")
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=6, shards=2)
    with pytest.raises(ConfigMismatchError, match="drop_per_priorities=True"):
        buffer.load(tmp_path / "per.rb")
    assert len(buffer) == 0
    assert buffer.load(tmp_path / "per.rb", drop_per_priorities=True) == 3
    assert [len(s) for s in buffer.shards] == [2, 1]


def test_per_priorities_are_saved_and_restored_shard_by_shard(fake_client, buffer_name,
                                                              tmp_path):
    per = PERSampler(alpha=1.0, eps=0.0)
    source = ShardedReplayBuffer(fake_client, buffer_name, capacity=12, shards=3,
                                 sampler=per)
    ids: list[int] = []
    for start in range(0, 9, 3):  # a batch goes to one shard
        ids += source.add(items([start, start + 1, start + 2]),
                          priorities=[1.0 + start, 2.0 + start, 3.0 + start]).ids.tolist()
    source.update_priority(ids[:2], [0.25, 0.0])
    expected = dict(zip(ids, [0.25, 0.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0], strict=True))
    path = tmp_path / "per.rb"
    assert source.save(path) == 9
    state = source.state_dict()
    assert dict(zip(state["ids"], state["per_priorities"], strict=True)) == expected

    def priorities_by_value(buffer: ShardedReplayBuffer) -> dict[float, float]:
        return per_priorities_by_field(fake_client, buffer.shards, "v")

    before = priorities_by_value(source)
    assert sorted(before.values()) == sorted(expected.values())
    for target in (
        ShardedReplayBuffer(fake_client, "same", capacity=12, shards=3, sampler=per),
        ShardedReplayBuffer(fake_client, "spread", capacity=12, shards=2, sampler=per),
    ):
        assert target.load(path) == 9
        assert priorities_by_value(target) == before
        target.load_state_dict(state)
        assert priorities_by_value(target) == before
    plain = ReplayBuffer(fake_client, "plain", capacity=12, sampler=per)
    assert plain.load(path) == 9
    assert per_priorities_by_field(fake_client, [plain], "v") == before
    without = ShardedReplayBuffer(fake_client, "without", capacity=12, shards=3)
    with pytest.raises(ConfigMismatchError, match="drop_per_priorities=True"):
        without.load(path)
    assert without.load(path, drop_per_priorities=True) == 9


def test_a_failure_part_way_names_the_shards_already_restored(
    fake_client, source, tmp_path, monkeypatch
):
    path = tmp_path / "s.rb"
    source.save(path)
    target = ShardedReplayBuffer(fake_client, "target", capacity=12, shards=3, seed=1)
    for start in range(0, 9, 3):
        target.add(items(np.arange(start, start + 3)))
    before = [snapshot(fake_client, shard.name) for shard in target.shards]

    def lost(*args, **kwargs):
        raise ServerUnavailableError("lost the server")

    monkeypatch.setattr(target.shards[2], "_apply_restore", lost)
    with pytest.raises(PartialLoadError, match=r"restored shard\(s\) 0, 1 of 3, then failed "
                       r"on shard 2") as caught:
        target.load(path)
    assert (caught.value.restored, caught.value.failed) == ([0, 1], 2)
    assert isinstance(caught.value.__cause__, ServerUnavailableError)
    for k in (0, 1):
        assert rows(target.shards[k]) == rows(source.shards[k])
    assert snapshot(fake_client, target.shards[2].name) == before[2]
    # the first shard failing: its own error, every shard as it was
    monkeypatch.undo()
    again = ShardedReplayBuffer.open(fake_client, "target")
    states = [snapshot(fake_client, shard.name) for shard in again.shards]
    monkeypatch.setattr(again.shards[0], "_apply_restore", lost)
    with pytest.raises(ServerUnavailableError, match="lost the server"):
        again.load(path)
    assert [snapshot(fake_client, shard.name) for shard in again.shards] == states


def test_progress_is_reported_for_save_and_load(fake_client, buffer_name, tmp_path):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=3000, shards=2)
    for _ in range(5):
        buffer.add(items(np.arange(500)))
    saves, loads = [], []
    assert buffer.save(tmp_path / "s.rb", progress=lambda *a: saves.append(a)) == 2500
    assert saves[0] == (1000, 2500) and saves[-1] == (2500, 2500)
    other = ShardedReplayBuffer(fake_client, "other", capacity=3000, shards=2)
    assert other.load(tmp_path / "s.rb", progress=lambda *a: loads.append(a)) == 2500
    done = [d for d, _total in loads]
    assert done == sorted(done) and loads[-1] == (2500, 2500)
    assert {total for _done, total in loads} == {2500} and len(loads) >= 4


def test_an_empty_buffer_round_trips_and_a_schemaless_target_takes_the_schema(
    fake_client, source, tmp_path
):
    empty = ShardedReplayBuffer(fake_client, "empty", capacity=6, shards=2)
    assert empty.save(tmp_path / "e.rb") == 0
    assert empty.state_dict()["ids"] == []
    target = ShardedReplayBuffer(fake_client, "target", capacity=12, shards=3)
    assert target.load(tmp_path / "e.rb") == 0 and len(target) == 0
    source.save(tmp_path / "s.rb")
    target.load(tmp_path / "s.rb")
    with pytest.raises(SchemaError, match="does not fit sharded buffer"):
        target.add({"w": np.arange(2.0), "log_rewards": np.zeros(2)})
    assert len(target) == 12
