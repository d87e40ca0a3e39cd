"""Sparse prefill: both contracts on every target, upstream's guard and routing tests (OPUS through a fake op, as
upstream monkeypatches it), the loader, exact edge cases, and bad input rejected before anything is written."""
from __future__ import annotations

import dataclasses
import json
import math
import sys

import pytest
import torch

import impl  # noqa: F401
from contracts import prefill as _prefill_contracts  # noqa: F401  (registers the contracts)
from fuzz import prefill as fz
from fuzz.cases import CaseError
from impl import prefill as pf
from impl.runtime import kernel_device, triton_mode
from oracles import compare as cmp
from oracles import prefill as ref_prefill

DEV = kernel_device()
HEAD_DIM = 512  # 448 NoPE + 64 RoPE


def _assert_matches_oracle(got, q, kv, scale, sink, **idx):
    ref = ref_prefill.ref_sparse_attn_prefill(q, kv, softmax_scale=scale, attn_sink=sink,
                                              out_width=int(got.shape[-1]), **idx)
    tol = ref_prefill.prefill_tolerance(ref, fz.dtype_name(q.dtype), triton_mode(), int(q.shape[-1]),
                                        fz.dtype_name(got.dtype))
    bad = cmp.compare_attention(got.cpu(), ref.out, tol)
    assert not bad, bad[:3]
    return ref, tol


def test_upstream_ragged_example_matches_oracle():
    # upstream's ragged prefill test: rows [[0, 2], [1, 3, 4], []] with an ordinary sink
    g = torch.Generator().manual_seed(0)
    q = (torch.randn(3, 3, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).to(DEV)
    kv = (torch.randn(5, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).to(DEV)
    indices = torch.tensor([0, 2, 1, 3, 4], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, 2, 5, 5], dtype=torch.int32, device=DEV)
    sink = torch.tensor([-0.25, 0.0, 0.25], dtype=torch.float32, device=DEV)
    out = pf.sparse_attn_prefill(q, kv, indices, HEAD_DIM ** -0.5, sink, indptr=indptr, target="gfx950")
    _assert_matches_oracle(out, q, kv, HEAD_DIM ** -0.5, sink, indices=indices.tolist(), indptr=indptr.tolist())
    # the empty row keeps only the sink: a zero-value logit, so exactly 0
    assert torch.equal(out[2].cpu(), torch.zeros(3, HEAD_DIM, dtype=torch.bfloat16))


@pytest.mark.parametrize("d", [448 + 64, 512 + 64])
def test_empty_rows_and_nope_wide_output_exact(d):
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 2, d, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.randn(6, 1, d, generator=g).to(torch.bfloat16).to(DEV)
    kv[5] = math.nan  # no kept entry reaches it
    dense = torch.tensor([[1, 4, 5], [-1, 6, 5], [5, 5, 5]], dtype=torch.int32, device=DEV)
    topk = torch.tensor([2, 2, 0], dtype=torch.int32, device=DEV)
    full = pf.sparse_attn_prefill(q, kv, dense, 0.07, None, topk_length=topk, target="generic")
    nope = torch.full((3, 2, d - 64), math.nan, dtype=torch.bfloat16, device=DEV)
    pf.sparse_attn_prefill(q, kv, dense, 0.07, None, nope, topk_length=topk, target="generic")
    # nope-wide output is the first nope lanes of the full one, bit for bit (same tiles, RoPE lanes not stored)
    assert torch.equal(nope.cpu(), full[..., : d - 64].cpu())
    # row 1 has only invalid entries (-1, 6 >= skv), row 2 none: no sink, so exactly 0
    assert torch.equal(full[1:].cpu(), torch.zeros(2, 2, d, dtype=torch.bfloat16))
    _assert_matches_oracle(full, q, kv, 0.07, None, dense=dense.tolist(), topk_length=topk.tolist())


def test_fp16_matches_oracle():
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 3, 576, generator=g).to(torch.float16).to(DEV)
    kv = torch.randn(7, 576, generator=g).to(torch.float16).to(DEV)
    dense = torch.tensor([[0, 3, 6, 2], [5, -1, 1, 1]], dtype=torch.int64, device=DEV)
    sink = torch.tensor([0.5, -math.inf, 3.0, 9.0], dtype=torch.float32, device=DEV)
    out = pf.sparse_attn_prefill(q, kv, dense, 0.05, sink, target="gfx942")
    assert out.dtype == torch.float16
    # fp16's own model: unit 2^-11 and an absolute underflow floor (oracles.prefill.prefill_error_model)
    _assert_matches_oracle(out, q, kv, 0.05, sink, dense=dense.tolist(), topk_length=None)


def test_fp16_output_underflow_is_within_the_floor():
    # a dominating sink pushes the output below fp16's range: the kernel stores 0 where the oracle has ~1e-8,
    # which no relative bound covers; the floor 2^-25 (1 + sum_j |v_j|) does
    g = torch.Generator().manual_seed(11)
    q = torch.randn(2, 2, 576, generator=g).to(torch.float16).to(DEV)
    kv = torch.randn(5, 576, generator=g).to(torch.float16).to(DEV)
    dense = torch.tensor([[0, 1, 2, 3], [4, 3, -1, 0]], dtype=torch.int32, device=DEV)
    sink = torch.tensor([20.0, 20.0], dtype=torch.float32, device=DEV)
    out = pf.sparse_attn_prefill(q, kv, dense, 0.05, sink, target="generic")
    ref, tol = _assert_matches_oracle(out, q, kv, 0.05, sink, dense=dense.tolist(), topk_length=None)
    tiny = (ref.out.abs() > 0) & (ref.out.abs() < ref_prefill.FP16_SUBNORMAL / 2)
    assert bool(tiny.any()) and bool((out.cpu()[tiny] == 0).all())
    assert bool((tol[tiny] >= ref_prefill.FP16_SUBNORMAL / 2).all())


