"""Reference indexer logits and top-k (SPEC 1.3 and 5), in float64 from the cache bytes.

logit[t, s] = kscale[s] * sum_h w[t, h] * relu(q[t, h] . k[s]); the relu keeps NaN (a NaN score stays NaN, as
torch.relu does); masked positions are -inf. Keys are read byte by byte at the absolute offsets SPEC 1.3 gives
(:func:`oracles.formats.indexer_k_token_offsets`, every slot at once), the fp8 codes decoded by
:func:`oracles.formats.fp8_decode`, the scale read as a little-endian fp32 (NaN and infinities kept). Every product
of two e4m3 values and every sum of 128 of them is exact in float64, so the reference is the exact value of the
formula up to float64 rounding.

Besides the logits the references return what a tolerance needs: the head sum before the scale, its absolute
counterpart sum_h |w[t, h]| * sum_d |q[t, h, d] * k[s, d]| and the scale, on every visible position, and the
``visible`` mask itself.

The top-k is a sort of (value, column) pairs: candidates are the logits that are neither -inf nor NaN, ranked by
value, larger first, equal values (-0.0 == +0.0) the lower column first; a row has min(k, count) entries, then -1.
"""
from __future__ import annotations

import math
import torch

from oracles.formats import fp8_decode, fp32_from_le_bytes, indexer_k_token_offsets, storage_bytes


#: readings of a cache block: SPEC 1.3's two layouts, and one that is not SPEC's (a diagnosis, for naming what a
#: wrong reader computed): each token's 132 bytes as one row of the block seen as [bs, 132] (fp8 bytes then scale)
READINGS = ("normal", "shuffle", "token-rows")


