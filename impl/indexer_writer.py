"""Indexer-K cache writers (SPEC 1.3, 4 "Indexer variant"): the DSv3.2 direct writer and the DSv4 head-128 compressor.

Both write one token per slot of the indexer-K cache, whose blocks are ``[bs * 128 fp8][bs * 4 scale]`` (132 B per
token, :class:`impl.formats.IndexerKLayout`; NORMAL token-major or SHUFFLE 16-token x 16-byte tiles), or, for the
MXFP4 variant, ``[bs * 64 packed E2M1][bs * 4 UE8M0]`` (68 B per token, always token-major: byte p of a token holds
element 2p in its low nibble and element 2p+1 in its high nibble, scale byte b covers elements 32b..32b+31). Blocks
are addressed with ``cache.stride(0)`` (a view into a shared pool) in int64.

* :func:`indexer_k_quant_and_cache` (DSv3.2, vLLM's ``indexer_k_quant_and_cache_triton``): ``k [T, 128]`` rows
  quantized as one fp8 block each with an fp32 scale.
* :func:`compress_norm_rope_store_indexer` (DSv4 C4A): pool the compressor state window (the head-512 compressor's
  pooling, :func:`impl.compressor.pool_window_rows`, with its NaN rules), RMSNorm, GPT-J RoPE on dims 64..127 FIRST,
  then quantize the whole 128-wide row: FP8 with a power-of-two fp32 scale, or MXFP4.

One-block fp8 quantization (both writers; SPEC 1.3; ``DIV`` = 448 for OCP, 224 for FNUZ, the divisor upstream uses
for each flavour):
  amax  = max |x| over the row's non-NaN values (+-inf included), so the result does not depend on a backend's max
          semantics (Triton's max ignores NaN on GPUs and propagates it on the interpreter);
  scale = max(amax, 1e-4) / DIV, correctly rounded fp32 division;
  POW2 (``scale_fmt == "ue8m0"``, and always for the compressor): scale = 2^ceil(log2(scale)), exact, from bits;
  q     = x / scale, correctly rounded; byte = e4m3(q) of the flavour, round-to-nearest-even, saturating (NaN -> the
          NaN code; FNUZ has no -0, so -0 -> 0x00);
  stored scale: the fp32 value (4 little-endian bytes), or, with ``mx_scale`` (compressor only; upstream's
          ``MX_SCALE`` for SM100 readers), its exponent byte repeated four times.
  [inferred] a row holding +-inf has scale +inf: its finite values store +-0 and the infinities the NaN code (inf /
  inf), so every reader sees the token as non-finite rather than as plausible values.
MXFP4 (32-wide blocks, OCP MX): amax over the block's non-NaN values, floored at 6 * 2^-126; e = clamp(ceil(log2(amax
/ 6)), -127, 127), code = e + 127; nibble = E2M1(x * 2^-e), round-to-nearest-even on {0, .5, 1, 1.5, 2, 3, 4, 6},
saturating at 6, sign bit kept (-0 is 0x8). [inferred] a block holding a NaN stores code 255 (E8M0's NaN: the whole
block is NaN, OCP MX 1.0) and zero nibbles; +-inf saturates (code 254, nibble 6, which readers decode to +-inf).

Fp8 flavour: the target's platform fp8 (``target.main_cache_fp8``, FNUZ on gfx942), for both writers: the indexer-K
readers (cp-gather, the MQA logits) take the cache as the platform's fp8 type. (Upstream's head-128 compressor writes
OCP e4m3 / 448 on every platform; see FINDINGS.md IW2.)

Layouts: the direct writer takes ``layout`` (``None``: :func:`impl.formats.default_indexer_layout`, NORMAL when bs == 1
and SHUFFLE otherwise, which needs bs % 16 == 0). The compressor defaults to the ratio's layout
(:func:`impl.prefill_assembly.indexer_k_layout_for_ratio`): NORMAL, since the indexer exists for C4A layers only and
C4A's indexer cache is block-flat; SHUFFLE (bs % 16 == 0) may be asked for explicitly for FP8.

``intermediates`` (compressor, optional fp32 ``[T, 128]``) receives every writing token's fp32 row right before
quantization: the normed NoPE dims and the rotated RoPE dims, before the bf16 rounding. The contract
``indexer-writer-exact`` compares it with the oracle's within a derived tolerance and then demands that the oracle's
quantization of it reproduces the cache bytes exactly.

Bad input raises ValueError/TypeError naming the argument before any kernel runs; the cache is then untouched.
"""
from __future__ import annotations


