"""Metamorphic decode contract: paths that must give the same answer on the same input agree with each other as well
as with the oracle.

``decode-paths-agree`` runs one decode input (``fuzz.metamorphic``: tails of every split and tile length, per-split
maxima far apart) through every path of the target: 1 split and S splits of its split-K family, on gfx950 the
adaptive plan next to the fixed one, on gfx942 the generic single kernel under gfx942's own fp8 flavours (a target
that differs from gfx942 only in its decode family: the generic kernel then reads the fnuz SWA cache, which the
``generic`` target, all OCP, never does; gfx950's flavours are generic's own, checked by ``decode-oracle-agreement``).

The other equivalences of issue 13 item 5 are checked elsewhere: single-pass vs two-stage compressor by
``writer-oracle-exact`` (contracts.cache_writers: the two-stage output against the single-pass one), graph replay vs
eager by ``graph-replay-agreement`` (contracts.graph_capture: every replay against an eager decode with the same
frozen plan).
"""
from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from contracts.core import AMD_TARGETS, Violation, contract, fmt, record_note
from contracts.decode import (attention_violations, decode_tolerance, oracle_violations,
                              reading_rule_violation, zeroed_nan_rows)
from contracts.subjects import SubjectUnavailable, bound, current
from fuzz import metamorphic as fm
from impl import splits as impl_splits
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import decode as ref_decode

_SKIP = "the metamorphic paths (1 vs S splits, adaptive, split-K vs generic) exist on split-K targets only"


def generic_twin(target: Target) -> Target:
    """``target`` with the generic single-kernel decode family and no split selector, its fp8 flavours kept."""
    return dataclasses.replace(target, decode_family="generic", split_selector=None, split_cap=None,
                               adaptive_splits_in_capture=False, may_trust_extra_nan_free=False)


#: adaptive splits exist only above this split count: the host turns them on only when S > 4 (SPEC section 2,
#: "host side"), and a row's active count is then 4, ONE_WAVE or S, never above S. Below it there is no adaptive
#: plan to compare (a kernel may rely on S > 4: upstream's takes 4 active splits whatever S is)
ADAPTIVE_MIN_SPLITS = 4


def decode_paths(case: fm.MetamorphicCase, target: Target, dec) -> list[tuple[str, Target, object]]:
    """(label, target, plan) of every path of ``case`` on ``target`` (the adaptive one only for S > 4)."""
    hb = impl_splits.head_blocks(case.decode.heads)
    fam, s = target.decode_family, case.num_splits
    paths = [("1 split", target, dec.DecodePlan(fam, 1, hb)), (f"{s} splits", target, dec.DecodePlan(fam, s, hb))]
    if has_adaptive_path(case, target):
        paths.append((_adaptive_label(case), target,
                      dec.DecodePlan(fam, s, hb, True, case.one_wave)))
    if target.decode_family == "gfx942":  # the generic twin under fnuz; gfx950 shares generic's flavours
        paths.append((f"generic kernel ({target.main_cache_fp8}/{target.extra_cache_fp8})", generic_twin(target),
                      dec.DecodePlan("generic", 1, hb)))
    return paths


def has_adaptive_path(case: fm.MetamorphicCase, target: Target) -> bool:
    """Whether ``case`` has an adaptive path on ``target``: adaptive splits allowed there, and S > 4."""
    return target.adaptive_splits_in_capture and case.num_splits > ADAPTIVE_MIN_SPLITS


def _adaptive_label(case: fm.MetamorphicCase) -> str:
    return f"{case.num_splits} adaptive splits (one_wave {case.one_wave})"


def _run(dec, inp, case: fm.MetamorphicCase, target: Target, plan, partials: dict | None = None,
         key=None) -> torch.Tensor:
    """The path's output on the CPU; with ``partials``, its workspace (on the CPU) is kept as ``partials[key]``."""
    b, h = case.decode.batch, case.decode.heads
    dev = kernel_device()
    ws = dec.DecodeWorkspace.allocate(b, plan.num_splits, h, dev, fill=math.nan)
    out = torch.full((b, h, 512), math.nan, dtype=torch.bfloat16, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        dec.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache,
                               inp.extra_indices, inp.extra_indptr, attn_sink=inp.attn_sink,
                               softmax_scale=inp.softmax_scale, target=target, cu_count=case.decode.cu_count,
                               plan=plan, workspace=ws, out=out)
    if partials is not None:
        partials[key] = tuple(x.cpu().clone() for x in (ws.part_m, ws.part_l, ws.part_acc))
    return out.cpu().clone()


