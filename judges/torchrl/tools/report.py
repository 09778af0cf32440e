"""Turn the junit files of run.sh into TSVs and the numbers of REPORT.md.

results/outcomes_redisbuf.tsv, outcomes_baseline.tsv: nodeid, outcome, first error line
results/counterparts_outcomes.tsv: TorchRL (LazyTensorStorage) nodeid, its outcome,
    redisbuf nodeid, its outcome, the redisbuf first error line
results/summary.md: counts and causes (pasted into REPORT.md)
"""
from __future__ import annotations

import collections
import re
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

RANK = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


def nodeid(classname: str, name: str) -> str:
    parts = classname.split(".")
    i = next(k for k, p in enumerate(parts) if p.startswith("test_"))
    return "::".join(["/".join(parts[: i + 1]) + ".py", *parts[i + 1:], name])


def first_line(text: str | None) -> str:
    text = (text or "").strip()
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:300].replace("\t", " ")
    return ""


def read(path: Path) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    if not path.exists():
        return out
    for tc in ET.parse(path).getroot().iter("testcase"):
        nid = nodeid(tc.get("classname", ""), tc.get("name", ""))
        outcome, msg = "passed", ""
        for child in tc:
            tag = child.tag
            if tag in ("failure", "error", "skipped"):
                o = {"failure": "failed", "error": "error", "skipped": "skipped"}[tag]
                m = child.get("message") or child.text
                if RANK[o] > RANK[outcome]:
                    outcome, msg = o, first_line(m)
        if nid in out and RANK[out[nid][0]] >= RANK[outcome]:
            continue
        out[nid] = (outcome, msg)
    return out


def norm(msg: str) -> str:
    m = re.sub(r"judge-[0-9a-f]+", "judge-<name>", msg)
    m = re.sub(r"0x[0-9a-f]+", "0x…", m)
    m = re.sub(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e-?\d+)?", "N", m)
    m = re.sub(r"\[[N, ]+\]", "[N…]", m)
    m = re.sub(r"\s+", " ", m)
    return m[:200]


RB_TOKENS = ("RedisbufStorage", "RedisbufWriter", "RedisbufTDWriter", "RedisbufSampler",
             "RedisbufPrioritizedSampler")
OTHER_TOKENS = ("SamplerWithoutReplacement", "TensorDictMaxValueWriter",
                "TensorDictPrioritizedReplayBuffer", "PrioritizedReplayBuffer",
                "RemoteTensorDictReplayBuffer", "TensorDictReplayBuffer", "ReplayBuffer")


# what a cause is, from its first line: (kind, explanation)
KINDS = [
    (r"takes RedisbufWriter, not", "refused by design",
     "TorchRL writer given (TensorDictMaxValueWriter has no mechanical counterpart; docs: prioritized_capacity=True + log_rewards)"),
    (r"samples with RedisbufSampler, RandomSampler or RedisbufPrioritizedSampler, not", "refused by design",
     "position-picking TorchRL sampler (SamplerWithoutReplacement) refused"),
    (r"cannot be overwritten in place", "refused by design",
     "Storage.set / writer writing slots in place (TensorDictMaxValueWriter.extend, storage.set(range(n), data))"),
    (r"\[harness\] LazyTensorStorage\(ndim", "refused by design",
     "ndim=2 storage: redisbuf items have one batch dimension"),
    (r"no batch dimension of their own", "refused by design", "multi-dim (lazy-stacked 2-D) batch"),
    (r"has no attribute '_cursor'", "gap: TorchRL internals",
     "test reads writer._cursor (a process-local slot cursor; RedisbufWriter has none)"),
    (r"has no attribute '_init'", "gap: TorchRL internals", "test calls LazyTensorStorage._init"),
    (r"update_at_", "gap: TorchRL internals", "test expects the in-place update_at_ write path"),
    (r"ids not in buffer", "gap: positions vs ids",
     "int index read as an item id: rb[2], rb.storage[2], `for b in rb.storage` (TorchRL Storage.__iter__ yields self[i] for i in range(len)) after eviction"),
    (r"batch dimension mismatch|tuple index out of range|mapping batch needs tensors with a leading",
     "gap: pytree data", "pytree items (lists/tuples of tensors, int keys) that LazyTensorStorage stores; redisbuf fails inside tensordict, not with its InvalidBatchError"),
    (r"EmptyBufferError", "gap: error type",
     "sampling an emptied buffer raises EmptyBufferError (LookupError/ValueError); the test expects RuntimeError('Cannot sample from an empty storage')"),
    (r"Only sampler of type 'RandomSampler'", "harness artifact",
     "identity check `sampler is not RandomSampler` in a torch.compile recompile test skips the RedisbufSampler row"),
]


