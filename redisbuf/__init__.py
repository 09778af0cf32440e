"""redisbuf: a replay buffer shared by many processes, stored in Redis."""

from .buffer import AddResult, ReplayBuffer, SampleInfo
from .connection import connect
from .containers import States, Trajectories, Transitions
from .diverse import DiverseAddResult, NormBasedDiversePrioritizedReplayBuffer
from .episodes import EpisodeBuffer, EpisodeSample, Windows
from .errors import (
    ConfigMismatchError,
    ControlTimeoutError,
    DecodeError,
    DurabilityError,
    EmptyBufferError,
    FetchTimeoutError,
    InvalidBatchError,
    ItemTooLargeError,
    PartialLoadError,
    ProtocolError,
    RateLimitTimeoutError,
    RedisBufError,
    SamplingError,
    SchemaError,
    ServerConfigError,
    ServerUnavailableError,
    ShardedBufferError,
    ShardUnavailableError,
    WaitTimeoutError,
)
from .fragments import Chunk, FragmentBuffer
from .keys import BufferKeys
from .limiters import MinSize, RateLimiter, SampleToInsertRatio
from .reader import Prefetcher
from .samplers import PERSampler, PrioritizedSampler, UniformSampler
from .selectors import FifoSampler, LifoSampler, MaxHeapSampler, MinHeapSampler
from .sequence import BatchInfo, SequenceBuffer
from .sharded import ShardedReplayBuffer
from .terminating import TerminatingStateBuffer

__version__ = "0.1.0"

__all__ = [
    "AddResult",
    "BatchInfo",
    "Chunk",
    "EpisodeBuffer",
    "EpisodeSample",
    "FetchTimeoutError",
    "FragmentBuffer",
    "Windows",
    "BufferKeys",
    "ConfigMismatchError",
    "ControlTimeoutError",
    "DecodeError",
    "DurabilityError",
    "DiverseAddResult",
    "EmptyBufferError",
    "FifoSampler",
    "InvalidBatchError",
    "NormBasedDiversePrioritizedReplayBuffer",
    "ItemTooLargeError",
    "LifoSampler",
    "MaxHeapSampler",
    "MinHeapSampler",
    "PERSampler",
    "Prefetcher",
    "PrioritizedSampler",
    "MinSize",
    "PartialLoadError",
    "ProtocolError",
    "RateLimitTimeoutError",
    "RateLimiter",
    "RedisBufError",
    "ReplayBuffer",
    "SampleInfo",
    "SampleToInsertRatio",
    "SamplingError",
    "SchemaError",
    "SequenceBuffer",
    "ServerConfigError",
    "ServerUnavailableError",
    "ShardedBufferError",
    "ShardedReplayBuffer",
    "ShardUnavailableError",
    "States",
    "TerminatingStateBuffer",
    "Trajectories",
    "Transitions",
    "UniformSampler",
    "WaitTimeoutError",
    "connect",
]
