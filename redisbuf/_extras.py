"""Optional dependencies (the pip extras): one place that imports them and, when one is
missing, says which extra installs it.

``pip install redisbuf`` installs what ``import redisbuf``, the buffers, the core commands
and the embedded server need. torch (``redisbuf[torch]``), matplotlib (``[plot]``),
prometheus_client (``[metrics]``), torchgfn (``[torchgfn]``) and the others are extras; code
that needs one asks for it here, and a missing one raises
:class:`~redisbuf.errors.MissingExtraError` (the CLI prints it as one line, exit code 1).
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from .errors import MissingExtraError


def missing(
    module: str,
    extra: str,
    feature: str,
    cause: ImportError | None = None,
    package: str | None = None,
) -> MissingExtraError:
    """The error saying that ``feature`` needs ``module``, installed by ``redisbuf[extra]``.
    ``cause``: the ImportError seen, when the module is there but one of its own
    dependencies is not (then named in the message). ``package``: the name to show when
    the distribution is not named as its module (torchgfn's is ``gfn``)."""
    top = module.partition(".")[0]
    missing_name = (cause.name or top) if cause is not None else top
    if missing_name.partition(".")[0] == top:
        reason = "not installed"
    else:
        reason = f"it cannot be imported: {cause}"
    return MissingExtraError(
        f"{feature} needs {package or top} ({reason}): pip install 'redisbuf[{extra}]'",
        name=top,
    )


def require(module: str, extra: str, feature: str, package: str | None = None) -> ModuleType:
    """Import ``module`` (e.g. ``"matplotlib"``) for ``feature`` (e.g. ``"redisbuf plot"``);
    raises :class:`~redisbuf.errors.MissingExtraError` naming ``redisbuf[extra]`` if it
    cannot be imported."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise missing(module, extra, feature, exc, package) from exc


def check(module: str, extra: str, feature: str, package: str | None = None) -> None:
    """Like :func:`require`, without importing ``module`` (for a command that imports it
    later, maybe in another process): only checks that it is installed."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise missing(module, extra, feature, package=package)
