"""One Reverb-API workload on DeepMind Reverb 0.14.0 and on redisbuf.reverb, back to back.

    .venv/bin/python benchmarks/peers/reverb_api.py [--quick] [--repeat 3]

The same code (``workload`` below) runs twice, each in its own process: with ``import
reverb`` in Reverb's venv (``$REDISBUF_PEERS_HOME/reverb``, built by
``benchmarks/peers/run.py``: dm-reverb 0.14.0, tensorflow-cpu 2.15.1, numpy<2), and with
``from redisbuf import reverb`` in the project's venv. Per item size (~200 B and 4 KiB
of observation a step):

* inserts: an Acme-style adder, ``client.trajectory_writer(2)``, one ``append`` per step
  and one item per step of the last two steps' observations and the first one's action
  (``history['obs'][-2:]``, ``history['action'][-2]``), ``flush(block_until_num_items=
  256)`` per step and ``flush()`` at the end: items per second, confirmed;
* samples through the dataset: ``TrajectoryDataset(...).batch(256)``, items per second,
  and the seconds from making the dataset to its first batch;
* samples through the client: ``Client.sample(table, 256, emit_timesteps=False)``;
* priority updates: ``Client.mutate_priorities`` of 256 sampled keys a call.

The table: Prioritized(0.6) sampler, Fifo remover, MinSize(1), 100,000 items, a signature
(``tf.TensorSpec`` for Reverb, ``reverb.TensorSpec`` for redisbuf), which the dataset
reads. Each figure is the median over ``--repeat`` runs; ``ratio`` is redisbuf over
Reverb. The figures go to ``benchmarks/results/reverb_api.json``
(``benchmarks/_report.py``). Never run in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
HOME = Path(os.environ.get("REDISBUF_PEERS_HOME", Path.home() / ".cache" / "redisbuf-peers"))
TABLE = "t"
BATCH = 256
SIZES = {"small": 48, "large": 1024}  # float32 observations: ~200 B and 4 KiB a step


def workload(backend: str, steps: int, obs_size: int, seconds: float) -> dict[str, float]:
    """The measured workload; ``reverb`` is whichever module ``backend`` names."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if backend == "reverb":
        import reverb
        import tensorflow as tf

        spec = tf.TensorSpec
    else:
        from redisbuf import reverb

        spec = reverb.TensorSpec
    signature = {"obs": spec([2, obs_size], np.float32), "action": spec([], np.int64)}
    table = reverb.Table(
        name=TABLE, sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(), max_size=100_000,
        rate_limiter=reverb.rate_limiters.MinSize(1), signature=signature)
    server = reverb.Server(tables=[table])
    client = reverb.Client(f"localhost:{server.port}")
    rng = np.random.default_rng(0)
    observations = rng.standard_normal((64, obs_size)).astype(np.float32)
    out: dict[str, float] = {}

    start = time.perf_counter()
    with client.trajectory_writer(num_keep_alive_refs=2) as writer:
        for t in range(steps):
            writer.append({"obs": observations[t % 64], "action": np.int64(t % 3)})
            if t >= 1:
                writer.create_item(TABLE, priority=1.0, trajectory={
                    "obs": writer.history["obs"][-2:],
                    "action": writer.history["action"][-2]})
                writer.flush(block_until_num_items=BATCH)
        writer.flush()
    out["insert"] = (steps - 1) / (time.perf_counter() - start)

    start = time.perf_counter()
    dataset = reverb.TrajectoryDataset.from_table_signature(
        server_address=f"localhost:{server.port}", table=TABLE,
        max_in_flight_samples_per_worker=2 * BATCH).batch(BATCH)
    iterator = dataset.as_numpy_iterator()
    keys: list[int] = []
    next(iterator)
    out["first_batch"] = time.perf_counter() - start
    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        sample = next(iterator)
        keys = [int(k) for k in sample.info.key]
        count += len(keys)
    out["sample_dataset"] = count / (time.perf_counter() - start)

    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for _sample in client.sample(TABLE, BATCH, emit_timesteps=False):
            count += 1
    out["sample_client"] = count / (time.perf_counter() - start)

    count, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.mutate_priorities(TABLE, updates=dict(zip(
            keys, rng.random(len(keys)).tolist(), strict=True)))
        count += len(keys)
    out["update"] = count / (time.perf_counter() - start)
    server.stop()
    return out


def _worker(argv: list[str]) -> int:
    backend, steps, obs_size, seconds = argv[0], int(argv[1]), int(argv[2]), float(argv[3])
    print(json.dumps(workload(backend, steps, obs_size, seconds)))
    return 0


def _python(backend: str) -> str:
    if backend == "reverb":
        return str(HOME / "reverb" / "bin" / "python")
    return sys.executable


def _run(backend: str, steps: int, obs_size: int, seconds: float) -> dict[str, float]:
    done = subprocess.run(
        [_python(backend), __file__, "--worker", backend, str(steps), str(obs_size),
         str(seconds)], capture_output=True, text=True, timeout=1800, check=False,
        cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"{backend} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


LABELS = {
    "insert": ("inserts (trajectory writer)", "items/s"),
    "first_batch": ("a new dataset's first batch (TrajectoryDataset.batch(256))", "s"),
    "sample_dataset": ("samples (TrajectoryDataset.batch(256))", "items/s"),
    "sample_client": ("samples (Client.sample(256))", "items/s"),
    "update": ("priority updates (mutate_priorities, 256)", "updates/s"),
}


def _digits(name: str) -> int:
    """Decimals a figure is printed with: seconds to 0.01, counts to the unit."""
    return 2 if LABELS[name][1] == "s" else 0


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        return _worker(sys.argv[2:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps, shorter reads")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    sys.path.insert(0, str(HERE.parent))
    from _report import load_average, record

    steps, seconds = (5_000, 2.0) if args.quick else (20_000, 5.0)
    figures: dict[tuple[str, str, str], list[float]] = {}
    for round_ in range(args.repeat):
        for size, obs_size in SIZES.items():
            order = ["reverb", "redisbuf"] if round_ % 2 == 0 else ["redisbuf", "reverb"]
            for backend in order:
                result = _run(backend, steps, obs_size, seconds)
                for name, value in result.items():
                    figures.setdefault((size, name, backend), []).append(value)
                print(f"round {round_ + 1} {size:5} {backend:8} "
                      + "  ".join(f"{k} {v:,.{_digits(k)}f}" for k, v in result.items()),
                      flush=True)
    print(f"\nload average {load_average()}\n")
    print(f"{'figure':48} {'Reverb':>12} {'redisbuf':>12} {'ratio':>7}")
    for size in SIZES:
        for name, (label, unit) in LABELS.items():
            reverb = statistics.median(figures[(size, name, "reverb")])
            ours = statistics.median(figures[(size, name, "redisbuf")])
            figure = f"{label}, {size} items"
            digits = _digits(name)
            print(f"{figure:48} {reverb:12,.{digits}f} {ours:12,.{digits}f} "
                  f"{ours / reverb:6.2f}x")
            spread = ", ".join(f"{v:,.{digits}f}" for v in figures[(size, name, "redisbuf")])
            record(figure, ours, unit, baseline=reverb, baseline_name="Reverb",
                   spread=spread,
                   target=None if name in ("update", "first_batch") else ">= 1",
                   key=f"{name}-{size}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
