"""FragmentBuffer against an in-memory port of MineStudio's ReplayBufferActor; reference
counts, waiting without polling, bad input, and many processes on a real server."""

from __future__ import annotations

import json
import math
import threading
import time
from collections import defaultdict

import numpy as np
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from process_helpers import fresh_context

from redisbuf.buffers.fragments import FragmentBuffer, FragmentKeys
from redisbuf.errors import ConfigMismatchError, FetchTimeoutError, InvalidBatchError


class Model:
    """MineStudio's ReplayBufferActor, minus Ray and the fragment store, with ids made
    the way FragmentBuffer makes them."""

    def __init__(self, max_chunks, per_chunk, max_staleness, max_reuse):
        self.max_chunks, self.per_chunk = max_chunks, per_chunk
        self.max_staleness, self.max_reuse = max_staleness, max_reuse
        self.version, self.session = -1, ""
        self.chunks: dict[int, dict] = {}  # insertion-ordered: oldest first
        self.pending: dict[str, list[int]] = {}
        self.info: dict[int, tuple] = {}  # fragment id -> (stream, index, version, session)
        self.next_index: dict[str, int] = defaultdict(int)
        self.last_fragment = self.last_chunk = 0
        self.reuse = [0.0, 0]
        self.staleness = [0.0, 0]

    def _metric(self, metric, value):
        metric[0] += value * self.per_chunk
        metric[1] += self.per_chunk

    def _fresh(self, version, session):
        return self.version - version <= self.max_staleness and self.session == session

    def add(self, version, session, stream):
        self.last_fragment += 1
        fid = self.last_fragment
        index = self.next_index[stream]
        self.next_index[stream] += 1
        self.info[fid] = (stream, index, version, session)
        queue = self.pending.setdefault(stream, [])
        queue.append(fid)
        discarded = 0
        while queue and not self._fresh(*self.info[queue[0]][2:]):
            self._metric(self.reuse, 0)
            queue.pop(0)
            discarded += 1
        chunk, evicted = None, 0
        if not queue:
            del self.pending[stream]
        elif len(queue) >= self.per_chunk:
            del self.pending[stream]
            while len(self.chunks) >= self.max_chunks:
                oldest = next(iter(self.chunks))
                self._metric(self.reuse, self.chunks.pop(oldest)["uses"])
                evicted += 1
            self.last_chunk += 1
            chunk = self.last_chunk
            _, _, v, s = self.info[queue[0]]
            self.chunks[chunk] = {"stream": stream, "version": v, "session": s, "uses": 0,
                                  "fragments": queue}
        return fid, index, chunk, evicted, discarded

    def update(self, session, version):
        changed = session != self.session
        self.session, self.version = session, version
        dropped = [c for c, info in self.chunks.items()
                   if changed or info["version"] < version - self.max_staleness]
        for c in dropped:
            self._metric(self.reuse, self.chunks.pop(c)["uses"])
        return len(dropped)

    def fetched(self, chunk_ids):
        for c in chunk_ids:
            info = self.chunks[c]
            info["uses"] += 1
            if info["uses"] >= self.max_reuse:
                self._metric(self.reuse, info["uses"])
                self._metric(self.staleness, self.version - info["version"])
                del self.chunks[c]

    def live_fragments(self):
        held = [f for q in self.pending.values() for f in q]
        held += [f for c in self.chunks.values() for f in c["fragments"]]
        return held


def payload(stream: str, index: int) -> dict:
    return {"stream": stream, "index": index, "obs": np.full(3, index, dtype=np.int16)}


def mean(metric):
    return metric[0] / metric[1] if metric[1] else math.nan


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b)


def check_against(buffer, model, client, name):
    keys = FragmentKeys(name)
    stats = buffer.stats()
    assert stats["chunks"] == len(buffer) == len(model.chunks)
    assert stats["model_version"] == model.version and stats["session_id"] == model.session
    assert same(stats["avg_reuse"], mean(model.reuse))
    assert same(stats["avg_staleness"], mean(model.staleness))
    live = model.live_fragments()
    # every stored fragment is held exactly as often as its reference count says
    refs = {int(k): int(v) for k, v in client.hgetall(keys.refs).items()}
    assert refs == {f: live.count(f) for f in live}
    assert sorted(int(k) for k in client.hkeys(keys.frags)) == sorted(set(live))
    assert buffer.num_fragments() == len(set(live))


add_op = st.tuples(st.just("add"), st.sampled_from("abc"), st.integers(-1, 3),
                  st.sampled_from(["s1"] * 6 + ["s2"]))
