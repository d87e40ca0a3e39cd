"""The sparse indexer's logits and top-k (SPEC sections 1.3 and 5): which compressed rows a C4A query attends.

For a query row t with head weights w[t, h] and a key s (128 fp8 lanes with one fp32 scale kscale[s]):

    logit[t, s] = kscale[s] * sum_h w[t, h] * relu(q[t, h] . k[s])        (fp32 arithmetic)

``fp8_mqa_logits`` (prefill) scores every key of a gathered ``k_fp8 [S, 128]`` and masks s outside [ks[t], ke[t]) to
-inf. ``fp8_paged_mqa_logits`` (decode) reads the keys straight from the paged indexer-K cache ``[nb, bs, 132]``
(per block: bs*128 fp8 bytes in the NORMAL or SHUFFLE order of :class:`impl.formats.IndexerKLayout`, then bs fp32
scales) through a block table. Request b has ``next_n`` query rows (1 = plain decode, more = MTP verification);
row j of a request with context ``ctx`` sees positions n <= ctx - next_n + j, every later position is -inf. With
``context_lens`` of shape [B, next_n] the row's visible length is given directly: row (b, j) sees n < ctx[b, j].
Every column of the output, up to ``max_model_len``, is written: a visible position gets its logit, every other one
-inf (no column is left holding whatever the buffer held before).

Numbers. q and the keys are e4m3 codes of the target's platform flavour (``Target.main_cache_fp8``: FNUZ on gfx942,
OCP elsewhere), converted by the device where it converts that flavour (natively: OCP everywhere, FNUZ on AMD) and
decoded from their bits by :func:`impl.triton_helpers.fp8_decode_bits` otherwise (FNUZ on NVIDIA, the interpreter).
Every fp8 value is exact in bf16, so the head dot products run as bf16 MMA with fp32 accumulation on a GPU (the
products of two e4m3 values are exact in fp32) and in fp32 under the interpreter (:func:`impl.triton_helpers.dot`);
the relu, the weight, the head sum and the scale are fp32. The error against exact arithmetic is therefore that of
fp32 accumulation over 128 lanes and H heads (the contract ``indexer-logits-agreement`` states the bound).

Non-finite values (what is promised). e4m3 has no infinity, only NaN codes. A NaN code in q[t, h] makes every
visible logit of row t NaN; a NaN code in a key, or a NaN scale, makes that key's logit NaN in every row that sees
it; the relu keeps NaN (``where(s < 0, 0, s)``, not a max that may drop it), and a NaN is never multiplied away by
a zero weight. An infinite scale gives +-inf by the sign of the fp32 head sum (NaN when it is exactly 0). A masked
position is -inf whatever its bytes hold: bytes past a row's visible length, in the tail of its last page or in a
block no visible position maps to, are never read.

Top-k (``topk_indices``, ``topk_indices_prefill``; torch ops). A logit is a candidate unless it is -inf or NaN (a
poisoned key never wins a slot; +inf does). Candidates rank by value, larger first; **equal values (and -0.0 vs
+0.0) rank the lower column first**. Row r of the int32 output holds its min(k, count_r) best columns in rank order
and -1 in every later entry (the buffer is filled with -1 first), which is what
``impl.ragged.compute_global_topk_ragged_indices_and_indptr`` reads (entries >= 0, -1 = none). The prefill variant
ranks only columns in [ks[r], ke[r]) and returns them relative to ks[r] (local to the request's first gathered key),
as upstream's prefill top-k does after ``_localize_aiter_prefill_topk``.

Validation reads the lengths and the block table on the host once (a sync; ``check_lengths=False`` skips it, e.g.
under graph capture):
a block table narrower than a request's pages, a referenced block id outside the pool, a visible length past
``max_model_len``, ks/ke outside [0, S] or ks > ke, lengths that disagree, wrong dtypes, layouts or devices raise
ValueError/TypeError naming the argument before anything is launched.

Sources: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` (``fp8_paged_mqa_logits_torch``,
``_fp8_paged_mqa_logits_decode_kernel``, ``rocm_fp8_paged_mqa_logits``, ``fp8_mqa_logits_torch``,
``rocm_aiter_sparse_attn_indexer``, ``_localize_aiter_prefill_topk``), restated in SPEC 5.
"""
from __future__ import annotations

import math
import os
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from impl.formats import INDEXER_HEAD_DIM, INDEXER_TOKEN_BYTES, IndexerKLayout, default_indexer_layout
from impl.runtime import kernel_device, native_without_gpu_hint
from impl.targets import Target, get_target
from impl.triton_helpers import INTERPRETER, dot, fp8_decode_bits, hw_fp8_decode
from impl.validation import dtype_name, require_tensor

D = INDEXER_HEAD_DIM
#: positions per tile (one tile of keys against all heads), and tiles per program of the paged kernel (q decoded once)
BLOCK_KV = 64
TILES_PER_PROGRAM = 8
INT_DTYPES = (torch.int32, torch.int64)
FP8_TORCH = {"ocp": torch.float8_e4m3fn, "fnuz": torch.float8_e4m3fnuz}
_NEG_INF = float("-inf")


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def _hw_fp8(tgt: Target) -> bool:
    """Whether the device converts the target's fp8 flavour itself: the one rule the decode kernels use too
    (:func:`impl.triton_helpers.hw_fp8_decode`: OCP on NVIDIA sm_89+ and gfx950, FNUZ on gfx942, never under the
    interpreter)."""
    return hw_fp8_decode(tgt.main_cache_is_fnuz)


def _heads_pad(h: int) -> int:
    """Heads padded to a power of two of at least 16 (the smallest MMA tile)."""
    return max(16, _next_pow2(h))


