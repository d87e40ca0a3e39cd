"""inverse-rope-exactly-once: ours' inverse-RoPE placement on every case of the domain, the oracle, the contract's
verdicts on hand-made plans, and upstream's layer (vLLM 0.34.0) as its adapter observes it, 0.33.0 skipped."""
from __future__ import annotations

import types
from pathlib import Path

import pytest

import contracts.layer_rope as lr
from contracts.core import CONTRACTS
from fuzz.layer_rope import LayerRopeCase, layer_rope_grid
from impl.layer_rope import InverseRopePlan, RowRotation, inverse_rope_plan
from impl.targets import TARGET_NAMES, get_target
from oracles.layer_rope import expected_rotation_counts, stage_rows
from upstream_trees import release_tree

ROOT = Path(__file__).resolve().parent.parent
ROCM = "vllm/models/deepseek_v4/amd/rocm.py"


def _case(d, p, fuse=True, ad=False, ap=False) -> LayerRopeCase:
    return LayerRopeCase(num_decode_tokens=d, num_prefill_tokens=p, fuse_inv_rope=fuse, aiter_decode=ad,
                         aiter_prefill=ap)


def _stages(plan) -> list[tuple]:
    return [(r.stage, r.start, r.end) for r in plan.rotations]


# --- ours ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGET_NAMES)
def test_ours_passes_on_every_case_of_the_domain(target):
    t = get_target(target)
    grid = layer_rope_grid()
    assert len(grid) == 200
    for case in grid:
        assert CONTRACTS["inverse-rope-exactly-once"].check(case, t) == [], case


@pytest.mark.parametrize("target, case, stages", [
    ("gfx942", _case(2, 3), [("decode-reduce", 0, 2), ("standalone", 2, 5)]),
    ("gfx950", _case(2, 3, ap=True), [("aiter-prefill-store", 2, 5), ("decode-reduce", 0, 2)]),
    ("gfx942", _case(2, 3, ad=True), [("aiter-decode-store", 0, 2), ("standalone", 2, 5)]),
    ("gfx950", _case(2, 3, ad=True, ap=True), [("aiter-prefill-store", 2, 5), ("aiter-decode-store", 0, 2)]),
    # the generic single-kernel decode has no reduce: its rows go to the standalone pass with the prefill rows
    ("generic", _case(2, 3), [("standalone", 0, 5)]),
    ("generic", _case(2, 3, ap=True), [("aiter-prefill-store", 2, 5), ("standalone", 0, 2)]),
    ("generic", _case(1, 0), [("standalone", 0, 1)]),
    ("gfx942", _case(0, 4), [("standalone", 0, 4)]),
    ("gfx942", _case(0, 4, ap=True), [("aiter-prefill-store", 0, 4)]),
    ("gfx950", _case(3, 0, ad=True, ap=True), [("aiter-decode-store", 0, 3)]),
    ("gfx942", _case(0, 0), []),
    # fp8 wo_a: its quantization step rotates, nothing here does
    ("gfx950", _case(2, 2, fuse=False, ad=True, ap=True), []),
    ("generic", _case(4, 4, fuse=False), []),
])
def test_ours_plans_exactly(target, case, stages):
    plan = inverse_rope_plan(target, **case.kwargs())
    assert _stages(plan) == stages
    assert all((r.positions_start, r.positions_end) == (r.start, r.end) for r in plan.rotations)
    assert plan.counts() == tuple(expected_rotation_counts(case.num_decode_tokens, case.num_prefill_tokens,
                                                           case.fuse_inv_rope))
    assert plan.target == target and plan.num_rows == case.num_decode_tokens + case.num_prefill_tokens


