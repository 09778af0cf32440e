"""An add above one add's bound (redisbuf/buffers/staged.py): staged in slices, committed,
stored a slice at a time, and seen whole or not at all by every other call, on fakeredis
and a real server; a writer that dies while staging leaves nothing, one that dies after
its commit blocks nobody. The processes' interleavings are in test_large_add_processes.py."""

from __future__ import annotations

import numpy as np
import pytest
from key_contents import key_contents

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.buffers import staged
from redisbuf.errors import ApplyingError, ConfigMismatchError, InvalidBatchError
from redisbuf.store import bounds, functions, scripts
from redisbuf.store.keys import BufferKeys

N = 3 * bounds.MAX_ADD_ITEMS + 5  # four slices


def _items(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + n, dtype=np.int64),
            "log_rewards": np.arange(start, start + n, dtype=np.float64) / 10}


def _stray_keys(client, name: str) -> list[bytes]:
    """Keys of a large add still there: staged slices, or an add not stored whole."""
    return sorted(k for k in client.keys(f"rb:{{{name}}}:*")
                  if b":adding:" in k or b":applying" in k)


class WriterGone(Exception):
    """The writer 'dies' right after its commit (the worst moment)."""


@pytest.fixture
def dies_after_commit(monkeypatch):
    def die(client, keys):
        raise WriterGone

    monkeypatch.setattr(staged, "_store_the_rest", die)


def test_a_large_add_lands_whole_with_its_ids_values_and_evictions(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5000)
    buffer.add(_items(10, start=-10))
    result = buffer.add(_items(N))
    assert result.ids.tolist() == list(range(11, 11 + N)) and result.evicted == 0
    assert len(buffer) == 10 + N
    assert buffer.get(result.ids)["x"].tolist() == list(range(N))
    assert client.zscore(buffer.keys.prio, b"%012d" % (11 + N - 1)) == (N - 1) / 10
    # at capacity: the oldest go, the old items first, then the start of this add
    more = buffer.add(_items(4000, start=N))
    assert more.evicted == 10 + N + 4000 - 5000 and len(buffer) == 5000
    kept = sorted(int(m) for m in client.zrange(buffer.keys.order, 0, -1))
    assert kept == list(range(11 + N + 4000 - 5000, 11 + N + 4000))
    stats = buffer.stats()
    assert (stats["inserted"], stats["evicted"], stats["length"]) == (
        10 + N + 4000, more.evicted, 5000)
    assert _stray_keys(client, buffer_name) == []
    assert not client.hexists(buffer.keys.meta, "applying")


def test_a_large_add_keeps_its_per_priorities_and_a_schema_without_log_rewards(
    client, buffer_name
):
    per = ReplayBuffer(client, buffer_name, capacity=10_000, sampler=PERSampler())
    priorities = np.linspace(0.5, 3.0, N)
    ids = per.add(_items(N), priorities=priorities).ids
    assert np.allclose(per.priorities(ids), priorities)
    assert per.sample(64)["x"].shape == (64,)
    plain = ReplayBuffer(client, f"{buffer_name}-nested", capacity=10_000)
    got = plain.add([{"v": i, "name": str(i)} for i in range(N)])
    assert plain.get(got.ids[[0, -1]]) == [{"v": 0, "name": "0"}, {"v": N - 1, "name": str(N - 1)}]


def test_an_add_above_the_byte_bound_goes_in_slices_of_it(client, buffer_name, monkeypatch):
    monkeypatch.setattr(bounds, "MAX_ADD_BYTES", 256 * 1024)  # the client's; 4 KiB items
    buffer = ReplayBuffer(client, buffer_name, capacity=1000)
    rows = np.arange(200, dtype=np.float32)[:, None] * np.ones(1024, np.float32)
    ids = buffer.add({"x": rows, "log_rewards": np.zeros(200)}).ids
    assert buffer.get(ids)["x"][:, 0].tolist() == list(range(200))


def test_a_refused_large_add_writes_nothing_and_drops_its_slices(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10_000)
    buffer.add(_items(3))
    keys = buffer.keys.all_keys()
    before = key_contents(client, keys)
    with pytest.raises(ConfigMismatchError, match="PER"):  # priorities without PER
        buffer.add(_items(N), priorities=np.ones(N))
    with pytest.raises(InvalidBatchError):  # a NaN log-reward: refused before any send
        buffer.add({"x": np.arange(N), "log_rewards": np.r_[np.zeros(N - 1), np.nan]})
    assert key_contents(client, keys) == before and _stray_keys(client, buffer_name) == []
    stale = ReplayBuffer(client, f"{buffer_name}-v", capacity=10_000, max_staleness=1)
    stale.update_model_version("run", 5)
    refused = stale.add(_items(N), model_version=1, session_id="run")
    assert refused.rejected == "stale" and len(stale) == 0
    assert _stray_keys(client, f"{buffer_name}-v") == []


def test_a_writer_that_dies_while_staging_leaves_nothing_and_its_slices_expire(
    client, buffer_name, monkeypatch
):
    buffer = ReplayBuffer(client, buffer_name, capacity=10_000)
    buffer.add(_items(3))
    before = key_contents(client, buffer.keys.all_keys())
    stage = staged._stage

    def stage_one_slice_then_die(client, keys, batch_id, blobs, *rest):
        stage(client, keys, batch_id, blobs[: bounds.MAX_ADD_ITEMS], *rest)
        raise WriterGone

    monkeypatch.setattr(staged, "_stage", stage_one_slice_then_die)
    with pytest.raises(WriterGone):
        buffer.add(_items(N))
    assert key_contents(client, buffer.keys.all_keys()) == before
    left = _stray_keys(client, buffer_name)
    assert len(left) == 2 and all(b":adding:" in key for key in left)
    assert all(0 < client.pttl(key) <= staged.STAGE_TTL_MS for key in left)
    assert len(buffer) == 3 and len(buffer.sample(3)["x"]) == 3


