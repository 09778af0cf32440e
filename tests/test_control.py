"""The Redis control backend: keys, sessions, heartbeats and timeouts."""

from __future__ import annotations

import multiprocessing
import os
import socket
import threading
import time

import pytest

from redisbuf.control import redis as control_redis
from redisbuf.control.protocol import ANY_SOURCE, DATA_TAG, METADATA_TAG, decode, request
from redisbuf.control.redis import (
    ControlKeys,
    RedisManagerTransport,
    RedisWorkerTransport,
    runs_here,
    this_process,
)
from redisbuf.errors import ControlTimeoutError, ProtocolError
from redisbuf.store.codec import packb

FAST = {"heartbeat_interval": 0.1, "heartbeat_ttl": 0.5}


@pytest.fixture
def manager(client, buffer_name):
    transport = RedisManagerTransport(client, buffer_name, **FAST)
    transport.start()
    yield transport
    transport.close()


def _worker(client, name, rank=None, **kwargs):
    options = {**FAST, "connect_timeout": 2.0, **kwargs}
    return RedisWorkerTransport(client, name, rank=rank, **options)


@pytest.fixture
def elsewhere(monkeypatch):
    """The peers of this test live on another host, as far as their liveness goes: an
    expired heartbeat alone then says a peer is gone (the peers here are this process,
    whose heartbeat threads the tests stop)."""
    monkeypatch.setattr(control_redis, "runs_here", lambda described: False)


def test_key_names_share_the_buffer_hash_tag():
    keys = ControlKeys("hg")
    assert keys.manager == "rb:{hg}:ctl:manager"
    assert keys.requests == "rb:{hg}:ctl:req"
    assert keys.reply(3, METADATA_TAG) == "rb:{hg}:ctl:rep:3:1"
    assert keys.heartbeat(3) == "rb:{hg}:ctl:hb:3"
    with pytest.raises(ValueError):
        ControlKeys("bad name")


def test_messages_travel_both_ways_on_their_tags(client, buffer_name, manager):
    worker = _worker(client, buffer_name)
    worker.send(0, DATA_TAG, request("metadata"))
    sender, body = manager.recv(ANY_SOURCE, DATA_TAG, timeout=1.0)
    assert sender == worker.rank == 1 and decode(body)["op"] == "metadata"
    manager.send(1, METADATA_TAG, b"meta")
    manager.send(1, DATA_TAG, b"score")
    assert worker.recv(0, DATA_TAG, timeout=1.0) == (0, b"score")
    assert worker.recv(0, METADATA_TAG, timeout=1.0) == (0, b"meta")
    with pytest.raises(ControlTimeoutError, match="within 0.2 s"):
        worker.recv(0, DATA_TAG, timeout=0.2)
    worker.close()


def test_ranks_are_handed_out_and_registered(client, buffer_name, manager):
    first, second = _worker(client, buffer_name), _worker(client, buffer_name)
    explicit = _worker(client, buffer_name, rank=7)
    assert (first.rank, second.rank, explicit.rank) == (1, 2, 7)
    assert manager.registered() == {1, 2, 7}
    with pytest.raises(ValueError, match="manager"):
        _worker(client, buffer_name, rank=0)
    for worker in (first, second, explicit):
        worker.close()


def test_a_second_manager_is_refused(client, buffer_name, manager):
    with pytest.raises(ProtocolError, match="already running"):
        RedisManagerTransport(client, buffer_name, **FAST).start()


def test_worker_without_a_manager_times_out_clearly(client, buffer_name):
    worker = _worker(client, buffer_name, connect_timeout=0.3)
    began = time.monotonic()
    with pytest.raises(ControlTimeoutError, match="no manager is running"):
        worker.send(0, DATA_TAG, request("exit"))
    assert time.monotonic() - began < 30.0  # its connect_timeout, not the default 60 s


def test_worker_notices_a_dead_manager_while_waiting(client, buffer_name, elsewhere):
    manager = RedisManagerTransport(client, buffer_name, **FAST)
    manager.start()
    worker = _worker(client, buffer_name)
    worker.send(0, DATA_TAG, request("metadata"))
    manager._heartbeat.stop()  # the manager "dies": its key is left to expire
    began = time.monotonic()
    with pytest.raises(ControlTimeoutError, match="manager of buffer .* stopped"):
        worker.recv(0, METADATA_TAG, timeout=None)
    assert time.monotonic() - began < 30.0
    worker.close()


def test_a_worker_waits_for_a_late_manager_whose_process_runs(client, buffer_name):
    """The manager's key expired (its beats late: a starved process) while its process
    still runs on this host: the waiting worker takes the reply when it comes instead of
    raising ControlTimeoutError (the demo's manager was given up for dead at load 14)."""
    manager = RedisManagerTransport(client, buffer_name, **FAST)
    manager.start()
    worker = _worker(client, buffer_name)
    worker.send(0, DATA_TAG, request("metadata"))
    manager._heartbeat.stop()
    keys = ControlKeys(buffer_name)
    while client.exists(keys.manager):
        time.sleep(0.05)
    replies: list = []
    waiting = threading.Thread(
        target=lambda: replies.append(worker.recv(0, METADATA_TAG, timeout=60)), daemon=True)
    waiting.start()
    time.sleep(3 * FAST["heartbeat_ttl"])  # several of the worker's liveness checks
    assert waiting.is_alive()
    sender, _ = manager.recv(ANY_SOURCE, DATA_TAG, timeout=10)
    manager.send(sender, METADATA_TAG, b"late")
    waiting.join(60)
    assert replies == [(0, b"late")]
    worker.close()
    manager.close()


