"""``redisbuf inspect``'s report and the Prometheus collector for every buffer class
(ReplayBuffer, SequenceBuffer, EpisodeBuffer, FragmentBuffer), on fakeredis; the command
line itself on a real server is in tests/test_cli_ops.py."""

from __future__ import annotations

import numpy as np
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from redisbuf import ReplayBuffer
from redisbuf.buffers.episodes import EpisodeBuffer
from redisbuf.buffers.fragments import FragmentBuffer
from redisbuf.buffers.sequence import SequenceBuffer
from redisbuf.cli._common import CommandError, resolve_class
from redisbuf.cli.inspect import class_report
from redisbuf.ops.metrics import LAYOUTS, BufferCollector, class_keys


def _sequence(client: redis.Redis, name: str) -> SequenceBuffer:
    seq = SequenceBuffer(client, name, num_environments=2, max_length=3, gamma=0.5)
    for _ in range(4):
        seq.add_batch({"x": np.arange(2, dtype=np.float32)})  # 8 steps into 2 x 3: 2 evicted
    seq.get_batch(2, 2)  # 2 windows of 2 steps: 4 sampled
    return seq


def _episodes(client: redis.Redis, name: str) -> EpisodeBuffer:
    episodes = EpisodeBuffer(client, name, capacity_episodes=2)
    for length in (1, 2, 3):
        episodes.push([{"o": float(t)} for t in range(length)])  # the first is evicted
    return episodes


def _fragments(client: redis.Redis, name: str) -> FragmentBuffer:
    fragments = FragmentBuffer(client, name, max_chunks=2, fragments_per_chunk=1,
                               max_staleness=5, max_reuse=4)
    fragments.update_model_version("s1", 3)
    for _ in range(3):
        fragments.add_fragment({"o": np.zeros(2)}, 3, "s1", "w0")  # 3 chunks, 1 evicted
    fragments.fetch(1)
    return fragments


def test_every_class_describes_each_of_its_keys():
    for buffer_class in LAYOUTS:
        keys = class_keys(buffer_class, "k")
        described = keys.describe()
        assert keys.meta in described
        assert set(described) <= set(keys.all_keys())
        if buffer_class != "buffer":  # the ReplayBuffer's shard layout key is apart
            assert list(described) == keys.all_keys()
        assert all(text.split(":")[0] in ("hash", "zset", "list") for text in described.values())
    with pytest.raises(ValueError, match="unknown buffer class 'nope'"):
        class_keys("nope", "k")


def test_sequence_report(fake_client):
    _sequence(fake_client, "s")
    report = class_report(fake_client, "s", "sequence")
    assert (report["buffer_class"], report["unit"]) == ("sequence", "steps")
    assert (report["length"], report["capacity"]) == (6, 6)
    assert report["counters"] == {"inserted": 8, "evicted": 2, "sampled": 4}
    assert report["counter_fields"] == {"inserted": "added", "evicted": "evicted",
                                        "sampled": "sampled"}
    config = report["configuration"]
    assert list(config)[:2] == ["num_environments", "max_length"]
    assert (config["num_environments"], config["max_length"], config["gamma"]) == (2, 3, 0.5)
    assert report["schema"] == {"x": {"dtype": "float32", "lib": "numpy", "shape": []}}
    keys = report["keys"]
    assert list(keys) == class_keys("sequence", "s").all_keys()
    assert keys["rb:{s}:seq:steps"]["exists"]
    # not prioritized: no step priorities and no mass log
    assert not keys["rb:{s}:seq:prio"]["exists"] and not keys["rb:{s}:seq:masslog"]["exists"]
    assert "top" not in report and "prioritized_sampling_ready" not in report


def test_episode_and_fragment_reports(fake_client):
    _episodes(fake_client, "e")
    report = class_report(fake_client, "e", "episodes")
    assert (report["unit"], report["length"], report["capacity"]) == ("episodes", 2, 2)
    assert report["configuration"] == {"capacity_episodes": 2}
    # 5 steps live (2 + 3), ids 1..3 given
    assert report["counters"] == {"inserted": 3, "evicted": 1, "sampled": 0, "steps": 5,
                                  "last_id": 3}
    assert report["counter_fields"]["inserted"] == "pushed"
    assert report["created_at"] is not None
    assert all(info["exists"] for info in report["keys"].values())

    _fragments(fake_client, "f")
    report = class_report(fake_client, "f", "fragments")
    assert (report["unit"], report["length"], report["capacity"]) == ("chunks", 2, 2)
    assert report["configuration"] == {"max_chunks": 2, "fragments_per_chunk": 1,
                                       "max_staleness": 5, "max_reuse": 4}
    counters = report["counters"]
    assert (counters["inserted"], counters["evicted"], counters["sampled"]) == (3, 1, 1)
    assert (counters["fragments_added"], counters["version"], counters["session"]) == (
        3, 3, "s1")
    assert report["counter_fields"] == {"inserted": "chunks_added",
                                        "evicted": "chunks_evicted", "sampled": "fetched"}


def test_a_name_of_several_classes_needs_class(fake_client):
    _sequence(fake_client, "both")
    _episodes(fake_client, "both")
    with pytest.raises(CommandError, match="classes sequence, episodes.*--class"):
        resolve_class(fake_client, "both", "redis://x", None)
    assert resolve_class(fake_client, "both", "redis://x", "episodes") == "episodes"
    with pytest.raises(CommandError, match="no fragments buffer named 'both'"):
        resolve_class(fake_client, "both", "redis://x", "fragments")


def _collect(client: redis.Redis, *names: str) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BufferCollector(client, names))
    values = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            key = (sample.name, sample.labels.get("buffer", ""), sample.labels.get("class", ""))
            assert key not in values, f"two series {key}"
            values[key] = sample.value
    return values


def test_collector_exports_every_class_with_a_class_label(fake_client):
    plain = ReplayBuffer(fake_client, "same", capacity=4)
    plain.add({"x": np.arange(6), "log_rewards": np.zeros(6)})
    _sequence(fake_client, "same")
    _episodes(fake_client, "same")
    _fragments(fake_client, "frag")
    values = _collect(fake_client)
    assert values[("redisbuf_up", "", "")] == 1
    expected = {  # (length, capacity, inserted, evicted, sampled) in each class's unit
        ("same", "buffer"): (4, 4, 6, 2, 0),
        ("same", "sequence"): (6, 6, 8, 2, 4),
        ("same", "episodes"): (2, 2, 3, 1, 0),
        ("frag", "fragments"): (2, 2, 3, 1, 1),
    }
    for (name, buffer_class), numbers in expected.items():
        got = tuple(
            values[(f"redisbuf_{metric}", name, buffer_class)]
            for metric in ("length", "capacity", "inserted_total", "evicted_total",
                           "sampled_total")
        )
        assert got == numbers, (name, buffer_class)
    series = {(b, c) for (_, b, c) in values if b}
    assert series == set(expected)
    # a name given: every class of that name, and only those
    named = _collect(fake_client, "same")
    assert {(b, c) for (_, b, c) in named if b} == {
        ("same", "buffer"), ("same", "sequence"), ("same", "episodes")}
    assert {(b, c) for (_, b, c) in _collect(fake_client, "frag", "nope") if b} == {
        ("frag", "fragments")}
