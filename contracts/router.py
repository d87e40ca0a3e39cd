"""Contract ``router-oracle-agreement`` (the subject's ``router`` family): the gate's out dtype policy, and the
biased grouped top-k router against its float64 oracle. Cases and inputs come from :mod:`fuzz.router`."""
from __future__ import annotations

import math

import torch

from contracts.core import ALL_TARGETS, Violation, contract, record_margin, single_threaded
from contracts.subjects import EntryMissing, bound
from fuzz import router as fr
from fuzz.router import RouterCase, make_inputs, router_cases
from impl.targets import Target
from oracles import router as oracle

U32 = 2.0 ** -24
U_IN = {"fp32": 0.0, "bf16": 2.0 ** -8}  # unit roundoff of the gate output dtype (fp32 logits are the reference)


def compare(case: RouterCase, weights: torch.Tensor, ids: torch.Tensor, ref: list[dict], logits: torch.Tensor,
            bias: torch.Tensor) -> tuple[list[Violation], int]:
    """Violations, and how many tokens had a different set excused by the rounding bound. Every bounded
    comparison (a boundary gap that excuses a set difference, each weight) reports its error-to-bound ratio."""
    v: list[Violation] = []
    T, k = case.tokens, case.topk
    if tuple(ids.shape) != (T, k) or ids.dtype != torch.int32 or weights.dtype != torch.float32 or \
            tuple(weights.shape) != (T, k):
        return [Violation("router output shape/dtype", "", f"[{T}, {k}] float32 weights, int32 ids",
                          f"{list(weights.shape)} {weights.dtype}, {list(ids.shape)} {ids.dtype}")], 0
    u_in = U_IN[case.gate_dtype]
    E, n_group = case.experts, case.n_group
    per = E // n_group if ref[0]["grouped"] else E
    excused = 0
    for t in range(T):
        r = ref[t]
        lg = logits[t].double().abs()
        bb = bias.double().abs()
        delta = (0.25 * u_in * lg + u_in * bb + 8 * U32 * (1 + bb)).max().item()
        tol_e, tol_g = 2 * delta, 4 * delta
        got_ids = ids[t].tolist()
        if len(set(got_ids)) != k:
            v.append(Violation("duplicate expert ids", f"token {t}", "k distinct ids", str(got_ids)))
            continue
        got_set, ref_set = set(got_ids), set(r["ids"])
        if got_set != ref_set:
            kth = min(r["masked"][e] for e in r["ids"])
            gmin = min(r["group_scores"][g] for g in r["kept_groups"]) if r["grouped"] else None
            ok, tie, low_precision = True, True, case.gate_dtype != "fp32"
            # a router that computes the scores in the gate's own dtype (bf16: unit roundoff 2^-8 on each score and
            # each biased score, twice that on a group's top-2 sum) may pick within that much of the boundary
            u_c = U_IN[case.gate_dtype]
            top = max(abs(x) for x in r["biased"])
            for e in got_set - ref_set:
                ge = e // per
                if r["grouped"] and ge not in r["kept_groups"]:
                    gap = gmin - r["group_scores"][ge]
                    ok &= 0 < gap <= tol_g
                    record_margin(gap / tol_g)
                    low_precision &= gap <= tol_g + 8 * u_c * top
                else:
                    gap = kth - r["biased"][e]
                    ok &= 0 < gap <= tol_e
                    record_margin(gap / tol_e)
                    low_precision &= gap <= tol_e + 4 * u_c * top
                tie &= gap == 0
            if not ok and low_precision and not tie:
                v.append(Violation("expert set differs within the rounding of scores computed in the gate's dtype "
                                   "(not in fp32)", f"token {t}", str(sorted(ref_set)), str(sorted(got_set))))
            elif not ok and tie:
                # every foreign pick scores exactly what the oracle's last pick scores: the same scores, another
                # tie-break (said apart from a wrong selection, which a tie-break rule can never excuse)
                v.append(Violation("expert set breaks an exact tie against the tie rule (lower group id, then lower "
                                   "expert id)", f"token {t}", str(sorted(ref_set)), str(sorted(got_set))))
            elif not ok:
                v.append(Violation("expert set differs from the oracle beyond the tie rule and the rounding bound",
                                   f"token {t}", str(sorted(ref_set)), str(sorted(got_set))))
            else:
                excused += 1
            continue
        w_ref = dict(zip(r["ids"], r["weights"]))
        sel_scores = [r["scores"][e] for e in r["ids"]]
        # score error from the input rounding: |x' - x| <= d = u_in |x|, and by the mean value theorem
        # |s(x') - s(x)| <= d * max s' on [x - d, x + d] <= d * min(1/4, s(x) e^d) (s' = s(1 - s) <= s, and s grows
        # by at most e^d over the interval); the relative form keeps the bound meaningful for tiny scores
        ds = []
        for e in r["ids"]:
            d = u_in * float(lg[e])
            ds.append(d * min(0.25, r["scores"][e] * math.exp(d)) + 4 * U32)
        S, dS = sum(sel_scores), sum(ds)
        rsf = case.routed_scaling_factor
        for j, e in enumerate(got_ids):
            i = r["ids"].index(e)
            if case.renormalize:
                s_e = sel_scores[i]
                if S - dS > 0:
                    tol = rsf * (ds[i] / (S - dS) + s_e * dS / (S - dS) ** 2 + (k + 4) * U32 * s_e / S)
                else:  # no first-order bound: the perturbation may exceed the sum itself; weights lie in [0, rsf]
                    tol = rsf
            else:
                tol = rsf * (ds[i] + 2 * U32 * sel_scores[i])
            got_w = float(weights[t, j])
            record_margin(abs(got_w - w_ref[e]) / tol)
            if not abs(got_w - w_ref[e]) <= tol:
                # a weight computed in the gate's dtype (bf16 sigmoid, sum and division) may be off by a few of
                # its units in the last place: said apart, so a wrong weight is never mistaken for it
                u_c = U_IN[case.gate_dtype]
                lowp = u_c > 0 and abs(got_w - w_ref[e]) <= tol + (k + 4) * u_c * abs(w_ref[e])
                msg = ("router weight differs within the rounding of a weight computed in the gate's dtype (not in "
                       "fp32)" if lowp else "router weight differs from the oracle beyond the derived bound")
                v.append(Violation(msg, f"token {t}, expert {e}", f"{w_ref[e]:.9g} +- {tol:.3g}", f"{got_w:.9g}"))
                break
    return v, excused