# ---------------------------------------------------------------------------------------------------------------
# Triton device functions and kernels
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def _mma_operand(x, F16: tl.constexpr = False):
    """fp32 values that are fp8 values -> the dot operand: bf16 (F16: fp16) on a GPU, exact either way (every e4m3
    value, OCP or FNUZ, is a bf16 and an fp16 value), fp32 under the interpreter."""
    if INTERPRETER:
        return x
    elif F16:
        return x.to(tl.float16)
    else:
        return x.to(tl.bfloat16)


@triton.jit
def _fp8_operand(codes, IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr, F16: tl.constexpr = False):
    """uint8 e4m3 codes -> the dot operand. With HW_FP8 (natively, where the device converts this flavour, as
    :func:`impl.triton_helpers.hw_fp8_decode` says) the hardware converts the codes to bf16 (F16: to fp16, one
    conversion instruction per pair of codes on sm_89+ where bf16 takes several); otherwise the shared decode from
    bits does it (FNUZ on NVIDIA, the interpreter). All are exact, NaN codes giving NaN."""
    if HW_FP8:
        if IS_FNUZ:
            f8 = codes.to(tl.float8e4b8, bitcast=True)
        else:
            f8 = codes.to(tl.float8e4nv, bitcast=True)
        if F16:
            return f8.to(tl.float16)
        else:
            return f8.to(tl.bfloat16)
    else:
        return _mma_operand(fp8_decode_bits(codes, IS_FNUZ), F16)


@triton.jit
def _fp8_raw_operand(codes, IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr, FP8_DOT: tl.constexpr,
                     F16: tl.constexpr = False):
    """uint8 e4m3 codes -> the dot operand: with FP8_DOT (and HW_FP8) the codes as the device's fp8 type, fed to
    the MMA as they are (upstream's paged kernel does this); otherwise :func:`_fp8_operand`."""
    if FP8_DOT and HW_FP8:
        if IS_FNUZ:
            return codes.to(tl.float8e4b8, bitcast=True)
        else:
            return codes.to(tl.float8e4nv, bitcast=True)
    else:
        return _fp8_operand(codes, IS_FNUZ, HW_FP8, F16)


@triton.jit
def _key_logits(k_codes, scale, q_op, w, h_ok, BLOCK_ROWS: tl.constexpr, H_PAD: tl.constexpr,
                IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr, FP8_DOT: tl.constexpr = False,
                F16: tl.constexpr = False, FP8_PROMOTE: tl.constexpr = True):
    """scale[s] * sum_h w[h] * relu(k[s] . q[h]) for a [BLOCK_ROWS, 128] tile of key codes; padded heads contribute
    exactly 0 (masked after the product, so a NaN key cannot leak through a zero pad weight); the key scale
    multiplies the head sum once, after the relu (a scale of either sign gives the formula's value). FP8_DOT:
    ``q_op`` is fp8 too and the MMA takes fp8 operands (products exact in fp32; with FP8_PROMOTE each MMA
    instruction's partial sum is added to the fp32 accumulator after every instruction, else the device accumulates
    as it does by default, upstream's way)."""
    k = _fp8_raw_operand(k_codes, IS_FNUZ, HW_FP8, FP8_DOT, F16)
    if FP8_DOT and HW_FP8:
        if FP8_PROMOTE:  # every MMA's partial sum promoted to the fp32 accumulator (no imprecise accumulation)
            s = tl.dot(k, tl.trans(q_op), tl.zeros((BLOCK_ROWS, H_PAD), dtype=tl.float32), max_num_imprecise_acc=0)
        else:
            s = tl.dot(k, tl.trans(q_op), tl.zeros((BLOCK_ROWS, H_PAD), dtype=tl.float32))
    else:
        s = dot(k, tl.trans(q_op), tl.zeros((BLOCK_ROWS, H_PAD), dtype=tl.float32))
    s = tl.where(s < 0, 0.0, s)  # relu that keeps NaN
    p = s * w[None, :]
    p = tl.where(h_ok[None, :], p, 0.0)
    return tl.sum(p, axis=1) * scale


@triton.jit
def _load_q_heads(q_row, stride_qh, NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, IS_FNUZ: tl.constexpr,
                  HW_FP8: tl.constexpr, FP8_DOT: tl.constexpr = False, F16: tl.constexpr = False):
    h = tl.arange(0, H_PAD)
    d = tl.arange(0, 128)
    h_ok = h < NUM_HEADS
    codes = tl.load(q_row + h[:, None] * stride_qh + d[None, :], mask=h_ok[:, None], other=0)
    return _fp8_raw_operand(codes, IS_FNUZ, HW_FP8, FP8_DOT, F16), h_ok


