"""Prioritized draws from replicas (redisbuf/sampling/replica.py, lua/_masslog.lua): the mass log,
catching up, reading afresh when the log no longer reaches back, applying one's own
update_priority, and the rule that a draw follows every change made before it began,
across processes on a real server."""

from __future__ import annotations

import json
import traceback
import uuid
from typing import Any

import numpy as np
import pytest
from process_helpers import fresh_context
from replica_helpers import followed_masses, fresh_replica, replica_scores, stored_priorities
from test_sampling import chi2, chi2_limit

from redisbuf import BufferKeys, PERSampler, ReplayBuffer, ShardedReplayBuffer
from redisbuf.sampling import first_read
from redisbuf.sampling.replica import MassReplica, replica_of


def _per_buffer(client, name, capacity=100, **kwargs):
    return ReplayBuffer(client, name, capacity=capacity, sampler=PERSampler(**kwargs), seed=3)


def _with_a_snapshot_out_of_reach(client, name: str) -> tuple[ReplayBuffer, BufferKeys]:
    """A softmax buffer with a snapshot (of 10 items) that the log no longer reaches:
    12,000 rows added after it, 10,000 kept. Needs _SNAP_MIN_ITEMS below 10. (Under PER
    the log is trimmed only behind the newest snapshot: it always reaches it.)"""
    buffer = ReplayBuffer(client, name, capacity=40_000, prioritized_sampling=True, seed=3)
    buffer.add({"x": np.arange(10), "log_rewards": np.zeros(10)})
    MassReplica("softmax").load(buffer.view)  # writes a snapshot at this version
    for _ in range(12):
        buffer.add({"x": np.arange(1000), "log_rewards": np.zeros(1000)})
    return buffer, BufferKeys(name)


