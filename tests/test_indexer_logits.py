"""impl.indexer_logits: the paged and prefill logits kernels (masks, layouts, every column written), the top-k's
tie rule and -1 fill, the hand-off to the ragged helpers, and bad inputs refused before any launch."""
from __future__ import annotations

import math

import pytest
import torch

from fuzz.indexer_logits import IndexerLogitsCase, build_decode_inputs, build_prefill_inputs
from impl import indexer_logits as il
from impl.ragged import compute_global_topk_ragged_indices_and_indptr
from impl.runtime import kernel_device
from oracles import indexer_logits as oracle

DEV = kernel_device()
NEG = float("-inf")


def _decode(target="generic", **kw):
    base = dict(seed=1, mode="decode", heads=3, topk=4, next_n=2, block_size=16, layout="shuffle",
                context_lens=(17, 3), max_model_len=20, extra_columns=1)
    case = IndexerLogitsCase(**{**base, **kw})
    fl = {"generic": "ocp", "gfx950": "ocp", "gfx942": "fnuz"}[target]
    return case, build_decode_inputs(case, fl), fl


def _call(case, inp, target="generic", **kw):
    return il.fp8_paged_mqa_logits(inp.q, inp.cache, inp.weights, inp.context_lens, inp.block_table,
                                   case.max_model_len, layout=case.layout, target=target, **kw)


@pytest.mark.parametrize("target", ["generic", "gfx942"])
@pytest.mark.parametrize("heads", [3, 20])
def test_paged_logits_match_the_oracle_and_mask_the_next_n_rows(target, heads):
    case, inp, fl = _decode(target, heads=heads)
    out = torch.full((4, 20), float("nan"), device=DEV)  # every column must be written
    got = _call(case, inp, target, out=out).cpu().double()
    ref = oracle.paged_logits(inp.q_codes, inp.cache.cpu(), inp.weights, inp.visible, inp.table, 20, case.layout, fl)
    vis = torch.zeros(4, 20, dtype=torch.bool)
    for r, n in enumerate([16, 17, 2, 3]):  # ctx - next_n + j + 1
        vis[r, :n] = True
    assert torch.equal(ref["visible"], vis)
    assert torch.equal(got == NEG, ~vis)
    assert torch.allclose(got[vis], ref["logits"][vis], rtol=1e-5, atol=1e-6)


def test_per_row_lengths_and_upstreams_4d_cache_view():
    case, inp, fl = _decode(context_lens=(5, 0, 17, 2), per_row=True)
    got = il.fp8_paged_mqa_logits(inp.q, inp.cache.unsqueeze(2), inp.weights, inp.context_lens.long(),
                                  inp.block_table.long(), 20, layout="shuffle", target="generic").cpu()
    assert [int(torch.isfinite(r).sum()) for r in got] == [5, 0, 17, 2]


def test_prefill_logits_mask_outside_each_rows_range():
    case = IndexerLogitsCase(seed=2, mode="prefill", heads=5, topk=3, keys=21, row_starts=(0, 4, 21, 7),
                             row_ends=(21, 4, 21, 9))
    inp = build_prefill_inputs(case, "ocp")
    k_scale_bytes = inp.k_scale.view(torch.uint8).reshape(21, 4)  # cp-gather's [S, 4] bytes
    got = il.fp8_mqa_logits(inp.q, inp.k_fp8, k_scale_bytes, inp.weights, inp.ks, inp.ke, target="generic").cpu()
    ref = oracle.prefill_logits(inp.q_codes, inp.k_codes, inp.k_scale, inp.weights, [0, 4, 21, 7], [21, 4, 21, 9],
                                "ocp")
    assert torch.equal(got == NEG, ~ref["visible"])
    assert torch.allclose(got.double()[ref["visible"]], ref["logits"][ref["visible"]], rtol=1e-5, atol=1e-6)


def test_nan_propagates_and_never_leaks_past_the_mask():
    case, inp, fl = _decode(nan_q=False, nan_k=True, bad_scale="inf", values="ties", block_size=3, layout="normal")
    got = _call(case, inp).cpu()
    ref = oracle.paged_logits(inp.q_codes, inp.cache.cpu(), inp.weights, inp.visible, inp.table, 20, "normal", fl)
    assert torch.equal(torch.isnan(got), torch.isnan(ref["logits"]))
    assert bool(torch.isnan(got).any())
    assert torch.equal(got == NEG, ~ref["visible"])  # the poisoned page tails and spare blocks are never read


def test_topk_tie_rule_fill_and_candidates():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, NEG],
                      [0.0, -0.0, 0.0, float("nan"), NEG, float("inf")],
                      [NEG, float("nan"), 5.0, NEG, NEG, NEG]], device=DEV)
    got = il.topk_indices(x, 4).cpu().tolist()
    assert got == [[1, 2, 4, 3], [5, 0, 1, 2], [2, -1, -1, -1]]
    assert got == oracle.topk(x.cpu().double().tolist(), 4)
    out = torch.full((3, 8), 7, dtype=torch.int32, device=DEV)
    assert il.topk_indices(x, 8, out=out) is out
    assert out.cpu().tolist()[2] == [2] + [-1] * 7
    # prefill: only [ks, ke) ranks, indices local to ks
    loc = il.topk_indices_prefill(x, torch.tensor([1, 0, 3], device=DEV), torch.tensor([4, 2, 3], device=DEV), 3)
    assert loc.cpu().tolist() == [[0, 1, 2], [0, 1, -1], [-1, -1, -1]]


