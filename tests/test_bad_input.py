"""Bad input: a clear error naming the problem, and the buffer exactly as it was."""

from __future__ import annotations

import socket
import threading
import time

import fakeredis
import numpy as np
import pytest
import redis
import torch
from key_contents import key_contents

import redisbuf
from redisbuf import BufferKeys, ReplayBuffer, States, Trajectories, Transitions
from redisbuf.errors import (
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
    ItemTooLargeError,
    SchemaError,
    ServerUnavailableError,
)
from redisbuf.store import codec


def snapshot(client, name: str) -> dict[str, object]:
    """Every key of buffer ``name`` with its type and full content."""
    return key_contents(client, BufferKeys(name).all_keys())


@pytest.fixture
def filled(client, buffer_name):
    """A prioritized buffer holding a few float32 dict items, and its snapshot."""
    buffer = ReplayBuffer(
        client, buffer_name, capacity=4, prioritized_capacity=True, prioritized_sampling=True,
        max_item_bytes=1000,
    )
    buffer.add(_good(np.arange(3)))
    buffer.sample(2)
    return buffer, snapshot(client, buffer_name)


def _good(values, rewards=None, dtype=np.float32, width=2):
    values = np.asarray(values)
    return {
        "obs": np.repeat(values[:, None], width, axis=1).astype(dtype),
        "log_rewards": np.asarray(values if rewards is None else rewards, dtype=np.float64),
    }


def _unchanged(client, buffer, before):
    assert snapshot(client, buffer.name) == before


# -- batches the buffer refuses -----------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "error", "words"),
    [
        (States(np.zeros((2, 2), np.float32), log_rewards=np.zeros(2)), SchemaError,
         ["dict", "states"]),
        (_good([1.0], dtype=np.float64), SchemaError, ["obs", "float32", "float64"]),
        (_good([1.0], width=3), SchemaError, ["obs", "shape", "[2]", "[3]"]),
        ({"obs": torch.zeros(1, 2), "log_rewards": torch.zeros(1)}, SchemaError,
         ["lib", "numpy", "torch"]),
        ({"obs": np.zeros((1, 2), np.float32)}, InvalidBatchError, ["log_rewards"]),
        ({**_good([1.0]), "extra": np.zeros(1)}, SchemaError, ["extra"]),
        (_good([1.0, 2.0], [0.0, np.nan]), InvalidBatchError, ["NaN", "[1]"]),
        (_good([1.0, 2.0], [0.0]), InvalidBatchError, ["log_rewards", "1", "2"]),
        ({"obs": np.zeros((3, 2), np.float32), "log_rewards": np.zeros(2)}, InvalidBatchError,
         ["disagree", "obs", "log_rewards"]),
        ({"obs": np.zeros((0, 2), np.float32), "log_rewards": np.zeros(0)}, InvalidBatchError,
         ["empty"]),
        ({"obs": np.float32(1.0), "log_rewards": np.zeros(1)}, InvalidBatchError,
         ["leading batch dimension"]),
        ({"obs": np.zeros((1, 2), np.complex64), "log_rewards": np.zeros(1)}, SchemaError,
         ["complex"]),
        ({"obs": np.array([[{}, {}]], dtype=object), "log_rewards": np.zeros(1)}, SchemaError,
         ["obs"]),
        ({1: np.zeros(1), "log_rewards": np.zeros(1)}, InvalidBatchError, ["strings"]),
        ((np.zeros(2),), SchemaError, ["tuple"]),
        ([np.zeros(2)], SchemaError, ["dict", "nest"]),
        (_good(np.arange(1), dtype=np.float32, width=300), ItemTooLargeError,
         ["item 0", "max_item_bytes=1000"]),
    ],
    ids=[
        "wrong-kind", "wrong-dtype", "wrong-trailing-shape", "wrong-library",
        "missing-log-rewards", "extra-field", "nan", "short-log-rewards",
        "mismatched-lengths", "empty", "scalar-field", "unsupported-dtype", "object-dtype",
        "non-string-key", "not-a-batch", "list-of-items", "too-large",
    ],
)
def test_rejected_batch_leaves_buffer_unchanged(client, filled, batch, error, words):
    buffer, before = filled
    with pytest.raises(error) as info:
        buffer.add(batch)
    message = str(info.value)
    for word in words:
        assert word in message, (word, message)
    _unchanged(client, buffer, before)
    # and the buffer still works
    assert buffer.add(_good([5.0])).ids.tolist() == [4]


