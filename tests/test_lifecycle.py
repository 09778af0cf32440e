"""A buffer's life across processes: drop, clear, recreate and restore by one process
while another holds the same name; corrupt restores leave the buffer as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest

from redisbuf import ReplayBuffer
from redisbuf.errors import RedisBufError, SamplingError


# Was a bug: lua/clear.lua HSETs counters into a meta hash that drop() deleted, leaving a meta
# without capacity/eviction, so every later open of the name dies with KeyError('capacity').
def test_clear_after_another_object_dropped_the_buffer_leaves_the_name_usable(
    client, buffer_name
):
    holder = ReplayBuffer(client, buffer_name, capacity=5)
    other = ReplayBuffer(client, buffer_name, capacity=5)
    holder.add({"v": np.arange(3.0)})
    other.drop()
    try:
        holder.clear()
    except RedisBufError:
        pass  # refusing is fine; corrupting the name is not
    again = ReplayBuffer(client, buffer_name, capacity=5)
    again.add({"v": np.arange(2.0)})
    assert len(again) == 2


# Was a bug: ReplayBuffer._restore validates nothing per record before clear(): a NaN priority
# makes add.lua fail mid-script after clear, so the buffer is emptied and its blobs orphaned.
def test_load_state_dict_with_a_nan_priority_leaves_the_buffer_as_it_was(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add({"v": np.arange(3.0), "log_rewards": np.array([0.0, 1.0, 2.0])})
    state = buffer.state_dict()
    state["priorities"][1] = math.nan
    with pytest.raises(RedisBufError):
        buffer.load_state_dict(state)
    assert len(buffer) == 3
    assert client.hlen(buffer.keys.items) == 3
    assert buffer.get([1, 2, 3])["v"].tolist() == [0.0, 1.0, 2.0]


# Was a bug: _restore accepted a +inf priority that add refused, and the sum tree was poisoned
# ("buffer is empty"). +inf is now a valid log-reward: restored like add stores it, and
# prioritized sampling refuses it by name while uniform sampling and the tree are unharmed.
def test_load_state_dict_keeps_a_plus_inf_priority(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, prioritized_sampling=True, seed=0)
    buffer.add({"v": np.arange(3.0), "log_rewards": np.array([0.0, 1.0, 2.0])})
    state = buffer.state_dict()
    state["priorities"][0] = math.inf
    buffer.load_state_dict(state)
    assert buffer.top(1)[0][1] == math.inf
    with pytest.raises(SamplingError, match=r"\+inf"):
        buffer.sample(2)
    uniform = ReplayBuffer(client, buffer_name, capacity=5, seed=0)
    assert sorted(uniform.sample(3)["v"].tolist()) == [0.0, 1.0, 2.0]


# Was a bug: ReplayBuffer caches the schema forever; after another process drops and recreates
# the name with another dtype, get/sample decode the new blobs with the stale schema and
# silently return wrong values (1.5 -> 1).
def test_a_stale_holder_does_not_decode_with_the_schema_of_a_dropped_buffer(
    fake_client, buffer_name
):
    holder = ReplayBuffer(fake_client, buffer_name, capacity=5)
    holder.add({"v": np.array([1, 2, 3])})
    ReplayBuffer(fake_client, buffer_name, capacity=5).drop()
    fresh = ReplayBuffer(fake_client, buffer_name, capacity=5)
    fresh.add({"v": np.array([1.5, 2.5, 3.5])})
    assert holder.get([1, 2, 3])["v"].tolist() == [1.5, 2.5, 3.5]


# Was a bug: _check_schema compares against the stale cached schema before asking the server, so
# a batch that fits the recreated buffer is refused with SchemaError.
def test_a_stale_holder_can_add_what_the_recreated_buffer_accepts(fake_client, buffer_name):
    holder = ReplayBuffer(fake_client, buffer_name, capacity=5)
    holder.add({"v": np.array([1, 2, 3])})
    ReplayBuffer(fake_client, buffer_name, capacity=5).drop()
    fresh = ReplayBuffer(fake_client, buffer_name, capacity=5)
    fresh.add({"v": np.array([1.5])})
    holder.add({"v": np.array([9.5])})
    assert len(fresh) == 2


def test_save_of_a_dropped_buffer_is_a_clear_error(client, buffer_name, tmp_path):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.drop()
    with pytest.raises(RedisBufError, match="does not exist"):
        buffer.save(tmp_path / "gone.rbuf")


def test_capacity_must_be_an_integer_not_a_bool(client, buffer_name):
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(client, buffer_name, capacity=True)


def test_a_corrupt_blob_in_a_restore_leaves_the_buffer_as_it_was(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add({"v": np.arange(3.0), "log_rewards": np.array([0.0, 1.0, 2.0])})
    state = buffer.state_dict()
    state["blobs"][2] = state["blobs"][2][:-3]
    with pytest.raises(RedisBufError):
        buffer.load_state_dict(state)
    assert buffer.get([1, 2, 3])["v"].tolist() == [0.0, 1.0, 2.0]


def test_add_script_refuses_a_nan_priority_before_writing(client, buffer_name):
    # the Python side rejects NaN first; the script must too, since it is not undone
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add({"v": np.arange(2.0)})
    blobs, _, schema = buffer.encode({"v": np.arange(2.0)})
    before = client.hgetall(buffer.keys.meta)
    with pytest.raises(RedisBufError, match="priority"):
        buffer._insert(blobs, np.array([0.0, math.nan]), schema)
    assert client.hgetall(buffer.keys.meta) == before
    assert len(buffer) == 2


def test_drop_after_a_manager_session_leaves_no_key_of_the_buffer(client, buffer_name):
    # issue 24: drop left rb:{name}:ctl:ranks and :ctl:workers (no expiry) behind
    from redisbuf.control.protocol import ANY_SOURCE, DATA_TAG, request
    from redisbuf.control.redis import RedisManagerTransport, RedisWorkerTransport
    from redisbuf.store.keys import StagingKeys

    fast = {"heartbeat_interval": 0.1, "heartbeat_ttl": 5.0}
    buffer = ReplayBuffer(client, buffer_name, capacity=8)
    buffer.add({"x": np.zeros((3, 2), np.float32)})
    manager = RedisManagerTransport(client, buffer_name, **fast)
    manager.start()
    worker = RedisWorkerTransport(client, buffer_name, connect_timeout=2.0, **fast)
    worker.send(0, DATA_TAG, request("metadata"))
    assert manager.recv(ANY_SOURCE, DATA_TAG, timeout=2.0)[0] == worker.rank
    manager.send(worker.rank, DATA_TAG, b"score")  # a reply list, kept for an hour
    # what a load interrupted before its swap leaves
    client.hset(StagingKeys(buffer_name, "dead").meta, "capacity", 8)
    # keys of other structures of the same name are not the buffer's
    foreign = [f"rb:{{{buffer_name}}}:{suffix}" for suffix in ("seq:meta", "episodes:meta")]
    for key in foreign:
        client.hset(key, "capacity", 1)
    worker.close()
    manager.close()  # the session is over: its registry and reply lists stay
    pattern = f"rb:{{{buffer_name}}}:*"
    left = {key.decode() for key in client.scan_iter(match=pattern)}
    assert {f"rb:{{{buffer_name}}}:ctl:{s}" for s in ("ranks", "workers")} <= left
    buffer.drop()
    assert sorted(client.scan_iter(match=pattern)) == sorted(k.encode() for k in foreign)
