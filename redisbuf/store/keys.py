"""Every Redis key of a buffer, in one place.

All keys of a buffer share the hash tag ``{name}``, so a buffer lives in one Redis
Cluster slot and one Lua script may touch all of them.

=========================  ======  =====================================================
key                        type    content
=========================  ======  =====================================================
``rb:{name}:meta``         hash    configuration, schema and counters
``rb:{name}:items``        hash    item id -> msgpack blob
``rb:{name}:prio``         zset    item id -> log-reward (priority); none without log_rewards
``rb:{name}:order``        zset    item id -> id (insertion order)
``rb:{name}:per``          hash    only of an earlier layout: PER priorities (now the log + snap)
``rb:{name}:perheap``      zset    item id -> PER priority, only once a heap selector used it
``rb:{name}:uses``         hash    item id -> times sampled
``rb:{name}:versions``     zset    item id -> model version it was produced with
``rb:{name}:times``        zset    one entry per add: "<first id>|<unix time>" scored by first id
``rb:{name}:vecs``         hash    item id -> compact state vector (diversity checks)
``rb:{name}:batches``      hash    batch id of a recent add -> its reply (see scripts.py)
``rb:{name}:batches:old``  hash    the previous generation of ``batches``, then forgotten
``rb:{name}:masslog``      list    score changes, for prioritized samplers' replicas (PER: the
                                   priorities after the snapshot)
``rb:{name}:snap``         hash    a replica's snapshot of the scores (PER: their copy behind
                                   the log)
``rb:{name}:shards``       hash    a sharded buffer's layout (see redisbuf/buffers/sharded.py)
``rb:{name}:quarantine``   hash    item id -> blob of a record set aside: it did not decode
``rb:{name}:applying``     hash    the large add being stored a slice at a time (its
                                   ``:blobs`` and ``:texts`` beside it; lua/_apply.lua)
=========================  ======  =====================================================

Other keys under the same tag: the control plane's ``rb:{name}:ctl:*``
(redisbuf/control/redis.py), a load's ``rb:{name}:staging:*`` and a large add's staged
slices ``rb:{name}:adding:*`` (they expire unless committed), which belong to the
buffer too (``drop`` deletes them), and the keys of an EpisodeBuffer, SequenceBuffer,
FragmentBuffer or StepStore of the same name (``episodes:``, ``seq:``, ``fragments:``,
``steps:``, see :class:`StepKeys`), which do not.

Item ids are positive integers written as 12-digit zero-padded decimals, so that
lexicographic order (Redis' tie-break inside a sorted set) is insertion order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

PREFIX = "rb"
# Key namespaces under a buffer's tag that belong to the other structures of the same name
# (redisbuf/buffers/episodes.py, sequence.py, fragments.py), which ReplayBuffer.drop leaves alone.
FOREIGN = ("episodes:", "seq:", "fragments:", "steps:")
ID_WIDTH = 12
#: Seconds a buffer remembers an add's batch id by default (``retry_window``), so that a
#: retried add is not inserted twice (see Script.__call__): far longer than any retry takes.
DEFAULT_RETRY_WINDOW = 600.0
# fullmatch: "$" alone would also accept a name ending in a newline
NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{1,200}")


def validate_name(name: str) -> str:
    """Return ``name`` if it is a valid buffer name, else raise ValueError."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise ValueError(
            f"invalid buffer name {name!r}: use 1-200 characters from A-Z a-z 0-9 _ . -"
        )
    return name


def storable(ids: np.ndarray) -> np.ndarray:
    """Which of ``ids`` (int64) an item can have: 1 .. 10^12 - 1, what ID_WIDTH digits hold."""
    return (ids >= 1) & (ids < 10**ID_WIDTH)


def format_id(item_id: int) -> bytes:
    return b"%012d" % item_id


