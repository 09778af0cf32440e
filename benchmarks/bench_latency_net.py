"""Round trips per operation and throughput under added network delay: redisbuf and Reverb.

Usage: python benchmarks/bench_latency_net.py [--quick] [--rounds 2] [--seconds 1.5]

There is no kernel netem on the development machine, so every client here reaches its
server through a user-space TCP delay proxy on loopback (``DelayProxy`` below, standard
library only), in a process of its own: per connection and direction one thread reads
chunks and another writes each one out at its arrival time + d/2, so a round trip costs
+d and pipelined bytes keep flowing (a chunk never waits for the one before it to be
delayed; the check: 1000 pipelined PINGs wait about one round trip). The delay is a
shared value switched between measurements; the connections stay open. Both sides run
through the proxy at +0 too, so the proxy's own cost is in every figure.

redisbuf: ``ReplayBuffer`` on an embedded server, through the proxy. DeepMind Reverb
0.14.0: its server in a process of its own (a client in the server's process samples
the tables directly, without gRPC) and its gRPC client, both in Reverb's venv
(``$REDISBUF_PEERS_HOME/reverb``) under a subprocess of this script, the client through
the same proxy. Each operation is called in a loop, the delays +0, +0.5, +2 and +10 ms
taking turns in 5 slices (so that the shared machine's load moves them alike), for
``--seconds`` per delay:

* redisbuf: ``add`` of 256 items of ~200 B and of 4 KiB (uniform), ``add`` of 256 4 KiB
  items with PER priorities, ``sample(256)`` uniform and PER, ``update_priority(256,
  count=False)``, and draws of 256 through ``redisbuf.Prefetcher(prefetch=4)``;
* Reverb: a ``TrajectoryWriter`` of 256 ``append`` + ``create_item`` then ``flush()``
  (~200 B, 4 KiB, 4 KiB with priorities), ``Client.sample(table, 256)`` on a uniform and
  a Prioritized(0.6) table (not at +10 ms: it waits a round trip per item),
  ``TrajectoryDataset(...).batch(256)`` on both (``max_in_flight_samples_per_worker=512``)
  and ``mutate_priorities`` of 256 keys.

Round trips an operation waits for = (median call time at +d - median at +0) / (median
time of a one-round-trip call at +d - at +0), that call being ``PING`` for redisbuf and
``Client.server_info()`` for Reverb (the proxy's sleeps overshoot d a little; dividing by
the measured cost of one round trip takes that out); +10 ms resolves the calls whose own
time varies by more than a few ms. The proxy also counts request bursts at +0: a chunk
from a client after the server last sent on that connection starts one (for gRPC's
streams, whose acknowledgements come back while the client sends, this counts far more
than the round trips waited). Throughput: items per second of the same loops at +0,
+0.5 and +2 ms, redisbuf over Reverb (``baseline``), each redisbuf figure beside its
Reverb counterpart (``OPS`` below). Figures are means over ``--rounds`` rounds (redisbuf
first in odd rounds, Reverb first in even ones). Writes
``benchmarks/results/bench_latency_net.json``. Never run in CI (minutes, and it needs
Reverb's venv; ``--quick``: a fraction of a second per delay and figure).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from queue import SimpleQueue
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
HOME = Path(os.environ.get("REDISBUF_PEERS_HOME", Path.home() / ".cache" / "redisbuf-peers"))
DELAYS = (0.0, 0.5, 2.0, 10.0)  # ms added to each round trip
SHOWN = (0.0, 0.5, 2.0)  # throughput at these; +10 ms only counts round trips
BATCH = 256
CAP4K, CAP200 = 16_384, 100_000
ALPHA, BETA = 0.6, 0.4
LAYOUTS: dict[str, dict[str, tuple[tuple[int, ...], str]]] = {  # as benchmarks/peers
    "4k": {"obs": ((1024,), "float32")},
    "200b": {"obs": ((20,), "float32"), "next_obs": ((20,), "float32"),
             "action": ((), "int64"), "reward": ((), "float32"), "done": ((), "float32")},
}


# ---- the delay proxy (standard library only: Reverb's interpreter runs it too) ---------


def _pump(src: socket.socket, dst: socket.socket, delay: Any, c2s: bool, state: dict[str, Any],
          bursts: Any) -> None:
    """Forward src -> dst, each chunk written at its arrival + delay/2."""
    queue: SimpleQueue[tuple[float, bytes] | None] = SimpleQueue()

    def writer() -> None:
        while True:
            item = queue.get()
            if item is None:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            due, data = item
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            try:
                dst.sendall(data)
            except OSError:
                return

    threading.Thread(target=writer, daemon=True).start()
    while True:
        try:
            data = src.recv(1 << 18)
        except OSError:
            data = b""
        if not data:
            queue.put(None)
            return
        now = time.perf_counter()
        if c2s:
            if state["last"] != "c2s":
                with bursts.get_lock():
                    bursts.value += 1
            state["last"] = "c2s"
        else:
            state["last"] = "s2c"
        queue.put((now + delay.value / 2000.0, data))


def _proxy_main(target: int, delay: Any, bursts: Any, port: Any, ready: Any) -> None:
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    port.value = listener.getsockname()[1]
    ready.set()
    while True:
        client, _ = listener.accept()
        server = socket.create_connection(("127.0.0.1", target))
        for sock in (client, server):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        state = {"last": "s2c"}
        for src, dst, c2s in ((client, server, True), (server, client, False)):
            threading.Thread(target=_pump, args=(src, dst, delay, c2s, state, bursts),
                             daemon=True).start()


class DelayProxy:
    """A TCP proxy to 127.0.0.1:``target`` in a spawned process; ``set_delay(ms)`` adds
    that much to every round trip of every connection through it, from the next chunk."""

    def __init__(self, target: int) -> None:
        ctx = mp.get_context("spawn")
        self.delay = ctx.Value("d", 0.0, lock=False)
        self.bursts = ctx.Value("q", 0)
        self._port = ctx.Value("i", 0, lock=False)
        ready = ctx.Event()
        self.proc = ctx.Process(target=_proxy_main,
                                args=(target, self.delay, self.bursts, self._port, ready),
                                daemon=True)
        self.proc.start()
        if not ready.wait(60):
            raise RuntimeError("the delay proxy did not start")
        self.port = int(self._port.value)

    def set_delay(self, ms: float) -> None:
        self.delay.value = float(ms)

    def take_bursts(self) -> int:
        with self.bursts.get_lock():
            value, self.bursts.value = self.bursts.value, 0
        return int(value)

    def close(self) -> None:
        self.proc.kill()
        self.proc.join()


# ---- timing --------------------------------------------------------------------------


def measure(fn: Callable[[int], int], seconds: float, proxy: DelayProxy, warmup: int = 1,
            slices: int = 5, delays: tuple[float, ...] = DELAYS
            ) -> dict[float, dict[str, float]]:
    """Call ``fn(i)`` (items handled) for ``seconds`` at each delay, the delays taking
    turns in ``slices`` slices (so that the machine's load moves them alike): per delay,
    items/s, median ms per call and request bursts per call counted at the proxy. After
    each switch ``warmup`` calls are not timed."""
    durations: dict[float, list[float]] = {d: [] for d in delays}
    items = dict.fromkeys(delays, 0)
    elapsed = dict.fromkeys(delays, 0.0)
    bursts = dict.fromkeys(delays, 0)
    index = 0
    for _ in range(slices):
        for delay in delays:
            proxy.set_delay(delay)
            for _ in range(warmup):
                fn(index)
                index += 1
            proxy.take_bursts()
            calls, start = 0, time.perf_counter()
            while calls < 1 or time.perf_counter() - start < seconds / slices:
                t0 = time.perf_counter()
                items[delay] += fn(index)
                durations[delay].append(time.perf_counter() - t0)
                index += 1
                calls += 1
            elapsed[delay] += time.perf_counter() - start
            bursts[delay] += proxy.take_bursts()
    proxy.set_delay(0.0)
    return {d: {"rate": items[d] / elapsed[d], "ms": statistics.median(durations[d]) * 1e3,
                "bursts": bursts[d] / len(durations[d]), "calls": len(durations[d])}
            for d in delays}


def ping_ms(fn: Callable[[], Any], proxy: DelayProxy, seconds: float) -> dict[float, float]:
    """Median ms of a one-round-trip call at each delay (see :func:`measure`)."""
    def one(_: int) -> int:
        fn()
        return 1
    return {d: r["ms"] for d, r in measure(one, seconds, proxy, warmup=3).items()}


def make_batch(layout: str, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, (shape, dtype) in LAYOUTS[layout].items():
        if np.dtype(dtype).kind == "f":
            out[name] = rng.standard_normal((n, *shape)).astype(dtype)
        else:
            out[name] = rng.integers(0, 6, (n, *shape)).astype(dtype)
    return out


def priorities(n: int, rng: np.random.Generator) -> np.ndarray:
    return rng.exponential(size=n) + 0.01


# ---- redisbuf (the project's venv) ---------------------------------------------------


def run_redisbuf(seconds: float) -> dict[str, Any]:
    import redis

    from redisbuf import PERSampler, ReplayBuffer
    from redisbuf.servers.embedded import EmbeddedServer
    from redisbuf.store.bounds import MAX_ADD_ITEMS

    try:
        from redisbuf import Prefetcher
    except ImportError:  # a checkout without the prefetching reader
        Prefetcher = None  # type: ignore[assignment,misc]  # noqa: N806
    rng = np.random.default_rng(0)
    pre = {layout: [make_batch(layout, BATCH, rng) for _ in range(8)] for layout in LAYOUTS}
    pris = [priorities(BATCH, rng) for _ in range(8)]
    out: dict[str, Any] = {"ops": {}}
    with EmbeddedServer() as server:
        proxy = DelayProxy(server.port)
        url = f"redis://127.0.0.1:{proxy.port}/0"
        try:
            buffers = {}
            for name, cap, layout, prio in (("u4k", CAP4K, "4k", False),
                                             ("p4k", CAP4K, "4k", True),
                                             ("u200", CAP200, "200b", False)):
                direct = ReplayBuffer(server.url, name, capacity=cap,
                                      sampler=PERSampler(alpha=ALPHA, beta=BETA) if prio
                                      else None, seed=None)
                chunk = min(MAX_ADD_ITEMS, 1024)
                template = make_batch(layout, chunk, rng)
                for _ in range(cap // chunk):
                    direct.add(template, priorities=priorities(chunk, rng) if prio else None)
                buffers[name] = ReplayBuffer(url, name, capacity=cap, sampler=PERSampler(
                    alpha=ALPHA, beta=BETA) if prio else None, seed=None)
            u4k, p4k, u200 = buffers["u4k"], buffers["p4k"], buffers["u200"]
            newest = int(p4k.client.hget(p4k.keys.meta, "last_id") or CAP4K)
            calls = [(rng.integers(max(1, newest - CAP4K + 1), newest + 1, BATCH),
                      priorities(BATCH, rng)) for _ in range(64)]
            ping = redis.Redis.from_url(url)

            def adder(buf: Any, layout: str, prio: bool) -> Callable[[int], int]:
                def add(i: int) -> int:
                    buf.add(pre[layout][i % 8], priorities=pris[i % 8] if prio else None)
                    return BATCH
                return add

            def sampler(buf: Any) -> Callable[[int], int]:
                def sample(_: int) -> int:
                    buf.sample(BATCH)
                    return BATCH
                return sample

            def update(i: int) -> int:
                p4k.update_priority(*calls[i % 64], count=False)
                return BATCH

            ops: dict[str, Callable[[int], int]] = {
                "add_200b": adder(u200, "200b", False),
                "add_4k": adder(u4k, "4k", False),
                "add_4k_per": adder(p4k, "4k", True),
                "sample_4k": sampler(u4k),
                "sample_4k_per": sampler(p4k),
                "update": update,
            }
            out["ping"] = ping_ms(ping.ping, proxy, seconds)
            pipe = ping.pipeline(transaction=False)

            def pipelined() -> None:
                for _ in range(1000):
                    pipe.ping()
                pipe.execute()
            out["pipelined"] = ping_ms(pipelined, proxy, seconds)
            for name, fn in ops.items():
                out["ops"][name] = measure(fn, seconds, proxy)
            if Prefetcher is not None:
                for name, buf in (("prefetch_4k", u4k), ("prefetch_4k_per", p4k)):
                    with Prefetcher(buf, BATCH, prefetch=4) as batches:
                        def draw(_: int, batches: Any = batches) -> int:
                            next(batches)
                            return BATCH
                        out["ops"][name] = measure(draw, seconds, proxy, warmup=5)
            print("  redisbuf: one round trip " + ", ".join(
                f"+{d:g} ms: {out['ping'][d]:.3f} ms" for d in DELAYS), flush=True)
        finally:
            proxy.close()
    return out


# ---- Reverb (its own venv, as a subprocess) ------------------------------------------


def run_reverb(seconds: float) -> dict[str, Any]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reverb
    import tensorflow as tf

    rng = np.random.default_rng(0)
    tables = {"u4k": (CAP4K, "4k", False), "p4k": (CAP4K, "4k", True),
              "u200": (CAP200, "200b", False)}
    # the server in a process of its own: a client in the server's process samples its
    # tables directly, without gRPC
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    ready = ctx.Event()
    server = ctx.Process(target=_reverb_serve, args=(port, tables, ready), daemon=True)
    server.start()
    if not ready.wait(120):
        raise RuntimeError("the Reverb server did not start")
    proxy = DelayProxy(port)
    address = f"127.0.0.1:{proxy.port}"
    out: dict[str, Any] = {"ops": {}}
    try:
        pre = {layout: [[{k: v[j] for k, v in make_batch(layout, BATCH, rng).items()}
                         for j in range(BATCH)] for _ in range(8)] for layout in LAYOUTS}
        pris = [priorities(BATCH, rng).tolist() for _ in range(8)]

        def adder(c: Any, table: str, layout: str, prio: bool) -> Callable[[int], int]:
            writer = c.trajectory_writer(num_keep_alive_refs=1)
            fields = list(LAYOUTS[layout])

            def add(i: int) -> int:
                steps, prs = pre[layout][i % 8], pris[i % 8]
                for j in range(BATCH):
                    writer.append(steps[j])
                    writer.create_item(table, priority=prs[j] if prio else 1.0,
                                       trajectory={k: writer.history[k][-1] for k in fields})
                writer.flush()
                return BATCH
            return add

        direct = reverb.Client(f"127.0.0.1:{port}")
        for table, (cap, layout, prio) in tables.items():
            fill = adder(direct, table, layout, prio)
            for i in range(cap // BATCH):
                fill(i)
        c = reverb.Client(address)
        keys = set()
        while len(keys) < 4096:
            for s in direct.sample("p4k", 1024, emit_timesteps=False):
                keys.add(int(s.info.key))
        key_list = np.array(sorted(keys), dtype=np.uint64)
        updates = [dict(zip((int(k) for k in rng.choice(key_list, BATCH, replace=False)),
                            priorities(BATCH, rng).tolist(), strict=True)) for _ in range(64)]

        def client_sampler(table: str) -> Callable[[int], int]:
            def sample(_: int) -> int:
                return len(list(c.sample(table, BATCH, emit_timesteps=False)))
            return sample

        def dataset_sampler(table: str) -> Callable[[int], int]:
            spec = LAYOUTS[tables[table][1]]
            ds = reverb.TrajectoryDataset(
                server_address=address, table=table,
                dtypes={k: tf.as_dtype(d) for k, (_, d) in spec.items()},
                shapes={k: tf.TensorShape(s) for k, (s, _) in spec.items()},
                max_in_flight_samples_per_worker=2 * BATCH).batch(BATCH)
            it = iter(ds)

            def sample(_: int) -> int:
                next(it)
                return BATCH
            return sample

        def update(i: int) -> int:
            c.mutate_priorities("p4k", updates=updates[i % 64])
            return BATCH

        ops: dict[str, Callable[[int], int]] = {
            "add_200b": adder(c, "u200", "200b", False),
            "add_4k": adder(c, "u4k", "4k", False),
            "add_4k_per": adder(c, "p4k", "4k", True),
            "sample_4k": client_sampler("u4k"),
            "sample_4k_per": client_sampler("p4k"),
            "update": update,
            "prefetch_4k": dataset_sampler("u4k"),
            "prefetch_4k_per": dataset_sampler("p4k"),
        }
        out["ping"] = ping_ms(c.server_info, proxy, seconds)
        for name, fn in ops.items():
            # Client.sample waits a round trip per item (see the docs): not at +10 ms
            out["ops"][name] = measure(fn, seconds, proxy,
                                       warmup=5 if name.startswith("prefetch") else 1,
                                       delays=SHOWN if name.startswith("sample") else DELAYS)
        print("  Reverb: one round trip " + ", ".join(
            f"+{d:g} ms: {out['ping'][d]:.3f} ms" for d in DELAYS), file=sys.stderr,
            flush=True)
    finally:
        proxy.close()
        server.kill()
        server.join()
    return out


def _reverb_serve(port: int, tables: dict[str, tuple[int, str, bool]], ready: Any) -> None:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reverb

    server = reverb.Server(tables=[
        reverb.Table(name=name, sampler=reverb.selectors.Prioritized(ALPHA) if prio
                     else reverb.selectors.Uniform(), remover=reverb.selectors.Fifo(),
                     max_size=cap, rate_limiter=reverb.rate_limiters.MinSize(1))
        for name, (cap, _, prio) in tables.items()], port=port)
    ready.set()
    server.wait()


def reverb_subprocess(seconds: float) -> dict[str, Any]:
    python = HOME / "reverb" / "bin" / "python"
    done = subprocess.run([str(python), __file__, "--reverb-worker", str(seconds)],
                          stdout=subprocess.PIPE, text=True, timeout=1200, check=False,
                          cwd=ROOT)
    if done.returncode != 0:
        raise RuntimeError(f"the Reverb worker failed (exit {done.returncode})")
    return _floats(json.loads(done.stdout.strip().splitlines()[-1]))


def _floats(tree: Any) -> Any:
    """JSON keys that are delays back to floats."""
    if isinstance(tree, dict):
        out = {}
        for k, v in tree.items():
            try:
                k = float(k)
            except ValueError:
                pass
            out[k] = _floats(v)
        return out
    return tree


# ---- the report ----------------------------------------------------------------------

# op -> (redisbuf's figure, Reverb's figure, whether it is an add or a draw)
OPS: dict[str, tuple[str, str, bool]] = {
    "add_200b": ("add(256), ~200 B", "TrajectoryWriter 256 x append+create_item, flush, ~200 B",
                 True),
    "add_4k": ("add(256), 4 KiB", "TrajectoryWriter 256 x append+create_item, flush, 4 KiB",
               True),
    "add_4k_per": ("add(256, priorities=...), 4 KiB",
                   "TrajectoryWriter 256 x append+create_item(priority), flush, 4 KiB", True),
    "sample_4k": ("sample(256) uniform, 4 KiB", "Client.sample(256) uniform table, 4 KiB",
                  True),
    "sample_4k_per": ("sample(256) PER, 4 KiB", "Client.sample(256) Prioritized table, 4 KiB",
                      True),
    "update": ("update_priority(256)", "mutate_priorities(256)", False),
    "prefetch_4k": ("Prefetcher(prefetch=4) next(), uniform, 4 KiB",
                    "TrajectoryDataset.batch(256) next(), uniform table, 4 KiB", True),
    "prefetch_4k_per": ("Prefetcher(prefetch=4) next(), PER, 4 KiB",
                        "TrajectoryDataset.batch(256) next(), Prioritized table, 4 KiB", True),
}


def dkey(delay: float) -> str:
    return f"d{delay:g}"


def report(runs: dict[str, list[dict[str, Any]]]) -> None:
    from _report import load_average, record

    def mean(side: str, op: str, delay: float, what: str) -> float:
        return statistics.fmean(r["ops"][op][delay][what] for r in runs[side]
                                if op in r["ops"])

    def ping(side: str, delay: float) -> float:
        return statistics.fmean(r["ping"][delay] for r in runs[side])

    print(f"\nload average {load_average()}\n")
    for side in ("redisbuf", "Reverb"):
        print(f"one round trip ({'PING' if side == 'redisbuf' else 'server_info'}), {side}: "
              + "  ".join(f"+{d:g} ms: {ping(side, d):.3f} ms" for d in DELAYS))
        for delay in DELAYS:
            record(f"one round trip, {side}, +{delay:g} ms", ping(side, delay), "ms",
                   key=f"ping/{side}/{dkey(delay)}")
    trips = [(statistics.fmean(r["pipelined"][d] for r in runs["redisbuf"])
              - statistics.fmean(r["pipelined"][0.0] for r in runs["redisbuf"]))
             / (ping("redisbuf", d) - ping("redisbuf", 0.0)) for d in DELAYS[1:]]
    for delay, rt in zip(DELAYS[1:], trips, strict=True):
        record(f"round trips waited: 1000 pipelined PINGs (the proxy's check), +{delay:g} ms",
               rt, "round trips", key=f"rt/pipelined_ping/redisbuf/{dkey(delay)}")
    print("1000 pipelined PINGs, round trips waited: "
          + "  ".join(f"+{d:g} ms: {t:.2f}" for d, t in zip(DELAYS[1:], trips, strict=True)))
    print(f"\n{'operation':70} {'side':8} " + " ".join(f"{'+' + format(d, 'g'):>8}"
                                                    for d in DELAYS[1:]) + "   bursts")
    for op, names in OPS.items():
        for side, figure in (("redisbuf", names[0]), ("Reverb", names[1])):
            if not all(op in r["ops"] for r in runs[side]):
                continue
            trips = []
            for delay in DELAYS[1:]:
                if not all(delay in r["ops"][op] for r in runs[side]):
                    trips.append(float("nan"))
                    continue
                added = ping(side, delay) - ping(side, 0.0)
                rt = (mean(side, op, delay, "ms") - mean(side, op, 0.0, "ms")) / added
                trips.append(rt)
                record(f"round trips waited: {side}, {figure}, +{delay:g} ms", rt,
                       "round trips", key=f"rt/{op}/{side}/{dkey(delay)}")
            bursts = mean(side, op, 0.0, "bursts")
            record(f"request bursts counted at the proxy: {side}, {figure}", bursts,
                   "bursts/call", key=f"bursts/{op}/{side}")
            print(f"{figure:70.70} {side:8} " + " ".join(f"{t:8.2f}" for t in trips)
                  + f" {bursts:8.2f}")
    print(f"\n{'throughput':52} {'delay':>6} {'redisbuf':>10} {'Reverb':>10} {'ratio':>6}")
    for op, (figure, reverb_figure, target) in OPS.items():
        if not all(op in r["ops"] for r in runs["redisbuf"]):
            continue
        unit = "updates/s" if op == "update" else "items/s"
        for delay in SHOWN:
            ours, theirs = mean("redisbuf", op, delay, "rate"), mean("Reverb", op, delay, "rate")
            spread = ", ".join(f"{r['ops'][op][delay]['rate']:,.0f}" for r in runs["redisbuf"])
            record(f"{figure}, +{delay:g} ms", ours, unit, baseline=theirs,
                   baseline_name=f"Reverb {reverb_figure.split(',')[0]}", spread=spread,
                   target=">= 1" if target else None, key=f"tput/{op}/{dkey(delay)}")
            print(f"{figure:52.52} {'+' + format(delay, 'g'):>6} {ours:10,.0f} {theirs:10,.0f}"
                  f" {ours / theirs:6.2f}")


def main() -> int:
    if len(sys.argv) > 2 and sys.argv[1] == "--reverb-worker":
        print(json.dumps(run_reverb(float(sys.argv[2]))), flush=True)
        return 0
    sys.path.insert(0, str(HERE))
    import _report  # noqa: F401  (the load average before the run)

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a few seconds per figure")
    parser.add_argument("--rounds", type=int, default=None, help="default 2 (1 with --quick)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="per operation and delay; default 1.5 (0.5 with --quick)")
    args = parser.parse_args()
    rounds = args.rounds or (1 if args.quick else 2)
    seconds = args.seconds or (0.5 if args.quick else 1.5)
    runs: dict[str, list[dict[str, Any]]] = {"redisbuf": [], "Reverb": []}
    for round_ in range(rounds):
        order = ["redisbuf", "Reverb"] if round_ % 2 == 0 else ["Reverb", "redisbuf"]
        for side in order:
            print(f"round {round_ + 1}: {side}", flush=True)
            t0 = time.perf_counter()
            runs[side].append(run_redisbuf(seconds) if side == "redisbuf"
                              else reverb_subprocess(seconds))
            print(f"  {time.perf_counter() - t0:.0f} s", flush=True)
    report(runs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
