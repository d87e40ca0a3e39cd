"""Optional epilogues of the sparse-decode reduce (SPEC section 2, "Reduce ... Optional epilogues"), as standalone
Triton kernels over the reduce's output rows (float32 or bf16), so a reduce can call them or fuse them later:

- ``inverse_rope_gptj``: undo the GPT-J (interleaved pairs) rotary embedding on the last 64 lanes of each row:
  for pair i, (a, b) = (x[W-64+2i], x[W-64+2i+1]):  even' = a*cos_i + b*sin_i,  odd' = b*cos_i - a*sin_i
  (the inverse of the writer's even' = e*cos - o*sin, odd' = o*cos + e*sin, SPEC 4 step 5).
- ``mxfp8_quantize``: the gfx950 MXFP8 output: one UE8M0 scale code per 32 lanes,
  code = clamp(ceil(log2(amax / 448)) + 127, 0, 254), and OCP e4m3 values q = x * 2^-(code - 127)
  (round-to-nearest-even, saturating at +-448).

Both compute in float32 and reuse the shared codecs of :mod:`impl.triton_helpers`.

Source: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` (the reduce and its epilogues) as SPEC
section 2 restates it; the inverse RoPE is what upstream's tests check through
``DeepseekV4ScalingRotaryEmbedding.forward_native(inverse=True)`` (SPEC 8).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl.triton_helpers import bf16_rne_bits, load_as_f32
from impl.validation import dtype_name as _name_dtype, require_kernel_device, require_tensor
from impl.runtime import kernel_device
from impl.triton_helpers import fp8_encode_bits, ue8m0_encode_bits

#: RoPE lanes at the end of each row (SPEC 2: 448 NoPE + 64 RoPE).
ROPE_DIM = 64
ROPE_PAIRS = ROPE_DIM // 2
#: Lanes per MXFP8 scale code.
MXFP8_GROUP = 32
#: Largest UE8M0 code the MXFP8 epilogue emits (255 is NaN in e8m0 and +inf in the readers).
MXFP8_SCALE_CODE_CAP = 254
#: Groups handled by one program of the MXFP8 kernel.
MXFP8_GROUPS_PER_PROGRAM = 4
#: Below this amax the quotient amax / 448 would be an fp32 subnormal (rounded); the kernel then scales amax by
#: 2^MXFP8_LOW_SHIFT first so the quotient stays normal and ceil(log2) stays exact.
MXFP8_LOW_AMAX = 2.0 ** -100
MXFP8_LOW_SHIFT = 64


def _require_tensor(name: str, t, dtypes: tuple[torch.dtype, ...]) -> None:
    require_tensor(name, t, dtypes)
    require_kernel_device(name, t)


# ----------------------------------------------------------------------------------------------------------------
# inverse GPT-J RoPE
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _store_out(ptr, v, OUT_BF16: tl.constexpr, mask=None):
    """Store float32 ``v``: as float32, or as bf16 bits rounded to nearest even (``ptr`` then points at int16: the
    interpreter truncates fp32 -> bf16 casts, GPUs round, the bit route is the same everywhere)."""
    if OUT_BF16:
        tl.store(ptr, bf16_rne_bits(v).to(tl.int16), mask=mask)
    else:
        tl.store(ptr, v, mask=mask)


@triton.jit
def _inverse_rope_gptj_kernel(x, stride_xt, stride_xh, out, stride_ot, stride_oh, cos_sin, stride_cp, positions,
                              width, PAIRS: tl.constexpr, BLOCK: tl.constexpr, IN_BF16: tl.constexpr,
                              OUT_BF16: tl.constexpr):
    """Inverse GPT-J RoPE of one row.

    Layout: ``x``/``out`` [T, H, width] with unit lane stride; ``cos_sin`` [P, 2 * PAIRS] float32 with cos_i in
    column i and sin_i in column PAIRS + i; ``positions`` [T]. Grid (T, H): program (t, h) rotates the last
    2 * PAIRS lanes of row (t, h) by the angles of row ``positions[t]`` and copies the lanes before them.
    Invariant: every position is in [0, P) (checked on the host). Each program reads its pair before writing it,
    so ``out`` may alias ``x``.
    """
    t = tl.program_id(0)
    h = tl.program_id(1)
    xrow = x + t.to(tl.int64) * stride_xt + h.to(tl.int64) * stride_xh
    orow = out + t.to(tl.int64) * stride_ot + h.to(tl.int64) * stride_oh
    head = width - 2 * PAIRS
    for start in range(0, head, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < head
        v = load_as_f32(xrow + offs, m, IN_BF16)
        _store_out(orow + offs, v, OUT_BF16, mask=m)
    i = tl.arange(0, PAIRS)
    pos = tl.load(positions + t).to(tl.int64)
    c = tl.load(cos_sin + pos * stride_cp + i)
    s = tl.load(cos_sin + pos * stride_cp + PAIRS + i)
    every = i < PAIRS
    a = load_as_f32(xrow + head + 2 * i, every, IN_BF16)
    b = load_as_f32(xrow + head + 2 * i + 1, every, IN_BF16)
    even = a * c + b * s
    odd = b * c - a * s
    _store_out(orow + head + 2 * i, even, OUT_BF16)
    _store_out(orow + head + 2 * i + 1, odd, OUT_BF16)


def inverse_rope_gptj(x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor, *,
                      out: torch.Tensor | None = None, out_dtype: torch.dtype | None = None,
                      check_positions: bool = True) -> torch.Tensor:
    """Undo GPT-J RoPE on the last 64 lanes of the reduce's output rows.

    ``x``: [T, H, W] float32 or bf16, W >= 64, unit lane stride (the reduce writes [b, h, 512]).
    ``cos_sin``: [P, 64] float32 [I]: row p holds cos(theta_i * p) in columns 0..31 and sin(theta_i * p) in
    columns 32..63 for pair i; this is the compressor's cos_sin row layout (SPEC 4 step 5), which SPEC does not
    restate for the decode's epilogue. ``positions``: int32/int64 [T], the row of ``cos_sin`` for each query token
    (shared by its heads). Lanes before the last 64 are copied. All arithmetic is float32; the result is cast to
    ``out_dtype`` (default ``x.dtype``) or written into ``out`` (which may be ``x``).
    ``check_positions`` reads positions on the host to reject one outside [0, P).
    """
    _require_tensor("x", x, (torch.float32, torch.bfloat16))
    if x.dim() != 3 or x.shape[2] < ROPE_DIM:
        raise ValueError(f"x: expected shape [tokens, heads, width >= {ROPE_DIM}], got {list(x.shape)}")
    if x.stride(2) != 1:
        raise ValueError(f"x: expected a unit stride on the last dimension, got strides {list(x.stride())}")
    T, H, W = (int(d) for d in x.shape)
    _require_tensor("cos_sin", cos_sin, (torch.float32,))
    if cos_sin.dim() != 2 or cos_sin.shape[1] != ROPE_DIM or cos_sin.shape[0] < 1:
        raise ValueError(f"cos_sin: expected shape [positions >= 1, {ROPE_DIM}] (cos in 0..31, sin in 32..63), "
                         f"got {list(cos_sin.shape)}")
    if cos_sin.stride(1) != 1:
        raise ValueError(f"cos_sin: expected a unit stride on the last dimension, got {list(cos_sin.stride())}")
    _require_tensor("positions", positions, (torch.int32, torch.int64))
    if positions.dim() != 1 or positions.numel() != T:
        raise ValueError(f"positions: expected shape [{T}] (one per token of x), got {list(positions.shape)}")
    if not positions.is_contiguous():
        raise ValueError("positions: expected a contiguous tensor")
    for name, ten in (("cos_sin", cos_sin), ("positions", positions)):
        if ten.device != x.device:
            raise ValueError(f"{name}: expected device {x.device} (the device of x), got {ten.device}")
    if not isinstance(check_positions, bool):
        raise TypeError(f"check_positions: expected a bool, got {type(check_positions).__name__}")
    if check_positions and T:
        p = positions.to("cpu", torch.int64)
        bad = ((p < 0) | (p >= cos_sin.shape[0])).nonzero().flatten()
        if len(bad):
            i = int(bad[0])
            raise ValueError(f"positions: expected values in [0, {cos_sin.shape[0]}) (rows of cos_sin), got "
                             f"positions[{i}] = {int(p[i])}")
    if out is None:
        dt = x.dtype if out_dtype is None else out_dtype
        if dt not in (torch.float32, torch.bfloat16):
            raise TypeError(f"out_dtype: expected float32 or bfloat16, got {_name_dtype(dt)}")
        out = torch.empty((T, H, W), dtype=dt, device=x.device)
    else:
        _require_tensor("out", out, (torch.float32, torch.bfloat16))
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"out_dtype: {_name_dtype(out_dtype)} differs from out's dtype {_name_dtype(out.dtype)}")
        if tuple(out.shape) != (T, H, W) or out.stride(2) != 1 or out.device != x.device:
            raise ValueError(f"out: expected shape {[T, H, W]} with unit last stride on {x.device}, got "
                             f"{list(out.shape)} strides {list(out.stride())} on {out.device}")
        in_place = (out.data_ptr() == x.data_ptr() and out.dtype == x.dtype and out.stride() == x.stride())
        if not in_place and _overlaps(out, x):
            raise ValueError("out: overlaps x without being x itself (only an exact in-place call is safe)")
    if T == 0 or H == 0:
        return out
    out_bf16 = out.dtype == torch.bfloat16
    dst = out.view(torch.int16) if out_bf16 else out
    in_bf16 = x.dtype == torch.bfloat16
    src = x.view(torch.int16) if in_bf16 else x
    _inverse_rope_gptj_kernel[(T, H)](src, x.stride(0), x.stride(1), dst, out.stride(0), out.stride(1), cos_sin,
                                      cos_sin.stride(0), positions, W, PAIRS=ROPE_PAIRS, BLOCK=64,
                                      IN_BF16=in_bf16, OUT_BF16=out_bf16, num_warps=1)
    return out


def _overlaps(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    ea, eb = a.element_size(), b.element_size()
    a0 = a.storage_offset() * ea
    b0 = b.storage_offset() * eb
    a1 = a0 + (sum((s - 1) * st for s, st in zip(a.shape, a.stride())) + 1) * ea
    b1 = b0 + (sum((s - 1) * st for s, st in zip(b.shape, b.stride())) + 1) * eb
    return a0 < b1 and b0 < a1


# ----------------------------------------------------------------------------------------------------------------
# MXFP8 output
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def mxfp8_scale_code(amax, CAP: tl.constexpr, LOW_AMAX: tl.constexpr, LOW_SHIFT: tl.constexpr):
    """UE8M0 code clamp(ceil(log2(amax / 448)) + 127, 0, CAP) for amax >= 0 (0 -> code 0, +inf -> CAP), exact.

    Exact because amax / 448 keeps the side of every power of two it lies on while the quotient is a normal fp32
    (amax has 24 significant bits, 448 = 7 * 2^6: a quotient off 2^k is off by at least 0.57 * 2^-23 relative, more
    than half an ulp); tiny amax is scaled up by 2^LOW_SHIFT first so the quotient never goes subnormal."""
    low = amax < LOW_AMAX
    code_hi = ue8m0_encode_bits(amax / 448.0, CAP).to(tl.int32)
    # only the low branch is scaled up (a large amax times 2^LOW_SHIFT would overflow)
    code_lo = ue8m0_encode_bits((tl.where(low, amax, 1.0) * (2.0 ** LOW_SHIFT)) / 448.0, CAP).to(tl.int32) - LOW_SHIFT
    code = tl.where(low, tl.maximum(code_lo, 0), code_hi)
    return tl.where(amax == 0.0, 0, code)


@triton.jit
def _pow2_bits(e):
    """2^e as float32 from the exponent bits, for -126 <= e <= 127."""
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


# do_not_specialize: num_groups only masks the group lanes (g < num_groups): nothing gains from its specialization
@triton.jit(do_not_specialize=["num_groups"])
def _mxfp8_quantize_kernel(x, stride_xr, codes, stride_cr, scales, stride_sr, num_groups,
                           CAP: tl.constexpr, GROUP: tl.constexpr, GROUPS: tl.constexpr,
                           LOW_AMAX: tl.constexpr, LOW_SHIFT: tl.constexpr, IN_BF16: tl.constexpr):
    """MXFP8 quantization of one row's groups.

    Layout: ``x`` [R, num_groups * GROUP] float32/bf16 (unit lane stride), ``codes`` [R, num_groups * GROUP] uint8
    (OCP e4m3), ``scales`` [R, num_groups] uint8 (UE8M0). Grid (R, cdiv(num_groups, GROUPS)): program (r, j)
    handles groups j*GROUPS .. j*GROUPS + GROUPS - 1 of row r.
    amax ignores NaN lanes (they encode to the NaN code 0x7F) [I]; an all-zero group gets code 0. Values are
    x * 2^-(code - 127) computed as two power-of-two products (each factor a normal fp32, so neither GPU
    flush-to-zero of 2^-127 nor double rounding changes the result), then RNE-encoded with saturation at 448.
    """
    r = tl.program_id(0)
    j = tl.program_id(1)
    g = j * GROUPS + tl.arange(0, GROUPS)
    lane = tl.arange(0, GROUP)
    gmask = g < num_groups
    offs = g[:, None] * GROUP + lane[None, :]
    v = load_as_f32(x + r.to(tl.int64) * stride_xr + offs, gmask[:, None], IN_BF16)
    mag = tl.where(v == v, tl.abs(v), 0.0)
    amax = tl.max(mag, axis=1)
    code = mxfp8_scale_code(amax, CAP, LOW_AMAX, LOW_SHIFT)
    e = code - 127
    e_lo = e >> 1
    e_hi = e - e_lo
    q = (v * _pow2_bits(-e_lo)[:, None]) * _pow2_bits(-e_hi)[:, None]
    tl.store(codes + r.to(tl.int64) * stride_cr + offs, fp8_encode_bits(q, False), mask=gmask[:, None])
    tl.store(scales + r.to(tl.int64) * stride_sr + g, code.to(tl.uint8), mask=gmask)


def mxfp8_quantize(x: torch.Tensor, *, codes: torch.Tensor | None = None,
                   scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP8-quantize rows of the reduce's output: ``x`` [..., W] float32 or bf16, W a multiple of 32, unit lane
    stride. Returns (``codes`` [..., W] uint8 OCP e4m3, ``scales`` [..., W // 32] uint8 UE8M0 codes <= 254); either
    may be given (contiguous, right shape) to be written in place. A value decodes as
    fp8(codes) * 2^(scales - 127), one scale per 32 consecutive lanes starting at lane 0."""
    _require_tensor("x", x, (torch.float32, torch.bfloat16))
    if x.dim() < 1 or x.shape[-1] == 0 or x.shape[-1] % MXFP8_GROUP:
        raise ValueError(f"x: expected a last dimension that is a positive multiple of {MXFP8_GROUP}, got shape "
                         f"{list(x.shape)}")
    if x.stride(-1) != 1:
        raise ValueError(f"x: expected a unit stride on the last dimension, got strides {list(x.stride())}")
    lead = tuple(int(d) for d in x.shape[:-1])
    W = int(x.shape[-1])
    G = W // MXFP8_GROUP
    rows = 1
    for d in lead:
        rows *= d
    # flattening the leading dimensions must not copy: the kernel reads x in place
    try:
        x2 = x.view(rows, W)
    except RuntimeError:
        raise ValueError(f"x: leading dimensions must flatten without a copy, got strides {list(x.stride())}") \
            from None
    for name, ten, shape in (("codes", codes, lead + (W,)), ("scales", scales, lead + (G,))):
        if ten is None:
            continue
        _require_tensor(name, ten, (torch.uint8,))
        if tuple(ten.shape) != shape or not ten.is_contiguous() or ten.device != x.device:
            raise ValueError(f"{name}: expected a contiguous uint8 tensor of shape {list(shape)} on {x.device}, got "
                             f"{list(ten.shape)} on {ten.device}")
    if codes is None:
        codes = torch.empty(lead + (W,), dtype=torch.uint8, device=x.device)
    if scales is None:
        scales = torch.empty(lead + (G,), dtype=torch.uint8, device=x.device)
    if rows == 0:
        return codes, scales
    c2, s2 = codes.view(rows, W), scales.view(rows, G)
    grid = (rows, triton.cdiv(G, MXFP8_GROUPS_PER_PROGRAM))
    in_bf16 = x.dtype == torch.bfloat16
    _mxfp8_quantize_kernel[grid](x2.view(torch.int16) if in_bf16 else x2, x2.stride(0), c2, c2.stride(0), s2, s2.stride(0), G,
                                 CAP=MXFP8_SCALE_CODE_CAP, GROUP=MXFP8_GROUP, GROUPS=MXFP8_GROUPS_PER_PROGRAM,
                                 LOW_AMAX=MXFP8_LOW_AMAX, LOW_SHIFT=MXFP8_LOW_SHIFT, IN_BF16=in_bf16,
                                 num_warps=1)
    return codes, scales
