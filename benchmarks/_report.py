"""Figures a benchmark script records: its results file, and rows for ``run_all.py``.

A script records each headline figure with one call near the end of its ``main()``::

    from _report import record   # benchmarks/ is on sys.path when a script runs

    record("sample(256) uniform", rate, "items/s", baseline=raw_rate, target=">= 0.8",
           key="sample-uniform")

When the script ends without an uncaught exception, every figure it recorded is written
to its results file, ``benchmarks/results/<script>.json`` (the whole file replaced: one
file is one run), with the commit, the date (UTC), the load average before and after, the
machine and the command line; ``benchmarks/render.py`` fills the docs' figures from those
files (see ``benchmarks/results/README.md``). ``$REDISBUF_BENCH_RESULTS`` names another
directory (a trial run: ``REDISBUF_BENCH_RESULTS=/tmp/try``) or ``off`` (nothing
written). Under ``run_all.py`` each row is also appended as one JSON line to the file
named by ``$REDISBUF_BENCH_REPORT``.

``key`` names the figure in its file (letters, digits, ``_ . / -``; default: the figure's
text made into one); keys are unique within a run. A row's ``ratio`` is ``value /
baseline`` unless given (a median of per-round ratios, say). ``target`` is ``"OP NUMBER"``
with OP one of ``>=``, ``<=``, ``>``, ``<``; it applies to the ratio when there is one,
else to the value (``target_of`` picks explicitly). ``axis`` and ``x`` place the row on a
curve of the PNG: ``axis="processes"`` (x = writer or worker processes) or
``axis="items"`` (x = items in the buffer), one curve per ``series``.
"""

from __future__ import annotations

import atexit
import datetime as dt
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ENV = "REDISBUF_BENCH_REPORT"
RESULTS_ENV = "REDISBUF_BENCH_RESULTS"
RESULTS_DIR = Path(__file__).resolve().parent / "results"
ROOT = RESULTS_DIR.parent.parent
AXES = ("processes", "items")
OPERATORS = (">=", "<=", ">", "<")
KEY = re.compile(r"[A-Za-z0-9_./-]+")
FORMAT = 1  # the results file's layout version


def load_average() -> str:
    """The machine's load average (1, 5, 15 minutes) as printed under a benchmark's table:
    these machines are shared, so a figure goes with the load it was measured under."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def _load_numbers() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


_LOAD_BEFORE = _load_numbers()  # scripts import this module first thing
_STARTED = dt.datetime.now(dt.UTC)
_ROWS: dict[str, dict[str, Any]] = {}
_STATE = {"failed": False, "saved": False, "hooked": False}


def parse_target(target: str) -> tuple[str, float]:
    """``">= 0.8"`` -> (``">="``, 0.8); ValueError naming the text if it is not one."""
    text = target.strip()
    for op in OPERATORS:  # two-character operators first
        if text.startswith(op):
            try:
                return op, float(text[len(op) :].strip().rstrip("x"))
            except ValueError:
                break
    raise ValueError(f"target {target!r} is not 'OP NUMBER' with OP one of {OPERATORS}")


def key_of(figure: str) -> str:
    """The default key of a figure: its text in lower case, runs of other characters
    than letters and digits made one ``-`` (``"update_priority(256), 10,000 items"`` ->
    ``"update_priority-256-10-000-items"``)."""
    return re.sub(r"[^a-z0-9_]+", "-", figure.lower()).strip("-") or "figure"


def record(
    figure: str,
    value: float,
    unit: str,
    *,
    baseline: float | None = None,
    baseline_name: str | None = None,
    ratio: float | None = None,
    spread: str | None = None,
    target: str | None = None,
    target_of: str | None = None,
    series: str | None = None,
    axis: str | None = None,
    x: float | None = None,
    key: str | None = None,
) -> None:
    """Record one figure of the running script (see the module docstring). Raises
    ValueError on a malformed target, axis or key, or a key recorded twice, so a script's
    mistake shows when it runs, not in the docs."""
    if target is not None:
        parse_target(target)
    if target_of not in (None, "ratio", "value"):
        raise ValueError(f"target_of must be 'ratio' or 'value', not {target_of!r}")
    if (axis is None) != (x is None) or (axis is not None and axis not in AXES):
        raise ValueError(f"axis must be one of {AXES} and given together with x")
    key = key_of(figure) if key is None else key
    if not KEY.fullmatch(key):
        raise ValueError(f"key {key!r}: use letters, digits and _ . / - only")
    if key in _ROWS:
        raise ValueError(f"figure key {key!r} recorded twice in one run (figure {figure!r})")
    row: dict[str, Any] = {
        "script": Path(sys.argv[0]).stem,
        "key": key,
        "figure": figure,
        "value": float(value),
        "unit": unit,
        "baseline": None if baseline is None else float(baseline),
        "baseline_name": baseline_name,
        "ratio": None if ratio is None else float(ratio),
        "spread": spread,
        "target": target,
        "target_of": target_of,
        "series": series,
        "axis": axis,
        "x": None if x is None else float(x),
    }
    _ROWS[key] = row
    _hook()
    path = os.environ.get(ENV)
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps(row) + "\n")


def _hook() -> None:
    """Once: write the results file at exit, unless an exception ended the script."""
    if _STATE["hooked"]:
        return
    _STATE["hooked"] = True
    previous = sys.excepthook

    def failed(*exc: Any) -> None:
        _STATE["failed"] = True
        previous(*exc)

    sys.excepthook = failed
    atexit.register(_save_at_exit)


def _save_at_exit() -> None:
    if _ROWS and not _STATE["failed"] and not _STATE["saved"]:
        path = save()
        if path is not None:
            print(f"wrote {path}", file=sys.stderr)


def results_dir() -> Path | None:
    """Where results files go: ``$REDISBUF_BENCH_RESULTS`` (None for ``off``), else
    ``benchmarks/results``."""
    value = os.environ.get(RESULTS_ENV)
    if value is None or value == "":
        return RESULTS_DIR
    return None if value.lower() == "off" else Path(value)


def machine() -> dict[str, Any]:
    """What ran the benchmark: CPU model, cores, memory, OS, Python."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = ""
    try:
        kib = int(Path("/proc/meminfo").read_text().split()[1])
        memory = f", {kib / 2**20:.0f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {
        "cpu": f"{cpu}, {os.cpu_count()} cores{memory}",
        "os": f"{platform.system()} {platform.release()}",
        "python": platform.python_version(),
    }


