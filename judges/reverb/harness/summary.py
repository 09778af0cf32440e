"""Per-file passed/failed/skipped/errors of a junit xml, then each failure's first line."""
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict

counts = defaultdict(Counter)
bad = []
for case in ET.parse(sys.argv[1]).iter("testcase"):
    mod = case.get("classname", "").split(".")[0]
    kind = "passed"
    for child in case:
        if child.tag in ("failure", "error", "skipped"):
            kind = {"failure": "failed", "error": "errors"}.get(child.tag, child.tag)
            if kind != "skipped":
                bad.append((kind, f"{case.get('classname')}::{case.get('name')}",
                            (child.get("message") or "").splitlines()[0][:160] if child.get("message") else ""))
    counts[mod][kind] += 1
total = Counter()
for mod, c in sorted(counts.items()):
    total += c
    print(f"{mod:28s} passed {c['passed']:4d} failed {c['failed']:3d} skipped {c['skipped']:3d} errors {c['errors']:3d}")
print(f"{'TOTAL':28s} passed {total['passed']:4d} failed {total['failed']:3d} skipped {total['skipped']:3d} errors {total['errors']:3d}")
for kind, name, msg in bad:
    print(f"{kind}: {name}: {msg}")
