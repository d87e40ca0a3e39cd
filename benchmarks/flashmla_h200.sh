#!/usr/bin/env bash
# FlashMLA beside ours on one NVIDIA H200 (SM90), in one device call of at most ~8 minutes:
#   0. setup: this checkout installed (--no-deps; allpairspy from .whl/ where the host reaches no registry), FlashMLA
#      found through SMV_FLASHMLA_PATH (default: the carried folder .fmla/, holding flash_mla/ - the sgl-flash-mla
#      wheel unzipped - or the wheel itself, unzipped here), one checked FlashMLA call (benchmarks/flashmla.py);
#   1. smv bench: the decode benchmarks (ours per family, FlashMLA's column, torch gather + SDPA, the copy and
#      matmul ceilings) at batch 1, 64 and 512, 64 heads, 128 SWA + 512 extra tokens per query row;
#   2. benchmarks/decode_variants.py: our fastest builds (gfx950 and gfx942 single-read) beside FlashMLA, each output
#      checked against the float64 oracle, FlashMLA's GB/s and TFLOP/s against ceilings measured in the same run;
#   3. smv audit --subject flashmla --profile ci natively: a verdict on every decode contract FlashMLA's entry point
#      serves, every other row skipped naming the entry point.
# Every step runs under its own time limit; a failing step is printed and the next one still runs.
# Writes to $OUT (or the first argument), six files at most: summary.txt, log.txt, bench.json,
# decode_variants.json, audit.json, audit.md.
#   usage: OUT=/some/dir bash benchmarks/flashmla_h200.sh      (step limits: SMV_FMLA_LIMITS="45 170 110 140", a 0
#   skips that step, e.g. "45 110 0 120" where defaults_h200.sh with SMV_DEFAULTS_FLASHMLA=1 times the variants;
#   SMV_FMLA_NO_INSTALL=1 where this checkout is installed already)
set -uo pipefail
out="${1:-${OUT:-./flashmla-h200}}"
mkdir -p "$out"
work="$(mktemp -d)"
log="$out/log.txt"
summary="$out/summary.txt"
: >"$log"; : >"$summary"
export PYTHONUNBUFFERED=1
read -r lim_setup lim_bench lim_variants lim_audit <<<"${SMV_FMLA_LIMITS:-45 170 110 140}"
say() { echo "$*" | tee -a "$summary"; }
section() { awk -v s="=== $1:" 'index($0, s) == 1 {f = 1; next} /^=== / {f = 0} f' "$log"; }
step() {  # step NAME LIMIT CMD...: run under a limit, output to the log, one status line in the summary
  local name="$1" lim="$2"; shift 2
  local t0=$SECONDS
  if [ "$lim" = 0 ]; then say "step $name: skipped (its limit is 0)"; return 0; fi
  echo "=== $name: $*" >>"$log"
  timeout --kill-after=10 "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  local how="exit $rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && how="cut at its ${lim}s limit (exit $rc)"
  say "step $name: $how in $((SECONDS - t0)) s"
  return 0
}

say "flashmla_h200: $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
# --- 0. setup --------------------------------------------------------------------------------------------------
if [ -z "${SMV_FMLA_NO_INSTALL:-}" ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --find-links .whl allpairspy >>"$log" 2>&1 \
    || say "setup: allpairspy from .whl/ failed"
fi
if [ -z "${SMV_FMLA_NO_INSTALL:-}" ]; then  # set it where this checkout is installed already
  python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 || say "setup: pip install -e . failed"
fi
fmla="${SMV_FLASHMLA_PATH:-$PWD/.fmla}"
if [ ! -d "$fmla/flash_mla" ]; then
  whl="$(ls "$fmla"/*.whl 2>/dev/null | head -1)"
  if [ -n "$whl" ]; then
    python3 -m zipfile -e "$whl" "$work/fmla" >>"$log" 2>&1 && fmla="$work/fmla" \
      && say "setup: unzipped $(basename "$whl")"
  fi
fi
export SMV_FLASHMLA_PATH="$fmla"
ver="$(cat "$fmla/flash_mla/VERSION" 2>/dev/null || echo 'no flash_mla/ there')"
say "setup: SMV_FLASHMLA_PATH=$fmla (flash_mla $ver)"
python3 - >>"$summary" 2>&1 <<'EOF' || say "setup: version probe failed"
import torch, triton
print(f"setup: torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")
from contracts.subjects import flashmla as fm
print("setup: flashmla", fm.unavailable_reason() or "available")
EOF
step check "$lim_setup" python3 benchmarks/flashmla.py --batch 2
grep -E "^(flashmla column|conversions):" "$log" | tee -a "$summary"

# --- 1. smv bench ----------------------------------------------------------------------------------------------
step bench "$lim_bench" python3 -m contracts.cli.bench --require-gpu -k "bench_decode and not reduce" \
  --json "$work/bench.json"
[ -s "$work/bench.json" ] && cp "$work/bench.json" "$out/bench.json"
section bench | awk '/^device /,0' | grep -vE "^(graph us|! )" | head -40 >>"$summary"

# --- 2. our best builds beside FlashMLA -----------------------------------------------------------------------
step variants "$lim_variants" python3 benchmarks/decode_variants.py --no-upstream --families gfx950,gfx942 \
  --variants single-read --budget "$((lim_variants - 15))" --json "$work/decode_variants.json"
[ -s "$work/decode_variants.json" ] && cp "$work/decode_variants.json" "$out/decode_variants.json"
section variants | awk '/^batch  *family/,0' | grep -E "^ *(batch|[0-9]+) |FAILED" | head -24 >>"$summary"
grep -E "^(flashmla:|ceilings:)" "$log" | tail -4 >>"$summary"

# --- 3. the contracts judging FlashMLA ---------------------------------------------------------------------------
jobs="${SMV_GPU_AUDIT_JOBS:-$(n=$(nproc); [ "$n" -gt 5 ] && echo $((n - 4)) || echo 1)}"
step audit "$lim_audit" python3 -m contracts.cli audit --subject flashmla --profile ci --jobs "$jobs" \
  --budget "$((lim_audit - 40))" --report "$work/audit" --no-progress
for f in audit.json audit.md; do [ -s "$work/audit/$f" ] && cp "$work/audit/$f" "$out/$f"; done
python3 - "$work/audit/audit.json" >>"$summary" 2>&1 <<'EOF' || say "audit: no audit.json to summarize"
import json, sys, collections
doc = json.load(open(sys.argv[1]))
rows = doc["results"]
print("audit:", dict(collections.Counter(r["status"] for r in rows)))
for r in rows:
    if r["status"] != "skipped":
        print(f"  {r['contract']:<28} {r['target']:<8} {r['status']:<8} {r['cases']:>4} {(r.get('reason') or '')[:160]}")
why = collections.Counter((r.get("reason") or "")[:140] for r in rows if r["status"] == "skipped")
for reason, n in why.most_common(8):
    print(f"  skipped x{n}: {reason}")
for s in doc["run"].get("subjects", []):
    for c in s.get("conversions", []):
        print(f"  conversion {c['id']}: {c['why']}")
EOF
say "flashmla_h200: done in $SECONDS s; files in $out"
rm -rf "$work"
exit 0
