#!/usr/bin/env bash
# The mutation score on a GPU host in one device call (<= 9 minutes wall): `smv mutate --sample 150 --seed 4242
# --operators all` with native Triton, mutants judged side by side (--jobs), a cap per mutant and a session budget
# that ends it in time. Writes at most three files into OUT_DIR: mutate.json (rewritten after every mutant, so a cut
# run keeps what it judged), summary.txt (the host, Triton's mode, the score, every survivor with its diff) and
# mutate.log (the per-mutant progress lines).
# Usage: ci/mutate_gpu.sh OUT_DIR
# The host may reach no registry: allpairspy and the part of cosmic-ray `smv mutate` imports (cosmic-ray, parso,
# stevedore, attrs; pure Python) come from the wheels in .whl/ when they are not installed; without cosmic-ray the
# sample is the Triton operators' alone, and summary.txt says so.
# Environment (defaults in brackets): SMV_MUTATE_SAMPLE [150], SMV_MUTATE_SEED [4242], SMV_MUTATE_OPERATORS [all],
# SMV_MUTATE_JOBS [cores - 2, at least 1], SMV_MUTATE_CAP [120: seconds per mutant with up to four covering
# contracts, in proportion beyond], SMV_MUTATE_WALL [510: seconds for the whole script; the session gets what is
# left after the install, less 20 s for the summary], SMV_MUTATE_ALLOW_CPU [0: refuse to run without CUDA; 1 for a
# dry run on CPU under the Triton interpreter, e.g. SMV_MUTATE_SAMPLE=4 SMV_MUTATE_JOBS=2], SMV_MUTATE_NO_INSTALL [0;
# 1: install nothing, for a prepared environment such as a development checkout's .venv].
# Each mutant runs in its own temporary copy of the code with its own TRITON_CACHE_DIR inside it, so a kernel
# compiled natively for one mutant (or for the unmutated code) is never what another mutant runs.
set -uo pipefail
out="${1:?usage: ci/mutate_gpu.sh OUT_DIR}"
start=$(date +%s)
wall="${SMV_MUTATE_WALL:-510}"
sample="${SMV_MUTATE_SAMPLE:-150}"
seed="${SMV_MUTATE_SEED:-4242}"
ops="${SMV_MUTATE_OPERATORS:-all}"
cap="${SMV_MUTATE_CAP:-120}"
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
jobs="${SMV_MUTATE_JOBS:-$([ "$cores" -gt 3 ] && echo $((cores - 2)) || echo 1)}"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "$*" >>"$summary"; }
trap 'cat "$summary"' EXIT  # the summary is the call's output, however the script ends
export PYTHONUNBUFFERED=1
# every audit process gets its share of the cores (the float64 oracles run on CPU), not all of them each
threads=$(( cores / jobs )); [ "$threads" -ge 1 ] || threads=1
export OMP_NUM_THREADS="$threads" MKL_NUM_THREADS="$threads"

if [ "${SMV_MUTATE_NO_INSTALL:-0}" = 1 ]; then
  :  # a dry run in a prepared environment: install nothing
elif ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --find-links .whl allpairspy >/dev/null 2>&1 \
    || { say "wheel install failed"; exit 2; }
  if ! python3 -c "import cosmic_ray.plugins" >/dev/null 2>&1; then
    # only what smv mutate imports: the rest of cosmic-ray's requirements (its CLI, its database) are not needed
    python3 -m pip install -q --no-index --find-links .whl --no-deps cosmic-ray parso stevedore attrs >/dev/null 2>&1 \
      || say "note: cosmic-ray's wheels did not install from .whl/"
  fi
fi
if [ "${SMV_MUTATE_NO_INSTALL:-0}" != 1 ]; then
  python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { say "install failed"; exit 2; }
fi
if [ "$ops" != triton ] && ! python3 -c "import cosmic_ray.plugins" >/dev/null 2>&1; then
  say "note: cosmic-ray is not importable here: the sample is the Triton operators' alone (--operators triton)"
  ops=triton
fi

host="$(python3 - <<'EOF' 2>&1
import torch
import impl  # impl chooses Triton's mode before anything imports triton
from impl.runtime import triton_mode
import triton
gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none"
print(f"torch {torch.__version__}, triton {triton.__version__}, cuda {torch.cuda.is_available()} ({gpu}), "
      f"triton mode {triton_mode()}")
EOF
)"
say "host: $cores cores; $host"
if [[ "$host" != *"cuda True"*"triton mode native"* ]] && [ "${SMV_MUTATE_ALLOW_CPU:-0}" != 1 ]; then
  say "refused: no CUDA device with native Triton (SMV_MUTATE_ALLOW_CPU=1 runs it on CPU under the interpreter)"
  exit 2
fi

left=$(( wall - ($(date +%s) - start) - 20 ))
[ "$left" -ge 60 ] || { say "refused: only ${left}s left of SMV_MUTATE_WALL=${wall}s after the install"; exit 2; }
stdout="$(mktemp)"  # smv mutate's own summary, copied into summary.txt (not a fourth file in OUT_DIR)
say "smv mutate --sample $sample --seed $seed --operators $ops --jobs $jobs --cap $cap --budget $left"
# the budget stops the session by itself; timeout's SIGTERM (then SIGKILL) is the backstop: smv mutate kills its
# audits' process groups on SIGTERM, and mutate.json is complete up to the last mutant judged
timeout -k 10 $(( left + 15 )) python3 -m contracts.cli mutate --sample "$sample" --seed "$seed" --operators "$ops" \
  --jobs "$jobs" --cap "$cap" --budget "$left" --report "$out" >"$stdout" 2>"$out/mutate.log"
rc=$?
{ echo "exit $rc after $(( $(date +%s) - start ))s (1: a mutant survived; 124 or 137: cut by timeout)"
  cat "$stdout"; } >>"$summary"
rm -f "$stdout"
python3 - "$out/mutate.json" <<'EOF' >>"$summary" 2>&1
import json, sys
d = json.load(open(sys.argv[1]))
print(f"mutate.json: complete {d['complete']}, {d['judged']} of {d['sample']} judged in {d['seconds']:.0f}s, "
      f"score {d['score']}")
EOF
# a survivor is a finding to triage, not a failed run: exit 0 unless the run itself broke
case "$rc" in 0|1) exit 0 ;; *) exit "$rc" ;; esac