def _full(client, name: str, capacity: int) -> ReplayBuffer:
    """A PER buffer of ``capacity`` items (adds of 1,000), the one that added them."""
    writer = _per_buffer(client, name, capacity=capacity)
    for _ in range(capacity // 1000):
        writer.add({"x": np.arange(1000)})
    return writer


def test_every_change_is_one_log_entry_and_a_follower_matches_a_fresh_read(client, buffer_name):
    buffer = _per_buffer(client, buffer_name, capacity=10)
    keys = BufferKeys(buffer_name)
    followed_masses(client, buffer_name, "per")  # the follower starts here
    ids = buffer.add({"x": np.arange(8)}, priorities=np.arange(8.0)).ids
    log = client.lrange(keys.masslog, 0, -1)
    assert [e[:2] for e in log] == [b"X|", b"C|"] and log[1].startswith(b"C|8|")
    buffer.add({"x": np.arange(4)})  # evicts 2: one entry, new items first, then the victims
    entry = client.lrange(keys.masslog, -1, -1)[0]
    _, count, _, rows, old, new = entry.split(b"|")
    assert count == b"6" and rows.split(b",")[4:] == [b"%012d" % i for i in ids[:2]]
    assert old == b""  # under PER no score before is logged (nothing reads it)
    assert new.split(b",") == [b"7"] * 4 + [b"nan"] * 2  # the running max, then removed
    buffer.update_priority(ids[2:5], [9.0, 1.0, 2.5])
    entry = client.lrange(keys.masslog, -1, -1)[0]
    # one V entry: the ids as big-endian int64, then the priorities as big-endian doubles
    assert entry.startswith(b"V|3|") and entry.endswith(
        np.asarray(ids[2:5], ">i8").tobytes() + np.array([9.0, 1.0, 2.5], ">f8").tobytes())
    # 12-digit text ids (rb_update_priority from other languages): one U entry
    text = [b"".join(b"%012d" % i for i in ids[3:4]), np.array([0.0], ">f8").tobytes()]
    buffer._run("update_priority", keys.all_keys(), text)
    entry = client.lrange(keys.masslog, -1, -1)[0]
    assert entry.startswith(b"U|1|") and entry.endswith(b"".join(text))
    masses = followed_masses(client, buffer_name, "per")
    assert masses[int(ids[3])] == pytest.approx(1e-6**0.6)
    assert masses[int(ids[2])] == pytest.approx((9 + 1e-6) ** 0.6)
    assert int(ids[0]) not in masses and len(masses) == 10
    buffer.clear()  # a new epoch: the follower reads everything again
    log = client.lrange(keys.masslog, 0, -1)
    assert len(log) == 1 and log[0].startswith(b"X|0|")
    assert followed_masses(client, buffer_name, "per") == {}


def test_the_log_keeps_a_bounded_number_of_ids_and_a_replica_behind_it_reads_afresh(
    client, buffer_name
):
    # softmax: the prio zset holds the scores, the log only the newest changes
    buffer = ReplayBuffer(client, buffer_name, capacity=50_000, prioritized_sampling=True)
    keys = BufferKeys(buffer_name)
    stale = MassReplica("softmax")
    stale.load(buffer.view)
    for _ in range(15):
        buffer.add({"x": np.arange(1000), "log_rewards": np.zeros(1000)})
    meta = client.hmget(keys.meta, "log_ids", "log_version", "log_first")
    held, version, first = (int(v) for v in meta)
    # the limit is max(10 000, capacity / 4) = 12 500 ids; the newest entry always stays
    assert held <= 12_500 and held == 1000 * client.llen(keys.masslog)
    assert version - first + 1 == client.llen(keys.masslog) < 13
    stale.sync(buffer.view)  # too far behind for the log: it reads the buffer again
    assert replica_scores(stale) == replica_scores(fresh_replica(client, buffer_name, "softmax"))
    assert len(stale) == 15_000


def test_a_per_log_is_trimmed_only_behind_the_snapshot(client, buffer_name):
    """Under PER the log and the snapshot are the priorities: with no replica following
    (writing snapshots), nothing is trimmed, and a replica far behind still follows the
    log; its snapshot then lets the next change trim to the usual bound."""
    buffer = _per_buffer(client, buffer_name, capacity=50_000)
    keys = BufferKeys(buffer_name)
    stale = MassReplica("per")
    stale.load(buffer.view)  # writes a snapshot of the empty buffer
    for _ in range(15):
        buffer.add({"x": np.arange(1000)})
    held, first = (int(v) for v in client.hmget(keys.meta, "log_ids", "log_first"))
    assert held == 15_000 and first == 1  # everything since the epoch's start
    stale.sync(buffer.view)  # follows all of it, then publishes a snapshot
    assert replica_scores(stale) == replica_scores(fresh_replica(client, buffer_name, "per"))
    assert int(client.hget(keys.meta, "snap_version")) == stale.version
    buffer.add({"x": np.arange(1000)})
    held = int(client.hget(keys.meta, "log_ids"))
    assert held <= 12_500 and held == 1000 * client.llen(keys.masslog)


def test_own_update_priority_is_applied_without_a_round_trip(client, buffer_name):
    buffer = _per_buffer(client, buffer_name)
    ids = buffer.add({"x": np.arange(20)}).ids
    buffer.sample(4)
    replica = replica_of(buffer.view, "per")
    version = replica.version
    buffer.update_priority([ids[0], ids[1], ids[0], 10**9], [3.0, 4.0, 5.0, 6.0])
    assert replica.version == version + 1  # its own change, applied at once
    assert replica_scores(replica)[int(ids[0])] == 5.0  # the later duplicate wins
    assert replica_scores(replica) == replica_scores(fresh_replica(client, buffer_name, "per"))
    other = _per_buffer(client, buffer_name)  # another process's change is not applied
    other.update_priority([ids[2]], [7.0])
    assert replica.version == version + 1
    buffer.sample(4)
    assert replica_scores(replica)[int(ids[2])] == 7.0


def test_a_stale_replica_never_draws_what_a_finished_change_removed(client, buffer_name):
    """Draws follow the server: an item set to priority 0 (eps 0) or evicted by another
    writer after this replica last looked is never drawn."""
    buffer = _per_buffer(client, buffer_name, capacity=40, eps=0.0)
    ids = buffer.add({"x": np.arange(40)}).ids
    buffer.sample(8)  # the replica is current here
    writer = _per_buffer(client, buffer_name, capacity=40, eps=0.0)
    writer.update_priority(ids[:30], np.zeros(30))
    writer.add({"x": np.arange(5)})  # evicts ids[:5]
    for _ in range(20):
        drawn = set(buffer.sample_with_info(64).ids.tolist())
        assert drawn <= {int(i) for i in ids[30:]} | set(range(41, 46))


def test_sharded_per_draws_follow_the_global_law(client, buffer_name):
    buffer = ShardedReplayBuffer(client, buffer_name, capacity=60, shards=3, seed=5,
                          sampler=PERSampler(alpha=0.7, eps=0.05))
    rng = np.random.default_rng(1)
    priorities = {}
    for _ in range(4):
        result = buffer.add({"x": np.arange(6)}, priorities=rng.uniform(0, 4, 6))
        priorities.update(dict(zip(result.ids.tolist(), rng.uniform(0, 4, 6), strict=True)))
    ids = np.array(sorted(priorities))
    buffer.update_priority(ids, [priorities[i] for i in ids])
    mass = np.array([(priorities[i] + 0.05) ** 0.7 for i in ids])
    p = mass / mass.sum()
    counts = dict.fromkeys(ids.tolist(), 0)
    draws = 0
    for _ in range(150):
        info = buffer.sample_with_info(100)
        for item, prob in zip(info.ids.tolist(), info.probabilities.tolist(), strict=True):
            counts[item] += 1
            assert prob == pytest.approx(p[np.searchsorted(ids, item)], rel=1e-9)
        draws += 100
    observed = np.array([counts[i] for i in ids.tolist()])
    assert chi2(observed, p * draws) < chi2_limit(len(ids) - 1)
    # weights over the whole buffer: the lowest mass of every shard gets weight 1
    info = buffer.sample_with_info(200)
    np.testing.assert_allclose(
        info.weights, (mass.min() / (info.probabilities * mass.sum())) ** 0.4, rtol=1e-9
    )
    mean = np.mean([priorities[i] for i in ids])
    expected = np.array([priorities[i] for i in info.ids.tolist()]) / mean
    np.testing.assert_allclose(info.importance_weights, expected, rtol=1e-9)


def test_sharded_update_priority_routes_each_id_to_its_shard(client, buffer_name):
    buffer = ShardedReplayBuffer(client, buffer_name, capacity=30, shards=3, seed=2,
                          sampler=PERSampler(eps=0.0))
    ids = np.concatenate([buffer.add({"x": np.arange(5)}).ids for _ in range(3)])
    assert buffer.update_priority(ids, np.zeros(len(ids))) == 15
    buffer.update_priority(ids[[2, 7]], [1.0, 3.0])
    drawn = buffer.sample_with_info(200).ids
    assert set(drawn.tolist()) == {int(ids[2]), int(ids[7])}
    share = np.mean(drawn == ids[7])
    assert 0.6 < share < 0.9  # 3^0.6 / (1 + 3^0.6) = 0.66


# -- processes ----------------------------------------------------------------------------


def _zeroing_writer(url: str, name: str, results) -> None:
    """Sets the priority of one item after another to 0 and, once each call returned,
    announces the id on a list; adds (and so evicts) between them."""
    try:
        buffer = ReplayBuffer(url, name, capacity=None, sampler=PERSampler(eps=0.0), seed=11)
        rng = np.random.default_rng(11)
        done_key = f"{name}:zeroed"
        for step in range(60):
            present = [int(i) for i in buffer.client.zrange(buffer.keys.order, 0, -1)]
            target = int(rng.choice(present))
            buffer.update_priority([target], [0.0])
            buffer.client.rpush(done_key, target)
            if step % 5 == 0:
                buffer.add({"x": np.arange(3)})
        buffer.client.rpush(done_key, -1)
        results.put({"worker": "writer"})
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put({"worker": "writer", "error": traceback.format_exc()})


@pytest.mark.multiprocess
@pytest.mark.redis_server
def test_draws_follow_every_change_another_process_finished(redis_server):
    """Strict consistency across processes: once the writer announced that an item's
    priority is 0 (eps 0), no draw begun afterwards returns it, and no draw returns an
    evicted item; the sampler's replica is behind the writer at every draw."""
    import redis

    name = f"strict-{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(redis_server.url)
    sampler = ReplayBuffer(client, name, capacity=60, sampler=PERSampler(eps=0.0), seed=4)
    sampler.add({"x": np.arange(60)})
    sampler.sample(4)
    context = fresh_context()
    results = context.Queue()
    writer = context.Process(
        target=_zeroing_writer, args=(redis_server.url, name, results)
    )
    writer.start()
    zeroed: set[int] = set()
    draws = 0
    try:
        while True:
            announced = client.lpop(f"{name}:zeroed")
            if announced is not None:
                if int(announced) < 0:
                    break
                zeroed.add(int(announced))
            present = {int(i) for i in client.zrange(sampler.keys.order, 0, -1)}
            try:
                ids = set(sampler.sample_with_info(32).ids.tolist())
            except Exception as exc:  # noqa: BLE001 - every item may be zeroed by now
                assert "empty" in str(exc)
                continue
            draws += 1
            assert not ids & zeroed, ids & zeroed
            assert ids <= present | set(range(61, 10**6))  # present when the draw began
    finally:
        writer.join(timeout=60)
    report = results.get(timeout=10)
    assert "error" not in report, report["error"]
    assert draws > 10 and len(zeroed) > 10


def test_per_is_turned_on_in_one_call_whatever_the_length(client, buffer_name):
    """Over a full buffer, one call turns PER on: the items present get their initial
    priority by the log's first entry (meta per_base, no write per item), an add or an
    update_priority afterwards is one more entry, and every reader (a new replica, the
    server's priority read) sees the items present then at the initial priority."""
    plain = ReplayBuffer(client, buffer_name, capacity=40)
    ids = plain.add({"x": np.arange(30)}).ids
    keys = BufferKeys(buffer_name)
    assert plain._run("enable_per", keys.all_keys(), ["0.6", "1e-06", "2.0", 7]) == 1
    assert client.hget(keys.meta, "per_base") == b"2.0" and client.exists(keys.per) == 0
    assert client.lrange(keys.masslog, 0, -1)[0].startswith(b"X|0|")
    new = plain.add({"x": np.arange(2)}).ids  # new items: the initial priority
    assert plain.update_priority(ids[20:22], [5.0, 6.0]) == 2
    per = {**dict.fromkeys([int(i) for i in ids], 2.0), int(new[0]): 2.0, int(new[1]): 2.0,
           int(ids[20]): 5.0, int(ids[21]): 6.0}
    assert stored_priorities(client, buffer_name) == per
    sampler = _per_buffer(client, buffer_name, capacity=40, initial_priority=2.0)
    assert set(sampler.sample_with_info(50).ids.tolist()) <= set(per)
    assert replica_scores(replica_of(sampler.view, "per")) == per


def _snapshot(replica: MassReplica) -> dict:
    return {key: (value.copy() if isinstance(value, np.ndarray) else value)
            for key, value in vars(replica).items() if key != "lock"}


def _restore(replica: MassReplica, state: dict) -> None:
    for key, value in state.items():
        setattr(replica, key, value.copy() if isinstance(value, np.ndarray) else value)


def test_the_server_corrects_a_stale_per_draw_to_the_current_law(
    client, buffer_name, monkeypatch
):
    """Every draw below is made from a replica behind by an add, evictions and re-scored
    items; lua/sample_prioritized.lua corrects each to the law at the commit, in the one
    commit call: the drawn items follow the current law (chi-square), and evicted or
    zeroed items never come."""
    from redisbuf.sampling import commits as engine

    commits = []
    send = engine._send_commit
    monkeypatch.setattr(engine, "_send_commit", lambda *a: commits.append(1) or send(*a))
    buffer = _per_buffer(client, buffer_name, capacity=16, alpha=1.0, eps=0.0)
    ids = buffer.add({"x": np.arange(12)}, priorities=np.arange(1.0, 13.0)).ids
    buffer.sample(2)
    replica = replica_of(buffer.view, "per")
    stale = _snapshot(replica)
    other = _per_buffer(client, buffer_name, capacity=16, alpha=1.0, eps=0.0)
    added = other.add({"x": np.arange(6)}, priorities=[30.0, 1.0, 5.0, 2.0, 2.0, 2.0]).ids
    other.update_priority(ids[4:8], [0.0, 20.0, 2.0, 9.0])
    per = stored_priorities(client, buffer_name)
    assert int(ids[0]) not in per and int(added[0]) in per  # 2 evicted by the add
    members = np.array(sorted(per))
    p = np.array([per[i] for i in members]) / sum(per.values())
    counts = dict.fromkeys(members.tolist(), 0)
    draws = 0
    for _ in range(60):
        _restore(replica, stale)
        info = buffer.sample_with_info(100)
        assert set(info.ids.tolist()) <= {i for i, v in per.items() if v > 0}
        np.testing.assert_allclose(
            info.probabilities, [per[i] / sum(per.values()) for i in info.ids.tolist()]
        )
        for item in info.ids.tolist():
            counts[item] += 1
        draws += 100
    # about one commit call per sample: corrected in place (the first ones find out how
    # many spare draws the server needs for changes this large)
    assert len(commits) < 75
    observed = np.array([counts[i] for i in members.tolist()])
    live = p > 0
    assert chi2(observed[live], p[live] * draws) < chi2_limit(int(live.sum()) - 1)


def test_a_new_replica_reads_the_snapshot_and_the_log_after_it(client, buffer_name,
                                                               monkeypatch):
    """After a first read (a scan) a replica publishes a snapshot; a new replica reads it
    and the entries logged after it, and holds exactly what a scan reads."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    buffer = _per_buffer(client, buffer_name, capacity=100)
    ids = buffer.add({"x": np.arange(40)}, priorities=np.arange(40.0)).ids
    keys = BufferKeys(buffer_name)
    first = MassReplica("per")
    first.load(buffer.view)  # no snapshot yet: a scan, then it writes one
    header = json.loads(client.hget(keys.snap, "header"))
    assert (header["version"], header["count"]) == (first.version, 40)
    buffer.update_priority(ids[:5], [7.0] * 5)  # logged after the snapshot
    buffer.add({"x": np.arange(3)})
    calls: list[str] = []
    run = buffer._run
    buffer._run = lambda name, k, a: calls.append(name) or run(name, k, a)
    second = MassReplica("per")
    second.load(buffer.view)
    assert "replica_read" not in calls  # no scan
    assert replica_scores(second) == replica_scores(fresh_replica(client, buffer_name, "per"))
    assert second.version == int(client.hget(keys.meta, "log_version"))


def test_a_snapshot_the_log_no_longer_reaches_or_of_another_epoch_is_not_used(
    client, buffer_name, monkeypatch
):
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    buffer, keys = _with_a_snapshot_out_of_reach(client, buffer_name)
    assert int(client.hget(keys.meta, "log_first")) > json.loads(
        client.hget(keys.snap, "header"))["version"] + 1
    later = MassReplica("softmax")
    later.load(buffer.view)  # falls back to a scan, and is right
    assert len(later) == 12_010
    buffer.clear()  # a new epoch: the snapshot (of the old one) is not read either
    buffer.add({"x": np.arange(4), "log_rewards": np.zeros(4)})
    again = MassReplica("softmax")
    again.load(buffer.view)
    assert len(again) == 4


def test_a_snapshot_replaced_while_read_is_read_again(client, buffer_name, monkeypatch):
    """The header and the chunks are separate reads: chunks of a newer snapshot (another
    token) are never mixed with an older header."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_CHUNK", 4)
    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    buffer = _per_buffer(client, buffer_name, capacity=100)
    buffer.add({"x": np.arange(10)}, priorities=np.arange(10.0))
    MassReplica("per").load(buffer.view)
    keys = BufferKeys(buffer_name)
    client.hset(keys.snap, "s1", b"\0" * 8 + b"\1" * 32)  # a page of another snapshot
    reader = MassReplica("per")
    assert not reader._load_snapshot(buffer.view)
    reader.load(buffer.view)  # then a scan
    assert replica_scores(reader) == {int(i): float(i - 1) for i in range(1, 11)}


