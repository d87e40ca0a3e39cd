"""Graph capture and replay of the sparse decode: the launch observer, capture/replay against eager and the oracle,
pointer stability, the emulation's launch check, bad input, the contracts, and real CUDA graphs on a GPU."""
from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch

import impl  # noqa: F401  (sets the Triton mode before anything imports triton)
from contracts import graph_capture as gr
from fuzz.cases import CaseError
from fuzz import graph_capture as fzg
from impl import decode as dec
from impl.graph_capture import DecodeGraph, GraphReplayError, default_mode
from impl.runtime import kernel_device
from impl.targets import get_target

DEV = kernel_device()


def _step(rows, main, extra, ms=0, es=0) -> fzg.GraphStep:
    return fzg.GraphStep(rows, tuple(main), None if extra is None else tuple(extra), ms, es)


_BASE = fzg.GraphCase(seed=5, batch=3, heads=2, compress_ratio=128, max_main=4, max_extra=5, main_bs=5, extra_bs=2,
                      padded=True, invalid_rate=0.2, scale=0.11, sink="ordinary", q_transposed=False, cu_count=4,
                      capture=_step(3, [2, 0, 4], [5, 1, 0], 2, 3),
                      replays=(_step(3, [0, 0, 0], [0, 0, 0]), _step(3, [4, 4, 4], [5, 5, 5]),
                               _step(2, [1, 3], [0, 5])))


def _case(**kw) -> fzg.GraphCase:
    return _BASE.replace(**kw)


def _capture(case, target, mode=None):
    inp = fzg.build_graph_case(case, target)
    cap = fzg.build_step(case, case.capture, 0, inp)
    ev = inp.extra.view if inp.extra is not None else None
    g = DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, ev, cap.extra_indices,
                            cap.extra_indptr, max_per_row_main=case.max_main, max_per_row_extra=case.max_extra,
                            compress_ratio=case.compress_ratio, attn_sink=inp.attn_sink,
                            softmax_scale=inp.softmax_scale, target=target, cu_count=case.cu_count, mode=mode)
    return g, inp, cap


# --- the launch observer ----------------------------------------------------------------------------------------

def test_observer_records_every_launch_and_changes_nothing():
    t = get_target("gfx950")
    case = _case()
    inp = fzg.build_graph_case(case, t)
    st = fzg.build_step(case, case.capture, 0, inp)
    args = (st.q, inp.main.view, st.main_indices, st.main_indptr, inp.extra.view, st.extra_indices, st.extra_indptr)
    kw = dict(attn_sink=inp.attn_sink, softmax_scale=0.11, target=t, cu_count=4)
    assert dec._launch_observer is None
    plain = dec.sparse_attn_decode(*args, **kw).cpu()
    records = []
    with dec.launch_observer(records.append):
        observed = dec.sparse_attn_decode(*args, **kw).cpu()
    assert dec._launch_observer is None
    assert torch.equal(plain, observed)
    plan = dec.plan_decode(t, 3, 2, st.main_indices.numel(), st.extra_indices.numel(), cu_count=4)
    assert [r.kernel for r in records] == ["_sparse_decode_gfx950_partial_kernel", "_sparse_decode_reduce_kernel"]
    assert records[0].grid == (3, plan.num_splits, 1) and records[1].grid == (3, 2)
    a = dict(records[0].args)
    assert a["q"] == dec.TensorArg(st.q.data_ptr(), (3, 2, 512), tuple(st.q.stride()), "bfloat16")
    assert a["main_idx"].data_ptr == st.main_indices.data_ptr() and a["main_idx"].dtype == "int32"
    assert a["extra_stride0"] == inp.extra.view.stride(0)
    assert a["num_splits"] == plan.num_splits and a["num_heads"] == 2
    assert a["qk_scale2"] == pytest.approx(0.11 * dec.LOG2E, rel=0, abs=0)
    meta = dict(records[0].meta)
    build = dec._launch_variant(plan, 3, 2, t, 4)  # the default's size rule: the build for 4 CUs
    assert meta["ADAPTIVE"] is False and meta["num_warps"] == (build.num_warps or 4) and meta["HAS_EXTRA"] is True
    assert meta["BLOCK_H_"] == (build.block_h or dec.BLOCK_H)
    assert dict(records[1].args)["num_splits"] == plan.num_splits


