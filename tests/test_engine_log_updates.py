"""Priority updates as mass-log entries (lua/update_priority.lua: one append, no id looked
up; the replicas apply it in order, skipping ids not stored there), against a second,
spawned process's changes at the worst moment for this process's draw: between its
replica's last catch-up and its commit, which the server corrects (lua/_correct.lua).
Each test knows the law at the commit and checks every draw against it: a randomised
probability integral transform (item k of a round with law p: u = F(k-1) + V p(k), V
uniform) is uniform exactly when the draws follow the round's law, whatever the rounds'
laws, so a chi-square of u's deciles tests all rounds at once; ids that must not come are
checked exactly. Also: a new sampler reading while another process updates, and a
failover that loses the last entries."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
import redis
from peer_process import Peer
from process_helpers import fresh_context
from test_sampling import chi2, chi2_limit

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.sampling import commits as engine
from redisbuf.sampling.replica import MassReplica, replica_of
from redisbuf.servers.embedded import EmbeddedServer

pytestmark = [pytest.mark.redis_server, pytest.mark.multiprocess]

PER = {"alpha": 1.0, "eps": 0.0}  # masses are the priorities


def _batch(n: int) -> dict:
    return {"x": np.arange(n), "log_rewards": np.zeros(n)}


@pytest.fixture
def peer(redis_server, buffer_name):
    made: list[Peer] = []

    def make(**options: Any) -> Peer:
        made.append(Peer(redis_server.url, buffer_name, **options))
        return made[-1]

    yield make
    for one in made:
        one.stop()


class Uniformity:
    """The randomised PIT of each draw against its round's law, and the deciles' test."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.u: list[float] = []

    def add(self, ids: np.ndarray, law: dict[int, float]) -> None:
        order = sorted(law)
        total = sum(law.values())
        cdf, below = {}, 0.0
        for i in order:
            cdf[i] = below
            below += law[i] / total
        for i in ids.tolist():
            assert law.get(i, 0.0) > 0, f"id {i} drawn, of probability 0 at the commit"
            self.u.append(cdf[i] + self.rng.random() * law[i] / total)

    def check(self) -> None:
        counts = np.histogram(self.u, bins=10, range=(0.0, 1.0))[0]
        expected = np.full(10, len(self.u) / 10)
        assert chi2(counts, expected) < chi2_limit(9), counts.tolist()


def _before_each_commit(monkeypatch, change) -> None:
    """Run ``change()`` right before every commit this process sends: after its draw from
    the replica, before the server checks it."""
    send = engine._send_commit

    def changed_then_sent(*args: Any) -> Any:
        change()
        return send(*args)

    monkeypatch.setattr(engine, "_send_commit", changed_then_sent)


def test_updates_racing_draws_follow_the_law_at_each_commit(redis_server, buffer_name, peer,
                                                            monkeypatch):
    """Before every commit another process sets new priorities (a random permutation of
    values with a zero among them, some of 4 ids, others kept): every draw follows the
    law after that update, never an item at priority 0."""
    other = peer(capacity=20, per=PER)
    sampler = ReplayBuffer(redis_server.url, buffer_name, capacity=20, sampler=PERSampler(**PER),
                           seed=1)
    ids = sampler.add(_batch(6), priorities=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).ids.tolist()
    law = dict(zip(ids, [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], strict=True))
    rng = np.random.default_rng(2)
    test = Uniformity(3)

    def update() -> None:
        chosen = rng.choice(ids, 4, replace=False).tolist()
        values = rng.permutation([0.0, 0.5, 7.0, 20.0]).tolist()
        other("update_priority", ids=chosen, priorities=values)
        law.update(zip(chosen, values, strict=True))

    _before_each_commit(monkeypatch, update)
    for _ in range(250):
        expected = None
        drawn = sampler.sample_with_info(8, replacement=True)
        expected = dict(law)  # as of the last commit, the one that stood
        test.add(drawn.ids, expected)
        total = sum(expected.values())
        np.testing.assert_allclose(drawn.probabilities,
                                   [expected[i] / total for i in drawn.ids.tolist()])
    test.check()