def test_a_snapshot_not_used_leaves_no_pin(client, buffer_name, monkeypatch):
    """A replica pins the log at the snapshot's version before reading it; when it does
    not use it (the log no longer reaches back to it, or its chunks were replaced) the
    pin goes too. One left at a version below the log's first stopped all trimming (and
    the scan after it kept renewing it in its place), so the log grew past its limit."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    monkeypatch.setattr(replica_module, "_SNAP_CHUNK", 4)
    buffer, keys = _with_a_snapshot_out_of_reach(client, buffer_name)
    later = MassReplica("softmax")
    assert not later._load_snapshot(buffer.view)
    assert client.hget(keys.meta, "log_pins") is None
    later.load(buffer.view)  # a scan; it then publishes a snapshot of its own
    assert client.hget(keys.meta, "log_pins") is None
    for _ in range(12):
        buffer.add({"x": np.arange(1000), "log_rewards": np.zeros(1000)})
    assert int(client.hget(keys.meta, "log_ids")) <= 10_000  # trimmed to its limit
    client.hset(keys.snap, "s1", b"\0" * 8 + b"\1" * 32)  # a page of another snapshot
    assert not MassReplica("softmax")._load_snapshot(buffer.view)
    assert client.hget(keys.meta, "log_pins") is None


def test_a_first_read_across_a_re_creation_uses_the_new_settings(client, buffer_name,
                                                                  monkeypatch):
    """The buffer is dropped and re-created with another alpha after a new replica read
    the PER settings and before it fixed the log's epoch: it reads again and uses the new
    epoch's alpha (it once kept the old one, and its draws followed the old law)."""
    priorities = np.array([1.0, 2.0, 4.0, 8.0])
    old = _per_buffer(client, buffer_name, alpha=1.0, eps=0.0)
    old.add({"x": np.arange(4)}, priorities=priorities)
    old.sample(2)
    load_snapshot = MassReplica._load_snapshot
    recreated: list[ReplayBuffer] = []

    def racing(self, buffer, *args):
        if not recreated:  # between the read of the settings and the read of the epoch
            ReplayBuffer(client, buffer_name, capacity=None).drop()
            recreated.append(_per_buffer(client, buffer_name, alpha=2.0, eps=0.0))
            recreated[0].add({"x": np.arange(4)}, priorities=priorities)
            recreated[0].sample(1)
        return load_snapshot(self, buffer, *args)

    monkeypatch.setattr(MassReplica, "_load_snapshot", racing)
    reader = ReplayBuffer(client, buffer_name, capacity=None, seed=7)
    replica = MassReplica("per")
    replica.load(reader.view)
    assert replica.epoch == client.hget(BufferKeys(buffer_name).meta, "log_epoch").decode()
    assert replica.alpha == 2.0
    held = ~np.isnan(replica.scores[: replica.count])
    assert replica.masses[: replica.count][held].tolist() == (priorities ** 2).tolist()


