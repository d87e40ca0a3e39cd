"""Reference for the DSv4 sparse MLA decode (SPEC section 2), written from SPEC.md.

Two stages, as DESIGN "Oracles" asks:
1. dequantize each referenced cache row the way the kernels do: fp8 NoPE value (float32) x UE8M0 reader value
   (2^(code-127), code 255 -> +inf) as one float32 product, RoPE as bf16 -> float32, then NaN lanes -> 0 when the
   row's cache is scrubbed (main: always; extra: unless the trust gate is open). Inf is kept.
2. float64 attention: one softmax over the row's valid main tokens, then valid extra tokens, plus the sink as an
   extra logit with a zero value; V = K (all 512 lanes). An empty row without a sink (l == 0) gives 0.

A ragged entry is valid when it lies inside its row's indptr range and 0 <= slot < num_blocks * block_size.
Bytes are located by absolute offsets into the cache's storage (``oracles.formats``), never through impl/.
Besides the output the reference returns what the comparison's error model needs (``oracles.compare``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oracles import formats as ref_formats

NOPE_DIM = 448
ROPE_DIM = 64
HEAD_DIM = NOPE_DIM + ROPE_DIM
GROUP = 64


def dequantize_rows(cache: torch.Tensor, slots: list[int], flavour: str, scrub: bool) -> torch.Tensor:
    """[len(slots), 512] float32 rows as the kernels see them (see the module docstring)."""
    flat, base = ref_formats.storage_bytes(cache)
    flat = flat.cpu()
    bs, stride = int(cache.shape[1]), int(cache.stride(0))
    fp8_table = ref_formats.fp8_decode(torch.arange(256), flavour).to(torch.float32)
    scale_table = ref_formats.ue8m0_decode(torch.arange(256), reader=True).to(torch.float32)
    rows = torch.empty(len(slots), HEAD_DIM, dtype=torch.float32)
    for i, s in enumerate(slots):
        spans = ref_formats.fp8_ds_mla_token_spans(s, bs, stride)
        nope = flat[base + spans["nope"][0]: base + spans["nope"][1]].to(torch.int64)
        codes = flat[base + spans["scale"][0]: base + spans["scale"][1]].to(torch.int64)
        rope = flat[base + spans["rope"][0]: base + spans["rope"][1]].clone().view(torch.bfloat16)
        scl = scale_table[codes].repeat_interleave(GROUP)
        rows[i, :NOPE_DIM] = fp8_table[nope] * scl  # one float32 product, as in the kernel
        rows[i, NOPE_DIM:] = rope.to(torch.float32)
    if scrub:
        rows = torch.where(torch.isnan(rows), torch.zeros_like(rows), rows)
    return rows


def valid_slots(indices: torch.Tensor, indptr: torch.Tensor, row: int, num_slots: int) -> list[int]:
    idx = indices.cpu().tolist()
    lo, hi = int(indptr[row]), int(indptr[row + 1])
    return [int(s) for s in idx[lo:hi] if 0 <= int(s) < num_slots]


@dataclass
class DecodeReference:
    """out: float64 [b, h, 512]. weight_abs: sum_j p_j |v_j| per lane (the output's natural scale; NaN where p is).
    logit_abs: per (b, h) the largest scale * sum_i |q_i k_ji| over tokens with a finite logit (bounds the dot's
    rounding). logit_max_abs: per (b, h) the largest |finite logit| or |finite sink|. tokens: valid tokens per row.
    max_abs_v: per row the largest finite |v| lane."""

    out: torch.Tensor
    weight_abs: torch.Tensor
    logit_abs: torch.Tensor
    logit_max_abs: torch.Tensor
    tokens: list[int]
    max_abs_v: list[float]


def ref_sparse_attn_decode(q: torch.Tensor, main_cache: torch.Tensor, main_indices: torch.Tensor,
                           main_indptr: torch.Tensor, extra_cache=None, extra_indices=None, extra_indptr=None, *,
                           attn_sink: torch.Tensor | None, softmax_scale: float, main_flavour: str,
                           extra_flavour: str, scrub_extra: bool) -> DecodeReference:
    b, h, width = q.shape
    if width != HEAD_DIM:
        raise ValueError(f"q: expected width {HEAD_DIM}, got {width}")
    q64 = q.detach().cpu().to(torch.float64)
    if attn_sink is None:
        sink = torch.full((h,), -math.inf, dtype=torch.float64)
    else:
        sink = attn_sink.detach().cpu().to(torch.float64)[:h]
    m_ip = main_indptr.cpu().to(torch.int64)
    main_slots = int(main_cache.shape[0]) * int(main_cache.shape[1])
    if extra_cache is not None:
        e_ip = extra_indptr.cpu().to(torch.int64)
        extra_slots = int(extra_cache.shape[0]) * int(extra_cache.shape[1])
    out = torch.zeros(b, h, HEAD_DIM, dtype=torch.float64)
    wabs = torch.zeros(b, h, HEAD_DIM, dtype=torch.float64)
    labs = torch.zeros(b, h, dtype=torch.float64)
    lmax = torch.zeros(b, h, dtype=torch.float64)
    tokens, max_abs_v = [], []
    for r in range(b):
        parts = [dequantize_rows(main_cache, valid_slots(main_indices, m_ip, r, main_slots), main_flavour, True)]
        if extra_cache is not None:
            parts.append(dequantize_rows(extra_cache, valid_slots(extra_indices, e_ip, r, extra_slots),
                                         extra_flavour, scrub_extra))
        kv = torch.cat(parts).to(torch.float64)  # [n, 512]
        n = kv.shape[0]
        tokens.append(n)
        fin_v = kv[torch.isfinite(kv)]
        max_abs_v.append(float(fin_v.abs().max()) if fin_v.numel() else 0.0)
        # elementwise products and sums keep IEEE inf/NaN semantics independent of any BLAS
        s = softmax_scale * (q64[r][:, None, :] * kv[None, :, :]).sum(-1)  # [h, n]
        s_abs = softmax_scale * (q64[r].abs()[:, None, :] * kv.abs()[None, :, :]).sum(-1)
        finite_s = torch.isfinite(s)
        labs[r] = torch.where(finite_s, s_abs, torch.zeros_like(s_abs)).amax(-1) if n else 0.0
        cand = torch.cat([torch.where(finite_s, s.abs(), torch.zeros_like(s)),
                          torch.where(torch.isfinite(sink), sink.abs(), torch.zeros_like(sink))[:, None]], dim=1)
        lmax[r] = cand.amax(-1)
        m = torch.maximum(s.amax(-1), sink) if n else sink.clone()  # NaN propagates
        for hh in range(h):
            mh = float(m[hh])
            if mh == -math.inf:
                continue  # no token with a finite logit and no sink: l == 0, the row is 0
            e = torch.exp(s[hh] - mh)
            l = float(e.sum()) + math.exp(float(sink[hh]) - mh) if not math.isnan(mh) else math.nan
            if l <= 0:
                continue
            o = (e[:, None] * kv).sum(0) / l
            p = e / l
            out[r, hh] = o
            wabs[r, hh] = (p[:, None] * kv.abs()).sum(0) if n else 0.0
            if math.isnan(l):
                out[r, hh] = math.nan
                wabs[r, hh] = math.nan
    return DecodeReference(out, wabs, labs, lmax, tokens, max_abs_v)
