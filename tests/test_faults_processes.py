"""Faults a long run meets, with real processes: connections cut at random moments while
four writers add (a lossy proxy on loopback), and writers killed mid-run."""

from __future__ import annotations

import multiprocessing
import os
import queue
import random
import signal
import socket
import threading
import time
import traceback
import uuid

import numpy as np
import pytest
import redis
from process_helpers import wait_dead

from redisbuf import ReplayBuffer
from redisbuf.control.ipc import MessageQueue
from redisbuf.servers.embedded import EmbeddedServer

pytestmark = [pytest.mark.multiprocess, pytest.mark.redis_server]

WRITERS = 4
BATCHES = 40
ITEMS = 3


class LossyProxy:
    """A TCP proxy on loopback to ``port`` that cuts a connection (both ways) with
    probability ``p`` at each chunk it forwards: after the server has run a command and
    before its reply arrives, or while the command is in flight."""

    def __init__(self, port: int, p: float, seed: int = 0) -> None:
        self.target = port
        self.p = p
        self.random = random.Random(seed)
        self.cuts = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopping = False
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _cut(self) -> bool:
        with self.lock:
            cut = self.random.random() < self.p
            self.cuts += cut
            return cut

    def _accept(self) -> None:
        while not self.stopping:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target))
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while True:
                data = source.recv(65536)
                if not data or self._cut():
                    break
                sink.sendall(data)
        except OSError:
            pass
        for end in (source, sink):
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            end.close()

    def close(self) -> None:
        self.stopping = True
        self.listener.close()


def _writer(url: str, name: str, index: int, results: MessageQueue) -> None:
    try:
        # Opening also crosses the lossy link (connect's handshake, PING, INFO): a run of cuts
        # there is a failed open, not a lost batch, which is what this test is about.
        for attempt in range(5):
            try:
                buffer = ReplayBuffer(url, name, capacity=WRITERS * BATCHES * ITEMS)
                break
            except redis.exceptions.ConnectionError:  # ServerUnavailableError
                if attempt == 4:
                    raise
        acked, failed = [], 0
        for batch in range(BATCHES):
            tags = np.array([[index, batch, item] for item in range(ITEMS)], dtype=np.int64)
            try:
                result = buffer.add({"tag": tags})
            except redis.exceptions.ConnectionError:  # ServerUnavailableError: not acked
                failed += 1
                continue
            acked.append([batch, result.ids.tolist()])
        results.put({"worker": index, "acked": acked, "failed": failed})
    except BaseException:  # noqa: BLE001 - reported to the parent
        results.put({"worker": index, "error": traceback.format_exc()})


def test_cut_connections_lose_and_duplicate_no_acknowledged_batch():
    with EmbeddedServer() as server:
        proxy = LossyProxy(server.port, p=0.04, seed=7)
        name = f"cut-{uuid.uuid4().hex[:8]}"
        url = f"redis://127.0.0.1:{proxy.port}/0"
        # the buffer and the functions library (1.1 MB: a FUNCTION LOAD through the proxy
        # is cut about half the time) are made directly: opening is not what this tests
        ReplayBuffer(redis.Redis.from_url(server.url), name, capacity=WRITERS * BATCHES * ITEMS)
        ctx = multiprocessing.get_context("spawn")
        results = MessageQueue(ctx)
        writers = [
            ctx.Process(target=_writer, args=(url, name, index, results))
            for index in range(WRITERS)
        ]
        for process in writers:
            process.start()
        reports = []
        try:
            for _ in writers:
                reports.append(results.get(timeout=240))
        except queue.Empty:
            pytest.fail(f"writers did not finish; got {reports}")
        finally:
            for process in writers:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()
            proxy.close()
        errors = [r["error"] for r in reports if "error" in r]
        assert not errors, errors[0]
        assert proxy.cuts > 20, "the proxy cut too few connections to test anything"

        direct = ReplayBuffer(redis.Redis.from_url(server.url), name, capacity=None)
        ids = [int(m) for m in direct.client.zrange(direct.keys.order, 0, -1)]
        tags = direct.get(ids)["tag"] if ids else np.zeros((0, 3), np.int64)
        stored: dict[tuple[int, int], list[int]] = {}
        for item_id, (writer, batch, _item) in zip(ids, tags.tolist(), strict=True):
            stored.setdefault((writer, batch), []).append(item_id)
        duplicated = {key: got for key, got in stored.items() if len(got) != ITEMS}
        assert not duplicated, f"batches stored twice (or in part): {duplicated}"
        acked = {(r["worker"], batch): got for r in reports for batch, got in r["acked"]}
        assert sum(r["failed"] for r in reports) + len(acked) == WRITERS * BATCHES
        lost = {key for key in acked if key not in stored}
        assert not lost, f"acknowledged batches missing: {sorted(lost)[:10]}"
        assert all(stored[key] == got for key, got in acked.items())
        stats = direct.stats()
        assert stats["inserted"] - stats["evicted"] == stats["length"] == len(ids)


