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


# --- closed by the indexer-logits int64 probe (wrapped 32-bit offsets) ---------------------------------------------

def _wrap32(x: int) -> int:
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _int32_scale_offsets(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None):
    """Mutant indexer_logits-885f79d35d: key s's scale read at ``s * k_scale.stride(0)`` computed in int32."""
    base, st = k_scale.storage_offset(), k_scale.stride(0)
    read = torch.cat([k_scale.as_strided((1,), (1,), base + _wrap32(s * st)) for s in range(k_scale.shape[0])])
    return il.fp8_mqa_logits(q, k_fp8, read, weights, ks, ke, out=out, target=target)


def _int32_block_offsets(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout=None, out=None,
                         target=None, check_lengths=True):
    """Mutant indexer_logits-c91183c4b5: block b of the paged cache read at ``b * kv_cache.stride(0)`` computed in
    int32 (the blocks the table names, gathered from there into a small cache the table is renumbered to)."""
    ids = sorted(set(block_tables.reshape(-1).tolist()))
    read = torch.stack([kv_cache.as_strided(kv_cache.shape[1:], kv_cache.stride()[1:],
                                            kv_cache.storage_offset() + _wrap32(b * kv_cache.stride(0)))
                        for b in ids])
    index = {b: i for i, b in enumerate(ids)}
    table = torch.tensor([[index[b] for b in row] for row in block_tables.tolist()], dtype=block_tables.dtype,
                         device=block_tables.device)
    return il.fp8_paged_mqa_logits(q, read, weights, context_lens, table, max_model_len, layout=layout, out=out,
                                   target=target, check_lengths=check_lengths)


def test_the_logits_int64_probe_passes_the_impl():
    assert cprobes.INT64_PROBES["indexer-logits"](TARGET) == []


def test_int32_key_scale_offsets_fail_the_logits_int64_probe(monkeypatch):
    monkeypatch.setattr(cprobes, "bound", lambda target: _family(fp8_mqa_logits=_int32_scale_offsets))
    v = cprobes.INT64_PROBES["indexer-logits"](TARGET)
    assert v and all("key scales past 2^31 elements" in x.message for x in v), [x.message for x in v]


def test_int32_block_offsets_fail_the_logits_int64_probe(monkeypatch):
    monkeypatch.setattr(cprobes, "bound", lambda target: _family(fp8_paged_mqa_logits=_int32_block_offsets))
    v = cprobes.INT64_PROBES["indexer-logits"](TARGET)
    assert v and all("cache blocks past 2^32 bytes" in x.message for x in v), [x.message for x in v]


# --- the third batch (far out rows, the documented 4-D cache form) -------------------------------------------------

def _flat_cache_only(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout=None, out=None,
                     target=None, check_lengths=True):
    """Mutant indexer_logits-e4e4fc7944 (``kv_cache.dim() == 4`` -> ``> 4``): upstream's [nb, bs, 1, 132] view is
    no longer squeezed, so the shape check refuses it."""
    if kv_cache.dim() == 4:
        raise ValueError(f"kv_cache: expected shape [num_blocks, block_size, 132], got {list(kv_cache.shape)}")
    return il.fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout=layout,
                                   out=out, target=target, check_lengths=check_lengths)


def test_upstreams_unit_heads_cache_view_is_pinned_and_read():
    case = next(c for c in ci._examples(TARGET) if c.cache_view == "unit-heads")
    assert case.mode == "decode"
    assert ci._check(case, TARGET) == []  # the real entry point reads the view as the flat cache


def test_refusing_upstreams_unit_heads_cache_view_fails_the_check(monkeypatch):
    case = next(c for c in ci._examples(TARGET) if c.cache_view == "unit-heads")
    monkeypatch.setattr(ci, "bound", lambda target: _family(fp8_paged_mqa_logits=_flat_cache_only))
    with pytest.raises(ValueError, match="kv_cache: expected shape"):
        ci._check(case, TARGET)


def _int32_out_rows(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None):
    """Mutant indexer_logits-bb5dffece3: the out row offset ``t * stride(0)`` computed in int32 (wrapped), each
    row stored there."""
    got = il.fp8_mqa_logits(q, k_fp8, k_scale, weights, ks, ke, target=target)
    if out is None:
        return got
    for t in range(got.shape[0]):
        off = out.storage_offset() + (t * out.stride(0) + 2 ** 31) % 2 ** 32 - 2 ** 31
        out.as_strided(out.shape[1:], out.stride()[1:], off).copy_(got[t])
    return out


def test_int32_out_row_offsets_fail_the_logits_int64_probe(monkeypatch):
    monkeypatch.setattr(cprobes, "bound", lambda target: _family(fp8_mqa_logits=_int32_out_rows))
    v = cprobes._indexer_logits_far_out(TARGET)
    assert v and all("out rows past 2^31 elements" in x.message for x in v), [x.message for x in v]


def test_the_out_rows_probe_passes_on_the_impl():
    assert cprobes._indexer_logits_far_out(TARGET) == []
