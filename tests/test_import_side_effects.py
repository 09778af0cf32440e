"""Importing redisbuf changes no process-wide state: no warnings filter is installed, and
decoding torch tensors still emits no warning (the suppression is scoped)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import warnings
    import msgpack, numpy, torch
    before = list(warnings.filters)
    import redisbuf
    from redisbuf import codec
    added = [f for f in warnings.filters if f not in before]
    assert not added, added
    warnings.simplefilter("error")   # any warning from decoding now fails
    for _ in range(2):
        out = codec.unpackb(codec.packb({"x": torch.arange(4.0)}))
        assert out["x"].tolist() == [0.0, 1.0, 2.0, 3.0]
    print("ok")
    """
)


def test_import_installs_no_warnings_filter_and_decoding_stays_quiet():
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
