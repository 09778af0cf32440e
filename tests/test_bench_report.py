"""benchmarks/run_all.py and benchmarks/_report.py: recording rows and results files,
assembling the table, and one run of the runner over tiny fake benchmark scripts that
renders a page from its results file (no real benchmark runs here, and nothing is
timed). benchmarks/render.py itself: tests/test_docs_figures.py."""

from __future__ import annotations

import importlib
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("_report"), importlib.import_module("run_all")


def test_record_writes_rows_only_when_the_runner_asks(bench, tmp_path, monkeypatch):
    report, _ = bench
    path = tmp_path / "rows.jsonl"
    monkeypatch.delenv(report.ENV, raising=False)
    monkeypatch.setattr(report, "_ROWS", {})
    report.record("a", 1.0, "items/s")
    assert not path.exists()
    monkeypatch.setenv(report.ENV, str(path))
    report.record("a again", 1.0, "items/s", baseline=2.0, target=">= 0.8")
    report.record("b", 3, "ms", series="s", axis="items", x=10, key="b-key")
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["key"], r["value"], r["baseline"], r["x"]) for r in rows] == [
        ("a-again", 1.0, 2.0, None),
        ("b-key", 3.0, None, 10.0),
    ]


def test_record_refuses_a_key_twice_or_a_bad_key(bench, monkeypatch):
    report, _ = bench
    monkeypatch.delenv(report.ENV, raising=False)
    monkeypatch.setattr(report, "_ROWS", {})
    report.record("update_priority(256), 10,000 items", 1.0, "items/s")
    assert list(report._ROWS) == ["update_priority-256-10-000-items"]
    with pytest.raises(ValueError, match="twice"):
        report.record("update_priority(256), 10,000 items", 2.0, "items/s")
    with pytest.raises(ValueError, match="key"):
        report.record("c", 1.0, "x", key="has space")


SCRIPT = """
import sys
from _report import record
record("add", 10.0, "items/s", baseline=5.0, key="add")
if sys.argv[1:] == ["--fail"]:
    raise RuntimeError("the benchmark broke")
"""


