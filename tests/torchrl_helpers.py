"""Child process of tests/test_torchrl.py (importable by spawned processes)."""

from __future__ import annotations

import traceback
from typing import Any


def shared_buffer_worker(url: str, name: str, src: int, n_items: int, barrier: Any,
                         commands: Any, results: Any) -> None:
    """Open the shared prioritized TorchRL buffer by URL and name, add ``n_items`` items
    tagged ``src``, then follow the parent's commands: ``"seen"`` reports every (src,
    value) drawn in 40 batches of 64 and the id of each; ``("boost", id)`` sets that
    id's priority to 1e6; ``("count", id)`` reports how often 256 draws hit that id."""
    try:
        import torch
        from tensordict import TensorDict

        from redisbuf.torchrl import RedisbufStorage, TensorDictPrioritizedReplayBuffer

        rb = TensorDictPrioritizedReplayBuffer(
            alpha=0.7, beta=0.5, storage=RedisbufStorage(url, name, 1000, seed=src),
            batch_size=64,
        )
        rb.extend(TensorDict({"src": torch.full((n_items,), src),
                              "value": torch.arange(n_items),
                              "obs": {"x": torch.randn(n_items, 3)}}, [n_items]))
        barrier.wait(timeout=60)
        while True:
            command = commands.get(timeout=120)
            if command == "stop":
                break
            if command == "seen":
                seen: dict[tuple[int, int], int] = {}
                for _ in range(40):
                    batch = rb.sample()
                    for s, v, i in zip(batch["src"].tolist(), batch["value"].tolist(),
                                       batch["index"].tolist(), strict=True):
                        seen[(s, v)] = i
                results.put({"src": src, "seen": seen})
            elif command[0] == "boost":
                rb.update_priority(torch.tensor([command[1]]), torch.tensor([1e6]))
                results.put({"src": src, "boosted": command[1]})
            elif command[0] == "count":
                batch = rb.sample(256)
                results.put({"src": src,
                             "hits": int((batch["index"] == command[1]).sum())})
    except BaseException:  # noqa: BLE001
        results.put({"src": src, "error": traceback.format_exc()})
