"""The Ape-X DQN example end to end: frames/s with 3 actors against 1, and the learner's wait.

Usage: python benchmarks/bench_apex_example.py [--url URL] [--seconds 60] [--rounds 1]
       [--actors 3]

Without --url an embedded server is started. Each round runs the example
(``redisbuf.examples.apex_dqn.run``, CartPole-v1, buffer of 100,000, ``--target 0`` so no
run stops early) once with 1 actor and once with --actors, one after the other, each for
--seconds (process start-up included in that time, left out of frames/s, which counts from
the first add). Printed per run: env frames/s, learner steps/s, the fraction of the
learner's time its training loop waited for a sampled batch, and its buffer thread's busy
fraction. The figures: frames/s of --actors over 1 actor, median over rounds of the
per-round ratio (issue 31's target: >= 2 with 3 actors), and the learner's wait with
--actors (target: <= 20 % of its time).
"""

from __future__ import annotations

import argparse
import io
import os
import statistics

from _report import record
from rich.console import Console
from rich.table import Table

from redisbuf.examples.apex_dqn import ApexConfig, RunResult, run
from redisbuf.servers.embedded import EmbeddedServer

NAME = "bench-apex-example"


def one(url: str, actors: int, seconds: float, seed: int) -> RunResult:
    config = ApexConfig(url=url, name=NAME, actors=actors, seed=seed, minutes=seconds / 60,
                        target=0.0, capacity=100_000)
    return run(config, live=False, console=Console(file=io.StringIO()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default=None)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--actors", type=int, default=3)
    args = parser.parse_args()
    console = Console()
    server = None
    url = args.url
    if url is None:
        server = EmbeddedServer().start()
        url = server.url
    table = Table(title=f"Ape-X example, {args.seconds:g} s per run, {os.cpu_count()} CPUs, "
                  f"load {os.getloadavg()[0]:.1f} at the start")
    for column in ("round", "actors", "env frames/s", "learner steps/s", "learner waits",
                   "buffer thread busy"):
        table.add_column(column, justify="right")
    ratios, waits = [], []
    try:
        for round_ in range(args.rounds):
            results = {}
            for actors in (1, args.actors):
                result = one(url, actors, args.seconds, seed=round_)
                results[actors] = result
                table.add_row(str(round_), str(actors), f"{result.frames_per_s:,.0f}",
                              f"{result.learner_steps_per_s:.1f}",
                              f"{100 * result.learner_wait_fraction:.0f} %",
                              f"{100 * result.learner_buffer_call_fraction:.0f} %")
            ratios.append(results[args.actors].frames_per_s / results[1].frames_per_s)
            waits.append(results[args.actors].learner_wait_fraction)
    finally:
        if server is not None:
            server.stop()
    console.print(table)
    ratio = statistics.median(ratios)
    wait = statistics.median(waits)
    console.print(f"frames/s, {args.actors} actors / 1: {ratio:.2f}x (rounds: "
                  f"{', '.join(f'{r:.2f}' for r in ratios)}; target >= 2); learner waits "
                  f"{100 * wait:.0f} % of its time with {args.actors} actors (target <= 20 %); "
                  f"load {os.getloadavg()[0]:.1f} at the end")
    record(f"Ape-X example frames/s, {args.actors} actors over 1", ratio, "x", ratio=ratio,
           spread=", ".join(f"{r:.2f}" for r in ratios), target=">= 2")
    record(f"Ape-X example learner wait, {args.actors} actors", 100 * wait, "%",
           target="<= 20")


if __name__ == "__main__":
    main()
