"""The biased grouped top-k router, its gate dtype policy, and the float64 oracle (two mask values)."""
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings

import impl  # noqa: F401
from contracts.core import collecting_margins
from contracts.router import compare, router_oracle_agreement
from fuzz.cases import CaseError
from fuzz.router import RouterCase, make_inputs, router_cases
from impl.targets import get_target
from impl.router import biased_grouped_topk, correction_bias_for_gate, gate_out_dtype
from oracles import router as oracle


def _route(logits, bias, topk, **kw):
    return biased_grouped_topk(logits, bias, topk, **kw)


def test_matches_oracle_fp32():
    case = RouterCase(seed=3, tokens=6, experts=32, n_group=8, topk_group=3, topk=6, renormalize=True,
                      routed_scaling_factor=2.5, gate_dtype="fp32", ties=False, logit_scale=3.0, bias_scale=1.0)
    logits, bias = make_inputs(case)
    w, ids = _route(logits, bias, 6, n_group=8, topk_group=3, renormalize=True, routed_scaling_factor=2.5)
    ref = oracle.biased_grouped_topk(logits.double().tolist(), bias.double().tolist(), 6, n_group=8, topk_group=3,
                                     renormalize=True, routed_scaling_factor=2.5)
    assert [sorted(r) for r in ids.tolist()] == [sorted(r["ids"]) for r in ref]
    assert compare(case, w, ids, ref, logits, bias) == ([], 0)
    assert w.dtype == torch.float32 and ids.dtype == torch.int32
    assert torch.allclose(w.sum(-1), torch.full((6,), 2.5), rtol=1e-6)


def test_tie_rule_lower_index_wins():
    # every expert equal: groups 0 and 1 are kept, experts 0..3 chosen, in ascending order
    logits = torch.zeros(1, 16)
    bias = torch.zeros(16)
    _, ids = _route(logits, bias, 4, n_group=4, topk_group=2, renormalize=False)
    assert ids.tolist() == [[0, 1, 2, 3]]
    assert oracle.route_token([0.0] * 16, [0.0] * 16, 4, 4, 2, False)["ids"] == [0, 1, 2, 3]
    # tie between experts 5 and 9 at the boundary: 5 wins
    logits = torch.full((1, 16), -5.0)
    logits[0, [5, 9, 12]] = torch.tensor([1.0, 1.0, 2.0])
    _, ids = _route(logits, torch.zeros(16), 2, n_group=1, topk_group=1, renormalize=False)
    assert ids.tolist() == [[12, 5]]


def test_weights_are_unbiased_scores():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    bias = torch.tensor([5.0, 0.0, 0.0, 0.0])  # steers selection to expert 0, not its weight
    w, ids = _route(logits, bias, 2, n_group=1, topk_group=1, renormalize=False)
    assert ids.tolist() == [[0, 2]]
    assert torch.allclose(w, torch.sigmoid(torch.tensor([[0.0, 2.0]])))


def test_ungroupable_experts_fall_back_to_plain_biased_topk():
    g = torch.Generator().manual_seed(0)
    logits, bias = torch.randn(3, 10, generator=g), torch.randn(10, generator=g) * 0.1
    w, ids = _route(logits, bias, 3, n_group=4, topk_group=1, renormalize=True)  # 10 % 4 != 0
    exp_ids = torch.sort(torch.sigmoid(logits) + bias, dim=-1, descending=True, stable=True).indices[:, :3]
    assert torch.equal(ids.long(), exp_ids)
    ref = oracle.biased_grouped_topk(logits.double().tolist(), bias.double().tolist(), 3, n_group=4, topk_group=1,
                                     renormalize=True)
    assert not ref[0]["grouped"] and [r["ids"] for r in ref] == exp_ids.tolist()


