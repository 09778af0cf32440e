"""Redis Cluster, on a real 3-master cluster on loopback (fixtures in conftest.py):
cluster URLs, buffers of different names on different masters, every buffer's keys in
one slot and its scripts touching only declared keys, a sharded buffer spread over the
masters with the unsharded sampling distribution, and a stopped master."""

from __future__ import annotations

import re

import numpy as np
import pytest
import redis
import redis.cluster
import redis.crc
from cluster_helpers import (
    check_prioritized_pairs,
    check_prioritized_with_replacement,
    check_uniform_subsets,
    filled,
)

from redisbuf import ReplayBuffer
from redisbuf.buffers.episodes import EpisodeKeys
from redisbuf.buffers.fragments import FragmentKeys
from redisbuf.buffers.sequence import SequenceKeys
from redisbuf.buffers.sharded import ShardedReplayBuffer
from redisbuf.errors import ServerUnavailableError, ShardUnavailableError
from redisbuf.sampling.samplers import PERSampler
from redisbuf.servers.cluster import LocalCluster
from redisbuf.store.connection import connect, is_cluster
from redisbuf.store.keys import BufferKeys, StagingKeys
from redisbuf.store.scripts import lua_dir

pytestmark = pytest.mark.redis_server


def batch(values, log_rewards=None):
    values = np.asarray(values)
    rewards = np.zeros(len(values)) if log_rewards is None else np.asarray(log_rewards)
    return {"v": values, "log_rewards": rewards}


def node_port(client, key: str) -> int:
    return int(client.get_node_from_key(key).port)


# -- URLs ----------------------------------------------------------------------------


def test_a_url_to_any_node_gives_a_cluster_client(redis_cluster, cluster_client):
    for url in [*redis_cluster.urls, redis_cluster.urls[1].replace("redis://", "redis+cluster://")]:
        client = connect(url)
        assert is_cluster(client)
        with ReplayBuffer(url, "via-url", capacity=50) as buffer:  # no MovedError
            buffer.add(batch(np.arange(5)))
            assert sorted(buffer.sample(5)["v"].tolist()) == [0, 1, 2, 3, 4]
        ReplayBuffer.open(client, "via-url").drop()
        client.close()


def test_a_cluster_url_with_a_database_is_refused(redis_cluster):
    url = redis_cluster.urls[0].replace("redis://", "redis+cluster://") + "/2"
    with pytest.raises(ServerUnavailableError, match="only database 0, the URL names database 2"):
        connect(url)
    with pytest.raises(ServerUnavailableError, match="is a Redis Cluster node.*only database 0"):
        connect(redis_cluster.urls[0] + "/1")


# -- one buffer per slot ---------------------------------------------------------------


def test_every_key_of_a_buffer_shares_one_slot():
    for keys in (
        BufferKeys("b").all_keys() + [BufferKeys("b").shards],
        StagingKeys("b", "t").all_keys(),
        EpisodeKeys("b").all_keys(),
        SequenceKeys("b").all_keys(),
        FragmentKeys("b").all_keys(),
    ):
        assert {redis.crc.key_slot(k.encode()) for k in keys} == {redis.crc.key_slot(b"b")}


_CALL = re.compile(r"redis\.p?call\(\s*'([A-Za-z]+)'\s*,\s*([^,)]*)")


def test_lua_scripts_touch_only_keys_they_are_given():
    """Every command's key is a variable (taken from KEYS), never a name put together
    in Lua: Redis Cluster routes a script by its declared KEYS only. The one built
    string is the PUBLISH channel (a channel, not a key)."""
    checked = 0
    for path in sorted(lua_dir().glob("*.lua")):
        for command, first in _CALL.findall(path.read_text()):
            if command.upper() in ("PUBLISH", "TIME"):
                continue
            assert ".." not in first and "'" not in first and '"' not in first, (
                f"{path.name}: {command} {first}"
            )
            checked += 1
    assert checked > 100


