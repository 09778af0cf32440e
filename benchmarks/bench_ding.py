"""redisbuf.ding's DequeBuffer beside DI-engine's own (in-process) on the same data and the
same calls, and redisbuf.ding's rate with a collector and a learner in two processes.

Usage (needs DI-engine 0.5.3 for the baseline, e.g. a venv with ``pip install
DI-engine==0.5.3`` and redisbuf; redisbuf does not require it, and without it the
script says so and measures nothing)::

    python benchmarks/bench_ding.py [--url URL] [--seconds 2] [--rounds 3]

Without --url an embedded server is started. The data are DI-engine's DQN transitions on
CartPole (``treetensor.torch.Tensor``: obs, next_obs, logit, action, reward, done,
collect_train_iter, env_data_id). Each buffer is a ``DequeBuffer(size=20000)`` with
``PriorityExperienceReplay`` (``ding/example/dqn_per.py``), filled with 2,000 items first;
timed for ``--seconds`` each, both buffers alternating within every round:

- push: ``push(t)`` one transition at a time (``data_pusher``), items/s;
- sample: ``sample(64)``, items/s;
- update: ``update(index, None, meta)`` of each sampled item (``OffPolicyLearner``'s
  priority write-back), items/s;
- train step: one ``sample(64)`` and its 64 updates, steps/s.

The ratio printed is the median over rounds of redisbuf / DI-engine. Then ``two
processes``: a collector pushing and a learner doing train steps on one redisbuf.ding
buffer at the same time, for ``--seconds`` (times 3), beside one DI-engine process doing
both in turn (8 pushes per train step, the example's ``n_sample``), as the sum of the
items pushed and sampled per second. The figures go to
``benchmarks/results/bench_ding.json`` (``_report.record``: commit, date, load, machine).
"""

from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _report import load_average, record  # noqa: E402

SIZE = 20_000
FILL = 2_000
BATCH = 64
PUSHES_PER_STEP = 8


HAVE_DING = importlib.util.find_spec("ding") is not None


def transition(i: int) -> Any:
    """One DQN transition: a treetensor tree where treetensor is installed (with
    DI-engine), else the same fields as a dict of tensors."""
    import torch

    g = torch.Generator().manual_seed(i)
    fields = {
        "obs": torch.randn(4, generator=g), "next_obs": torch.randn(4, generator=g),
        "logit": torch.randn(2, generator=g), "action": torch.tensor([i % 2]),
        "reward": torch.tensor([1.0]), "done": torch.tensor(False),
        "collect_train_iter": torch.tensor([0]), "env_data_id": torch.tensor([i % 8]),
    }
    if importlib.util.find_spec("treetensor") is None:
        return fields
    import treetensor.torch as ttorch

    return ttorch.as_tensor(fields)


def make(kind: str, url: str) -> Any:
    if kind == "ding":
        from ding.data import DequeBuffer
        from ding.data.buffer.middleware import PriorityExperienceReplay

        buffer = DequeBuffer(size=SIZE)
    else:
        from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

        buffer = DequeBuffer(size=SIZE, url=url, name=f"bench-ding-{uuid.uuid4().hex[:8]}")
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=True))
    for i in range(FILL):
        buffer.push(transition(i))
    return buffer


def train_step(buffer: Any) -> int:
    batch = buffer.sample(BATCH)
    for item in batch:
        item.meta["priority"] = 1.5
        buffer.update(index=item.index, data=None, meta=item.meta)
    return len(batch)


def timed(fn: Callable[[], int], seconds: float) -> float:
    done, start = 0, time.perf_counter()
    while done < 3 or time.perf_counter() - start < seconds:
        done += fn()
    return done / (time.perf_counter() - start)


def operations(buffer: Any, data: list[Any]) -> dict[str, Callable[[], int]]:
    position = [0]

    def push() -> int:
        buffer.push(data[position[0] % len(data)])
        position[0] += 1
        return 1

    def sample() -> int:
        return len(buffer.sample(BATCH))

    drawn = buffer.sample(BATCH)

    def update() -> int:
        for item in drawn:
            item.meta["priority"] = 2.0
            buffer.update(index=item.index, data=None, meta=item.meta)
        return len(drawn)

    def step() -> int:
        train_step(buffer)
        return 1

    return {"push": push, "sample": sample, "update": update, "train step": step}


def _collector(url: str, name: str, seconds: float, results: Any) -> None:
    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

    buffer = DequeBuffer(size=SIZE, url=url, name=name)
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=True))
    data = [transition(i) for i in range(256)]
    pushed, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        buffer.push(data[pushed % len(data)])
        pushed += 1
    results.put(("pushed", pushed / (time.perf_counter() - start)))


