"""Sparse decode contracts: the kernels agree with the float64 oracle on every target, and the split selectors stay
within their caps and equal an independent re-derivation of SPEC's formulas."""
from __future__ import annotations

import math
import warnings

import torch
from hypothesis import strategies as st

from contracts.core import AMD_TARGETS, ALL_TARGETS, Violation, contract, fmt, record_margin
from fuzz import decode as fz
from impl import decode as dec
from impl import splits as impl_splits
from impl.runtime import kernel_device, triton_mode
from impl.targets import Target
from oracles import compare as cmp
from oracles import decode as ref_decode
from oracles import splits as ref_splits

# --- decode-oracle-agreement -------------------------------------------------------------------------------------


def _decode_examples(target: Target) -> list[fz.DecodeCase]:
    boundary = (0, 1, 31, 32, 33, 63, 64, 65)  # the gfx950 tile boundaries of upstream's tests
    base = fz.DecodeCase(seed=7, batch=len(boundary), heads=1, main_bs=61, extra_bs=5, main_lens=(3,) * len(boundary),
                         extra_lens=boundary, invalid_rate=0.15, indptr_offset=0, tail_junk=1, scale=0.11,
                         sink="mixed", poison="nan", padded=True, q_transposed=False, cu_count=2,
                         num_splits=1 if target.split_selector else None, adaptive=None, trust=False,
                         int32_extremes=True)
    out = [base,
           base.replace(seed=8, batch=3, heads=16, main_lens=(0, 5, 0), extra_lens=(0, 0, 9), sink="-inf",
                        invalid_rate=0.4, num_splits=None)]
    if target.decode_family == "gfx950":
        out.append(base.replace(seed=9, batch=2, heads=3, main_lens=(9, 40), extra_lens=(33, 1), num_splits=6,
                                adaptive=fz.AdaptiveSplits(one_wave=3), sink="large"))
    return out


def _plan_for(case: fz.DecodeCase, target: Target):
    """The plan a case pins (None: the target's own plan for the case's sizes and CU count)."""
    if case.num_splits is None:
        return None
    hb = impl_splits.head_blocks(case.heads)
    if case.adaptive is not None:
        return dec.DecodePlan(target.decode_family, case.num_splits, hb, True, case.adaptive.one_wave)
    return dec.DecodePlan(target.decode_family, case.num_splits, hb)


@contract("decode-oracle-agreement", targets=ALL_TARGETS, cases=lambda t: fz.decode_cases(t),
          examples=_decode_examples, min_cases=5, max_cases=14, case_type=fz.DecodeCase, numeric=True)
def decode_oracle_agreement(case: fz.DecodeCase, target: Target) -> list[Violation]:
    """The sparse decode equals the float64 oracle within the derived error model, NaN/inf masks exactly.

    One softmax over a row's valid SWA tokens, valid extra tokens and the sink (a zero-value logit); V = K; an
    empty row gives 0; invalid entries (-1, INT32_MIN/MAX, slots at or past the end of the cache, entries outside
    indptr) are masked and never read: every unreferenced slot (and the pool past each cache view) is poisoned so
    that any stray read shows up. The main cache is always scrubbed (NaN -> 0 after dequantisation), the extra cache
    unless the trust gate is open; inf is never scrubbed. Partials and the output are NaN-poisoned before the run;
    the kernel family, split selector and fp8 flavours come from the target; adaptive splits (gfx950) skip the
    splits they leave unwritten. The cache bytes are not modified. Tolerance: oracles.compare (relative to
    sum_j p_j |v_j|, no fraction of lanes may fail); the margin is the worst error-to-tolerance ratio. Sources:
    SPEC section 2, seed 004 (gfx950 partial, adaptive splits, trust gate), upstream tests' boundaries (extra_len
    0/1/31/32/33/63/64/65).
    """
    inp = fz.build_decode_inputs(case, target)
    b, h = case.batch, case.heads
    plan = _plan_for(case, target)
    if plan is None:
        plan = dec.plan_decode(target, b, h, inp.main_indices.numel(),
                               inp.extra_indices.numel() if inp.extra_indices is not None else 0,
                               cu_count=case.cu_count)
    dev = kernel_device()
    ws = dec.DecodeWorkspace.allocate(b, plan.num_splits, h, dev, fill=math.nan)
    out = torch.full((b, h, 512), math.nan, dtype=torch.bfloat16, device=dev)
    pools_before = [p.clone() for p in inp.pools if p is not None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on 0 * inf by design
        dec.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache,
                               inp.extra_indices, inp.extra_indptr, attn_sink=inp.attn_sink,
                               softmax_scale=inp.softmax_scale, target=target, trust_extra_nan_free=case.trust,
                               plan=plan, workspace=ws, out=out)
    got = out.cpu().clone()
    violations: list[Violation] = []
    for i, (before, p) in enumerate(zip(pools_before, [p for p in inp.pools if p is not None])):
        if not torch.equal(before, p):
            violations.append(Violation("decode modified a cache pool", f"pool {i}", "unchanged bytes",
                                        f"{int((before != p).sum())} bytes changed"))
    ref = ref_decode.ref_sparse_attn_decode(
        inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache, inp.extra_indices,
        inp.extra_indptr, attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale,
        main_flavour=target.main_cache_fp8, extra_flavour=target.extra_cache_fp8, scrub_extra=not case.trust)
    model = cmp.AttentionErrorModel.for_mode(triton_mode())
    tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                  plan.num_splits, 16, model)
    res = cmp.attention_comparison(got, ref.out, tol)
    if res.worst_ratio is not None:
        record_margin(res.worst_ratio)
    label = (f"decode output vs float64 oracle ({target.decode_family} family, S={plan.num_splits}, "
             f"adaptive={plan.adaptive})")
    violations += [Violation(f"{label}: {m.detail}", m.where, m.expected, m.got) for m in res.mismatches]
    return violations