def test_worker_notices_a_manager_restart(client, buffer_name):
    old = RedisManagerTransport(client, buffer_name, **FAST)
    old.start()
    worker = _worker(client, buffer_name)
    worker.connect()
    old.close()
    new = RedisManagerTransport(client, buffer_name, **FAST)
    new.start()
    with pytest.raises(ControlTimeoutError, match="expired or changed"):
        worker.recv(0, DATA_TAG, timeout=5.0)
    new.close()


def test_manager_reports_a_worker_gone_without_exit(client, buffer_name, manager, elsewhere):
    alive, doomed = _worker(client, buffer_name), _worker(client, buffer_name)
    alive.connect()
    doomed.connect()
    doomed._heartbeat.stop()  # dies without EXIT; its heartbeat key expires
    manager.check_peers(set())
    deadline = time.monotonic() + 3.0
    with pytest.raises(ControlTimeoutError, match=r"worker rank\(s\) \[2\].*without EXIT"):
        while time.monotonic() < deadline:
            manager.check_peers(set())
            time.sleep(0.05)
    manager.check_peers({2})  # once its EXIT was counted it is not reported
    alive.close()


def test_a_starved_worker_whose_process_runs_is_not_reported(client, buffer_name, manager):
    """A worker's heartbeat expired while its process still runs on this host (a starved
    machine): the manager does not report it; the beat resumes and all is as before."""
    worker = _worker(client, buffer_name)
    worker.connect()
    worker._heartbeat.stop()
    key = ControlKeys(buffer_name).heartbeat(worker.rank)
    while client.exists(key):
        time.sleep(0.05)
    for _ in range(5):
        manager.check_peers(set())
    worker._heartbeat.beat()
    manager.check_peers(set())
    assert client.hget(ControlKeys(buffer_name).procs, worker.rank) == this_process()
    worker.close()


def test_a_process_runs_here_only_while_it_lives_on_this_host_and_namespace():
    me = this_process()
    assert runs_here(me) and runs_here(b"token " + me)
    assert not runs_here(me.replace(socket.gethostname().encode(), b"another-host"))
    assert not runs_here(me.replace(b"ns=", b"ns=other"))
    assert not runs_here(None) and not runs_here(b"") and not runs_here(b"pid=x")
    child = multiprocessing.get_context("fork").Process(target=os._exit, args=(0,))
    child.start()
    while True:  # exited, not reaped yet: a zombie is no running process
        with open(f"/proc/{child.pid}/stat", "rb") as f:
            if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.01)
    gone = me.replace(b"pid=%d" % os.getpid(), b"pid=%d" % child.pid)
    assert not runs_here(gone)
    child.join()
    assert not runs_here(gone)


def test_a_queued_exit_is_not_mistaken_for_death(client, buffer_name, manager):
    worker = _worker(client, buffer_name)
    worker.send(0, DATA_TAG, request("exit"))
    worker.close()  # heartbeat removed right after the EXIT was queued
    manager.check_peers(set())  # must not raise: the EXIT is still in the list
    sender, body = manager.recv(ANY_SOURCE, DATA_TAG, timeout=1.0)
    assert sender == 1 and decode(body)["op"] == "exit"


def test_requests_of_an_earlier_session_are_dropped(client, buffer_name, manager):
    stale = packb({"src": 5, "tag": 0, "session": b"old", "body": request("metadata")})
    client.lpush(ControlKeys(buffer_name).requests, stale)
    with pytest.raises(ControlTimeoutError):
        manager.recv(ANY_SOURCE, DATA_TAG, timeout=0.2)


def test_starting_a_manager_clears_the_previous_session(client, buffer_name):
    keys = ControlKeys(buffer_name)
    client.lpush(keys.requests, b"junk")
    client.sadd(keys.workers, 4)
    client.set(keys.ranks, 9)
    manager = RedisManagerTransport(client, buffer_name, **FAST)
    manager.start()
    assert client.llen(keys.requests) == 0 and manager.registered() == set()
    assert _worker(client, buffer_name).rank == 1
    manager.close()
    assert client.get(keys.manager) is None


def test_heartbeats_outlive_a_busy_main_thread(client, buffer_name, manager, monkeypatch):
    beats: list[float] = []
    beat = control_redis._Heartbeat.beat

    def counted(self):
        beats.append(time.monotonic())
        beat(self)

    monkeypatch.setattr(control_redis._Heartbeat, "beat", counted)
    worker = _worker(client, buffer_name)
    worker.connect()
    # the worker's main thread computes (holding the GIL but for its switches) for 5
    # heartbeat intervals; the heartbeat thread beats on meanwhile
    first = len(beats)
    end = time.monotonic() + 5 * FAST["heartbeat_interval"]
    while time.monotonic() < end or len(beats) == first:
        sum(range(10_000))
    assert len(beats) > first
    manager.check_peers(set())
    assert client.exists(ControlKeys(buffer_name).heartbeat(1))
    worker.close()
    assert not client.exists(ControlKeys(buffer_name).heartbeat(1))


def test_manager_transport_skips_a_malformed_request(fake_client, buffer_name):
    transport = RedisManagerTransport(fake_client, buffer_name)
    try:
        transport.start()
        fake_client.lpush(transport.keys.requests, b"\xc1 not msgpack")
        with pytest.raises(ControlTimeoutError):
            transport.recv(ANY_SOURCE, DATA_TAG, timeout=0.3)
    finally:
        transport.close()
