"""A stored record that does not decode is set aside, and learners keep sampling (issue 33).

A foreign writer (FCALL ``rb_add`` on a real server, a raw HSET on fakeredis) stores
records that do not decode; every sample that draws one sets it aside in
``rb:{name}:quarantine``, counts it, warns naming it, and completes with decodable items;
nothing else of the buffer is lost.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from redisbuf import PERSampler, ReplayBuffer, ShardedReplayBuffer
from redisbuf.errors import DecodeError, MissingExtraError, QuarantinedRecordWarning
from redisbuf.store import codec, functions
from redisbuf.store.keys import BufferKeys, format_id

N = 16
TRUNCATED = b"\x82\xa1x\xc7"  # a msgpack map cut short
WRONG_FIELDS = codec.packb({"y": np.zeros(2, np.float32), "log_rewards": 0.0})

SAMPLERS = {
    "uniform": {},
    "softmax": {"prioritized_sampling": True},
    "per": {"sampler": PERSampler(alpha=0.6, beta=0.4)},
}


def _filled(client, name: str, sampler: str) -> ReplayBuffer:
    buffer = ReplayBuffer(client, name, capacity=64, seed=0, **SAMPLERS[sampler])
    x = np.arange(2 * N, dtype=np.float32).reshape(N, 2)
    buffer.add({"x": x, "log_rewards": np.linspace(-1.0, 0.0, N)})
    if sampler == "per":
        buffer.update_priority(np.arange(1, N + 1), np.linspace(0.5, 2.0, N))
    return buffer


def _quarantined_metric(client, name: str) -> float:
    """``redisbuf_quarantined_total`` of buffer ``name``, as Prometheus scrapes it."""
    from prometheus_client import CollectorRegistry

    from redisbuf.ops.metrics import BufferCollector

    registry = CollectorRegistry()
    registry.register(BufferCollector(client, [name]))
    value = registry.get_sample_value("redisbuf_quarantined_total",
                                      {"buffer": name, "class": "buffer"})
    assert value is not None
    return value


def _per_priorities(client, keys: BufferKeys, ids: list[int]) -> list[bytes | None]:
    return client.hmget(keys.per, [format_id(i) for i in ids])


def _sample_until_set_aside(buffer: ReplayBuffer, bad: set[int], n: int, replacement):
    """Sample until every bad id was set aside; each batch checked to hold its own ids'
    data. Returns the warnings' messages and the number of items returned."""
    messages: list[str] = []
    returned = 0
    for _ in range(200):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            info = buffer.sample_with_info(n, replacement=replacement)
        messages += [str(w.message) for w in caught if w.category is QuarantinedRecordWarning]
        ids = info.ids.tolist()
        assert len(ids) == n and not bad & set(ids)
        # each row is its own item's data (x of item i is [2(i-1), 2(i-1)+1])
        np.testing.assert_array_equal(info.batch["x"][:, 0], 2 * (info.ids - 1))
        if replacement is False:
            assert len(set(ids)) == n  # without replacement the redraw repeats nothing
        returned += n
        if buffer.stats()["quarantined"] == len(bad):
            return messages, returned
    raise AssertionError("the bad records were never drawn")


