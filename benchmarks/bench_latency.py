"""How long each operation makes every other client of the server wait.

Usage: python benchmarks/bench_latency.py [--url URL] [--items 2000000] [--dim 8]
                                          [--only NAME,NAME]

``--only`` keeps the operations whose name holds one of the words, or whole setups by
name: uniform, prioritized, per, add (4 KiB items at capacity 16384), add64 (64 KiB
items at capacity 2048), lifetime
(``update_model_version`` removing half the buffer as stale), load (save, then load over
a PER buffer of up to 500 000 items), sequence (a SequenceBuffer of 16 streams of
``--items / 16`` steps: get_batch, gather_all and get_field of far more steps than one
command's bound), large (one add of 10^5 items of 1 KiB, atomic though above one add's
bound, into a buffer holding as many, against the same items as adds of one add's bound).

Without --url it starts the bundled valkey 8 (as the tests do). A probe process PINGs
the server every 2 ms while each operation runs once at a large
size on a buffer of ``--items`` items (``dim`` float32 each; 2x10^6 by default, as issue
35 asks); per operation it prints the probe's worst PING reply, the server's slowest
command (SLOWLOG) and the operation's own wall time. The bound on one command's work
(:mod:`redisbuf.store.bounds`) keeps the first two in the tens of milliseconds whatever
the request; the third grows with the request. Runs against any redisbuf checkout
(``PYTHONPATH=/path/to/checkout``) so that the numbers before and after a change can be
compared on one machine; operations the checkout lacks are skipped.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis
from _report import key_of, record

from redisbuf import ReplayBuffer
from redisbuf.ops.latency import LatencyProbe
from redisbuf.servers.embedded import BIN_ENV, EmbeddedServer, bundled_server_binary

try:
    from redisbuf.store import bounds
except ImportError:  # a checkout from before the bound
    bounds = None  # type: ignore[assignment]


def fill(buffer: ReplayBuffer, items: int, dim: int, rng: np.random.Generator,
         **options: Any) -> None:
    """Add ``items`` items in batches the server takes in one command each."""
    step = bounds.MAX_ADD_ITEMS if bounds is not None else 1000
    if bounds is not None and hasattr(bounds, "MAX_ADD_BYTES"):
        step = max(1, min(step, bounds.MAX_ADD_BYTES // (4 * dim + 64)))
    elif dim >= 1024:
        step = 256
    done = 0
    while done < items:
        k = min(step, items - done)
        buffer.add(batch(rng, k, dim), **options)
        done += k


def batch(rng: np.random.Generator, k: int, dim: int) -> dict[str, np.ndarray]:
    return {"obs": rng.standard_normal((k, dim)).astype(np.float32),
            "log_rewards": rng.standard_normal(k)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url")
    parser.add_argument("--items", type=int, default=2_000_000)
    parser.add_argument("--dim", type=int, default=8)
    parser.add_argument("--only", default="")
    args = parser.parse_args()
    server = None
    url = args.url
    if url is None:
        # the bundled valkey 8, as the test suite, even when a redis-server is on PATH
        if not os.environ.get(BIN_ENV) and bundled_server_binary():
            os.environ[BIN_ENV] = bundled_server_binary()  # type: ignore[assignment]
        server = EmbeddedServer().start()
        url = server.url
    try:
        run(url, args.items, args.dim, {s for s in args.only.split(",") if s})
    finally:
        if server is not None:
            server.stop()


def run(url: str, items: int, dim: int, only: set[str]) -> None:
    from redisbuf import PERSampler

    client = redis.Redis.from_url(url)
    client.config_set("busy-reply-threshold" if _has(client, "busy-reply-threshold")
                      else "lua-time-limit", 60_000)  # never cut a long script short here
    rng = np.random.default_rng(0)
    n = min(items, 1_000_000)
    k = min(n, 150_000)
    some = rng.choice(np.arange(1, items + 1), n, replace=False)
    uniforms = rng.integers(0, 2**48, n, dtype=np.uint64).astype("<u8").view(np.uint8)
    packed = uniforms.reshape(n, 8)[:, :6].tobytes()

    def uniform_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        keys = buffer.keys.all_keys()
        return [
            (f"sample({n}) uniform, without replacement", lambda: buffer.sample(n)),
            (f"sample({n}, replacement=True) uniform",
             lambda: buffer.sample(n, replacement=True)),
            (f"sample({n}, True, sample_range=slice(-{n}, None))",
             lambda: buffer.sample(n, replacement=True, sample_range=slice(-n, None))),
            (f"sample({n}, sample_range=slice(-{n}, None)) without replacement",
             lambda: buffer.sample(n, sample_range=slice(-n, None))),
            (f"get({n} ids)", lambda: buffer.get(some)),
            (f"top({n})", lambda: buffer.top(n)),
            ("stats()", lambda: buffer.stats()),
            (f"FCALL rb_sample_uniform n={n}",
             lambda: client.execute_command("FCALL", "rb_sample_uniform", len(keys), *keys,
                                            n, 0, 0, packed)),
            ("add(1024 items)", lambda: buffer.add(batch(rng, 1024, dim))),
        ]

    def prioritized_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        return [(f"prioritized sample({k})", lambda: buffer.sample(k))]

    def per_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        m = min(n, 100_000)
        return [
            (f"PER sample_with_info({k})", lambda: buffer.sample_with_info(k)),
            (f"update_priority({m} ids)",
             lambda: buffer.update_priority(some[:m], rng.random(m))),
        ]

    def add_ops(buffer: ReplayBuffer, dim: int = 1024,
                counts: tuple[int, ...] = (1024, 512, 256)) -> list[tuple[str, Callable[[], Any]]]:
        # items at capacity (each add evicts as many): 4 KiB is the example size
        ops: list[tuple[str, Callable[[], Any]]] = []
        for count in counts:
            part = batch(rng, count, dim)
            for rep in range(3):
                ops.append((f"add({count} x {dim // 256} KiB) at capacity #{rep + 1}",
                            lambda part=part: buffer.add(part)))
        return ops

    def add64_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        return add_ops(buffer, 16384, (1024, 512, 256))

    def lifetime_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        return [(f"update_model_version removing {items // 2} stale items",
                 lambda: buffer.update_model_version("s", 1))]

    def load_ops(buffer: ReplayBuffer) -> list[tuple[str, Callable[[], Any]]]:
        path = f"/tmp/bench-latency-{os.getpid()}.rbuf"

        def load() -> Any:
            try:
                return buffer.load(path)
            finally:
                os.unlink(path)

        size = min(items, 500_000)
        return [(f"save({size} items)", lambda: buffer.save(path)),
                (f"load over {size} PER items", load)]

    print(f"{'operation':48s} {'probe worst':>12s} {'server worst':>13s} {'wall':>8s}  "
          "slowest command")
    setups = [
        ("uniform", {}, uniform_ops),
        ("prioritized", {"prioritized_sampling": True}, prioritized_ops),
        ("per", {"sampler": PERSampler()}, per_ops),
        ("add", {"capacity": 16384, "dim": 1024}, add_ops),
        ("add64", {"capacity": 2048, "dim": 16384}, add64_ops),
        ("lifetime", {"max_staleness": 0}, lifetime_ops),
        ("load", {"sampler": PERSampler(), "capacity": min(items, 500_000)}, load_ops),
    ]
    with LatencyProbe(url) as probe:
        for label, options, make in setups:
            options = dict(options)
            size, width = options.pop("capacity", items), options.pop("dim", dim)
            buffer = ReplayBuffer(client, f"latency-{label}", capacity=size, seed=1,
                                  **options)
            ops = [(name, op) for name, op in make(buffer)
                   if not only or label in only or any(word in name for word in only)]
            if not ops:
                client.unlink(*buffer.keys.all_keys())
                continue
            started = time.perf_counter()
            if label == "lifetime":  # half the items stale at version 1
                buffer.update_model_version("s", 0)
                fill(buffer, size // 2, width, rng, model_version=0)
                fill(buffer, size - len(buffer), width, rng, model_version=1)
            else:
                fill(buffer, size - len(buffer), width, rng)
            print(f"({label}: {len(buffer)} items of {width} float32 filled in "
                  f"{time.perf_counter() - started:.0f} s)", flush=True)
            for name, op in ops:
                started = time.perf_counter()
                try:
                    with probe.window() as seen:
                        op()
                    status = ""
                except Exception as exc:  # a refusal is a result here
                    status = f"  raised {type(exc).__name__}: {str(exc)[:70]}"
                wall = time.perf_counter() - started
                print(f"{name:48s} {seen.probe_worst * 1e3:9.1f} ms "
                      f"{seen.server_worst * 1e3:10.1f} ms {wall:7.2f}s  "
                      f"{' '.join(seen.server_command)}{status}", flush=True)
                shown = f"{name} ({status.strip()[:40]})" if status else name
                record(f"{shown}: probe's worst wait", seen.probe_worst * 1e3, "ms",
                       key=f"{key_of(name)}/probe")
                record(f"{shown}: slowest command", seen.server_worst * 1e3, "ms",
                       key=f"{key_of(name)}/server")
            # UNLINK: freeing 2x10^6 items is for a background thread, not the server's
            client.unlink(*buffer.keys.all_keys())
        if not only or "sequence" in only:
            sequence_run(client, probe, items, rng)
        if not only or "large" in only:
            large_run(client, probe, rng)


def large_run(client: redis.Redis, probe: LatencyProbe, rng: np.random.Generator,
              count: int = 100_000, dim: int = 256) -> None:
    """One add of ``count`` items (1 KiB each), above one add's bound, so staged and
    stored a slice at a time yet atomic (redisbuf/buffers/staged.py), into a buffer
    holding as many already, beside the probe; then the same items as adds of one
    add's bound each (not atomic as a whole), the baseline of its rate."""
    if bounds is None or not hasattr(bounds, "add_slices"):
        return
    part = batch(rng, count, dim)
    timings = {}
    for label in ("atomic", "slices"):
        buffer = ReplayBuffer(client, f"latency-large-{label}", capacity=2 * count, seed=1)
        fill(buffer, count, dim, rng)
        name = (f"add({count} x {dim // 256} KiB) in one call" if label == "atomic" else
                f"the same as adds of {bounds.MAX_ADD_ITEMS}")

        def op(buffer: ReplayBuffer = buffer, label: str = label) -> None:
            if label == "atomic":
                buffer.add(part)
                return
            for start, stop in bounds.add_slices([4 * dim + 64] * count):
                buffer.add({key: value[start:stop] for key, value in part.items()})

        started = time.perf_counter()
        with probe.window() as seen:
            op()
        wall = timings[label] = time.perf_counter() - started
        assert len(buffer) == 2 * count
        print(f"{name:48s} {seen.probe_worst * 1e3:9.1f} ms "
              f"{seen.server_worst * 1e3:10.1f} ms {wall:7.2f}s  "
              f"{' '.join(seen.server_command)}", flush=True)
        record(f"{name}: probe's worst wait", seen.probe_worst * 1e3, "ms",
               key=f"large-{label}/probe", target="< 100")
        record(f"{name}: slowest command", seen.server_worst * 1e3, "ms",
               key=f"large-{label}/server", target="< 100")
        client.unlink(*client.keys(f"rb:{{latency-large-{label}}}:*"))
    record(f"add({count} x {dim // 256} KiB) in one call, atomic", count / timings["atomic"],
           "items/s", baseline=count / timings["slices"],
           baseline_name=f"adds of {bounds.MAX_ADD_ITEMS}", key="large/rate")