def test_spec_tile_and_fp16_model():
    # SPEC 3's literal BLOCK_K, and the fp16 units: no bf16 unit stands in for fp16
    assert [ref_prefill.spec_block_k(d) for d in (128, 255, 256, 512, 576)] == [32, 32, 16, 16, 16]
    m16 = ref_prefill.prefill_error_model("float16", triton_mode(), 576)
    assert m16.operand_unit == m16.output_unit == 2.0 ** -11 and m16.dot_len == 576
    assert ref_prefill.prefill_error_model("bfloat16", triton_mode(), 512).output_unit >= 2.0 ** -8
    # an out of another dtype rounds as that dtype; p keeps the input's unit
    m = ref_prefill.prefill_error_model("float16", triton_mode(), 576, "float32")
    assert m.output_unit == 0 and m.operand_unit == 2.0 ** -11
    m = ref_prefill.prefill_error_model("bfloat16", triton_mode(), 576, "float16")
    assert m.output_unit == 2.0 ** -11 and m.operand_unit >= 2.0 ** -8


def test_multi_tile_rows_and_a_second_head_block():
    # 40-entry rows span three BLOCK_K = 16 tiles (the online softmax rescales across them); 17 heads need a
    # second head block of one live head
    g = torch.Generator().manual_seed(12)
    q = torch.randn(2, 17, 512, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.randn(48, 512, generator=g).to(torch.bfloat16).to(DEV)
    indices = torch.randperm(48, generator=g)[:40].repeat(2).to(torch.int32).to(DEV)
    indptr = torch.tensor([0, 40, 80], dtype=torch.int32, device=DEV)
    sink = torch.linspace(-1.0, 1.0, 17, dtype=torch.float32).to(DEV)
    out = torch.full_like(q, math.nan)
    pf.sparse_attn_prefill(q, kv, indices, 0.11, sink, out, indptr=indptr, target="generic")
    _assert_matches_oracle(out, q, kv, 0.11, sink, indices=indices.tolist(), indptr=indptr.tolist())


@pytest.mark.parametrize("q_dtype,out_dtype", [(torch.bfloat16, torch.float32), (torch.bfloat16, torch.float16),
                                               (torch.float16, torch.bfloat16), (torch.float16, torch.float32)])
def test_out_of_another_float_dtype_is_converted_on_store(q_dtype, out_dtype):
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, 576, generator=g).to(q_dtype).to(DEV)
    kv = torch.randn(9, 576, generator=g).to(q_dtype).to(DEV)
    dense = torch.tensor([[0, 3, 8, 2, -1], [5, 7, 1, 4, 6]], dtype=torch.int32, device=DEV)
    sink = torch.tensor([0.5, -math.inf, 3.0], dtype=torch.float32, device=DEV)
    out = torch.full((2, 3, 576), math.nan, dtype=out_dtype, device=DEV)
    pf.sparse_attn_prefill(q, kv, dense, 0.05, sink, out, target="gfx950")
    _assert_matches_oracle(out, q, kv, 0.05, sink, dense=dense.tolist(), topk_length=None)
    if out_dtype == torch.float32:
        # the same fp32 result, stored without rounding: q's dtype is exactly its rounding (to nearest natively;
        # the interpreter truncates bf16)
        same = pf.sparse_attn_prefill(q, kv, dense, 0.05, sink, target="gfx950")
        err = (out.cpu().to(q_dtype).float() - same.cpu().float()).abs()
        unit = 2.0 ** -7 if q_dtype == torch.bfloat16 else 2.0 ** -10
        assert bool((err <= unit * same.cpu().float().abs()).all())


def test_dense_rows_are_read_in_place_and_equal_the_ragged_rows_bit_for_bit(monkeypatch):
    g = torch.Generator().manual_seed(14)
    q = torch.randn(3, 17, 576, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.randn(40, 576, generator=g).to(torch.bfloat16).to(DEV)
    kv[39] = math.nan  # only entries past a row's length point at it
    width = 36
    lens = [36, 20, 0]
    rows = [torch.randperm(39, generator=g)[:n].tolist() + [39] * (width - n) for n in lens]
    rows[1][3] = -1
    rows[1][5] = 2 ** 31 - 1
    buf = torch.full((3, 1, width + 4), 39, dtype=torch.int64)
    buf[:, 0, :width] = torch.tensor(rows)
    dense = buf.to(DEV)[:, :, :width]  # [sq, 1, k] with a padded row stride
    topk = torch.tensor(lens, dtype=torch.int32, device=DEV)
    sink = torch.linspace(-1.0, 1.0, 17, dtype=torch.float32).to(DEV)
    ragged = torch.tensor([v for r, n in zip(rows, lens) for v in r[:n]], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, 36, 56, 56], dtype=torch.int32, device=DEV)
    want = pf.sparse_attn_prefill(q, kv, ragged, 0.11, sink, indptr=indptr, target="generic")
    monkeypatch.setattr(pf, "build_ragged_indices_from_dense",
                        lambda *a, **k: pytest.fail("dense rows converted on the Triton path"))
    got = pf.sparse_attn_prefill(q, kv, dense, 0.11, sink, topk_length=topk, target="generic")
    assert torch.equal(got.cpu(), want.cpu())  # the same entries in the same tiles: the same bits
    _assert_matches_oracle(got, q, kv, 0.11, sink, dense=[r for r in rows], topk_length=lens)


# --- the guard (upstream's selection tests, on fake tensors: "q on the GPU" needs no GPU) ---------------------

_BASE = fz.GuardCase(sq=1024, heads=16, d=HEAD_DIM, dtype="bfloat16", gpu="cuda:0", skv=1024, combos=())
_ONE_GPU = "needs a second GPU the fake mode can name: " + fz.NO_SECOND_GPU_REASON


@pytest.mark.parametrize(("sq", "target", "expected"), [
    (1023, "gfx950", False), (1024, "gfx950", True), (1024, "gfx942", False), (1024, "generic", False),
    (4096, "gfx950", True), (1, "gfx950", False)])
