"""Cost of a diverse add at capacity 10^4 next to a plain prioritized-capacity add of the
same batch, measured in one run.

Usage: python benchmarks/bench_diverse.py [--url URL] [--rounds 5] [--adds 20]

Without --url an embedded server is started. Both buffers are filled to capacity with
distinct terminating states (HyperGrid-like: ndim 4, height 32, int64) first. Each round
adds ``--adds`` fresh batches of B states to each buffer, back to back, the order
alternating per round; figures are medians over rounds.

* plain: ``ReplayBuffer(prioritized_capacity=True).add`` (encode, one Lua insert with
  reward eviction).
* cutoff 0: ``NormBasedDiversePrioritizedReplayBuffer(cutoff_distance=0.0).add`` (torchgfn's
  default) of the same batches: log-rewards above the stored minimum and states new to the
  buffer, so every item is checked against the whole batch and all 10^4 stored vectors
  (the worst case); at cutoff 0 that is an equality test (a set of vector texts in Lua).
* cutoff 0.5, p=2: the numeric path (p-norm against every stored vector, the same items
  kept since the states are integers): the worst case of a positive cutoff.
* cutoff < 0: the same class with the distance test off (reward filter only).
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid

import numpy as np
from _report import record

from redisbuf import NormBasedDiversePrioritizedReplayBuffer, ReplayBuffer, States, connect
from redisbuf.servers.embedded import EmbeddedServer

CAPACITY = 10_000
NDIM, HEIGHT = 4, 32


def distinct_states(rng: np.random.Generator, n: int, taken: set[tuple[int, ...]]) -> np.ndarray:
    out = []
    while len(out) < n:
        state = tuple(rng.integers(0, HEIGHT, NDIM).tolist())
        if state not in taken:
            taken.add(state)
            out.append(state)
    return np.array(out, dtype=np.int64)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--adds", type=int, default=20, help="batches per buffer per round")
    parser.add_argument("--batch", type=int, nargs="+", default=[16, 64])
    args = parser.parse_args()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    client = connect(url)
    try:
        print(f"capacity {CAPACITY}, states ndim {NDIM} height {HEIGHT}; medians of "
              f"{args.rounds} rounds of {args.adds} adds")
        configs = [("cutoff 0", 0.0, 1.0), ("cutoff 0.5 p=2", 0.5, 2.0), ("cutoff<0", -1.0, 1.0)]
        print(f"{'B':>4} {'plain ms/add':>13} " + " ".join(
            f"{label + ' ms/add':>22} {'ratio':>6}" for label, _, _ in configs))
        for batch in args.batch:
            rng = np.random.default_rng(batch)
            tag = uuid.uuid4().hex[:8]
            taken: set[tuple[int, ...]] = set()
            fill = States(distinct_states(rng, CAPACITY, taken), log_rewards=np.zeros(CAPACITY))
            buffers: dict[str, ReplayBuffer] = {"plain": ReplayBuffer(
                client, f"bd-plain-{tag}", capacity=CAPACITY, prioritized_capacity=True)}
            for index, (label, cutoff, p) in enumerate(configs):
                buffers[label] = NormBasedDiversePrioritizedReplayBuffer(
                    client, f"bd-{index}-{tag}", capacity=CAPACITY, cutoff_distance=cutoff,
                    p_norm_distance=p,
                )
            for buffer in buffers.values():
                buffer.add(fill)
            times: dict[str, list[float]] = {key: [] for key in buffers}
            for round_ in range(args.rounds):
                batches = [
                    States(distinct_states(rng, batch, taken),
                           log_rewards=1.0 + round_ + rng.random(batch))
                    for _ in range(args.adds)
                ]
                order = list(buffers.items())
                if round_ % 2:
                    order.reverse()
                for key, buffer in order:
                    start = time.perf_counter()
                    for item in batches:
                        result = buffer.add(item)
                        assert len(result.ids) == batch, "the worst case keeps every item"
                    times[key].append((time.perf_counter() - start) / args.adds * 1000)
            cells = []
            for label, _, _ in configs:
                ratio = statistics.median(
                    d / p for d, p in zip(times[label], times["plain"], strict=True))
                cells.append(f"{statistics.median(times[label]):>22.2f} {ratio:>6.1f}")
                record(f"diverse add, {label}, B={batch}", statistics.median(times[label]),
                       "ms", baseline=statistics.median(times["plain"]),
                       baseline_name="plain add", ratio=ratio)
            print(f"{batch:>4} {statistics.median(times['plain']):>13.2f} " + " ".join(cells))
            for buffer in buffers.values():
                buffer.drop()
    finally:
        client.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
