#!/usr/bin/env bash
# Pull-request pipeline: tests, the contract audit of ours and of upstream vLLM at a pinned release (JUnit + Markdown
# artifacts), the planted-bug zoo (ours and upstream's), the merge gate.
# Usage: ci/pull_request.sh [ARTIFACT_DIR]   (expects the suite installed: pip install -e '.[cpu]' or ROCm torch)
# SMV_VLLM_PIN names the upstream release audited beside ours (the wheel is downloaded once into SMV_CACHE, default
# ~/.cache/sparse-mla-verify: cache that directory between runs).
set -uo pipefail
out="${1:-smv-report}"
pin="${SMV_VLLM_PIN:-0.34.0}"
mkdir -p "$out"
status=0
python -m pytest -n 2 --junitxml="$out/pytest.xml" || status=1
smv audit --profile ci --subject ours --subject "vllm==$pin" --report "$out/audit" --junit "$out/audit-junit.xml" \
  --no-progress || status=1
smv zoo --report "$out/zoo" || status=1
smv zoo --subject "vllm==$pin" --report "$out/zoo-vllm" || status=1
python ci/merge_gate.py "$out/audit/audit.json" || status=1
exit "$status"
