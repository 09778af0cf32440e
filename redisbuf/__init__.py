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
from .samplers import PERSampler, PrioritizedSampler, UniformSampler
from .selectors import FifoSampler, LifoSampler, MaxHeapSampler, MinHeapSampler

__version__ = "0.1.0"

__all__ = [
    "AddResult",
    "BufferKeys",
    "ConfigMismatchError",
    "ControlTimeoutError",
    "DecodeError",
    "EmptyBufferError",
    "FifoSampler",
    "InvalidBatchError",
    "ItemTooLargeError",
    "LifoSampler",
    "MaxHeapSampler",
    "MinHeapSampler",
    "PERSampler",
    "PrioritizedSampler",
    "ProtocolError",
    "RedisBufError",
    "ReplayBuffer",
    "SampleInfo",
    "SchemaError",
    "ServerUnavailableError",
    "States",
    "Trajectories",
    "Transitions",
    "UniformSampler",
    "connect",
]
