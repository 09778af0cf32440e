"""The fault probe's defects (issue 13), each pinned by a test that failed before its fix."""

from __future__ import annotations

import threading
import time
import uuid
import warnings
from pathlib import Path

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from key_contents import key_contents
from test_per import assert_matches, per_scores

import redisbuf
from redisbuf import ReplayBuffer, ShardedReplayBuffer
from redisbuf.errors import (
    ConfigMismatchError,
    DecodeError,
    EmptyBufferError,
    SchemaError,
    ServerConfigError,
    ServerFullError,
    ServerUnavailableError,
)
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import codec
from redisbuf.store.keys import BufferKeys, format_id

# -- 1. every decode path raises DecodeError naming buffer, key and id --------------------


def _with_shape(blob: bytes, shape: tuple[int, ...]) -> bytes:
    """``blob`` (one float32 array field) with its declared shape rewritten in place."""
    item = codec.unpackb(blob)
    (name, array), = item.items()
    good = codec.packb({name: array})
    head = good.index(np.asarray(array.shape, "<u8").tobytes())
    raw = np.asarray(shape, "<u8").tobytes()
    assert len(raw) == 8 * array.ndim
    return good[:head] + raw + good[head + len(raw) :]


@pytest.mark.parametrize("ids", [[2], [1, 2], [2, 3], [1, 2, 3]])
def test_blob_whose_shape_does_not_fit_its_payload_is_a_decode_error(client, buffer_name, ids):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.arange(18, dtype=np.float32).reshape(3, 3, 2)})
    keys = BufferKeys(buffer_name)
    blob = client.hget(keys.items, format_id(2))
    client.hset(keys.items, format_id(2), _with_shape(blob, (4, 2)))  # 8 values, payload 6
    with pytest.raises(DecodeError) as info:
        buffer.get(ids)
    message = str(info.value)
    assert buffer_name in message and keys.items in message and "id 2" in message
    assert buffer.get([1, 3])["x"].shape == (2, 3, 2)


def test_blob_with_an_odd_shape_in_a_same_layout_batch_is_a_decode_error(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((3, 6), np.float32)})
    keys = BufferKeys(buffer_name)
    blob = client.hget(keys.items, format_id(2))
    client.hset(keys.items, format_id(2), _with_shape(blob, (3,)))  # same size, other shape
    with pytest.raises(DecodeError, match="id 2"):
        buffer.get([1, 2, 3])


@pytest.mark.parametrize("value", ["a string", 7, None, [1.0, 2.0], {"k": 1}, b"bytes"])
def test_record_with_a_non_array_where_an_array_belongs_is_a_decode_error(
    client, buffer_name, value
):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((3, 2), np.float32), "log_rewards": np.zeros(3)})
    keys = BufferKeys(buffer_name)
    client.hset(keys.items, format_id(2), codec.packb({"x": value, "log_rewards": 0.0}))
    for ids in ([2], [1, 2], [1, 2, 3]):
        with pytest.raises(DecodeError) as info:
            buffer.get(ids)
        assert buffer_name in str(info.value) and "id 2" in str(info.value)
    assert buffer.get([1, 3])["x"].shape == (2, 2)


def test_trajectory_record_with_a_string_for_states_is_a_decode_error(client, buffer_name):
    from redisbuf import Trajectories

    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add(
        Trajectories(
            states=np.zeros((4, 3, 2), np.float32),
            actions=np.zeros((3, 3), np.int64),
            terminating_idx=np.array([1, 2, 3]),
            log_rewards=np.zeros(3),
        )
    )
    keys = BufferKeys(buffer_name)
    item = codec.unpackb(client.hget(keys.items, format_id(2)))
    item["states"] = "not an array"
    client.hset(keys.items, format_id(2), codec.packb(item))
    with pytest.raises(DecodeError) as info:
        buffer.get([1, 2, 3])
    assert buffer_name in str(info.value) and "id 2" in str(info.value)
    assert buffer.get([1, 3]).log_rewards.shape[0] == 2


# -- 3. a sample racing drop() recreates nothing -----------------------------------------


def test_sample_that_loses_its_items_to_drop_leaves_no_keys_behind(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((4, 2), np.float32)})
    run = buffer._run

    def run_then_drop(script, keys, args):
        reply = run(script, keys, args)
        if script.startswith("sample"):
            client.delete(*BufferKeys(buffer_name).all_keys())  # another process drops
        return reply

    buffer._run = run_then_drop
    with pytest.raises(EmptyBufferError):
        buffer.sample(2)
    assert client.exists(*BufferKeys(buffer_name).all_keys()) == 0
    again = ReplayBuffer(client, buffer_name, capacity=8)  # the name is usable at once
    again.add({"x": np.zeros((1, 2), np.float32)})
    assert again.stats()["inserted"] == 1


@pytest.mark.redis_server
def test_drop_and_recreate_in_a_loop_while_another_client_samples(redis_server, buffer_name):
    stop = threading.Event()
    failures: list[BaseException] = []

    def sample_forever() -> None:
        client = redis.Redis.from_url(redis_server.url)
        buffer = None
        while not stop.is_set():
            try:
                buffer = buffer or ReplayBuffer.open(client, buffer_name)  # never creates
                buffer.sample(4, replacement=True)
            except EmptyBufferError:
                buffer = None
            except ConfigMismatchError as exc:
                if "has no configuration" in str(exc):
                    failures.append(exc)
                    return
                buffer = None
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                failures.append(exc)
                return

    samplers = [threading.Thread(target=sample_forever) for _ in range(2)]
    for thread in samplers:
        thread.start()
    client = redis.Redis.from_url(redis_server.url)
    cycles = 0
    deadline = time.monotonic() + 2.0
    try:
        while time.monotonic() < deadline:
            buffer = ReplayBuffer(client, buffer_name, capacity=64)
            buffer.add({"x": np.zeros((16, 2), np.float32)})
            buffer.drop()
            cycles += 1
    finally:
        stop.set()
        for thread in samplers:
            thread.join(timeout=10)
    assert not failures, failures[0]
    assert cycles > 20
    assert client.exists(*BufferKeys(buffer_name).all_keys()) == 0


