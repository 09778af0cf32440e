"""A large add (redisbuf/buffers/staged.py) against other processes on a real server: the
readers of every kind see it whole or not at all, at the worst moment (the writer stopped
right after its commit, its slices mostly not stored) and while it goes on; a writer
killed there blocks nobody."""

from __future__ import annotations

import multiprocessing as mp
import os

import numpy as np
import pytest
import redis

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.buffers import staged

pytestmark = pytest.mark.redis_server

N = 6 * 1024 + 3
BEFORE = 50
CONTEXT = mp.get_context("fork")  # the children keep this process's monkeypatches off


@pytest.fixture(autouse=True)
def _dropped(redis_server, buffer_name):
    """The test's buffer goes afterwards (the session's server is shared by the file's
    worker: tests/test_cli.py lists the buffers left there)."""
    yield
    client = redis.Redis.from_url(redis_server.url)
    keys = list(client.scan_iter(match=f"rb:{{{buffer_name}}}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def _items(n: int, start: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.arange(start, start + n, dtype=np.int64), "log_rewards": np.zeros(n)}


def _writer(url: str, name: str, committed, go, out, die: bool) -> None:
    rest = staged._store_the_rest

    def paused(client, keys):  # the worst moment: committed, one slice of many stored
        committed.set()
        if die:
            os._exit(0)
        go.wait(60)
        rest(client, keys)

    staged._store_the_rest = paused
    buffer = ReplayBuffer(url, name, capacity=20_000, sampler=PERSampler())
    result = buffer.add(_items(N, start=BEFORE))
    out.put((result.ids[0], len(result.ids), result.evicted))


def _reader(url: str, name: str, start, out, kind: str) -> None:
    start.wait(60)
    buffer = ReplayBuffer(url, name, capacity=20_000, sampler=PERSampler())
    if kind == "len":
        seen = len(buffer)
    elif kind == "stats":
        seen = buffer.stats()["length"]
    elif kind == "sample":  # PER, its replica made before the add
        seen = int(buffer.sample_with_info(2048).ids.max())
    else:  # an add of its own, after the large one
        seen = int(buffer.add(_items(2)).ids[0])
    out.put((kind, seen))


def _start(url: str, name: str, die: bool):
    buffer = ReplayBuffer(url, name, capacity=20_000, sampler=PERSampler())
    buffer.add(_items(BEFORE))
    buffer.sample(8)  # its replica exists: the reader's draws follow the log
    committed, go, out = CONTEXT.Event(), CONTEXT.Event(), CONTEXT.Queue()
    writer = CONTEXT.Process(target=_writer, args=(url, name, committed, go, out, die))
    writer.start()
    return buffer, writer, committed, go, out


@pytest.mark.parametrize("kind", ["len", "stats", "sample", "add"])
def test_readers_meeting_a_committed_add_see_it_whole(redis_server, buffer_name, kind):
    url = redis_server.url
    buffer, writer, committed, go, out = _start(url, buffer_name, die=False)
    results = CONTEXT.Queue()
    readers = [CONTEXT.Process(target=_reader, args=(url, buffer_name, committed, results, kind))
               for _ in range(2)]
    for reader in readers:
        reader.start()
    seen = [results.get(timeout=120) for _ in readers]
    go.set()  # the writer goes on only once both readers have their answer
    first, count, evicted = out.get(timeout=120)
    for process in (writer, *readers):
        process.join(60)
        assert process.exitcode == 0
    assert (first, count, evicted) == (BEFORE + 1, N, 0)
    expected = {"len": BEFORE + N, "stats": BEFORE + N, "sample": None,
                "add": BEFORE + N + 1}[kind]
    for got_kind, value in seen:
        assert got_kind == kind
        if kind == "sample":  # drawn from the whole add: beyond its first slice
            assert BEFORE + 1024 < value <= BEFORE + N
        elif kind == "add":  # ids after the large add's, each reader's own pair
            assert value in (expected, expected + 2)
        else:
            assert value == expected
    total = BEFORE + N + (4 if kind == "add" else 0)
    assert len(buffer) == total and not buffer.client.hexists(buffer.keys.meta, "applying")


def test_a_writer_killed_after_its_commit_blocks_nobody(redis_server, buffer_name):
    url = redis_server.url
    buffer, writer, committed, _go, _out = _start(url, buffer_name, die=True)
    writer.join(60)
    assert committed.is_set() and writer.exitcode == 0
    assert buffer.client.hexists(buffer.keys.meta, "applying")
    results = CONTEXT.Queue()
    reader = CONTEXT.Process(target=_reader, args=(url, buffer_name, committed, results, "len"))
    reader.start()
    assert results.get(timeout=120) == ("len", BEFORE + N)
    reader.join(60)
    assert buffer.get(np.arange(1, BEFORE + N + 1))["x"].tolist() == list(range(BEFORE + N))
    assert not buffer.client.keys(f"rb:{{{buffer_name}}}:appl*")


def _poll(url: str, name: str, stop, out) -> None:
    buffer = ReplayBuffer(url, name, capacity=20_000, sampler=PERSampler())
    lengths = set()
    while not stop.is_set():
        lengths.add(len(buffer))
    out.put(sorted(lengths))


def test_lengths_read_during_a_large_add_are_before_or_after(redis_server, buffer_name):
    url = redis_server.url
    buffer = ReplayBuffer(url, buffer_name, capacity=20_000, sampler=PERSampler())
    buffer.add(_items(BEFORE))
    stop, out = CONTEXT.Event(), CONTEXT.Queue()
    pollers = [CONTEXT.Process(target=_poll, args=(url, buffer_name, stop, out))
               for _ in range(2)]
    for poller in pollers:
        poller.start()
    for round_ in range(3):
        buffer.add(_items(N, start=BEFORE + round_ * N))
    stop.set()
    seen = [out.get(timeout=120) for _ in pollers]
    for poller in pollers:
        poller.join(60)
    allowed = {BEFORE + k * N for k in range(4)}
    assert all(set(lengths) <= allowed for lengths in seen), seen
