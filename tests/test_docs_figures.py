"""benchmarks/render.py: the docs' figures filled from results files, and the check CI
runs (a figure that differs from its file, a marker naming nothing, a figure typed by
hand outside any marker); benchmarks/peers/publish.py: a peers run made a results file."""

from __future__ import annotations

import importlib
import io
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


@pytest.fixture
def render(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.syspath_prepend(str(BENCH))
    return importlib.import_module("render")


RUN = {
    "format": 1, "name": "bench_demo", "commit": "abc1234", "dirty": False,
    "date": "2026-12-01 10:00 UTC", "load": {"before": [0.5, 0.4, 0.3], "after": [1.5, 1, 1]},
    "machine": {"cpu": "Some CPU, 2 cores, 24 GiB", "os": "Linux 6", "python": "3.11.7"},
    "command": "python benchmarks/bench_demo.py --quick",
    "figures": {
        "add": {"script": "bench_demo", "figure": "add(256)", "value": 73419.1, "unit": "items/s",
                "baseline": 53303.2, "baseline_name": "raw", "target": ">= 0.8"},
        "sample": {"script": "bench_demo", "figure": "sample(256)", "value": 1520.0,
                   "unit": "items/s", "baseline": 1000.0, "spread": "1.4-1.6"},
        "memory": {"script": "bench_demo", "figure": "memory", "value": 1139.4, "unit": "MB"},
        "wait": {"script": "bench_demo", "figure": "wait", "value": 13.27, "unit": "%"},
    },
}


@pytest.fixture
def results(render, tmp_path):
    (tmp_path / "bench_demo.json").write_text(json.dumps(RUN))
    return render.Results(tmp_path)


def fill(render, results, text):
    report = render.Report()
    out = render.render_text(text, results, "page.md", report)
    return out, report


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("add", "73.4k items/s"),
        ("add:ratio", "1.38x"),
        ("add:baseline", "53.3k items/s"),
        ("memory", "1,139 MB"),
        ("wait {:.0f} %", "13 %"),
        ("add,sample:ratio", "1.38-1.52x"),
        ("add,sample", "1.52k-73.4k items/s"),
        ("@date", "2026-12-01 10:00 UTC"),
        ("@commit", "abc1234"),
        ("@load", "0.5 before, 1.5 after"),
        ("@command", "python benchmarks/bench_demo.py --quick"),
    ],
)
def test_a_figure_marker_is_filled_from_its_file(render, results, spec, expected):
    out, report = fill(render, results, f"at <!-- fig bench_demo {spec} -->old<!-- /fig -->.")
    assert out == f"at <!-- fig bench_demo {spec} -->{expected}<!-- /fig -->."
    assert report.differ and not report.problems
    again, report = fill(render, results, out)
    assert again == out and not report.differ  # filled once, it stays


@pytest.mark.parametrize(
    ("spec", "why"),
    [("nope add", "no results file"), ("bench_demo nokey", "no figure 'nokey'"),
     ("bench_demo add:spread", "not one of"), ("bench_demo @when", "not one of"),
     ("bench_demo memory:ratio", "no ratio"), ("bench_demo add {:d}", "template")],
)
def test_a_marker_naming_nothing_is_a_problem(render, results, spec, why):
    text = f"x <!-- fig {spec} -->1<!-- /fig -->"
    out, report = fill(render, results, text)
    assert out == text and len(report.problems) == 1 and why in report.problems[0]


@pytest.mark.parametrize("text", ["Adds ran\n<!-- fig bench_demo add -->1<!-- /fig -->.",
                                  "- <!-- fig bench_demo add -->1<!-- /fig --> adds"])
def test_a_marker_starting_a_line_is_refused_as_it_breaks_the_paragraph(render, results, text):
    _, report = fill(render, results, text)
    assert len(report.problems) == 1 and "starts the line" in report.problems[0]
    _, report = fill(render, results, text.replace("\n<", " <").replace("- <", "- x <"))
    assert not report.problems


def test_a_table_marker_gets_the_runs_provenance_and_its_rows(render, results):
    out, report = fill(render, results, "<!-- table bench_demo only=add,sample -->\n"
                                        "<!-- /table -->\n")
    lines = out.splitlines()
    assert lines[1].startswith("From `benchmarks/results/bench_demo.json`: `python "
                               "benchmarks/bench_demo.py --quick` at commit abc1234, "
                               "2026-12-01 10:00 UTC; Some CPU")
    assert "load average (1 min) 0.5 before, 1.5 after" in lines[1]
    assert lines[3:] == [
        "| figure | value | baseline | ratio | target | met? |",
        "|---|---|---|---|---|---|",
        "| add(256) | 73.4k items/s | 53.3k items/s (raw) | 1.38 | >= 0.8x | yes |",
        "| sample(256) | 1.52k items/s | 1k items/s | 1.52 (1.4-1.6) |  |  |",
        "<!-- /table -->",
    ]


def test_a_table_by_series_is_the_peers_comparison(render, tmp_path):
    rows = {
        "redisbuf/add": {"figure": "add", "value": 2000.0, "unit": "items/s",
                         "series": "redisbuf", "baseline": 1000.0, "spread": "1.9-2.1"},
        "Reverb/add": {"figure": "add", "value": 1000.0, "unit": "items/s", "series": "Reverb"},
        "redisbuf/mem": {"figure": "memory", "value": 1139.0, "unit": "MB",
                         "series": "redisbuf", "baseline": 3848.0},
    }
    (tmp_path / "peers.json").write_text(json.dumps({**RUN, "figures": rows}))
    out, _ = fill(render, render.Results(tmp_path), "<!-- table peers by=series -->\n"
                                                    "<!-- /table -->\n")
    assert out.splitlines()[3:-1] == [
        "| figure | unit | redisbuf | Reverb |",
        "|---|---|---|---|",
        "| add | items/s | 2k (2.00x, 1.9-2.1) | 1k |",
        "| memory | MB | 1,139 (0.30x) | - |",
    ]


