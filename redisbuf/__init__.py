"""redisbuf: a replay buffer shared by many processes, stored in Redis.

The names below are imported on first use (PEP 562 ``__getattr__``), so that ``import
redisbuf`` and ``redisbuf --help`` load neither redis nor numpy. ``from redisbuf import
ReplayBuffer`` works as before; type checkers and IDEs read the imports under
``TYPE_CHECKING``.

Modules moved when the package was split into subpackages (issue 27) keep their old
paths: :data:`_MOVED` maps each old path to the new one, and :class:`_MovedModules` makes
``import redisbuf.server`` bind the very module ``redisbuf.servers.embedded`` (one module
object under two names, so a monkeypatch through either is seen by both).
"""

from __future__ import annotations

import importlib
import sys
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

#: old module path -> new module path (both under ``redisbuf.``), for the modules moved
#: into subpackages: the old paths are aliases of the new modules (see _MovedModules)
_MOVED: dict[str, str] = {
    "buffer": "buffers.replay",
    "sharded": "buffers.sharded",
    "sequence": "buffers.sequence",
    "episodes": "buffers.episodes",
    "fragments": "buffers.fragments",
    "terminating": "buffers.terminating",
    "diverse": "buffers.diverse",
    "samplers": "sampling.samplers",
    "selectors": "sampling.selectors",
    "windows": "sampling.windows",
    "replica": "sampling.replica",
    "limiters": "sampling.limiters",
    "lifetime": "sampling.lifetime",
    "waiting": "sampling.waiting",
    "reader": "sampling.reader",
    "connection": "store.connection",
    "keys": "store.keys",
    "scripts": "store.scripts",
    "functions": "store.functions",
    "codec": "store.codec",
    "containers": "store.containers",
    "_torch": "store._torch",
    "server": "servers.embedded",
    "_watchdog": "servers._watchdog",
    "cluster": "servers.cluster",
    "manager": "control.manager",
    "remote": "control.remote",
    "ipc": "control.ipc",
    "demo": "demos.processes",
    "control.demo": "demos.manager",
    "metrics": "ops.metrics",
    "acl": "ops.acl",
    "torchgfn": "integrations.torchgfn",
}


class _MovedModules:
    """Finder and loader (``sys.meta_path``) of the old paths in :data:`_MOVED`: importing
    ``redisbuf.OLD`` imports ``redisbuf.NEW`` and binds that same module object under the
    old name too (in ``sys.modules`` and as the parent package's attribute). Unknown
    names are left to the normal finders, so they fail as before. Run as a script
    (``python -m redisbuf.OLD``) an old path is not supported: none had a main."""

    @classmethod
    def find_spec(cls, fullname: str, path: Any = None, target: Any = None) -> Any:
        if not fullname.startswith("redisbuf."):
            return None
        new = _MOVED.get(fullname[len("redisbuf."):])
        if new is None:
            return None
        from importlib.machinery import ModuleSpec

        return ModuleSpec(fullname, cls, loader_state=f"redisbuf.{new}")

    @staticmethod
    def create_module(spec: Any) -> Any:
        module = importlib.import_module(spec.loader_state)
        # the import system sets __spec__ of what we return to the alias's spec: keep the
        # module's own, put back by exec_module
        spec.loader_state = module.__spec__
        return module

    @staticmethod
    def exec_module(module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state


if not any(getattr(finder, "_redisbuf_moved", False) for finder in sys.meta_path):
    _MovedModules._redisbuf_moved = True  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _MovedModules)  # type: ignore[arg-type]


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
