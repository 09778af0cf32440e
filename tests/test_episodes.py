"""EpisodeBuffer: whole episodes as units, windows inside one episode, oldest-first
eviction, against an in-memory model; many processes on a real server."""

from __future__ import annotations

import json
import time
from collections import Counter, deque

import numpy as np
import pytest
import redis
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import fresh_context

from redisbuf.buffers import episodes as episodes_module
from redisbuf.buffers.episodes import EpisodeBuffer, EpisodeKeys
from redisbuf.errors import ConfigMismatchError, EmptyBufferError, InvalidBatchError, SchemaError


def episode(tag: int, length: int) -> dict[str, np.ndarray]:
    """Steps that say which episode and step they are: ``tag`` and ``t``."""
    return {
        "tag": np.full(length, tag, dtype=np.int32),
        "t": np.arange(length, dtype=np.int64),
        "obs": np.arange(length * 2, dtype=np.float32).reshape(length, 2) + tag,
    }


def snapshot(client, name: str) -> dict[str, object]:
    out: dict[str, object] = {}
    for key in EpisodeKeys(name).all_keys():
        kind = client.type(key).decode()
        if kind == "hash":
            out[key] = sorted(client.hgetall(key).items())
        elif kind == "zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = kind
    return out


def test_push_evicts_whole_episodes_oldest_first(client, buffer_name):
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=3, seed=0)
    ids = [buffer.push(episode(tag, length)) for tag, length in enumerate([4, 1, 6, 2, 3])]
    assert ids == [1, 2, 3, 4, 5]
    assert buffer.count() == 3 and buffer.num_steps() == 6 + 2 + 3
    assert buffer.stats() == {"steps": 11, "pushed": 5, "evicted": 2, "sampled": 0, "episodes": 3}
    drawn = buffer.sample_episodes(3)
    assert sorted(drawn.ids.tolist()) == [3, 4, 5]
    for eid, ep in zip(drawn.ids, drawn.episodes, strict=True):
        tag, length = {3: (2, 6), 4: (3, 2), 5: (4, 3)}[int(eid)]
        expected = episode(tag, length)
        assert set(ep) == set(expected)
        for key, value in expected.items():
            np.testing.assert_array_equal(ep[key], value)
            assert ep[key].dtype == value.dtype
    # steps of evicted episodes are gone from Redis, not only from the index
    assert client.hlen(EpisodeKeys(buffer_name).steps) == 11
    with pytest.raises(EmptyBufferError, match="without replacement"):
        buffer.sample(4)
    assert len(buffer.sample(7, replace=True)) == 7


def test_windows_lie_inside_one_episode(client, buffer_name):
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=10, seed=1)
    for tag, length in enumerate([2, 5, 9, 3]):
        buffer.push(episode(tag, length))
    windows = buffer.sample_windows(50, 3)
    assert windows.data["obs"].shape == (50, 3, 2) and windows.data["obs"].dtype == np.float32
    assert windows.data["t"].shape == (50, 3)
    lengths = {1: 2, 2: 5, 3: 9, 4: 3}
    for i in range(50):
        eid, off = int(windows.episode_ids[i]), int(windows.offsets[i])
        assert lengths[eid] >= off + 3
        np.testing.assert_array_equal(windows.data["tag"][i], eid - 1)
        np.testing.assert_array_equal(windows.data["t"][i], np.arange(off, off + 3))
    with pytest.raises(EmptyBufferError, match="no stored episode has 10 steps"):
        buffer.sample_windows(1, 10)
    for n, length in ((0, 3), (2, 0), (-1, 2), (1.5, 2)):
        with pytest.raises(ValueError, match="must be an integer >= 1"):
            buffer.sample_windows(n, length)
    assert buffer.sample(0) == []


