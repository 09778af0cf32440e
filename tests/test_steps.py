"""The step store (redisbuf/buffers/steps.py): steps stored once in chunks, items of
several buffers referencing them, inserted atomically, freed by the sweep once no item
references them (after the grace period), and written back when a sweep freed chunks a
writer still references."""

from __future__ import annotations

import numpy as np
import pytest

from redisbuf import FifoSampler, PERSampler, ReplayBuffer
from redisbuf.buffers import step_checkpoint, step_reads
from redisbuf.buffers.step_records import (
    ItemColumn,
    decode_chunk,
    decode_item,
    encode_chunk,
    encode_item,
)
from redisbuf.buffers.steps import StepStore, TableBatch
from redisbuf.errors import (
    ConfigMismatchError,
    RateLimitTimeoutError,
    SchemaError,
    WaitTimeoutError,
)
from redisbuf.limiters import Queue


def step(t: int) -> list[np.ndarray]:
    return [np.full(3, t, dtype=np.float32), np.int64(t)]


def chunk_count(store: StepStore) -> int:
    return int(store.client.hlen(store.keys.chunks))


def test_an_item_reads_the_cells_it_names(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=10, sampler=FifoSampler())
    with store.writer(num_keep_alive_refs=5) as writer:
        refs = [writer.append(step(t)) for t in range(5)]
        writer.create_item("t", 2.0, [[r[0] for r in refs[1:4]], [refs[4][1]]],
                           [False, True])
    [item] = store.sample(table, 1)
    assert item.columns[0].tolist() == [[1.0] * 3, [2.0] * 3, [3.0] * 3]
    assert item.columns[1].shape == () and int(item.columns[1]) == 4
    assert (item.priority, item.times_sampled, item.probability) == (2.0, 1, 1.0)


def test_items_of_several_buffers_share_their_steps(client):
    store = StepStore(client, "s")
    tables = [store.table(name, capacity=100) for name in ("a", "b", "c")]
    with store.writer(num_keep_alive_refs=4, chunk_length=4) as writer:
        for t in range(40):
            refs = writer.append(step(t))
            for table in tables:
                writer.create_item(table.name, 1.0, [[refs[0]]], [True])
    assert [len(table) for table in tables] == [40, 40, 40]
    # 40 steps in chunks of 4, once for the three buffers
    assert chunk_count(store) == 10
    held = sum(len(client.hget(store.keys.chunks, k)) for k in client.hkeys(store.keys.chunks))
    assert held < 40 * 3 * (12 + 8)  # less than three copies of the cells
    for table in tables:
        values = sorted(float(i.columns[0][0]) for i in store.sample(table, 200))
        assert set(values) <= set(map(float, range(40)))


def test_chunks_are_freed_after_the_grace_period_once_unreferenced(client):
    store = StepStore(client, "s")
    keep = store.table("keep", capacity=100)
    recent = store.table("recent", capacity=2)
    with store.writer(num_keep_alive_refs=2, chunk_length=2) as writer:
        for t in range(10):
            refs = writer.append(step(t))
            writer.create_item("recent", 1.0, [[refs[0]]], [True])
            if t == 0:
                writer.create_item("keep", 1.0, [[refs[0]]], [True])
    # the writer's own sweeps (grace 10 s) may have marked some unreferenced already
    assert len(recent) == 2 and chunk_count(store) == 5
    store.sweep(100, grace=0)  # marks the unreferenced ones (frees the marked)
    store.sweep(100, grace=0)  # frees them: chunk 0 (step 0 kept) and the last stay
    assert chunk_count(store) == 2
    keep.clear()
    store.sweep(100, grace=0)
    store.sweep(100, grace=0)
    assert chunk_count(store) == 1
    recent.drop()
    store.collect(grace=0)
    store.collect(grace=0)
    assert chunk_count(store) == 0 and store.stats()["chunks_freed"] == 5


def test_the_grace_period_keeps_chunks_found_unreferenced(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=1)
    with store.writer(num_keep_alive_refs=1, chunk_length=1) as writer:
        for t in range(3):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
    for _ in range(3):
        store.sweep(100, grace=3600)
    assert chunk_count(store) == 3  # two unreferenced, kept for the grace period
    assert store.stats()["unreferenced"] == 2
    assert len(table) == 1


