"""A failover to a replica that lost writes, with real servers and processes: a second
server replicates the first, two processes add and this one samples with PER; the replica
is promoted (REPLICAOF NO ONE) while they write, the writers go on on the promoted server,
and the sampler follows them there with the replica of the scores it had. No draw may
return an id the new primary does not hold (the sampler must notice that its history
was rolled back), and with ``durability="replica"`` no acknowledged item is lost."""

from __future__ import annotations

import multiprocessing
import time

import numpy as np
import pytest
import redis

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.sampling.replica import replica_of
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store.keys import BufferKeys

pytestmark = [pytest.mark.redis_server, pytest.mark.multiprocess]

NAME = "failover"


def _batch(n: int) -> dict:
    return {"x": np.arange(n), "log_rewards": np.zeros(n)}


def _writer(urls, switch, stop, acknowledged, index: int) -> None:
    """Add to the primary with durability="replica" until told to switch, then (without
    durability: there is no replica any more) to the promoted server, until told to stop.
    Every add acknowledged before the switch goes into ``acknowledged``."""
    buffer = ReplayBuffer(urls[0], NAME, capacity=None, durability="replica",
                          durability_timeout=2.0)
    while not switch.is_set():
        try:
            ids = buffer.add(_batch(8)).ids
        except Exception:  # the replica left: this add is not acknowledged
            break
        acknowledged.put([int(i) for i in ids])
    switch.wait(30)
    promoted = ReplayBuffer(urls[1], NAME, capacity=None)
    while not stop.is_set():
        promoted.add(_batch(8))
        time.sleep(0.002)


def _wait_link(client: redis.Redis) -> None:
    deadline = time.monotonic() + 30
    while client.info("replication").get("master_link_status") != "up":
        assert time.monotonic() < deadline, "the replica did not connect"
        time.sleep(0.05)


def test_a_failover_that_lost_writes_never_yields_a_missing_id():
    with EmbeddedServer() as primary, EmbeddedServer() as standby:
        standby_client = redis.Redis.from_url(standby.url)
        standby_client.replicaof("127.0.0.1", primary.port)
        _wait_link(standby_client)
        # no eviction: every id the new primary held stays, so "held" is well defined
        sampler = ReplayBuffer(primary.url, NAME, capacity=10**6,
                               sampler=PERSampler(alpha=1.0, eps=0.0), seed=2)
        sampler.add(_batch(500))
        ctx = multiprocessing.get_context("spawn")
        switch, stop = ctx.Event(), ctx.Event()
        acknowledged = ctx.Queue()
        writers = [ctx.Process(target=_writer,
                               args=([primary.url, standby.url], switch, stop, acknowledged, k))
                   for k in range(2)]
        for writer in writers:
            writer.start()
        acked: set[int] = set()
        try:
            while len(acked) < 2 * 8 * 5:  # both writers are adding
                acked.update(acknowledged.get(timeout=60))
            for _ in range(30):  # the sampler follows the primary while the writers add
                sampler.sample(64)
                sampler.update_priority(sampler.sample_with_info(16).ids, np.ones(16) * 2)
            standby_client.replicaof("no", "one")  # promoted: writes after this are lost
            promoted_at = time.monotonic()
            primary_client = sampler.client
            sampler.add(_batch(1000))  # lost: only the old primary has these
            sampler.add(_batch(1000))
            while time.monotonic() - promoted_at < 0.3:  # the old primary goes on a while
                sampler.sample(64)
            switch.set()
            while True:  # what the writers had acknowledged (before the switch)
                try:
                    acked.update(acknowledged.get(timeout=1))
                except Exception:
                    break
            # the sampler fails over to the promoted server with its replica as it was
            failed_over = ReplayBuffer(standby.url, NAME, capacity=None,
                                       sampler=PERSampler(alpha=1.0, eps=0.0), seed=3)
            failed_over.view.replicas = sampler.view.replicas
            keys = BufferKeys(NAME)
            old_version = replica_of(sampler.view, "per").version
            assert int(primary_client.hget(keys.meta, "log_version")) == old_version
            deadline = time.monotonic() + 60
            # the new history passes the sampler's version: its entries after that version
            # would apply cleanly to a replica that does not check whose history it follows
            while int(standby_client.hget(keys.meta, "log_version")) < old_version + 5:
                assert time.monotonic() < deadline
                time.sleep(0.01)
            for _ in range(40):
                present = {int(m) for m in standby_client.zrange(keys.order, 0, -1)}
                drawn = set(failed_over.sample_with_info(64).ids.tolist())
                now = {int(m) for m in standby_client.zrange(keys.order, 0, -1)}
                # every drawn id was held by the new primary (it only adds meanwhile)
                assert drawn <= now, sorted(drawn - now)[:10]
                assert present <= now
            held = {int(m) for m in standby_client.zrange(keys.order, 0, -1)}
            assert acked and acked <= held, sorted(acked - held)[:10]
        finally:
            switch.set()
            stop.set()
            for writer in writers:
                writer.join(30)
                if writer.is_alive():
                    writer.kill()
