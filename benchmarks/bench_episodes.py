"""EpisodeBuffer.sample_windows(64, 32) and sample(8) next to a raw redis-py read of the
same bytes.

Usage: python benchmarks/bench_episodes.py [--url URL] [--rounds 5] [--quick]

Without --url an embedded server is started. The buffer holds about 10^6 steps (--quick:
10^5) of ~100-byte steps (obs float32[16], reward, t) in episodes of 20 to 400 steps.
Each round times ``sample_windows(64, 32)`` (choose windows in Lua, read 2,048 blobs
atomically, decode into [64, 32, ...] arrays) and ``sample(8)`` (whole episodes, decoded),
and, back to back, one HMGET of the same step fields chosen beforehand (no choice, no
decode). Printed: medians of steps per second, of the per-round ratio, and of the
server's time per redisbuf call (its scripts and HMGETs, from INFO commandstats).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from _report import record, script_stats

from redisbuf import EpisodeBuffer, connect
from redisbuf.buffers.episodes import EpisodeKeys
from redisbuf.servers.embedded import EmbeddedServer


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", help="Redis URL (default: start an embedded server)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=10, help="calls per timed run")
    parser.add_argument("--quick", action="store_true", help="10^5 steps instead of 10^6")
    args = parser.parse_args()
    server = None if args.url else EmbeddedServer().start()
    client = connect(args.url or server.url)
    name = "bench-episodes"
    target = 10**5 if args.quick else 10**6
    try:
        client.delete(*EpisodeKeys(name).all_keys())
        buf = EpisodeBuffer(client, name, capacity_episodes=100_000, seed=1)
        rng = np.random.default_rng(0)
        start = time.perf_counter()
        while buf.num_steps() < target:
            t = int(rng.integers(20, 401))
            buf.push(
                {
                    "obs": rng.standard_normal((t, 16), dtype=np.float32),
                    "reward": rng.standard_normal(t).astype(np.float32),
                    "t": np.arange(t),
                }
            )
        elapsed = time.perf_counter() - start
        print(
            f"filled {buf.num_steps():,} steps in {buf.count():,} episodes in {elapsed:.0f} s "
            f"({buf.num_steps() / elapsed:,.0f} steps/s)"
        )
        steps_key = EpisodeKeys(name).steps

        index = EpisodeKeys(name).index

        def window_fields(w) -> list[str]:
            starts = client.zmscore(index, [b"%012d" % i for i in w.episode_ids])
            return [str(int(s) + o + j) for s, o in zip(starts, w.offsets, strict=True)
                    for j in range(32)]

        def episode_fields(s) -> list[str]:
            return [str(int(st) + j) for st, ep in zip(s.starts, s.episodes, strict=True)
                    for j in range(len(ep["t"]))]

        calls = (
            ("sample_windows(64, 32)", lambda: buf.sample_windows(64, 32), window_fields,
             lambda w: 64 * 32),
            ("sample(8)", lambda: buf.sample_episodes(8), episode_fields,
             lambda s: sum(len(ep["t"]) for ep in s.episodes)),
        )
        print(
            f"{'call':<24}{'redisbuf steps/s':>18}{'raw steps/s':>14}{'ratio':>8}"
            f"{'server ms/call':>16}"
        )
        for label, call, fields_of, rows_of in calls:
            ours, raw, ratios, server_ms = [], [], [], []
            for _ in range(args.rounds):
                client.config_resetstat()
                t0 = time.perf_counter()
                total = 0
                for _ in range(args.repeat):
                    result = call()
                    total += rows_of(result)
                a = total / (time.perf_counter() - t0)
                hmget = client.info("commandstats").get("cmdstat_hmget", {})
                server_us = script_stats(client)["usec"] + hmget.get("usec", 0)
                server_ms.append(server_us / 1e3 / args.repeat)
                fields = fields_of(result)  # the last call's steps, read raw
                t0 = time.perf_counter()
                for _ in range(args.repeat):
                    client.hmget(steps_key, fields)
                b = len(fields) * args.repeat / (time.perf_counter() - t0)
                ours.append(a)
                raw.append(b)
                ratios.append(a / b)
            print(
                f"{label:<24}{statistics.median(ours):>18,.0f}{statistics.median(raw):>14,.0f}"
                f"{statistics.median(ratios):>8.2f}{statistics.median(server_ms):>16.2f}"
            )
            record(label, statistics.median(ours), "steps/s", baseline=statistics.median(raw),
                   baseline_name="HMGET", ratio=statistics.median(ratios),
                   spread=f"{min(ratios):.2f}-{max(ratios):.2f}")
    finally:
        client.delete(*EpisodeKeys(name).all_keys())
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
