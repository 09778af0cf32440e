"""The rate history (lua/_history.lua) written by the insert scripts of every buffer class:
ReplayBuffer.add, SequenceBuffer.add_batch, EpisodeBuffer.push, FragmentBuffer.add_fragment.

Unit tests on fakeredis with a controlled server clock: fakeredis answers TIME (also inside
Lua) from its server_mixin module's ``time.time()``, which the ``clock`` fixture replaces.
"""

from __future__ import annotations

from types import SimpleNamespace

import fakeredis.commands_mixins.server_mixin as server_mixin
import numpy as np
import pytest

from redisbuf import ReplayBuffer
from redisbuf.buffers.episodes import EpisodeBuffer
from redisbuf.buffers.fragments import FragmentBuffer
from redisbuf.buffers.sequence import SequenceBuffer
from redisbuf.errors import InvalidBatchError, SchemaError
from redisbuf.ops.metrics import HIST_SLOTS, HIST_STEP, every_buffer, history_rates, snapshot


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    fake = Clock(1_000_000.25)
    monkeypatch.setattr(server_mixin, "time", SimpleNamespace(time=fake.time))
    return fake


def hist_fields(client, meta_key: str) -> dict[str, str]:
    meta = {k.decode(): v.decode() for k, v in client.hgetall(meta_key).items()}
    return {k: v for k, v in meta.items() if k.startswith("hist:") or k == "last_insert"}


def entry(now: float, inserted: int, evicted: int, sampled: int) -> tuple[str, str]:
    bucket = int(now) // HIST_STEP
    return f"hist:{bucket % HIST_SLOTS}", f"{bucket} {inserted} {evicted} {sampled}"


def stamp(now: float) -> str:
    return f"{int(now)}.{round((now % 1) * 1000):03d}"


def test_plain_add_history_is_the_reference(fake_client, clock):
    """The plain add's fields, under the same clock the other classes are checked with."""
    buf = ReplayBuffer(fake_client, "plain", capacity=3)
    buf.add({"x": np.arange(2), "log_rewards": np.zeros(2)})
    assert hist_fields(fake_client, "rb:{plain}:meta") == dict(
        [entry(clock.now, 2, 0, 0), ("last_insert", stamp(clock.now))]
    )


def test_sequence_add_records_steps(fake_client, clock):
    seq = SequenceBuffer(fake_client, "s", num_environments=2, max_length=3)
    meta = "rb:{s}:seq:meta"
    t0 = clock.now
    seq.add_batch({"x": np.arange(2)})
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 2, 0, 0), ("last_insert", stamp(t0))]
    )
    # same bucket: the entry is overwritten with the newer counters
    clock.now = t0 + 3.5
    for _ in range(3):
        seq.add_batch({"x": np.arange(2)})  # 8 steps into 2 x 3: 2 evicted
    seq.get_batch(2, 2)  # 2 windows of 2 steps: 4 steps sampled
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 8, 2, 0), ("last_insert", stamp(clock.now))]
    )
    # the sampling script writes no history; the next bucket's add shows the sampling
    before = hist_fields(fake_client, meta)
    seq.get_batch(1, 3)
    assert hist_fields(fake_client, meta) == before
    clock.now = t0 + HIST_STEP
    seq.add_batch({"x": np.arange(1)}, env_ids=[1])
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 8, 2, 0), entry(clock.now, 9, 3, 7), ("last_insert", stamp(clock.now))]
    )
    snap = snapshot(fake_client, "s", buffer_class="sequence")
    assert snap is not None and snap.unit == "steps"
    assert (snap.length, snap.capacity, snap.inserted, snap.evicted, snap.sampled) == (
        6, 6, 9, 3, 7
    )
    [rate] = history_rates(snap.history)
    assert (rate.inserted, rate.evicted, rate.sampled) == (0.1, 0.1, 0.7)


def test_rejected_sequence_add_writes_no_history(fake_client, clock):
    seq = SequenceBuffer(fake_client, "s", num_environments=1, max_length=4)
    seq.add_batch({"x": np.arange(1)})
    before = fake_client.hgetall("rb:{s}:seq:meta")
    clock.now += HIST_STEP
    with pytest.raises(SchemaError):
        seq.add_batch({"x": np.ones(1, dtype=np.float32)})
    assert fake_client.hgetall("rb:{s}:seq:meta") == before


