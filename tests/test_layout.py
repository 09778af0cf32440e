"""The package layout (issue 27): every module moved into a subpackage keeps its old path
as an alias of the same module object (redisbuf._MOVED, one finder in redisbuf/__init__.py),
the top-level lazy exports include the servers and the manager, and unknown names still
fail. These are the only tests that import through the old paths on purpose."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import redisbuf
from redisbuf import _MOVED

ROOT = Path(redisbuf.__file__).resolve().parent
# importing them needs an optional dependency (torchgfn): checked where it is installed
OPTIONAL = {"torchgfn"}


def _run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


@pytest.mark.parametrize("old", sorted(_MOVED))
def test_old_path_is_the_new_module(old):
    new = _MOVED[old]
    if old in OPTIONAL:
        pytest.importorskip("gfn")
    moved = importlib.import_module(f"redisbuf.{new}")
    alias = importlib.import_module(f"redisbuf.{old}")
    assert alias is moved
    assert sys.modules[f"redisbuf.{old}"] is moved
    # the module keeps its own name and spec: relative imports, pickling, reload use them
    assert moved.__name__ == f"redisbuf.{new}"
    assert moved.__spec__.name == f"redisbuf.{new}"
    assert Path(moved.__file__).resolve() == ROOT / (new.replace(".", "/") + ".py")
    # one mechanism, no shim files left behind at the old places
    assert not (ROOT / (old.replace(".", "/") + ".py")).exists()


def test_monkeypatch_through_the_old_path_is_seen_by_the_new(monkeypatch):
    import redisbuf.server as old

    import redisbuf.servers.embedded as new

    sentinel = object()
    monkeypatch.setattr("redisbuf.server.free_port", sentinel)
    assert new.free_port is sentinel and old.free_port is sentinel
    monkeypatch.setattr(new, "BIN_ENV", "X")
    assert old.BIN_ENV == "X"


def test_from_old_paths_import_names():
    from redisbuf.buffer import SAVE_FORMAT_VERSION, AddResult, ReplayBuffer
    from redisbuf.cluster import LocalCluster
    from redisbuf.control.demo import run
    from redisbuf.manager import ReplayBufferManager
    from redisbuf.server import EmbeddedServer

    from redisbuf.buffers.checkpoint import SAVE_FORMAT_VERSION as saved_version
    from redisbuf.buffers.insert import AddResult as add_result
    from redisbuf.buffers.replay import ReplayBuffer as replay_buffer
    from redisbuf.demos.manager import run as manager_run
    from redisbuf.servers.cluster import LocalCluster as local_cluster
    from redisbuf.servers.embedded import EmbeddedServer as embedded_server

    assert ReplayBuffer is replay_buffer and AddResult is add_result
    assert SAVE_FORMAT_VERSION == saved_version
    assert EmbeddedServer is embedded_server and LocalCluster is local_cluster
    assert run is manager_run
    assert ReplayBufferManager.__module__ == "redisbuf.control.manager"


def test_top_level_exports_include_servers_and_manager():
    from redisbuf.control.manager import ReplayBufferManager
    from redisbuf.servers.cluster import LocalCluster
    from redisbuf.servers.embedded import EmbeddedServer

    assert redisbuf.EmbeddedServer is EmbeddedServer
    assert redisbuf.LocalCluster is LocalCluster
    assert redisbuf.ReplayBufferManager is ReplayBufferManager
    assert {"EmbeddedServer", "LocalCluster", "ReplayBufferManager"} <= set(redisbuf.__all__)


def test_unknown_names_still_fail():
    with pytest.raises(ModuleNotFoundError, match="redisbuf.nosuch"):
        importlib.import_module("redisbuf.nosuch")
    with pytest.raises(ModuleNotFoundError, match="redisbuf.buffers.nosuch"):
        importlib.import_module("redisbuf.buffers.nosuch")
    with pytest.raises(ImportError, match="NoSuchThing"):
        exec("from redisbuf.server import NoSuchThing", {})
    with pytest.raises(AttributeError, match="NoSuchThing"):
        redisbuf.NoSuchThing  # noqa: B018


def test_old_paths_in_a_fresh_interpreter():
    # the first import names an old path: the parent package installs the finder first
    out = _run(
        """
        import sys
        import redisbuf.control.demo as old
        import redisbuf.demos.manager as new
        assert old is new and new.__spec__.name == "redisbuf.demos.manager"
        from redisbuf.server import EmbeddedServer
        import redisbuf
        assert redisbuf.server is sys.modules["redisbuf.servers.embedded"]
        assert redisbuf.codec is sys.modules["redisbuf.store.codec"]
        assert redisbuf.EmbeddedServer is EmbeddedServer
        print("ok")
        """
    )
    assert out == "ok"


@pytest.mark.parametrize(
    "module", ["redisbuf", "redisbuf.examples.apex_dqn", "redisbuf.control.commands"]
)
def test_module_entry_points_still_run(module):
    if module.endswith("apex_dqn"):
        pytest.importorskip("gymnasium")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT.parent), *sys.path])}
    result = subprocess.run(
        [sys.executable, "-m", module, "--help"], capture_output=True, text=True,
        timeout=120, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout


def test_lua_scripts_are_found():
    from redisbuf.store.scripts import load, lua_dir

    assert (lua_dir() / "add.lua").is_file()
    assert load("add").source
