"""What every view of one ``redisbuf.ding`` buffer shares: the redisbuf buffer behind it
(a schemaless one, opened again when a middleware fixes a setting), how its records
hold DI-engine's ``(data, meta)`` pairs, and this facade's own server state.

Each item is one nest record ``{"meta": meta, "data": data}`` (meta first, so a scan of
the metas skips the data: :func:`meta_of`). Indices are the items' redisbuf ids as the
12-digit text of the wire format (``"000000000042"``), so ``HGET rb:{name}:items
<index>`` reads an item. The facade's state that is not the buffer's (the annealing of
``PriorityExperienceReplay``'s IS exponent) lives in the hash ``rb:{name}:ding``, under
the buffer's tag, so ``drop`` deletes it with the buffer.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections import OrderedDict
from typing import Any

import msgpack

from ..buffers.replay import ReplayBuffer
from ..sampling.samplers import PERSampler
from ..store import nest
from ..store.connection import as_client
from ..store.keys import BufferKeys, format_id

#: the session every process's ``staleness_check`` makes current (redisbuf sessions:
#: another one would remove every item)
SESSION = "ding"
#: how many drawn records a process keeps for a later ``update`` of their meta (LRU)
RECORD_CACHE = 4096


def index_of(item_id: int) -> str:
    """The DI-engine index (a str) of an item id."""
    return format_id(item_id).decode()


def id_of(index: Any) -> int | None:
    """The item id of a DI-engine index, or None when ``index`` is not one of ours."""
    if isinstance(index, str) and len(index) == 12 and index.isdigit() and index.isascii():
        return int(index)
    return None


def record(data: Any, meta: dict) -> dict[str, Any]:
    return {"meta": meta, "data": data}


def meta_of(blob: bytes) -> Any:
    """The meta of a record, without decoding its data."""
    unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
    unpacker.feed(blob)
    for _ in range(unpacker.read_map_header()):
        key = unpacker.unpack()
        start = unpacker.tell()
        unpacker.skip()
        if key == "meta":
            return nest.decode_nest(blob[start : unpacker.tell()])
    return {}


class Shared:
    """One buffer's redisbuf handles and settings, shared by a DequeBuffer and its views.

    ``engine`` draws uniformly (and reads, writes, removes); ``per_engine``, once a
    ``PriorityExperienceReplay`` is used, draws by priority. A buffer made without a
    name gets a fresh one and is dropped when the last object sharing it is gone."""

    def __init__(self, size: int, url: Any, name: str | None) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive integer, got {size!r}")
        self.size = size
        self.private = name is None
        self.name = f"ding-{uuid.uuid4().hex}" if name is None else name
        #: the client of the buffer's server (redis-py's replies are Any here)
        self.client: Any = as_client(url)
        self.keys = BufferKeys(self.name)
        self.state_key = self.keys.pattern[:-1] + "ding"  # rb:{name}:ding
        self.lock = threading.RLock()
        self.max_use: int | None = None
        self.max_staleness: int | None = None
        self.alpha: float | None = None
        self.engine = self._open(None)
        self.per_engine: ReplayBuffer | None = None
        self.cache: OrderedDict[int, bytes] = OrderedDict()  # drawn records, by id
        self.local = threading.local()  # a draw's decoded records, for the chain's read
        if self.private:
            weakref.finalize(self, _drop, self.client, self.name)

    def _open(self, sampler: PERSampler | None) -> ReplayBuffer:
        return ReplayBuffer(
            self.client, self.name, capacity=self.size, kind="nest", sampler=sampler,
            max_use=self.max_use, max_staleness=self.max_staleness,
        )

    def configure(self, *, max_use: int | None = None, max_staleness: int | None = None,
                  alpha: float | None = None) -> None:
        """Fix a lifetime setting or turn PER on, on the server (for every process); a
        lifetime setting only while the buffer has never held an item (redisbuf fixes
        them then: ConfigMismatchError otherwise, unless the stored one is the same)."""
        with self.lock:
            if max_use is not None:
                self.max_use = max_use
            if max_staleness is not None:
                self.max_staleness = max_staleness
            if alpha is not None:
                self.alpha = alpha
            self.engine = self._open(None)
            if self.alpha is not None:
                self.per_engine = self._open(
                    PERSampler(alpha=self.alpha, beta=1.0, initial_priority=1.0, eps=0.0,
                           stratified=True))

    def per(self) -> ReplayBuffer:
        """The handle that draws by priority (a ``PriorityExperienceReplay`` made it)."""
        if self.per_engine is None:
            raise RuntimeError(f"buffer {self.name!r}: PER is not turned on in this process")
        return self.per_engine

    def per_on(self) -> bool:
        """Whether the buffer has PER priorities (some process turned them on)."""
        return self.per_engine is not None or self.client.hget(self.keys.meta, "mass") == b"per"

    def remember(self, ids: list[int], blobs: list[bytes] | None) -> None:
        """Keep drawn records for a compare and set by a later update of their meta."""
        if not blobs:
            return
        with self.lock:
            for item_id, blob in zip(ids, blobs, strict=True):
                self.cache[item_id] = blob
                self.cache.move_to_end(item_id)
            while len(self.cache) > RECORD_CACHE:
                self.cache.popitem(last=False)


def _drop(client: Any, name: str) -> None:
    try:
        ReplayBuffer.open(client, name).drop()
    except Exception:  # noqa: BLE001 - best effort at exit: the server may be gone
        pass
