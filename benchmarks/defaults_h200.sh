#!/usr/bin/env bash
# Issue 31 items 3 and 4 on one NVIDIA H200, in one device call of at most ~4.5 minutes:
#   0. setup: this checkout installed (--no-deps; allpairspy from .whl/ where the host reaches no registry);
#   1. benchmarks/decode_variants.py: the gfx950 and gfx942 decode defaults (impl.decode's SizeRule: the build it
#      picks per batch), their 16-head ("narrow") and single-read builds forced, and the wide-side candidates
#      (block_h 32/64, warps, stages) at batch 64, 512 and 1 beside torch gather + SDPA, every output checked
#      against the float64 oracle (NaN-poisoned buffers);
#   2. benchmarks/logits_variants.py: the paged MQA logits, our default and candidate builds (LogitsVariant) beside
#      upstream's Triton kernel (SMV_BENCH_SUBJECT, default vllm@.smv-subject/vllm-0.34.0) at 64 requests x 8192
#      context and 4 x 8192, 64 heads, every output checked against the float64 oracle with the contract's bound;
#   3. one table (summary.txt): per batch and family the default's build and time, narrow, single-read, the best
#      candidate, SDPA and default / SDPA; per logits point ours (default, best) over upstream's time.
# Every step runs under its own time limit; a failing step is printed and the next one still runs.
# Writes three files to $OUT (or the first argument): summary.txt, log.txt, defaults.json (both scripts' JSON).
#   usage: OUT=/some/dir bash benchmarks/defaults_h200.sh      (step limits: SMV_DEFAULTS_LIMITS="40 150 75";
#   SMV_DEFAULTS_NO_INSTALL=1 where this checkout is installed already; SMV_DEFAULTS_FLASHMLA=1 times FlashMLA's
#   row in step 1 too; --dry-run: the same steps under the Triton
#   interpreter at tiny shapes, no timing, no install - the CPU check of this script)
set -uo pipefail
dry=""
if [ "${1:-}" = "--dry-run" ]; then dry="--dry-run"; shift; fi
out="${1:-${OUT:-./defaults-h200}}"
mkdir -p "$out"
work="$(mktemp -d)"
log="$out/log.txt"
summary="$out/summary.txt"
: >"$log"; : >"$summary"
export PYTHONUNBUFFERED=1
# the dry run is the interpreter's (minutes on a shared CPU): its steps get room, the GPU run's stay within 4.5 min
if [ -n "$dry" ]; then def_limits="40 600 300"; else def_limits="40 150 75"; fi
read -r lim_setup lim_decode lim_logits <<<"${SMV_DEFAULTS_LIMITS:-$def_limits}"
say() { echo "$*" | tee -a "$summary"; }
step() {  # step NAME LIMIT CMD...: run under a limit, output to the log, one status line in the summary
  local name="$1" lim="$2"; shift 2
  local t0=$SECONDS
  echo "=== $name: $*" >>"$log"
  timeout --kill-after=10 "$lim" "$@" >>"$log" 2>&1
  local rc=$?
  local how="exit $rc"
  [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && how="cut at its ${lim}s limit (exit $rc)"
  say "step $name: $how in $((SECONDS - t0)) s"
  return 0
}

say "defaults_h200${dry:+ (dry run)}: $(date -u +%FT%TZ) on $(nvidia-smi --query-gpu=name,compute_cap --format=csv,noheader 2>/dev/null | head -1)"
# --- 0. setup --------------------------------------------------------------------------------------------------
if [ -z "$dry" ] && [ -z "${SMV_DEFAULTS_NO_INSTALL:-}" ]; then
  if ls .whl/*.whl >/dev/null 2>&1; then
    timeout 20 python3 -m pip install -q --no-index --find-links .whl allpairspy >>"$log" 2>&1 \
      || say "setup: allpairspy from .whl/ failed"
  fi
  timeout "$lim_setup" python3 -m pip install -q --no-deps --no-build-isolation -e . >>"$log" 2>&1 \
    || say "setup: pip install -e . failed"
fi
python3 - >>"$summary" 2>&1 <<'EOF' || say "setup: version probe failed"
import torch, triton
print(f"setup: torch {torch.__version__}, triton {triton.__version__}, cuda {torch.version.cuda}")
EOF
subject="${SMV_BENCH_SUBJECT:-vllm@.smv-subject/vllm-0.34.0}"

# --- 1. decode: defaults, forced builds and candidates beside SDPA -----------------------------------------------
# 14 compile jobs (gfx950 7, gfx942 7): one wave of decode_variants.py's 14 compile workers on the H200's 16 cores
dv_variants="default,narrow,single-read,h32+w8,single-read+pipelined,h32+w8+stages1,h32+w4,h32+w4+stages1"
if [ -n "$dry" ]; then
  step decode "$lim_decode" python3 benchmarks/decode_variants.py --dry-run --no-upstream --no-flashmla \
    --families gfx950,gfx942 --variants "$dv_variants" --json "$work/decode_variants.json"
else
  # FlashMLA's row stays out unless SMV_DEFAULTS_FLASHMLA=1 (decode_variants.py finds it through SMV_FLASHMLA_PATH)
  fm_flag="--no-flashmla"; [ -n "${SMV_DEFAULTS_FLASHMLA:-}" ] && fm_flag=""
  step decode "$lim_decode" python3 benchmarks/decode_variants.py --no-upstream $fm_flag \
    --families gfx950,gfx942 --batches 64,512,1 --variants "$dv_variants" --budget "$((lim_decode - 15))" \
    --rep-ms 40 --json "$work/decode_variants.json"
  grep -E "^(flashmla|ceilings):|FlashMLA's time" "$log" | tail -6 >>"$summary"
fi

# --- 2. paged logits: ours (default, candidates) beside upstream's ----------------------------------------------
if [ -n "$dry" ]; then
  step logits "$lim_logits" python3 benchmarks/logits_variants.py --dry-run --json "$work/logits_variants.json"
else
  export SMV_BENCH_SUBJECT="$subject"
  step logits "$lim_logits" python3 benchmarks/logits_variants.py \
    --budget "$((lim_logits - 10))" --json "$work/logits_variants.json"
fi

# --- 3. one table -------------------------------------------------------------------------------------------------
python3 - "$work/decode_variants.json" "$work/logits_variants.json" "$out/defaults.json" 2>&1 <<'PY' | tee -a "$summary"
import json, sys
from pathlib import Path


def load(p):
    try:
        return json.loads(Path(p).read_text())
    except Exception as e:  # a step cut before its first row
        print(f"summary: no {Path(p).name} ({type(e).__name__})")
        return {"rows": []}


dv, lv = load(sys.argv[1]), load(sys.argv[2])
Path(sys.argv[3]).write_text(json.dumps({"decode_variants": dv, "logits_variants": lv}, indent=1, default=str))


def g(r):  # the CUDA-graph median where the row has one
    if r is None or r.get("error"):
        return None
    return r.get("graph_us") if r.get("graph_us") is not None else (
        r.get("us") if r.get("timing") == "do_bench_cudagraph" else None)


def ok(r):
    return r is not None and not r.get("error") and (r.get("oracle") or {}).get("ok", True)


def f(x, w=8):
    return f"{x:>{w}.1f}" if x is not None else f"{'-':>{w}}"


from impl import decode as D
from impl.targets import get_target

rows = dv.get("rows", [])
print("decode (graph us; every ours row checked against the float64 oracle; default = impl.decode's SizeRule)")
print(f"{'batch':>5} {'family':<7} {'S':>3} {'default picks':<13} {'default':>8} {'narrow':>8} {'1-read':>8} "
      f"{'best candidate':<22} {'best':>8} {'SDPA':>8} {'def/SDPA':>8}  checks")
for b in sorted({r["batch"] for r in rows}):
    torch_row = next((r for r in rows if r["batch"] == b and r["family"] == "torch"), None)
    for fam in ("gfx950", "gfx942"):
        rs = {r.get("variant"): r for r in rows if r["batch"] == b and r["family"] == fam
              and r["impl"].startswith("ours ") and r["impl"] != "ours reduce"}
        if not rs:
            continue
        d = rs.get("default")
        s = (d or {}).get("num_splits")
        rule = D.DEFAULT_VARIANTS[fam]
        pick = "-"
        if s is not None and isinstance(rule, D.SizeRule):
            v = rule.pick(b, s, dv.get("shape", {}).get("heads", 64), get_target(fam).cu_count)
            pick = "wide" if v == rule.wide else "narrow"
        cands = [(n, r) for n, r in rs.items() if ok(r) and g(r) is not None]
        bn, br = min(cands, key=lambda x: g(x[1])) if cands else (None, None)
        bad = [n for n, r in rs.items() if not ok(r)]
        sd = g(torch_row)
        ratio = f"{g(d) / sd:8.2f}" if g(d) and sd else f"{'-':>8}"
        print(f"{b:>5} {fam:<7} {s if s is not None else '-':>3} {pick:<13} {f(g(d))} {f(g(rs.get('narrow')))} "
              f"{f(g(rs.get('single-read')))} {bn or '-':<22} {f(g(br))} {f(sd)} {ratio}  "
              f"{'all ok' if not bad else 'FAILED: ' + ','.join(bad)}")
lrows = lv.get("rows", [])
print("paged MQA logits (graph us / events us; every row checked against the float64 oracle, the contract's bound)")
print(f"{'point':>8} {'default':>17} {'best build':<22} {'best':>17} {'upstream':>17} {'def/up':>7} {'best/up':>7}  "
      "checks")
for pt in dict.fromkeys(r["point"] for r in lrows):
    rs = {r["impl"]: r for r in lrows if r["point"] == pt}
    up, d = rs.get("upstream"), rs.get("default")
    cands = [(n, r) for n, r in rs.items() if n != "upstream" and ok(r) and r.get("graph_us")]
    bn, br = min(cands, key=lambda x: x[1]["graph_us"]) if cands else (None, None)

    def both(r):
        return f"{f(r.get('graph_us'))} / {f(r.get('us'))}" if r else f"{'-':>17}"

    def rat(r):
        good = r and up and r.get("graph_us") and up.get("graph_us")
        return f"{r['graph_us'] / up['graph_us']:7.2f}" if good else f"{'-':>7}"

    bad = [n for n, r in rs.items() if not ok(r)]
    print(f"{pt:>8} {both(d)} {bn or '-':<22} {both(br)} {both(up)} {rat(d)} {rat(br)}  "
          f"{'all ok' if not bad else 'FAILED: ' + ','.join(bad)}")
PY
[ "${PIPESTATUS[0]}" -eq 0 ] || say "summary: failed (the log has both scripts' own tables)"
grep -E "FAILED|ERROR|Traceback" "$log" | head -12 | sed 's/^/log: /' | tee -a "$summary"
say "defaults_h200: done in $SECONDS s; files in $out"
rm -rf "$work"
exit 0