def test_one_oversized_item_rejects_the_whole_batch(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, max_item_bytes=400)

    def trajectories(lengths):
        horizon = max(lengths)
        return Trajectories(
            np.zeros((horizon + 1, len(lengths), 8), np.float32),
            np.zeros((horizon, len(lengths)), np.int64),
            np.array(lengths),
        )

    buffer.add(trajectories([1, 2]))
    before = snapshot(client, buffer_name)
    with pytest.raises(ItemTooLargeError, match="item 2 encodes to .* over max_item_bytes=400"):
        buffer.add(trajectories([1, 3, 20, 2]))  # only the third trajectory is too large
    _unchanged(client, buffer, before)
    assert buffer.add(trajectories([3, 4])).ids.tolist() == [3, 4]


def test_rejected_first_batch_fixes_no_schema(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=5, kind="states")
    before = snapshot(client, buffer_name)
    with pytest.raises(SchemaError, match="states"):
        buffer.add({"x": np.zeros(2)})
    with pytest.raises(InvalidBatchError, match="NaN"):
        buffer.add(States(np.zeros((2, 1)), log_rewards=np.array([np.nan, 0.0])))
    _unchanged(client, buffer, before)
    assert client.hget(BufferKeys(buffer_name).meta, "schema") is None
    # a new object may still pick any schema of the right kind
    buffer.add(States(np.zeros((2, 3), np.int8)))
    assert buffer.get([1, 2]).states.dtype == np.int8


@pytest.mark.parametrize(
    ("batch", "words"),
    [
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1, 3])), ["[0, 2]"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1, -1])), ["[0, 2]"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1.0, 1.0])),
         ["terminating_idx", "integers"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1])),
         ["terminating_idx", "2"]),
        (Trajectories(np.zeros((4, 2, 1)), np.zeros((2, 2)), np.array([1, 1])), ["disagree"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 3)), np.array([1, 1])), ["disagree"]),
        (Trajectories(np.zeros((3, 2)), np.zeros(2), np.array([1, 1])), ["(T+1, B"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1, 1]),
                      log_probs=np.zeros((3, 2))), ["log_probs", "(2, 2)"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1, 1]),
                      conditions=np.zeros((3, 1))), ["conditions", "2"]),
        (Trajectories(np.zeros((3, 2, 1)), np.zeros((2, 2)), np.array([1, 1]),
                      log_rewards=np.array([0.0, np.nan])), ["NaN"]),
        (Transitions(np.zeros((2, 1)), np.zeros((2, 1)), np.zeros(2), None), ["is_terminating"]),
        (Transitions(np.zeros((2, 1)), np.zeros((3, 1)), np.zeros(2), np.zeros(2, bool)),
         ["disagree"]),
    ],
)
def test_malformed_containers_are_refused(client, buffer_name, batch, words):
    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    before = snapshot(client, buffer_name)
    with pytest.raises(InvalidBatchError) as info:
        buffer.add(batch)
    for word in words:
        assert word in str(info.value), (word, str(info.value))
    _unchanged(client, buffer, before)


def test_trajectory_padding_values_are_part_of_the_schema(client, buffer_name):
    def make(pad):
        return Trajectories(np.zeros((2, 1, 1)), np.zeros((1, 1)), np.array([1]),
                            states_pad_value=pad)

    buffer = ReplayBuffer(client, buffer_name, capacity=5)
    buffer.add(make(0.0))
    before = snapshot(client, buffer_name)
    with pytest.raises(SchemaError, match="padding"):
        buffer.add(make(-1.0))
    _unchanged(client, buffer, before)


# -- configuration --------------------------------------------------------------------


@pytest.mark.parametrize("capacity", [0, -3, 2.5, "10"])
def test_bad_capacity_is_refused_before_touching_redis(client, buffer_name, capacity):
    ReplayBuffer(client, buffer_name, capacity=4).add({"x": np.zeros(2)})
    before = snapshot(client, buffer_name)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(client, buffer_name, capacity=capacity)
    with pytest.raises(ValueError, match="capacity"):
        ReplayBuffer(client, f"{buffer_name}-new", capacity=capacity)
    assert snapshot(client, buffer_name) == before
    assert client.exists(*BufferKeys(f"{buffer_name}-new").all_keys()) == 0


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [({"kind": "tensors"}, "kind"), ({"max_item_bytes": 0}, "max_item_bytes")],
)
def test_bad_options_are_refused(client, buffer_name, kwargs, word):
    with pytest.raises(ValueError, match=word):
        ReplayBuffer(client, buffer_name, capacity=4, **kwargs)
    assert client.exists(*BufferKeys(buffer_name).all_keys()) == 0


@pytest.mark.parametrize(
    "name",
    ["", "has space", "brace{x}", "colon:x", "x" * 201, "ünï", "a/b", None, 5]
    + ["a\n", "x" * 200 + "\n"],  # "$" matches before a final newline: fullmatch does not
)
def test_invalid_buffer_names_are_refused(client, name):
    before = client.dbsize()
    with pytest.raises(ValueError, match="invalid buffer name"):
        ReplayBuffer(client, name, capacity=4)
    with pytest.raises(ValueError, match="invalid buffer name"):
        BufferKeys(name)
    assert client.dbsize() == before


