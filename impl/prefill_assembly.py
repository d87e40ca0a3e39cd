"""DSv4 sparse prefill assembly (SPEC sections 3 and 9): the chunk plan, the combined top-k + SWA index rows, and
the C4A indexer-K layout gate.

Per chunk of consecutive prefill requests, the prefill gathers a bf16 workspace ``kv [chunk, M, d]``: request b's
compressed rows (dequantized) at columns [0, seq_len // ratio), its last ``gather_len`` SWA tokens at [N, N +
gather_len). The combined index row of a query token points into that workspace flattened to ``[chunk * M, d]``.

``plan_prefill_chunks`` (host Python, as upstream's planner is): requests are taken in order; a chunk grows by one
more request while ``count * (max(seq // ratio) + max(gather)) <= budget``, with gather = q_len + min(prefix,
window - 1) (the upper bound; the kernels get the exact, possibly smaller, lengths) and the area budget
``PREFILL_CHUNK_SIZE * (ceil(max_model_len / ratio) + window + max_num_batched_tokens)`` (the compressed term 0 for
SWA-only layers). One request always fits, so every chunk holds at least one. Per chunk N = max(seq // ratio) (0
for SWA-only), M = N + max(gather).

``combine_topk_swa_indices`` (a Triton kernel): for request b of the chunk and its token at position pos
(positions seq_len - q_len .. seq_len - 1):

    topk_len = min((pos + 1) // ratio, topk)     entries topk_local + M*b where 0 <= topk_local < N, else -1
    swa_start = max(pos - window + 1, 0, seq_len - gather_len),  swa_len = pos + 1 - swa_start
                                                  entries M*b + N + (swa_start - (seq_len - gather_len)) + j

then -1 up to the row width ``ceil((topk + window + max_image_tokens) / 128) * 128``.

Image visibility (DSv4's vision variant, ``max_image_tokens`` > 0): a token inside an image span also sees
``left_visible[t]`` tokens to its left and ``right_visible[t]`` to its right (upstream's SWA metadata builder counts
them from the spans: min(pos - span_start, max_image_tokens - 1) and min(span_end - pos, max_image_tokens)). The
SWA part then covers positions max(min(pos - window + 1, pos - left), 0, seq_len - gather_len) ..
min(pos + right, seq_len - 1): the window widened to the image's visible left part, and past the query token up to
its visible right part within the sequence so far. Rows are ``window + max_image_tokens`` SWA entries wide even for
a batch without image spans (no visibility tensors: left = right = 0). With gather_len = q_len + min(prefix, window -
1) the start is SPEC 3's max(pos - window + 1, 0) (swa_len = min(pos + 1, window)); a smaller gather (bounded
replay: context below the replay start has no window KV) starts the window at the first gathered token instead of
below the workspace's SWA region. ``lens[t] = topk_len + swa_len`` counts the -1 top-k entries too: the attention
masks them.

``indexer_k_layout_for_ratio``: the indexer-K cache layout the writer and the gather use for a layer of a given
compress ratio - C4A (ratio 4) is block-flat NORMAL, every other ratio keeps the 16 x 16 SHUFFLE tiles (upstream
passes no layout there, so a block size of 1 is NORMAL by ``impl.formats.default_indexer_layout``).

Sources: vllm-project/vllm 0.33.0 ``vllm/models/deepseek_v4/amd/rocm.py`` (``combine_topk_swa_indices``, its
kernel, ``_forward_prefill``), ``vllm/v1/attention/backends/mla/sparse_swa.py``
(``DeepseekSparseSWAMetadata.get_prefill_chunk_plan``, the prefill gather-length kernel),
``vllm/models/deepseek_v4/attention.py`` (``PREFILL_CHUNK_SIZE``), ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py``
(``_indexer_k_is_c4a_block_flat``), restated in SPEC 3 and 9.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch
import triton
import triton.language as tl

from impl.formats import default_indexer_layout
from impl.validation import dtype_name, require_kernel_device

#: requests per chunk the area budget is sized for (``DeepseekV4Attention.PREFILL_CHUNK_SIZE`` in vLLM 0.33.0)
PREFILL_CHUNK_SIZE = 4
#: DSv4's ``sliding_window`` (HF DeepseekV4Config default; vLLM's fallback too)
SLIDING_WINDOW = 128
#: DSv4's ``index_topk``
INDEX_TOPK = 512
#: combined rows are padded with -1 to a multiple of this many entries
COMBINED_ROW_ALIGNMENT = 128
#: the C4A compress ratio: its indexer-K cache is block-flat (NORMAL)
C4A_RATIO = 4
#: tokens per program of the combine kernel (columns are walked COMBINED_ROW_ALIGNMENT at a time)
COMBINE_BLOCK_T = 16
INT32_MAX = 2 ** 31 - 1


class PrefillChunk(NamedTuple):
    """Requests [start, end) of the prefill batch, their workspace's compressed width N and row width M
    (compares equal to upstream's ``(start, end, N, M)`` tuples)."""

    start: int
    end: int
    N: int
    M: int


def _positive_int(name: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f"{name}: expected an int >= {minimum}, got {v!r}")
    return v


def _host_ints(name: str, v) -> list[int]:
    """A 1-D sequence of ints (a list, a tuple or a 1-D integer tensor on any device) as a Python list."""
    if isinstance(v, torch.Tensor):
        if v.dtype.is_floating_point or v.dtype.is_complex or v.dtype == torch.bool:
            raise TypeError(f"{name}: expected an integer tensor, got dtype {dtype_name(v.dtype)}")
        if v.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {list(v.shape)}")
        return [int(x) for x in v.detach().cpu().tolist()]
    if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
        raise TypeError(f"{name}: expected a sequence of ints or a 1-D integer tensor, got {type(v).__name__}")
    out = []
    for i, x in enumerate(v):
        if isinstance(x, bool) or not isinstance(x, int):
            raise TypeError(f"{name}[{i}]: expected an int, got {x!r}")
        out.append(x)
    return out


# ----------------------------------------------------------------------------------------------------------------
# chunk plan (host)
# ----------------------------------------------------------------------------------------------------------------

def prefill_workspace_budget(*, compress_ratio: int, max_model_len: int, max_num_batched_tokens: int,
                             window_size: int = SLIDING_WINDOW, prefill_chunk_size: int = PREFILL_CHUNK_SIZE,
                             has_compressed: bool | None = None) -> int:
    """The area (rows of the bf16 workspace) a chunk may take: ``prefill_chunk_size * (ceil(max_model_len /
    ratio) [0 without a compressed region] + window + max_num_batched_tokens)``. ``has_compressed`` defaults to
    ratio > 1 (ratio <= 1 is an SWA-only layer)."""
    r = _positive_int("compress_ratio", compress_ratio)
    if has_compressed is None:
        has_compressed = r > 1
    compressed = -(-max_model_len // r) if has_compressed else 0
    return prefill_chunk_size * (compressed + window_size + max_num_batched_tokens)


def plan_prefill_chunks(seq_lens, query_lens, *, compress_ratio: int, max_model_len: int,
                        max_num_batched_tokens: int, window_size: int = SLIDING_WINDOW,
                        prefill_chunk_size: int = PREFILL_CHUNK_SIZE,
                        has_compressed: bool | None = None) -> list[PrefillChunk]:
    """Chunks of the prefill requests (``seq_lens`` / ``query_lens``: one entry per request, ints or 1-D integer
    tensors, read on the host) for the bf16 gather workspace; see the module docstring for the rule.

    ``has_compressed`` (default ``compress_ratio > 1``) says whether the layer gathers a compressed region (N > 0).
    Bad input raises before anything is planned: lengths that disagree, q_len < 1, seq_len < q_len, seq_len past
    ``max_model_len`` or q_len past ``max_num_batched_tokens`` (either would let one request outgrow the budget).
    Returns a list of :class:`PrefillChunk`, empty for no requests."""
    ratio = _positive_int("compress_ratio", compress_ratio)
    mml = _positive_int("max_model_len", max_model_len)
    mnbt = _positive_int("max_num_batched_tokens", max_num_batched_tokens)
    window = _positive_int("window_size", window_size)
    cs = _positive_int("prefill_chunk_size", prefill_chunk_size)
    if has_compressed is not None and not isinstance(has_compressed, bool):
        raise TypeError(f"has_compressed: expected a bool or None, got {has_compressed!r}")
    seqs = _host_ints("seq_lens", seq_lens)
    qs = _host_ints("query_lens", query_lens)
    if len(seqs) != len(qs):
        raise ValueError(f"query_lens: expected {len(seqs)} entries (one per request of seq_lens), got {len(qs)}")
    for r, (s, q) in enumerate(zip(seqs, qs)):
        if q < 1 or q > mnbt:
            raise ValueError(f"query_lens[{r}]: expected in [1, max_num_batched_tokens = {mnbt}], got {q}")
        if s < q or s > mml:
            raise ValueError(f"seq_lens[{r}]: expected in [query_lens[{r}] = {q}, max_model_len = {mml}], got {s}")
    if has_compressed is None:
        has_compressed = ratio > 1
    budget = prefill_workspace_budget(compress_ratio=ratio, max_model_len=mml, max_num_batched_tokens=mnbt,
                                      window_size=window, prefill_chunk_size=cs, has_compressed=has_compressed)
    compressed = [s // ratio if has_compressed else 0 for s in seqs]
    gather = [q + min(max(s - q, 0), window - 1) for s, q in zip(seqs, qs)]
    plan: list[PrefillChunk] = []
    start, n = 0, len(seqs)
    while start < n:
        n_max, g_max, end = compressed[start], gather[start], start + 1
        while end < n:
            cand_n, cand_g = max(n_max, compressed[end]), max(g_max, gather[end])
            if (end - start + 1) * (cand_n + cand_g) > budget:
                break
            n_max, g_max, end = cand_n, cand_g, end + 1
        plan.append(PrefillChunk(start, end, n_max, n_max + g_max))
        start = end
    return plan


# ----------------------------------------------------------------------------------------------------------------
# combined top-k + SWA rows (Triton)
# ----------------------------------------------------------------------------------------------------------------

def combined_row_width(topk: int, window_size: int, max_image_tokens: int = 0) -> int:
    """Entries per combined row: topk + window + max_image_tokens rounded up to a multiple of
    COMBINED_ROW_ALIGNMENT (128)."""
    a = COMBINED_ROW_ALIGNMENT
    return (topk + window_size + max_image_tokens + a - 1) // a * a


@triton.jit
def _combine_topk_swa_indices_kernel(
        topk_ptr, stride_topk_t, stride_topk_k,
        qsl_ptr, seq_ptr, gather_ptr, left_ptr, right_ptr,
        out_ptr, stride_out_t, lens_ptr,
        M, N,
        TOP_K: tl.constexpr, RATIO: tl.constexpr, WINDOW: tl.constexpr, ROW_W: tl.constexpr,
        HAS_IMAGE: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr):
    """Combined top-k + SWA index rows of one chunk.

    Layout: ``topk`` [T, >= TOP_K] integer rows (any strides), chunk-local query tokens; ``qsl`` [R + 1] query
    start offsets (any base: qsl[0] is subtracted), ``seq`` / ``gather`` [R]; ``out`` int32 [T, ROW_W] rows with
    stride ``stride_out_t`` and unit column stride, ``lens`` int32 [T]; with HAS_IMAGE, ``left`` / ``right`` [T]
    chunk-local visible counts (read only then). ROW_W is a multiple of BLOCK_C.
    Grid (R, cdiv(max q_len, BLOCK_T)): program (b, tb) takes tokens tb*BLOCK_T.. of request b and walks their
    whole rows BLOCK_C columns at a time, writing every column - top-k part, SWA part and the -1 padding - so the
    output needs no fill beforehand.
    Invariant (checked on the host): q_len <= gather_len <= seq_len and N + gather_len <= M, so an SWA entry lies
    in [M*b + N, M*b + N + gather_len), a kept top-k entry in [M*b, M*b + N), and R*M fits int32; a top-k column
    is read only below topk_len <= TOP_K <= the row's width; topk_len + swa_len <= ROW_W (the host checks each
    token's image-widened SWA part against window + max_image_tokens)."""
    b = tl.program_id(0)
    tb = tl.program_id(1)
    base = tl.load(qsl_ptr)
    q_start = tl.load(qsl_ptr + b) - base
    q_len = tl.load(qsl_ptr + b + 1) - base - q_start
    seq_len = tl.load(seq_ptr + b)
    gather_start = seq_len - tl.load(gather_ptr + b)
    t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
    t_ok = t < q_len
    pos = seq_len - q_len + t
    topk_len = tl.minimum((pos + 1) // RATIO, TOP_K)
    row = (q_start + t).to(tl.int64)
    if HAS_IMAGE:
        left = tl.load(left_ptr + row, mask=t_ok, other=0)
        right = tl.load(right_ptr + row, mask=t_ok, other=0)
    else:
        left = tl.zeros_like(pos)
        right = tl.zeros_like(pos)
    # an image token's window reaches back to the first of its visible image tokens, when that lies further
    left_add = tl.maximum(left - (WINDOW - 1), 0)
    swa_start = tl.maximum(tl.maximum(pos - WINDOW + 1 - left_add, 0), gather_start)
    # and forward to its visible right part, within the tokens the sequence holds so far
    swa_end = tl.minimum(pos + right + 1, seq_len)
    swa_len = tl.maximum(swa_end - swa_start, 0)
    req_base = M * b
    swa_first = req_base + N + swa_start - gather_start
    for c0 in range(0, ROW_W, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        in_topk = c[None, :] < topk_len[:, None]
        local = tl.load(topk_ptr + row[:, None] * stride_topk_t + c[None, :].to(tl.int64) * stride_topk_k,
                        mask=t_ok[:, None] & in_topk, other=-1)
        keep = (local >= 0) & (local < N)
        topk_val = tl.where(keep, local + req_base, -1)
        j = c[None, :] - topk_len[:, None]
        in_swa = (j >= 0) & (j < swa_len[:, None])
        val = tl.where(in_topk, topk_val, tl.where(in_swa, swa_first[:, None] + j, -1))
        tl.store(out_ptr + row[:, None] * stride_out_t + c[None, :], val.to(tl.int32), mask=t_ok[:, None])
    tl.store(lens_ptr + row, (topk_len + swa_len).to(tl.int32), mask=t_ok)


def _index_tensor(name: str, t, device=None) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected dtype int32 or int64, got {dtype_name(t.dtype)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of topk_indices), got {t.device}")
    return t


def _image_visibility(left, right, T: int, window: int, max_image_tokens: int, dev):
    """The visibility tensors (contiguous, on ``dev``) or (None, None); every check the kernel's row width relies
    on, before the launch."""
    if (left is None) != (right is None):
        raise ValueError("left_visible, right_visible: give both or neither")
    if left is None:
        return None, None
    out = []
    for name, t in (("left_visible", left), ("right_visible", right)):
        _index_tensor(name, t, dev)
        if t.dim() != 1 or t.numel() != T:
            raise ValueError(f"{name}: expected shape [{T}] (one count per query token), got {list(t.shape)}")
        if T and int(t.min()) < 0:
            raise ValueError(f"{name}: expected counts >= 0, got {t.tolist()}")
        out.append(t.contiguous())
    widest = (torch.clamp(out[0].to(torch.int64), min=window - 1) + out[1].to(torch.int64) + 1)
    if T and int(widest.max()) > window + max_image_tokens:
        t = int(widest.argmax())
        raise ValueError(f"left_visible, right_visible: token {t} sees {int(widest[t])} SWA entries "
                         f"(max(window - 1, left) + right + 1), more than window + max_image_tokens = "
                         f"{window + max_image_tokens}")
    return out[0], out[1]


def combine_topk_swa_indices(topk_indices: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                             gather_lens: torch.Tensor, *, compress_ratio: int, M: int, N: int,
                             topk: int = INDEX_TOPK, window_size: int = SLIDING_WINDOW,
                             max_image_tokens: int = 0, left_visible: torch.Tensor | None = None,
                             right_visible: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The combined index rows of one prefill chunk (see the module docstring).

    ``topk_indices``: int32/int64 ``[T, K]`` or ``[T, 1, K]`` chunk-local top-k rows (K >= ``topk``; any strides;
    ignored when ``topk`` is 0, the SWA-only case). ``query_start_loc`` ``[R + 1]`` (any base), ``seq_lens`` and
    ``gather_lens`` ``[R]``: int32/int64 on topk_indices' device, read once on the host for the checks below.
    ``compress_ratio`` >= 1, ``topk`` >= 0 (0: SWA-only; topk_len is then 0), ``window_size`` >= 1, the chunk's
    ``N`` and ``M`` (``plan_prefill_chunks``). ``max_image_tokens`` >= 0 widens every row's SWA part to
    ``window + max_image_tokens``; ``left_visible`` / ``right_visible`` (both or neither) int32/int64 [T] >= 0 are
    the chunk's per-token visible image counts (module docstring), each token's SWA part at most
    max(window - 1, left) + right + 1 <= window + max_image_tokens entries.

    Checked before the launch: T == query_start_loc[-1] - query_start_loc[0], a non-decreasing query_start_loc,
    per request q_len <= gather_len <= seq_len and N + gather_len <= M, N >= seq_len // ratio when topk > 0 (the
    compressed rows fit below N), R * M within int32.
    Returns ``(combined int32 [T, combined_row_width(topk, window)], lens int32 [T])``."""
    _index_tensor("topk_indices", topk_indices)
    require_kernel_device("topk_indices", topk_indices)
    dev = topk_indices.device
    if topk_indices.dim() == 3 and topk_indices.shape[1] == 1:
        topk2 = topk_indices[:, 0, :]
    elif topk_indices.dim() == 2:
        topk2 = topk_indices
    else:
        raise ValueError(f"topk_indices: expected shape [T, K] or [T, 1, K], got {list(topk_indices.shape)}")
    ratio = _positive_int("compress_ratio", compress_ratio)
    window = _positive_int("window_size", window_size)
    k = _positive_int("topk", topk, 0)
    n_ = _positive_int("N", N, 0)
    m_ = _positive_int("M", M, 0)
    if k > topk2.shape[1]:
        raise ValueError(f"topk: expected at most the width of topk_indices ({topk2.shape[1]}), got {k}")
    for name, t in (("query_start_loc", query_start_loc), ("seq_lens", seq_lens), ("gather_lens", gather_lens)):
        _index_tensor(name, t, dev)
        if t.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {list(t.shape)}")
    R = int(seq_lens.numel())
    if query_start_loc.numel() != R + 1:
        raise ValueError(f"query_start_loc: expected {R + 1} entries (one more than seq_lens), got "
                         f"{query_start_loc.numel()}")
    if gather_lens.numel() != R:
        raise ValueError(f"gather_lens: expected {R} entries (one per request of seq_lens), got {gather_lens.numel()}")
    qsl = [int(x) for x in query_start_loc.cpu().tolist()]
    seqs = [int(x) for x in seq_lens.cpu().tolist()]
    gathers = [int(x) for x in gather_lens.cpu().tolist()]
    T = int(topk2.shape[0])
    if qsl[-1] - qsl[0] != T:
        raise ValueError(f"query_start_loc: spans {qsl[-1] - qsl[0]} tokens, but topk_indices has {T} rows")
    for r in range(R):
        q = qsl[r + 1] - qsl[r]
        if q < 0:
            raise ValueError(f"query_start_loc: expected a non-decreasing tensor, got entries {qsl[r]} then "
                             f"{qsl[r + 1]} at request {r}")
        if seqs[r] < q:
            raise ValueError(f"seq_lens[{r}]: expected at least the request's {q} query tokens, got {seqs[r]}")
        if not q <= gathers[r] <= seqs[r]:
            raise ValueError(f"gather_lens[{r}]: expected in [q_len = {q}, seq_len = {seqs[r]}], got {gathers[r]}")
        if n_ + gathers[r] > m_:
            raise ValueError(f"M: expected at least N + gather_lens[{r}] = {n_ + gathers[r]}, got {m_}")
        if k > 0 and seqs[r] // ratio > n_:
            raise ValueError(f"N: expected at least seq_lens[{r}] // compress_ratio = {seqs[r] // ratio} (the "
                             f"request's compressed rows), got {n_}")
    if R * m_ > INT32_MAX:
        raise ValueError(f"M: {R} requests of {m_} workspace rows exceed int32 indices")
    mit = _positive_int("max_image_tokens", max_image_tokens, 0)
    left_t, right_t = _image_visibility(left_visible, right_visible, T, window, mit, dev)
    width = combined_row_width(k, window, mit)
    combined = torch.empty(T, width, dtype=torch.int32, device=dev)
    lens = torch.empty(T, dtype=torch.int32, device=dev)
    max_q = max((qsl[r + 1] - qsl[r] for r in range(R)), default=0)
    if T == 0 or max_q == 0:
        return combined, lens
    grid = (R, triton.cdiv(max_q, COMBINE_BLOCK_T))
    _combine_topk_swa_indices_kernel[grid](
        topk2, topk2.stride(0), topk2.stride(1),
        query_start_loc, seq_lens, gather_lens,
        left_t if left_t is not None else lens, right_t if right_t is not None else lens,
        combined, combined.stride(0), lens,
        m_, n_,
        TOP_K=k, RATIO=ratio, WINDOW=window, ROW_W=width, HAS_IMAGE=left_t is not None,
        BLOCK_T=COMBINE_BLOCK_T, BLOCK_C=COMBINED_ROW_ALIGNMENT)
    return combined, lens


# ----------------------------------------------------------------------------------------------------------------
# C4A indexer-K layout gate
# ----------------------------------------------------------------------------------------------------------------

def indexer_k_is_c4a_block_flat(compress_ratio: int) -> bool:
    """True for the C4A ratio (4): that layer's indexer-K cache is block-flat (NORMAL). Ratios 1 and 2 (and any
    other) keep the 16 x 16 SHUFFLE tiles."""
    return _positive_int("compress_ratio", compress_ratio) == C4A_RATIO


def indexer_k_layout_for_ratio(compress_ratio: int, block_size: int | None = None) -> str:
    """The indexer-K cache layout ("normal" | "shuffle", ``impl.formats``' names) for a layer of this compress
    ratio: "normal" for C4A (ratio 4); otherwise "shuffle", or - given ``block_size`` - the default layout for
    that block size (``impl.formats.default_indexer_layout``: "normal" when it is 1), which is what upstream's
    gather gets when it passes no layout."""
    if indexer_k_is_c4a_block_flat(compress_ratio):
        return "normal"
    if block_size is None:
        return "shuffle"
    return default_indexer_layout(_positive_int("block_size", block_size))