operations = st.lists(
    st.one_of(
        add_op, add_op, add_op, add_op,
        st.tuples(st.just("update"), st.sampled_from(["s1"] * 4 + ["s2"]), st.integers(-1, 4)),
        st.tuples(st.just("fetch"), st.integers(1, 3)),
    ),
    max_size=60,
)


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(
    max_chunks=st.integers(1, 4),
    per_chunk=st.integers(1, 3),
    max_staleness=st.integers(0, 2),
    max_reuse=st.integers(1, 3),
    ops=operations,
    seed=st.integers(0, 2**16),
)
def test_matches_minestudio(client, max_chunks, per_chunk, max_staleness, max_reuse, ops, seed):
    client.delete(*FragmentKeys("model").all_keys())  # one buffer per example
    buffer = FragmentBuffer(client, "model", max_chunks, per_chunk, max_staleness, max_reuse,
                            seed=seed)
    model = Model(max_chunks, per_chunk, max_staleness, max_reuse)
    for op in [("update", "s1", 0), *ops]:
        if op[0] == "add":
            _, stream, version, session = op
            index = model.next_index[stream]
            added = buffer.add_fragment(payload(stream, index), version, session, stream)
            expected = model.add(version, session, stream)
            got = (added.fragment_id, added.index, added.chunk_id, added.evicted, added.discarded)
            assert got == expected
        elif op[0] == "update":
            assert buffer.update_model_version(op[1], op[2]) == model.update(op[1], op[2])
        else:
            n = op[1]
            if n > max_chunks:
                with pytest.raises(ValueError, match="exceeds max_chunks"):
                    buffer.fetch(n, timeout=0)
                continue
            if len(model.chunks) < n:
                with pytest.raises(FetchTimeoutError):
                    buffer.fetch(n, timeout=0)
                continue
            chunks = buffer.fetch(n, timeout=0)
            ids = [c.chunk_id for c in chunks]
            assert len(set(ids)) == n
            for chunk in chunks:
                info = model.chunks[chunk.chunk_id]
                assert chunk.fragment_ids == info["fragments"]
                assert chunk.stream_id == info["stream"]
                assert chunk.model_version == info["version"]
                assert chunk.session_id == info["session"] == model.session
                assert chunk.use_count == info["uses"] + 1
                assert chunk.staleness == model.version - info["version"]
                first = chunk.indices[0]
                assert chunk.indices == list(range(first, first + per_chunk))
                for fragment, index in zip(chunk.fragments, chunk.indices, strict=True):
                    assert fragment["stream"] == chunk.stream_id and fragment["index"] == index
                    np.testing.assert_array_equal(fragment["obs"], np.full(3, index))
            model.fetched(ids)
        check_against(buffer, model, client, "model")


def test_fragment_bytes_go_with_their_last_reference(client, buffer_name):
    buffer = FragmentBuffer(client, buffer_name, max_chunks=2, fragments_per_chunk=2,
                            max_staleness=0, max_reuse=1, seed=0)
    buffer.update_model_version("s", 0)
    for _ in range(3):
        buffer.add_fragment(b"x" * 100, 0, "s", "a")
    keys = FragmentKeys(buffer_name)
    assert buffer.num_fragments() == 3 and len(buffer) == 1
    assert client.hgetall(keys.refs) == {b"000000000001": b"1", b"000000000002": b"1",
                                         b"000000000003": b"1"}
    [chunk] = buffer.fetch(1)  # max_reuse=1: used up, its two fragments are released
    assert chunk.fragments == [b"x" * 100] * 2 and chunk.use_count == 1
    assert buffer.num_fragments() == 1 and len(buffer) == 0
    assert client.hkeys(keys.refs) == [b"000000000003"]
    buffer.update_model_version("s", 1)  # the pending fragment is now stale: dropped on arrival
    added = buffer.add_fragment(b"y", 1, "s", "a")
    assert added.discarded == 1 and added.index == 3
    assert buffer.num_fragments() == 1
    stats = buffer.stats(reset=True)
    assert stats["avg_reuse"] == pytest.approx(0.5) and stats["avg_staleness"] == 0.0
    stats = buffer.stats()
    assert math.isnan(stats["avg_reuse"]) and math.isnan(stats["avg_staleness"])
    assert stats["fragments_added"] == 4 and stats["fragments_discarded"] == 1
    assert buffer.clear() == 0 and buffer.num_fragments() == 0
    assert buffer.add_fragment(b"z", 1, "s", "a").index == 4  # stream indices keep growing


