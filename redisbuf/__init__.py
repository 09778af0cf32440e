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
        MissingExtraError,
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

__version__ = "0.2.0"

#: submodule -> the names this package exports from it
_EXPORTS: dict[str, tuple[str, ...]] = {
    "buffer": ("AddResult", "ReplayBuffer", "SampleInfo"),
    "connection": ("connect",),
    "containers": ("States", "Trajectories", "Transitions"),
    "diverse": ("DiverseAddResult", "NormBasedDiversePrioritizedReplayBuffer"),
    "episodes": ("EpisodeBuffer", "EpisodeSample", "Windows"),
    "errors": (
        "ConfigMismatchError", "ControlTimeoutError", "DecodeError", "DurabilityError",
        "EmptyBufferError", "FetchTimeoutError", "InvalidBatchError", "ItemTooLargeError",
        "MissingExtraError", "PartialLoadError", "ProtocolError", "RateLimitTimeoutError",
        "RedisBufError", "SamplingError", "SchemaError", "ServerConfigError",
        "ServerUnavailableError", "ShardedBufferError", "ShardUnavailableError",
        "WaitTimeoutError",
    ),
    "fragments": ("Chunk", "FragmentBuffer"),
    "keys": ("BufferKeys",),
    "limiters": ("MinSize", "RateLimiter", "SampleToInsertRatio"),
    "reader": ("Prefetcher",),
    "samplers": ("PERSampler", "PrioritizedSampler", "UniformSampler"),
    "selectors": ("FifoSampler", "LifoSampler", "MaxHeapSampler", "MinHeapSampler"),
    "sequence": ("BatchInfo", "SequenceBuffer"),
    "sharded": ("ShardedReplayBuffer",),
    "terminating": ("TerminatingStateBuffer",),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        # `import redisbuf` used to import every submodule: `redisbuf.codec` still works
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
    "MissingExtraError",
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
