"""The ReplayBuffer API: sharing by name, configuration checks, atomic add, counters,
clear / drop, stats, top, get."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from redisbuf import AddResult, BufferKeys, ReplayBuffer, States, Trajectories
from redisbuf.errors import ConfigMismatchError, SchemaError
from redisbuf.store import scripts


def _batch(values, log_rewards=None):
    batch = {"x": np.asarray(values, dtype=np.float32)}
    if log_rewards is not None:
        batch["log_rewards"] = np.asarray(log_rewards, dtype=np.float64)
    return batch


def _ids_in_order(client, name) -> list[int]:
    return [int(m) for m in client.zrange(BufferKeys(name).order, 0, -1)]


class CommandLog:
    """Records the name of every command the client sends."""

    def __init__(self, client):
        self.names: list[str] = []
        self._original = client.execute_command
        client.execute_command = self._record

    def _record(self, *args, **kwargs):
        self.names.append(str(args[0]).upper())
        return self._original(*args, **kwargs)


# -- sharing and configuration ----------------------------------------------------------


def test_objects_on_one_name_share_one_buffer(client, buffer_name):
    first = ReplayBuffer(client, buffer_name, capacity=10)
    second = ReplayBuffer(client, buffer_name, capacity=10)
    a = first.add(_batch([1, 2, 3]))
    b = second.add(_batch([4, 5]))
    assert a.ids.tolist() == [1, 2, 3]
    assert b.ids.tolist() == [4, 5]  # one id sequence across objects
    assert len(first) == len(second) == 5
    assert first.get([5, 1])["x"].tolist() == [5.0, 1.0]
    assert second.get([2])["x"].tolist() == [2.0]
    third = ReplayBuffer.open(client, buffer_name)
    assert third.sample(5)["x"].tolist() != []
    assert sorted(third.sample(5)["x"].tolist()) == [1, 2, 3, 4, 5]


def test_names_do_not_interfere(client):
    one = ReplayBuffer(client, "one", capacity=3)
    two = ReplayBuffer(client, "two", capacity=5)
    one.add(_batch([1, 2, 3, 4]))
    two.add(_batch([9]))
    assert len(one) == 3 and len(two) == 1
    assert two.get([1])["x"].tolist() == [9.0]


def test_capacity_mismatch_is_refused(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=10)
    with pytest.raises(ConfigMismatchError, match="capacity 10") as info:
        ReplayBuffer(client, buffer_name, capacity=11)
    assert buffer_name in str(info.value) and "11" in str(info.value)


def test_eviction_policy_mismatch_is_refused(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=10, prioritized_capacity=True)
    with pytest.raises(ConfigMismatchError, match="prioritized_capacity"):
        ReplayBuffer(client, buffer_name, capacity=10, prioritized_capacity=False)
    other = f"{buffer_name}-b"
    ReplayBuffer(client, other, capacity=10)
    with pytest.raises(ConfigMismatchError, match="eviction"):
        ReplayBuffer(client, other, capacity=10, prioritized_capacity=True)


def test_container_kind_mismatch_is_refused(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=10).add(States(np.zeros((2, 3))))
    with pytest.raises(ConfigMismatchError, match="states.*trajectories|kind"):
        ReplayBuffer(client, buffer_name, capacity=10, kind="trajectories")
    assert ReplayBuffer(client, buffer_name, capacity=10, kind="states").kind == "states"


def test_prioritized_sampling_is_per_object_not_a_mismatch(client, buffer_name):
    plain = ReplayBuffer(client, buffer_name, capacity=10)
    prioritized = ReplayBuffer(client, buffer_name, capacity=10, prioritized_sampling=True)
    assert plain.sampler.name == "uniform" and prioritized.sampler.name == "prioritized"


def test_newer_stored_format_is_refused(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=10)
    client.hset(BufferKeys(buffer_name).meta, "format_version", 99)
    with pytest.raises(ConfigMismatchError, match="newer"):
        ReplayBuffer(client, buffer_name, capacity=10)


def test_open_adopts_the_stored_configuration(client, buffer_name):
    ReplayBuffer(client, buffer_name, capacity=7, prioritized_capacity=True).add(
        _batch([1.0], [0.5])
    )
    opened = ReplayBuffer.open(client, buffer_name)
    assert opened.capacity == 7
    assert opened.prioritized_capacity is True
    assert opened.kind == "dict"
    assert len(opened) == 1
    assert ReplayBuffer(client, buffer_name, capacity=None).capacity == 7


def test_open_of_a_missing_buffer_is_refused(client, buffer_name):
    with pytest.raises(ConfigMismatchError, match=buffer_name):
        ReplayBuffer.open(client, buffer_name)
    with pytest.raises(ConfigMismatchError, match="does not exist"):
        ReplayBuffer(client, buffer_name, capacity=None)
    assert client.exists(*BufferKeys(buffer_name).all_keys()) == 0


# -- add ------------------------------------------------------------------------------


def test_add_is_a_reserving_script_then_one_transaction(client, buffer_name, monkeypatch):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(_batch([0.0], [0.0]))  # fixes the schema and loads the scripts
    log = CommandLog(client)
    trips: list[list[str]] = []
    original = redis.client.Pipeline.execute

    def recording(pipe, *args, **kwargs):
        trips.append([str(command[0]).upper() for command, _ in pipe.command_stack])
        return original(pipe, *args, **kwargs)

    monkeypatch.setattr(redis.client.Pipeline, "execute", recording)
    result = buffer.add(_batch(np.arange(8), np.zeros(8)))
    # two round trips: the reserving function (with EVALSHA: the script and SCRIPT EXISTS
    # of the commit, one pipeline), then one transaction
    assert scripts.uses_functions(client)
    assert log.names == ["FCALL"]
    assert trips == [["MULTI", "HSET", "FCALL", "EXEC"]]
    assert isinstance(result, AddResult)
    assert result.ids.dtype == np.int64
    assert result.ids.tolist() == list(range(2, 10))
    assert result.evicted == 4
    assert result.score is None


def test_add_returns_consecutive_ids_and_eviction_counts(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    results = [buffer.add(_batch(np.arange(n))) for n in (3, 1, 2, 6)]
    assert [r.ids.tolist() for r in results] == [[1, 2, 3], [4], [5, 6], [7, 8, 9, 10, 11, 12]]
    assert [r.evicted for r in results] == [0, 0, 2, 6]
    assert len(buffer) == 4
    assert _ids_in_order(client, buffer_name) == [9, 10, 11, 12]


def test_batch_larger_than_capacity_keeps_its_newest_items(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    result = buffer.add(_batch(np.arange(10)))
    assert result.evicted == 7
    assert buffer.get([8, 9, 10])["x"].tolist() == [7.0, 8.0, 9.0]
    with pytest.raises(KeyError, match=r"\[7\]"):
        buffer.get([7])


# -- len, clear, drop -------------------------------------------------------------------


def test_clear_resets_counters_keeps_schema_and_never_reuses_ids(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_sampling=True)
    buffer.add(_batch([1, 2, 3, 4], [0, 1, 2, 3]))
    buffer.sample(2)
    assert buffer.clear() == 3
    assert len(buffer) == 0
    stats = buffer.stats()
    assert (stats["inserted"], stats["evicted"], stats["sampled"], stats["length"]) == (0, 0, 0, 0)
    assert stats["capacity"] == 3 and stats["kind"] == "dict"
    result = buffer.add(_batch([5], [0]))
    assert result.ids.tolist() == [5]
    with pytest.raises(SchemaError):
        buffer.add({"y": np.zeros(2), "log_rewards": np.zeros(2)})
    with pytest.raises(SchemaError):  # a fresh object sees the kept schema too
        ReplayBuffer(client, buffer_name, capacity=3).add({"x": np.zeros(1, dtype=np.int8)})
    assert buffer.stats()["inserted"] == 1
    assert buffer.sample(1)["x"].tolist() == [5.0]
    assert buffer.clear() == 1 and buffer.clear() == 0


def test_drop_removes_every_key(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3, prioritized_sampling=True)
    buffer.add(_batch([1, 2, 3, 4], [0, 1, 2, 3]))
    keys = BufferKeys(buffer_name).all_keys()
    assert client.exists(*keys) >= 6
    buffer.drop()
    assert client.exists(*keys) == 0
    # the name is free again, with any configuration
    again = ReplayBuffer(client, buffer_name, capacity=5)
    assert again.add({"z": np.zeros(2, dtype=np.int8)}).ids.tolist() == [1, 2]


# -- stats, top, get --------------------------------------------------------------------


def test_stats_report_counters_length_capacity_and_memory(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    buffer.add(_batch(np.arange(3)))
    buffer.add(_batch(np.arange(3)))
    buffer.sample(3)
    buffer.sample(2)
    stats = buffer.stats()
    assert stats["name"] == buffer_name
    assert stats["capacity"] == 4
    assert stats["length"] == 4 == len(buffer)
    assert stats["inserted"] == 6 and stats["evicted"] == 2 and stats["sampled"] == 5
    assert stats["inserted"] - stats["evicted"] == stats["length"]
    assert stats["last_id"] == 6
    assert stats["kind"] == "dict" and stats["eviction"] == "fifo"
    assert stats["prioritized_sampling_ready"] is False
    memory = stats["memory_bytes"]
    assert memory is None or memory > 0
    assert "fifo" in repr(buffer) and buffer_name in repr(buffer)


@pytest.mark.redis_server
def test_stats_memory_grows_with_content(real_client, buffer_name):
    buffer = ReplayBuffer(real_client, buffer_name, capacity=100)
    buffer.add(_batch(np.arange(1)))
    small = buffer.stats()["memory_bytes"]
    buffer.add({"x": np.zeros(50, dtype=np.float32)})
    assert buffer.stats()["memory_bytes"] > small > 0


def test_top_lists_highest_log_rewards(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    rewards = [0.5, -np.inf, 3.0, -2.0, 1.25]
    buffer.add(_batch(np.arange(5), rewards))
    assert buffer.top(3) == [(3, 3.0), (5, 1.25), (1, 0.5)]
    assert buffer.top(10) == [(3, 3.0), (5, 1.25), (1, 0.5), (4, -2.0), (2, -np.inf)]
    assert buffer.top(1) == [(3, 3.0)]


def test_top_zero_is_empty(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10)
    buffer.add(_batch(np.arange(5), np.arange(5.0)))
    assert buffer.top(0) == []
    assert buffer.top(-1) == []


def test_get_returns_items_in_the_order_asked_and_names_missing_ids(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    buffer.add(_batch([10, 20, 30, 40]))
    assert buffer.get(np.array([4, 2, 4]))["x"].tolist() == [40.0, 20.0, 40.0]
    with pytest.raises(KeyError, match=r"\[1, 99\]"):
        buffer.get([1, 3, 99])


def test_get_and_sample_on_a_buffer_without_schema(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    with pytest.raises(KeyError):
        buffer.get([1])
    assert len(buffer) == 0


def test_trajectory_kind_is_fixed_by_the_first_add(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=3)
    assert buffer.kind is None
    traj = Trajectories(np.zeros((2, 1, 1)), np.zeros((1, 1)), np.array([1]))
    buffer.add(traj)
    assert buffer.kind == "trajectories"
    assert ReplayBuffer(client, buffer_name, capacity=3).kind == "trajectories"
