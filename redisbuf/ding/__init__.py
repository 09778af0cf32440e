"""DI-engine's replay buffers on a redisbuf buffer that every process shares by URL and name.

One import switches a DI-engine program to it::

    from redisbuf.ding import DequeBuffer            # was: from ding.data import DequeBuffer
    buffer = DequeBuffer(size=10000, url="redis://host:6379/0", name="replay")

- ``ding.data.buffer``: :class:`DequeBuffer`, :class:`Buffer`, :class:`BufferedData`,
  :func:`apply_middleware`; the middleware in :mod:`redisbuf.ding.middleware`
  (``PriorityExperienceReplay``, ``use_time_check``, ``staleness_check``,
  ``sample_range_view``, ``clone_object``, ``group_sample``, ``padding``).
- ``ding.worker.replay_buffer``: :class:`NaiveReplayBuffer`, :class:`AdvancedReplayBuffer`,
  :class:`EpisodeReplayBuffer`, :class:`IBuffer`, :func:`create_buffer`,
  :func:`get_buffer_cls`; configs are :class:`EasyDict` (no ``easydict`` needed).

Where DI-engine is installed, DI-engine's own middleware (``OffPolicyLearner``'s data
fetcher) takes these buffers and ``PriorityExperienceReplay`` for its own. Differences
from DI-engine: ``docs/coming-from/di-engine.md``.
"""

from __future__ import annotations

from ._compat import register_buffer
from .buffer import Buffer, BufferedData, DequeBuffer, apply_middleware
from .config import EasyDict
from .middleware import (
    PriorityExperienceReplay,
    clone_object,
    group_sample,
    padding,
    sample_range_view,
    staleness_check,
    use_time_check,
)
from .worker import (
    AdvancedReplayBuffer,
    EpisodeReplayBuffer,
    IBuffer,
    NaiveReplayBuffer,
    UsedDataRemover,
    create_buffer,
    get_buffer_cls,
)

register_buffer(DequeBuffer)

__all__ = [
    "AdvancedReplayBuffer", "Buffer", "BufferedData", "DequeBuffer", "EasyDict",
    "EpisodeReplayBuffer", "IBuffer", "NaiveReplayBuffer", "PriorityExperienceReplay",
    "UsedDataRemover", "apply_middleware", "clone_object", "create_buffer", "get_buffer_cls",
    "group_sample", "padding", "sample_range_view", "staleness_check", "use_time_check",
]
