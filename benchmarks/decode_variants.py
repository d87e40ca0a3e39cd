"""Build, check and time every decode family's candidate variants side by side with upstream's kernels, in one call.

    SMV_BENCH_SUBJECT=vllm@.smv-subject/vllm-0.33.0 python3 benchmarks/decode_variants.py --budget 270

What it does, in order (benchmarks/DECODE_PERF.md says why each variant is there and what it predicts):

1. fp8: all 256 codes of each flavour through ``impl.triton_helpers.fp8_decode`` on the path this device takes
   (hardware where it has the flavour) and on the bit-level path, bit-exact against torch's fp8 dtypes (NaN
   positions exactly, -0 kept).
2. Compiles every (family, variant) in parallel worker processes (they fill Triton's on-disk cache; this process
   then loads the binaries), so compile time stays out of the budget's serial part.
3. For batch 64, 512 and 1 (64 heads, SWA 128 + 512 extra tokens per query row, as issue 15's table), per family and
   variant: one checked call into NaN-poisoned ``out`` and workspace, compared with the float64 oracle on the first
   rows (error-model tolerance, NaN/inf positions, worst |err| / tol) and with the family's default variant (bit
   identity, max difference); the compiler statistics (registers, spills, shared memory per kernel: Triton's
   ``n_regs``, ``n_spills``, ``metadata.shared``); ``triton.testing.do_bench`` median (batch 1:
   ``do_bench_cudagraph``, falling back to ``do_bench`` when the call cannot be captured). Upstream's decode (and
   reduce) for the same family and inputs when ``SMV_BENCH_SUBJECT`` names it, and the torch gather + SDPA baseline.
   FlashMLA's sparse decode (benchmarks/flashmla.py) on the same cache bytes and index lists, checked against the
   same oracle, with its bandwidth and FLOP rate against the copy and bf16-matmul ceilings measured at the start of
   the run; where FlashMLA is not installed (``SMV_FLASHMLA_PATH`` may name the folder holding flash_mla/) or the
   GPU is not SM90/SM100 one line says why and the row is left out.
4. Prints a short table last; the full results go to ``$OUT/decode_variants.json`` (``--json``), rewritten after
   every row so a run cut by its time limit still leaves what it measured.

The gfx942 family runs with an OCP main cache beside upstream's (NVIDIA has no FNUZ, so upstream's gfx942 runs
only that way here, as in issue 15's table); one row ``gfx942-fnuz`` runs our true gfx942 target (FNUZ main cache,
decoded from bits on NVIDIA). Variants are ``impl.decode.DecodeVariant`` values; ``bits`` is the default with the
hardware fp8 conversion turned off (the kernels as they were before it).

Under the Triton interpreter (no GPU) ``--dry-run`` runs the same steps on a tiny shape without timing or
statistics (one line says so): the check that the script itself works.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import math
import multiprocessing as mp
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: (name, DecodeVariant fields) per row family, most telling first (a run cut by its budget keeps those). "default"
#: is the family's ``DEFAULT_VARIANTS`` entry (gfx942 / gfx950: a ``SizeRule``, the build it picks per batch),
#: "narrow" its 16-head build forced at every batch, "bits" the default with the hardware fp8 conversion off. The
#: ``h32`` / ``+stages`` / ``+w4`` rows are issue 31 item 3's sweep for the wide side of the rule (gfx942 at batch
#: 512 was only at parity with SDPA: 759.9 vs 765.7 us).
VARIANTS = {
    "gfx950": [
        ("default", {}),
        ("narrow", dict(rope16=True, extra_tile=32)),
        ("single-read", dict(rope16=True, block_h=64, num_warps=8, extra_tile=32, num_stages=1)),
        ("single-read+pipelined", dict(rope16=True, block_h=64, num_warps=8, extra_tile=32)),
        ("single-read+qkchunks", dict(rope16=True, block_h=64, num_warps=8, extra_tile=32, num_stages=1,
                                      qk_chunks=True)),
        ("single-read+qkchunks+x64", dict(rope16=True, block_h=64, num_warps=8, extra_tile=64, num_stages=1,
                                          qk_chunks=True)),
        # around the fastest build of 2026-12-06's H100 run (single-read+qkchunks+x64): the 64-token tiles without
        # the chunked QK (the default's QK order), one warpgroup (no QK computed twice, twice the accumulator per
        # thread), the tile loop pipelined
        ("single-read+x64", dict(rope16=True, block_h=64, num_warps=8, extra_tile=64, num_stages=1)),
        ("single-read+qkchunks+x64+w4", dict(rope16=True, block_h=64, num_warps=4, extra_tile=64, num_stages=1,
                                             qk_chunks=True)),
        ("single-read+qkchunks+x64+st2", dict(rope16=True, block_h=64, num_warps=8, extra_tile=64, num_stages=2,
                                              qk_chunks=True)),
        ("h32+w8", dict(rope16=True, block_h=32, num_warps=8, extra_tile=32)),
        ("h32+w4", dict(rope16=True, block_h=32, num_warps=4, extra_tile=32)),
        ("h32+w8+stages1", dict(rope16=True, block_h=32, num_warps=8, extra_tile=32, num_stages=1)),
        ("single-read+w16", dict(rope16=True, block_h=64, num_warps=16, extra_tile=32)),
        ("x32+stages1", dict(rope16=True, extra_tile=32, num_stages=1)),
        ("x64", dict(rope16=True, extra_tile=64)),
        ("bits", {}),
    ],
    "gfx942": [
        ("default", {}),
        ("narrow", dict(rope16=True, num_stages=1)),
        ("single-read", dict(rope16=True, block_h=64, num_warps=8, num_stages=1)),
        ("single-read+pipelined", dict(rope16=True, block_h=64, num_warps=8)),
        ("single-read+stages3", dict(rope16=True, block_h=64, num_warps=8, num_stages=3)),
        ("h32+w8", dict(rope16=True, block_h=32, num_warps=8)),
        ("h32+w8+stages1", dict(rope16=True, block_h=32, num_warps=8, num_stages=1)),
        ("h32+w4+stages1", dict(rope16=True, block_h=32, num_warps=4, num_stages=1)),
        ("single-read+w16", dict(rope16=True, block_h=64, num_warps=16)),
        ("stages-default", dict(rope16=True)),
        ("bits", {}),
    ],
    "generic": [
        ("default", {}),
        ("single-read", dict(rope16=True, block_h=64, num_warps=8, num_stages=1)),
    ],
    "gfx942-fnuz": [
        ("default", {}),
        ("single-read", dict(rope16=True, block_h=64, num_warps=8, num_stages=1)),
    ],
}
#: the kernel family (impl.decode's) each row family launches
KERNEL_FAMILY = {"generic": "generic", "gfx942": "gfx942", "gfx942-fnuz": "gfx942", "gfx950": "gfx950"}
BATCH_ORDER = (64, 512, 1)
ORACLE_ROWS = 4  # query rows the float64 oracle checks per batch (all heads, both segments)


# ---------------------------------------------------------------------------------------------------------------
# targets, variants, workloads
# ---------------------------------------------------------------------------------------------------------------

def row_target(family: str):
    """The Target a row family runs: gfx942 with an OCP main cache (comparable with upstream's natively), the
    true gfx942 for gfx942-fnuz, the others as they are."""
    from impl.targets import get_target

    if family == "gfx942":
        return dataclasses.replace(get_target("gfx942"), main_cache_fp8="ocp")
    if family == "gfx942-fnuz":
        return get_target("gfx942")
    return get_target(family)


@contextlib.contextmanager
def variant_active(family: str, name: str, fields: dict):
    """Launch ``family`` with this variant for the block (``bits``: the default with hardware fp8 off)."""
    from impl import decode as D

    kf = KERNEL_FAMILY[family]
    chosen = D.DEFAULT_VARIANTS[kf] if name in ("default", "bits") else D.DecodeVariant(**fields)
    with D.decode_variant(kf, chosen):
        if name == "bits":
            saved = D.hw_fp8_decode
            D.hw_fp8_decode = lambda *a, **k: False
            try:
                yield
            finally:
                D.hw_fp8_decode = saved
        else:
            yield


class Work:
    """One batch: ``bench.DecodeWorkload``'s inputs (same seed, same caches) and, per row family, a frozen plan
    with caller-owned ``out`` and workspace."""

    def __init__(self, batch: int, device, heads: int, swa: int, extra: int):
        from contracts.cli import bench

        self.batch, self.device = batch, device
        self.w = bench.DecodeWorkload(batch, device, heads=heads, swa=swa, extra=extra)
        self._calls: dict = {}

    def main_cache(self, family: str):
        return self.w.main["fnuz" if row_target(family).main_cache_is_fnuz else "ocp"]

    def plan(self, family: str):
        from impl.decode import plan_decode

        w = self.w
        return plan_decode(row_target(family), w.batch, w.heads, w.main_idx.numel(), w.extra_idx.numel())

    def buffers(self, family: str):
        import torch

        from impl.decode import DecodeWorkspace

        if family not in self._calls:
            plan = self.plan(family)
            out = torch.empty_like(self.w.q)
            ws = (DecodeWorkspace.allocate(self.batch, plan.num_splits, self.w.heads, self.device)
                  if plan.family != "generic" else None)
            self._calls[family] = (plan, out, ws)
        return self._calls[family]

    def ours(self, family: str):
        """The zero-argument call of ours (the variant active when it runs is the one launched)."""
        from impl.decode import sparse_attn_decode

        w, t = self.w, row_target(family)
        plan, out, ws = self.buffers(family)
        main = self.main_cache(family)

        def run():
            return sparse_attn_decode(w.q, main, w.main_idx, w.main_ptr, w.extra_cache, w.extra_idx, w.extra_ptr,
                                      attn_sink=w.sink, target=t, plan=plan, workspace=ws, out=out,
                                      check_indptr=False)

        return run, plan, out, ws


# ---------------------------------------------------------------------------------------------------------------
# checks
# ---------------------------------------------------------------------------------------------------------------

_PROBE = None


def _fp8_probe():
    """The 256-code probe kernel (built on first use: Triton resolves its globals from this module)."""
    global _PROBE, TH, tl
    if _PROBE is None:
        import triton
        import triton.language as tl
        from impl import triton_helpers as TH

        @triton.jit
        def probe(src, dst, IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr):
            o = tl.arange(0, 256)
            tl.store(dst + o, TH.fp8_decode(tl.load(src + o), IS_FNUZ, HW_FP8))

        _PROBE = probe
    return _PROBE


def fp8_checks() -> list[dict]:
    """All 256 codes per flavour on the path chosen here and on the bit-level path, against torch."""
    import torch

    from impl import triton_helpers as TH
    from impl.runtime import kernel_device

    probe = _fp8_probe()
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    res = []
    for flavour, td in (("ocp", torch.float8_e4m3fn), ("fnuz", torch.float8_e4m3fnuz)):
        want = codes.view(td).float()
        hw = TH.hw_fp8_decode(flavour == "fnuz")
        for path in sorted({False, hw}):
            dst = torch.empty(256, dtype=torch.float32, device=kernel_device())
            probe[(1,)](codes.to(kernel_device()), dst, IS_FNUZ=flavour == "fnuz", HW_FP8=path)
            got = dst.cpu()
            nan_ok = torch.equal(got.isnan(), want.isnan())
            fin = ~want.isnan()
            bits_ok = torch.equal(got[fin].view(torch.int32), want[fin].view(torch.int32))
            bad = [c for c in range(256) if (bool(got[c].isnan()) != bool(want[c].isnan())) or
                   (not bool(want[c].isnan()) and int(got[c:c + 1].view(torch.int32)) !=
                    int(want[c:c + 1].view(torch.int32)))]
            res.append({"flavour": flavour, "path": "hardware" if path else "bits", "chosen": path == hw,
                        "exact": nan_ok and bits_ok, "bad_codes": bad[:16]})
    return res


def oracle_key(family: str) -> str:
    """Row families with the same cache flavours and scrub share one oracle (the inputs are the same)."""
    t = row_target(family)
    return f"{t.main_cache_fp8}/{t.extra_cache_fp8}"


def oracle_inputs(work: Work, family: str, rows: int) -> dict:
    """Host copies of what the oracle reads for the first ``rows`` query rows (their segments come first in each
    index list); made on the main thread, so no copy enters the GPU's stream while a call is being timed."""
    w, t = work.w, row_target(family)
    r = min(rows, w.batch)
    mp_, ep = w.main_ptr[:r + 1].cpu(), w.extra_ptr[:r + 1].cpu()
    return {"q": w.q[:r].cpu(), "main_cache": work.main_cache(family).cpu(),
            "main_indices": w.main_idx[:int(mp_[-1])].cpu(), "main_indptr": mp_, "extra_cache": w.extra_cache.cpu(),
            "extra_indices": w.extra_idx[:int(ep[-1])].cpu(), "extra_indptr": ep, "attn_sink": w.sink.cpu(),
            "softmax_scale": w.q.shape[2] ** -0.5, "main_flavour": t.main_cache_fp8,
            "extra_flavour": t.extra_cache_fp8, "scrub_extra": True}


def oracle_reference(inputs: dict):
    """The float64 oracle (CPU only) over :func:`oracle_inputs`; (reference, rows)."""
    from oracles import decode as oracle_decode

    return oracle_decode.ref_sparse_attn_decode(**inputs), int(inputs["q"].shape[0])


def check_against(ref, r: int, out, num_splits: int) -> dict:
    from impl.runtime import triton_mode
    from oracles import compare as cmp

    tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                  num_splits, 16, cmp.AttentionErrorModel.for_mode(triton_mode()))
    got = out[:r].detach().cpu()
    comp = cmp.attention_comparison(got, ref.out, tol)
    g, e = got.double(), ref.out.double()
    fin = g.isfinite() & e.isfinite()
    denom = e.abs().amax().item() or 1.0
    rel = ((g - e).abs()[fin].max().item() / denom) if fin.any() else 0.0
    return {"ok": comp.ok, "worst_err_over_tol": comp.worst_ratio, "max_rel_err": rel,
            "nan_positions_equal": bool((g.isnan() == e.isnan()).all()),
            "mismatches": [m.detail + f" at {m.where}" for m in comp.mismatches[:3]]}