def test_observer_that_raises_stops_the_launch_before_anything_is_written():
    t = get_target("generic")
    case = _case(compress_ratio=0, max_extra=None, capture=_step(3, [2, 1, 0], None), replays=())
    inp = fzg.build_graph_case(case, t)
    st = fzg.build_step(case, case.capture, 0, inp)
    out = torch.full((3, 2, 512), math.nan, dtype=torch.bfloat16, device=DEV)

    def veto(record):
        raise RuntimeError(f"vetoed {record.kernel}")

    with pytest.raises(RuntimeError, match="vetoed _sparse_decode_generic_kernel"):
        with dec.launch_observer(veto):
            dec.sparse_attn_decode(st.q, inp.main.view, st.main_indices, st.main_indptr, target=t, out=out)
    assert bool(torch.isnan(out.cpu().float()).all())
    with pytest.raises(TypeError, match="observer"):
        dec.set_launch_observer(42)


# --- capture and replay -----------------------------------------------------------------------------------------

def test_capture_replay_matches_eager_and_oracle(target):
    violations, g = gr.run_graph_case(_case(), target)
    assert violations == [], [str(v) for v in violations]
    assert g.mode == default_mode() and g.replays == 3
    assert g.plan.family == target.decode_family
    assert g.dispatch.for_cudagraph_capture is True
    assert len(g.launches) == (1 if target.decode_family == "generic" else 2)


def test_replay_at_zero_and_max_and_pointer_stability():
    t = get_target("gfx942")
    case = _case()
    g, inp, cap = _capture(case, t)
    ptrs = g.buffer_pointers()
    captured = g.launches
    # all rows empty: sink only (no value) -> exactly 0
    z = fzg.build_step(case, _step(3, [0, 0, 0], [0, 0, 0]), 1, inp)
    out0 = g.replay(z.q, z.main_indices, z.main_indptr, z.extra_indices, z.extra_indptr).cpu().clone()
    assert torch.equal(out0, torch.zeros_like(out0))
    assert z.main_indices.numel() == 0
    # every row at its maximum, the source exactly the capacity
    m = fzg.build_step(case, _step(3, [4, 4, 4], [5, 5, 5]), 2, inp)
    got = g.replay(m.q, m.main_indices, m.main_indptr, m.extra_indices, m.extra_indptr).cpu().clone()
    want = dec.sparse_attn_decode(m.q, inp.main.view, m.main_indices, m.main_indptr, inp.extra.view, m.extra_indices,
                                  m.extra_indptr, attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale, target=t,
                                  plan=g.plan).cpu()
    assert torch.equal(got, want)
    assert g.buffer_pointers() == ptrs and g.launches is captured
    assert g.last_views["main_indices"].data_ptr() == ptrs["main_indices"]
    assert g.last_views["extra_indptr"].tolist() == [0, 5, 10, 15]
    # fewer rows than captured: the missing rows run empty and the result is the eager one for those rows
    f = fzg.build_step(case, _step(1, [3], [2]), 3, inp)
    got1 = g.replay(f.q, f.main_indices, f.main_indptr, f.extra_indices, f.extra_indptr)
    assert got1.shape == (1, 2, 512) and got1.data_ptr() == ptrs["out"]
    assert g.last_views["main_indptr"].tolist() == [0, 3, 3, 3]
    want1 = dec.sparse_attn_decode(f.q, inp.main.view, f.main_indices, f.main_indptr, inp.extra.view,
                                   f.extra_indices, f.extra_indptr, attn_sink=inp.attn_sink,
                                   softmax_scale=inp.softmax_scale, target=t, plan=g.plan).cpu()
    assert torch.equal(got1.cpu(), want1)


