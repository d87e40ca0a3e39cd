#!/usr/bin/env bash
# Nightly: slow tests, a fuzz campaign under the nightly Hypothesis profile (persistent example database in .smv/),
# the zoo, the mutation score, and an audit of upstream vLLM's newest release. Every distinct failure is saved as a repro file under DIR/fuzz/repro/.
set -uo pipefail
out="${1:-smv-nightly}"
budget="${SMV_NIGHTLY_BUDGET:-6h}"
mkdir -p "$out"
status=0
python -m pytest -n 2 --run-slow --smv-profile nightly --junitxml="$out/pytest.xml" || status=1
smv fuzz --budget "$budget" --report "$out/fuzz" || status=1
smv zoo --report "$out/zoo" || status=1
# the mutation score: a seeded sample of cosmic-ray's mutants of impl/ (needs the `mutate` extra); survivors do not
# fail the night, they are read from mutate.json
smv mutate --sample "${SMV_NIGHTLY_MUTANTS:-150}" --seed "${SMV_NIGHTLY_MUTATE_SEED:-13}" --report "$out/mutate" \
  --cap "${SMV_NIGHTLY_MUTANT_CAP:-240}" --no-progress || [ $? -eq 1 ] || status=1
# upstream's newest release, judged by the same contracts (its known findings are `known`, anything new fails)
latest="$(python -m pip index versions vllm 2>/dev/null | sed -n 's/^vllm (\([^)]*\)).*/\1/p' | head -1)"
if [ -n "$latest" ]; then
  smv audit --subject "vllm==$latest" --budget "${SMV_NIGHTLY_UPSTREAM_BUDGET:-1800}" --report "$out/audit-vllm" \
    --no-progress || status=1
  smv zoo --subject "vllm==$latest" --report "$out/zoo-vllm" || status=1
else
  echo "nightly: could not find vLLM's newest release on the package index" >&2; status=1
fi
exit "$status"
