"""DSv4 prefill assembly: the pinned tables (upstream's older one under both readings of SPEC 3), chunk plans at the
area budget, the row layout (padding, ranges, replay-shortened gathers), the C4A indexer-K gate, the contract on
its pinned examples, and bad input rejected before the kernel launches."""
from __future__ import annotations

import json

import pytest
import torch

import impl  # noqa: F401  (the Triton mode first)
from contracts import prefill_assembly as cpa
from fuzz import prefill_assembly as fz
from fuzz.cases import CaseError
from impl import prefill_assembly as pa
from impl.runtime import kernel_device
from impl.targets import get_target
from oracles import prefill_assembly as ref

DEV = kernel_device()


def _i32(x):
    return torch.tensor(x, dtype=torch.int32, device=DEV)


def _t_old_inputs(gathers=(4, 3), topk_rows=cpa.T_OLD_TOPK):
    return _i32(topk_rows), _i32([0, 3, 5]), _i32([6, 4]), _i32(list(gathers))


def _prefixes(idx, lens):
    return [tuple(r[:n]) for r, n in zip(idx.cpu().tolist(), lens.cpu().tolist())]


# --- pinned tables -------------------------------------------------------------------------------------------------

T_OLD_LITERAL = ((100, 101, 7, 8, 9), (110, 111, 8, 9, 10), (120, 121, 122, 9, 10, 11), (150, 27, 28, 29),
                 (160, 161, 28, 29, 30))


def test_spec_formula_as_written_reproduces_upstreams_older_table():
    rows, lens = ref.ref_combined_rows([list(r) for r in cpa.T_OLD_TOPK], [0, 3, 5], [6, 4], [4, 3], window=3,
                                       ratio=2, topk=4, M=20, N=8, rule="t-old")
    assert [tuple(r[:n]) for r, n in zip(rows, lens)] == list(T_OLD_LITERAL)
    assert lens == [5, 5, 6, 4, 5]


def test_older_table_under_0_33_rules():
    idx, lens = pa.combine_topk_swa_indices(*_t_old_inputs(), window_size=3, compress_ratio=2, topk=4, M=20, N=8)
    assert idx.shape == (5, 128) and idx.dtype == torch.int32 and lens.dtype == torch.int32
    assert _prefixes(idx, lens) == list(cpa.T_OLD_ROWS_V033)
    assert bool((idx[0, 4:] == -1).all())  # padded with -1 to the 128-wide row


def test_full_gathers_and_causal_ids_agree_under_both_readings():
    args = [list(r) for r in cpa.T_OLD_FULL_TOPK], [0, 3, 5], [6, 4], [5, 4]
    kw = dict(window=3, ratio=2, topk=4, M=20, N=8)
    old, new = (ref.ref_combined_rows(*args, **kw, rule=r) for r in ref.RULES)
    assert old == new
    idx, lens = pa.combine_topk_swa_indices(*_t_old_inputs((5, 4), cpa.T_OLD_FULL_TOPK), window_size=3,
                                            compress_ratio=2, topk=4, M=20, N=8)
    assert _prefixes(idx, lens) == list(cpa.T_OLD_FULL_ROWS)
    assert idx.cpu().tolist() == new[0]


def test_topk_ids_are_kept_only_below_n():
    topk = _i32([[7, 8, -1, 2 ** 31 - 1]])
    idx, lens = pa.combine_topk_swa_indices(topk, _i32([4, 5]), _i32([20]), _i32([3]), window_size=3,
                                            compress_ratio=4, topk=4, M=40, N=8)
    # pos 19: topk_len 4 (20 // 4 = 5 clamped to 4); 7 kept, 8 and the rest dropped; window of 3 at N
    assert _prefixes(idx, lens) == [(7, -1, -1, -1, 8, 9, 10)]


# --- chunk plans -------------------------------------------------------------------------------------------------

def test_dsv4_defaults():
    assert (pa.PREFILL_CHUNK_SIZE, pa.SLIDING_WINDOW, pa.INDEX_TOPK) == (4, 128, 512)
    assert pa.combined_row_width(512, 128) == 640 and pa.combined_row_width(0, 128) == 128
    assert pa.prefill_workspace_budget(compress_ratio=4, max_model_len=1000, max_num_batched_tokens=8) == \
        4 * (250 + 128 + 8)
    assert pa.prefill_workspace_budget(compress_ratio=1, max_model_len=1000, max_num_batched_tokens=8) == 4 * 136