def test_buffers_with_different_names_spread_over_the_masters(redis_cluster, cluster_client):
    names = [f"buf-{i}" for i in range(6)]  # their tags hash into all three slot ranges
    ports = set()
    for name in names:
        buffer = ReplayBuffer(cluster_client, name, capacity=20, prioritized_sampling=True)
        ports.add(node_port(cluster_client, buffer.keys.meta))
        buffer.add(batch(np.arange(10), np.arange(10.0)))
        assert len(buffer.sample(4)["v"]) == 4
    assert ports == set(redis_cluster.ports)


def test_every_script_path_runs_on_a_cluster_slot(cluster_client, tmp_path):
    """A broad pass over the buffer's scripts on a cluster: a script that touched a key
    outside its slot would fail there (CROSSSLOT / non-local key)."""
    buffer = ReplayBuffer(cluster_client, "scripts", capacity=8, prioritized_sampling=True)
    for start in range(0, 20, 4):
        buffer.add(batch(np.arange(start, start + 4), np.arange(4.0)))
    assert len(buffer) == 8
    buffer.sample(3)
    buffer.sample(3, replacement=True)
    buffer.sample(2, sample_range=slice(-4, None))
    assert buffer.top(1)[0][1] == 3.0 and buffer.stats()["length"] == 8
    assert buffer.save(tmp_path / "s.rb") == 8
    buffer.clear()
    assert buffer.load(tmp_path / "s.rb") == 8 and len(buffer) == 8
    per = ReplayBuffer(cluster_client, "per", capacity=8, sampler=PERSampler())
    ids = per.add(batch(np.arange(4)), priorities=[1.0, 2.0, 3.0, 4.0]).ids
    assert per.update_priority(ids, [4.0, 3.0, 2.0, 1.0]) == 4
    assert per.sample_with_info(3).weights is not None
    # a PER checkpoint: priorities and use counts back, the tree rebuilt on the slot
    uses = sorted(int(u) for u in cluster_client.hvals(per.keys.uses))
    assert per.save(tmp_path / "per.rb") == 4
    per.clear()
    assert per.load(tmp_path / "per.rb") == 4
    stored = [int(m) for m in cluster_client.zrange(per.keys.order, 0, -1)]
    assert sorted(per.priorities(stored).tolist()) == [1.0, 2.0, 3.0, 4.0]
    assert sorted(int(u) for u in cluster_client.hvals(per.keys.uses)) == uses
    assert len(per.sample_with_info(3).ids) == 3
    used = ReplayBuffer(cluster_client, "used", capacity=8, max_use=1)
    used.add(batch(np.arange(3)))
    used.sample(3)
    assert len(used) == 0
    for each in (buffer, per, used):
        each.drop()


# -- one buffer over several masters ----------------------------------------------------


def test_a_sharded_buffer_puts_its_shards_on_different_masters(redis_cluster, cluster_client):
    buffer = ShardedReplayBuffer(cluster_client, "spread", capacity=30, shards=3)
    ports = [node_port(cluster_client, shard.keys.meta) for shard in buffer.shards]
    assert sorted(ports) == sorted(redis_cluster.ports)
    for shard in buffer.shards:
        assert len({cluster_client.keyslot(key) for key in shard.keys.all_keys()}) == 1
    for start in range(0, 12, 2):
        buffer.add(batch([start, start + 1]))
    assert [len(shard) for shard in buffer.shards] == [4, 4, 4]
    assert buffer.stats()["length"] == 12
    assert sorted(buffer.sample(12)["v"].tolist()) == list(range(12))


def test_sharded_uniform_draws_on_the_cluster(cluster_client):
    check_uniform_subsets(filled(cluster_client, "uniform", prioritized=False), 300)


def test_sharded_prioritized_draws_on_the_cluster(cluster_client):
    buffer = filled(cluster_client, "prioritized", prioritized=True)
    check_prioritized_pairs(buffer, 300)
    check_prioritized_with_replacement(buffer, 150)


