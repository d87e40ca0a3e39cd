"""The indexer-K gather (``cp_gather_indexer_k_quant_cache``, SPEC 5): copy each sequence's fp8 keys and fp32
scales out of the paged indexer-K cache into contiguous rows, for the prefill logits.

Inputs (SPEC 1.3, 5): ``k_cache [nb, bs, 132]`` uint8, each block ``[bs*128 fp8][bs fp32 scales]`` in the NORMAL or
SHUFFLE layout of :class:`impl.formats.IndexerKLayout`, blocks ``k_cache.stride(0)`` bytes apart (a strided view
into a larger pool is fine); ``block_table [B, W]``, ``cu_seqlen [B+1]``, ``token_to_seq [T]`` (int32 or int64).
Outputs, written in place: ``k_fp8 [T, 128]`` uint8 and ``k_scale [T, 4]`` uint8 (the scale's fp32 bytes).

Token t belongs to sequence b = token_to_seq[t] at offset o = t - cu_seqlen[b]; its key is slot o % bs of block
block_table[b, o // bs]. What a token gets when that chain breaks (the same for both variants):

* an **invalid token** (b outside [0, B), or t outside [cu_seqlen[b], cu_seqlen[b+1])): nothing is written; its
  ``k_fp8`` and ``k_scale`` rows keep what they held (SPEC 5: "an invalid token returns early", as upstream's
  kernels do);
* a valid token with an **invalid block** (o // bs >= W, or a table entry outside [0, nb)): its ``k_scale`` row
  becomes four zero bytes (fp32 +0.0) and its ``k_fp8`` row keeps what it held (SPEC 5: "an invalid block stores
  scale 0"; upstream stores the scale and masks the data). A zero scale is what makes the logits of such a row 0;
  the stale fp8 bytes beside it are the caller's buffer (FINDINGS.md, "cp-gather: observed", says what a NaN code there does).

Both variants mask every one of these cases; they differ in what Triton specializes, i.e. in how often they
compile (``target.cp_gather_variant``, SPEC 5 / seed 004 item 4):

* ``legacy`` (gfx942, generic): the token count is a constexpr (one compilation per token count, as seed 004 says
  of upstream's older kernel); batch count, table width and block count are plain ints (Triton specializes them on
  "== 1" and "divisible by 16").
* ``gfx950``: token and batch counts are runtime scalars (``do_not_specialize``), table width and block count are
  constexpr, the metadata pointers are not specialized on alignment: for one cache and table geometry it compiles
  once whatever the token and batch counts and wherever the table's rows start (the ``compile-once`` contract).

Block offsets (block * stride(0)) and output row offsets are computed in int64: a pool passes 2^31 bytes at
about 250K blocks of 64 tokens.

Bad input raises ValueError/TypeError naming the argument before anything is launched or written. With
``check_metadata`` (the default) one host copy of ``cu_seqlen`` also checks it: non-decreasing from >= 0, its last
entry at most T, and no sequence longer than its table row covers (``ceil(len / bs) <= W``). Callers that cannot
sync (graph capture) pass ``check_metadata=False``; the kernel's masks then handle such metadata as above.
``token_to_seq`` is never read on the host: its invalid entries are masked in the kernel.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl import formats
from impl.targets import Target, get_target
from impl.validation import dtype_name, require_kernel_device, require_tensor

HEAD_DIM = formats.INDEXER_HEAD_DIM
SCALE_BYTES = formats.INDEXER_TOKEN_BYTES - formats.INDEXER_HEAD_DIM  # 4
TILE_TOKENS = formats.SHUFFLE_TILE_TOKENS
TILE_BYTES = formats.SHUFFLE_TILE_BYTES
#: tokens per program: one [BLOCK_T, 128] byte tile (a token's 128 B alone is too small a load for bandwidth)
BLOCK_T = 64
#: warps per program
NUM_WARPS = 4
INDEX_DTYPES = (torch.int32, torch.int64)
VARIANTS = ("legacy", "gfx950")


@triton.jit
def _gather_tile(pid, num_tokens, num_batches, table_width, num_blocks,
                 cache_ptr, cache_block_stride, block_size,
                 k_fp8_ptr, k_fp8_row_stride, k_scale_ptr, k_scale_row_stride,
                 table_ptr, table_row_stride, table_col_stride, cu_ptr, tts_ptr,
                 SHUFFLE: tl.constexpr, BLOCK_T: tl.constexpr, HEAD: tl.constexpr, SCALE: tl.constexpr,
                 TILE_T: tl.constexpr, TILE_B: tl.constexpr):
    """One program gathers tokens [pid*BLOCK_T, (pid+1)*BLOCK_T) (the module docstring's rules)."""
    t = pid.to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
    in_grid = t < num_tokens
    b = tl.load(tts_ptr + t, mask=in_grid, other=-1).to(tl.int64)
    valid_batch = in_grid & (b >= 0) & (b < num_batches)
    sb = tl.where(valid_batch, b, 0)
    start = tl.load(cu_ptr + sb, mask=valid_batch, other=0).to(tl.int64)
    end = tl.load(cu_ptr + sb + 1, mask=valid_batch, other=0).to(tl.int64)
    valid_token = valid_batch & (t >= start) & (t < end)
    off = tl.where(valid_token, t - start, 0)
    col = off // block_size
    pos = off % block_size
    valid_col = valid_token & (col < table_width)
    blk = tl.load(table_ptr + sb * table_row_stride + col * table_col_stride, mask=valid_col, other=-1)
    valid_block = valid_col & (blk >= 0) & (blk < num_blocks)
    # int64 before the stride multiply: block * stride(0) passes 2^31 in production pools
    safe_blk = tl.where(valid_block, blk, 0).to(tl.int64)
    safe_pos = tl.where(valid_block, pos, 0)
    block_base = safe_blk * cache_block_stride
    d = tl.arange(0, HEAD)
    if SHUFFLE:
        token_off = (safe_pos // TILE_T) * (TILE_T * HEAD) + (safe_pos % TILE_T) * TILE_B
        lane_off = (d // TILE_B) * (TILE_T * TILE_B) + d % TILE_B
    else:
        token_off = safe_pos * HEAD
        lane_off = d
    src = cache_ptr + (block_base + token_off)[:, None] + lane_off[None, :]
    vals = tl.load(src, mask=valid_block[:, None], other=0)
    tl.store(k_fp8_ptr + (t * k_fp8_row_stride)[:, None] + d[None, :], vals, mask=valid_block[:, None])
    j = tl.arange(0, SCALE)
    scale_src = cache_ptr + (block_base + block_size * HEAD + safe_pos * SCALE)[:, None] + j[None, :]
    scale = tl.load(scale_src, mask=valid_block[:, None], other=0)
    tl.store(k_scale_ptr + (t * k_scale_row_stride)[:, None] + j[None, :], scale, mask=valid_token[:, None])


@triton.jit
def _cp_gather_legacy_kernel(cache_ptr, cache_block_stride, block_size,
                             k_fp8_ptr, k_fp8_row_stride, k_scale_ptr, k_scale_row_stride,
                             table_ptr, table_row_stride, table_col_stride, cu_ptr, tts_ptr,
                             num_batches, table_width, num_blocks,
                             NUM_TOKENS: tl.constexpr,
                             SHUFFLE: tl.constexpr, BLOCK_T: tl.constexpr, HEAD: tl.constexpr,
                             SCALE: tl.constexpr, TILE_T: tl.constexpr, TILE_B: tl.constexpr):
    """Legacy variant. Grid ``(cdiv(T, BLOCK_T),)``; program p gathers tokens [p*BLOCK_T, (p+1)*BLOCK_T).

    Layout: cache block at ``cache_ptr + block * cache_block_stride`` (bytes), token data at pos*128 (NORMAL) or
    in 16x16-byte tiles (SHUFFLE), scales at bs*128 + pos*4; outputs row-major with the given row strides.
    ``NUM_TOKENS`` is a constexpr: one compilation per token count. Invariant: programs write disjoint output
    rows and never write the cache."""
    _gather_tile(tl.program_id(0), NUM_TOKENS, num_batches, table_width, num_blocks,
                 cache_ptr, cache_block_stride, block_size,
                 k_fp8_ptr, k_fp8_row_stride, k_scale_ptr, k_scale_row_stride,
                 table_ptr, table_row_stride, table_col_stride, cu_ptr, tts_ptr,
                 SHUFFLE, BLOCK_T, HEAD, SCALE, TILE_T, TILE_B)


@triton.jit(do_not_specialize=["num_tokens", "num_batches"],
            do_not_specialize_on_alignment=["table_ptr", "cu_ptr", "tts_ptr"])
def _cp_gather_gfx950_kernel(cache_ptr, cache_block_stride, block_size,
                             k_fp8_ptr, k_fp8_row_stride, k_scale_ptr, k_scale_row_stride,
                             table_ptr, table_row_stride, table_col_stride, cu_ptr, tts_ptr,
                             num_tokens, num_batches,
                             TABLE_WIDTH: tl.constexpr, NUM_BLOCKS: tl.constexpr,
                             SHUFFLE: tl.constexpr, BLOCK_T: tl.constexpr, HEAD: tl.constexpr,
                             SCALE: tl.constexpr, TILE_T: tl.constexpr, TILE_B: tl.constexpr):
    """gfx950 variant: the legacy kernel's layout, grid and invariant, with token and batch counts as runtime
    scalars that Triton does not specialize (``do_not_specialize``) and table width and block count constexpr:
    for a fixed cache and table geometry one compilation serves every token and batch count. The metadata
    pointers are not specialized on their alignment either (their loads are per-token gathers, which alignment does
    not help): a prefill chunk's block table is a row slice of the persistent table, 16-byte aligned or not
    depending on its first row."""
    _gather_tile(tl.program_id(0), num_tokens, num_batches, TABLE_WIDTH, NUM_BLOCKS,
                 cache_ptr, cache_block_stride, block_size,
                 k_fp8_ptr, k_fp8_row_stride, k_scale_ptr, k_scale_row_stride,
                 table_ptr, table_row_stride, table_col_stride, cu_ptr, tts_ptr,
                 SHUFFLE, BLOCK_T, HEAD, SCALE, TILE_T, TILE_B)


_KERNELS = {"legacy": _cp_gather_legacy_kernel, "gfx950": _cp_gather_gfx950_kernel}


def _variant(t: Target) -> str:
    v = t.cp_gather_variant
    if v not in VARIANTS:
        raise ValueError(f"target: {t.name}'s cp_gather_variant {v!r} is not one of {', '.join(VARIANTS)}")
    return v


def gather_kernel(target: "Target | str | None" = None):
    """The Triton kernel object ``cp_gather_indexer_k_quant_cache`` launches on ``target`` (the ``compile-once``
    contract counts its specializations)."""
    return _KERNELS[_variant(get_target(target))]


def _resolve_layout(layout, block_size: int) -> str:
    if layout is None:
        resolved = formats.default_indexer_layout(block_size)
    elif not isinstance(layout, str):
        raise TypeError(f"layout: expected None, 'normal' or 'shuffle', got {type(layout).__name__}")
    elif layout not in ("normal", "shuffle"):
        raise ValueError(f"layout: expected None, 'normal' or 'shuffle', got {layout!r}")
    else:
        resolved = layout
    if resolved == "shuffle" and block_size % TILE_TOKENS:
        raise ValueError(f"layout: SHUFFLE ({'the default for a block size other than 1' if layout is None else 'asked'}"
                         f") tiles 16 tokens, so it needs a block size that is a multiple of 16; k_cache has "
                         f"block size {block_size} (pass layout='normal')")
    return resolved


def _require_rows(name: str, t: torch.Tensor, rows: int, width: int) -> None:
    if tuple(t.shape) != (rows, width):
        raise ValueError(f"{name}: expected shape [{rows}, {width}], got {list(t.shape)}")
    if rows and width > 1 and t.stride(1) != 1:
        raise ValueError(f"{name}: each row must be contiguous, got strides {list(t.stride())}")


def check_metadata_on_host(cu_seqlen: torch.Tensor, num_tokens: int, table_width: int, block_size: int) -> None:
    """The host checks of ``check_metadata`` (one device -> host copy of ``cu_seqlen``)."""
    cu = cu_seqlen.detach().to("cpu", torch.int64).tolist()
    if cu[0] < 0:
        raise ValueError(f"cu_seqlen: expected cu_seqlen[0] >= 0, got {cu[0]}")
    for b in range(len(cu) - 1):
        n = cu[b + 1] - cu[b]
        if n < 0:
            raise ValueError(f"cu_seqlen: expected a non-decreasing cu_seqlen, got cu_seqlen[{b}] = {cu[b]} > "
                             f"cu_seqlen[{b + 1}] = {cu[b + 1]}")
        if -(-n // block_size) > table_width:
            raise ValueError(f"block_table: sequence {b} holds {n} tokens, which need {-(-n // block_size)} blocks "
                             f"of {block_size}, but block_table has {table_width} columns")
    if cu[-1] > num_tokens:
        raise ValueError(f"cu_seqlen: its last entry {cu[-1]} exceeds the {num_tokens} rows of k_fp8 / k_scale")


def cp_gather_indexer_k_quant_cache(k_cache: torch.Tensor, k_fp8: torch.Tensor, k_scale: torch.Tensor,
                                    block_table: torch.Tensor, cu_seqlen: torch.Tensor, token_to_seq: torch.Tensor,
                                    *, layout: "str | None" = None, target: "Target | str | None" = None,
                                    check_metadata: bool = True) -> None:
    """Gather the indexer keys of ``token_to_seq``'s tokens into ``k_fp8 [T, 128]`` and ``k_scale [T, 4]`` (uint8,
    in place), with the rules and the variant of the module docstring.

    ``layout``: None (NORMAL when bs == 1, else SHUFFLE: ``impl.formats.default_indexer_layout``), "normal" or
    "shuffle" (needs bs % 16 == 0). ``target`` picks the kernel variant (``target.cp_gather_variant``).
    ``cu_seqlen`` and ``token_to_seq`` must be stride-1 vectors (refused otherwise); the table's and the outputs'
    strides are followed.
    """
    t = get_target(target)
    variant = _variant(t)
    require_tensor("k_cache", k_cache, (torch.uint8,), dim=3)
    if not isinstance(check_metadata, bool):
        raise TypeError(f"check_metadata: expected a bool, got {type(check_metadata).__name__}")
    lay = formats.check_indexer_k_cache(k_cache, _resolve_layout(layout, int(k_cache.shape[1])), "k_cache")
    require_tensor("k_fp8", k_fp8, (torch.uint8,), dim=2)
    num_tokens = int(k_fp8.shape[0])
    _require_rows("k_fp8", k_fp8, num_tokens, HEAD_DIM)
    require_tensor("k_scale", k_scale, (torch.uint8,), dim=2)
    _require_rows("k_scale", k_scale, num_tokens, SCALE_BYTES)
    require_tensor("block_table", block_table, INDEX_DTYPES, dim=2)
    require_tensor("cu_seqlen", cu_seqlen, INDEX_DTYPES, dim=1)
    require_tensor("token_to_seq", token_to_seq, INDEX_DTYPES, dim=1)
    num_batches, table_width = int(block_table.shape[0]), int(block_table.shape[1])
    if cu_seqlen.shape[0] != num_batches + 1:
        raise ValueError(f"cu_seqlen: expected {num_batches + 1} entries (block_table has {num_batches} rows, one "
                         f"per sequence), got {cu_seqlen.shape[0]}")
    if token_to_seq.shape[0] != num_tokens:
        raise ValueError(f"token_to_seq: expected {num_tokens} entries (one per row of k_fp8), got "
                         f"{token_to_seq.shape[0]}")
    for name, x in (("k_cache", k_cache), ("k_fp8", k_fp8), ("k_scale", k_scale), ("block_table", block_table),
                    ("cu_seqlen", cu_seqlen), ("token_to_seq", token_to_seq)):
        require_kernel_device(name, x)
        if x.device != k_cache.device:
            raise ValueError(f"{name}: expected the device of k_cache ({k_cache.device}), got {x.device}")
    for name, x in (("block_table", block_table), ("cu_seqlen", cu_seqlen), ("token_to_seq", token_to_seq)):
        if x.dtype != token_to_seq.dtype or x.dtype != cu_seqlen.dtype:
            raise TypeError(f"{name}: block_table, cu_seqlen and token_to_seq must share one index dtype, got "
                            f"{dtype_name(block_table.dtype)}, {dtype_name(cu_seqlen.dtype)} and "
                            f"{dtype_name(token_to_seq.dtype)}")
    for name, x in (("cu_seqlen", cu_seqlen), ("token_to_seq", token_to_seq)):
        # the kernels read both at ptr + i (no stride argument): a strided view would be read as if packed
        if x.shape[0] > 1 and x.stride(0) != 1:
            raise ValueError(f"{name}: expected a contiguous vector (stride 1), got stride {x.stride(0)}; pass "
                             f"{name}.contiguous()")
    if check_metadata:
        check_metadata_on_host(cu_seqlen, num_tokens, table_width, lay.block_size)
    if num_tokens == 0:
        return
    grid = (triton.cdiv(num_tokens, BLOCK_T),)
    common = (k_cache, k_cache.stride(0), lay.block_size,
              k_fp8, k_fp8.stride(0), k_scale, k_scale.stride(0),
              block_table, block_table.stride(0), block_table.stride(1), cu_seqlen, token_to_seq)
    meta = dict(SHUFFLE=lay.layout == "shuffle", BLOCK_T=BLOCK_T, HEAD=HEAD_DIM, SCALE=SCALE_BYTES,
                TILE_T=TILE_TOKENS, TILE_B=TILE_BYTES)
    if variant == "gfx950":
        _cp_gather_gfx950_kernel[grid](*common, num_tokens, num_batches,
                                       TABLE_WIDTH=table_width, NUM_BLOCKS=int(k_cache.shape[0]), **meta,
                                       num_warps=NUM_WARPS)
    else:
        _cp_gather_legacy_kernel[grid](*common, num_batches, table_width, int(k_cache.shape[0]),
                                       NUM_TOKENS=num_tokens, **meta, num_warps=NUM_WARPS)
