"""redisbuf.torchrl without its extra: the error names ``redisbuf[torchrl]`` (runs where
torchrl is absent too, unlike tests/test_torchrl.py)."""

from __future__ import annotations

import subprocess

import pytest
from extras_helpers import code_without


@pytest.mark.parametrize("blocked, package", [("torch", "torch"), ("tensordict", "tensordict"),
                                              ("torchrl", "torchrl")])
def test_torchrl_integration_names_its_extra(blocked, package):
    code = (
        "from redisbuf.errors import MissingExtraError\n"
        "try:\n"
        "    import redisbuf.torchrl\n"
        "except MissingExtraError as exc:\n"
        "    assert isinstance(exc, ImportError)\n"
        "    print(exc)\n"
    )
    done = subprocess.run(code_without([blocked], code), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"redisbuf.torchrl needs {package} (not installed): pip install 'redisbuf[torchrl]'"
    )