def test_a_sharded_checkpoint_round_trips_on_the_cluster(cluster_client, tmp_path):
    """save / load of a sharded buffer whose shards sit on the three masters: every
    shard's restore (staging keys, swap script) runs on its own master's slot."""
    buffer = ShardedReplayBuffer(cluster_client, "ckpt", capacity=12, shards=3, seed=4)
    for start in range(0, 24, 3):
        buffer.add(batch(np.arange(start, start + 3), np.arange(3.0)))
    buffer.sample(5)
    before = [[r[1:] for r in shard._records()] for shard in buffer.shards]
    stats = buffer.stats()
    assert buffer.save(tmp_path / "s.rb") == 12
    copy = ShardedReplayBuffer(cluster_client, "ckpt-copy", capacity=12, shards=3)
    assert copy.load(tmp_path / "s.rb") == 12
    assert [[r[1:] for r in shard._records()] for shard in copy.shards] == before
    assert {k: copy.stats()[k] for k in ("inserted", "evicted", "sampled")} == {
        k: stats[k] for k in ("inserted", "evicted", "sampled")}
    plain = ReplayBuffer(cluster_client, "ckpt-plain", capacity=12)
    assert plain.load(tmp_path / "s.rb") == 12
    two = ShardedReplayBuffer(cluster_client, "ckpt-two", capacity=12, shards=2)
    two.load_state_dict(plain.state_dict())
    assert [len(s) for s in two.shards] == [6, 6]
    assert sorted(two.sample(12)["v"].tolist()) == sorted(buffer.sample(12)["v"].tolist())
    for each in (buffer, copy, plain, two):
        each.drop()


def test_a_stopped_master_fails_only_its_shard():
    with LocalCluster(masters=3) as cluster:
        client = redis.cluster.RedisCluster.from_url(cluster.urls[0])
        buffer = ShardedReplayBuffer(client, "faults", capacity=60, shards=3, seed=3)
        ids, values = {}, {}
        for b in range(3):
            added = np.arange(10 * b, 10 * b + 5)
            result = buffer.add(batch(added))
            ids[int(result.ids[0]) % 3], values[int(result.ids[0]) % 3] = result.ids, added
        buffer.sample(6)  # scripts loaded everywhere before the failure
        cluster.stop_master(cluster.ports.index(node_port(client, buffer.shards[1].keys.meta)))

        for call in (lambda: buffer.sample(2), lambda: len(buffer), lambda: buffer.get(ids[1])):
            with pytest.raises(ShardUnavailableError, match=r"shard 1 of 3 \('faults\.shard1"):
                call()
        # nothing lost elsewhere: shards 0 and 2 read and write
        for k in (0, 2):
            np.testing.assert_array_equal(buffer.get(ids[k])["v"], values[k])
        landed, refused = [], []
        for _ in range(3):
            try:
                landed.append(int(buffer.add(batch([100, 101])).ids[0]) % 3)
            except ShardUnavailableError as exc:
                refused.append(exc.shard)
        assert sorted(landed) == [0, 2] and refused == [1]
        assert [len(buffer.shards[k]) for k in (0, 2)] == [7, 7]
        assert sorted(buffer.shards[0].sample(7)["v"].tolist())[-2:] == [100, 101]
        client.close()


def test_opening_a_sharded_buffer_with_a_master_down_names_the_shard_and_the_node():
    """A master is down when a process opens the sharded buffer (by client or URL): the
    error names the shard and its node (redis-py's raw ConnectionError came out, from
    loading the functions library on every primary); with the master of the layout's slot
    down too, the error names the layout and that node."""
    with LocalCluster(masters=3) as cluster:
        client = redis.cluster.RedisCluster.from_url(cluster.urls[0])
        buffer = ShardedReplayBuffer(client, "opening", capacity=60, shards=3, seed=3)
        buffer.add(batch(np.arange(6)))
        layout_port = node_port(client, buffer.keys.shards)
        k = next(k for k in range(3) if node_port(client, buffer.shards[k].keys.meta)
                 != layout_port)
        port = node_port(client, buffer.shards[k].keys.meta)
        cluster.stop_master(cluster.ports.index(port))
        alive = next(url for url in cluster.urls if not url.endswith(f":{port}"))
        for source in (lambda: redis.cluster.RedisCluster.from_url(alive), lambda: alive):
            with pytest.raises(ShardUnavailableError,
                               match=rf"shard {k} of 3 .*node 127\.0\.0\.1:{port}\b") as caught:
                ShardedReplayBuffer(source(), "opening", capacity=60, shards=3)
            assert caught.value.shard == k
        cluster.stop_master(cluster.ports.index(layout_port))
        alive = next(url for url in cluster.urls
                     if not url.endswith((f":{port}", f":{layout_port}")))
        with pytest.raises(ServerUnavailableError,
                           match=rf"layout .*node 127\.0\.0\.1:{layout_port}\b"):
            ShardedReplayBuffer(alive, "opening", capacity=60, shards=3)
        client.close()


