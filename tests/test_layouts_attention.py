"""Memory layouts and absolute regimes of the attention families (issue 30, items 1 and 3): the decode's and the
split-K reduce's layout dimensions build views around the same values, a kernel that ignores a stride is caught, a
layout an entry point refuses is refused cleanly (and a refusal that is not clean is named), and the regimes sit
where they say (every live logit below fp32 exp's underflow, exact ties, signed zeros; sinks vanishing and
overwhelming)."""
from __future__ import annotations

import math
import types

import pytest
import torch

from contracts import decode as cdec
from contracts import decode_reduce as cred
from fuzz import decode as fz
from fuzz import decode_reduce as fr
from fuzz import domains
from fuzz import splits as fs
from impl.runtime import kernel_device
from impl import decode as impl_decode
from impl.targets import TARGET_NAMES, get_target
from oracles.decode import dequantize_rows, valid_slots_all

#: where the kernels run (the host under the interpreter, the GPU natively): inputs that reach a kernel live there
DEV = kernel_device()

GFX950 = get_target("gfx950")


def _case(**kw) -> fz.DecodeCase:
    base = dict(seed=11, batch=2, heads=3, main_bs=5, extra_bs=2, main_lens=(6, 3), extra_lens=(4, 9),
                invalid_rate=0.0, indptr_offset=2, tail_junk=1, scale=0.11, sink="ordinary", poison="none",
                padded=False, q_transposed=False, cu_count=2, num_splits=2, q_layout="contiguous",
                cache_layout="packed")
    base.update(kw)
    return fz.DecodeCase(**base)


def _rows(inp, target):
    """Every valid referenced row of each cache, dequantized (what the kernel must read), and the index values."""
    out = []
    for cache, idx, ptr, fl in ((inp.main_cache, inp.main_indices, inp.main_indptr, target.main_cache_fp8),
                                (inp.extra_cache, inp.extra_indices, inp.extra_indptr, target.extra_cache_fp8)):
        slots, _ = valid_slots_all(idx, ptr, len(ptr) - 1, int(cache.shape[0]) * int(cache.shape[1]))
        out.append(dequantize_rows(cache, slots, fl, True))
    return out


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_layout_and_regime_value_classifies_and_forces(target):
    """Every value of the new dimensions is in some ci row, and each row forced onto each plain example classifies
    as that row (the families' examples are what tests/test_reach.py forces too)."""
    t = get_target(target)
    new = ((fz.DECODE_DIMENSIONS, ("q_layout", "cache_layout", "index_layout", "sink_layout", "out_layout",
                                   "logits", "main_bs")),
           (fr.REDUCE_DIMENSIONS, ("level", "sink_gap", "ws_layout", "sink_layout", "out_layout")))
    for fam, dims in new:
        assert fam.examples is not None and fam.examples(t)
        seen = {d: set() for d in dims}
        for row in fam.covering_array(t, 2):
            for base in fam.examples(t):
                got = fam.classify(fam.force(base, row, t), t)
                assert {k: got.get(k) for k in row} == row, (fam.name, row, got)
            for d in dims:
                seen[d].add(row[d])
        assert all(seen[d] == set(fam.values(d, t)) for d in dims), (fam.name, seen)


@pytest.mark.parametrize("dim,value", [("q_layout", v) for v in fz.Q_LAYOUTS[1:]]
                         + [("cache_layout", v) for v in fz.CACHE_LAYOUTS[1:]]
                         + [("index_layout", v) for v in fz.INDEX_LAYOUTS[1:]]
                         + [("sink_layout", v) for v in fz.SINK_LAYOUTS[1:]])
def test_a_layout_changes_memory_only(dim, value):
    """The view holds the values the packed build holds (q, sink, the index values, every referenced cache row),
    and it is really another layout."""
    packed = fz.build_decode_inputs(_case(), GFX950, DEV)
    other = fz.build_decode_inputs(_case(**{dim: value}), GFX950, DEV)
    assert torch.equal(packed.q.view(torch.int16), other.q.view(torch.int16))
    assert torch.equal(packed.attn_sink, other.attn_sink)
    for a, b in ((packed.main_indices, other.main_indices), (packed.main_indptr, other.main_indptr),
                 (packed.extra_indices, other.extra_indices), (packed.extra_indptr, other.extra_indptr)):
        assert torch.equal(a, b)
    for a, b in zip(_rows(packed, GFX950), _rows(other, GFX950)):
        assert torch.equal(a.nan_to_num(), b.nan_to_num()) and a.numel() > 0
    t = {"q_layout": other.q, "index_layout": other.main_indices, "sink_layout": other.attn_sink,
         "cache_layout": other.main_cache}[dim]
    if dim == "cache_layout":
        assert t.stride(0) > t.shape[1] * 584 if value == "padded" else t.storage_offset() > 0
    elif value == "slice":
        assert t.is_contiguous() and t.storage_offset() > 0
    else:
        assert not t.is_contiguous()


