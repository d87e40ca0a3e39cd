"""Mutation survivors of ``impl/indexer_logits.py`` closed by the ``indexer-logits`` int64 probe (issue 30 item 5):
each test plants the surviving mutant's behaviour, an offset computed in 32 bits and wrapped, as a subject entry
point and shows the probe names it; the real implementation passes the same probe."""
from __future__ import annotations

import types

import torch

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
    table = torch.tensor([[index[b] for b in row] for row in block_tables.tolist()], dtype=block_tables.dtype)
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
