"""TorchRL 0.14.1's StoreStorage (tensordict's TensorDictStore on Redis) through
``TensorDictReplayBuffer`` (its default writer and ``RandomSampler``), on an embedded
server, in the project's venv (torch 2.13, where TorchRL's C++ PrioritizedSampler does not
load: the "prioritized" figures are drawn uniformly and say so in ``via``).

What it shares across processes: nothing by name. Each ``StoreStorage`` writes under a
random key prefix of its own, and its length, the writer's cursor and any sampler state
live in the process, so the 4-writer figures are 4 separate buffers on one server and
the sampler of the mixed figure reads a buffer that only it filled before the timing.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse

import torch
from common import BATCH, batches, config_from_argv, emit, loop_until, run_processes, timed_loop
from tensordict import TensorDict
from torchrl.data import TensorDictReplayBuffer
from torchrl.data.replay_buffers import StoreStorage

from redisbuf.servers.embedded import EmbeddedServer

PRE = 8
PATH = "TensorDictReplayBuffer(StoreStorage(N, host, port)): extend(td) / sample(256)"
UNIFORM = "uniform RandomSampler: TorchRL's PrioritizedSampler does not load on torch 2.13"


def open_rb(url: str, capacity: int) -> TensorDictReplayBuffer:
    parsed = urlparse(url)
    return TensorDictReplayBuffer(
        storage=StoreStorage(capacity, host=parsed.hostname, port=parsed.port), batch_size=BATCH
    )


def tds(layout: str, count: int, n: int = BATCH, seed: int = 0) -> list[TensorDict]:
    return [TensorDict({k: torch.from_numpy(v) for k, v in b.items()}, [n])
            for b in batches(layout, count, n=n, seed=seed)]


def fill(rb: TensorDictReplayBuffer, layout: str, count: int) -> None:
    chunk = 2000
    template = tds(layout, 1, n=chunk, seed=1)[0]
    for start in range(0, count, chunk):
        rb.extend(template[: min(chunk, count - start)].clone())


def writer(url: str, capacity: int, layout: str, seed: int) -> Any:
    rb = open_rb(url, capacity)
    fill(rb, layout, capacity)
    pre = tds(layout, PRE, seed=seed)

    def add(i: int) -> int:
        rb.extend(pre[i % PRE].copy())
        return BATCH

    return lambda deadline: loop_until(deadline, add)


def sampler(url: str, capacity: int) -> Any:
    rb = open_rb(url, capacity)
    fill(rb, "4k", capacity)  # its own items: it cannot open the writers' buffers

    def sample(_: int) -> int:
        rb.sample()
        return BATCH

    return lambda deadline: loop_until(deadline, sample)


def main() -> None:
    cfg = config_from_argv()
    figures, seconds = set(cfg["figures"]), cfg["seconds"]
    cap4k, cap200 = cfg["cap4k"], cfg["cap200"]
    out: dict[str, Any] = {}
    with EmbeddedServer() as server:
        url = server.url
        if figures & {"add_4k_uniform", "sample_4k_uniform", "add_4k_prio", "sample_4k_prio"}:
            rb = open_rb(url, cap4k)
            fill(rb, "4k", cap4k)
            pre = tds("4k", PRE)
            add = timed_loop(lambda i: rb.extend(pre[i % PRE].copy()) is not None and BATCH,
                             seconds)
            out["add_4k_uniform"] = add
            sample = timed_loop(lambda i: rb.sample() is not None and BATCH, seconds)
            out["sample_4k_uniform"] = sample
            if "sample_4k_prio" in figures:
                out["sample_4k_prio"] = {**sample, "via": UNIFORM}
            rb.empty()
        if "add_200b" in figures:
            rb = open_rb(url, cap200)
            fill(rb, "200b", cap200)
            pre = tds("200b", PRE)
            out["add_200b"] = timed_loop(
                lambda i: rb.extend(pre[i % PRE].copy()) is not None and BATCH, seconds)
            rb.empty()
        if "add_4k_4proc" in figures:
            res = run_processes([(writer, (url, cap4k, "4k", s)) for s in range(4)], seconds)
            out["add_4k_4proc"] = {"rate": sum(r["rate"] for r in res),
                                   "via": "4 separate buffers (no buffer is shared by name)"}
        if figures & {"mixed_ins", "mixed_smp"}:
            workers = [(writer, (url, cap4k, "4k", s)) for s in range(4)]
            workers.append((sampler, (url, cap4k)))
            res = run_processes(workers, seconds)
            out["mixed_ins"] = {"rate": sum(r["rate"] for r in res[:4]),
                                "via": "4 separate buffers; " + UNIFORM}
            out["mixed_smp"] = {"rate": res[4]["rate"],
                                "via": "the sampler's own buffer; " + UNIFORM}
    emit({"path": PATH, "results": out})


if __name__ == "__main__":
    main()
