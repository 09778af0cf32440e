"""A feature whose optional dependency (pip extra) is missing says which extra installs
it: one line and exit code 1 from the command, MissingExtraError (an ImportError) from
the library. The missing packages are simulated (``sys.modules[name] = None``)."""

from __future__ import annotations

import subprocess
import sys

import pytest
from extras_helpers import ROOT, code_without, distribution, extras, redisbuf_without

from redisbuf import _extras
from redisbuf.errors import MissingExtraError, RedisBufError
from redisbuf.store import _torch

URL = "redis://127.0.0.1:1/0"  # never reached: the check comes first


def _run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _one_error_line(done: subprocess.CompletedProcess[str], expected: str) -> None:
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [f"error: {expected}"]


@pytest.mark.parametrize(
    "blocked, argv, expected",
    [
        (
            "matplotlib",
            ["plot", "b", "-o", "b.png", "--url", URL],
            "redisbuf plot needs matplotlib (not installed): pip install 'redisbuf[plot]'",
        ),
        (
            "prometheus_client",
            ["metrics", "--url", URL],
            "redisbuf metrics needs prometheus_client (not installed): "
            "pip install 'redisbuf[metrics]'",
        ),
    ],
)
def test_command_names_the_missing_extra(tmp_path, blocked, argv, expected):
    done = subprocess.run(redisbuf_without([blocked], *argv), capture_output=True, text=True,
                          timeout=120, cwd=tmp_path)
    _one_error_line(done, expected)
    assert not (tmp_path / "b.png").exists()


def test_commands_that_need_no_extra_run_without_them():
    blocked = ["torch", "matplotlib", "prometheus_client", "gfn"]
    done = _run(redisbuf_without(blocked, "--help"))
    assert done.returncode == 0, done.stderr
    assert "inspect" in done.stdout and "plot" in done.stdout


@pytest.mark.parametrize("blocked, package", [("torch", "torch"), ("gfn", "torchgfn")])
def test_torchgfn_drop_in_names_its_extra(blocked, package):
    code = (
        "from redisbuf.errors import MissingExtraError\n"
        "try:\n"
        "    import redisbuf.torchgfn\n"
        "except MissingExtraError as exc:\n"
        "    assert isinstance(exc, ImportError)\n"
        "    print(exc)\n"
    )
    done = _run(code_without([blocked], code))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        f"redisbuf.torchgfn needs {package} (not installed): pip install 'redisbuf[torchgfn]'"
    )


def test_tensors_without_torch_name_the_torch_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError) as caught:
        _torch.require()
    assert str(caught.value) == (
        "working with tensors needs torch (not installed): pip install 'redisbuf[torch]'"
    )
    assert caught.value.name == "torch"
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, RedisBufError)


@pytest.mark.redis_server
def test_the_demo_and_a_worker_run_without_torch(redis_server):
    """HyperGrid's numpy trajectories: `redisbuf demo` and `redisbuf worker` need no torch
    (each of their processes imported it, seconds apiece; they refused without it)."""
    demo = _run(redisbuf_without(["torch"], "demo", "--workers", "1", "--batches", "2",
                                 "--batch-size", "4", "--yes", "--url", redis_server.url))
    assert demo.returncode == 0, demo.stderr
    worker = _run(redisbuf_without(["torch"], "worker", "--name", "demo", "--batches", "1",
                                   "--batch-size", "4", "--url", redis_server.url))
    assert worker.returncode == 0, worker.stderr
    from redisbuf import ReplayBuffer

    assert ReplayBuffer.open(redis_server.url, "demo").stats()["inserted"] == 12


def test_hypergrid_gives_numpy_trajectories_without_torch(monkeypatch):
    import numpy as np

    from redisbuf.envs import HyperGrid

    monkeypatch.setitem(sys.modules, "torch", None)
    batch = HyperGrid(ndim=2, height=4).sample_trajectories(
        3, np.random.default_rng(0), tensors=False)
    assert isinstance(batch.states, np.ndarray) and batch.states.shape[1:] == (3, 2)
    assert len(batch) == 3 and batch.log_rewards.shape == (3,)


def test_hypergrid_without_torch_names_the_torch_extra(monkeypatch):
    import numpy as np

    from redisbuf.envs import HyperGrid

    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(MissingExtraError, match=r"pip install 'redisbuf\[torch\]'"):
        HyperGrid(ndim=2, height=4).sample_trajectories(2, np.random.default_rng(0))


def test_numpy_buffers_need_no_extra():
    code = (
        "import numpy as np\n"
        "import fakeredis\n"
        "from redisbuf import ReplayBuffer\n"
        "buffer = ReplayBuffer(fakeredis.FakeRedis(), 'lean', capacity=8)\n"
        "buffer.add({'x': np.arange(6.0).reshape(3, 2)})\n"
        "out = buffer.sample(5)\n"
        "assert (out['x'][:, 1] == out['x'][:, 0] + 1).all()\n"
        "print(len(buffer))\n"
    )
    done = _run(code_without(["torch", "matplotlib", "prometheus_client", "gfn"], code))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "3"


def test_a_broken_dependency_of_the_extra_is_named():
    cause = ModuleNotFoundError("No module named 'kiwisolver'", name="kiwisolver")
    error = _extras.missing("matplotlib.pyplot", "plot", "redisbuf plot", cause)
    assert str(error) == (
        "redisbuf plot needs matplotlib (it cannot be imported: No module named "
        "'kiwisolver'): pip install 'redisbuf[plot]'"
    )


def test_check_does_not_import(monkeypatch):
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    _extras.check("json.tool", "x", "a test")
    assert "json.tool" not in sys.modules
    with pytest.raises(MissingExtraError, match=r"redisbuf\[x\]"):
        _extras.check("no_such_module_redisbuf", "x", "a test")


def test_extras_all_is_torch_plot_metrics_and_the_core_is_lean():
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {distribution(r) for r in project["dependencies"]}
    assert not core & {"torch", "matplotlib", "prometheus_client", "torchgfn"}
    optional = extras()
    assert set(optional["all"]) == {*optional["torch"], *optional["plot"], *optional["metrics"]}
    assert set(optional["torch"]) <= set(optional["torchgfn"])  # the drop-in makes tensors
    assert set(optional["torch"]) <= set(optional["examples"])
