"""Uniform sampling with ids computed by the client (UniformSampler's guess mode): the
ids are exactly those the script's own draw gives, the draws are uniform, bookkeeping is
the same, and a draw racing adds and evictions in other processes never returns a wrong,
torn or missing item. Also: the decode scratch area is never visible in a result."""

from __future__ import annotations

import math
import threading
import traceback

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import fresh_context

from redisbuf import ReplayBuffer, Trajectories
from redisbuf.sampling import samplers
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import codec
from redisbuf.store.keys import format_id

SETTINGS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


def chi2_limit(df: int, z: float = 5.0) -> float:
    """Wilson-Hilferty upper quantile of chi-square(df) at about z sigmas (p ~ 3e-7)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def chi2(observed: np.ndarray, expected: np.ndarray) -> float:
    return float(((observed - expected) ** 2 / expected).sum())


def _items(start: int, count: int) -> dict:
    return {"v": np.arange(start, start + count), "log_rewards": np.zeros(count)}


class _Paths:
    """Counts draws served by the guess (one round trip) and by the script's own draw."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.guessed = self.plain = 0
        guess, plain = samplers.UniformSampler._guess, samplers._draw_then_fetch

        def counted_guess(*args, **kwargs):
            draw = guess(*args, **kwargs)
            self.guessed += draw is not None
            return draw

        def counted_plain(*args, **kwargs):
            self.plain += 1
            return plain(*args, **kwargs)

        monkeypatch.setattr(samplers.UniformSampler, "_guess", counted_guess)
        monkeypatch.setattr(samplers, "_draw_then_fetch", counted_plain)


