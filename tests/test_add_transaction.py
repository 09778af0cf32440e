"""An add is two calls: ``add_reserve`` (checks, ids), then one MULTI/EXEC of a native HSET
of the blobs and ``add_commit`` (the rest). What readers, refusals, a lost script, a lost
reply and orphaned blobs leave behind, on fakeredis and a real server; readers against
concurrent writer processes on a real server."""

from __future__ import annotations

import traceback
import uuid

import numpy as np
import pytest
import redis
from process_helpers import fresh_context
from test_bad_input import snapshot

from redisbuf import BufferKeys, ReplayBuffer
from redisbuf.control.ipc import MessageQueue
from redisbuf.errors import ConfigMismatchError, SchemaError
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import scripts
from redisbuf.store.containers import schema_to_json
from redisbuf.store.keys import format_id


def _batch(start: int, n: int, rewards=None) -> dict[str, np.ndarray]:
    return {
        "x": np.arange(start, start + n, dtype=np.float32).reshape(n, 1),
        "log_rewards": np.zeros(n) if rewards is None else np.asarray(rewards, np.float64),
    }


def _members(client, buffer: ReplayBuffer) -> tuple[set[int], set[int], set[int]]:
    keys = buffer.keys
    items = {int(k) for k in client.hkeys(keys.items)}
    order = {int(m) for m in client.zrange(keys.order, 0, -1)}
    prio = {int(m) for m in client.zrange(keys.prio, 0, -1)}
    return items, order, prio


def _reserve(buffer: ReplayBuffer, batch) -> tuple[int, list[bytes], list[str], str]:
    """Run add's first call alone: (first id, blobs, log-reward texts, schema json)."""
    blobs, log_rewards, schema = buffer.encode(batch)
    texts = [repr(float(v)) for v in log_rewards]
    schema_json = schema_to_json(schema)
    reply = scripts.load("add_reserve")(
        buffer.client, buffer.keys.all_keys(), [schema_json, len(blobs), "", *texts]
    )
    return int(reply[0]), blobs, texts, schema_json


@pytest.mark.parametrize("prioritized", [False, True])
def test_the_items_hash_holds_exactly_the_items_through_adds_and_evictions(
    client, buffer_name, prioritized
):
    buffer = ReplayBuffer(
        client, buffer_name, capacity=10, prioritized_capacity=prioritized,
        prioritized_sampling=prioritized,
    )
    rng = np.random.default_rng(0)
    for start in range(0, 60, 6):
        result = buffer.add(_batch(start, 6, rng.normal(size=6)))
        assert result.ids.tolist() == list(range(start + 1, start + 7))
    items, order, prio = _members(client, buffer)
    assert items == order == prio and len(items) == 10
    stats = buffer.stats()
    assert (stats["inserted"], stats["evicted"], stats["last_id"]) == (60, 50, 60)
    values = buffer.get(sorted(items))["x"][:, 0]
    assert values.tolist() == [float(i - 1) for i in sorted(items)]  # each blob at its id
    assert buffer.sample(4)["x"].shape == (4, 1)


def test_a_batch_refused_at_commit_gives_its_ids_back_and_leaves_the_buffer_as_it_was(
    client, buffer_name
):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    before = snapshot(client, buffer_name)
    first, blobs, texts, _schema_json = _reserve(buffer, _batch(3, 2))
    assert first == 4 and int(client.hget(buffer.keys.meta, "last_id")) == 5
    other = schema_to_json(buffer.encode({"y": np.zeros((2, 1), np.int8)})[2])
    # as if another process had fixed another schema between the two calls
    with pytest.raises(SchemaError):
        buffer._commit(first, blobs, texts, other, "", uuid.uuid4().hex)
    assert snapshot(client, buffer_name) == before  # blobs deleted, last_id back to 3


