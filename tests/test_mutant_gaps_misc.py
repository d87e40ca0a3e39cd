"""Gaps that surviving mutants of ``smv mutate`` showed (issue 30 item 5, the seed-4242 sample), each closed by an
int64-addressing probe: the planted behaviour of the mutant, swapped in for the real entry point, is reported, and
the real one passes.

* ``indexer-k-quant``: the direct indexer-K writer's slot narrowed to 32 bits, so ``block * stride(0)`` wraps at
  the far end of a pool larger than 2^32 bytes;
* ``indexer-compress``: the head-128 compressor's request id left 32-bit, so ``req * stride(0)`` of a state block
  table whose rows lie 1.6 G elements apart wraps.
"""
from __future__ import annotations

import torch

from contracts import int64_probes as ci
from contracts.registry import load_all
from impl import indexer_writer
from impl.targets import TARGETS

load_all()


def _wrapped(offset: int) -> int:
    """``offset`` as a 32-bit product leaves it."""
    return (offset + 2 ** 31) % 2 ** 32 - 2 ** 31


def test_indexer_k_quant_probe_catches_a_32_bit_block_offset(monkeypatch):
    real = indexer_writer.indexer_k_quant_and_cache

    def planted(k, cache, slot_mapping, **kw):
        # each token's record (block size 1: the whole block) stored where a 32-bit block * stride(0) lands
        assert cache.shape[1] == 1
        for t, s in enumerate(slot_mapping.tolist()):
            if s < 0:
                continue
            tmp = torch.zeros((1, 1, cache.shape[2]), dtype=torch.uint8, device=cache.device)
            real(k[t:t + 1], tmp, torch.zeros(1, dtype=torch.int64, device=cache.device), **kw)
            at = cache.storage_offset() + _wrapped(s * cache.stride(0))
            cache.as_strided((cache.shape[2],), (1,), at).copy_(tmp.flatten())

    t = TARGETS["gfx942"]
    assert ci.INT64_PROBES["indexer-k-quant"](t) == []
    monkeypatch.setattr(indexer_writer, "indexer_k_quant_and_cache", planted)
    got = ci.INT64_PROBES["indexer-k-quant"](t)
    assert any("pool's start changed" in v.message for v in got)
    assert any("far end" in v.message for v in got)


def test_indexer_compress_probe_catches_a_32_bit_table_row_offset(monkeypatch):
    real = indexer_writer.compress_norm_rope_store_indexer

    def planted(state, table, *args, **kw):
        # row r of the state block table read where a 32-bit r * stride(0) lands
        rows = [table.as_strided((table.shape[1],), (1,), table.storage_offset() + _wrapped(r * table.stride(0)))
                for r in range(table.shape[0])]
        return real(state, torch.stack(rows), *args, **kw)

    t = TARGETS["generic"]
    assert ci.INT64_PROBES["indexer-compress"](t) == []
    monkeypatch.setattr(indexer_writer, "compress_norm_rope_store_indexer", planted)
    got = ci.INT64_PROBES["indexer-compress"](t)
    assert len(got) == 1 and "state block table" in got[0].message