def _examples(target: Target) -> list[RouterCase]:
    base = RouterCase(seed=7, tokens=4, experts=16, n_group=4, topk_group=2, topk=4, renormalize=True,
                      routed_scaling_factor=2.5, gate_dtype="fp32", ties=True, logit_scale=3.0, bias_scale=1.0)
    return [base, base.replace(seed=8, gate_dtype="bf16", ties=False, renormalize=False)]


@contract("router-oracle-agreement", targets=ALL_TARGETS, cases=lambda target: router_cases(), examples=_examples,
          case_type=RouterCase, numeric=True)
def router_oracle_agreement(case: RouterCase, target: Target) -> list[Violation]:
    """The biased grouped top-k router (sigmoid scores + correction bias for selection, top-2 group sums, -inf
    masking, weights from the unbiased scores, optional renormalisation, routed scaling) picks the same expert set as
    a float64 oracle under the documented tie rule (lower group id, then lower expert id). With the gate emitting
    bf16 (seed 000's policy: the gate weight's dtype when AITER MoE has a bias; the bias is cast to it too), or from
    fp32 rounding, a set may differ only where the oracle's top-k (or top-group) boundary gap is positive and within
    the derived rounding bound of the inputs; weights agree within a derived bound. SPEC section 7. Margin: the worst
    weight error, or excused boundary gap, over its bound.
    First, on every case, the subject's gate policy (SPEC 7, seed 000): with AITER MoE on and a correction bias the
    gate emits the gate weight's dtype (bf16) under the "weight" policy, fp32 under the older "fp32" one, and the fp32
    bias is cast to that dtype; the case's gate dtype picks the policy its routing runs under. A subject with a gate but no router entry point fails on a wrong gate policy and is otherwise skipped,
    naming the entry point."""
    with single_threaded():
        return _check(case, target)


#: the gate weight's dtype in every case (DeepSeek checkpoints): what seed 000's policy makes the gate emit
GATE_WEIGHT_DTYPE = torch.bfloat16


def _gate_violations(router, policy: str, bias: torch.Tensor) -> tuple[list[Violation], torch.dtype, torch.Tensor]:
    """The subject's gate out dtype and bias cast for AITER MoE on with a correction bias, against SPEC 7: the gate
    weight's dtype under seed 000's policy ("weight"), fp32 under the older one; the bias cast to that dtype."""
    out_dtype = router.gate_out_dtype(GATE_WEIGHT_DTYPE, has_correction_bias=True, aiter_moe_enabled=True,
                                      policy=policy)
    want = GATE_WEIGHT_DTYPE if policy == "weight" else torch.float32
    where = f"gate weight {GATE_WEIGHT_DTYPE}, AITER MoE on, correction bias, policy {policy}"
    v = []
    if out_dtype != want:
        v.append(Violation("gate out dtype differs from SPEC 7's policy", where, str(want), str(out_dtype)))
    gate_bias = router.correction_bias_for_gate(bias, out_dtype)
    if gate_bias.dtype != (out_dtype or bias.dtype) or not torch.equal(gate_bias.double(),
                                                                       bias.to(gate_bias.dtype).double()):
        v.append(Violation("correction bias not the fp32 bias cast to the gate out dtype", where,
                           str(out_dtype or bias.dtype), str(gate_bias.dtype)))
    return v, out_dtype, gate_bias


def _check(case: RouterCase, target: "Target | str" = "generic") -> list[Violation]:
    router = bound(target).router
    logits, bias = make_inputs(case)
    policy = "weight" if case.gate_dtype == "bf16" else "fp32"
    # both policies on every case (cheap): a wrong one is seen whichever gate dtype the case draws
    gate_v, by_policy = [], {}
    for p in ("weight", "fp32"):
        v, dt, b = _gate_violations(router, p, bias)
        gate_v += v
        by_policy[p] = (dt, b)
    out_dtype, gate_bias = by_policy[policy]
    try:
        # the same values in the case's memory layout, laid out after the cast (a cast would pack them)
        gate_logits, gate_bias = fr.lay_out_router_inputs(logits.to(out_dtype), gate_bias, case.layout)
        weights, ids = router.biased_grouped_topk(gate_logits, gate_bias, case.topk, n_group=case.n_group,
                                                  topk_group=case.topk_group, renormalize=case.renormalize,
                                                  routed_scaling_factor=case.routed_scaling_factor)
    except EntryMissing:
        if gate_v:  # what the subject has is wrong: that is a verdict; otherwise the row names what it lacks
            return gate_v
        raise
    ref = oracle.biased_grouped_topk(logits.double().tolist(), bias.double().tolist(), case.topk,
                                     n_group=case.n_group, topk_group=case.topk_group,
                                     renormalize=case.renormalize, routed_scaling_factor=case.routed_scaling_factor)
    return gate_v + compare(case, weights, ids, ref, logits, bias)[0]