# -- 7. reading keeps working when the server refuses writes ------------------------------


@pytest.fixture
def own_server():
    """A private server: these tests change its configuration."""
    with EmbeddedServer() as server:
        yield server


@pytest.fixture
def replicated():
    """A primary and a read-only replica of it, linked and in sync."""
    with EmbeddedServer() as primary:
        with EmbeddedServer(extra_args=["--replicaof", "127.0.0.1", str(primary.port)]) as copy:
            replica = redis.Redis.from_url(copy.url)
            deadline = time.monotonic() + 15
            while replica.info("replication").get("master_link_status") != "up":
                assert time.monotonic() < deadline, "the replica did not link"
                time.sleep(0.05)
            yield redis.Redis.from_url(primary.url), replica
            replica.close()


@pytest.mark.redis_server
@pytest.mark.parametrize("prioritized", [False, True])
def test_sampling_works_on_a_server_at_maxmemory(own_server, buffer_name, prioritized):
    client = redis.Redis.from_url(own_server.url)
    buffer = ReplayBuffer(client, buffer_name, capacity=64, prioritized_sampling=prioritized)
    buffer.add({"x": np.arange(32, dtype=np.float32).reshape(16, 2), "log_rewards": np.zeros(16)})
    client.config_set("maxmemory", 1)  # every write is refused from now on (noeviction)
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        buffer.add({"x": np.zeros((1, 2), np.float32), "log_rewards": np.zeros(1)})
    batch = buffer.sample(8)
    assert batch["x"].shape == (8, 2)
    info = buffer.sample_with_info(4, replacement=True)
    assert np.array_equal(buffer.get(info.ids)["x"], info.batch["x"])
    assert len(buffer) == 16
    assert ReplayBuffer(client, buffer_name, capacity=64).sample(2)["x"].shape == (2, 2)
    client.config_set("maxmemory", 0)
    assert buffer.stats()["sampled"] == 0  # read-only draws are not counted