def test_evictions_between_an_update_and_its_apply(redis_server, buffer_name, peer, monkeypatch):
    """Before each commit another process updates two items and then adds items that evict
    the oldest ones, one of the two among them: this process's replica applies none of it
    before the server corrects its draw. Evicted items never come, and the draws follow
    the law after both changes."""
    capacity = 8
    other = peer(capacity=capacity, per=PER)
    sampler = ReplayBuffer(redis_server.url, buffer_name, capacity=capacity,
                           sampler=PERSampler(**PER), seed=4)
    ids = sampler.add(_batch(capacity), priorities=np.arange(1.0, capacity + 1)).ids.tolist()
    law = dict(zip(ids, np.arange(1.0, capacity + 1).tolist(), strict=True))
    order = list(ids)  # FIFO: the oldest first
    test = Uniformity(5)
    rng = np.random.default_rng(6)

    def update_then_evict() -> None:
        oldest, later = order[0], order[int(rng.integers(2, len(order)))]
        values = [float(rng.integers(10, 30)), float(rng.integers(1, 5))]
        other("update_priority", ids=[oldest, later], priorities=values)
        law[oldest], law[later] = values
        added = other("add", log_rewards=[0.0, 0.0], priorities=[3.0, 9.0])
        for gone in order[:2]:  # capacity 8: the two oldest go, the updated one too
            del law[gone]
        del order[:2]
        order.extend(added)
        law.update(zip(added, [3.0, 9.0], strict=True))

    _before_each_commit(monkeypatch, update_then_evict)
    for _ in range(250):
        drawn = sampler.sample_with_info(6, replacement=True)
        test.add(drawn.ids, law)  # evicted ids are not in it: an exact check too
    test.check()
    replica = replica_of(sampler.view, "per")
    held = ~np.isnan(replica.scores[: replica.count])
    assert dict(zip(replica.ids[: replica.count][held].tolist(),
                    replica.scores[: replica.count][held].tolist(), strict=True)) == law


def test_an_update_naming_an_evicted_id_and_a_new_one(redis_server, buffer_name, peer,
                                                      monkeypatch):
    """Before each commit another process adds an item (evicting the oldest) and then
    updates two ids: the one the previous round evicted (this process's replica has seen
    it go; no entry since names it) and the one added now. Every replica skips the
    evicted id; the server's correction counts its mass as if it were stored (the log
    alone cannot tell) and asks whether it is where a draw ends on it, then draws that
    one again; the new id gets its priority. Draws follow that law, never the evicted id."""
    capacity = 5
    other = peer(capacity=capacity, per=PER)
    sampler = ReplayBuffer(redis_server.url, buffer_name, capacity=capacity,
                           sampler=PERSampler(**PER), seed=7)
    ids = sampler.add(_batch(capacity), priorities=[1.0, 2.0, 3.0, 4.0, 5.0]).ids.tolist()
    law = dict(zip(ids, [1.0, 2.0, 3.0, 4.0, 5.0], strict=True))
    order = list(ids)
    evicted: list[int] = []
    test = Uniformity(8)
    rng = np.random.default_rng(9)

    def add_then_update() -> None:
        added = other("add", log_rewards=[0.0], priorities=[1.0])[0]
        evicted.append(order.pop(0))
        del law[evicted[-1]]
        order.append(added)
        value = float(rng.integers(1, 8))
        named = [evicted[-2]] if len(evicted) > 1 else []
        other("update_priority", ids=[*named, added], priorities=[*([5.0] * len(named)), value])
        law[added] = value

    sampler.sample(1)  # the replica is current from here
    _before_each_commit(monkeypatch, add_then_update)
    for _ in range(300):
        drawn = sampler.sample_with_info(2, replacement=True)
        test.add(drawn.ids, law)
        assert not set(drawn.ids.tolist()) & set(evicted)
    test.check()
    monkeypatch.undo()
    assert sampler.priorities(order).tolist() == [law[i] for i in order]
    assert np.isnan(sampler.priorities(evicted)).all()


def _updating(url: str, name: str, stop: Any, seed: int) -> None:
    """Update random stored items' priorities and add now and then, until ``stop``."""
    buffer = ReplayBuffer(url, name, capacity=None, sampler=PERSampler(**PER), seed=seed)
    rng = np.random.default_rng(seed)
    while not stop.is_set():
        last = int(buffer.client.hget(buffer.keys.meta, "last_id"))
        ids = rng.integers(max(1, last - 3000), last + 1, 256)
        buffer.update_priority(ids, rng.random(256) * 10, count=False)
        if rng.random() < 0.2:
            buffer.add(_batch(64), priorities=rng.random(64))


