"""redisbuf.reverb, Reverb's API on shared buffers: tables found by name from any client,
items in several tables with their steps stored once, Reverb's sample info, signatures
(refused inserts write nothing), rate limiters and timeouts, datasets, checkpoints.
Reverb's own tests are run against it separately (docs/coming-from/reverb.md)."""

from __future__ import annotations

import collections
import gc
import pickle
import weakref

import numpy as np
import pytest

from redisbuf import reverb
from redisbuf.reverb import nest, tensor_spec

pytestmark = pytest.mark.redis_server


@pytest.fixture(scope="module")
def server():
    tables = [
        reverb.Table("prio", reverb.selectors.Prioritized(1.0), reverb.selectors.Fifo(), 100,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table("uniform", reverb.selectors.Uniform(), reverb.selectors.Lifo(), 3,
                     reverb.rate_limiters.MinSize(1)),
        reverb.Table.queue("queue", 4),
        reverb.Table("typed", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 10,
                     reverb.rate_limiters.MinSize(1),
                     signature={"obs": reverb.TensorSpec([2, 2, 3], np.float32),
                                "action": reverb.TensorSpec([], np.int64)}),
    ]
    server = reverb.Server(tables)
    yield server
    server.stop()


@pytest.fixture
def client(server):
    client = server.localhost_client()
    yield client
    for name in ("prio", "uniform", "queue", "typed"):
        client.reset(name)


def keys_of(client, table, n):
    return [s.info.key for s in client.sample(table, n, emit_timesteps=False)]


def test_one_insert_in_several_tables_stores_its_step_once(client):
    store = client.store()
    before = store.stats()["chunks_written"]
    client.insert({"x": np.arange(4.0)}, priorities={"prio": 2.0, "uniform": 1.0})
    infos = client.server_info()
    assert infos["prio"].current_size == infos["uniform"].current_size == 1
    assert store.stats()["chunks_written"] == before + 1
    a = next(client.sample("prio", 1, emit_timesteps=False))
    b = next(client.sample("uniform", 1, emit_timesteps=False))
    np.testing.assert_array_equal(a.data[0], [[0.0, 1.0, 2.0, 3.0]])
    np.testing.assert_array_equal(a.data[0], b.data[0])
    assert (a.info.priority, b.info.priority) == (2.0, 1.0)


def test_another_client_finds_the_tables_by_name(server, client):
    other = pickle.loads(pickle.dumps(reverb.Client(f"localhost:{server.port}")))
    other.insert(np.int64(7), priorities={"prio": 1.0})
    [[step]] = list(client.sample("prio", 1))
    assert int(step.data[0]) == 7


def test_sample_info_as_reverb_reports_it(client):
    for priority in (1.0, 3.0):
        client.insert(np.float32(priority), priorities={"prio": priority})
    samples = [s for s in client.sample("prio", 400, emit_timesteps=False)]
    by_key = collections.defaultdict(list)
    for sample in samples:
        by_key[sample.info.key].append(sample.info)
    assert len(by_key) == 2
    for infos in by_key.values():
        assert infos[0].table_size == 2
        assert infos[0].probability == pytest.approx(infos[0].priority / 4.0)
        times = [info.times_sampled for info in infos]
        assert times == list(range(1, len(times) + 1))
    counts = sorted(len(v) for v in by_key.values())
    assert 60 < counts[0] < 140  # the priority-1 item: a quarter of 400
    info = client.server_info()["prio"]
    assert info.num_unique_samples == 2 and info.rate_limiter_info.sample_stats.completed == 400


def test_mutate_priorities_updates_then_deletes(client):
    for _ in range(3):
        client.insert(np.zeros(1), priorities={"prio": 1.0})
    keys = sorted(set(keys_of(client, "prio", 50)))
    client.mutate_priorities("prio", updates={keys[0]: 0.0, 10**9: 5.0}, deletes=[keys[1]])
    assert set(keys_of(client, "prio", 100)) == {keys[2]}
    assert client.server_info()["prio"].current_size == 2


def test_a_lifo_remover_keeps_the_oldest(client):
    for value in range(5):
        client.insert(np.int64(value), priorities={"uniform": 1.0})
    values = {int(s.data[0][0]) for s in client.sample("uniform", 100, emit_timesteps=False)}
    assert values == {0, 1, 4}


def test_a_queue_gives_each_item_once_in_order(client):
    for value in range(4):
        client.insert(np.int64(value), priorities={"queue": 1.0})
    assert client.server_info()["queue"].rate_limiter_info.max_diff == 4
    got = [int(s.data[0][0]) for s in client.sample("queue", 4, emit_timesteps=False)]
    assert got == [0, 1, 2, 3]
    assert client.server_info()["queue"].current_size == 0
    writer = client.trajectory_writer(1)
    for value in range(5):  # the fifth waits for room
        writer.append(np.int64(value))
        writer.create_item("queue", 1.0, writer.history[-1:])
    with pytest.raises(reverb.DeadlineExceededError):
        writer.flush(timeout_ms=300)
    assert next(client.sample("queue", 1, emit_timesteps=False)).data[0][0] == 0
    writer.flush(timeout_ms=30_000)
    writer.close()


def test_trajectories_take_any_columns_of_the_history(client):
    with client.trajectory_writer(num_keep_alive_refs=3) as writer:
        for t in range(4):
            writer.append({"obs": np.full((2, 3), t, np.float32), "action": np.int64(t)})
        writer.create_item("typed", 1.0, {"obs": writer.history["obs"][-2:],
                                          "action": writer.history["action"][-1]})
    [sample] = list(client.sample("typed", 1, emit_timesteps=False,
                                  unpack_as_table_signature=True))
    assert sample.data["obs"].shape == (2, 2, 3)
    assert sample.data["obs"][:, 0, 0].tolist() == [2.0, 3.0]
    assert int(sample.data["action"]) == 3


def test_an_item_that_does_not_fit_the_signature_is_refused(client):
    writer = client.trajectory_writer(num_keep_alive_refs=2)
    for _ in range(2):
        writer.append({"obs": np.zeros((2, 3), np.float64), "action": np.int64(0)})
    with pytest.raises(ValueError, match="table expects column 1 to be a float"):
        writer.create_item("typed", 1.0, {"obs": writer.history["obs"][-2:],
                                          "action": writer.history["action"][-1]})
    with pytest.raises(ValueError, match="could not be found"):
        writer.create_item("nowhere", 1.0, {"obs": writer.history["obs"][-1:]})
    writer.flush()
    writer.close()
    assert client.server_info()["typed"].current_size == 0


def test_the_signature_comes_back_as_specs(client):
    signature = client.server_info()["typed"].signature
    assert signature == {"obs": reverb.TensorSpec([2, 2, 3], np.float32),
                         "action": reverb.TensorSpec([], np.int64)}
    assert client.server_info()["prio"].signature is None


def test_nested_signatures_round_trip_through_json():
    point = collections.namedtuple("point", "x y")
    signature = (reverb.TensorSpec([None, 2], np.int32, "a"),
                 {"b": [reverb.TensorSpec([], np.bool_)], "c": point(
                     reverb.TensorSpec([1], np.uint8), reverb.TensorSpec(None, np.float16))})
    back = tensor_spec.from_json(tensor_spec.to_json(signature))
    assert nest.flatten(back) == nest.flatten(signature)
    assert type(back[1]["c"]).__name__ == "point" and back[1]["c"]._fields == ("x", "y")
    with pytest.raises(ValueError, match="Unsupported signature spec"):
        tensor_spec.to_json({"a": np.zeros(3)})


def test_nest_flattens_as_dm_tree():
    data = {"b": 1, "a": [2, (3, None)], "c": {"z": 4, "y": 5}}
    assert nest.flatten(data) == [2, 3, None, 1, 5, 4]
    assert [p for p, _ in nest.flatten_with_path(data)][:2] == [("a", 0), ("a", 1, 0)]
    assert nest.unflatten_as(data, list(range(6))) == {"b": 3, "a": [0, (1, 2)],
                                                       "c": {"z": 5, "y": 4}}


def test_nest_holds_no_leaf_once_it_returns():
    # no reference cycle keeps a leaf alive until the garbage collector runs
    gc.disable()
    try:
        leaf = np.zeros(3)
        alive = weakref.ref(leaf)
        structure = {"a": [leaf, (leaf,)], "b": leaf}
        nest.assert_same_structure(structure, structure)
        nest.flatten_with_path(structure)
        rebuilt = nest.map_structure(lambda x: x, structure)
        del leaf, structure, rebuilt
        assert alive() is None
    finally:
        gc.enable()


def test_datasets_batch_as_acme_reads_them(client):
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(20):
            writer.append({"obs": np.full((2, 3), t, np.float32), "action": np.int64(t)})
            if t:
                writer.create_item("typed", 1.0, {"obs": writer.history["obs"][-2:],
                                                  "action": writer.history["action"][-2]})
    dataset = reverb.TrajectoryDataset.from_table_signature(
        client.server_address, "typed", max_in_flight_samples_per_worker=8,
        rate_limiter_timeout_ms=500)
    batches = list(dataset.batch(4, drop_remainder=True).prefetch(2).take(3)
                   .as_numpy_iterator())
    assert len(batches) == 3
    for batch in batches:
        assert batch.data["obs"].shape == (4, 2, 2, 3)
        assert batch.info.key.dtype == np.uint64 and batch.info.times_sampled.dtype == np.int32
        assert (batch.data["obs"][:, 1, 0, 0] == batch.data["obs"][:, 0, 0, 0] + 1).all()
        assert (batch.data["action"] == batch.data["obs"][:, 0, 0, 0]).all()



def test_a_datasets_worker_threads_commit_their_prioritized_draws_at_once(client,
                                                                        monkeypatch):
    # the first two PER commits wait at a barrier of two parties: both worker threads
    # must be inside a commit together, which one replica shared by them (its lock held
    # from the draw to the commit's reply) never allows
    import threading

    from redisbuf.sampling import commits

    for value in range(20):
        client.insert(np.int64(value), priorities={"prio": 1.0 + value})
    hold, entered = threading.Barrier(2), []
    send = commits._send_commit

    def held_send(*args, **kwargs):
        entered.append(threading.get_ident())
        if len(entered) <= 2:
            hold.wait(30)
        return send(*args, **kwargs)

    monkeypatch.setattr(commits, "_send_commit", held_send)
    dataset = reverb.TrajectoryDataset(client.server_address, "prio", dtypes=[np.int64],
                                       shapes=[(1,)], max_in_flight_samples_per_worker=4,
                                       num_workers_per_iterator=2, max_samples=16,
                                       sampler_processes=False)
    batches = list(dataset.batch(4).as_numpy_iterator())
    assert not hold.broken and len(set(entered[:2])) == 2
    assert [len(batch.info.key) for batch in batches] == [4] * 4
    assert all(0 <= v < 20 for batch in batches for v in batch.data[0][:, 0].tolist())


def test_a_timestep_dataset_yields_every_step_of_an_item(client):
    with client.writer(max_sequence_length=3) as writer:
        for t in range(3):
            writer.append({"obs": np.full(2, t, np.float32), "t": np.int64(t)})
        writer.create_item("queue", 3, 1.0)
    steps = list(reverb.TimestepDataset(
        client.server_address, "queue", dtypes={"obs": np.float32, "t": np.int64},
        shapes={"obs": (2,), "t": ()}, max_in_flight_samples_per_worker=2,
        rate_limiter_timeout_ms=200))
    assert [int(s.data["t"]) for s in steps] == [0, 1, 2]
    assert len({s.info.key for s in steps}) == 1


def test_a_dataset_ends_when_the_rate_limiter_times_out(client):
    dataset = reverb.TrajectoryDataset(
        client.server_address, "queue", dtypes=[np.int64], shapes=[(1,)],
        max_in_flight_samples_per_worker=2, rate_limiter_timeout_ms=200)
    assert list(dataset) == []  # the queue is empty
    assert list(dataset.batch(2)) == []
    for value in range(3):
        client.insert(np.int64(value), priorities={"queue": 1.0})
    assert [int(s.data[0][0]) for s in dataset] == [0, 1, 2]


@pytest.mark.parametrize("processes", [True, False], ids=["processes", "threads"])
def test_a_batched_dataset_that_has_ended_takes_nothing_more_from_a_queue(client, processes):
    # its workers were waiting on the empty queue when the iteration ended; the item
    # inserted afterwards is the next dataset's, not lost to one of them
    import time

    client.insert(np.int64(7), priorities={"queue": 1.0})
    dataset = reverb.TrajectoryDataset(client.server_address, "queue", dtypes=[np.int64],
                                       shapes=[(1,)], max_in_flight_samples_per_worker=1,
                                       num_workers_per_iterator=2,
                                       sampler_processes=processes)
    batches = dataset.batch(1).as_numpy_iterator()
    assert int(next(batches).data[0][0, 0]) == 7
    batches.close()
    client.insert(np.int64(8), priorities={"queue": 1.0})
    time.sleep(0.3)  # room for a worker of the ended iteration to take it (it must not)
    later = reverb.TrajectoryDataset(client.server_address, "queue", dtypes=[np.int64],
                                     shapes=[(1,)], max_in_flight_samples_per_worker=1,
                                     rate_limiter_timeout_ms=2000, max_samples=1)
    assert [int(s.data[0][0]) for s in later] == [8]


def test_a_dataset_refuses_a_sample_of_other_dtypes(client):
    client.insert(np.float32(1.0), priorities={"prio": 1.0})
    dataset = reverb.TrajectoryDataset(client.server_address, "prio", dtypes=[np.int64],
                                       shapes=[(1,)], max_in_flight_samples_per_worker=1)
    with pytest.raises(ValueError, match="expects int64"):
        next(iter(dataset))


def test_the_legacy_writer_items_span_the_last_steps(client):
    with client.writer(max_sequence_length=3) as writer:
        for t in range(3):
            writer.append([np.int64(t), np.ones(2)])
        writer.create_item("prio", 3, 1.0)
        writer.create_item("prio", 1, 1.0)
        with pytest.raises(ValueError, match="above the steps"):
            writer.create_item("prio", 4, 1.0)
    lengths = sorted(len(s) for s in client.sample("prio", 100))
    assert set(lengths) == {1, 3}


def test_checkpoint_and_a_server_loading_it(tmp_path):
    table = reverb.Table("t", reverb.selectors.Uniform(), reverb.selectors.Fifo(), 10,
                         reverb.rate_limiters.MinSize(1))
    checkpointer = reverb.checkpointers.DefaultCheckpointer(str(tmp_path))
    first = reverb.Server([table], checkpointer=checkpointer)
    client = first.localhost_client()
    for value in range(4):
        client.insert(np.int64(value), priorities={"t": 1.0 + value})
    path = client.checkpoint()
    assert path.startswith(str(tmp_path))
    first.stop()
    second = reverb.Server([reverb.Table("t", reverb.selectors.Uniform(),
                                         reverb.selectors.Fifo(), 10,
                                         reverb.rate_limiters.MinSize(1))],
                           checkpointer=checkpointer)
    try:
        again = second.localhost_client()
        assert again.server_info()["t"].current_size == 4
        values = {int(s.data[0][0]): s.info.priority
                  for s in again.sample("t", 200, emit_timesteps=False)}
        assert values == {0: 1.0, 1: 2.0, 2: 3.0, 3: 4.0}
    finally:
        second.stop()



@pytest.mark.parametrize("table", ["prio", "uniform"])
def test_sample_info_reports_the_priority_a_mutation_set(client, table):
    # Reverb reports each sampled item's priority now, under any sampler: a prioritized
    # draw's own, and a uniform one's read where the priorities are (not at insert time)
    for value in range(3):
        client.insert(np.int64(value), priorities={table: 1000.0})
    keys = {int(s.data[0][0]): s.info.key
            for s in client.sample(table, 60, emit_timesteps=False)}
    client.mutate_priorities(table, updates={keys[v]: float(v + 1) for v in keys})
    seen = {int(s.data[0][0]): s.info.priority
            for s in client.sample(table, 60, emit_timesteps=False)}
    assert seen == {v: float(v + 1) for v in keys}

def test_table_arguments_are_checked():
    limiter = reverb.rate_limiters.MinSize(1)
    with pytest.raises(ValueError, match="nonempty"):
        reverb.Table("", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1, limiter)
    with pytest.raises(ValueError, match="max_size"):
        reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 0, limiter)
    with pytest.raises(ValueError, match="extensions"):
        reverb.Table("t", reverb.selectors.Fifo(), reverb.selectors.Fifo(), 1, limiter,
                     extensions=[object()])
    with pytest.raises(ValueError, match="same name"):
        reverb.Server([reverb.Table.queue("q", 1), reverb.Table.queue("q", 2)])


def test_server_info_of_an_unreachable_server_times_out():
    with pytest.raises(reverb.DeadlineExceededError, match="within provided timeout"):
        reverb.Client("localhost:1").server_info(timeout=1)


def test_info_of_a_table_counts_its_episodes(client):
    with client.trajectory_writer(num_keep_alive_refs=1) as writer:
        for _ in range(3):
            for t in range(2):
                writer.append(np.int64(t))
                writer.create_item("uniform", 1.0, writer.history[-1:])
            writer.end_episode()
    info = client.server_info()["uniform"]
    assert info.current_size == 3  # max_size 3, LIFO remover: the first two and the last
    assert info.num_episodes == 2 and info.num_deleted_episodes == 1