@SETTINGS
@given(
    length=st.integers(1, 400),
    n=st.integers(1, 60),
    replace=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_client_ranks_are_the_scripts_ranks(fake_client, length, n, replace, seed):
    buffer = ReplayBuffer(fake_client, f"ranks-{length}", capacity=length)
    if len(buffer) == 0:
        buffer.add(_items(0, length))
    words = samplers._uniform_words(np.random.default_rng(seed), n)
    reply = buffer._run(
        "sample_uniform",
        buffer.keys.all_keys(),
        [n, int(replace), 0, samplers._pack_words(words)],
    )
    assert int(reply[0]) == length and int(reply[1]) == 1
    script_ids = [int(i) for i in reply[2:]]
    ranks = samplers._uniform_ranks(words, length, replace or n > length)
    assert (ranks + 1).tolist() == script_ids


def test_client_ranks_match_the_real_servers_lua_at_large_ranges(real_client):
    # Lua 5.1 (Redis) and 5.4 (fakeredis) must both agree with the numpy arithmetic
    # (one command draws at most bounds.MAX_ITEMS_PER_COMMAND = 2048 items)
    buffer = ReplayBuffer(real_client, "ranks-large", capacity=2000)
    buffer.add(_items(0, 1000))  # at most bounds.MAX_ADD_ITEMS (1024) an add
    buffer.add(_items(1000, 1000))
    rng = np.random.default_rng(3)
    for n, replace in ((256, False), (256, True), (2000, False), (2048, False)):
        words = samplers._uniform_words(rng, n)
        reply = buffer._run(
            "sample_uniform", buffer.keys.all_keys(), [n, int(replace), 0,
                                                      samplers._pack_words(words)]
        )
        ranks = samplers._uniform_ranks(words, 2000, replace or n > 2000)
        assert (ranks + 1).tolist() == [int(i) for i in reply[2:]]


def test_guessed_and_plain_draws_are_identical_with_the_same_bookkeeping(
    client, buffer_name, monkeypatch
):
    fast = ReplayBuffer(client, buffer_name, capacity=50, seed=5)
    fast.add(_items(0, 80))  # evicts 30: ids 31..80 present
    paths = _Paths(monkeypatch)
    fast_draws = [fast.sample_with_info(k, replacement=r) for k, r in
                  [(7, None), (7, None), (50, None), (60, None), (9, True), (3, None)]]
    assert paths.guessed == 5 and paths.plain == 1  # the first draw learns the range
    fast_stats = fast.stats()
    fast_uses = client.hgetall(fast.keys.uses)

    client.delete(*fast.keys.all_keys())
    slow = ReplayBuffer(client, buffer_name, capacity=50, seed=5)
    slow.add(_items(0, 80))
    monkeypatch.setattr(samplers.UniformSampler, "_guess", lambda *args: None)
    slow_draws = [slow.sample_with_info(k, replacement=r) for k, r in
                  [(7, None), (7, None), (50, None), (60, None), (9, True), (3, None)]]
    for a, b in zip(fast_draws, slow_draws, strict=True):
        assert a.ids.tolist() == b.ids.tolist()
        assert (a.batch["v"] + 1).tolist() == a.ids.tolist()
    assert slow.stats()["sampled"] == fast_stats["sampled"] == 7 + 7 + 50 + 60 + 9 + 3
    assert client.hgetall(slow.keys.uses) == fast_uses


@pytest.mark.parametrize("replacement", [None, True])
def test_guessed_draws_are_uniform(client, buffer_name, monkeypatch, replacement):
    buffer = ReplayBuffer(client, buffer_name, capacity=20, seed=17)
    buffer.add(_items(0, 27))  # ids 8..27
    paths = _Paths(monkeypatch)
    counts = np.zeros(20)
    pairs: dict[tuple[int, int], int] = {}
    calls = 1500
    for _ in range(calls):
        ids = buffer.sample_with_info(4, replacement=replacement).ids.tolist()
        if replacement is None:
            assert len(set(ids)) == 4
        for item_id in ids:
            counts[item_id - 8] += 1
        pair = tuple(sorted(ids[:2]))
        pairs[pair] = pairs.get(pair, 0) + 1
    assert paths.guessed == calls - 1 and paths.plain == 1
    assert chi2(counts, np.full(20, calls * 4 / 20)) < chi2_limit(19)
    if replacement is None:  # every unordered pair of the first two draws equally likely
        assert len(pairs) == 190
        observed = np.array(list(pairs.values()), dtype=float)
        assert chi2(observed, np.full(190, calls / 190)) < chi2_limit(189)


def test_a_moved_range_is_drawn_again_for_the_new_range(client, buffer_name, monkeypatch):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, seed=1)
    other = ReplayBuffer(client, buffer_name, capacity=None, seed=2)
    buffer.add(_items(0, 10))
    buffer.sample(3)  # learns ids 1..10
    other.add(_items(10, 4))  # another process: ids 5..14 now
    paths = _Paths(monkeypatch)
    for _ in range(20):
        info = buffer.sample_with_info(10)
        assert sorted(info.ids.tolist()) == list(range(5, 15))
        assert (info.batch["v"] + 1).tolist() == info.ids.tolist()
    assert paths.guessed == 20  # the first guess missed, the redraw for 5..14 hit
    assert buffer.stats()["sampled"] == 3 + 200


def test_holes_in_the_ids_use_the_scripts_draw(client, buffer_name, monkeypatch):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, prioritized_capacity=True, seed=1)
    rewards = np.array([5.0, 5, 0, 5, 0, 5, 0, 5, 5, 5])
    buffer.add({"v": np.arange(10), "log_rewards": rewards})
    buffer.add({"v": np.arange(10, 13), "log_rewards": np.full(3, 6.0)})  # evicts 3, 5, 7
    paths = _Paths(monkeypatch)
    for _ in range(5):
        info = buffer.sample_with_info(4)
        assert (info.batch["v"] + 1).tolist() == info.ids.tolist()
    assert paths.guessed == 0 and paths.plain == 5


def test_max_use_draws_stay_in_the_script(client, buffer_name, monkeypatch):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, max_use=2, seed=1)
    buffer.add(_items(0, 10))
    paths = _Paths(monkeypatch)
    for _ in range(3):
        info = buffer.sample_with_info(4)
        assert (info.batch["v"] + 1).tolist() == info.ids.tolist()
    assert paths.guessed == 0 and paths.plain == 3
    assert buffer.stats()["sampled"] == 12