def test_each_reader_keeps_its_own_pin_of_the_log(client, buffer_name):
    """Two first reads pin the log at once: A at an earlier version, B at a later one. A's
    unpin leaves B's pin (the one shared pin slot once went with A's unpin, and the adds
    after it trimmed the entries B needed); a renewal replaces the reader's own pin, so
    one unpin drops it; once none is left the log is trimmed to its limit again. A reader
    that names no token goes by the version it pinned. (Softmax: under PER the snapshot
    holds trimming back too.)"""
    buffer = ReplayBuffer(client, buffer_name, capacity=20_000, prioritized_sampling=True)
    rng = np.random.default_rng(8)

    def add(times: int) -> None:  # the log keeps 10,000 rows
        for _ in range(times):
            buffer.add({"x": np.arange(1000), "log_rewards": rng.random(1000)})

    add(20)
    buffer.sample(1)  # prioritized sampling on (the mass log kept)
    keys = BufferKeys(buffer_name)
    every = keys.all_keys()

    def read(*args) -> list:
        return buffer._run("masslog_read", every, list(args))

    a = read("", 0, "", "pin", 10_000)  # no token: the reader goes by its version
    add(2)
    b = read("", 0, "", "pin", 10_000)
    assert int(b[2]) > int(a[2])
    add(1)
    read("", 0, "", "unpin", int(a[2]))  # A's read is done
    add(15)  # 30,000 rows: past the limit, while B's pin holds
    caught = read(b[1], int(b[2]), b[3], "unpin", int(b[2]))
    assert len(caught) > 4  # entries from the version B pinned: it can catch up
    assert client.hget(keys.meta, "log_pins") is None
    add(1)
    assert int(client.hget(keys.meta, "log_ids")) <= 10_000  # trimmed again
    read("", 0, "", "pin", 10_000, "readerA")
    add(1)
    read("", 0, "", "pin", 10_000, "readerB")
    read("", 0, "", "pin", 10_000, "readerA")  # a renewal, at the later version
    read("", 0, "", "unpin", "readerA")
    pins = client.hget(keys.meta, "log_pins").decode()
    assert pins.startswith("readerB=") and ";" not in pins
    read("", 0, "", "unpin", "readerB")
    assert client.hget(keys.meta, "log_pins") is None
    with pytest.raises(ValueError, match="letters and digits"):
        read("", 0, "", "pin", 10_000, "not;a=token")


