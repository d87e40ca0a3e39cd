"""Sparse decode: the oracle-agreement contract on every target, the reduce's rules, adaptive splits, the trust
gate, and bad input rejected before any launch."""
from __future__ import annotations

import math

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings

import impl  # noqa: F401
from impl.runtime import triton_mode
from contracts import decode as _decode_contracts  # noqa: F401  (registers the contracts)
from contracts.core import CONTRACTS
from fuzz.cases import CaseError
from fuzz import decode as fz
from impl import decode as dec
from impl import formats, splits
from impl.runtime import kernel_device
from impl.targets import get_target

DEV = kernel_device()
AGREE = CONTRACTS["decode-oracle-agreement"]


_BASE = fz.DecodeCase(seed=11, batch=2, heads=3, main_bs=5, extra_bs=2, main_lens=(6, 0), extra_lens=(9, 4),
                      invalid_rate=0.15, indptr_offset=0, tail_junk=1, scale=0.11, sink="ordinary", poison="none",
                      padded=True, q_transposed=False, cu_count=2, num_splits=None, adaptive=None, trust=False,
                      int32_extremes=True)


def _case(**kw) -> fz.DecodeCase:
    return _BASE.replace(**kw)


def _run(case, target, **kw):
    t = get_target(target)
    inp = fz.build_decode_inputs(case, t)
    out = dec.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache,
                                 inp.extra_indices, inp.extra_indptr, attn_sink=inp.attn_sink,
                                 softmax_scale=inp.softmax_scale, target=t, cu_count=case.cu_count, **kw)
    return inp, out.cpu()


@pytest.mark.parametrize("target", ["generic", "gfx942", "gfx950"])
def test_decode_case_round_trips_and_rejects_a_missing_field(target):
    @settings(max_examples=40, deadline=None, database=None)
    @given(fz.decode_cases(get_target(target)))
    def round_trip(case):
        doc = json.loads(json.dumps(case.to_json()))
        assert fz.DecodeCase.from_json(doc) == case
        added = {f.name: f.default for f in dataclasses.fields(fz.DecodeCase) if f.name in fz.DecodeCase.ADDED_FIELDS}
        older = {k: v for k, v in doc.items() if k not in added}  # as stored before those fields came
        assert fz.DecodeCase.from_json(older) == case.replace(**added)
        for f in dataclasses.fields(fz.DecodeCase):
            if f.name in added:
                continue
            partial = {k: v for k, v in doc.items() if k != f.name}
            with pytest.raises(CaseError, match=f"missing field {f.name}"):
                fz.DecodeCase.from_json(partial)

    round_trip()


def test_decode_case_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="main_lens: expected 2 lengths"):
        _case(main_lens=(1,))
    with pytest.raises(ValueError, match="adaptive: an adaptive plan needs num_splits"):
        _case(adaptive=fz.AdaptiveSplits(one_wave=1))
    with pytest.raises(ValueError, match="adaptive.one_wave"):
        _case(num_splits=4, adaptive=fz.AdaptiveSplits(one_wave=5))
    doc = _BASE.to_json()
    doc["adaptive"] = {"one_wave": "3"}
    doc["num_splits"] = 4
    with pytest.raises(CaseError, match=r"adaptive.one_wave: expected an integer"):
        fz.DecodeCase.from_json(doc)


def test_reduce_adaptive_skips_stale_splits_exactly():
    # upstream's reduce test: live splits with acc 1 and 3 (equal m, l) give exactly 2; the skipped split's acc is
    # NaN (stale) and must not leak in
    ws = dec.DecodeWorkspace.allocate(1, 3, 2, DEV)
    ws.part_m[0, :, :] = torch.tensor([[0.5, 0.5], [0.5, 0.5], [-dec.FLT_MAX, -dec.FLT_MAX]])
    ws.part_l[0, :, :] = torch.tensor([[1.0, 1.0], [1.0, 1.0], [0.0, 0.0]])
    ws.part_acc[0, 0] = 1.0
    ws.part_acc[0, 1] = 3.0
    ws.part_acc[0, 2] = math.nan
    out = dec.decode_reduce(ws, adaptive=True).cpu()
    assert torch.equal(out, torch.full((1, 2, 512), 2.0, dtype=torch.bfloat16))
    # without the skip the stale NaN propagates: the flag is what makes the difference
    assert bool(torch.isnan(dec.decode_reduce(ws, adaptive=False).cpu()).all())


