"""Reduce epilogues: upstream's inverse GPT-J RoPE and its MXFP8 quantizer, behind our API.

- ``inverse_rope_gptj`` calls upstream's ``_fused_inverse_rope_gptj`` (the host wrapper of
  ``_inverse_rope_gptj_kernel``, which ``rocm_inverse_rope_rows_`` runs over the rows the decode reduce did not
  rotate) with ``rope_head_dim = 64`` and our ``cos_sin`` as its ``cos_sin_cache`` (the same [P, 64] cos | sin
  layout). Upstream writes bf16 only: a float32 output is :class:`~contracts.subjects.EntryMissing`. Rows of the
  64 RoPE lanes alone (width 64) make its kernel fail to build; that failure is re-raised as one stable ValueError.
- ``mxfp8_quantize``: upstream has no host entry that quantizes without rotating first (``rocm_inverse_rope_mxfp8_rows``
  and the reduce's ``QUANT_OUT`` both rotate, and an identity rotation is not an identity on inf and -0 lanes:
  ``inf * 0`` is NaN, ``-0 + 0`` is +0). So a loader kernel of ours reads one 32-lane group per program as
  float32 and hands it to upstream's own ``_mxfp8_quantize_rows`` (the helper both of upstream's MXFP8 paths call);
  it stores the helper's results the way upstream's kernels store them: the values cast to the e4m3 output
  dtype, the exponents cast to uint8.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from contracts.subjects.base import EntryMissing, Family
from contracts.subjects.vllm.adapters import needs

ROPE_DIM = 64
MXFP8_GROUP = 32
NO_NOPE_LANES = ("upstream's _fused_inverse_rope_gptj cannot take rows without NoPE lanes (width 64): its kernel "
                 "does not build")

#: upstream's ``_mxfp8_quantize_rows`` of the target being called (set under the loader's lock for each call)
_UPSTREAM_QUANTIZE_ROWS = None


@triton.jit
def _mxfp8_group_kernel(x, stride_xr, codes, stride_cr, scales, stride_sr, IN_BF16: tl.constexpr):
    """Program (r, g): lanes [32 g, 32 g + 32) of row r through upstream's ``_mxfp8_quantize_rows(x, 1, 32)``."""
    r = tl.program_id(0).to(tl.int64)
    g = tl.program_id(1).to(tl.int64)
    lanes = tl.arange(0, 32)
    v = tl.load(x + r * stride_xr + g * 32 + lanes)
    if IN_BF16:
        v = (v.to(tl.int32) << 16).to(tl.float32, bitcast=True)  # bf16 -> fp32 is exact: the high half
    v = tl.reshape(v.to(tl.float32), (1, 32))
    q, bits = _UPSTREAM_QUANTIZE_ROWS(v, 1, 32)
    tl.store(codes + r * stride_cr + g * 32 + lanes, tl.reshape(q, (32,)).to(codes.dtype.element_ty))
    tl.store(scales + r * stride_sr + g + tl.arange(0, 1), tl.reshape(bits, (1,)).to(tl.uint8))


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["_fused_inverse_rope_gptj", "_mxfp8_quantize_rows"],
}, since={"ops._fused_inverse_rope_gptj": "0.24.0", "ops._mxfp8_quantize_rows": "0.31.0"})


def build(ctx) -> Family:
    ops = ctx["ops"]

    def inverse_rope_gptj(x, cos_sin, positions, *, out=None, out_dtype=None, check_positions=True):
        T, H, W = (int(d) for d in x.shape)
        dt = out.dtype if out is not None else (x.dtype if out_dtype is None else out_dtype)
        if dt != torch.bfloat16:
            raise EntryMissing("epilogues.inverse_rope_gptj",
                               f"upstream's inverse RoPE writes bf16 only, {dt} was asked for")
        if out is None:
            out = torch.empty((T, H, W), dtype=torch.bfloat16, device=x.device)
        try:
            return ctx.call(ops._fused_inverse_rope_gptj, x, positions, cos_sin, ROPE_DIM, out=out)
        except Exception as exc:
            if W - ROPE_DIM > 0:
                raise
            # its kernel sizes a NoPE block of next_power_of_2(width - 64) = 0 lanes, which no Triton can build;
            # said in one sentence that does not depend on how this Triton words the failure
            raise ValueError(NO_NOPE_LANES) from exc

    def mxfp8_quantize(x, *, codes=None, scales=None):
        lead = tuple(int(d) for d in x.shape[:-1])
        W = int(x.shape[-1])
        G = W // MXFP8_GROUP
        rows = 1
        for d in lead:
            rows *= d
        x2 = x.view(rows, W)
        if codes is None:
            codes = torch.empty(lead + (W,), dtype=torch.uint8, device=x.device)
        if scales is None:
            scales = torch.empty(lead + (G,), dtype=torch.uint8, device=x.device)
        if rows == 0:
            return codes, scales
        c2 = codes.view(rows, W).view(torch.float8_e4m3fn)
        s2 = scales.view(rows, G)
        in_bf16 = x.dtype == torch.bfloat16

        def run():
            global _UPSTREAM_QUANTIZE_ROWS
            _UPSTREAM_QUANTIZE_ROWS = ops._mxfp8_quantize_rows
            _mxfp8_group_kernel[(rows, G)](x2.view(torch.int16) if in_bf16 else x2, x2.stride(0), c2, c2.stride(0),
                                           s2, s2.stride(0), IN_BF16=in_bf16, num_warps=1)

        ctx.call(run)
        return codes, scales

    return Family("epilogues", inverse_rope_gptj=inverse_rope_gptj, mxfp8_quantize=mxfp8_quantize, ROPE_DIM=ROPE_DIM)
