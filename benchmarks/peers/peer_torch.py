"""TorchRL and torchgfn, in-process buffers (one process: no multi-process figures).

* TorchRL (mode "torchrl"): ``TensorDictReplayBuffer`` on ``LazyTensorStorage`` (tensors
  in memory, its fastest storage), ``RandomSampler`` or ``PrioritizedSampler(alpha=0.6,
  beta=0.4)`` with the priorities in the batch's ``td_error`` entry; ``extend`` of 256,
  ``sample()`` of 256, ``update_priority(index, priority)``.
* torchgfn 2.4.1 (mode "torchgfn"): ``gfn.containers.ReplayBuffer`` of ``StatesContainer``
  of HyperGrid states (int64, 512 dimensions = 4 KiB, 25 = 200 B); its only prioritized
  mode is ``prioritized_capacity`` + ``prioritized_sampling`` by log-reward (softmax), not
  PER, and it has no priority updates.
Memory: growth of the RSS of the process holding the buffer, from before it was made to
after the fill (the torch runtime itself is not counted).
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
from common import (  # noqa: E402
    ALPHA,
    BATCH,
    BETA,
    batches,
    config_from_argv,
    emit,
    priorities,
    rss_mb,
    timed_loop,
)

PRE = 8


class TorchRL:
    def __init__(self, layout: str, size: int, prio: bool) -> None:
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, TensorDictReplayBuffer
        from torchrl.data.replay_buffers.samplers import PrioritizedSampler, RandomSampler

        torch.set_num_threads(1)
        self.torch, self.size, self.prio, self.layout = torch, size, prio, layout
        sampler = PrioritizedSampler(size, ALPHA, BETA) if prio else RandomSampler()
        self.rb = TensorDictReplayBuffer(
            storage=LazyTensorStorage(size), sampler=sampler, batch_size=BATCH,
            priority_key="td_error",
        )
        rng = np.random.default_rng(0)

        def td(batch: dict[str, np.ndarray], n: int) -> Any:
            fields = {k: torch.from_numpy(v) for k, v in batch.items()}
            if prio:
                fields["td_error"] = torch.from_numpy(priorities(n, rng).astype(np.float32))
            return TensorDict(fields, batch_size=[n])

        self.td = td
        self.pre = [td(b, BATCH) for b in batches(layout, PRE)]

    def fill(self) -> None:
        chunk = min(self.size, 8192)
        (big,) = batches(self.layout, 1, n=chunk, seed=1)
        done = 0
        while done < self.size:
            n = min(chunk, self.size - done)
            self.rb.extend(self.td({k: v[:n] for k, v in big.items()}, n))
            done += n

    def add(self, i: int) -> int:
        self.rb.extend(self.pre[i % PRE])
        return BATCH

    def sample(self, _: int) -> int:
        self.rb.sample()
        return BATCH

    def updater(self) -> Any:
        torch = self.torch
        rng = np.random.default_rng(2)
        calls = [
            (torch.from_numpy(rng.integers(0, self.size, BATCH)),
             torch.from_numpy(priorities(BATCH, rng).astype(np.float32)))
            for _ in range(64)
        ]

        def update(i: int) -> int:
            self.rb.update_priority(*calls[i % len(calls)])
            return BATCH

        return update


class TorchGFN:
    def __init__(self, layout: str, size: int, prio: bool) -> None:
        import torch
        from gfn.containers import ReplayBuffer, StatesContainer
        from gfn.gym import HyperGrid

        torch.set_num_threads(1)
        self.torch, self.size = torch, size
        self.env = HyperGrid(ndim=512 if layout == "4k" else 25, height=2, validate_modes=False)
        self.buf = ReplayBuffer(
            self.env, capacity=size, prioritized_capacity=prio, prioritized_sampling=prio
        )
        self.container = StatesContainer
        self.pre = [self.batch(BATCH) for _ in range(PRE)]

    def batch(self, n: int) -> Any:
        states = self.env.reset(batch_shape=(n,), random=True)
        return self.container(self.env, states, log_rewards=self.torch.randn(n))

    def fill(self) -> None:
        chunk = min(self.size, 8192)
        big = self.batch(chunk)
        done = 0
        while done < self.size:
            n = min(chunk, self.size - done)
            self.buf.add(big[self.torch.arange(n)] if n < chunk else big)
            done += n

    def add(self, i: int) -> int:
        self.buf.add(self.pre[i % PRE])
        return BATCH

    def sample(self, _: int) -> int:
        self.buf.sample(BATCH)
        return BATCH


def main() -> None:
    cfg = config_from_argv()
    figures, seconds = set(cfg["figures"]), cfg["seconds"]
    cls = TorchRL if cfg["mode"] == "torchrl" else TorchGFN
    out: dict[str, Any] = {}
    for prio in (False, True):
        add_id = "add_4k_prio" if prio else "add_4k_uniform"
        smp_id = "sample_4k_prio" if prio else "sample_4k_uniform"
        if not {add_id, smp_id} & figures:
            continue
        try:
            rb = cls("4k", cfg["cap4k"], prio)
        except RuntimeError as exc:  # e.g. TorchRL's PrioritizedSampler without its C++ part
            for fig in {add_id, smp_id} & figures:
                out[fig] = {"error": str(exc)}
            continue
        rb.fill()
        if smp_id in figures:
            out[smp_id] = timed_loop(rb.sample, seconds)
        if add_id in figures:
            out[add_id] = timed_loop(rb.add, seconds)
        del rb
    if "add_200b" in figures:
        rb = cls("200b", cfg["cap200"], False)
        rb.fill()
        out["add_200b"] = timed_loop(rb.add, seconds)
        del rb
    if cls is TorchRL and figures & {"update_small", "update_apex", "apex_memory"}:
        try:
            TorchRL("200b", 16, True)
        except RuntimeError as exc:
            for fig in {"update_small", "update_apex", "apex_memory"} & figures:
                out[fig] = {"error": str(exc)}
            emit({"path": __doc__.replace("\n", " "), "results": out})
            return
        if "update_small" in figures:
            rb = TorchRL("200b", cfg["update_size"], True)
            rb.fill()
            out["update_small"] = timed_loop(rb.updater(), seconds)
            del rb
        base = rss_mb(os.getpid())
        rb = TorchRL("200b", cfg["apex_size"], True)
        rb.fill()
        out["apex_memory"] = {"rate": rss_mb(os.getpid()) - base, "via": "RSS growth"}
        if "update_apex" in figures:
            out["update_apex"] = timed_loop(rb.updater(), seconds)
    emit({"path": __doc__.replace("\n", " "), "results": out})


if __name__ == "__main__":
    main()