def _truth(client, name) -> dict[int, float]:
    return stored_priorities(client, name)


@pytest.mark.parametrize("mode", ["base", "one_at_a_time", "longer_than_a_pin"])
def test_a_first_read_in_slices_catches_the_writes_made_between_them(
        client, buffer_name, monkeypatch, mode):
    """A first read without a snapshot (PER: the epoch's base, the ids present as of its
    first entry, then the log from there) reads the ids in SCAN steps, several in flight
    (a cluster's client one call at a time). Another client's adds (evicting items read
    and not yet read, and passing the log's length limit), priority changes of items read
    and not yet read, come between two steps: the replica ends holding exactly what the
    server holds, in one attempt (the pin kept the entries after the version it began
    at, and is renewed when the read outlasts it)."""
    import time

    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(first_read, "_SCAN_COUNT", 200)
    if mode == "longer_than_a_pin":  # 15 slices of 0.25 s; a pin of 2.5 s, renewed
        monkeypatch.setattr(replica_module, "_PIN_MS", 2500)
    rng = np.random.default_rng(5)
    buffer = _per_buffer(client, buffer_name, capacity=3000)
    for _ in range(3):
        buffer.add({"x": np.arange(1000)}, priorities=rng.random(1000) + 0.1)
    keys = BufferKeys(buffer_name)
    writer = _per_buffer(client, buffer_name, capacity=3000)
    old = int(client.hget(keys.meta, "inserted"))
    plans: list[Any] = []
    starts: list[int] = []
    run = buffer._run

    def recording(name, keys, args, **kw):
        reply = run(name, keys, args, **kw)
        if name == "masslog_read" and args[3:4] == ["pin"]:
            starts.append(int(reply[2]))
        if name == "replica_read":
            plans.append(reply[0])
        return reply

    buffer._run = recording
    if mode == "one_at_a_time":
        monkeypatch.setattr(first_read, "_plain_pool", lambda client: None)
    steps = 0
    scan = first_read._scan

    def writing(*args):
        nonlocal steps
        for step in scan(*args):
            steps += 1
            if steps == 4:  # between two steps: 24,000 rows logged, past the log's limit
                for _ in range(12):
                    writer.add({"x": np.arange(1000)}, priorities=rng.random(1000) + 0.1)
                survivors = np.arange(old + 12_000 - 3000 + 1, old + 12_000 + 1)
                writer.update_priority(survivors[::7], np.full(len(survivors[::7]), 9.5))
            if mode == "longer_than_a_pin":
                time.sleep(0.25)
            yield step

    monkeypatch.setattr(first_read, "_scan", writing)
    replica = MassReplica("per")
    replica.load(buffer.view)
    assert steps > 4  # the writes came between two steps
    assert plans[0] == b"base"  # no snapshot yet: the ids present, from the log's start
    assert len(starts) == 1  # one attempt: the pin kept the log's entries
    if mode == "longer_than_a_pin":
        assert len(plans) >= 4  # renewed
    assert replica_scores(replica) == _truth(client, buffer_name)
    assert replica.version == int(client.hget(keys.meta, "log_version"))


