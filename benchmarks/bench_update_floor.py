"""What a priority update of 256 ids costs at its floor: the Redis primitives alone.

Usage: python benchmarks/bench_update_floor.py [--url URL] [--sizes 1e5,2e6] [--calls 1000]

Without --url an embedded server is started. For each size, a hash of that many 12-digit
ids -> priority text (the layout of ``rb:{name}:per``) and a packed float64 array of as
many slots are written; then, with 64 prepared calls of 256 random ids and priorities,
each way of changing them is timed (the best of 3 rounds of ``--calls`` calls): a script
that reads then writes the 256 fields (the least any per-item hash needs: the old value
for the sums, the new one), a native HSET of the fields (no read, no script), APPEND of a
packed binary delta in a script, and a native BITFIELD SET at 256 offsets of the packed
array (the command's bytes built by hand). A PING and redisbuf's own ``update_priority``
on a PER buffer of that size are timed beside them: with ``count=False`` from a process
without a replica (the bare append, as Reverb's ``mutate_priorities`` counts nothing),
and from a learner's process, whose replica applies and counts each update (made and
caught up before the timing). Printed: ms per call and the server's microseconds per
call (INFO commandstats). docs/performance.md uses these to say where an update's time
goes.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import redis
from _report import key_of, load_average, record
from rich.console import Console
from rich.table import Table

from redisbuf import PERSampler, ReplayBuffer
from redisbuf.servers.embedded import EmbeddedServer

IDS = 256
READ_THEN_WRITE = """
local ids, pairs_, i = {}, {}, 0
for text in string.gmatch(ARGV[2], '[^,]+') do
  i = i + 1
  ids[i] = string.sub(ARGV[1], 12 * i - 11, 12 * i)
  pairs_[2 * i - 1], pairs_[2 * i] = ids[i], text
