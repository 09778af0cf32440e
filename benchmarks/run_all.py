"""Run every benchmark script, print one table, and write it as the results file that
docs/performance.md's latest run is rendered from, with a PNG.

Usage: python benchmarks/run_all.py [--quick] [--only NAME ...] [--skip NAME ...]
                                    [--timeout S] [--no-write]

Runs each ``benchmarks/bench_*.py`` (found by name, so new scripts join without an edit
here) in its own process, one after another, passing ``--quick`` to those that accept
it. Each script records its headline figures with ``_report.record`` (see
``benchmarks/_report.py``), which writes the script's own results file
(``benchmarks/results/<script>.json``) and hands the rows to this runner through a
JSON-lines file named by ``$REDISBUF_BENCH_REPORT``; a script that records nothing only
shows its own output. Then it prints one table (figure, value, baseline, ratio, target,
met?), writes every row with the date, the commit, the machine, its load average before
and after and which scripts ran to ``benchmarks/results/run_all.json``, draws
``docs/benchmarks/throughput.png`` (inside docs/, so that ``mkdocs build --strict``
serves it): throughput against processes and against buffer size, from the rows that
carry an ``axis``, and renders docs/performance.md (its ``<!-- table run_all -->``
block) and the other pages from the results files (``benchmarks/render.py``). Never run
in CI: it takes minutes and its figures depend on the machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import render
from _report import ENV, RESULTS_ENV, load_average, results_dir, run_meta, write_results

HERE = Path(__file__).resolve().parent
PAGE = HERE.parent / "docs" / "performance.md"
PNG = HERE.parent / "docs" / "benchmarks" / "throughput.png"
NAME = "run_all"  # the results file the page's latest run is rendered from
MARKER = f"<!-- table {NAME} -->"


def discover(bench_dir: Path, only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[Path]:
    """The ``bench_*.py`` scripts of ``bench_dir`` in name order; ``only`` / ``skip`` take
    names with or without the ``bench_`` prefix and ``.py`` suffix. ValueError names an
    ``only`` entry that matches no script."""
    scripts = sorted(bench_dir.glob("bench_*.py"))

    def short(name: str) -> str:
        return name.removesuffix(".py").removeprefix("bench_")

    names = {short(p.name): p for p in scripts}
    unknown = [name for name in only if short(name) not in names]
    if unknown:
        raise ValueError(f"no benchmark named {unknown}; have {sorted(names)}")
    wanted = {short(n) for n in only} or set(names)
    dropped = {short(n) for n in skip}
    return [p for n, p in names.items() if n in wanted and n not in dropped]


def script_args(script: Path, quick: bool) -> list[str]:
    """``--quick`` for a script whose source defines that option, else nothing."""
    return ["--quick"] if quick and '"--quick"' in script.read_text() else []


def run_script(script: Path, args: list[str], report: Path, timeout: float,
               results: Path | None) -> dict[str, Any]:
    """Run one script (its output goes to ours); returns its name, exit code and seconds.
    On timeout its whole process group (servers, mpiexec ranks) is killed."""
    # _report importable from scripts outside this folder too (the tests run such ones)
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, **{ENV: str(report), "PYTHONPATH": path,
                              RESULTS_ENV: str(results) if results else "off"})
    start = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, str(script), *args], env=env, start_new_session=True
    )
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        code = None
    finally:
        if proc.poll() is None:  # Ctrl-C here: take the script's processes down with us
            os.killpg(proc.pid, signal.SIGKILL)
    return {"script": script.stem, "code": code, "seconds": time.monotonic() - start}


def load_rows(report: Path) -> list[dict[str, Any]]:
    """The rows ``_report.record`` appended to ``report`` (none if it does not exist)."""
    if not report.exists():
        return []
    return [json.loads(line) for line in report.read_text().splitlines() if line.strip()]


def assemble(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows with ``ratio`` filled in (value / baseline unless recorded), ``met``: True /
    False against the target, None without a target or the number it applies to, and
    ``target_text`` (see ``render.judge``)."""
    return [render.judge(row) for row in rows]


def fmt(value: float | None) -> str:
    """A ratio with 3 significant digits (thousands separated), or empty for None."""
    if value is None:
        return ""
    if value != 0 and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


MET = {True: "yes", False: "no", None: ""}
COLUMNS = ("script", "figure", "value", "baseline", "ratio", "target", "met?")


def cells(row: dict[str, Any]) -> list[str]:
    """A row's table cells, in the order of :data:`COLUMNS`."""
    baseline = render.with_unit(row.get("baseline"), row["unit"])
    if baseline and row.get("baseline_name"):
        baseline += f" ({row['baseline_name']})"
    ratio = fmt(row.get("ratio"))
    if ratio and row.get("spread"):
        ratio += f" ({row['spread']})"
    return [
        row["script"].removeprefix("bench_"),
        row["figure"],
        render.with_unit(row["value"], row["unit"]),
        baseline,
        ratio,
        row.get("target_text", ""),
        MET[row["met"]],
    ]


def outcome(run: dict[str, Any]) -> str:
    return "timed out" if run["code"] is None else f"exit {run['code']}"


