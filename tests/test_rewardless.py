"""Buffers whose schema has no log_rewards field keep no ``prio`` zset (meta rewards = 0):
every item's log-reward is 0, and everything that reads log-rewards answers as if the
zset held 0 for each item (reward order = insertion order)."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from key_contents import key_contents

from redisbuf import ReplayBuffer
from redisbuf.errors import InvalidBatchError
from redisbuf.sampling.samplers import PERSampler
from redisbuf.sampling.selectors import MaxHeapSampler, MinHeapSampler
from redisbuf.store.functions import install


def _plain(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + n, dtype=np.int64)[:, None]}


def test_no_prio_zset_and_rewards_read_as_zero(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=5, sampler=PERSampler())
    first = buf.add(_plain(3)).ids.tolist()
    second = buf.add(_plain(3, 3)).ids.tolist()  # evicts the oldest: FIFO
    assert client.hget(buf.keys.meta, "rewards") == b"0"
    assert not client.exists(buf.keys.prio)
    assert len(buf) == 5 and buf.stats()["evicted"] == 1
    kept = first[1:] + second
    assert [int(m) for m in client.zrange(buf.keys.order, 0, -1)] == kept
    assert buf.top(3) == [(i, 0.0) for i in kept[::-1][:3]]  # ties: the newest first
    assert set(buf.sample(64)["x"][:, 0].tolist()) <= set(range(1, 6))


def test_rewards_kept_when_the_schema_has_them(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=5)
    buf.add({"x": np.zeros((3, 1)), "log_rewards": np.array([0.5, -1.0, 2.0])})
    assert client.hget(buf.keys.meta, "rewards") == b"1"
    assert [s for _, s in client.zrange(buf.keys.prio, 0, -1, withscores=True)] == [-1.0, 0.5, 2.0]
    assert [score for _, score in buf.top(2)] == [2.0, 0.5]


@pytest.mark.parametrize("selector", [MaxHeapSampler(), MinHeapSampler()])
def test_heap_selectors_by_log_reward_take_the_oldest_first(client, buffer_name, selector):
    """All log-rewards equal (0): the oldest first, as among equals with a prio zset."""
    buf = ReplayBuffer(client, buffer_name, capacity=10, sampler=selector)
    ids = buf.add(_plain(4)).ids.tolist()
    rewarded = ReplayBuffer(client, buffer_name + "-r", capacity=10, sampler=selector)
    rewarded.add({**_plain(4), "log_rewards": np.zeros(4)})
    assert buf.sample(3)["x"][:, 0].tolist() == [0, 1, 2] == (
        rewarded.sample(3)["x"][:, 0].tolist())
    assert len(ids) == 4


def test_save_and_load_round_trip(client, buffer_name, tmp_path) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    buf.add(_plain(4))
    buf.update_priority(buf.add(_plain(2, 4)).ids, [3.0, 4.0])
    path = tmp_path / "b.rb"
    assert buf.save(path) == 6
    other = ReplayBuffer(client, buffer_name + "-copy", capacity=10, sampler=PERSampler())
    other.load(path)
    assert len(other) == 6 and not client.exists(other.keys.prio)
    assert other.get(client.zrange(other.keys.order, 0, -1))["x"][:, 0].tolist() == list(range(6))
    state = other.state_dict()
    assert list(state["priorities"]) == [0.0] * 6
    assert sorted(state["per_priorities"])[-2:] == [3.0, 4.0]


def test_stats_give_zero_log_rewards(client, buffer_name) -> None:
    buf = ReplayBuffer(client, buffer_name, capacity=10)
    assert buf.stats().get("priority_min") is None
    buf.add(_plain(2))
    stats = buf.stats()
    assert (stats["priority_min"], stats["priority_max"]) == (0.0, 0.0)


@pytest.mark.redis_server
def test_a_foreign_add_with_a_reward_but_no_reward_field_is_refused(real_client, buffer_name):
    buf = ReplayBuffer(real_client, buffer_name, capacity=10)
    buf.add(_plain(2))
    install(real_client)
    keys = buf.keys.all_keys()
    schema = real_client.hget(buf.keys.meta, "schema")
    blob = real_client.hget(buf.keys.items, real_client.zrange(buf.keys.order, 0, 0)[0])
    before = key_contents(real_client, keys)
    with pytest.raises(redis.ResponseError, match="RB_INVALID.*no log_rewards field"):
        real_client.fcall("rb_add", len(keys), *keys, schema, 1, "", blob, "1.5")
    assert key_contents(real_client, keys) == before
    assert real_client.fcall("rb_add", len(keys), *keys, schema, 1, "", blob, "0")[1] == 1
    assert len(buf) == 3 and not real_client.exists(buf.keys.prio)


def test_bad_reward_argument_through_the_python_script_path(client, buffer_name) -> None:
    """The same rule through EVALSHA (what fakeredis runs): nothing written."""
    from redisbuf.store import scripts

    buf = ReplayBuffer(client, buffer_name, capacity=10)
    buf.add(_plain(1))
    schema = client.hget(buf.keys.meta, "schema")
    blob = client.hget(buf.keys.items, client.zrange(buf.keys.order, 0, 0)[0])
    meta = client.hgetall(buf.keys.meta)
    script = scripts.load("add")
    with pytest.raises(InvalidBatchError, match="no log_rewards field"):
        script(client, buf.keys.all_keys(), [schema, 1, "", blob, "2"])
    assert client.hgetall(buf.keys.meta) == meta and len(buf) == 1
