"""FlashMLA's column in the decode benchmarks: its SM90/SM100 sparse decode on the same inputs as ours, checked
against our float64 oracle, timed by the caller (``smv bench``: tests/benchmarks/bench_decode.py; and
benchmarks/decode_variants.py).

    SMV_FLASHMLA_PATH=.fmla python3 benchmarks/flashmla.py [--batch 2]

The loading, the conversion of our inputs to FlashMLA's and the call live in :mod:`contracts.subjects.flashmla`
(the ``flashmla`` subject uses the same code); this file builds the benchmark's call on a
``contracts.cli.bench.DecodeWorkload`` and checks its output. Our DSv4 cache bytes are FlashMLA's V4 layout, so
the caches are passed as views of the same bytes (the subject module copies only what FlashMLA would refuse, and
says so). Run as a script it prints whether the column can run here and, where it can, one checked call.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

#: query rows the float64 oracle checks per batch (all heads, both segments), as decode_variants checks ours
ORACLE_ROWS = 4


def availability():
    """(flash_mla module, None) where the column can run, else (None, the one-line reason it is skipped)."""
    from contracts.subjects import flashmla as fm

    why = fm.unavailable_reason()
    if why:
        return None, why
    return fm.load(), None


def label() -> str:
    """``flashmla==VERSION`` (the subject's label)."""
    from contracts.subjects import flashmla as fm

    return f"flashmla=={fm.package_info()[0] or 'not-installed'}"


def arch_family() -> str:
    """The GPU's FlashMLA kernel family: ``sm90`` or ``sm100`` (``sm?`` without CUDA)."""
    import torch

    if not torch.cuda.is_available():
        return "sm?"
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def workload_call(mod, w):
    """(run, plan): FlashMLA's decode of ``w`` (a ``DecodeWorkload``: its OCP main cache, extra cache, ragged
    indices, sink); ``run()`` returns the [b, h, 512] output (FlashMLA's own tensor at 64 or 128 heads: no copy is
    timed). The inputs are converted once, outside the timing, and FlashMLA's scheduler state is made by a first
    call and kept, as its wrapper allows for repeated calls with the same shapes and lengths (a CUDA graph replays
    it)."""
    from contracts.subjects import flashmla as fm

    args = (w.q, w.main["ocp"], w.main_idx, w.main_ptr, w.extra_cache, w.extra_idx, w.extra_ptr)
    fm.decode(*args, attn_sink=w.sink, fm=mod)  # learns any conversion FlashMLA asks for
    prepared = fm.prepare_decode(mod, *args, attn_sink=w.sink, block_size=fm.LEARNED["block_size"])
    fm.run_prepared(mod, prepared)  # the scheduler state, made once before any timing or capture

    def run():
        return fm.run_prepared(mod, prepared)

    per_row = max(w.batch, 1)
    plan = fm._plan_decode(None, w.batch, w.heads, w.main_idx.numel() // per_row, w.extra_idx.numel() // per_row)
    return run, plan


def oracle_check(w, out, num_splits: int, rows: int = ORACLE_ROWS) -> dict:
    """FlashMLA's output for the first ``rows`` query rows against the float64 oracle (OCP caches, the extra cache
    scrubbed as our API's default; the workload's caches hold no NaN code, so the scrub changes nothing), within the
    error model of :mod:`oracles.compare` for ``num_splits`` splits: {"ok", "worst_err_over_tol", "max_rel_err",
    "mismatches"}."""
    from impl.runtime import triton_mode
    from oracles import compare as cmp
    from oracles import decode as oracle_decode

    r = min(rows, w.batch)
    mp_, ep = w.main_ptr[:r + 1].cpu(), w.extra_ptr[:r + 1].cpu()
    ref = oracle_decode.ref_sparse_attn_decode(
        w.q[:r].cpu(), w.main["ocp"].cpu(), w.main_idx[:int(mp_[-1])].cpu(), mp_, w.extra_cache.cpu(),
        w.extra_idx[:int(ep[-1])].cpu(), ep, attn_sink=w.sink.cpu(), softmax_scale=w.q.shape[2] ** -0.5,
        main_flavour="ocp", extra_flavour="ocp", scrub_extra=True)
    tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                  num_splits, 16, cmp.AttentionErrorModel.for_mode(triton_mode()))
    got = out[:r].detach().cpu()
    comp = cmp.attention_comparison(got, ref.out, tol)
    g, e = got.double(), ref.out.double()
    fin = g.isfinite() & e.isfinite()
    denom = e.abs().amax().item() or 1.0
    rel = ((g - e).abs()[fin].max().item() / denom) if fin.any() else 0.0
    return {"ok": comp.ok, "worst_err_over_tol": comp.worst_ratio, "max_rel_err": rel, "rows": r,
            "mismatches": [m.detail + f" at {m.where}" for m in comp.mismatches[:3]]}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=2, help="batch of the checked call (64 heads, SWA 128 + 512 extra)")
    args = p.parse_args(argv)
    import impl  # noqa: F401 - configures the Triton mode before Triton is used

    mod, why = availability()
    if mod is None:
        print(f"flashmla column: skipped: {why}")
        return 0
    from contracts.cli import bench
    from contracts.subjects import flashmla as fm

    w = bench.DecodeWorkload(args.batch, "cuda")
    run, plan = workload_call(mod, w)
    chk = oracle_check(w, run(), plan.num_splits)
    print(f"flashmla column: {label()} on {arch_family()}: batch {args.batch}, oracle "
          f"{'ok' if chk['ok'] else 'FAIL'} (worst err/tol {chk['worst_err_over_tol']}, max rel err "
          f"{chk['max_rel_err']:.2e}){'; ' + '; '.join(chk['mismatches']) if chk['mismatches'] else ''}")
    if fm.CONVERSIONS:
        print("conversions: " + "; ".join(f"{k}: {v}" for k, v in sorted(fm.CONVERSIONS.items())))
    return 0 if chk["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