def test_a_marked_chunk_referenced_again_is_unmarked_and_kept(client):
    """A chunk found unreferenced is marked; an item that references it again (a cell the
    writer kept alive) unmarks it, and later sweeps past the grace period keep it, while
    the other marked chunks are freed."""
    store = StepStore(client, "s")
    table = store.table("t", capacity=1)
    with store.writer(num_keep_alive_refs=4, chunk_length=1) as writer:
        first = writer.append(step(0))
        writer.create_item("t", 1.0, [[first[0]]], [True])
        for t in (1, 2):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
        writer.flush()
        store.sweep(100, grace=3600)  # chunks of steps 0 and 1: unreferenced, marked
        assert store.stats()["unreferenced"] == 2
        def dead() -> set[str]:
            return {key.decode() for key in client.zrange(store.keys.dead, 0, -1)}

        assert first[0].chunk in dead()
        writer.create_item("t", 1.0, [[first[0]]], [True])  # step 0's chunk again
        writer.flush()
        # unmarked (step 2's, whose item the new one evicted, is marked by the
        # writer's own sweep)
        assert first[0].chunk not in dead() and len(dead()) == 2
        for _ in range(2):
            store.sweep(100, grace=0)
    assert chunk_count(store) == 1  # step 0's, which the one item left references
    [item] = store.sample(table, 1)
    assert float(item.columns[0][0]) == 0.0
    assert store.stats()["unreferenced"] == 0


def test_the_sweeps_front_passes_each_unreferenced_chunk_once_and_stops_at_a_referenced_one(
        client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=100)
    with store.writer(num_keep_alive_refs=1, chunk_length=1) as writer:
        for t in range(30):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
    order = [key.decode() for key, _ in client.zrange(store.keys.order, 0, -1,
                                                       withscores=True)]
    scores = dict(client.zrange(store.keys.order, 0, -1, withscores=True))

    def front() -> float:
        return float(client.hget(store.keys.meta, "sweep_front") or 0)

    table.remove(np.arange(1, 21))  # the 20 oldest items: their chunks are unreferenced
    fronts = []
    for _ in range(5):
        store.sweep(5, grace=3600)
        fronts.append(front())
    # five new chunks a call, in order, then it waits at chunk 21 (still referenced)
    assert fronts == [scores[order[i].encode()] for i in (4, 9, 14, 19, 19)]
    assert store.stats()["unreferenced"] == 20 and chunk_count(store) == 30
    table.remove(np.array([21]))
    store.sweep(5, grace=3600)
    assert front() == scores[order[20].encode()]


def test_a_sweep_never_frees_a_chunk_an_item_references(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=50, sampler=PERSampler(alpha=1.0, eps=0.0))
    rng = np.random.default_rng(0)
    recent: list = []
    with store.writer(num_keep_alive_refs=6, chunk_length=3) as writer:
        for t in range(200):
            recent = [*recent, writer.append(step(t))][-3:]
            if t >= 2:
                writer.create_item("t", float(rng.random()) + 0.1,
                                   [[refs[0] for refs in recent]], [False])
            if t % 7 == 0:
                writer.flush()
                table.remove(rng.integers(1, t + 2, size=3))
            store.sweep(50, grace=0)
    items = store.sample(table, 500)
    assert len(items) == 500
    for item in items:  # three consecutive steps, all there
        first = item.columns[0][0, 0]
        assert item.columns[0][:, 0].tolist() == [first, first + 1, first + 2]


def test_an_insert_is_refused_whole_and_leaves_no_chunk(client):
    store = StepStore(client, "s")
    good = store.table("good", capacity=10)
    plain = ReplayBuffer(client, "plain", capacity=10)
    plain.add({"x": np.zeros(2)})
    blob = encode_chunk(1, {0: ([0], np.zeros((1, 3)))})
    record = encode_item(1, ["w:0"], [ItemColumn(0, [(0, 0, 1)], True)], 1.0)
    batches = [TableBatch(buffer, [record], [1.0], [["w:0"]], {})
               for buffer in (good, plain)]
    with pytest.raises(SchemaError):  # the script's check, before any write
        store.insert({"w:0": blob}, batches)
    assert len(good) == 0 and len(plain) == 2 and chunk_count(store) == 0
    # a writer refuses a buffer of other items, or none, before sending
    writer = store.writer(num_keep_alive_refs=2, background=False)
    refs = writer.append(step(0))
    for name in ("plain", "missing"):
        writer.create_item(name, 1.0, [[refs[0]]], [True])
        with pytest.raises(ConfigMismatchError):
            writer.flush()
        assert chunk_count(store) == 0
    writer.close()