def poison(out, ws) -> None:
    import torch

    out.view(torch.int16).fill_(-1)  # 0xFFFF: a bf16 NaN
    if ws is not None:
        for t in (ws.part_m, ws.part_l, ws.part_acc):
            t.fill_(math.nan)


def diff(a, b) -> dict:
    import torch

    same = torch.equal(a.view(torch.int16), b.view(torch.int16))
    d = (a.float() - b.float()).abs()
    d = d[d.isfinite()]
    return {"bit_identical": bool(same), "max_abs_diff": float(d.max()) if d.numel() else 0.0,
            "nan_positions_equal": bool(torch.equal(a.isnan(), b.isnan()))}


# ---------------------------------------------------------------------------------------------------------------
# compiler statistics
# ---------------------------------------------------------------------------------------------------------------

def StatsWatch(kernels):  # noqa: N802 - the shared helper, kept under its class name
    from contracts.cli import bench

    return bench.StatsWatch(kernels)


def our_kernels() -> dict:
    from impl import decode as D

    return {"generic": D._sparse_decode_generic_kernel, "gfx942": D._sparse_decode_gfx942_partial_kernel,
            "gfx950": D._sparse_decode_gfx950_partial_kernel, "reduce": D._sparse_decode_reduce_kernel}


# ---------------------------------------------------------------------------------------------------------------
# upstream
# ---------------------------------------------------------------------------------------------------------------

