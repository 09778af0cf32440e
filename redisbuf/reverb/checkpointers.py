"""Reverb's checkpointers (``reverb.checkpointers``): where ``client.checkpoint()`` writes
and what a :class:`~redisbuf.reverb.Server` loads when it starts.

A checkpoint is a directory under the checkpointer's ``path`` (see
:mod:`redisbuf.buffers.step_checkpoint`): a server made with a checkpointer loads the
newest one there (or, when there is none, ``fallback_checkpoint_path``), and its tables
replace the ones of the same name given to the server. Writing one reads the tables
from Redis in the process that calls ``checkpoint()``: the path must be one that process
can write (the default, a temporary directory, is on the machine of the process that
made the server).
"""

from __future__ import annotations

import abc
import tempfile


class CheckpointerBase(metaclass=abc.ABCMeta):
    """The base of the checkpointers: a ``path`` (the root directory of its
    checkpoints) and an optional ``fallback_checkpoint_path``."""

    path: str
    fallback_checkpoint_path: str | None = None

    def internal_checkpointer(self) -> CheckpointerBase:
        """This checkpointer (Reverb returns its C++ object here)."""
        return self


class DefaultCheckpointer(CheckpointerBase):
    """Checkpoints in directories under ``path``.

    Args:
        path: the root directory of the checkpoints.
        group: unused (Reverb's file-system group).
        fallback_checkpoint_path: a checkpoint directory loaded when ``path`` holds none
            (to start from another run's).
    """

    def __init__(self, path: str, group: str = "",
                 fallback_checkpoint_path: str | None = None) -> None:
        self.path = str(path)
        self.group = group
        self.fallback_checkpoint_path = fallback_checkpoint_path


class TempDirCheckpointer(DefaultCheckpointer):
    """Checkpoints in a new temporary directory."""

    def __init__(self) -> None:
        super().__init__(tempfile.mkdtemp(prefix="redisbuf-reverb-"))


def default_checkpointer(group: str | None = None) -> CheckpointerBase:
    """A :class:`TempDirCheckpointer` (Reverb's default)."""
    del group
    return TempDirCheckpointer()


__all__ = ["CheckpointerBase", "DefaultCheckpointer", "TempDirCheckpointer",
           "default_checkpointer"]