def test_a_writer_that_dies_after_its_commit_blocks_nobody(client, buffer_name,
                                                           dies_after_commit):
    writer = ReplayBuffer(client, buffer_name, capacity=10_000, sampler=PERSampler())
    writer.add(_items(3))
    with pytest.raises(WriterGone):
        writer.add(_items(N, start=3))
    assert client.hexists(writer.keys.meta, "applying")
    # the first slice is in already: a native read sees it, no call does
    assert 3 < client.zcard(writer.keys.order) < 3 + N
    other = ReplayBuffer(client, buffer_name, capacity=10_000, sampler=PERSampler())
    assert len(other) == 3 + N  # stores the rest first
    assert not client.hexists(writer.keys.meta, "applying")
    assert sorted(other.get(np.arange(1, 4 + N))["x"].tolist()) == list(range(3 + N))
    assert len(other.sample(256)["x"]) == 256
    assert _stray_keys(client, buffer_name) == []
    # the writer's batch memory holds the whole add's reply
    memory = client.hgetall(writer.keys.batches)
    whole = [scripts.remembered(v, "add_staged") for v in memory.values()]
    assert [4, N, 0] in [w[:3] for w in whole if w is not None]


@pytest.mark.parametrize("call", ["sample", "update", "add", "stats", "clear"])
def test_every_call_on_the_buffer_stores_the_rest_first(client, buffer_name, dies_after_commit,
                                                        call):
    writer = ReplayBuffer(client, buffer_name, capacity=10_000, sampler=PERSampler())
    writer.add(_items(3))
    writer.sample(2)  # the replica is made before the add
    with pytest.raises(WriterGone):
        writer.add(_items(N, start=3))
    if call == "sample":
        # (its replica follows the whole add: ids past the first slice are drawn)
        info = writer.sample_with_info(512)
        assert info.ids.max() > 4 + bounds.MAX_ADD_ITEMS and info.ids.max() <= 3 + N
    elif call == "update":
        writer.update_priority(np.array([1, 3 + N]), np.array([5.0, 6.0]))
        assert writer.priorities([1, 3 + N]).tolist() == [5.0, 6.0]
    elif call == "add":
        assert writer.add(_items(2)).ids.tolist() == [4 + N, 5 + N]
        assert len(writer) == 5 + N
    elif call == "stats":
        assert writer.stats()["length"] == 3 + N
    else:
        assert writer.clear() == 3 + N and len(writer) == 0
    assert _stray_keys(client, buffer_name) == []


# Scripts on a replay buffer's keys (KEYS[1] its meta) that refuse while a large add is
# being stored; the others: the apply's own, staging, giving ids back, config and
# creation (no items read), drop, and the other structures' scripts.
GATED = {
    "add", "add_commit", "add_diverse", "add_reserve", "add_staged", "clear", "enable_per",
    "enable_softmax", "heap_build", "len", "manager_score", "masslog_read", "per_raise_max",
    "priority_read", "quarantine", "rate_limit", "remove", "replace", "replica_read",
    "restore", "restore_items", "sample_per", "sample_prioritized", "sample_select",
    "sample_uniform", "sample_window", "snapshot_commit", "stats", "undo_draws",
    "update_model_version", "update_priority",
}


def test_exactly_the_scripts_on_a_buffers_items_refuse_while_an_add_is_stored(fake_client):
    keys = BufferKeys("gate")
    refusing = set()
    for name in functions.script_names():
        # (add_apply finds no add and clears the flag: set again for each)
        fake_client.hset(keys.meta, mapping={"capacity": 10, "applying": "x"})
        script = scripts.load(name)
        low, high = script.keys or (1, None)
        count = max(low, min(high or 13, 13))
        names = [keys.meta, *keys.data_keys(), *keys.applying_keys(), keys.snap][:count]
        names += [f"rb:{{gate}}:extra{i}" for i in range(count - len(names))]
        try:
            script._run_once(fake_client, names, ["1"] * 8, None)
        except ApplyingError:
            refusing.add(name)
        except Exception:  # refused for its arguments, after the gate let it by
            pass
    assert refusing == GATED


def test_a_sharded_buffers_large_add_is_whole_on_its_shard(client, buffer_name,
                                                           dies_after_commit):
    from redisbuf import ShardedReplayBuffer

    writer = ShardedReplayBuffer(client, buffer_name, capacity=20_000, shards=2)
    writer.add(_items(4))  # on one shard; the large add goes to the other
    with pytest.raises(WriterGone):
        writer.add(_items(N, start=4))
    big = next(k for k, shard in enumerate(writer.shards)
               if client.hexists(shard.keys.meta, "applying"))
    reader = ShardedReplayBuffer(client, buffer_name, capacity=20_000, shards=2)
    assert len(reader) == 4 + N  # the shard's sizes: through its runner
    drawn = reader.sample_with_info(2048).ids
    assert (drawn % 2 == big).sum() > 1900  # (global id mod 2: its shard) N of 4 + N there
    assert all(_stray_keys(client, shard.name) == [] for shard in writer.shards)
