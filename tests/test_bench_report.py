"""benchmarks/run_all.py and benchmarks/_report.py: recording rows, assembling the table,
rewriting the block of docs/performance.md, and one run of the runner over tiny fake
benchmark scripts (no real benchmark runs here, and nothing is timed)."""

from __future__ import annotations

import importlib
import json
import math
import re
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


def test_record_writes_only_when_the_runner_asks(bench, tmp_path, monkeypatch):
    report, _ = bench
    path = tmp_path / "rows.jsonl"
    monkeypatch.delenv(report.ENV, raising=False)
    report.record("a", 1.0, "items/s")
    assert not path.exists()
    monkeypatch.setenv(report.ENV, str(path))
    report.record("a", 1.0, "items/s", baseline=2.0, target=">= 0.8")
    report.record("b", 3, "ms", series="s", axis="items", x=10)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(r["figure"], r["value"], r["baseline"], r["x"]) for r in rows] == [
        ("a", 1.0, 2.0, None),
        ("b", 3.0, None, 10.0),
    ]


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


def test_rewrite_block_replaces_only_between_the_markers(bench):
    _, run_all = bench
    text = f"# title\n\nintro\n{run_all.BEGIN}\nold | table\n{run_all.END}\n\n## next\n"
    new = run_all.rewrite_block(text, "| new | table |\n")
    assert new == f"# title\n\nintro\n{run_all.BEGIN}\n| new | table |\n{run_all.END}\n\n## next\n"
    assert run_all.rewrite_block(new, "| new | table |") == new  # idempotent
    # markers quoted inside a line (as the page's own description does) are not markers
    quoted = f"rewrites `{run_all.BEGIN}` to `{run_all.END}`\n"
    assert run_all.rewrite_block(quoted + text, "x") == quoted + run_all.rewrite_block(text, "x")


@pytest.mark.parametrize(
    "text",
    ["no markers", "<!-- benchmarks:begin -->\nonly the start",
     "<!-- benchmarks:end -->\n<!-- benchmarks:begin -->",
     "<!-- benchmarks:begin -->\n<!-- benchmarks:end -->\n<!-- benchmarks:begin -->",
     "<!-- benchmarks:begin --> and <!-- benchmarks:end --> on one line"],
)
def test_rewrite_block_refuses_missing_or_misordered_markers(bench, text):
    _, run_all = bench
    with pytest.raises(ValueError):
        run_all.rewrite_block(text, "x")


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


def test_the_runner_writes_the_performance_page_and_a_png_mkdocs_serves(bench):
    """By default the table goes into docs/performance.md (which has its one pair of
    markers) and the PNG inside docs/, linked by a path that stays inside docs/:
    ``mkdocs build --strict`` refuses a page linking a file outside docs_dir."""
    _, run_all = bench
    docs = ROOT / "docs"
    assert run_all.PAGE == docs / "performance.md"
    page = run_all.PAGE.read_text()
    assert run_all.rewrite_block(page, "") != page  # exactly one begin and one end marker
    assert run_all.PNG.is_relative_to(docs) and run_all.PNG.suffix == ".png"
    block = page.split(run_all.BEGIN + "\n")[1].split(run_all.END)[0]
    images = re.findall(r"!\[[^]]*\]\(([^)]+)\)", block)
    assert images, "the block shows the PNG it was written with"
    for image in images:
        assert (run_all.PAGE.parent / image).resolve().is_relative_to(docs), image
        assert (run_all.PAGE.parent / image).is_file(), image


def test_runner_over_fake_scripts_writes_the_block_and_the_png(tmp_path):
    scripts = tmp_path / "benchmarks"
    scripts.mkdir()
    (scripts / "bench_ok.py").write_text(textwrap.dedent(FAKE_OK))
    (scripts / "bench_fails.py").write_text(textwrap.dedent(FAKE_FAILS))
    (scripts / "bench_hangs.py").write_text(textwrap.dedent(FAKE_HANGS))
    (scripts / "helper.py").write_text("raise SystemExit('not a benchmark: never run')")
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "performance.md"
    before, after = "# x\n\n## The latest run\n\n", "\n\n## Next\ntext\n"
    page.write_text(f"{before}<!-- benchmarks:begin -->\nstale\n<!-- benchmarks:end -->{after}")
    png = tmp_path / "docs" / "benchmarks" / "throughput.png"
    png.parent.mkdir()
    done = subprocess.run(
        [sys.executable, str(BENCH / "run_all.py"), "--quick", "--timeout", "5",
         "--bench-dir", str(scripts), "--page", str(page), "--png", str(png)],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # one failed, one timed out
    text = page.read_text()
    assert text.startswith(before + "<!-- benchmarks:begin -->\n") and text.endswith(after)
    block = text.split("<!-- benchmarks:begin -->\n")[1].split("<!-- benchmarks:end -->")[0]
    assert "stale" not in block
    prose = " ".join(block.split())  # the runner wraps its sentences
    assert "`bench_fails` (exit 3)" in prose and "`bench_hangs` (timed out)" in prose
    assert "Load average" in prose and "run_all.py --quick`" in prose
    table = [line for line in block.splitlines() if line.startswith("| ")]
    assert table[0] == "| script | figure | value | baseline | ratio | target | met? |"
    assert (
        "| ok | sample vs HMGET | 80 items/s | 100 items/s (raw) | 0.8 (0.7-0.9) | >= 0.9x | no |"
        in table
    )
    assert "| fails | sample at 10^6 items | 50 items/s |  |  |  |  |" in table
    assert len(table) == 1 + 3 + 1 + 1
    assert "![throughput against processes and buffer size](benchmarks/throughput.png)" in block
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
