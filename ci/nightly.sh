#!/usr/bin/env bash
# Nightly: slow tests, a long audit under the nightly Hypothesis profile (persistent example database in .smv/),
# and the zoo. Failing cases are saved as repro files under the report folder.
set -uo pipefail
out="${1:-smv-nightly}"
budget="${SMV_NIGHTLY_BUDGET:-3600}"
mkdir -p "$out"
status=0
python -m pytest -n 2 --run-slow --smv-profile nightly --junitxml="$out/pytest.xml" || status=1
smv audit --profile nightly --budget "$budget" --report "$out/audit" --junit "$out/audit-junit.xml" || status=1
smv zoo --report "$out/zoo" || status=1
exit "$status"
