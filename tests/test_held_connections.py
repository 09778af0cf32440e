"""The connections of redisbuf's clients (redisbuf/store/connection.py HeldRedis): each
thread keeps one between its commands, gives it back when it ends, never reads another
command's reply after a failure, and a forked process or a connection the server closed
starts afresh."""

from __future__ import annotations

import os
import threading

import pytest
import redis

from redisbuf.store.connection import HeldRedis, connect

pytestmark = pytest.mark.redis_server


@pytest.fixture
def client(redis_server):
    made = connect(redis_server.url)
    yield made
    made.close()


def _in_thread(call):
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    thread.join()
    return out[0]


def test_a_thread_keeps_its_connection_and_others_have_their_own(client):
    assert isinstance(client, HeldRedis)
    mine = client.client_id()
    assert client.client_id() == mine
    with pytest.raises(redis.exceptions.ResponseError):
        client.execute_command("HGET", "only-one-argument")
    assert client.client_id() == mine  # an error reply leaves the connection as it was
    other = _in_thread(client.client_id)
    assert other != mine
    # a thread that ended gave its connection back: the next thread is lent it
    assert [_in_thread(client.client_id) for _ in range(3)] == [other] * 3


def test_a_connection_the_server_closed_is_connected_again_first(client, redis_server):
    mine = client.client_id()
    admin = redis.Redis.from_url(redis_server.url)
    assert admin.client_kill_filter(_id=mine) == 1
    assert client.ping() is True
    assert client.client_id() != mine
    admin.close()


def test_a_command_that_timed_out_lets_its_connection_go(redis_server):
    client = connect(redis_server.url, socket_timeout=0.2)
    mine = client.client_id()
    with pytest.raises(redis.exceptions.TimeoutError):
        client.execute_command("BLPOP", "rb-test-never-pushed", 2)
    # the next command is answered on another connection: not with BLPOP's late reply
    assert client.echo(b"mine") == b"mine"
    assert client.client_id() != mine
    client.close()


def test_a_forked_process_takes_its_own_connection(client):
    parent = client.client_id()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child reports through the pipe
        try:
            os.write(write, str(client.client_id()).encode())
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        reported = pipe.read()
    os.waitpid(child, 0)
    assert reported and int(reported) != parent
    assert client.client_id() == parent  # the parent's connection is untouched