def test_a_first_read_keeps_its_pin_until_it_has_caught_up(client, buffer_name, monkeypatch):
    """More rows are written during a first read than one catch-up reply carries
    (MASSLOG_REPLY_ROWS, 20,000), and another add comes while the replica applies the
    first reply: the log keeps every entry after the version the read began at until the
    replica has caught up (the pin was once dropped with the first reply, that add trimmed
    the rest, and the read began again), so it ends in one attempt holding what the server
    holds, and its pin is gone."""
    monkeypatch.setattr(first_read, "_SCAN_COUNT", 200)
    rng = np.random.default_rng(6)
    buffer = _per_buffer(client, buffer_name, capacity=3000)
    for _ in range(3):
        buffer.add({"x": np.arange(1000)}, priorities=rng.random(1000) + 0.1)
    buffer.sample(4)  # prioritized sampling on (the mass log kept)
    keys = BufferKeys(buffer_name)
    client.delete(keys.snap)
    writer = _per_buffer(client, buffer_name, capacity=3000)
    starts: list[int] = []
    run = buffer._run

    def recording(name, keys_, args, **kw):
        reply = run(name, keys_, args, **kw)
        if name == "masslog_read" and args[3:4] == ["pin"]:
            starts.append(int(reply[2]))
        return reply

    buffer._run = recording
    steps = 0
    scan = first_read._scan

    def writing(*args):
        nonlocal steps
        for step in scan(*args):
            steps += 1
            if steps == 3:  # 16 adds at capacity: 32,000 rows (an add and an eviction each)
                for _ in range(16):
                    writer.add({"x": np.arange(1000)}, priorities=rng.random(1000) + 0.1)
            yield step

    monkeypatch.setattr(first_read, "_scan", writing)
    applied = 0
    apply = MassReplica.apply

    def adding(self, entry):
        nonlocal applied
        applied += 1
        if applied == 1:  # while the first reply is applied: the next add trims the log
            writer.add({"x": np.arange(1000)}, priorities=rng.random(1000) + 0.1)
        return apply(self, entry)

    monkeypatch.setattr(MassReplica, "apply", adding)
    replica = MassReplica("per")
    replica.load(buffer.view)
    assert len(starts) == 1  # one attempt
    assert replica_scores(replica) == _truth(client, buffer_name)
    assert replica.version == int(client.hget(keys.meta, "log_version"))
    assert client.hget(keys.meta, "log_pins") is None