def test_a_flushed_script_is_loaded_again_by_the_guess(
    client, buffer_name, monkeypatch, flush_scripts
):
    buffer = ReplayBuffer(client, buffer_name, capacity=10, seed=1)
    buffer.add(_items(0, 10))
    buffer.sample(2)
    flush_scripts()  # e.g. a restarted server
    paths = _Paths(monkeypatch)
    info = buffer.sample_with_info(5)
    assert (info.batch["v"] + 1).tolist() == info.ids.tolist()
    assert paths.guessed == 1 and paths.plain == 0
    assert buffer.stats()["sampled"] == 7


@pytest.mark.redis_server
def test_guessed_draws_on_a_server_refusing_writes_record_nothing(buffer_name, monkeypatch):
    with EmbeddedServer() as server:  # its own: the test changes its configuration
        client = redis.Redis.from_url(server.url)
        buffer = ReplayBuffer(client, buffer_name, capacity=64, seed=2)
        buffer.add(_items(0, 16))
        buffer.sample(2)  # learns the range
        client.config_set("maxmemory", 1)  # every write is refused (noeviction)
        paths = _Paths(monkeypatch)
        for _ in range(5):
            info = buffer.sample_with_info(8)
            assert (info.batch["v"] + 1).tolist() == info.ids.tolist()
        assert paths.guessed == 5 and paths.plain == 0
        client.config_set("maxmemory", 0)
        assert buffer.stats()["sampled"] == 2  # read-only draws are not counted
        buffer.sample(3)
        assert buffer.stats()["sampled"] == 5  # and counted again once writes are allowed
        client.close()


# -- racing other processes (real server) --------------------------------------------

ROWS = 64


def _writer(url: str, name: str, stop, errors) -> None:
    """Adds batches of items whose every value is the item's own id, evicting as it goes
    (the only writer: ids are assigned in order, so the id is known before the add)."""
    try:
        buffer = ReplayBuffer(url, name, capacity=None)
        next_id = 1 + int(buffer.client.hget(buffer.keys.meta, "inserted") or 0)
        while not stop.is_set():
            count = 17
            ids = np.arange(next_id, next_id + count)
            result = buffer.add(
                {"x": np.repeat(ids[:, None], ROWS, axis=1).astype(np.int64),
                 "log_rewards": np.zeros(count)}
            )
            assert result.ids.tolist() == ids.tolist()
            next_id += count
    except BaseException:  # noqa: BLE001 - reported to the test
        errors.put(traceback.format_exc())


@pytest.mark.redis_server
@pytest.mark.multiprocess
def test_sampling_while_another_process_adds_and_evicts_returns_only_whole_right_items(
    redis_server, buffer_name, monkeypatch
):
    buffer = ReplayBuffer(redis_server.url, buffer_name, capacity=200, seed=3)
    ids = np.arange(1, 201)
    buffer.add({"x": np.repeat(ids[:, None], ROWS, axis=1).astype(np.int64),
                "log_rewards": np.zeros(200)})
    paths = _Paths(monkeypatch)
    ctx = fresh_context()
    stop, errors = ctx.Event(), ctx.Queue()
    writers = [ctx.Process(target=_writer, args=(redis_server.url, buffer_name, stop, errors))]
    for process in writers:
        process.start()
    try:
        draws = 0
        while draws < 200 or paths.plain < 5 or paths.guessed < 5:
            info = buffer.sample_with_info(100, replacement=draws % 2 == 1)
            x = info.batch["x"]
            assert x.shape == (100, ROWS)
            assert (x == info.ids[:, None]).all()  # each row is its own item, whole
            if draws % 2 == 0:
                assert len(set(info.ids.tolist())) == 100
            draws += 1
            assert errors.empty(), errors.get()
            assert draws < 5000, f"guessed {paths.guessed}, drawn again {paths.plain}"
    finally:
        stop.set()
        for process in writers:
            process.join(timeout=60)
    assert errors.empty(), errors.get()
    assert paths.guessed > 0 and paths.plain > 0  # both the guess and the redraw were raced


# -- decode --------------------------------------------------------------------------


