"""Float64 reference of the split-K reduce (SPEC 2, "Reduce"), written from SPEC alone.

m = max(max_s m_s, sink); w_s = e^(m_s - m); l = sum_s w_s l_s (+ e^(sink - m)); out = sum_s w_s acc_s / l, and 0
where l <= 0 (no valid token and no sink). With adaptive splits, a split whose m is exactly -FLT_MAX is left out
entirely (its accumulator is never read). Also the error bound of an fp32 evaluation rounded to bf16.
"""
from __future__ import annotations

import torch

FLT_MAX = float(torch.finfo(torch.float32).max)
U32 = 2.0 ** -24
#: one bf16 unit in the last place, relative: an fp32 -> bf16 store rounds to nearest on a GPU (half of it) but
#: truncates under the Triton interpreter (3.9: 1 + 3 * 2^-8 stores as 1 + 2^-7), so a whole unit is allowed
U_BF16 = 2.0 ** -7
BF16_TINY = 2.0 ** -133  # below the smallest bf16 subnormal's half: flushes and denormal rounding


def ref_reduce(part_m: torch.Tensor, part_l: torch.Tensor, part_acc: torch.Tensor, sink, adaptive: bool):
    """``(out, bound)``: out [b, h, 512] float64 and the per-element bound of an fp32 reduce rounded to bf16."""
    m_s = part_m.double()
    l_s = part_l.double()
    acc = part_acc.double()
    b, S, h = m_s.shape
    live = (part_m != -FLT_MAX) if adaptive else torch.ones_like(part_m, dtype=torch.bool)
    m = torch.where(live, m_s, torch.full_like(m_s, -FLT_MAX)).amax(dim=1)  # [b, h]
    if adaptive:
        # every split dead: the running maximum keeps its -FLT_MAX start (the kernel never reads a dead m)
        m = torch.where(live.any(dim=1), m, torch.full_like(m, -FLT_MAX))
    if sink is not None:
        m = torch.maximum(m, sink.double()[None, :h])
    w = torch.exp(m_s - m[:, None, :])
    w = torch.where(live, w, torch.zeros_like(w))
    l = (w * l_s).sum(dim=1)
    if sink is not None:
        l = l + torch.exp(sink.double()[None, :h] - m)
    wacc = torch.where(live[..., None], w[..., None] * acc, torch.zeros_like(acc))
    num = wacc.sum(dim=1)
    out = torch.where((l <= 0)[..., None], torch.zeros_like(num), num / l.clamp_min(1e-30)[..., None])
    # fp32 evaluation: each w_s carries the rounding of m_s - m and of exp (relative (|m_s| + |m|) u + 2u), each sum
    # S + 2 roundings; the quotient's error is the numerator's over l plus out times the denominator's relative
    mag = torch.where(live[..., None], w[..., None] * acc.abs(), torch.zeros_like(acc)).nan_to_num(0.0).sum(dim=1)
    mterm = (torch.where(live, m_s.abs(), torch.zeros_like(m_s)).amax(dim=1) + m.abs()).clamp_max(1e6)
    rel = 8 * U32 * (S + 4 + mterm)  # [b, h]
    den = l.clamp_min(1e-30)
    bound = rel[..., None] * (mag / den[..., None] + out.abs().nan_to_num(0.0)) + U_BF16 * out.abs() + BF16_TINY
    return out, bound
