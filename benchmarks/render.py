"""Fill the docs' benchmark figures from the results files, or check that they match.

Usage: python benchmarks/render.py [--check] [--strict] [PAGE ...]

The pages (README.md and every docs/**/*.md unless PAGEs are named) quote a figure only
between markers, which this script fills from ``benchmarks/results/<FILE>.json`` (the
files benchmark scripts write through ``benchmarks/_report.py``; the convention is in
``benchmarks/results/README.md``):

* ``<!-- fig FILE KEY -->73.4k items/s<!-- /fig -->``: one figure. ``KEY:ratio`` or
  ``KEY:baseline`` quotes that part of the row; ``KEY1,KEY2`` the range ``low-high`` of
  several; ``@date``, ``@commit``, ``@load``, ``@machine``, ``@command`` the run's own
  data. A template after the key (``{:.1f} %``) formats the number instead of the unit's
  default.
* ``<!-- table FILE [by=series] [only=PATTERN,...] -->`` ... ``<!-- /table -->``, each
  marker alone on its line: a table of the file's figures (those whose key matches one
  of the shell patterns, all by default), under a line saying what ran where and when.
  ``by=series`` makes one column per series (the peers' comparison). A table whose file
  does not exist yet says how to make it.

Without ``--check`` the pages are rewritten in place. With it nothing is written and the
exit status is 1 when a marked figure differs from its file, a marker names a file or key
that does not exist, or a line outside markers and code carries what looks like a
measured figure (a rate ``/s``, a ratio ``1.4x``, a duration ``2.5 ms``, a size ``1,139
MB``, a percentage, ``load average 3``): quote it, or end the line with
``<!-- not-a-figure -->`` if it is a setting or a bound, not a measurement. ``--strict``
also fails on a table whose results file is missing. CI runs ``--check``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import math
import os
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import parse_target  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"

FIG = re.compile(r"<!-- fig (?P<spec>[^\n]*?) -->(?P<text>[^\n]*?)<!-- /fig -->")
TABLE = re.compile(
    r"^<!-- table (?P<spec>[^\n]*?) -->\n(?P<body>(?:.*\n)*?)<!-- /table -->$", re.M
)
NOT_A_FIGURE = "<!-- not-a-figure -->"
# a line (or a list item) that starts with an HTML comment starts a raw HTML block in
# Markdown (CommonMark, Python-Markdown): the paragraph breaks there and the rest of the
# line is not Markdown any more
LINE_START = re.compile(r"^ {0,3}(?:(?:[-*+]|\d+[.)]) +)?<!-- fig ", re.M)
META = ("@date", "@commit", "@load", "@machine", "@command")
FIELDS = ("value", "baseline", "ratio")

# what a measured figure looks like in prose (code, markers and comments are left out)
FIGURE_PATTERNS: dict[str, str] = {
    "a rate": r"(?<![\w.])\d[\d,.]*\s?[kM]?(?:\s?[a-z]+(?: [a-z]+)?)?/s\b",
    "a ratio": r"(?<![\w.^])\d+(?:\.\d+)?x(?![\w^])",
    "a duration": r"(?<![\w.^])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|us|µs)\b",
    "a time": r"(?<![\w.^])\d+\.\d+(?:-\d+(?:\.\d+)?)? s\b",
    "a size": r"(?<![\w.^])\d[\d,.]* ?(?:[kKMG]B\b|B per\b)",
    "a percentage": r"(?<![\w.^])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?%",
    "a load average": r"\bload(?: average)?(?: of| at| about| between| was)? \d",
}


class ResultsError(ValueError):
    """A marker that cannot be filled: unknown file, key or field, or a bad template."""


def pages(root: Path = ROOT) -> list[Path]:
    """README.md and every Markdown page under docs/ (the changelog is a record of the
    past, included by docs/changelog.md, and not checked)."""
    found = [root / "README.md"] if (root / "README.md").exists() else []
    return found + sorted((root / "docs").rglob("*.md"))


class Results:
    """The results files of a directory, read once each."""

    def __init__(self, directory: Path = RESULTS) -> None:
        self.directory = directory
        self._cache: dict[str, dict[str, Any] | None] = {}

    def get(self, name: str) -> dict[str, Any] | None:
        if name not in self._cache:
            path = self.directory / f"{name}.json"
            self._cache[name] = json.loads(path.read_text()) if path.exists() else None
        return self._cache[name]

    def need(self, name: str) -> dict[str, Any]:
        data = self.get(name)
        if data is None:
            raise ResultsError(f"no results file {self.directory.name}/{name}.json")
        return data


# ---- formatting -------------------------------------------------------------------------


def number(value: float | None, unit: str = "") -> str:
    """A figure's number without its unit: rates with k / M and 3 significant digits
    (``73.4k``), other values of 1000 or more with thousands separated (``1,139``),
    smaller ones with 3 significant digits; ``x`` ratios with 2 decimals."""
    if value is None:
        return ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if unit == "x":
        return f"{value:.2f}"
    if "/s" in unit:
        for div, suffix in ((1e6, "M"), (1e3, "k")):
            if abs(value) >= div:
                return f"{value / div:.3g}{suffix}"
    if value != 0 and abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def with_unit(value: float | None, unit: str) -> str:
    """``number`` and the unit (``1.38x``, ``73.4k items/s``, ``15.8 ms``)."""
    if value is None:
        return ""
    return f"{number(value, unit)}x" if unit == "x" else f"{number(value, unit)} {unit}"


def load_text(data: dict[str, Any]) -> str:
    """The load a run was measured under, as the file records it."""
    load = data.get("load") or {}
    if isinstance(load, str):
        return load
    if load.get("range"):
        return str(load["range"])
    before, after = load.get("before"), load.get("after")
    if before and after:
        return f"{before[0]:.1f} before, {after[0]:.1f} after"
    return "not recorded"


def commit_text(data: dict[str, Any]) -> str:
    text = data.get("commit") or "not recorded"
    if data.get("dirty"):
        text += " (with local changes)"
    return f"{text} ({data['commit_note']})" if data.get("commit_note") else text


def machine_text(data: dict[str, Any]) -> str:
    machine = data.get("machine") or {}
    if isinstance(machine, str):
        return machine
    parts = [machine.get("cpu") or (f"{machine['cpus']} CPUs" if machine.get("cpus") else "")]
    parts += [machine.get("os") or machine.get("platform") or ""]
    parts += [f"Python {machine['python']}" if machine.get("python") else ""]
    return "; ".join(p for p in parts if p) or "not recorded"


def meta_value(data: dict[str, Any], what: str) -> str:
    return {
        "@date": lambda: str(data.get("date") or "not recorded"),
        "@commit": lambda: commit_text(data),
        "@load": lambda: load_text(data),
        "@machine": lambda: machine_text(data),
        "@command": lambda: str(data.get("command") or "not recorded"),
    }[what]()


def provenance(name: str, data: dict[str, Any]) -> str:
    """The line above a table: what ran, at which commit, when, where, under which load."""
    machine = machine_text(data)
    text = (
        f"From `benchmarks/results/{name}.json`: `{meta_value(data, '@command')}` at "
        f"commit {commit_text(data)}, {meta_value(data, '@date')}; "
        f"{'machine not recorded' if machine == 'not recorded' else machine}; "
        f"load average (1 min) {load_text(data)}."
    )
    if data.get("note"):
        text += f" {data['note']}"
    return text


# ---- one figure ---------------------------------------------------------------------------


def figure_row(data: dict[str, Any], name: str, key: str) -> dict[str, Any]:
    figures = data.get("figures") or {}
    if key not in figures:
        near = [k for k in figures if key.split("/")[-1] in k][:5]
        hint = f"; keys like it: {near}" if near else ""
        raise ResultsError(f"{name}.json has no figure {key!r}{hint}")
    row: dict[str, Any] = figures[key]
    return row


def part(row: dict[str, Any], what: str) -> tuple[float | None, str]:
    """(number, unit) of one part of a row; a ratio is computed from its baseline if the
    row carries none."""
    if what == "ratio":
        ratio = row.get("ratio")
        if ratio is None and row.get("baseline") and row.get("value") is not None:
            ratio = row["value"] / row["baseline"]
        return ratio, "x"
    return row.get(what), row.get("unit", "")


def fill(spec: str, results: Results) -> str:
    """The text of one ``fig`` marker (see the module docstring)."""
    words = spec.split(None, 2)
    if len(words) < 2:
        raise ResultsError(f"fig marker {spec!r}: give FILE and KEY")
    name, selector, template = words[0], words[1], words[2] if len(words) > 2 else None
    data = results.need(name)
    if selector.startswith("@"):
        if selector not in META:
            raise ResultsError(f"fig marker {spec!r}: {selector} is not one of {META}")
        return meta_value(data, selector)
    keys, _, what = selector.partition(":")
    what = what or "value"
    if what not in FIELDS:
        raise ResultsError(f"fig marker {spec!r}: {what!r} is not one of {FIELDS}")
    parts = [part(figure_row(data, name, key), what) for key in keys.split(",")]
    if any(value is None for value, _ in parts):
        raise ResultsError(f"fig marker {spec!r}: the file has no {what} for it")

    def show(value: float, unit: str) -> str:
        if template is None:
            return with_unit(value, unit)
        try:
            return template.format(value)
        except (ValueError, IndexError, KeyError) as exc:
            raise ResultsError(f"fig marker {spec!r}: template {template!r}: {exc}") from exc

    if len(parts) == 1:
        return show(*parts[0])  # type: ignore[arg-type]
    low = min(parts, key=lambda p: p[0])  # type: ignore[arg-type,return-value]
    high = max(parts, key=lambda p: p[0])  # type: ignore[arg-type,return-value]
    if template is None and low[1] == high[1]:  # one unit after the range
        unit = low[1]
        tail = "x" if unit == "x" else f" {unit}"
        return f"{number(low[0], unit)}-{number(high[0], unit)}{tail}"
    if template is not None and "}" in template:  # "{:.0f} %": the tail once, at the end
        head, _, tail = template.rpartition("}")
        try:
            return f"{(head + '}').format(low[0])}-{(head + '}').format(high[0])}{tail}"
        except (ValueError, IndexError, KeyError) as exc:
            raise ResultsError(f"fig marker {spec!r}: template {template!r}: {exc}") from exc
    return f"{show(*low)}-{show(*high)}"  # type: ignore[arg-type]


# ---- tables ------------------------------------------------------------------------------


def selected(data: dict[str, Any], only: Sequence[str]) -> list[tuple[str, dict[str, Any]]]:
    rows = list((data.get("figures") or {}).items())
    if only:
        rows = [(k, r) for k, r in rows if any(fnmatch.fnmatchcase(k, p) for p in only)]
    return rows


def cell(text: str) -> str:
    return text.replace("|", "\\|")


def judge(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with ``ratio`` filled in (value / baseline unless recorded), ``met``
    (True / False against the target; None without a target or the number it applies to)
    and ``target_text`` (``">= 0.8x"``, ``">= 60000 items/s"``)."""
    row = dict(row, ratio=row.get("ratio"))
    if row["ratio"] is None and row.get("baseline") and row.get("value") is not None:
        row["ratio"] = row["value"] / row["baseline"]
    row["met"] = None
    if row.get("target"):
        op, bound = parse_target(row["target"])
        of = row.get("target_of") or ("ratio" if row.get("ratio") is not None else "value")
        subject = row.get(of)
        if subject is not None and math.isfinite(subject):
            row["met"] = {">=": subject >= bound, "<=": subject <= bound,
                          ">": subject > bound, "<": subject < bound}[op]
        unit = "x" if of == "ratio" or row.get("unit") == "x" else f" {row.get('unit', '')}"
        row["target_text"] = f"{op} {bound:g}{unit}"
    return row


