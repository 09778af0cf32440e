"""The Redis control backend: keys, sessions, heartbeats and timeouts."""

from __future__ import annotations

import threading
import time

import pytest

from redisbuf.control.protocol import ANY_SOURCE, DATA_TAG, METADATA_TAG, decode, request
from redisbuf.control.redis import ControlKeys, RedisManagerTransport, RedisWorkerTransport
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
    assert time.monotonic() - began < 2.0


def test_worker_notices_a_dead_manager_while_waiting(client, buffer_name):
    manager = RedisManagerTransport(client, buffer_name, **FAST)
    manager.start()
    worker = _worker(client, buffer_name)
    worker.send(0, DATA_TAG, request("metadata"))
    manager._heartbeat.stop()  # the manager "dies": its key is left to expire
    began = time.monotonic()
    with pytest.raises(ControlTimeoutError, match="manager of buffer .* stopped"):
        worker.recv(0, METADATA_TAG, timeout=None)
    assert time.monotonic() - began < 3.0
    worker.close()


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


def test_manager_reports_a_worker_gone_without_exit(client, buffer_name, manager):
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


def test_heartbeats_outlive_a_busy_main_thread(client, buffer_name, manager):
    worker = _worker(client, buffer_name)
    worker.connect()
    stop = threading.Event()
    # the worker's main thread "computes" for longer than the TTL; the thread beats on
    stop.wait(1.0)
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
