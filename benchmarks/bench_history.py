"""The cost of the rate history (lua/_history.lua) in ``add``: microseconds per add of 16
small items on a real server, the add script as it is against the same script with the
``record_history`` call removed (interleaved rounds, ratio in the same run).

    .venv/bin/python benchmarks/bench_history.py
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import redis
from _report import record

from redisbuf import ReplayBuffer, scripts
from redisbuf.server import EmbeddedServer

CALL = "\n  record_history(meta)\n"


def main(rounds: int = 3, adds: int = 2000) -> None:
    original_load = scripts.load
    full = original_load("add")
    assert CALL in full._expanded
    bare = scripts.Script("add", full._expanded.replace(CALL, "\n", 1))
    with EmbeddedServer() as server:
        client = redis.Redis.from_url(server.url)

        def run(name: str, script: scripts.Script) -> float:
            scripts.load = lambda n: script if n == "add" else original_load(n)
            try:
                buffer = ReplayBuffer(client, name, capacity=1000)
                batch = {"x": np.arange(16), "log_rewards": np.zeros(16)}
                buffer.add(batch)
                start = time.perf_counter()
                for _ in range(adds):
                    buffer.add(batch)
                return (time.perf_counter() - start) / adds * 1e6
            finally:
                scripts.load = original_load

        pairs = []
        for i in range(rounds):
            with_history, without = run(f"h{i}", full), run(f"n{i}", bare)
            print(
                f"round {i}: with history {with_history:.0f} us, without {without:.0f} us, "
                f"ratio {with_history / without:.3f}"
            )
            pairs.append((with_history, without, with_history / without))
        ours, bare_us, ratios = zip(*pairs, strict=True)
        record("add(16 small items) with the rate history", statistics.median(ours), "us",
               baseline=statistics.median(bare_us), baseline_name="without it",
               ratio=statistics.median(ratios), spread=f"{min(ratios):.3f}-{max(ratios):.3f}")


if __name__ == "__main__":
    main()