def test_topk_feeds_the_global_slot_conversion():
    x = torch.tensor([[0.5, 2.0, NEG, 1.0], [NEG, NEG, NEG, NEG]], device=DEV)
    local = il.topk_indices(x, 3)
    table = torch.tensor([[4, 9]], dtype=torch.int32, device=DEV)
    slots, indptr = compute_global_topk_ragged_indices_and_indptr(local, torch.tensor([0, 0], device=DEV), table, 2)
    assert local.cpu().tolist() == [[1, 3, 0], [-1, -1, -1]]
    assert slots.cpu().tolist() == [4 * 2 + 1, 9 * 2 + 1, 4 * 2 + 0] and indptr.cpu().tolist() == [0, 3, 3]


def _refused(exc, match, fn):
    with pytest.raises(exc, match=match):
        fn()


def test_bad_paged_inputs_are_refused_before_any_launch():
    case, inp, fl = _decode()
    before = inp.cache.clone()
    out = torch.full((4, 20), 5.0, device=DEV)

    def call(**kw):
        a = dict(q=inp.q, kv_cache=inp.cache, weights=inp.weights, context_lens=inp.context_lens,
                 block_tables=inp.block_table, max_model_len=20, out=out)
        a.update(kw)
        return lambda: il.fp8_paged_mqa_logits(**a, layout="shuffle", target="generic")

    _refused(ValueError, "block_tables: request 0 needs 2 blocks", call(block_tables=inp.block_table[:, :1]))
    _refused(ValueError, "context_lens: expected 2 entries", call(context_lens=inp.context_lens[:1]))
    _refused(ValueError, "more than max_model_len", call(max_model_len=16, out=None))
    _refused(ValueError, "outside the pool", call(block_tables=torch.full_like(inp.block_table, 99)))
    _refused(ValueError, "weights: expected shape", call(weights=inp.weights[:3]))
    _refused(TypeError, "q: target generic reads OCP", call(q=inp.q_codes.view(torch.float8_e4m3fnuz)))
    _refused(TypeError, "weights: expected dtype float32", call(weights=inp.weights.double()))
    _refused(TypeError, "context_lens: expected dtype", call(context_lens=inp.context_lens.float()))
    _refused(ValueError, "context_lens: expected lengths >= 0", call(context_lens=-inp.context_lens))
    _refused(ValueError, "weights: expected device", call(weights=torch.empty(4, 3, device="meta")))
    _refused(ValueError, "max_model_len: expected a positive int", call(max_model_len=0, out=None))
    with pytest.raises(ValueError, match="multiple of 16"):
        il.fp8_paged_mqa_logits(inp.q, inp.cache[:, :3], inp.weights, inp.context_lens, inp.block_table, 20,
                                layout="shuffle", target="generic")
    assert torch.equal(inp.cache, before) and bool((out == 5.0).all())


def test_bad_prefill_and_topk_inputs_are_refused():
    case = IndexerLogitsCase(seed=3, mode="prefill", heads=2, topk=3, keys=8, row_starts=(0, 2), row_ends=(8, 5))
    inp = build_prefill_inputs(case, "fnuz")
    ok = dict(q=inp.q, k_fp8=inp.k_fp8, k_scale=inp.k_scale, weights=inp.weights, ks=inp.ks, ke=inp.ke)
    run = lambda **kw: il.fp8_mqa_logits(**{**ok, **kw}, target="gfx942")  # noqa: E731
    _refused(ValueError, "ks/ke: row 1 has the range", lambda: run(ks=torch.tensor([0, 6], dtype=torch.int32, device=DEV)))
    _refused(ValueError, "ks/ke: row 0", lambda: run(ke=torch.tensor([9, 5], dtype=torch.int32, device=DEV)))
    _refused(ValueError, "k_scale: expected", lambda: run(k_scale=inp.k_scale[:7]))
    _refused(ValueError, "ke: expected 2 entries", lambda: run(ke=inp.ke[:1]))
    _refused(TypeError, "k_fp8: target gfx942 reads FNUZ", lambda: run(k_fp8=inp.k_codes.view(torch.float8_e4m3fn)))
    assert torch.isfinite(run()).sum() == 8 + 3
    x = torch.zeros(2, 4, device=DEV)
    _refused(ValueError, "k: expected a positive int", lambda: il.topk_indices(x, 0))
    _refused(ValueError, "out: expected shape", lambda: il.topk_indices(x, 2, out=torch.empty(2, 3, dtype=torch.int32, device=DEV)))
    _refused(TypeError, "logits: expected dtype float32", lambda: il.topk_indices(x.double(), 2))
    _refused(ValueError, "ks/ke: row 0", lambda: il.topk_indices_prefill(x, torch.tensor([3, 0], device=DEV), torch.tensor([5, 0], device=DEV), 2))


def test_oracle_tie_rule_treats_both_zeros_as_one_value():
    assert oracle.topk([[-0.0, 0.0, math.nan, 0.0]], 2) == [[0, 1]]