def test_guard_threshold(sq, target, expected):
    q, kv, sink, out = fz.guard_tensors(_BASE.replace(sq=sq), [])
    assert pf.OPUS_MIN_QUERIES == 1024
    assert pf.can_use_aiter_sparse_prefill_opus(q, kv, sink, out, target=target) is expected
    attrs = fz.tensor_attributes(target, q, kv, sink, out)
    assert ref_prefill.opus_guard_expected(attrs) is expected


@pytest.mark.parametrize("pert", ["out_heads_major", "sink_short", "all_cpu", "sink_bf16", "sink_none",
                                  "q_last_dim_strided", "kv_other_gpu", "out_nope_wide"])
def test_guard_rejects_incompatible_inputs(pert):
    if pert in fz.SECOND_GPU_PERTURBATIONS and len(fz.guard_gpus()) < 2:
        pytest.skip(_ONE_GPU)
    q, kv, sink, out = fz.guard_tensors(_BASE, [pert])
    assert not pf.can_use_aiter_sparse_prefill_opus(q, kv, sink, out, target="gfx950")
    assert ref_prefill.opus_guard_failures(fz.tensor_attributes("gfx950", q, kv, sink, out))


@pytest.mark.parametrize("pert", ["all_fp16", "kv_3d", "kv_row_padded", "q_and_out_heads_major", "sq=1025"])
def test_guard_keeps_compatible_variants(pert):
    q, kv, sink, out = fz.guard_tensors(_BASE, [pert])
    assert pf.can_use_aiter_sparse_prefill_opus(q, kv, sink, out, target="gfx950")


_DEVICE_CONDITIONS = {"kv on q's device", "out on q's device", "sink on q's device"}


def _index_blind_guard(real):
    """The guard comparing device types instead of devices: True wherever the only conditions that fail are the
    same-device ones and every tensor is on some GPU."""
    def guard(q, kv, attn_sink, out, *, target=None):
        if real(q, kv, attn_sink, out, target=target):
            return True
        name = getattr(target, "name", target)
        fails = set(ref_prefill.opus_guard_failures(fz.tensor_attributes(name, q, kv, attn_sink, out)))
        tensors = (q, kv, out) + ((attn_sink,) if attn_sink is not None else ())
        return bool(fails) and fails <= _DEVICE_CONDITIONS and all(t.is_cuda for t in tensors)

    return guard


def test_guard_check_covers_kv_out_and_sink_on_another_gpu_here(monkeypatch):
    # the emulation's fakes name two GPUs, so the contract's guard check reaches the multi-device conditions and
    # catches a guard that compares device types rather than devices
    from contracts import prefill as cp
    from impl.targets import get_target

    if len(fz.guard_gpus()) < 2:
        pytest.skip(_ONE_GPU)
    seen = []
    real = pf.can_use_aiter_sparse_prefill_opus

    def recording(q, kv, attn_sink, out, *, target=None):
        seen.append({str(t.device) for t in (q, kv, out) + ((attn_sink,) if attn_sink is not None else ())})
        return real(q, kv, attn_sink, out, target=target)

    monkeypatch.setattr(pf, "can_use_aiter_sparse_prefill_opus", recording)
    assert cp._guard_violations(_BASE, get_target("gfx950")) == []
    assert any(len(devs) == 2 and all(d.startswith("cuda:") for d in devs) for devs in seen)
    monkeypatch.setattr(pf, "can_use_aiter_sparse_prefill_opus", _index_blind_guard(real))
    broken = cp._guard_violations(_BASE, get_target("gfx950"))
    assert {v.where.split("perturbations=")[1] for v in broken} == {"['kv_other_gpu']", "['out_other_gpu']",
                                                                    "['sink_other_gpu']"}


def test_one_gpu_host_generates_no_second_gpu(monkeypatch):
    # a one-GPU CUDA host, simulated: the fake mode there initialises every device a fake tensor names, so cuda:1
    # ("invalid device ordinal") is never drawn and the other-GPU perturbations are left out, with the reason
    from hypothesis import given, settings

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert fz.guard_gpus() == ("cuda:0",)
    assert set(fz.guard_perturbations()) == set(fz.GUARD_PERTURBATIONS) - set(fz.SECOND_GPU_PERTURBATIONS)
    drawn = []

    @settings(max_examples=60, deadline=None, database=None)
    @given(fz.routing_cases())
    def collect(case):
        drawn.append(case.guard)

    collect()
    assert all(g.gpu == "cuda:0" for g in drawn)
    assert not {p for g in drawn for c in g.combos for p in c} & set(fz.SECOND_GPU_PERTURBATIONS)
    assert any(g.combos for g in drawn)
    # a reproducer from a bigger host is refused before any tensor, saying why
    with pytest.raises(CaseError, match="needs a second GPU.*invalid device ordinal"):
        fz.guard_tensors(_BASE, ["kv_other_gpu"])
    with pytest.raises(CaseError, match="needs cuda:1"):
        fz.guard_tensors(_BASE.replace(gpu="cuda:1"), [])
    # and a multi-GPU host names its devices
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert fz.guard_gpus() == ("cuda:0", "cuda:1") and fz.guard_perturbations() == fz.GUARD_PERTURBATIONS


def test_real_guard_is_false_for_cpu_tensors_even_with_an_op(monkeypatch):
    # 1024 real CPU rows on gfx950: every condition holds but "q on the GPU", so OPUS is never asked
    cpu = torch.device("cpu")
    q = torch.zeros(1024, 1, HEAD_DIM, dtype=torch.bfloat16, device=cpu)
    kv = torch.zeros(4, 1, HEAD_DIM, dtype=torch.bfloat16, device=cpu)
    sink = torch.zeros(1, dtype=torch.float32, device=cpu)
    indices = torch.zeros(1024, 1, dtype=torch.int32, device=cpu)
    assert ref_prefill.opus_guard_failures(fz.tensor_attributes("gfx950", q, kv[:, 0], sink, torch.empty_like(q))) \
        == ["q on the GPU"]
    assert pf.can_use_aiter_sparse_prefill_opus(q, kv[:, 0], sink, torch.empty_like(q), target="gfx950") is False
    calls = {"op": 0, "triton": 0}
    monkeypatch.setattr(pf, "get_aiter_sparse_prefill_opus",
                        lambda: lambda *a, **k: calls.__setitem__("op", calls["op"] + 1))
    monkeypatch.setattr(pf, "sparse_attn_prefill_triton",
                        lambda *a, **k: calls.__setitem__("triton", calls["triton"] + 1))
    if DEV == "cpu":
        pf.sparse_attn_prefill(q, kv, indices, 0.1, sink, target="gfx950")
        assert calls == {"op": 0, "triton": 1}
    else:  # the kernels run on the GPU here: the entry refuses CPU tensors before the guard or any launch
        with pytest.raises(ValueError, match="q: kernels run on"):
            pf.sparse_attn_prefill(q, kv, indices, 0.1, sink, target="gfx950")
        assert calls == {"op": 0, "triton": 0}