@pytest.mark.parametrize("change", ["plan", "scale", "index-view", "trust"])
def test_emulated_replay_rejects_a_launch_that_differs_from_the_capture(change):
    t = get_target("gfx950")
    case = _case()
    g, inp, cap = _capture(case, t, mode="emulate")
    if change == "plan":
        g.plan = dataclasses.replace(g.plan, num_splits=g.plan.num_splits + 1)
        g.workspace = dec.DecodeWorkspace.allocate(3, g.plan.num_splits, 2, DEV)
        match = "grid"
    elif change == "scale":
        g.softmax_scale = 0.5
        match = "qk_scale2"
    elif change == "index-view":
        g._main_view = g._main_view.clone()
        match = "main_idx"
    else:
        g.dispatch = dataclasses.replace(g.dispatch, trust_extra_nan_free=not g.dispatch.trust_extra_nan_free)
        match = "SCRUB_EXTRA"
    with pytest.raises(GraphReplayError, match=match):
        g.replay(cap.q, cap.main_indices, cap.main_indptr, cap.extra_indices, cap.extra_indptr)


def test_replay_rejects_bad_input_before_writing_anything():
    t = get_target("gfx950")
    case = _case()
    g, inp, cap = _capture(case, t)
    snapshot = {k: v.clone() for k, v in (("q", g.q_buffer), ("mi", g.main_indices_buffer),
                                          ("mp", g.main_indptr_buffer), ("ei", g.extra_indices_buffer),
                                          ("ep", g.extra_indptr_buffer))}
    big = fzg.build_step(case, _step(4, [1, 1, 1, 1], [1, 1, 1, 1]), 1, inp)
    wide = fzg.build_step(case, _step(3, [5, 0, 0], [1, 1, 1]), 1, inp)  # 5 > max_per_row_main = 4
    wide_extra = fzg.build_step(case, _step(2, [1, 1], [6, 0]), 1, inp)  # 6 > max_per_row_extra = 5
    ok = fzg.build_step(case, _step(3, [1, 2, 3], [1, 2, 3]), 1, inp)
    bad = [
        ((big.q, big.main_indices, big.main_indptr, big.extra_indices, big.extra_indptr), ValueError, "q: 4 rows"),
        ((wide.q, wide.main_indices, wide.main_indptr, wide.extra_indices, wide.extra_indptr), ValueError,
         "main_indptr: row 0 holds 5"),
        ((wide_extra.q, wide_extra.main_indices, wide_extra.main_indptr, wide_extra.extra_indices,
          wide_extra.extra_indptr), ValueError, "extra_indptr: row 0 holds 6"),
        ((ok.q.float(), ok.main_indices, ok.main_indptr, ok.extra_indices, ok.extra_indptr), TypeError,
         "q: expected dtype bfloat16"),
        ((ok.q, ok.main_indices.long(), ok.main_indptr, ok.extra_indices, ok.extra_indptr), TypeError,
         "main_indices: expected dtype int32"),
        ((ok.q[:, :1], ok.main_indices, ok.main_indptr, ok.extra_indices, ok.extra_indptr), ValueError,
         r"q: expected shape \[rows, 2, 512\]"),
        ((ok.q, ok.main_indices, ok.main_indptr, None, None), ValueError, "extra_indices, extra_indptr"),
        ((ok.q, torch.zeros(13, dtype=torch.int32, device=DEV), ok.main_indptr, ok.extra_indices, ok.extra_indptr),
         ValueError, "main_indices: 13 entries do not fit"),
    ]
    for args, exc, msg in bad:
        with pytest.raises(exc, match=msg):
            g.replay(*args)
        for k, v in (("q", g.q_buffer), ("mi", g.main_indices_buffer), ("mp", g.main_indptr_buffer),
                     ("ei", g.extra_indices_buffer), ("ep", g.extra_indptr_buffer)):
            assert torch.equal(v, snapshot[k]), (msg, k)
    assert g.replays == 0


