"""Sparse decode contract: the kernels agree with the float64 oracle on every target (the split selectors' own
contract is in contracts.splits)."""
from __future__ import annotations

import contextlib
import math
import warnings
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from contracts.core import ALL_TARGETS, CONTRACTS, Violation, contract, fmt, record_margin
from contracts.subjects import SubjectUnavailable, bound, is_ours, ours
from fuzz import decode as fz
from fuzz import splits as fz_splits
from fuzz.cases import Case
from fuzz.splits import SplitCase
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

    Layouts (issue 30): every tensor input comes packed or as a strided, padded or offset view of a poisoned buffer
    (fuzz.decode's ``*_LAYOUTS``), the values the same, so the oracle's answer is the same: a layout the entry point
    accepts must give it. A layout it may refuse (strided indices/indptr or sink: fuzz.decode.MAY_REFUSE) is either
    computed the same or refused with a ValueError/TypeError naming the argument, the NaN-poisoned output buffer and
    workspace untouched; refusing any other layout is a violation. A mismatch of a case whose packed twin passes is
    reported as the layouts that alone make it differ (LAYOUT_DIFFERS). The absolute regimes (every live logit near
    -110, below fp32 exp's underflow; exact ties everywhere; q all signed zeros) meet every sink kind.
    """
    return _oracle_agreement(case, target)


def _oracle_agreement(case: fz.DecodeCase, target: Target) -> list[Violation]:
    """The check; a mismatch of a case laid out other than packed is re-run packed and, where the packed case
    passes, reported as the layouts that alone make it fail (:func:`layout_violations`)."""
    got = _oracle_agreement_once(case, target)
    if got and fz.non_packed(case) and not any(v.message.startswith("decode refused") for v in got):
        return layout_violations(case, target) or got
    return got


#: a decode that computes differently when an input is laid out other than packed (finding signatures match it)
LAYOUT_DIFFERS = "decode output with a non-packed layout differs from the same inputs packed"


def layout_violations(case: fz.DecodeCase, target: Target) -> list[Violation]:
    """One violation naming each non-packed layout that alone (the others packed) adds a violation the packed case
    does not have, with the first such one; where the packed case fails too, its own violations come first (a known
    defect of the packed inputs and a layout's defect are told apart). [] where no single layout adds one."""
    packed = _oracle_agreement_once(fz.packed_except(case, {}), target)
    seen = {(v.message, v.where) for v in packed}
    out = []
    for dim, value in fz.non_packed(case).items():
        alone = _oracle_agreement_once(fz.packed_except(case, {dim: value}), target)
        new = [v for v in alone if (v.message, v.where) not in seen]
        if new:
            out.append(Violation(f"{LAYOUT_DIFFERS}: {dim}={value}", new[0].where, new[0].expected,
                                 f"{new[0].got} ({new[0].message})"))
    return packed + out if out else []


def _oracle_agreement_once(case: fz.DecodeCase, target: Target) -> list[Violation]:
    dec = bound(target).decode
    inp = fz.build_decode_inputs(case, target)
    plan = _decode_plan(dec, case, target, inp)
    pools_before = [p.clone() for p in inp.pools if p is not None]
    try:
        got = _run_decode(dec, case, target, inp, plan)
    except _Refused as e:
        return refusal_violations(case, e) + _pools_changed(pools_before, inp)
    pools = _pools_changed(pools_before, inp)
    ref = _oracle(case, target, inp)
    raw = got.clone()
    zeroed = zeroed_nan_rows(NAN_ROW_ZEROED, got, ref.out)
    label = (f"decode output vs float64 oracle ({target.decode_family} family, S={plan.num_splits}, "
             f"adaptive={plan.adaptive})")
    found = oracle_violations(label, got, ref, plan.num_splits)
    if found and case.poison != "none":  # a kernel reading poisoned bytes by another rule is named as such
        rule = reading_rule_violation(lambda **r: _oracle(case, target, inp, **r), raw, plan.num_splits, label, ref)
        if rule:
            return pools + rule
    return pools + zeroed + found


#: a refusal of a layout the entry point may refuse must be clean: these texts name what was not
REFUSED_ACCEPTED_LAYOUT = "decode refused a layout it must accept"
REFUSAL_WROTE = "decode refused a layout but wrote its output or workspace first"
REFUSAL_UNNAMED = "decode refused a layout without naming the argument"


class _Refused(Exception):
    """A refusal raised by the subject, with the output and workspace buffers as they were left."""

    def __init__(self, error: Exception, buffers: dict):
        super().__init__(str(error))
        self.error, self.buffers = error, buffers


def refusal_violations(case: fz.DecodeCase, refused: Exception) -> list[Violation]:
    """A decode that raised: fine only for a layout the entry point may refuse (fuzz.decode.MAY_REFUSE), when the
    error names one of that layout's arguments and nothing it was handed to write was written (the NaN-poisoned
    output buffer and workspace still all NaN)."""
    err = refused.error if isinstance(refused, _Refused) else refused
    buffers = refused.buffers.items() if isinstance(refused, _Refused) else ()
    written = [(name, int((~torch.isnan(buf.float())).sum())) for name, buf in buffers]
    return layout_refusal((REFUSED_ACCEPTED_LAYOUT, REFUSAL_UNNAMED, REFUSAL_WROTE), f"layouts {fz._layouts(case)}",
                          fz.refusable(case), err, written)


def layout_refusal(messages: tuple[str, str, str], where: str, args: dict, err: Exception,
                   written: list[tuple[str, int]]) -> list[Violation]:
    """A refusal judged (decode's and prefill's): ``messages`` are the family's (refused a layout it must accept,
    refused without naming the argument, wrote before refusing); ``args`` the refusable layouts' argument names
    ("a/b" for either), ``written`` each output buffer's count of elements no longer NaN."""
    accepted, unnamed, wrote = messages
    if not args:
        return [Violation(accepted, where, "a result", f"{type(err).__name__}: {err}")]
    names = [n for a in args.values() for n in a.split("/")]
    out = []
    if not any(n in str(err) for n in names):
        out.append(Violation(unnamed, where, f"a message naming one of {names}", str(err)))
    out += [Violation(wrote, f"{where}; {name}", "every element still NaN", f"{n} elements written")
            for name, n in written if n]
    return out


def _pools_changed(pools_before: list, inp) -> list[Violation]:
    violations: list[Violation] = []
    for i, (before, p) in enumerate(zip(pools_before, [p for p in inp.pools if p is not None])):
        if not torch.equal(before, p):
            violations.append(Violation("decode modified a cache pool", f"pool {i}", "unchanged bytes",
                                        f"{int((before != p).sum())} bytes changed"))
    return violations


#: a row whose every lane is NaN in the reference (a NaN softmax denominator) comes back as all zeros: said once, in
#: these words, and those rows are left out of the lane comparison (so this is the case's only violation for them)
NAN_ROW_ZEROED = "decode output: a row the oracle gives as NaN is all zeros"
NAN_ROW_ZEROED_VS_OURS = "decode output: a row ours gives as NaN is all zeros in the subject"


def zeroed_nan_rows(message: str, got: torch.Tensor, ref_out: torch.Tensor) -> list[Violation]:
    """Rows (b, h) that are NaN in every lane of ``ref_out`` and exactly 0 in every lane of ``got``: one violation
    naming the first (the count in ``got``); those rows of ``got`` are set to NaN in place, so the lane comparison
    that follows does not report them again."""
    rows = (torch.isnan(ref_out.to(torch.float64)).all(-1) & (got.to(torch.float64) == 0).all(-1)).nonzero()
    if not len(rows):
        return []
    got[tuple(rows.t())] = math.nan
    b, h = rows[0].tolist()
    return [Violation(message, f"out[{b}, {h}]", "NaN in every lane",
                      f"0 in every lane ({len(rows)} such row{'s' if len(rows) > 1 else ''})")]


def _decode_plan(dec, case: fz.DecodeCase, target: Target, inp):
    """The case's pinned plan, else the subject's own plan for the case's sizes and CU count."""
    plan = _plan_for(case, target, dec)
    if plan is None:
        plan = dec.plan_decode(target, case.batch, case.heads, inp.main_indices.numel(),
                               inp.extra_indices.numel() if inp.extra_indices is not None else 0,
                               cu_count=case.cu_count)
    return plan


def _run_decode(dec, case: fz.DecodeCase, target: Target, inp, plan) -> torch.Tensor:
    """``dec.sparse_attn_decode`` of the case under ``plan`` with a NaN-poisoned workspace and output; the output
    on the CPU."""
    b, h = case.batch, case.heads
    dev = kernel_device()
    ws = dec.DecodeWorkspace.allocate(b, plan.num_splits, h, dev, fill=math.nan)
    out, out_base = fz.make_out(case, dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on 0 * inf by design
        try:
            dec.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache,
                                   inp.extra_indices, inp.extra_indptr, attn_sink=inp.attn_sink,
                                   softmax_scale=inp.softmax_scale, target=target, trust_extra_nan_free=case.trust,
                                   cu_count=case.cu_count, plan=plan, workspace=ws, out=out)
        except (ValueError, TypeError) as e:
            raise _Refused(e, {"out": out_base, "workspace.part_m": ws.part_m, "workspace.part_l": ws.part_l,
                               "workspace.part_acc": ws.part_acc}) from e
    return out.cpu().clone()


def _oracle(case: fz.DecodeCase, target: Target, inp, **reading):
    """The float64 oracle of the case; ``reading`` (``scrub``, ``scale_255``) swaps one of SPEC 2's reader rules
    for another a kernel may follow (:data:`READING_RULES`)."""
    scrub = reading.pop("scrub", True)
    return ref_decode.ref_sparse_attn_decode(
        inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache, inp.extra_indices,
        inp.extra_indptr, attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale,
        main_flavour=target.main_cache_fp8, extra_flavour=target.extra_cache_fp8,
        scrub_extra=scrub and not case.trust, scrub_main=scrub, **reading)


#: a decode that keeps the NaN of referenced cache rows (finding signatures match these texts)
NAN_NOT_SCRUBBED = ("decode output keeps the NaN lanes of referenced cache rows that the readers zero after "
                    "dequantization: it agrees with the oracle without that scrub")
#: a decode that reads UE8M0 scale code 255 as NaN (the OCP MX rule for E8M0) where the readers give +inf
SCALE_255_NAN = ("decode output reads UE8M0 scale code 255 as NaN where the readers give +inf: it agrees with the "
                 "oracle reading 255 as NaN")
#: SPEC 2's reader rules a kernel may replace: (oracle keywords, the violation's message). Only cases with poisoned
#: referenced rows (NaN codes, code 255) tell them apart. Both at once is not a third rule: without the scrub, code
#: 255 over finite codes gives a row NaN whether it reads as +inf or NaN, so the first rule already names it.
READING_RULES = (({"scrub": False}, NAN_NOT_SCRUBBED),
                 ({"scale_255": "nan"}, SCALE_255_NAN))


def reading_rule_violation(oracle, got: torch.Tensor, num_splits: int, where: str, ref=None) -> list[Violation]:
    """Where ``got`` (the output of a case whose referenced rows are poisoned) fails the oracle: one violation naming
    the first of :data:`READING_RULES` under which the oracle agrees with it on every lane (NaN and inf positions
    exactly, the rest within the same bound), so a kernel that reads the cache bytes by another rule is told apart
    from one that computes wrong. ``oracle(**reading)`` is the case's oracle under a reading (none: SPEC 2's), and
    ``ref`` its SPEC 2 result where the caller has it. [] where no rule explains ``got``, and where ``got`` agrees
    with SPEC 2's oracle once its rows of zeros where SPEC 2 gives NaN are set aside (a kernel that writes such a
    row as zeros, vLLM's U3, is named by its callers' own violation): then whatever else differs is not a reading
    rule's doing. A CPU audit of vLLM 0.34.0 (seed 1368058255, gfx950, an underflow case where every finite output
    is about 0) named the 255-as-NaN rule for upstream's zeroed rows."""
    spec = ref if ref is not None else oracle()
    plain = got.clone()
    zeroed_nan_rows("", plain, spec.out)  # rows of zeros where SPEC 2 gives NaN: the callers name those themselves
    if not cmp.attention_comparison(plain, spec.out, decode_tolerance(spec, num_splits)).mismatches:
        return []
    for reading, message in READING_RULES:
        alt = oracle(**reading)
        if not cmp.attention_comparison(got.clone(), alt.out, decode_tolerance(alt, num_splits)).mismatches:
            first = torch.isnan(got.to(torch.float64)) != torch.isnan(spec.out)
            idx = tuple(first.nonzero()[0].tolist()) if bool(first.any()) else None
            at = f"out[{', '.join(map(str, idx))}]" if idx else "out"
            return [Violation(message, f"{where}: {at} ({int(first.sum())} lanes NaN on one side only)",
                              "the readers' rules (SPEC 2)", ", ".join(f"{k}={v}" for k, v in reading.items()))]
    return []


def oracle_violations(label: str, got: torch.Tensor, ref, num_splits: int) -> list[Violation]:
    """A decode output against the float64 oracle's result ``ref`` under the derived error model of
    :mod:`oracles.compare` for this Triton mode and split count; the worst error-to-tolerance ratio is recorded as
    the case's margin. Every contract that reads the decode's output (agreement, graph replay, int64 probes) uses
    this one comparison."""
    return attention_violations(label, got, ref.out, decode_tolerance(ref, num_splits))


def decode_tolerance(ref, num_splits: int) -> torch.Tensor:
    """Per-lane tolerance of a decode output with ``num_splits`` splits around the oracle's result ``ref``
    (:mod:`oracles.compare`'s derived error model for this Triton mode)."""
    model = cmp.AttentionErrorModel.for_mode(triton_mode())
    return cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                   num_splits, 16, model)


def attention_violations(label: str, got: torch.Tensor, ref_out: torch.Tensor, tol: torch.Tensor) -> list[Violation]:
    """An attention output against its oracle within per-lane ``tol`` (:func:`oracles.compare.attention_comparison`):
    the mismatches as violations, and the worst error-to-tolerance ratio recorded as the case's margin."""
    res = cmp.attention_comparison(got, ref_out, tol)
    if res.worst_ratio is not None:
        record_margin(res.worst_ratio)
    return [Violation(f"{label}: {m.detail}", m.where, m.expected, m.got) for m in res.mismatches]


# --- subject-agreement -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AgreementCase(Case):
    """One comparison of the subject with ours: a decode case or a split-selector case (``family`` says which; only
    that field is set)."""

    KIND = "subject-agreement"
    family: Literal["decode", "split"]
    decode: fz.DecodeCase | None = None
    split: SplitCase | None = None

    def __post_init__(self):
        super().__post_init__()
        given = [name for name in ("decode", "split") if getattr(self, name) is not None]
        if given != [self.family]:
            raise ValueError(f"family: {self.family!r} needs exactly its own case, got {given or 'none'}")


def _agreement_cases(target: Target):
    decode = fz.decode_cases(target).map(lambda c: AgreementCase("decode", decode=c))
    if target.split_selector is None:
        return decode
    return st.one_of(decode, fz_splits.split_cases(target.cu_count).map(lambda c: AgreementCase("split", split=c)))


def _agreement_examples(target: Target) -> list[AgreementCase]:
    from contracts.splits import _split_examples

    out = [AgreementCase("decode", decode=c) for c in _decode_examples(target)]
    if target.split_selector is not None:
        out += [AgreementCase("split", split=c) for c in _split_examples(target)]
    return out


@contract("subject-agreement", targets=ALL_TARGETS, cases=_agreement_cases, examples=_agreement_examples, min_cases=5,
          max_cases=14, case_type=AgreementCase, numeric=True)
def subject_agreement(case: AgreementCase, target: Target) -> list[Violation]:
    """On the same cases, the subject's decode and split selection equal ours.

    Decode: the case runs through ours and through the subject, each with the case's pinned plan or its own plan for
    the case's sizes (NaN-poisoned workspace and output for both; under the interpreter both with the GPU's numerics,
    contracts.subjects.fidelity). Where both plans are the same the outputs must be equal bit for bit (a NaN equals
    any NaN): both sides are deterministic; a difference says whether it stays within the sum of both sides' oracle
    tolerances (oracles.compare's error model for each side's split count) or not. Where the plans differ the
    subject's output must lie within that sum of ours, NaN/inf masks exactly; the margin is the worst
    error-to-tolerance ratio. A row that is NaN in every lane for ours and 0 in every lane for the subject is named
    as such. Split selection
    (split-K targets): the subject's split count equals ours for the same sizes and CU count, and so does its decode
    plan (adaptive splits where the target allows them under capture). Skipped when the subject is ours. Source:
    issue 11 (item 4: the subject's outputs equal ours, bitwise where deterministic, else within the oracle's bound).
    """
    if is_ours():
        raise SubjectUnavailable("the subject is ours: nothing to compare")
    if case.family == "split":
        return _agree_split(case.split, target)
    return _agree_decode(case.decode, target)


#: read by the suite's own tests: on ours this contract's rows are ``skipped`` by design (nothing to compare), and
#: its planted bugs live in the upstream catalogs (contracts/zoo/upstream/decode.toml)
CONTRACTS["subject-agreement"].extra["skipped_on_ours"] = True


def _agree_decode(case: fz.DecodeCase, target: Target) -> list[Violation]:
    got = _agree_decode_once(case, target)
    if got and fz.non_packed(case):
        return layout_violations(case, target) or got  # a layout alone makes the subject differ from the oracle
    return got


def _agree_decode_once(case: fz.DecodeCase, target: Target) -> list[Violation]:
    from contracts.subjects import fidelity

    mine, theirs = ours().bind(target).decode, bound(target).decode
    # a layout ours refuses (fuzz.decode.MAY_REFUSE): ours runs the same values with those inputs packed, so the
    # subject, which may accept the layout, must give what the packed inputs give
    refused = fz.refusable(case)
    mine_case = fz.packed_except(case, {d: v for d, v in fz.non_packed(case).items() if d not in refused})
    inp_o = fz.build_decode_inputs(mine_case if refused else case, target)
    inp_s = fz.build_decode_inputs(case, target)
    plan_o = _decode_plan(mine, case, target, inp_o)
    plan_s = _decode_plan(theirs, case, target, inp_s)
    # ours with the GPU's numerics too: under the interpreter a subject's kernels run corrected (ctx.call), and ours
    # would otherwise differ from them by the interpreter's own roundings (fp32 -> bf16 truncation); natively a no-op
    # and with upstream's design: the 16-head build where the family's size rule would pick the wide one. The wide
    # build's dots have 64 rows, and numpy's BLAS (the interpreter's matmul) may sum those in another order than 16
    # rows on some CPUs, a last-bit difference the bitwise comparison below would report against a design upstream
    # does not have; the wide build itself is judged against the oracle by decode-oracle-agreement
    with fidelity.corrected(), _narrow_build(mine, target):
        got_o = _run_decode(mine, mine_case if refused else case, target, inp_o, plan_o)
    try:
        got_s = _run_decode(theirs, case, target, inp_s, plan_s)
    except _Refused as e:
        return refusal_violations(case, e)
    differs = _agree_outputs(got_o, got_s, _oracle(case, target, inp_o), plan_o, plan_s)
    if differs and case.poison != "none":  # the subject reads poisoned bytes by another rule: named as such
        return reading_rule_violation(lambda **r: _oracle(case, target, inp_s, **r), got_s, plan_s.num_splits,
                                      "the subject") or differs
    return differs


def _agree_outputs(got_o, got_s, ref, plan_o, plan_s) -> list[Violation]:
    """The subject's output ``got_s`` against ours ``got_o``: bitwise under the same plan, else within both plans'
    bounds around the oracle's ``ref`` (``got_s`` is not modified: a zeroed NaN row is named on a copy)."""
    got_s = got_s.clone()
    out = zeroed_nan_rows(NAN_ROW_ZEROED_VS_OURS, got_s, got_o)
    tol = decode_tolerance(ref, plan_o.num_splits) + decode_tolerance(ref, plan_s.num_splits)
    if plan_o == plan_s:
        # both NaN, or both zero: a zero's sign (an underflowed weight times a value of either sign) says only
        # whether an accumulation started from +0 or from its first product, which changes no nonzero sum and
        # which neither design promises (a CPU audit of vLLM 0.34.0, seed 1511958873: generic, every lane of an
        # all-underflow output -0.0 in ours and +0.0 in upstream's)
        same = (torch.isnan(got_o) & torch.isnan(got_s)) | ((got_o == 0) & (got_s == 0))
        differ = (got_o.view(torch.int16) != got_s.view(torch.int16)) & ~same
        n = int(differ.sum())
        if n:
            o64, s64 = got_o.to(torch.float64), got_s.to(torch.float64)
            beyond = differ & ~((s64 - o64).abs() <= tol)  # a mask mismatch (NaN/inf on one side) is beyond
            worst = beyond if bool(beyond.any()) else differ
            idx = tuple(worst.nonzero()[0].tolist())
            msg = AGREE_BEYOND if bool(beyond.any()) else AGREE_BITS
            out.append(Violation(msg, f"out[{', '.join(map(str, idx))}] ({n} of {differ.numel()} lanes differ, "
                                      f"{int(beyond.sum())} beyond the bound)",
                                 fmt(float(got_o[idx])), fmt(float(got_s[idx]))))
        return out
    label = "decode output vs ours under a different plan"
    return out + attention_violations(label, got_s, got_o.to(torch.float64), tol)


def _narrow_build(mine, target: Target):
    """Ours' 16-head build for ``target``'s family where its default is a size rule (``impl.decode.SizeRule``), for
    the block; nothing else changes."""
    rule = mine.DEFAULT_VARIANTS.get(target.decode_family)
    if not isinstance(rule, mine.SizeRule):
        return contextlib.nullcontext()
    return mine.decode_variant(target.decode_family, rule.narrow)


#: the two ways a same-plan decode can differ from ours (finding signatures match these texts)
AGREE_BITS = "decode output differs from ours bit for bit under the same plan, within the oracle's bound"
AGREE_BEYOND = "decode output differs from ours beyond the oracle's bound under the same plan"


def _agree_split(case: SplitCase, target: Target) -> list[Violation]:
    from contracts.splits import DIFFERS_OURS, differs_message

    mine, theirs = ours().bind(target), bound(target)
    b, h, cu = case.batch, case.heads, case.cu_count
    m, e = case.main_numel, case.extra_numel
    sel = target.split_selector
    where = f"{sel}(batch={b}, heads={h}, main_numel={m}, extra_numel={e}, cu={cu})"
    want = mine.splits.select_num_splits(sel, b, h, m, e, cu)
    got = theirs.splits.select_num_splits(sel, b, h, m, e, cu)
    if got != want:
        # ours equals the exact re-derivation (split-bounds), so the same diagnosis applies
        return [Violation(differs_message(sel, got, b, h, m, e, cu, DIFFERS_OURS), where, fmt(want), fmt(got))]
    adaptive = target.adaptive_splits_in_capture
    p_o = mine.decode.plan_decode(target, b, h, m, e, cu_count=cu, adaptive_splits=adaptive)
    p_s = theirs.decode.plan_decode(target, b, h, m, e, cu_count=cu, adaptive_splits=adaptive)
    if p_o != p_s:
        return [Violation("decode plan differs from ours", where, fmt(p_o), fmt(p_s))]
    return []


# --- subject-agreement's declared dimensions ---------------------------------------------------------------------
# The case type lives here (AgreementCase), so the family is declared here, on top of the decode family's: a
# decode case hits the decode family's dimensions, a split-selector case hits "-" in each of them (and "-" only).

SPLIT_ONLY = "-"


def _agreement_family():
    from fuzz.dimensions import Dimension, Family, declare

    base = fz.DECODE_DIMENSIONS
    names = [d.name for d in base.dimensions]

    def classify(case: AgreementCase, target: Target) -> dict:
        if case.family == "split":
            return {"family": "split", **{n: SPLIT_ONLY for n in names}}
        return {"family": "decode", **base.classify(case.decode, target)}

    def force(case: AgreementCase, combo: dict, target: Target) -> AgreementCase:
        fam = combo.get("family", case.family)
        if fam == "split":
            if case.split is not None:
                return case
            d = case.decode
            return AgreementCase("split", split=SplitCase(
                batch=d.batch, heads=d.heads, avg_main=sum(d.main_lens) // d.batch,
                avg_extra=sum(d.extra_lens or ()) // d.batch, ragged_slack=d.tail_junk, cu_count=d.cu_count))
        d = case.decode if case.decode is not None else _decode_from_split(case.split)
        return AgreementCase("decode", decode=base.force(d, {k: v for k, v in combo.items() if k in names}, target))

    def allowed(c: dict, target: Target) -> bool:
        dec = {k: v for k, v in c.items() if k in names}
        dashed = [k for k, v in dec.items() if v == SPLIT_ONLY]
        split = c.get("family") == "split" or bool(dashed)
        if split:
            return target.split_selector is not None and len(dashed) == len(dec) and c.get("family") != "decode"
        return base._ok(dec, target)

    return declare(Family(
        "subject-agreement",
        (Dimension("family", ("decode", "split"), "a decode case, or a split-selector case (split-K targets)"),)
        + tuple(Dimension(d.name, d.values + (SPLIT_ONLY,), d.doc) for d in base.dimensions),
        # the pairs where a subject's own plan and gate logic may differ from ours (the split plan by extra length,
        # the trust gate by poison and extra length); extra length x invalid entries, a kernel-masking pair, is
        # decode-oracle-agreement's (with it the array outgrows 25 rows on gfx950)
        (("extra_len", "plan"), ("trust", "poison"), ("trust", "extra_len")),
        classify, force, allowed, examples=_agreement_plain_examples), "subject-agreement")


def _decode_from_split(s: SplitCase) -> fz.DecodeCase:
    """A tiny decode case of a split case's batch and heads (at most 3 and 4: the interpreter runs it)."""
    b = min(s.batch, 3)
    return fz.DecodeCase(seed=s.batch * 7 + s.heads, batch=b, heads=min(s.heads, 4), main_bs=1, extra_bs=1,
                         main_lens=(min(s.avg_main, 9),) * b, extra_lens=(min(s.avg_extra, 9),) * b,
                         invalid_rate=0.0, indptr_offset=0, tail_junk=0, scale=0.11, sink="none", poison="none",
                         padded=False, q_transposed=False, cu_count=min(s.cu_count, 8))


def _agreement_plain_examples(target: Target) -> list[AgreementCase]:
    out = [AgreementCase("decode", decode=fz.DecodeCase(
        seed=1, batch=2, heads=1, main_bs=1, extra_bs=1, main_lens=(0, 3), extra_lens=(0, 5), invalid_rate=0.0,
        indptr_offset=0, tail_junk=0, scale=0.03125, sink="none", poison="none", padded=False, q_transposed=False,
        cu_count=1))]
    if target.split_selector is not None:
        out.append(AgreementCase("split", split=SplitCase(batch=2, heads=3, avg_main=4, avg_extra=0, ragged_slack=0,
                                                          cu_count=2)))
    return out


AGREEMENT_DIMENSIONS = _agreement_family()