def test_a_writer_sends_again_the_chunks_a_sweep_freed(client):
    store = StepStore(client, "s")
    store.table("t", capacity=1)
    writer = store.writer(num_keep_alive_refs=4, chunk_length=1, background=False)
    refs = [writer.append(step(t)) for t in range(3)]
    writer.create_item("t", 1.0, [[refs[0][0]]], [True])
    writer.flush()
    writer.create_item("t", 1.0, [[refs[1][0]]], [True])  # evicts the first item
    writer.flush()
    store.sweep(10, grace=0)
    store.sweep(10, grace=0)  # the first chunk is freed
    assert chunk_count(store) == 1
    writer.create_item("t", 1.0, [[refs[0][0], refs[2][0]]], [False])  # reads it again
    writer.flush()
    [item] = store.sample(store.table("t"), 1)
    assert item.columns[0][:, 0].tolist() == [0.0, 2.0]
    writer.close()


def test_an_expired_reference_is_refused(client):
    store = StepStore(client, "s")
    store.table("t", capacity=4)
    with store.writer(num_keep_alive_refs=2) as writer:
        first = writer.append(step(0))
        writer.append(step(1))
        writer.append(step(2))
        assert first[0].expired
        with pytest.raises(ValueError, match="expired"):
            writer.create_item("t", 1.0, [[first[0]]], [True])


def test_cells_of_another_dtype_or_shape_are_refused(client):
    store = StepStore(client, "s")
    with store.writer(num_keep_alive_refs=2) as writer:
        writer.append([np.zeros(2, np.float32), 1])
        with pytest.raises(ValueError, match="wrong dtype provided for column 1. Got double"):
            writer.append([np.zeros(2, np.float32), 1.0])
        with pytest.raises(ValueError, match=r"incompatible shape .* column 0. Got \[3\]"):
            writer.append([np.zeros(3, np.float32), 1])
        assert writer.episode_steps == 1


def test_the_rate_limiter_admits_items_one_at_a_time(client):
    store = StepStore(client, "s")
    queue = store.table("q", capacity=3, sampler=FifoSampler(successive=True), max_use=1,
                        rate_limiter=Queue(3))
    writer = store.writer(num_keep_alive_refs=1, background=False)
    for t in range(5):
        writer.create_item("q", 1.0, [[writer.append(step(t))[0]]], [True])
    with pytest.raises(WaitTimeoutError):
        writer.flush(timeout=0.5)
    assert len(queue) == 3 and writer.pending == 2  # three admitted, two waiting
    got = [int(i.columns[0][0]) for i in store.sample(queue, 2)]
    writer.flush(timeout=30)
    got += [int(i.columns[0][0]) for i in store.sample(queue, 3)]
    assert got == [0, 1, 2, 3, 4] and len(queue) == 0
    with pytest.raises(RateLimitTimeoutError):
        store.sample(queue, 1, timeout=0.2)
    writer.close()


def test_a_background_writer_keeps_sending_after_a_timeout(real_client):
    store = StepStore(real_client, "s")
    queue = store.table("q", capacity=1, sampler=FifoSampler(successive=True), max_use=1,
                        rate_limiter=Queue(1))
    writer = store.writer(num_keep_alive_refs=1)
    writer.create_item("q", 1.0, [[writer.append(step(0))[0]]], [True])
    writer.create_item("q", 1.0, [[writer.append(step(1))[0]]], [True])
    with pytest.raises(WaitTimeoutError):
        writer.flush(timeout=0.3)
    assert [int(i.columns[0][0]) for i in store.sample(queue, 1)] == [0]
    writer.flush(timeout=30)  # the second went in once the first was taken
    assert [int(i.columns[0][0]) for i in store.sample(queue, 1, timeout=30)] == [1]
    writer.close()