def _endless_writer(url: str, name: str, index: int, done) -> None:
    buffer = ReplayBuffer(url, name, capacity=400, prioritized_sampling=True)
    batch = 0
    while True:
        done.value = batch
        n = 50
        tags = np.array([[index, batch, item] for item in range(n)], dtype=np.int64)
        pad = np.ones((n, 1024), np.float32)  # 200 KiB batches: kills land mid-transfer
        buffer.add({"tag": tags, "pad": pad,
                    "log_rewards": np.random.default_rng(batch).normal(size=n)})
        buffer.sample(8)
        batch += 1


def test_writers_killed_at_random_moments_leave_whole_batches_and_true_counters():
    with EmbeddedServer() as server:
        name = f"killed-{uuid.uuid4().hex[:8]}"
        ReplayBuffer(server.url, name, capacity=400, prioritized_sampling=True)
        ctx = multiprocessing.get_context("spawn")
        rng = random.Random(3)
        for _round in range(2):
            counts = [ctx.Value("i", 0) for _ in range(WRITERS)]
            writers = [
                ctx.Process(target=_endless_writer, args=(server.url, name, index, counts[index]))
                for index in range(WRITERS)
            ]
            for process in writers:
                process.start()
            for process, count in zip(writers, counts, strict=True):
                deadline = time.monotonic() + 120
                while count.value < 2 and time.monotonic() < deadline:  # it is adding now
                    time.sleep(0.05)
                time.sleep(rng.uniform(0.0, 0.5))  # SIGKILL at a random moment of its run
                process.kill()
                process.join(timeout=30)
        buffer = ReplayBuffer(server.url, name, capacity=None, prioritized_sampling=True)
        ids = [int(m) for m in buffer.client.zrange(buffer.keys.order, 0, -1)]
        assert ids, "no writer got anything in"
        tags = buffer.get(ids)["tag"].tolist()
        stats = buffer.stats()
        assert stats["inserted"] - stats["evicted"] == stats["length"] == len(ids) <= 400
        assert buffer.client.hlen(buffer.keys.items) == len(ids)  # no orphan blob
        assert stats["inserted"] % 50 == 0  # only whole batches were ever inserted
        by_batch: dict[tuple[int, int], list[int]] = {}
        for writer, batch, item in tags:
            by_batch.setdefault((writer, batch), []).append(item)
        # capacity is 8 batches of 50: FIFO eviction removes whole batches too, so every
        # batch present is complete unless a killed add left part of one
        partial = {key: len(items) for key, items in by_batch.items() if len(items) != 50}
        assert not partial, partial
        assert buffer.sample(16)["tag"].shape == (16, 3)  # the sum tree is usable


