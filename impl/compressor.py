"""DSv4 compressor writer ``compress_norm_rope_store`` (head 512): pool ``ratio`` state rows into one compressed row,
RMSNorm it, quantize its NoPE part, rotate its RoPE part and store it into the compressed ("extra") ``fp8_ds_mla``
cache. SPEC section 4 steps 1-6; a single-pass kernel and, for ratio 128 prefill, a two-stage variant.

Interfaces SPEC leaves open, defined here (the oracle takes the same inputs):

* State rows [inferred]. ``state`` is fp32 ``[num_state_blocks, state_block_size, 2*coff*512]`` (coff = 2 for
  ratio 4, 1 for ratio 128; SPEC 1.3: rows ``[kv | score]``, state block size 4 for C4 and 8 for C128, any size is
  accepted). Token t belongs to request ``token_to_req[t]``; position p of request r is the row
  ``state[state_block_table[r, p // state_block_size], p % state_block_size]``. The table may map several
  positions to one block (a ring); only the rows of the window are read.
* Window. A token at position ``pos`` pools R = (1 + overlap) * ratio rows, positions pos-R+1 .. pos, overlap =
  (ratio == 4). Row i (0-based in the window) reads kv ``row[h*512 : h*512+512]`` and score
  ``row[coff*512 + h*512 : ...]`` with h = (i >= ratio) (SPEC: rows >= ratio read the second halves). Positions < 0
  give score -inf and kv 0 and are not read.
* APE [inferred]. SPEC 1.3 says the ``ape [ratio, coff*512]`` table is added when rows are saved into the state
  ("fused APE addition"); this writer therefore reads rows that already include it and takes no ``ape`` argument.
* cos/sin table. ``cos_sin_cache`` is fp32 ``[max_pos, 64]``: row p holds cos in [0:32] and sin in [32:64] for the
  32 GPT-J pairs (SPEC 4 step 5); the row used is (pos // ratio) * ratio.
* Norm weight: ``norm_weight [512]`` fp32 or bf16 (read as fp32); ``eps`` is ``rms_norm_eps``.

Per-dimension softmax, NaN rules [inferred, identical in both variants and the oracle]: the running max ignores NaN
scores; a row with score -inf has weight 0 (so an all -inf dimension gives 0/0 = NaN, and a non-finite kv there
gives kv * 0 = NaN); any NaN or +inf score makes the dimension NaN. A +-inf kv in a row with a finite score adds
+-inf to the dimension whatever its fp32 weight rounds to (its exact weight is positive; +inf and -inf together give
NaN): its weight exp(score - max) may underflow to 0 under one running or split max and not under another, and a
plain product kv * weight would make the NaN mask depend on the summation order. Infinite partial sums are therefore
never rescaled (inf * 0 would be NaN). Sums are fp32 in row chunks (online softmax), so the two variants differ only
in rounding.

Only tokens with ``slot_mapping[t] >= 0`` and ``(pos + 1) % ratio == 0`` write. The extra cache is OCP e4m3 on every
target; the UE8M0 cap is ``target.writer_scale_code_cap`` and ``target.sanitizes_writer`` turns on SANITIZE (see
:mod:`impl.cache_writers` for the group quantizer): non-finite NoPE values become 0, RoPE lanes that are NaN or
+-inf after rounding to bf16 become 0 (the seed's prose "NaN/Inf -> 0"; upstream's code clears NaN only, see
FINDINGS.md).

``intermediates`` (optional fp32 ``[T, 512]``) receives, for every writing token, the kernel's fp32 row right before
quantization: the normed NoPE values (before bf16 rounding) and the rotated RoPE values (before bf16 rounding and
sanitizing). The writer-oracle contract compares those within a derived tolerance, then re-quantizes them with the
oracle and demands byte equality (DESIGN.md "Oracles").
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from impl import formats
from impl.triton_helpers import bf16_round
from impl.cache_writers import (HEAD, check_cache, check_slot_mapping, quantize_nope_groups, require_kernel_device,
                                require_contiguous_vector, require_tensor, store_bf16_bytes)
from impl.targets import Target, effective_cu_count, get_target

SUPPORTED_RATIOS = (4, 128)
#: rows pooled per loop step (a [ROWS, 8, 64] fp32 tile)
ROWS_PER_STEP = 8
#: upper bound of the two-stage split count (SPEC 4)
TWO_STAGE_MAX_SPLITS = 16


def window_rows(ratio: int) -> int:
    return (2 if ratio == 4 else 1) * ratio


def state_row_width(ratio: int) -> int:
    return 2 * (2 if ratio == 4 else 1) * HEAD


def num_two_stage_splits(num_tokens: int, ratio: int, target: "Target | str | None" = None) -> int:
    """SPEC 4: the largest power of two <= min(ceil(CU / (T / ratio)), 16), with CU from the target."""
    if num_tokens < 1:
        raise ValueError(f"num_tokens: expected >= 1, got {num_tokens}")
    cu = effective_cu_count(get_target(target))
    want = min(-(-cu * ratio // num_tokens), TWO_STAGE_MAX_SPLITS)
    return 1 << (max(want, 1).bit_length() - 1)


# ---------------------------------------------------------------------------------------------------------------
# Triton device functions
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def _rescale(acc, f):
    """``acc * f`` except that +-inf stays +-inf when f is 0 (an underflowed rescale must not turn it into NaN)."""
    return tl.where(tl.abs(acc) == float("inf"), acc, acc * f)


@triton.jit
def pool_window_rows(state_ptr, st_block_stride, st_row_stride, bt_row, state_block_size, pos, row_begin, row_end,
                     RATIO: tl.constexpr, R: tl.constexpr, COFF: tl.constexpr, ROWS: tl.constexpr,
                     HEAD_DIM: tl.constexpr, GROUPS: tl.constexpr):
    """Online per-dimension softmax over window rows [row_begin, row_end) (a multiple of ROWS apart) of a state whose
    rows are ``[kv (COFF*HEAD_DIM) | score (COFF*HEAD_DIM)]``, HEAD_DIM = GROUPS * 64 (512 here, 128 for the indexer
    variant in :mod:`impl.indexer_writer`).

    Returns ``(m, s, acc)``, each ``[GROUPS, 64]`` fp32 (dimension d = 64*g + l): m the NaN-ignoring running max, s the
    sum of exp(score - m), acc the sum of kv * exp(score - m) (a +-inf kv of a row with score > -inf adds +-inf
    whatever its weight, and +-inf sums are not rescaled: the NaN rules of the module docstring). Rows at positions
    < 0 are masked (score -inf, kv 0)."""
    g = tl.arange(0, GROUPS)[None, :, None]
    lane = tl.arange(0, 64)[None, None, :]
    dim = g * 64 + lane
    m = tl.full([GROUPS, 64], float("-inf"), tl.float32)
    s = tl.zeros([GROUPS, 64], tl.float32)
    acc = tl.zeros([GROUPS, 64], tl.float32)
    for r0 in range(row_begin, row_end, ROWS):
        i = r0 + tl.arange(0, ROWS)
        p = pos - R + 1 + i
        valid = p >= 0
        p_safe = tl.where(valid, p, 0)
        blk = tl.load(bt_row + p_safe // state_block_size, mask=valid, other=0).to(tl.int64)
        row_off = blk * st_block_stride + (p_safe % state_block_size) * st_row_stride
        half = (i >= RATIO).to(tl.int64) * HEAD_DIM
        base = state_ptr + (row_off + half)[:, None, None] + dim
        v3 = valid[:, None, None]
        kv = tl.load(base, mask=v3, other=0.0)
        sc = tl.load(base + COFF * HEAD_DIM, mask=v3, other=float("-inf"))
        m_blk = tl.max(tl.where(sc == sc, sc, float("-inf")), axis=0)
        m_new = tl.maximum(m, m_blk)
        alpha = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_new))
        e = tl.where(sc == float("-inf"), 0.0, tl.exp(sc - m_new[None, :, :]))
        # +-inf kv of a live row counts as +-inf even where e underflowed to 0 (module docstring, NaN rules)
        kv_e = tl.where((sc != float("-inf")) & (tl.abs(kv) == float("inf")), kv, kv * e)
        s = s * alpha + tl.sum(e, axis=0)
        acc = _rescale(acc, alpha) + tl.sum(kv_e, axis=0)
        m = m_new
    return m, s, acc


@triton.jit
def _pool_rows(state_ptr, st_block_stride, st_row_stride, bt_row, state_block_size, pos, row_begin, row_end,
               RATIO: tl.constexpr, R: tl.constexpr, COFF: tl.constexpr, ROWS: tl.constexpr):
    """:func:`pool_window_rows` for head 512: ``(m, s, acc)`` as ``[8, 64]`` tiles."""
    return pool_window_rows(state_ptr, st_block_stride, st_row_stride, bt_row, state_block_size, pos, row_begin,
                            row_end, RATIO, R, COFF, ROWS, 512, 8)


@triton.jit
def _norm_rope_quant_store(c, t, pos, slot, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride,
                           block_size, eps, inter_ptr, STORE_INTER: tl.constexpr, RATIO: tl.constexpr,
                           CAP: tl.constexpr, SANITIZE: tl.constexpr):
    """Steps 3-6 for one compressed row ``c [8, 64]`` fp32: RMSNorm, NoPE quantization (bf16 rounding first),
    GPT-J RoPE at row (pos // RATIO) * RATIO of the cos/sin table, store at ``slot`` (int64 block offsets)."""
    g = tl.arange(0, 8)[:, None]
    dim = g * 64 + tl.arange(0, 64)[None, :]
    ms = tl.sum(tl.sum(c * c, axis=1), axis=0) / 512.0
    r = tl.math.rsqrt(ms + eps)
    normed = c * r * tl.load(w_ptr + dim).to(tl.float32)
    if STORE_INTER:
        tl.store(inter_ptr + t * 512 + dim, normed, mask=g < 7)

    blk = (slot // block_size).to(tl.int64)
    in_block = slot % block_size
    block_base = cache_ptr + blk * cache_block_stride
    data = block_base + in_block * 576
    scales = block_base + block_size * 576 + in_block * 8

    xb = bf16_round(normed)
    codes, scale_codes = quantize_nope_groups(xb, 448.0, False, CAP, SANITIZE)
    tl.store(data + dim, codes, mask=g < 7)
    gi = tl.arange(0, 8)
    tl.store(scales + gi, tl.where(gi < 7, scale_codes, 0).to(tl.uint8))

    # RoPE on dims 448..511: the pairs of group 7, taken out of the tile bit-exactly (an integer sum of one
    # non-zero row keeps -0.0 and NaN payloads, which a float sum would not)
    ev3, od3 = tl.split(tl.reshape(normed, [8, 32, 2]))
    g2 = tl.arange(0, 8)[:, None]
    ev = tl.sum(tl.where(g2 == 7, ev3.to(tl.int32, bitcast=True), 0), axis=0).to(tl.float32, bitcast=True)
    od = tl.sum(tl.where(g2 == 7, od3.to(tl.int32, bitcast=True), 0), axis=0).to(tl.float32, bitcast=True)
    pair = tl.arange(0, 32)
    cs_row = cs_ptr + ((pos // RATIO) * RATIO) * cs_row_stride
    cos = tl.load(cs_row + pair)
    sin = tl.load(cs_row + 32 + pair)
    ev_rot = ev * cos - od * sin
    od_rot = od * cos + ev * sin
    if STORE_INTER:
        tl.store(inter_ptr + t * 512 + 448 + 2 * pair, ev_rot)
        tl.store(inter_ptr + t * 512 + 449 + 2 * pair, od_rot)
    ev_b = bf16_round(ev_rot)
    od_b = bf16_round(od_rot)
    if SANITIZE:
        # NaN -> 0 (upstream's rule) and +-inf -> 0 (the seed's prose; upstream's code misses it, see FINDINGS.md);
        # bf16 rounding comes first because it turns fp32 values near the bf16 maximum into inf
        ev_b = tl.where(ev_b == ev_b, ev_b, 0.0)
        od_b = tl.where(od_b == od_b, od_b, 0.0)
        ev_b = tl.where(tl.abs(ev_b) == float("inf"), 0.0, ev_b)
        od_b = tl.where(tl.abs(od_b) == float("inf"), 0.0, od_b)
    store_bf16_bytes(data + 448 + 4 * pair, ev_b)
    store_bf16_bytes(data + 450 + 4 * pair, od_b)


# do_not_specialize: state_block_size and block_size only split a position / slot into block and row (bs*576 is a
# multiple of 16 whatever bs is): nothing gains from their specialization; the strides keep theirs
@triton.jit(do_not_specialize=["state_block_size", "block_size"])
def _compress_single_pass_kernel(
        state_ptr, st_block_stride, st_row_stride, bt_ptr, bt_row_stride, state_block_size, req_ptr, pos_ptr,
        slot_ptr, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride, block_size, eps, inter_ptr,
        STORE_INTER: tl.constexpr, RATIO: tl.constexpr, R: tl.constexpr, COFF: tl.constexpr, ROWS: tl.constexpr,
        CAP: tl.constexpr, SANITIZE: tl.constexpr):
    """Grid ``(T,)``: one program per token; only tokens with slot >= 0 and (pos + 1) % RATIO == 0 write.

    Pools the R window rows in ROWS-row steps (online softmax), then steps 3-6. Invariant: written slots are unique
    (host-checked), so programs write disjoint bytes; all cache and state offsets are int64."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & ((pos + 1) % RATIO == 0):
        req = tl.load(req_ptr + t).to(tl.int64)
        m, s, acc = _pool_rows(state_ptr, st_block_stride, st_row_stride, bt_ptr + req * bt_row_stride,
                               state_block_size, pos, 0, R, RATIO, R, COFF, ROWS)
        _norm_rope_quant_store(acc / s, t, pos, slot, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride,
                               block_size, eps, inter_ptr, STORE_INTER, RATIO, CAP, SANITIZE)


# do_not_specialize: state_block_size only splits a position into state block and row
@triton.jit(do_not_specialize=["state_block_size"])
def _compress_partial_kernel(
        state_ptr, st_block_stride, st_row_stride, bt_ptr, bt_row_stride, state_block_size, req_ptr, pos_ptr,
        slot_ptr, ws_ptr, RATIO: tl.constexpr, R: tl.constexpr, COFF: tl.constexpr, ROWS: tl.constexpr,
        SPLITS: tl.constexpr):
    """Two-stage, stage 1. Grid ``(T, SPLITS)``: program (t, j) pools window rows [j*R/SPLITS, (j+1)*R/SPLITS) of
    a writing token and stores (m, s, acc) to ``ws [T, SPLITS, 3, 512]`` fp32. Non-writing tokens store nothing."""
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & ((pos + 1) % RATIO == 0):
        req = tl.load(req_ptr + t).to(tl.int64)
        rows: tl.constexpr = R // SPLITS
        m, s, acc = _pool_rows(state_ptr, st_block_stride, st_row_stride, bt_ptr + req * bt_row_stride,
                               state_block_size, pos, j * rows, (j + 1) * rows, RATIO, R, COFF, ROWS)
        dim = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 64)[None, :]
        out = ws_ptr + (t * SPLITS + j) * 1536 + dim
        tl.store(out, m)
        tl.store(out + 512, s)
        tl.store(out + 1024, acc)


# do_not_specialize: block_size only splits a slot into block and position (bs*576 is a multiple of 16 whatever bs is)
@triton.jit(do_not_specialize=["block_size"])
def _compress_finalize_kernel(
        pos_ptr, slot_ptr, ws_ptr, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride, block_size, eps,
        inter_ptr, STORE_INTER: tl.constexpr, RATIO: tl.constexpr, SPLITS: tl.constexpr, CAP: tl.constexpr,
        SANITIZE: tl.constexpr):
    """Two-stage, stage 2. Grid ``(T,)``: merge the SPLITS partials of a writing token (max, then rescaled sums; a
    split with m = -inf contributes 0, a +-inf partial sum stays +-inf), then steps 3-6 exactly as the single pass, sanitizing included."""
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if (slot >= 0) & ((pos + 1) % RATIO == 0):
        dim = tl.arange(0, 8)[:, None] * 64 + tl.arange(0, 64)[None, :]
        part = ws_ptr + t * SPLITS * 1536 + dim
        m_all = tl.full([8, 64], float("-inf"), tl.float32)
        for j in tl.static_range(SPLITS):
            m_all = tl.maximum(m_all, tl.load(part + j * 1536))
        s = tl.zeros([8, 64], tl.float32)
        acc = tl.zeros([8, 64], tl.float32)
        for j in tl.static_range(SPLITS):
            m_j = tl.load(part + j * 1536)
            f = tl.where(m_j == float("-inf"), 0.0, tl.exp(m_j - m_all))
            s += tl.load(part + j * 1536 + 512) * f
            acc += _rescale(tl.load(part + j * 1536 + 1024), f)
        _norm_rope_quant_store(acc / s, t, pos, slot, w_ptr, cs_ptr, cs_row_stride, cache_ptr, cache_block_stride,
                               block_size, eps, inter_ptr, STORE_INTER, RATIO, CAP, SANITIZE)


# ---------------------------------------------------------------------------------------------------------------
# Host API
# ---------------------------------------------------------------------------------------------------------------

def check_window_inputs(state, state_block_table, token_to_req, positions, norm_weight, cos_sin_cache, *, ratio,
                        eps, head: int, width: int, ratios: tuple, ratio_words: str) -> int:
    """The compressor inputs every head size shares (the state of ``width``-float rows and its table, positions,
    requests, the norm weight of ``head`` lanes, the cos/sin table), checked before any launch; returns the token
    count."""
    if isinstance(ratio, bool) or not isinstance(ratio, int) or ratio not in ratios:
        raise ValueError(f"ratio: expected one of {ratios} ({ratio_words}), got {ratio!r}")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not (math.isfinite(eps) and eps >= 0):
        raise ValueError(f"eps: expected a finite float >= 0, got {eps!r}")
    require_tensor("state", state, (torch.float32,), dim=3)
    if state.shape[2] != width or state.stride(2) != 1:
        raise ValueError(f"state: expected [num_state_blocks, state_block_size, {width}] with contiguous rows for "
                         f"ratio {ratio}, got shape {list(state.shape)} strides {list(state.stride())}")
    if state.shape[0] < 1 or state.shape[1] < 1:
        raise ValueError(f"state: expected at least one block of at least one row, got {list(state.shape)}")
    require_tensor("state_block_table", state_block_table, (torch.int32, torch.int64), dim=2)
    if state_block_table.shape[1] and state_block_table.stride(1) != 1:
        raise ValueError("state_block_table: rows must be contiguous")
    require_tensor("positions", positions, (torch.int64,), dim=1)
    T = positions.shape[0]
    require_tensor("token_to_req", token_to_req, (torch.int32, torch.int64), dim=1)
    if token_to_req.shape[0] != T:
        raise ValueError(f"token_to_req: expected {T} entries (one per token), got {token_to_req.shape[0]}")
    require_contiguous_vector("positions", positions)
    require_contiguous_vector("token_to_req", token_to_req)
    require_tensor("norm_weight", norm_weight, (torch.float32, torch.bfloat16), dim=1)
    if norm_weight.shape[0] != head or norm_weight.stride(0) != 1:
        raise ValueError(f"norm_weight: expected a contiguous [{head}] vector, got {list(norm_weight.shape)}")
    require_tensor("cos_sin_cache", cos_sin_cache, (torch.float32,), dim=2)
    if cos_sin_cache.shape[1] != formats.DSV4_ROPE_DIM or cos_sin_cache.stride(1) != 1:
        raise ValueError(f"cos_sin_cache: expected [max_pos, {formats.DSV4_ROPE_DIM}] (cos 0:32, sin 32:64) with "
                         f"contiguous rows, got {list(cos_sin_cache.shape)}")
    return T


def check_intermediates_and_devices(T: int, head: int, intermediates, **tensors) -> None:
    """``intermediates`` (optional) is a contiguous fp32 ``[T, head]``; every tensor is on the kernel device."""
    if intermediates is not None:
        require_tensor("intermediates", intermediates, (torch.float32,), dim=2)
        if tuple(intermediates.shape) != (T, head) or not intermediates.is_contiguous():
            raise ValueError(f"intermediates: expected a contiguous [{T}, {head}] tensor, got "
                             f"{list(intermediates.shape)}")
        tensors["intermediates"] = intermediates
    require_kernel_device(**tensors)


def check_window_tables(state, state_block_table, token_to_req, cos_sin_cache, pos, writes, ratio: int) -> None:
    """For every writing token (host copies ``pos`` and ``writes``): its request is a row of the state block table,
    its RoPE row is in the cos/sin table, and its pooling window maps through columns and blocks that exist."""
    reqs = token_to_req.detach().cpu().to(torch.int64)
    table = state_block_table.detach().cpu().to(torch.int64)
    R = window_rows(ratio)
    sbs = state.shape[1]
    for t in [i for i, w in enumerate(writes) if w]:
        r, p = int(reqs[t]), int(pos[t])
        if not 0 <= r < table.shape[0]:
            raise ValueError(f"token_to_req: token {t} names request {r}, outside [0, {table.shape[0]})")
        rope_row = (p // ratio) * ratio
        if rope_row >= cos_sin_cache.shape[0]:
            raise ValueError(f"cos_sin_cache: token {t} needs row {rope_row}, the table has {cos_sin_cache.shape[0]}")
        cols = sorted({q // sbs for q in range(max(p - R + 1, 0), p + 1)})
        if cols[-1] >= table.shape[1]:
            raise ValueError(f"state_block_table: token {t} (position {p}) needs column {cols[-1]}, the table has "
                             f"{table.shape[1]}")
        ids = table[r, cols]
        if bool(((ids < 0) | (ids >= state.shape[0])).any()):
            raise ValueError(f"state_block_table: request {r} maps its window to blocks {ids.tolist()}, expected ids "
                             f"in [0, {state.shape[0]})")


def _validate(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight, cos_sin_cache, cache,
              ratio, eps, intermediates):
    T = check_window_inputs(state, state_block_table, token_to_req, positions, norm_weight, cos_sin_cache,
                            ratio=ratio, eps=eps, head=HEAD, width=state_row_width(ratio) if ratio in SUPPORTED_RATIOS else 0,
                            ratios=SUPPORTED_RATIOS, ratio_words="C4A / C128A")
    layout = check_cache(cache)
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
    check_slot_mapping(slot_mapping, T, cache.shape[0] * layout.block_size, writes=writes)
    check_window_tables(state, state_block_table, token_to_req, cos_sin_cache, pos, writes, ratio)
    return layout


def compress_norm_rope_store(state: torch.Tensor, state_block_table: torch.Tensor, token_to_req: torch.Tensor,
                             positions: torch.Tensor, slot_mapping: torch.Tensor, norm_weight: torch.Tensor,
                             cos_sin_cache: torch.Tensor, cache: torch.Tensor, *, ratio: int, eps: float = 1e-6,
                             target: "Target | str | None" = None, two_stage: bool = False,
                             intermediates: torch.Tensor | None = None, splits: int | None = None) -> None:
    """Compress, normalize, rotate and store one row per ``ratio`` tokens into the extra cache (in place).

    ``two_stage=True`` selects the ratio-128 prefill variant (SPEC 4): ``splits`` programs per token (default
    :func:`num_two_stage_splits` from the target's CU count) each pool R/splits rows into a workspace, and a finalizer
    merges them and runs steps 3-6, sanitizing as the single pass does. Decode tokens should use the single pass.
    Inputs are described in the module docstring; all are validated before any kernel runs or any byte is written.
    """
    tgt = get_target(target)
    layout = _validate(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight, cos_sin_cache,
                       cache, ratio, eps, intermediates)
    if not isinstance(two_stage, bool):
        raise TypeError(f"two_stage: expected a bool, got {type(two_stage).__name__}")
    T = positions.shape[0]
    R = window_rows(ratio)
    if two_stage:
        if ratio != 128:
            raise ValueError(f"two_stage: the two-stage variant is for ratio 128 (prefill), got ratio {ratio}")
        if splits is None:
            splits = num_two_stage_splits(max(T, 1), ratio, tgt)
        if isinstance(splits, bool) or not isinstance(splits, int):
            # bool is an int subclass: True would silently mean one split
            raise TypeError(f"splits: expected an int (a power of two in [1, {TWO_STAGE_MAX_SPLITS}]) or None, got "
                            f"{type(splits).__name__} {splits!r}")
        if splits < 1 or splits > TWO_STAGE_MAX_SPLITS or splits & (splits - 1) \
                or (R // splits) % ROWS_PER_STEP:
            raise ValueError(f"splits: expected a power of two in [1, {TWO_STAGE_MAX_SPLITS}] leaving a multiple of "
                             f"{ROWS_PER_STEP} rows per split, got {splits!r}")
    elif splits is not None:
        raise ValueError("splits: only meaningful with two_stage=True")
    if T == 0:
        return
    coff = 2 if ratio == 4 else 1
    inter = intermediates if intermediates is not None else cache  # never written when STORE_INTER is False
    common_state = (state, state.stride(0), state.stride(1), state_block_table, state_block_table.stride(0),
                    state.shape[1], token_to_req, positions, slot_mapping)
    cap = tgt.writer_scale_code_cap
    if not two_stage:
        _compress_single_pass_kernel[(T,)](
            *common_state, norm_weight, cos_sin_cache, cos_sin_cache.stride(0), cache, cache.stride(0),
            layout.block_size, float(eps), inter, STORE_INTER=intermediates is not None, RATIO=ratio, R=R,
            COFF=coff, ROWS=ROWS_PER_STEP, CAP=cap, SANITIZE=tgt.sanitizes_writer,
        )
        return
    workspace = torch.full((T, splits, 3, HEAD), float("nan"), dtype=torch.float32, device=positions.device)
    _compress_partial_kernel[(T, splits)](
        *common_state, workspace, RATIO=ratio, R=R, COFF=coff, ROWS=ROWS_PER_STEP, SPLITS=splits,
    )
    _compress_finalize_kernel[(T,)](
        positions, slot_mapping, workspace, norm_weight, cos_sin_cache, cos_sin_cache.stride(0), cache,
        cache.stride(0), layout.block_size, float(eps), inter, STORE_INTER=intermediates is not None, RATIO=ratio,
        SPLITS=splits, CAP=cap, SANITIZE=tgt.sanitizes_writer,
    )