def _fill_to_maxmemory(client, add) -> int:
    """Set ``maxmemory`` (``noeviction``) a little above what the server uses now,
    ``add()`` until the server refuses one (ServerFullError), then lower ``maxmemory``
    to half the memory used: right after a refusal the server may be just under its
    limit again (the refused request's buffers freed), and every command is to meet it
    over.
    The number of adds made."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", client.info("memory")["used_memory"] + 256 * 1024)
    for made in range(10_000):
        try:
            add()
        except ServerFullError:
            # well under what is used: the reads and draws that follow allocate and free
            # memory, and must not bring the server back under its limit (a write would
            # then go through: seen in CI at 128 KiB under)
            used = client.info("memory")["used_memory"]
            client.config_set("maxmemory", used // 2)
            return made
    raise AssertionError("the server never refused an add")


def _all_keys_dumped(client) -> dict[bytes, bytes]:
    return key_contents(client, client.scan_iter(match="rb:*"))


# Debian 12's Redis 7.0 (installed by .ci/setup) refuses every command queued in a MULTI
# above maxmemory, reads too; the bundled valkey 8.1 lets reads through.
DEBIAN_SERVER = "/usr/bin/redis-server"


@pytest.mark.redis_server
@pytest.mark.parametrize("server", [
    "bundled",
    pytest.param("redis-7.0", marks=pytest.mark.skipif(
        not Path(DEBIAN_SERVER).exists(), reason="needs Debian's redis-server")),
])
def test_every_read_and_draw_works_on_a_server_filled_to_maxmemory(
    server, buffer_name, monkeypatch
):
    """Issue 33: a learner kept drawing by priority only while nothing queued its reads
    in a MULTI (refused whole above maxmemory, reads too). Filled to the limit: PER,
    softmax and uniform draws, a fresh learner (its replica's snapshot write is refused),
    sequence windows (prioritized, with returns), a sharded PER buffer, state_dict; an
    add fails naming the buffer; and none of it changes a key."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 8)  # a new replica publishes
    with EmbeddedServer(binary=DEBIAN_SERVER if server == "redis-7.0" else None) as own:
        _every_read_at_maxmemory(redis.Redis.from_url(own.url), buffer_name)


def _every_read_at_maxmemory(client, buffer_name: str) -> None:
    from redisbuf import PERSampler, SequenceBuffer

    rng = np.random.default_rng(0)

    def batch(n: int) -> dict:
        return {"x": rng.random((n, 4), dtype=np.float32), "log_rewards": rng.random(n)}

    per = ReplayBuffer(client, buffer_name + "-per", capacity=10**6, sampler=PERSampler())
    soft = ReplayBuffer(client, buffer_name + "-soft", capacity=10**6,
                        prioritized_sampling=True)
    uniform = ReplayBuffer(client, buffer_name + "-uni", capacity=10**6)
    sharded = ShardedReplayBuffer(client, buffer_name + "-sh", capacity=10**6, shards=2,
                           sampler=PERSampler())
    for buffer in (per, soft, uniform, sharded, sharded):  # one add per shard
        buffer.add(batch(64))
    sharded.sample(4)
    per.update_priority(np.arange(1, 65), rng.random(64) + 0.1)
    per.sample(4)
    soft.sample(4)
    sequences = SequenceBuffer(client, buffer_name + "-seq", 2, 64, done_field="done",
                               prioritized_sampling=True, record_episodic_return=True, seed=0)
    for t in range(40):
        sequences.add_batch({"obs": np.full((2, 3), t, np.float32),
                             "done": np.array([t % 10 == 9] * 2),
                             "reward": np.ones(2, np.float32)})
    assert _fill_to_maxmemory(client, lambda: uniform.add(batch(256))) > 0
    before = _all_keys_dumped(client)
    length = len(per)

    with pytest.raises(ServerFullError, match=f"buffer '{buffer_name}-per'.*maxmemory") as info:
        per.add(batch(8))
    assert isinstance(info.value, redis.exceptions.OutOfMemoryError)  # what callers caught
    assert _all_keys_dumped(client) == before and len(per) == length

    drawn = per.sample_with_info(16)
    assert np.array_equal(per.get(drawn.ids)["x"], drawn.batch["x"])
    assert drawn.weights is not None and np.all(drawn.weights > 0)
    assert per.sample(32)["x"].shape == (32, 4)
    assert soft.sample(8)["x"].shape == (8, 4)
    assert soft.sample(8, replacement=True)["x"].shape == (8, 4)
    for replacement in (False, True):
        info = uniform.sample_with_info(8, replacement=replacement)
        assert np.array_equal(uniform.get(info.ids)["x"], info.batch["x"])
    info = sharded.sample_with_info(16)
    assert np.array_equal(sharded.get(info.ids)["x"], info.batch["x"])
    # fresh learners: their replicas load, and the snapshot they would publish is refused
    fresh = ReplayBuffer(client, buffer_name + "-per", capacity=10**6, sampler=PERSampler())
    assert fresh.sample(8)["x"].shape == (8, 4)
    assert ReplayBuffer(client, buffer_name + "-soft", capacity=10**6,
                        prioritized_sampling=True).sample(8)["x"].shape == (8, 4)
    data, windows = sequences.get_batch(4, 3)
    assert data["obs"].shape == (4, 3, 3) and "discounted_return" in data
    np.testing.assert_array_equal(data["obs"][:, :, 0], windows.positions[:, None] + np.arange(3))
    state = per.state_dict()
    assert len(state["ids"]) == length and all(p is not None for p in state["per_priorities"])
    assert _all_keys_dumped(client) == before  # read-only draws record nothing
    client.config_set("maxmemory", 0)
    assert per.add(batch(1)).ids.tolist() == [length + 1]


@pytest.mark.redis_server
@pytest.mark.parametrize("prioritized", [False, True])
def test_sampling_works_on_a_read_only_replica(replicated, buffer_name, prioritized):
    primary, replica = replicated
    writer = ReplayBuffer(primary, buffer_name, capacity=64, prioritized_sampling=prioritized)
    writer.add({"x": np.arange(32, dtype=np.float32).reshape(16, 2), "log_rewards": np.zeros(16)})
    assert primary.wait(1, 5000) == 1
    reader = ReplayBuffer(replica, buffer_name, capacity=64, prioritized_sampling=prioritized)
    assert reader.sample(8)["x"].shape == (8, 2)
    assert len(ReplayBuffer.open(replica, buffer_name)) == 16
    with pytest.raises(redis.exceptions.ReadOnlyError):
        reader.add({"x": np.zeros((1, 2), np.float32), "log_rewards": np.zeros(1)})
    with pytest.raises(redis.exceptions.ReadOnlyError):
        reader.clear()


# -- 4. passwords never appear in messages ------------------------------------------------

SECRET_URLS = [
    ("redis://127.0.0.1:1/0?password=Zq9secret", "Zq9secret"),
    ("redis://127.0.0.1:1/0?db=0&password=Zq9secret&x=1", "Zq9secret"),
    ("redis://u:Zq9#secret@127.0.0.1:1/0", "Zq9"),
    ("redis://u:Zq9/secret@127.0.0.1:1/0", "Zq9"),
    ("redis://:Zq9/se#cret@127.0.0.1:1/0", "Zq9"),
    ("redis://u:Zq9?secret@127.0.0.1:1/0", "Zq9"),
    ("redis://u:4242#secret@127.0.0.1:1/0", "4242"),
    ("redis://u:Zq9@secret@127.0.0.1:1/0", "Zq9"),
    ("unix:///tmp/no-such.sock?password=Zq9secret", "Zq9secret"),
]


@pytest.mark.parametrize(("url", "secret"), SECRET_URLS)
def test_passwords_are_redacted_from_every_connection_error(url, secret):
    import traceback

    from redisbuf.store.connection import redacted

    assert secret not in redacted(url) and "secret" not in redacted(url)
    for attempt in (
        lambda: redisbuf.connect(url, connect_timeout=0.5),
        lambda: ReplayBuffer(url, "x", capacity=2),
    ):
        with pytest.raises(ServerUnavailableError) as info:
            attempt()
        shown = "".join(traceback.format_exception(info.value))
        assert secret not in shown and "secret" not in shown, shown


# -- 8. a lost server is a ServerUnavailableError naming it -------------------------------


@pytest.mark.redis_server
@pytest.mark.parametrize("opened_with", ["url", "client"])
def test_server_gone_mid_run_is_server_unavailable_naming_the_url(buffer_name, opened_with):
    server = EmbeddedServer().start()
    try:
        url = server.url
        target = url if opened_with == "url" else redis.Redis.from_url(url, socket_timeout=2)
        buffer = ReplayBuffer(target, buffer_name, capacity=8)
        buffer.add({"x": np.zeros((4, 2), np.float32)})
    finally:
        server.stop()
    for operation in (
        lambda: buffer.add({"x": np.zeros((1, 2), np.float32)}),
        lambda: buffer.sample(2),
        lambda: len(buffer),
        buffer.stats,
        lambda: buffer.get([1]),
        buffer.clear,
        lambda: ReplayBuffer.open(buffer.client, buffer_name),
    ):
        with pytest.raises(ServerUnavailableError) as info:
            operation()
        assert f"127.0.0.1:{server.port}" in str(info.value)
        assert isinstance(info.value, redis.exceptions.ConnectionError)  # still catchable so


# -- 9. a failed save leaves the previous checkpoint intact -------------------------------


def test_failed_save_keeps_the_previous_checkpoint(client, buffer_name, tmp_path):
    buffer = ReplayBuffer(client, buffer_name, capacity=2000)
    values = np.arange(3000, dtype=np.float32).reshape(1500, 2)
    buffer.add({"x": values[:750]})  # one add stores at most bounds.MAX_ADD_ITEMS items
    buffer.add({"x": values[750:]})
    path = tmp_path / "ckpt.rb"
    assert buffer.save(path) == 1500
    before = path.read_bytes()
    records = buffer._records

    def failing_records(*args, **kwargs):
        for index, record in enumerate(records(*args, **kwargs)):
            if index == 1200:
                raise redis.exceptions.ConnectionError("lost the server mid-save")
            yield record

    buffer._records = failing_records
    with pytest.raises(redis.exceptions.ConnectionError):
        buffer.save(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.rb"]  # no temp file left
    buffer._records = records
    buffer.add({"x": np.zeros((1, 2), np.float32)})
    assert buffer.save(str(path)) == 1501  # still saves by str path, replacing the file
    assert path.read_bytes() != before and len(list(tmp_path.iterdir())) == 1
    ReplayBuffer(client, buffer_name + "-copy", capacity=2000).load(path)


# -- 11. a server that may evict a buffer's keys is reported -----------------------------


@pytest.mark.redis_server
@pytest.mark.parametrize("policy", ["allkeys-lru", "allkeys-lfu", "allkeys-random"])
def test_an_evicting_policy_warns_and_strict_refuses(own_server, buffer_name, policy):
    client = redis.Redis.from_url(own_server.url)
    client.config_set("maxmemory-policy", policy)
    with pytest.warns(RuntimeWarning, match=f"maxmemory-policy {policy}"):
        ReplayBuffer(client, buffer_name, capacity=4)
    with pytest.raises(ServerConfigError, match="noeviction"):
        ReplayBuffer(client, buffer_name + "-strict", capacity=4, strict=True)
    assert not client.exists(BufferKeys(buffer_name + "-strict").meta)  # refused before init


@pytest.mark.redis_server
@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru", "volatile-ttl"])
def test_policies_that_keep_keys_without_ttl_pass_silently(own_server, buffer_name, policy):
    client = redis.Redis.from_url(own_server.url)
    client.config_set("maxmemory-policy", policy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ReplayBuffer(client, buffer_name, capacity=4, strict=True).add({"x": np.zeros(2)})


# -- 5. restores: counters checked or derived, all-or-nothing for other processes --------


def _every_key(client, name: str) -> dict[bytes, bytes]:
    """Every key of the buffer's hash tag (staging keys included), dumped."""
    return key_contents(client, client.scan_iter(match=f"rb:{{{name}}}:*"))


def _filled(client, name: str, n: int = 10) -> ReplayBuffer:
    buffer = ReplayBuffer(client, name, capacity=5000, prioritized_sampling=True)
    buffer.add({"x": np.arange(2 * n, dtype=np.float32).reshape(n, 2), "log_rewards": np.zeros(n)})
    buffer.sample(3)
    return buffer


@pytest.mark.parametrize(
    "counters",
    [
        {"inserted": -1, "evicted": 0, "sampled": 0},
        {"inserted": 2**64 - 1, "evicted": 0, "sampled": 0},
        {"inserted": 10, "evicted": 0, "sampled": -5},
        {"inserted": "10", "evicted": 0, "sampled": 0},
        {"inserted": 10.5, "evicted": 0, "sampled": 0},
        {"inserted": True, "evicted": 0, "sampled": 0},
        {"inserted": 10, "evicted": None, "sampled": 0},
        [10, 0, 0],
    ],
)
def test_crafted_counters_are_refused_before_the_buffer_changes(client, buffer_name, counters):
    source = _filled(client, buffer_name + "-src")
    state = source.state_dict()
    state["counters"] = counters
    target = _filled(client, buffer_name)
    target.add({"x": np.zeros((3, 2), np.float32), "log_rewards": np.ones(3)})
    before = _every_key(client, buffer_name)
    with pytest.raises(DecodeError, match="counter"):
        target.load_state_dict(state)
    assert _every_key(client, buffer_name) == before


@pytest.mark.parametrize("saved", [(10, 0, 3), (3, 0, 0), (40, 35, 2), (0, 0, 0)])
def test_restored_counters_keep_inserted_minus_evicted_equal_to_length(
    client, buffer_name, tmp_path, saved
):
    source = _filled(client, buffer_name + "-src")
    state = source.state_dict()
    state["counters"] = dict(zip(("inserted", "evicted", "sampled"), saved, strict=True))
    target = _filled(client, buffer_name, n=20)
    target.load_state_dict(state)
    stats = target.stats()
    assert stats["length"] == 10 and stats["inserted"] - stats["evicted"] == 10
    assert stats["inserted"] == max(saved[0], 10) and stats["sampled"] == saved[2]
    assert target.sample(4)["x"].shape == (4, 2)  # the sum tree was rebuilt


@pytest.mark.redis_server
def test_readers_never_see_a_half_loaded_buffer(redis_server, buffer_name, tmp_path):
    client = redis.Redis.from_url(redis_server.url)
    source = ReplayBuffer(client, buffer_name + "-src", capacity=6000)
    for _ in range(5):  # one add stores at most bounds.MAX_ADD_ITEMS items
        source.add({"x": np.ones((1000, 2), np.float32)})
    path = tmp_path / "big.rb"
    source.save(path)
    target = ReplayBuffer(client, buffer_name, capacity=6000)
    target.add({"x": np.zeros((7, 2), np.float32)})
    seen: set[tuple[int, int, int]] = set()
    stop = threading.Event()

    def watch() -> None:
        reader = redis.Redis.from_url(redis_server.url)
        keys = BufferKeys(buffer_name)
        while not stop.is_set():
            pipe = reader.pipeline(transaction=True)
            pipe.zcard(keys.order)
            pipe.hlen(keys.items)
            pipe.hget(keys.meta, "inserted")
            length, items, inserted = pipe.execute()
            seen.add((length, items, int(inserted or -1)))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert target.load(path) == 5000
        time.sleep(0.05)
    finally:
        stop.set()
        watcher.join()
    assert seen <= {(7, 7, 7), (5000, 5000, 5000)}, sorted(seen)[:5]
    assert (5000, 5000, 5000) in seen


@pytest.mark.redis_server
def test_load_while_another_process_adds_keeps_the_counters_consistent(
    redis_server, buffer_name, tmp_path
):
    client = redis.Redis.from_url(redis_server.url)
    source = ReplayBuffer(client, buffer_name + "-src", capacity=3000)
    for _ in range(5):  # one add stores at most bounds.MAX_ADD_ITEMS items
        source.add({"x": np.ones((500, 2), np.float32)})
    path = tmp_path / "ckpt.rb"
    source.save(path)
    target = ReplayBuffer(client, buffer_name, capacity=3000)
    stop = threading.Event()
    handed_out: list[int] = []

    def add_forever() -> None:
        writer = ReplayBuffer(redis_server.url, buffer_name, capacity=3000)
        while not stop.is_set():
            handed_out.extend(writer.add({"x": np.zeros((5, 2), np.float32)}).ids.tolist())

    adder = threading.Thread(target=add_forever)
    adder.start()
    try:
        for _ in range(3):
            target.load(path)
    finally:
        stop.set()
        adder.join()
    stats = target.stats()
    assert stats["inserted"] - stats["evicted"] == stats["length"] == len(target)
    present = [int(m) for m in client.zrange(target.keys.order, 0, -1)]
    assert len(present) == len(set(present))
    restored = np.array(present)[target.get(present)["x"][:, 0] == 1].tolist()
    assert len(restored) == 2500
    assert not set(restored) & set(handed_out)  # no restored item took an id handed out
    assert len(set(handed_out)) == len(handed_out)
    assert not client.keys(f"rb:{{{buffer_name}}}:staging:*")


# -- retries: an add runs once per batch id; reads are retried ----------------------------


def _add_args(n: int = 2) -> list:
    """ARGV pairs of add.lua for ``n`` items of {"x": float32[2]}."""
    blob = codec.packb({"x": np.zeros(2, np.float32)})
    return [blob, "0.0"] * n


def test_an_add_repeated_with_its_batch_id_inserts_once(client, buffer_name):
    from redisbuf.store import scripts

    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((1, 2), np.float32)})
    keys = buffer.keys
    schema = client.hget(keys.meta, "schema")
    memory = [keys.batches, keys.batches_old]
    args = [schema, 2, "", *_add_args(2)]
    first = scripts.load("add")(client, keys.all_keys(), list(args), batch=("b1", memory, 60))
    again = scripts.load("add")(client, keys.all_keys(), list(args), batch=("b1", memory, 60))
    assert first == again == [2, 2, 0]
    assert len(buffer) == 3 and buffer.stats()["inserted"] == 3
    other = scripts.load("add")(client, keys.all_keys(), list(args), batch=("b2", memory, 60))
    assert other == [4, 2, 0] and len(buffer) == 5
    # an error reply is not remembered: the same id may succeed later
    bad = [schema, 1, "", _add_args(1)[0], "nan"]
    with pytest.raises(redisbuf.errors.InvalidBatchError):
        scripts.load("add")(client, keys.all_keys(), bad, batch=("b3", memory, 60))
    assert client.hget(keys.batches, "b3") is None


def test_batch_ids_are_forgotten_after_their_time(client, buffer_name):
    from redisbuf.store import scripts

    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((1, 2), np.float32)})
    keys = buffer.keys
    schema = client.hget(keys.meta, "schema")
    memory = [keys.batches, keys.batches_old]
    add = scripts.load("add")

    def remembered() -> set[bytes]:
        return {f for k in memory for f in client.hkeys(k) if f != b"~since"}

    client.delete(*memory)
    add(client, keys.all_keys(), [schema, 1, "", *_add_args(1)], batch=("old", memory, 0.05))
    time.sleep(0.1)
    # a window later "old" moves to the older generation, still remembered ...
    add(client, keys.all_keys(), [schema, 1, "", *_add_args(1)], batch=("new", memory, 0.05))
    assert client.hkeys(keys.batches_old) == [b"~since", b"old"]
    assert remembered() == {b"old", b"new"}
    again = add(client, keys.all_keys(), [schema, 1, "", *_add_args(1)], batch=("old", memory, 60))
    assert again == [2, 1, 0] and len(buffer) == 3  # its first reply, not a second insert
    time.sleep(0.1)
    # ... and a second window later it is forgotten with its generation
    add(client, keys.all_keys(), [schema, 1, "", *_add_args(1)], batch=("last", memory, 0.05))
    assert remembered() == {b"new", b"last"}


