"""The command packer of redisbuf's connections (redisbuf/store/connection.py): the bytes
on the wire are redis-py's own, for small commands (hiredis directly) and large ones (one
join), and a bad argument is refused as redis-py refuses it."""

from __future__ import annotations

import pytest
import redis
from redis.connection import HiredisRespSerializer

from redisbuf.store.connection import PackingConnection, RespPacker

COMMANDS = [
    ("PING",),
    ("HMGET", "rb:{b}:uses", *[b"%012d" % i for i in range(512)]),
    ("FCALL", "rbs_x", 2, "k1", b"k2", 3, 2.5, b"\x00\xff raw"),
    (b"CLIENT SETNAME", b"x"),  # a two-word command given as one
    ("CLIENT SETNAME", "x"),
    ("SET", "k", memoryview(b"view")),
    ("SET", "k", bytearray(b"array")),
    ("RPUSH", "big", b"x" * (RespPacker.LARGE + 1), memoryview(b"y" * 10)),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: str(c[0])[:14])
def test_the_packer_writes_redis_pys_bytes(command):
    ours = b"".join(RespPacker().pack(*command))
    theirs = b"".join(HiredisRespSerializer().pack(*command))
    assert ours == theirs


@pytest.mark.parametrize("bad", [None, object(), [1, 2]])
def test_an_argument_redis_py_refuses_is_refused(bad):
    with pytest.raises(redis.exceptions.DataError):
        RespPacker().pack("SET", "k", bad)


@pytest.mark.redis_server
def test_a_packed_command_runs_on_the_server(redis_server):
    client = redis.Redis.from_url(redis_server.url, connection_class=PackingConnection)
    fields = [b"%012d" % i for i in range(300)]
    client.delete("packer:k")
    client.hset("packer:k", mapping=dict.fromkeys(fields, memoryview(b"v")))
    client.hset("packer:k", fields[0], b"w" * (RespPacker.LARGE + 1))
    assert client.hmget("packer:k", fields)[1:] == [b"v"] * 299
    assert client.hstrlen("packer:k", fields[0]) == RespPacker.LARGE + 1
    client.delete("packer:k")
    client.close()
