"""The fault probe's defects (issue 13), each pinned by a test that failed before its fix."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
import redis

from redisbuf import ReplayBuffer, codec
from redisbuf.errors import ConfigMismatchError, DecodeError, EmptyBufferError
from redisbuf.keys import BufferKeys, format_id
from redisbuf.server import EmbeddedServer

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
