"""Add throughput of the Node.js client (clients/node, FCALL rb_add) beside Python's
ReplayBuffer.add, same batches (transitions with float32 observations), same server.

    python benchmarks/bench_node.py [--url URL] [--batches 200] [--batch-size 64] [--obs-dim 128]

Without --url it starts an embedded server. Each writer's batches are made before its
clock starts; the timed loop is the adds alone, record encoding included. Also runs
Python through FCALL rb_add (the same server path as Node) to tell client cost from the
server path: Python's add keeps blobs out of Lua (reserve, then MULTI/HSET/commit), rb_add
carries them through add.lua. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from contextlib import ExitStack
from pathlib import Path

import numpy as np
import redis
from _report import record

from redisbuf import ReplayBuffer
from redisbuf.servers.embedded import EmbeddedServer
from redisbuf.store import codec, functions

NODE_DIR = Path(__file__).resolve().parent.parent / "clients" / "node"


def _batch(rng: np.random.Generator, n: int, dim: int, b: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.random((n, dim), dtype=np.float32),
        "next_obs": rng.random((n, dim), dtype=np.float32),
        "action": np.arange(n) % 4,
        "reward": rng.random(n, dtype=np.float32),
        "done": np.arange(n) % 50 == 49,
        "log_rewards": np.full(n, float(b)),
    }


def python_add(url: str, name: str, batches: int, n: int, dim: int) -> float:
    rng = np.random.default_rng(0)
    with ReplayBuffer(url, name, capacity=batches * n * 2) as buffer:
        buffer.add(_batch(rng, n, dim, 0))
        data = [_batch(rng, n, dim, b) for b in range(batches)]
        start = time.perf_counter()
        for batch in data:
            buffer.add(batch)
        return batches * n / (time.perf_counter() - start)


def python_fcall_add(url: str, name: str, batches: int, n: int, dim: int) -> float:
    rng = np.random.default_rng(0)
    with ReplayBuffer(url, name, capacity=batches * n * 2) as buffer:
        buffer.add(_batch(rng, n, dim, 0))
        client, keys = redis.Redis.from_url(url), buffer.keys.all_keys()
        schema = client.hget(buffer.keys.meta, "schema")
        data = [_batch(rng, n, dim, b) for b in range(batches)]
        start = time.perf_counter()
        for batch in data:
            blobs, rewards, _ = buffer.encode(batch)
            args: list[object] = [schema, n, ""]
            for blob, reward in zip(blobs, rewards.tolist(), strict=True):
                args += [blob, repr(reward)]
            args.append(os.urandom(8).hex())
            client.fcall("rb_add", len(keys), *keys, *args)
        rate = batches * n / (time.perf_counter() - start)
        client.close()
        return rate


def node_add(url: str, name: str, batches: int, n: int, dim: int) -> float:
    with ReplayBuffer(url, name, capacity=batches * n * 2):
        pass  # created (and the library installed) by Python; Node's first add fixes the schema
    done = subprocess.run(
        ["node", "bench/add.mjs", name, str(batches), str(n), str(dim)], cwd=NODE_DIR,
        env={**os.environ, "REDISBUF_URL": url}, capture_output=True, text=True, check=True,
    )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["items_per_s"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--batches", type=int, default=200)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--obs-dim", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if not (NODE_DIR / "node_modules" / "redis").is_dir():
        subprocess.run(["npm", "install", "--no-audit", "--no-fund"], cwd=NODE_DIR, check=True)
    with ExitStack() as stack:
        url = args.url or stack.enter_context(EmbeddedServer()).url
        functions.install(redis.Redis.from_url(url))
        shape = (args.batches, args.batch_size, args.obs_dim)
        rates: dict[str, list[float]] = {"python": [], "node": [], "python_fcall": []}
        for round_ in range(args.rounds):  # interleaved: drift hits each writer alike
            rates["python"].append(python_add(url, f"bench-py-{round_}", *shape))
            rates["node"].append(node_add(url, f"bench-node-{round_}", *shape))
            rates["python_fcall"].append(python_fcall_add(url, f"bench-pyf-{round_}", *shape))
    best = {key: max(values) for key, values in rates.items()}
    # the ratio of medians: on a shared machine one lucky round moves a best-of ratio
    median = {key: float(np.median(values)) for key, values in rates.items()}
    record_bytes = len(codec.packb({"obs": np.zeros(args.obs_dim, np.float32)})) * 2
    document = {
        "batches": args.batches, "batch_size": args.batch_size, "obs_dim": args.obs_dim,
        "record_bytes_approx": record_bytes,
        "items_per_s": rates, "best_items_per_s": best, "median_items_per_s": median,
        "node_over_python": median["node"] / median["python"],
        "node_over_python_fcall": median["node"] / median["python_fcall"],
    }
    record("Node.js rb_add", median["node"], "items/s", baseline=median["python"],
           baseline_name="Python add", key="node")
    record("Python through FCALL rb_add", median["python_fcall"], "items/s",
           baseline=median["python"], baseline_name="Python add", key="python-fcall")
    json.dump(document, sys.stdout, indent=2)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
