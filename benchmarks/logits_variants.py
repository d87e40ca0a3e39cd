"""Build, check and time the paged MQA logits' build variants beside upstream's Triton kernel, in one call.

    SMV_BENCH_SUBJECT=vllm@.smv-subject/vllm-0.34.0 python3 benchmarks/logits_variants.py --budget 70

Issue 31 item 4: ``impl.indexer_logits.fp8_paged_mqa_logits`` at least as fast as upstream's
``rocm_fp8_paged_mqa_logits_triton`` (last measured 2.2x slower at batch 64, 8192 context). What it does:

1. Per point (``--points``, default ``64x8192,4x8192``: requests x context, 64 heads, one query row per request,
   64-token blocks of C4A's NORMAL layout, the only one upstream's kernel reads; the workload of ``smv bench``'s
   logits rows, tests/benchmarks/bench_indexer.py's ``LogitsWorkload``), the float64 oracle
   (``oracles.indexer_logits``) over the first ``ORACLE_ROWS`` rows on a CPU thread.
2. Per build (``VARIANTS``: ``impl.indexer_logits.LogitsVariant`` values, the default first) and upstream's kernel:
   one call into a NaN-filled output, checked against the oracle with the contract's bound
   (``contracts.indexer_logits.tolerances``: worst |err| / tol, -inf exactly at the positions not visible, NaN
   where the oracle has NaN), bit identity with our default; compiler statistics; ``do_bench`` (L2 flushed) and
   ``do_bench_cudagraph`` medians.
3. One table last: per point, every row's us (graph and events), its time over upstream's on each clock, and
   its check. ``$OUT/logits_variants.json`` (``--json``) is rewritten after every row.

``--dry-run`` (the Triton interpreter, no GPU): a tiny point, every build checked against the oracle, no timing, no
upstream (its direct launcher is native only): the check that the script works (tests/test_bench.py runs it).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import importlib.util
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: (name, LogitsVariant fields), the default first, then the most telling (a run cut by its budget keeps those).
#: benchmarks/DECODE_PERF.md's item-4 section says what each tests against upstream's kernel.
VARIANTS = [
    ("default", dict(page_tile=True, scale32=True, fill=1.0, f16=True)),  # impl.indexer_logits.DEFAULT_LOGITS_VARIANT
    ("first", {}),  # the kernel's first build (the default until the 2026-12-06 measurement)
    ("bf16", dict(page_tile=True, scale32=True, fill=1.0)),  # the default's bf16 operands (default, 2026-12-06)
    ("page", dict(page_tile=True)),
    ("page+s32", dict(page_tile=True, scale32=True)),
    ("page+s32+fill", dict(page_tile=True, scale32=True, fill=1.0)),
    # the last 6% at 64 x 8192 (2026-12-06; counts from `sm90_static.py --rows logits:NAME`, Triton 3.9): the
    # conversion to bf16 is two F2F and a PRMT per pair of codes, to fp16 one F2FP (kernel body 944 -> 752 SASS
    # instructions: `default` now); fp8 operands with Hopper's own accumulation run fp8 wgmma (k32) with no
    # conversion (560), where promoting every MMA's sum (`fp8dot` below) falls back to mma.sync with conversions
    # (864). Upstream's kernel, fp8 in its source, compiles on sm_90 to the bf16 conversion and a bf16 wgmma (792)
    ("fp8dev", dict(page_tile=True, scale32=True, fill=1.0, fp8_dot=True, fp8_promote=False)),
    ("default+st3", dict(page_tile=True, scale32=True, fill=1.0, f16=True, num_stages=3)),
    ("fp8dev+st3", dict(page_tile=True, scale32=True, fill=1.0, fp8_dot=True, fp8_promote=False,
                        num_stages=3)),
    ("default+t4", dict(page_tile=True, scale32=True, fill=1.0, f16=True, tiles=4)),
    ("page+s32+fp8dot", dict(page_tile=True, scale32=True, fp8_dot=True)),
    ("page+s32+fp8dot+fill", dict(page_tile=True, scale32=True, fp8_dot=True, fill=1.0)),
    ("page+s32+t4", dict(page_tile=True, scale32=True, tiles=4)),
    ("page+s32+w8", dict(page_tile=True, scale32=True, num_warps=8)),
    ("page+s32+st3", dict(page_tile=True, scale32=True, num_stages=3)),
    ("page+s32+b128", dict(page_tile=True, scale32=True, block=128, num_warps=8)),
    ("s32", dict(scale32=True)),
]
POINTS = "64x8192,4x8192"
HEADS = 64
ORACLE_ROWS = 2


def _bench_indexer():
    """tests/benchmarks/bench_indexer.py (LogitsWorkload, logits_figures), loaded by path."""
    path = ROOT / "tests" / "benchmarks" / "bench_indexer.py"
    spec = importlib.util.spec_from_file_location("smv_bench_indexer", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def oracle_inputs(w, rows: int) -> dict:
    """Host copies of what the oracle reads for the first ``rows`` requests (made on the main thread)."""
    r = min(rows, w.batch)
    return {"q": w.q[:r].cpu(), "cache": w.cache.cpu(), "weights": w.weights[:r].cpu(),
            "ctx": [int(c) for c in w.context_lens[:r].cpu()], "table": w.table[:r].cpu().tolist(),
            "max_model_len": w.max_model_len, "heads": w.heads}


def oracle_reference(inp: dict) -> dict:
    import torch

    from contracts.indexer_logits import tolerances
    from oracles import indexer_logits as oracle

    q = inp["q"].view(torch.uint8)
    vis = [[c] for c in inp["ctx"]]  # next_n = 1: row b sees ctx positions
    ref = oracle.paged_logits(q, inp["cache"], inp["weights"], vis, inp["table"], inp["max_model_len"], "normal",
                              "ocp")
    ref["tol"], _ = tolerances(ref, inp["heads"])
    return ref


def check(ref: dict, got) -> dict:
    """The contract's bound over the oracle's rows: worst |err| / tol, -inf exactly where not visible, NaN kept."""
    import torch

    r = int(ref["logits"].shape[0])
    g = got[:r].detach().cpu().double()
    e, tol, vis = ref["logits"], ref["tol"], ref["visible"]
    masked_ok = bool(torch.equal(g[~vis] == float("-inf"), torch.ones_like(g[~vis], dtype=torch.bool)))
    nan_ok = bool(torch.equal(g[vis].isnan(), e[vis].isnan()))
    fin = vis & e.isfinite() & g.isfinite()
    ratio = float(((g - e).abs()[fin] / tol[fin].clamp(min=1e-300)).max()) if fin.any() else 0.0
    nonfinite_ok = bool(torch.equal(g[vis & ~e.isnan()].isfinite(), e[vis & ~e.isnan()].isfinite()))
    return {"ok": masked_ok and nan_ok and nonfinite_ok and ratio <= 1.0, "worst_err_over_tol": ratio,
            "masked_exact": masked_ok, "nan_positions_equal": nan_ok}


def _times(fn, timing: bool, rep_ms: int) -> dict:
    if not timing:
        return {}
    import torch
    import triton

    t = {"us": triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median") * 1e3}
    try:
        t["graph_us"] = triton.testing.do_bench_cudagraph(fn, rep=max(10, rep_ms // 2), return_mode="median") * 1e3
    except Exception:  # noqa: BLE001 - a call that cannot be captured keeps its event time
        torch.cuda.synchronize()
    return t


def run_point(bi, point: str, dev, variants, up, ref_fut, timing, args, note, rows_out, save, deadline, watch):
    import torch

    from impl import indexer_logits as il
    from impl.targets import get_target

    batch, ctx = (int(x) for x in point.split("x"))
    w = point_work(bi, point, dev)
    ref = None
    try:
        ref = ref_fut.result()
    except Exception as e:  # noqa: BLE001
        note(f"{point}: oracle failed: {type(e).__name__}: {e}")
    default_out = None
    # upstream's right after our default: a run cut by its budget keeps the comparison
    impls = variants[:1] + ([("upstream", None)] if up is not None else []) + variants[1:]
    for name, fields in impls:
        if time.time() > deadline - 2:
            note(f"{point} {name}: skipped, budget spent")
            continue
        row = {"point": point, "batch": batch, "context": ctx, "heads": w.heads, "impl": name, "fields": fields,
               **w.figures}
        try:
            if name == "upstream":
                fn = up.bind("gfx950").indexer_logits.triton_launcher(w.q, w.cache, w.weights, w.context_lens,
                                                                      w.table, w.max_model_len, target="gfx950")
                out = fn()
                if native():
                    torch.cuda.synchronize()
                got = out.detach().clone()
            else:
                v = il.LogitsVariant(**fields)
                with il.logits_variant(v):
                    w.out.fill_(float("nan"))
                    fn = w.call("normal")
                    fn()
                    if native():
                        torch.cuda.synchronize()
                    if watch is not None:  # timing runs only (a dry run on a GPU host compiles but does not time)
                        row["stats"] = watch.new()
                    got = w.out.detach().clone()
                    grid, meta = il._paged_launch(v, batch, w.max_model_len, w.block_size, w.cache,
                                                  get_target("gfx950"))
                    row["launch"] = {"grid": list(grid), **{k: meta[k] for k in sorted(meta)}}
            if ref is not None:
                row["oracle"] = check(ref, got)
            if default_out is None:
                default_out = got
            else:
                same = torch.equal(got.view(torch.int32), default_out.view(torch.int32))
                row["bit_identical_to_default"] = bool(same)
            if name == "upstream":
                row.update(_times(fn, timing, args.rep_ms))
            else:
                with il.logits_variant(il.LogitsVariant(**fields)):
                    row.update(_times(fn, timing, args.rep_ms))
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {e}"[:400]
            row["trace"] = traceback.format_exc()[-1200:]
        rows_out.append(row)
        print(_row_line(row), flush=True)
        save()


_WORK: dict = {}


def point_work(bi, point: str, dev):
    if point not in _WORK:
        batch, ctx = (int(x) for x in point.split("x"))
        _WORK[point] = bi.LogitsWorkload(dev, batch=batch, heads=HEADS if not _DRY else 8, ctx=ctx, block_size=64)
    return _WORK[point]


_DRY = False


def native() -> bool:
    import torch

    from impl.runtime import triton_mode

    return triton_mode() == "native" and torch.cuda.is_available()


def _row_line(r) -> str:
    us = f"{r['us']:9.1f}" if r.get("us") is not None else f"{'-':>9}"
    g = f"{r['graph_us']:9.1f}" if r.get("graph_us") is not None else f"{'-':>9}"
    o = r.get("oracle")
    chk = ("ok" if o["ok"] else "FAIL") + f" {o['worst_err_over_tol']:.2e}" if o else "-"
    same = "" if "bit_identical_to_default" not in r else ("=def" if r["bit_identical_to_default"] else "!=def")
    launch = r.get("launch") or {}
    lt = f"grid={launch.get('grid')} B{launch.get('BLOCK')} T{launch.get('TILES')} w{launch.get('num_warps')}" \
        if launch else ""
    st = ""
    if r.get("stats"):
        from contracts.cli import bench

        st = bench.format_stats(r["stats"])
    err = f" ERROR {r['error'][:160]}" if r.get("error") else ""
    return f"{r['point']:>8} {r['impl']:<22} {us} us {g} graph-us {chk:<14} {same:<5} {lt} {st}{err}"


def summary_table(rows) -> str:
    lines = [f"{'point':>8} {'impl':<22} {'events us':>9} {'graph us':>9} {'/up ev':>7} {'/up gr':>7}  check"]
    for point in dict.fromkeys(r["point"] for r in rows):
        rs = [r for r in rows if r["point"] == point]
        up = next((r for r in rs if r["impl"] == "upstream" and not r.get("error")), None)
        for r in rs:
            def ratio(k):
                return (f"{r[k] / up[k]:7.2f}" if up is not None and r.get(k) and up.get(k) else f"{'-':>7}")
            o = r.get("oracle")
            chk = "ERROR" if r.get("error") else (("ok" if o["ok"] else "FAIL") if o else "-")
            us = f"{r['us']:9.1f}" if r.get("us") is not None else f"{'-':>9}"
            g = f"{r['graph_us']:9.1f}" if r.get("graph_us") is not None else f"{'-':>9}"
            lines.append(f"{point:>8} {r['impl']:<22} {us} {g} {ratio('us')} {ratio('graph_us')}  {chk}")
        ours = [r for r in rs if r["impl"] != "upstream" and r.get("graph_us") and not r.get("error")
                and (r.get("oracle") or {}).get("ok", True)]
        if ours and up is not None and up.get("graph_us"):
            best = min(ours, key=lambda r: r["graph_us"])
            lines.append(f"{point:>8} best: {best['impl']} {best['graph_us']:.1f} us = "
                         f"{best['graph_us'] / up['graph_us']:.2f}x upstream's graph time")
    return "\n".join(lines)


def main(argv=None) -> int:
    global _DRY
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=70.0, help="seconds for the whole run (default 70)")
    p.add_argument("--json", default=None, help="JSON path (default $OUT/logits_variants.json, else ./)")
    p.add_argument("--points", default=POINTS, help=f"comma-separated REQUESTSxCONTEXT (default {POINTS})")
    p.add_argument("--variants", default=None, help="comma-separated names to keep (the default is always kept)")
    p.add_argument("--rep-ms", type=int, default=40, help="do_bench rep per measurement, ms")
    p.add_argument("--dry-run", action="store_true", help="tiny point, no timing, no upstream (interpreter check)")
    p.add_argument("--no-upstream", action="store_true", help="ignore SMV_BENCH_SUBJECT")
    args = p.parse_args(argv)
    t_start = time.time()
    deadline = t_start + args.budget

    import impl  # noqa: F401 - configures the Triton mode first
    import torch

    from impl.runtime import detect_device, kernel_device, triton_mode

    _DRY = args.dry_run
    timing = native() and not args.dry_run
    if not native() and not args.dry_run:
        print("logits_variants: no GPU here (Triton interpreter): nothing to time; --dry-run checks the script")
        return 0
    points = ["2x200"] if args.dry_run else [x.strip() for x in args.points.split(",") if x.strip()]
    keep = set(args.variants.split(",")) if args.variants else None
    variants = [v for v in VARIANTS if keep is None or v[0] in keep or v[0] == "default"]
    json_path = Path(args.json) if args.json else Path(os.environ.get("OUT") or ".") / "logits_variants.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    import triton

    doc = {"script": "benchmarks/logits_variants.py", "device": detect_device().as_json(), "mode": triton_mode(),
           "triton": triton.__version__, "torch": torch.__version__, "points": points, "rows": [], "notes": []}

    def save():
        doc["elapsed_s"] = time.time() - t_start
        tmp = json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(json_path)

    def note(msg):
        print(msg, flush=True)
        doc["notes"].append(msg)

    up = None
    spec = None if (args.no_upstream or args.dry_run) else os.environ.get("SMV_BENCH_SUBJECT")
    if spec:
        try:
            from contracts.subjects import parse_subject

            up = parse_subject(spec)
            doc["upstream"] = spec
        except Exception as e:  # noqa: BLE001
            note(f"upstream {spec}: cannot load ({type(e).__name__}: {e}); ours only")
    elif not args.dry_run:
        note("no SMV_BENCH_SUBJECT: upstream's kernel is not run (set it to vllm@.smv-subject/vllm-0.34.0)")
    if not timing:
        note("dry run: checks only (no timing, no compiler statistics)" if native()
             else "Triton interpreter: checks only (no timing, no compiler statistics)")
    bi = _bench_indexer()
    dev = kernel_device()
    pool = cf.ThreadPoolExecutor(max_workers=2)
    refs = {pt: pool.submit(oracle_reference, oracle_inputs(point_work(bi, pt, dev), ORACLE_ROWS)) for pt in points}
    from impl import indexer_logits as il

    watch = None
    if timing:
        from contracts.cli import bench

        watch = bench.StatsWatch({"paged": il._paged_mqa_logits_kernel})
    for pt in points:
        if time.time() > deadline - 2:
            note(f"{pt}: skipped, budget spent")
            continue
        run_point(bi, pt, dev, variants, up, refs[pt], timing, args, note, doc["rows"], save, deadline, watch)
    pool.shutdown(wait=False, cancel_futures=True)
    save()
    print()
    print(summary_table(doc["rows"]))
    print(f"\nlogits_variants: {len(doc['rows'])} rows in {time.time() - t_start:.0f} s; JSON in {json_path}")
    bad = [r for r in doc["rows"] if r.get("error") or (r.get("oracle") and not r["oracle"]["ok"])]
    for r in bad[:6]:
        print(f"  FAILED {r['point']} {r['impl']}: {r.get('error') or r['oracle']}"[:240])
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
