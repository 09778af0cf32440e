"""A batched ``redisbuf.reverb.TrajectoryDataset`` drawn by sampler processes
(redisbuf/buffers/batch_processes.py): the same batches, ends and errors as its threads
give; a process that dies is reported; closing the dataset ends every process, also one
waiting on the rate limiter or blocked sending a batch nobody reads; a process draws
its next answer while the last one waits for the reader; the wire carries items of
columns that differ in shape; and columns in slots of shared memory are never written
over while a batch of them is kept, and cross the socket when no slot is lent."""

from __future__ import annotations

import gc
import mmap
import os
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from redisbuf import reverb
from redisbuf.buffers import batch_processes
from redisbuf.buffers.step_reads import SampledBatch, SampledItem
from redisbuf.buffers.steps import DEFAULT_CACHE_BYTES
from redisbuf.errors import NoSuchBufferError, SamplerProcessError
from redisbuf.reverb import datasets

MODES = pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])


@pytest.fixture(scope="module")
def server():
    tables = [
        reverb.Table("steps", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 100,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("queue", 10),
        reverb.Table("big", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                     reverb.rate_limiters.MinSize(1)),
    ]
    server = reverb.Server(tables)
    yield server
    server.stop()


@pytest.fixture
def client(server):
    client = server.localhost_client()
    yield client
    for name in ("steps", "queue", "big"):
        client.reset(name)


def children() -> set[int]:
    """The pids of this process's living children."""
    found = set()
    for task in Path("/proc/self/task").iterdir():
        found.update(int(pid) for pid in (task / "children").read_text().split())
    return found


def dataset(client, table, processes, **kwargs):
    kwargs.setdefault("max_in_flight_samples_per_worker", 4)
    return reverb.TrajectoryDataset(client.server_address, table, dtypes=[np.int64],
                                    shapes=[(1,)], sampler_processes=processes, **kwargs)


@pytest.mark.redis_server
@MODES
def test_batches_hold_each_items_own_steps_and_stop_at_max_samples(client, processes):
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(30):
            writer.append({"obs": np.full((2, 3), t, np.float32), "t": np.int64(t)})
            if t:
                writer.create_item("steps", 1.0, {"obs": writer.history["obs"][-2:],
                                                  "t": writer.history["t"][-2]})
    made = reverb.TrajectoryDataset(
        client.server_address, "steps", dtypes={"obs": np.float32, "t": np.int64},
        shapes={"obs": (2, 2, 3), "t": ()}, max_in_flight_samples_per_worker=4,
        max_samples=10, sampler_processes=processes)
    batches = list(made.batch(4).as_numpy_iterator())
    assert [len(b.info.key) for b in batches] == [4, 4, 2]
    for batch in batches:
        assert batch.data["obs"].shape[1:] == (2, 2, 3)
        assert batch.info.key.dtype == np.uint64 and batch.info.table_size.dtype == np.int64
        assert batch.info.times_sampled.dtype == np.int32
        assert (batch.data["obs"][:, 1] == batch.data["obs"][:, 0] + 1).all()
        assert (batch.data["t"] == batch.data["obs"][:, 0, 0, 0]).all()
        assert (batch.info.table_size == 29).all()
        np.testing.assert_allclose(batch.info.probability, 1 / 29)
    kept = list(made.batch(4, drop_remainder=True).as_numpy_iterator())
    assert [len(b.info.key) for b in kept] == [4, 4]


@pytest.mark.redis_server
@MODES
def test_a_rate_limiter_timeout_ends_the_iteration_after_what_was_drawn(client, processes):
    for value in range(3):
        client.insert(np.int64(value), priorities={"queue": 1.0})
    made = dataset(client, "queue", processes, max_in_flight_samples_per_worker=2,
                   num_workers_per_iterator=1, rate_limiter_timeout_ms=300)
    got = [b.data[0][:, 0].tolist() for b in made.batch(2).as_numpy_iterator()]
    assert got == [[0, 1], [2]]
    client.insert(np.int64(3), priorities={"queue": 1.0})
    assert list(made.batch(2, drop_remainder=True).as_numpy_iterator()) == []
    assert client.server_info()["queue"].current_size == 0  # the one item was drawn


@pytest.mark.redis_server
@MODES
def test_an_error_in_a_worker_is_raised_as_its_own_class(client, processes):
    with pytest.raises(ValueError, match='Could not find table "nope"'):
        next(iter(dataset(client, "nope", processes).batch(2)))


@pytest.mark.redis_server
def test_a_sampler_process_that_dies_is_reported_by_pid(client):
    client.insert(np.int64(1), priorities={"steps": 1.0})
    before = children()
    batches = iter(dataset(client, "steps", True, num_workers_per_iterator=1).batch(2))
    next(batches)
    (pid,) = children() - before
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(SamplerProcessError, match=f"sampler process {pid} exited without"):
        for _ in range(10_000):  # the batches already on their way come first
            next(batches)
    assert children() == before


@pytest.mark.redis_server
def test_closing_ends_a_process_blocked_sending_a_batch_nobody_reads(client, monkeypatch):
    # each batch (4 MiB) is far more than the socket holds, and no slot of shared memory
    # is lent: with two draws asked of each process, both are blocked in a send when the
    # dataset is closed
    monkeypatch.setattr(batch_processes, "_SLOTS_PER_PROCESS", 0)
    for value in range(4):
        client.insert(np.full(2**18, value, np.float32), priorities={"big": 1.0})
    before = children()
    made = reverb.TrajectoryDataset(client.server_address, "big", dtypes=[np.float32],
                                    shapes=[(1, 2**18)], max_in_flight_samples_per_worker=4)
    batches = made.batch(4).as_numpy_iterator()
    first = next(batches)
    assert first.data[0].shape == (4, 1, 2**18)
    assert all((row == row[0]).all() for row in first.data[0][:, 0])
    assert len(children() - before) == 2
    batches.close()
    assert children() == before


def _roundtrip(batch: SampledBatch) -> SampledBatch:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        sender = threading.Thread(
            target=batch_processes._send_batch, args=(theirs, batch, True, False))
        sender.start()
        got = batch_processes._recv_batch(ours, batch_processes._recv(ours))
        sender.join()
    return got


def test_the_wire_carries_stacked_columns_and_items_of_differing_shapes():
    info = (np.array([3, 9], np.uint64), np.array([0.25, 0.75]), np.array([4, 4]),
            np.array([1.0, 2.0]), np.array([1, 2], np.int32))
    stacked = _roundtrip(SampledBatch(*info, [np.arange(2 * 10**6, dtype=np.float32)
                                              .reshape(2, -1), np.zeros((2, 0))]))
    assert stacked.items is None and stacked.columns is not None
    np.testing.assert_array_equal(stacked.columns[0].ravel(),
                                  np.arange(2 * 10**6, dtype=np.float32))
    assert stacked.columns[1].shape == (2, 0)
    for sent, got in zip(info, (stacked.keys, stacked.probabilities, stacked.table_sizes,
                                stacked.priorities, stacked.times_sampled), strict=True):
        np.testing.assert_array_equal(sent, got)
        assert sent.dtype == got.dtype
    items = [SampledItem(3, 0.25, 4, 1.0, 1, [np.ones((1, 2)), np.int64(5)], 0),
             SampledItem(9, 0.75, 4, 2.0, 2, [np.ones((3, 2)), np.int64(6)], 1)]
    ragged = _roundtrip(SampledBatch(*info, None, items))
    assert ragged.columns is None and ragged.items is not None
    for sent_item, got_item in zip(items, ragged.items, strict=True):
        assert (got_item.key, got_item.probability, got_item.table_size, got_item.priority,
                got_item.times_sampled, got_item.episode) == (
                    sent_item.key, sent_item.probability, sent_item.table_size,
                    sent_item.priority, sent_item.times_sampled, sent_item.episode)
        for a, b in zip(sent_item.columns, got_item.columns, strict=True):
            np.testing.assert_array_equal(a, b)
            assert np.asarray(a).shape == b.shape


def test_errors_come_back_as_their_class_only_when_it_is_redisbufs_or_builtin():
    rebuilt = batch_processes._rebuilt
    assert type(rebuilt("redisbuf.errors", "NoSuchBufferError", "gone", 7)) is \
        NoSuchBufferError
    assert type(rebuilt("builtins", "KeyError", "k", 7)) is KeyError
    other = rebuilt("os", "system", "x", 7)
    assert isinstance(other, SamplerProcessError)
    assert str(other) == "sampler process 7 failed: os.system: x"
    assert isinstance(rebuilt("redisbuf.errors", "NoSuchThing", "x", 7), SamplerProcessError)


@pytest.mark.redis_server
def test_a_process_draws_its_next_answer_while_the_last_waits_for_the_reader(client,
                                                                            monkeypatch):
    # each batch (4 MiB) is far more than the socket holds, and no slot is lent. After
    # the first batch the reader has asked for two more and reads nothing: the process
    # draws both, one of them waiting to be sent, rather than stopping at the send of
    # the first
    monkeypatch.setattr(batch_processes, "_SLOTS_PER_PROCESS", 0)
    for value in range(4):
        client.insert(np.full(2**18, value, np.float32), priorities={"big": 1.0})
    made = reverb.TrajectoryDataset(client.server_address, "big", dtypes=[np.float32],
                                    shapes=[(1, 2**18)], max_in_flight_samples_per_worker=4,
                                    num_workers_per_iterator=1)
    batches = made.batch(4).as_numpy_iterator()
    next(batches)

    def samples() -> int:
        return client.server_info()["big"].rate_limiter_info.sample_stats.completed

    deadline = time.monotonic() + 60  # a liveness wait: the process may be starved
    while samples() < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert samples() == 12
    second = next(batches)
    assert second.data[0].shape == (4, 1, 2**18)
    batches.close()


@pytest.mark.redis_server
@MODES
def test_cache_bytes_bounds_the_chunks_each_worker_keeps_decoded(client, processes,
                                                                 monkeypatch):
    openers = []
    draws = batch_processes.draws_in_processes

    def recorded(opener, args, *rest, **kwargs):
        openers.append((opener, args))
        return draws(opener, args, *rest, **kwargs)

    monkeypatch.setattr(batch_processes, "draws_in_processes", recorded)
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for t in range(12):
            writer.append({"t": np.int64(t)})
            writer.create_item("steps", 1.0, {"t": writer.history["t"][-1:]})
    for cache_bytes, keeps in ((0, False), (None, True)):
        made = reverb.TrajectoryDataset(client.server_address, "steps", dtypes={"t": np.int64},
                                        shapes={"t": (1,)}, max_in_flight_samples_per_worker=4,
                                        max_samples=8, sampler_processes=processes,
                                        cache_bytes=cache_bytes)
        batches = list(made.batch(4).as_numpy_iterator())
        assert [len(b.info.key) for b in batches] == [4, 4]
        assert {t for b in batches for t in b.data["t"][:, 0].tolist()} <= set(range(12))
        if processes:  # each process opens its store with the dataset's bound
            opener, args = openers.pop()
            store, _ = getattr(datasets, opener.partition(":")[2])(*args)
        else:
            store = made.source.store()
            assert (store._cached_bytes > 0) is keeps
        assert store.cache_bytes == (DEFAULT_CACHE_BYTES if cache_bytes is None else 0)


@pytest.mark.parametrize("cache_bytes", [-1, 1.5, True, "1"])
def test_cache_bytes_must_be_none_or_a_count_of_bytes(cache_bytes):
    with pytest.raises(ValueError, match=r"cache_bytes \(.*\) must be None or an integer"):
        reverb.TrajectoryDataset("localhost:1", "t", dtypes=[np.int64], shapes=[(1,)],
                                 max_in_flight_samples_per_worker=1, cache_bytes=cache_bytes)


def _in_a_slot(array: np.ndarray) -> bool:
    """Whether ``array`` is a view of a slot of the reader's shared memory."""
    lease = array.base  # the slot's bytes, made of a memoryview of the map
    view = None if lease is None else lease.base
    return isinstance(view, memoryview) and isinstance(view.obj, mmap.mmap)


def _fill_numbered(client, count):
    """Items of two steps of 1,024 values each, every value the step's number."""
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(count + 1):
            writer.append({"obs": np.full(1024, t, np.float32)})
            if t:
                writer.create_item("steps", 1.0, {"obs": writer.history["obs"][-2:]})


def _numbered_batches(client, **kwargs):
    return reverb.TrajectoryDataset(
        client.server_address, "steps", dtypes={"obs": np.float32},
        shapes={"obs": (2, 1024)}, max_in_flight_samples_per_worker=8,
        **kwargs).batch(8).as_numpy_iterator()


def _check_numbered(batch):
    obs = batch.data["obs"]
    assert obs.shape == (8, 2, 1024)
    first = obs[:, 0, 0]  # an item's steps are t - 1 and t, every value the number
    assert (obs[:, 0] == first[:, None]).all() and (obs[:, 1] == first[:, None] + 1).all()


@pytest.mark.redis_server
def test_batches_kept_are_never_written_over_and_dropped_ones_lend_their_slot(client,
                                                                                monkeypatch):
    # the first two draws are asked before an answer's size is known: they cross the
    # socket; the next two are kept in their slots, and four slots are left to lend
    monkeypatch.setattr(batch_processes, "_SLOTS_PER_PROCESS", 6)
    _fill_numbered(client, 60)
    batches = _numbered_batches(client, num_workers_per_iterator=1)
    kept = [next(batches) for _ in range(4)]
    copies = [b.data["obs"].copy() for b in kept]
    assert any(_in_a_slot(b.data["obs"]) for b in kept)
    assert not all(_in_a_slot(b.data["obs"]) for b in kept)
    dropped = 0
    for _ in range(30):  # each dropped at once: its slot is lent again
        batch = next(batches)
        _check_numbered(batch)
        dropped += _in_a_slot(batch.data["obs"])
        del batch
    assert dropped >= 15  # (a draw may be asked while the slots are held downstream)
    for batch, copy in zip(kept, copies, strict=True):
        _check_numbered(batch)
        np.testing.assert_array_equal(batch.data["obs"], copy)
    batches.close()


@pytest.mark.redis_server
def test_without_memory_files_every_column_crosses_the_socket(client, monkeypatch):
    monkeypatch.delattr(os, "memfd_create")
    _fill_numbered(client, 20)
    batches = _numbered_batches(client, max_samples=40)
    got = list(batches)
    assert len(got) == 5
    for batch in got:
        _check_numbered(batch)
        assert not _in_a_slot(batch.data["obs"])


@pytest.mark.redis_server
def test_a_batch_is_let_go_without_the_garbage_collector(client, monkeypatch):
    # a batch in no reference cycle: its slot is free again as soon as it is dropped
    monkeypatch.setattr(batch_processes, "_SLOTS_PER_PROCESS", 3)
    _fill_numbered(client, 20)
    gc.disable()
    try:
        batches = _numbered_batches(client, num_workers_per_iterator=1)
        slotted = 0
        for _ in range(40):
            batch = next(batches)
            _check_numbered(batch)
            slotted += _in_a_slot(batch.data["obs"])
            del batch
        batches.close()
    finally:
        gc.enable()
    assert slotted >= 15  # (a cycle would hold each of the 3 slots for good: 3 at most)
