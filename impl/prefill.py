"""DSv4 sparse MLA prefill (SPEC sections 3 and 10): a Triton ragged kernel, AMD AITER's OPUS kernel behind a
strict guard on gfx950, and AITER's ``pa_prefill_sparse`` from 512 query rows on gfx942.

``sparse_attn_prefill`` attends every query row r of ``q [sq, h, d]`` to the rows of an already dequantized
``kv [skv, d]`` (or ``[skv, 1, d]``) that its sparse indices name, plus an optional per-head sink logit with a zero
value:

    s_j = scale * q . kv_j (all d lanes),   V = K
    out = sum_j e^(s_j - m) v_j / (sum_j e^(s_j - m) + e^(sink - m)),   m = max(max_j s_j, sink)

An empty row without a sink gives 0. An entry is valid when it lies inside its row's range and 0 <= slot < skv;
anything else (-1, INT32 extremes, slots at or past skv, entries outside indptr, dense entries past the row's
length) is masked and never read. The output is ``d`` wide, or ``nope`` wide (RoPE lanes dropped), of q's dtype or
another float dtype (bf16, fp16, fp32): the fp32 result is converted on store, as upstream's kernel stores into
whatever ``out`` it is given.

Indices come dense (``[sq, k]`` or ``[sq, 1, k]``, with an optional ``topk_length [sq]``) or ragged (``indices``
plus ``indptr [sq + 1]``). Row r of dense indices keeps its first clamp(topk_length[r] or count(idx >= 0), 0, k)
entries (SPEC 2's rule); the Triton kernel reads dense rows in place (the DSv4 prefill assembly's padded rows go
straight in, with no conversion and no host read), ragged ones through indptr. Only the OPUS route converts dense
indices, with ``impl.ragged.build_ragged_indices_from_dense`` (values outside [0, skv) become -1).

Routing (seed 003): the entry first asks ``can_use_aiter_sparse_prefill_opus`` (every SPEC 3 condition, the target
from ``Target.opus_eligible``) and ``get_aiter_sparse_prefill_opus`` (the real AITER op, or None). When both hold,
OPUS gets the ragged indices (dense ones converted as above) with the masked entries removed - AITER documents
that every index it is given must be a valid row - and an empty second segment; if the OPUS call reports failure (raises RuntimeError)
the Triton kernel runs instead, so the result never depends on whether OPUS accepted the shape. Otherwise the
Triton kernel ``_sparse_attn_prefill_kernel`` runs (its dense or ragged mode, as the indices came).

The gfx942 AITER route (SPEC 10, vLLM 0.34.0), asked after OPUS and before Triton: ``can_use_aiter_pa_prefill_sparse``
(the target's ``aiter_pa_prefill_sparse_min_queries``, 512 on gfx942 and None elsewhere; q bf16 or fp16; kv of q's
dtype) and ``get_aiter_pa_prefill_sparse`` (AITER's op when AMD AITER is importable and its op takes ``out=``, else
None). Dense rows are converted as for OPUS (valid entries only, packed); a caller's ragged list goes as it is
(AITER's gfx942 kernel skips -1 and slots past the pool, so filtering would only cost a host read). The op writes
``out`` in place when it is a contiguous ``[sq, h, d]`` tensor of q's dtype (what AITER accepts as ``out``), else
its result is copied into ``out`` (the first ``out.shape[-1]`` lanes, converted). Unlike upstream, a failing op
falls back to Triton: AITER's published ``pa_prefill_sparse`` reports configurations it cannot serve by raising
(AssertionError in its gfx1250-only builds, TypeError in builds without ``out=``, RuntimeError / ValueError /
NotImplementedError on inputs it rejects), and a prefill must not depend on which AITER build is installed. The
Triton kernel rewrites every lane of ``out``, so nothing a failed call left behind survives.

Upstream (vLLM 0.33.0) has a separate dense entry too, but it converts the rows to ragged ones
(``build_ragged_indices_from_dense``) and runs the ragged kernel; the results are the same, the dense kernel here
saves the conversion.

Sources: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` (``rocm_sparse_attn_prefill``,
``_can_use_aiter_sparse_prefill_opus``, ``_get_aiter_sparse_prefill_opus``) as SPEC section 3 and seed 003 restate
them; the OPUS op's argument order (q, unified_kv, prefix indices/indptr, extend kv, extend indices/indptr, sink,
scale, out=) from ROCm/aiter ``aiter/ops/pa_sparse_prefill_opus.py``; the gfx942 route as SPEC 10 restates vLLM
0.34.0's ``_can_use_aiter_pa_prefill_sparse`` / ``_rocm_sparse_attn_prefill_aiter``, and ``pa_prefill_sparse``'s
arguments (the same order, the extend trio None for one pool, ``out=`` a contiguous [T, H, D] buffer of q's dtype)
from ROCm/aiter ``aiter/ops/triton/attention/pa_prefill_sparse.py``.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
from typing import Callable

import torch
import triton
import triton.language as tl

from impl.ragged import build_ragged_indices_from_dense
from impl.runtime import kernel_device, native_without_gpu_hint
from impl.targets import Target, aiter_status, get_target
from impl.triton_helpers import dot, load_as_f32, online_softmax_step
from impl.validation import dtype_name as _dtype_name, require_tensor, require_valid_indptr

#: OPUS is correct at any size; below this many query rows the Triton kernel is faster. The figure is the
#: crossover measured side by side (operator-level A/B of Triton vs OPUS on MI355X, TP8 DeepSeek-V4) in the
#: upstream review of the change (seed 003): a performance threshold, not a correctness limit.
OPUS_MIN_QUERIES = 1024
#: the OPUS op's module and name in AMD AITER
AITER_OPUS_MODULE = "aiter.ops.pa_sparse_prefill_opus"
AITER_OPUS_NAME = "pa_sparse_prefill_opus"
#: the gfx942 prefill op's module and name in AMD AITER (its Triton branch serves gfx942)
AITER_PA_PREFILL_MODULE = "aiter.ops.triton.attention.pa_prefill_sparse"
AITER_PA_PREFILL_NAME = "pa_prefill_sparse"
#: dtypes both paths accept for q (kv must match)
PREFILL_DTYPES = (torch.bfloat16, torch.float16)
#: dtypes the Triton path stores into (converting the fp32 result on store); OPUS needs out of q's dtype
OUT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DEFAULT_ROPE_DIM = 64
BLOCK_H = 16
NUM_WARPS = 4
FLT_MAX = 3.4028234663852886e38
#: l below this is clamped before the division; l <= 0 (no valid token, no sink) writes 0
L_FLOOR = 1e-30

_FLT_MAX: tl.constexpr = tl.constexpr(FLT_MAX)
_L_FLOOR: tl.constexpr = tl.constexpr(L_FLOOR)


def _next_pow2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def block_k_for(d: int) -> int:
    """Tokens per tile: 16 when d >= 256, else 32 (SPEC 3)."""
    return 16 if d >= 256 else 32


def splits_nope_rope(nope: int, rope: int) -> bool:
    """Separate NoPE and RoPE tiles only when next_pow2(nope) + next_pow2(rope) <= next_pow2(d) (SPEC 3): true
    for 512 + 64 (one 512 and one 64 tile instead of a 1024 tile), false for 448 + 64 (one 512 tile covers it)."""
    if rope == 0:
        return False
    return _next_pow2(nope) + _next_pow2(rope) <= _next_pow2(nope + rope)


# ----------------------------------------------------------------------------------------------------------------
# Triton kernel
# ----------------------------------------------------------------------------------------------------------------

@triton.jit
def _load_rows(base, rows_off, lanes, row_mask, lane_mask, stride_d, IN_BF16: tl.constexpr):
    ptrs = base + rows_off[:, None] + lanes[None, :].to(tl.int64) * stride_d
    return load_as_f32(ptrs, row_mask[:, None] & lane_mask[None, :], IN_BF16)


# do_not_specialize: num_kv bounds the slot check (raw < num_kv), dense_width clamps a dense row's length and
# num_heads masks the head block: bounds and masks only, so a 1 or a multiple of 16 enables nothing; the strides stay
# specialized (their divisibility lets the loads vectorize)
@triton.jit(do_not_specialize=["num_kv", "dense_width", "num_heads"])
def _sparse_attn_prefill_kernel(
        q, stride_qs, stride_qh, stride_qd,
        kv, stride_kvs, stride_kvd, num_kv,
        idx, stride_ir, stride_ik, row_info, stride_len, dense_width, sink,
        out, stride_os, stride_oh, stride_od,
        num_heads, scale,
        NOPE: tl.constexpr, ROPE: tl.constexpr, OUT_D: tl.constexpr, SPLIT_D: tl.constexpr,
        BLOCK_A: tl.constexpr, BLOCK_R: tl.constexpr, HAS_SINK: tl.constexpr, IN_BF16: tl.constexpr,
        DENSE: tl.constexpr, BLOCK_H_: tl.constexpr, BLOCK_K: tl.constexpr):
    """Sparse prefill over ragged or dense index rows.

    Layout: q [sq, h, d] and out [sq, h, OUT_D] (OUT_D = d or NOPE; out of any float dtype, converted on store)
    with any strides; kv [skv, d] rows with any strides; bf16 tensors are passed as int16 views and widened
    exactly. Ragged (DENSE false): ``idx`` int32 1-D, ``row_info`` the int32 indptr (both packed), row r owning
    idx[indptr[r]:indptr[r+1]] (``stride_ir``/``stride_len``/``dense_width`` unused). Dense: ``idx`` int32/int64
    [sq, dense_width] with strides (stride_ir, stride_ik), ``row_info`` the int32/int64 row lengths at stride
    ``stride_len`` (a caller's topk_length may be a strided view), row r owning its first clamp(len[r], 0,
    dense_width) entries. ``sink`` fp32 [>= h] when HAS_SINK.
    Grid (sq, ceil(h / BLOCK_H)). Program (r, hb) walks row r's entries in BLOCK_K-token tiles with a natural-exp
    online softmax over heads hb*BLOCK_H.., folds in the sink as a zero-value logit, normalises and stores.
    Lanes: with SPLIT_D a BLOCK_A = next_pow2(NOPE) tile plus a BLOCK_R = next_pow2(ROPE) tile at offset NOPE;
    otherwise one BLOCK_A = next_pow2(d) tile. Lanes past their part are masked.
    Invariant: an entry is read only when it lies in its row's range and 0 <= slot < num_kv (compared in int64, so
    an int64 index past int32 is masked, not wrapped); masked entries get logit -inf and value 0, so no stray row
    (poisoned or outside the tensor) can reach the sums; with no valid entry and no sink l == 0 and the row is
    written as 0. The running max starts at -FLT_MAX, not -inf, so a tile of masked entries rescales by exp(0)
    instead of producing inf - inf."""
    r = tl.program_id(0)
    hb = tl.program_id(1)
    heads = hb * BLOCK_H_ + tl.arange(0, BLOCK_H_)
    hmask = heads < num_heads
    q_rows = r.to(tl.int64) * stride_qs + heads.to(tl.int64) * stride_qh
    if IN_BF16:
        dot_ty: tl.constexpr = tl.bfloat16
    else:
        dot_ty: tl.constexpr = tl.float16
    la = tl.arange(0, BLOCK_A)
    if SPLIT_D:
        la_mask = la < NOPE
    else:
        la_mask = la < NOPE + ROPE
    qa = _load_rows(q, q_rows, la, hmask, la_mask, stride_qd, IN_BF16).to(dot_ty)
    acc_a = tl.zeros((BLOCK_H_, BLOCK_A), tl.float32)
    if SPLIT_D:
        lr = NOPE + tl.arange(0, BLOCK_R)
        lr_mask = lr < NOPE + ROPE
        qr = _load_rows(q, q_rows, lr, hmask, lr_mask, stride_qd, IN_BF16).to(dot_ty)
        acc_r = tl.zeros((BLOCK_H_, BLOCK_R), tl.float32)
    m_i = tl.full((BLOCK_H_,), -_FLT_MAX, tl.float32)
    l_i = tl.zeros((BLOCK_H_,), tl.float32)
    if DENSE:
        lo = r.to(tl.int64) * stride_ir
        n = tl.minimum(tl.maximum(tl.load(row_info + r.to(tl.int64) * stride_len).to(tl.int64), 0), dense_width)
        step = stride_ik
    else:
        lo = tl.load(row_info + r).to(tl.int64)
        n = tl.load(row_info + r + 1).to(tl.int64) - lo
        step = 1
    tk = tl.arange(0, BLOCK_K).to(tl.int64)
    for t0 in range(0, n, BLOCK_K):
        offs = t0 + tk
        in_row = offs < n
        raw = tl.load(idx + lo + offs * step, mask=in_row, other=-1).to(tl.int64)
        valid = in_row & (raw >= 0) & (raw < num_kv)
        kv_rows = tl.where(valid, raw, 0) * stride_kvs
        ka = _load_rows(kv, kv_rows, la, valid, la_mask, stride_kvd, IN_BF16).to(dot_ty)
        s = dot(qa, tl.trans(ka), tl.zeros((BLOCK_H_, BLOCK_K), tl.float32))
        if SPLIT_D:
            kr = _load_rows(kv, kv_rows, lr, valid, lr_mask, stride_kvd, IN_BF16).to(dot_ty)
            s = dot(qr, tl.trans(kr), s)
        m_new, l_i, alpha, p = online_softmax_step(s * scale, valid, m_i, l_i, False)
        pb = p.to(dot_ty)
        acc_a = dot(pb, ka, acc_a * alpha[:, None])
        if SPLIT_D:
            acc_r = dot(pb, kr, acc_r * alpha[:, None])
        m_i = m_new
    if HAS_SINK:
        sink_val = tl.load(sink + heads, mask=hmask, other=float("-inf"))
        m_f = tl.maximum(m_i, sink_val)
        alpha = tl.exp(m_i - m_f)
        l_i = l_i * alpha + tl.exp(sink_val - m_f)
        acc_a = acc_a * alpha[:, None]
        if SPLIT_D:
            acc_r = acc_r * alpha[:, None]
    # 0 only when l <= 0 (no valid token, no sink); a NaN l must stay NaN
    inv = 1.0 / tl.maximum(l_i, _L_FLOOR)
    empty = l_i <= 0
    o_rows = r.to(tl.int64) * stride_os + heads.to(tl.int64) * stride_oh
    o_a = tl.where(empty[:, None], 0.0, acc_a * inv[:, None])
    oa_ptr = out + o_rows[:, None] + la[None, :].to(tl.int64) * stride_od
    tl.store(oa_ptr, o_a.to(out.dtype.element_ty), mask=hmask[:, None] & (la < OUT_D)[None, :])
    if SPLIT_D:
        if OUT_D > NOPE:
            o_r = tl.where(empty[:, None], 0.0, acc_r * inv[:, None])
            or_ptr = out + o_rows[:, None] + lr[None, :].to(tl.int64) * stride_od
            tl.store(or_ptr, o_r.to(out.dtype.element_ty), mask=hmask[:, None] & lr_mask[None, :])


# ----------------------------------------------------------------------------------------------------------------
# OPUS: guard and loader
# ----------------------------------------------------------------------------------------------------------------

def can_use_aiter_sparse_prefill_opus(q: torch.Tensor, kv: torch.Tensor, attn_sink: torch.Tensor | None,
                                      out: torch.Tensor, *, target: "Target | str | None" = None) -> bool:
    """Whether these tensors may go to AITER's OPUS sparse prefill (SPEC 3, seed 003). All must hold:
    the target is OPUS-eligible (gfx950); sq >= OPUS_MIN_QUERIES; q on the GPU; out.shape == q.shape; kv's last
    dim == q's; q bf16 or fp16 with kv and out of the same dtype and on q's device; last-dim strides of 1 for q
    and kv and out.stride() == q.stride(); a sink given, fp32, shape (h,), on q's device.

    Reads only tensor metadata (shape, dtype, device, strides), never data, so it is exact on fake tensors. The
    op's availability (AITER importable) is ``get_aiter_sparse_prefill_opus``'s business."""
    t = get_target(target)
    if not t.opus_eligible:
        return False
    if q.dim() != 3 or q.shape[0] < OPUS_MIN_QUERIES:
        return False
    if not q.is_cuda:
        return False
    if tuple(out.shape) != tuple(q.shape) or kv.shape[-1] != q.shape[-1]:
        return False
    if q.dtype not in PREFILL_DTYPES or kv.dtype != q.dtype or out.dtype != q.dtype:
        return False
    if kv.device != q.device or out.device != q.device:
        return False
    if q.stride(-1) != 1 or kv.stride(-1) != 1 or out.stride() != q.stride():
        return False
    if attn_sink is None:
        return False
    if tuple(attn_sink.shape) != (q.shape[1],) or attn_sink.dtype != torch.float32:
        return False
    return attn_sink.device == q.device


@functools.cache
def get_aiter_sparse_prefill_opus() -> Callable | None:
    """AITER's ``pa_sparse_prefill_opus``, or None when AMD AITER is not importable or lacks the op.

    Upstream also requires vLLM's AITER-MLA switch; this project has no such configuration, so "AITER MLA enabled"
    reduces to AMD AITER being importable (``impl.targets.aiter_status``). Cached: it is looked up once."""
    return _aiter_op(AITER_OPUS_MODULE, AITER_OPUS_NAME)


def _aiter_op(module: str, name: str) -> Callable | None:
    """``module.name`` from AMD AITER when it is importable and callable, else None (AITER absent, a partial ROCm
    install failing in any of its many ways, or a build without that op)."""
    if not aiter_status().importable:
        return None
    try:
        mod = importlib.import_module(module)
    except Exception:  # noqa: BLE001 - any failure means "no such op"
        return None
    op = getattr(mod, name, None)
    return op if callable(op) else None


def valid_entries_only(indices: torch.Tensor, indptr: torch.Tensor, num_rows: int
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """A packed ragged list holding only each row's valid entries (0 <= slot < num_rows), in order, with its int32
    indptr starting at 0. Masked entries add nothing to the attention, so this changes no result; it is what OPUS
    may be given: ROCm/aiter ``aiter/ops/pa_sparse_prefill_opus.py`` requires every index to be a valid row (an
    older copy said -1 sentinels are skipped; neither says anything of slots past the source). One host read."""
    ptr = indptr.to(torch.int64)
    lo, hi = int(ptr[0]), int(ptr[-1])
    seg = indices[lo:hi].to(torch.int64)
    ok = (seg >= 0) & (seg < num_rows)
    row_of = torch.repeat_interleave(torch.arange(ptr.numel() - 1, device=indices.device), ptr[1:] - ptr[:-1])
    counts = torch.zeros(ptr.numel() - 1, dtype=torch.int64, device=indices.device).index_add_(
        0, row_of, ok.to(torch.int64))
    new_ptr = torch.zeros(ptr.numel(), dtype=torch.int32, device=indices.device)
    new_ptr[1:] = torch.cumsum(counts, 0).to(torch.int32)
    return seg[ok].to(torch.int32), new_ptr


def run_aiter_sparse_prefill_opus(op: Callable, q: torch.Tensor, kv2: torch.Tensor, indices: torch.Tensor,
                                  indptr: torch.Tensor, softmax_scale: float, attn_sink: torch.Tensor,
                                  out: torch.Tensor) -> bool:
    """Call OPUS with ``indices``/``indptr`` as its first (paged) segment and an empty second segment: a one-row
    placeholder source, no indices, an all-zero indptr. True when the call succeeded (``out`` written); False when
    OPUS reported failure (RuntimeError, e.g. an unsupported head dim), in which case the caller falls back."""
    sq = q.shape[0]
    empty_indices = torch.zeros(0, dtype=torch.int32, device=q.device)
    empty_indptr = torch.zeros(sq + 1, dtype=torch.int32, device=q.device)
    try:
        res = op(q, kv2, indices, indptr, kv2[:1], empty_indices, empty_indptr, attn_sink, float(softmax_scale),
                 out=out)
    except RuntimeError:
        return False
    if isinstance(res, torch.Tensor) and res.data_ptr() != out.data_ptr():
        out.copy_(res)
    return True


# ----------------------------------------------------------------------------------------------------------------
# AITER pa_prefill_sparse (gfx942): guard, loader, call
# ----------------------------------------------------------------------------------------------------------------

def can_use_aiter_pa_prefill_sparse(q: torch.Tensor, kv: torch.Tensor, *,
                                    target: "Target | str | None" = None) -> bool:
    """Whether these tensors may go to AITER's ``pa_prefill_sparse`` (SPEC 10): the target has the route
    (``Target.aiter_pa_prefill_sparse_min_queries``: gfx942 only), sq reaches that many rows (512: a measured
    crossover, not a correctness bound), q is bf16 or fp16 and kv has q's dtype. Nothing else: the op serves any
    head count, head dim, layout and sink (its out-of-place result is copied into ``out``).

    Reads only metadata, so it is exact on fake tensors. Whether the op exists is ``get_aiter_pa_prefill_sparse``'s
    business (upstream's guard also asks vLLM's AITER-MLA switch; here that is AMD AITER being importable)."""
    t = get_target(target)
    min_queries = t.aiter_pa_prefill_sparse_min_queries
    if min_queries is None:
        return False
    if q.dim() != 3 or q.shape[0] < min_queries:
        return False
    return q.dtype in PREFILL_DTYPES and kv.dtype == q.dtype


def _accepts_out(op: Callable) -> bool:
    """Whether ``op`` takes an ``out=`` keyword (AITER's builds before it took one return a fresh tensor)."""
    try:
        params = inspect.signature(op).parameters.values()
    except (TypeError, ValueError):
        return False
    return any((p.name == "out" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or p.kind is p.VAR_KEYWORD
               for p in params)


@functools.cache
def get_aiter_pa_prefill_sparse() -> Callable | None:
    """AITER's ``pa_prefill_sparse``, or None when AMD AITER is not importable (``impl.targets.aiter_status``: the
    real AITER, never PyPI's unrelated ``aiter``), lacks the op, or has a build of it without ``out=`` (older builds
    serve gfx1250 only, asserting so, or return a fresh tensor for every call). Cached: it is looked up once."""
    op = _aiter_op(AITER_PA_PREFILL_MODULE, AITER_PA_PREFILL_NAME)
    return op if op is not None and _accepts_out(op) else None


def aiter_pa_ragged(dense: torch.Tensor | None, topk_length: torch.Tensor | None, indices: torch.Tensor,
                    indptr: torch.Tensor | None, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The (indices, indptr) the gfx942 route hands AITER: dense rows converted to their valid entries, packed
    from 0 (``build_ragged_indices_from_dense`` then ``valid_entries_only``, as for OPUS); a caller's ragged list
    as it is (AITER's gfx942 kernel skips -1 and slots past the pool itself)."""
    if dense is None:
        return indices, indptr
    return valid_entries_only(*build_ragged_indices_from_dense(dense, topk_length, num_rows=num_rows), num_rows)


def run_aiter_pa_prefill_sparse(op: Callable, q: torch.Tensor, kv2: torch.Tensor, indices: torch.Tensor,
                                indptr: torch.Tensor, softmax_scale: float, attn_sink: torch.Tensor | None,
                                out: torch.Tensor) -> bool:
    """Call ``pa_prefill_sparse`` on one pool (the extend trio None). ``out`` goes to the op when AITER accepts it
    (a contiguous tensor of q's shape and dtype), else the op's result is copied into ``out``'s lanes. True when
    ``out`` holds the result; False when the op raised or returned no ``[sq, h, >= out width]`` tensor, in which
    case the caller falls back to Triton (see the module docstring for why any exception counts)."""
    in_place = tuple(out.shape) == tuple(q.shape) and out.dtype == q.dtype and out.is_contiguous()
    try:
        res = op(q, kv2, indices, indptr, None, None, None, attn_sink, float(softmax_scale),
                 out=out if in_place else None)
    except Exception:
        return False
    if not isinstance(res, torch.Tensor) or res.dim() != 3 or tuple(res.shape[:2]) != tuple(out.shape[:2]) \
            or res.shape[2] < out.shape[2]:
        return False
    if res.data_ptr() != out.data_ptr():
        out.copy_(res[..., :out.shape[2]])
    return True


# ----------------------------------------------------------------------------------------------------------------
# Entry
# ----------------------------------------------------------------------------------------------------------------

def _require_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")


def _require_device(name: str, t: torch.Tensor, device) -> None:
    if t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of q), got {t.device}")


def _require_index_dtype(name: str, t: torch.Tensor, dtypes=(torch.int32, torch.int64)) -> None:
    require_tensor(name, t, dtypes)


def _validate_ragged(indices: torch.Tensor, indptr: torch.Tensor, sq: int, device) -> None:
    _require_tensor("indptr", indptr)
    _require_index_dtype("indices", indices, (torch.int32,))
    _require_index_dtype("indptr", indptr, (torch.int32,))
    if indices.dim() != 1:
        raise ValueError(f"indices: ragged indices must be 1-D, got shape {list(indices.shape)}")
    if indptr.dim() != 1 or indptr.numel() != sq + 1:
        raise ValueError(f"indptr: expected shape [sq + 1] = [{sq + 1}], got {list(indptr.shape)}")
    _require_device("indices", indices, device)
    _require_device("indptr", indptr, device)
    if not indices.is_contiguous() or not indptr.is_contiguous():
        raise ValueError("indices/indptr: expected contiguous tensors")
    require_valid_indptr("indptr", indptr, "indices", indices.numel())


def _validate_dense(indices: torch.Tensor, topk_length, sq: int, device) -> torch.Tensor:
    _require_index_dtype("indices", indices)
    if indices.dim() == 3:
        if indices.shape[1] != 1:
            raise ValueError(f"indices: dense 3-D indices must be [sq, 1, k], got {list(indices.shape)}")
        indices = indices[:, 0, :]
    if indices.dim() != 2 or indices.shape[0] != sq:
        raise ValueError(f"indices: expected dense [sq, k] or [sq, 1, k] with sq = {sq} (or 1-D ragged indices "
                         f"with indptr), got {list(indices.shape)}")
    _require_device("indices", indices, device)
    if topk_length is not None:
        _require_tensor("topk_length", topk_length)
        _require_index_dtype("topk_length", topk_length)
        if topk_length.dim() != 1 or topk_length.numel() != sq:
            raise ValueError(f"topk_length: expected shape [sq] = [{sq}], got {list(topk_length.shape)}")
        _require_device("topk_length", topk_length, device)
    return indices


def _may_self_overlap(t: torch.Tensor) -> bool:
    """False when no two elements of ``t`` can share memory: with the dims of size > 1 ordered by stride, each
    stride exceeds the largest offset the smaller dims reach. Every packed, padded, sliced or transposed layout
    passes; an expanded (stride-0) view fails, and so would an exotic interleaving that does not overlap."""
    reach = 0
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes a non-empty tensor's elements span."""
    extent = sum((sz - 1) * st for sz, st in zip(t.shape, t.stride()))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def _validate_out_memory(out: torch.Tensor, inputs: dict) -> None:
    """``out`` must not overlap itself (programs would race on the shared elements) nor any input's memory span
    (a program could overwrite what another still reads). Spans, not elements, are compared: an ``out``
    interleaved with an input in one buffer is rejected too."""
    if out.numel() == 0:
        return
    if _may_self_overlap(out):
        raise ValueError(f"out: expected non-overlapping memory (with its dims ordered by stride, each stride above "
                         f"the span of the smaller ones), got shape {list(out.shape)} with strides "
                         f"{tuple(out.stride())}: an expanded or self-overlapping view")
    lo, hi = _byte_range(out)
    for name, t in inputs.items():
        if t is None or t.numel() == 0 or t.device != out.device:
            continue
        t_lo, t_hi = _byte_range(t)
        if lo < t_hi and t_lo < hi:
            raise ValueError(f"out: expected memory apart from the inputs, got bytes [{lo:#x}, {hi:#x}) overlapping "
                             f"{name}'s [{t_lo:#x}, {t_hi:#x})")


def sparse_attn_prefill(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, softmax_scale: float,
                        attn_sink: torch.Tensor | None = None, out: torch.Tensor | None = None, *,
                        topk_length: torch.Tensor | None = None, indptr: torch.Tensor | None = None,
                        rope_head_dim: int = DEFAULT_ROPE_DIM,
                        target: "Target | str | None" = None) -> torch.Tensor:
    """Sparse MLA prefill of ``q [sq, h, d]`` (bf16 or fp16, d = nope + rope) over ``kv [skv, d]`` or
    ``[skv, 1, d]`` of q's dtype (see the module docstring for the math and the routing).

    ``indices``: dense int32/int64 ``[sq, k]`` or ``[sq, 1, k]`` with optional ``topk_length [sq]``, or ragged
    int32 1-D with ``indptr`` int32 ``[sq + 1]`` (read on the host to reject a decreasing one). ``softmax_scale``:
    a finite float (no default: the caller knows its head dim and mscale). ``attn_sink``: fp32 ``[>= h]``
    (-inf = no sink; the first h entries are used). ``out``: bf16, fp16 or fp32 (converted on store; OPUS only
    for q's dtype), ``[sq, h, d]`` or ``[sq, h, nope]`` (RoPE
    lanes dropped), any strides whose elements do not overlap, apart from every input's memory; allocated like q
    when None. ``rope_head_dim``: the RoPE part of d (SPEC checks only d = nope + rope; 448 + 64 and 512 + 64 both
    pass). ``target`` decides OPUS eligibility and the gfx942 AITER route.
    Every argument is validated before anything is launched or written. Returns ``out``."""
    t = get_target(target)
    _require_tensor("q", q)
    if q.dtype not in PREFILL_DTYPES:
        raise TypeError(f"q: expected dtype bfloat16 or float16, got {_dtype_name(q.dtype)}")
    if q.dim() != 3:
        raise ValueError(f"q: expected shape [sq, heads, d], got {list(q.shape)}")
    sq, h, d = (int(x) for x in q.shape)
    if h < 1 or d < 1:
        raise ValueError(f"q: expected at least one head and one lane, got shape {list(q.shape)}")
    device = q.device
    if device.type != kernel_device():
        raise ValueError(f"q: kernels run on '{kernel_device()}' here, got tensors on {device}"
                         f"{native_without_gpu_hint()}")
    if isinstance(rope_head_dim, bool) or not isinstance(rope_head_dim, int) or not 0 <= rope_head_dim < d:
        raise ValueError(f"rope_head_dim: expected an int in [0, d = {d}), got {rope_head_dim!r}")
    nope = d - rope_head_dim
    _require_tensor("kv", kv)
    if kv.dtype != q.dtype:
        raise TypeError(f"kv: expected dtype {_dtype_name(q.dtype)} (the dtype of q), got {_dtype_name(kv.dtype)}")
    if kv.dim() == 3 and kv.shape[1] == 1:
        kv2 = kv[:, 0, :]
    elif kv.dim() == 2:
        kv2 = kv
    else:
        raise ValueError(f"kv: expected shape [skv, {d}] or [skv, 1, {d}], got {list(kv.shape)}")
    if kv2.shape[1] != d:
        raise ValueError(f"kv: expected last dim {d} (the last dim of q), got {list(kv.shape)}")
    _require_device("kv", kv, device)
    skv = int(kv2.shape[0])
    _require_tensor("indices", indices)
    if indptr is not None:
        if topk_length is not None:
            raise ValueError("topk_length: only for dense indices; ragged indices (with indptr) carry their lengths")
        _validate_ragged(indices, indptr, sq, device)
        dense = None
    else:
        dense = _validate_dense(indices, topk_length, sq, device)
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
    if attn_sink is not None:
        _require_tensor("attn_sink", attn_sink)
        if attn_sink.dtype != torch.float32:
            raise TypeError(f"attn_sink: expected dtype float32, got {_dtype_name(attn_sink.dtype)}")
        if attn_sink.dim() != 1 or attn_sink.numel() < h:
            raise ValueError(f"attn_sink: expected a 1-D tensor of at least {h} entries (one per head), got shape "
                             f"{list(attn_sink.shape)}")
        _require_device("attn_sink", attn_sink, device)
        if not attn_sink.is_contiguous():
            raise ValueError("attn_sink: expected a contiguous tensor")
    if out is None:
        out = torch.empty_like(q)
    else:
        _require_tensor("out", out)
        if out.dtype not in OUT_DTYPES:
            raise TypeError(f"out: expected dtype bfloat16, float16 or float32 (converted on store), got "
                            f"{_dtype_name(out.dtype)}")
        if out.dim() != 3 or tuple(out.shape[:2]) != (sq, h) or out.shape[2] not in (d, nope):
            raise ValueError(f"out: expected shape [{sq}, {h}, {d}] or [{sq}, {h}, {nope}] (nope wide), got "
                             f"{list(out.shape)}")
        _require_device("out", out, device)
        _validate_out_memory(out, {"q": q, "kv": kv, "indices": indices, "indptr": indptr,
                                   "topk_length": topk_length, "attn_sink": attn_sink})
    if sq == 0:
        return out

    # --- nothing above wrote anything ---
    sink_h = attn_sink[:h] if attn_sink is not None else None
    if can_use_aiter_sparse_prefill_opus(q, kv2, sink_h, out, target=t):
        op = get_aiter_sparse_prefill_opus()
        if op is not None:
            if dense is not None:
                r_idx, r_ptr = build_ragged_indices_from_dense(dense, topk_length, num_rows=skv)
            else:
                r_idx, r_ptr = indices, indptr
            r_idx, r_ptr = valid_entries_only(r_idx, r_ptr, skv)
            if run_aiter_sparse_prefill_opus(op, q, kv2, r_idx, r_ptr, float(softmax_scale), sink_h, out):
                return out
    if can_use_aiter_pa_prefill_sparse(q, kv2, target=t):
        pa_op = get_aiter_pa_prefill_sparse()
        if pa_op is not None:
            pa_idx, pa_ptr = aiter_pa_ragged(dense, topk_length, indices, indptr, skv)
            if run_aiter_pa_prefill_sparse(pa_op, q, kv2, pa_idx, pa_ptr, float(softmax_scale), sink_h, out):
                return out
    if dense is not None:
        sparse_attn_prefill_triton(q, kv2, dense, None, float(softmax_scale), sink_h, out, rope_head_dim,
                                   topk_length=topk_length)
    else:
        sparse_attn_prefill_triton(q, kv2, indices, indptr, float(softmax_scale), sink_h, out, rope_head_dim)
    return out


def _check_launch(q, kv2, indices, indptr, softmax_scale, attn_sink, out, rope_head_dim, topk_length) -> None:
    """The launcher's own argument checks: types, shapes and devices only (no host read, so a caller that must
    not sync may launch it; ``sparse_attn_prefill`` also checks the values: indptr, memory overlap)."""
    require_tensor("q", q, PREFILL_DTYPES, dim=3)
    sq, h, d = (int(x) for x in q.shape)
    if q.device.type != kernel_device():
        raise ValueError(f"q: kernels run on '{kernel_device()}' here, got tensors on {q.device}")
    if isinstance(rope_head_dim, bool) or not isinstance(rope_head_dim, int) or not 0 <= rope_head_dim < d:
        raise ValueError(f"rope_head_dim: expected an int in [0, d = {d}), got {rope_head_dim!r}")
    require_tensor("kv2", kv2, (q.dtype,), dim=2, device=q.device)
    if kv2.shape[1] != d:
        raise ValueError(f"kv2: expected shape [skv, {d}] (the last dim of q), got {list(kv2.shape)}")
    if indptr is None:
        require_tensor("indices", indices, (torch.int32, torch.int64), dim=2, device=q.device)
        if indices.shape[0] != sq:
            raise ValueError(f"indices: expected dense [sq = {sq}, k], got {list(indices.shape)}")
        if topk_length is not None:
            require_tensor("topk_length", topk_length, (torch.int32, torch.int64), dim=1, device=q.device)
            if topk_length.numel() != sq:
                raise ValueError(f"topk_length: expected shape [{sq}], got {list(topk_length.shape)}")
    else:
        if topk_length is not None:
            raise ValueError("topk_length: only for dense indices (indptr None)")
        require_tensor("indices", indices, (torch.int32,), dim=1, device=q.device)
        require_tensor("indptr", indptr, (torch.int32,), dim=1, device=q.device)
        if indptr.numel() != sq + 1:
            raise ValueError(f"indptr: expected shape [sq + 1] = [{sq + 1}], got {list(indptr.shape)}")
        for name, t in (("indices", indices), ("indptr", indptr)):
            if not t.is_contiguous():
                raise ValueError(f"{name}: expected a contiguous tensor, got strides {list(t.stride())}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)) \
            or not math.isfinite(softmax_scale):
        raise ValueError(f"softmax_scale: expected a finite float, got {softmax_scale!r}")
    if attn_sink is not None:
        require_tensor("attn_sink", attn_sink, (torch.float32,), dim=1, device=q.device)
        if attn_sink.numel() < h or not attn_sink.is_contiguous():
            raise ValueError(f"attn_sink: expected a contiguous tensor of at least {h} entries")
    require_tensor("out", out, OUT_DTYPES, dim=3, device=q.device)
    if tuple(out.shape[:2]) != (sq, h) or out.shape[2] not in (d, d - rope_head_dim):
        raise ValueError(f"out: expected shape [{sq}, {h}, {d}] or [{sq}, {h}, {d - rope_head_dim}], got "
                         f"{list(out.shape)}")


def sparse_attn_prefill_triton(q: torch.Tensor, kv2: torch.Tensor, indices: torch.Tensor,
                               indptr: torch.Tensor | None, softmax_scale: float, attn_sink: torch.Tensor | None,
                               out: torch.Tensor, rope_head_dim: int, *,
                               topk_length: torch.Tensor | None = None) -> None:
    """Launch ``_sparse_attn_prefill_kernel`` on validated arguments (``sparse_attn_prefill`` checks them):
    ragged int32 ``indices``/``indptr``, or - ``indptr`` None - dense int32/int64 ``indices [sq, k]`` (any strides)
    read in place with ``topk_length [sq]`` (None: each row's count of entries >= 0, SPEC 2's rule, computed on
    the device); ``kv2 [skv, d]``; ``attn_sink`` None or fp32 [>= h]; ``out`` bf16/fp16/fp32.

    The dense path is the one the DSv4 prefill assembly feeds (``impl.prefill_assembly``: padded [T, W] rows and
    their lengths): it reads the rows where they are, with no dense -> ragged conversion and no host read of the
    packed length."""
    _check_launch(q, kv2, indices, indptr, softmax_scale, attn_sink, out, rope_head_dim, topk_length)
    sq, h, d = (int(x) for x in q.shape)
    nope = d - rope_head_dim
    split = splits_nope_rope(nope, rope_head_dim)
    block_a = _next_pow2(nope) if split else _next_pow2(d)
    block_r = _next_pow2(rope_head_dim) if split else 1
    is_bf16 = q.dtype == torch.bfloat16
    # bf16 is read as raw 16-bit words and widened exactly (see impl.triton_helpers.load_as_f32)
    qv = q.view(torch.int16) if is_bf16 else q
    kvv = kv2.view(torch.int16) if is_bf16 else kv2
    dense = indptr is None
    if dense:
        lens = topk_length if topk_length is not None else (indices >= 0).sum(dim=-1)
        row_info, stride_len = lens, lens.stride(0)
        stride_ir, stride_ik, width = indices.stride(0), indices.stride(1), int(indices.shape[1])
    else:
        row_info, stride_len, stride_ir, stride_ik, width = indptr, 1, 0, 1, 0
    sink = attn_sink if attn_sink is not None else row_info
    grid = (sq, triton.cdiv(h, BLOCK_H))
    _sparse_attn_prefill_kernel[grid](
        qv, q.stride(0), q.stride(1), q.stride(2),
        kvv, kv2.stride(0), kv2.stride(1), int(kv2.shape[0]),
        indices, stride_ir, stride_ik, row_info, stride_len, width, sink,
        out, out.stride(0), out.stride(1), out.stride(2),
        h, float(softmax_scale),
        NOPE=nope, ROPE=rope_head_dim, OUT_D=int(out.shape[2]), SPLIT_D=split, BLOCK_A=block_a, BLOCK_R=block_r,
        HAS_SINK=attn_sink is not None, IN_BF16=is_bf16, DENSE=dense, BLOCK_H_=BLOCK_H, BLOCK_K=block_k_for(d),
        num_warps=NUM_WARPS)