def _examples(target: Target) -> list[fm.MetamorphicCase]:
    from fuzz.decode import AdaptiveSplits, DecodeCase

    is_950 = target.decode_family == "gfx950"
    # gfx950: S = 5 (adaptive splits need S > 4); both rows are then active on A = 4 of the 5 splits
    s = fm.MAX_SPLITS if is_950 else 3
    dec = DecodeCase(seed=11, batch=2, heads=1, main_bs=5, extra_bs=2, main_lens=(7, 2), extra_lens=(33, 0),
                     invalid_rate=0.15, indptr_offset=3, tail_junk=1, scale=0.3, sink="ordinary", poison="none",
                     padded=True, q_transposed=False, cu_count=2, int32_extremes=False,
                     num_splits=s if is_950 else None, adaptive=AdaptiveSplits(2) if is_950 else None)
    return [fm.MetamorphicCase(decode=dec, num_splits=s, one_wave=2)]


@contract("decode-paths-agree", targets=AMD_TARGETS, cases=fm.metamorphic_cases, examples=_examples,
          skip_reason=_SKIP, min_cases=1, max_cases=1, case_type=fm.MetamorphicCase, numeric=True)
def decode_paths_agree(case: fm.MetamorphicCase, target: Target) -> list[Violation]:
    """On one input, every decode path of the target agrees with the float64 oracle and with every other path: 1
    split vs S splits, on gfx950 adaptive vs fixed S splits, and the split-K family vs the generic single kernel
    under the target's own fp8 flavours (gfx942: fnuz SWA cache). Agreement between two paths: NaN and inf lanes
    exactly the same, finite lanes within the sum of both paths' oracle tolerances (oracles.compare, each path's
    split count); each path against the oracle as in ``decode-oracle-agreement``. A pairwise violation names both
    paths. On gfx950, where S > 4 (the only plans with adaptive splits: SPEC section 2's host rule), each row of
    the adaptive path equals bit for bit the same row of the fixed plan with the row's active split count (4,
    ONE_WAVE or S by seed 004's rule), its output and its active splits' fp32 partials: the oracle's tolerance
    cannot see a reduce that rounds differently or a slicing by another count, this can. Where the oracle's row
    is NaN, two paths must agree exactly, and a path that writes that row as zeros says so once (as
    ``decode-oracle-agreement`` does). A path the subject does not have (upstream has no generic
    kernel under gfx942's flavours) is left out and named in the row's reason; the others are still compared.
    Inputs: tails of every split and tile length, per-split maxima orders of magnitude apart (fuzz.metamorphic).
    Layout invariance (issue 30, ``view_layout`` "views"): the S-split path runs on every input re-laid as a view
    of a larger poisoned buffer (q rows padded, cache blocks padded one block into a pool, index, indptr and sink
    slices), the values the same, and must agree with the packed paths as any path does (bit for bit with the
    adaptive path where a row is active on all S splits).
    Single-pass vs two-stage compressor and graph replay vs eager are checked by ``writer-oracle-exact`` and
    ``graph-replay-agreement``. Source: issue 13 item 5; SPEC section 2 (split-K partials and their reduce;
    adaptive splits' host rule)."""
    dec = bound(target).decode
    inp = fm.build_metamorphic_inputs(case, target)
    def oracle(scrub=True, scale_255="inf"):  # SPEC 2's readers, or another rule (contracts.decode.READING_RULES)
        return ref_decode.ref_sparse_attn_decode(
            inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache, inp.extra_indices,
            inp.extra_indptr, attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale,
            main_flavour=target.main_cache_fp8, extra_flavour=target.extra_cache_fp8, scrub_extra=scrub,
            scrub_main=scrub, scale_255=scale_255)

    ref = oracle()
    poisoned = case.decode.poison != "none"

    outs = []
    v: list[Violation] = []
    missing = None
    partials: dict = {}
    views = fm.relaid_inputs(inp) if case.view_layout == "views" else None
    for label, t, plan in decode_paths(case, target, dec):
        on_views = views is not None and label == f"{case.num_splits} splits"
        try:
            got = _run(dec, views if on_views else inp, case, t, plan, partials, label)
        except SubjectUnavailable as exc:  # a path the subject does not have: no verdict about it
            record_note(f"path {label!r} not run: {exc.reason(current().label)}")
            missing = exc
            continue
        shown = label + (VIEWS_SUFFIX if on_views else "")
        judged = got.clone()  # a row zeroed where the oracle is NaN: named once, then left out of its lanes
        zeroed = zeroed_nan_rows(nan_row_zeroed(shown), judged, ref.out)
        found = oracle_violations(f"decode path {shown} vs float64 oracle", judged, ref, plan.num_splits)
        # a path reading poisoned cache bytes by another rule than the readers' is named as such
        rule = (reading_rule_violation(oracle, got, plan.num_splits, f"decode path {shown}", ref)
                if found and poisoned else [])
        v += rule or (zeroed + found)
        outs.append((label, got, decode_tolerance(ref, plan.num_splits), shown))
    for i, (_, a, ta, la) in enumerate(outs):
        for _, b, tb, lb in outs[i + 1:]:
            # where the oracle is NaN its tolerance is too: two paths must then agree exactly
            tol = ta + tb
            tol = torch.where(torch.isnan(tol), torch.zeros_like(tol), tol)
            v += attention_violations(f"decode path {lb} vs path {la}", b.clone(), a.to(torch.float64), tol)
    if len(outs) < 2 and missing is not None:
        raise missing  # nothing left to compare
    if any(lbl == _adaptive_label(case) for lbl, _, _, _ in outs):
        v += _adaptive_bitwise(case, target, dec, inp, {lbl: o for lbl, o, _, _ in outs}, partials)
    return v


