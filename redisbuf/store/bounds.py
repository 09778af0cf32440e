"""The bound on one command's work: how many items one server call may touch.

Redis runs one command at a time, so a buffer is only as shared as its longest command:
while one script runs, every other client's add, sample and even PING waits. Every
operation whose work grows with the request is therefore made of commands of at most
:data:`MAX_ITEMS_PER_COMMAND` items each: the client splits a larger request (a sample,
a get, ``top(k)``, a listing) into several commands, and the server's scripts and FCALL
functions refuse a request above the bound with ``RB_LIMIT`` (:class:`RequestTooLargeError`
in Python), so that a client that is not ours cannot stall the server either.

The numbers come from measurement (``benchmarks/bench_latency.py``; docs/performance.md):
at 4 KiB items, on Redis 7.0, on the 2-core development machine while other jobs kept
its load average at 7, a bounded draw or read (a uniform draw of 2048 items from a buffer
whose ids have holes, with its bookkeeping; the HMGET of their blobs) took 12-20 ms of
server time, and an add of 1024 items 27 ms (median); a command of 4096 took twice that.
The server's work per command also grows with the items' size (it copies the blobs into
its reply): :data:`MAX_REPLY_BYTES` bounds what the client asks one command to return.
"""

from __future__ import annotations

#: Items one command may draw, read, add, rank or list (uniform draws, ``get``, ``add``,
#: ``top``, selectors, windows, sequence and episode draws, exports).
MAX_ITEMS_PER_COMMAND = 2048

#: Windows one ``SequenceBuffer.get_batch`` draws: one script chooses them all, so a
#: larger batch is refused (the scripts enforce the same number, RB_MAX_ITEMS).
MAX_WINDOWS_PER_DRAW = MAX_ITEMS_PER_COMMAND

#: A batch ``add`` is one atomic command (readers see all of it or none), so it is
#: refused above this many items instead of being split (:class:`RequestTooLargeError`).
#: Storing an item (order, log-reward, time, eviction of another) costs several times
#: what drawing one does: 2048 took 38 ms at 4 KiB on the loaded development machine.
MAX_ADD_ITEMS = 1024

#: Blob bytes one ``add`` of more than one item may store (32 MiB; about 500 items of
#: 64 KiB): the server's time for an add grows with its bytes as well as its items (it
#: copies the blobs in and, at capacity, frees as many bytes of evicted ones). Measured
#: with ``benchmarks/bench_latency.py --items 20000 --only add`` on the 2-core development
#: machine (valkey 8.1, load average 1.6-2.5, 2026-11-27), adds to a full buffer, three
#: each, without this bound, what a PINGing probe waited at worst (the slowest command in
#: SLOWLOG): 1024 items of 4 KiB 8-15 ms (8-10 ms), 1024 of 64 KiB 18-40 ms (10-32 ms),
#: 512 of 64 KiB 10-24 ms (5-17 ms), 256 of 64 KiB 4-8 ms (3-4 ms). A batch above it is
#: refused like one above :data:`MAX_ADD_ITEMS` (the add is atomic); one item alone may
#: be larger (up to the buffer's ``max_item_bytes``).
MAX_ADD_BYTES = 32 * 1024 * 1024

#: Blob bytes the client asks one read command to return: a chunk of a large ``get`` or
#: sample holds at most this many bytes of blobs, as far as the first chunk's sizes tell.
MAX_REPLY_BYTES = 16 * 1024 * 1024


#: Elements of a key MEMORY USAGE looks at (``stats()``, metrics): an estimate from this
#: many, where ``SAMPLES 0`` (every element) took ~300 ms on a 2x10^6-item buffer.
MEMORY_USAGE_SAMPLES = 1000


def items_for_bytes(bytes_per_item: float) -> int:
    """Items per read command for blobs of ``bytes_per_item`` on average: at most
    :data:`MAX_ITEMS_PER_COMMAND`, and at most :data:`MAX_REPLY_BYTES` of blobs (at least 1)."""
    if bytes_per_item <= 0:
        return MAX_ITEMS_PER_COMMAND
    return max(1, min(MAX_ITEMS_PER_COMMAND, int(MAX_REPLY_BYTES // bytes_per_item)))


def add_slices(sizes: list[int], max_bytes: int | None = None) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive batches of items whose encoded sizes are ``sizes``,
    each an add the bounds allow: at most :data:`MAX_ADD_ITEMS` items and
    :data:`MAX_ADD_BYTES` bytes, or ``max_bytes`` when lower (an item larger than that
    alone)."""
    limit = MAX_ADD_BYTES if max_bytes is None else min(max_bytes, MAX_ADD_BYTES)
    slices: list[tuple[int, int]] = []
    start, held = 0, 0
    for index, size in enumerate(sizes):
        if index > start and (index - start >= MAX_ADD_ITEMS or held + size > limit):
            slices.append((start, index))
            start, held = index, 0
        held += size
    if start < len(sizes):
        slices.append((start, len(sizes)))
    return slices


def add_refusal(count: int, size: int) -> str | None:
    """Why an add of ``count`` items of ``size`` blob bytes in all is above the bounds
    (a message naming the limit), or None when one command may store it."""
    if count > MAX_ADD_ITEMS:
        return (f"one add stores at most {MAX_ADD_ITEMS} items "
                f"(redisbuf.store.bounds.MAX_ADD_ITEMS), got {count}")
    if count > 1 and size > MAX_ADD_BYTES:
        return (f"one add of more than one item stores at most {MAX_ADD_BYTES} bytes of "
                f"items (redisbuf.store.bounds.MAX_ADD_BYTES), got {size} in {count} items")
    return None


def chunks(total: int, size: int = MAX_ITEMS_PER_COMMAND) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive slices of ``range(total)``, ``size`` long each
    (the last shorter)."""
    return [(start, min(start + size, total)) for start in range(0, total, size)]


__all__ = [
    "MAX_ADD_BYTES",
    "MAX_ADD_ITEMS",
    "MAX_ITEMS_PER_COMMAND",
    "MAX_REPLY_BYTES",
    "MEMORY_USAGE_SAMPLES",
    "add_refusal",
    "add_slices",
    "chunks",
    "items_for_bytes",
]