@pytest.mark.parametrize("tries", [0, 1, 16])
def test_windows_are_uniform_over_all_windows(fake_client, buffer_name, monkeypatch, tries):
    # windows of length 4: 0 + 1 + 7 + 2 = 10 of them; tries=0 uses only the exact
    # fallback, tries=1 mixes rejection draws (60% miss) with it
    monkeypatch.setattr(episodes_module, "WINDOW_TRIES", tries)
    buffer = EpisodeBuffer(fake_client, buffer_name, capacity_episodes=10, seed=2)
    for tag, length in enumerate([3, 4, 10, 5, 1, 1, 1]):
        buffer.push(episode(tag, length))
    draws = 4000
    counts: Counter = Counter()
    for _ in range(draws // 200):
        w = buffer.sample_windows(200, 4)
        counts.update(zip(w.episode_ids.tolist(), w.offsets.tolist(), strict=True))
    expected = {(2, 0)} | {(3, o) for o in range(7)} | {(4, o) for o in range(2)}
    assert set(counts) == expected
    chi2 = sum((c - draws / 10) ** 2 / (draws / 10) for c in counts.values())
    assert chi2 < 27.9  # chi-square, 9 degrees of freedom, p = 0.001


@pytest.mark.parametrize("evictions", [1, 3, 10])
def test_a_window_evicted_before_its_read_is_drawn_again(client, buffer_name, monkeypatch,
                                                         evictions):
    # windows are drawn in Lua and read by a native HMGET; here every read but the last
    # `evictions` ones finds its episode evicted (capacity 1) by another writer
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=1, seed=0)
    writer = EpisodeBuffer(client, buffer_name, capacity_episodes=1)
    buffer.push(episode(1, 6))
    reads = []
    real_hmget = client.hmget

    def hmget(*args, **kwargs):
        if len(reads) < evictions:
            writer.push(episode(len(reads) + 2, 6))
        reads.append(args)
        return real_hmget(*args, **kwargs)

    monkeypatch.setattr(client, "hmget", hmget)
    w = buffer.sample_windows(4, 3)
    last = min(evictions, 3) + 1  # after 3 failed reads the script reads inside Lua
    assert w.episode_ids.tolist() == [last] * 4
    np.testing.assert_array_equal(w.data["tag"], last)  # tags equal ids here
    for t, off in zip(w.data["t"], w.offsets, strict=True):
        np.testing.assert_array_equal(t, np.arange(off, off + 3))
    assert len(reads) == min(evictions + 1, 3)
    assert buffer.stats()["sampled"] == 4  # the windows thrown away are not counted


@pytest.mark.parametrize("evictions", [1, 3, 10])
def test_an_episode_evicted_before_its_read_is_drawn_again(client, buffer_name, monkeypatch,
                                                           evictions):
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=2, seed=0)
    writer = EpisodeBuffer(client, buffer_name, capacity_episodes=2)
    buffer.push(episode(1, 4))
    buffer.push(episode(2, 5))
    reads = []
    real_hmget = client.hmget

    def hmget(*args, **kwargs):
        if len(reads) < evictions:  # evict both stored episodes
            writer.push(episode(2 * len(reads) + 3, 3))
            writer.push(episode(2 * len(reads) + 4, 2))
        reads.append(args)
        return real_hmget(*args, **kwargs)

    monkeypatch.setattr(client, "hmget", hmget)
    drawn = buffer.sample_episodes(2)
    newest = 2 * min(evictions, 3) + 2  # after 3 failed reads the script reads inside Lua
    assert sorted(drawn.ids.tolist()) == [newest - 1, newest]
    for eid, ep in zip(drawn.ids.tolist(), drawn.episodes, strict=True):
        np.testing.assert_array_equal(ep["tag"], eid)
        np.testing.assert_array_equal(ep["t"], np.arange({newest - 1: 3, newest: 2}[eid]))
    assert len(reads) == min(evictions + 1, 3)
    assert buffer.stats()["sampled"] == 2  # the draws thrown away are not counted


def test_episodes_as_lists_of_steps_and_torch_fields(client, buffer_name):
    steps = EpisodeBuffer(client, buffer_name, capacity_episodes=2, seed=0)
    steps.push([{"a": 1, "s": "x"}, {"a": 2, "s": "y"}, {"a": 3, "s": "z"}])
    assert steps.sample(1) == [[{"a": 1, "s": "x"}, {"a": 2, "s": "y"}, {"a": 3, "s": "z"}]]
    w = steps.sample_windows(4, 2)
    for window, off in zip(w.data, w.offsets, strict=True):
        assert [step["a"] for step in window] == [off + 1, off + 2]
    with pytest.raises(SchemaError, match="schema"):
        steps.push({"a": np.arange(3)})
    tensors = EpisodeBuffer(client, buffer_name + "t", capacity_episodes=2, seed=0)
    tensors.push({"x": torch.arange(6, dtype=torch.float16).reshape(3, 2), "r": torch.ones(3)})
    ep = tensors.sample(1)[0]
    assert ep["x"].dtype == torch.float16 and ep["r"].dtype == torch.float32
    assert torch.equal(ep["x"], torch.arange(6, dtype=torch.float16).reshape(3, 2))


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ([], InvalidBatchError, "at least one step"),
        ({"x": np.zeros((0, 2))}, InvalidBatchError, "at least one step"),
        ({"x": np.zeros(3), "y": np.zeros(4)}, InvalidBatchError, "'y' has 4 steps"),
        ({"x": 3}, InvalidBatchError, "'x' must be an array"),
        ({"x": np.zeros(3, dtype=np.complex64)}, InvalidBatchError, "'x'.*complex64"),
        ([object()], InvalidBatchError, "cannot be encoded"),
        ("text", InvalidBatchError, "got str"),
        ({"tag": np.zeros(3, dtype=np.int64)}, SchemaError, "differs"),
    ],
)
def test_bad_episodes_write_nothing(client, buffer_name, bad, error, match):
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=2)
    buffer.push(episode(0, 3))
    before = snapshot(client, buffer_name)
    with pytest.raises(error, match=match):
        buffer.push(bad)
    assert snapshot(client, buffer_name) == before