def commit() -> dict[str, Any]:
    """The checkout's commit (short hash) and whether its tracked files had changes."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True,
                              text=True, timeout=30, check=False)
        return done.stdout.strip() if done.returncode == 0 else ""

    head = git("rev-parse", "--short", "HEAD")
    dirty = bool(git("status", "--porcelain", "--untracked-files=no")) if head else None
    return {"commit": head or None, "dirty": dirty}


def run_meta(started: dt.datetime | None = None,
             load_before: list[float] | None = None) -> dict[str, Any]:
    """commit, dirty, date (UTC, of the start), load (1/5/15 min before and after),
    machine and command of the running process."""
    started = started or _STARTED
    argv = [Path(sys.argv[0]).as_posix(), *sys.argv[1:]]
    try:
        argv[0] = Path(sys.argv[0]).resolve().relative_to(ROOT).as_posix()
    except ValueError:
        pass
    return {
        **commit(),
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "load": {"before": load_before or _LOAD_BEFORE, "after": _load_numbers()},
        "machine": machine(),
        "command": "python " + " ".join(argv),
    }


def write_results(name: str, figures: dict[str, dict[str, Any]], meta: dict[str, Any],
                  directory: Path | None = None, **extra: Any) -> Path | None:
    """Write ``<directory>/<name>.json`` (default: :func:`results_dir`; None and nothing
    written when that is ``off``): ``meta`` (see :func:`run_meta`), the figures by key
    and any ``extra`` fields. The file is replaced whole, through a temporary file."""
    directory = directory or results_dir()
    if directory is None:
        return None
    if not KEY.fullmatch(name) or "/" in name:
        raise ValueError(f"results name {name!r}: use letters, digits and _ . - only")
    directory.mkdir(parents=True, exist_ok=True)
    body = {"format": FORMAT, "name": name, **meta, **extra, "figures": figures}
    path = directory / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(body, indent=1, allow_nan=True) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path


def save(name: str | None = None, **extra: Any) -> Path | None:
    """Write the figures recorded so far to the script's results file now (it is written
    at exit otherwise); ``extra`` fields (a note, settings) go into the file too."""
    _STATE["saved"] = True
    return write_results(name or Path(sys.argv[0]).stem, dict(_ROWS), run_meta(), **extra)


def server_cpu(client: Any) -> float:
    """The server's CPU seconds so far (INFO cpu, user + sys): of its main thread, which
    runs the commands (all threads where the server does not say)."""
    info = client.info("cpu")
    thread = "_main_thread" if "used_cpu_user_main_thread" in info else ""
    return float(info[f"used_cpu_user{thread}"]) + float(info[f"used_cpu_sys{thread}"])


SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro")


def script_stats(client: Any) -> dict[str, float]:
    """The server's ``INFO commandstats`` of script calls, whichever way redisbuf runs them
    (FCALL / FCALL_RO of the library, or EVALSHA; redisbuf/store/scripts.py): ``calls``,
    ``usec`` and ``usec_per_call`` (NaN when there was none)."""
    stats = client.info("commandstats")
    calls = sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in SCRIPT_COMMANDS)
    usec = sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in SCRIPT_COMMANDS)
    return {"calls": calls, "usec": usec, "usec_per_call": usec / calls if calls else float("nan")}