def kind_of(msg: str) -> tuple[str, str]:
    for pat, kind, why in KINDS:
        if re.search(pat, msg):
            return kind, why
    return "other", ""


def parts_of(nid: str) -> str:
    params = nid[nid.find("[") + 1: -1] if "[" in nid else ""
    toks = params.split("-")
    rb = [t for t in toks if t in RB_TOKENS]
    other = [t for t in toks if t in ("SamplerWithoutReplacement", "TensorDictMaxValueWriter")]
    return "+".join(rb + [f"(TorchRL {t})" for t in other])


def func_of(nid: str) -> str:
    return nid.split("[")[0]


def counts(res: dict) -> dict:
    c = collections.Counter(o for o, _ in res.values())
    return {k: c.get(k, 0) for k in ("passed", "failed", "skipped", "error")}


def causes(rows, top=40, examples=3):
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for nid, msg in rows:
        groups[norm(msg) or "(no message)"].append(nid)
    out = []
    for cause, nids in sorted(groups.items(), key=lambda kv: -len(kv[1]))[:top]:
        cls = collections.Counter(parts_of(n) for n in nids)
        funcs = collections.Counter(func_of(n).split("::", 1)[1] for n in nids)
        out.append((cause, len(nids), cls, funcs, nids[:examples], kind_of(cause)))
    return out


def md_causes(title, rows, top=40):
    lines = [f"### {title}", ""]
    for i, (cause, n, cls, funcs, ex, (kind, why)) in enumerate(causes(rows, top), 1):
        lines.append(f"{i}. **{n}** × `{cause}`")
        if kind != "other":
            lines.append(f"   - kind: **{kind}**: {why}")
        lines.append("   - parts: " + ", ".join(f"{k or '-'} ({v})" for k, v in cls.most_common(6)))
        lines.append("   - tests: " + ", ".join(f"{k} ({v})" for k, v in funcs.most_common(6))
                     + (" …" if len(funcs) > 6 else ""))
        lines.append("   - e.g. " + "; ".join(f"`{e}`" for e in ex))
    return "\n".join(lines) + "\n"