import torch
import triton
import triton.language as tl

from impl import formats
from impl.cache_writers import check_slot_mapping, require_kernel_device, require_tensor
from impl.compressor import (check_intermediates_and_devices, check_window_inputs, check_window_tables,
                             pool_window_rows)
from impl.prefill_assembly import indexer_k_layout_for_ratio
from impl.targets import Target, get_target
from impl.triton_helpers import bf16_round, fp8_encode_bits, load_as_f32

HEAD = formats.INDEXER_HEAD_DIM  # 128
ROPE = 64
NOPE = HEAD - ROPE
TOKEN_BYTES = formats.INDEXER_TOKEN_BYTES  # 132
#: divisor of the fp8 scale per flavour (SPEC 1.3: max(amax, 1e-4) / 448 OCP, / 224 FNUZ)
FP8_SCALE_DIVISOR = {"ocp": 448.0, "fnuz": 224.0}
SCALE_FORMATS = (None, "ue8m0")
KV_FORMATS = ("fp8", "mxfp4")
MXFP4_BLOCK = 32
MXFP4_DATA_BYTES = HEAD // 2  # 64 packed bytes per token
MXFP4_SCALE_BYTES = HEAD // MXFP4_BLOCK  # 4 UE8M0 codes per token
MXFP4_TOKEN_BYTES = MXFP4_DATA_BYTES + MXFP4_SCALE_BYTES  # 68
#: the indexer exists for C4A layers only (SPEC 1.3)
SUPPORTED_RATIOS = (4,)
#: window rows pooled per loop step (the compressor's)
ROWS_PER_STEP = 8
#: what these writers can write ("default": the writer picks the layout); contracts draw only the variants a subject
#: names here (an adapter of another implementation may offer less)
VARIANTS = {"direct_layouts": ("default", "normal", "shuffle"), "compressor_formats": KV_FORMATS,
            "compressor_layouts": ("default", "normal", "shuffle"), "mx_scale": (False, True)}


def window_rows(ratio: int) -> int:
    return (2 if ratio == 4 else 1) * ratio


def state_row_width(ratio: int) -> int:
    """fp32 values per state row: [kv | score], each coff * 128 (coff = 2 for ratio 4)."""
    return 2 * (2 if ratio == 4 else 1) * HEAD


def compressor_layout(ratio: int, layout: "str | None" = None, block_size: "int | None" = None) -> str:
    """The layout the compressor writes: the one given, else the ratio's (:func:`impl.prefill_assembly.
    indexer_k_layout_for_ratio`: NORMAL for C4A, whose indexer cache is block-flat)."""
    if layout is None:
        return indexer_k_layout_for_ratio(ratio, block_size)
    return _layout_name(layout)


# ---------------------------------------------------------------------------------------------------------------
# Triton device functions
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def ceil_log2_normal(s):
    """Exact ceil(log2(s)) as int32 for a positive normal float32 s, 128 for +inf (no subnormal branch: the scales
    here are >= 1e-4 / 448 and >= 2^-126; :func:`impl.triton_helpers.ceil_log2_bits` is the general one)."""
    bits = s.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    return (bits >> 23) - 127 + ((bits & 0x7FFFFF) != 0).to(tl.int32)


