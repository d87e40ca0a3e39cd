#!/usr/bin/env bash
# Pull-request pipeline: tests, the contract audit (JUnit + Markdown artifacts), the planted-bug zoo, the merge gate.
# Usage: ci/pull_request.sh [ARTIFACT_DIR]   (expects the suite installed: pip install -e '.[cpu]' or ROCm torch)
set -uo pipefail
out="${1:-smv-report}"
mkdir -p "$out"
status=0
python -m pytest -n 2 --junitxml="$out/pytest.xml" || status=1
smv audit --profile ci --report "$out/audit" --junit "$out/audit-junit.xml" --no-progress || status=1
smv zoo --report "$out/zoo" || status=1
python ci/merge_gate.py "$out/audit/audit.json" || status=1
exit "$status"
