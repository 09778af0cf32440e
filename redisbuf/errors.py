"""redisbuf's own exceptions. Catch :class:`RedisBufError` for all of them; bad arguments
may also raise plain ``ValueError`` / ``TypeError`` / ``KeyError``."""

from __future__ import annotations

import redis.exceptions


class RedisBufError(Exception):
    """Base class of every redisbuf error.

    ``code`` (a class attribute) is the ``RB_*`` code of the server scripts' and FCALL
    functions' error reply that the class stands for (:data:`SCRIPT_ERRORS`), whether
    the error came from the server or was raised in Python; None for classes that stand
    for no code. A reply with a code no class has becomes a plain ``RedisBufError``
    whose instance ``code`` is that code. Tell errors apart by class
    (``except NoSuchBufferError``), not by comparing codes.

    Attributes:
        code: the ``RB_*`` code, or ``None``.

    Examples:
        >>> import fakeredis
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import EmptyBufferError, RedisBufError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> try:
        ...     buffer.sample(1)
        ... except RedisBufError as error:
        ...     print(type(error).__name__, error.code, isinstance(error, EmptyBufferError))
        EmptyBufferError RB_EMPTY True
    """

    code: str | None = None


class ConfigMismatchError(RedisBufError, ValueError):
    """The buffer's stored configuration differs from the one asked for (a script's
    ``RB_CONFIG``: e.g. PER priorities for a buffer without PER). The subclasses below
    are the script replies a caller must tell apart; ``except ConfigMismatchError``
    catches them all."""

    code = "RB_CONFIG"


class NoSuchBufferError(ConfigMismatchError):
    """The buffer does not exist (a script's ``RB_NOBUF``: it was dropped, or never
    made); scripts that meet it write nothing, so a dropped buffer is not recreated."""

    code = "RB_NOBUF"


class PrioritizedSamplingOffError(ConfigMismatchError):
    """Prioritized sampling (softmax or PER) is not on for the buffer (``RB_NOLOG``):
    the buffer was dropped and made again, or turned on for the other rule. The
    samplers turn it back on when they meet it."""

    code = "RB_NOLOG"


class PerBusyError(ConfigMismatchError):
    """PER is being turned on by another process, a slice at a time (``RB_BUSY``):
    finish turning it on (any process may) and retry."""

    code = "RB_BUSY"


class HeapNotBuiltError(ConfigMismatchError):
    """A MaxHeap / MinHeap selector by PER priority asked before the buffer's priority
    heap is built (``RB_NOHEAP``): build it (lua/heap_build.lua, a bounded slice a call;
    the selectors do) and retry. An add refuses with it, before any write, when the
    buffer's remover reads the heap and none is kept (opening the buffer with its
    remover builds it)."""

    code = "RB_NOHEAP"


class NoSnapshotError(ConfigMismatchError):
    """A draw made by the server (FCALL ``rb_sample_per``) found no snapshot of the
    buffer's PER priorities of this log epoch (``RB_NOSNAP``): a Python process that
    samples or reads the buffer writes one."""

    code = "RB_NOSNAP"


class SnapshotBehindError(ConfigMismatchError):
    """A draw made by the server (FCALL ``rb_sample_per``) found more log after the
    snapshot than one command reads (``RB_BEHIND``): a following sampler writes a newer
    one every max(5,000, length / 8) rows."""

    code = "RB_BEHIND"


class BufferShardedError(ConfigMismatchError):
    """The name is a sharded buffer's (``RB_SHARDED``): a plain buffer of that name
    would hide it, so none is made."""

    code = "RB_SHARDED"


class BufferNotShardedError(ConfigMismatchError):
    """The name is a plain buffer's, asked for as a sharded one (``RB_UNSHARDED``)."""

    code = "RB_UNSHARDED"


class SchemaError(RedisBufError, ValueError):
    """A batch's container kind, field dtypes or trailing shapes do not fit the buffer.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import SchemaError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> _ = buffer.add({"obs": np.zeros(2), "log_rewards": np.zeros(2)})
        >>> try:
        ...     buffer.add({"obs": np.zeros((2, 3)), "log_rewards": np.zeros(2)})
        ... except SchemaError:
        ...     print("refused; the buffer keeps", len(buffer), "items")
        refused; the buffer keeps 2 items
    """

    code = "RB_SCHEMA"


