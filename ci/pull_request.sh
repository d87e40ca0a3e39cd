#!/usr/bin/env bash
# Pull-request pipeline, change-aware: every step runs only what the change since the base touched
# (--changed-since, contracts/engine/changes.py): tests, the contract audit of ours and of upstream vLLM at a pinned
# release (JUnit + Markdown artifacts), the planted-bug zoo (ours and upstream's), the merge gate. A change to the
# engine, oracles, fuzz, shared fixtures or pyproject.toml runs everything; for the pinned wheel the change that
# matters is the suite's own (a changed contract or adapter selects its rows; an impl-only change selects only the
# contracts that compute their expectations with that impl module). A step the change selects nothing for passes,
# saying so.
# Usage: ci/pull_request.sh [ARTIFACT_DIR]   (expects the suite installed: pip install -e '.[cpu]' or ROCm torch)
# SMV_BASE_REF: the base commit (default: the merge base with origin/main, else HEAD~1).
# SMV_VLLM_PIN names the upstream release audited beside ours (the wheel is downloaded once into SMV_CACHE, default
# ~/.cache/sparse-mla-verify: cache that directory between runs).
set -uo pipefail
out="${1:-smv-report}"
pin="${SMV_VLLM_PIN:-0.34.0}"
base="${SMV_BASE_REF:-}"
if [ -z "$base" ]; then
  base="$(git merge-base HEAD origin/main 2>/dev/null || git rev-parse HEAD~1)"
fi
echo "pull request: changes since $base"
mkdir -p "$out"
status=0
python -m pytest -n 2 --changed-since "$base" --junitxml="$out/pytest.xml"
rc=$?; [ "$rc" -eq 0 ] || [ "$rc" -eq 5 ] || status=1   # 5: the change touched no test
smv audit --profile ci --subject ours --subject "vllm==$pin" --changed-since "$base" --report "$out/audit" \
  --junit "$out/audit-junit.xml" --no-progress || status=1
smv zoo --changed-since "$base" --report "$out/zoo" || status=1
smv zoo --subject "vllm==$pin" --changed-since "$base" --report "$out/zoo-vllm" || status=1
python ci/merge_gate.py "$out/audit/audit.json" || status=1
exit "$status"
