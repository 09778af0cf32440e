"""Where DI-engine is installed, its own middleware must take redisbuf.ding's classes for
its own: DequeBuffer registers as ding.data.Buffer (an ABC) and PriorityExperienceReplay
derives from DI-engine's. Checked in a fresh interpreter against a stand-in ``ding``
package with those two classes (CI does not install DI-engine)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import fakeredis  # noqa: F401 - the child imports it

CHECK = textwrap.dedent("""
    import fakeredis
    import ding.data
    from ding.data.buffer.middleware import PriorityExperienceReplay as TheirPER
    from redisbuf.ding import DequeBuffer, PriorityExperienceReplay

    buffer = DequeBuffer(4, url=fakeredis.FakeRedis())
    per = PriorityExperienceReplay(buffer)
    buffer.use(per)
    # what ding.framework.middleware.functional.data_processor checks
    assert isinstance(buffer, ding.data.Buffer)
    assert any(isinstance(m, TheirPER) for m in buffer._middleware)
    assert per.IS_weight_power_factor == 0.4  # ours, not the stand-in's
    print("ok")
""")


def _run(path: Path | None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True,
                          env=env, timeout=120)


def test_dienignes_checks_take_our_classes(tmp_path: Path) -> None:
    buffer_pkg = tmp_path / "ding" / "data" / "buffer"
    (buffer_pkg / "middleware").mkdir(parents=True)
    (tmp_path / "ding" / "__init__.py").write_text("")
    (tmp_path / "ding" / "data" / "__init__.py").write_text("from .buffer import Buffer\n")
    (buffer_pkg / "__init__.py").write_text(
        "from abc import ABC\nclass Buffer(ABC):\n    pass\n")
    (buffer_pkg / "middleware" / "__init__.py").write_text(
        "class PriorityExperienceReplay:\n"
        "    IS_weight_power_factor = -1.0\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise AssertionError('the stand-in must not run')\n")
    done = _run(tmp_path)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_without_dienigne_nothing_is_imported() -> None:
    code = ("import sys, redisbuf.ding, redisbuf.ding.middleware as m; "
            "assert 'ding' not in sys.modules; assert m.PriorityExperienceReplay.__mro__[1] "
            "is object; print('ok')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