def test_a_chunk_area_equal_to_the_budget_fits_and_the_next_request_starts_a_chunk():
    plan = pa.plan_prefill_chunks([12] * 8, [2] * 8, compress_ratio=4, max_model_len=16, max_num_batched_tokens=6,
                                  window_size=4)
    assert plan == [(0, 7, 3, 8), (7, 8, 3, 8)]
    assert all(isinstance(c, pa.PrefillChunk) for c in plan)


@pytest.mark.parametrize("ratio,window", [(4, 8), (128, 4), (1, 3)])
def test_plans_equal_the_oracle_at_and_past_the_budget(ratio, window):
    mml, mnbt = (40 if ratio == 4 else 300), 8
    seqs = [mml, 5, mml - 1, mml, 9, mml, mml, 2, mml]
    qs = [8, 1, 7, 8, 2, 8, 6, 2, 8]
    kw = dict(max_model_len=mml, max_num_batched_tokens=mnbt)
    got = pa.plan_prefill_chunks(seqs, qs, compress_ratio=ratio, window_size=window, **kw)
    assert got == ref.ref_plan_chunks(seqs, qs, ratio=ratio, window=window, **kw)
    assert len(got) > 1 and (ratio > 1 or all(c.N == 0 for c in got))
    assert pa.plan_prefill_chunks(torch.tensor(seqs), torch.tensor(qs), compress_ratio=ratio, window_size=window,
                                  **kw) == got
    assert pa.plan_prefill_chunks([], [], compress_ratio=ratio, **kw) == []


@pytest.mark.parametrize("kw,exc,name", [
    (dict(seq_lens=[4, 5], query_lens=[1]), ValueError, "query_lens"),
    (dict(query_lens=[0]), ValueError, "query_lens"),
    (dict(query_lens=[9]), ValueError, "query_lens"),
    (dict(seq_lens=[3], query_lens=[4]), ValueError, "seq_lens"),
    (dict(seq_lens=[41]), ValueError, "seq_lens"),
    (dict(compress_ratio=0), ValueError, "compress_ratio"),
    (dict(window_size=0), ValueError, "window_size"),
    (dict(seq_lens=[4.0]), TypeError, "seq_lens"),
    (dict(seq_lens=torch.tensor([4.0])), TypeError, "seq_lens"),
    (dict(has_compressed=1), TypeError, "has_compressed"),
])
def test_planner_rejects_bad_input(kw, exc, name):
    args = dict(seq_lens=[4], query_lens=[2], compress_ratio=4, max_model_len=40, max_num_batched_tokens=8)
    args.update(kw)
    with pytest.raises(exc, match=name):
        pa.plan_prefill_chunks(args.pop("seq_lens"), args.pop("query_lens"), **args)


# --- combine: layout and bad input -------------------------------------------------------------------------------

def test_replayed_window_starts_at_the_first_gathered_token_and_swa_only_has_no_topk():
    # seq 10, q 2, gather 3 (one prefix token visible): positions 8, 9 with window 4
    idx, lens = pa.combine_topk_swa_indices(_i32([[5]] * 2), _i32([0, 2]), _i32([10]), _i32([3]), window_size=4,
                                            compress_ratio=1, topk=0, M=3, N=0)
    assert _prefixes(idx, lens) == [(0, 1), (0, 1, 2)]
    idx3, _ = pa.combine_topk_swa_indices(_i32([[[5]]] * 2), _i32([0, 2]), _i32([10]), _i32([3]), window_size=4,
                                          compress_ratio=1, topk=0, M=3, N=0)
    assert torch.equal(idx, idx3)