@triton.jit
def _paged_tile(cache_ptr, stride_cache_blk, block_size, bt_row, t0, pos, live, visible, BLOCK: tl.constexpr,
                SHUFFLE: tl.constexpr, PAGE_TILE: tl.constexpr, SCALE32: tl.constexpr):
    """The key codes [BLOCK, 128] and fp32 scales [BLOCK] of the tile starting at position ``t0`` (``live``: the
    visible positions; nothing else is read). PAGE_TILE: the tile lies in one page (the host checked block_size %
    BLOCK == 0), one table entry and one 64-bit block base; else a table entry and a block base per position.
    SCALE32: the scale as one fp32 word (the host checked 4-byte alignment); else four bytes assembled."""
    d = tl.arange(0, 128)
    if PAGE_TILE:
        page = tl.load(bt_row + t0 // block_size, mask=t0 < visible, other=0).to(tl.int64)
        p = t0 % block_size + tl.arange(0, BLOCK)
    else:
        page = tl.load(bt_row + pos // block_size, mask=live, other=0).to(tl.int64)
        p = pos % block_size
    if SHUFFLE:
        off = ((p // 16) * 2048 + (p % 16) * 16)[:, None] + ((d // 16) * 256 + d % 16)[None, :]
    else:
        off = p[:, None] * 128 + d[None, :]
    block = cache_ptr + page * stride_cache_blk
    if PAGE_TILE:
        codes = tl.load(block + off, mask=live[:, None], other=0)
    else:
        codes = tl.load(block[:, None] + off, mask=live[:, None], other=0)
    sp = block + block_size * 128 + p * 4
    if SCALE32:
        scale = tl.load(sp.to(tl.pointer_type(tl.float32)), mask=live, other=0.0)
    else:
        sbits = tl.load(sp, mask=live, other=0).to(tl.int32)
        sbits = sbits | (tl.load(sp + 1, mask=live, other=0).to(tl.int32) << 8)
        sbits = sbits | (tl.load(sp + 2, mask=live, other=0).to(tl.int32) << 16)
        sbits = sbits | (tl.load(sp + 3, mask=live, other=0).to(tl.int32) << 24)
        scale = sbits.to(tl.float32, bitcast=True)
    return codes, scale


# do_not_specialize: block_size only splits a position into page (n // bs) and in-page row (n % bs), and bs*128 is a
# multiple of 16 whatever bs is; max_model_len only masks columns: neither gains from specialization (the strides keep
# theirs)
@triton.jit(do_not_specialize=["block_size", "max_model_len"])
def _paged_mqa_logits_kernel(q_ptr, stride_qb, stride_qn, stride_qh,
                             cache_ptr, stride_cache_blk, block_size,
                             w_ptr, stride_w,
                             ctx_ptr, stride_ctx_b, stride_ctx_n,
                             bt_ptr, stride_bt,
                             out_ptr, stride_out, max_model_len,
                             NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, NEXT_N: tl.constexpr,
                             BLOCK: tl.constexpr, TILES: tl.constexpr, CTX_PER_ROW: tl.constexpr,
                             SHUFFLE: tl.constexpr, IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr,
                             NUM_STAGES: tl.constexpr, PAGE_TILE: tl.constexpr = False,
                             SCALE32: tl.constexpr = False, FP8_DOT: tl.constexpr = False,
                             F16: tl.constexpr = False, FP8_PROMOTE: tl.constexpr = True):
    """Grid ``(B * next_n, cdiv(max_model_len, BLOCK * TILES))``: program (row, chunk) writes columns
    [chunk*TILES*BLOCK, (chunk+1)*TILES*BLOCK) of output row ``row`` = b * next_n + j, one BLOCK-wide tile of keys
    against all heads at a time (q is decoded once per program and reused by its TILES tiles).

    Layout: q codes [B, next_n, H, 128] (lane stride 1); cache block ``page`` at page*stride_cache_blk holds the fp8
    bytes of position p at p*128 + d (NORMAL) or (p//16)*2048 + (d//16)*256 + (p%16)*16 + d%16 (SHUFFLE), and its
    fp32 scale as 4 little-endian bytes at block_size*128 + 4p (assembled from bytes: a strided pool need not be
    4-byte aligned); page = block_table[b, n // block_size], p = n % block_size.
    Invariant (checked on the host): every visible position's table column exists and names a block of the pool, and
    the visible length is at most max_model_len. Only visible positions are loaded (a masked lane reads nothing), so
    bytes past the visible length are never touched; every column is stored, -inf where not visible.

    Build options (``LogitsVariant``; none changes a value): PAGE_TILE (host: block_size % BLOCK == 0) reads one
    table entry per tile, a tile then lying in one page; SCALE32 (host: the pool 4-byte aligned) loads each scale as
    one fp32 word instead of four bytes; FP8_DOT feeds the fp8 codes to the MMA where the device converts them
    (FP8_PROMOTE: each MMA's partial sum promoted to fp32, else the device's accumulation); F16 makes the operands
    fp16 instead of bf16 (both exact)."""
    row = tl.program_id(0)
    chunk = tl.program_id(1)
    b = row // NEXT_N
    j = row % NEXT_N
    if CTX_PER_ROW:
        visible = tl.load(ctx_ptr + b * stride_ctx_b + j * stride_ctx_n).to(tl.int32)
    else:
        visible = tl.load(ctx_ptr + b * stride_ctx_b).to(tl.int32) - NEXT_N + j + 1
    first = chunk * (TILES * BLOCK)
    out_row = out_ptr + row.to(tl.int64) * stride_out
    if first >= visible:
        for t in tl.static_range(TILES):
            pos = first + t * BLOCK + tl.arange(0, BLOCK)
            tl.store(out_row + pos, tl.full((BLOCK,), float("-inf"), tl.float32), mask=pos < max_model_len)
    else:
        q_op, h_ok = _load_q_heads(q_ptr + b.to(tl.int64) * stride_qb + j * stride_qn, stride_qh,
                                   NUM_HEADS, H_PAD, IS_FNUZ, HW_FP8, FP8_DOT, F16)
        w = tl.load(w_ptr + row.to(tl.int64) * stride_w + tl.arange(0, H_PAD), mask=h_ok, other=0.0)
        bt_row = bt_ptr + b.to(tl.int64) * stride_bt
        for t in tl.range(0, TILES, num_stages=NUM_STAGES):
            t0 = first + t * BLOCK
            pos = t0 + tl.arange(0, BLOCK)
            in_row = pos < max_model_len
            live = pos < visible
            codes, scale = _paged_tile(cache_ptr, stride_cache_blk, block_size, bt_row, t0, pos, live, visible,
                                       BLOCK, SHUFFLE, PAGE_TILE, SCALE32)
            logit = _key_logits(codes, scale, q_op, w, h_ok, BLOCK, H_PAD, IS_FNUZ, HW_FP8, FP8_DOT, F16,
                                FP8_PROMOTE)
            tl.store(out_row + pos, tl.where(live, logit, float("-inf")), mask=in_row)


# do_not_specialize: num_keys only masks columns (pos < num_keys): nothing gains from its specialization
@triton.jit(do_not_specialize=["num_keys"])
def _mqa_logits_kernel(q_ptr, stride_qt, stride_qh,
                       k_ptr, stride_k, ks_scale_ptr, stride_kscale,
                       w_ptr, stride_w,
                       row_start_ptr, row_end_ptr,
                       out_ptr, stride_out, num_keys,
                       NUM_HEADS: tl.constexpr, H_PAD: tl.constexpr, BLOCK: tl.constexpr,
                       IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr):
    """Grid ``(T, cdiv(S, BLOCK))``: program (t, tile) writes columns [tile*BLOCK, (tile+1)*BLOCK) of row t.

    Layout: q codes [T, H, 128], key codes [S, 128] (lane stride 1), fp32 key scales [S], weights [T, H].
    Invariant (checked on the host): 0 <= ks[t] <= ke[t] <= S. Keys outside [ks[t], ke[t]) are not loaded; their
    columns are -inf."""
    t = tl.program_id(0)
    tile = tl.program_id(1)
    ks = tl.load(row_start_ptr + t).to(tl.int32)
    ke = tl.load(row_end_ptr + t).to(tl.int32)
    start = tile * BLOCK
    pos = start + tl.arange(0, BLOCK)
    in_row = pos < num_keys
    out_row = out_ptr + t.to(tl.int64) * stride_out
    if (start >= ke) | (start + BLOCK <= ks):
        tl.store(out_row + pos, tl.full((BLOCK,), float("-inf"), tl.float32), mask=in_row)
    else:
        live = (pos >= ks) & (pos < ke)
        q_op, h_ok = _load_q_heads(q_ptr + t.to(tl.int64) * stride_qt, stride_qh, NUM_HEADS, H_PAD, IS_FNUZ,
                                   HW_FP8)
        w = tl.load(w_ptr + t.to(tl.int64) * stride_w + tl.arange(0, H_PAD), mask=h_ok, other=0.0)
        d = tl.arange(0, 128)
        codes = tl.load(k_ptr + pos.to(tl.int64)[:, None] * stride_k + d[None, :], mask=live[:, None], other=0)
        scale = tl.load(ks_scale_ptr + pos.to(tl.int64) * stride_kscale, mask=live, other=0.0)
        logit = _key_logits(codes, scale, q_op, w, h_ok, BLOCK, H_PAD, IS_FNUZ, HW_FP8)
        tl.store(out_row + pos, tl.where(live, logit, float("-inf")), mask=in_row)


# ---------------------------------------------------------------------------------------------------------------
# Build variants of the paged kernel (issue 31 item 4; benchmarks/logits_variants.py times them)
# ---------------------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LogitsVariant:
    """How ``fp8_paged_mqa_logits``'s kernel is built, never what it computes (benchmarks/DECODE_PERF.md, issue 31
    item 4, says why each exists).

    - ``block``: positions per tile (16, 32, 64 = the default, 128; capped by max_model_len as before).
    - ``tiles``: tiles per program (q decoded once per program); None = ``TILES_PER_PROGRAM``.
    - ``fill``: shrink ``tiles`` (halving) until the grid has at least ``fill`` x the target's CU count programs,
      as upstream's split count fills the device on few rows; 0 = off.
    - ``page_tile``: one block-table entry per tile (used only where block_size % block == 0, else per lane).
    - ``scale32``: each key scale loaded as one fp32 word (used only where the pool's base and block stride are
      4-byte aligned, else four bytes).
    - ``fp8_dot``: the fp8 codes straight into the MMA where the device converts the flavour (upstream's way); the
      products stay exact, the MMA's fp32 accumulation is the device's (the contract's bound judges it natively;
      under the interpreter there is no hardware conversion, so the build is the default's).
    - ``fp8_promote``: with ``fp8_dot``, each MMA instruction's partial sum promoted to the fp32 accumulator
      (``max_num_imprecise_acc=0``); False leaves the device's default accumulation, as upstream's kernel does.
    - ``f16``: the converted operands fp16 instead of bf16 (every e4m3 value is exact in both; on sm_89+ the
      conversion to fp16 is one instruction per pair of codes, to bf16 several).
    - ``num_warps`` / ``num_stages``: launch options (None: 4 warps, 2 stages in the tile loop)."""

    block: int = BLOCK_KV
    tiles: int | None = None
    fill: float = 0.0
    page_tile: bool = False
    scale32: bool = False
    fp8_dot: bool = False
    fp8_promote: bool = True
    f16: bool = False
    num_warps: int | None = None
    num_stages: int | None = None

    def __post_init__(self):
        if self.block not in (16, 32, 64, 128):
            raise ValueError(f"block: expected 16, 32, 64 or 128, got {self.block!r}")
        for nm in ("tiles", "num_warps", "num_stages"):
            v = getattr(self, nm)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{nm}: expected None or a positive int, got {v!r}")
        if self.num_warps is not None and self.num_warps & (self.num_warps - 1):
            raise ValueError(f"num_warps: expected a power of 2 (what the compilers accept), got {self.num_warps!r}")
        if isinstance(self.fill, bool) or not isinstance(self.fill, (int, float)) or self.fill < 0:
            raise ValueError(f"fill: expected a number >= 0, got {self.fill!r}")


#: the build ``fp8_paged_mqa_logits`` launches with: one table entry per tile, fp32 scale words, tiles per program
#: halved until the grid fills the device, fp16 operands. Measured on an H100 (2026-12-06, benchmarks/DECODE_PERF.md,
#: CUDA-graph medians, 64 heads): 35.7 / 4.4 us at 64 x 8192 / 4 x 8192 against upstream's 42.4 / 5.2 (0.84x /
#: 0.83x), the same build with bf16 operands 43.6 / 5.3, the kernel's first build (``LogitsVariant()``, "first" in
#: benchmarks/logits_variants.py) 62.6 / 19.7 on the H200; every build computes the same values (fp16 and bf16
#: operands are both exact, and gave the same bits natively). fp8 operands with Hopper's own accumulation
#: (``fp8_dot, fp8_promote=False``) were faster still (31.6 / 3.6 us) but took 0.90 of the contract's bound where
#: every other build took 0.0003, so they stay opt-in
DEFAULT_LOGITS_VARIANT = LogitsVariant(page_tile=True, scale32=True, fill=1.0, f16=True)
#: ``SMV_LOGITS_VARIANT``: an override read at import, e.g. ``page_tile,scale32,block=64,tiles=4,num_warps=8``
LOGITS_VARIANT_ENV = "SMV_LOGITS_VARIANT"


def _parse_logits_variant(spec: str) -> "LogitsVariant | None":
    """``flag,key=value,...`` -> LogitsVariant (a bare flag means True); empty -> None."""
    import dataclasses

    spec = spec.strip()
    if not spec:
        return None
    fields = {f.name for f in dataclasses.fields(LogitsVariant)}
    kw = {}
    for item in filter(None, (x.strip() for x in spec.split(","))):
        key, eq, val = (x.strip() for x in item.partition("="))
        if key not in fields:
            raise ValueError(f"{LOGITS_VARIANT_ENV}: unknown field {key!r} (expected one of {sorted(fields)})")
        if key in ("page_tile", "scale32", "fp8_dot", "fp8_promote", "f16"):
            kw[key] = (not eq) or val in ("1", "true", "True")
        elif key == "fill":
            kw[key] = float(val)
        else:
            kw[key] = None if val in ("", "none", "None") else int(val)
    return LogitsVariant(**kw)


_logits_variant = _parse_logits_variant(os.environ.get(LOGITS_VARIANT_ENV, "")) or DEFAULT_LOGITS_VARIANT


@contextmanager
def logits_variant(variant: "LogitsVariant | None"):
    """``with logits_variant(LogitsVariant(page_tile=True)): ...``: the paged kernel's build for the block (None:
    the default), then the previous one."""
    global _logits_variant
    if variant is not None and not isinstance(variant, LogitsVariant):
        raise TypeError(f"variant: expected a LogitsVariant or None, got {type(variant).__name__}")
    previous = _logits_variant
    _logits_variant = DEFAULT_LOGITS_VARIANT if variant is None else variant
    try:
        yield _logits_variant
    finally:
        _logits_variant = previous


def _paged_launch(v: LogitsVariant, rows: int, max_model_len: int, block_size: int, cache, tgt: Target):
    """(grid, constexprs and launch options) of the paged kernel under build ``v``."""
    block = min(v.block, max(16, _next_pow2(max_model_len)))
    tiles = max(1, min(v.tiles or TILES_PER_PROGRAM, triton.cdiv(max_model_len, block)))
    while v.fill and tiles > 1 and rows * triton.cdiv(max_model_len, block * tiles) < v.fill * tgt.cu_count:
        tiles //= 2
    meta = dict(BLOCK=block, TILES=tiles, NUM_STAGES=v.num_stages or 2, num_warps=v.num_warps or 4,
                PAGE_TILE=v.page_tile and block_size % block == 0,
                SCALE32=v.scale32 and cache.data_ptr() % 4 == 0 and cache.stride(0) % 4 == 0,
                FP8_DOT=v.fp8_dot, FP8_PROMOTE=v.fp8_promote, F16=v.f16)
    return (rows, triton.cdiv(max_model_len, block * tiles)), meta


# ---------------------------------------------------------------------------------------------------------------
# Host-side validation
# ---------------------------------------------------------------------------------------------------------------

def _fp8_codes(name: str, t, tgt: Target, dim: int, last: int) -> torch.Tensor:
    """``t`` as uint8 codes of the target's platform fp8: a uint8 tensor (raw codes) or torch's fp8 dtype of that
    flavour; the other flavour's dtype is a TypeError (its bits mean other numbers)."""
    want = FP8_TORCH[tgt.main_cache_fp8]
    require_tensor(name, t, (torch.uint8, want), dim=dim)
    if t.shape[-1] != last:
        raise ValueError(f"{name}: expected last dim {last}, got shape {list(t.shape)}")
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: expected unit stride along the last dim, got strides {list(t.stride())}")
    return t if t.dtype == torch.uint8 else t.view(torch.uint8)


def _check_fp8_dtype_message(name: str, t, tgt: Target) -> None:
    other = {v: k for k, v in FP8_TORCH.items()}.get(getattr(t, "dtype", None))
    if other is not None and other != tgt.main_cache_fp8:
        raise TypeError(f"{name}: target {tgt.name} reads {tgt.main_cache_fp8.upper()} fp8 "
                        f"({dtype_name(FP8_TORCH[tgt.main_cache_fp8])} or raw uint8 codes), got "
                        f"{dtype_name(t.dtype)} ({other.upper()})")


def _same_device(device, **tensors) -> None:
    want = kernel_device()
    if device.type != want:
        raise ValueError(f"q: kernels run on '{want}' here, got a tensor on {device}{native_without_gpu_hint()}")
    for name, t in tensors.items():
        if t is not None and t.device != device:
            raise ValueError(f"{name}: expected device {device} (the device of q), got {t.device}")


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return v


def _check_out(out, rows: int, cols: int, device) -> None:
    if out is None:
        return
    require_tensor("out", out, torch.float32, dim=2)
    if tuple(out.shape) != (rows, cols):
        raise ValueError(f"out: expected shape [{rows}, {cols}], got {list(out.shape)}")
    if out.device != device:
        raise ValueError(f"out: expected device {device} (the device of q), got {out.device}")
    if cols > 1 and out.stride(1) != 1:
        raise ValueError(f"out: expected unit stride along the columns, got strides {list(out.stride())}")


def _visible_lengths(context_lens: torch.Tensor, batch: int, next_n: int) -> torch.Tensor:
    """Host int64 [B, next_n]: how many positions row (b, j) sees."""
    cl = context_lens.to("cpu", torch.int64)
    if cl.dim() == 2:
        return cl.clone()
    j = torch.arange(next_n, dtype=torch.int64)
    return cl[:, None] - next_n + j[None, :] + 1


def _validate_paged(q, kv_cache, weights, context_lens, block_tables, max_model_len, layout, out, tgt,
                    check_lengths=True):
    for name, t in (("q", q), ("kv_cache", kv_cache), ("weights", weights), ("context_lens", context_lens),
                    ("block_tables", block_tables)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _check_fp8_dtype_message("q", q, tgt)
    q8 = _fp8_codes("q", q, tgt, 4, D)
    B, next_n, H, _ = q8.shape
    if H < 1 or next_n < 1:
        raise ValueError(f"q: expected at least one query row per request and one head, got shape {list(q.shape)}")
    require_tensor("kv_cache", kv_cache, torch.uint8)
    if kv_cache.dim() == 4 and kv_cache.shape[2] == 1:
        kv_cache = kv_cache.squeeze(2)  # upstream's [nb, bs, 1, 132] view of the same bytes
    if kv_cache.dim() != 3 or kv_cache.shape[2] != INDEXER_TOKEN_BYTES:
        raise ValueError(f"kv_cache: expected shape [num_blocks, block_size, {INDEXER_TOKEN_BYTES}], got "
                         f"{list(kv_cache.shape)}")
    if kv_cache.stride(2) != 1 or (kv_cache.shape[1] > 1 and kv_cache.stride(1) != INDEXER_TOKEN_BYTES):
        raise ValueError(f"kv_cache: each block must be contiguous, got strides {list(kv_cache.stride())}")
    nb, bs = int(kv_cache.shape[0]), int(kv_cache.shape[1])
    lay = IndexerKLayout(bs, default_indexer_layout(bs) if layout is None else layout)
    require_tensor("weights", weights, torch.float32, dim=2)
    if tuple(weights.shape) != (B * next_n, H):
        raise ValueError(f"weights: expected shape [B * next_n, H] = [{B * next_n}, {H}], got {list(weights.shape)}")
    if H > 1 and weights.stride(1) != 1:
        raise ValueError(f"weights: expected unit stride along the heads, got strides {list(weights.stride())}")
    require_tensor("context_lens", context_lens, INT_DTYPES)
    if context_lens.dim() == 2 and context_lens.shape[1] == 1 and next_n == 1:
        context_lens = context_lens.reshape(-1)
    if context_lens.dim() == 1:
        if context_lens.shape[0] != B:
            raise ValueError(f"context_lens: expected {B} entries (one per request of q), got {context_lens.shape[0]}")
    elif context_lens.dim() == 2:
        if tuple(context_lens.shape) != (B, next_n):
            raise ValueError(f"context_lens: expected [B] = [{B}] or [B, next_n] = [{B}, {next_n}], got "
                             f"{list(context_lens.shape)}")
    else:
        raise ValueError(f"context_lens: expected [B] or [B, next_n], got shape {list(context_lens.shape)}")
    require_tensor("block_tables", block_tables, INT_DTYPES, dim=2)
    if block_tables.shape[0] != B:
        raise ValueError(f"block_tables: expected {B} rows (one per request of q), got {block_tables.shape[0]}")
    if block_tables.shape[1] > 1 and block_tables.stride(1) != 1:
        raise ValueError(f"block_tables: expected unit stride along the columns, got {list(block_tables.stride())}")
    max_model_len = _positive_int("max_model_len", max_model_len)
    _same_device(q.device, kv_cache=kv_cache, weights=weights, context_lens=context_lens,
                 block_tables=block_tables)
    _check_out(out, B * next_n, max_model_len, q.device)
    if not check_lengths:
        return q8, kv_cache, lay, B, next_n, H, context_lens, max_model_len
    # host checks: one read of the lengths and the table
    cl = context_lens.to("cpu", torch.int64)
    if bool((cl < 0).any()):
        raise ValueError(f"context_lens: expected lengths >= 0, got {cl.tolist()}")
    vis = _visible_lengths(context_lens, B, next_n).clamp(min=0)
    if B and int(vis.max()) > max_model_len:
        r = int(vis.reshape(-1).argmax())
        raise ValueError(f"context_lens: row {r} sees {int(vis.reshape(-1)[r])} positions, more than max_model_len = "
                         f"{max_model_len}")
    pages = (vis.max(dim=1).values + bs - 1) // bs if B else torch.zeros(0, dtype=torch.int64)
    W = int(block_tables.shape[1])
    if B and int(pages.max()) > W:
        b = int(pages.argmax())
        raise ValueError(f"block_tables: request {b} needs {int(pages[b])} blocks (ceil({int(vis[b].max())} / "
                         f"block_size {bs})), but the table has {W} columns")
    if B and int(pages.max()) > 0:
        bt = block_tables.to("cpu", torch.int64)
        need = torch.arange(W)[None, :] < pages[:, None]
        bad = need & ((bt < 0) | (bt >= nb))
        if bool(bad.any()):
            b, c = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_tables: request {b}, column {c} names block {int(bt[b, c])}, outside the pool of "
                             f"{nb} blocks")
    return q8, kv_cache, lay, B, next_n, H, context_lens, max_model_len


def _validate_prefill(q, k_fp8, k_scale, weights, ks, ke, out, tgt):
    for name, t in (("q", q), ("k_fp8", k_fp8), ("k_scale", k_scale), ("weights", weights), ("ks", ks),
                    ("ke", ke)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    _check_fp8_dtype_message("q", q, tgt)
    _check_fp8_dtype_message("k_fp8", k_fp8, tgt)
    q8 = _fp8_codes("q", q, tgt, 3, D)
    k8 = _fp8_codes("k_fp8", k_fp8, tgt, 2, D)
    T, H, _ = q8.shape
    S = int(k8.shape[0])
    if H < 1:
        raise ValueError(f"q: expected at least one head, got shape {list(q.shape)}")
    require_tensor("k_scale", k_scale, (torch.float32, torch.uint8))
    if k_scale.dtype == torch.uint8:  # cp-gather's [S, 4] bytes
        if tuple(k_scale.shape) != (S, 4) or k_scale.stride(1) != 1:
            raise ValueError(f"k_scale: uint8 scales must be [S, 4] = [{S}, 4] bytes with unit stride, got shape "
                             f"{list(k_scale.shape)}")
        k_scale = k_scale.view(torch.float32).reshape(S)
    elif tuple(k_scale.shape) not in ((S,), (S, 1)):
        raise ValueError(f"k_scale: expected [S] or [S, 1] = [{S}] float32 (one per key of k_fp8), got "
                         f"{list(k_scale.shape)}")
    k_scale = k_scale.reshape(S)
    require_tensor("weights", weights, torch.float32, dim=2)
    if tuple(weights.shape) != (T, H):
        raise ValueError(f"weights: expected shape [T, H] = [{T}, {H}], got {list(weights.shape)}")
    if H > 1 and weights.stride(1) != 1:
        raise ValueError(f"weights: expected unit stride along the heads, got strides {list(weights.stride())}")
    for name, t in (("ks", ks), ("ke", ke)):
        require_tensor(name, t, INT_DTYPES, dim=1)
        if t.shape[0] != T:
            raise ValueError(f"{name}: expected {T} entries (one per query row of q), got {t.shape[0]}")
    _same_device(q.device, k_fp8=k_fp8, k_scale=k_scale, weights=weights, ks=ks, ke=ke)
    _check_out(out, T, S, q.device)
    lo, hi = ks.to("cpu", torch.int64), ke.to("cpu", torch.int64)
    bad = (lo < 0) | (hi > S) | (lo > hi)
    if bool(bad.any()):
        t = int(bad.nonzero()[0])
        raise ValueError(f"ks/ke: row {t} has the range [{int(lo[t])}, {int(hi[t])}); expected 0 <= ks <= ke <= S = {S}")
    return q8, k8, k_scale, T, H, S


# ---------------------------------------------------------------------------------------------------------------
# Public entry points
# ---------------------------------------------------------------------------------------------------------------

def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout=None,
                         out=None, target=None, check_lengths: bool = True) -> torch.Tensor:
    """Decode indexer logits from the paged indexer-K cache: -> fp32 ``[B * next_n, max_model_len]``.

    ``q`` [B, next_n, H, 128] platform-fp8 (or its uint8 codes); ``kv_cache`` [nb, bs, 132] uint8 (or upstream's
    [nb, bs, 1, 132]); ``weights`` [B * next_n, H] fp32; ``context_lens`` [B] (row j of request b sees positions
    n <= ctx - next_n + j) or [B, next_n] (row (b, j) sees n < ctx[b, j]); ``block_tables`` [B, W] with W >= the
    pages of every request; ``layout`` "normal" | "shuffle" | None (``impl.formats.default_indexer_layout``: NORMAL
    for bs == 1, SHUFFLE otherwise; C4A caches are NORMAL). ``out``: an fp32 buffer to write (every column is
    written). ``check_lengths=False`` skips the one host read of the lengths and the table (for graph capture and
    timing): the caller then guarantees the kernel's invariant (every visible position's table column exists and
    names a block of the pool, no row sees more than max_model_len positions). Semantics in the module docstring."""
    tgt = get_target(target)
    q8, cache, lay, B, next_n, H, context_lens, max_model_len = _validate_paged(
        q, kv_cache, weights, context_lens, block_tables, max_model_len, layout, out, tgt, check_lengths)
    rows = B * next_n
    if out is None:
        out = torch.empty(rows, max_model_len, dtype=torch.float32, device=q.device)
    if rows == 0:
        return out
    per_row = context_lens.dim() == 2
    grid, meta = _paged_launch(_logits_variant, rows, max_model_len, lay.block_size, cache, tgt)
    _paged_mqa_logits_kernel[grid](
        q8, q8.stride(0), q8.stride(1), q8.stride(2),
        cache, cache.stride(0), lay.block_size,
        weights, weights.stride(0),
        context_lens, context_lens.stride(0), context_lens.stride(1) if per_row else 0,
        block_tables, block_tables.stride(0),
        out, out.stride(0), max_model_len,
        NUM_HEADS=H, H_PAD=_heads_pad(H), NEXT_N=next_n, CTX_PER_ROW=per_row,
        SHUFFLE=lay.layout == "shuffle", IS_FNUZ=tgt.main_cache_is_fnuz, HW_FP8=_hw_fp8(tgt), **meta,
    )
    return out


def fp8_mqa_logits(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None) -> torch.Tensor:
    """Prefill indexer logits over gathered keys: -> fp32 ``[T, S]``, -inf outside [ks[t], ke[t]).

    ``q`` [T, H, 128] platform-fp8 (or uint8 codes); ``k_fp8`` [S, 128] likewise (cp-gather's output); ``k_scale``
    fp32 [S] or [S, 1], or cp-gather's uint8 [S, 4] bytes; ``weights`` [T, H] fp32; ``ks``/``ke`` [T] int32/int64
    with 0 <= ks <= ke <= S (ks == ke: an empty row)."""
    tgt = get_target(target)
    q8, k8, k_scale, T, H, S = _validate_prefill(q, k_fp8, k_scale, weights, ks, ke, out, tgt)
    if out is None:
        out = torch.empty(T, S, dtype=torch.float32, device=q.device)
    if T == 0 or S == 0:
        return out
    block = min(BLOCK_KV, max(16, _next_pow2(S)))
    grid = (T, triton.cdiv(S, block))
    _mqa_logits_kernel[grid](
        q8, q8.stride(0), q8.stride(1),
        k8, k8.stride(0), k_scale, k_scale.stride(0),
        weights, weights.stride(0),
        ks, ke,
        out, out.stride(0), S,
        NUM_HEADS=H, H_PAD=_heads_pad(H), BLOCK=block, IS_FNUZ=tgt.main_cache_is_fnuz, HW_FP8=_hw_fp8(tgt),
        num_warps=4,
    )
    return out


# ---------------------------------------------------------------------------------------------------------------
# Top-k
# ---------------------------------------------------------------------------------------------------------------

_INT64_MIN = -(2 ** 63)


def _rank_keys(logits: torch.Tensor, allowed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A unique int64 key per column whose order is the ranking (value, then the lower column), and the count of
    candidates per row. key = monotone(fp32 bits) * 2^32 + (2^32 - 1 - column); non-candidates get INT64_MIN."""
    R, W = logits.shape
    x = logits + 0.0  # -0.0 + 0.0 = +0.0: the two zeros are one value
    bits = x.contiguous().view(torch.int32).to(torch.int64)
    mono = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    col = torch.arange(W, device=logits.device, dtype=torch.int64)
    key = mono * (2 ** 32) + (2 ** 32 - 1 - col)[None, :]
    cand = ~(torch.isnan(logits) | (logits == float("-inf")))
    if allowed is not None:
        cand = cand & allowed
    key = torch.where(cand, key, torch.full_like(key, _INT64_MIN))
    return key, cand.sum(dim=1)


def _check_topk_args(logits, k, out) -> tuple[int, int]:
    require_tensor("logits", logits, torch.float32, dim=2)
    _positive_int("k", k)
    R = int(logits.shape[0])
    if out is not None:
        require_tensor("out", out, torch.int32, dim=2)
        if tuple(out.shape) != (R, k):
            raise ValueError(f"out: expected shape [{R}, {k}] (rows of logits, k), got {list(out.shape)}")
        if out.device != logits.device:
            raise ValueError(f"out: expected device {logits.device} (the device of logits), got {out.device}")
    return R, int(logits.shape[1])


def _fill_topk(key: torch.Tensor, count: torch.Tensor, k: int, out, device, offset=None) -> torch.Tensor:
    R, W = key.shape
    if out is None:
        out = torch.empty(R, k, dtype=torch.int32, device=device)
    out.fill_(-1)
    n = min(k, W)
    if R == 0 or n == 0:
        return out
    top = torch.topk(key, n, dim=1, largest=True, sorted=True).indices
    if offset is not None:
        top = top - offset[:, None]
    valid = torch.arange(n, device=device)[None, :] < count[:, None]
    out[:, :n] = torch.where(valid, top.to(torch.int32), out[:, :n])
    return out


def topk_indices(logits, k, *, out=None) -> torch.Tensor:
    """int32 ``[rows, k]``: each row's best min(k, count) columns (candidates: not -inf, not NaN), larger logit
    first, equal logits the lower column first; -1 in every later entry. ``out`` ([rows, k] int32, any strides) is
    filled with -1 first and written in place."""
    _check_topk_args(logits, k, out)
    key, count = _rank_keys(logits)
    return _fill_topk(key, count, k, out, logits.device)


def topk_indices_prefill(logits, ks, ke, k, *, out=None) -> torch.Tensor:
    """The prefill top-k: row r ranks only columns in [ks[r], ke[r]) (as :func:`topk_indices`) and returns them
    relative to ks[r] (local to the request's first gathered key); -1 past the count."""
    R, W = _check_topk_args(logits, k, out)
    for name, t in (("ks", ks), ("ke", ke)):
        require_tensor(name, t, INT_DTYPES, dim=1)
        if t.shape[0] != R:
            raise ValueError(f"{name}: expected {R} entries (one per row of logits), got {t.shape[0]}")
        if t.device != logits.device:
            raise ValueError(f"{name}: expected device {logits.device} (the device of logits), got {t.device}")
    lo, hi = ks.to(torch.int64), ke.to(torch.int64)
    lo_h, hi_h = lo.cpu(), hi.cpu()
    bad = (lo_h < 0) | (hi_h > W) | (lo_h > hi_h)
    if bool(bad.any()):
        r = int(bad.nonzero()[0])
        raise ValueError(f"ks/ke: row {r} has the range [{int(lo_h[r])}, {int(hi_h[r])}); expected "
                         f"0 <= ks <= ke <= {W} (the columns of logits)")
    col = torch.arange(W, device=logits.device)[None, :]
    allowed = (col >= lo[:, None]) & (col < hi[:, None])
    key, count = _rank_keys(logits, allowed)
    return _fill_topk(key, count, k, out, logits.device, offset=lo)