# --- split-bounds ------------------------------------------------------------------------------------------------

def _split_cases(target: Target):
    batch = st.one_of(st.integers(1, 4), st.integers(1, 80), st.integers(1, 2048))
    return st.fixed_dictionaries({
        "batch": batch,
        "heads": st.sampled_from([1, 3, 16, 17, 32, 64, 128]),
        "avg_main": st.one_of(st.just(0), st.sampled_from([64, 128, 256]), st.integers(0, 512)),
        "avg_extra": st.one_of(st.just(0), st.sampled_from([32, 512, 2048, 8192]), st.integers(0, 20000)),
        "ragged_slack": st.integers(0, 63),
        "cu_count": st.one_of(st.sampled_from([target.cu_count, 256, 304, 80, 38]), st.integers(1, 512)),
    })


def _split_examples(target: Target) -> list[dict]:
    def c(b, h, a, e, cu=256):
        return {"batch": b, "heads": h, "avg_main": a, "avg_extra": e, "ragged_slack": 0, "cu_count": cu}

    # SPEC's checkpoints at CU = 256 (from upstream's tests); checked against their stated values too
    return [c(1, 1, 128, 8192), c(17, 1, 128, 32), c(512, 1, 128, 7812), c(256, 1, 128, 8192), c(20, 16, 128, 300),
            c(40, 1, 100, 5000, 38)]


_CHECKPOINTS = {("gfx950", 1, 1, 128, 8192): 32, ("gfx950", 17, 1, 128, 32): 4, ("gfx950", 512, 1, 128, 7812): 1,
                ("gfx942", 1, 1, 128, 8192): 16, ("gfx942", 256, 1, 128, 8192): 1}

_REF = {"gfx942": ref_splits.ref_num_splits_gfx942, "gfx950": ref_splits.ref_num_splits_gfx950}


@contract("split-bounds", targets=AMD_TARGETS, cases=_split_cases, examples=_split_examples, min_cases=10,
          skip_reason="generic has no split selector (single-kernel fallback)")
def split_bounds(case, target: Target) -> list[Violation]:
    """Every split count the target's selector returns lies in [1, split_cap] (16 on gfx942, 32 on gfx950) and
    equals an independent re-derivation of SPEC's formula, for any sizes and CU counts; the selector sees only
    sizes (numel), never indptr values. On gfx950 the adaptive host plan (on iff base >= 16 and S > 4; ONE_WAVE in
    [1, S]) matches too. Source: SPEC section 2 "Split count"; seed 004's review (the shared gfx942 selector must
    keep its 16-split cap while gfx950 gets 32).
    """
    b, h, cu = int(case["batch"]), int(case["heads"]), int(case["cu_count"])
    main_numel = b * int(case["avg_main"]) + (int(case["ragged_slack"]) if case["avg_main"] else 0)
    extra_numel = b * int(case["avg_extra"])
    sel = target.split_selector
    got = impl_splits.select_num_splits(sel, b, h, main_numel, extra_numel, cu)
    want = _REF[sel](b, h, main_numel, extra_numel, cu)
    where = f"{sel}(batch={b}, heads={h}, main_numel={main_numel}, extra_numel={extra_numel}, cu={cu})"
    out: list[Violation] = []
    if not 1 <= got <= target.split_cap:
        out.append(Violation("split count outside [1, cap]", where, f"1..{target.split_cap}", fmt(got)))
    if got != want:
        out.append(Violation("split count differs from the re-derived formula", where, fmt(want), fmt(got)))
    key = (target.name, b, h, int(case["avg_main"]), int(case["avg_extra"]))
    if cu == 256 and key in _CHECKPOINTS and got != _CHECKPOINTS[key]:
        out.append(Violation("SPEC checkpoint", where, fmt(_CHECKPOINTS[key]), fmt(got)))
    plan = dec.plan_decode(target, b, h, main_numel, extra_numel, cu_count=cu,
                           adaptive_splits=target.adaptive_splits_in_capture)
    if plan.num_splits != got:
        out.append(Violation("plan_decode does not use the target's selector", where, fmt(got), fmt(plan.num_splits)))
    if target.adaptive_splits_in_capture:
        en, ow = ref_splits.ref_adaptive_host(got, b, h, cu)
        if plan.adaptive != en or (en and plan.one_wave != ow):
            out.append(Violation("adaptive host plan differs", where, f"enabled={en}, one_wave={ow}",
                                 f"enabled={plan.adaptive}, one_wave={plan.one_wave}"))
    return out