def test_the_command_line_refuses_a_sharded_name_and_reads_its_shards(
    redis_cluster, cluster_client, capsys, tmp_path
):
    from redisbuf.cli import main

    buffer = ShardedReplayBuffer(cluster_client, "cli", capacity=30, shards=3)
    buffer.add(batch([1, 2]))
    url = redis_cluster.urls[0]
    assert main(["inspect", "cli", "--url", url]) != 0
    assert "is sharded" in capsys.readouterr().err
    # export / import take the sharded buffer whole
    assert main(["export", "cli", str(tmp_path / "cli.rb"), "--url", url]) == 0
    assert main(["import", str(tmp_path / "cli.rb"), "cli-copy", "--url", url]) == 0
    capsys.readouterr()
    copy = ShardedReplayBuffer.open(cluster_client, "cli-copy")
    assert [len(s) for s in copy.shards] == [len(s) for s in buffer.shards]
    copy.drop()
    shard = next(s for s in buffer.shards if len(s))
    assert main(["inspect", shard.name, "--url", url, "--json"]) == 0
    assert '"length": 2' in capsys.readouterr().out
    assert main(["list", "--url", url]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in buffer.shard_names)


def _add_from_process(url: str, values: list[int]) -> None:
    buffer = ShardedReplayBuffer(url, "multi", capacity=300, shards=3)
    for value in values:
        buffer.add(batch([value, value + 1000]))
    buffer.close()


@pytest.mark.multiprocess
def test_processes_adding_to_one_sharded_buffer(redis_cluster, cluster_client):
    import multiprocessing

    ShardedReplayBuffer(cluster_client, "multi", capacity=300, shards=3)
    context = multiprocessing.get_context("fork")
    processes = [
        context.Process(
            target=_add_from_process, args=(redis_cluster.urls[p], list(range(20 * p, 20 * p + 20)))
        )
        for p in range(3)
    ]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    buffer = ShardedReplayBuffer.open(cluster_client, "multi")
    assert len(buffer) == 120 and all(len(shard) > 0 for shard in buffer.shards)
    values = sorted(buffer.sample(120)["v"].tolist())
    assert values == sorted([v for p in range(60) for v in (p, p + 1000)])


def _give_slot(redis_cluster, slot: int, owner: int, port: int) -> None:
    """Hand the (empty) ``slot`` from the master on ``owner`` to the one on ``port`` as a
    resharding does: IMPORTING on the new owner and MIGRATING on the old one, then NODE on
    the new owner first, which bumps its config epoch (a bare SETSLOT NODE does not, and
    the old owner could win the slot back through the cluster bus), then on every other
    master."""
    nodes = {p: redis.Redis(port=p) for p in redis_cluster.ports}
    try:
        ids = {p: node.execute_command("CLUSTER MYID") for p, node in nodes.items()}
        nodes[port].execute_command("CLUSTER SETSLOT", slot, "IMPORTING", ids[owner])
        nodes[owner].execute_command("CLUSTER SETSLOT", slot, "MIGRATING", ids[port])
        for p in sorted(nodes, key=lambda p: p != port):
            nodes[p].execute_command("CLUSTER SETSLOT", slot, "NODE", ids[port])
    finally:
        for node in nodes.values():
            node.close()