class Upstream:
    """Upstream's decode per row family through contracts' subject (its loader's named rewrites for this host)."""

    def __init__(self, spec: str):
        from contracts.subjects import parse_subject

        self.spec = spec
        self.subject = parse_subject(spec)
        self.bound: dict = {}

    def bind(self, family: str):
        if family not in self.bound:
            self.bound[family] = self.subject.bind(row_target(family))
        return self.bound[family]

    def kernels(self, family: str) -> dict:
        from contracts.subjects.vllm.adapters.decode import PARTIAL_KERNELS, REDUCE_KERNEL

        ops = self.bind(family).ctx["ops"]
        kf = KERNEL_FAMILY[family]
        return {f"upstream {kf}": getattr(ops, PARTIAL_KERNELS[kf]), "upstream reduce": getattr(ops, REDUCE_KERNEL)}

    def call(self, work: Work, family: str):
        import torch

        from contracts.subjects import using

        sub = self.bind(family)
        w = work.w
        main = work.main_cache(family)
        out = torch.empty_like(w.q)
        decode = sub.decode.sparse_attn_decode
        tname = KERNEL_FAMILY[family]

        def run():
            with using(self.subject):
                return decode(w.q, main, w.main_idx, w.main_ptr, w.extra_cache, w.extra_idx, w.extra_ptr,
                              attn_sink=w.sink, target=tname, out=out)

        return run, out

    def plan(self, work: Work, family: str):
        from contracts.subjects import using

        w = work.w
        with using(self.subject):
            return self.bind(family).decode.plan_decode(KERNEL_FAMILY[family], w.batch, w.heads, w.main_idx.numel(),
                                                        w.extra_idx.numel())

    def rewrites(self) -> list:
        return [{"id": r["id"], "file": r["file"]} for r in self.subject.rewrites]


