"""redisbuf: a replay buffer shared by many processes, stored in Redis.

The names below are imported on first use (PEP 562 ``__getattr__``), so that ``import
redisbuf`` and ``redisbuf --help`` load neither redis nor numpy. ``_EXPORTS`` is the one
list of the top-level names; ``__all__`` and ``__getattr__`` are built from it, and the
imports under ``TYPE_CHECKING`` (for type checkers and IDEs; ``X as X`` marks a
re-export) are checked against it by tests/test_layout.py. Three public namespaces group
the rest, as Reverb's ``reverb.selectors`` and ``reverb.rate_limiters``:
:mod:`redisbuf.selectors` (samplers and selectors), :mod:`redisbuf.limiters` (rate
limiters) and :mod:`redisbuf.errors` (every exception).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from . import errors as errors
    from . import limiters as limiters
    from . import selectors as selectors
    from .buffers.diverse import DiverseAddResult as DiverseAddResult
    from .buffers.diverse import (
        NormBasedDiversePrioritizedReplayBuffer as NormBasedDiversePrioritizedReplayBuffer,
    )
    from .buffers.episodes import EpisodeBuffer as EpisodeBuffer
    from .buffers.episodes import EpisodeSample as EpisodeSample
    from .buffers.episodes import Windows as Windows
    from .buffers.fragments import Chunk as Chunk
    from .buffers.fragments import FragmentBuffer as FragmentBuffer
    from .buffers.insert import AddResult as AddResult
    from .buffers.replay import ReplayBuffer as ReplayBuffer
    from .buffers.replay import SampleInfo as SampleInfo
    from .buffers.sequence import BatchInfo as BatchInfo
    from .buffers.sequence import SequenceBuffer as SequenceBuffer
    from .buffers.sharded import ShardedReplayBuffer as ShardedReplayBuffer
    from .buffers.terminating import TerminatingStateBuffer as TerminatingStateBuffer
    from .control.manager import ReplayBufferManager as ReplayBufferManager
    from .control.remote import ManagerLink as ManagerLink
    from .sampling.reader import Prefetcher as Prefetcher
    from .sampling.samplers import PERSampler as PERSampler
    from .sampling.samplers import PrioritizedSampler as PrioritizedSampler
    from .sampling.samplers import UniformSampler as UniformSampler
    from .sampling.selectors import FifoSampler as FifoSampler
    from .sampling.selectors import LifoSampler as LifoSampler
    from .sampling.selectors import MaxHeapSampler as MaxHeapSampler
    from .sampling.selectors import MinHeapSampler as MinHeapSampler
    from .servers.cluster import LocalCluster as LocalCluster
    from .servers.embedded import EmbeddedServer as EmbeddedServer
    from .store.connection import connect as connect
    from .store.containers import Items as Items
    from .store.containers import States as States
    from .store.containers import Trajectories as Trajectories
    from .store.containers import Transitions as Transitions
    from .store.keys import BufferKeys as BufferKeys

__version__ = "0.2.0"

#: submodule -> the names this package exports from it. The samplers and selectors are
#: also in :mod:`redisbuf.selectors`: their flat names stay while the docstring examples of
#: redisbuf/sampling/samplers.py import them so.
_EXPORTS: dict[str, tuple[str, ...]] = {
    "buffers.replay": ("ReplayBuffer", "SampleInfo"),
    "buffers.insert": ("AddResult",),
    "buffers.sharded": ("ShardedReplayBuffer",),
    "buffers.sequence": ("BatchInfo", "SequenceBuffer"),
    "buffers.episodes": ("EpisodeBuffer", "EpisodeSample", "Windows"),
    "buffers.fragments": ("Chunk", "FragmentBuffer"),
    "buffers.terminating": ("TerminatingStateBuffer",),
    "buffers.diverse": ("DiverseAddResult", "NormBasedDiversePrioritizedReplayBuffer"),
    "sampling.samplers": ("PERSampler", "PrioritizedSampler", "UniformSampler"),
    "sampling.selectors": ("FifoSampler", "LifoSampler", "MaxHeapSampler", "MinHeapSampler"),
    "sampling.reader": ("Prefetcher",),
    "store.connection": ("connect",),
    "store.containers": ("Items", "States", "Trajectories", "Transitions"),
    "store.keys": ("BufferKeys",),
    "servers.embedded": ("EmbeddedServer",),
    "servers.cluster": ("LocalCluster",),
    "control.manager": ("ReplayBufferManager",),
    "control.remote": ("ManagerLink",),
}
#: the public namespaces: submodules of this package, imported on first use
_NAMESPACES = ("errors", "limiters", "selectors")
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


__all__ = sorted(_MODULE_OF) + list(_NAMESPACES)