def test_times_sampled_and_table_size_as_reverb_reports_them(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=10, max_use=2, sampler=FifoSampler(successive=True))
    with store.writer(num_keep_alive_refs=1) as writer:
        for t in range(3):
            writer.create_item("t", 5.0 + t, [[writer.append(step(t))[0]]], [True])
    items = store.sample(table, 4)
    assert [i.key for i in items] == [1, 1, 2, 2]
    assert [i.times_sampled for i in items] == [1, 2, 1, 2]
    assert [i.table_size for i in items] == [3, 3, 2, 2]  # before each removal
    assert [i.priority for i in items] == [5.0, 5.0, 6.0, 6.0]  # the items are gone
    assert len(table) == 1


def test_a_checkpoint_restores_chunks_items_and_counts(fake_client, tmp_path):
    store = StepStore(fake_client, "s")
    table = store.table("t", capacity=10, sampler=PERSampler(alpha=1.0, eps=0.0))
    store.describe("t", {"what": "any JSON"})
    with store.writer(num_keep_alive_refs=3) as writer:
        for t in range(6):
            refs = writer.append(step(t))
            writer.create_item("t", 1.0 + t, [[refs[0]], [refs[1]]], [True, True])
    store.sample(table, 3)
    path = step_checkpoint.save(store, {"t": table}, tmp_path)
    assert step_checkpoint.latest(tmp_path) is not None
    table.drop()
    store.drop()

    def reopen(name, description):
        assert description == {"what": "any JSON"}
        return store.table(name, capacity=10, sampler=PERSampler(alpha=1.0, eps=0.0))

    restored = step_checkpoint.load(store, path, reopen)["t"]
    assert len(restored) == 6 and store.episodes_inserted("t") == 1
    data = step_reads.read_all(store, restored, list(range(1, 100)))
    assert sorted(int(v[1]) for v in data.values()) == list(range(6))
    store.sweep(100, grace=0)
    store.sweep(100, grace=0)
    assert chunk_count(store) >= 1  # every chunk referenced again
    assert all(decode_chunk(b) for b in fake_client.hvals(store.keys.chunks))


def test_a_cluster_client_is_refused(redis_cluster):
    import redis.cluster

    from redisbuf.errors import ServerConfigError

    client = redis.cluster.RedisCluster.from_url(redis_cluster.urls[0])
    with pytest.raises(ServerConfigError, match="one server"):
        StepStore(client, "s")


def test_a_draw_whose_chunks_were_freed_before_its_read_is_drawn_again(client, monkeypatch):
    store = StepStore(client, "s")
    table = store.table("t", capacity=20, sampler=FifoSampler())
    with store.writer(num_keep_alive_refs=1, chunk_length=1) as writer:
        for t in range(6):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
    real_draw = step_reads._draw
    stale = {}

    def draw_then_lose_it(buffer, n, timeout, gate=None):
        draw = real_draw(buffer, n, timeout, gate)
        if not stale:  # the worst moment: the items leave and their chunks are freed
            stale["ids"] = list(draw.ids)
            buffer.remove(draw.ids)
            store.sweep(100, grace=0)
            store.sweep(100, grace=0)
        return draw

    monkeypatch.setattr(step_reads, "_draw", draw_then_lose_it)
    batch = step_reads.sample_batch(store, table, 2)
    assert stale["ids"] == [1, 2]
    assert batch.keys.tolist() == [3, 4]  # drawn again: the next two, whole
    assert batch.columns[0][:, 0].tolist() == [2.0, 3.0]
    stale.clear()
    # a process holding those chunks decoded still has them: a draw made before the
    # items left is served (as Reverb's sample holds its item's chunks)
    assert [i.key for i in step_reads.sample(store, table, 2)] == [3, 4]
    assert len(table) == 2