# --- typed cases -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["prefill", "routing"])
def test_cases_round_trip_and_reject_a_missing_field(name):
    from hypothesis import given, settings

    cls, strategy = {"prefill": (fz.PrefillCase, fz.prefill_cases()), "routing": (fz.RoutingCase, fz.routing_cases())}[name]

    @settings(max_examples=40, deadline=None, database=None)
    @given(strategy)
    def round_trip(case):
        doc = json.loads(json.dumps(case.to_json()))
        assert cls.from_json(doc) == case
        for f in dataclasses.fields(cls):
            if f.name in cls.ADDED_FIELDS:  # added later: a case saved before it replays with the default
                assert cls.from_json({k: v for k, v in doc.items() if k != f.name}).replace(
                    **{f.name: getattr(case, f.name)}) == case
                continue
            with pytest.raises(CaseError, match=f"missing field {f.name}"):
                cls.from_json({k: v for k, v in doc.items() if k != f.name})
        if cls is fz.RoutingCase:
            for sub, sub_cls in (("inputs", fz.PrefillCase), ("guard", fz.GuardCase)):
                for f in dataclasses.fields(sub_cls):
                    if f.name in sub_cls.ADDED_FIELDS:
                        continue
                    broken = json.loads(json.dumps(doc))
                    del broken[sub][f.name]
                    with pytest.raises(CaseError, match=rf"{sub}: missing field {f.name}"):
                        cls.from_json(broken)

    round_trip()


def test_cases_reject_bad_values():
    doc = fz.RoutingCase(inputs=_prefill_contracts._routing_examples(None)[0].inputs, fallback="no_op",
                         guard=_BASE.replace(combos=(("q_cpu", "kv_dtype"),))).to_json()
    doc["guard"]["combos"][0][1] = "kv_on_mars"
    with pytest.raises(CaseError, match=r"guard.combos\[0\]\[1\]: expected one of"):
        fz.RoutingCase.from_json(doc)
    with pytest.raises(ValueError, match="gpu: expected a device like 'cuda:0'"):
        _BASE.replace(gpu="cpu")
    with pytest.raises(ValueError, match="lens: a dense row holds at most width"):
        _prefill_contracts._agreement_examples(None)[0].replace(lens=(9, 0, 0))


# --- routing (upstream's monkeypatched tests) -------------------------------------------------------------------

