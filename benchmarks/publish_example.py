"""Turn the Ape-X DQN example's run (``OUT.json`` of ``python -m redisbuf.examples.apex_dqn
--out OUT``) into a results file the docs quote (see benchmarks/results/README.md).

Usage: python benchmarks/publish_example.py docs/apex_dqn.json [--name apex_dqn]
                                            [--from-git]

Each run (seed) of the file gives one row per figure, keyed ``seed-N/FIGURE`` and in the
series ``seed N``: seconds and frames to the target mean return, env frames/s, learner
steps/s, the share of the learner's time spent waiting for the buffer and in buffer
calls, and samples per insert. The date and load are the run's own (the example records
them); the commit and machine are this checkout's, which is right when this runs just
after the example. ``--from-git`` is for a run kept from before the example recorded its
date: the commit is then the parent of the commit that last changed the JSON, and the
date that commit's, both noted in the file.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _report import commit, machine, write_results  # noqa: E402

# figure key -> (label, unit, the run's field, scale)
FIGURES: dict[str, tuple[str, str, str, float]] = {
    "time_to_target": ("time to the target mean return", "s", "time_to_target", 1.0),
    "frames_to_target": ("frames then", "frames", "frames_to_target", 1.0),
    "frames_per_s": ("env frames/s", "frames/s", "frames_per_s", 1.0),
    "learner_steps": ("learner steps", "steps", "learner_steps", 1.0),
    "learner_steps_per_s": ("learner steps/s", "steps/s", "learner_steps_per_s", 1.0),
    "learner_wait": ("learner blocked on the buffer", "%", "learner_wait_fraction", 100.0),
    "learner_buffer_calls": ("learner's buffer thread in buffer calls", "%",
                             "learner_buffer_call_fraction", 100.0),
    "samples_per_insert": ("samples per insert", "samples", "samples_per_insert", 1.0),
}


def git(*args: str) -> str:
    done = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                          check=False, env={**os.environ, "TZ": "UTC"})
    return done.stdout.strip()


def figures_of(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for key, (label, unit, source, scale) in FIGURES.items():
        for run in document["runs"]:
            value = run.get(source)
            if value is None:
                continue
            rows[f"seed-{run['seed']}/{key}"] = {
                "figure": label, "value": float(value) * scale, "unit": unit,
                "series": f"seed {run['seed']}",
            }
    return rows


def publish(path: Path, name: str, from_git: bool = False,
            directory: Path | None = None) -> Path | None:
    document = json.loads(path.read_text())
    command = " ".join(document.get("command") or ["python -m redisbuf.examples.apex_dqn"])
    meta: dict[str, Any] = {**commit(), "date": document.get("date"),
                            "load": document.get("load") or "not recorded",
                            "machine": machine(), "command": command}
    extra: dict[str, Any] = {"config": document.get("config")}
    if from_git:
        relative = path.resolve().relative_to(ROOT).as_posix()
        published = git("log", "-1", "--format=%H", "--", relative)
        meta["commit"] = git("rev-parse", "--short", f"{published}^")
        meta["dirty"] = None
        meta["date"] = git("log", "-1", "--date=format-local:%Y-%m-%d %H:%M UTC",
                           "--format=%cd", published)
        meta["machine"] = "not recorded"
        extra["note"] = (f"The run recorded no date, commit or machine: its JSON was "
                         f"committed in {published[:7]} (the date given), on top of the "
                         f"commit given.")
    if not meta["date"]:
        raise SystemExit(f"{path} records no date: give --from-git for a run kept from before")
    return write_results(name, figures_of(document), meta, directory, **extra)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("run", type=Path, help="the example's OUT.json")
    parser.add_argument("--name", default="apex_dqn", help="the results file's name")
    parser.add_argument("--from-git", action="store_true",
                        help="date and commit from the commit that added the JSON")
    args = parser.parse_args()
    print(f"wrote {publish(args.run, args.name, args.from_git)}")


if __name__ == "__main__":
    main()