def sequence_run(client: redis.Redis, probe: LatencyProbe, items: int,
                 rng: np.random.Generator) -> None:
    """A SequenceBuffer's reads of far more steps than one command's bound, beside the
    probe (tests/test_latency_bound.py checks the same reads' work on the server)."""
    from redisbuf import SequenceBuffer

    envs, length = 16, max(64, min(items // 16, 250_000))
    seq = SequenceBuffer(client, "latency-sequence", envs, length, seed=0)
    started = time.perf_counter()
    for start in range(0, length, 256):
        steps = min(256, length - start)
        for t in range(start, start + steps):
            seq.add_batch({"obs": rng.standard_normal((envs, 128)).astype(np.float32),
                           "t": np.full(envs, t, dtype=np.int64)})
    print(f"(sequence: {envs} x {length} steps filled in "
          f"{time.perf_counter() - started:.0f} s)", flush=True)
    windows = min(length // 2, 100_000)
    envs_ids = np.repeat(np.arange(envs), min(length, 10_000))
    positions = np.tile(np.arange(min(length, 10_000)), envs)
    for name, op in [
        (f"get_batch({windows}, 16)", lambda: seq.get_batch(windows, 16)),
        (f"gather_all() of {envs * length} steps", seq.gather_all),
        (f"get_field('t', {len(envs_ids)} steps)",
         lambda: seq.get_field("t", envs_ids, positions)),
    ]:
        started = time.perf_counter()
        with probe.window() as seen:
            op()
        wall = time.perf_counter() - started
        print(f"{name:48s} {seen.probe_worst * 1e3:9.1f} ms "
              f"{seen.server_worst * 1e3:10.1f} ms {wall:7.2f}s  "
              f"{' '.join(seen.server_command)}", flush=True)
        record(f"{name}: probe's worst wait", seen.probe_worst * 1e3, "ms",
               key=f"{key_of(name)}/probe")
        record(f"{name}: slowest command", seen.server_worst * 1e3, "ms",
               key=f"{key_of(name)}/server")
    seq.drop()


def _has(client: redis.Redis, setting: str) -> bool:
    return bool(client.config_get(setting))


if __name__ == "__main__":
    main()