@pytest.mark.parametrize("durability", [None, "aof"])
def test_a_killed_server_with_appendonly_keeps_every_acknowledged_add(tmp_path, durability):
    aof = ["--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(tmp_path)]
    name = f"aof-{uuid.uuid4().hex[:8]}"
    server = EmbeddedServer(extra_args=aof).start()
    acked = []
    batches = 200 if durability is None else 20  # each durable add waits for an fsync
    try:
        buffer = ReplayBuffer(server.url, name, capacity=10_000, durability=durability)
        for batch in range(batches):
            tags = np.array([[batch, item] for item in range(5)], dtype=np.int64)
            acked.append(buffer.add({"tag": tags}).ids.tolist())
    finally:
        # SIGKILL the server itself (server.process is its watchdog): no shutdown, no final
        # fsync or rewrite
        server_pid = server.pid
        assert server_pid is not None and server_pid > 0
        os.kill(server_pid, signal.SIGKILL)
        assert wait_dead(server_pid, 10), "the killed server is still running"
        server.stop()
    with EmbeddedServer(extra_args=aof) as again:
        restored = ReplayBuffer(again.url, name, capacity=None)
        stats = restored.stats()
        assert stats["length"] == stats["inserted"] == 5 * batches
        ids = [i for batch in acked for i in batch]
        expected = [[b, i] for b in range(batches) for i in range(5)]
        assert restored.get(ids)["tag"].tolist() == expected


_SILENT_MANAGER = """
import time
from redisbuf.control import mpi
from redisbuf.errors import ControlTimeoutError
transport = mpi.MPITransport()
assert transport.default_timeout == mpi.DEFAULT_TIMEOUT < float("inf"), transport.default_timeout
transport.default_timeout = 0.5  # the default's behaviour, without waiting 300 s
start = time.monotonic()
try:
    transport.recv(0, 7, None)  # a worker waiting for a manager that never runs
except ControlTimeoutError as exc:
    print("timeout after", round(time.monotonic() - start, 1), exc)
"""


def test_an_mpi_worker_whose_manager_never_runs_times_out():
    import subprocess
    import sys

    pytest.importorskip("mpi4py")
    done = subprocess.run(
        [sys.executable, "-c", _SILENT_MANAGER], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "no MPI message from rank 0" in done.stdout, done.stdout


def test_loads_through_cut_connections_restore_exactly_the_file_or_nothing(tmp_path):
    with EmbeddedServer() as server:
        name = f"cutload-{uuid.uuid4().hex[:8]}"
        direct = redis.Redis.from_url(server.url)
        source = ReplayBuffer(direct, name + "-src", capacity=3000)
        for start in (0, 1000, 2000):  # one add stores at most bounds.MAX_ADD_ITEMS items
            tags = np.arange(start, min(start + 1000, 2500), dtype=np.int64)
            source.add({"tag": tags.reshape(-1, 1)})
        path = tmp_path / "ckpt.rb"
        source.save(path)
        proxy = LossyProxy(server.port, p=0.05, seed=11)
        try:
            # opening's first checks of the server are not retried; the loads are what
            # this test cuts, so it opens until one open gets through
            for _ in range(10):
                try:
                    target = ReplayBuffer(f"redis://127.0.0.1:{proxy.port}/0", name,
                                          capacity=3000)
                    break
                except redis.exceptions.ConnectionError:
                    continue
            target.add({"tag": np.full((7, 1), -1, dtype=np.int64)})
            loaded = 0
            for _ in range(6):
                try:
                    target.load(path)
                    loaded += 1
                except redis.exceptions.ConnectionError:
                    pass  # gave up after its retries: the buffer is the old one or the file
                check = ReplayBuffer(direct, name, capacity=None)
                ids = [int(m) for m in direct.zrange(check.keys.order, 0, -1)]
                tags = sorted(check.get(ids)["tag"][:, 0].tolist())
                assert tags in ([-1] * 7, list(range(2500))), (len(tags), tags[:5])
                stats = check.stats()
                assert stats["inserted"] - stats["evicted"] == stats["length"] == len(ids)
        finally:
            proxy.close()
        assert loaded >= 1 and proxy.cuts > 0