@pytest.mark.parametrize("snapshot", [True, False], ids=["from-a-snapshot", "from-the-base"])
def test_a_new_sampler_reads_while_updates_arrive(redis_server, buffer_name, snapshot):
    """Two processes update priorities (and add) as fast as they can while a new replica
    reads the buffer, from its snapshot or, with none, from the epoch's base and the
    whole log: it finishes, then (the writers stopped) holds exactly the server's
    priorities, and its draws follow them (chi-square)."""
    capacity = 3000
    buffer = ReplayBuffer(redis_server.url, buffer_name, capacity=capacity,
                          sampler=PERSampler(**PER), seed=10)
    for _ in range(3):
        buffer.add(_batch(1000), priorities=np.random.default_rng(1).random(1000))
    if snapshot:
        MassReplica("per").load(buffer.view)  # a first read publishes one
    ctx = fresh_context()
    stop = ctx.Event()
    writers = [ctx.Process(target=_updating, args=(redis_server.url, buffer_name, stop, 20 + k))
               for k in range(2)]
    for writer in writers:
        writer.start()
    try:
        versions = buffer.client.hget(buffer.keys.meta, "log_version")
        deadline = time.monotonic() + 60
        while buffer.client.hget(buffer.keys.meta, "log_version") == versions:
            assert time.monotonic() < deadline, "the writers did not start"
            time.sleep(0.01)
        replica = MassReplica("per")
        replica.load(buffer.view)  # while they update
    finally:
        stop.set()
        for writer in writers:
            writer.join(30)
    assert all(writer.exitcode == 0 for writer in writers)
    replica.sync(buffer.view)
    held = ~np.isnan(replica.scores[: replica.count])
    mine = dict(zip(replica.ids[: replica.count][held].tolist(),
                    replica.scores[: replica.count][held].tolist(), strict=True))
    stored = [int(m) for m in buffer.client.zrange(buffer.keys.order, 0, -1)]
    assert set(mine) == set(stored)
    sample = np.random.default_rng(11).choice(stored, 200, replace=False)
    assert buffer.priorities(sample).tolist() == [mine[int(i)] for i in sample]
    test = Uniformity(12)
    for _ in range(40):
        test.add(buffer.sample_with_info(256).ids, mine)
    test.check()


def _wait_link(client: redis.Redis) -> None:
    deadline = time.monotonic() + 30
    while client.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)


def test_a_failover_that_loses_the_last_updates(buffer_name):
    """The sampler follows a primary through priority updates that its replica server
    never gets (promoted before them: lost); on the promoted server another process then
    writes as many entries again (the same versions, another history). The sampler's
    replica, of the lost history, must read again (the stamps differ): its draws follow
    the promoted server's priorities (chi-square) and never the lost ones."""
    with EmbeddedServer() as primary, EmbeddedServer() as standby:
        standby_client = redis.Redis.from_url(standby.url)
        standby_client.replicaof("127.0.0.1", primary.port)
        _wait_link(standby_client)
        sampler = ReplayBuffer(primary.url, buffer_name, capacity=100,
                               sampler=PERSampler(**PER), seed=13)
        ids = sampler.add(_batch(10), priorities=np.arange(1.0, 11.0)).ids.tolist()
        sampler.sample(8)
        deadline = time.monotonic() + 30
        while standby_client.hget(sampler.keys.meta, "log_version") != \
                sampler.client.hget(sampler.keys.meta, "log_version"):
            assert time.monotonic() < deadline, "the replica did not catch up"
            time.sleep(0.01)
        standby_client.replicaof("no", "one")  # promoted: what follows on the old is lost
        for k in range(6):  # lost: the heavy ones to 0, the light ones to 1000
            sampler.update_priority(ids[:5], [1000.0 + k] * 5)
            sampler.update_priority(ids[5:], [0.0] * 5)
        sampler.sample(8)  # its replica follows the lost history
        lost_version = replica_of(sampler.view, "per").version
        writer = ReplayBuffer(standby.url, buffer_name, capacity=None,
                              sampler=PERSampler(**PER))
        while int(standby_client.hget(writer.keys.meta, "log_version")) < lost_version:
            writer.update_priority([ids[0]], [0.5])  # the same versions, another history
        law = dict(zip(ids, np.arange(1.0, 11.0).tolist(), strict=True))
        law[ids[0]] = 0.5
        failed_over = ReplayBuffer(standby.url, buffer_name, capacity=None,
                                   sampler=PERSampler(**PER), seed=14)
        failed_over.view.replicas = sampler.view.replicas  # the replica as it was
        test = Uniformity(15)
        for _ in range(60):
            test.add(failed_over.sample_with_info(64).ids, law)
        test.check()
        assert failed_over.priorities(ids).tolist() == [law[i] for i in ids]
        standby_client.close()
