#!/usr/bin/env bash
# GPU validation on an NVIDIA machine (where torch and Triton are already installed): every kernel compiled
# natively, the test suite (GPU-marked tests included; the zoo is left to CPU CI), every contract natively,
# compute-sanitizer memcheck and racecheck on a representative decode run, and the benchmarks (smv bench).
# Usage: ci/gpu_validate.sh OUT_DIR [tests|audit|subject|sanitize|bench|flashmla]...   (default: the first five)
# The subject step audits upstream vLLM natively from a fetched tree (the GPU host may reach no registry):
#   smv subject fetch vllm==0.33.0 --to .smv-subject/vllm   (on a machine that can download), then carry that folder;
# SMV_SUBJECT_TREE names another one. Without a tree the step says so and fails.
# A cold machine compiles every kernel variant during the audit; the audit and subject steps run their rows on
# SMV_GPU_AUDIT_JOBS worker processes (default: the host's cores less 4, at least 1), which compile side by side.
# FlashMLA (the bench's column, the flashmla step's `audit --subject flashmla`) is found where it is installed or in
# the folder SMV_FLASHMLA_PATH names (default .fmla/ where it exists: the sgl-flash-mla wheel unzipped); without it the
# column is skipped and the flashmla step says why.
# SMV_GPU_STEP_TIMEOUT=S stops any one step's command after S seconds (GNU timeout; 0 or unset: no limit), so a run
# under an outer limit still reaches its later steps and prints what each step found before it was cut.
set -uo pipefail
out="${1:?usage: ci/gpu_validate.sh OUT_DIR [steps]}"; shift
steps="${*:-tests audit subject sanitize bench}"
tree="${SMV_SUBJECT_TREE:-.smv-subject/vllm}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
[ -z "${SMV_FLASHMLA_PATH:-}" ] && [ -d .fmla/flash_mla ] && export SMV_FLASHMLA_PATH="$PWD/.fmla"
# a host that reaches no registry gets the runtime dependencies it lacks (allpairspy) from wheels carried in .whl/;
# what is installed already stays as it is
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --find-links .whl allpairspy >/dev/null 2>&1 || { echo "wheel install failed"; exit 2; }
fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || { echo "install failed"; exit 2; }
status=0
lim="${SMV_GPU_STEP_TIMEOUT:-0}"
jobs="${SMV_GPU_AUDIT_JOBS:-$(n=$(nproc); [ "$n" -gt 5 ] && echo $((n - 4)) || echo 1)}"
for step in $steps; do
  case "$step" in
    tests)
      # one line per test (-v): a run cut by an outer time limit still names what failed; most of the suite's time
      # on a cold host is compiling, which parallelizes over the host's cores
      workers="${SMV_GPU_TEST_WORKERS:-$(n=$(nproc); [ "$n" -gt 4 ] && echo $((n - 2)) || echo 2)}"
      timeout "$lim" python3 -m pytest -v -n "$workers" -p no:cacheprovider --ignore=tests/test_zoo.py -rfE \
        --junitxml="$out/pytest.xml" >"$out/pytest.txt" 2>&1 || status=1
      grep -E '(FAILED|ERROR) ' "$out/pytest.txt" | sed -E 's/^\[gw[0-9]+\] \[ *[0-9]+%\] //; s/ +(- .*)?$//' \
        | sort -u | tail -20
      tail -1 "$out/pytest.txt" ;;
    audit)
      timeout "$lim" python3 -m contracts.cli audit --profile ci --max-cases 0 --jobs "$jobs" --budget "${SMV_GPU_AUDIT_BUDGET:-540}" --report "$out" --no-progress \
        >"$out/audit.txt" 2>&1 || status=1
      tail -3 "$out/audit.txt" ;;
    subject)
      if [ -d "$tree" ]; then
        timeout "$lim" python3 -m contracts.cli audit --profile ci --subject "vllm@$tree" --max-cases 0 --jobs "$jobs" \
          --budget "${SMV_GPU_SUBJECT_BUDGET:-300}" --report "$out/subject" --no-progress \
          >"$out/subject.txt" 2>&1 || status=1
        tail -3 "$out/subject.txt"
      else
        echo "subject: no vLLM tree at $tree (fetch one with: smv subject fetch vllm==X --to $tree)"; status=1
      fi ;;
    sanitize)
      for tool in memcheck racecheck; do
        timeout "$lim" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 benchmarks/sanitize_decode.py \
          >"$out/sanitizer-$tool.txt" 2>&1; rc=$?
        echo "compute-sanitizer $tool: exit $rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/sanitizer-$tool.txt" | tail -1)"
        [ "$rc" -eq 0 ] || status=1
      done ;;
    bench)
      # pytest-benchmark's JSON (with the ratios and ceilings in each extra_info) stays in the out dir; the roofline
      # is drawn where matplotlib is installed (the `plot` extra) and skipped with a line where it is not
      # with a vLLM tree, upstream's decode families run as columns beside ours (SMV_BENCH_SUBJECT)
      [ -d "$tree" ] && export SMV_BENCH_SUBJECT="vllm@$tree"
      timeout "$lim" python3 -m contracts.cli.bench --require-gpu --json "$out/bench.json" 2>&1 | tee "$out/bench.txt" || status=1
      [ -s "$out/bench.json" ] && python3 -m contracts.cli.bench --plot "$out/bench.json" --out "$out/roofline.png" ;;
    flashmla)
      why="$(python3 -c 'from contracts.subjects import flashmla as f; print(f.unavailable_reason() or "")' 2>&1)"
      if [ -z "$why" ]; then
        timeout "$lim" python3 -m contracts.cli audit --profile ci --subject flashmla --jobs "$jobs" \
          --budget "${SMV_GPU_FLASHMLA_BUDGET:-240}" --report "$out/flashmla" --no-progress \
          >"$out/flashmla.txt" 2>&1 || status=1
        tail -3 "$out/flashmla.txt"
      else
        echo "flashmla: not run: $why"
      fi ;;
    *) echo "unknown step $step"; exit 2 ;;
  esac
done
exit "$status"
