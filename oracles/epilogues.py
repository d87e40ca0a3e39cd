"""References for the reduce epilogues (SPEC section 2, "Optional epilogues"), in float64 with plain loops.

- inverse GPT-J RoPE on the last 64 lanes: even' = a*cos + b*sin, odd' = b*cos - a*sin, with an error bound for a
  float32 implementation (see :func:`rope_error_bound`);
- MXFP8: one UE8M0 code per 32 lanes, code = clamp(ceil(log2(amax / 448)) + 127, 0, 254) found by exact comparison
  against 448 * 2^k, values encoded to OCP e4m3 by nearest-value search (ties to even) from the same float32 lanes,
  so the result is byte-exact. Lanes that sit exactly on a rounding tie and groups whose amax is exactly 448 * 2^k
  (the edge between two scale codes) are counted, so a check can show they were reached.
"""
from __future__ import annotations

import bisect
import math

import torch

from oracles.formats import fp8_value

ROPE_DIM = 64
GROUP = 32
FP8_MAX = 448.0  # OCP e4m3
CODE_CAP = 254
U32 = 2.0 ** -24  # unit roundoff of float32
U_BF16 = 2.0 ** -8
#: flush-to-zero of subnormal float32 intermediates on GPUs (absolute, per rounding step)
FTZ = 2.0 ** -126


# --- inverse RoPE ---------------------------------------------------------------------------------------------

def inverse_rope_gptj(x: torch.Tensor, cos_sin: torch.Tensor, positions: list[int]) -> tuple[torch.Tensor,
                                                                                          torch.Tensor]:
    """(reference [T, H, W] float64, magnitude [T, H, W] float64) where magnitude is |a*cos| + |b*sin| (even lane)
    or |b*cos| + |a*sin| (odd lane) on the RoPE lanes, the scale of the rounding error of a float32 evaluation,
    and 0 elsewhere.

    ``cos_sin`` [P, 64]: cos of pair i in column i, sin in column 32 + i; ``positions[t]`` picks the row for token t.
    """
    xd = x.detach().cpu().to(torch.float64)
    cs = cos_sin.detach().cpu().to(torch.float64)
    T, H, W = xd.shape
    ref = xd.clone()
    mag = torch.zeros_like(xd)
    head = W - ROPE_DIM
    for t in range(T):
        row = cs[positions[t]]
        for h in range(H):
            for i in range(ROPE_DIM // 2):
                a = float(xd[t, h, head + 2 * i])
                b = float(xd[t, h, head + 2 * i + 1])
                c, s = float(row[i]), float(row[ROPE_DIM // 2 + i])
                ref[t, h, head + 2 * i] = a * c + b * s
                ref[t, h, head + 2 * i + 1] = b * c - a * s
                mag[t, h, head + 2 * i] = abs(a * c) + abs(b * s)
                mag[t, h, head + 2 * i + 1] = abs(b * c) + abs(a * s)
    return ref, mag


def rope_error_bound(ref: torch.Tensor, mag: torch.Tensor, out_dtype: torch.dtype) -> torch.Tensor:
    """Largest |got - ref| a float32 evaluation may show, per element.

    Error model: two float32 products and one float32 sum (or a fused multiply-add, which rounds less) each round
    with relative error <= u = 2^-24, so the float32 result is within (2u + u^2) * (|a cos| + |b sin|) of the
    exact value; the final cast to ``out_dtype`` adds u_out * |result| (bf16: 2^-8, float32: 0). Each rounding may
    also flush a subnormal to zero on a GPU: 3 * 2^-126 absolute (4 with a bf16 cast). The 1.01 factor covers the
    second-order terms of these products."""
    u_out = U_BF16 if out_dtype == torch.bfloat16 else 0.0
    f32_err = (2 * U32 + U32 * U32) * mag
    bound = f32_err * (1 + u_out) + u_out * ref.abs() + (4 if u_out else 3) * FTZ
    return bound * 1.01


# --- MXFP8 ----------------------------------------------------------------------------------------------------

def mxfp8_scale_code(amax: float) -> tuple[int, bool]:
    """(code, on_edge): code = clamp(ceil(log2(amax / 448)) + 127, 0, 254) with amax = 0 -> 0 and +inf -> 254;
    ``on_edge`` is True when amax == 448 * 2^k exactly (the largest amax a code covers)."""
    if amax == 0.0:
        return 0, False
    if math.isinf(amax):
        return CODE_CAP, False
    # smallest k with amax <= 448 * 2^k; ldexp is exact in float64 over this range
    k = math.ceil(math.log2(amax / FP8_MAX))
    while amax > math.ldexp(FP8_MAX, k):
        k += 1
    while amax <= math.ldexp(FP8_MAX, k - 1):
        k -= 1
    on_edge = amax == math.ldexp(FP8_MAX, k)
    return min(max(k + 127, 0), CODE_CAP), on_edge


# every finite non-negative OCP e4m3 magnitude with its code, ascending
_OCP_TABLE = sorted((fp8_value(c, "ocp"), c) for c in range(0x7F))
_OCP_VALUES = [v for v, _ in _OCP_TABLE]


def _encode_ocp(q: float) -> tuple[int, bool]:
    """(code, on_tie): nearest OCP e4m3 value to float64 ``q`` (ties to the even code), saturating at +-448 (inf
    too), NaN -> 0x7F, the sign kept on zero; ``on_tie`` when |q| is exactly halfway between two neighbours."""
    if math.isnan(q):
        return 0x7F, False
    a = min(abs(q), FP8_MAX)
    i = bisect.bisect_left(_OCP_VALUES, a)
    if _OCP_VALUES[i] == a:
        code, tie = _OCP_TABLE[i][1], False
    else:
        (lo, clo), (hi, chi) = _OCP_TABLE[i - 1], _OCP_TABLE[i]
        tie = a - lo == hi - a
        if tie:
            code = clo if clo % 2 == 0 else chi
        else:
            code = clo if a - lo < hi - a else chi
    if math.copysign(1.0, q) < 0:
        code |= 0x80
    return code, tie


def mxfp8_quantize(x: torch.Tensor) -> dict:
    """Reference MXFP8 of float32/bf16 rows [..., W]: ``codes`` uint8 [..., W], ``scales`` uint8 [..., W // 32],
    ``ties`` (lanes whose scaled value sits exactly on an e4m3 rounding tie), ``edges`` (groups whose amax is
    exactly 448 * 2^k). NaN lanes are ignored by amax and encode to 0x7F."""
    lead = tuple(x.shape[:-1])
    W = x.shape[-1]
    vals = x.detach().cpu().to(torch.float64).reshape(-1, W).tolist()
    codes, scales = [], []
    ties = edges = 0
    for row in vals:
        crow, srow = [], []
        for g0 in range(0, W, GROUP):
            group = row[g0:g0 + GROUP]
            amax = max((abs(v) for v in group if not math.isnan(v)), default=0.0)
            code, on_edge = mxfp8_scale_code(amax)
            edges += on_edge
            srow.append(code)
            for v in group:
                q = v * math.ldexp(1.0, 127 - code)  # exact in float64
                c, tie = _encode_ocp(q)
                ties += tie
                crow.append(c)
        codes.append(crow)
        scales.append(srow)
    return {"codes": torch.tensor(codes, dtype=torch.int32).to(torch.uint8).reshape(lead + (W,)),
            "scales": torch.tensor(scales, dtype=torch.int32).to(torch.uint8).reshape(lead + (W // GROUP,)),
            "ties": ties, "edges": edges}