def test_a_remembered_add_does_not_recreate_a_dropped_buffer(client, buffer_name):
    from redisbuf.store import scripts

    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    keys = buffer.keys
    buffer.drop()
    memory = [keys.batches, keys.batches_old]
    args = ["{}", 1, "", *_add_args(1)]
    with pytest.raises(ConfigMismatchError):
        scripts.load("add")(client, keys.all_keys(), args, batch=("b", memory, 60))
    assert client.exists(*keys.all_keys()) == 0


def test_reads_and_read_pipelines_are_retried_after_a_lost_connection(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.arange(8, dtype=np.float32).reshape(4, 2)})
    real = buffer.client.unwrapped
    failures = {"zcard": 2, "execute": 2}

    class Flaky:
        """Forwards to ``inner``; the first calls named in ``failures`` lose the server."""

        def __init__(self, inner):
            object.__setattr__(self, "inner", inner)

        def __setattr__(self, name, value):
            setattr(self.inner, name, value)

        def __getattr__(self, name):
            value = getattr(self.inner, name)
            if name == "pipeline":
                return lambda *a, **k: Flaky(value(*a, **k))
            if name in failures and failures[name] > 0:
                def fail(*args, **kwargs):
                    failures[name] -= 1
                    if name == "execute":
                        self.inner.reset()  # what redis-py does on a failed execute
                    raise redis.exceptions.ConnectionError("Connection closed by server.")
                return fail
            return value

    from redisbuf.store.connection import Guarded

    buffer.client = Guarded(Flaky(real))
    # (len() runs lua/len.lua: a script, retried by the runner)
    assert buffer.client.zcard(buffer.keys.order) == 4  # zcard failed twice, then answered
    assert buffer.get([1, 2])["x"].tolist() == [[0, 1], [2, 3]]  # pipeline re-sent
    assert failures == {"zcard": 0, "execute": 0}
    failures["delete"] = 1  # a write is not retried
    with pytest.raises(ServerUnavailableError):
        buffer.client.delete("unrelated")
    assert failures["delete"] == 0


