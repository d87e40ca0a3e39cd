"""DSv4 sparse MLA decode over ``fp8_ds_mla`` caches (SPEC section 2): three Triton kernel families and the reduce.

``sparse_attn_decode`` attends every query row to the union of its SWA ("main") tokens and its compressed
("extra") tokens, plus an optional per-head sink logit with a zero value:

    s_j = scale * (q_nope . k_nope_j + q_rope . k_rope_j),   V = K (all 512 lanes, RoPE included)
    out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink - m)),   m = max(max_j s_j, sink)

An empty row without a sink gives 0. Which kernels run is decided by the ``Target``:

- ``generic``: one kernel, grid (b, ceil(h/16)), BLOCK_K 16, 8 warps, writes bf16 directly.
- ``gfx942``: split-K partial, grid (b, S, ceil(h/16)), BLOCK_H 16, BLOCK_K 32, natural-log online softmax over
  separate NoPE/RoPE dots, then the reduce.
- ``gfx950``: split-K partial with four 128-wide tiles of the 512 lanes (the last one 64 NoPE + 64 RoPE) joined
  into one QK dot, four 128-wide PV accumulators, base-2 softmax, the main segment in guarded 32-token tiles, the
  extra segment in 32-token online-softmax steps (upstream's: it loads 64 tokens and runs two 32-token steps;
  ``extra_tile=64`` makes it one 64-token step, then at most two 32-token tails); optional adaptive splits. Then
  the reduce.

The grids' 16-head blocks are the defaults' (and upstream's); a ``block_h`` variant widens them (64: one program
per query and split, every KV row read once, ``SINGLE_READ_VARIANTS``).

Cache reads: a slot is valid when it lies inside its row's indptr range and 0 <= slot < num_blocks * block_size;
anything else (-1, INT32 extremes, slots past the cache) is masked and never dereferenced. Blocks are addressed
with ``cache.stride(0)`` in int64. fp8 flavours come from the Target (main ``target.main_cache_fp8``, extra
``target.extra_cache_fp8``); each is decoded by the hardware conversion where the device has that flavour (OCP on
NVIDIA sm_89+ and gfx950, FNUZ on gfx942) and from the raw bits otherwise (FNUZ on NVIDIA, OCP on gfx942, the
interpreter, whose conversions get the NaN codes wrong). ``impl.triton_helpers.hw_fp8_decode`` is the one place that
decides, and ``sparse_attn_decode`` passes its answer as the HW_FP8_MAIN / HW_FP8_EXTRA constexprs; both paths give
the same fp32 value for every code. UE8M0 goes through the readers' rule (code 255 -> +inf), products in fp32. NaN
lanes are scrubbed to 0 after dequantization: always for the main cache, for the extra cache unless the trust gate
is open. Inf is never scrubbed.

Dot operands are bf16 (exact for fp8 x 2^k products and bf16 RoPE; p is rounded to bf16 for the PV dot),
accumulation fp32; every dot goes through ``impl.triton_helpers.dot``.

Every K/V tile is built by ``_kv_tile`` (wide loads at plain masked offsets, one scale per 64-lane group). How
each family's kernel is built otherwise (16-bit RoPE reads, heads per program, gfx950's extra tile width, warps
and pipeline stages) is a ``DecodeVariant`` (``DEFAULT_VARIANTS``, ``decode_variant``); the generic default keeps
the structure SPEC 2 restates from upstream, and gfx942's and gfx950's pick per launch by its size (``SizeRule``):
upstream's 16-head blocks where few programs run, the single-read build where its programs fill the device.

Every launch goes through ``_launch``, which reports it to an optional launch observer (``set_launch_observer``,
``launch_observer``): kernel, grid, argument pointers/layouts, scalars and meta-parameters. Graph capture uses it
to freeze a launch sequence and to prove a replay reuses it (``impl.graph_capture``).

Source: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` (``rocm_sparse_attn_decode`` and the
gfx950 partial kernel) as SPEC section 2 restates it.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field, replace

import torch
import triton
import triton.language as tl

from impl import formats
from impl import splits as _splits
from impl.runtime import kernel_device, native_without_gpu_hint
from impl.targets import Target, effective_cu_count, get_target
from impl.triton_helpers import dot, fp8_decode, hw_fp8_decode, online_softmax_step, ue8m0_decode_reader
from impl.validation import dtype_name as _name_dtype, require_kernel_device, require_tensor, require_valid_indptr

FLT_MAX = 3.4028234663852886e38
LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
DEFAULT_SOFTMAX_SCALE = formats.DSV4_HEAD_DIM ** -0.5
BLOCK_H = _splits.BLOCK_H
GFX942_BLOCK_K = 32
GENERIC_BLOCK_K = 16
GFX950_MAIN_TILE = 32
GFX950_EXTRA_TILE = 64
GFX950_TAIL_TILE = 32
#: l below this is clamped before the division (SPEC: the kernel clamps the denominator at 1e-30).
L_FLOOR = 1e-30

_NOPE: tl.constexpr = tl.constexpr(formats.DSV4_NOPE_DIM)
_TOKEN_DATA: tl.constexpr = tl.constexpr(formats.DSV4_TOKEN_DATA_BYTES)
_TOKEN_SCALE: tl.constexpr = tl.constexpr(formats.DSV4_TOKEN_SCALE_BYTES)
_GROUP: tl.constexpr = tl.constexpr(formats.DSV4_GROUP)
_FLT_MAX: tl.constexpr = tl.constexpr(FLT_MAX)
_LN2: tl.constexpr = tl.constexpr(LN2)
_L_FLOOR: tl.constexpr = tl.constexpr(L_FLOOR)


# ----------------------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _split_slice(seg_lo, seg_hi, split, num_splits):
    """Split ``split`` of ``num_splits`` takes [seg_lo + split*ceil(len/S), ...) of a segment, clipped to it."""
    chunk = (seg_hi - seg_lo + num_splits - 1) // num_splits
    lo = seg_lo + split * chunk
    hi = tl.minimum(lo + chunk, seg_hi)
    return lo, hi


@triton.jit
def _slot_tile(idx_ptr, offs, seg_hi, num_slots):
    """Slots of one tile of ragged entries ``offs`` (absolute positions, int64). Only entries inside the segment
    are read; a slot is valid when 0 <= slot < num_slots. Invalid slots come back as 0 with valid == False."""
    in_seg = offs < seg_hi
    raw = tl.load(idx_ptr + offs, mask=in_seg, other=-1).to(tl.int64)
    valid = in_seg & (raw >= 0) & (raw < num_slots)
    return tl.where(valid, raw, 0), valid


@triton.jit
def _kv_tile(cache, slots, valid, block_size, stride0, START: tl.constexpr, W: tl.constexpr,
             IS_FNUZ: tl.constexpr, SCRUB: tl.constexpr, HAS_NOPE: tl.constexpr, HAS_ROPE: tl.constexpr,
             HW_FP8: tl.constexpr, ROPE16: tl.constexpr):
    """Dequantized lanes [START, START + W) (constexpr, START and W multiples of 64) of the tokens at ``slots``
    -> a bf16 [BK, W] tile (SPEC 1.2 layout: block = slot // bs at ``block * stride0`` bytes; token data at pos*576,
    448 fp8 NoPE then 64 bf16 RoPE; scale codes at bs*576 + pos*8, one UE8M0 code per 64 NoPE lanes).

    Lanes < 448 come from the NoPE part when HAS_NOPE, lanes >= 448 from the RoPE part when HAS_ROPE; a lane whose
    part is off, and every lane of a masked token, is 0. fp8 codes decode through
    :func:`impl.triton_helpers.fp8_decode` (HW_FP8 as ``hw_fp8_decode`` chose it), times the group's scale in fp32,
    then round to bf16 (exact: an fp8 value times 2^k is a bf16 value inside bf16's range). NaN lanes are scrubbed
    when SCRUB, in fp32 before the cast (the interpreter compares a bf16 NaN equal to itself).

    How it loads: lane offsets are a plain ``arange`` under a mask, never clamped with a ``where``, so the compiler
    sees them contiguous and issues wide loads (a clamped offset vector made it load byte by byte: 20 to 34 times
    upstream's L1 sectors under ncu); one scale code per 64-lane group, broadcast to its lanes; slot // bs in int32
    (a slot is an int32 index; the block's byte offset stays int64); ROPE16 reads each RoPE lane as one 16-bit word
    (the host sets it only when every token row is 2-byte aligned), otherwise as two bytes."""
    s32 = slots.to(tl.int32)
    blk = s32 // block_size
    pos = s32 - blk * block_size
    base = cache + blk.to(tl.int64) * stride0
    row = base + pos * _TOKEN_DATA
    d = START + tl.arange(0, W)
    is_nope = d < _NOPE
    x = tl.zeros((slots.shape[0], W), tl.bfloat16)
    if HAS_NOPE:
        G: tl.constexpr = W // _GROUP
        codes = tl.load(row[:, None] + d[None, :], mask=valid[:, None] & is_nope[None, :], other=0)
        g = START // _GROUP + tl.arange(0, G)
        srow = base + block_size * _TOKEN_DATA + pos * _TOKEN_SCALE
        sc = tl.load(srow[:, None] + g[None, :], mask=valid[:, None] & (g < _NOPE // _GROUP)[None, :], other=0)
        scale = tl.reshape(tl.broadcast_to(ue8m0_decode_reader(sc)[:, :, None], (slots.shape[0], G, _GROUP)),
                           (slots.shape[0], W))
        nope = fp8_decode(codes, IS_FNUZ, HW_FP8) * scale
        if SCRUB:
            nope = tl.where(nope == nope, nope, 0.0)
        x = tl.where(is_nope[None, :], nope.to(tl.bfloat16), x)
    if HAS_ROPE:
        lane = d - _NOPE  # negative on NoPE lanes, which the mask keeps unread
        m_rope = valid[:, None] & (d >= _NOPE)[None, :]
        if ROPE16:
            w16 = tl.load((row + _NOPE).to(tl.pointer_type(tl.int16))[:, None] + lane[None, :], mask=m_rope,
                          other=0).to(tl.int32)
            rope = (w16 << 16).to(tl.float32, bitcast=True)
        else:
            rp = (row + _NOPE)[:, None] + (2 * lane)[None, :]
            lo = tl.load(rp, mask=m_rope, other=0).to(tl.int32)
            hi = tl.load(rp + 1, mask=m_rope, other=0).to(tl.int32)
            rope = ((hi << 24) | (lo << 16)).to(tl.float32, bitcast=True)
        if SCRUB:
            rope = tl.where(rope == rope, rope, 0.0)
        x = tl.where(is_nope[None, :], x, rope.to(tl.bfloat16))
    return x


@triton.jit
def _tile_natural(q_nope, q_rope, m_i, l_i, acc_n, acc_r, cache, idx_ptr, offs, seg_hi, num_slots, block_size,
                  stride0, scale, IS_FNUZ: tl.constexpr, SCRUB: tl.constexpr, HW_FP8: tl.constexpr,
                  ROPE16: tl.constexpr):
    """One online-softmax step (natural exp) over the tokens at ragged positions ``offs``: separate NoPE
    ([BK, 512] with lanes >= 448 zero) and RoPE ([BK, 64]) dots for QK and for PV."""
    slots, valid = _slot_tile(idx_ptr, offs, seg_hi, num_slots)
    kn = _kv_tile(cache, slots, valid, block_size, stride0, 0, 512, IS_FNUZ, SCRUB, True, False, HW_FP8, ROPE16)
    kr = _kv_tile(cache, slots, valid, block_size, stride0, _NOPE, 64, IS_FNUZ, SCRUB, False, True, HW_FP8, ROPE16)
    s = dot(q_nope, tl.trans(kn), tl.zeros((q_nope.shape[0], kn.shape[0]), tl.float32))
    s = dot(q_rope, tl.trans(kr), s)
    m_new, l_i, alpha, p = online_softmax_step(s * scale, valid, m_i, l_i, False)
    pb = p.to(tl.bfloat16)
    acc_n = dot(pb, kn, acc_n * alpha[:, None])
    acc_r = dot(pb, kr, acc_r * alpha[:, None])
    return m_new, l_i, acc_n, acc_r


@triton.jit
def _load_q_split(q, b, heads, hmask, stride_qb, stride_qh, stride_qd):
    d512 = tl.arange(0, 512)
    d64 = tl.arange(0, 64) + _NOPE
    qrow = q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    q_nope = tl.load(qrow + d512[None, :] * stride_qd, mask=hmask[:, None] & (d512 < _NOPE)[None, :], other=0.0)
    q_rope = tl.load(qrow + d64[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
    return q_nope, q_rope


@triton.jit
def _accumulate_segments(
        q, stride_qb, stride_qh, stride_qd, b, heads, hmask, split, num_splits,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots, scale,
        HAS_EXTRA: tl.constexpr, IS_FNUZ_MAIN: tl.constexpr, IS_FNUZ_EXTRA: tl.constexpr,
        SCRUB_EXTRA: tl.constexpr, BLOCK_H_: tl.constexpr, BLOCK_K: tl.constexpr,
        HW_FP8_MAIN: tl.constexpr, HW_FP8_EXTRA: tl.constexpr, ROPE16: tl.constexpr):
    """Natural-exp online softmax of row ``b`` for ``heads`` over split ``split`` of ``num_splits`` of its main
    segment, then the same split of its extra segment, in BLOCK_K-token tiles that never cross segments.
    Returns un-normalised (m, l, acc over the 512 lanes, acc over the 64 RoPE lanes). The single-kernel fallback
    is the case split 0 of 1; the main cache is always scrubbed, the extra cache when SCRUB_EXTRA."""
    q_nope, q_rope = _load_q_split(q, b, heads, hmask, stride_qb, stride_qh, stride_qd)
    m_i = tl.full((BLOCK_H_,), -_FLT_MAX, tl.float32)
    l_i = tl.zeros((BLOCK_H_,), tl.float32)
    acc_n = tl.zeros((BLOCK_H_, 512), tl.float32)
    acc_r = tl.zeros((BLOCK_H_, 64), tl.float32)
    tk = tl.arange(0, BLOCK_K).to(tl.int64)
    lo, hi = _split_slice(tl.load(main_indptr + b).to(tl.int64), tl.load(main_indptr + b + 1).to(tl.int64),
                          split, num_splits)
    for t0 in range(lo, hi, BLOCK_K):
        m_i, l_i, acc_n, acc_r = _tile_natural(q_nope, q_rope, m_i, l_i, acc_n, acc_r, main_cache, main_idx,
                                               t0 + tk, hi, main_num_slots, main_bs, main_stride0, scale,
                                               IS_FNUZ_MAIN, True, HW_FP8_MAIN, ROPE16)
    if HAS_EXTRA:
        lo, hi = _split_slice(tl.load(extra_indptr + b).to(tl.int64), tl.load(extra_indptr + b + 1).to(tl.int64),
                              split, num_splits)
        for t0 in range(lo, hi, BLOCK_K):
            m_i, l_i, acc_n, acc_r = _tile_natural(q_nope, q_rope, m_i, l_i, acc_n, acc_r, extra_cache, extra_idx,
                                                   t0 + tk, hi, extra_num_slots, extra_bs, extra_stride0, scale,
                                                   IS_FNUZ_EXTRA, SCRUB_EXTRA, HW_FP8_EXTRA, ROPE16)
    return m_i, l_i, acc_n, acc_r


@triton.jit(do_not_specialize=["main_bs", "main_num_slots", "extra_bs", "extra_num_slots", "num_heads"])
def _sparse_decode_generic_kernel(
        q, stride_qb, stride_qh, stride_qd,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots,
        sink, out, stride_ob, stride_oh, num_heads, scale,
        HAS_EXTRA: tl.constexpr, HAS_SINK: tl.constexpr, IS_FNUZ_MAIN: tl.constexpr, IS_FNUZ_EXTRA: tl.constexpr,
        SCRUB_EXTRA: tl.constexpr, BLOCK_H_: tl.constexpr, BLOCK_K: tl.constexpr, HW_FP8_MAIN: tl.constexpr = False,
        HW_FP8_EXTRA: tl.constexpr = False, ROPE16: tl.constexpr = False):
    """Fallback single kernel (targets with neither split-K family).

    Grid (b, ceil(h / BLOCK_H)). Program (b, hb) walks row b's main segment then its extra segment in BLOCK_K-token
    tiles with a natural-exp online softmax, folds in the sink, normalises and writes bf16 ``out[b, heads, 512]``.
    Invariant: tiles never cross segments; masked tokens get logit -inf and value 0; with no valid token and no
    sink l == 0 and the row is written as 0. fp8 codes decode through ``fp8_decode``: the device's conversion where ``HW_FP8_MAIN`` / ``HW_FP8_EXTRA`` say the
    device has the cache's flavour (``hw_fp8_decode``: OCP on NVIDIA sm_89+ and gfx950, FNUZ on gfx942), the bit-level
    decode otherwise (FNUZ on NVIDIA, the interpreter); the same values either way."""
    b = tl.program_id(0)
    hb = tl.program_id(1)
    heads = hb * BLOCK_H_ + tl.arange(0, BLOCK_H_)
    hmask = heads < num_heads
    m_i, l_i, acc_n, acc_r = _accumulate_segments(
        q, stride_qb, stride_qh, stride_qd, b, heads, hmask, 0, 1,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots, scale,
        HAS_EXTRA, IS_FNUZ_MAIN, IS_FNUZ_EXTRA, SCRUB_EXTRA, BLOCK_H_, BLOCK_K,
        HW_FP8_MAIN, HW_FP8_EXTRA, ROPE16)
    if HAS_SINK:
        sink_val = tl.load(sink + heads, mask=hmask, other=float("-inf"))
        m_f = tl.maximum(m_i, sink_val)
        alpha = tl.exp(m_i - m_f)
        l_i = l_i * alpha + tl.exp(sink_val - m_f)
        acc_n = acc_n * alpha[:, None]
        acc_r = acc_r * alpha[:, None]
    # 0 only when l <= 0 (no valid token, no sink); a NaN l must stay NaN
    inv = 1.0 / tl.maximum(l_i, _L_FLOOR)
    empty = l_i <= 0
    o_n = tl.where(empty[:, None], 0.0, acc_n * inv[:, None])
    o_r = tl.where(empty[:, None], 0.0, acc_r * inv[:, None])
    d512 = tl.arange(0, 512)
    d64 = tl.arange(0, 64) + _NOPE
    orow = out + b.to(tl.int64) * stride_ob + heads[:, None].to(tl.int64) * stride_oh
    tl.store(orow + d512[None, :], o_n.to(tl.bfloat16), mask=hmask[:, None] & (d512 < _NOPE)[None, :])
    tl.store(orow + d64[None, :], o_r.to(tl.bfloat16), mask=hmask[:, None])


#: the split count is a plain int to the compiler: one binary serves every S (a batch's S varies)
@triton.jit(do_not_specialize=["num_splits", "main_bs", "main_num_slots", "extra_bs", "extra_num_slots", "num_heads"])
def _sparse_decode_gfx942_partial_kernel(
        q, stride_qb, stride_qh, stride_qd,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots,
        part_m, part_l, part_acc, stride_mb, stride_ms, stride_ab, stride_as, stride_ah,
        num_heads, num_splits, scale,
        HAS_EXTRA: tl.constexpr, IS_FNUZ_MAIN: tl.constexpr, IS_FNUZ_EXTRA: tl.constexpr,
        SCRUB_EXTRA: tl.constexpr, BLOCK_H_: tl.constexpr, BLOCK_K: tl.constexpr, HW_FP8_MAIN: tl.constexpr = False,
        HW_FP8_EXTRA: tl.constexpr = False, ROPE16: tl.constexpr = False):
    """gfx942 split-K partial.

    Grid (b, S, ceil(h / BLOCK_H)). Program (b, s, hb) takes slice [s*ceil(len/S), ...) of row b's main segment,
    then the same slice of its extra segment (no tile crosses segments), and stores un-normalised fp32 partials:
    ``part_m[b, s, h]`` (running max, natural log; -FLT_MAX when nothing was valid), ``part_l`` (sum of exp),
    ``part_acc[b, s, h, 512]`` (sum of p*v). No sink here. Every (b, s, h < num_heads) entry is written.
    fp8 codes decode through ``fp8_decode``: the device's conversion where ``HW_FP8_MAIN`` / ``HW_FP8_EXTRA`` say the
    device has the cache's flavour (``hw_fp8_decode``: OCP on NVIDIA sm_89+ and gfx950, FNUZ on gfx942), the bit-level
    decode otherwise (FNUZ on NVIDIA, the interpreter); the same values either way."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    hb = tl.program_id(2)
    heads = hb * BLOCK_H_ + tl.arange(0, BLOCK_H_)
    hmask = heads < num_heads
    m_i, l_i, acc_n, acc_r = _accumulate_segments(
        q, stride_qb, stride_qh, stride_qd, b, heads, hmask, split, num_splits,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots, scale,
        HAS_EXTRA, IS_FNUZ_MAIN, IS_FNUZ_EXTRA, SCRUB_EXTRA, BLOCK_H_, BLOCK_K,
        HW_FP8_MAIN, HW_FP8_EXTRA, ROPE16)
    ml = b.to(tl.int64) * stride_mb + split.to(tl.int64) * stride_ms + heads
    tl.store(part_m + ml, m_i, mask=hmask)
    tl.store(part_l + ml, l_i, mask=hmask)
    d512 = tl.arange(0, 512)
    d64 = tl.arange(0, 64) + _NOPE
    arow = (part_acc + b.to(tl.int64) * stride_ab + split.to(tl.int64) * stride_as
            + heads[:, None].to(tl.int64) * stride_ah)
    tl.store(arow + d512[None, :], acc_n, mask=hmask[:, None] & (d512 < _NOPE)[None, :])
    tl.store(arow + d64[None, :], acc_r, mask=hmask[:, None])


@triton.jit
def _tile_base2(q512, q0, q1, q2, q3, m2, l_i, a0, a1, a2, a3, cache, idx_ptr, offs, seg_hi, num_slots, block_size,
                stride0, qk_scale2, IS_FNUZ: tl.constexpr, SCRUB: tl.constexpr, HW_FP8: tl.constexpr,
                ROPE16: tl.constexpr, QK_CHUNKS: tl.constexpr):
    """One base-2 online-softmax step over the tokens at ragged positions ``offs``: four 128-lane tiles (the last
    is 64 NoPE + 64 RoPE lanes) joined into one [BK, 512] operand for a single QK dot with ``q512``; PV into four
    128-lane accumulators. Logits are in log2 units (scale * log2(e) folded into ``qk_scale2``). With QK_CHUNKS
    (``DecodeVariant.qk_chunks``, opt-in) QK is four 128-lane dots with ``q0``..``q3`` summed in order instead: no
    joined operand, another fp32 summation order. The q operands a build does not use are placeholders."""
    slots, valid = _slot_tile(idx_ptr, offs, seg_hi, num_slots)
    k0 = _kv_tile(cache, slots, valid, block_size, stride0, 0, 128, IS_FNUZ, SCRUB, True, False, HW_FP8, ROPE16)
    k1 = _kv_tile(cache, slots, valid, block_size, stride0, 128, 128, IS_FNUZ, SCRUB, True, False, HW_FP8, ROPE16)
    k2 = _kv_tile(cache, slots, valid, block_size, stride0, 256, 128, IS_FNUZ, SCRUB, True, False, HW_FP8, ROPE16)
    k3 = _kv_tile(cache, slots, valid, block_size, stride0, 384, 128, IS_FNUZ, SCRUB, True, True, HW_FP8, ROPE16)
    if QK_CHUNKS:
        s = dot(q0, tl.trans(k0), tl.zeros((q0.shape[0], k0.shape[0]), tl.float32))
        s = dot(q1, tl.trans(k1), s)
        s = dot(q2, tl.trans(k2), s)
        s = dot(q3, tl.trans(k3), s)
    else:
        # [BK, 128, i, o] holds tile 2*o + i; reorder to [BK, o, i, 128] so the flat lane is tile*128 + d
        kk = tl.join(tl.join(k0, k1), tl.join(k2, k3))
        kk = tl.reshape(tl.permute(kk, (0, 3, 2, 1)), (k0.shape[0], 512))
        s = dot(q512, tl.trans(kk), tl.zeros((q512.shape[0], k0.shape[0]), tl.float32))
    m_new, l_i, alpha, p = online_softmax_step(s * qk_scale2, valid, m2, l_i, True)
    pb = p.to(tl.bfloat16)
    a0 = dot(pb, k0, a0 * alpha[:, None])
    a1 = dot(pb, k1, a1 * alpha[:, None])
    a2 = dot(pb, k2, a2 * alpha[:, None])
    a3 = dot(pb, k3, a3 * alpha[:, None])
    return m_new, l_i, a0, a1, a2, a3


@triton.jit
def _row_iters(len_m, len_e, s, K: tl.constexpr):
    return ((len_m + s - 1) // s + K - 1) // K + ((len_e + s - 1) // s + K - 1) // K


#: the split count is a plain int to the compiler: one binary serves every S (a batch's S varies)
@triton.jit(do_not_specialize=["num_splits", "one_wave", "main_bs", "main_num_slots", "extra_bs", "extra_num_slots",
                               "num_heads"])
def _sparse_decode_gfx950_partial_kernel(
        q, stride_qb, stride_qh, stride_qd,
        main_cache, main_idx, main_indptr, main_bs, main_stride0, main_num_slots,
        extra_cache, extra_idx, extra_indptr, extra_bs, extra_stride0, extra_num_slots,
        part_m, part_l, part_acc, stride_mb, stride_ms, stride_ab, stride_as, stride_ah,
        num_heads, num_splits, one_wave, qk_scale2,
        HAS_EXTRA: tl.constexpr, IS_FNUZ_MAIN: tl.constexpr, IS_FNUZ_EXTRA: tl.constexpr,
        SCRUB_EXTRA: tl.constexpr, ADAPTIVE: tl.constexpr, BLOCK_H_: tl.constexpr, MAIN_TILE: tl.constexpr,
        EXTRA_TILE: tl.constexpr, TAIL_TILE: tl.constexpr, ITER_K: tl.constexpr, HW_FP8_MAIN: tl.constexpr = False,
        HW_FP8_EXTRA: tl.constexpr = False, ROPE16: tl.constexpr = False, QK_CHUNKS: tl.constexpr = False):
    """gfx950 split-K partial.

    Grid (b, S, ceil(h / BLOCK_H)), S frozen by the caller (graph capture keeps it). With ADAPTIVE, each row first
    recomputes its active split count A from its real indptr lengths (4 if iters(4) <= 3, else ONE_WAVE if
    iters(ONE_WAVE) <= 3, else S; never above S); splits s >= A write ``m = -FLT_MAX, l = 0`` and exit, leaving
    ``part_acc`` untouched (the reduce must skip them). Otherwise A = S. Split s takes slice [s*ceil(len/A), ...)
    of the main segment (guarded MAIN_TILE tiles), then of the extra segment (EXTRA_TILE tiles, then at most two
    TAIL_TILE tails). Partials are un-normalised: ``part_m`` = running max converted back to natural log (m2 * ln2),
    or -FLT_MAX when l == 0; ``part_l``; ``part_acc[b, s, h, 512]``. No sink here.
    fp8 codes decode through ``fp8_decode``: the device's conversion where ``HW_FP8_MAIN`` / ``HW_FP8_EXTRA`` say the
    device has the cache's flavour (``hw_fp8_decode``: OCP on NVIDIA sm_89+ and gfx950, FNUZ on gfx942), the bit-level
    decode otherwise (FNUZ on NVIDIA, the interpreter); the same values either way."""
    b = tl.program_id(0)
    split = tl.program_id(1)
    hb = tl.program_id(2)
    heads = hb * BLOCK_H_ + tl.arange(0, BLOCK_H_)
    hmask = heads < num_heads
    ml = b.to(tl.int64) * stride_mb + split.to(tl.int64) * stride_ms + heads
    m_lo = tl.load(main_indptr + b).to(tl.int64)
    m_hi = tl.load(main_indptr + b + 1).to(tl.int64)
    if HAS_EXTRA:
        e_lo = tl.load(extra_indptr + b).to(tl.int64)
        e_hi = tl.load(extra_indptr + b + 1).to(tl.int64)
    else:
        e_lo = m_lo * 0
        e_hi = m_lo * 0
    active = num_splits
    if ADAPTIVE:
        len_m = m_hi - m_lo
        len_e = e_hi - e_lo
        active = tl.where(_row_iters(len_m, len_e, 4, ITER_K) <= 3, 4,
                          tl.where(_row_iters(len_m, len_e, one_wave, ITER_K) <= 3, one_wave, num_splits))
        active = tl.minimum(active, num_splits)
    if split >= active:
        tl.store(part_m + ml, tl.full((BLOCK_H_,), -_FLT_MAX, tl.float32), mask=hmask)
        tl.store(part_l + ml, tl.zeros((BLOCK_H_,), tl.float32), mask=hmask)
        return
    d512 = tl.arange(0, 512)
    qrow = q + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    if QK_CHUNKS:  # four 128-lane q tiles (q512 a placeholder)
        d128q = tl.arange(0, 128)
        q0 = tl.load(qrow + d128q[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
        q1 = tl.load(qrow + (128 + d128q)[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
        q2 = tl.load(qrow + (256 + d128q)[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
        q3 = tl.load(qrow + (384 + d128q)[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
        q512 = q0
    else:  # one 512-lane q (q0..q3 placeholders)
        q512 = tl.load(qrow + d512[None, :] * stride_qd, mask=hmask[:, None], other=0.0)
        q0 = q512
        q1 = q512
        q2 = q512
        q3 = q512
    m2 = tl.full((BLOCK_H_,), -_FLT_MAX, tl.float32)
    l_i = tl.zeros((BLOCK_H_,), tl.float32)
    a0 = tl.zeros((BLOCK_H_, 128), tl.float32)
    a1 = tl.zeros((BLOCK_H_, 128), tl.float32)
    a2 = tl.zeros((BLOCK_H_, 128), tl.float32)
    a3 = tl.zeros((BLOCK_H_, 128), tl.float32)
    lo, hi = _split_slice(m_lo, m_hi, split, active)
    tm = tl.arange(0, MAIN_TILE).to(tl.int64)
    for t0 in range(lo, hi, MAIN_TILE):
        m2, l_i, a0, a1, a2, a3 = _tile_base2(q512, q0, q1, q2, q3, m2, l_i, a0, a1, a2, a3, main_cache, main_idx,
                                              t0 + tm, hi, main_num_slots, main_bs, main_stride0, qk_scale2,
                                              IS_FNUZ_MAIN, True, HW_FP8_MAIN, ROPE16, QK_CHUNKS)
    if HAS_EXTRA:
        lo, hi = _split_slice(e_lo, e_hi, split, active)
        te = tl.arange(0, EXTRA_TILE).to(tl.int64)
        n_full = (hi - lo) // EXTRA_TILE
        for i in range(0, n_full):
            m2, l_i, a0, a1, a2, a3 = _tile_base2(q512, q0, q1, q2, q3, m2, l_i, a0, a1, a2, a3, extra_cache,
                                                  extra_idx, lo + i * EXTRA_TILE + te, hi, extra_num_slots, extra_bs,
                                                  extra_stride0, qk_scale2, IS_FNUZ_EXTRA, SCRUB_EXTRA,
                                                  HW_FP8_EXTRA, ROPE16, QK_CHUNKS)
        tt = tl.arange(0, TAIL_TILE).to(tl.int64)
        for t0 in range(lo + n_full * EXTRA_TILE, hi, TAIL_TILE):
            m2, l_i, a0, a1, a2, a3 = _tile_base2(q512, q0, q1, q2, q3, m2, l_i, a0, a1, a2, a3, extra_cache,
                                                  extra_idx, t0 + tt, hi, extra_num_slots, extra_bs, extra_stride0,
                                                  qk_scale2, IS_FNUZ_EXTRA, SCRUB_EXTRA, HW_FP8_EXTRA, ROPE16,
                                                  QK_CHUNKS)
    tl.store(part_m + ml, tl.where(l_i == 0, -_FLT_MAX, m2 * _LN2), mask=hmask)
    tl.store(part_l + ml, l_i, mask=hmask)
    arow = (part_acc + b.to(tl.int64) * stride_ab + split.to(tl.int64) * stride_as
            + heads[:, None].to(tl.int64) * stride_ah)
    d128 = tl.arange(0, 128)
    tl.store(arow + d128[None, :], a0, mask=hmask[:, None])
    tl.store(arow + 128 + d128[None, :], a1, mask=hmask[:, None])
    tl.store(arow + 256 + d128[None, :], a2, mask=hmask[:, None])
    tl.store(arow + 384 + d128[None, :], a3, mask=hmask[:, None])


@triton.jit
def _reduce_step(acc, acc_s, m_s, m, ADAPTIVE: tl.constexpr):
    """acc + e^(m_s - m) acc_s: one split's term of the reduce. With ADAPTIVE a split whose m is -FLT_MAX adds
    nothing, by a select, not a product: 0 * NaN would still be NaN (an inactive split's acc is never written)."""
    w = tl.exp(m_s - m)
    if ADAPTIVE:
        return acc + tl.where(m_s != -_FLT_MAX, w * acc_s, 0.0)
    return acc + w * acc_s


#: the split count is a plain int to the compiler: one binary serves every S > 1 (a batch's S varies) and one S = 1
#: (MULTI false), where a second row loaded ahead, even masked, cost 9% at batch 512 on the H200
@triton.jit(do_not_specialize=["num_splits"])
def _sparse_decode_reduce_kernel(part_m, part_l, part_acc, stride_mb, stride_ms, stride_ab, stride_as, stride_ah,
                                 sink, out, stride_ob, stride_oh, num_splits,
                                 HAS_SINK: tl.constexpr, ADAPTIVE: tl.constexpr, SPLITS_PAD: tl.constexpr = 1,
                                 MULTI: tl.constexpr = True):
    """Combine split partials into the bf16 output.

    Grid (b, h). m = max over splits of part_m, then with the sink; w_s = e^(m_s - m);
    l = sum w_s l_s + e^(sink - m); out = sum w_s acc_s / max(l, 1e-30), or 0 when l <= 0. With ADAPTIVE, splits
    whose m is -FLT_MAX are skipped outright: their acc may be stale or NaN (inactive splits never write it).
    m and l come from one vector load of every split (SPLITS_PAD: the split count rounded up to a power of two),
    so both are tree reductions, as upstream's reduce makes them."""
    b = tl.program_id(0)
    h = tl.program_id(1)
    d = tl.arange(0, 512)
    mrow = b.to(tl.int64) * stride_mb + h
    arow = part_acc + b.to(tl.int64) * stride_ab + h.to(tl.int64) * stride_ah + d
    # split 0's row first, and split 1's with MULTI: their addresses need no m, so their 2 KB each are in flight
    # while the max and l wait on their own loads
    acc_s = tl.load(arow)
    m_s = tl.load(part_m + mrow)
    if MULTI:
        acc_n = tl.load(arow + stride_as)
        m_n = tl.load(part_m + mrow + stride_ms)
    # every split's m and l in one vector load (SPLITS_PAD = S rounded up to a power of two, padding masked), so
    # the max and l are tree reductions with no chain of dependent loads; only the acc rows are walked
    sp = tl.arange(0, SPLITS_PAD)
    smask = sp < num_splits
    m_all = tl.load(part_m + mrow + sp * stride_ms, mask=smask, other=-_FLT_MAX)
    l_all = tl.load(part_l + mrow + sp * stride_ms, mask=smask, other=0.0)
    m = tl.max(m_all, axis=0)
    if HAS_SINK:
        sink_val = tl.load(sink + h)
        m = tl.maximum(m, sink_val)
    w_all = tl.exp(m_all - m)
    if ADAPTIVE:
        # a select, not a product: 0 * NaN would still be NaN
        l = tl.sum(tl.where(smask & (m_all != -_FLT_MAX), w_all * l_all, 0.0), axis=0)
    else:
        l = tl.sum(tl.where(smask, w_all * l_all, 0.0), axis=0)
    acc = tl.zeros((512,), tl.float32)
    # each later split's row is loaded two steps ahead of the term that uses it, so no row waits on an earlier
    # term's FMA; the sum's order is unchanged (split 0 first, as upstream's)
    if MULTI:
        for s in range(2, num_splits):
            m_nn = tl.load(part_m + mrow + s * stride_ms)
            acc_nn = tl.load(arow + s * stride_as)
            acc = _reduce_step(acc, acc_s, m_s, m, ADAPTIVE)
            m_s = m_n
            acc_s = acc_n
            m_n = m_nn
            acc_n = acc_nn
    acc = _reduce_step(acc, acc_s, m_s, m, ADAPTIVE)
    if MULTI:
        acc = _reduce_step(acc, acc_n, m_n, m, ADAPTIVE)
    if HAS_SINK:
        l = l + tl.exp(sink_val - m)
    # 0 only when l <= 0 (no valid token, no sink); a NaN l must stay NaN
    o = tl.where(l <= 0, 0.0, acc / tl.maximum(l, _L_FLOOR))
    tl.store(out + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh + d, o.to(tl.bfloat16))


# ----------------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------------

# --- launch observer: every kernel launch of this module goes through ``_launch`` ---------------------------------

@dataclass(frozen=True)
class TensorArg:
    """A tensor argument as a launch sees it: where it points and how it is laid out, never its data."""

    data_ptr: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: str


@dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch: kernel name, grid, every argument by parameter name (tensors as ``TensorArg``, scalars
    by value) and the constexpr/meta keywords. Two launches with equal records read and write the same addresses
    with the same host-side parameters; only the data behind the pointers can differ."""

    kernel: str
    grid: tuple[int, ...]
    args: tuple[tuple[str, object], ...]
    meta: tuple[tuple[str, object], ...]


#: None (the default) or ``observer(record: LaunchRecord)``, called before each launch; an exception it raises
#: stops the launch. Only ``_launch`` reads it, so with no observer a launch costs one global lookup more.
_launch_observer = None


def set_launch_observer(observer) -> object:
    """Install ``observer`` (a callable taking a ``LaunchRecord``, or None to remove it); returns the previous one."""
    global _launch_observer
    if observer is not None and not callable(observer):
        raise TypeError(f"observer: expected a callable or None, got {type(observer).__name__}")
    previous, _launch_observer = _launch_observer, observer
    return previous


@contextmanager
def launch_observer(observer):
    """``with launch_observer(fn): ...`` installs ``fn`` for the block and restores the previous observer after."""
    previous = set_launch_observer(observer)
    try:
        yield observer
    finally:
        set_launch_observer(previous)


def _normalize_arg(value):
    if isinstance(value, torch.Tensor):
        return TensorArg(int(value.data_ptr()), tuple(int(x) for x in value.shape),
                         tuple(int(x) for x in value.stride()), _name_dtype(value.dtype))
    return value


def _launch(kernel, grid: tuple, *args, **meta) -> None:
    observer = _launch_observer
    if observer is not None:
        names = getattr(kernel, "arg_names", None) or [f"arg{i}" for i in range(len(args))]
        name = getattr(kernel, "__name__", None) or kernel.fn.__name__
        observer(LaunchRecord(name, tuple(int(g) for g in grid),
                              tuple((n, _normalize_arg(a)) for n, a in zip(names, args)),
                              tuple(sorted((k, _normalize_arg(v)) for k, v in meta.items()))))
    kernel[grid](*args, **meta)


@dataclass(frozen=True)
class DecodeVariant:
    """How a family's kernel is built, never what it computes: the candidates of the decode performance work
    (benchmarks/DECODE_PERF.md measures them; benchmarks/decode_variants.py times each on a GPU). Every field keeps
    the values the contracts judge; the ones that change an accumulation order say so.

    - ``rope16``: RoPE lanes read as 16-bit words, not byte pairs; used only when both caches' rows are 2-byte
      aligned (even ``stride(0)`` and base address), else the byte reads run.
    - ``extra_tile`` (gfx950): the extra segment's full-tile width; 32 walks it in the 32-token steps upstream's
      kernel takes (it loads 64 and runs two 32-token steps; gfx950's default), 64 in one 64-token step. This
      changes the online-softmax step boundaries on rows with 64 or more extra tokens per split, within the error
      model (the split count and tile count already bound it).
    - ``block_h``: heads per program (16, the default, as upstream; 32; 64). The split count and the plan are
      unchanged (the selector still counts 16-head blocks); the grid's head dimension becomes ceil(h / block_h), so
      with 64 every KV row is read once for all heads of a query instead of once per 16-head block. Per head the
      same tiles and the same online-softmax steps; the dots are wider (M = block_h), which on a GPU may change the
      order of the fp32 sums inside an MMA, within the error model (one dot's accumulation).
    - ``num_warps`` / ``num_stages``: launch options (None: the family's default; ``num_stages`` None leaves
      Triton's own default, which on NVIDIA pipelines the token loops through shared memory).
    - ``qk_chunks`` (gfx950): QK as four 128-lane dots summed in order instead of one dot over the joined 512-lane
      operand, so each dequantized tile feeds both products as one value (no joined copy). Another fp32 summation
      order of the QK product than upstream's single dot: opt-in, within the error model (one dot's accumulation).
    """

    rope16: bool = False
    block_h: int | None = None
    extra_tile: int | None = None
    num_warps: int | None = None
    num_stages: int | None = None
    qk_chunks: bool = False

    def __post_init__(self):
        if not isinstance(self.qk_chunks, bool):
            raise ValueError(f"qk_chunks: expected a bool, got {self.qk_chunks!r}")
        if self.block_h not in (None, 16, 32, 64):
            raise ValueError(f"block_h: expected None, 16, 32 or 64, got {self.block_h!r}")
        if self.extra_tile not in (None, 32, 64):
            raise ValueError(f"extra_tile: expected None, 32 or 64, got {self.extra_tile!r}")
        for nm in ("num_warps", "num_stages"):
            v = getattr(self, nm)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{nm}: expected None or a positive int, got {v!r}")
        if self.num_warps is not None and self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps: expected a power of 2 (what the compilers accept), got {self.num_warps!r}")


@dataclass(frozen=True)
class SizeRule:
    """A family's default build chosen per launch by the launch's size (issue 31 item 3): ``wide`` (a ``block_h``
    build that reads each KV row once for several 16-head blocks) where its programs fill the device, ``narrow``
    (upstream's 16-head blocks) where they would leave it idle. The wide build's programs are
    ``batch * S * ceil(h / wide.block_h)``; it runs when that is at least ``fill`` times the CU count the launch
    plans with (``cu_count`` where the caller gives one, else the target's). Sizes only: no sync, and a frozen plan
    (graph capture) always launches the same build. Both builds compute the same values; the wide one's dots are
    M = block_h rows wide (``DecodeVariant``'s note on ``block_h``: one dot's accumulation order, inside the error
    model)."""

    narrow: DecodeVariant
    wide: DecodeVariant
    fill: float = 0.5

    def __post_init__(self):
        if not isinstance(self.narrow, DecodeVariant) or not isinstance(self.wide, DecodeVariant):
            raise TypeError("SizeRule: narrow and wide must be DecodeVariant values")
        if (self.wide.block_h or BLOCK_H) <= (self.narrow.block_h or BLOCK_H):
            raise ValueError("SizeRule: the wide build must hold more heads per program than the narrow one")
        if isinstance(self.fill, bool) or not isinstance(self.fill, (int, float)) or not self.fill > 0:
            raise ValueError(f"SizeRule: fill must be a positive number, got {self.fill!r}")

    def pick(self, batch: int, num_splits: int, num_heads: int, cu_count: int) -> DecodeVariant:
        """The build a launch of this size runs."""
        progs = batch * num_splits * -(-num_heads // self.wide.block_h)
        return self.wide if progs >= self.fill * cu_count else self.narrow


#: the narrow builds, measured side by side with upstream's kernels on an H200 (Triton 3.6,
#: benchmarks/decode_variants.py, CUDA-graph medians at batch 1 / 64 / 512, 64 heads, 128 + 512 tokens; ours vs
#: upstream's, benchmarks/DECODE_PERF.md has the table): generic 138 / 198 / 1654 us vs 242 / 514 / 4190, gfx942
#: 17.0 / 145 / 1211 vs 23.8 / 204 / 1730, gfx950 19.2 / 137 / 1046 vs 23.6 / 191 / 1413. gfx950's extra_tile=32
#: walks the extra segment in the 32-token online-softmax steps upstream's kernel takes (it loads 64 tokens and
#: runs two 32-token steps), so its step boundaries are upstream's.
NARROW_VARIANTS = {"generic": DecodeVariant(rope16=True, num_stages=1),
                   "gfx942": DecodeVariant(rope16=True, num_stages=1),
                   "gfx950": DecodeVariant(rope16=True, extra_tile=32)}
#: the opt-in single-read build per family (issue 15 item 4): one program per (query, split) holds all 64 heads,
#: so every KV row is read once, not once per 16-head block (``decode_variant(f, SINGLE_READ_VARIANTS[f])`` or
#: ``SMV_DECODE_VARIANT``). gfx950 needs the 32-token extra step to fit shared memory (246 KB at 64 tokens).
#: num_stages=1 (no software pipelining of the tile loop) measured faster than the compiler's default at every batch
#: on the H200 (2026-12-06: gfx950 24.9 / 85.5 / 587 us vs 28.2 / 95.1 / 650 at batch 1 / 64 / 512, gfx942 26.6 /
#: 152.6 / 655 vs 31.8 / 167.9 / 740): with 255 registers and ~210 spilled, a second stage's buffers only add spills.
SINGLE_READ_VARIANTS = {
    "generic": DecodeVariant(rope16=True, block_h=64, num_warps=8, num_stages=1),
    "gfx942": DecodeVariant(rope16=True, block_h=64, num_warps=8, num_stages=1),
    "gfx950": DecodeVariant(rope16=True, block_h=64, num_warps=8, extra_tile=32, num_stages=1)}
#: what each family launches with by default: generic stays upstream's single-kernel design; gfx942 and gfx950 pick
#: their build by the launch's size (``SizeRule``). On the H200 (benchmarks/DECODE_PERF.md) the single-read build
#: beat the 16-head one where its programs fill the device (gfx950 batch 64, S = 2: 96 vs 137 us; batch 512: 661 /
#: 760 vs 1042 / 1217 us) and lost where they do not (batch 1: 28 / 31 vs 19 / 17 us; gfx942 batch 64, S = 1,
#: 64 programs: 169 vs 145 us); fill 0.5 of the target's CU count (256 / 304) separates those points.
DEFAULT_VARIANTS = {"generic": NARROW_VARIANTS["generic"],
                    "gfx942": SizeRule(NARROW_VARIANTS["gfx942"], SINGLE_READ_VARIANTS["gfx942"]),
                    "gfx950": SizeRule(NARROW_VARIANTS["gfx950"], SINGLE_READ_VARIANTS["gfx950"])}
#: ``SMV_DECODE_VARIANT``: per-family overrides read at import, e.g.
#: ``gfx950:rope16,block_h=64,num_warps=8,extra_tile=32;gfx942:num_warps=8`` (audits and benchmarks of a variant)
VARIANT_ENV = "SMV_DECODE_VARIANT"


def parse_variants(spec: str) -> dict:
    """``family:flag,key=value,...;family:...`` -> {family: DecodeVariant}; a bare flag means True."""
    import dataclasses

    fields = {f.name: f for f in dataclasses.fields(DecodeVariant)}
    out = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        family, _, body = part.partition(":")
        family = family.strip()
        if family not in DEFAULT_VARIANTS:
            raise ValueError(f"{VARIANT_ENV}: unknown family {family!r} in {part!r} "
                             f"(expected one of {sorted(DEFAULT_VARIANTS)})")
        kw = {}
        for item in filter(None, (x.strip() for x in body.split(","))):
            key, eq, val = item.partition("=")
            key = key.strip()
            if key not in fields:
                raise ValueError(f"{VARIANT_ENV}: unknown field {key!r} in {part!r} (expected one of {sorted(fields)})")
            if not eq:
                kw[key] = True
            elif key in ("rope16",):
                if val.strip() not in ("0", "1", "true", "false", "True", "False"):
                    raise ValueError(f"{VARIANT_ENV}: {key}={val!r}: expected 0/1/true/false")
                kw[key] = val.strip() in ("1", "true", "True")
            else:
                kw[key] = None if val.strip() in ("", "none", "None") else int(val)
        out[family] = DecodeVariant(**kw)
    return out


_variants = {**DEFAULT_VARIANTS, **parse_variants(os.environ.get(VARIANT_ENV, ""))}


def set_decode_variant(family: str, variant: "DecodeVariant | SizeRule | None") -> "DecodeVariant | SizeRule":
    """Launch ``family`` with ``variant`` from now on (a ``SizeRule``: the build it picks per launch; None: back to
    ``DEFAULT_VARIANTS``, not to what ``SMV_DECODE_VARIANT`` gave); returns the previous."""
    if family not in DEFAULT_VARIANTS:
        raise ValueError(f"family: expected one of {sorted(DEFAULT_VARIANTS)}, got {family!r}")
    if variant is not None and not isinstance(variant, (DecodeVariant, SizeRule)):
        raise TypeError(f"variant: expected a DecodeVariant, a SizeRule or None, got {type(variant).__name__}")
    previous = _variants[family]
    _variants[family] = DEFAULT_VARIANTS[family] if variant is None else variant
    return previous


def current_variant(family: str) -> "DecodeVariant | SizeRule":
    """The variant (or size rule) ``family`` launches with now."""
    return _variants[family]


@contextmanager
def decode_variant(family: str, variant: "DecodeVariant | SizeRule | None"):
    """``with decode_variant("gfx950", DecodeVariant(block_h=64)): ...`` for the block, then the previous one."""
    previous = set_decode_variant(family, variant)
    try:
        yield _variants[family]
    finally:
        set_decode_variant(family, previous)


def _rows_2byte_aligned(*caches) -> bool:
    return all(int(c.stride(0)) % 2 == 0 and int(c.data_ptr()) % 2 == 0 for c in caches)


def _launch_variant(plan: "DecodePlan", batch: int, num_heads: int, t: "Target", cu_count) -> DecodeVariant:
    """The build this launch runs: the family's variant, or the one its ``SizeRule`` picks for this size (with the
    caller's ``cu_count`` where it gave a valid one, else the target's CU count, as ``plan_decode`` counts)."""
    v = _variants[plan.family]
    if not isinstance(v, SizeRule):
        return v
    if plan.build is not None:  # picked when the plan was made: every launch of that plan runs the same build
        return v.wide if plan.build == "wide" else v.narrow
    cu = cu_count if isinstance(cu_count, int) and not isinstance(cu_count, bool) and cu_count >= 1 \
        else effective_cu_count(t)
    return v.pick(batch, plan.num_splits, num_heads, cu)


def _variant_meta(v: DecodeVariant, family: str, num_warps: int, caches) -> dict:
    """The constexprs and launch options a variant adds to a decode launch."""
    meta = {"ROPE16": v.rope16 and _rows_2byte_aligned(*caches), "num_warps": v.num_warps or num_warps}
    if v.num_stages is not None:
        meta["num_stages"] = v.num_stages
    return meta


@dataclass(frozen=True)
class DecodePlan:
    """Everything that fixes the launch: kernel family, split count S (grid dim 1), head blocks (grid dim 2),
    adaptive splits and ONE_WAVE. A graph-capture mode freezes one plan and replays it with new indices."""

    family: str
    num_splits: int
    head_blocks: int
    adaptive: bool = False
    one_wave: int = 1
    #: where the family's default is a ``SizeRule``: the build ("wide" or "narrow") picked for the size the plan was
    #: made for (``plan_decode``), so a frozen plan launches one build whatever the rows of a later launch (a graph
    #: replay with fewer rows, an eager decode handed the graph's plan): natively the builds' bits differ (warps).
    #: None: picked per launch. Not part of the plan's identity (equality compares the launch grid).
    build: "str | None" = field(default=None, compare=False)


@dataclass
class DecodeWorkspace:
    """Split-K partials: part_m, part_l [b, S, h] and part_acc [b, S, h, 512], fp32."""

    part_m: torch.Tensor
    part_l: torch.Tensor
    part_acc: torch.Tensor

    @staticmethod
    def allocate(batch: int, num_splits: int, num_heads: int, device, fill: float = 0.0) -> "DecodeWorkspace":
        def mk(*shape):
            return torch.full(shape, fill, dtype=torch.float32, device=device)

        return DecodeWorkspace(mk(batch, num_splits, num_heads), mk(batch, num_splits, num_heads),
                               mk(batch, num_splits, num_heads, formats.DSV4_HEAD_DIM))


def plan_decode(target: "Target | str | None", batch: int, num_heads: int, main_numel: int, extra_numel: int = 0,
                *, adaptive_splits: bool = False, cu_count: int | None = None) -> DecodePlan:
    """The plan ``sparse_attn_decode`` would use: family and selector from the target, sizes only (sync-free)."""
    t = get_target(target)
    if adaptive_splits and not t.adaptive_splits_in_capture:
        raise ValueError(f"adaptive_splits: target {t.name} does not allow adaptive splits (only targets with "
                         f"adaptive_splits_in_capture, i.e. gfx950)")
    cu = effective_cu_count(t) if cu_count is None else cu_count
    if isinstance(cu, bool) or not isinstance(cu, int) or cu < 1:
        raise ValueError(f"cu_count: expected a positive int, got {cu!r}")
    hb = _splits.head_blocks(num_heads)
    if t.split_selector is None:
        return _with_build(DecodePlan(t.decode_family, 1, hb), batch, num_heads, cu)
    s = _splits.select_num_splits(t.split_selector, batch, num_heads, main_numel, extra_numel, cu)
    if adaptive_splits:
        ap = _splits.adaptive_plan(s, batch, num_heads, cu)
        if ap.enabled:
            return _with_build(DecodePlan(t.decode_family, s, hb, True, ap.one_wave), batch, num_heads, cu)
    return _with_build(DecodePlan(t.decode_family, s, hb), batch, num_heads, cu)


def _with_build(plan: DecodePlan, batch: int, num_heads: int, cu: int) -> DecodePlan:
    """``plan`` with the build its family's ``SizeRule`` picks for this size recorded (unchanged otherwise)."""
    v = _variants.get(plan.family)
    if not isinstance(v, SizeRule):
        return plan
    return replace(plan, build="wide" if v.pick(batch, plan.num_splits, num_heads, cu) is v.wide else "narrow")


def _check_tensor(name: str, t, dtype: torch.dtype, dims: int, device) -> None:
    require_tensor(name, t, dtype, dim=dims, device=device)


def _check_ragged(prefix: str, indices, indptr, batch: int, device, check_indptr: bool) -> None:
    _check_tensor(f"{prefix}_indices", indices, torch.int32, 1, device)
    _check_tensor(f"{prefix}_indptr", indptr, torch.int32, 1, device)
    if indptr.numel() != batch + 1:
        raise ValueError(f"{prefix}_indptr: expected batch + 1 = {batch + 1} entries, got {indptr.numel()}")
    if not indices.is_contiguous() or not indptr.is_contiguous():
        raise ValueError(f"{prefix}_indices/{prefix}_indptr: expected contiguous tensors")
    if check_indptr:
        require_valid_indptr(f"{prefix}_indptr", indptr, f"{prefix}_indices", indices.numel())


def _check_plan(plan: DecodePlan, t: Target, num_heads: int) -> None:
    if not isinstance(plan, DecodePlan):
        raise TypeError(f"plan: expected a DecodePlan, got {type(plan).__name__}")
    if plan.family != t.decode_family:
        raise ValueError(f"plan: family {plan.family!r} does not match target {t.name}'s {t.decode_family!r}")
    hb = _splits.head_blocks(num_heads)
    if plan.head_blocks != hb:
        raise ValueError(f"plan: head_blocks must be ceil(num_heads / {BLOCK_H}) = {hb}, got {plan.head_blocks}")
    cap = t.split_cap if t.split_selector is not None else 1
    if not 1 <= plan.num_splits <= cap:
        raise ValueError(f"plan: num_splits must be in [1, {cap}] on {t.name}, got {plan.num_splits}")
    if plan.adaptive:
        if not t.adaptive_splits_in_capture:
            raise ValueError(f"plan: target {t.name} does not allow adaptive splits")
        if not 1 <= plan.one_wave <= plan.num_splits:
            raise ValueError(f"plan: one_wave must be in [1, num_splits = {plan.num_splits}], got {plan.one_wave}")


def sparse_attn_decode(q: torch.Tensor, main_cache: torch.Tensor, main_indices: torch.Tensor,
                       main_indptr: torch.Tensor, extra_cache: torch.Tensor | None = None,
                       extra_indices: torch.Tensor | None = None, extra_indptr: torch.Tensor | None = None, *,
                       attn_sink: torch.Tensor | None = None, softmax_scale: float | None = None,
                       target: "Target | str | None" = None, adaptive_splits: bool = False,
                       trust_extra_nan_free: bool = False, cu_count: int | None = None,
                       plan: DecodePlan | None = None, workspace: DecodeWorkspace | None = None,
                       out: torch.Tensor | None = None, check_indptr: bool = True) -> torch.Tensor:
    """Sparse MLA decode of ``q [b, h, 448 + 64]`` bf16 over a main (SWA) cache and an optional extra (compressed)
    cache, each ``[num_blocks, block_size, 584]`` uint8 with ragged int32 global-slot ``indices``/``indptr [b+1]``.

    ``attn_sink``: fp32 ``[>= h]`` (-inf = no sink). ``softmax_scale`` defaults to 512^-0.5. ``target`` picks the
    kernel family, the split selector and the fp8 flavours. ``adaptive_splits`` (gfx950 only) turns on per-row
    active splits when the host rule allows (base >= 16, S > 4). ``trust_extra_nan_free`` opens the trust gate
    (targets with ``may_trust_extra_nan_free`` only): the extra cache is then not scrubbed. ``cu_count`` overrides
    the target's CU count; ``plan`` freezes the launch (validated against the target); ``workspace``/``out`` let
    the caller own the buffers. ``check_indptr`` reads indptr on the host to reject a decreasing one.
    Returns ``out [b, h, 512]`` bf16. Every argument is validated before anything is launched or written."""
    t = get_target(target)
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q: expected a torch.Tensor, got {type(q).__name__}")
    if q.dtype != torch.bfloat16:
        raise TypeError(f"q: expected dtype bfloat16, got {_name_dtype(q.dtype)}")
    width = formats.DSV4_NOPE_DIM + formats.DSV4_ROPE_DIM
    if q.dim() != 3 or q.shape[2] != width:
        raise ValueError(f"q: expected shape [batch, heads, {formats.DSV4_NOPE_DIM} + {formats.DSV4_ROPE_DIM} = "
                         f"{width}], got {list(q.shape)}")
    batch, num_heads = int(q.shape[0]), int(q.shape[1])
    if batch < 1 or num_heads < 1:
        raise ValueError(f"q: expected at least one row and one head, got shape {list(q.shape)}")
    device = q.device
    if device.type != kernel_device():
        raise ValueError(f"q: kernels run on '{kernel_device()}' here, got tensors on {device}"
                         f"{native_without_gpu_hint()}")
    formats.check_fp8_ds_mla_cache(main_cache, "main_cache")
    if main_cache.device != device:
        raise ValueError(f"main_cache: expected device {device} (the device of q), got {main_cache.device}")
    _check_ragged("main", main_indices, main_indptr, batch, device, check_indptr)
    extra_given = [x is not None for x in (extra_cache, extra_indices, extra_indptr)]
    if any(extra_given) and not all(extra_given):
        raise ValueError("extra_cache, extra_indices, extra_indptr: give all three or none")
    has_extra = all(extra_given)
    if has_extra:
        formats.check_fp8_ds_mla_cache(extra_cache, "extra_cache")
        if extra_cache.device != device:
            raise ValueError(f"extra_cache: expected device {device} (the device of q), got {extra_cache.device}")
        _check_ragged("extra", extra_indices, extra_indptr, batch, device, check_indptr)
    if attn_sink is not None:
        _check_tensor("attn_sink", attn_sink, torch.float32, 1, device)
        if attn_sink.numel() < num_heads:
            raise ValueError(f"attn_sink: expected at least {num_heads} entries (one per head), got {attn_sink.numel()}")
        if not attn_sink.is_contiguous():
            raise ValueError("attn_sink: expected a contiguous tensor")
    scale = DEFAULT_SOFTMAX_SCALE if softmax_scale is None else softmax_scale
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
    if not isinstance(adaptive_splits, bool):
        raise TypeError(f"adaptive_splits: expected a bool, got {type(adaptive_splits).__name__}")
    if not isinstance(trust_extra_nan_free, bool):
        raise TypeError(f"trust_extra_nan_free: expected a bool, got {type(trust_extra_nan_free).__name__}")
    if trust_extra_nan_free and not t.may_trust_extra_nan_free:
        raise ValueError(f"trust_extra_nan_free: target {t.name} may not trust the extra cache to be NaN-free "
                         f"(its compressor does not sanitize)")
    if trust_extra_nan_free and not has_extra:
        raise ValueError("trust_extra_nan_free: the trust gate needs an extra cache, none was given")
    if plan is None:
        plan = plan_decode(t, batch, num_heads, main_indices.numel(),
                           extra_indices.numel() if has_extra else 0,
                           adaptive_splits=adaptive_splits, cu_count=cu_count)
    else:
        if adaptive_splits and not plan.adaptive:
            raise ValueError("adaptive_splits: True, but the given plan has adaptive splits off")
        _check_plan(plan, t, num_heads)
    S = plan.num_splits
    if out is None:
        out = torch.empty(batch, num_heads, width, dtype=torch.bfloat16, device=device)
    else:
        _check_tensor("out", out, torch.bfloat16, 3, device)
        if tuple(out.shape) != (batch, num_heads, width) or out.stride(2) != 1:
            raise ValueError(f"out: expected shape [{batch}, {num_heads}, {width}] with unit last stride, "
                             f"got {list(out.shape)} strides {list(out.stride())}")
    if plan.family != "generic":
        if workspace is None:
            workspace = DecodeWorkspace.allocate(batch, S, num_heads, device)
        else:
            if not isinstance(workspace, DecodeWorkspace):
                raise TypeError(f"workspace: expected a DecodeWorkspace, got {type(workspace).__name__}")
            for nm, ten, shape in (("part_m", workspace.part_m, (batch, S, num_heads)),
                                   ("part_l", workspace.part_l, (batch, S, num_heads)),
                                   ("part_acc", workspace.part_acc, (batch, S, num_heads, width))):
                _check_tensor(f"workspace.{nm}", ten, torch.float32, len(shape), device)
                if tuple(ten.shape) != shape or not ten.is_contiguous():
                    raise ValueError(f"workspace.{nm}: expected a contiguous {list(shape)} tensor, got "
                                     f"{list(ten.shape)}")

    # --- launch (nothing above wrote anything) ---
    is_fnuz_main = t.main_cache_is_fnuz
    is_fnuz_extra = t.extra_cache_is_fnuz
    # the one place the fp8 path is chosen: the Target gives the flavour, the device whether it converts it
    hw_fp8 = dict(HW_FP8_MAIN=hw_fp8_decode(is_fnuz_main), HW_FP8_EXTRA=hw_fp8_decode(is_fnuz_extra))
    variant = _launch_variant(plan, batch, num_heads, t, cu_count)
    # heads per program: the plan's head blocks are BLOCK_H wide (the split selector counts them); a block_h
    # variant covers them with fewer, wider programs (64: every KV row read once for all heads of a query)
    bh = variant.block_h or BLOCK_H
    head_progs = -(-num_heads // bh)
    scrub_extra = not trust_extra_nan_free
    ec, ei, ep = (extra_cache, extra_indices, extra_indptr) if has_extra else (main_cache, main_indices, main_indptr)
    main_args = (main_cache, main_indices, main_indptr, int(main_cache.shape[1]), int(main_cache.stride(0)),
                 int(main_cache.shape[0]) * int(main_cache.shape[1]))
    extra_args = (ec, ei, ep, int(ec.shape[1]), int(ec.stride(0)), int(ec.shape[0]) * int(ec.shape[1]))
    q_args = (q, q.stride(0), q.stride(1), q.stride(2))
    sink = attn_sink if attn_sink is not None else q
    if plan.family == "generic":
        _launch(_sparse_decode_generic_kernel, (batch, head_progs),
                *q_args, *main_args, *extra_args, sink, out, out.stride(0), out.stride(1), num_heads, float(scale),
                HAS_EXTRA=has_extra, HAS_SINK=attn_sink is not None, IS_FNUZ_MAIN=is_fnuz_main,
                IS_FNUZ_EXTRA=is_fnuz_extra, SCRUB_EXTRA=scrub_extra, BLOCK_H_=bh, BLOCK_K=GENERIC_BLOCK_K,
                **hw_fp8, **_variant_meta(variant, "generic", 8, (main_cache, ec)))
        return out
    ws = workspace
    part_args = (ws.part_m, ws.part_l, ws.part_acc, ws.part_m.stride(0), ws.part_m.stride(1),
                 ws.part_acc.stride(0), ws.part_acc.stride(1), ws.part_acc.stride(2))
    grid = (batch, S, head_progs)
    if plan.family == "gfx942":
        _launch(_sparse_decode_gfx942_partial_kernel, grid,
                *q_args, *main_args, *extra_args, *part_args, num_heads, S, float(scale),
                HAS_EXTRA=has_extra, IS_FNUZ_MAIN=is_fnuz_main, IS_FNUZ_EXTRA=is_fnuz_extra, SCRUB_EXTRA=scrub_extra,
                BLOCK_H_=bh, BLOCK_K=GFX942_BLOCK_K, **hw_fp8,
                **_variant_meta(variant, "gfx942", 4, (main_cache, ec)))
    elif plan.family == "gfx950":
        _launch(_sparse_decode_gfx950_partial_kernel, grid,
                *q_args, *main_args, *extra_args, *part_args, num_heads, S, plan.one_wave, float(scale * LOG2E),
                HAS_EXTRA=has_extra, IS_FNUZ_MAIN=is_fnuz_main, IS_FNUZ_EXTRA=is_fnuz_extra, SCRUB_EXTRA=scrub_extra,
                ADAPTIVE=plan.adaptive, BLOCK_H_=bh, MAIN_TILE=GFX950_MAIN_TILE,
                EXTRA_TILE=variant.extra_tile or GFX950_EXTRA_TILE, TAIL_TILE=GFX950_TAIL_TILE, ITER_K=_splits.BLOCK_K,
                QK_CHUNKS=variant.qk_chunks,
                **hw_fp8, **_variant_meta(variant, "gfx950", 4, (main_cache, ec)))
    else:
        raise ValueError(f"target {t.name}: unknown decode family {plan.family!r}")
    _launch_reduce(ws, attn_sink, out, plan.adaptive)
    return out


def _launch_reduce(ws: DecodeWorkspace, attn_sink: torch.Tensor | None, out: torch.Tensor, adaptive: bool) -> None:
    batch, S, num_heads = ws.part_m.shape
    part_args = (ws.part_m, ws.part_l, ws.part_acc, ws.part_m.stride(0), ws.part_m.stride(1),
                 ws.part_acc.stride(0), ws.part_acc.stride(1), ws.part_acc.stride(2))
    sink = attn_sink if attn_sink is not None else ws.part_m
    _launch(_sparse_decode_reduce_kernel, (batch, num_heads),
            *part_args, sink, out, out.stride(0), out.stride(1), S,
            HAS_SINK=attn_sink is not None, ADAPTIVE=adaptive, SPLITS_PAD=triton.next_power_of_2(S), MULTI=S > 1,
            num_warps=4)


def decode_reduce(workspace: DecodeWorkspace, *, attn_sink: torch.Tensor | None = None, adaptive: bool = False,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Run only the reduce over given partials (``part_m``/``part_l`` [b, S, h], ``part_acc`` [b, S, h, 512]):
    out [b, h, 512] bf16. With ``adaptive`` splits whose m is -FLT_MAX are skipped."""
    if not isinstance(workspace, DecodeWorkspace):
        raise TypeError(f"workspace: expected a DecodeWorkspace, got {type(workspace).__name__}")
    pm = workspace.part_m
    if not isinstance(pm, torch.Tensor) or pm.dim() != 3:
        raise ValueError("workspace.part_m: expected a [b, S, h] tensor")
    batch, S, num_heads = (int(x) for x in pm.shape)
    device = pm.device
    require_kernel_device("workspace.part_m", pm)
    for nm, ten, shape in (("part_m", workspace.part_m, (batch, S, num_heads)),
                           ("part_l", workspace.part_l, (batch, S, num_heads)),
                           ("part_acc", workspace.part_acc, (batch, S, num_heads, formats.DSV4_HEAD_DIM))):
        _check_tensor(f"workspace.{nm}", ten, torch.float32, len(shape), device)
        if tuple(ten.shape) != shape or not ten.is_contiguous():
            raise ValueError(f"workspace.{nm}: expected a contiguous {list(shape)} tensor, got {list(ten.shape)}")
    if attn_sink is not None:
        _check_tensor("attn_sink", attn_sink, torch.float32, 1, device)
        if attn_sink.numel() < num_heads or not attn_sink.is_contiguous():
            raise ValueError(f"attn_sink: expected a contiguous tensor of at least {num_heads} entries")
    if out is None:
        out = torch.empty(batch, num_heads, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=device)
    else:
        _check_tensor("out", out, torch.bfloat16, 3, device)
        if tuple(out.shape) != (batch, num_heads, formats.DSV4_HEAD_DIM) or out.stride(2) != 1:
            raise ValueError(f"out: expected shape [{batch}, {num_heads}, {formats.DSV4_HEAD_DIM}] with unit last "
                             f"stride, got {list(out.shape)}")
    _launch_reduce(workspace, attn_sink, out, bool(adaptive))
    return out