def _bad_combine_cases():
    ok = dict(topk_indices=_i32([[0, 1]] * 3), query_start_loc=_i32([2, 4, 5]), seq_lens=_i32([8, 3]),
              gather_lens=_i32([4, 2]), compress_ratio=4, M=10, N=3, topk=2, window_size=3)
    return ok, [
        (dict(topk_indices=[[0]]), TypeError, "topk_indices"),
        (dict(topk_indices=torch.zeros(3, 2)), TypeError, "topk_indices"),
        (dict(topk_indices=_i32([[[0, 1]]] * 3).expand(3, 2, 2)), ValueError, "topk_indices"),
        (dict(topk=3), ValueError, "topk"),
        (dict(query_start_loc=_i32([2, 4])), ValueError, "query_start_loc"),
        (dict(query_start_loc=_i32([2, 4, 6])), ValueError, "query_start_loc"),
        (dict(query_start_loc=_i32([2, 6, 5]), topk_indices=_i32([[0, 1]] * 3)), ValueError, "query_start_loc"),
        (dict(seq_lens=_i32([1, 3])), ValueError, "seq_lens"),
        (dict(gather_lens=_i32([1, 2])), ValueError, "gather_lens"),
        (dict(gather_lens=_i32([9, 2])), ValueError, "gather_lens"),
        (dict(gather_lens=_i32([4])), ValueError, "gather_lens"),
        (dict(M=6), ValueError, "M"),
        (dict(N=1), ValueError, "N"),
        (dict(compress_ratio=0), ValueError, "compress_ratio"),
        (dict(window_size=0), ValueError, "window_size"),
        (dict(M=2 ** 30, N=3), ValueError, "M"),
        (dict(seq_lens=torch.tensor([8, 3], dtype=torch.int16, device=DEV)), TypeError, "seq_lens"),
    ]


@pytest.mark.parametrize("i", range(len(_bad_combine_cases()[1])))
def test_combine_rejects_bad_input_before_the_launch(i, monkeypatch):
    ok, cases = _bad_combine_cases()
    kw, exc, name = cases[i]
    launches = []
    monkeypatch.setattr(pa, "_combine_topk_swa_indices_kernel", _Recorder(launches))
    args = dict(ok, **kw)
    with pytest.raises(exc, match=name):
        pa.combine_topk_swa_indices(args.pop("topk_indices"), args.pop("query_start_loc"), args.pop("seq_lens"),
                                    args.pop("gather_lens"), **args)
    assert launches == []


class _Recorder:
    def __init__(self, log):
        self.log = log

    def __getitem__(self, grid):
        return lambda *a, **k: self.log.append(grid)


def test_the_valid_base_case_runs():
    ok, _ = _bad_combine_cases()
    idx, lens = pa.combine_topk_swa_indices(ok.pop("topk_indices"), ok.pop("query_start_loc"), ok.pop("seq_lens"),
                                            ok.pop("gather_lens"), **ok)
    # pos 6: 1 top-k (7 // 4) + window 4..6; pos 7: 2 + 5..7; request 1 (pos 2, gather 2): window 1..2
    assert idx.shape == (3, 128) and lens.tolist() == [1 + 3, 2 + 3, 0 + 2]


# --- C4A indexer-K gate ------------------------------------------------------------------------------------------

def test_indexer_k_gate():
    assert pa.indexer_k_is_c4a_block_flat(4) and not pa.indexer_k_is_c4a_block_flat(2)
    assert not pa.indexer_k_is_c4a_block_flat(1) and not pa.indexer_k_is_c4a_block_flat(128)
    assert [pa.indexer_k_layout_for_ratio(r) for r in (1, 2, 4)] == ["shuffle", "shuffle", "normal"]
    assert pa.indexer_k_layout_for_ratio(2, block_size=1) == "normal"
    assert pa.indexer_k_layout_for_ratio(2, block_size=64) == "shuffle"
    assert pa.indexer_k_layout_for_ratio(4, block_size=64) == "normal"
    for bad in (0, -4, 4.0, True, None):
        with pytest.raises(ValueError, match="compress_ratio"):
            pa.indexer_k_layout_for_ratio(bad)
    with pytest.raises(ValueError, match="block_size"):
        pa.indexer_k_layout_for_ratio(2, block_size=0)


# --- the contract and its cases ----------------------------------------------------------------------------------

def test_contract_passes_its_pinned_examples():
    t = get_target("generic")
    for case in cpa._examples(t):
        assert cpa.prefill_assembly_oracle(case, t) == [], case