def test_ours_rejects_bad_arguments_naming_them():
    ok = dict(num_decode_tokens=1, num_prefill_tokens=1, fuse_inv_rope=True, aiter_decode=False, aiter_prefill=False)
    with pytest.raises(TypeError, match="num_decode_tokens: expected an int, got bool"):
        inverse_rope_plan("gfx942", **{**ok, "num_decode_tokens": True})
    with pytest.raises(ValueError, match="num_prefill_tokens: expected a token count >= 0, got -1"):
        inverse_rope_plan("gfx942", **{**ok, "num_prefill_tokens": -1})
    with pytest.raises(TypeError, match="aiter_prefill: expected a bool, got int"):
        inverse_rope_plan("gfx942", **{**ok, "aiter_prefill": 1})
    with pytest.raises(ValueError, match="unknown architecture"):
        inverse_rope_plan("gfx1250", **ok)


# --- the oracle and the case family -------------------------------------------------------------------------------

def test_oracle_counts_and_stage_rows():
    assert expected_rotation_counts(2, 3, True) == [1] * 5
    assert expected_rotation_counts(2, 3, False) == [0] * 5
    assert expected_rotation_counts(0, 0, True) == []
    assert stage_rows("standalone", "generic", 2, 3, False, False) == range(0, 5)
    assert stage_rows("aiter-decode-store", "gfx942", 2, 3, True, False) == range(0, 2)
    assert stage_rows("aiter-decode-store", "gfx942", 2, 3, False, True) is None
    assert stage_rows("decode-reduce", "gfx950", 2, 3, False, False) == range(0, 2)
    assert stage_rows("decode-reduce", "gfx950", 2, 3, True, False) is None  # AITER ran the decode
    assert stage_rows("decode-reduce", "generic", 2, 3, False, False) is None  # no reduce on the fallback
    assert stage_rows("aiter-prefill-store", "generic", 2, 3, False, True) == range(2, 5)
    assert stage_rows("aiter-prefill-store", "gfx942", 2, 3, True, False) is None
    assert stage_rows("triton-prefill", "gfx942", 2, 3, True, True) is None


def test_case_validation_and_label():
    with pytest.raises(ValueError, match="num_decode_tokens: expected a token count in"):
        _case(-1, 0)
    c = _case(2, 3, ad=True)
    assert LayerRopeCase.from_json(c.to_json()) == c
    assert c.label() == ("2 decode + 3 prefill rows, bf16 wo_a (fuse_inv_rope=True), AITER decode on, "
                         "AITER prefill off")


# --- the contract's verdicts on plans a subject might report -----------------------------------------------------

def _judge(monkeypatch, case, rotations, target="gfx942"):
    plan = InverseRopePlan(target, case.num_decode_tokens, case.num_prefill_tokens, case.fuse_inv_rope,
                           tuple(RowRotation(*r) for r in rotations))
    fam = types.SimpleNamespace(inverse_rope_plan=lambda t, **kw: plan)
    monkeypatch.setattr(lr, "bound", lambda t: types.SimpleNamespace(layer_rope=fam))
    return [v.message for v in lr.inverse_rope_exactly_once(case, get_target(target))]


def test_contract_names_each_wrong_row_and_stage(monkeypatch):
    case = _case(2, 2, ap=True)
    good = [("aiter-prefill-store", 2, 4, 2, 4), ("decode-reduce", 0, 2, 0, 2)]
    assert _judge(monkeypatch, case, good) == []
    # the standalone pass also running over the prefill rows (0.33.0's end with 0.34.0's store)
    assert _judge(monkeypatch, case, good + [("standalone", 2, 4, 2, 4)]) == ["row inverse-RoPE'd 2 times"] * 2
    # the decode reduce claimed but not done
    assert _judge(monkeypatch, case, good[:1]) == ["row never inverse-RoPE'd"] * 2
    # positions of other rows
    assert _judge(monkeypatch, case, [good[0], ("standalone", 0, 2, 2, 4)]) == [
        "standalone rotates rows with other rows' positions"]
    # a stage that cannot rotate here: the generic decode has no reduce
    assert _judge(monkeypatch, case, good, target="generic") == [
        "decode-reduce cannot rotate in this step on generic (its kernel does not run here or has no epilogue)"]
    # AITER's prefill store on decode rows
    msgs = _judge(monkeypatch, case, [("aiter-prefill-store", 0, 4, 0, 4)])
    assert msgs == ["aiter-prefill-store rotates rows of another part of the step"]
    # rows past the output
    assert _judge(monkeypatch, case, good + [("standalone", 4, 5, 4, 5)]) == [
        "standalone rotates rows outside the step's output"]
    # fp8 wo_a: any rotation is one too many
    fp8 = _case(1, 1, fuse=False, ad=True)
    assert _judge(monkeypatch, fp8, [("aiter-decode-store", 0, 1, 0, 1)]) == [
        "row rotated by the attention although the fp8 wo_a rotates it in its quantization step"]


