"""How a step writer cuts its steps into chunks and when it seals its items
(redisbuf/buffers/step_writer.py), how the sweep judges a chunk referenced
(lua/steps_sweep.lua), and the one send of a pipeline (redisbuf/store/connection.py)."""

from __future__ import annotations

import socket

import numpy as np
import pytest
import redis

from redisbuf import connect
from redisbuf.buffers import step_records
from redisbuf.buffers.step_records import decode_chunk, encode_chunk, encode_chunk_cells
from redisbuf.buffers.step_writer import CHUNK_BYTES, SEAL_BYTES
from redisbuf.buffers.steps import StepStore
from redisbuf.store.connection import OneSendConnection, _connection_class


def step(t: int, width: int = 3) -> list[np.ndarray]:
    return [np.full(width, t, dtype=np.float32), np.int64(t)]


def chunks(store: StepStore) -> list:
    blobs = store.client.hgetall(store.keys.chunks).values()
    return sorted((decode_chunk(blob) for blob in blobs),
                  key=lambda chunk: int(chunk.steps_of(0)[0]))


def test_a_steps_cells_share_one_chunk_whatever_its_items_read(client):
    """Items of the last two observations and the first one's action (an Acme adder's
    transition): each step's observation and action go into the same chunk, although
    the item that reads a step's observation does not read its action."""
    store = StepStore(client, "s")
    table = store.table("t", capacity=100)
    with store.writer(num_keep_alive_refs=2, chunk_length=4) as writer:
        for t in range(16):
            writer.append(step(t))
            if t >= 1:
                obs, action = writer.kept(0), writer.kept(1)
                writer.create_item("t", 1.0, [obs, [action[0]]], [False, True])
    found = chunks(store)
    assert [c.steps_of(0).tolist() for c in found] == [[0, 1, 2, 3], [4, 5, 6, 7],
                                                      [8, 9, 10, 11], [12, 13, 14, 15]]
    for chunk in found:
        assert chunk.steps_of(1).tolist() == chunk.steps_of(0).tolist()
    assert len(table) == 15
    for item in store.sample(table, 200, timeout=0):
        first = int(item.columns[1])
        assert item.columns[0][:, 0].tolist() == [first, first + 1]


def test_default_chunks_are_sealed_by_about_seal_bytes_of_new_steps(client):
    """With the default chunk length (chunks of about CHUNK_BYTES), items wait until the
    new steps they read hold about SEAL_BYTES, then are sealed into several chunks."""
    store = StepStore(client, "s")
    table = store.table("t", capacity=100)
    width = 1024  # 4 KiB of float32 a step
    step_bytes = width * 4 + 8 + 8
    length, seal = CHUNK_BYTES // step_bytes, SEAL_BYTES // step_bytes
    assert 1 < length < seal
    with store.writer(num_keep_alive_refs=2, background=False) as writer:
        writer.append(step(0, width))
        for t in range(1, seal - 1):
            writer.append(step(t, width))
            writer.create_item("t", 1.0, [writer.kept(0)], [False])
        assert len(writer._unsealed) == seal - 2  # seal - 1 new steps: none sealed yet
        writer.append(step(seal - 1, width))
        writer.create_item("t", 1.0, [writer.kept(0)], [False])
        assert writer._unsealed == []  # seal new steps: every waiting item sealed
    assert writer.chunk_length == length and len(table) == seal - 1
    assert [len(c.steps_of(0)) for c in chunks(store)] == [length] * (seal // length) + (
        [seal % length] if seal % length else [])


def test_an_explicit_chunk_length_seals_at_every_chunk(client):
    store = StepStore(client, "s")
    store.table("t", capacity=10)
    with store.writer(num_keep_alive_refs=2, chunk_length=3, background=False) as writer:
        writer.append(step(0, 1024))
        writer.append(step(1, 1024))
        writer.create_item("t", 1.0, [writer.kept(0)], [False])
        assert len(writer._unsealed) == 1
        writer.append(step(2, 1024))
        writer.create_item("t", 1.0, [writer.kept(0)], [False])
        assert writer._unsealed == []