# -- durability on request ----------------------------------------------------------------


@pytest.mark.redis_server
def test_durability_aof_adds_once_the_append_only_file_has_the_batch(buffer_name):
    with EmbeddedServer(extra_args=["--appendonly", "yes", "--appendfsync", "always"]) as server:
        client = redis.Redis.from_url(server.url)
        buffer = ReplayBuffer(client, buffer_name, capacity=8, durability="aof")
        result = buffer.add({"x": np.zeros((3, 2), np.float32)})
        assert result.ids.tolist() == [1, 2, 3] and len(buffer) == 3
        assert ReplayBuffer(server.url, buffer_name, capacity=8, durability="aof").add(
            {"x": np.ones((1, 2), np.float32)}
        ).ids.tolist() == [4]


@pytest.mark.redis_server
def test_durability_aof_without_appendonly_is_a_clear_error(own_server, buffer_name):
    with pytest.raises(ServerConfigError, match="appendonly yes"):
        ReplayBuffer(own_server.url, buffer_name, capacity=8, durability="aof")
    assert not redis.Redis.from_url(own_server.url).exists(BufferKeys(buffer_name).meta)


def test_durability_aof_without_waitaof_is_a_clear_error(fake_client, buffer_name):
    # fakeredis has no WAITAOF, like Debian's Redis 7.0: the same error path
    with pytest.raises(ServerConfigError, match="WAITAOF"):
        ReplayBuffer(fake_client, buffer_name, capacity=8, durability="aof")
    with pytest.raises(ValueError, match="durability"):
        ReplayBuffer(fake_client, buffer_name, capacity=8, durability="fsync")


