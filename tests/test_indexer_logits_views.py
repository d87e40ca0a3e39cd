"""The indexer logits' cache views and context lengths (issue 13's generator gaps): a cache view whose token rows
are not 132 bytes apart (read at block size 1, refused above it) and a 1-D context_lens longer than q's requests
(refused), in the impl and as the contract and its declared family reach them."""
from __future__ import annotations

import pytest
import torch

from contracts.indexer_logits import _check, _refusals
from fuzz.indexer_logits import (LOGITS_DIMENSIONS, IndexerLogitsCase, build_decode_inputs, long_context_lens,
                                 padded_rows_view)
from impl import indexer_logits as il
from impl.targets import get_target


def _case(**kw):
    base = dict(seed=3, mode="decode", heads=2, topk=3, next_n=1, block_size=1, layout="normal",
                context_lens=(3, 2), max_model_len=4, extra_columns=1)
    return IndexerLogitsCase(**{**base, **kw})


def _call(case, inp, cache, lens):
    return il.fp8_paged_mqa_logits(inp.q, cache, inp.weights, lens, inp.block_table, case.max_model_len,
                                   layout=case.layout, target="generic")


def test_a_padded_rows_view_is_read_at_block_size_1_and_refused_above():
    case = _case()
    inp = build_decode_inputs(case, "ocp")
    view = padded_rows_view(inp.cache, "ocp")
    assert view.stride(1) != 132 and torch.equal(view, inp.cache)
    assert torch.equal(_call(case, inp, view, inp.context_lens), _call(case, inp, inp.cache, inp.context_lens))
    case = _case(block_size=3, context_lens=(4, 2), max_model_len=5)
    inp = build_decode_inputs(case, "ocp")
    with pytest.raises(ValueError, match="kv_cache: each block must be contiguous"):
        _call(case, inp, padded_rows_view(inp.cache, "ocp"), inp.context_lens)


@pytest.mark.parametrize("per_row", [False, True])
def test_context_lens_longer_than_the_requests_are_refused(per_row):
    ctx = (3, 2, 3, 1) if per_row else (3, 2)
    case = _case(next_n=2, per_row=per_row, context_lens=ctx)
    inp = build_decode_inputs(case, "ocp")
    lens = long_context_lens(case)
    assert lens.dim() == 1 and lens.shape[0] > case.batch
    with pytest.raises(ValueError, match="context_lens: expected 2 entries"):
        _call(case, inp, inp.cache, lens)


def test_the_contract_judges_both_and_names_an_accepting_subject():
    t = get_target("generic")
    case = _case(cache_view="padded-rows", ctx_count="long", next_n=2)
    assert _check(case, t) == []
    inp = build_decode_inputs(case, "ocp")
    v = _refusals(case, lambda cache, lens: None, inp, "ocp")
    assert [x.message for x in v] == ["decode: a 1-D context_lens longer than q's requests was accepted (per-row "
                                      "lengths flattened cannot be told from per-request ones)"]
    with pytest.raises(ValueError):
        _case(ctx_count="long")  # next_n 1: a longer context_lens is padding only
    with pytest.raises(ValueError):
        IndexerLogitsCase(seed=0, mode="prefill", heads=1, topk=1, keys=1, row_starts=(0,), row_ends=(1,),
                          cache_view="padded-rows")


def test_the_family_reaches_both_views_and_both_counts():
    for name in ("gfx942", "generic"):
        t = get_target(name)
        rows = LOGITS_DIMENSIONS.covering_array(t, 2)
        assert {r["view"] for r in rows} == {"flat", "padded-bs1", "padded-blocks"}
        assert {(r["shape"], r["ctx_count"]) for r in rows} >= {("mtp", "long"), ("mtp-per-row", "long")}
        assert ("single", "long") not in {(r["shape"], r["ctx_count"]) for r in rows}
        assert all(r["geometry"] == "bs1" for r in rows if r["view"] == "padded-bs1")