@pytest.mark.parametrize("dtype", ["float32", "int64", "bool", "complex64", "<U3"])
def test_a_chunk_of_cells_decodes_as_the_stacked_one(dtype):
    cells = [np.asarray(np.arange(6).reshape(2, 3) + t).astype(dtype) for t in range(3)]
    cells[1] = np.asfortranarray(cells[1])  # not C-contiguous: its bytes in C order
    scalars = [np.asarray(t, dtype=np.int64) for t in range(3)]
    joined = decode_chunk(encode_chunk_cells(7, {0: ([4, 5, 6], cells),
                                                 2: ([4, 5, 6], scalars)}))
    stacked = decode_chunk(encode_chunk(7, {0: ([4, 5, 6], np.stack(cells)),
                                            2: ([4, 5, 6], np.stack(scalars))}))
    assert joined.episode == stacked.episode == 7
    for column in (0, 2):
        assert joined.columns[column].dtype == stacked.columns[column].dtype
        np.testing.assert_array_equal(joined.columns[column], stacked.columns[column])
        assert joined.steps_of(column).tolist() == [4, 5, 6]
        assert joined.kinds[column] == stacked.kinds[column]


def test_a_chunks_kind_names_its_dtype_and_cell_shape_for_any_number_of_shapes():
    # decoding remembers each kind it met, and forgets them all past a bound: cells of
    # ever new shapes neither grow memory without end nor get another shape's kind
    for width in range(1, step_records._MAX_KINDS + 50):
        chunk = decode_chunk(encode_chunk(0, {0: ([0, 1], np.zeros((2, width), np.float32)),
                                              1: ([0, 1], np.zeros(2, np.int64))}))
        assert chunk.kinds[0] == f"<f4({width},)"
        assert chunk.kinds[1] == "<i8()"
        assert chunk.columns[0].shape == (2, width) and chunk.columns[0].dtype == np.float32
        assert len(step_records._KINDS) <= step_records._MAX_KINDS


def test_a_chunk_of_python_objects_is_refused():
    with pytest.raises(TypeError, match="Python objects"):
        encode_chunk_cells(1, {0: ([0], [np.asarray([object()], dtype=object)])})


def test_a_chunk_stays_while_an_older_item_reads_it_after_its_newest_left(client):
    """The sweep looks at a chunk's newest reference first; when that item has left, an
    older one still holds the chunk, whichever of the front or the cursor looks."""
    store = StepStore(client, "s")
    table = store.table("t", capacity=100)
    with store.writer(num_keep_alive_refs=2, chunk_length=2) as writer:
        for t in range(2):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
    assert len(chunks(store)) == 1
    first, newest = sorted(int(i) for i in client.zrange(table.keys.order, 0, -1))
    table.remove([newest])
    for _ in range(3):
        store.sweep(100, grace=0)
    assert len(chunks(store)) == 1 and store.stats()["unreferenced"] == 0
    [item] = store.sample(table, 1, timeout=0)
    assert float(item.columns[0][0]) == 0.0
    table.remove([first])
    store.sweep(100, grace=0)  # marks it
    store.sweep(100, grace=0)  # frees it
    assert chunks(store) == [] and store.stats()["chunks_freed"] == 1


@pytest.mark.redis_server
def test_a_pipeline_of_large_pieces_goes_in_one_send(redis_server, monkeypatch):
    client = connect(redis_server.url)
    connection = client.connection_pool.get_connection()
    assert isinstance(connection, OneSendConnection)
    client.connection_pool.release(connection)  # connected: no handshake below
    sends: list[int] = []
    real = socket.socket.sendall

    def counted(sock, data, *args):
        sends.append(len(data))
        return real(sock, data, *args)

    monkeypatch.setattr(socket.socket, "sendall", counted)
    pipe = client.pipeline(transaction=False)
    pipe.set("a", b"x" * 10_000)
    pipe.set("b", b"y" * 100_000)
    pipe.get("a")
    pipe.strlen("b")
    replies = pipe.execute()
    assert replies == [True, True, b"x" * 10_000, 100_000]
    assert len(sends) == 1 and sends[0] > 110_000
    client.close()


@pytest.mark.parametrize("url", ["redis://h:1/0", "REDIS://h:1", "rediss://h:1",
                                 "RedisS://h:1", "unix:///tmp/r.sock", "UNIX:///tmp/r.sock"])
def test_the_one_send_connection_is_of_the_kind_redis_py_picks_for_the_url(url):
    """TLS or a Unix socket as redis-py reads the URL, whatever the scheme's case."""
    picked = redis.connection.parse_url(url).get("connection_class",
                                                 redis.connection.Connection)
    assert issubclass(_connection_class(url), picked)
