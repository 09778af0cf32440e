"""redisbuf.reverb across OS processes on one server: writer processes insert into a
queue table and a shared table at once (their steps stored once) while reader processes
drain the queue and sample the shared table, the queue full and empty by turns (both
sides block on its rate limiter) and every writer sweeping chunks as it goes. Every item
is read from the queue exactly once, with the data it was written with; the shared
table's items stay whole; once both tables are empty, the sweep frees every chunk."""

from __future__ import annotations

import traceback

import numpy as np
import pytest
from process_helpers import fresh_context

from redisbuf import reverb

pytestmark = [pytest.mark.redis_server, pytest.mark.timeout(300)]

WRITERS, READERS, ITEMS = 2, 2, 150


def _payload(writer: int, seq: int) -> dict[str, np.ndarray]:
    return {"who": np.array([writer, seq], np.int64),
            "obs": np.full(6, writer * 1000 + seq, np.float32)}


def _writer(address: str, index: int, results: object) -> None:
    try:
        client = reverb.Client(address)
        with client.trajectory_writer(num_keep_alive_refs=2) as writer:
            for seq in range(ITEMS):
                writer.append(_payload(index, seq))
                column = {"who": writer.history["who"][-1], "obs": writer.history["obs"][-1]}
                writer.create_item("queue", 1.0, column)
                writer.create_item("shared", 1.0, column)
                writer.flush(block_until_num_items=4)
        results.put(("writer", index, "ok"))  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001 - reported to the test
        results.put(("writer", index, traceback.format_exc()))  # type: ignore[attr-defined]


def _reader(address: str, index: int, share: int, results: object) -> None:
    try:
        client = reverb.Client(address)
        got = []
        for sample in client.sample("queue", share, emit_timesteps=False,
                                    unpack_as_table_signature=True):
            who, obs = sample.data["who"], sample.data["obs"]
            if not (obs == who[0] * 1000 + who[1]).all():
                raise AssertionError(f"item {who.tolist()} holds {obs.tolist()}")
            got.append(tuple(who.tolist()))
            if len(got) % 10 == 0:  # the shared table meanwhile: its chunks stay whole
                for shared in client.sample("shared", 8, emit_timesteps=False):
                    obs_, who_ = shared.data  # flat: the keys sorted
                    assert (obs_ == who_[0] * 1000 + who_[1]).all()
        results.put(("reader", index, got))  # type: ignore[attr-defined]
    except BaseException:  # noqa: BLE001
        results.put(("reader", index, traceback.format_exc()))  # type: ignore[attr-defined]


def test_writers_and_readers_share_a_queue_and_a_table():
    signature = {"who": reverb.TensorSpec([2], np.int64), "obs": reverb.TensorSpec([6],
                                                                                  np.float32)}
    server = reverb.Server([
        reverb.Table.queue("queue", 16, signature=signature),
        reverb.Table("shared", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 64,
                     reverb.rate_limiters.MinSize(1), signature=signature),
    ])
    address = f"localhost:{server.port}"
    context = fresh_context()
    results = context.Queue()
    total = WRITERS * ITEMS
    processes = [context.Process(target=_writer, args=(address, i, results))
                 for i in range(WRITERS)]
    processes += [context.Process(target=_reader, args=(address, i, total // READERS, results))
                  for i in range(READERS)]
    try:
        for process in processes:
            process.start()
        read: list[tuple[int, int]] = []
        for _ in processes:
            role, index, outcome = results.get(timeout=240)
            if isinstance(outcome, str) and outcome != "ok":
                pytest.fail(f"{role} {index} failed:\n{outcome}")
            if role == "reader":
                read.extend(outcome)
        for process in processes:
            process.join(timeout=30)
        assert sorted(read) == sorted((w, s) for w in range(WRITERS) for s in range(ITEMS))
        client = server.localhost_client()
        infos = client.server_info()
        assert infos["queue"].current_size == 0 and infos["shared"].current_size == 64
        store = client.store()
        client.reset("shared")
        store.collect(grace=0)
        store.collect(grace=0)
        assert store.stats()["chunks"] == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
        server.stop()
