"""Sparse decode contract: the kernels agree with the float64 oracle on every target (the split selectors' own
contract is in contracts.splits)."""
from __future__ import annotations

import math
import warnings

import torch

from contracts.core import ALL_TARGETS, Violation, contract, record_margin
from contracts.subjects import bound
from fuzz import decode as fz
from impl import splits as impl_splits
from impl.runtime import kernel_device, triton_mode
from impl.targets import Target
from oracles import compare as cmp
from oracles import decode as ref_decode

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


def _plan_for(case: fz.DecodeCase, target: Target, dec):
    """The plan a case pins (None: the target's own plan for the case's sizes and CU count); ``dec`` is the
    subject's decode family (its plan type is our API's)."""
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
    dec = bound(target).decode
    inp = fz.build_decode_inputs(case, target)
    b, h = case.batch, case.heads
    plan = _plan_for(case, target, dec)
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
    label = (f"decode output vs float64 oracle ({target.decode_family} family, S={plan.num_splits}, "
             f"adaptive={plan.adaptive})")
    return violations + oracle_violations(label, got, ref, plan.num_splits)


def oracle_violations(label: str, got: torch.Tensor, ref, num_splits: int) -> list[Violation]:
    """A decode output against the float64 oracle's result ``ref`` under the derived error model of
    :mod:`oracles.compare` for this Triton mode and split count; the worst error-to-tolerance ratio is recorded as
    the case's margin. Every contract that reads the decode's output (agreement, graph replay, int64 probes) uses
    this one comparison."""
    model = cmp.AttentionErrorModel.for_mode(triton_mode())
    tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                  num_splits, 16, model)
    return attention_violations(label, got, ref.out, tol)


def attention_violations(label: str, got: torch.Tensor, ref_out: torch.Tensor, tol: torch.Tensor) -> list[Violation]:
    """An attention output against its oracle within per-lane ``tol`` (:func:`oracles.compare.attention_comparison`):
    the mismatches as violations, and the worst error-to-tolerance ratio recorded as the case's margin."""
    res = cmp.attention_comparison(got, ref_out, tol)
    if res.worst_ratio is not None:
        record_margin(res.worst_ratio)
    return [Violation(f"{label}: {m.detail}", m.where, m.expected, m.got) for m in res.mismatches]
