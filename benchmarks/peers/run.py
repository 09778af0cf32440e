"""redisbuf against the replay buffers users would pick instead, back to back in one run.

Usage (from the repository root, with the project's venv):

    .venv/bin/python benchmarks/peers/run.py [--quick] [--repeat 3] [--apex-size N]

The first run builds the peers' environments outside the project's venv, under
``$REDISBUF_PEERS_HOME`` (default ``~/.cache/redisbuf-peers``), and reuses them after:

* ``reverb``: Python 3.11 venv with dm-reverb 0.14.0, tensorflow-cpu 2.15.1, numpy<2 and
  cpprb 11.0.0 (Reverb, cpprb and cpprb's shared-memory MP* buffers run from it);
* ``torch``: torch 2.13.0 (CPU) and torchgfn 2.4.1;
* ``torchrl``: torch 2.14.1 and torchrl 0.14.1 (TorchRL's C++ part, which its
  prioritized sampler needs, does not load beside torch 2.13.0).

TorchRL's ``StoreStorage`` (Redis, through tensordict) runs in the project's own venv
(extra ``torchrl``), on an embedded server like redisbuf's.

A peer whose environment cannot be built is left out of the run and the table says so.
Each peer runs in its own process (``peer_*.py``), the order rotating from one repetition
to the next; the load average is recorded around each. Every figure is the median over
repetitions (the spread is kept in the JSON). The run prints one table (figure, each
peer, ratio to Reverb) and writes ``peers-<time>.json``, ``.png``, ``.md`` and the peers' logs
to ``--out`` (default ``benchmarks/peers/results``, ignored by git). At its end it also
writes the results file the docs quote, ``benchmarks/results/peers.json`` (``--name``
another; see ``publish.py`` and benchmarks/results/README.md): commit this and run
``python benchmarks/render.py`` to bring the README and the docs to it. Never run in CI.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from common import FIGURES, LOWER_IS_BETTER  # noqa: E402
from publish import publish  # noqa: E402

sys.path.insert(0, str(HERE.parent))
from _report import commit  # noqa: E402

HOME = Path(os.environ.get("REDISBUF_PEERS_HOME", Path.home() / ".cache" / "redisbuf-peers"))

# venv -> (packages installed in order, one pip call each; an import that must work)
ENVS: dict[str, tuple[list[list[str]], str]] = {
    "reverb": (
        [["dm-reverb==0.14.0", "tensorflow-cpu==2.15.1", "numpy<2", "cpprb==11.0.0"]],
        "import reverb, cpprb",
    ),
    "torch": ([["torch==2.13.0"], ["torchgfn==2.4.1", "torch==2.13.0"]], "import gfn"),
    "torchrl": (
        [["torch==2.14.1"], ["torchrl==0.14.1", "torch==2.14.1"]],
        "import torchrl._torchrl",
    ),
}

# column -> (venv or None for the project's own interpreter, script, mode)
PEERS: dict[str, tuple[str | None, str, str]] = {
    "redisbuf": (None, "peer_redisbuf.py", ""),
    "Reverb": ("reverb", "peer_reverb.py", ""),
    "cpprb": ("reverb", "peer_cpprb.py", "inproc"),
    "cpprb MP": ("reverb", "peer_cpprb.py", "mp"),
    "TorchRL": ("torchrl", "peer_torch.py", "torchrl"),
    "torchgfn": ("torch", "peer_torch.py", "torchgfn"),
    "TorchRL StoreStorage": (None, "peer_torchrl_store.py", ""),
}

# peer -> what independent processes share through it (the table's last row)
SHARES: dict[str, str] = {
    "redisbuf": "one buffer by URL and name: items, eviction, ids, priorities on the server",
    "Reverb": "one table per server, by address and table name",
    "cpprb": "nothing (one process)",
    "cpprb MP": "shared memory with processes it starts (not independent ones)",
    "TorchRL": "nothing by name: the processes a buffer is handed to, or a Ray / RPC "
    "service holding it",
    "torchgfn": "nothing by name (one process's, or a gloo manager process)",
    "TorchRL StoreStorage": "its keys, by td_id (random unless given) or load_state_dict; "
    "length, cursor, priorities per process",
}


def python_of(env: str) -> Path:
    return HOME / env / "bin" / "python"


def build_env(env: str, console: Console) -> str | None:
    """Create venv ``env`` once (a stamp file marks it done); None, or why it failed."""
    steps, check = ENVS[env]
    venv = HOME / env
    stamp = venv / ".redisbuf-peers-ok"
    if stamp.exists():
        return None
    HOME.mkdir(parents=True, exist_ok=True)
    log = HOME / f"install-{env}.log"
    console.print(f"building {venv} (log: {log})")
    with open(log, "w") as out:
        try:
            if not python_of(env).exists():
                subprocess.run(["python3.11", "-m", "venv", str(venv)], check=True,
                               stdout=out, stderr=out)
            for packages in steps:
                subprocess.run([str(python_of(env)), "-m", "pip", "install", "-q", *packages],
                               check=True, stdout=out, stderr=out)
            subprocess.run([str(python_of(env)), "-c", check], check=True,
                           stdout=out, stderr=out)
        except (OSError, subprocess.CalledProcessError) as exc:
            return f"{env} environment failed ({exc}); see {log}"
    stamp.touch()
    return None


def run_peer(
    peer: str, cfg: dict[str, Any], log_dir: Path, tag: str, timeout: float
) -> dict[str, Any]:
    env, script, mode = PEERS[peer]
    python = sys.executable if env is None else str(python_of(env))
    log = log_dir / f"{tag}-{peer.replace(' ', '_')}.log"
    load_before = os.getloadavg()
    start = time.time()
    try:
        with open(log, "w") as err:
            proc = subprocess.run(
                [python, str(HERE / script), json.dumps({**cfg, "mode": mode})],
                stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, cwd=HERE,
            )
        lines = proc.stdout.strip().splitlines()
        if proc.returncode != 0 or not lines:
            raise RuntimeError(f"exit {proc.returncode}; see {log}")
        report = json.loads(lines[-1])
    except (RuntimeError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
        report = {"error": str(exc), "results": {}}
    report.update(
        load_before=load_before, load_after=os.getloadavg(), seconds=time.time() - start
    )
    return report


def fmt(value: float, figure: str) -> str:
    if figure in LOWER_IS_BETTER:
        return f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    for div, suffix in ((1e6, "M"), (1e3, "k")):
        if value >= div:
            return f"{value / div:.3g}{suffix}"
    return f"{value:.3g}"


def summarize(runs: list[dict[str, dict[str, Any]]], peers: list[str]) -> dict[str, Any]:
    """figure -> peer -> {median, runs, via} over the repetitions that produced it."""
    table: dict[str, Any] = {}
    for figure in FIGURES:
        for peer in peers:
            values, via, errors = [], set(), set()
            for run in runs:
                got = run.get(peer, {}).get("results", {}).get(figure)
                if got is None:
                    continue
                if "error" in got:
                    errors.add(got["error"][:200])
                    continue
                values.append(got["rate"])
                if "via" in got:
                    via.add(got["via"])
            if values or errors:
                table.setdefault(figure, {})[peer] = {
                    "median": statistics.median(values) if values else None,
                    "runs": values,
                    "via": sorted(via),
                    "errors": sorted(errors),
                }
    return table


def ratio_cells(entry: dict[str, Any], ref: dict[str, Any] | None) -> str:
    if entry["median"] is None or not ref or not ref.get("median"):
        return ""
    if entry is ref:
        return " (1.00x)"
    ratio = entry["median"] / ref["median"]
    if len(entry["runs"]) > 1 and len(ref["runs"]) == len(entry["runs"]):
        per_run = [a / b for a, b in zip(entry["runs"], ref["runs"], strict=True)]
        return f" ({ratio:.2f}x, {min(per_run):.2f}-{max(per_run):.2f})"
    return f" ({ratio:.2f}x)"


def row_cells(row: dict[str, Any], figure: str, peers: list[str]) -> list[str]:
    """One figure's cell per peer: its median with the ratio to Reverb, "-" when the peer
    has no such figure, "error" when it failed."""
    cells = []
    for peer in peers:
        entry = row.get(peer)
        if entry is None:
            cells.append("-")
        elif entry["median"] is None:
            cells.append("error")
        else:
            cells.append(fmt(entry["median"], figure) + ratio_cells(entry, row.get("Reverb")))
    return cells


def print_table(console: Console, summary: dict[str, Any], peers: list[str],
                title: str) -> None:
    table = Table(title=title, show_lines=False)
    table.add_column("figure")
    table.add_column("unit")
    for peer in peers:
        table.add_column(peer, justify="right")
    for figure, (label, unit) in FIGURES.items():
        row = summary.get(figure)
        if row is None:
            continue
        table.add_row(label, unit, *row_cells(row, figure, peers))
    table.add_row("shared across processes", "", *(SHARES.get(p, "") for p in peers))
    console.print(table)
    console.print(
        "(x) = ratio to Reverb in the same run (median; the range is over repetitions); "
        "for ms and MB lower is better. '-' = the peer has no such figure."
    )


def markdown(summary: dict[str, Any], peers: list[str]) -> str:
    """The table as Markdown (for the README): value (ratio to Reverb) per peer."""
    lines = ["| figure | unit | " + " | ".join(peers) + " |",
             "|---|---|" + "---|" * len(peers)]
    for figure, (label, unit) in FIGURES.items():
        row = summary.get(figure)
        if row is None:
            continue
        lines.append(f"| {label} | {unit} | " + " | ".join(row_cells(row, figure, peers)) + " |")
    lines.append("| shared across processes | | " + " | ".join(SHARES.get(p, "") for p in peers)
                 + " |")
    return "\n".join(lines) + "\n"


def plot(summary: dict[str, Any], peers: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    figures = [f for f in FIGURES if f in summary and f not in LOWER_IS_BETTER]
    fig, ax = plt.subplots(figsize=(max(10, 1.3 * len(figures)), 6))
    width = 0.8 / len(peers)
    x = np.arange(len(figures))
    for k, peer in enumerate(peers):
        values = [
            (summary[f].get(peer) or {}).get("median") or 0.0 for f in figures
        ]
        ax.bar(x + (k - (len(peers) - 1) / 2) * width, values, width, label=peer)
    ax.set_yscale("log")
    ax.set_ylabel("items (or updates) per second, log scale")
    ax.set_xticks(x)
    ax.set_xticklabels([FIGURES[f][0] for f in figures], rotation=30, ha="right",
                       fontsize=8)
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, ncol=3)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true",
                        help="smaller buffers and shorter timings (Ape-X size 2x10^5)")
    parser.add_argument("--repeat", type=int, default=1, help="repetitions (median)")
    parser.add_argument("--apex-size", type=int, help="Ape-X buffer size (default 2x10^6)")
    parser.add_argument("--seconds", type=float, help="timed seconds per figure")
    parser.add_argument("--peers", help=f"comma-separated subset of {list(PEERS)}")
    parser.add_argument("--figures", help="comma-separated subset of figure ids")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--peer-timeout", type=float, default=3600.0)
    parser.add_argument("--name", default="peers",
                        help="results file written at the end (benchmarks/results/NAME.json)")
    args = parser.parse_args()
    console = Console(width=max(Console().width, 200))
    peers = args.peers.split(",") if args.peers else list(PEERS)
    unknown = set(peers) - set(PEERS)
    if unknown:
        parser.error(f"unknown peers {sorted(unknown)}; choose from {list(PEERS)}")
    figures = args.figures.split(",") if args.figures else list(FIGURES)
    unknown = set(figures) - set(FIGURES)
    if unknown:
        parser.error(f"unknown figures {sorted(unknown)}; choose from {list(FIGURES)}")

    skipped: dict[str, str] = {}
    for env in sorted({PEERS[p][0] for p in peers if PEERS[p][0]}):
        why = build_env(env, console)
        if why:
            console.print(f"[red]{why}[/red]")
            for peer in peers:
                if PEERS[peer][0] == env:
                    skipped[peer] = why
    active = [p for p in peers if p not in skipped]

    cfg = {
        "figures": figures,
        "seconds": args.seconds or (1.5 if args.quick else 4.0),
        "cap4k": 5_000 if args.quick else 20_000,
        "cap200": 20_000 if args.quick else 100_000,
        "update_size": 100_000,
        "apex_size": args.apex_size or (200_000 if args.quick else 2_000_000),
    }
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%MZ")
    # what ran, taken before the first repetition (a commit made during a run is not it)
    meta = {"command": " ".join(["python benchmarks/peers/run.py", *sys.argv[1:]]), **commit()}
    args.out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    orders = []
    for rep in range(args.repeat):
        order = active[rep % len(active):] + active[: rep % len(active)] if active else []
        orders.append(order)
        run: dict[str, Any] = {}
        for peer in order:
            console.print(f"run {rep + 1}/{args.repeat}: {peer} (load {os.getloadavg()[0]:.1f})")
            run[peer] = report = run_peer(peer, cfg, args.out, f"{stamp}-{rep}",
                                          args.peer_timeout)
            if "error" in report:
                console.print(f"[red]{peer}: {report['error']}[/red]")
        runs.append(run)
        # written after every repetition, so an interrupted run keeps what it measured
        json_path = write_outputs(console, args.out, stamp, cfg, runs, orders, active,
                                  skipped, final=rep == args.repeat - 1, meta=meta)
    published = publish(json_path, args.name, png=json_path.with_suffix(".png"))
    if published:
        console.print(f"wrote {published}: commit it, then python benchmarks/render.py")


def write_outputs(
    console: Console, out: Path, stamp: str, cfg: dict[str, Any], runs: list[dict[str, Any]],
    orders: list[list[str]], active: list[str], skipped: dict[str, str], final: bool,
    meta: dict[str, Any] | None = None,
) -> Path:
    """JSON, PNG and Markdown of the repetitions so far (the JSON's path returned); the
    table too when ``final``."""
    summary = summarize(runs, active)
    loads = [r[p]["load_before"][0] for r in runs for p in r] + [
        r[p]["load_after"][0] for r in runs for p in r
    ]
    load_text = f"{min(loads):.1f}-{max(loads):.1f}" if loads else "?"
    title = (
        f"redisbuf and its peers, {stamp}, {platform.node() or 'this machine'} "
        f"({os.cpu_count()} CPUs), load average {load_text}, median of {len(runs)} "
        f"run(s), Ape-X size {cfg['apex_size']:,}"
    )
    result = {
        "date": stamp,
        **(meta or {}),
        "shares": {p: SHARES.get(p, "") for p in active},
        "machine": {"node": platform.node(), "cpus": os.cpu_count(),
                    "platform": platform.platform(), "python": platform.python_version()},
        "config": cfg,
        "repeat": len(runs),
        "orders": orders,
        "load_range": load_text,
        "skipped": skipped,
        "paths": {p: next((r[p].get("path") for r in runs if r.get(p, {}).get("path")), None)
                  for p in active},
        "summary": summary,
        "runs": runs,
    }
    json_path = out / f"peers-{stamp}.json"
    json_path.write_text(json.dumps(result, indent=1))
    png_path = out / f"peers-{stamp}.png"
    plot(summary, active, png_path, title)
    md_path = out / f"peers-{stamp}.md"
    md_path.write_text(f"{title}\n\n{markdown(summary, active)}")
    if final:
        print_table(console, summary, active, title)
        for peer, why in skipped.items():
            console.print(f"{peer}: not run ({why})")
        console.print(f"wrote {json_path}, {png_path} and {md_path}")
    return json_path

if __name__ == "__main__":
    main()
