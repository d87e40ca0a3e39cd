#!/usr/bin/env bash
# Nightly: slow tests, a fuzz campaign under the nightly Hypothesis profile (persistent example database in .smv/),
# and the zoo. Every distinct failure is saved as a repro file under DIR/fuzz/repro/.
set -uo pipefail
out="${1:-smv-nightly}"
budget="${SMV_NIGHTLY_BUDGET:-6h}"
mkdir -p "$out"
status=0
python -m pytest -n 2 --run-slow --smv-profile nightly --junitxml="$out/pytest.xml" || status=1
smv fuzz --budget "$budget" --report "$out/fuzz" || status=1
smv zoo --report "$out/zoo" || status=1
exit "$status"