def test_out_layouts_are_views_of_a_nan_buffer():
    for layout in fz.OUT_LAYOUTS:
        out, base = fz.make_out(_case(out_layout=layout), DEV)
        assert tuple(out.shape) == (2, 3, 512) and bool(torch.isnan(base.float()).all())
        assert out.is_contiguous() == (layout == "contiguous")


def _wrapped(**overrides):
    """impl.decode's family with some functions replaced (a planted bug)."""
    ns = types.SimpleNamespace(**{k: getattr(impl_decode, k) for k in
                                  ("DecodePlan", "DecodeWorkspace", "plan_decode", "sparse_attn_decode",
                                   "decode_reduce")})
    for k, v in overrides.items():
        setattr(ns, k, v)
    return ns


def _check_with(dec, case, target=GFX950):
    inp = fz.build_decode_inputs(case, target)
    plan = cdec._decode_plan(dec, case, target, inp)
    try:
        got = cdec._run_decode(dec, case, target, inp, plan)
    except cdec._Refused as e:
        return cdec.refusal_violations(case, e)
    ref = cdec._oracle(case, target, inp)
    return cdec.oracle_violations("decode", got, ref, plan.num_splits)


def test_ours_passes_every_layout_and_a_stride_ignoring_kernel_is_caught():
    case = _case(q_layout="lane-strided", out_layout="padded")
    assert _check_with(impl_decode, case) == []

    def ignores_lane_stride(q, *a, **k):  # the kernel reads q's lanes as if packed
        return impl_decode.sparse_attn_decode(q.as_strided(q.shape, (q.stride(0), q.stride(1), 1)), *a, **k)

    v = _check_with(_wrapped(sparse_attn_decode=ignores_lane_stride), case)
    assert v and all("oracle" in x.message or "decode" in x.message for x in v)

    def packed_blocks(q, main_cache, *a, **k):  # the kernel assumes packed cache blocks
        packed = main_cache.as_strided(main_cache.shape, (main_cache.shape[1] * 584, 584, 1))
        return impl_decode.sparse_attn_decode(q, packed, *a, **k)

    assert _check_with(_wrapped(sparse_attn_decode=packed_blocks), _case(cache_layout="padded"))


def test_ours_refuses_strided_indices_and_sinks_cleanly_and_unclean_refusals_are_named():
    for kw in ({"index_layout": "strided"}, {"sink_layout": "strided"}):
        case = _case(**kw)
        inp = fz.build_decode_inputs(case, GFX950)
        plan = cdec._decode_plan(impl_decode, case, GFX950, inp)
        with pytest.raises(cdec._Refused) as e:
            cdec._run_decode(impl_decode, case, GFX950, inp, plan)
        assert isinstance(e.value.error, ValueError)
        assert cdec.refusal_violations(case, e.value) == []
        assert cdec._oracle_agreement(case, GFX950) == []

    def refuses_everything(*a, **k):
        raise ValueError("q: no")

    v = _check_with(_wrapped(sparse_attn_decode=refuses_everything), _case(q_layout="padded"))
    assert [x.message for x in v] == [cdec.REFUSED_ACCEPTED_LAYOUT]

    def writes_then_refuses(q, *a, out=None, **k):
        out.zero_()
        raise ValueError("main_indices: expected contiguous tensors")

    v = _check_with(_wrapped(sparse_attn_decode=writes_then_refuses), _case(index_layout="strided"))
    assert cdec.REFUSAL_WROTE in [x.message for x in v]