@pytest.mark.parametrize(("sampler", "replacement"), [
    ("uniform", False), ("uniform", True), ("softmax", False), ("softmax", True),
    ("per", None),
])
def test_records_written_raw_that_do_not_decode_are_set_aside(
    fake_client, buffer_name, sampler, replacement
):
    client = fake_client
    buffer = _filled(client, buffer_name, sampler)
    keys = buffer.keys
    good = [i for i in range(1, N + 1) if i not in (3, 7)]
    per_before = _per_priorities(client, keys, good)
    client.hset(keys.items, format_id(3), TRUNCATED)  # a foreign writer's garbage
    client.hset(keys.items, format_id(7), WRONG_FIELDS)
    n = 8 if replacement is not False else N - 2  # all that stays, without replacement
    messages, returned = _sample_until_set_aside(buffer, {3, 7}, n, replacement)

    assert len(messages) == 2 and all(keys.quarantine in m for m in messages)  # once each
    assert any("item 3 does not decode (DecodeError" in m for m in messages)
    assert any("item 7 does not decode" in m for m in messages)
    assert client.hgetall(keys.quarantine) == {format_id(3): TRUNCATED,
                                               format_id(7): WRONG_FIELDS}
    stats = buffer.stats()
    assert stats["quarantined"] == 2 and stats["length"] == N - 2
    assert stats["sampled"] == returned  # the draws taken back are not counted
    assert stats["inserted"] == N and stats["evicted"] == 0
    # nothing else is lost: every other item, its data and its PER priority
    assert buffer.get(good)["x"][:, 0].tolist() == [2.0 * (i - 1) for i in good]
    assert _per_priorities(client, keys, good) == per_before
    assert client.zcard(keys.order) == client.zcard(keys.prio) == N - 2
    assert client.zscore(keys.order, format_id(3)) is None
    with pytest.raises(KeyError, match="3"):
        buffer.get([3])
    assert _quarantined_metric(client, buffer_name) == 2.0
    # a fresh learner's replica does not know the records set aside either
    fresh = ReplayBuffer(client, buffer_name, capacity=64, seed=1, **SAMPLERS[sampler])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(20):
            assert not {3, 7} & set(fresh.sample_with_info(8, replacement=True).ids.tolist())


def test_max_use_keeps_the_decodable_part_of_the_draw(fake_client, buffer_name):
    """Under max_use a draw may use items up, so it is not taken back: the decodable
    items stay in the batch and only the bad record's position is drawn again."""
    buffer = ReplayBuffer(fake_client, buffer_name, capacity=64, max_use=1, seed=0)
    buffer.add({"x": np.arange(2 * 40, dtype=np.float32).reshape(40, 2)})
    fake_client.hset(buffer.keys.items, format_id(5), TRUNCATED)
    seen: list[int] = []
    with pytest.warns(QuarantinedRecordWarning, match="item 5 does not decode"):
        while buffer.stats()["quarantined"] == 0:
            info = buffer.sample_with_info(4)
            np.testing.assert_array_equal(info.batch["x"][:, 0], 2 * (info.ids - 1))
            seen += info.ids.tolist()
    assert 5 not in seen and len(seen) == len(set(seen))  # each item used once, as max_use
    assert len(buffer) == 40 - 1 - len(seen)  # the others used up, one set aside
    assert fake_client.hget(buffer.keys.quarantine, format_id(5)) == TRUNCATED


def test_a_failure_of_this_process_sets_nothing_aside(fake_client, buffer_name, monkeypatch):
    """A decode that fails for a reason of this process (an optional dependency missing)
    says nothing of the records: the sample raises DecodeError as before, and every
    record stays."""
    buffer = _filled(fake_client, buffer_name, "uniform")

    def missing(*args, **kwargs):
        raise MissingExtraError("pip install 'redisbuf[torch]'")

    monkeypatch.setattr(buffer, "_join", missing)
    with pytest.raises(DecodeError, match="MissingExtraError"):
        buffer.sample(4)
    assert buffer.stats()["quarantined"] == 0 and len(buffer) == N
    assert not fake_client.exists(buffer.keys.quarantine)


@pytest.mark.redis_server
@pytest.mark.parametrize("sampler", ["uniform", "per"])
def test_a_malformed_record_written_with_fcall_does_not_stop_a_learner(
    real_client, buffer_name, sampler
):
    """The issue's case: a foreign client writes with FCALL rb_add, which stores records
    without looking inside them; the learner keeps sampling."""
    client = real_client
    buffer = _filled(client, buffer_name, sampler)
    functions.install(client)
    keys = buffer.keys
    schema = client.hget(keys.meta, "schema")
    bad_record = b"\x93\x01\x02"  # msgpack [1, 2]: not a dict of the schema's fields
    reply = client.fcall("rb_add", len(keys.all_keys()), *keys.all_keys(),
                         schema, 2, "", bad_record, "0.5", TRUNCATED, "0.0")
    first = int(reply[0])
    bad = {first, first + 1}
    assert len(buffer) == N + 2
    messages, returned = _sample_until_set_aside(buffer, bad, 8, True)
    assert {f"item {i} does not decode" for i in bad} <= {m.split(" (")[0].split(": ", 1)[1]
                                                          for m in messages}
    assert client.hgetall(keys.quarantine) == {format_id(first): bad_record,
                                               format_id(first + 1): TRUNCATED}
    stats = buffer.stats()
    assert stats["quarantined"] == 2 and stats["length"] == N
    assert stats["sampled"] == returned
    assert buffer.sample(N)["x"].shape == (N, 2)  # every good item still there