def test_session_change_discards_everything_of_the_old_session(client, buffer_name):
    buffer = FragmentBuffer(client, buffer_name, 10, 1, 5, 10, seed=0)
    buffer.update_model_version("one", 3)
    for i in range(4):
        buffer.add_fragment(i, 3, "one", f"s{i}")
    assert len(buffer) == 4
    assert buffer.add_fragment(9, 3, "two", "s9").discarded == 1  # another session
    assert buffer.update_model_version("two", 0) == 4 and len(buffer) == 0
    assert buffer.num_fragments() == 0


def snapshot(client, name):
    out = {}
    for key in FragmentKeys(name).all_keys():
        kind = client.type(key).decode()
        if kind == "hash":
            out[key] = sorted(client.hgetall(key).items())
        elif kind == "zset":
            out[key] = client.zrange(key, 0, -1, withscores=True)
        else:
            out[key] = kind
    return out


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((object(), 0, "s", "a"), "cannot be encoded"),
        ((b"x", 1.5, "s", "a"), "model_version must be an integer"),
        ((b"x", True, "s", "a"), "model_version must be an integer"),
        ((b"x", 10**13, "s", "a"), "out of range"),
        ((b"x", 0, 3, "a"), "must be str"),
        ((b"x", 0, "s", None), "must be str"),
    ],
)
def test_bad_fragments_write_nothing(client, buffer_name, args, match):
    buffer = FragmentBuffer(client, buffer_name, 3, 2, 1, 2)
    buffer.update_model_version("s", 0)
    buffer.add_fragment(b"first", 0, "s", "a")
    before = snapshot(client, buffer_name)
    with pytest.raises(InvalidBatchError, match=match):
        buffer.add_fragment(*args)
    assert snapshot(client, buffer_name) == before


def test_configuration_is_checked(client, buffer_name):
    FragmentBuffer(client, buffer_name, 3, 2, 1, 2)
    opened = FragmentBuffer(client, buffer_name)
    assert (opened.max_chunks, opened.fragments_per_chunk, opened.max_staleness,
            opened.max_reuse) == (3, 2, 1, 2)
    with pytest.raises(ConfigMismatchError, match=r"max_reuse=2 \(asked 5\)"):
        FragmentBuffer(client, buffer_name, 3, 2, 1, 5)
    with pytest.raises(ValueError, match="missing"):
        FragmentBuffer(client, buffer_name, 3)
    with pytest.raises(ConfigMismatchError, match="does not exist"):
        FragmentBuffer(client, buffer_name + "x")
    with pytest.raises(ValueError, match="max_reuse must be an integer >= 1"):
        FragmentBuffer(client, buffer_name + "y", 3, 2, 1, 0)
    with pytest.raises(ValueError, match="n_chunks"):
        opened.fetch(0)
    with pytest.raises(ValueError, match="timeout must be >= 0"):
        opened.fetch(1, timeout=-1)


@pytest.mark.redis_server
def test_fetch_sleeps_until_enough_chunks_arrive(redis_server, real_client, buffer_name):
    buffer = FragmentBuffer(real_client, buffer_name, 10, 2, 0, 5, seed=0)
    buffer.update_model_version("s", 0)
    result: dict = {}

    def learner():
        start = time.monotonic()
        learner_buffer = FragmentBuffer(redis.Redis.from_url(redis_server.url), buffer_name)
        result["chunks"] = learner_buffer.fetch(2, timeout=10)
        result["waited"] = time.monotonic() - start

    def script_calls():
        stats = real_client.info("commandstats")
        return sum(stats.get(k, {}).get("calls", 0) for k in ("cmdstat_fcall", "cmdstat_fcall_ro",
                                                             "cmdstat_evalsha", "cmdstat_eval"))

    before = script_calls()
    thread = threading.Thread(target=learner)
    thread.start()
    # its two checks (before subscribing and after) found too few chunks: on a busy
    # machine the thread may make them late
    while script_calls() < before + 2:
        time.sleep(0.05)
    time.sleep(0.3)
    calls = script_calls()
    time.sleep(1.0)
    assert script_calls() == calls  # asleep: not one fetch attempt in a second
    for i in range(3):
        buffer.add_fragment(i, 0, "s", "a")
        buffer.add_fragment(i, 0, "s", "b")
        time.sleep(0.2 if i == 0 else 0)
    thread.join(10)
    assert not thread.is_alive()
    # it returned once the chunks came (its fetch did not time out), not before: no bound
    # on how soon, which a busy machine decides
    assert result["waited"] > 1.3
    assert sorted(c.stream_id for c in result["chunks"]) == ["a", "b"]
    # one attempt per stored chunk at most, plus the first check after subscribing
    assert script_calls() - calls <= 6 + 4
    with pytest.raises(FetchTimeoutError, match="fewer than 5 chunks"):
        buffer.fetch(5, timeout=0.2)