def test_a_buffer_of_the_earlier_layout_is_read_from_its_per_hash_once(client, buffer_name):
    """A PER buffer written before the priorities moved to the log (a per hash, no meta
    log_truth): turning PER on again starts an epoch whose base is that hash; the first
    read gets it by id while the ids are mostly present (else a scan), applies the log
    after it, publishes a snapshot, and the hash goes."""
    buffer = ReplayBuffer(client, buffer_name, capacity=400, sampler=PERSampler(), seed=3)
    ids = buffer.add({"x": np.arange(400)}).ids
    keys = BufferKeys(buffer_name)
    legacy = {int(i): 0.5 + k / 100 for k, i in enumerate(ids)}
    client.hset(keys.per, mapping={b"%012d" % i: repr(v) for i, v in legacy.items()})
    client.hdel(keys.meta, "log_truth")  # as the earlier layout left it
    plan = buffer._run("enable_per", keys.all_keys(), ["0.6", "1e-06", "1.0", 0])
    assert plan == 1 and client.hget(keys.meta, "per_legacy") == b"1"
    assert buffer._run("replica_read", keys.all_keys(), [1000, 1])[0] == b"ids"
    assert stored_priorities(client, buffer_name) == legacy  # read through the hash
    buffer.update_priority(ids[:2], [9.0, 8.0])
    legacy.update({int(ids[0]): 9.0, int(ids[1]): 8.0})
    reader = ReplayBuffer(client, buffer_name, capacity=None, sampler=PERSampler(), seed=4)
    reader.sample(4)  # reads the hash as its base, then writes a snapshot
    assert replica_scores(replica_of(reader.view, "per")) == legacy
    assert client.exists(keys.per) == 0 and client.hget(keys.meta, "per_legacy") is None
    assert stored_priorities(client, buffer_name) == legacy  # now from the snapshot


@pytest.mark.parametrize("stored", [True, False])
def test_a_first_softmax_read_scans_the_log_rewards(client, buffer_name, monkeypatch, stored):
    """Softmax: the first read scans the prio zset (log-rewards, +-inf included) in
    steps, or, for a schema without log_rewards, the insertion order (every log-reward
    0); a SCAN step may return a member twice, which the replica holds once."""
    from redisbuf import PrioritizedSampler
    from redisbuf.errors import SamplingError

    monkeypatch.setattr(first_read, "_SCAN_COUNT", 7)
    buffer = ReplayBuffer(client, buffer_name, capacity=300, sampler=PrioritizedSampler(),
                          seed=3)
    rewards = np.linspace(-5, 5, 120)
    rewards[[3, 50]] = [-np.inf, np.inf]
    batch = {"x": np.arange(120)}
    if stored:
        batch["log_rewards"] = rewards
    ids = buffer.add(batch).ids
    if stored:
        with pytest.raises(SamplingError, match=r"\+inf"):  # undefined, but turned on
            buffer.sample(2)
    else:
        buffer.sample(2)
    scan = first_read._scan

    def twice(*args):  # every step handed on twice: its members come twice
        for step in scan(*args):
            yield step
            yield step

    monkeypatch.setattr(first_read, "_scan", twice)
    replica = fresh_replica(client, buffer_name, "softmax")
    expected = rewards if stored else np.zeros(120)
    assert replica_scores(replica) == dict(zip(ids.tolist(), expected.tolist(), strict=True))
    assert len(replica) == 120