def test_pinned_examples_cross_the_budget_and_cover_every_layer():
    t = get_target("generic")
    ex = cpa._examples(t)
    assert {c.ratio for c in ex} >= {1, 2, 4, 128}
    multi = [fz.oracle_plan(c) for c in ex if c.workspace is None]
    assert any(len(p) > 1 for p in multi)


def test_cases_round_trip_and_are_strict():
    case = cpa._examples(get_target("generic"))[0]
    doc = json.loads(json.dumps(case.to_json()))
    assert fz.AssemblyCase.from_json(doc) == case
    del doc["replay_cut"]
    with pytest.raises(CaseError, match="replay_cut"):
        fz.AssemblyCase.from_json(doc)
    with pytest.raises(ValueError, match="expect"):
        case.replace(expect=((1,),))


# --- image visibility ----------------------------------------------------------------------------------------------

#: SWA-only, window 3, one request of 10 tokens whose last 4 (positions 6..9) are queried, gathering 6 (from
#: position 4); an image span [5, 12] of at most 8 tokens runs past the sequence so far. Position 6 sees back to 4
#: (its window) and forward to 9 (the last token so far, not 12); positions 7..9 see back to the image's first
#: token, 5 (left 2, 3, 4: from 8 on further back than their windows' starts).
IMAGE_SPAN = (5, 12)
IMAGE_ROWS = ((0, 1, 2, 3, 4, 5), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5), (1, 2, 3, 4, 5))


def test_image_visibility_literal_rows():
    left, right = zip(*(ref.ref_image_visibility(p, [IMAGE_SPAN], 8) for p in range(6, 10)))
    assert (left, right) == ((1, 2, 3, 4), (6, 5, 4, 3))
    idx, lens = pa.combine_topk_swa_indices(_i32([[0]] * 4), _i32([0, 4]), _i32([10]), _i32([6]), compress_ratio=1,
                                            M=6, N=0, topk=0, window_size=3, max_image_tokens=8,
                                            left_visible=_i32(list(left)), right_visible=_i32(list(right)))
    assert tuple(idx.shape) == (4, 128) and _prefixes(idx, lens) == list(IMAGE_ROWS)
    rows, rlens = ref.ref_combined_rows([[0]] * 4, [0, 4], [10], [6], window=3, ratio=1, topk=0, M=6, N=0,
                                        max_image_tokens=8, left=list(left), right=list(right))
    assert [tuple(r[:n]) for r, n in zip(rows, rlens)] == list(IMAGE_ROWS)
    # max_image_tokens with no visibility tensors only widens the rows
    idx0, lens0 = pa.combine_topk_swa_indices(_i32([[0]] * 4), _i32([0, 4]), _i32([10]), _i32([6]),
                                              compress_ratio=1, M=6, N=0, topk=0, window_size=128,
                                              max_image_tokens=8)
    assert tuple(idx0.shape) == (4, 256) and lens0.tolist() == [3, 4, 5, 6]  # from the first gathered token


@pytest.mark.parametrize("kw,match", [
    (dict(left_visible=_i32([0] * 4)), "give both or neither"),
    (dict(left_visible=_i32([0] * 3), right_visible=_i32([0] * 3)), "left_visible: expected shape"),
    (dict(left_visible=_i32([0, -1, 0, 0]), right_visible=_i32([0] * 4)), "left_visible: expected counts >= 0"),
    (dict(left_visible=_i32([0] * 4), right_visible=_i32([0, 9, 0, 0])), "more than window \\+ max_image_tokens"),
])
def test_image_visibility_bad_input(kw, match):
    with pytest.raises(ValueError, match=match):
        pa.combine_topk_swa_indices(_i32([[0]] * 4), _i32([0, 4]), _i32([10]), _i32([6]), compress_ratio=1, M=6,
                                    N=0, topk=0, window_size=3, max_image_tokens=8, **kw)


def test_image_case_round_trip_and_validation():
    c = cpa._examples(get_target("generic"))[-1]
    assert c.image_spans and fz.AssemblyCase.from_json(json.loads(json.dumps(c.to_json()))) == c
    with pytest.raises(ValueError, match="image_spans"):
        c.replace(image_spans=((0, 0, 8),))  # 9 tokens, more than max_image_tokens 8
    assert cpa.prefill_assembly_oracle(c, get_target("generic")) == []