class InvalidBatchError(RedisBufError, ValueError):
    """A batch is malformed: mismatched lengths, NaN log-rewards, bad values.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import InvalidBatchError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> try:
        ...     buffer.add({"obs": np.zeros(2), "log_rewards": np.array([0.0, np.nan])})
        ... except InvalidBatchError as error:
        ...     print(error)
        log_rewards contains NaN (items [1])
    """

    code = "RB_INVALID"


class ItemTooLargeError(InvalidBatchError):
    """One encoded item is larger than the buffer's ``max_item_bytes``.

    Examples:
        >>> import fakeredis, numpy as np
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import ItemTooLargeError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", max_item_bytes=64)
        >>> try:
        ...     buffer.add({"obs": np.zeros((1, 100)), "log_rewards": np.zeros(1)})
        ... except ItemTooLargeError as error:
        ...     print(error)
        item 0 encodes to ... bytes, over max_item_bytes=64
    """


class UnsupportedItemError(InvalidBatchError, TypeError):
    """An item of a schemaless buffer holds a value the nest codec does not store
    (:mod:`redisbuf.store.nest`): the message names its path and type. Also a
    ``TypeError``. Nothing was written.

    Examples:
        >>> import fakeredis
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import UnsupportedItemError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo", kind="nest")
        >>> try:
        ...     buffer.add([{"obs": [1, 2]}, {"obs": {1, 2}}])
        ... except TypeError as error:
        ...     print(type(error).__name__, "--", str(error)[:55], "--", len(buffer))
        UnsupportedItemError -- cannot store items[1]['obs']: a value of type set (a ne -- 0
    """


class RequestTooLargeError(InvalidBatchError):
    """One call asked the server for more items than one command may touch
    (:data:`redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`; an ``add`` above
    :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS` where no large add may store it: a
    diverse buffer, a remover that chooses at random); the message names the limit.
    Nothing was written. The server's scripts and FCALL functions reply ``RB_LIMIT``
    likewise."""

    code = "RB_LIMIT"


class EmptyBufferError(RedisBufError, LookupError, ValueError):
    """Sampling was asked of a buffer that holds no item that can be drawn. Also a
    ValueError, which is what torchgfn's buffers raise (and its users catch) there.

    Examples:
        >>> import fakeredis
        >>> from redisbuf import ReplayBuffer
        >>> try:
        ...     ReplayBuffer(fakeredis.FakeRedis(), "demo").sample(1)
        ... except ValueError as error:  # torchgfn's users catch ValueError
        ...     print(error)
        buffer 'demo': buffer is empty
    """

    code = "RB_EMPTY"


class SamplingError(RedisBufError, ValueError):
    """The asked-for draw is undefined: a softmax over log-rewards that include +inf, or
    more draws without replacement than items of nonzero probability."""

    code = "RB_UNDEFINED"


class MissingExtraError(RedisBufError, ImportError):
    """What was asked needs an optional dependency that is not installed; the message names
    the extra that installs it (e.g. ``pip install 'redisbuf[plot]'``)."""


class DecodeError(RedisBufError, ValueError):
    """A stored blob is not a valid redisbuf item."""


class QuarantinedRecordWarning(RuntimeWarning):
    """A sample drew a stored record that does not decode (another client wrote it, e.g.
    with FCALL ``rb_add``); it was set aside in the buffer's quarantine hash
    (``rb:{name}:quarantine``) and the draw made again without it. The message names the
    buffer, the item id and the decode error."""


class ServerUnavailableError(RedisBufError, redis.exceptions.ConnectionError, ConnectionError):
    """The Redis server cannot be reached, or was lost (the message names the URL, without
    its password). Also a redis-py ``ConnectionError``, for code that catches those."""


class SamplerProcessError(RedisBufError):
    """A sampler process (:mod:`redisbuf.buffers.batch_processes`) failed with an error
    that is neither redisbuf's nor a builtin one (its type and message are in the text),
    or it exited without answering."""


class ServerConfigError(RedisBufError):
    """The server is configured in a way that can lose a buffer (``strict=True``)."""


class ServerFullError(RedisBufError, redis.exceptions.OutOfMemoryError):
    """The server refused an add because its memory is above ``maxmemory`` and its policy
    (``noeviction``) evicts nothing; the message names the buffer. Nothing of the batch
    was written. Reads and draws keep working on such a server. Also a redis-py
    ``OutOfMemoryError``, for code that catches those."""