# ---------------------------------------------------------------------------------------------------------------
# timing
# ---------------------------------------------------------------------------------------------------------------

def graph_us(fn, rep_ms: int):
    """Median microseconds under ``do_bench_cudagraph`` (host launch cost out), or None when it cannot capture."""
    import torch
    import triton

    try:
        return triton.testing.do_bench_cudagraph(fn, rep=max(10, rep_ms // 3), return_mode="median") * 1e3
    except Exception:  # noqa: BLE001
        torch.cuda.synchronize()
        return None


def time_call(fn, batch: int, rep_ms: int) -> tuple[float, str]:
    """(median microseconds, how): do_bench; at batch 1 do_bench_cudagraph when the call can be captured."""
    import torch
    import triton

    if batch == 1:
        try:
            ms = triton.testing.do_bench_cudagraph(fn, rep=max(10, rep_ms // 3), return_mode="median")
            return ms * 1e3, "do_bench_cudagraph"
        except Exception as e:  # noqa: BLE001 - a call that cannot be captured is timed eagerly
            torch.cuda.synchronize()
            how = f"do_bench (graph capture failed: {type(e).__name__})"
    else:
        how = "do_bench"
    ms = triton.testing.do_bench(fn, warmup=10, rep=rep_ms, return_mode="median")
    return ms * 1e3, how


# ---------------------------------------------------------------------------------------------------------------
# parallel compile (workers fill Triton's disk cache)
# ---------------------------------------------------------------------------------------------------------------

_WORKS: dict = {}


def _compile_job(job: dict) -> dict:
    """A worker: build the workloads, run each listed (family, variant) once per batch (ours) or upstream's."""
    t0 = time.time()
    try:
        from impl.runtime import kernel_device

        dev = kernel_device()
        # a worker process runs several jobs: its workloads are built once
        for b in job["batches"]:
            if (b, job["heads"]) not in _WORKS:
                _WORKS[(b, job["heads"])] = Work(b, dev, job["heads"], job["swa"], job["extra"])
        works = {b: _WORKS[(b, job["heads"])] for b in job["batches"]}
        if job.get("upstream"):
            up = Upstream(job["upstream"])
            for b, work in works.items():
                run, _ = up.call(work, job["family"])
                run()
                if KERNEL_FAMILY[job["family"]] != "generic":
                    up.bind(job["family"])  # the reduce compiles inside the call
        else:
            for name, fields in job["variants"]:
                with variant_active(job["family"], name, fields):
                    for work in works.values():
                        work.ours(job["family"])[0]()
        import torch

        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return {"job": job["label"], "ok": True, "seconds": time.time() - t0}
    except Exception as e:  # noqa: BLE001 - reported, the main process compiles it itself then
        return {"job": job["label"], "ok": False, "seconds": time.time() - t0,
                "error": f"{type(e).__name__}: {e}"[:400], "trace": traceback.format_exc()[-1500:]}


def precompile(jobs: list[dict], workers: int, timeout: float) -> list[dict]:
    if not jobs or workers < 1:
        return []
    ctx = mp.get_context("spawn")
    results = []
    # one job per process: a job that faults (an illegal address) leaves no broken CUDA context to the next one
    try:
        ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx, max_tasks_per_child=1)
    except TypeError:  # Python < 3.11
        ex = cf.ProcessPoolExecutor(max_workers=workers, mp_context=ctx)
    futs = [ex.submit(_compile_job, j) for j in jobs]
    try:
        for f in cf.as_completed(futs, timeout=timeout):
            try:
                results.append(f.result())
            except Exception as e:  # noqa: BLE001 - a worker that died
                results.append({"job": "?", "ok": False, "error": f"{type(e).__name__}: {e}"[:300]})
    except cf.TimeoutError:
        left = [j["label"] for j, f in zip(jobs, futs) if not f.done()]
        results.append({"job": "precompile", "ok": False,
                        "error": f"not done within {timeout:.0f} s: {', '.join(left)} (compiled here on first use)"})
        # a worker still compiling would hold the exit (the pool joins its processes): stop them
        for proc in list(getattr(ex, "_processes", {}).values()):
            with contextlib.suppress(Exception):
                proc.terminate()
    ex.shutdown(wait=False, cancel_futures=True)
    return results


# ---------------------------------------------------------------------------------------------------------------
# FlashMLA and the ceilings
# ---------------------------------------------------------------------------------------------------------------

def flashmla_column(disabled: bool, note):
    """(benchmarks/flashmla.py, flash_mla) where FlashMLA's row runs here, else (module or None, None) after one
    line saying why it is left out."""
    if disabled:
        note("flashmla: left out (--no-flashmla)")
        return None, None
    try:
        import importlib.util

        spec = importlib.util.spec_from_file_location("smv_bench_flashmla", Path(__file__).with_name("flashmla.py"))
        col = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(col)
        mod, why = col.availability()
    except Exception as e:  # noqa: BLE001 - a broken install is a reason, not the end of the run
        note(f"flashmla: skipped: {type(e).__name__}: {e}")
        return None, None
    if mod is None:
        note(f"flashmla: skipped: {why}")
        return col, None
    note(f"flashmla: {col.label()} on {col.arch_family()} runs beside ours")
    return col, mod


def measure_ceilings(rep_ms: int) -> dict:
    """The device's copy bandwidth (1 GiB copied, read + write counted) and bf16 matmul rate (8192^3), do_bench
    medians in this run: the yardsticks FlashMLA's row (and the summary) are divided by."""
    import torch
    import triton

    from contracts.cli import bench

    n = bench.COPY_BYTES
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    copy_s = triton.testing.do_bench(lambda: b.copy_(a), warmup=5, rep=rep_ms, return_mode="median") / 1e3
    m = bench.MATMUL_SIZE
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    mm_s = triton.testing.do_bench(lambda: x @ y, warmup=5, rep=rep_ms, return_mode="median") / 1e3
    return {"copy_bytes_per_s": bench.copy_figures(n)["bytes"] / copy_s,
            "matmul_flops_per_s": bench.matmul_figures(m)["flops"] / mm_s}


def rates(row: dict, ceilings) -> None:
    """A timed row's achieved GB/s and TFLOP/s (graph median where it has one) and their fractions of the ceilings."""
    us = _graph_us(row) or row.get("us")
    if not us:
        return
    sec = us / 1e6
    row["gb_per_s"], row["tflop_per_s"] = row["bytes"] / sec / 1e9, row["flops"] / sec / 1e12
    if ceilings:
        row["fraction_of_copy_ceiling"] = row["bytes"] / sec / ceilings["copy_bytes_per_s"]
        row["fraction_of_matmul_ceiling"] = row["flops"] / sec / ceilings["matmul_flops_per_s"]


def flashmla_row(col, mod, work: Work, batch: int, fig: dict, ref_future, timing: bool, args, ceilings) -> dict:
    """FlashMLA's decode of this batch: one checked call (the shared oracle where one was computed for OCP caches,
    else its own), then timed as ours are."""
    import torch

    row = {"batch": batch, "family": "flashmla", "impl": f"{col.label()} {col.arch_family()}", **fig}
    try:
        run, plan = col.workload_call(mod, work.w)  # FlashMLA allocates its own output
        row["num_splits"] = plan.num_splits
        got = run().detach().clone()
        torch.cuda.synchronize()
        if ref_future is not None:
            ref, r = ref_future.result()
            row["oracle"] = check_against(ref, r, got, plan.num_splits)
        else:
            row["oracle"] = col.oracle_check(work.w, got, plan.num_splits, ORACLE_ROWS)
        if timing:
            row["us"], row["timing"] = time_call(run, batch, args.rep_ms)
            if batch > 1 and args.graph:
                row["graph_us"] = graph_us(run, args.rep_ms)
            rates(row, ceilings)
    except Exception as e:  # noqa: BLE001
        row["error"] = f"{type(e).__name__}: {e}"[:500]
        row["trace"] = traceback.format_exc()[-1500:]
    return row


# ---------------------------------------------------------------------------------------------------------------
# the run
# ---------------------------------------------------------------------------------------------------------------

#: a worker's error that means the call itself faulted on the device: the main process does not run that call (a
#: fault would end its CUDA context and every row after it)
DEVICE_FAULTS = ("illegal memory access", "illegal address", "misaligned address", "unspecified launch failure",
                 "illegal instruction", "device-side assert")


def faulted_jobs(results: list[dict]) -> dict:
    """label -> the worker's error, for jobs whose call faulted on the device."""
    return {r["job"]: r.get("error", "") for r in results
            if not r.get("ok") and any(f in (r.get("error") or "").lower() for f in DEVICE_FAULTS)}


def figures(batch, heads, swa, extra) -> dict:
    from contracts.cli import bench

    return bench.decode_figures(batch, heads, swa, extra)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--budget", type=float, default=270.0, help="seconds for the whole run (default 270)")
    p.add_argument("--json", default=None, help="JSON path (default $OUT/decode_variants.json, else ./)")
    p.add_argument("--families", default=",".join(VARIANTS), help="comma-separated row families")
    p.add_argument("--batches", default=",".join(str(b) for b in BATCH_ORDER))
    p.add_argument("--variants", default=None, help="comma-separated variant names to keep (default: all)")
    p.add_argument("--workers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)),
                   help="compile worker processes (0: compile serially here)")
    p.add_argument("--rep-ms", type=int, default=60, help="do_bench rep per measurement, ms")
    p.add_argument("--no-graph", dest="graph", action="store_false",
                   help="batches above 1: only do_bench (default: also do_bench_cudagraph, as graph_us)")
    p.add_argument("--dry-run", action="store_true", help="tiny shape, no timing (the interpreter's self-check)")
    p.add_argument("--no-upstream", action="store_true", help="ignore SMV_BENCH_SUBJECT")
    p.add_argument("--no-flashmla", action="store_true", help="leave FlashMLA's row out")
    args = p.parse_args(argv)
    t_start = time.time()
    deadline = t_start + args.budget

    import impl  # noqa: F401 - configures the Triton mode before Triton is used
    from impl.runtime import detect_device, kernel_device, triton_mode

    import torch

    native = triton_mode() == "native" and torch.cuda.is_available()
    # a dry run (the suite's own check of this script, on any machine) never times and never spawns workers
    timing = native and not args.dry_run
    if not native and not args.dry_run:
        print("decode_variants: no GPU here (Triton interpreter): nothing to time; --dry-run checks the script")
        return 0
    heads, swa, extra = (16, 8, 40) if args.dry_run else (64, 128, 512)
    batches = [2, 1] if args.dry_run else [int(b) for b in args.batches.split(",") if b.strip()]
    families = [f.strip() for f in args.families.split(",") if f.strip()]
    for f in families:
        if f not in VARIANTS:
            print(f"decode_variants: unknown family {f!r} (expected {', '.join(VARIANTS)})", file=sys.stderr)
            return 2
    keep = set(args.variants.split(",")) if args.variants else None
    variants = {f: [v for v in VARIANTS[f] if keep is None or v[0] in keep or v[0] == "default"] for f in families}
    out_dir = Path(args.json).parent if args.json else Path(os.environ.get("OUT") or ".")
    json_path = Path(args.json) if args.json else out_dir / "decode_variants.json"
    json_path.parent.mkdir(parents=True, exist_ok=True)
    dev = kernel_device()
    import triton

    doc = {"script": "benchmarks/decode_variants.py", "device": detect_device().as_json(), "triton": triton.__version__,
           "torch": torch.__version__, "mode": triton_mode(), "shape": {"heads": heads, "swa": swa, "extra": extra},
           "budget_s": args.budget, "fp8": [], "precompile": [], "rows": [], "notes": []}

    def save():
        doc["elapsed_s"] = time.time() - t_start
        tmp = json_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1, default=str))
        tmp.replace(json_path)

    def note(msg):
        print(msg, flush=True)
        doc["notes"].append(msg)

    # 1. fp8 paths
    doc["fp8"] = fp8_checks()
    for r in doc["fp8"]:
        print(f"fp8 {r['flavour']:<4} {r['path']:<8} {'(chosen here)' if r['chosen'] else '             '} "
              f"{'exact on all 256 codes' if r['exact'] else 'NOT EXACT: codes ' + str(r['bad_codes'])}", flush=True)
    save()

    spec = None if args.no_upstream else os.environ.get("SMV_BENCH_SUBJECT")
    up = None
    if spec:
        try:
            up = Upstream(spec)
        except Exception as e:  # noqa: BLE001
            note(f"upstream {spec}: cannot load ({type(e).__name__}: {e}); ours only")
    else:
        note("no SMV_BENCH_SUBJECT: upstream's kernels are not run (set it to vllm@.smv-subject/vllm-0.33.0)")

    fm_col, fm_mod = flashmla_column(args.no_flashmla, note)
    if timing:
        try:
            doc["ceilings"] = measure_ceilings(args.rep_ms)
            note(f"ceilings: copy {doc['ceilings']['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
                 f"{doc['ceilings']['matmul_flops_per_s'] / 1e12:.0f} TFLOP/s (measured in this run)")
        except Exception as e:  # noqa: BLE001
            note(f"ceilings: not measured ({type(e).__name__}: {e})")

    # the workloads, and the float64 oracles on CPU threads (torch releases the GIL) while the GPU works
    works = {b: Work(b, dev, heads, swa, extra) for b in batches}
    pool = cf.ThreadPoolExecutor(max_workers=2)
    oracles = {}
    for b in batches:
        for f in families:
            key = (b, oracle_key(f))
            if key not in oracles:
                oracles[key] = pool.submit(oracle_reference, oracle_inputs(works[b], f, ORACLE_ROWS))

    # 2. parallel compile
    faulted: dict = {}
    if timing and args.workers > 0:
        jobs = []
        for f in families:
            for v in variants[f]:
                jobs.append({"label": f"{f} {v[0]}", "family": f, "variants": [v], "batches": batches,
                             "heads": heads, "swa": swa, "extra": extra})
            if up is not None and f != "gfx942-fnuz":
                jobs.append({"label": f"upstream {f}", "family": f, "upstream": spec, "batches": batches,
                             "heads": heads, "swa": swa, "extra": extra})
        t0 = time.time()
        try:
            doc["precompile"] = precompile(jobs, args.workers, timeout=max(30.0, 0.55 * args.budget))
        except Exception as e:  # noqa: BLE001 - no workers: this process compiles on first use
            doc["precompile"] = [{"job": "precompile", "ok": False, "error": f"{type(e).__name__}: {e}"[:300]}]
        faulted.update(faulted_jobs(doc["precompile"]))
        bad = [r for r in doc["precompile"] if not r.get("ok")]
        note(f"precompile: {len(jobs)} jobs on {args.workers} workers in {time.time() - t0:.1f} s"
             + (f"; {len(bad)} failed (compiled here instead): " + "; ".join(f"{r['job']}: {r.get('error')}"
                                                                           for r in bad[:4]) if bad else ""))
        save()

    if not native:
        note("Triton interpreter: no compiler statistics (no compiled kernel), no timing; checks only")
    watch = StatsWatch(our_kernels()) if native else None
    up_watch, stats_seen = {}, {}

    # 3. per batch, family, variant
    for batch in batches:
        if time.time() > deadline - 5:
            note(f"batch {batch}: skipped, budget spent")
            continue
        work = works[batch]
        fig = figures(batch, heads, swa, extra)
        if timing and time.time() < deadline - 10:
            try:
                base = work.w.baseline_call()
                us, how = time_call(base, batch, args.rep_ms)
                doc["rows"].append({"batch": batch, "family": "torch", "impl": "torch gather + SDPA", "us": us,
                                    "timing": how, **fig})
                if batch > 1 and args.graph:
                    doc["rows"][-1]["graph_us"] = graph_us(base, args.rep_ms)
            except Exception as e:  # noqa: BLE001
                note(f"batch {batch}: torch baseline failed: {type(e).__name__}: {e}")
        for family in families:
            kf = KERNEL_FAMILY[family]
            try:
                ref, r = oracles[(batch, oracle_key(family))].result()
            except Exception as e:  # noqa: BLE001
                ref, r = None, 0
                note(f"batch {batch} {family}: oracle failed: {type(e).__name__}: {e}")
            default_out = None
            for name, fields in variants[family]:
                if time.time() > deadline - 3:
                    note(f"batch {batch} {family} {name}: skipped, budget spent")
                    continue
                row = {"batch": batch, "family": family, "impl": f"ours {name}", "variant": name, "fields": fields,
                       **fig}
                if f"{family} {name}" in faulted:
                    row["error"] = f"not run here: it faulted in its compile worker: {faulted[f'{family} {name}']}"
                    doc["rows"].append(row)
                    print(_row_line(row), flush=True)
                    continue
                try:
                    with variant_active(family, name, fields):
                        run, plan, out, ws = work.ours(family)
                        row["num_splits"] = plan.num_splits
                        poison(out, ws)
                        run()
                        if native:
                            torch.cuda.synchronize()
                            # a variant's kernels load on its first call; later batches reuse them
                            new = watch.new()
                            row["stats"] = new or stats_seen.get((family, name), {})
                            stats_seen.setdefault((family, name), new)
                        got = out.detach().clone()
                        if ref is not None:
                            row["oracle"] = check_against(ref, r, got, plan.num_splits)
                        if default_out is None:
                            default_out = got
                        else:
                            row["vs_default"] = diff(got, default_out)
                        if timing:
                            row["us"], row["timing"] = time_call(run, batch, args.rep_ms)
                            if batch > 1 and args.graph:
                                row["graph_us"] = graph_us(run, args.rep_ms)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                    row["trace"] = traceback.format_exc()[-1500:]
                doc["rows"].append(row)
                print(_row_line(row), flush=True)
                save()
            # our reduce alone (default variant's partials)
            if timing and kf != "generic" and time.time() < deadline - 3:
                try:
                    from impl.decode import decode_reduce

                    run, plan, out, ws = work.ours(family)
                    run()
                    us, how = time_call(lambda: decode_reduce(ws, attn_sink=work.w.sink, adaptive=plan.adaptive,
                                                              out=out), batch, args.rep_ms)
                    doc["rows"].append({"batch": batch, "family": family, "impl": "ours reduce", "us": us,
                                        "timing": how, "num_splits": plan.num_splits,
                                        "stats": watch.new()})
                    print(_row_line(doc["rows"][-1]), flush=True)
                except Exception as e:  # noqa: BLE001
                    note(f"batch {batch} {family}: reduce failed: {type(e).__name__}: {e}")
            # upstream
            if up is not None and family != "gfx942-fnuz" and time.time() < deadline - 3:
                row = {"batch": batch, "family": family, "impl": "upstream", **fig}
                if f"upstream {family}" in faulted:
                    row["error"] = f"not run here: it faulted in its compile worker: {faulted[f'upstream {family}']}"
                    doc["rows"].append(row)
                    print(_row_line(row), flush=True)
                    continue
                try:
                    if family not in up_watch and native:
                        up_watch[family] = StatsWatch(up.kernels(family))
                    row["num_splits"] = up.plan(work, family).num_splits
                    run, out = up.call(work, family)
                    out.view(torch.int16).fill_(-1)
                    run()
                    if native:
                        torch.cuda.synchronize()
                        row["stats"] = up_watch[family].new()
                    got = out.detach().clone()
                    if ref is not None:
                        row["oracle"] = check_against(ref, r, got, row["num_splits"])
                    if default_out is not None:
                        row["vs_default"] = diff(got, default_out)
                    if timing:
                        row["us"], row["timing"] = time_call(run, batch, args.rep_ms)
                        if batch > 1 and args.graph:
                            row["graph_us"] = graph_us(run, args.rep_ms)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {e}"[:500]
                    row["trace"] = traceback.format_exc()[-1500:]
                doc["rows"].append(row)
                print(_row_line(row), flush=True)
                save()
        if fm_mod is not None and time.time() < deadline - 3:
            row = flashmla_row(fm_col, fm_mod, work, batch, fig, oracles.get((batch, "ocp/ocp")), timing, args,
                               doc.get("ceilings"))
            doc["rows"].append(row)
            print(_row_line(row), flush=True)
            save()
    if fm_mod is not None:
        from contracts.subjects import flashmla as fm

        doc["flashmla_conversions"] = [{"id": k, "why": v} for k, v in sorted(fm.CONVERSIONS.items())]
    if up is not None:
        with contextlib.suppress(Exception):
            doc["upstream_rewrites"] = up.rewrites()
            print("upstream rewrites (named, by its loader): "
                  + (", ".join(sorted({r["id"] for r in doc["upstream_rewrites"]})) or "none"))
    pool.shutdown(wait=False, cancel_futures=True)
    save()
    print()
    print(summary_table(doc))
    print(f"\ndecode_variants: {len(doc['rows'])} rows in {time.time() - t_start:.0f} s; JSON in {json_path}")
    fails = [r for r in doc["rows"] if r.get("error") or (r.get("oracle") and not r["oracle"]["ok"])]
    fp8_bad = [r for r in doc["fp8"] if not r["exact"]]
    return 1 if fails or fp8_bad else 0


def _stats_text(st) -> str:
    from contracts.cli import bench

    return bench.format_stats({k.split()[-1]: v for k, v in (st or {}).items()})


def _row_line(r) -> str:
    us = f"{r['us']:9.1f}" if r.get("us") is not None else f"{'-':>9}"
    if r.get("graph_us") is not None:
        us += f" (graph {r['graph_us']:.1f})"
    chk = ""
    if r.get("oracle"):
        o = r["oracle"]
        wr = o.get("worst_err_over_tol")
        chk = ("ok" if o["ok"] else "FAIL") + (f" {wr:.2f}" if wr is not None else "")
    vd = r.get("vs_default")
    same = "" if not vd else ("=def" if vd["bit_identical"] else f"d{vd['max_abs_diff']:.1e}")
    err = f" ERROR {r['error'][:120]}" if r.get("error") else ""
    s = r.get("num_splits")
    return (f"{r['batch']:>4} {r['family']:<12} {r['impl']:<36} S={s if s is not None else '-':<3} {us} us "
            f"{chk:<10} {same:<9} {_stats_text(r.get('stats'))}{err}")


def _graph_us(r):
    """A row's CUDA-graph median in us: ``graph_us``, or ``us`` where do_bench_cudagraph gave it; else None."""
    if r.get("graph_us") is not None:
        return r["graph_us"]
    return r.get("us") if r.get("timing") == "do_bench_cudagraph" else None


def _clock(*rs) -> str:
    """"graph" where every row given (None: no row) has a CUDA-graph median, else "events" (do_bench)."""
    present = [r for r in rs if r is not None]
    return "graph" if present and all(_graph_us(r) is not None for r in present) else "events"


def flashmla_lines(rows) -> list[str]:
    """Per batch with a timed FlashMLA row: its time, GB/s, TFLOP/s and fractions of the ceilings, beside our
    fastest correct build (any family and variant) on the same clock, and ours over FlashMLA's time."""
    out = []
    for fm in (r for r in rows if r["family"] == "flashmla" and r.get("us") and not r.get("error")):
        ours = [r for r in rows if r["batch"] == fm["batch"] and r["impl"].startswith("ours ")
                and r["impl"] != "ours reduce" and r.get("us") and not r.get("error")
                and r.get("oracle", {}).get("ok", True)]
        clock = _clock(fm, *ours)
        key = _graph_us if clock == "graph" else (lambda r: r["us"])
        best = min(ours, key=key) if ours else None
        pct = (lambda x: f"{100 * x:.1f}%" if x is not None else "-")
        ok = "ok" if fm.get("oracle", {}).get("ok") else "ORACLE FAIL"
        line = (f"{fm['batch']:>5} flashmla     {key(fm):9.1f} us ({clock}, oracle {ok}): "
                f"{fm.get('gb_per_s', 0):.0f} GB/s = {pct(fm.get('fraction_of_copy_ceiling'))} of copy, "
                f"{fm.get('tflop_per_s', 0):.1f} TFLOP/s = {pct(fm.get('fraction_of_matmul_ceiling'))} of bf16 mma")
        if best is not None:
            line += (f"; our best {best['family']} {best.get('variant')} {key(best):.1f} us = "
                     f"{key(best) / key(fm):.2f}x FlashMLA's time")
        out.append(line)
    return out


def summary_table(doc) -> str:
    """Per batch and family: upstream, our default, our fastest correct variant, ratios; then torch.

    Each line's times are CUDA-graph medians where all of its rows have one (batch 1's time already is one;
    batches above 1 carry ``graph_us`` unless run with --no-graph), else do_bench medians: one clock per line,
    named in its last column. The graph replay keeps host work out, so an adapter whose Python outlasts its
    kernels (upstream's at batch 64 on the H200: 1.2-1.5 ms by events, 190-520 us replayed) is not charged for it."""
    rows = doc["rows"]
    lines = [f"{'batch':>5} {'family':<12} {'upstream us':>11} {'default us':>10} {'best variant':<32} "
             f"{'best us':>9} {'def/up':>7} {'best/up':>7} {'torch us':>9}  clock"]
    torch_marked = False
    for b in sorted({r["batch"] for r in rows}):
        torch_row = next((r for r in rows if r["batch"] == b and r["family"] == "torch" and r.get("us")), None)
        for f in VARIANTS:
            rs = [r for r in rows if r["batch"] == b and r["family"] == f and r.get("us")]
            if not rs:
                continue
            upr = next((r for r in rs if r["impl"] == "upstream"), None)
            ours = [r for r in rs if r["impl"].startswith("ours ") and r["impl"] != "ours reduce"
                    and not r.get("error") and r.get("oracle", {}).get("ok", True)]
            dft = next((r for r in ours if r.get("variant") == "default"), None)
            # one clock for the line: graph where every row on it (and every candidate for best) has one
            clock = _clock(upr, *ours)
            key = _graph_us if clock == "graph" else (lambda r: r["us"])
            best = min(ours, key=key) if ours else None
            up_us, d_us, b_us = (key(r) if r is not None else None for r in (upr, dft, best))
            # torch on the line's clock; by events (marked) where the line is by graph and torch has none
            t_graph = _graph_us(torch_row) if torch_row is not None and clock == "graph" else None
            t_us = t_graph if t_graph is not None else (torch_row["us"] if torch_row is not None else None)
            t_mark = "*" if torch_row is not None and clock == "graph" and t_graph is None else " "
            torch_marked = torch_marked or t_mark == "*"

            def fmt(x, w=10, p=1):
                return f"{x:>{w}.{p}f}" if x is not None else f"{'-':>{w}}"
            lines.append(f"{b:>5} {f:<12} {fmt(up_us, 11)} {fmt(d_us)} "
                         f"{(best['variant'] if best else '-'):<32} {fmt(b_us, 9)} "
                         f"{fmt(d_us / up_us if d_us and up_us else None, 7, 2)} "
                         f"{fmt(b_us / up_us if b_us and up_us else None, 7, 2)} {fmt(t_us, 9)}{t_mark} {clock}")
    if torch_marked:
        lines.append("* torch us by events: that row has no CUDA-graph median")
    lines.extend(flashmla_lines(rows))
    seen = {}
    for r in rows:
        if r.get("stats") and r["impl"] != "ours reduce":
            seen.setdefault((r["family"], r["impl"]), r["stats"])
    if seen:
        lines.append("compiler statistics (registers / spills / shared KiB per kernel):")
        for (f, impl_name), st in seen.items():
            lines.append(f"  {f:<12} {impl_name:<36} {_stats_text(st)}")
    else:
        lines.append("compiler statistics: none (Triton interpreter, or no kernel compiled here)")
    bad = [r for r in rows if r.get("error") or (r.get("oracle") and not r["oracle"]["ok"])]
    for r in bad[:8]:
        lines.append(f"  FAILED {r['batch']} {r['family']} {r['impl']}: "
                     f"{r.get('error') or '; '.join(r['oracle']['mismatches'])}"[:200])
    fp8 = doc.get("fp8") or []
    lines.append("fp8: " + ", ".join(f"{r['flavour']}/{r['path']}{'*' if r['chosen'] else ''} "
                                     f"{'exact' if r['exact'] else 'NOT EXACT'}" for r in fp8)
                 + " (* = the path kernels take here)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
