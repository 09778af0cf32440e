"""Turn a peers run (``benchmarks/peers/run.py``'s ``peers-<time>.json``) into a results
file the docs quote (``benchmarks/results/<name>.json``, see benchmarks/results/README.md).

Usage: python benchmarks/peers/publish.py RUN.json [--name peers] [--commit REV]

``run.py`` does this itself at the end of a run (``benchmarks/results/peers.json``); this
script is for a run kept from before, or to publish one under its own name
(``--name peers-20261127T2044Z``) beside the latest. Each figure of each peer becomes one
row keyed ``PEER/FIGURE_ID`` (``redisbuf/add_4k_uniform``): the median over the
repetitions, the values of every repetition, and against Reverb of the same run the
ratio of medians and, with several repetitions, the range of per-repetition ratios.

The commit is the run's own (recorded by run.py since results files exist), or
``--commit``, or else the last commit on the first-parent line of HEAD made before the
run began, noted as such in the file: the run may have been of a tree with changes not
yet committed.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from _report import FORMAT, KEY, write_results  # noqa: E402
from common import FIGURES  # noqa: E402

REFERENCE = "Reverb"
DOCS_PNG = ROOT / "docs" / "benchmarks"


def started(stamp: str) -> dt.datetime:
    """The UTC start of a run from its stamp (``20261127T2044Z``)."""
    return dt.datetime.strptime(stamp, "%Y%m%dT%H%MZ").replace(tzinfo=dt.UTC)


def commit_before(when: dt.datetime) -> str | None:
    """The last commit on HEAD's first-parent line committed before ``when``."""
    done = subprocess.run(
        ["git", "-C", str(ROOT), "rev-list", "-1", "--first-parent",
         f"--before={when.isoformat()}", "HEAD"],
        capture_output=True, text=True, check=False,
    )
    head = done.stdout.strip()
    return head[:7] if done.returncode == 0 and head else None


def figures_of(run: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The rows of a run's summary, keyed ``PEER/FIGURE_ID``, in the table's order."""
    summary = run["summary"]
    rows: dict[str, dict[str, Any]] = {}
    peers = [p for p in run.get("orders", [[]])[0]] or sorted(
        {p for by in summary.values() for p in by})
    for figure, (label, unit) in FIGURES.items():
        by = summary.get(figure)
        if not by:
            continue
        ref = by.get(REFERENCE) or {}
        for peer in sorted(by, key=lambda p: (p != "redisbuf", p != REFERENCE,
                                              peers.index(p) if p in peers else 99)):
            entry = by[peer]
            row: dict[str, Any] = {
                "figure": label, "value": entry["median"], "unit": unit, "series": peer,
                "runs": entry.get("runs", []), "via": entry.get("via", []),
            }
            if entry.get("errors"):
                row["error"] = "; ".join(entry["errors"])
            if peer != REFERENCE and entry["median"] is not None and ref.get("median"):
                row["baseline"] = ref["median"]
                row["baseline_name"] = REFERENCE
                row["ratio"] = entry["median"] / ref["median"]
                mine, theirs = entry.get("runs", []), ref.get("runs", [])
                if len(mine) > 1 and len(mine) == len(theirs):
                    per_run = [a / b for a, b in zip(mine, theirs, strict=True)]
                    row["spread"] = f"{min(per_run):.2f}-{max(per_run):.2f}"
            key = f"{peer.replace(' ', '_')}/{figure}"
            assert KEY.fullmatch(key), key
            rows[key] = row
    return rows


def command_of(run: dict[str, Any]) -> str:
    """The run's command line: recorded by run.py, else rebuilt from its settings."""
    if run.get("command"):
        return str(run["command"])
    cfg = run.get("config") or {}
    words = ["python benchmarks/peers/run.py", f"--repeat {run.get('repeat', 1)}"]
    peers = (run.get("orders") or [[]])[0]
    if peers:
        words.append("--peers " + ",".join(f'"{p}"' if " " in p else p for p in peers))
    if cfg.get("figures") and list(cfg["figures"]) != list(FIGURES):
        words.append("--figures " + ",".join(cfg["figures"]))
    if cfg.get("apex_size") not in (None, 2_000_000):
        words.append(f"--apex-size {cfg['apex_size']}")
    return " ".join(words)


def results_of(run: dict[str, Any], commit: str | None = None,
               command: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(meta, extra) of the results file for ``run`` (see the module docstring)."""
    when = started(run["date"])
    meta: dict[str, Any] = {
        "commit": commit or run.get("commit"),
        "dirty": run.get("dirty"),
        "date": when.strftime("%Y-%m-%d %H:%M UTC"),
        "load": {"range": run.get("load_range")},
        "machine": run.get("machine"),
        "command": command or command_of(run),
    }
    extra: dict[str, Any] = {
        "repeat": run.get("repeat"), "config": run.get("config"),
        "skipped": run.get("skipped") or {}, "shares": run.get("shares") or {},
    }
    if not meta["commit"]:
        meta["commit"] = commit_before(when)
        extra["commit_note"] = ("the run recorded no commit: this is the last commit made "
                                "before it began")
    return meta, extra


def publish(path: Path, name: str, commit: str | None = None,
            command: str | None = None, directory: Path | None = None,
            png: Path | None = None) -> Path | None:
    """Write the results file ``name`` for the run in ``path``; ``png``, the run's plot,
    is copied into docs/benchmarks/ (where the docs can show it) and named in the file."""
    run = json.loads(path.read_text())
    meta, extra = results_of(run, commit, command)
    if png is not None and png.exists():
        shown = DOCS_PNG / f"peers-{run['date']}.png"
        if png.resolve() != shown.resolve():
            shutil.copyfile(png, shown)
        extra["png"] = shown.relative_to(ROOT).as_posix()
        extra["png_caption"] = "each peer's figures of this run"
    return write_results(name, figures_of(run), meta, directory, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="a peers-<time>.json of run.py")
    parser.add_argument("--name", default="peers", help="the results file's name")
    parser.add_argument("--commit", help="the commit the run measured")
    parser.add_argument("--command", help="the command line of the run")
    parser.add_argument("--png", type=Path, help="the run's PNG (default: beside RUN.json)")
    args = parser.parse_args()
    png = args.png or args.run.with_suffix(".png")
    print(f"wrote {publish(args.run, args.name, args.commit, args.command, png=png)} "
          f"(results format {FORMAT})")


if __name__ == "__main__":
    main()