class DurabilityError(RedisBufError):
    """An add was applied but its requested durability (AOF fsync, a replica) was not
    confirmed in time; the batch is in the buffer and may be lost in a crash."""


class ProtocolError(RedisBufError):
    """A control-plane peer sent something unexpected, or did not answer in time."""


class ControlTimeoutError(ProtocolError, TimeoutError):
    """A control-plane peer did not answer within the timeout."""


class WaitTimeoutError(RedisBufError, TimeoutError):
    """A blocking call waited its whole timeout for a buffer (the message names it).

    Examples:
        >>> import fakeredis
        >>> from redisbuf import ReplayBuffer
        >>> from redisbuf.errors import WaitTimeoutError
        >>> buffer = ReplayBuffer(fakeredis.FakeRedis(), "demo")
        >>> try:
        ...     buffer.sample(1, block=True, timeout=0)
        ... except TimeoutError as error:
        ...     print(type(error).__name__)
        WaitTimeoutError
    """


class RateLimitTimeoutError(WaitTimeoutError):
    """A rate limiter held an insert or a sample back for its whole timeout (the message
    says which side waited, for what)."""


class FetchTimeoutError(WaitTimeoutError):
    """A waiting read (``FragmentBuffer.fetch``) found too little data within its timeout."""


class ShardUnavailableError(ServerUnavailableError):
    """One shard of a sharded buffer cannot be reached (its Redis Cluster master is down,
    or the connection to it was lost). ``shard`` is its index; the message names the
    buffer, the shard and its node. The other shards are untouched.

    Args:
        message: the message.
        shard: the shard's index.

    Attributes:
        shard: the shard's index.
    """

    def __init__(self, message: str, shard: int) -> None:
        super().__init__(message)
        self.shard = shard


class ShardedBufferError(RedisBufError, ValueError):
    """An operation that does not support sharded buffers (opening with
    :meth:`ReplayBuffer.open`, the command line other than ``export`` / ``import``) was
    asked of one."""


class PartialLoadError(RedisBufError):
    """A sharded buffer's ``load`` / ``load_state_dict`` failed after some shards were
    already restored (each shard's restore is atomic, the whole is not). ``restored``
    lists the shards that hold the loaded items, ``failed`` the shard that failed (it
    and the ones after it are as they were); the cause is chained.

    Args:
        message: the message.
        restored: the shards restored.
        failed: the shard that failed.

    Attributes:
        restored: the shards that hold the loaded items.
        failed: the shard that failed.
    """

    def __init__(self, message: str, restored: list[int], failed: int) -> None:
        super().__init__(message)
        self.restored = restored
        self.failed = failed


class StepsGoneError(RedisBufError):
    """An insert into a step store referenced chunks the store no longer holds (its
    sweep freed them: no item referenced them any longer); nothing was written. A writer
    that still holds those steps sends them again (redisbuf/buffers/step_writer.py).

    Attributes:
        chunks: the keys of the missing chunks.
    """

    code = "RB_GONE"

    def __init__(self, message: str) -> None:
        super().__init__(f"chunks no longer held: {message}")
        self.chunks = message.split()


class ApplyingError(RedisBufError):
    """A large add (more than one add's bound, stored a slice at a time) is being stored
    in the buffer (``RB_APPLYING``): every script on the buffer refuses, before any read
    or write, until it is stored whole. The runner (redisbuf/store/applying.py) stores the
    rest itself (``add_apply``) and calls again, so callers meet this error only where
    they may not write (a read-only replica, the operator role) and the add did not end
    within their wait."""

    code = "RB_APPLYING"


# The one mapping of script error codes to exceptions: a script's or FCALL function's
# error reply that starts with a code becomes an instance of its class here
# (redisbuf/store/scripts.py, translate).
SCRIPT_ERRORS: dict[str, type[RedisBufError]] = {
    cls.code: cls
    for cls in (
        EmptyBufferError,
        SchemaError,
        ConfigMismatchError,
        NoSuchBufferError,
        PrioritizedSamplingOffError,
        PerBusyError,
        HeapNotBuiltError,
        NoSnapshotError,
        SnapshotBehindError,
        BufferShardedError,
        BufferNotShardedError,
        InvalidBatchError,
        SamplingError,
        RequestTooLargeError,
        StepsGoneError,
        ApplyingError,
    )
}