def _trajectories(rng: np.random.Generator, lengths: np.ndarray, horizon: int) -> Trajectories:
    n = len(lengths)
    return Trajectories(
        states=rng.standard_normal((horizon + 1, n, 16)).astype(np.float32),
        actions=rng.integers(0, 5, (horizon, n)).astype(np.int8),
        terminating_idx=lengths,
        log_rewards=rng.standard_normal(n),
    )


def _same(a: Trajectories, b: Trajectories) -> bool:
    return all(
        np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)), equal_nan=True)
        for f in ("states", "actions", "terminating_idx", "log_rewards")
    )


@SETTINGS
@given(
    layout=st.sampled_from(["fixed", "variable", "mixed"]),
    n=st.integers(1, 30),
    seed=st.integers(0, 2**16),
)
def test_decode_of_each_layout_matches_the_msgpack_reference(
    fake_client, monkeypatch, layout, n, seed
):
    rng = np.random.default_rng(seed)
    buffer = ReplayBuffer(fake_client, f"layout-{layout}-{n}-{seed}", capacity=4 * n)
    if layout == "fixed":
        buffer.add(_trajectories(rng, np.full(n, 12), 12))
    elif layout == "variable":
        buffer.add(_trajectories(rng, rng.integers(1, 13, n), 12))
    else:  # two batches of different fixed horizons, and one of varied lengths
        buffer.add(_trajectories(rng, np.full(n, 5), 5))
        buffer.add(_trajectories(rng, np.full(n, 12), 12))
        buffer.add(_trajectories(rng, rng.integers(1, 9, n), 8))
    count = len(buffer)
    blobs = fake_client.hmget(buffer.keys.items, [format_id(i) for i in range(1, count + 1)])
    order = rng.permutation(count)
    blobs = [blobs[i] for i in order]
    fast = buffer.decode(blobs)
    with monkeypatch.context() as patch:  # the per-blob msgpack parse only
        patch.setattr(codec, "decode_same_layout", lambda blobs, scratch=None: None)
        patch.setattr(codec, "decode_ragged", lambda blobs, scratch=None: None)
        reference = buffer.decode(blobs)
    assert _same(fast, reference)
    buffer.drop()


@pytest.mark.parametrize("varied", [False, True], ids=["fixed", "variable"])
def test_a_result_never_shares_memory_with_the_scratch_area(fake_client, varied):
    buffer = ReplayBuffer(fake_client, "scratch", capacity=100)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 10, 40) if varied else np.full(40, 9)
    buffer.add(_trajectories(rng, lengths, 9))
    first = buffer.get(list(range(1, 41)))
    kept = {f: np.array(getattr(first, f), copy=True) for f in ("states", "actions")}
    for _ in range(3):  # decodes reuse the area: the first result must not change
        buffer.get(list(range(40, 0, -1)))
    for field, values in kept.items():
        array = getattr(first, field)
        assert np.array_equal(array, values)
        assert array.flags.writeable


def test_threads_decoding_at_once_get_their_own_items(fake_client):
    buffer = ReplayBuffer(fake_client, "threads", capacity=400)
    rng = np.random.default_rng(1)
    batch = _trajectories(rng, rng.integers(1, 20, 300), 20)
    buffer.add(batch)
    blobs = fake_client.hmget(buffer.keys.items, [format_id(i) for i in range(1, 301)])
    failures: list[str] = []

    def decode(offset: int) -> None:
        try:
            for round_ in range(30):
                start = (offset * 37 + round_ * 11) % 250
                out = buffer.decode(blobs[start : start + 50])
                expected = np.asarray(batch.log_rewards)[start : start + 50]
                if not np.array_equal(np.asarray(out.log_rewards), expected):
                    failures.append(f"thread {offset} round {round_}: log_rewards")
                lengths = np.asarray(batch.terminating_idx)[start : start + 50]
                if not np.array_equal(np.asarray(out.terminating_idx), lengths):
                    failures.append(f"thread {offset} round {round_}: lengths")
                states = np.asarray(out.states)
                for k in (0, 49):
                    rows = lengths[k] + 1
                    source = np.asarray(batch.states)[:rows, start + k]
                    if not np.array_equal(states[:rows, k], source):
                        failures.append(f"thread {offset} round {round_}: states")
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(repr(exc))

    threads = [threading.Thread(target=decode, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