def test_mask_value_minus_inf_vs_zero():
    # all biased scores negative: with 0.0 masking, experts of dropped groups outrank the kept ones
    logits = torch.tensor([[2.0, 1.0, -1.0, -2.0, 0.5, 0.0, -3.0, -4.0]])
    bias = torch.full((8,), -2.0)
    _, ids = _route(logits, bias, 2, n_group=2, topk_group=1, renormalize=False)
    kw = dict(n_group=2, topk_group=1, renormalize=False)
    neg_inf = oracle.biased_grouped_topk(logits.double().tolist(), bias.tolist(), 2, **kw)[0]
    zero = oracle.biased_grouped_topk(logits.double().tolist(), bias.tolist(), 2, mask_value=0.0, **kw)[0]
    assert neg_inf["ids"] == ids[0].tolist() == [0, 1]
    assert zero["ids"] == [4, 5]  # masked experts (group 1), chosen by the tie rule
    # with positive biased scores the two agree
    bias = torch.zeros(8)
    a = oracle.biased_grouped_topk(logits.double().tolist(), bias.tolist(), 2, **kw)[0]["ids"]
    b = oracle.biased_grouped_topk(logits.double().tolist(), bias.tolist(), 2, mask_value=0.0, **kw)[0]["ids"]
    assert a == b


def test_gate_dtype_policy():
    assert gate_out_dtype(torch.bfloat16, has_correction_bias=True, aiter_moe_enabled=True) == torch.bfloat16
    assert gate_out_dtype(torch.bfloat16, has_correction_bias=True, aiter_moe_enabled=True,
                          policy="fp32") == torch.float32
    assert gate_out_dtype(torch.bfloat16, has_correction_bias=False, aiter_moe_enabled=True) is None
    assert gate_out_dtype(torch.bfloat16, has_correction_bias=True, aiter_moe_enabled=False) is None
    assert correction_bias_for_gate(torch.tensor([0.1]), torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="policy"):
        gate_out_dtype(torch.bfloat16, has_correction_bias=True, aiter_moe_enabled=True, policy="fp16")


def test_bf16_gate_set_difference_excused_only_within_rounding():
    # experts 1 and 3 differ by 2^-10 in fp32 logits; both round to 1.0 in bf16 -> tie -> lower index (1) wins,
    # while the oracle picks 3. The boundary gap is positive and within the bf16 bound: excused.
    logits = torch.full((1, 8), -4.0)
    logits[0, 1] = 1.0
    logits[0, 3] = 1.0 + 2.0 ** -10
    bias = torch.zeros(8)
    case = RouterCase(seed=0, tokens=1, experts=8, n_group=1, topk_group=1, topk=1, renormalize=False,
                      routed_scaling_factor=1.0, gate_dtype="bf16", ties=False, logit_scale=1.0, bias_scale=0.0)
    w, ids = _route(logits.to(torch.bfloat16), bias.to(torch.bfloat16), 1, n_group=1, topk_group=1,
                    renormalize=False)
    ref = oracle.biased_grouped_topk(logits.double().tolist(), bias.tolist(), 1, n_group=1, topk_group=1,
                                     renormalize=False)
    assert ids.tolist() == [[1]] and ref[0]["ids"] == [3]
    with collecting_margins() as margins:
        assert compare(case, w, ids, ref, logits, bias) == ([], 1)
    # the excused gap (2^-10 in fp32 logits, about 2^-12 in scores) is reported against its bound
    assert margins and 0 < margins[0] <= 1
    # the same difference with fp32 gate output is not excused
    violations, _ = compare(case.replace(gate_dtype="fp32"), w, ids, ref, logits, bias)
    assert violations and "expert set differs" in violations[0].message
    # nor is a pick far below the boundary
    violations, _ = compare(case, w, torch.tensor([[0]], dtype=torch.int32), ref, logits, bias)
    assert violations


@pytest.mark.parametrize("kw,match", [
    (dict(topk=9), "topk"),
    (dict(topk_group=5), "topk_group"),
    (dict(topk=5, topk_group=1), "exceeds"),
    (dict(bias=torch.zeros(7)), "correction_bias"),
])
def test_bad_arguments(kw, match):
    args = dict(topk=2, n_group=4, topk_group=2, bias=torch.zeros(8))
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        biased_grouped_topk(torch.zeros(2, 8), args.pop("bias"), args.pop("topk"), renormalize=False, **args)