def test_reduce_refuses_padded_partials_and_a_stride_ignoring_reduce_is_caught():
    case = fr.ReduceCase(seed=2, batch=2, heads=3, splits=3, adaptive=False, sink="below", ws_layout="padded",
                         sink_layout="strided", out_layout="heads-major")
    p = fr.build_partials(case)
    ws = impl_decode.DecodeWorkspace(*(fr.lay_out(p[k], "padded", DEV) for k in ("part_m", "part_l", "part_acc")))
    with pytest.raises(ValueError, match="workspace"):
        impl_decode.decode_reduce(ws)
    out_case = case.replace(ws_layout="contiguous", sink_layout="contiguous")

    def packed_out(workspace, *, out=None, **k):  # writes out as if packed
        flat = out.as_strided(out.shape, (out.shape[1] * 512, 512, 1))
        impl_decode.decode_reduce(workspace, out=flat, **k)
        return out

    real = cred.bound
    try:
        cred.bound = lambda t: types.SimpleNamespace(decode=_wrapped(decode_reduce=packed_out))
        assert cred.decode_reduce_oracle(out_case, GFX950)
        cred.bound = lambda t: types.SimpleNamespace(decode=_wrapped())
        assert cred.decode_reduce_oracle(out_case, GFX950) == []
        assert cred.decode_reduce_oracle(case, GFX950) == []  # refused cleanly: padded partials, strided sink
    finally:
        cred.bound = real


def test_underflow_tied_and_signed_zero_regimes_sit_where_they_say():
    for logits in ("underflow", "tied", "signed-zero"):
        case = _case(logits=logits, scale=512 ** -0.5)
        inp = fz.build_decode_inputs(case, GFX950, DEV)
        q = inp.q.to("cpu", torch.float64)  # the dequantized rows are host tensors, whatever device built the case
        rows = _rows(inp, GFX950)
        if logits == "signed-zero":
            bits = inp.q.view(torch.int16)
            assert bool((q == 0).all()) and bool((bits < 0).any()) and bool((bits == 0).any())
            continue
        for kv in rows:
            if logits == "tied":
                assert bool((kv == kv[:1]).all())
            else:
                lg = case.scale * torch.einsum("bhd,nd->bhn", q, kv.to(torch.float64))
                assert float(lg.max()) < -103.97 and float(lg.max() - lg.min()) < 5.0
    assert domains.reach_class(_case(logits="underflow")) != "production"
    assert "logits-above-exp-underflow" in domains.outside(_case(logits="underflow"))
    assert "logits-above-exp-underflow" not in domains.outside(_case(logits="tied"))


def test_reduce_levels_and_far_sinks():
    base = fr.ReduceCase(seed=1, batch=1, heads=2, splits=4, adaptive=False, sink="below")
    p = fr.build_partials(base.replace(level="underflow", m_spread=0.0))
    assert float(p["part_m"].max()) < -103.97
    p = fr.build_partials(base.replace(level="overflow"))
    assert float(p["part_m"].min()) > 88.8  # e^m overflows fp32
    p = fr.build_partials(base.replace(level="signed-zero"))
    m = p["part_m"]
    assert bool((m == 0).all()) and bool(torch.signbit(m).any()) and not bool(torch.signbit(m).all())
    far = fr.build_partials(base.replace(sink_gap="far"))
    assert far["sink"][0] == -math.inf and float(far["part_m"].max() - far["sink"][1]) > 190
    over = fr.build_partials(base.replace(sink="dominant", sink_gap="far"))
    assert float(over["sink"].min() - over["part_m"].max()) > 190
    assert domains.reach_class(base) == "production"
    assert domains.outside(base.replace(level="overflow", sink_gap="far", ws_layout="padded")) == [
        "maxima-within-exp-range", "sink-near-the-maxima", "partials-packed"]


def test_production_cu_counts_and_shapes_are_drawn():
    t = get_target("gfx942")
    fam = fs.SPLIT_DIMENSIONS
    counts = {fam.force(b, r, t).cu_count for b in fam.examples(t) for r in fam.covering_array(t, 2)
              if r["cu"] == "other"}
    assert counts and counts <= set(fs.PRODUCTION_CU_COUNTS)
    assert 512 ** -0.5 in fz.SCALES and fz.DECODE_DIMENSIONS.force(
        fz.DECODE_DIMENSIONS.examples(t)[0], {"main_bs": "swa-64"}, t).main_bs == 64


# --- the sparse prefill (fuzz/prefill.py) -----------------------------------------------------------------------

from contracts import prefill as cpre  # noqa: E402
from fuzz import prefill as fp  # noqa: E402
from impl import prefill as impl_prefill  # noqa: E402