def _token_row_offsets(slots: torch.Tensor, block_size: int, block_stride: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's 132 bytes as one row of the block (the "token-rows" reading), for many slots: int64 [n, 128]
    byte offsets and [n] scale offsets."""
    block, t = torch.div(slots, block_size, rounding_mode="floor"), torch.remainder(slots, block_size)
    row = block * block_stride + t * 132
    return row[:, None] + torch.arange(128), row + 128


def _read_keys(cache: torch.Tensor, slots: list[int], layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 codes [n, 128] and float64 scales [n] of the given slots of an indexer-K cache view [nb, bs, 132]."""
    if layout not in READINGS:
        raise ValueError(f"layout: expected one of {READINGS}, got {layout!r}")
    flat, base = storage_bytes(cache)
    flat = flat.cpu()
    bs = int(cache.shape[1])
    stride = int(cache.stride(0))
    s = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
    if layout == "token-rows":
        offs, soff = _token_row_offsets(s, bs, stride)
    else:
        offs, soff = indexer_k_token_offsets(s, bs, stride, layout)
    codes = flat[offs + base]  # [n, 128] uint8, every slot's bytes at once
    scales = fp32_from_le_bytes(flat[(base + soff)[:, None] + torch.arange(4)]).to(torch.float64)
    return codes, scales


def _score(qf: torch.Tensor, w: torch.Tensor, kf: torch.Tensor, scales: torch.Tensor, variant: dict):
    """qf [H, 128], w [H], kf [n, 128], scales [n] (float64) -> (logit, head sum, absolute sum) each [n].

    ``variant`` (diagnoses only; SPEC's formula when empty): ``scale_inside`` folds the key scale into the key before
    the dot (so before the relu), ``relu_drops_nan`` makes relu(NaN) = 0."""
    if variant.get("scale_inside"):
        # the dequantized key as an fp32 tensor holds it: a product past FLT_MAX is inf there, as in such a reader
        s = (kf.float() * scales.float()[:, None]).double() @ qf.T
    else:
        s = kf @ qf.T  # [n, H]
    if variant.get("relu_drops_nan"):
        relu = torch.where(s > 0, s, torch.zeros_like(s))
    else:
        relu = torch.where(s < 0, torch.zeros_like(s), s)
    head_sum = (relu * w[None, :]).sum(dim=1)
    # NaN lanes count 0 in the magnitude: it bounds the error of a logit that is finite (a NaN one has no bound)
    absum = (kf.nan_to_num(0.0).abs() @ qf.nan_to_num(0.0).abs().T * w.abs()[None, :]).sum(dim=1)
    if variant.get("scale_inside"):
        # each dequantized lane k * scale may lose one subnormal ulp: sum_h |w_h| sum_d |q_hd| of them at most
        absum = absum + (qf.nan_to_num(0.0).abs().sum(dim=1) * w.abs()).sum() * 2.0 ** -149 / scales.abs().clamp(
            min=2.0 ** -149)
        return head_sum, head_sum, absum
    return head_sum * scales, head_sum, absum


def _empty(rows: int, cols: int) -> dict:
    return {"logits": torch.full((rows, cols), -math.inf, dtype=torch.float64),
            "head_sum": torch.zeros(rows, cols, dtype=torch.float64),
            "absum": torch.zeros(rows, cols, dtype=torch.float64),
            "scale": torch.zeros(rows, cols, dtype=torch.float64),
            "visible": torch.zeros(rows, cols, dtype=torch.bool)}


def paged_logits(q_codes: torch.Tensor, cache: torch.Tensor, weights: torch.Tensor, visible: list[list[int]],
                 block_table: list[list[int]], max_model_len: int, layout: str, flavour: str, **variant) -> dict:
    """Decode reference. ``q_codes`` [B, next_n, H, 128] uint8; ``cache`` the [nb, bs, 132] uint8 view;
    ``weights`` [B * next_n, H]; ``visible[b][j]`` how many positions row (b, j) sees (SPEC 5's decode mask:
    ctx - next_n + j + 1 for a per-request length, given per row otherwise); ``block_table`` rows as lists;
    ``layout`` one of :data:`READINGS`; ``variant`` as :func:`_score` takes it.
    Returns float64 [B * next_n, max_model_len] tensors ``logits``, ``head_sum``, ``absum``, ``scale`` and the bool
    ``visible``."""
    B, next_n, H, _ = q_codes.shape
    bs = int(cache.shape[1])
    out = _empty(B * next_n, max_model_len)
    qf = fp8_decode(q_codes.cpu(), flavour)
    w = weights.detach().cpu().to(torch.float64)
    for b in range(B):
        n_max = max(max(visible[b]), 0)
        slots = [block_table[b][n // bs] * bs + n % bs for n in range(n_max)]
        codes, scales = _read_keys(cache, slots, layout)
        kf = fp8_decode(codes, flavour)
        for j in range(next_n):
            n = max(visible[b][j], 0)
            if n == 0:
                continue
            r = b * next_n + j
            logit, hs, ab = _score(qf[b, j], w[r], kf[:n], scales[:n], variant)
            out["logits"][r, :n] = logit
            out["head_sum"][r, :n] = hs
            out["absum"][r, :n] = ab
            out["scale"][r, :n] = scales[:n]
            out["visible"][r, :n] = True
    return out


def prefill_logits(q_codes: torch.Tensor, k_codes: torch.Tensor, k_scale: torch.Tensor, weights: torch.Tensor,
                   ks: list[int], ke: list[int], flavour: str, **variant) -> dict:
    """Prefill reference: ``q_codes`` [T, H, 128], ``k_codes`` [S, 128] uint8, ``k_scale`` [S] (any float dtype);
    row t sees keys [ks[t], ke[t]). Returns float64 [T, S] ``logits``, ``head_sum``, ``absum``, ``scale``."""
    T = int(q_codes.shape[0])
    S = int(k_codes.shape[0])
    out = _empty(T, S)
    qf = fp8_decode(q_codes.cpu(), flavour)
    kf = fp8_decode(k_codes.cpu(), flavour)
    sc = k_scale.detach().cpu().to(torch.float64).reshape(S)
    w = weights.detach().cpu().to(torch.float64)
    for t in range(T):
        lo, hi = ks[t], ke[t]
        if hi <= lo:
            continue
        logit, hs, ab = _score(qf[t], w[t], kf[lo:hi], sc[lo:hi], variant)
        out["logits"][t, lo:hi] = logit
        out["head_sum"][t, lo:hi] = hs
        out["absum"][t, lo:hi] = ab
        out["scale"][t, lo:hi] = sc[lo:hi]
        out["visible"][t, lo:hi] = True
    return out


def ranked(row: list[float], lo: int = 0, hi: int | None = None) -> list[int]:
    """Candidate columns of one row (in [lo, hi)) in rank order: value descending, then the lower column."""
    hi = len(row) if hi is None else hi
    cands = [(-v, c) for c, v in enumerate(row) if lo <= c < hi and not math.isnan(v) and v != -math.inf]
    return [c for _, c in sorted(cands)]


def topk(rows: list[list[float]], k: int, starts: list[int] | None = None, ends: list[int] | None = None
         ) -> list[list[int]]:
    """Each row's first min(k, count) ranked columns then -1 (k entries). With ``starts``/``ends`` only columns in
    [starts[r], ends[r]) rank and the result is relative to starts[r] (the prefill form)."""
    out = []
    for r, row in enumerate(rows):
        lo = 0 if starts is None else starts[r]
        hi = None if ends is None else ends[r]
        picks = [c - lo for c in ranked(row, lo, hi)[:k]]
        out.append(picks + [-1] * (k - len(picks)))
    return out
