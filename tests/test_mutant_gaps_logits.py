"""Mutation survivors of ``impl/indexer_logits.py`` closed as generator gaps (issue 30 item 5): each test plants the
surviving mutant's behaviour as a subject entry point and shows the contract now names it (the real implementation
passing the same checks is the ci audit's job). The cp-gather survivor (an unmasked block-table read) is proved by
the audit alone: the mutant faults on the pinned gather with no sequences, which a test cannot host in-process."""
from __future__ import annotations

import types

import pytest
import torch

import contracts.indexer_logits as ci
import contracts.int64_probes as cprobes
from impl import indexer_logits as il
from impl.targets import get_target

TARGET = get_target("gfx950")


def _family(**planted):
    """The subject's ``indexer_logits`` family: the impl's entry points, ``planted`` ones swapped in."""
    fam = types.SimpleNamespace(fp8_paged_mqa_logits=il.fp8_paged_mqa_logits, fp8_mqa_logits=il.fp8_mqa_logits,
                                topk_indices=il.topk_indices, topk_indices_prefill=il.topk_indices_prefill)
    for name, fn in planted.items():
        setattr(fam, name, fn)
    return types.SimpleNamespace(indexer_logits=fam)


def _spilling_prefill(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None):
    """Mutant indexer_logits-1151208ee6: a row's all -inf tile stored without the column mask (a whole tile of
    ``block`` columns from its start, past the row's last column)."""
    got = il.fp8_mqa_logits(q, k_fp8, k_scale, weights, ks, ke, out=out, target=target)
    S = got.shape[1]
    block = min(il.BLOCK_KV, max(16, il._next_pow2(S)))
    for t in range(got.shape[0]):
        if int(ke[t]) == 0:  # the row's one tile starts at or past its end: the all -inf branch
            got.as_strided((block,), (1,), got.storage_offset() + t * got.stride(0)).fill_(float("-inf"))
    return got


def test_a_tile_stored_past_a_row_reaches_a_padded_out_and_is_named(monkeypatch):
    case = next(c for c in ci._examples(TARGET) if c.out_rows == "padded")
    assert case.mode == "prefill" and 0 in case.row_ends  # a row whose tile is all -inf
    assert case.keys < min(il.BLOCK_KV, max(16, il._next_pow2(case.keys)))  # and wider than the row
    monkeypatch.setattr(ci, "bound", lambda target: _family(fp8_mqa_logits=_spilling_prefill))
    v = ci._check(case, TARGET)
    assert any(ci.OUT_PADDING_WRITTEN in x.message for x in v), [x.message for x in v]


def test_a_positional_only_max_model_len_fails_the_decode_check(monkeypatch):
    """Mutant indexer_logits-48ffd73881 (``*`` -> ``/`` in the signature): max_model_len, which callers may pass
    by keyword, becomes positional-only; the contract passes it by keyword."""

    def positional_only(q, kv_cache, weights, context_lens, block_tables, max_model_len, /, layout=None, out=None,
                        target=None, check_lengths=True):
        return il.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len,
                                       layout=layout, out=out, target=target, check_lengths=check_lengths)

    case = next(c for c in ci._examples(TARGET) if c.mode == "decode")
    monkeypatch.setattr(ci, "bound", lambda target: _family(fp8_paged_mqa_logits=positional_only))
    with pytest.raises(TypeError, match="positional-only"):
        ci._check(case, TARGET)


def _int32_row_offsets(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None):
    """Mutant indexer_logits-f226af0c37: q's row offset ``t * stride(0)`` computed in int32 (wrapped), then the
    rows read from there."""
    codes = q.view(torch.uint8)
    rows = [codes.as_strided(codes.shape[1:], codes.stride()[1:],
                             codes.storage_offset() + (t * codes.stride(0) + 2 ** 31) % 2 ** 32 - 2 ** 31)
            for t in range(codes.shape[0])]
    return il.fp8_mqa_logits(torch.stack(rows).view(q.dtype), k_fp8, k_scale, weights, ks, ke, out=out,
                             target=target)


def test_int32_q_row_offsets_fail_the_logits_int64_probe(monkeypatch):
    monkeypatch.setattr(cprobes, "bound", lambda target: _family(fp8_mqa_logits=_int32_row_offsets))
    v = cprobes.INT64_PROBES["indexer-logits"](TARGET)
    assert v and all("q rows past 2^31 bytes" in x.message for x in v), [x.message for x in v]


def test_scale32_build_is_refused_a_pool_whose_block_stride_is_not_4_byte_aligned():
    """The guard of mutant indexer_logits-098f424c20 (recorded equivalent for the contracts, which run the default
    build): a scale32 build loads each key scale as one fp32 word only where the pool's base and block stride are
    both 4-byte aligned."""
    bs, stride = 64, 64 * 132 + 2
    base = torch.empty(2 * stride, dtype=torch.uint8)
    odd = base.as_strided((2, bs, 132), (stride, 132, 1))
    assert odd.data_ptr() % 4 == 0 and odd.stride(0) % 4 == 2
    _, meta = il._paged_launch(il.LogitsVariant(scale32=True), 1, 128, bs, odd, TARGET)
    assert meta["SCALE32"] is False
    _, meta = il._paged_launch(il.LogitsVariant(scale32=True), 1, 128, bs, base[:2 * bs * 132].view(2, bs, 132),
                               TARGET)
    assert meta["SCALE32"] is True