def _learner(url: str, name: str, seconds: float, results: Any) -> None:
    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

    buffer = DequeBuffer(size=SIZE, url=url, name=name)
    buffer.use(PriorityExperienceReplay(buffer, IS_weight=True))
    sampled, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sampled += train_step(buffer)
    results.put(("sampled", sampled / (time.perf_counter() - start)))


def two_processes(url: str, seconds: float) -> tuple[float, float]:
    name = f"bench-ding-mp-{uuid.uuid4().hex[:8]}"
    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

    shared = DequeBuffer(size=SIZE, url=url, name=name)
    shared.use(PriorityExperienceReplay(shared, IS_weight=True))
    for i in range(FILL):
        shared.push(transition(i))
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, name, seconds, results))
             for target in (_collector, _learner)]
    for proc in procs:
        proc.start()
    rates = dict(results.get(timeout=seconds + 300) for _ in procs)
    for proc in procs:
        proc.join(timeout=60)
    return rates["pushed"], rates["sampled"]


def one_process_interleaved(seconds: float) -> tuple[float, float]:
    """DI-engine alone: push PUSHES_PER_STEP transitions, then a train step, in turn."""
    buffer = make("ding", "")
    data = [transition(i) for i in range(256)]
    pushed = sampled = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _ in range(PUSHES_PER_STEP):
            buffer.push(data[pushed % len(data)])
            pushed += 1
        sampled += train_step(buffer)
    elapsed = time.perf_counter() - start
    return pushed / elapsed, sampled / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        from redisbuf.servers.embedded import EmbeddedServer

        server = EmbeddedServer().start()
        url = server.url
    load_before = load_average()
    if not HAVE_DING:
        print("DI-engine is not installed: no baseline to compare with (pip install "
              "DI-engine==0.5.3 in a venv of its own)")
        return
    data = [transition(i) for i in range(256)]
    buffers = {kind: make(kind, url) for kind in ("ding", "redisbuf")}
    ops = {kind: operations(buffer, data) for kind, buffer in buffers.items()}
    rates: dict[str, dict[str, list[float]]] = {op: {"ding": [], "redisbuf": []}
                                               for op in ops["ding"]}
    for round_ in range(args.rounds):
        order = ("ding", "redisbuf") if round_ % 2 == 0 else ("redisbuf", "ding")
        for op in rates:
            for kind in order:
                rates[op][kind].append(timed(ops[kind][op], args.seconds))
    rows = []
    for op, by_kind in rates.items():
        ratios = [r / d for r, d in zip(by_kind["redisbuf"], by_kind["ding"], strict=True)]
        unit = "steps/s" if op == "train step" else "items/s"
        rows.append({"figure": op, "unit": unit, "key": op.replace(" ", "-"),
                     "ding": statistics.median(by_kind["ding"]),
                     "redisbuf": statistics.median(by_kind["redisbuf"]),
                     "ratio": statistics.median(ratios)})
    pushed, sampled = two_processes(url, 3 * args.seconds)
    ding_pushed, ding_sampled = one_process_interleaved(3 * args.seconds)
    rows.append({"figure": "two processes: pushed + sampled", "unit": "items/s",
                 "key": "two-processes",
                 "ding": ding_pushed + ding_sampled, "redisbuf": pushed + sampled,
                 "ratio": (pushed + sampled) / (ding_pushed + ding_sampled)})
    rows.append({"figure": "two processes: pushed", "unit": "items/s", "key": "two-pushed",
                 "ding": ding_pushed, "redisbuf": pushed, "ratio": pushed / ding_pushed})
    rows.append({"figure": "two processes: sampled", "unit": "items/s", "key": "two-sampled",
                 "ding": ding_sampled, "redisbuf": sampled, "ratio": sampled / ding_sampled})
    load = f"{load_before} -> {load_average()}"
    print(f"{'figure':34} {'DI-engine':>12} {'redisbuf.ding':>14} {'ratio':>8}")
    for row in rows:
        print(f"{row['figure']:34} {row['ding']:12.0f} {row['redisbuf']:14.0f} "
              f"{row['ratio']:8.3f}  {row['unit']}")
        record(row["figure"], row["redisbuf"], row["unit"], baseline=row["ding"],
               baseline_name="DI-engine DequeBuffer", ratio=row["ratio"], key=row["key"])
    print(f"load average {load}")
    if server is not None:
        server.stop()


if __name__ == "__main__":
    main()
