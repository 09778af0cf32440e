"""torch, imported only by code that is handed a tensor or asked to produce one.

``import torch`` costs 1-2 s, so no redisbuf module imports it at module level: a process
that stores and samples numpy data, or runs ``redisbuf --help``, never loads it. A value
can only be a :class:`torch.Tensor` if torch is already in ``sys.modules``, so
:func:`is_tensor` checks for that instead of importing torch to find out.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers: neither is imported at run time
    import torch
    from typing_extensions import TypeIs


def is_tensor(value: Any) -> TypeIs[torch.Tensor]:
    """True if ``value`` is a ``torch.Tensor``; never imports torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def imported() -> ModuleType | None:
    """The torch module if this process has imported it, else None."""
    return sys.modules.get("torch")


def require() -> ModuleType:
    """The torch module, imported now if no one has yet (for code that makes tensors);
    without torch, a :class:`~redisbuf.errors.MissingExtraError` naming ``redisbuf[torch]``."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    from .._extras import require as require_extra

    return require_extra("torch", "torch", "working with tensors")