#: the S-split path's label suffix where it ran on the inputs re-laid as views (fuzz.metamorphic.relaid_inputs)
VIEWS_SUFFIX = " (inputs as views of larger buffers)"


ADAPTIVE_BITS = "adaptive splits differ bit for bit from the fixed plan with the row's active split count"
ADAPTIVE_PARTIALS = ("adaptive splits' partials differ bit for bit from those of the fixed plan with the row's "
                     "active split count")


def nan_row_zeroed(label: str) -> str:
    """The violation of a path that gives 0 in every lane of a row the oracle gives as NaN (a finding's signature
    matches it: ``^decode path .+: a row the oracle gives as NaN is all zeros$``)."""
    return f"decode path {label}: a row the oracle gives as NaN is all zeros"


def active_splits(len_main: int, len_extra: int, num_splits: int, one_wave: int, iter_k: int) -> int:
    """A row's active split count under adaptive splits (seed 004): 4 if the row needs at most 3 iterations of
    ``iter_k`` entries per split with 4 splits, else ``one_wave`` if it does with that many, else S; at most S."""
    def iters(s: int) -> int:
        return -(-(-(-len_main // s)) // iter_k) + -(-(-(-len_extra // s)) // iter_k)

    a = 4 if iters(4) <= 3 else (one_wave if iters(one_wave) <= 3 else num_splits)
    return min(a, num_splits)


def _adaptive_bitwise(case: fm.MetamorphicCase, target: Target, dec, inp, outs: dict,
                      partials: dict) -> list[Violation]:
    """Each row of the adaptive path equals, bit for bit, the same row of the fixed plan whose split count is the
    row's active count A: the same slices, the same partials in the same order, and the reduce adds exact zeros for
    the skipped splits (NaN equals NaN). The fp32 partials of its A active splits (m, l, acc) are compared too: a
    bf16 output hides most of a slicing that differs (4 vs 5 splits round alike in most lanes), they do not."""
    label = _adaptive_label(case)
    s, hb = case.num_splits, impl_splits.head_blocks(case.decode.heads)
    ad = outs[_adaptive_label(case)]
    mp = inp.main_indptr.cpu().tolist()
    ep = inp.extra_indptr.cpu().tolist() if inp.extra_indptr is not None else [0] * len(mp)
    fixed = {1: outs["1 split"], s: outs[f"{s} splits"]}
    fixed_parts = {1: partials["1 split"], s: partials[f"{s} splits"]}
    v: list[Violation] = []
    for r in range(case.decode.batch):
        a = active_splits(mp[r + 1] - mp[r], ep[r + 1] - ep[r], s, case.one_wave, impl_splits.BLOCK_K)
        if a not in fixed:
            fixed[a] = _run(dec, inp, case, target, dec.DecodePlan(target.decode_family, a, hb), fixed_parts, a)
        for name, w_all, g_all in zip(("part_m", "part_l", "part_acc"), fixed_parts[a], partials[label]):
            w, g = w_all[r, :a], g_all[r, :a]
            bad = (w.view(torch.int32) != g.view(torch.int32)) & ~(torch.isnan(w) & torch.isnan(g))
            if bool(bad.any()):
                ix = bad.nonzero()[0].tolist()
                v.append(Violation(ADAPTIVE_PARTIALS, f"{name}[{r}, {', '.join(map(str, ix))}] (A={a} of S={s}; "
                                                      f"{int(bad.sum())} values differ)",
                                   fmt(float(w[tuple(ix)])), fmt(float(g[tuple(ix)]))))
                break
        want, got = fixed[a][r], ad[r]
        differ = (want.view(torch.int16) != got.view(torch.int16)) & ~(torch.isnan(want) & torch.isnan(got))
        if bool(differ.any()):
            h, d = differ.nonzero()[0].tolist()
            v.append(Violation(ADAPTIVE_BITS, f"out[{r}, {h}, {d}] (A={a} of S={s}; {int(differ.sum())} lanes "
                                              "differ)", fmt(float(want[h, d])), fmt(float(got[h, d]))))
    return v