def ratio_text(row: dict[str, Any]) -> str:
    ratio, _ = part(row, "ratio")
    if ratio is None:
        return ""
    text = number(ratio, "x")
    return f"{text} ({row['spread']})" if row.get("spread") else text


def plain_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """figure, value, baseline, ratio, target, met? (and the script, when the rows come
    from several); columns that no row fills are left out."""
    columns: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("script", lambda r: str(r.get("script") or "").removeprefix("bench_")),
        ("figure", lambda r: str(r.get("figure") or "")),
        ("value", lambda r: "error" if r.get("error") else with_unit(r.get("value"),
                                                                   r.get("unit", ""))),
        ("baseline", lambda r: with_unit(r.get("baseline"), r.get("unit", ""))
         + (f" ({r['baseline_name']})" if r.get("baseline_name") else "")),
        ("ratio", ratio_text),
        ("target", lambda r: str(r.get("target_text") or r.get("target") or "")),
        ("met?", lambda r: {True: "yes", False: "no"}.get(r.get("met"), "")),  # type: ignore[arg-type]
    ]
    scripts = {r.get("script") for _, r in rows}
    if len(scripts) <= 1:
        columns = columns[1:]
    columns = [(h, f) for h, f in columns if h == "figure" or any(f(r) for _, r in rows)]
    lines = ["| " + " | ".join(h for h, _ in columns) + " |", "|" + "---|" * len(columns)]
    for _, row in rows:
        lines.append("| " + " | ".join(cell(f(row)) for _, f in columns) + " |")
    return lines


