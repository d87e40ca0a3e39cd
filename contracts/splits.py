"""Split-selector contract (``impl.splits``): every split count stays within its target's cap and equals an
independent re-derivation of SPEC's formulas."""
from __future__ import annotations

from fractions import Fraction

from contracts.core import AMD_TARGETS, Violation, contract, fmt
from contracts.subjects import EntryMissing, bound
from fuzz import splits as fz
from fuzz.splits import BLOCK_K, SplitCase
from impl.targets import Target
from oracles import splits as ref_splits


def _split_cases(target: Target):
    return fz.split_cases(target.cu_count)


def _split_examples(target: Target) -> list[SplitCase]:
    def c(b, h, a, e, cu=256):
        return SplitCase(batch=b, heads=h, avg_main=a, avg_extra=e, ragged_slack=0, cu_count=cu)

    # SPEC's checkpoints at CU = 256 (from upstream's tests); checked against their stated values too
    # then sizes where an average taken in floating point (numel * (1.0 / batch)) overshoots the exact one
    # (8736 / 91 and 34944 / 91 are whole numbers, their float averages are not), and two empty segments
    return [c(1, 1, 128, 8192), c(17, 1, 128, 32), c(512, 1, 128, 7812), c(256, 1, 128, 8192), c(20, 16, 128, 300),
            c(40, 1, 100, 5000, 38), c(91, 16, 0, 96), c(91, 16, 0, 384), c(1, 1, 0, 0)]


_CHECKPOINTS = {("gfx950", 1, 1, 128, 8192): 32, ("gfx950", 17, 1, 128, 32): 4, ("gfx950", 512, 1, 128, 7812): 1,
                ("gfx942", 1, 1, 128, 8192): 16, ("gfx942", 256, 1, 128, 8192): 1}

_REF = {"gfx942": ref_splits.ref_num_splits_gfx942, "gfx950": ref_splits.ref_num_splits_gfx950}


@contract("split-bounds", targets=AMD_TARGETS, cases=_split_cases, examples=_split_examples, min_cases=10,
          skip_reason="generic has no split selector (single-kernel fallback)", case_type=SplitCase, numeric=False)
def split_bounds(case: SplitCase, target: Target) -> list[Violation]:
    """Every split count the target's selector returns lies in [1, split_cap] (16 on gfx942, 32 on gfx950) and
    equals an independent re-derivation of SPEC's formula, for any sizes and CU counts; the selector sees only
    sizes (numel), never indptr values. On gfx950 the adaptive host plan (on iff base >= 16 and S > 4; ONE_WAVE in
    [1, S]) matches too, and so does the per-query active split count (4, ONE_WAVE or S, from a row's own
    lengths) at the case's lengths and at each branch's edge. Source: SPEC section 2 "Split count"; seed 004's
    review (the shared gfx942 selector must keep its 16-split cap while gfx950 gets 32). A mismatch with the re-derivation names its cause when it is one
    of two recognisable ones: both index tensors empty, or a count that equals the re-derivation at lengths averaged
    in floating point (numel * (1.0 / batch)).
    """
    sub = bound(target)
    b, h, cu = case.batch, case.heads, case.cu_count
    main_numel, extra_numel = case.main_numel, case.extra_numel
    sel = target.split_selector
    got = sub.splits.select_num_splits(sel, b, h, main_numel, extra_numel, cu)
    want = _REF[sel](b, h, main_numel, extra_numel, cu)
    where = f"{sel}(batch={b}, heads={h}, main_numel={main_numel}, extra_numel={extra_numel}, cu={cu})"
    out: list[Violation] = []
    if not 1 <= got <= target.split_cap:
        out.append(Violation("split count outside [1, cap]", where, f"1..{target.split_cap}", fmt(got)))
    if got != want:
        out.append(Violation(differs_message(sel, got, b, h, main_numel, extra_numel, cu), where, fmt(want),
                             fmt(got)))
    key = (target.name, b, h, case.avg_main, case.avg_extra)
    if cu == 256 and key in _CHECKPOINTS and got != _CHECKPOINTS[key]:
        out.append(Violation("SPEC checkpoint", where, fmt(_CHECKPOINTS[key]), fmt(got)))
    plan = sub.decode.plan_decode(target, b, h, main_numel, extra_numel, cu_count=cu,
                                  adaptive_splits=target.adaptive_splits_in_capture)
    if plan.num_splits != got:
        out.append(Violation("plan_decode does not use the target's selector", where, fmt(got), fmt(plan.num_splits)))
    if target.adaptive_splits_in_capture:
        en, ow = ref_splits.ref_adaptive_host(got, b, h, cu)
        if plan.adaptive != en or (en and plan.one_wave != ow):
            out.append(Violation("adaptive host plan differs", where, f"enabled={en}, one_wave={ow}",
                                 f"enabled={plan.adaptive}, one_wave={plan.one_wave}"))
        # the plan's (S, ONE_WAVE), and the largest grid with the same ONE_WAVE (the kernel takes any S >= ONE_WAVE)
        for S, w in sorted({(got, ow), (target.split_cap, max(1, min(ow, target.split_cap)))}):
            v = _active_violations(sub, case, S, w, where)
            if v:
                out += v
                break
    return out