@pytest.mark.redis_server
def test_durability_replica_waits_for_the_replica(replicated, buffer_name):
    primary, replica = replicated
    buffer = ReplayBuffer(
        primary, buffer_name, capacity=8, durability="replica", durability_timeout=20
    )
    buffer.add({"x": np.zeros((3, 2), np.float32)})
    # WAIT returned: the replica has the batch now, without any further waiting
    assert replica.zcard(BufferKeys(buffer_name).order) == 3
    replica.execute_command("REPLICAOF", "NO", "ONE")  # the replica leaves
    buffer.durability_timeout = 0.3
    start = time.monotonic()
    with pytest.raises(redisbuf.errors.DurabilityError, match="replica"):
        buffer.add({"x": np.zeros((1, 2), np.float32)})
    assert time.monotonic() - start < 15  # the 0.3 s set now, not the 20 s it was made with
    assert len(buffer) == 4  # the batch is in, just not confirmed


@pytest.mark.redis_server
def test_durability_replica_without_a_replica_is_a_clear_error(own_server, buffer_name):
    with pytest.raises(ServerConfigError, match="no replica"):
        ReplayBuffer(own_server.url, buffer_name, capacity=8, durability="replica")


# -- close() and use as a context manager -------------------------------------------------


def _connections(client, name: str) -> int:
    return sum(1 for c in client.client_list() if c.get("name") == name)


@pytest.mark.redis_server
def test_close_releases_the_connections_of_a_buffer_opened_by_url(own_server, buffer_name):
    admin = redis.Redis.from_url(own_server.url)
    url = own_server.url + "?client_name=rb-close-test"
    with ReplayBuffer(url, buffer_name, capacity=8) as buffer:
        buffer.add({"x": np.zeros((2, 2), np.float32)})
        assert buffer.sample(1)["x"].shape == (1, 2)
        assert _connections(admin, "rb-close-test") >= 1
    # the server drops a closed socket on its next event-loop turn: allow it that long
    deadline = time.monotonic() + 5
    while _connections(admin, "rb-close-test") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _connections(admin, "rb-close-test") == 0
    given = redis.Redis.from_url(url)
    other = ReplayBuffer(given, buffer_name, capacity=8)
    assert len(other) == 2
    other.close()  # a client passed in is its owner's to close
    assert given.ping() and _connections(admin, "rb-close-test") == 1
    given.close()


# -- the ACL rule docs/operators.md gives is enough ---------------------------------------

ACL_RULE = (
    "~rb:* resetchannels &rb:* -@all +@read +@write +@scripting +@connection +@pubsub +info "
    "+memory|usage +time +multi +exec"
)