def test_capture_rejects_bad_flags_and_modes():
    t = get_target("gfx950")
    case = _case()
    inp = fzg.build_graph_case(case, t)
    cap = fzg.build_step(case, case.capture, 0, inp)
    common = dict(max_per_row_main=4, attn_sink=inp.attn_sink, target=t)
    with pytest.raises(ValueError, match="extra_cache: a layer with compress_ratio 128"):
        DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, compress_ratio=128, **common)
    with pytest.raises(ValueError, match="has_extra_cache"):
        DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, inp.extra.view,
                            cap.extra_indices, cap.extra_indptr, max_per_row_extra=5, compress_ratio=0, **common)
    with pytest.raises(ValueError, match="max_per_row_extra: required"):
        DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, inp.extra.view,
                            cap.extra_indices, cap.extra_indptr, compress_ratio=128, **common)
    with pytest.raises(ValueError, match="main_indptr: row 2 holds 4"):
        DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, inp.extra.view,
                            cap.extra_indices, cap.extra_indptr, compress_ratio=128, max_per_row_extra=5,
                            **dict(common, max_per_row_main=3))
    with pytest.raises(ValueError, match="mode"):
        DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, inp.extra.view,
                            cap.extra_indices, cap.extra_indptr, compress_ratio=128, max_per_row_extra=5,
                            mode="replay", **common)
    if default_mode() != "cuda":
        with pytest.raises(ValueError, match="mode: 'cuda' needs native Triton"):
            DecodeGraph.capture(cap.q, inp.main.view, cap.main_indices, cap.main_indptr, inp.extra.view,
                                cap.extra_indices, cap.extra_indptr, compress_ratio=128, max_per_row_extra=5,
                                mode="cuda", **common)
    with pytest.raises(TypeError, match="DecodeGraph.capture"):
        DecodeGraph()


@pytest.mark.parametrize("arch,ratio,adaptive", [("gfx950", 128, True), ("gfx950", 4, False),
                                                 ("gfx942", 128, False), ("generic", 128, False)])
def test_capture_dispatch_allows_adaptive_splits_only_on_gfx950_c128a(arch, ratio, adaptive):
    t = get_target(arch)
    case = _case(compress_ratio=ratio, replays=())
    g, _, _ = _capture(case, t)
    assert g.dispatch.adaptive_splits is adaptive
    assert g.plan.adaptive is False  # base = batch * head_blocks = 3 < 16: the host rule keeps them off here


# --- adaptive splits under capture (base >= 16 needs 16 rows; the all-maximum replay is nightly only) ------------

def adaptive_case() -> fzg.GraphCase:
    """gfx950, ratio 128, 16 rows x 1 head (base 16), cu 80, sources 16 * 129 = 2064 wide (the capacity): the
    selector gives S = 5 > 4 with ONE_WAVE 5, so the captured plan has adaptive splits on; the rows themselves stay
    short except in the all-maximum replay."""
    lens = [1, 0, 2, 3, 0, 1, 4, 2, 0, 1, 3, 2, 1, 0, 2, 1]
    cap = _step(16, lens, lens[::-1], 2064 - sum(lens), 2064 - sum(lens))
    return _case(seed=23, batch=16, heads=1, max_main=129, max_extra=129, cu_count=80, sink="ordinary",
                 capture=cap, replays=(_step(16, [0] * 16, [0] * 16), _step(16, [129] * 16, [129] * 16),
                                       _step(5, [3, 0, 7, 1, 2], [0, 5, 1, 8, 2], 3, 1)))


def test_adaptive_capture_empty_and_short_replays():
    """The adaptive capture with its cheap replays only (all empty; 5 short rows): inactive splits are skipped."""
    case = adaptive_case()
    case = case.replace(replays=(case.replays[0], case.replays[2]))
    violations, g = gr.run_graph_case(case, get_target("gfx950"))
    assert violations == [], [str(v) for v in violations]
    assert g.plan.adaptive and g.plan.num_splits == 5 and g.plan.one_wave == 5
    assert dict(g.launches[0].meta)["ADAPTIVE"] is True


@pytest.mark.slow
def test_adaptive_capture_replays_match_eager_and_oracle():
    violations, g = gr.run_graph_case(adaptive_case(), get_target("gfx950"))
    assert violations == [], [str(v) for v in violations]
    assert g.plan.adaptive and g.plan.num_splits == 5 and g.plan.one_wave == 5


# --- contracts ----------------------------------------------------------------------------------------------------

