"""Memory layouts of the routing families (opus-routing, aiter-pa-routing, aiter-pa-fallback) and of graph replay
(issue 30 item 1): every layout value is reached by the ci covering array and forced cases classify as their row;
ours passes non-packed layouts (refusing a strided sink or ragged list cleanly, before anything is routed); and a
planted bug that ignores a layout on a routed path - a dense->ragged conversion that reads the table as packed, an
AITER out handed over without asking its strides, a refusal after the guard was asked, a graph replay that reads
its indices as packed - is caught and named by its layout."""
from __future__ import annotations

import types

import pytest
import torch

from contracts import graph_capture as cgc
from contracts import prefill as cpre
from fuzz import graph_capture as fg
from fuzz import prefill as fp
from impl import graph_capture as impl_graph
from impl import prefill as impl_prefill
from impl.targets import TARGET_NAMES, get_target

GFX942 = get_target("gfx942")
GENERIC = get_target("generic")

ROUTING_FAMILIES = (fp.ROUTING_DIMENSIONS, fp.AITER_ROUTING_DIMENSIONS, fp.AITER_FALLBACK_DIMENSIONS)


@pytest.mark.parametrize("target", TARGET_NAMES)
@pytest.mark.parametrize("fam,dims", [(f, fp.ROUTING_LAYOUT_DIMS) for f in ROUTING_FAMILIES]
                         + [(fg.GRAPH_DIMENSIONS, tuple(fg.PACKED))], ids=lambda x: getattr(x, "name", ""))
def test_every_layout_value_is_in_the_ci_array_and_forced_cases_classify_as_their_row(target, fam, dims):
    t = get_target(target)
    seen = {d: set() for d in dims}
    for row in fam.covering_array(t, 2):
        for base in fam.examples(t):
            got = fam.classify(fam.force(base, row, t), t)
            assert {k: got.get(k) for k in row} == row, (fam.name, row, got)
        for d in dims:
            seen[d].add(row[d])
    assert all(seen[d] == set(fam.values(d, t)) for d in dims), (fam.name, seen)
    # the layouts interact with what decides the route: the index mode (opus, aiter) / the replay sequence (graph)
    decider = "steps" if fam is fg.GRAPH_DIMENSIONS else "index_mode"
    assert any(decider in g and "index_layout" in g for g in fam.interactions)


def _inputs(**kw) -> fp.PrefillCase:
    base = dict(seed=21, sq=3, heads=2, d=512, skv=8, mode="dense", width=6, lens=(2, 6, 0), topk_given=True,
                topk_quirks=False, dense_3d=False, invalid_rate=0.2, int32_extremes=False, indptr_offset=0,
                tail_junk=0, scale=0.11, sink="ordinary", out_width="full", out_padded=False,
                q_layout="contiguous", kv_layout="2d")
    base.update(kw)
    return fp.PrefillCase(**base)


GUARD = fp.GuardCase(sq=1024, heads=16, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())
AGUARD = fp.AiterGuardCase(sq=512, heads=16, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())


def _opus(inputs, fallback="op_raises"):
    return fp.RoutingCase(inputs=inputs, fallback=fallback, guard=GUARD)


def _aiter(inputs):
    return fp.AiterRoutingCase(inputs=inputs, guard=AGUARD, large=False)


LAID_OUT = _inputs(index_layout="transposed", topk_layout="strided", sink_layout="slice", out_layout="heads-major",
                   q_layout="row_slice", kv_layout="pool_slice")


def test_ours_routes_every_layout_and_refuses_strided_sinks_and_ragged_lists_before_routing():
    ragged = LAID_OUT.replace(mode="ragged", topk_given=False, index_layout="slice", indptr_offset=2, tail_junk=1,
                              out_layout="padded", out_padded=True, q_layout="strided", kv_layout="strided_lanes")
    for inputs in (LAID_OUT, ragged):
        assert cpre.opus_routing_guard(_opus(inputs), GFX942) == []
        assert cpre.aiter_prefill_routing(_aiter(inputs), GFX942) == []
        assert cpre.aiter_prefill_fallback(fp.AiterFallbackCase(inputs=inputs, failure="TypeError"), GFX942) == []
    for refused in (LAID_OUT.replace(sink_layout="strided"),
                    ragged.replace(index_layout="strided", sink_layout="contiguous")):
        inp = fp.build_prefill_inputs(refused)
        rec = cpre._route(inp, GFX942, True, "ok")
        assert isinstance(rec["refused"], ValueError) and not rec["guard"] and not rec["op"] and not rec["triton"]
        assert cpre.opus_routing_guard(_opus(refused, "guard_false"), GFX942) == []
        assert cpre.aiter_prefill_fallback(fp.AiterFallbackCase(inputs=refused, failure="no_op"), GFX942) == []


def _packed_reader(t: torch.Tensor) -> torch.Tensor:
    """``t``'s storage read as if ``t`` were packed from its first element (the planted stride bug)."""
    strides, acc = [], 1
    for n in reversed(t.shape):
        strides.insert(0, acc)
        acc *= n
    return t.as_strided(t.shape, strides, t.storage_offset())