# A foreign writer: redis-py and FCALL only, no redisbuf. It stores, per call, a copy of a
# good record and a record that does not decode (0xc1 is no msgpack type), then says done.
FOREIGN_WRITER = """
import sys, time, redis
url, name, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
client = redis.Redis.from_url(url)
keys = [f"rb:{{{name}}}:{s}" for s in ("meta", "items", "prio", "order", "perheap",
        "per", "uses", "versions", "times", "vecs",
        "batches", "batches:old", "masslog")]
schema = client.hget(keys[0], "schema")
good = client.hget(keys[1], "000000000001")
for i in range(count):
    client.fcall("rb_add", len(keys), *keys, schema, 2, "", good, "0.0",
                 b"\\xc1bad" + str(i).encode(), "0.0")
    time.sleep(0.01)
print("done", flush=True)
"""


@pytest.mark.redis_server
@pytest.mark.parametrize("sampler", ["uniform", "per"])
def test_a_learner_keeps_sampling_while_another_process_writes_garbage_with_fcall(
    redis_server, real_client, buffer_name, sampler
):
    import subprocess
    import sys

    assert BufferKeys(buffer_name).all_keys() == [
        f"rb:{{{buffer_name}}}:{s}" for s in ("meta", "items", "prio", "order", "perheap",
        "per", "uses", "versions", "times", "vecs",
        "batches", "batches:old", "masslog")]  # the writer's key list
    buffer = _filled(real_client, buffer_name, sampler)
    functions.install(real_client)
    count = 20
    writer = subprocess.Popen(
        [sys.executable, "-c", FOREIGN_WRITER, redis_server.url, buffer_name, str(count)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    returned = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        while writer.poll() is None or buffer.stats()["quarantined"] < count:
            batch = buffer.sample(8, replacement=True)
            returned += 8
            # every row is a good record's: x = [2k, 2k + 1]
            np.testing.assert_array_equal(batch["x"][:, 1], batch["x"][:, 0] + 1)
            assert returned < 200_000, "the bad records were never all drawn"
    out, err = writer.communicate()
    assert writer.returncode == 0 and out.strip() == "done", err
    assert sum(w.category is QuarantinedRecordWarning for w in caught) == count
    held = real_client.hgetall(buffer.keys.quarantine)
    assert sorted(held.values()) == sorted(b"\xc1bad" + str(i).encode() for i in range(count))
    stats = buffer.stats()
    assert stats["quarantined"] == count and stats["length"] == N + count  # the copies stay
    assert stats["inserted"] == N + 2 * count and stats["sampled"] == returned

@pytest.mark.parametrize("sampler", ["uniform", "softmax", "per"])
def test_a_sharded_buffer_sets_aside_in_the_shard_that_holds_the_record(
    fake_client, buffer_name, sampler
):
    buffer = ShardedReplayBuffer(fake_client, buffer_name, capacity=64, shards=2, seed=0,
                          **SAMPLERS[sampler])
    for start in (0, N):  # one add per shard
        x = np.arange(2 * start, 2 * (start + N), dtype=np.float32).reshape(N, 2)
        buffer.add({"x": x, "log_rewards": np.zeros(N)})
    shard = buffer.shards[1]
    local = int(fake_client.zrange(shard.keys.order, 0, 0)[0])
    fake_client.hset(shard.keys.items, format_id(local), TRUNCATED)
    bad = local * buffer.count + 1  # its global id
    returned = 0
    with pytest.warns(QuarantinedRecordWarning, match=f"item {local} does not decode"):
        while buffer.stats()["quarantined"] == 0:
            info = buffer.sample_with_info(8, replacement=True)
            assert bad not in info.ids.tolist()
            np.testing.assert_array_equal(buffer.get(info.ids)["x"], info.batch["x"])
            returned += 8
    stats = buffer.stats()
    assert stats["length"] == 2 * N - 1 and stats["sampled"] == returned
    assert fake_client.hgetall(shard.keys.quarantine) == {format_id(local): TRUNCATED}
    assert not fake_client.exists(buffer.shards[0].keys.quarantine)