def _active_violations(sub, case: SplitCase, num_splits: int, one_wave: int, where: str) -> list[Violation]:
    """gfx950's per-query active split count (the host mirror of what the adaptive partial kernel computes from
    a row's real lengths) against the re-derivation, at the case's own average lengths and at each branch's edge:
    the largest lengths with iters(4) <= 3 and with iters(ONE_WAVE) <= 3, and one past each."""
    try:
        active = sub.splits.adaptive_active_splits
    except EntryMissing:
        return []  # a subject without the host mirror (upstream computes it only in the kernel)
    edge = fz.short_edge(case)
    ow_edge = 3 * BLOCK_K * one_wave
    queries = {(case.avg_main, case.avg_extra), (case.avg_main, edge), (case.avg_main, edge + 1), (0, ow_edge),
               (0, ow_edge + 1)}
    out = []
    for m, e in sorted(queries):
        want = ref_splits.ref_adaptive_active(m, e, num_splits, one_wave)
        got = active(m, e, num_splits, one_wave)
        if got != want:
            out.append(Violation("adaptive active split count differs from the re-derivation", f"{where}: query "
                                 f"main_len={m}, extra_len={e}, S={num_splits}, ONE_WAVE={one_wave}", fmt(want),
                                 fmt(got)))
            break
    return out


#: the message of a split count that differs from the re-derivation (or, in subject-agreement, from ours), by what
#: explains it (the finding signatures of findings.toml match these texts)
DIFFERS = "split count differs from the re-derived formula"
DIFFERS_OURS = "split count differs from ours"
EMPTY = ": both segments empty"
FLOAT_AVERAGES = ": equals the exact formula at the float-averaged lengths numel * (1.0 / batch)"


def differs_message(sel: str, got: int, b: int, h: int, main_numel: int, extra_numel: int, cu: int,
                    base: str = DIFFERS) -> str:
    """``base``, plus which of two known causes explains the mismatch if one does: both index tensors empty, or
    average lengths taken in floating point (``numel * (1.0 / b)``, which can overshoot the exact ``numel / b`` and
    push a ceil up). The second is checked by evaluating the exact re-derivation at those float averages (given to
    it as numels ``Fraction(avg) * b``, so that its ``numel / b`` is the float average exactly)."""
    if main_numel == 0 and extra_numel == 0:
        return base + EMPTY
    inv = 1.0 / b
    fm, fe = Fraction(main_numel * inv) * b, Fraction(extra_numel * inv) * b
    if (fm, fe) != (main_numel, extra_numel) and _REF[sel](b, h, fm, fe, cu) == got:
        return base + FLOAT_AVERAGES
    return base