def test_a_batch_holds_its_items_columns_and_reverbs_sample_info(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=10, max_use=2, sampler=FifoSampler(successive=True))
    # chunks of 3 steps and items of 4: every item's first column spans two chunks
    with store.writer(num_keep_alive_refs=4, chunk_length=3) as writer:
        refs = [writer.append(step(t)) for t in range(3)]
        for t in range(3, 6):
            refs.append(writer.append(step(t)))
            writer.create_item("t", 5.0 + t, [[r[0] for r in refs[-4:]], [refs[-1][1]]],
                               [False, True])
    batch = step_reads.sample_batch(store, table, 4)
    assert batch.keys.tolist() == [1, 1, 2, 2]
    assert batch.times_sampled.tolist() == [1, 2, 1, 2]
    assert batch.table_sizes.tolist() == [3, 3, 2, 2]  # before each removal
    assert batch.priorities.tolist() == [8.0, 8.0, 9.0, 9.0]
    assert batch.probabilities.tolist() == [1.0] * 4
    assert batch.items is None and len(batch.columns) == 2
    observations, actions = batch.columns
    assert observations.shape == (4, 4, 3) and observations.dtype == np.float32
    assert observations[:, :, 0].tolist() == [[0, 1, 2, 3]] * 2 + [[1, 2, 3, 4]] * 2
    assert actions.shape == (4,) and actions.dtype == np.int64
    assert actions.tolist() == [3, 3, 4, 4]
    observations[0, 0, 0] = -1.0  # the batch's own arrays: writable, sharing nothing
    assert step_reads.sample_batch(store, table, 1).columns[0][0, 0, 0] == 2.0


def test_a_batch_of_items_that_differ_in_length_keeps_them_apart(client):
    store = StepStore(client, "s")
    table = store.table("t", capacity=10, max_use=1, sampler=FifoSampler(successive=True))
    with store.writer(num_keep_alive_refs=3) as writer:
        refs = [writer.append(step(t)) for t in range(3)]
        writer.create_item("t", 1.0, [[r[0] for r in refs[:2]]], [False])
        writer.create_item("t", 1.0, [[r[0] for r in refs]], [False])
    batch = step_reads.sample_batch(store, table, 2)
    assert batch.columns is None
    assert [item.columns[0][:, 0].tolist() for item in batch.items] == [[0, 1], [0, 1, 2]]
    assert [item.times_sampled for item in batch.items] == [1, 1]


def test_a_uniform_batch_reports_one_over_the_table_size(client):
    from redisbuf import UniformSampler

    store = StepStore(client, "s")
    table = store.table("t", capacity=10, sampler=UniformSampler())
    with store.writer(num_keep_alive_refs=1) as writer:
        for t in range(4):
            writer.create_item("t", 1.0, [[writer.append(step(t))[0]]], [True])
    batch = step_reads.sample_batch(store, table, 64)
    assert batch.probabilities.tolist() == [0.25] * 64
    assert batch.table_sizes.tolist() == [4] * 64
    for key in set(batch.keys.tolist()):  # the j-th draw of an item reports j
        assert batch.times_sampled[batch.keys == key].tolist() == list(
            range(1, int((batch.keys == key).sum()) + 1))
    assert sorted(set(batch.columns[0][:, 0].tolist())) <= [0.0, 1.0, 2.0, 3.0]


def test_a_decoded_record_and_chunk_are_immutable_and_hold_no_memoryview():
    # the store's caches hand one decoded object to every thread: nothing in it may be
    # altered in place, and it holds no memoryview (which the collector visits)
    record = decode_item(encode_item(7, ["w:0", "w:1"],
                                     [ItemColumn(0, ((0, 1, 1), (1, 0, 1)), False),
                                      ItemColumn(1, ((1, 0, 1),), True)], 0.5))
    assert record.chunks == ("w:0", "w:1")
    assert record.columns == ((0, ((0, 1, 1), (1, 0, 1)), False), (1, ((1, 0, 1),), True))
    assert record.layout == ((0, False, 2), (1, True, 1))
    assert all(type(part) is tuple for column in record.columns for part in (column, column[1]))
    chunk = decode_chunk(encode_chunk(7, {0: ([3, 4], np.arange(6, dtype=np.float32)
                                                       .reshape(2, 3))}))
    assert chunk.kinds == {0: "<f4(3,)"}
    assert chunk.columns[0][1].tolist() == [3.0, 4.0, 5.0]
    held = [*chunk.columns.values(), *chunk.steps.values(), *chunk.kinds.values()]
    assert not any(isinstance(value, memoryview) for value in held)