def pack_ids(ids: np.ndarray) -> tuple[bytes, int]:
    """Ids as decimal text of one width, back to back, and that width: 12 (the stored form,
    :func:`format_id`) unless an id has more digits. One argument for a script instead of
    one per id, built without a Python loop (``unpack_ids`` in lua/_common.lua)."""
    import numpy as np  # not at import: `redisbuf --help` loads this module

    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    width = max(ID_WIDTH, len(str(int(ids.max())))) if len(ids) else ID_WIDTH
    powers = 10 ** np.arange(width - 1, -1, -1, dtype=np.int64)
    digits = (ids[:, None] // powers) % 10 + 48
    return digits.astype(np.uint8).tobytes(), width


def last_of_each(ids: Any) -> Any:
    """The index of each distinct id's last occurrence in ``ids`` (an array), in id
    order: where a change names an id twice, the last one wins."""
    import numpy as np

    return len(ids) - 1 - np.unique(ids[::-1], return_index=True)[1]


def split_ids(packed: bytes, width: int) -> list[bytes]:
    """The ids of :func:`pack_ids`'s text in their stored form (:func:`format_id`)."""
    if width == ID_WIDTH:
        return [packed[k : k + width] for k in range(0, len(packed), width)]
    return [format_id(int(packed[k : k + width])) for k in range(0, len(packed), width)]


def decode_meta(raw: dict[Any, Any]) -> dict[str, str]:
    """A buffer's meta hash (HGETALL) with its fields and values as text."""
    return {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in raw.items()
    }


def keeps_rewards(client: Any, keys: BufferKeys) -> bool:
    """Whether the ``prio`` zset holds the items' log-rewards: not for a buffer whose
    schema has no ``log_rewards`` field (meta ``rewards`` = 0), whose items' log-rewards
    are all 0 (reward order is then insertion order, the ``order`` zset)."""
    return client.hget(keys.meta, "rewards") not in (b"0", "0")


@dataclass(frozen=True)
class BufferKeys:
    """The key names of the buffer called ``name``.

    Args:
        name: the buffer's name.

    Raises:
        ValueError: an invalid buffer name.

    Examples:
        >>> from redisbuf import BufferKeys
        >>> keys = BufferKeys("demo")
        >>> keys.meta, keys.items
        ('rb:{demo}:meta', 'rb:{demo}:items')
    """

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
    def per_heap(self) -> str:
        """PER priorities in order (a sorted set), kept only once a heap selector by
        priority has been used on the buffer, or from its start when its remover reads
        PER priorities (meta ``per_heap`` = 1)."""
        return self._key("perheap")

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
    def batches_old(self) -> str:
        """The previous generation of ``batches`` (see lua/_remember.lua)."""
        return self._key("batches:old")

    @property
    def masslog(self) -> str:
        """The log of score changes that prioritized samplers' replicas follow."""
        return self._key("masslog")

    @property
    def snap(self) -> str:
        """A replica's snapshot of the scores (chunks of packed ids and scores), which a new
        replica reads instead of scanning every item (redisbuf/sampling/replica.py)."""
        return self._key("snap")

    def snap_staging(self, token: str) -> str:
        """Where a snapshot is written before it replaces :attr:`snap`.

        Args:
            token: the writer's token.

        Returns:
            The key name.
        """
        return self._key(f"snap:staging:{token}")

    @property
    def shards(self) -> str:
        """A sharded buffer's layout (shard names, capacity, schema); its shards are
        buffers of their own, and no buffer ``name`` exists beside them."""
        return self._key("shards")

    @property
    def quarantine(self) -> str:
        """Records set aside because they do not decode (item id -> blob, as stored),
        moved there by lua/quarantine.lua when a sample drew them
        (redisbuf/buffers/quarantine.py). Not among :meth:`all_keys`: only that script
        takes it; ``clear`` keeps it, ``drop`` deletes it."""
        return self._key("quarantine")

    def adding(self, batch_id: str) -> list[str]:
        """Where a large add stages its slices before its commit (lua/add_stage.lua): its
        blobs and its texts, which expire unless the commit takes them.

        Args:
            batch_id: the add's batch id.

        Returns:
            ``[blobs key, texts key]``.
        """
        return [self._key(f"adding:{batch_id}:blobs"), self._key(f"adding:{batch_id}:texts")]

    def applying_keys(self) -> list[str]:
        """The keys of the large add being stored a slice at a time (lua/_apply.lua): its
        state, its blobs and its texts, all gone once it is stored.

        Returns:
            ``[state, blobs, texts]``.
        """
        return [self._key("applying"), self._key("applying:blobs"),
                self._key("applying:texts")]

    def drawing(self, token: str) -> str:
        """The set of ids one large uniform draw has returned so far (its chunks exclude
        them; see UniformSampler): it expires 60 s after the draw's last chunk.

        Args:
            token: the draw's token.

        Returns:
            The key name.
        """
        return self._key(f"drawing:{token}")

    def data_keys(self) -> list[str]:
        """Keys holding items and sampling structures (everything but meta).

        Returns:
            The key names, in the order the scripts take them after meta.
        """
        return [
            self.items,
            self.prio,
            self.order,
            self.per_heap,
            self.per,
            self.uses,
            self.versions,
            self.times,
            self.vecs,
            self.batches,
            self.batches_old,
            self.masslog,
        ]

    def all_keys(self) -> list[str]:
        """Every key the buffer's scripts take, in their order.

        Returns:
            ``[meta, *data_keys()]`` (a new list each call).
        """
        return list(self._all_keys)

    @cached_property
    def _all_keys(self) -> tuple[str, ...]:
        # made once: every script call passes them (a frozen dataclass keeps no other state)
        return (self.meta, *self.data_keys())

    @property
    def pattern(self) -> str:
        """SCAN pattern of every key under the buffer's tag (names hold no glob character)."""
        return self._key("*")

    def owns(self, key: str) -> bool:
        """Whether ``key`` (under :attr:`pattern`) belongs to this buffer: not to another
        structure of the same name, nor to the sharded buffer whose layout it would be.

        Args:
            key: a key name under :attr:`pattern`.

        Returns:
            Whether the buffer owns it.

        Examples:
            >>> from redisbuf import BufferKeys
            >>> keys = BufferKeys("demo")
            >>> keys.owns("rb:{demo}:items"), keys.owns("rb:{demo}:shards")
            (True, False)
        """
        suffix = key[len(self._key("")) :]
        return not suffix.startswith(FOREIGN) and suffix != "shards"

    def describe(self) -> dict[str, str]:
        """Key name -> what it holds, for people reading the buffer with redis-cli.

        Returns:
            A dict from key name to a description.

        Examples:
            >>> from redisbuf import BufferKeys
            >>> BufferKeys("demo").describe()["rb:{demo}:items"]
            'hash: item id -> msgpack blob'
        """
        return {
            self.meta: "hash: configuration, schema, counters",
            self.items: "hash: item id -> msgpack blob",
            self.prio: "zset: item id -> log-reward",
            self.order: "zset: item id -> insertion order",
            self.per: "hash: an earlier layout's PER priorities (now the snapshot and the log)",
            self.per_heap: ("zset: item id -> PER priority (once a heap selector used it, or "
                            "kept for a remover by priority)"),
            self.uses: "hash: item id -> times sampled",
            self.versions: "zset: item id -> model version",
            self.times: "zset: one entry per add, \"<first id>|<unix time>\" by first id",
            self.vecs: "hash: item id -> compact state vector (diversity checks)",
            self.batches: "hash: recent add's batch id -> its reply (retried adds)",
            self.batches_old: "hash: the previous generation of the batch ids (then forgotten)",
            self.masslog: "list: score changes, for prioritized samplers' replicas "
                          "(PER: the priorities after the snapshot rb:{name}:snap)",
        }


@dataclass(frozen=True)
class StagingKeys(BufferKeys):
    """The keys a restore builds a buffer's new content under before swapping it in
    (``rb:{name}:staging:TOKEN:...``): the same hash tag, so one script may rename them
    over the buffer's own keys, and a token so that concurrent restores do not mix."""

    token: str = "0"

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:staging:{self.token}:{suffix}"


@dataclass(frozen=True)
class StepKeys:
    """The key names of the step store called ``name`` (redisbuf/buffers/steps.py): steps
    stored once, in chunks, which items of any number of buffers reference.

    =================================  ======  ==========================================
    key                                type    content
    =================================  ======  ==========================================
    ``rb:{name}:steps:meta``           hash    counters, the chunk sequence, the sweep's
                                               cursor, the tables' registry (``table:T``
                                               -> index, ``tname:I`` -> name)
    ``rb:{name}:steps:chunks``         hash    chunk key -> msgpack blob of its steps
    ``rb:{name}:steps:refs``           hash    chunk key -> the items referencing it
                                               (``I:ID`` words: table index, item id)
    ``rb:{name}:steps:order``          zset    chunk key -> its sequence number
    ``rb:{name}:steps:dead``           zset    chunk key -> server ms it was found
                                               unreferenced (freed a grace period later)
    ``rb:{name}:steps:tables``         hash    table name -> JSON description (signature)
    =================================  ======  ==========================================

    Examples:
        >>> from redisbuf.store.keys import StepKeys
        >>> StepKeys("demo").chunks
        'rb:{demo}:steps:chunks'
    """

    name: str

    def __post_init__(self) -> None:
        validate_name(self.name)

    def _key(self, suffix: str) -> str:
        return f"{PREFIX}:{{{self.name}}}:steps:{suffix}"

    @property
    def meta(self) -> str:
        return self._key("meta")

    @property
    def chunks(self) -> str:
        return self._key("chunks")

    @property
    def refs(self) -> str:
        return self._key("refs")

    @property
    def order(self) -> str:
        return self._key("order")

    @property
    def dead(self) -> str:
        return self._key("dead")

    @property
    def tables(self) -> str:
        return self._key("tables")

    @property
    def batches(self) -> str:
        """The memory of recent inserts' batch ids (a retried insert runs once)."""
        return self._key("batches")

    @property
    def batches_old(self) -> str:
        return self._key("batches:old")

    def all_keys(self) -> list[str]:
        """The keys the step scripts take first, in their order.

        Returns:
            ``[meta, chunks, refs, order, dead, tables]``.
        """
        return [self.meta, self.chunks, self.refs, self.order, self.dead, self.tables]

    @property
    def pattern(self) -> str:
        """SCAN pattern of every key of the store."""
        return self._key("*")
