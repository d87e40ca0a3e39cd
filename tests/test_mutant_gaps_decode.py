"""Gaps that surviving mutants of ``smv mutate`` showed (issue 30 item 5), each closed in a generator or a check:
the planted behaviour of the mutant, swapped in for the real entry point, is reported, and the real one passes.

* int64-addressing ``decode-views``: q and out views whose rows or heads lie 1.6 G elements apart (a 32-bit
  ``head * stride_qh`` or ``row * stride_ob`` / ``head * stride_oh`` wraps);
* int64-addressing ``prefill``: a dense call whose topk_length entries lie 1.6 G elements apart (a 32-bit
  ``row * stride_len`` wraps);
* epilogue-oracle-agreement: an in-place float32 inverse RoPE of width 96, whose last copy block runs into the
  RoPE lanes (an unmasked copy store zeroes them before they are read);
* dsv4-step-agreement: the metadata's compressed_slot_mapping (0 instead of -1 for a token that completes no row);
* bad-input-refusal: the MXFP4 indexer cache with its tokens padded apart (a block check that refuses only when
  both strides are wrong).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from contracts import bad_input as cb
from contracts import dsv4_step as cds
from contracts import epilogues as ce
from contracts import int64_probes as ci
from contracts.registry import load_all
from fuzz import bad_input as fz
from impl import decode, dsv4_step, epilogues, indexer_writer, prefill
from impl.targets import TARGETS

load_all()


def _wrapped(offset: int) -> int:
    """``offset`` as a 32-bit product leaves it."""
    return (offset + 2 ** 31) % 2 ** 32 - 2 ** 31


def _int32_view(t: torch.Tensor, idx: tuple[int, ...]) -> torch.Tensor:
    """The element ``t[idx]`` (a 1-element view) where a 32-bit offset sum(i * stride) lands."""
    off = _wrapped(sum(i * s for i, s in zip(idx, t.stride())))
    return t.as_strided((1,), (1,), t.storage_offset() + off)


# --- the decode: q and out addressed in 32 bits -------------------------------------------------------------------

@pytest.mark.parametrize("what", ["q heads", "out rows and heads"])
def test_decode_views_probe_catches_32_bit_q_and_out_offsets(monkeypatch, what):
    real = decode.sparse_attn_decode

    def planted(q, *args, out=None, **kw):
        if what == "q heads":  # head h of row b read from where b * stride_qb + h * stride_qh wraps to
            q2 = torch.empty(q.shape, dtype=q.dtype, device=q.device)
            for b in range(q.shape[0]):
                for h in range(q.shape[1]):
                    off = b * q.stride(0) + _wrapped(h * q.stride(1))
                    q2[b, h] = q.as_strided((q.shape[2],), (q.stride(2),), q.storage_offset() + off)
            return real(q2, *args, out=out, **kw)
        tmp = torch.empty(out.shape, dtype=out.dtype, device=out.device)
        real(q, *args, out=tmp, **kw)
        for b in range(out.shape[0]):
            for h in range(out.shape[1]):
                _int32_view(out, (b, h)).as_strided((out.shape[2],), (1,)).copy_(tmp[b, h])
        return out

    t = TARGETS["gfx942"]
    assert ci.INT64_PROBES["decode-views"](t) == []
    monkeypatch.setattr(decode, "sparse_attn_decode", planted)
    assert ci.INT64_PROBES["decode-views"](t)


# --- the prefill: topk_length read in 32 bits ----------------------------------------------------------------------

def test_prefill_probe_catches_a_32_bit_topk_length_offset(monkeypatch):
    real = prefill.sparse_attn_prefill

    def planted(*args, topk_length=None, **kw):
        if topk_length is not None:  # entry r read where r * stride_len wraps to
            topk_length = torch.cat([_int32_view(topk_length, (r,)) for r in range(topk_length.shape[0])])
        return real(*args, topk_length=topk_length, **kw)

    t = TARGETS["gfx942"]
    assert ci.INT64_PROBES["prefill"](t) == []
    monkeypatch.setattr(prefill, "sparse_attn_prefill", planted)
    assert any("topk_length" in v.message for v in ci.INT64_PROBES["prefill"](t))


# --- the inverse RoPE: an unmasked float32 copy store -------------------------------------------------------------

def test_in_place_rope_example_catches_an_unmasked_copy_store(monkeypatch):
    real = epilogues.inverse_rope_gptj
    t = TARGETS["generic"]
    example = [c for c in ce._epilogue_examples(t) if c.rope is not None and c.rope.width == 96]
    assert len(example) == 1 and example[0].rope.alias == "in-place" and example[0].rope.in_dtype == "float32"

    def planted(x, cos_sin, positions, *, out=None, **kw):
        # the last 64-lane copy block stores its masked lanes (zeros) over the RoPE lanes of the same row, which
        # an in-place call then reads
        if out is not None and out.dtype == torch.float32:
            head = x.shape[2] - 64
            out[:, :, head:min(x.shape[2], -(-head // 64) * 64)] = 0.0
        return real(x, cos_sin, positions, out=out, **kw)

    assert ce.epilogue_oracle_agreement(example[0], t) == []
    monkeypatch.setattr(epilogues, "inverse_rope_gptj", planted)
    assert ce.epilogue_oracle_agreement(example[0], t)


# --- the DSv4 step's metadata: compressed_slot_mapping -------------------------------------------------------------

def test_step_checks_the_compressed_slot_mapping(monkeypatch):
    real = dsv4_step.build_layer_metadata

    def planted(*args, **kw):
        m = real(*args, **kw)
        if m.compressed_slot_mapping is None:
            return m
        c = m.compressed_slot_mapping
        return dataclasses.replace(m, compressed_slot_mapping=torch.where(c < 0, torch.zeros_like(c), c))

    t = TARGETS["generic"]
    monkeypatch.setattr(dsv4_step, "build_layer_metadata", planted)
    got = cds.dsv4_step_agreement(cds.REGRESSION_CASE, t)
    assert any("compressed_slot_mapping" in v.message for v in got), [str(v) for v in got]


# --- the MXFP4 indexer cache: tokens padded apart ------------------------------------------------------------------

def test_padded_mxfp4_cache_is_refused_and_a_weakened_check_is_caught(monkeypatch):
    t = TARGETS["generic"]
    case = [c for c in fz._examples(t) if c.breakage == "padded"]
    assert len(case) == 1 and dict(case[0].inner)["kv_format"] == "mxfp4"
    assert cb.bad_input_refusal(case[0], t) == []

    def weakened(cache):
        if cache.dim() != 3 or cache.shape[2] != indexer_writer.MXFP4_TOKEN_BYTES:
            raise ValueError("cache: expected shape [num_blocks, block_size, 68]")
        if cache.stride(2) != 1 and cache.stride(1) != indexer_writer.MXFP4_TOKEN_BYTES:
            raise ValueError("cache: each block must be contiguous")
        return int(cache.shape[1])

    monkeypatch.setattr(indexer_writer, "_check_mxfp4_cache", weakened)
    assert cb.bad_input_refusal(case[0], t)
