"""Every Redis key of a buffer, in one place.

All keys of a buffer share the hash tag ``{name}``, so a buffer lives in one Redis
Cluster slot and one Lua script may touch all of them.

=========================  ======  =====================================================
key                        type    content
=========================  ======  =====================================================
``rb:{name}:meta``         hash    configuration, schema and counters
``rb:{name}:items``        hash    item id -> msgpack blob
``rb:{name}:prio``         zset    item id -> log-reward (priority)
``rb:{name}:order``        zset    item id -> id (insertion order)
``rb:{name}:tree``         hash    sum-tree node v -> 16 masses of its children 16v+1..16v+16
``rb:{name}:tree:ids``     hash    bucket b -> item ids of leaf slots 16b..16b+15
``rb:{name}:tree:slots``   hash    bucket b -> leaf slots of item ids 16b..16b+15
``rb:{name}:tree:free``    list    leaf slots freed by removals, reused first
``rb:{name}:per``          zset    item id -> PER priority (prioritized experience replay)
``rb:{name}:uses``         hash    item id -> times sampled
``rb:{name}:versions``     zset    item id -> model version it was produced with
``rb:{name}:times``        hash    item id -> insertion time
``rb:{name}:vecs``         hash    item id -> compact state vector (diversity checks)
``rb:{name}:batches``      hash    batch id of a recent add -> its reply (see scripts.py)
``rb:{name}:batchtime``    zset    batch id -> time it was added (ms), to forget it
``rb:{name}:shards``       hash    a sharded buffer's layout (see redisbuf/sharded.py)
=========================  ======  =====================================================

Item ids are positive integers written as 12-digit zero-padded decimals, so that
lexicographic order (Redis' tie-break inside a sorted set) is insertion order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

PREFIX = "rb"
ID_WIDTH = 12
# fullmatch: "$" alone would also accept a name ending in a newline
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid buffer name, else raise ValueError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"invalid buffer name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . -"
        )
    return name


def format_id(item_id: int) -> bytes:
    return b"%012d" % item_id


@dataclass(frozen=True)
class BufferKeys:
    """The key names of the buffer called ``name``."""

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:{suffix}"

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def items(self) -> str:
        return self._key("items")

    @property
    def prio(self) -> str:
        return self._key("prio")

    @property
    def order(self) -> str:
        return self._key("order")

    @property
    def tree(self) -> str:
        return self._key("tree")

    @property
    def tree_ids(self) -> str:
        return self._key("tree:ids")

    @property
    def tree_slots(self) -> str:
        return self._key("tree:slots")

    @property
    def tree_free(self) -> str:
        return self._key("tree:free")

    @property
    def per(self) -> str:
        return self._key("per")

    @property
    def uses(self) -> str:
        return self._key("uses")

    @property
    def versions(self) -> str:
        return self._key("versions")

    @property
    def times(self) -> str:
        return self._key("times")

    @property
    def vecs(self) -> str:
        return self._key("vecs")

    @property
    def batches(self) -> str:
        return self._key("batches")

    @property
    def batch_times(self) -> str:
        return self._key("batchtime")

    @property
    def masslog(self) -> str:
        """The log of score changes that prioritized samplers' replicas follow."""
        return self._key("masslog")

    @property
    def shards(self) -> str:
        """A sharded buffer's layout (shard names, capacity, schema); its shards are
        buffers of their own, and no buffer ``name`` exists beside them."""
        return self._key("shards")

    def data_keys(self) -> list[str]:
        """Keys holding items and sampling structures (everything but meta)."""
        return [
            self.items,
            self.prio,
            self.order,
            self.tree,
            self.tree_ids,
            self.tree_slots,
            self.tree_free,
            self.per,
            self.uses,
            self.versions,
            self.times,
            self.vecs,
            self.batches,
            self.batch_times,
            self.masslog,
        ]

    def all_keys(self) -> list[str]:
        return [self.meta, *self.data_keys()]

    def describe(self) -> dict[str, str]:
        """Key name -> what it holds, for people reading the buffer with redis-cli."""
        return {
            self.meta: "hash: configuration, schema, counters",
            self.items: "hash: item id -> msgpack blob",
            self.prio: "zset: item id -> log-reward",
            self.order: "zset: item id -> insertion order",
            self.per: "zset: item id -> PER priority",
            self.uses: "hash: item id -> times sampled",
            self.versions: "zset: item id -> model version",
            self.times: "hash: item id -> insertion time",
            self.vecs: "hash: item id -> compact state vector (diversity checks)",
            self.batches: "hash: recent add's batch id -> its reply (retried adds)",
            self.batch_times: "zset: recent add's batch id -> when (ms), for forgetting",
            self.masslog: "list: recent score changes, for prioritized samplers' replicas",
        }


@dataclass(frozen=True)
class StagingKeys(BufferKeys):
    """The keys a restore builds a buffer's new content under before swapping it in
    (``rb:{name}:staging:TOKEN:...``): the same hash tag, so one script may rename them
    over the buffer's own keys, and a token so that concurrent restores do not mix."""

    token: str = "0"

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:staging:{self.token}:{suffix}"