# --- upstream -----------------------------------------------------------------------------------------------------

def _tree(version: str) -> str:
    return release_tree(version, ROCM)


@pytest.fixture(scope="module")
def vllm034():
    from contracts.subjects import parse_subject

    return parse_subject(f"vllm@{_tree('0.34.0')}")


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_upstream_034_rotates_every_row_once_on_the_split_k_targets(vllm034, target):
    fam = vllm034.bind(target).layer_rope
    for case, stages in [
        (_case(2, 3), [("decode-reduce", 0, 2), ("standalone", 2, 5)]),
        (_case(2, 3, ap=True), [("aiter-prefill-store", 2, 5), ("decode-reduce", 0, 2)]),
        (_case(2, 3, ad=True), [("aiter-decode-store", 0, 2), ("standalone", 2, 5)]),
        (_case(2, 3, ad=True, ap=True), [("aiter-prefill-store", 2, 5), ("aiter-decode-store", 0, 2)]),
        (_case(0, 2, ap=True), [("aiter-prefill-store", 0, 2)]),
        (_case(2, 2, fuse=False, ad=True, ap=True), []),
        (_case(0, 0), []),
    ]:
        plan = fam.inverse_rope_plan(target, **case.kwargs())
        assert _stages(plan) == stages, case
        assert all((r.positions_start, r.positions_end) == (r.start, r.end) for r in plan.rotations)


def test_upstream_034_generic_decode_rows_are_never_rotated(vllm034):
    """The fallback decode kernel (neither gfx942 nor gfx950) has no epilogue, yet rocm_sparse_attn_decode reports
    every row it was handed positions for as rotated, so forward_mqa's standalone pass starts past them."""
    t = get_target("generic")
    fam = vllm034.bind(t).layer_rope
    plan = fam.inverse_rope_plan("generic", **_case(1, 0).kwargs())
    assert plan.counts() == (0,) and plan.rotations == ()
    assert _stages(fam.inverse_rope_plan("generic", **_case(2, 3).kwargs())) == [("standalone", 2, 5)]
    # AITER's decode store does rotate them
    assert fam.inverse_rope_plan("generic", **_case(1, 0, ad=True).kwargs()).counts() == (1,)
    from contracts.subjects import using

    with using(vllm034):
        msgs = CONTRACTS["inverse-rope-exactly-once"].check(_case(1, 0), t)
    assert [v.message for v in msgs] == ["row never inverse-RoPE'd"]


def test_upstream_033_predates_the_split_flags_and_skips_naming_the_symbol():
    from contracts.subjects import SymbolTooNew, parse_subject

    sub = parse_subject(f"vllm@{_tree('0.33.0')}")
    with pytest.raises(SymbolTooNew, match="layer_rope adapter needs on_rdna .* came in vLLM 0.34.0"):
        sub.bind("gfx942").layer_rope


def test_upstream_catalog_lines_are_034s_and_absent_from_033():
    from contracts.zoo.runner import UPSTREAM_CATALOG_DIR, load_catalog

    mutants = load_catalog(UPSTREAM_CATALOG_DIR / "layer_rope.toml")
    assert len(mutants) == 4 and all(m.expect == ["inverse-rope-exactly-once"] for m in mutants)
    new, old = (Path(_tree(v)) for v in ("0.34.0", "0.33.0"))
    for m in mutants:
        assert (new / m.file).read_text().count(m.find) == 1, m.id
        assert (old / m.file).read_text().count(m.find) == 0, m.id  # `smv zoo --subject vllm==0.33.0`: stale
        assert "generic" not in m.targets  # the unpatched 0.34.0 already fails there