def test_episode_push_records_episodes(fake_client, clock):
    eps = EpisodeBuffer(fake_client, "e", capacity_episodes=2)
    meta = "rb:{e}:episodes:meta"
    t0 = clock.now
    for length in (3, 1, 2):
        eps.push({"x": np.arange(length)})
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 3, 1, 0), ("last_insert", stamp(t0))]
    )
    eps.sample_episodes(2)
    eps.sample_windows(3, 1)  # 2 + 3 draws
    clock.now = t0 + 2 * HIST_STEP + 0.007
    eps.push({"x": np.arange(4)})
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 3, 1, 0), entry(clock.now, 4, 2, 5), ("last_insert", stamp(clock.now))]
    )
    before = fake_client.hgetall(meta)
    clock.now += HIST_STEP
    with pytest.raises(SchemaError):
        eps.push({"y": np.arange(2)})
    with pytest.raises(InvalidBatchError):
        eps.push({"x": np.arange(0)})
    assert fake_client.hgetall(meta) == before
    snap = snapshot(fake_client, "e", buffer_class="episodes")
    assert snap is not None and snap.unit == "episodes"
    assert (snap.length, snap.capacity, snap.inserted, snap.evicted, snap.sampled) == (
        2, 2, 4, 2, 5
    )
    [rate] = history_rates(snap.history)
    assert (rate.inserted, rate.evicted, rate.sampled) == (0.05, 0.05, 0.25)


def test_fragment_add_records_chunks_on_every_add(fake_client, clock):
    frags = FragmentBuffer(fake_client, "f", max_chunks=1, fragments_per_chunk=2,
                           max_staleness=0, max_reuse=5)
    meta = "rb:{f}:fragments:meta"
    frags.update_model_version("run", 0)
    t0 = clock.now
    frags.add_fragment(b"a", 0, "run", "w")  # pending, no chunk yet: still an entry
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 0, 0, 0), ("last_insert", stamp(t0))]
    )
    for blob in (b"b", b"c", b"d"):  # two chunks, the second evicts the first
        frags.add_fragment(blob, 0, "run", "w")
    frags.fetch(1)
    clock.now = t0 + HIST_STEP
    frags.add_fragment(b"e", 0, "run", "w")
    assert hist_fields(fake_client, meta) == dict(
        [entry(t0, 2, 1, 0), entry(clock.now, 2, 1, 1), ("last_insert", stamp(clock.now))]
    )
    snap = snapshot(fake_client, "f", buffer_class="fragments")
    assert snap is not None and snap.unit == "chunks"
    assert (snap.length, snap.capacity, snap.inserted, snap.evicted, snap.sampled) == (
        1, 1, 2, 1, 1
    )


def test_history_ring_reuses_slots_an_hour_apart(fake_client, clock):
    eps = EpisodeBuffer(fake_client, "e", capacity_episodes=5)
    t0 = clock.now
    eps.push([1])
    clock.now = t0 + HIST_SLOTS * HIST_STEP  # one hour later: the same slot
    eps.push([2])
    assert hist_fields(fake_client, "rb:{e}:episodes:meta") == dict(
        [entry(clock.now, 2, 0, 0), ("last_insert", stamp(clock.now))]
    )


def test_snapshot_of_a_missing_class_is_none(fake_client):
    assert snapshot(fake_client, "nothing", buffer_class="sequence") is None
    with pytest.raises(ValueError, match="unknown buffer class"):
        snapshot(fake_client, "nothing", buffer_class="nope")


def test_every_buffer_finds_each_class_once_per_name(fake_client):
    ReplayBuffer(fake_client, "a", capacity=2)
    SequenceBuffer(fake_client, "a", num_environments=1, max_length=2)
    EpisodeBuffer(fake_client, "b", capacity_episodes=2)
    FragmentBuffer(fake_client, "c", max_chunks=1, fragments_per_chunk=1, max_staleness=0,
                   max_reuse=1)
    fake_client.hset("rb:{d}:staging:x:meta", "capacity", 1)  # a restore's, not a buffer
    fake_client.hset("rb:{e}:items", "1", b"")
    assert every_buffer(fake_client) == [
        ("a", "buffer"), ("a", "sequence"), ("b", "episodes"), ("c", "fragments")
    ]


@pytest.mark.redis_server
def test_sequence_sampling_counts_steps_yet_works_on_a_server_refusing_writes(buffer_name):
    """seq_sample now writes its "sampled" counter; the read-only variant (full server)
    still draws, and counts nothing."""
    import redis

    from redisbuf.servers.embedded import EmbeddedServer

    with EmbeddedServer() as server:  # private: its configuration changes
        client = redis.Redis.from_url(server.url)
        seq = SequenceBuffer(client, buffer_name, num_environments=2, max_length=8, seed=0)
        for _ in range(4):
            seq.add_batch({"x": np.arange(2)})
        seq.get_batch(3, 2)
        meta = seq.keys.meta
        assert client.hget(meta, "sampled") == b"6"
        client.config_set("maxmemory", 1)  # every write is refused from now on (noeviction)
        try:
            before = client.hgetall(meta)
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                seq.add_batch({"x": np.arange(2)})
            data, _ = seq.get_batch(2, 3)
            assert data["x"].shape == (2, 3)
            assert client.hgetall(meta) == before
        finally:
            client.config_set("maxmemory", 0)