def test_slots_of_finds_every_held_id_however_the_ids_lie():
    """The slot lookup (a direct read where ids count up without gaps, a search where
    not) gives what a binary search over the ids gives: dense ids, ids with gaps, holes
    of removed items, ids below, between and above the ones held."""
    rng = np.random.default_rng(7)
    for trial in range(200):
        n = int(rng.integers(1, 3000))
        if trial % 2:
            ids = np.sort(rng.choice(np.arange(1, 5000), n, replace=False))
        else:
            ids = np.arange(7, 7 + n)
        replica = MassReplica("per")
        replica._set_arrays(ids.astype(np.int64), rng.random(n))
        replica.scores[:n][rng.random(n) < 0.2] = np.nan  # removed: holes keep their ids
        asked = np.concatenate([rng.integers(-5, 5200, 300), ids[rng.integers(0, n, 50)]])
        where = np.minimum(np.searchsorted(ids, asked), n - 1)
        held = (ids[where] == asked) & ~np.isnan(replica.scores[where])
        assert replica.slots_of(asked).tolist() == np.where(held, where, -1).tolist()


def test_holes_are_filled_with_fresh_draws_at_the_replicas_law():
    """A corrected draw's holes (the server's rounds ran out of candidates, or ended on an
    item not stored) are draws that have not ended: each is filled with a fresh draw of
    the replica, caught up to the commit, in proportion to every mass (chi-square), and
    the draws already made stay; None when nothing holds mass."""
    from redisbuf.sampling.commits import _fill_holes

    replica = MassReplica("per")
    replica.alpha, replica.eps = 1.0, 0.0
    replica._set_arrays(np.array([1, 2, 3, 4], dtype=np.int64), np.array([6.0, 1.0, 3.0, 0.0]))
    rng = np.random.default_rng(5)
    holes = 4000
    filled = _fill_holes(replica, b"2," + b"," * (holes - 1), [np.array([1])], rng)
    assert filled is not None and filled[0] == 2 and set(filled[1:].tolist()) <= {1, 2, 3}
    counts = np.array([(filled[1:] == i).sum() for i in (1, 2, 3)])
    assert chi2(counts, holes * np.array([0.6, 0.1, 0.3])) < chi2_limit(2)
    empty = MassReplica("per")
    empty._set_arrays(np.array([1], dtype=np.int64), np.array([0.0]))
    assert _fill_holes(empty, b",", [np.array([1])], rng) is None


def test_a_following_replica_keeps_the_snapshot_within_the_logs_reach(
    client, buffer_name, monkeypatch
):
    """A sampler following a full buffer while another process adds writes snapshots often
    enough that the newest stays within what the log keeps (max(10,000, capacity / 4)
    rows): a new replica can always start from it (the review found it out of reach
    about half the time, a replica writing one every half its length)."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    sampler = _per_buffer(client, buffer_name, capacity=40_000)
    writer = _full(client, buffer_name, 40_000)
    sampler.sample(4)  # the first read, then a snapshot
    keys = BufferKeys(buffer_name)
    out_of_reach = 0
    for _ in range(40):
        writer.add({"x": np.arange(1000)})  # 1,000 added and 1,000 evicted: 2,000 rows
        sampler.sample(4)
        snap, first = client.hmget(keys.meta, "snap_version", "log_first")
        out_of_reach += int(snap) < int(first)
    assert out_of_reach == 0
    fresh = MassReplica("per")
    assert fresh._load_snapshot(sampler.view)


def test_two_following_replicas_do_not_both_write_every_snapshot(
    client, buffer_name, monkeypatch
):
    """A replica skips its snapshot when another process published one in the later
    half of the versions since its own: two samplers following the same buffer write
    about as many snapshots between them as one alone."""
    from redisbuf.sampling import replica as replica_module

    monkeypatch.setattr(replica_module, "_SNAP_MIN_ITEMS", 1)
    written: list[int] = []
    write = MassReplica.write_snapshot
    monkeypatch.setattr(MassReplica, "write_snapshot",
                        lambda self, buffer: written.append(id(self)) or write(self, buffer))
    writer = _full(client, buffer_name, 40_000)
    samplers = [_per_buffer(client, buffer_name, capacity=40_000) for _ in range(2)]
    counts = []
    for sampling in (samplers[:1], samplers):
        for sampler in sampling:
            sampler.sample(4)
        written.clear()
        for _ in range(30):
            writer.add({"x": np.arange(1000)})
            for sampler in sampling:
                sampler.sample(4)
        counts.append(len(written))
    alone, together = counts
    assert alone >= 8 and together <= alone + 2, counts