def test_a_refused_commit_after_a_later_reservation_leaves_only_a_gap(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    first, blobs, texts, _schema_json = _reserve(buffer, _batch(3, 2))
    later = buffer.add(_batch(5, 2))  # reserved (and stored) after the first reservation
    assert later.ids.tolist() == [6, 7]
    before = snapshot(client, buffer_name)
    other = schema_to_json(buffer.encode({"y": np.zeros((2, 1), np.int8)})[2])
    with pytest.raises(SchemaError):
        buffer._commit(first, blobs, texts, other, "", uuid.uuid4().hex)
    assert snapshot(client, buffer_name) == before  # ids 4 and 5 stay unused
    assert sorted(_members(client, buffer)[0]) == [1, 2, 3, 6, 7]


def test_a_buffer_dropped_between_reserve_and_commit_gets_no_key_back(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    first, blobs, texts, schema_json = _reserve(buffer, _batch(3, 2))
    ReplayBuffer(client, buffer_name, capacity=None).drop()
    with pytest.raises(ConfigMismatchError):
        buffer._commit(first, blobs, texts, schema_json, "", uuid.uuid4().hex)
    assert client.keys(f"rb:{{{buffer_name}}}*") == []


def test_noscript_inside_the_transaction_reruns_it_and_stores_the_batch_once(
    client, buffer_name, flush_scripts
):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    first, blobs, texts, schema_json = _reserve(buffer, _batch(3, 2))
    flush_scripts()  # a restarted server: the HSET runs, the script call finds nothing
    reply = buffer._commit(first, blobs, texts, schema_json, "", uuid.uuid4().hex)
    assert [int(v) for v in reply] == [4, 2, 0]
    items, order, _ = _members(client, buffer)
    assert items == order == {1, 2, 3, 4, 5}
    assert buffer.stats()["inserted"] == 5
    assert buffer.get([4, 5])["x"][:, 0].tolist() == [3.0, 4.0]


def test_blobs_whose_script_never_ran_are_deleted_by_the_next_add(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    first, blobs, _texts, _schema_json = _reserve(buffer, _batch(3, 2))
    # what a transaction leaves whose EVALSHA got NOSCRIPT, its writer dying before a retry
    client.hset(buffer.keys.items, mapping={format_id(first + i): b for i, b in enumerate(blobs)})
    assert client.hlen(buffer.keys.items) == 5
    assert buffer.add(_batch(10, 2)).ids.tolist() == [6, 7]
    items, order, _ = _members(client, buffer)
    assert items == order == {1, 2, 3, 6, 7}


def test_a_reply_lost_after_exec_is_not_stored_twice_nor_written_back_after_eviction(
    client, buffer_name, monkeypatch
):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    other = ReplayBuffer(client, buffer_name, capacity=4)
    original = redis.client.Pipeline.execute
    armed = [True]

    def cut_after_exec(self, *args, **kwargs):
        commit = any(command[0] == "EXEC" for command, _ in self.command_stack)
        result = original(self, *args, **kwargs)
        if armed[0] and commit:
            armed[0] = False
            other.add(_batch(100, 4))  # evicts the batch before the writer retries
            raise redis.exceptions.ConnectionError("connection cut after EXEC")
        return result

    monkeypatch.setattr(redis.client.Pipeline, "execute", cut_after_exec)
    result = buffer.add(_batch(0, 3))
    assert not armed[0]
    assert result.ids.tolist() == [1, 2, 3]  # the first run's reply
    items, order, _ = _members(client, buffer)
    assert items == order == {4, 5, 6, 7}  # no blob of the evicted batch came back
    stats = buffer.stats()
    assert (stats["inserted"], stats["evicted"], stats["length"]) == (7, 3, 4)


def test_a_refused_batch_reserves_nothing(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8, max_staleness=1)
    buffer.update_model_version("s", 5)
    buffer.add(_batch(0, 2), model_version=5, session_id="s")
    before = snapshot(client, buffer_name)
    result = buffer.add(_batch(2, 2), model_version=3, session_id="s")
    assert result.rejected == "stale" and len(result.ids) == 0
    after = snapshot(client, buffer_name)
    meta = BufferKeys(buffer_name).meta
    changed = {k for k in dict(after[meta][1]) if dict(before[meta][1]).get(k) != dict(
        after[meta][1])[k]}
    assert changed == {b"rejected_stale"}  # last_id included: unchanged
    assert buffer.add(_batch(4, 2), model_version=5, session_id="s").ids.tolist() == [3, 4]


# -- concurrent writer processes on a real server ----------------------------------------

BLOCK = 50  # items per batch; ids are reserved per batch, so every batch is one block


def _padded(writer: int, batch: int) -> dict[str, np.ndarray]:
    tags = np.array([[writer, batch, item] for item in range(BLOCK)], dtype=np.int64)
    return {"tag": tags, "pad": np.ones((BLOCK, 512), np.float32)}  # ~2 KiB per item


def _writer(url: str, name: str, index: int, batches: int, results: MessageQueue) -> None:
    try:
        buffer = ReplayBuffer(url, name, capacity=8 * BLOCK)
        for batch in range(batches):
            buffer.add(_padded(index, batch))
        results.put({"worker": index})
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put({"worker": index, "error": traceback.format_exc()})


@pytest.mark.multiprocess
@pytest.mark.redis_server
def test_readers_never_see_part_of_a_batch_while_four_processes_add():
    with EmbeddedServer() as server:
        name = f"tx-{uuid.uuid4().hex[:8]}"
        ReplayBuffer(server.url, name, capacity=8 * BLOCK)
        ctx = fresh_context()
        results = MessageQueue(ctx)
        writers = [
            ctx.Process(target=_writer, args=(server.url, name, index, 30, results))
            for index in range(4)
        ]
        for process in writers:
            process.start()
        keys = BufferKeys(name)
        client = redis.Redis.from_url(server.url)
        views = 0
        try:
            while any(process.is_alive() for process in writers) or views == 0:
                pipe = client.pipeline(transaction=True)  # one consistent view
                pipe.zrange(keys.order, 0, -1)
                pipe.hkeys(keys.items)
                pipe.zcard(keys.prio)
                pipe.hmget(keys.meta, "inserted", "evicted")
                order, fields, prio_count, (inserted, evicted) = pipe.execute()
                present = sorted(int(m) for m in order)
                assert sorted(int(f) for f in fields) == present  # no blob without its item
                # no log_rewards in the schema: no prio zset (lua/_common.lua rewards_kept)
                assert prio_count == 0 and len(present) <= 8 * BLOCK
                assert int(inserted or 0) - int(evicted or 0) == len(present)
                blocks: dict[int, int] = {}
                for item_id in present:
                    blocks[(item_id - 1) // BLOCK] = blocks.get((item_id - 1) // BLOCK, 0) + 1
                assert all(count == BLOCK for count in blocks.values()), blocks
                views += 1
            reports = [results.get(timeout=60) for _ in writers]
        finally:
            for process in writers:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
        errors = [r["error"] for r in reports if "error" in r]
        assert not errors, errors[0]
        assert views > 10
        buffer = ReplayBuffer(client, name, capacity=None)
        stats = buffer.stats()
        assert stats["inserted"] == 4 * 30 * BLOCK and len(buffer) == 8 * BLOCK
        tags = buffer.get(sorted(int(m) for m in client.zrange(keys.order, 0, -1)))["tag"]
        groups: dict[tuple[int, int], int] = {}
        for writer, batch, _item in tags.tolist():
            groups[(writer, batch)] = groups.get((writer, batch), 0) + 1
        assert set(groups.values()) == {BLOCK}  # each block holds one writer's batch


@pytest.mark.redis_server
@pytest.mark.parametrize("prioritized", [False, True])
def test_a_batch_refused_at_maxmemory_leaves_last_id_and_the_batch_memory_as_they_were(
    real_client, buffer_name, prioritized
):
    # issue 24: each add refused by OOM (its MULTI/EXEC, after its reservation) moved
    # last_id by its size and left an entry in the batch memory
    buffer = ReplayBuffer(
        real_client, buffer_name, capacity=100_000, prioritized_sampling=prioritized
    )
    big = {"x": np.zeros((64, 1024), np.float32), "log_rewards": np.zeros(64)}  # 256 KiB
    buffer.add(big)
    saved = {k: real_client.config_get(k)[k] for k in ("maxmemory", "maxmemory-policy")}
    try:
        used = real_client.info("memory")["used_memory"]
        real_client.config_set("maxmemory-policy", "noeviction")
        real_client.config_set("maxmemory", used + 512 * 1024)
        refusals = 0
        before = None
        for _ in range(12):
            try:
                buffer.add(big)
                before = None
            except redis.exceptions.OutOfMemoryError:
                refusals += 1
                after = snapshot(real_client, buffer_name)
                if before is not None:
                    assert after == before  # last_id, batches, items: all as they were
                before = after
                if refusals == 6:
                    break
        assert refusals == 6
    finally:
        for key, value in saved.items():
            real_client.config_set(key, value)
    stats = buffer.stats()
    assert stats["last_id"] == stats["inserted"] == len(buffer)  # no gap, no lost batch
    assert buffer.add(big).ids[0] == stats["last_id"] + 1


def test_a_refused_commit_is_released_once_and_never_takes_later_ids(client, buffer_name):
    # add_release.lua runs once per reservation (it deletes the reservation's entry
    # first): a second call, after another batch reserved as many ids, gives nothing back
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(_batch(0, 3))
    keys = buffer.keys
    release = [keys.meta, keys.items, keys.batches, keys.batches_old]
    client.hset(keys.batches, "B", "r[4,2]")  # what add_reserve.lua remembers for it
    client.hset(keys.meta, "last_id", 5)
    client.hset(keys.items, mapping={format_id(4): b"a", format_id(5): b"b"})
    assert scripts.load("add_release")(client, release, [4, 2, "B", 1]) == 1
    assert int(client.hget(keys.meta, "last_id")) == 3
    assert sorted(_members(client, buffer)[0]) == [1, 2, 3]
    assert buffer.add(_batch(3, 2)).ids.tolist() == [4, 5]  # ids 4, 5 again
    before = snapshot(client, buffer_name)
    assert scripts.load("add_release")(client, release, [4, 2, "B", 1]) == 0
    assert snapshot(client, buffer_name) == before
