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


def dequantize_rows(cache: torch.Tensor, slots, flavour: str, scrub: bool, scale_255: str = "inf") -> torch.Tensor:
    """[len(slots), 512] float32 rows as the kernels see them (see the module docstring); ``slots`` a list or an
    int64 tensor of valid slots, read all at once by their absolute byte offsets. ``scale_255="nan"`` reads UE8M0
    code 255 as NaN (the OCP MX rule for E8M0) instead of the readers' +inf: the other reading a kernel may have."""
    if scale_255 not in ("inf", "nan"):
        raise ValueError(f"scale_255: expected 'inf' or 'nan', got {scale_255!r}")
    flat, base = ref_formats.storage_bytes(cache)
    flat = flat.cpu()
    bs, stride = int(cache.shape[1]), int(cache.stride(0))
    s = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
    off = ref_formats.fp8_ds_mla_token_offsets(s, bs, stride)
    nope = flat[base + off["nope"]]  # [n, 448] codes
    codes = flat[base + off["scale"]]  # [n, 7] UE8M0 codes
    rope = flat[base + off["rope"]].contiguous().view(torch.bfloat16)  # [n, 64], little-endian pairs
    # each code's value from the codecs' 256-entry tables (computed here, for this call), looked up per byte
    fp8_table = ref_formats.fp8_decode(torch.arange(256), flavour).to(torch.float32)
    scale_table = ref_formats.ue8m0_decode(torch.arange(256), reader=True).to(torch.float32)
    if scale_255 == "nan":
        scale_table[255] = math.nan
    fp8 = fp8_table[nope.to(torch.int64)]
    scl = scale_table[codes.to(torch.int64)].repeat_interleave(GROUP, dim=1)
    rows = torch.empty(len(s), HEAD_DIM, dtype=torch.float32)
    rows[:, :NOPE_DIM] = fp8 * scl  # one float32 product, as in the kernel
    rows[:, NOPE_DIM:] = rope.to(torch.float32)
    if scrub:
        rows = torch.where(torch.isnan(rows), torch.zeros_like(rows), rows)
    return rows


def valid_slots(indices: torch.Tensor, indptr: torch.Tensor, row: int, num_slots: int) -> list[int]:
    idx = indices.cpu().tolist()
    lo, hi = int(indptr[row]), int(indptr[row + 1])
    return [int(s) for s in idx[lo:hi] if 0 <= int(s) < num_slots]


def valid_slots_all(indices: torch.Tensor, indptr: torch.Tensor, rows: int, num_slots: int
                    ) -> tuple[torch.Tensor, list[int]]:
    """:func:`valid_slots` of rows 0..rows-1 at once: the valid slots of all rows in row order (int64), and each
    row's count."""
    idx = indices.detach().cpu().to(torch.int64).reshape(-1)
    ip = indptr.detach().cpu().to(torch.int64).reshape(-1).tolist()
    parts = []
    for r in range(rows):
        seg = idx[ip[r]:ip[r + 1]]  # the slice valid_slots takes (a Python slice's rules)
        parts.append(seg[(seg >= 0) & (seg < num_slots)])
    if not parts:
        return torch.zeros(0, dtype=torch.int64), []
    return torch.cat(parts), [int(p.numel()) for p in parts]


def attend_heads(q64: torch.Tensor, kv: torch.Tensor, sink: torch.Tensor, softmax_scale: float) -> tuple:
    """Float64 attention of one query row q64 [h, 512] over its tokens kv [n, 512] (V = K) with the sink as an
    extra logit of value zero, every head at once. Returns (out, wabs) [h, 512] and (labs, lmax) [h], per head:
    0 where no token has a finite logit and there is no sink (m == -inf) or l <= 0; NaN where m or l is NaN;
    else out = sum_j e_j v_j / l and wabs = sum_j p_j |v_j|, e_j = exp(s_j - m), l = sum_j e_j + exp(sink - m).
    Elementwise products and sums keep IEEE inf/NaN semantics independent of any BLAS."""
    n = kv.shape[0]
    s = softmax_scale * (q64[:, None, :] * kv[None, :, :]).sum(-1)  # [h, n]
    s_abs = softmax_scale * (q64.abs()[:, None, :] * kv.abs()[None, :, :]).sum(-1)
    finite_s = torch.isfinite(s)
    labs = torch.where(finite_s, s_abs, torch.zeros_like(s_abs)).amax(-1) if n else torch.zeros_like(sink)
    cand = torch.cat([torch.where(finite_s, s.abs(), torch.zeros_like(s)),
                      torch.where(torch.isfinite(sink), sink.abs(), torch.zeros_like(sink))[:, None]], dim=1)
    lmax = cand.amax(-1)
    m = torch.maximum(s.amax(-1), sink) if n else sink.clone()  # NaN propagates
    e = torch.exp(s - m[:, None])  # [h, n]
    l = e.sum(-1) + torch.exp(sink - m)
    out = (e[:, :, None] * kv[None, :, :]).sum(1) / l[:, None]
    p = e / l[:, None]
    wabs = (p[:, :, None] * kv.abs()[None, :, :]).sum(1)
    nan = (torch.isnan(m) | torch.isnan(l))[:, None]
    zero = ((m == -math.inf) | (~torch.isnan(l) & (l <= 0)))[:, None]
    out = torch.where(zero, 0.0, torch.where(nan, math.nan, out))
    wabs = torch.where(zero, 0.0, torch.where(nan, math.nan, wabs))
    return out, wabs, labs, lmax


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
                           extra_flavour: str, scrub_extra: bool, scrub_main: bool = True,
                           scale_255: str = "inf") -> DecodeReference:
    """The reference decode (module docstring). SPEC 2's readers are the defaults; ``scrub_main=False`` keeps the
    main cache's NaN lanes and ``scale_255="nan"`` reads UE8M0 code 255 as NaN: the other readings a kernel may
    have, which the contracts use to name the rule a mismatching kernel follows instead."""
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
    if b == 0:
        return DecodeReference(out, wabs, labs, lmax, tokens, max_abs_v)
    # every referenced row of each cache dequantized at once, then split by row
    m_slots, m_counts = valid_slots_all(main_indices, m_ip, b, main_slots)
    m_rows = dequantize_rows(main_cache, m_slots, main_flavour, scrub_main, scale_255).to(torch.float64
                                                                                           ).split(m_counts)
    if extra_cache is not None:
        e_slots, e_counts = valid_slots_all(extra_indices, e_ip, b, extra_slots)
        e_rows = dequantize_rows(extra_cache, e_slots, extra_flavour, scrub_extra, scale_255).to(torch.float64
                                                                                                 ).split(e_counts)
    for r in range(b):
        kv = torch.cat([m_rows[r], e_rows[r]]) if extra_cache is not None else m_rows[r]  # [n, 512]
        n = kv.shape[0]
        tokens.append(n)
        fin_v = kv[torch.isfinite(kv)]
        max_abs_v.append(float(fin_v.abs().max()) if fin_v.numel() else 0.0)
        out[r], wabs[r], labs[r], lmax[r] = attend_heads(q64[r], kv, sink, softmax_scale)
    return DecodeReference(out, wabs, labs, lmax, tokens, max_abs_v)