def test_a_buffer_client_follows_its_slot_and_runs_transactions(redis_cluster, cluster_client):
    """A buffer's client on a cluster is its slot master's own (MULTI/EXEC and a
    keyless command in a pipeline work); when the slot moves, a MOVED call is sent
    again to the new master."""
    from redisbuf.store.connection import SlotClient

    buffer = ReplayBuffer(cluster_client, "follow", capacity=10)
    client = buffer.client.unwrapped
    assert isinstance(client, SlotClient)
    pipe = client.pipeline(transaction=True)
    pipe.hset(buffer.keys.meta, "probe", 1)
    pipe.execute_command("SCRIPT", "EXISTS", "0" * 40)
    assert pipe.execute() == [1, [0]]
    slot = cluster_client.keyslot(buffer.keys.meta)
    owner = client.node.port
    other = next(p for p in redis_cluster.ports if p != owner)
    buffer.drop()  # SETSLOT NODE needs the slot empty
    try:
        _give_slot(redis_cluster, slot, owner, other)
        assert client.hset(buffer.keys.meta, "probe", 2) == 1  # MOVED, then sent again
        assert client.node.port == other
        assert cluster_client.hget(buffer.keys.meta, "probe") == b"2"
    finally:
        cluster_client.delete(buffer.keys.meta)
        _give_slot(redis_cluster, slot, other, owner)
        cluster_client.nodes_manager.initialize()


def test_the_other_buffer_kinds_work_on_a_cluster(cluster_client):
    """Episode, sequence and fragment buffers keep their keys in one slot too; their
    scripts run on a cluster client."""
    from redisbuf import EpisodeBuffer, FragmentBuffer, SequenceBuffer

    episodes = EpisodeBuffer(cluster_client, "episodes", capacity_episodes=3, seed=0)
    for length in (2, 3):
        episodes.push({"t": np.arange(length, dtype=np.int64)})
    assert len(episodes) == 2 and len(episodes.sample(2)) == 2
    sequences = SequenceBuffer(cluster_client, "sequences", 2, 8, seed=0)
    for t in range(4):
        sequences.add_batch({"obs": np.array([t, 10 + t], dtype=np.float32)}, env_ids=[0, 1])
    data, _info = sequences.get_batch(2, 2)
    assert data["obs"].shape == (2, 2)
    fragments = FragmentBuffer(cluster_client, "fragments", 2, 1, 1, 1, seed=0)
    fragments.update_model_version("s", 0)
    fragments.add_fragment({"obs": np.zeros(3, dtype=np.int16)}, 0, "s", "a")
    assert len(fragments.fetch(1, timeout=0)) == 1


def test_a_pipeline_that_loses_its_master_reads_the_slot_map_again(cluster_client,
                                                                    monkeypatch):
    """A sampler's commit is a pipeline: when its master is lost during it, the slot map
    is read again, so the calls that follow go to the master that serves the slot now
    (the review saw a PER sampler call a dead master for good after a failover)."""
    import redis as redis_lib

    from redisbuf import PERSampler
    from redisbuf.errors import ServerUnavailableError

    buffer = ReplayBuffer(cluster_client, "lostpipe", capacity=20, sampler=PERSampler(),
                          seed=0)
    buffer.add({"x": np.arange(8)})
    buffer.sample(4)
    client = buffer.client.unwrapped
    reads: list[bool] = []
    rebind = client._rebind
    monkeypatch.setattr(client, "_rebind", lambda: reads.append(True) or rebind())
    real = client._client.pipeline

    def lost_pipeline(*args, **kwargs):
        pipe = real(*args, **kwargs)

        def lost(*_, **__):
            raise redis_lib.exceptions.ConnectionError("master lost")

        pipe.execute = lost
        return pipe

    monkeypatch.setattr(client._client, "pipeline", lost_pipeline)
    with pytest.raises(ServerUnavailableError, match="master lost"):
        buffer.sample(4)
    assert reads  # the slot map was read again
    monkeypatch.setattr(client._client, "pipeline", real)
    assert len(buffer.sample(4)["x"]) == 4
    buffer.drop()