def note(runs: list[dict[str, Any]]) -> str:
    """Which scripts ran, how long, and which failed: the results file's note."""
    parts = []
    ran = ", ".join(f"`{r['script']}` ({r['seconds']:.0f} s)" for r in runs if r["code"] == 0)
    if ran:
        parts.append(f"Ran: {ran}.")
    failed = [r for r in runs if r["code"] != 0]
    if failed:
        parts.append("Failed (rows recorded before the failure are kept): "
                     + ", ".join(f"`{r['script']}` ({outcome(r)})" for r in failed) + ".")
    return " ".join(parts)


def plot(rows: list[dict[str, Any]], path: Path, caption: str = "") -> bool:
    """Draw throughput against processes and against items into ``path``; False (no file
    written) if no row carries an axis."""
    curves: dict[str, dict[tuple[str, str], list[tuple[float, float]]]] = {}
    for row in rows:
        if row.get("axis"):
            key = (row.get("series") or row["figure"], row["unit"])
            curves.setdefault(row["axis"], {}).setdefault(key, []).append((row["x"], row["value"]))
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_names = [a for a in ("processes", "items") if a in curves]
    fig, axes = plt.subplots(1, len(axes_names), figsize=(6 * len(axes_names), 4.2), squeeze=False)
    for ax, name in zip(axes[0], axes_names, strict=True):
        for (series, unit), points in sorted(curves[name].items()):
            points.sort()
            ax.plot(*zip(*points, strict=True), marker="o", label=f"{series} ({unit})")
        ax.set_xlabel("processes" if name == "processes" else "items in the buffer")
        ax.set_ylabel("per second (log scale)")
        ax.set_yscale("log")
        if name == "items":
            ax.set_xscale("log")
            ax.set_title("throughput against buffer size")
        else:
            ax.set_xticks(sorted({x for points in curves[name].values() for x, _ in points}))
            ax.set_title("throughput against processes")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    if caption:
        fig.suptitle(caption, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def print_table(rows: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="redisbuf benchmarks (ratios against baselines of the same run)")
    for column in COLUMNS:
        table.add_column(column, justify="right" if column in ("value", "ratio") else "left")
    for row in rows:
        style = {True: "green", False: "red", None: None}[row["met"]]
        table.add_row(*cells(row), style=style)
    # a wide table even in a log file (rich assumes 80 columns when not on a terminal)
    Console(width=None if sys.stdout.isatty() else 200).print(table)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="pass --quick where accepted")
    parser.add_argument("--only", nargs="+", default=[], help="run only these (e.g. per)")
    parser.add_argument("--skip", nargs="+", default=[], help="do not run these")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per script")
    # --no-readme: the name from when the table lived in README.md
    parser.add_argument("--no-write", "--no-readme", dest="no_write", action="store_true",
                        help="print only; write nothing")
    parser.add_argument("--bench-dir", type=Path, default=HERE, help=argparse.SUPPRESS)
    parser.add_argument("--page", type=Path, default=PAGE, help=argparse.SUPPRESS)
    parser.add_argument("--png", type=Path, default=PNG, help=argparse.SUPPRESS)
    parser.add_argument("--results", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        scripts = discover(args.bench_dir, args.only, args.skip)
    except ValueError as exc:
        parser.error(str(exc))
    results = None if args.no_write else (args.results or results_dir())
    if not args.no_write and MARKER not in args.page.read_text():
        # fail before minutes of benchmarks, not after
        parser.error(f"{args.page} has no {MARKER} line to render the run into")
    started = dt.datetime.now(dt.UTC)
    load_before = [round(x, 2) for x in os.getloadavg()]
    runs = []
    with tempfile.TemporaryDirectory(prefix="redisbuf-bench-") as tmp:
        report = Path(tmp) / "rows.jsonl"
        for script in scripts:
            extra = script_args(script, args.quick)
            print(f"\n=== {script.name} {' '.join(extra)}", flush=True)
            runs.append(run_script(script, extra, report, args.timeout, results))
            print(f"=== {script.name}: {outcome(runs[-1])}, {runs[-1]['seconds']:.0f} s")
        rows = assemble(load_rows(report))
    print_table(rows)
    for run in runs:
        if run["code"] != 0:
            print(f"{run['script']}: {outcome(run)}")
    status = 0 if all(r["code"] == 0 for r in runs) else 1
    if results is None:
        return status
    meta = run_meta(started, load_before)
    caption = f"{meta['date']}, {meta['machine']['cpu']}, load {load_average()}"
    extra: dict[str, Any] = {"note": note(runs), "runs": runs,
                             "png_caption": "throughput against processes and buffer size"}
    if plot(rows, args.png, caption):
        root = HERE.parent
        extra["png"] = (args.png.resolve().relative_to(root).as_posix()
                        if args.png.resolve().is_relative_to(root) else str(args.png.resolve()))
    figures = {f"{row['script']}/{row['key']}": row for row in rows}
    path = write_results(NAME, figures, meta, results, **extra)
    print(f"wrote {path}" + (f" and {args.png}" if extra.get("png") else ""))
    render.run([args.page.resolve()], check=False, results=render.Results(results))
    return status


if __name__ == "__main__":
    sys.exit(main())
