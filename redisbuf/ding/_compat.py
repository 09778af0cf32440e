"""Where DI-engine itself is installed, its own code must take ours for its own:
``offpolicy_data_fetcher`` (``OffPolicyLearner``) checks ``isinstance(buffer_,
ding.data.Buffer)`` and looks for ``ding.data.buffer.middleware.PriorityExperienceReplay``
among a buffer's middleware before it writes priorities back. So our ``DequeBuffer`` is
registered as a virtual subclass of DI-engine's ``Buffer`` (an ABC) and our
``PriorityExperienceReplay`` derives from DI-engine's (it overrides every method). Without
DI-engine nothing is imported.
"""

from __future__ import annotations

import importlib.util
from typing import Any


def _installed() -> bool:
    try:
        return importlib.util.find_spec("ding") is not None
    except (ImportError, ValueError):
        return False


def per_base() -> type:
    """DI-engine's ``PriorityExperienceReplay`` class where it imports, else ``object``."""
    if not _installed():
        return object
    try:
        from ding.data.buffer.middleware import PriorityExperienceReplay
    except Exception:  # noqa: BLE001 - a broken DI-engine install: work without it
        return object
    return PriorityExperienceReplay


def register_buffer(cls: type) -> None:
    """Make ``isinstance(buffer, ding.data.Buffer)`` true for ``cls`` where DI-engine imports."""
    if not _installed():
        return
    try:
        from ding.data.buffer import Buffer
    except Exception:  # noqa: BLE001
        return
    abc_register: Any = getattr(Buffer, "register", None)
    if abc_register is not None:
        abc_register(cls)