def series_table(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """One row per figure, one column per series: ``value (ratio)`` in each cell, ``-``
    where a series has no such figure (the peers' comparison)."""
    series: list[str] = []
    figures: dict[str, dict[str, dict[str, Any]]] = {}
    units: dict[str, str] = {}
    for _, row in rows:
        name = str(row.get("series") or "")
        if name not in series:
            series.append(name)
        figures.setdefault(row["figure"], {})[name] = row
        units.setdefault(row["figure"], row.get("unit", ""))

    def one(row: dict[str, Any] | None) -> str:
        if row is None:
            return "-"
        if row.get("value") is None:
            return "error"
        text = number(row["value"], row.get("unit", ""))
        ratio, _ = part(row, "ratio")
        if ratio is None:
            return text
        spread = f", {row['spread']}" if row.get("spread") else ""
        return f"{text} ({number(ratio, 'x')}x{spread})"

    lines = ["| figure | unit | " + " | ".join(series) + " |",
             "|---|---|" + "---|" * len(series)]
    for figure, by in figures.items():
        lines.append(f"| {cell(figure)} | {units[figure]} | "
                     + " | ".join(cell(one(by.get(s))) for s in series) + " |")
    return lines


def table(spec: str, results: Results, page: Path | None = None) -> tuple[str, bool]:
    """The body of one ``table`` marker on ``page`` and whether its results file exists;
    a PNG the file names (``png``, from the repository root) is shown under the table."""
    words = spec.split()
    if not words:
        raise ResultsError("table marker without a FILE")
    name, options = words[0], dict(w.partition("=")[::2] for w in words[1:])
    unknown = set(options) - {"by", "only"}
    if unknown or options.get("by", "series") != "series":
        raise ResultsError(f"table marker {spec!r}: options are by=series and only=PATTERNS")
    data = results.get(name)
    if data is None:
        script = HERE / f"{name}.py"
        if not script.exists():
            script = HERE / "peers" / "run.py" if name.startswith("peers") else None
        how = f" `python {script.relative_to(ROOT).as_posix()}`" if script else ""
        return (f"Not measured on this version yet: run{how} to write "
                f"`benchmarks/results/{name}.json`, then `python benchmarks/render.py`.\n",
                False)
    only = [p for p in options.get("only", "").split(",") if p]
    rows = selected(data, only)
    if not rows:
        raise ResultsError(f"table marker {spec!r}: no figure of {name}.json matches")
    rows = [(key, judge(row)) for key, row in rows]
    lines = series_table(rows) if "by" in options else plain_table(rows)
    if data.get("png") and page is not None:
        image = Path(os.path.relpath(ROOT / data["png"], page.parent)).as_posix()
        lines += ["", f"![{data.get('png_caption') or 'plot of these figures'}]({image})"]
    return provenance(name, data) + "\n\n" + "\n".join(lines) + "\n", True


# ---- pages --------------------------------------------------------------------------------


@dataclass
class Report:
    """What rendering or checking a page found."""

    problems: list[str] = field(default_factory=list)
    differ: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def render_text(text: str, results: Results, where: str = "page",
                report: Report | None = None, page: Path | None = None) -> str:
    """``text`` with every marker filled; problems, differences and missing files are
    added to ``report``."""
    report = report if report is not None else Report()

    def tables(match: re.Match[str]) -> str:
        spec, body = match["spec"].strip(), match["body"]
        at = f"{where}:{line_of(text, match.start())}"
        try:
            new, found = table(spec, results, page)
        except ResultsError as exc:
            report.problems.append(f"{at}: {exc}")
            return match[0]
        if not found:
            report.missing.append(f"{at}: {spec.split()[0]}")
        if new != body:
            report.differ.append(f"{at}: the table of {spec!r} differs from its file")
        return f"<!-- table {spec} -->\n{new}<!-- /table -->"

    text = TABLE.sub(tables, text)

    def figures(match: re.Match[str]) -> str:
        spec, old = match["spec"].strip(), match["text"]
        at = f"{where}:{line_of(text, match.start())}"
        try:
            new = fill(spec, results)
        except ResultsError as exc:
            report.problems.append(f"{at}: {exc}")
            return match[0]
        if new != old:
            report.differ.append(f"{at}: {spec!r} reads {old!r}, its file gives {new!r}")
        return f"<!-- fig {spec} -->{new}<!-- /fig -->"

    text = FIG.sub(figures, text)
    for match in LINE_START.finditer(text):
        report.problems.append(f"{where}:{line_of(text, match.start())}: a fig marker "
                               "starts the line, which breaks the paragraph in Markdown: "
                               "move a word of the line before onto it")
    return text


def prose_lines(text: str) -> Iterable[tuple[int, str]]:
    """(line number, text) of the lines a reader sees as prose: fenced code, table
    markers' bodies, filled figures, inline code and HTML comments taken out (inline code
    and comments may span lines), and lines marked ``<!-- not-a-figure -->`` left out."""

    def blank(match: re.Match[str]) -> str:
        return "\n" * match[0].count("\n")

    text = TABLE.sub(blank, text)
    text = FIG.sub("", text)
    lines, fenced = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            lines.append("")
            continue
        lines.append("" if fenced or NOT_A_FIGURE in line else line)
    text = "\n".join(lines)
    text = re.sub(r"<!--.*?-->", blank, text, flags=re.S)
    text = re.sub(r"`[^`]*`", blank, text)
    yield from enumerate(text.splitlines(), 1)


def unmarked(text: str, where: str = "page") -> list[str]:
    """Every piece of ``text`` that looks like a measured figure but is not under a
    marker (see FIGURE_PATTERNS)."""
    found = []
    for line_number, line in prose_lines(text):
        for what, pattern in FIGURE_PATTERNS.items():
            for match in re.finditer(pattern, line):
                found.append(f"{where}:{line_number}: {match[0]!r} looks like {what} "
                             "measured by hand")
    return found


def run(paths: Sequence[Path], check: bool, strict: bool = False,
        results: Results | None = None, out: Any = sys.stdout) -> int:
    """Render (or check) ``paths``; the exit status."""
    results = results or Results()
    report = Report()
    for path in paths:
        where = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else str(path)
        text = path.read_text()
        new = render_text(text, results, where, report, path)
        report.problems += unmarked(new, where)
        if not check and new != text:
            path.write_text(new)
            print(f"rendered {where}", file=out)
    for line in report.problems:
        print(f"error: {line}", file=out)
    if check:
        for line in report.differ:
            print(f"differs: {line}", file=out)
    for line in report.missing:
        print(f"{'error' if strict else 'note'}: no results file yet for the table at {line}",
              file=out)
    failed = bool(report.problems) or (check and bool(report.differ)) or (
        strict and bool(report.missing))
    if failed:
        print("docs figures: see benchmarks/results/README.md; `python benchmarks/render.py` "
              "fills the markers from the results files", file=out)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("pages", nargs="*", type=Path, help="default: README.md and docs/")
    parser.add_argument("--check", action="store_true", help="write nothing; fail on drift")
    parser.add_argument("--strict", action="store_true", help="fail on missing results too")
    parser.add_argument("--results", type=Path, default=RESULTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    paths = [p.resolve() for p in args.pages] or pages()
    return run(paths, args.check, args.strict, Results(args.results))


if __name__ == "__main__":
    sys.exit(main())