@triton.jit
def pow2_at_least(s):
    """2^ceil(log2(s)) for float32 s >= 2^-126 (normal) or +inf (-> +inf), exact, built from bits."""
    k = ceil_log2_normal(s)
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def quantize_fp8_block(x, DIV: tl.constexpr, IS_FNUZ: tl.constexpr, POW2: tl.constexpr):
    """One fp8 block over a whole ``[G, 64]`` fp32 tile (the module docstring's rule). Returns (codes uint8 [G, 64],
    scale fp32 scalar)."""
    ax = tl.where(x == x, tl.abs(x), 0.0)
    amax = tl.max(tl.max(ax, axis=1), axis=0)
    scale = tl.math.div_rn(tl.maximum(amax, 1e-4), DIV)
    if POW2:
        scale = pow2_at_least(scale)
    q = tl.math.div_rn(x, tl.zeros_like(x) + scale)
    return fp8_encode_bits(q, IS_FNUZ), scale


@triton.jit
def store_u32_bytes(dst, word):
    """Store an int32 ``word`` as 4 little-endian bytes at the byte pointer ``dst`` (any alignment)."""
    j = tl.arange(0, 4)
    tl.store(dst + j, ((word >> (8 * j)) & 0xFF).to(tl.uint8))


@triton.jit
def token_element_offsets(pos, d, SHUFFLE: tl.constexpr):
    """Offsets of a token's 128 fp8 bytes within its block: NORMAL pos*128 + d; SHUFFLE (16 x 16 B tiles)
    (pos//16)*2048 + (d//16)*256 + (pos%16)*16 + d%16 (SPEC 1.3)."""
    if SHUFFLE:
        return (pos // 16) * (16 * 128) + (d // 16) * 256 + (pos % 16) * 16 + d % 16
    else:
        return pos * 128 + d


@triton.jit
def e2m1_encode(x):
    """fp32 -> E2M1 nibble (int32): round-to-nearest-even on {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (+-inf
    included), sign bit 8 kept for -0. NaN gives 0 here (the caller's block rule decides)."""
    a = tl.abs(x)
    mag = ((a > 0.25).to(tl.int32) + (a >= 0.75).to(tl.int32) + (a > 1.25).to(tl.int32)
           + (a >= 1.75).to(tl.int32) + (a > 2.5).to(tl.int32) + (a >= 3.5).to(tl.int32) + (a > 5.0).to(tl.int32))
    neg = (x.to(tl.int32, bitcast=True) < 0) & (x == x)
    return tl.where(neg, mag | 8, mag)


@triton.jit
def quantize_mxfp4_blocks(x):
    """MXFP4 of a ``[4, 32]`` fp32 tile (row b = elements 32b..32b+31; module docstring). Returns (nibbles int32
    [4, 32], codes int32 [4])."""
    finite_or_inf = x == x
    amax = tl.max(tl.where(finite_or_inf, tl.abs(x), 0.0), axis=1)
    has_nan = tl.max(tl.where(finite_or_inf, 0, 1), axis=1) > 0
    amax = tl.maximum(amax, 6.0 * (2.0 ** -126))
    e = ceil_log2_normal(tl.math.div_rn(amax, tl.zeros_like(amax) + 6.0))
    e = tl.minimum(tl.maximum(e, -127), 127)
    # 2^-e from bits: -e in [-127, 126]; 2^-127 is the fp32 subnormal 1 << 22
    k = -e
    mult = tl.where(k >= -126, (k + 127) << 23, 1 << 22).to(tl.float32, bitcast=True)
    nib = e2m1_encode(x * mult[:, None])
    nib = tl.where(has_nan[:, None], 0, nib)
    codes = tl.where(has_nan, 255, e + 127)
    return nib, codes


# do_not_specialize: block_size only splits a slot into block and position (bs*128 is a multiple of 16 whatever bs is)
@triton.jit(do_not_specialize=["block_size"])
def _indexer_k_quant_kernel(k_ptr, k_row_stride, slot_ptr, cache_ptr, cache_block_stride, block_size,
                            IN_BF16: tl.constexpr, DIV: tl.constexpr, IS_FNUZ: tl.constexpr, POW2: tl.constexpr,
                            SHUFFLE: tl.constexpr):
    """Grid ``(T,)``: program t quantizes row t of ``k [T, 128]`` (bf16 read as raw words, or fp32) as one fp8
    block and stores it at slot ``slot_mapping[t]`` (skipped when < 0).

    Layout: block = slot // bs at ``block * cache_block_stride`` (int64), pos = slot % bs; fp8 bytes at
    :func:`token_element_offsets`, the fp32 scale's 4 bytes at bs*128 + 4*pos. Invariant: writing slots are unique
    and in range (host-checked), so programs write disjoint bytes and nothing outside their token's record."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        g = tl.arange(0, 2)[:, None]
        d = g * 64 + tl.arange(0, 64)[None, :]
        x = load_as_f32(k_ptr + t * k_row_stride + d, d < 128, IN_BF16)
        codes, scale = quantize_fp8_block(x, DIV, IS_FNUZ, POW2)
        blk = slot // block_size
        pos = slot % block_size
        base = cache_ptr + blk * cache_block_stride
        tl.store(base + token_element_offsets(pos, d, SHUFFLE), codes)
        store_u32_bytes(base + block_size * 128 + 4 * pos, scale.to(tl.int32, bitcast=True))


# do_not_specialize: state_block_size and block_size only split a position / slot into block and row: nothing gains
# from their specialization; the strides keep theirs
@triton.jit(do_not_specialize=["state_block_size", "block_size"])
def _indexer_compress_kernel(
        state_ptr, st_block_stride, st_row_stride, bt_ptr, bt_row_stride, state_block_size, req_ptr, pos_ptr,
        slot_ptr, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride, block_size, eps, inter_ptr,
        STORE_INTER: tl.constexpr, RATIO: tl.constexpr, R: tl.constexpr, COFF: tl.constexpr, ROWS: tl.constexpr,
        W_BF16: tl.constexpr, MXFP4: tl.constexpr, DIV: tl.constexpr, IS_FNUZ: tl.constexpr,
        SHUFFLE: tl.constexpr, MX_SCALE: tl.constexpr):
    """Grid ``(T,)``: one program per token; only tokens with slot >= 0 and (pos + 1) % RATIO == 0 write.

    Pools the R window rows into a ``[2, 64]`` fp32 tile (dims 64*g + l), RMSNorm over 128 dims, GPT-J RoPE on
    group 1 (dims 64..127, pairs (64+2j, 65+2j), cos/sin row (pos // RATIO) * RATIO; NoPE dims untouched), then the
    FP8 block (NORMAL or SHUFFLE, fp32 or 4 x UE8M0 scale) or the MXFP4 blocks (68-byte token-major records).
    Invariant: writing slots are unique (host-checked), so programs write disjoint bytes; offsets are int64."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & ((pos + 1) % RATIO == 0):
        req = tl.load(req_ptr + t).to(tl.int64)
        m, s, acc = pool_window_rows(state_ptr, st_block_stride, st_row_stride, bt_ptr + req * bt_row_stride,
                                     state_block_size, pos, 0, R, RATIO, R, COFF, ROWS, 128, 2)
        c = acc / s
        g = tl.arange(0, 2)[:, None]
        dim = g * 64 + tl.arange(0, 64)[None, :]
        ms = tl.sum(tl.sum(c * c, axis=1), axis=0) / 128.0
        r = tl.math.rsqrt(ms + eps)
        normed = c * r * load_as_f32(w_ptr + dim, dim < 128, W_BF16)

        # RoPE first: rotate the pairs of group 1 (dims 64..127); group 0 (NoPE) keeps its values bit for bit
        ev, od = tl.split(tl.reshape(normed, [2, 32, 2]))
        pair = tl.arange(0, 32)
        cs_row = cs_ptr + ((pos // RATIO) * RATIO) * cs_row_stride
        cos = tl.load(cs_row + pair)[None, :]
        sin = tl.load(cs_row + 32 + pair)[None, :]
        is_rope = tl.arange(0, 2)[:, None] == 1
        ev_r = tl.where(is_rope, ev * cos - od * sin, ev)
        od_r = tl.where(is_rope, od * cos + ev * sin, od)
        row = tl.reshape(tl.join(ev_r, od_r), [2, 64])
        if STORE_INTER:
            tl.store(inter_ptr + t * 128 + dim, row)

        xb = bf16_round(row)
        blk = slot // block_size
        in_block = slot % block_size
        base = cache_ptr + blk * cache_block_stride
        if MXFP4:
            nib, codes = quantize_mxfp4_blocks(tl.reshape(xb, [4, 32]))
            lo, hi = tl.split(tl.reshape(nib, [64, 2]))
            tl.store(base + in_block * 64 + tl.arange(0, 64), (lo | (hi << 4)).to(tl.uint8))
            tl.store(base + block_size * 64 + in_block * 4 + tl.arange(0, 4), codes.to(tl.uint8))
        else:
            codes, scale = quantize_fp8_block(xb, DIV, IS_FNUZ, True)
            tl.store(base + token_element_offsets(in_block, dim, SHUFFLE), codes)
            bits = scale.to(tl.int32, bitcast=True)
            if MX_SCALE:
                bits = ((bits >> 23) & 0xFF) * 0x01010101
            store_u32_bytes(base + block_size * 128 + 4 * in_block, bits)


# ---------------------------------------------------------------------------------------------------------------
# Host-side validation
# ---------------------------------------------------------------------------------------------------------------

def _layout_name(layout) -> str:
    if not isinstance(layout, str) or layout.lower() not in ("normal", "shuffle"):
        raise ValueError(f"layout: expected 'normal', 'shuffle' or None, got {layout!r}")
    return layout.lower()


def _check_indexer_cache(cache, layout: str) -> formats.IndexerKLayout:
    try:
        return formats.check_indexer_k_cache(cache, layout)
    except ValueError as exc:
        msg = str(exc)
        raise ValueError(msg if msg.startswith("cache") or msg.startswith("block_size") else f"cache: {msg}") from None


def _check_mxfp4_cache(cache) -> int:
    require_tensor("cache", cache, (torch.uint8,))
    if cache.dim() != 3 or cache.shape[2] != MXFP4_TOKEN_BYTES:
        raise ValueError(f"cache: expected shape [num_blocks, block_size, {MXFP4_TOKEN_BYTES}] for the MXFP4 "
                         f"indexer cache, got {list(cache.shape)}")
    if cache.stride(2) != 1 or cache.stride(1) != MXFP4_TOKEN_BYTES:
        raise ValueError(f"cache: each block must be contiguous, got strides {list(cache.stride())}")
    if cache.shape[1] < 1:
        raise ValueError(f"cache: expected a block size >= 1, got {cache.shape[1]}")
    return int(cache.shape[1])


def check_indexer_slots(slot_mapping, num_tokens: int, num_slots: int, writes=None,
                        name: str = "slot_mapping") -> list[int]:
    """:func:`impl.cache_writers.check_slot_mapping` with upstream's indexer rule: a negative entry skips its
    token."""
    return check_slot_mapping(slot_mapping, num_tokens, num_slots, writes=writes, name=name,
                              any_negative_skips=True)


def _flavour(tgt: Target):
    fl = formats.fp8_flavour(tgt.main_cache_fp8)
    return fl, FP8_SCALE_DIVISOR[fl.name]


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------

def indexer_k_quant_and_cache(k: torch.Tensor, cache: torch.Tensor, slot_mapping: torch.Tensor, *,
                              scale_fmt: "str | None" = None, layout: "str | None" = None,
                              target: "Target | str | None" = None) -> None:
    """Quantize ``k [T, 128]`` (bf16 or fp32) into the indexer-K ``cache [num_blocks, bs, 132]`` uint8 in place.

    One fp8 block of 128 per token (module docstring): scale max(amax, 1e-4) / 448 (OCP) or / 224 (FNUZ, the
    target's ``main_cache_fp8``), rounded up to a power of two when ``scale_fmt == "ue8m0"``, stored as fp32.
    ``slot_mapping`` int64 ``[T]``: a negative entry skips its token. ``layout``: "normal", "shuffle" or None
    (:func:`impl.formats.default_indexer_layout`). Every byte outside the written tokens' records is left as it was.
    """
    tgt = get_target(target)
    if scale_fmt not in SCALE_FORMATS:
        raise ValueError(f"scale_fmt: expected None or 'ue8m0', got {scale_fmt!r}")
    require_tensor("k", k, (torch.bfloat16, torch.float32), dim=2)
    if k.shape[1] != HEAD:
        raise ValueError(f"k: expected shape [T, {HEAD}], got {list(k.shape)}")
    if k.shape[0] and k.stride(1) != 1:
        raise ValueError(f"k: the last dimension must be contiguous, got strides {list(k.stride())}")
    require_tensor("cache", cache, (torch.uint8,))
    if cache.dim() != 3:
        raise ValueError(f"cache: expected shape [num_blocks, block_size, {TOKEN_BYTES}], got {list(cache.shape)}")
    lay_name = formats.default_indexer_layout(int(cache.shape[1])) if layout is None else _layout_name(layout)
    lay = _check_indexer_cache(cache, lay_name)
    require_tensor("slot_mapping", slot_mapping, (torch.int64,), dim=1)
    require_kernel_device(k=k, cache=cache, slot_mapping=slot_mapping)
    check_indexer_slots(slot_mapping, k.shape[0], cache.shape[0] * lay.block_size)
    T = k.shape[0]
    if T == 0:
        return
    fl, div = _flavour(tgt)
    in_bf16 = k.dtype == torch.bfloat16
    _indexer_k_quant_kernel[(T,)](
        k.view(torch.int16) if in_bf16 else k, k.stride(0), slot_mapping, cache, cache.stride(0), lay.block_size,
        IN_BF16=in_bf16, DIV=div, IS_FNUZ=fl.is_fnuz, POW2=scale_fmt == "ue8m0", SHUFFLE=lay.layout == "shuffle",
    )


def _validate_compressor(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight,
                         cos_sin_cache, cache, ratio, eps, kv_format, layout, mx_scale, intermediates):
    if kv_format not in KV_FORMATS:
        raise ValueError(f"kv_format: expected one of {KV_FORMATS}, got {kv_format!r}")
    if not isinstance(mx_scale, bool):
        raise TypeError(f"mx_scale: expected a bool, got {type(mx_scale).__name__}")
    if kv_format == "mxfp4" and mx_scale:
        raise ValueError("mx_scale: only for the fp8 cache (MXFP4 always stores UE8M0 codes)")
    T = check_window_inputs(state, state_block_table, token_to_req, positions, norm_weight, cos_sin_cache,
                            ratio=ratio, eps=eps, head=HEAD,
                            width=state_row_width(ratio) if ratio in SUPPORTED_RATIOS else 0,
                            ratios=SUPPORTED_RATIOS, ratio_words="the indexer is C4A's")
    if kv_format == "mxfp4":
        if layout is not None and _layout_name(layout) != "normal":
            raise ValueError(f"layout: the MXFP4 indexer cache is token-major ('normal'), got {layout!r}")
        lay_name = "normal"
        bs = _check_mxfp4_cache(cache)
    else:
        require_tensor("cache", cache, (torch.uint8,))
        if cache.dim() != 3:
            raise ValueError(f"cache: expected shape [num_blocks, block_size, {TOKEN_BYTES}], got "
                             f"{list(cache.shape)}")
        lay_name = compressor_layout(ratio, layout, int(cache.shape[1]) or None)
        bs = _check_indexer_cache(cache, lay_name).block_size
    require_tensor("slot_mapping", slot_mapping, (torch.int64,), dim=1)
    check_intermediates_and_devices(T, HEAD, intermediates, state=state, state_block_table=state_block_table,
                                    token_to_req=token_to_req, positions=positions, slot_mapping=slot_mapping,
                                    norm_weight=norm_weight, cos_sin_cache=cos_sin_cache, cache=cache)

    pos = positions.detach().cpu()
    if T and int(pos.min()) < 0:
        raise ValueError(f"positions: expected >= 0, got {int(pos.min())}")
    if slot_mapping.shape[0] != T:
        raise ValueError(f"slot_mapping: expected {T} entries (one per token), got {slot_mapping.shape[0]}")
    slots = slot_mapping.detach().cpu()
    writes = ((slots >= 0) & ((pos + 1) % ratio == 0)).tolist() if T else []
    check_indexer_slots(slot_mapping, T, cache.shape[0] * bs, writes=writes)
    check_window_tables(state, state_block_table, token_to_req, cos_sin_cache, pos, writes, ratio)
    return lay_name, bs


def compress_norm_rope_store_indexer(state: torch.Tensor, state_block_table: torch.Tensor,
                                     token_to_req: torch.Tensor, positions: torch.Tensor, slot_mapping: torch.Tensor,
                                     norm_weight: torch.Tensor, cos_sin_cache: torch.Tensor, cache: torch.Tensor, *,
                                     ratio: int = 4, eps: float = 1e-6, kv_format: str = "fp8",
                                     layout: "str | None" = None, mx_scale: bool = False,
                                     target: "Target | str | None" = None,
                                     intermediates: torch.Tensor | None = None) -> None:
    """The head-128 compressor (SPEC 4 "Indexer variant"): one row per ``ratio`` tokens into the indexer-K cache.

    Arguments as :func:`impl.compressor.compress_norm_rope_store`'s (state rows ``[kv | score]`` of coff * 128 each,
    the state block table, ``token_to_req``, ``positions``, ``slot_mapping``; ``norm_weight [128]``;
    ``cos_sin_cache [max_pos, 64]``), plus ``kv_format`` ("fp8": ``cache [nb, bs, 132]``, "mxfp4":
    ``cache [nb, bs, 68]``), ``layout`` (fp8 only; None = NORMAL, C4A's block-flat layout), ``mx_scale`` (fp8 only:
    store the power-of-two scale as four UE8M0 bytes) and ``intermediates`` (module docstring). Only tokens with
    ``slot_mapping[t] >= 0`` and ``(pos + 1) % ratio == 0`` write.
    """
    tgt = get_target(target)
    lay_name, bs = _validate_compressor(state, state_block_table, token_to_req, positions, slot_mapping,
                                        norm_weight, cos_sin_cache, cache, ratio, eps, kv_format, layout, mx_scale,
                                        intermediates)
    T = positions.shape[0]
    if T == 0:
        return
    fl, div = _flavour(tgt)
    w_bf16 = norm_weight.dtype == torch.bfloat16
    inter = intermediates if intermediates is not None else cache  # never written when STORE_INTER is False
    _indexer_compress_kernel[(T,)](
        state, state.stride(0), state.stride(1), state_block_table, state_block_table.stride(0), state.shape[1],
        token_to_req, positions, slot_mapping, norm_weight.view(torch.int16) if w_bf16 else norm_weight,
        cos_sin_cache, cos_sin_cache.stride(0), cache, cache.stride(0), bs, float(eps), inter,
        STORE_INTER=intermediates is not None, RATIO=ratio, R=window_rows(ratio), COFF=2 if ratio == 4 else 1,
        ROWS=ROWS_PER_STEP, W_BF16=w_bf16, MXFP4=kv_format == "mxfp4", DIV=div, IS_FNUZ=fl.is_fnuz,
        SHUFFLE=lay_name == "shuffle", MX_SCALE=mx_scale,
    )
