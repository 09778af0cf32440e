"""redisbuf: a replay buffer shared by many processes, stored in Redis.

The names below are imported on first use (PEP 562 ``__getattr__``), so that ``import
redisbuf`` and ``redisbuf --help`` load neither redis nor numpy. ``from redisbuf import
ReplayBuffer`` works as before; type checkers and IDEs read the imports under
``TYPE_CHECKING``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .buffers.diverse import DiverseAddResult, NormBasedDiversePrioritizedReplayBuffer
    from .buffers.episodes import EpisodeBuffer, EpisodeSample, Windows
    from .buffers.fragments import Chunk, FragmentBuffer
    from .buffers.insert import AddResult
    from .buffers.replay import ReplayBuffer, SampleInfo
    from .buffers.sequence import BatchInfo, SequenceBuffer
    from .buffers.sharded import ShardedReplayBuffer
    from .buffers.terminating import TerminatingStateBuffer
    from .control.manager import ReplayBufferManager
    from .errors import (
        ConfigMismatchError,
        ControlTimeoutError,
        DecodeError,
        DurabilityError,
        EmptyBufferError,
        FetchTimeoutError,
        InvalidBatchError,
        ItemTooLargeError,
        MissingExtraError,
        PartialLoadError,
        ProtocolError,
        RateLimitTimeoutError,
        RedisBufError,
        RequestTooLargeError,
        SamplingError,
        SchemaError,
        ServerConfigError,
        ServerUnavailableError,
        ShardedBufferError,
        ShardUnavailableError,
        WaitTimeoutError,
    )
    from .sampling.limiters import MinSize, RateLimiter, SampleToInsertRatio
    from .sampling.reader import Prefetcher
    from .sampling.samplers import PERSampler, PrioritizedSampler, UniformSampler
    from .sampling.selectors import FifoSampler, LifoSampler, MaxHeapSampler, MinHeapSampler
    from .servers.cluster import LocalCluster
    from .servers.embedded import EmbeddedServer
    from .store.connection import connect
    from .store.containers import States, Trajectories, Transitions
    from .store.keys import BufferKeys

__version__ = "0.2.0"

#: submodule -> the names this package exports from it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "buffers.replay": ("ReplayBuffer", "SampleInfo"),
    "buffers.insert": ("AddResult",),
    "store.connection": ("connect",),
    "store.containers": ("States", "Trajectories", "Transitions"),
    "buffers.diverse": ("DiverseAddResult", "NormBasedDiversePrioritizedReplayBuffer"),
    "buffers.episodes": ("EpisodeBuffer", "EpisodeSample", "Windows"),
    "errors": (
        "ConfigMismatchError", "ControlTimeoutError", "DecodeError", "DurabilityError",
        "EmptyBufferError", "FetchTimeoutError", "InvalidBatchError", "ItemTooLargeError",
        "MissingExtraError", "PartialLoadError", "ProtocolError", "RateLimitTimeoutError",
        "RedisBufError", "RequestTooLargeError", "SamplingError", "SchemaError",
        "ServerConfigError", "ServerUnavailableError", "ShardedBufferError",
        "ShardUnavailableError",
        "WaitTimeoutError",
    ),
    "buffers.fragments": ("Chunk", "FragmentBuffer"),
    "store.keys": ("BufferKeys",),
    "sampling.limiters": ("MinSize", "RateLimiter", "SampleToInsertRatio"),
    "sampling.reader": ("Prefetcher",),
    "sampling.samplers": ("PERSampler", "PrioritizedSampler", "UniformSampler"),
    "sampling.selectors": ("FifoSampler", "LifoSampler", "MaxHeapSampler", "MinHeapSampler"),
    "buffers.sequence": ("BatchInfo", "SequenceBuffer"),
    "buffers.sharded": ("ShardedReplayBuffer",),
    "buffers.terminating": ("TerminatingStateBuffer",),
    "servers.embedded": ("EmbeddedServer",),
    "servers.cluster": ("LocalCluster",),
    "control.manager": ("ReplayBufferManager",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        # a subpackage or module read as an attribute (`redisbuf.store`) is imported
        try:
            return importlib.import_module(f".{name}", __name__)
        except ModuleNotFoundError as exc:
            if exc.name != f"{__name__}.{name}":
                raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


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
    "EmbeddedServer",
    "EmptyBufferError",
    "FifoSampler",
    "InvalidBatchError",
    "LocalCluster",
    "NormBasedDiversePrioritizedReplayBuffer",
    "ItemTooLargeError",
    "LifoSampler",
    "MaxHeapSampler",
    "MinHeapSampler",
    "PERSampler",
    "Prefetcher",
    "PrioritizedSampler",
    "MinSize",
    "MissingExtraError",
    "PartialLoadError",
    "ProtocolError",
    "RateLimitTimeoutError",
    "RateLimiter",
    "RedisBufError",
    "ReplayBuffer",
    "ReplayBufferManager",
    "RequestTooLargeError",
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