def test_longest_valid_name_is_accepted(client):
    name = "A-z_0." + "x" * 194
    buffer = ReplayBuffer(client, name, capacity=2)
    buffer.add({"x": np.zeros(1)})
    assert len(buffer) == 1


def test_sampling_an_empty_buffer_changes_nothing(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4, prioritized_sampling=True)
    before = snapshot(client, buffer_name)
    for replacement in (None, True):
        with pytest.raises(EmptyBufferError, match="buffer is empty"):
            buffer.sample(3, replacement=replacement)
    uniform = ReplayBuffer(client, buffer_name, capacity=4)
    with pytest.raises(EmptyBufferError, match="buffer is empty"):
        uniform.sample(1)
    _unchanged(client, buffer, before)


def test_client_decoding_responses_is_refused(client, buffer_name):
    kwargs = client.connection_pool.connection_kwargs
    if isinstance(client, fakeredis.FakeRedis):
        decoding = fakeredis.FakeRedis(server=client.connection_pool.connection_kwargs.get(
            "server"), decode_responses=True)
    else:
        decoding = redis.Redis(host=kwargs["host"], port=kwargs["port"], decode_responses=True)
    with pytest.raises(ValueError, match="decode_responses=False"):
        ReplayBuffer(decoding, buffer_name, capacity=4)
    assert client.exists(*BufferKeys(buffer_name).all_keys()) == 0


def test_corrupt_stored_blob_raises_decode_error_naming_the_item(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=4)
    buffer.add({"x": np.zeros((3, 2), np.float32)})
    keys = BufferKeys(buffer_name)
    client.hset(keys.items, b"%012d" % 2, b"\x82\xa1x\xc7")  # truncated
    with pytest.raises(DecodeError, match="id 2"):
        buffer.get([1, 2])
    wrong = codec.packb({"x": np.zeros(2, np.float64)})  # schema says float32
    client.hset(keys.items, b"%012d" % 3, wrong)
    with pytest.raises(DecodeError):
        buffer.get([3])
    client.hset(keys.items, b"%012d" % 3, codec.packb({"y": np.zeros(2, np.float32)}))
    with pytest.raises(DecodeError):
        buffer.get([3])
    assert buffer.get([1])["x"].shape == (1, 2)


# -- the server -------------------------------------------------------------------------


def test_unreachable_server_fails_fast_naming_the_url():
    start = time.monotonic()
    with pytest.raises(ServerUnavailableError, match=r"redis://127\.0\.0\.1:1"):
        redisbuf.connect("redis://127.0.0.1:1")
    with pytest.raises(ServerUnavailableError, match=r"127\.0\.0\.1:1"):
        ReplayBuffer("redis://127.0.0.1:1", "x", capacity=3)
    assert time.monotonic() - start < 30  # no retry loop (a hang guard, not a speed bound)


def test_unreachable_server_message_hides_the_password():
    with pytest.raises(ServerUnavailableError) as info:
        redisbuf.connect("redis://user:s3cret@127.0.0.1:1/0")
    assert "s3cret" not in str(info.value) and "***" in str(info.value)


@pytest.fixture
def silent_port():
    """A port that accepts TCP connections and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    yield listener.getsockname()[1]
    listener.close()  # resets the pending connections: any waiting client returns


def _connect_in_thread(url: str, **kwargs) -> tuple[threading.Thread, list[BaseException]]:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            redisbuf.connect(url, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, errors


def test_silent_server_times_out_on_the_socket_timeout(silent_port):
    thread, errors = _connect_in_thread(
        f"redis://127.0.0.1:{silent_port}", connect_timeout=0.5, socket_timeout=0.5
    )
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], ServerUnavailableError)
    assert f"127.0.0.1:{silent_port}" in str(errors[0])


def test_silent_server_is_given_up_on_the_connect_timeout(silent_port):
    thread, errors = _connect_in_thread(f"redis://127.0.0.1:{silent_port}", connect_timeout=0.5)
    thread.join(timeout=3)
    assert not thread.is_alive(), "connect() still waiting 3 s after a 0.5 s connect_timeout"


def test_non_redis_server_is_reported_as_unavailable():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]

    def answer() -> None:
        conn, _ = listener.accept()
        conn.recv(1024)
        conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        with pytest.raises(ServerUnavailableError, match=str(port)):
            redisbuf.connect(f"redis://127.0.0.1:{port}", connect_timeout=2, socket_timeout=2)
    finally:
        listener.close()


def test_missing_url_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("REDISBUF_URL", raising=False)
    monkeypatch.setenv("REDISBUF_EMBEDDED", "0")  # else a private server starts
    with pytest.raises(ServerUnavailableError, match="REDISBUF_URL"):
        redisbuf.connect()