end
local old = redis.call('HMGET', KEYS[1], unpack(ids))
redis.call('HSET', KEYS[1], unpack(pairs_))
return #old
"""
APPEND_DELTA = """
redis.call('APPEND', KEYS[1], ARGV[1])
return redis.call('HINCRBY', KEYS[2], 'version', 1)
"""


def _timed(calls: int, fn: Callable[[int], Any]) -> float:
    fn(0)
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        for i in range(calls):
            fn(i)
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def _server_us(client: redis.Redis, command: str) -> float:
    stats = client.info("commandstats").get(f"cmdstat_{command}")
    return float(stats["usec_per_call"]) if stats else float("nan")


def measure(url: str, size: int, calls: int) -> list[tuple[str, float, float]]:
    client = redis.Redis.from_url(url)
    rng = np.random.default_rng(0)
    per, packed, log, meta = "floor:per", "floor:packed", "floor:log", "floor:meta"
    client.delete(per, packed, log, meta)
    for start in range(0, size, 10_000):
        ids = range(start + 1, min(size, start + 10_000) + 1)
        client.hset(per, mapping={b"%012d" % i: repr(float(v)).encode()
                                  for i, v in zip(ids, rng.random(len(ids)), strict=True)})
    client.set(packed, rng.random(size).tobytes())
    prepared = [(rng.integers(1, size + 1, IDS), rng.random(IDS)) for _ in range(64)]
    texts = [("".join(f"{i:012d}" for i in ids.tolist()), ",".join(map(repr, v.tolist())))
             for ids, v in prepared]
    fields = [[x for i, v in zip(ids.tolist(), vs.tolist(), strict=True)
               for x in (b"%012d" % i, repr(v).encode())] for ids, vs in prepared]
    deltas = [ids.astype("<u8").tobytes() + vs.astype("<f8").tobytes() for ids, vs in prepared]
    bitfields = []
    for ids, vs in prepared:
        parts = [b"*%d\r\n$8\r\nBITFIELD\r\n$%d\r\n%s\r\n" % (2 + 4 * IDS, len(packed),
                                                          packed.encode())]
        for slot, bits in zip((ids - 1).tolist(), vs.view("<i8").tolist(), strict=True):
            offset, value = b"#%d" % slot, b"%d" % bits
            parts.append(b"$3\r\nSET\r\n$3\r\ni64\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n"
                         % (len(offset), offset, len(value), value))
        bitfields.append(b"".join(parts))
    read_then_write = client.register_script(READ_THEN_WRITE)
    append_delta = client.register_script(APPEND_DELTA)
    connection = client.connection_pool.get_connection()

    def bitfield(i: int) -> Any:
        connection.send_packed_command([bitfields[i % 64]])
        return connection.read_response()

    buffer = ReplayBuffer(url, f"floor-{size}", capacity=size, sampler=PERSampler())
    buffer.drop()
    buffer = ReplayBuffer(url, f"floor-{size}", capacity=size, sampler=PERSampler())
    for start in range(0, size, 1000):
        count = min(1000, size - start)
        buffer.add({"x": np.zeros(count, dtype=np.float32)}, priorities=rng.random(count))
    last = int(buffer.client.hget(buffer.keys.meta, "last_id"))
    updates = [(rng.integers(last - size + 1, last + 1, IDS), rng.random(IDS))
               for _ in range(64)]
    ways: list[tuple[str, str, Callable[[int], Any]]] = [
        ("PING", "ping", lambda i: client.ping()),
        ("script: HMGET then HSET of the 256 fields", "evalsha",
         lambda i: read_then_write(keys=[per], args=list(texts[i % 64]))),
        ("native HSET of the 256 fields", "hset",
         lambda i: client.execute_command("HSET", per, *fields[i % 64])),
        ("script: APPEND a packed delta", "evalsha",
         lambda i: append_delta(keys=[log, meta], args=[deltas[i % 64]])),
        ("native BITFIELD SET i64 x256 (packed array)", "bitfield", bitfield),
        ("redisbuf update_priority(256), count=False, no replica", "fcall",
         lambda i: bare.update_priority(*updates[i % 64], count=False)),
        ("redisbuf update_priority(256), the learner's replica counting", "fcall",
         lambda i: buffer.update_priority(*updates[i % 64])),
    ]
    bare = ReplayBuffer(url, f"floor-{size}", capacity=None)
    buffer.sample(1)  # the learner's replica, read (and its snapshot written) before timing
    rows = []
    for label, command, fn in ways:
        fn(0)
        client.config_resetstat()
        seconds = _timed(calls, fn)
        rows.append((label, seconds * 1e3, _server_us(client, command)))
        if command == "fcall" and np.isnan(rows[-1][2]):
            rows[-1] = (label, seconds * 1e3, _server_us(client, "evalsha"))
    client.connection_pool.release(connection)
    client.delete(per, packed, log, meta)
    buffer.drop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url")
    parser.add_argument("--sizes", default="1e5,2e6")
    parser.add_argument("--calls", type=int, default=1000)
    args = parser.parse_args()
    server = None if args.url else EmbeddedServer().start()
    url = args.url or server.url
    try:
        table = Table(title=f"Changing {IDS} priorities: ms per call (server us per call)")
        table.add_column("way")
        sizes = [int(float(s)) for s in args.sizes.split(",")]
        results = [measure(url, size, args.calls) for size in sizes]
        for size in sizes:
            table.add_column(f"{size:,} items", justify="right")
        for k, (label, _, _) in enumerate(results[0]):
            table.add_row(label, *(f"{r[k][1]:.3f} ({r[k][2]:.0f})" for r in results))
            for size, r in zip(sizes, results, strict=True):
                key = f"{key_of(label)}/{size}"
                record(f"{label}, {size:,} items", r[k][1], "ms", key=key)
                record(f"{label}, {size:,} items: server time", r[k][2], "us",
                       key=f"{key}/server")
        Console().print(table)
        print("load average:", load_average())
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