def test_int64_addressing_covers_the_decode(target):
    from contracts.registry import load_all
    from contracts.int64_probes import INT64_PROBES

    load_all()
    assert {"swa-insert", "compressor", "decode"} <= set(INT64_PROBES)
    violations = INT64_PROBES["decode"](target)
    assert violations == [], [str(v) for v in violations]


def test_graph_replay_cases_include_zero_and_max():
    from hypothesis import given, settings

    seen = []

    @settings(max_examples=30, derandomize=True, database=None, deadline=None)
    @given(fzg.graph_replay_cases(get_target("gfx950")))
    def collect(case):
        seen.append(case)

    collect()
    for case in seen:
        kinds = list(case.replays)
        assert any(all(n == 0 for n in r.main_lens) for r in kinds)
        assert any(r.rows == case.batch and r.main_lens == (case.max_main,) * case.batch
                   and r.main_slack == 0 for r in kinds)
        for r in [case.capture] + kinds:
            assert sum(r.main_lens) + r.main_slack <= case.batch * case.max_main
    assert any(r.rows < c.batch for c in seen for r in c.replays)


@pytest.mark.parametrize("arch", ["generic", "gfx942", "gfx950"])
def test_graph_case_round_trips_and_rejects_a_missing_field(arch):
    from hypothesis import given, settings

    @settings(max_examples=40, deadline=None, database=None)
    @given(fzg.graph_replay_cases(get_target(arch)))
    def round_trip(case):
        doc = json.loads(json.dumps(case.to_json()))
        assert fzg.GraphCase.from_json(doc) == case
        added = {f.name: f.default for f in dataclasses.fields(fzg.GraphCase) if f.name in fzg.GraphCase.ADDED_FIELDS}
        older = {k: v for k, v in doc.items() if k not in added}  # as stored before the layout fields came
        assert fzg.GraphCase.from_json(older) == case.replace(**added)
        for f in dataclasses.fields(fzg.GraphCase):
            if f.name in added:
                continue
            with pytest.raises(CaseError, match=f"missing field {f.name}"):
                fzg.GraphCase.from_json({k: v for k, v in doc.items() if k != f.name})
        # a nested step's field too
        for f in dataclasses.fields(fzg.GraphStep):
            broken = json.loads(json.dumps(doc))
            del broken["replays"][0][f.name]
            with pytest.raises(CaseError, match=rf"replays\[0\]: missing field {f.name}"):
                fzg.GraphCase.from_json(broken)

    round_trip()


def test_graph_case_rejects_inconsistent_fields():
    with pytest.raises(ValueError, match="max_extra: None exactly when"):
        _case(compress_ratio=0)
    with pytest.raises(ValueError, match=r"replays\[1\].rows: at most the captured batch 3"):
        _case(replays=(_step(3, [0, 0, 0], [0, 0, 0]), _step(4, [0] * 4, [0] * 4)))
    with pytest.raises(ValueError, match="main_lens: expected 2 lengths"):
        _step(2, [1], [0, 0])
    with pytest.raises(ValueError, match=r"capture.extra_lens: expected None"):
        _case(compress_ratio=1, max_extra=None)


# --- real CUDA graphs ---------------------------------------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("arch", ["generic", "gfx942", "gfx950"])
def test_real_cuda_graph_replay_matches_eager(arch):
    if default_mode() != "cuda":
        pytest.skip(f"needs native Triton on a GPU torch can capture on; default mode here is {default_mode()}")
    t = get_target(arch)
    for case in (_case(), _case(seed=9, compress_ratio=0, max_extra=None, capture=_step(3, [1, 4, 2], None),
                                replays=[_step(3, [0, 0, 0], None), _step(3, [4, 4, 4], None)]), adaptive_case()):
        violations, g = gr.run_graph_case(case, t, mode="cuda")
        assert violations == [], [str(v) for v in violations]
        assert g.mode == "cuda" and isinstance(g._graph, torch.cuda.CUDAGraph) and g.replays == len(case.replays)
        if arch == "gfx950" and case.batch == 16:
            assert g.plan.adaptive
