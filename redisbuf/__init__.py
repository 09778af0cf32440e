"""redisbuf: a replay buffer shared by many processes, stored in Redis."""

from .buffer import AddResult, ReplayBuffer, SampleInfo
from .connection import connect
from .containers import States, Trajectories, Transitions
from .errors import (
    ConfigMismatchError,
    ControlTimeoutError,
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
    ItemTooLargeError,
    ProtocolError,
    RedisBufError,
    SchemaError,
    ServerUnavailableError,
)
from .keys import BufferKeys
from .samplers import PrioritizedSampler, UniformSampler
from .sequence import BatchInfo, SequenceBuffer

__version__ = "0.1.0"

__all__ = [
    "AddResult",
    "BatchInfo",
    "BufferKeys",
    "ConfigMismatchError",
    "ControlTimeoutError",
    "DecodeError",
    "EmptyBufferError",
    "InvalidBatchError",
    "ItemTooLargeError",
    "PrioritizedSampler",
    "ProtocolError",
    "RedisBufError",
    "ReplayBuffer",
    "SampleInfo",
    "SchemaError",
    "SequenceBuffer",
    "ServerUnavailableError",
    "States",
    "Trajectories",
    "Transitions",
    "UniformSampler",
    "connect",
]