def test_a_conversion_that_reads_dense_rows_packed_is_named_by_its_layout(monkeypatch):
    real = impl_prefill.build_ragged_indices_from_dense

    def packed_rows(dense, topk_length, **kw):
        return real(_packed_reader(dense), topk_length, **kw)

    case = _inputs(index_layout="transposed", out_layout="heads-major")
    assert cpre.opus_routing_guard(_opus(case), GFX942) == []
    monkeypatch.setattr(impl_prefill, "build_ragged_indices_from_dense", packed_rows)
    v = cpre.opus_routing_guard(_opus(case), GFX942)
    assert [x.message for x in v] == [f"{cpre.ROUTING_LAYOUT_DIFFERS}: index_layout=transposed"]
    v = cpre.aiter_prefill_routing(_aiter(case), GFX942)
    assert [x.message for x in v] == [f"{cpre.ROUTING_LAYOUT_DIFFERS}: index_layout=transposed"]
    # packed rows read packed: nothing to see
    assert cpre.opus_routing_guard(_opus(case.replace(index_layout="contiguous")), GFX942) == []


def test_an_aiter_out_handed_over_without_asking_its_strides_is_named_by_its_layout(monkeypatch):
    def no_stride_check(op, q, kv2, indices, indptr, scale, sink, out):
        if tuple(out.shape) == tuple(q.shape) and out.dtype == q.dtype:  # contiguity not asked
            op(q, kv2, indices, indptr, None, None, None, sink, float(scale), out=out)
            return True
        return real(op, q, kv2, indices, indptr, scale, sink, out)

    real = impl_prefill.run_aiter_pa_prefill_sparse
    case = _aiter(_inputs(out_layout="heads-major", q_layout="strided"))
    assert cpre.aiter_prefill_routing(case, GFX942) == []
    monkeypatch.setattr(impl_prefill, "run_aiter_pa_prefill_sparse", no_stride_check)
    v = cpre.aiter_prefill_routing(case, GFX942)
    assert [x.message for x in v] == [f"{cpre.ROUTING_LAYOUT_DIFFERS}: out_layout=heads-major"]
    assert "does not accept" in v[0].got


def test_a_refusal_after_the_guard_was_asked_is_named(monkeypatch):
    def late(q, kv, indices, scale, sink=None, out=None, **kw):
        impl_prefill.can_use_aiter_sparse_prefill_opus(q, kv, sink, out, target=kw.get("target"))
        raise ValueError("attn_sink: expected a contiguous tensor")

    monkeypatch.setattr(impl_prefill, "sparse_attn_prefill", late)
    v = cpre.opus_routing_guard(_opus(_inputs(sink_layout="strided")), GFX942)
    assert [x.message for x in v] == [cpre.REFUSAL_AFTER_ROUTING]
    # a refusal of a layout the entry must accept is named as such
    v = cpre.aiter_prefill_fallback(fp.AiterFallbackCase(inputs=_inputs(q_layout="heads_major"), failure="no_op"),
                                    GFX942)
    assert cpre.REFUSED_ACCEPTED_LAYOUT in [x.message for x in v]


# --- graph replay ---------------------------------------------------------------------------------------------

def _graph(**kw) -> fg.GraphCase:
    step = fg.GraphStep
    base = fg.GraphCase(seed=3, batch=2, heads=2, compress_ratio=0, max_main=3, max_extra=None, main_bs=2,
                        extra_bs=1, padded=False, invalid_rate=0.0, scale=0.11, sink="ordinary",
                        q_transposed=False, cu_count=1, capture=step(2, (2, 1), None, 1),
                        replays=(step(2, (3, 3), None), step(1, (2,), None, 1)), q_layout="contiguous",
                        cache_layout="packed")
    return base.replace(**kw)


def test_graph_layouts_change_memory_only():
    packed = _graph()
    other = _graph(q_layout="lane-strided", cache_layout="pool-slice", index_layout="strided", sink_layout="slice")
    a, b = fg.build_graph_case(packed, GENERIC, "cpu"), fg.build_graph_case(other, GENERIC, "cpu")
    assert torch.equal(a.attn_sink, b.attn_sink) and b.attn_sink.storage_offset() > 0
    assert b.main.view.storage_offset() > 0 and not b.main.view.is_contiguous()
    sa, sb = fg.build_step(packed, packed.replays[1], 2, a, "cpu"), fg.build_step(other, other.replays[1], 2, b, "cpu")
    assert torch.equal(sa.q.view(torch.int16), sb.q.view(torch.int16)) and not sb.q.is_contiguous()
    for x, y in ((sa.main_indices, sb.main_indices), (sa.main_indptr, sb.main_indptr)):
        assert torch.equal(x, y) and not y.is_contiguous()


def _with_graph(cls):
    real = cgc.bound
    sub = real(GENERIC)
    ns = types.SimpleNamespace(graph_capture=types.SimpleNamespace(
        DecodeGraph=cls, GraphReplayError=sub.graph_capture.GraphReplayError), decode=sub.decode)
    cgc.bound = lambda t: ns
    return real


def test_ours_replays_every_layout_and_a_replay_reading_indices_packed_is_named():
    case = _graph(index_layout="strided", q_layout="transposed", cache_layout="pool-slice", sink_layout="slice")
    assert cgc.graph_replay_agreement(case, GENERIC) == []
    refused = _graph(sink_layout="strided")
    assert cgc.graph_replay_agreement(refused, GENERIC) == []
    v, g = cgc.run_graph_case(refused, GENERIC)
    assert v == [] and g is None  # refused at capture, naming attn_sink

    class PackedIndices(impl_graph.DecodeGraph):
        def replay(self, q, main_indices, main_indptr, *a, **k):
            return super().replay(q, _packed_reader(main_indices), main_indptr, *a, **k)

    real = _with_graph(PackedIndices)
    try:
        v = cgc.graph_replay_agreement(_graph(index_layout="strided"), GENERIC)
    finally:
        cgc.bound = real
    assert v and {x.message for x in v} == {f"{cgc.LAYOUT_DIFFERS}: index_layout=strided"}