def main(results: Path) -> None:
    rb = read(results / "redisbuf.xml")
    base = read(results / "baseline.xml") or read(results / "baseline_lts.xml")
    for name, res in (("redisbuf", rb), ("baseline", base)):
        with open(results / f"outcomes_{name}.tsv", "w") as f:
            f.write("nodeid\toutcome\tfirst_error_line\n")
            for nid, (o, m) in sorted(res.items()):
                f.write(f"{nid}\t{o}\t{m}\n")
    pairs = []
    cmap = results / "counterparts.tsv"
    if cmap.exists():
        for line in cmap.read_text().splitlines():
            r, t = line.split("\t")
            pairs.append((t, r))
    with open(results / "counterparts_outcomes.tsv", "w") as f:
        f.write("torchrl_nodeid\ttorchrl_outcome\tredisbuf_nodeid\tredisbuf_outcome\t"
                "redisbuf_first_error_line\n")
        for t, r in sorted(pairs):
            to = base.get(t, ("not-run", ""))[0]
            ro, rm = rb.get(r, ("not-run", ""))
            f.write(f"{t}\t{to}\t{r}\t{ro}\t{rm}\n")
    s = []
    s.append("## Counts\n")
    s.append("| run | tests | passed | failed | skipped | errors |")
    s.append("|---|---|---|---|---|---|")
    for name, res in (("redisbuf items (mirrored rows)", rb), ("baseline (plain TorchRL, test/rb)", base)):
        c = counts(res)
        s.append(f"| {name} | {len(res)} | {c['passed']} | {c['failed']} | {c['skipped']} | {c['error']} |")
    lts = {t: base.get(t, ("not-run", ""))[0] for t, _ in pairs}
    c = collections.Counter(lts.values())
    s.append(f"| baseline, the {len(pairs)} LazyTensorStorage items mirrored | {len(pairs)} | "
             f"{c.get('passed', 0)} | {c.get('failed', 0)} | {c.get('skipped', 0)} | {c.get('error', 0)} |")
    s.append("")
    # per file
    s.append("### redisbuf items per file\n")
    s.append("| file | tests | passed | failed | skipped | errors |")
    s.append("|---|---|---|---|---|---|")
    per = collections.defaultdict(dict)
    for nid, v in rb.items():
        per[nid.split("::")[0]][nid] = v
    for fname in sorted(per):
        cc = counts(per[fname])
        s.append(f"| {fname} | {len(per[fname])} | {cc['passed']} | {cc['failed']} | {cc['skipped']} | {cc['error']} |")
    s.append("")
    # counterparts of LTS-passing
    trans = collections.Counter()
    bad = []
    for t, r in pairs:
        to = base.get(t, ("not-run", ""))[0]
        ro, rm = rb.get(r, ("not-run", ""))
        trans[(to, ro)] += 1
        if to == "passed" and ro != "passed":
            bad.append((r, f"[{ro}] {rm}"))
    s.append("## LazyTensorStorage item -> its RedisbufStorage counterpart\n")
    s.append("| TorchRL (LazyTensorStorage) outcome | redisbuf counterpart outcome | items |")
    s.append("|---|---|---|")
    for (to, ro), n in sorted(trans.items(), key=lambda kv: -kv[1]):
        s.append(f"| {to} | {ro} | {n} |")
    s.append("")
    npass = sum(n for (to, _), n in trans.items() if to == "passed")
    nboth = trans.get(("passed", "passed"), 0)
    s.append(f"Of the {npass} items that pass with LazyTensorStorage, {nboth} pass with "
             f"RedisbufStorage and {npass - nboth} do not.\n")
    kinds = collections.Counter(kind_of(m)[0] for _, m in bad)
    s.append("By kind: " + ", ".join(f"{k} {v}" for k, v in kinds.most_common()) + "\n")
    full = [(t, r) for t, r in pairs if "SamplerWithoutReplacement" not in r
            and "TensorDictMaxValueWriter" not in r]
    ft = collections.Counter((base.get(t, ("not-run",))[0], rb.get(r, ("not-run",))[0]) for t, r in full)
    fp = sum(n for (to, _), n in ft.items() if to == "passed")
    s.append(f"Fully mapped rows only (every TorchRL part swapped for a redisbuf one: no "
             f"SamplerWithoutReplacement / TensorDictMaxValueWriter left): {len(full)} items; "
             f"{fp} pass with LazyTensorStorage, of which {ft.get(('passed', 'passed'), 0)} pass "
             f"with RedisbufStorage; " + ", ".join(f"{a}->{b} {n}" for (a, b), n in ft.most_common()) + ".\n")
    fbad = [(r, f"[{rb.get(r, ('not-run', ''))[0]}] {rb.get(r, ('', ''))[1]}") for t, r in full
            if base.get(t, ("",))[0] == "passed" and rb.get(r, ("",))[0] != "passed"]
    s.append(md_causes("Fully mapped rows: counterpart failures/skips of items that pass with LazyTensorStorage", fbad))
    s.append(md_causes("Counterpart failures/skips of items that pass with LazyTensorStorage, by cause", bad))
    allbad = [(n, f"[{o}] {m}") for n, (o, m) in rb.items() if o in ("failed", "error")]
    s.append(md_causes("All redisbuf-item failures and errors, by cause", allbad))
    skips = [(n, m) for n, (o, m) in rb.items() if o == "skipped"]
    s.append(md_causes("redisbuf-item skips, by reason", skips, top=10))
    bbad = [(n, f"[{o}] {m}") for n, (o, m) in base.items() if o in ("failed", "error")]
    s.append(md_causes("Baseline failures and errors, by cause", bbad, top=15))
    (results / "summary.md").write_text("\n".join(s))
    print("\n".join(s[:12]))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