def _pcase(**kw) -> fp.PrefillCase:
    base = dict(seed=5, sq=3, heads=3, d=512, skv=9, mode="dense", width=8, lens=(8, 0, 3), topk_given=True,
                topk_quirks=False, dense_3d=False, invalid_rate=0.2, int32_extremes=False, indptr_offset=0,
                tail_junk=0, scale=0.0625, sink="ordinary", out_width="full", out_padded=False,
                q_layout="contiguous", kv_layout="2d")
    base.update(kw)
    return fp.PrefillCase(**base)


PREFILL_NEW = ("index_layout", "topk_layout", "sink_layout", "out_layout", "logits", "q_layout", "kv_layout")


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_prefill_layout_and_regime_value_classifies_and_forces(target):
    t = get_target(target)
    fam = fp.PREFILL_DIMENSIONS
    seen = {d: set() for d in PREFILL_NEW}
    for row in fam.covering_array(t, 2):
        for base in fam.examples(t):
            got = fam.classify(fam.force(base, row, t), t)
            assert {k: got.get(k) for k in row} == row, (row, got)
        for d in PREFILL_NEW:
            seen[d].add(row[d])
    assert all(seen[d] == set(fam.values(d, t)) for d in PREFILL_NEW), seen


def _prefill_values(inp):
    return (inp.q.float().nan_to_num(7.0), inp.kv.float().nan_to_num(7.0), inp.indices, inp.topk_length,
            inp.indptr, inp.attn_sink)


@pytest.mark.parametrize("mode,dim,value", [("dense", "index_layout", v) for v in fp.INDEX_LAYOUTS[1:]]
                         + [("ragged", "index_layout", v) for v in ("slice", "strided")]
                         + [("dense", "topk_layout", v) for v in fp.TOPK_LAYOUTS[1:]]
                         + [("dense", "sink_layout", v) for v in fp.SINK_LAYOUTS[1:]]
                         + [("dense", "q_layout", "row_slice"), ("dense", "kv_layout", "pool_slice")])
def test_a_prefill_layout_changes_memory_only(mode, dim, value):
    """The view holds the values the packed build holds, and it is really another layout."""
    kw = dict(mode=mode, indptr_offset=1, tail_junk=1, topk_given=mode == "dense")
    packed = fp.build_prefill_inputs(_pcase(**kw), DEV)
    other = fp.build_prefill_inputs(_pcase(**kw, **{dim: value}), DEV)
    for a, b in zip(_prefill_values(packed), _prefill_values(other)):
        assert (a is None) == (b is None) and (a is None or torch.equal(a, b))
    assert (packed.dense, packed.topk_list, packed.ragged, packed.indptr_list) == \
        (other.dense, other.topk_list, other.ragged, other.indptr_list)
    t = {"index_layout": other.indices, "topk_layout": other.topk_length, "sink_layout": other.attn_sink,
         "q_layout": other.q, "kv_layout": other.kv}[dim]
    if value in ("slice", "row_slice", "pool_slice"):
        assert t.storage_offset() > 0
    if value != "row_slice" and not (value == "slice" and t.dim() == 1):
        assert not t.is_contiguous()


def test_prefill_out_layouts_are_views_of_a_nan_buffer():
    for layout in fp.OUT_LAYOUTS:
        inp = fp.build_prefill_inputs(_pcase(out_layout=layout, out_padded=layout == "padded"), DEV)
        assert tuple(inp.out.shape) == (3, 3, 512) and bool(torch.isnan(inp.out_buffer.float()).all())
        assert inp.out.is_contiguous() == (layout == "contiguous")


def _with_prefill(entry):
    """contracts.prefill's subject with sparse_attn_prefill replaced (a planted bug)."""
    ns = types.SimpleNamespace(prefill=types.SimpleNamespace(sparse_attn_prefill=entry))
    real = cpre.bound
    cpre.bound = lambda t: ns
    return real


def test_ours_passes_every_prefill_layout_and_a_stride_ignoring_entry_is_caught():
    cases = [_pcase(index_layout="strided", topk_layout="strided", sink_layout="slice", out_layout="heads-major",
                    q_layout="row_slice", kv_layout="pool_slice"),
             _pcase(index_layout="transposed", dense_3d=True, out_layout="padded", out_padded=True)]
    for c in cases:
        assert cpre.prefill_oracle_agreement(c, GFX950) == []

    def packed_topk(q, kv, indices, scale, sink=None, out=None, *, topk_length=None, **k):
        flat = topk_length.as_strided(topk_length.shape, (1,))  # reads topk_length as if packed
        return impl_prefill.sparse_attn_prefill(q, kv, indices, scale, sink, out, topk_length=flat, **k)

    real = _with_prefill(packed_topk)
    try:
        v = cpre.prefill_oracle_agreement(cases[0].replace(index_layout="contiguous"), GFX950)
    finally:
        cpre.bound = real
    assert [x.message for x in v] == [f"{cpre.LAYOUT_DIFFERS}: topk_layout=strided"]