def test_reduce_sink_and_empty_row():
    ws = dec.DecodeWorkspace.allocate(2, 2, 1, DEV)
    ws.part_m[0] = torch.tensor([[0.0], [0.0]])
    ws.part_l[0] = torch.tensor([[1.0], [1.0]])
    ws.part_acc[0] = 3.0
    ws.part_m[1] = -dec.FLT_MAX  # an empty row: nothing valid anywhere
    sink = torch.tensor([math.log(2.0)], dtype=torch.float32, device=DEV)
    out = dec.decode_reduce(ws, attn_sink=sink).cpu().to(torch.float64)
    # row 0: (3 + 3) / (1 + 1 + e^{ln 2}) = 1.5 ; row 1: l = e^{sink - sink} = 1, acc 0 -> 0
    assert torch.equal(out[0], torch.full((1, 512), 1.5, dtype=torch.float64))
    assert torch.equal(out[1], torch.zeros(1, 512, dtype=torch.float64))
    no_sink = dec.decode_reduce(ws).cpu()
    assert torch.equal(no_sink[1], torch.zeros(1, 512, dtype=torch.bfloat16))  # l == 0 -> 0, not NaN


def test_adaptive_active_split_counts_follow_the_row_lengths():
    # three rows hitting the three per-query branches: 4 splits, ONE_WAVE, S
    case = _case(seed=5, batch=3, heads=1, main_bs=61, extra_bs=61, main_lens=[10, 10, 10],
                 extra_lens=[20, 300, 700], invalid_rate=0.0, sink="none", num_splits=7,
                 adaptive=fz.AdaptiveSplits(one_wave=6))
    t = get_target("gfx950")
    inp = fz.build_decode_inputs(case, t)
    ws = dec.DecodeWorkspace.allocate(3, 7, 1, DEV, fill=math.nan)
    plan = dec.DecodePlan("gfx950", 7, 1, True, 6)
    dec.sparse_attn_decode(inp.q, inp.main_cache, inp.main_indices, inp.main_indptr, inp.extra_cache,
                           inp.extra_indices, inp.extra_indptr, softmax_scale=inp.softmax_scale, target=t,
                           plan=plan, workspace=ws)
    pm = ws.part_m.cpu()
    actives = []
    for r, (lm, le) in enumerate(zip(case.main_lens, case.extra_lens)):
        a = splits.adaptive_active_splits(lm, le, 7, 6)
        actives.append(a)
        assert bool((pm[r, a:] == -dec.FLT_MAX).all()), (r, a, pm[r])
        assert bool(torch.isfinite(pm[r, :a]).all() & (pm[r, :a] > -dec.FLT_MAX).all()), (r, a, pm[r])
    assert actives == [4, 6, 7]
    assert AGREE.check(case, t) == []


def test_trust_gate_changes_only_what_it_should():
    # NaN-poisoned extra rows: scrubbed (finite output) with the gate closed, NaN with it open; oracle agrees both
    case = _case(seed=3, poison="nan", extra_lens=[30, 40], invalid_rate=0.0, sink="none")
    t = get_target("gfx950")
    assert AGREE.check(case, t) == []
    assert AGREE.check(case.replace(trust=True), t) == []
    _, closed = _run(case, "gfx950")
    _, open_ = _run(case, "gfx950", trust_extra_nan_free=True)
    assert bool(torch.isfinite(closed).all())
    assert bool(torch.isnan(open_).any())