def test_configuration_is_checked(client, buffer_name):
    EpisodeBuffer(client, buffer_name, capacity_episodes=5)
    assert EpisodeBuffer(client, buffer_name, capacity_episodes=None).capacity_episodes == 5
    with pytest.raises(ConfigMismatchError, match="capacity_episodes=5"):
        EpisodeBuffer(client, buffer_name, capacity_episodes=6)
    with pytest.raises(ConfigMismatchError, match="does not exist"):
        EpisodeBuffer(client, buffer_name + "x", capacity_episodes=None)
    with pytest.raises(ValueError, match="positive"):
        EpisodeBuffer(client, buffer_name, capacity_episodes=0)
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=5)
    buffer.push(episode(0, 2))
    assert buffer.clear() == 1 and buffer.count() == 0 and buffer.num_steps() == 0
    with pytest.raises(EmptyBufferError):
        buffer.sample(1)
    assert buffer.push(episode(1, 2)) == 2  # ids keep growing
    buffer.drop()
    assert client.keys(f"rb:{{{buffer_name}}}:*") == []


# -- reference model -----------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.integers(1, 7)),
        st.tuples(st.just("sample"), st.integers(1, 4), st.booleans()),
        st.tuples(st.just("windows"), st.integers(1, 5), st.integers(1, 6)),
        st.tuples(st.just("clear")),
    ),
    max_size=30,
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(capacity=st.integers(1, 5), ops=operations, seed=st.integers(0, 2**16))
def test_matches_an_in_memory_model(client, capacity, ops, seed):
    client.delete(*EpisodeKeys("model").all_keys())  # one buffer per example
    buffer = EpisodeBuffer(client, "model", capacity_episodes=capacity, seed=seed)
    model: deque[tuple[int, int]] = deque()  # (episode id, length), oldest first
    next_id = 1
    for op in ops:
        if op[0] == "push":
            assert buffer.push(episode(next_id, op[1])) == next_id
            model.append((next_id, op[1]))
            next_id += 1
            while len(model) > capacity:
                model.popleft()
        elif op[0] == "clear":
            assert buffer.clear() == len(model)
            model.clear()
        elif op[0] == "sample":
            n, replace = op[1], op[2]
            if not model or (not replace and n > len(model)):
                with pytest.raises(EmptyBufferError):
                    buffer.sample_episodes(n, replace)
                continue
            drawn = buffer.sample_episodes(n, replace)
            lengths = dict(model)
            assert len(drawn.episodes) == n
            if not replace:
                assert len(set(drawn.ids.tolist())) == n
            for eid, ep in zip(drawn.ids.tolist(), drawn.episodes, strict=True):
                assert eid in lengths
                np.testing.assert_array_equal(ep["tag"], np.full(lengths[eid], eid))
                np.testing.assert_array_equal(ep["t"], np.arange(lengths[eid]))
        else:
            n, length = op[1], op[2]
            lengths = dict(model)
            if not any(t >= length for t in lengths.values()):
                with pytest.raises(EmptyBufferError):
                    buffer.sample_windows(n, length)
                continue
            w = buffer.sample_windows(n, length)
            for i in range(n):
                eid, off = int(w.episode_ids[i]), int(w.offsets[i])
                assert eid in lengths and 0 <= off and off + length <= lengths[eid]
                np.testing.assert_array_equal(w.data["tag"][i], np.full(length, eid))
                np.testing.assert_array_equal(w.data["t"][i], np.arange(off, off + length))
        assert buffer.count() == len(model)
        assert buffer.num_steps() == sum(t for _, t in model)
        assert client.hlen(EpisodeKeys("model").steps) == buffer.num_steps()


