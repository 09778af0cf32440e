"""Run Python (or the ``redisbuf`` command) as if some packages were not installed: each
blocked module is set to None in ``sys.modules`` before anything else runs, so that
importing it raises ModuleNotFoundError exactly as in an environment without it."""

from __future__ import annotations

import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: the module that each optional distribution provides (its import name)
MODULE_OF_DISTRIBUTION = {
    "torch": "torch",
    "matplotlib": "matplotlib",
    "prometheus_client": "prometheus_client",
    "torchgfn": "gfn",
    "gymnasium": "gymnasium",
    "mpi4py": "mpi4py",
}

_BOOT = (
    "import sys\n"
    "for _name in sys.argv.pop(1).split(','):\n"
    "    if _name:\n"
    "        sys.modules[_name] = None\n"
    "del _name\n"
)


def code_without(modules: list[str] | tuple[str, ...], code: str) -> list[str]:
    """argv running ``code`` in a Python where ``modules`` cannot be imported."""
    return [sys.executable, "-c", _BOOT + code, ",".join(modules)]


def redisbuf_without(modules: list[str] | tuple[str, ...], *args: str) -> list[str]:
    """argv running ``redisbuf ARGS`` (as ``python -m redisbuf``) where ``modules`` cannot
    be imported."""
    run = "import runpy\nrunpy.run_module('redisbuf', run_name='__main__', alter_sys=True)\n"
    return [*code_without(modules, run), *args]


def extras() -> dict[str, list[str]]:
    """pyproject.toml's optional dependencies: extra -> requirement strings."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return project["optional-dependencies"]


def distribution(requirement: str) -> str:
    """The distribution a requirement names: ``"torch>=2.1,<3"`` -> ``"torch"``."""
    name = requirement
    for stop in "[<>=!~; ":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("-", "_")


def modules_missing_without(installed_extras: set[str]) -> list[str]:
    """The modules of the optional distributions that an install of the package with only
    ``installed_extras`` lacks (those neither in the core dependencies nor in them)."""
    present = {distribution(r) for extra in installed_extras for r in extras()[extra]}
    optional = {distribution(r) for reqs in extras().values() for r in reqs}
    return sorted(
        MODULE_OF_DISTRIBUTION[dist]
        for dist in optional - present
        if dist in MODULE_OF_DISTRIBUTION
    )