def test_a_script_writes_its_results_file_at_exit_with_where_and_when(tmp_path):
    """One run, one file: commit, date, load before and after, machine, command and the
    figures by key; a script that dies of an exception leaves the file as it was."""
    script = tmp_path / "bench_demo.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "results"
    env = {**os.environ, "PYTHONPATH": str(BENCH), "REDISBUF_BENCH_RESULTS": str(out)}
    env.pop("REDISBUF_BENCH_REPORT", None)
    done = subprocess.run([sys.executable, str(script), "--x"], env=env, capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    data = json.loads((out / "bench_demo.json").read_text())
    assert data["figures"]["add"]["value"] == 10.0 and data["figures"]["add"]["baseline"] == 5.0
    assert data["commit"] and data["date"].endswith("UTC") and data["command"].endswith("--x")
    assert len(data["load"]["before"]) == 3 and len(data["load"]["after"]) == 3
    assert "cores" in data["machine"]["cpu"]
    before = (out / "bench_demo.json").read_text()
    failed = subprocess.run([sys.executable, str(script), "--fail"], env=env,
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert failed.returncode == 1 and "the benchmark broke" in failed.stderr
    assert (out / "bench_demo.json").read_text() == before
    env["REDISBUF_BENCH_RESULTS"] = "off"
    (out / "bench_demo.json").unlink()
    subprocess.run([sys.executable, str(script)], env=env, check=True, timeout=120, cwd=ROOT)
    assert not (out / "bench_demo.json").exists()


@pytest.mark.parametrize(
    "kwargs",
    [{"target": "about 1"}, {"target": "=> 1"}, {"axis": "items"}, {"x": 3},
     {"axis": "time", "x": 1}, {"target_of": "baseline"}],
)
def test_record_rejects_a_malformed_row_even_unrecorded(bench, monkeypatch, kwargs):
    report, _ = bench
    monkeypatch.delenv(report.ENV, raising=False)
    with pytest.raises(ValueError):
        report.record("a", 1.0, "items/s", **kwargs)


def test_assemble_fills_ratio_and_judges_the_target(bench):
    _, run_all = bench
    rows = run_all.assemble(
        [
            {"figure": "r", "value": 9.0, "unit": "u", "baseline": 10.0, "target": ">= 0.8"},
            {"figure": "given", "value": 9.0, "unit": "u", "baseline": 10.0, "ratio": 0.7,
             "target": ">= 0.8"},
            {"figure": "v", "value": 70_000.0, "unit": "items/s", "baseline": 100_000.0,
             "target": ">= 60000", "target_of": "value"},
            {"figure": "cost", "value": 2.5, "unit": "x", "target": "<= 2"},
            {"figure": "none", "value": 1.0, "unit": "u"},
            {"figure": "nan", "value": float("nan"), "unit": "u", "baseline": 1.0,
             "target": "> 1"},
        ]
    )
    by = {row["figure"]: row for row in rows}
    assert by["r"]["ratio"] == pytest.approx(0.9) and by["r"]["met"] is True
    assert by["r"]["target_text"] == ">= 0.8x"
    assert by["given"]["ratio"] == 0.7 and by["given"]["met"] is False
    assert by["v"]["met"] is True and by["v"]["target_text"] == ">= 60000 items/s"
    assert by["cost"]["met"] is False and by["cost"]["target_text"] == "<= 2x"
    assert by["none"]["met"] is None and by["none"]["ratio"] is None
    assert math.isnan(by["nan"]["ratio"]) and by["nan"]["met"] is None


def test_discover_finds_bench_scripts_and_filters(bench, tmp_path):
    _, run_all = bench
    for name in ("bench_b.py", "bench_a.py", "_report.py", "run_all.py", "bench_c.txt"):
        (tmp_path / name).write_text("")
    assert [p.name for p in run_all.discover(tmp_path)] == ["bench_a.py", "bench_b.py"]
    assert [p.name for p in run_all.discover(tmp_path, only=["b"])] == ["bench_b.py"]
    assert [p.name for p in run_all.discover(tmp_path, skip=["bench_a.py"])] == ["bench_b.py"]
    with pytest.raises(ValueError, match="nope"):
        run_all.discover(tmp_path, only=["nope"])


FAKE_OK = """
import sys
from _report import record
assert sys.argv[1:] == ["--quick"], sys.argv  # the runner passes "--quick" when defined
for workers, rate in ((1, 100.0), (2, 180.0), (4, 300.0)):
    record(f"add, {workers} writers", rate, "items/s", series="add", axis="processes",
           x=workers)
record("sample vs HMGET", 80.0, "items/s", baseline=100.0, baseline_name="raw",
       target=">= 0.9", spread="0.7-0.9")
"""
FAKE_FAILS = """
import sys
from _report import record
assert sys.argv[1:] == [], sys.argv  # no --quick option here: none passed
record("sample at 10^6 items", 50.0, "items/s", series="sample", axis="items", x=10**6)
sys.exit(3)
"""
FAKE_HANGS = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
time.sleep(120)
"""


def test_the_performance_page_has_the_runners_marker_and_the_png_stays_in_docs(bench):
    """By default the run is rendered into docs/performance.md (which has its marker) and
    the PNG lands inside docs/: ``mkdocs build --strict`` refuses a page linking a file
    outside docs_dir."""
    _, run_all = bench
    docs = ROOT / "docs"
    assert run_all.PAGE == docs / "performance.md"
    assert run_all.PAGE.read_text().count(run_all.MARKER) == 1
    assert run_all.PNG.is_relative_to(docs) and run_all.PNG.suffix == ".png"


def test_runner_over_fake_scripts_writes_the_results_the_page_and_the_png(tmp_path):
    scripts = tmp_path / "benchmarks"
    scripts.mkdir()
    (scripts / "bench_ok.py").write_text(textwrap.dedent(FAKE_OK))
    (scripts / "bench_fails.py").write_text(textwrap.dedent(FAKE_FAILS))
    (scripts / "bench_hangs.py").write_text(textwrap.dedent(FAKE_HANGS))
    (scripts / "helper.py").write_text("raise SystemExit('not a benchmark: never run')")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    before, after = "# x\n\n## The latest run\n\n", "\n\n## Next\ntext\n"
    page.write_text(f"{before}<!-- table run_all -->\nstale\n<!-- /table -->{after}")
    png = tmp_path / "docs" / "benchmarks" / "throughput.png"
    png.parent.mkdir()
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--timeout", "5",
         "--bench-dir", str(scripts), "--page", str(page), "--png", str(png),
         "--results", str(results)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one failed, one timed out
    data = json.loads((results / "run_all.json").read_text())
    assert data["command"].endswith("run_all.py --quick --timeout 5 --bench-dir "
                                    f"{scripts} --page {page} --png {png} --results {results}")
    assert set(data["figures"]) == {"bench_ok/add-1-writers", "bench_ok/add-2-writers",
                                    "bench_ok/add-4-writers", "bench_ok/sample-vs-hmget",
                                    "bench_fails/sample-at-10-6-items"}
    assert (results / "bench_ok.json").exists()  # each script's own file too
    assert (results / "bench_fails.json").exists()  # exit 3 is no exception: its rows count
    assert not (results / "bench_hangs.json").exists()
    text = page.read_text()
    assert text.startswith(before + "<!-- table run_all -->\n") and text.endswith(after)
    block = text.split("<!-- table run_all -->\n")[1].split("<!-- /table -->")[0]
    assert "stale" not in block
    prose = " ".join(block.split())
    assert "`bench_fails` (exit 3)" in prose and "`bench_hangs` (timed out)" in prose
    assert "load average" in prose and "run_all.py --quick" in prose
    table = [line for line in block.splitlines() if line.startswith("| ")]
    assert table[0] == "| script | figure | value | baseline | ratio | target | met? |"
    assert (
        "| ok | sample vs HMGET | 80 items/s | 100 items/s (raw) | 0.80 (0.7-0.9) | >= 0.9x "
        "| no |" in table
    )
    assert "| fails | sample at 10^6 items | 50 items/s |  |  |  |  |" in table
    assert len(table) == 1 + 3 + 1 + 1
    assert "![throughput against processes and buffer size](benchmarks/throughput.png)" in block
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