def _tiny():
    g = torch.Generator().manual_seed(9)
    q = torch.randn(2, 1, HEAD_DIM, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.randn(3, 1, HEAD_DIM, generator=g).to(torch.bfloat16).to(DEV)
    dense = torch.tensor([[0, 2], [1, 2]], dtype=torch.int32, device=DEV)
    topk = torch.tensor([1, 2], dtype=torch.int32, device=DEV)
    sink = torch.tensor([0.3, 7.0], dtype=torch.float32, device=DEV)  # padded past h = 1
    return q, kv, dense, topk, sink


def test_routing_converts_dense_and_sends_an_empty_second_segment(monkeypatch):
    q, kv, dense, topk, sink = _tiny()
    out = torch.full_like(q, math.nan)
    seen = []

    def fake_opus(*args, out):
        seen.append(args)
        out.zero_()
        return out

    monkeypatch.setattr(pf, "can_use_aiter_sparse_prefill_opus", lambda *a, **k: True)
    monkeypatch.setattr(pf, "get_aiter_sparse_prefill_opus", lambda: fake_opus)
    monkeypatch.setattr(pf, "sparse_attn_prefill_triton", lambda *a, **k: pytest.fail("unexpected Triton fallback"))
    pf.sparse_attn_prefill(q, kv, dense, 0.125, sink, out, topk_length=topk, target="gfx950")
    assert len(seen) == 1
    a = seen[0]
    assert a[2].dtype == torch.int32 and a[2].tolist() == [0, 1, 2]
    assert a[3].dtype == torch.int32 and a[3].tolist() == [0, 1, 3]
    assert a[5].numel() == 0 and a[6].tolist() == [0, 0, 0]
    assert tuple(a[1].shape) == (3, HEAD_DIM) and a[7].tolist() == [pytest.approx(0.3)] and a[8] == 0.125
    assert torch.count_nonzero(out) == 0


def test_opus_gets_only_valid_entries():
    # masked entries add nothing, and AITER requires every index it is given to be a valid row
    idx = torch.tensor([9, 9, 0, -1, 3, 4, 2, -7, 2 ** 31 - 1, 1, 9], dtype=torch.int32, device=DEV)
    ptr = torch.tensor([2, 5, 5, 10], dtype=torch.int32, device=DEV)
    got_idx, got_ptr = pf.valid_entries_only(idx, ptr, 4)
    assert got_idx.dtype == torch.int32 and got_ptr.dtype == torch.int32
    assert got_idx.tolist() == [0, 3, 2, 1] and got_ptr.tolist() == [0, 2, 2, 4]
    assert (got_idx.tolist(), got_ptr.tolist()) == ref_prefill.ref_opus_ragged(idx.tolist(), ptr.tolist(), 4)


@pytest.mark.parametrize("scenario", ["no_op", "op_raises"])
def test_triton_fallback_result_stands(monkeypatch, scenario):
    q, kv, dense, topk, sink = _tiny()
    out = torch.full_like(q, math.nan)
    calls = []

    def failing_opus(*args, out):
        calls.append(1)
        out.fill_(math.nan)
        raise RuntimeError("only D = 512 compiled")

    monkeypatch.setattr(pf, "can_use_aiter_sparse_prefill_opus", lambda *a, **k: True)
    monkeypatch.setattr(pf, "get_aiter_sparse_prefill_opus", lambda: None if scenario == "no_op" else failing_opus)
    pf.sparse_attn_prefill(q, kv, dense, 0.125, sink, out, topk_length=topk, target="gfx950")
    assert len(calls) == (scenario == "op_raises")
    _assert_matches_oracle(out, q, kv, 0.125, sink, dense=dense.tolist(), topk_length=topk.tolist())


# --- the loader ------------------------------------------------------------------------------------------------

@pytest.fixture
def fresh_loader():
    pf.get_aiter_sparse_prefill_opus.cache_clear()
    yield pf.get_aiter_sparse_prefill_opus
    pf.get_aiter_sparse_prefill_opus.cache_clear()


def test_loader_finds_the_op_in_a_fake_aiter(fake_module, fresh_loader):
    def op(*args, out=None):
        return out

    leaf = fake_module("aiter.ops.pa_sparse_prefill_opus", pa_sparse_prefill_opus=op)
    ops = fake_module("aiter.ops", pa_sparse_prefill_opus=leaf)
    fake_module("aiter", ops=ops)
    assert fresh_loader() is op


def test_loader_is_none_without_the_op(monkeypatch, fake_module, fresh_loader):
    ops = fake_module("aiter.ops")
    fake_module("aiter", ops=ops)
    monkeypatch.setitem(sys.modules, "aiter.ops.pa_sparse_prefill_opus", None)  # import fails
    assert fresh_loader() is None


def test_loader_is_none_for_the_unrelated_pypi_aiter(monkeypatch, fake_module, fresh_loader):
    fake_module("aiter")  # no aiter.ops: PyPI's async-iterator package
    monkeypatch.setitem(sys.modules, "aiter.ops", None)
    assert fresh_loader() is None


# --- bad input ---------------------------------------------------------------------------------------------------

def _bad_calls():
    q = torch.zeros(2, 3, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    kv = torch.zeros(4, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    dense = torch.zeros(2, 3, dtype=torch.int32, device=DEV)
    ragged = torch.zeros(3, dtype=torch.int32, device=DEV)
    sink = torch.zeros(3, dtype=torch.float32, device=DEV)
    ok = dict(q=q, kv=kv, indices=dense, softmax_scale=0.1, attn_sink=sink)
    return [
        (dict(ok, q=q.float()), TypeError, "q"),
        (dict(ok, q=q[0]), ValueError, "q"),
        (dict(ok, kv=kv.half()), TypeError, "kv"),
        (dict(ok, kv=kv[:, :448]), ValueError, "kv"),
        (dict(ok, kv=kv.reshape(4, 2, 256)), ValueError, "kv"),
        (dict(ok, indices=dense.float()), TypeError, "indices"),
        (dict(ok, indices=dense[:1]), ValueError, "indices"),
        (dict(ok, topk_length=torch.ones(3, dtype=torch.int32, device=DEV)), ValueError, "topk_length"),
        (dict(ok, indices=ragged, indptr=torch.tensor([0, 2], dtype=torch.int32, device=DEV)), ValueError, "indptr"),
        (dict(ok, indices=ragged, indptr=torch.tensor([0, 2, 1], dtype=torch.int32, device=DEV)), ValueError,
         "indptr"),
        (dict(ok, indices=ragged, indptr=torch.tensor([0, 2, 4], dtype=torch.int32, device=DEV)), ValueError,
         "indptr"),
        (dict(ok, indices=ragged.long(), indptr=torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV)), TypeError,
         "indices"),
        (dict(ok, indices=ragged, indptr=torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
              topk_length=torch.ones(2, dtype=torch.int32, device=DEV)), ValueError, "topk_length"),
        (dict(ok, softmax_scale=math.nan), ValueError, "softmax_scale"),
        (dict(ok, softmax_scale=True), ValueError, "softmax_scale"),
        (dict(ok, attn_sink=sink.to(torch.bfloat16)), TypeError, "attn_sink"),
        (dict(ok, attn_sink=sink[:2]), ValueError, "attn_sink"),
        (dict(ok, out=torch.zeros(2, 3, 500, dtype=torch.bfloat16, device=DEV)), ValueError, "out"),
        (dict(ok, out=torch.zeros(2, 3, HEAD_DIM, dtype=torch.float64, device=DEV)), TypeError, "out"),
        (dict(ok, out=torch.zeros(2, 3, HEAD_DIM, dtype=torch.int16, device=DEV)), TypeError, "out"),
        (dict(ok, rope_head_dim=HEAD_DIM), ValueError, "rope_head_dim"),
    ]


def _overlapping_outs():
    """(out, the input it aliases or None, ...) builders: each out must be rejected naming ``out``."""
    base = torch.full((2, 3, 2 * HEAD_DIM), math.nan, dtype=torch.bfloat16, device=DEV)
    return [
        ("expanded", lambda: torch.full((1, 1, HEAD_DIM), math.nan, dtype=torch.bfloat16, device=DEV)
         .expand(2, 3, HEAD_DIM), {}),
        ("rows-overlap", lambda: base.as_strided((2, 3, HEAD_DIM), (HEAD_DIM, 8, 1)), {}),
        ("is-q", lambda: base[..., :HEAD_DIM], {"q": lambda o: o}),
        ("inside-q-buffer", lambda: base[..., HEAD_DIM:], {"q": lambda o: base[..., :HEAD_DIM]}),
        ("over-kv", lambda: base[..., :HEAD_DIM], {"kv": lambda o: base.reshape(-1, HEAD_DIM)[:4]}),
        ("over-sink", lambda: base[..., :HEAD_DIM],
         {"attn_sink": lambda o: base.view(torch.float32).reshape(-1)[:3]}),
    ]


@pytest.mark.parametrize("i", range(len(_overlapping_outs())))
def test_overlapping_out_rejected_before_any_write(i):
    _, make_out, swaps = _overlapping_outs()[i]
    out = make_out()
    kwargs = dict(q=torch.zeros(2, 3, HEAD_DIM, dtype=torch.bfloat16, device=DEV),
                  kv=torch.zeros(4, HEAD_DIM, dtype=torch.bfloat16, device=DEV),
                  indices=torch.zeros(2, 3, dtype=torch.int32, device=DEV), softmax_scale=0.1,
                  attn_sink=torch.zeros(3, dtype=torch.float32, device=DEV), out=out)
    for name, f in swaps.items():
        kwargs[name] = f(out)
    storage = out.as_strided((out.untyped_storage().nbytes() // 2,), (1,), 0)
    before = storage.view(torch.int16).clone()
    with pytest.raises(ValueError, match=r"^out: "):
        pf.sparse_attn_prefill(**kwargs, target="gfx950")
    assert torch.equal(storage.view(torch.int16), before)


def test_padded_and_transposed_outs_are_accepted():
    # the overlap checks reject no ordinary layout: a padded buffer and a heads-major out give the oracle's result
    g = torch.Generator().manual_seed(13)
    q = torch.randn(2, 3, HEAD_DIM, generator=g).to(torch.bfloat16).to(DEV)
    kv = torch.randn(4, HEAD_DIM, generator=g).to(torch.bfloat16).to(DEV)
    dense = torch.tensor([[0, 1, 3], [2, -1, 1]], dtype=torch.int32, device=DEV)
    outs = [torch.full((2, 3, HEAD_DIM + 8), math.nan, dtype=torch.bfloat16, device=DEV)[..., :HEAD_DIM],
            torch.full((3, 2, HEAD_DIM), math.nan, dtype=torch.bfloat16, device=DEV).transpose(0, 1)]
    for out in outs:
        pf.sparse_attn_prefill(q, kv, dense, 0.1, None, out, target="generic")
        _assert_matches_oracle(out, q, kv, 0.1, None, dense=dense.tolist(), topk_length=None)


@pytest.mark.parametrize("i", range(len(_bad_calls())))
def test_bad_input_rejected_before_any_write(i):
    kwargs, exc, name = _bad_calls()[i]
    poison = torch.full((2, 3, HEAD_DIM), math.nan, dtype=torch.bfloat16, device=DEV)
    kwargs.setdefault("out", poison)
    before = kwargs["out"].clone()
    with pytest.raises(exc, match=name):
        pf.sparse_attn_prefill(**kwargs, target="gfx950")
    assert torch.equal(kwargs["out"].view(torch.int16), before.view(torch.int16))


def test_zero_rows_launch_nothing(monkeypatch):
    monkeypatch.setattr(pf, "sparse_attn_prefill_triton", lambda *a, **k: pytest.fail("launched for sq = 0"))
    q = torch.zeros(0, 2, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    out = pf.sparse_attn_prefill(q, torch.zeros(1, HEAD_DIM, dtype=torch.bfloat16, device=DEV),
                                 torch.zeros(0, 4, dtype=torch.int32, device=DEV), 0.1)
    assert tuple(out.shape) == (0, 2, HEAD_DIM)


# --- real hardware -------------------------------------------------------------------------------------------

@pytest.mark.gfx950
def test_real_opus_matches_oracle():
    op = pf.get_aiter_sparse_prefill_opus()
    if op is None:
        pytest.skip("needs AMD AITER with aiter.ops.pa_sparse_prefill_opus: not importable here")
    g = torch.Generator().manual_seed(4)
    sq, h = 8, 16
    q = (torch.randn(sq, h, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).cuda()
    kv = (torch.randn(sq, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).cuda()
    rows = [list(range(r + 1)) for r in range(sq)]
    indices = torch.tensor([i for row in rows for i in row], dtype=torch.int32).cuda()
    indptr = torch.tensor([0] + [sum(len(x) for x in rows[: r + 1]) for r in range(sq)], dtype=torch.int32).cuda()
    sink = torch.linspace(-0.25, 0.25, h, dtype=torch.float32).cuda()
    out = torch.full_like(q, math.nan)
    assert pf.run_aiter_sparse_prefill_opus(op, q, kv, indices, indptr, HEAD_DIM ** -0.5, sink, out)
    # OPUS is not the Triton kernel: compare under the native model (bf16 operands, GPU exp)
    _assert_matches_oracle(out, q, kv, HEAD_DIM ** -0.5, sink, indices=indices.tolist(), indptr=indptr.tolist())


# --- the gfx942 AITER pa_prefill_sparse route (SPEC 10) -----------------------------------------------------------

_PA_BASE = fz.AiterGuardCase(sq=512, heads=16, d=HEAD_DIM, dtype="bfloat16", gpu="cuda:0", skv=64, combos=())


@pytest.mark.parametrize(("sq", "target", "expected"), [
    (511, "gfx942", False), (512, "gfx942", True), (513, "gfx942", True), (1, "gfx942", False),
    (512, "gfx950", False), (4096, "gfx950", False), (512, "generic", False)])
def test_aiter_pa_guard_threshold_and_architecture(sq, target, expected):
    from impl.targets import get_target

    assert get_target("gfx942").aiter_pa_prefill_sparse_min_queries == 512
    assert get_target("gfx950").aiter_pa_prefill_sparse_min_queries is None
    q, kv = fz.aiter_guard_tensors(_PA_BASE.replace(sq=sq), [])
    assert pf.can_use_aiter_pa_prefill_sparse(q, kv, target=target) is expected
    assert ref_prefill.aiter_pa_guard_expected(fz.aiter_guard_attributes(target, q, kv)) is expected


@pytest.mark.parametrize(("pert", "broken"), [
    ("q_fp32", ["q bf16 or fp16", "kv dtype == q dtype"]), ("all_fp32", ["q bf16 or fp16"]),
    ("kv_dtype", ["kv dtype == q dtype"]), ("sq=511", ["sq >= 512"]),
    # the guard asks nothing of devices, layouts, head dims: these keep it true
    ("all_fp16", []), ("all_cpu", []), ("q_cpu", []), ("kv_3d", []), ("q_heads_major", []), ("kv_narrow", []),
    ("kv_last_dim_strided", [])])
def test_aiter_pa_guard_conditions(pert, broken):
    q, kv = fz.aiter_guard_tensors(_PA_BASE, [pert])
    assert ref_prefill.aiter_pa_guard_failures(fz.aiter_guard_attributes("gfx942", q, kv)) == broken
    assert pf.can_use_aiter_pa_prefill_sparse(q, kv, target="gfx942") is (not broken)


def test_aiter_pa_guard_check_catches_an_off_by_one(monkeypatch):
    from contracts import prefill as cp
    from impl.targets import get_target

    t = get_target("gfx942")
    assert all(cp._aiter_guard_violations(_PA_BASE, get_target(n)) == [] for n in ("gfx942", "gfx950", "generic"))
    real = pf.can_use_aiter_pa_prefill_sparse
    monkeypatch.setattr(pf, "can_use_aiter_pa_prefill_sparse",
                        lambda q, kv, *, target=None: real(q, kv, target=target) and q.shape[0] > 512)
    broken = cp._aiter_guard_violations(_PA_BASE, t)
    # the base (512 rows) and every perturbation that keeps it eligible at 512 rows
    assert {v.where.split("perturbations=")[1] for v in broken} == {
        "[]", "['sq=512']", "['all_fp16']", "['q_cpu']", "['all_cpu']", "['kv_3d']", "['q_heads_major']",
        "['kv_narrow']", "['kv_last_dim_strided']"}
    assert {v.message for v in broken} == {"gfx942 AITER guard differs from SPEC 10's truth table"}


def test_aiter_pa_rows_oracle():
    # dense: the first clamp(len, 0, k) entries, valid ones only (-1, past skv and INT32_MAX dropped), in order
    dense = [[3, -1, 9, 1, 2], [0, 0, 4, 4, 1], [2, 2, 2, 2, 2]]
    assert ref_prefill.ref_aiter_pa_rows(5, dense=dense, topk_length=[4, 7, -1]) == [[3, 1], [0, 0, 4, 4, 1], []]
    assert ref_prefill.ref_aiter_pa_rows(5, dense=[[3, 2 ** 31 - 1, 1, -1, 4]]) == [[3, 1]]  # count(idx >= 0) = 4
    # ragged: the caller's rows as given, invalid entries included, junk outside indptr left out
    assert ref_prefill.ref_aiter_pa_rows(4, indices=[7, 3, -1, 9, 0, 8], indptr=[1, 4, 4, 5]) == [[3, -1, 9], [], [0]]


def _pa_route_inputs(**kw):
    from contracts import prefill as cp
    from impl.targets import get_target

    return fz.build_prefill_inputs(cp._aiter_routing_examples(get_target("gfx942"))[0].inputs.replace(**kw))


def test_aiter_pa_route_converts_dense_rows_and_copies_a_narrow_result():
    from contracts import prefill as cp
    from impl.targets import get_target

    t = get_target("gfx942")
    inp = _pa_route_inputs()  # dense, topk_length with quirks, invalid entries and INT32 extremes, nope-wide out
    rec = cp._route_pa(inp, t, True, "ok")
    assert (len(rec["op"]), rec["triton"], rec["escaped"]) == (1, 0, None)
    args, kw = rec["op"][0]
    assert args[2].dtype == torch.int32 and args[3].dtype == torch.int32 and args[3].tolist()[0] == 0
    ptr = args[3].tolist()
    rows = [args[2].tolist()[ptr[r]:ptr[r + 1]] for r in range(inp.q.shape[0])]
    assert rows == ref_prefill.ref_aiter_pa_rows(int(inp.kv.shape[0]), dense=inp.dense, topk_length=inp.topk_list)
    assert all(0 <= s < inp.kv.shape[0] for row in rows for s in row)
    assert args[4:7] == (None, None, None) and args[8] == inp.softmax_scale
    assert torch.equal(args[7].cpu(), inp.attn_sink[:2].cpu())
    assert kw == {"out": None}  # a nope-wide out is no [sq, h, d] buffer: the result is copied
    want = cp._pa_pattern(3, 2, HEAD_DIM, torch.bfloat16, "cpu")[..., :HEAD_DIM - 64]
    assert torch.equal(inp.out.cpu(), want)
    assert cp._check_pa_call(args, kw, inp, "routed") == []


def test_aiter_pa_route_passes_a_ragged_list_through_and_writes_in_place():
    from contracts import prefill as cp
    from impl.targets import get_target

    inp = _pa_route_inputs(mode="ragged", indptr_offset=3, tail_junk=2, out_width="full", sink="none")
    rec = cp._route_pa(inp, get_target("gfx942"), True, "ok")
    args, kw = rec["op"][0]
    # the caller's tensors themselves: no conversion, no host read
    assert args[2].data_ptr() == inp.indices.data_ptr() and args[3].data_ptr() == inp.indptr.data_ptr()
    assert args[3].tolist()[0] == 3 and args[7] is None
    assert kw["out"] is not None and kw["out"].data_ptr() == inp.out.data_ptr()
    assert torch.equal(inp.out.cpu(), cp._pa_pattern(3, 2, HEAD_DIM, torch.bfloat16, "cpu"))
    assert cp._check_pa_routed(rec, inp, "routed") == []


@pytest.mark.parametrize("failure", fz.AITER_FAILURES)
def test_aiter_pa_failure_falls_back_to_triton(failure):
    from contracts import prefill as cp
    from impl.targets import get_target

    inp = _pa_route_inputs(out_width="full")  # in place: a failing op is handed out and poisons it first
    missing = failure == "no_op"
    rec = cp._route_pa(inp, get_target("gfx942"), True, None if missing else "raises",
                       "RuntimeError" if missing else failure)
    assert (len(rec["op"]), rec["triton"], rec["escaped"]) == (0 if missing else 1, 1, None)
    assert cp._compare_with_oracle(inp.out.detach().cpu().clone(), inp, "fallback") == []


def test_aiter_pa_result_of_the_wrong_shape_falls_back():
    q = torch.zeros(2, 1, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    out = torch.full((2, 1, HEAD_DIM - 64), math.nan, dtype=torch.bfloat16, device=DEV)
    idx = torch.zeros(0, dtype=torch.int32, device=DEV)
    ptr = torch.zeros(3, dtype=torch.int32, device=DEV)
    kv = torch.zeros(1, HEAD_DIM, dtype=torch.bfloat16, device=DEV)
    assert not pf.run_aiter_pa_prefill_sparse(lambda *a, out=None: torch.zeros(2, 1, 8), q, kv, idx, ptr, 0.1,
                                              None, out)
    assert bool(torch.isnan(out).all())  # nothing copied: the caller's Triton kernel writes it
    assert pf.run_aiter_pa_prefill_sparse(lambda *a, out=None: torch.ones(2, 1, HEAD_DIM, device=DEV), q, kv, idx,
                                          ptr, 0.1, None, out)
    assert bool((out == 1).all())


@pytest.fixture
def fresh_pa_loader():
    pf.get_aiter_pa_prefill_sparse.cache_clear()
    yield pf.get_aiter_pa_prefill_sparse
    pf.get_aiter_pa_prefill_sparse.cache_clear()


def _fake_pa_aiter(fake_module, op):
    leaf = fake_module(pf.AITER_PA_PREFILL_MODULE, pa_prefill_sparse=op)
    attention = fake_module("aiter.ops.triton.attention", pa_prefill_sparse=leaf)
    triton_pkg = fake_module("aiter.ops.triton", attention=attention)
    fake_module("aiter", ops=fake_module("aiter.ops", triton=triton_pkg))


def test_pa_loader_takes_only_an_op_with_out(fake_module, fresh_pa_loader):
    def op(q, kv, idx, ptr, ekv, eidx, eptr, sink, scale, has_invalid=None, out=None):
        return out

    _fake_pa_aiter(fake_module, op)
    assert fresh_pa_loader() is op
    fresh_pa_loader.cache_clear()

    def old_op(q, kv, idx, ptr, ekv, eidx, eptr, sink, scale, has_invalid=None):  # builds before out=
        return q

    _fake_pa_aiter(fake_module, old_op)
    assert fresh_pa_loader() is None


def test_pa_loader_is_none_without_the_module_or_for_pypi_aiter(monkeypatch, fake_module, fresh_pa_loader):
    fake_module("aiter", ops=fake_module("aiter.ops"))
    monkeypatch.setitem(sys.modules, pf.AITER_PA_PREFILL_MODULE, None)
    assert fresh_pa_loader() is None
    fresh_pa_loader.cache_clear()
    fake_module("aiter")  # PyPI's async-iterator package: no aiter.ops
    monkeypatch.setitem(sys.modules, "aiter.ops", None)
    assert fresh_pa_loader() is None


@pytest.mark.parametrize("cls", [fz.AiterRoutingCase, fz.AiterFallbackCase])
def test_aiter_cases_round_trip(cls):
    from hypothesis import given, settings

    from impl.targets import get_target

    strategy = fz.aiter_routing_cases("gfx942") if cls is fz.AiterRoutingCase else fz.aiter_fallback_cases()
    seen_large = []

    @settings(max_examples=30, deadline=None, database=None)
    @given(strategy)
    def round_trip(case):
        doc = json.loads(json.dumps(case.to_json()))
        assert cls.from_json(doc) == case
        for f in dataclasses.fields(cls):
            if f.name in cls.ADDED_FIELDS:  # added later: a case saved before it replays with the default
                assert cls.from_json({k: v for k, v in doc.items() if k != f.name}).replace(
                    **{f.name: getattr(case, f.name)}) == case
                continue
            with pytest.raises(CaseError, match=f"missing field {f.name}"):
                cls.from_json({k: v for k, v in doc.items() if k != f.name})
        seen_large.append(getattr(case, "large", False))

    round_trip()
    if cls is fz.AiterRoutingCase:
        assert any(seen_large)  # gfx942 draws 512-row calls ...
        base = _prefill_contracts._aiter_routing_examples(get_target("gfx942"))[0].inputs
        big = fz.large_inputs(base)
        assert 512 <= big.sq <= 514 and big.lens[:base.sq] == base.lens and len(big.lens) == big.sq

        @settings(max_examples=20, deadline=None, database=None)
        @given(fz.aiter_routing_cases("gfx950"))
        def never_large(case):
            assert case.large is False  # ... and no other target does

        never_large()


@pytest.mark.gfx942
def test_real_aiter_pa_prefill_sparse_matches_oracle():
    op = pf.get_aiter_pa_prefill_sparse()
    if op is None:
        pytest.skip("needs AMD AITER with aiter.ops.triton.attention.pa_prefill_sparse (taking out=): not "
                    "importable here")
    g = torch.Generator().manual_seed(5)
    sq, h = 512, 16
    q = (torch.randn(sq, h, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).cuda()
    kv = (torch.randn(64, HEAD_DIM, generator=g) * 0.125).to(torch.bfloat16).cuda()
    rows = [[(r + j) % 64 for j in range(r % 9)] + [-1] for r in range(sq)]  # -1: the op skips it
    indices = torch.tensor([i for row in rows for i in row], dtype=torch.int32).cuda()
    indptr = torch.tensor([0] + [sum(len(x) for x in rows[: r + 1]) for r in range(sq)], dtype=torch.int32).cuda()
    sink = torch.linspace(-0.25, 0.25, h, dtype=torch.float32).cuda()
    out = torch.full_like(q, math.nan)
    assert pf.run_aiter_pa_prefill_sparse(op, q, kv, indices, indptr, HEAD_DIM ** -0.5, sink, out)
    _assert_matches_oracle(out, q, kv, HEAD_DIM ** -0.5, sink, indices=indices.tolist(), indptr=indptr.tolist())
