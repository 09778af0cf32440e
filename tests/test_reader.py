"""redisbuf.sampling.reader: Prefetcher (k batches drawn ahead by background threads) and
ReplayDataset (a torch IterableDataset over it), on fakeredis and on a real server."""

from __future__ import annotations

import gc
import threading
import time

import numpy as np
import pytest

from redisbuf import PERSampler, Prefetcher, ReplayBuffer, SampleInfo, ShardedReplayBuffer
from redisbuf.errors import (
    ConfigMismatchError,
    EmptyBufferError,
    InvalidBatchError,
    WaitTimeoutError,
)

DEADLINE = 30.0  # seconds any wait of these tests may take under load before failing


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("redisbuf-prefetch")]


def wait_until(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def drawn(batches: Prefetcher) -> int:
    """Batches whose draw has finished, waiting to be handed out."""
    return len(batches._reader._ready)


def per_buffer(client, name, n=50, eps=1e-6) -> ReplayBuffer:
    buffer = ReplayBuffer(client, name, capacity=1000, sampler=PERSampler(eps=eps), seed=0)
    buffer.add({"x": np.arange(n, dtype=np.float32).reshape(-1, 1)})
    return buffer


class Counting:
    """A buffer proxy counting the draws started (from any thread); ``fail_at`` makes
    that draw raise; ``hold`` makes every draw wait at that barrier first, so a test
    sees which draws are on the wire at once."""

    def __init__(self, buffer, fail_at: int | None = None,
                 hold: threading.Barrier | None = None) -> None:
        self.buffer = buffer
        self.calls = 0
        self.fail_at = fail_at
        self.hold = hold
        self.name = buffer.name
        self._lock = threading.Lock()

    def sample_with_info(self, n, **kwargs):
        with self._lock:
            self.calls += 1
            call = self.calls
        if self.hold is not None:
            self.hold.wait(DEADLINE)
        if call == self.fail_at:
            raise RuntimeError(f"draw {call} failed")
        info = self.buffer.sample_with_info(n, **kwargs)
        info.batch["draw"] = np.full(n, call)
        return info

    def update_priority(self, ids, priorities):
        return self.buffer.update_priority(ids, priorities)


@pytest.fixture(autouse=True)
def no_thread_left_behind():
    yield
    gc.collect()
    for thread in prefetch_threads():
        thread.join(DEADLINE)
    assert not prefetch_threads()


# -- batches ------------------------------------------------------------------------------


@pytest.mark.parametrize("prefetch", [0, 1, 3])
def test_yields_max_batches_of_the_right_shape_with_per_info(client, buffer_name, prefetch):
    buffer = per_buffer(client, buffer_name)
    stored = set(range(1, 51))
    with Prefetcher(buffer, 8, prefetch=prefetch, max_batches=7) as batches:
        got = list(batches)
    assert len(got) == 7
    for info in got:
        assert isinstance(info, SampleInfo)
        assert info.batch["x"].shape == (8, 1)
        assert info.ids.shape == (8,) and set(info.ids.tolist()) <= stored
        # each item's x is its id - 1: the batch is the items the ids name
        assert info.batch["x"][:, 0].tolist() == (info.ids - 1).tolist()
        for values in (info.probabilities, info.weights, info.importance_weights):
            assert values is not None and values.shape == (8,) and np.all(values > 0)


def test_with_info_false_yields_plain_batches(client, buffer_name):
    buffer = per_buffer(client, buffer_name)
    with Prefetcher(buffer, 4, with_info=False, max_batches=3) as batches:
        got = list(batches)
    assert [type(b) for b in got] == [dict] * 3
    assert all(b["x"].shape == (4, 1) for b in got)


def test_sharded_buffer_blocks_until_items_arrive(fake_client, buffer_name):
    sharded = ShardedReplayBuffer(fake_client, buffer_name, capacity=100, shards=3, seed=1)
    with Prefetcher(sharded, 5, prefetch=2, max_batches=2, timeout=DEADLINE) as batches:
        assert batches.in_flight() <= 2
        sharded.add({"x": np.arange(10, dtype=np.float32).reshape(-1, 1)})
        got = list(batches)
    assert len(got) == 2
    for info in got:
        assert len(info.ids) == 5
        assert info.batch["x"].tolist() == sharded.get(info.ids)["x"].tolist()


# -- in flight ----------------------------------------------------------------------------


@pytest.mark.parametrize(("prefetch", "draw_threads"), [(1, 1), (2, 1), (4, 1), (2, 2), (4, 3)])
def test_never_more_than_prefetch_batches_drawn_ahead(client, buffer_name, prefetch,
                                                      draw_threads):
    proxy = Counting(per_buffer(client, buffer_name))
    with Prefetcher(proxy, 4, prefetch=prefetch, draw_threads=draw_threads) as batches:
        wait_until(lambda: drawn(batches) == prefetch, "the queue to fill")
        assert proxy.calls == prefetch
        seen = []
        for handed in range(1, 20):
            info = next(batches)
            seen.append(int(info.batch["draw"][0]))
            assert info.batch["draw"].tolist() == [seen[-1]] * 4
            if draw_threads == 1:  # one thread: batches come in draw order
                assert seen[-1] == handed
            # after `handed` next() calls at most `prefetch` more draws may have started
            assert proxy.calls <= handed + prefetch
            assert batches.in_flight() <= prefetch
        assert len(set(seen)) == 19 and max(seen) <= 19 + prefetch  # each draw handed once
        wait_until(lambda: proxy.calls == 19 + prefetch, "the queue to refill")
        assert batches.in_flight() == prefetch


@pytest.mark.parametrize("draw_threads", [2, 3])
def test_draw_threads_put_that_many_draws_on_the_wire_at_once(client, buffer_name,
                                                              draw_threads):
    # every draw waits at a barrier of draw_threads parties: the queue fills only if
    # that many draws are in progress together (one thread would wait out DEADLINE)
    hold = threading.Barrier(draw_threads)
    proxy = Counting(per_buffer(client, buffer_name), hold=hold)
    with Prefetcher(proxy, 4, prefetch=draw_threads, draw_threads=draw_threads) as batches:
        wait_until(lambda: drawn(batches) == draw_threads, "the concurrent draws")
        assert not hold.broken
        assert sorted(int(next(batches).batch["draw"][0]) for _ in range(draw_threads)) \
            == list(range(1, draw_threads + 1))
        hold.abort()  # later draws do not wait for partners
        assert len(prefetch_threads()) == draw_threads
    assert not prefetch_threads()


def test_per_draws_of_several_threads_are_committed_at_once(client, buffer_name,
                                                           monkeypatch):
    # the first two PER commits wait at a barrier of two parties: it passes only if
    # both draws are inside their commit together, which a replica shared by the
    # threads (its lock held from the draw to the commit's reply) never allows
    from redisbuf.sampling import commits

    hold = threading.Barrier(2)
    entered = []
    send = commits._send_commit

    def held_send(*args, **kwargs):
        entered.append(threading.current_thread().name)
        if len(entered) <= 2:
            hold.wait(DEADLINE)
        return send(*args, **kwargs)

    monkeypatch.setattr(commits, "_send_commit", held_send)
    buffer = per_buffer(client, buffer_name)
    with Prefetcher(buffer, 4, prefetch=2, draw_threads=2) as batches:
        infos = [next(batches) for _ in range(4)]
        assert not hold.broken
        assert len(set(entered[:2])) == 2  # one commit of each thread
        batches.update_priority(infos[0].ids, np.full(4, 9.0))
        batches.flush()
    assert all(len(info.ids) == 4 for info in infos)
    # the draws kept their replicas to their threads: the buffer object made none
    assert "per" not in buffer.view.replicas
    assert buffer.priorities(infos[0].ids).tolist() == [9.0] * 4


def test_own_replicas_gives_a_thread_replicas_of_its_own_until_it_ends(fake_client,
                                                                       buffer_name):
    from redisbuf.sampling.base import own_replicas

    buffer = per_buffer(fake_client, buffer_name)
    buffer.sample(4)
    shared = buffer.view.replicas["per"]
    seen = {}

    def draw() -> None:
        with own_replicas():
            buffer.sample(4)
            seen["inside"] = buffer.view.replicas["per"]
        seen["after"] = buffer.view.replicas.get("per")

    thread = threading.Thread(target=draw)
    thread.start()
    thread.join()
    assert seen["inside"] is not shared and seen["after"] is shared
    assert len(seen["inside"]) == len(shared) == 50


def test_draw_threads_never_exceed_prefetch(fake_client, buffer_name):
    buffer = per_buffer(fake_client, buffer_name)
    with Prefetcher(buffer, 4, prefetch=1, draw_threads=4) as batches:
        assert batches.draw_threads == 1 and len(prefetch_threads()) == 1
        next(batches)
    with Prefetcher(buffer, 4, prefetch=0, draw_threads=4) as batches:
        assert batches.draw_threads == 0 and not prefetch_threads()


def test_prefetch_zero_draws_on_demand_in_the_caller(client, buffer_name):
    proxy = Counting(per_buffer(client, buffer_name))
    with Prefetcher(proxy, 4, prefetch=0) as batches:
        assert not prefetch_threads()
        assert proxy.calls == 0
        next(batches)
        assert proxy.calls == 1


@pytest.mark.parametrize("prefetch", [0, 1, 3])
@pytest.mark.parametrize("through", ["prefetcher", "buffer"])
def test_an_update_reaches_every_batch_after_the_in_flight_ones(
    client, buffer_name, prefetch, through
):
    # eps=0: an item of priority 0 is never drawn, so a batch shows which priorities its
    # draw saw
    buffer = per_buffer(client, buffer_name, eps=0.0)
    ids = np.arange(1, 51)
    with Prefetcher(buffer, 8, prefetch=prefetch) as batches:
        next(batches)
        wait_until(lambda: drawn(batches) == prefetch, "the queue to fill")
        priorities = np.where(ids == 7, 1.0, 0.0)
        if through == "prefetcher":
            batches.update_priority(ids, priorities)
        else:
            buffer.update_priority(ids, priorities)
        after = [next(batches).ids.tolist() for _ in range(prefetch + 3)]
    # the batches in flight were drawn before the update; every later one after it
    assert all(batch == [7] * 8 for batch in after[prefetch:])
    if prefetch:  # the first in-flight batch was drawn before the update (50 items)
        assert after[0] != [7] * 8


def test_handed_updates_apply_in_order(client, buffer_name):
    buffer = per_buffer(client, buffer_name, eps=0.0)
    ids = np.arange(1, 51)
    with Prefetcher(buffer, 8, prefetch=2) as batches:
        for winner in (3, 9, 4):
            batches.update_priority(ids, np.where(ids == winner, 1.0, 0.0))
        batches.flush()
        assert buffer.sample_with_info(8).ids.tolist() == [4] * 8


def test_update_priority_checks_its_arguments_at_once(client, buffer_name):
    buffer = per_buffer(client, buffer_name)
    with Prefetcher(buffer, 8, prefetch=2) as batches:
        with pytest.raises(InvalidBatchError, match="priorities must be finite"):
            batches.update_priority([1, 2], [1.0, float("nan")])
        with pytest.raises(InvalidBatchError, match="3 priorities for 2 items"):
            batches.update_priority([1, 2], [1.0, 2.0, 3.0])
        next(batches)  # nothing failed in the thread


# -- errors and closing -------------------------------------------------------------------


def test_an_empty_buffer_without_block_raises_in_the_consumer(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    batches = Prefetcher(buffer, 4, prefetch=2, block=False)
    with pytest.raises(EmptyBufferError, match="empty"):
        next(batches)
    assert batches.closed and not prefetch_threads()
    with pytest.raises(StopIteration):
        next(batches)


def test_a_dropped_buffer_surfaces_after_the_batches_in_flight(client, buffer_name):
    buffer = per_buffer(client, buffer_name)
    with Prefetcher(buffer, 4, prefetch=2, block=False) as batches:
        wait_until(lambda: drawn(batches) == 2, "the queue to fill")
        buffer.drop()
        got = []
        # what sample_with_info itself raises on a dropped buffer
        with pytest.raises(ConfigMismatchError, match="does not exist"):
            for info in batches:
                got.append(info)
        assert len(got) == 2  # drawn before the drop
    assert not prefetch_threads()


def test_a_failed_draw_comes_after_the_batches_drawn_before_it(fake_client, buffer_name):
    proxy = Counting(per_buffer(fake_client, buffer_name), fail_at=3)
    batches = Prefetcher(proxy, 4, prefetch=4, draw_threads=1)
    assert [next(batches).batch["draw"][0] for _ in range(2)] == [1, 2]
    with pytest.raises(RuntimeError, match="draw 3 failed"):
        next(batches)
    assert proxy.calls == 3  # nothing drawn after the failure
    assert list(batches) == []


def test_a_failed_draw_beside_another_on_the_wire_ends_the_iteration(client, buffer_name):
    # draws 1 and 2 start together (barrier of 2); draw 2 fails, draw 1 finishes: the
    # error comes after the batches finished before it, no draw starts after it, and a
    # batch finished after it is dropped
    hold = threading.Barrier(2)
    proxy = Counting(per_buffer(client, buffer_name), fail_at=2, hold=hold)
    batches = Prefetcher(proxy, 4, prefetch=4, draw_threads=2)
    handed = []
    with pytest.raises(RuntimeError, match="draw 2 failed"):
        for info in batches:
            handed.append(int(info.batch["draw"][0]))
            hold.abort()
    assert set(handed) <= {1}
    assert proxy.calls == 2  # nothing drawn after the failure
    assert batches.closed and list(batches) == []
    assert not prefetch_threads()


def test_a_blocking_wait_times_out_in_the_consumer(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    with Prefetcher(buffer, 4, prefetch=1, timeout=0.3) as batches:
        with pytest.raises(WaitTimeoutError, match="no batch within timeout=0.3"):
            next(batches)


def test_a_failed_handed_update_raises_at_the_next_step(client, buffer_name):
    # a buffer without PER refuses update_priority on the server
    buffer = ReplayBuffer(client, buffer_name, capacity=100)
    buffer.add({"x": np.arange(20, dtype=np.float32).reshape(-1, 1)})
    try:
        buffer.update_priority([1], [1.0])
    except Exception as exc:
        refusal = type(exc)
    else:
        pytest.skip("this buffer accepts update_priority without PER")
    with Prefetcher(buffer, 4, prefetch=2) as batches:
        batches.update_priority([1], [1.0])
        with pytest.raises(refusal):
            batches.flush()
        batches.update_priority([1], [1.0])
        wait_until(lambda: batches._reader._update_error is not None, "the update to fail")
        with pytest.raises(refusal):
            next(batches)
        next(batches)  # sampling goes on


def test_close_stops_a_thread_blocked_on_an_empty_buffer(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, sampler=PERSampler())
    batches = Prefetcher(buffer, 4, prefetch=2, timeout=None)
    wait_until(lambda: batches.in_flight() == 2, "both draw threads to start waiting")
    assert prefetch_threads()
    start = time.monotonic()
    batches.close()
    assert time.monotonic() - start < 30  # not the limiter's 60 s (a hang guard)
    assert not prefetch_threads()
    with pytest.raises(StopIteration):
        next(batches)
    batches.close()  # idempotent


@pytest.mark.parametrize("limiter_timeout", [None, 60.0])
def test_close_stops_a_thread_held_back_by_a_rate_limiter(client, buffer_name,
                                                          limiter_timeout):
    """Without ``block`` only a rate limiter makes a draw wait, for the limiter's own
    timeout: close() ends that wait too (the review saw it never return with no limiter
    timeout, and wait out a 60 s one)."""
    from redisbuf.limiters import SampleToInsertRatio

    limiter = SampleToInsertRatio(1, min_size_to_sample=2, error_buffer=4,
                                  timeout=limiter_timeout)
    buffer = ReplayBuffer(client, buffer_name, capacity=100, sampler=PERSampler(),
                          rate_limiter=limiter)
    buffer.add({"x": np.arange(4.0), "log_rewards": np.zeros(4)})  # 6 samples allowed
    batches = Prefetcher(buffer, 1, prefetch=2, block=False)
    for _ in range(6):
        next(batches)
    wait_until(lambda: batches.in_flight() == 2, "draws 7 and 8 to wait on the limiter")
    start = time.monotonic()
    batches.close()
    assert time.monotonic() - start < 30  # not the limiter's 60 s (a hang guard)
    assert not prefetch_threads()
    assert buffer.stats()["sampled"] == 6


def test_an_abandoned_prefetcher_stops_its_thread(client, buffer_name):
    buffer = per_buffer(client, buffer_name)
    batches = Prefetcher(buffer, 4, prefetch=2)
    next(batches)
    threads = batches._reader._threads
    del batches
    gc.collect()
    for thread in threads:
        thread.join(DEADLINE)
        assert not thread.is_alive()


def test_close_applies_the_updates_handed_over(client, buffer_name):
    buffer = per_buffer(client, buffer_name, eps=0.0)
    ids = np.arange(1, 51)
    batches = Prefetcher(buffer, 4, prefetch=2)
    batches.update_priority(ids, np.where(ids == 5, 1.0, 0.0))
    batches.close()
    assert buffer.sample_with_info(4).ids.tolist() == [5] * 4


def test_bad_arguments_are_refused(fake_client, buffer_name):
    buffer = per_buffer(fake_client, buffer_name)
    for kwargs, message in [
        ({"batch_size": 0}, "batch_size"),
        ({"batch_size": 4, "prefetch": -1}, "prefetch"),
        ({"batch_size": 4, "draw_threads": 0}, "draw_threads"),
        ({"batch_size": 4, "draw_threads": True}, "draw_threads"),
        ({"batch_size": 4, "timeout": -1}, "timeout"),
        ({"batch_size": 4, "max_batches": 1.5}, "max_batches"),
    ]:
        with pytest.raises(ValueError, match=message):
            Prefetcher(buffer, **kwargs)


# -- torch --------------------------------------------------------------------------------


def test_dataset_with_a_dataloader_in_process(client, buffer_name):
    torch = pytest.importorskip("torch")
    from redisbuf.sampling.reader import ReplayDataset

    buffer = per_buffer(client, buffer_name)
    dataset = ReplayDataset(buffer, 8, prefetch=2, num_batches=5)
    assert isinstance(dataset, torch.utils.data.IterableDataset)
    got = list(torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=0))
    assert len(got) == 5
    for info in got:
        assert isinstance(info.batch["x"], torch.Tensor) and info.batch["x"].shape == (8, 1)
        assert isinstance(info.ids, torch.Tensor) and info.ids.dtype == torch.int64
        assert isinstance(info.weights, torch.Tensor)
        assert torch.equal(info.batch["x"][:, 0].long(), info.ids - 1)


def test_dataset_refuses_a_buffer_object_in_worker_processes(fake_client, buffer_name):
    pytest.importorskip("torch")
    from redisbuf.sampling.reader import ReplayDataset

    with pytest.raises(ValueError, match="needs the buffer's name"):
        ReplayDataset("redis://localhost", 8)
    with pytest.raises(ValueError, match="go with a URL"):
        ReplayDataset(per_buffer(fake_client, buffer_name), 8, name="x")


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_dataset_with_two_workers_each_opening_the_buffer(real_client, redis_server, buffer_name):
    torch = pytest.importorskip("torch")
    from redisbuf.sampling.reader import ReplayDataset

    per_buffer(real_client, buffer_name)
    dataset = ReplayDataset(
        redis_server.url,
        8,
        name=buffer_name,
        buffer_kwargs={"sampler": PERSampler(), "seed": 3},
        num_batches=7,
        prefetch=2,
    )
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2)
    got = list(loader)
    assert len(got) == 7  # split 4 + 3 between the workers
    for info in got:
        assert info.weights is not None and info.batch["x"].shape == (8, 1)
        assert torch.equal(info.batch["x"][:, 0].long(), info.ids - 1)
    # seeds 3 and 4: the workers draw apart
    assert got[0].ids.tolist() != got[1].ids.tolist()


def test_to_torch_converts_arrays_inside_containers():
    torch = pytest.importorskip("torch")
    from redisbuf import Transitions
    from redisbuf.sampling.reader import to_torch

    readonly = np.arange(3.0)
    readonly.flags.writeable = False
    transitions = Transitions(
        states=np.zeros((2, 3)),
        next_states=np.zeros((2, 3)),
        actions=np.zeros(2),
        is_terminating=np.zeros(2, dtype=bool),
        log_rewards=np.ones(2),
    )
    out = to_torch({"a": [readonly, (np.ones(2), "s")], "t": transitions})
    assert isinstance(out["a"][0], torch.Tensor) and out["a"][1][1] == "s"
    assert out["a"][0].tolist() == [0.0, 1.0, 2.0]
    assert isinstance(out["t"], Transitions) and isinstance(out["t"].log_rewards, torch.Tensor)
    assert out["t"].conditions is None


def count_round_trips(monkeypatch) -> list[int]:
    """One entry per request sent to a server from now on (a pipeline is one)."""
    import redis.connection

    sent: list[int] = []
    send = redis.connection.Connection.send_packed_command

    def counted(self, command, *args, **kwargs):
        sent.append(1)
        return send(self, command, *args, **kwargs)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counted)
    return sent


def test_blocking_draws_read_the_length_only_until_the_buffer_held_enough(
    real_client, buffer_name, monkeypatch
):
    buffer = ReplayBuffer(real_client, buffer_name, capacity=100, seed=0)
    buffer.add({"obs": np.arange(8.0), "log_rewards": np.zeros(8)})
    with Prefetcher(buffer, batch_size=4, prefetch=0) as batches:
        sent = count_round_trips(monkeypatch)
        next(batches)  # the first waits: the length, then the draw
        assert len(sent) >= 2, sent
        sent.clear()
        for _ in range(3):
            assert len(next(batches).ids) == 4
        assert len(sent) == 3  # then one round trip a batch: the draw


def test_a_buffer_emptied_meanwhile_makes_the_prefetcher_wait_again(client, buffer_name):
    buffer = ReplayBuffer(client, buffer_name, capacity=100, seed=0)
    buffer.add({"obs": np.arange(8.0), "log_rewards": np.zeros(8)})
    with Prefetcher(buffer, batch_size=4, prefetch=0, timeout=0.3) as batches:
        next(batches)
        buffer.clear()
        with pytest.raises(WaitTimeoutError):
            next(batches)