@pytest.mark.parametrize("kw,exc,match", [
    (dict(topk=True), TypeError, "topk: expected an int, got bool True"),
    (dict(topk=2.0), TypeError, "topk: expected an int, got float 2.0"),
    (dict(n_group=True), TypeError, "n_group: expected an int, got bool"),
    (dict(topk_group=2.0), TypeError, "topk_group: expected an int"),
    (dict(renormalize="no"), TypeError, "renormalize: expected a bool, got str 'no'"),
    (dict(renormalize=1), TypeError, "renormalize: expected a bool"),
    (dict(routed_scaling_factor="2.5"), TypeError, "routed_scaling_factor: expected a float"),
    (dict(routed_scaling_factor=True), TypeError, "routed_scaling_factor"),
    (dict(routed_scaling_factor=float("nan")), ValueError, "routed_scaling_factor: expected a finite value"),
    (dict(bias=torch.zeros(8, dtype=torch.int64)), TypeError, "correction_bias: expected a floating dtype, got "
                                                              "torch.int64"),
    (dict(bias=torch.zeros(8, device="meta")), ValueError, "correction_bias: expected the device of gating_output "
                                                           r"\(cpu\), got meta"),
    (dict(logits=torch.zeros(2, 8, dtype=torch.int32)), TypeError, "gating_output: expected a floating dtype"),
])
def test_bad_argument_types_and_devices(kw, exc, match):
    args = dict(topk=2, n_group=4, topk_group=2, renormalize=False, routed_scaling_factor=1.0)
    logits, bias = kw.pop("logits", torch.zeros(2, 8)), kw.pop("bias", torch.zeros(8))
    args.update(kw)
    with pytest.raises(exc, match=match):
        biased_grouped_topk(logits, bias, args.pop("topk"), **args)


def test_integral_arguments_of_other_int_types_route_as_ints():
    # numpy integers (e.g. read from a config array) are ints; the result equals the plain-int call
    np = pytest.importorskip("numpy")
    g = torch.Generator().manual_seed(1)
    logits, bias = torch.randn(3, 16, generator=g), torch.randn(16, generator=g) * 0.1
    w, ids = biased_grouped_topk(logits, bias, np.int64(4), n_group=np.int32(4), topk_group=np.int64(2),
                                 renormalize=True, routed_scaling_factor=np.float32(2.5))
    w2, ids2 = biased_grouped_topk(logits, bias, 4, n_group=4, topk_group=2, renormalize=True,
                                   routed_scaling_factor=2.5)
    assert torch.equal(ids, ids2) and torch.equal(w, w2)
    ref = oracle.biased_grouped_topk(logits.double().tolist(), bias.double().tolist(), 4, n_group=4, topk_group=2,
                                     renormalize=True, routed_scaling_factor=2.5)
    assert [r["ids"] for r in ref] == ids.tolist()


# --- the typed case of router-oracle-agreement --------------------------------------------------------------------

@settings(max_examples=60, deadline=None, database=None)
@given(router_cases())
def test_router_case_round_trips_through_json(case):
    assert RouterCase.from_json(case.to_json()) == case
    assert RouterCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_router_case_rejects_a_missing_field():
    case = RouterCase(seed=1, tokens=2, experts=8, n_group=2, topk_group=1, topk=2, renormalize=True,
                      routed_scaling_factor=2.5, gate_dtype="bf16", ties=True, logit_scale=3.0, bias_scale=0.05)
    for f in dataclasses.fields(case):
        if f.name in RouterCase.ADDED_FIELDS:  # older cases replay with its default
            continue
        doc = case.to_json()
        del doc[f.name]
        with pytest.raises(CaseError, match=f"missing field {f.name}"):
            RouterCase.from_json(doc)
    with pytest.raises(CaseError, match="gate_dtype"):
        RouterCase.from_json({**case.to_json(), "gate_dtype": "fp16"})
    with pytest.raises(CaseError, match="topk: expected a positive int"):
        RouterCase.from_json({**case.to_json(), "topk": 0})


def test_router_check_records_a_margin_per_case():
    """A passing case reports its worst weight error over the derived bound: a ratio in [0, 1]."""
    case = RouterCase(seed=8, tokens=4, experts=16, n_group=4, topk_group=2, topk=4, renormalize=True,
                      routed_scaling_factor=2.5, gate_dtype="bf16", ties=False, logit_scale=3.0, bias_scale=1.0)
    with collecting_margins() as margins:
        assert router_oracle_agreement(case, get_target("gfx950")) == []
    assert len(margins) >= case.tokens * case.topk and 0 <= max(margins) <= 1
