"""The cost of the rate history (lua/_history.lua) in the insert of every buffer class:
microseconds per call on a real server, the insert script as it is against the same script
with its ``record_history`` call removed (interleaved rounds, ratio in the same run).

- ReplayBuffer.add of 16 small items (lua/add.lua, via _insert.lua)
- SequenceBuffer.add_batch of 16 steps, one per environment (lua/seq_add.lua)
- EpisodeBuffer.push of a 16-step episode (lua/episode_push.lua)
- FragmentBuffer.add_fragment of one small fragment (lua/fragment_add.lua)

    .venv/bin/python benchmarks/bench_history.py [--calls N] [--rounds R]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import redis
from _report import record

from redisbuf import ReplayBuffer
from redisbuf.buffers.episodes import EpisodeBuffer
from redisbuf.buffers.fragments import FragmentBuffer
from redisbuf.buffers.sequence import SequenceBuffer
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import scripts


@dataclass(frozen=True)
class Case:
    figure: str  # the row recorded for run_all.py
    script: str  # the insert script
    call: str  # its record_history line, removed for the baseline
    make: Callable[[redis.Redis, str], Callable[[], object]]  # buffer -> one insert


def _plain(client: redis.Redis, name: str) -> Callable[[], object]:
    buffer = ReplayBuffer(client, name, capacity=1000)
    batch = {"x": np.arange(16), "log_rewards": np.zeros(16)}
    return lambda: buffer.add(batch)


def _sequence(client: redis.Redis, name: str) -> Callable[[], object]:
    buffer = SequenceBuffer(client, name, num_environments=16, max_length=64)
    batch = {"x": np.arange(16)}
    return lambda: buffer.add_batch(batch)


def _episodes(client: redis.Redis, name: str) -> Callable[[], object]:
    buffer = EpisodeBuffer(client, name, capacity_episodes=100)
    episode = {"x": np.arange(16)}
    return lambda: buffer.push(episode)


def _fragments(client: redis.Redis, name: str) -> Callable[[], object]:
    buffer = FragmentBuffer(client, name, max_chunks=100, fragments_per_chunk=4,
                            max_staleness=10, max_reuse=4)
    buffer.update_model_version("s", 0)  # fragments of session "s" are kept
    return lambda: buffer.add_fragment(b"0123456789abcdef", 0, "s", "w")


CASES = [
    Case("add(16 small items) with the rate history", "add",
         "\n  record_history(meta)\n", _plain),
    Case("sequence add_batch(16 steps) with the rate history", "seq_add",
         "\nrecord_history(K.meta, {'added', 'evicted', 'sampled'})\n", _sequence),
    Case("episode push(16 steps) with the rate history", "episode_push",
         "\nrecord_history(meta, {'pushed', 'evicted', 'sampled'})\n", _episodes),
    Case("add_fragment(1 small) with the rate history", "fragment_add",
         "\nrecord_history(F.meta, {'chunks_added', 'chunks_evicted', 'fetched'})\n",
         _fragments),
]


def main(rounds: int = 3, calls: int = 1000) -> None:
    original_load = scripts.load
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)
        for case in CASES:
            full = original_load(case.script)
            assert case.call in full._expanded, f"{case.script} lost its record_history call"
            bare = scripts.Script(case.script, full._expanded.replace(case.call, "\n", 1))

            def run(name: str, script: scripts.Script, case: Case = case) -> float:
                scripts.load = lambda n: script if n == case.script else original_load(n)
                try:
                    insert = case.make(client, name)
                    insert()  # the first insert fixes the schema
                    start = time.perf_counter()
                    for _ in range(calls):
                        insert()
                    return (time.perf_counter() - start) / calls * 1e6
                finally:
                    scripts.load = original_load

            pairs = []
            for i in range(rounds):
                with_history = run(f"{case.script}-h{i}", full)
                without = run(f"{case.script}-n{i}", bare)
                print(
                    f"{case.script} round {i}: with history {with_history:.0f} us, without "
                    f"{without:.0f} us, ratio {with_history / without:.3f}"
                )
                pairs.append((with_history, without, with_history / without))
            ours, bare_us, ratios = zip(*pairs, strict=True)
            record(case.figure, statistics.median(ours), "us",
                   baseline=statistics.median(bare_us), baseline_name="without it",
                   ratio=statistics.median(ratios),
                   spread=f"{min(ratios):.3f}-{max(ratios):.3f}")
            print(f"{case.script}: median ratio {statistics.median(ratios):.3f} "
                  f"(rounds {min(ratios):.3f}-{max(ratios):.3f})")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=1000, help="inserts per measurement")
    options = parser.parse_args()
    main(options.rounds, options.calls)
