"""redisbuf: a replay buffer shared by many processes, stored in Redis."""

from .buffer import AddResult, ReplayBuffer, SampleInfo
from .connection import connect
from .containers import States, Trajectories, Transitions
from .diverse import DiverseAddResult, NormBasedDiversePrioritizedReplayBuffer
from .errors import (
    ConfigMismatchError,
    ControlTimeoutError,
    DecodeError,
    EmptyBufferError,
    InvalidBatchError,
    ItemTooLargeError,
    ProtocolError,
    RedisBufError,
    SamplingError,
    SchemaError,
    ServerUnavailableError,
)
from .keys import BufferKeys
from .samplers import PrioritizedSampler, UniformSampler
from .terminating import TerminatingStateBuffer

__version__ = "0.1.0"

__all__ = [
    "AddResult",
    "BufferKeys",
    "ConfigMismatchError",
    "ControlTimeoutError",
    "DecodeError",
    "DiverseAddResult",
    "EmptyBufferError",
    "InvalidBatchError",
    "NormBasedDiversePrioritizedReplayBuffer",
    "ItemTooLargeError",
    "PrioritizedSampler",
    "ProtocolError",
    "RedisBufError",
    "ReplayBuffer",
    "SampleInfo",
    "SamplingError",
    "SchemaError",
    "ServerUnavailableError",
    "States",
    "TerminatingStateBuffer",
    "Trajectories",
    "Transitions",
    "UniformSampler",
    "connect",
]