def test_a_table_without_its_file_says_how_to_make_it(render, tmp_path):
    out, report = fill(render, render.Results(tmp_path), "<!-- table bench_per -->\n"
                                                         "<!-- /table -->\n")
    assert "run `python benchmarks/bench_per.py` to write `benchmarks/results/bench_per.json`" \
        in out
    assert report.missing and not report.problems


HAND = """# page

Adds ran at 73.4k items/s, 1.38x the baseline, 2.5 ms a call, 1,139 MB, 13 % waiting,
at load average 3-4.
Polls every 5 ms, doubling to 100 ms. <!-- not-a-figure -->

```bash
python bench.py --target 1.5x --seconds 2.5   # code is not prose
```

`sample(256)` took `1.2 ms` in code; <!-- a comment with 2.0x --> a 2x10^6-item buffer.
"""


def test_figures_typed_by_hand_outside_markers_are_found(render):
    found = render.unmarked(HAND, "page.md")
    assert [f.split(": ", 1)[1].split(" looks")[0] for f in found] == [
        "'73.4k items/s'", "'1.38x'", "'2.5 ms'", "'1,139 MB'", "'13 %'", "'load average 3'",
    ]
    assert all(f.startswith("page.md:3: ") for f in found[:5]) and found[5].startswith("page.md:4")


def test_check_fails_on_a_figure_that_differs_from_its_file(render, results, tmp_path):
    page = tmp_path / "page.md"
    good = "Adds: <!-- fig bench_demo add:ratio -->1.38x<!-- /fig --> the baseline.\n"
    page.write_text(good)
    out = io.StringIO()
    assert render.run([page], check=True, results=results, out=out) == 0, out.getvalue()
    page.write_text(good.replace("1.38x", "1.40x"))
    out = io.StringIO()
    assert render.run([page], check=True, results=results, out=out) == 1
    assert "reads '1.40x', its file gives '1.38x'" in out.getvalue()
    assert page.read_text() == good.replace("1.38x", "1.40x")  # --check writes nothing
    assert render.run([page], check=False, results=results, out=io.StringIO()) == 0
    assert page.read_text() == good  # rendering puts it right


def test_check_fails_on_a_hand_typed_figure_and_strict_on_a_missing_file(render, results,
                                                                        tmp_path):
    page = tmp_path / "page.md"
    page.write_text("Adds ran at 1.38x.\n")
    out = io.StringIO()
    assert render.run([page], check=True, results=results, out=out) == 1
    assert "'1.38x' looks like a ratio measured by hand" in out.getvalue()
    page.write_text("<!-- table bench_none -->\n<!-- /table -->\n")
    render.run([page], check=False, results=results, out=io.StringIO())
    assert render.run([page], check=True, results=results, out=io.StringIO()) == 0
    assert render.run([page], check=True, strict=True, results=results,
                      out=io.StringIO()) == 1


def test_the_repositorys_pages_match_their_results_files(render):
    """What CI runs (.ci/test): every figure of README.md and docs/ comes from a results
    file and reads as that file says."""
    out = io.StringIO()
    assert render.run(render.pages(), check=True, out=out) == 0, out.getvalue()


def test_every_committed_results_file_has_where_and_when(render):
    for path in sorted((BENCH / "results").glob("*.json")):
        data = json.loads(path.read_text())
        assert data["name"] == path.stem and data["format"] == 1, path
        for field in ("commit", "date", "load", "machine", "command", "figures"):
            assert data.get(field), f"{path.name} has no {field}"


def test_a_peers_run_becomes_a_results_file_keyed_by_peer_and_figure(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(BENCH / "peers"))
    monkeypatch.syspath_prepend(str(BENCH))
    publish = importlib.import_module("publish")
    run = {
        "date": "20261127T2044Z", "repeat": 2, "load_range": "0.4-3.4",
        "machine": {"cpus": 2, "platform": "Linux", "python": "3.11.7"},
        "config": {"figures": ["add_4k_uniform"], "apex_size": 2_000_000},
        "orders": [["redisbuf", "Reverb"], ["Reverb", "redisbuf"]],
        "summary": {"add_4k_uniform": {
            "redisbuf": {"median": 150.0, "runs": [100.0, 200.0], "via": []},
            "Reverb": {"median": 100.0, "runs": [100.0, 100.0], "via": ["StructuredWriter"]},
        }},
    }
    source = tmp_path / "run.json"
    source.write_text(json.dumps(run))
    path = publish.publish(source, "peers-test", commit="abc1234", directory=tmp_path)
    data = json.loads(path.read_text())
    assert data["commit"] == "abc1234" and data["date"] == "2026-11-27 20:44 UTC"
    assert data["command"] == ("python benchmarks/peers/run.py --repeat 2 --peers "
                               "redisbuf,Reverb --figures add_4k_uniform")
    ours = data["figures"]["redisbuf/add_4k_uniform"]
    assert ours["ratio"] == 1.5 and ours["spread"] == "1.00-2.00" and ours["baseline"] == 100.0
    assert "ratio" not in data["figures"]["Reverb/add_4k_uniform"]
    guessed = json.loads(publish.publish(source, "peers-guess", directory=tmp_path).read_text())
    assert guessed["commit"] and "last commit made before it began" in guessed["commit_note"]