def test_the_acl_rule_tested_here_is_the_one_the_operators_page_gives():
    page = (Path(__file__).resolve().parent.parent / "docs" / "operators.md").read_text()
    assert ACL_RULE in " ".join(page.split()), "docs/operators.md no longer gives ACL_RULE"


@pytest.mark.redis_server
def test_the_documented_acl_rule_is_enough_for_every_buffer_operation(own_server, tmp_path):
    admin = redis.Redis.from_url(own_server.url)
    admin.execute_command("ACL", "SETUSER", "rb", "on", ">pw", *ACL_RULE.split())
    url = f"redis://rb:pw@127.0.0.1:{own_server.port}/0"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the policy check may read INFO: no warning
        for prioritized in (False, True):
            name = f"acl-{int(prioritized)}"
            with ReplayBuffer(url, name, capacity=8, prioritized_sampling=prioritized) as buffer:
                buffer.add({"x": np.zeros((4, 2), np.float32), "log_rewards": np.zeros(4)})
                assert buffer.sample(2)["x"].shape == (2, 2)
                assert buffer.get([1])["x"].shape == (1, 2) and len(buffer) == 4
                assert buffer.stats()["memory_bytes"] > 0 and buffer.top(1)
                assert buffer.save(tmp_path / name) == 4 and buffer.load(tmp_path / name) == 4
                buffer.clear()
                buffer.drop()
    assert admin.execute_command("ACL", "LOG", 10) == []  # nothing was refused
    with pytest.raises(redis.exceptions.NoPermissionError):  # other keys stay out of reach
        redis.Redis.from_url(url).get("not-a-buffer")


# -- untrusted data: fuzzing every decode path and save files ----------------------------

