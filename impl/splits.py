"""Split-K selectors for the DSv4 sparse decode (SPEC section 2, "Split count").

Both selectors are sync-free: they see tensor *sizes* (``indices.numel()``), never indptr values, so they can run
on the host while the GPU is busy and inside graph capture. The average segment length is ``numel / batch``;
``ceil(ceil(numel / b) / s) == ceil(numel / (b * s))`` for positive integers, so the selectors work on the
integer numel directly and never round an average.

Sources: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` ``_decode_num_splits`` (gfx942,
searched over 1..16) and ``_decode_gfx950_num_splits`` (cap 32, two workgroups per CU), as SPEC section 2 restates
them; the checkpoints at CU = 256 come from upstream's tests (``tests/kernels/attention/test_rocm_triton_attn_dsv4.py``).

Choices this module makes where SPEC is silent [I]:
- ``block_k`` (the K of ``iters``) is 32, the split-K partial's BLOCK_K, for both segments.
- gfx942 costs are compared exactly (integer cross-multiplication) so that "ties go to the smaller s" means a
  mathematical tie, not a floating-point accident.
- SPEC's gfx950 rule ``ow = CU // base`` is 0 when base > CU (a partitioned device): the suite takes
  ``ow = max(1, CU // base)`` and never returns fewer than 1 split.
"""
from __future__ import annotations

from dataclasses import dataclass

