"""Rows a benchmark script hands to ``benchmarks/run_all.py``.

A script records each headline figure with one call near the end of its ``main()``::

    from _report import record   # benchmarks/ is on sys.path when a script runs

    record("sample(256) uniform", rate, "items/s", baseline=raw_rate, target=">= 0.8")

``record`` appends one JSON line to the file named by ``$REDISBUF_BENCH_REPORT`` (set by
``run_all.py``) and does nothing when it is unset, so a script run by hand prints what it
always printed and writes nothing.

A row's ``ratio`` is ``value / baseline`` unless given (a median of per-round ratios, say).
``target`` is ``"OP NUMBER"`` with OP one of ``>=``, ``<=``, ``>``, ``<``; it applies to the
ratio when there is one, else to the value (``target_of`` picks explicitly). ``axis`` and
``x`` place the row on a curve of the PNG: ``axis="processes"`` (x = writer or worker
processes) or ``axis="items"`` (x = items in the buffer), one curve per ``series``.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ENV = "REDISBUF_BENCH_REPORT"
AXES = ("processes", "items")
OPERATORS = (">=", "<=", ">", "<")


def load_average() -> str:
    """The machine's load average (1, 5, 15 minutes) as printed under a benchmark's table:
    these machines are shared, so a figure goes with the load it was measured under."""
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


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
) -> None:
    """Record one figure of the running script for ``run_all.py`` (see the module
    docstring); a no-op unless ``$REDISBUF_BENCH_REPORT`` is set. Raises ValueError on a
    malformed target or axis, so a script's mistake shows when it runs, not in the table."""
    path = os.environ.get(ENV)
    if target is not None:
        parse_target(target)
    if target_of not in (None, "ratio", "value"):
        raise ValueError(f"target_of must be 'ratio' or 'value', not {target_of!r}")
    if (axis is None) != (x is None) or (axis is not None and axis not in AXES):
        raise ValueError(f"axis must be one of {AXES} and given together with x")
    if not path:
        return
    row: dict[str, Any] = {
        "script": Path(sys.argv[0]).stem,
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
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps(row) + "\n")


SCRIPT_COMMANDS = ("fcall", "fcall_ro", "evalsha", "evalsha_ro")


def script_stats(client: Any) -> dict[str, float]:
    """The server's ``INFO commandstats`` of script calls, whichever way redisbuf runs them
    (FCALL / FCALL_RO of the library, or EVALSHA; redisbuf/store/scripts.py): ``calls``,
    ``usec`` and ``usec_per_call`` (NaN when there was none)."""
    stats = client.info("commandstats")
    calls = sum(stats.get(f"cmdstat_{name}", {}).get("calls", 0) for name in SCRIPT_COMMANDS)
    usec = sum(stats.get(f"cmdstat_{name}", {}).get("usec", 0) for name in SCRIPT_COMMANDS)
    return {"calls": calls, "usec": usec, "usec_per_call": usec / calls if calls else float("nan")}
