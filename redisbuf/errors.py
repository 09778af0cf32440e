"""redisbuf's own exceptions. Catch :class:`RedisBufError` for all of them; bad arguments
may also raise plain ``ValueError`` / ``TypeError`` / ``KeyError``."""

from __future__ import annotations

import redis.exceptions


class RedisBufError(Exception):
    """Base class of every redisbuf error."""


class ConfigMismatchError(RedisBufError, ValueError):
    """The buffer's stored configuration differs from the one asked for."""


class SchemaError(RedisBufError, ValueError):
    """A batch's container kind, field dtypes or trailing shapes do not fit the buffer."""


class InvalidBatchError(RedisBufError, ValueError):
    """A batch is malformed: mismatched lengths, NaN log-rewards, bad values."""


class ItemTooLargeError(InvalidBatchError):
    """One encoded item is larger than the buffer's ``max_item_bytes``."""


class RequestTooLargeError(InvalidBatchError):
    """One call asked the server for more items than one command may touch
    (:data:`redisbuf.store.bounds.MAX_ITEMS_PER_COMMAND`; a batch ``add`` above
    :data:`~redisbuf.store.bounds.MAX_ADD_ITEMS`); the message names the limit. Nothing
    was written. The server's scripts and FCALL functions reply ``RB_LIMIT`` likewise."""


class EmptyBufferError(RedisBufError, LookupError, ValueError):
    """Sampling was asked of a buffer that holds no item that can be drawn. Also a
    ValueError, which is what torchgfn's buffers raise (and its users catch) there."""


class SamplingError(RedisBufError, ValueError):
    """The asked-for draw is undefined: a softmax over log-rewards that include +inf, or
    more draws without replacement than items of nonzero probability."""


class MissingExtraError(RedisBufError, ImportError):
    """What was asked needs an optional dependency that is not installed; the message names
    the extra that installs it (e.g. ``pip install 'redisbuf[plot]'``)."""


class DecodeError(RedisBufError, ValueError):
    """A stored blob is not a valid redisbuf item."""


class ServerUnavailableError(RedisBufError, redis.exceptions.ConnectionError, ConnectionError):
    """The Redis server cannot be reached, or was lost (the message names the URL, without
    its password). Also a redis-py ``ConnectionError``, for code that catches those."""


class ServerConfigError(RedisBufError):
    """The server is configured in a way that can lose a buffer (``strict=True``)."""


class DurabilityError(RedisBufError):
    """An add was applied but its requested durability (AOF fsync, a replica) was not
    confirmed in time; the batch is in the buffer and may be lost in a crash."""


class ProtocolError(RedisBufError):
    """A control-plane peer sent something unexpected, or did not answer in time."""


class ControlTimeoutError(ProtocolError, TimeoutError):
    """A control-plane peer did not answer within the timeout."""


class WaitTimeoutError(RedisBufError, TimeoutError):
    """A blocking call waited its whole timeout for a buffer (the message names it)."""


class RateLimitTimeoutError(WaitTimeoutError):
    """A rate limiter held an insert or a sample back for its whole timeout (the message
    says which side waited, for what)."""


class FetchTimeoutError(WaitTimeoutError):
    """A waiting read (``FragmentBuffer.fetch``) found too little data within its timeout."""


class ShardUnavailableError(ServerUnavailableError):
    """One shard of a sharded buffer cannot be reached (its Redis Cluster master is down,
    or the connection to it was lost). ``shard`` is its index; the message names the
    buffer, the shard and its node. The other shards are untouched."""

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
    and the ones after it are as they were); the cause is chained."""

    def __init__(self, message: str, restored: list[int], failed: int) -> None:
        super().__init__(message)
        self.restored = restored
        self.failed = failed
