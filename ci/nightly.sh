#!/usr/bin/env bash
# Nightly: slow tests, the fuzz campaign (every GPU and core of this host: one worker each), the zoo, the mutation
# score, and an audit of every upstream vLLM release that holds the DSv4 ROCm code, the newest included. Every distinct failure, crashes and hangs included, is
# saved as a reproducer under DIR/fuzz/repro/.
# Usage: ci/nightly.sh DIR [tests|fuzz|zoo|mutate|upstream]...   (default: all five)
# Many hosts: run the fuzz step on each with SMV_SHARD=K/N and one shared SMV_FUZZ_DATABASE=redis://HOST:PORT/DB,
# then `smv fuzz merge DIR1/fuzz DIR2/fuzz ... --report OUT` (ci/github/nightly.yml does this as a matrix).
# Running the fuzz step again on the same DIR resumes a campaign that was killed.
set -uo pipefail
out="${1:-smv-nightly}"; shift || true
steps="${*:-tests fuzz zoo mutate upstream}"
budget="${SMV_NIGHTLY_BUDGET:-6h}"
mkdir -p "$out"
status=0
for step in $steps; do
  case "$step" in
    tests)
      python -m pytest -n 2 --run-slow --smv-profile nightly --junitxml="$out/pytest.xml" || status=1 ;;
    fuzz)
      args=(--budget "$budget" --report "$out/fuzz")
      [ -n "${SMV_SHARD:-}" ] && args+=(--shard "$SMV_SHARD")
      [ -n "${SMV_FUZZ_DATABASE:-}" ] && args+=(--database "$SMV_FUZZ_DATABASE")
      [ -n "${SMV_FUZZ_JOBS:-}" ] && args+=(--jobs "$SMV_FUZZ_JOBS")
      smv fuzz "${args[@]}" || status=1 ;;
    zoo)
      smv zoo --report "$out/zoo" || status=1 ;;
    mutate)
      # a seeded sample of cosmic-ray's and the Triton operators' mutants of impl/ (needs the `mutate` extra);
      # survivors do not fail the night, they are read from mutate.json
      smv mutate --sample "${SMV_NIGHTLY_MUTANTS:-150}" --seed "${SMV_NIGHTLY_MUTATE_SEED:-13}" --report "$out/mutate" \
        --operators "${SMV_NIGHTLY_MUTATE_OPERATORS:-all}" \
        --cap "${SMV_NIGHTLY_MUTANT_CAP:-240}" --no-progress || [ $? -eq 1 ] || status=1 ;;
    upstream)
      # every release since the first that holds the DSv4 ROCm code (vllm/models/deepseek_v4/amd/rocm.py came in
      # 0.22.0), side by side in one audit: its findings lifecycle says which releases show each known finding and
      # each new failure; then the newest release's zoo. SMV_NIGHTLY_RELEASES (space-separated) overrides the list.
      releases="${SMV_NIGHTLY_RELEASES:-$(python ci/vllm_releases.py --since "${SMV_VLLM_FIRST:-0.22.0}")}"
      if [ -n "$releases" ]; then
        subjects=()
        for v in $releases; do subjects+=(--subject "vllm==$v"); done
        latest="${releases##* }"
        smv audit "${subjects[@]}" --budget "${SMV_NIGHTLY_UPSTREAM_BUDGET:-900}" --report "$out/audit-vllm" \
          --no-progress || status=1
        smv zoo --subject "vllm==$latest" --report "$out/zoo-vllm" || status=1
      else
        echo "nightly: could not list vLLM's releases on the package index" >&2; status=1
      fi ;;
    *) echo "nightly: unknown step $step" >&2; exit 2 ;;
  esac
done
exit "$status"