# -- many processes on a real server -------------------------------------------------------


def _pusher(url: str, name: str, worker: int, seconds: float) -> None:
    buffer = EpisodeBuffer(redis.Redis.from_url(url), name, capacity_episodes=None, seed=worker)
    rng = np.random.default_rng(worker)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        length = int(rng.integers(1, 40))
        buffer.push(
            {
                "worker": np.full(length, worker, dtype=np.int32),
                "length": np.full(length, length, dtype=np.int32),
                "t": np.arange(length, dtype=np.int32),
            }
        )


def _sampler(url: str, name: str, worker: int, seconds: float) -> None:
    client = redis.Redis.from_url(url)
    buffer = EpisodeBuffer(client, name, capacity_episodes=None, seed=100 + worker)
    problems, episodes, windows = [], 0, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            for ep in buffer.sample(4, replace=True):
                length = int(ep["length"][0])
                episodes += 1
                if not (
                    len(ep["t"]) == length
                    and (ep["t"] == np.arange(length)).all()
                    and (ep["length"] == length).all()
                    and (ep["worker"] == ep["worker"][0]).all()
                ):
                    problems.append(f"torn episode {ep}")
            w = buffer.sample_windows(8, 5)
            windows += 8
            for i in range(8):
                t, lengths = w.data["t"][i], w.data["length"][i]
                if not (
                    (t == np.arange(t[0], t[0] + 5)).all()
                    and (lengths == lengths[0]).all()
                    and t[-1] < lengths[0]
                    and (w.data["worker"][i] == w.data["worker"][i][0]).all()
                    and t[0] == w.offsets[i]
                ):
                    problems.append(f"torn window {t} {lengths}")
        except EmptyBufferError:
            pass
        if buffer.count() > buffer.capacity_episodes:
            problems.append(f"{buffer.count()} episodes stored")
    client.rpush(f"{name}:results", json.dumps([episodes, windows, problems[:5]]))


@pytest.mark.redis_server
def test_many_processes_push_and_sample_whole_episodes(redis_server, buffer_name):
    client = redis.Redis.from_url(redis_server.url)
    EpisodeBuffer(client, buffer_name, capacity_episodes=20)
    ctx = fresh_context()
    procs = [ctx.Process(target=_pusher, args=(redis_server.url, buffer_name, i, 3.0))
             for i in range(3)]
    procs += [ctx.Process(target=_sampler, args=(redis_server.url, buffer_name, i, 3.0))
              for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(240)  # spawn + imports take long on a loaded machine
        assert proc.exitcode == 0
    results = [json.loads(r) for r in client.lrange(f"{buffer_name}:results", 0, -1)]
    assert len(results) == 2
    for episodes, windows, problems in results:
        assert problems == []
        assert episodes > 0 and windows > 0
    buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=None)
    stats = buffer.stats()
    assert stats["episodes"] == 20 and stats["pushed"] - stats["evicted"] == 20
    total = sum(int(ep["length"][0]) for ep in buffer.sample(20))
    assert stats["steps"] == total == client.hlen(EpisodeKeys(buffer_name).steps)


@pytest.mark.redis_server
def test_sampling_works_on_a_server_that_refuses_writes(buffer_name):
    from redisbuf.servers.embedded import EmbeddedServer

    with EmbeddedServer() as server:  # private: its configuration changes
        client = redis.Redis.from_url(server.url)
        buffer = EpisodeBuffer(client, buffer_name, capacity_episodes=4, seed=0)
        buffer.push(episode(0, 5))
        client.config_set("maxmemory", 1)  # every write is refused from now on (noeviction)
        with pytest.raises(redis.exceptions.OutOfMemoryError):
            buffer.push(episode(1, 5))
        assert buffer.sample(1)[0]["t"].tolist() == [0, 1, 2, 3, 4]
        assert buffer.sample_windows(3, 2).data["t"].shape == (3, 2)
        assert EpisodeBuffer(client, buffer_name, capacity_episodes=4).count() == 1
        client.config_set("maxmemory", 0)
        assert buffer.stats()["sampled"] == 0  # read-only draws are not counted