FUZZ = settings(
    max_examples=60, deadline=5000, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def _mutate(data: bytes, how: str, at: int, payload: bytes) -> bytes:
    at = at % max(len(data), 1)
    if how == "truncate":
        return data[:at]
    if how == "flip":
        return data[:at] + bytes([data[at] ^ (payload[0] if payload else 0xFF)]) + data[at + 1 :]
    if how == "insert":
        return data[:at] + payload + data[at:]
    return payload  # "replace": random bytes


_MUTATIONS = st.tuples(
    st.sampled_from(["truncate", "flip", "insert", "replace"]),
    st.integers(0, 10_000),
    st.binary(min_size=1, max_size=64),
)


@FUZZ
@given(
    mutation=_MUTATIONS,
    layout=st.sampled_from(["same", "ragged"]),
    crafted=st.one_of(
        st.none(),
        st.recursive(
            st.none()
            | st.booleans()
            | st.integers(-(2**63), 2**64 - 1)  # what msgpack can encode
            | st.text(max_size=5)
            | st.binary(max_size=8),
            lambda inner: (
                st.lists(inner, max_size=3)
                | st.dictionaries(st.text(max_size=3), inner, max_size=3)
            ),
            max_leaves=20,
        ),
    ),
)
def test_a_corrupt_stored_item_is_a_decode_error_and_the_others_stay_readable(
    fake_client, mutation, layout, crafted
):
    from redisbuf import Trajectories

    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    buffer = ReplayBuffer(fake_client, name, capacity=8)
    if layout == "same":
        x = np.arange(12, dtype=np.float32).reshape(3, 2, 2)
        buffer.add({"x": x, "log_rewards": np.zeros(3)})
    else:
        buffer.add(
            Trajectories(
                states=np.zeros((4, 3, 2), np.float32),
                actions=np.zeros((3, 3), np.int64),
                terminating_idx=np.array([1, 2, 3]),
                log_rewards=np.zeros(3),
            )
        )
    keys = BufferKeys(name)
    good = fake_client.hget(keys.items, format_id(2))
    bad = codec.packb(crafted) if crafted is not None else _mutate(good, *mutation)
    fake_client.hset(keys.items, format_id(2), bad)
    for ids in ([2], [1, 2, 3]):
        try:
            buffer.get(ids)
        except DecodeError as exc:
            assert "id 2" in str(exc) and name in str(exc)
    buffer.get([1, 3])
    buffer.drop()


@FUZZ
@given(mutation=_MUTATIONS)
def test_a_corrupt_save_file_is_refused_and_changes_nothing(
    fake_client, tmp_path_factory, mutation
):
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    source = ReplayBuffer(fake_client, name, capacity=8)
    source.add({"x": np.arange(12, dtype=np.float32).reshape(3, 2, 2), "log_rewards": np.zeros(3)})
    path = tmp_path_factory.mktemp("fuzz") / "f.rb"
    source.save(path)
    path.write_bytes(_mutate(path.read_bytes(), *mutation))
    target = ReplayBuffer(fake_client, name + "-t", capacity=8)
    target.add({"x": np.zeros((1, 2, 2), np.float32), "log_rewards": np.zeros(1)})
    before = _every_key(fake_client, name + "-t")
    try:
        target.load(path)
    except (DecodeError, SchemaError):  # SchemaError: a changed but well-formed schema
        assert _every_key(fake_client, name + "-t") == before
    source.drop()
    target.drop()


@FUZZ
@given(mutation=_MUTATIONS)
def test_a_corrupt_per_checkpoint_is_refused_or_loads_consistently(
    fake_client, tmp_path_factory, mutation
):
    """A format-2 file with PER priorities and use counts, mutated: refused with nothing
    changed, or (a mutation the checks cannot tell from data, e.g. in a priority's
    digits) loaded with PER state, tree and use counters consistent with what it holds."""
    name = f"fuzz-{uuid.uuid4().hex[:8]}"
    sampler = redisbuf.PERSampler(alpha=0.6, eps=0.01)
    source = ReplayBuffer(fake_client, name, capacity=8, sampler=sampler, seed=0)
    ids = source.add({"x": np.arange(4, dtype=np.float32)[:, None], "log_rewards": np.zeros(4)}).ids
    source.update_priority(ids, [0.0, 0.5, 2.0, 9.0])
    source.sample(5)
    path = tmp_path_factory.mktemp("fuzz") / "f.rb"
    source.save(path)
    path.write_bytes(_mutate(path.read_bytes(), *mutation))
    target = ReplayBuffer(fake_client, name + "-t", capacity=8, sampler=sampler, max_use=50)
    target.add({"x": np.zeros((1, 1), np.float32), "log_rewards": np.zeros(1)})
    before = _every_key(fake_client, name + "-t")
    try:
        target.load(path)
    except (DecodeError, SchemaError, ConfigMismatchError):
        # ConfigMismatchError: a use count mutated to >= max_use, or PER settings dropped
        assert _every_key(fake_client, name + "-t") == before
    else:
        assert_matches(fake_client, target.name, per_scores(fake_client, target.name), 0.6, 0.01)
        keys = BufferKeys(target.name)
        uses = [int(u) for u in fake_client.hvals(keys.uses)]
        assert all(0 < u < 50 for u in uses)
        assert int(fake_client.hget(keys.meta, "present_uses")) == sum(uses)
    source.drop()
    target.drop()


def _remembered(client, keys) -> list[bytes]:
    """The replies the batch memory holds (both generations), without its "~since"."""
    return [
        value
        for key in (keys.batches, keys.batches_old)
        for field, value in client.hgetall(key).items()
        if field != b"~since"
    ]


def test_the_retry_window_is_the_buffers_and_bounds_the_batch_memory(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=8, retry_window=0.05)
    assert float(client.hget(buffer.keys.meta, "retry_window")) == 0.05
    assert ReplayBuffer(client, buffer_name, capacity=8).retry_window == 0.05  # None adopts
    with pytest.raises(ConfigMismatchError, match=r"retry_window 0.05 s, not 600 s"):
        ReplayBuffer(client, buffer_name, capacity=8, retry_window=600)
    with pytest.raises(ValueError, match="retry_window must be a positive number"):
        ReplayBuffer(client, buffer_name + "x", capacity=8, retry_window=0)
    row = {"x": np.zeros((1, 2), np.float32)}
    for _ in range(3):
        buffer.add(row)
    # one entry per add: the commit's reply ("c") replaced the reservation's ("r")
    assert sorted(_remembered(client, buffer.keys)) == [b"c[1,1,0]", b"c[2,1,0]", b"c[3,1,0]"]
    time.sleep(0.12)  # a window: the next add starts a new generation, the old one kept
    buffer.add(row)
    assert len(_remembered(client, buffer.keys)) == 4
    time.sleep(0.12)  # another: the first three are forgotten with their generation
    buffer.add(row)
    assert sorted(_remembered(client, buffer.keys)) == [b"c[4,1,0]", b"c[5,1,0]"]
    # a buffer made before the window was stored has the former fixed 600 s
    client.hdel(buffer.keys.meta, "retry_window")
    assert ReplayBuffer(client, buffer_name, capacity=None).retry_window == 600.0


@pytest.mark.redis_server
def test_a_remembered_batch_costs_under_100_bytes(real_client, buffer_name):
    # issue 24: a JSON reply per call and a time zset cost ~390 B per add (valkey 8)
    buffer = ReplayBuffer(real_client, buffer_name, capacity=100)
    row = {"x": np.zeros((1, 2), np.float32)}
    adds = 1000
    for _ in range(adds):
        buffer.add(row)
    keys = buffer.keys
    assert len(_remembered(real_client, keys)) == adds
    found = [k.decode() for k in real_client.scan_iter(match=f"rb:{{{buffer_name}}}:batch*")]
    used = sum(real_client.memory_usage(k, samples=0) for k in found)
    assert used / adds < 100, (found, used)


@pytest.mark.redis_server
def test_a_socket_timeout_that_would_cut_the_durability_wait_is_refused(replicated,
                                                                        buffer_name):
    """``durability="replica"`` waits with one WAIT of ``durability_timeout``; a client
    socket timeout below it cut that wait, and the add was sent again and again (the
    review saw it still going after 40 s with a stalled replica): refused when the buffer
    is opened, naming both."""
    primary, _ = replicated
    kwargs = primary.connection_pool.connection_kwargs
    short = redis.Redis(host=kwargs["host"], port=kwargs["port"], socket_timeout=1.0)
    with pytest.raises(ValueError, match=r"socket_timeout \(1.0 s\).*durability_timeout"):
        ReplayBuffer(short, buffer_name, capacity=10, durability="replica",
                     durability_timeout=3.0)
    long = redis.Redis(host=kwargs["host"], port=kwargs["port"], socket_timeout=5.0)
    buffer = ReplayBuffer(long, buffer_name, capacity=10, durability="replica",
                          durability_timeout=3.0)
    assert len(buffer.add({"x": np.arange(4, dtype=np.float32)}).ids) == 4
    short.close()
    long.close()


@pytest.mark.redis_server
def test_durability_replica_covers_a_large_add_whole(replicated, buffer_name):
    primary, replica = replicated
    buffer = ReplayBuffer(primary, buffer_name, capacity=10_000, durability="replica",
                          durability_timeout=20)
    n = 3 * 1024 + 7  # a large add: staged, committed, then stored a slice a command
    assert len(buffer.add({"x": np.zeros((n, 2), np.float32)}).ids) == n
    # WAIT returned: the replica has every slice, without any further waiting
    assert replica.zcard(BufferKeys(buffer_name).order) == n
    assert not replica.hexists(BufferKeys(buffer_name).meta, "applying")