# -- many processes on a real server -------------------------------------------------------


def _actor(url: str, name: str, worker: int, seconds: float) -> None:
    buffer = FragmentBuffer(redis.Redis.from_url(url), name)
    end = time.monotonic() + seconds
    index = 0
    while time.monotonic() < end:
        version = int(buffer.stats()["model_version"])
        buffer.add_fragment({"w": worker, "i": index, "v": version}, version, "run", f"w{worker}")
        index += 1


def _learner(url: str, name: str, worker: int, seconds: float) -> None:
    client = redis.Redis.from_url(url)
    buffer = FragmentBuffer(client, name, seed=worker)
    problems, fetched = [], 0
    end = time.monotonic() + seconds
    version = 0
    while time.monotonic() < end:
        if worker == 0:
            version += 1
            buffer.update_model_version("run", version // 20)
        try:
            chunks = buffer.fetch(2, timeout=1.0)
        except FetchTimeoutError:
            continue
        fetched += len(chunks)
        for chunk in chunks:
            w = int(chunk.stream_id[1:])
            first = chunk.indices[0]
            if chunk.indices != list(range(first, first + 3)):
                problems.append(f"indices {chunk.indices}")
            if [f["i"] for f in chunk.fragments] != chunk.indices:
                problems.append(f"fragments {chunk.fragments} at {chunk.indices}")
            if any(f["w"] != w for f in chunk.fragments):
                problems.append(f"fragments of another stream in {chunk.stream_id}")
            if not 1 <= chunk.use_count <= 2 or not 0 <= chunk.staleness <= 1:
                problems.append(f"uses {chunk.use_count} staleness {chunk.staleness}")
    client.rpush(f"{name}:results", json.dumps([fetched, problems[:5]]))


@pytest.mark.redis_server
def test_many_actors_and_learners_share_one_buffer(redis_server, buffer_name):
    client = redis.Redis.from_url(redis_server.url)
    buffer = FragmentBuffer(client, buffer_name, 16, 3, 1, 2)
    buffer.update_model_version("run", 0)
    ctx = fresh_context()
    procs = [ctx.Process(target=_actor, args=(redis_server.url, buffer_name, i, 3.0))
             for i in range(3)]
    procs += [ctx.Process(target=_learner, args=(redis_server.url, buffer_name, i, 3.0))
              for i in range(2)]
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join(240)  # spawn + imports take long on a loaded machine
        assert proc.exitcode == 0
    results = [json.loads(r) for r in client.lrange(f"{buffer_name}:results", 0, -1)]
    assert len(results) == 2
    for fetched, problems in results:
        assert problems == [] and fetched > 0
    keys = FragmentKeys(buffer_name)
    # reference counts agree with what holds the fragments, and no bytes are orphaned
    holders: list[bytes] = []
    for raw in client.hvals(keys.pending):
        holders += [f.encode() for f in json.loads(raw)]
    for raw in client.hvals(f"rb:{{{buffer_name}}}:fragments:cinfo"):
        holders += [f.encode() for f in json.loads(raw)["fragments"]]
    refs = {k: int(v) for k, v in client.hgetall(keys.refs).items()}
    assert refs == {f: holders.count(f) for f in holders}
    assert sorted(client.hkeys(keys.frags)) == sorted(set(holders))
    assert len(buffer) <= 16


def test_one_stored_chunk_wakes_every_waiting_fetch(client, buffer_name):
    # MineStudio sets the event of every request the new chunk satisfies, not just one
    buffer = FragmentBuffer(client, buffer_name, 4, 1, 0, 10, seed=0)
    buffer.update_model_version("s", 0)
    got: list = []

    def learner(seed):
        chunks = FragmentBuffer(client, buffer_name, seed=seed).fetch(1, timeout=10)
        got.append([c.chunk_id for c in chunks])

    threads = [threading.Thread(target=learner, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    time.sleep(0.5)
    assert got == []
    buffer.add_fragment(b"only", 0, "s", "a")
    for thread in threads:
        thread.join(10)
    assert got == [[1], [1], [1]]
    assert buffer.stats()["fetched"] == 3