def test_main_cache_flavour_comes_from_the_target():
    # gfx942 writes its main cache as FNUZ, generic as OCP: each agrees with the oracle under its own flavour
    case = _case(extra_lens=None, sink="none", invalid_rate=0.0)
    assert AGREE.check(case, get_target("gfx942")) == []
    assert AGREE.check(case, get_target("generic")) == []


# --- bad input ------------------------------------------------------------------------------------------------

def _inputs():
    return fz.build_decode_inputs(_case(), get_target("gfx950"))


def _call(inp, **kw):
    args = dict(q=inp.q, main_cache=inp.main_cache, main_indices=inp.main_indices, main_indptr=inp.main_indptr,
                extra_cache=inp.extra_cache, extra_indices=inp.extra_indices, extra_indptr=inp.extra_indptr)
    opts = dict(attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale, target="gfx950")
    for k, v in kw.items():
        (args if k in args else opts)[k] = v
    return dec.sparse_attn_decode(args.pop("q"), args.pop("main_cache"), args.pop("main_indices"),
                                  args.pop("main_indptr"), args.pop("extra_cache"), args.pop("extra_indices"),
                                  args.pop("extra_indptr"), **opts)


@pytest.mark.parametrize("change, exc, match", [
    (lambda i: {"q": i.q[..., :448].contiguous()}, ValueError, r"q: expected shape \[batch, heads, 448 \+ 64"),
    (lambda i: {"q": i.q.to(torch.float32)}, TypeError, "q: expected dtype bfloat16"),
    (lambda i: {"main_indices": i.main_indices.to(torch.int64)}, TypeError, "main_indices: expected dtype int32"),
    (lambda i: {"main_indptr": i.main_indptr.flip(0).contiguous()}, ValueError, "main_indptr: expected a non-decreasing"),
    (lambda i: {"extra_indptr": i.extra_indptr[:-1].contiguous()}, ValueError, "extra_indptr: expected batch \\+ 1"),
    (lambda i: {"main_cache": i.main_cache.view(torch.int8)}, TypeError, "main_cache: expected dtype uint8"),
    (lambda i: {"extra_indices": None}, ValueError, "give all three or none"),
    (lambda i: {"main_indices": i.main_indices.to("meta")}, ValueError, "main_indices: expected device"),
    (lambda i: {"attn_sink": i.attn_sink[:1]}, ValueError, "attn_sink: expected at least 3"),
    (lambda i: {"attn_sink": i.attn_sink.to(torch.bfloat16)}, TypeError, "attn_sink: expected dtype float32"),
    (lambda i: {"softmax_scale": float("nan")}, ValueError, "softmax_scale"),
    (lambda i: {"target": "gfx942", "trust_extra_nan_free": True}, ValueError, "trust_extra_nan_free: target gfx942"),
    (lambda i: {"target": "generic", "adaptive_splits": True}, ValueError, "adaptive_splits: target generic"),
    (lambda i: {"plan": dec.DecodePlan("gfx950", 33, 1)}, ValueError, r"num_splits must be in \[1, 32\]"),
    (lambda i: {"plan": dec.DecodePlan("gfx942", 2, 1)}, ValueError, "plan: family"),
    (lambda i: {"plan": dec.DecodePlan("gfx950", 4, 1, True, 5)}, ValueError, "one_wave"),
])
def test_bad_input_rejected_before_launch(change, exc, match):
    inp = _inputs()
    out = torch.full((2, 3, 512), math.nan, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(exc, match=match):
        _call(inp, out=out, **change(inp))
    assert bool(torch.isnan(out).all()), "nothing may be written before the arguments are validated"


def test_indptr_past_indices_rejected():
    inp = _inputs()
    bad = inp.main_indptr.clone()
    bad[-1] = inp.main_indices.numel() + 1
    with pytest.raises(ValueError, match="main_indptr: indptr\\[-1\\]"):
        _call(inp, main_indptr=bad)


def test_workspace_shape_checked():
    inp = _inputs()
    plan = dec.plan_decode("gfx950", 2, 3, inp.main_indices.numel(), inp.extra_indices.numel(), cu_count=2)
    ws = dec.DecodeWorkspace.allocate(2, plan.num_splits + 1, 3, DEV, fill=math.nan)
    with pytest.raises(ValueError, match="workspace.part_m"):
        _call(inp, plan=plan, workspace=ws)
    assert bool(torch.isnan(ws.part_acc).all())


def test_default_scale_is_head_dim_inverse_sqrt():
    assert dec.DEFAULT_SOFTMAX_SCALE == formats.DSV4_HEAD_DIM ** -0.5


# --- build variants (DecodeVariant) and the fp8 path choice -----------------------------------------------------

_VARIANT_CASE = _case(seed=5, batch=2, heads=17, main_bs=16, extra_bs=16, main_lens=(40, 7), extra_lens=(150, 70),
                      invalid_rate=0.1, poison="nan", cu_count=512)  # 512 CUs: the size rule's narrow side


@pytest.mark.parametrize("target,variant", [
    ("generic", dec.DecodeVariant(num_warps=4)),
    ("gfx942", dec.DecodeVariant(num_warps=8, num_stages=2)),
    ("gfx950", dec.DecodeVariant(extra_tile=32, num_stages=1)),
    ("gfx950", dec.DecodeVariant(rope16=True, extra_tile=64)),
    ("gfx942", dec.DecodeVariant(block_h=64, num_warps=8)),
    ("gfx950", dec.DecodeVariant(rope16=True, block_h=32, extra_tile=32)),
    ("generic", dec.DecodeVariant(block_h=64)),
    ("gfx950", dec.DecodeVariant(rope16=True, extra_tile=32, qk_chunks=True)),
    ("gfx950", dec.DecodeVariant(rope16=True, block_h=64, num_warps=8, extra_tile=64, qk_chunks=True)),
], ids=["generic", "gfx942", "gfx950", "gfx950-x64", "gfx942-h64", "gfx950-h32", "generic-h64", "gfx950-qk",
        "gfx950-h64-qk-x64"])
def test_build_variants_compute_what_the_default_computes(target, variant):
    """Every variant with the default's extra tile and no ``block_h`` keeps the operands and the sums: the same bits
    as the default. Another extra tile moves online-softmax step boundaries (rows with >= 64 extra tokens per split),
    and a wider head block makes each dot M = block_h rows (the matrix product may sum in another order), so those
    agree within rounding and keep NaN positions exactly. Natively the compiler schedules each build's fp32 work
    on its own (which products fuse, how an MMA orders its sums), so there every variant is held to the
    rounding bound and the NaN positions, and bit identity is the interpreter's check."""
    fam = get_target(target).decode_family
    plan = dec.plan_decode(target, 2, 17, 47, 220, cu_count=_VARIANT_CASE.cu_count)
    plan = dataclasses.replace(plan, num_splits=1) if fam != "generic" else plan
    inp, ref = _run(_VARIANT_CASE, target, plan=plan)
    with dec.decode_variant(fam, variant) as active:
        assert active == variant
        _, got = _run(_VARIANT_CASE, target, plan=plan)
    assert dec.current_variant(fam) == dec.DEFAULT_VARIANTS[fam]
    assert torch.equal(got.isnan(), ref.isnan())
    dflt = dec.DEFAULT_VARIANTS[fam]
    if isinstance(dflt, dec.SizeRule):  # the build the size rule picked for the reference run (_run's CU count)
        dflt = dec._launch_variant(plan, 2, 17, get_target(target), _VARIANT_CASE.cu_count)
    same_steps = (variant.extra_tile or 64) == (dflt.extra_tile or 64)
    # the reference's own head block counts too: a 16-head build beside the wide one multiplies other matrix shapes,
    # whose sums numpy's BLAS may order differently (which it does depends on the CPU's kernels: bit-equal on one
    # host, 1 ulp apart on another); the case's 512 CUs make the reference the narrow build, so the knobs that keep
    # the head block (warps, stages, rope16, the extra step) are held to the bits
    same_block = (variant.block_h or 16) == (dflt.block_h or 16)
    if same_steps and same_block and not variant.qk_chunks and triton_mode() == "interpreter":
        assert torch.equal(got.view(torch.int16), ref.view(torch.int16))
    else:
        fin = ref.isfinite()
        r, g = ref[fin].float(), got[fin].float()
        assert (g - r).abs().max() <= 2 ** -6 * r.abs().max()


def test_variant_launch_meta_and_the_rope16_alignment_guard():
    seen = []
    case = _VARIANT_CASE.replace(padded=False)
    with dec.launch_observer(lambda r: seen.append(dict(r.meta))):
        with dec.decode_variant("gfx950", dec.DecodeVariant(rope16=True, block_h=32, num_stages=1, num_warps=8)):
            _run(case, "gfx950")
    part = seen[0]
    assert part["num_stages"] == 1 and part["num_warps"] == 8
    assert part["BLOCK_H_"] == 32
    # the flags are what hw_fp8_decode says for gfx950's flavours here (bits under the interpreter)
    t = get_target("gfx950")
    assert part["HW_FP8_MAIN"] is dec.hw_fp8_decode(t.main_cache_is_fnuz)
    assert part["HW_FP8_EXTRA"] is dec.hw_fp8_decode(t.extra_cache_is_fnuz)
    inp = fz.build_decode_inputs(case, get_target("gfx950"))
    assert part["ROPE16"] is (inp.main_cache.stride(0) % 2 == 0 and inp.extra_cache.stride(0) % 2 == 0
                              and inp.main_cache.data_ptr() % 2 == 0 and inp.extra_cache.data_ptr() % 2 == 0)
    odd = torch.empty(2 * 585 * 1 + 1, dtype=torch.uint8)[1:].as_strided((2, 1, 584), (585, 584, 1))
    assert dec._rows_2byte_aligned(odd) is False


def test_fp8_path_is_chosen_from_the_target_flavour_and_the_device(monkeypatch):
    """sparse_attn_decode asks hw_fp8_decode once per cache flavour and passes the answers as constexprs."""
    asked = []

    def fake(is_fnuz, *a, **k):
        asked.append(is_fnuz)
        return False

    monkeypatch.setattr(dec, "hw_fp8_decode", fake)
    seen = []
    with dec.launch_observer(lambda r: seen.append(dict(r.meta))):
        _run(_VARIANT_CASE, "gfx942")
    assert asked == [True, False]  # gfx942: FNUZ main, OCP extra
    assert seen[0]["IS_FNUZ_MAIN"] is True and seen[0]["HW_FP8_MAIN"] is False


def test_subject_agreement_compares_ours_in_upstreams_16_head_design():
    """subject-agreement's bitwise comparison runs ours with the 16-head build where the size rule would pick the
    wide one (upstream has no wide build; under the interpreter numpy may sum a 64-row dot in another order than a
    16-row one on some CPUs, a last-bit difference that is no defect of either); generic has no rule to force."""
    from contracts.decode import _narrow_build

    for fam in ("gfx942", "gfx950"):
        with _narrow_build(dec, get_target(fam)):
            assert dec.current_variant(fam) == dec.NARROW_VARIANTS[fam]
        assert dec.current_variant(fam) == dec.DEFAULT_VARIANTS[fam]
    with _narrow_build(dec, get_target("generic")):
        assert dec.current_variant("generic") == dec.DEFAULT_VARIANTS["generic"]