#: BLOCK_H of the split-K partial kernels: one program handles this many heads.
BLOCK_H = 16
#: K in ``iters(a, e, s, K)``: the split-K partial's BLOCK_K.
BLOCK_K = 32
#: The gfx942 selector searches s in 1..GFX942_MAX_SPLITS (the review of the gfx950 change kept it at 16).
GFX942_MAX_SPLITS = 16
#: The gfx950 selector never asks for more than this many splits.
GFX950_MAX_SPLITS = 32
#: gfx942 cost model: waves * (1/s + GFX942_SPLIT_OVERHEAD_NUM / GFX942_SPLIT_OVERHEAD_DEN), i.e. + 0.04 per wave.
GFX942_SPLIT_OVERHEAD_NUM = 1
GFX942_SPLIT_OVERHEAD_DEN = 25
#: gfx950 "short work" split count and its iteration threshold.
GFX950_SHORT_SPLITS = 4
GFX950_SHORT_ITERS = 3
#: gfx950: one wave when iters(ow) <= this, else two.
GFX950_ONE_WAVE_ITERS = 9


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_sizes(batch: int, num_heads: int, main_numel: int, extra_numel: int, cu_count: int) -> None:
    for name, v, lo in (("batch", batch, 1), ("num_heads", num_heads, 1), ("main_numel", main_numel, 0),
                        ("extra_numel", extra_numel, 0), ("cu_count", cu_count, 1)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
        if v < lo:
            raise ValueError(f"{name}: expected an int >= {lo}, got {v}")


def head_blocks(num_heads: int) -> int:
    return _cdiv(num_heads, BLOCK_H)


def decode_iters(main_numel: int, extra_numel: int, batch: int, splits: int, block_k: int = BLOCK_K) -> int:
    """iters(a, e, s, K) = ceil(ceil(a/s)/K) + ceil(ceil(e/s)/K) with a = main_numel/batch, e = extra_numel/batch;
    an empty segment counts 0."""
    total = 0
    for numel in (main_numel, extra_numel):
        if numel > 0:
            total += _cdiv(_cdiv(numel, batch * splits), block_k)
    return total


def row_iters(main_len: int, extra_len: int, splits: int, block_k: int = BLOCK_K) -> int:
    """iters for one query's real lengths (the adaptive kernel's per-query recomputation)."""
    return decode_iters(main_len, extra_len, 1, splits, block_k)


def _waves(base: int, s: int, cu_count: int) -> int:
    return _cdiv(base * s, cu_count)


def _snap_down(s: int, base: int, cu_count: int, iters_of) -> int:
    """The smallest s' <= s with the same number of waves and the same iters as s."""
    w, it = _waves(base, s, cu_count), iters_of(s)
    for cand in range(1, s + 1):
        if _waves(base, cand, cu_count) == w and iters_of(cand) == it:
            return cand
    return s


def num_splits_gfx942(batch: int, num_heads: int, main_numel: int, extra_numel: int, cu_count: int,
                      block_k: int = BLOCK_K) -> int:
    """gfx942 split count: minimise ceil(base*s/CU) * (1/s + 0.04) over s in 1..16 (ties to the smaller s), then
    snap down to the smallest s with the same waves and iters. base = batch * ceil(num_heads / 16)."""
    _check_sizes(batch, num_heads, main_numel, extra_numel, cu_count)
    base = batch * head_blocks(num_heads)
    best, best_num, best_den = 1, None, None
    for s in range(1, GFX942_MAX_SPLITS + 1):
        # cost = waves * (DEN + NUM*s) / (DEN * s); compare num/den pairs by cross-multiplication
        num = _waves(base, s, cu_count) * (GFX942_SPLIT_OVERHEAD_DEN + GFX942_SPLIT_OVERHEAD_NUM * s)
        den = GFX942_SPLIT_OVERHEAD_DEN * s
        if best_num is None or num * best_den < best_num * den:
            best, best_num, best_den = s, num, den
    return _snap_down(best, base, cu_count,
                      lambda s: decode_iters(main_numel, extra_numel, batch, s, block_k))


def num_splits_gfx950(batch: int, num_heads: int, main_numel: int, extra_numel: int, cu_count: int,
                      block_k: int = BLOCK_K) -> int:
    """gfx950 split count: S = min(32, ceil(2*CU/base)) (two workgroups per CU); when base >= 16, S > 4 and
    iters(4) <= 3 the answer is 4; when 16 <= base < 64 it is capped at waves*CU//base (waves 1 when
    iters(CU//base) <= 9, else 2); then, for base >= 16, snapped down."""
    _check_sizes(batch, num_heads, main_numel, extra_numel, cu_count)
    base = batch * head_blocks(num_heads)

    def iters_of(s: int) -> int:
        return decode_iters(main_numel, extra_numel, batch, s, block_k)

    s = min(GFX950_MAX_SPLITS, _cdiv(2 * cu_count, base))
    if base >= 16 and s > GFX950_SHORT_SPLITS and iters_of(GFX950_SHORT_SPLITS) <= GFX950_SHORT_ITERS:
        return GFX950_SHORT_SPLITS
    if 16 <= base < 64:
        ow = max(1, cu_count // base)
        waves = 1 if iters_of(ow) <= GFX950_ONE_WAVE_ITERS else 2
        s = max(1, min(s, waves * cu_count // base))
    if base >= 16:
        s = _snap_down(s, base, cu_count, iters_of)
    return s


SELECTORS = {"gfx942": num_splits_gfx942, "gfx950": num_splits_gfx950}


def select_num_splits(selector: "str | None", batch: int, num_heads: int, main_numel: int, extra_numel: int,
                      cu_count: int) -> int:
    """Dispatch by a Target's ``split_selector``; ``None`` (no split-K) gives 1."""
    if selector is None:
        _check_sizes(batch, num_heads, main_numel, extra_numel, cu_count)
        return 1
    try:
        fn = SELECTORS[selector]
    except KeyError:
        raise ValueError(f"selector: expected one of {sorted(SELECTORS)} or None, got {selector!r}") from None
    return fn(batch, num_heads, main_numel, extra_numel, cu_count)


@dataclass(frozen=True)
class AdaptivePlan:
    """Host side of adaptive splits: whether they are on, and ONE_WAVE (the middle per-query choice)."""

    enabled: bool
    one_wave: int


def adaptive_plan(num_splits: int, batch: int, num_heads: int, cu_count: int) -> AdaptivePlan:
    """Adaptive splits are on only when base >= 16 and S > 4 (the caller also requires a target that allows them).
    ONE_WAVE = CU // base when 16 <= base < 64, else S (kept within [1, S])."""
    base = batch * head_blocks(num_heads)
    enabled = base >= 16 and num_splits > GFX950_SHORT_SPLITS
    one_wave = cu_count // base if 16 <= base < 64 else num_splits
    return AdaptivePlan(enabled, max(1, min(one_wave, num_splits)))


def adaptive_active_splits(main_len: int, extra_len: int, num_splits: int, one_wave: int,
                           block_k: int = BLOCK_K) -> int:
    """Per query: 4 if iters(4) <= 3, else ONE_WAVE if iters(ONE_WAVE) <= 3, else S (never above S).
    Host mirror of what the gfx950 partial kernel computes from the real indptr lengths."""
    if row_iters(main_len, extra_len, GFX950_SHORT_SPLITS, block_k) <= GFX950_SHORT_ITERS:
        active = GFX950_SHORT_SPLITS
    elif row_iters(main_len, extra_len, one_wave, block_k) <= GFX950_SHORT_ITERS:
        active = one_wave
    else:
        active = num_splits
    return min(active, num_splits)