def test_ours_refuses_strided_ragged_indices_and_sinks_cleanly_and_unclean_refusals_are_named():
    for kw in ({"mode": "ragged", "index_layout": "strided", "topk_given": False}, {"sink_layout": "strided"}):
        case = _pcase(**kw)
        inp = fp.build_prefill_inputs(case)
        with pytest.raises(ValueError) as e:
            cpre._run_entry(inp, GFX950)
        assert cpre.refusal_violations(case, e.value, inp) == []
        assert cpre.prefill_oracle_agreement(case, GFX950) == []

    def refuses(*a, **k):
        raise ValueError("q: no")

    real = _with_prefill(refuses)
    try:
        v = cpre.prefill_oracle_agreement(_pcase(out_layout="heads-major"), GFX950)
        assert [x.message for x in v] == [cpre.REFUSED_ACCEPTED_LAYOUT]

        def writes_then_refuses(q, kv, indices, scale, sink=None, out=None, **k):
            out.zero_()
            raise ValueError("attn_sink: expected a contiguous tensor")

        cpre.bound = lambda t: types.SimpleNamespace(
            prefill=types.SimpleNamespace(sparse_attn_prefill=writes_then_refuses))
        v = cpre.prefill_oracle_agreement(_pcase(sink_layout="strided"), GFX950)
        assert cpre.REFUSAL_WROTE in [x.message for x in v]
    finally:
        cpre.bound = real


def test_prefill_regimes_sit_where_they_say():
    for logits in ("underflow", "tied", "signed-zero"):
        case = _pcase(logits=logits, invalid_rate=0.0)
        inp = fp.build_prefill_inputs(case, DEV)
        kv = inp.kv.double()
        live = [i for i in range(case.skv) if not bool(torch.isnan(kv[i]).any())]
        assert len(live) >= 2
        if logits == "signed-zero":
            bits = inp.q.view(torch.int16)
            assert bool((inp.q == 0).all()) and bool((bits < 0).any()) and bool((bits == 0).any())
        elif logits == "tied":
            assert bool((kv[live] == kv[live[:1]]).all())
        else:
            lg = case.scale * torch.einsum("shd,nd->shn", inp.q.double(), kv[live])
            assert float(lg.max()) < -103.97 and float(lg.max() - lg.min()) < 5.0
    assert domains.reach_class(_pcase(logits="underflow")) != "production"
    assert domains.reach_class(_pcase(logits="tied")) == "production"
    assert domains.outside(_pcase(index_layout="transposed", sink_layout="strided", logits="underflow")) == [
        "indices-packed", "sink-packed", "logits-above-exp-underflow"]


# --- the graph-buffer copy (fuzz/graph_buffers.py) ---------------------------------------------------------------

from contracts import graph_buffers as cgb  # noqa: E402
from fuzz import graph_buffers as fgb  # noqa: E402


def test_graph_buffer_layouts_are_reached_and_forced():
    fam = fgb.GRAPH_BUFFER_DIMENSIONS
    rows = fam.covering_array(GFX950, 2)
    forced = [fam.force(b, r, GFX950) for r in rows for b in fam.examples(GFX950)]
    # every source layout meets a copy that runs (no defect, packed buffers); a strided buffer meets every placement
    assert {c.source_layout for c in forced if c.defect is None and c.buffer_layout == "contiguous"} == \
        set(fgb.SOURCE_LAYOUTS)
    assert {cgb.fz.classify_graph_buffer(c)["placement"] for c in forced if c.buffer_layout == "strided"} == \
        set(fgb.PLACEMENTS)


def test_graph_buffer_sources_change_memory_only_and_strided_buffers_are_refused():
    case = fgb.GraphBufferCase(seed=1, num_rows=2, max_per_row=3, lens=(2, 1), source_extra=1)
    inp = fgb.graph_buffer_inputs(case)
    for layout in fgb.SOURCE_LAYOUTS:
        src = fgb.lay_out_source(inp.source, layout, DEV)
        assert torch.equal(src.cpu(), inp.source.cpu()) and src.is_contiguous() == (layout != "strided")
        assert cgb.ragged_view_capacity(case.replace(source_layout=layout), GFX950) == []
    assert cgb.ragged_view_capacity(case.replace(buffer_layout="strided"), GFX950) == []
    # a one-entry strided view is contiguous: the builder makes both buffers two entries at least
    one = fgb.GraphBufferCase(seed=1, num_rows=0, max_per_row=0, lens=(), source_extra=0, buffer_layout="strided")
    assert min(fgb.graph_buffer_inputs(one).indices_len, fgb.graph_buffer_inputs(one).indptr_len) >= 2


# --- the ragged helpers (fuzz/ragged.py) ---------------------------------------------------------------------------

from contracts import ragged as crg  # noqa: E402
from fuzz import ragged as frg  # noqa: E402
from impl import ragged as impl_ragged  # noqa: E402


@pytest.mark.parametrize("layout", frg.INPUT_LAYOUTS)
def test_ragged_input_layouts_change_memory_only_and_ours_passes(layout):
    case = frg.ragged_family_examples()[1].replace(input_layout=layout)
    for helper in ("dense", "global", "swa"):
        packed = frg.make_inputs(case.replace(input_layout="contiguous"), helper, DEV)
        other = frg.make_inputs(case, helper, DEV)
        for k, v in packed.items():
            if isinstance(v, torch.Tensor):
                assert torch.equal(v, other[k]), (helper, k)
                one_row = layout == "transposed" and v.dim() == 2 and min(v.shape) == 1  # transposed is packed
                if k != "block_table" and layout != "contiguous" and v.numel() > 1 and not one_row:
                    assert not other[k].is_contiguous() or other[k].storage_offset() > 0, (helper, k)
    assert crg.ragged_helpers_oracle(case, GFX950) == []


def test_a_ragged_helper_that_reads_rows_packed_is_named_by_its_layout():
    case = frg.ragged_family_examples()[1].replace(input_layout="strided")

    def packed_rows(dense_indices, topk_lens=None, num_rows=-1):
        R, W = dense_indices.shape
        flat = dense_indices.as_strided((R, W), (W, 1))
        return impl_ragged.build_ragged_indices_from_dense(flat, topk_lens, num_rows)

    fam = types.SimpleNamespace(**{n: getattr(impl_ragged, n) for n in crg.ENTRY.values()})
    fam.build_ragged_indices_from_dense = packed_rows
    real = crg.bound
    crg.bound = lambda t: types.SimpleNamespace(ragged=fam)
    try:
        v = crg.ragged_helpers_oracle(case, GFX950)
        assert [x.message for x in v] == [f"{crg.LAYOUT_DIFFERS}: input_layout=strided"]
        assert crg.ragged_helpers_oracle(case.replace(input_layout="contiguous"), GFX950) == []
    finally:
        crg.bound = real


# --- the decode paths' layout invariance (fuzz/metamorphic.py) -----------------------------------------------------

from fuzz import metamorphic as fmm  # noqa: E402



@pytest.mark.parametrize("target", ("gfx942", "gfx950"))
def test_relaid_metamorphic_inputs_hold_the_same_values_as_views(target):
    t = get_target(target)
    fam = fmm.METAMORPHIC_DIMENSIONS
    assert {fam.force(b, r, t).view_layout for r in fam.covering_array(t, 2) for b in fam.examples(t)} == \
        set(fmm.VIEW_LAYOUTS)
    case = fmm.metamorphic_examples(t)[0]
    case = case.replace(decode=case.decode.replace(sink="ordinary"))
    inp = fmm.build_metamorphic_inputs(case, t)
    views = fmm.relaid_inputs(inp)
    for name in ("q", "main_cache", "main_indices", "main_indptr", "extra_cache", "extra_indices", "extra_indptr",
                 "attn_sink"):
        a, b = getattr(inp, name), getattr(views, name)
        assert torch.equal(a.view(torch.int16) if a.dtype == torch.bfloat16 else a,
                           b.view(torch.int16) if b.dtype == torch.bfloat16 else b), name
        assert b.storage_offset() > 0 or not b.is_contiguous(), name
    assert views.main_cache.stride(0) > views.main_cache.shape[1] * views.main_cache.shape[2]
