"""A deterministic (token, kv-split) work partition across CUs, and a consumer that executes it.

AITER's ``get_mla_metadata_v1`` (SPEC section 6) builds a persistent work-stealing partition of sparse-MLA decode work
plus reduce maps that merge partial outputs; its internals are not public. This module defines our own partition with
the same role and a documented layout, so that the metadata builder has a real artifact to cache and a stale partition
shows up as wrong attention output (the consumer below executes the partition literally, item by item).

Scheme (every step is a pure function of ``kv_indptr``, ``num_cu`` and ``kv_granularity``):

1. Token ``t`` owns the kv entries ``[kv_indptr[t], kv_indptr[t+1])`` of ``paged_kv_indices`` (its sparse length
   ``L_t``). It costs ``g_t = ceil(L_t / kv_granularity)`` granules; an empty token costs none.
2. ``W = sum(g_t)``; each CU gets a budget of ``B = max(1, ceil(W / num_cu))`` granules.
3. Tokens are walked in order with a cursor ``(cu, used)``. A non-empty token is cut into pieces: each piece takes
   ``min(remaining, B - used)`` granules on the current CU; when the CU's budget is spent the cursor moves to the next
   CU. An empty token becomes one zero-length item on the current CU (it writes zeros).
4. A token cut into one piece is a *direct* item (``partial = -1``: it writes the final output). A token cut into
   ``k > 1`` pieces gets ``k`` consecutive partial slots and one reduce group that merges them by log-sum-exp.

Because the cursor only moves forward, each CU's items are contiguous and in token order. Capacity bounds (so the
buffers can be persistent): every CU advance cuts at most one token, so ``items <= T + num_cu - 1``,
``partials <= 2 * (num_cu - 1)`` and ``reduce groups <= num_cu - 1``.

Buffers (int32, zero-initialised, the live prefix of each written by :func:`write_work_partition`):

- ``work_meta[3]``: ``(num_items, num_partials, num_reduce_groups)``.
- ``work_indptr[num_cu + 1]``: CU ``c`` runs ``work_info[work_indptr[c]:work_indptr[c+1]]``.
- ``work_info[max_items, 4]``: ``(token, kv_begin, kv_end, partial)``; ``kv_begin``/``kv_end`` are absolute positions
  in ``paged_kv_indices``; ``partial`` is ``-1`` for a direct item.
- ``reduce_indptr[num_cu + 1]``: group ``r`` merges ``reduce_partial_map[reduce_indptr[r]:reduce_indptr[r+1]]``.
- ``reduce_final_map[num_cu]``: the token group ``r`` writes.
- ``reduce_partial_map[2 * num_cu]``: partial slot ids.

Live extents: ``work_indptr`` and ``reduce_indptr`` are live up to ``num_cu + 1`` and ``num_reduce + 1`` entries
respectively (``work_indptr`` always covers every CU); ``work_info`` rows ``[0, num_items)``;
``reduce_final_map[0, num_reduce)``; ``reduce_partial_map[0, num_partials)``. Everything past is zero.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from impl.validation import require_tensor

WORK_INFO_FIELDS = 4  # token, kv_begin, kv_end, partial
#: AITER is called with ``kv_granularity=16`` upstream (SPEC section 6); the same default here.
DEFAULT_KV_GRANULARITY = 16

PARTITION_BUFFERS = ("work_meta", "work_indptr", "work_info", "reduce_indptr", "reduce_final_map",
                     "reduce_partial_map")


def partition_capacity(max_tokens: int, num_cu: int) -> dict[str, tuple[int, ...]]:
    """Shapes of the persistent partition buffers for ``max_tokens`` tokens on ``num_cu`` CUs."""
    if max_tokens < 0 or num_cu < 1:
        raise ValueError(f"max_tokens/num_cu: expected >= 0 and >= 1, got {max_tokens} and {num_cu}")
    return {
        "work_meta": (3,),
        "work_indptr": (num_cu + 1,),
        "work_info": (max_tokens + num_cu, WORK_INFO_FIELDS),
        "reduce_indptr": (num_cu + 1,),
        "reduce_final_map": (num_cu,),
        "reduce_partial_map": (2 * num_cu,),
    }


def allocate_partition_buffers(max_tokens: int, num_cu: int, device="cpu") -> dict[str, torch.Tensor]:
    """Zero-initialised partition buffers (zeros, never ``empty``: a graph may read past the live extent)."""
    return {name: torch.zeros(shape, dtype=torch.int32, device=device)
            for name, shape in partition_capacity(max_tokens, num_cu).items()}


def compute_work_partition(kv_indptr: np.ndarray, num_cu: int,
                           kv_granularity: int = DEFAULT_KV_GRANULARITY) -> dict[str, np.ndarray]:
    """The live part of each partition buffer for ``kv_indptr`` (host int array of ``T + 1`` entries)."""
    if num_cu < 1 or kv_granularity < 1:
        raise ValueError(f"num_cu/kv_granularity: expected >= 1, got {num_cu} and {kv_granularity}")
    indptr = np.asarray(kv_indptr, dtype=np.int64)
    lens = np.diff(indptr)
    granules = (lens + kv_granularity - 1) // kv_granularity
    total = int(granules.sum())
    budget = max(1, math.ceil(total / num_cu))

    items: list[tuple[int, int, int, int]] = []
    item_cu: list[int] = []
    final_map: list[int] = []
    reduce_indptr = [0]
    partial_map: list[int] = []
    num_partials = 0
    cu, used = 0, 0
    for t in range(lens.shape[0]):
        begin, end = int(indptr[t]), int(indptr[t + 1])
        if begin == end:
            items.append((t, begin, begin, -1))
            item_cu.append(cu)
            continue
        pieces: list[tuple[int, int, int]] = []
        remaining = int(granules[t])
        pos = begin
        while remaining > 0:
            if used == budget:
                cu, used = cu + 1, 0
            take = min(remaining, budget - used)
            stop = min(pos + take * kv_granularity, end)
            pieces.append((cu, pos, stop))
            used += take
            remaining -= take
            pos = stop
        if len(pieces) == 1:
            c, b, e = pieces[0]
            items.append((t, b, e, -1))
            item_cu.append(c)
        else:
            for c, b, e in pieces:
                items.append((t, b, e, num_partials))
                item_cu.append(c)
                partial_map.append(num_partials)
                num_partials += 1
            final_map.append(t)
            reduce_indptr.append(len(partial_map))

    counts = np.bincount(np.asarray(item_cu, dtype=np.int64), minlength=num_cu) if items else np.zeros(num_cu, np.int64)
    work_indptr = np.zeros(num_cu + 1, dtype=np.int32)
    work_indptr[1:] = np.cumsum(counts)
    info = np.asarray(items, dtype=np.int32).reshape(-1, WORK_INFO_FIELDS)
    return {
        "work_meta": np.asarray([len(items), num_partials, len(final_map)], dtype=np.int32),
        "work_indptr": work_indptr,
        "work_info": info,
        "reduce_indptr": np.asarray(reduce_indptr if final_map else [], dtype=np.int32),
        "reduce_final_map": np.asarray(final_map, dtype=np.int32),
        "reduce_partial_map": np.asarray(partial_map, dtype=np.int32),
    }


def write_work_partition(buffers: dict[str, torch.Tensor], live: dict[str, np.ndarray],
                         prev_lengths: dict[str, int] | None) -> dict[str, int]:
    """Copy a host partition into the persistent buffers, zeroing only what the previous partition wrote beyond the
    new live extents (shrink-tail). Returns the new live lengths (to pass back next time)."""
    new_lengths = {name: int(arr.shape[0]) for name, arr in live.items()}
    for name, arr in live.items():
        buf = buffers[name]
        n = new_lengths[name]
        if arr.shape[1:] != tuple(buf.shape[1:]) or n > buf.shape[0]:
            raise ValueError(f"{name}: partition needs {list(arr.shape)}, buffer holds {list(buf.shape)}")
        prev = (prev_lengths or {}).get(name, 0)
        if prev > n:
            buf[n:prev].fill_(0)
        if n:
            buf[:n].copy_(torch.from_numpy(np.ascontiguousarray(arr)), non_blocking=True)
    return new_lengths


_FLOATS = (torch.bfloat16, torch.float16, torch.float32)
_PARTITION_KEYS = ("work_meta", "work_info", "work_indptr", "reduce_indptr", "reduce_final_map", "reduce_partial_map")


def _check_consumer(q, kv_cache, kv_indices, partition, softmax_scale, kv_lora_rank, out):
    """The consumer's argument checks (before anything is written): shapes, dtypes, devices, and every slot id an
    item of the partition reads within ``kv_cache`` (holes, < 0, are masked). Returns the items (host lists), the
    partial count and the reduce count."""
    require_tensor("q", q, _FLOATS, dim=3)
    require_tensor("kv_cache", kv_cache, _FLOATS, dim=2, device=q.device)
    if kv_cache.shape[1] != q.shape[2]:
        raise ValueError(f"kv_cache: expected rows of q's width {q.shape[2]}, got shape {list(kv_cache.shape)}")
    if isinstance(kv_lora_rank, bool) or not isinstance(kv_lora_rank, int) or not 1 <= kv_lora_rank <= q.shape[2]:
        raise ValueError(f"kv_lora_rank: expected an int in [1, {q.shape[2]}], got {kv_lora_rank!r}")
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float)):
        raise TypeError(f"softmax_scale: expected a float, got {type(softmax_scale).__name__}")
    require_tensor("kv_indices", kv_indices, (torch.int32, torch.int64), dim=1, device=q.device)
    if not isinstance(partition, dict) or any(k not in partition for k in _PARTITION_KEYS):
        raise TypeError(f"partition: expected a dict with {', '.join(_PARTITION_KEYS)}")
    T, H = int(q.shape[0]), int(q.shape[1])
    if out is not None:
        require_tensor("out", out, (q.dtype,), dim=3, device=q.device)
        if tuple(out.shape) != (T, H, kv_lora_rank):
            raise ValueError(f"out: expected shape {[T, H, kv_lora_rank]}, got {list(out.shape)}")
    meta = partition["work_meta"].cpu()
    n_items, n_partials, n_reduce = (int(x) for x in meta[:3])
    info = partition["work_info"][:n_items].cpu().tolist()
    ids = kv_indices.to("cpu", torch.int64)
    for t, b, e, _ in info:
        if e > ids.numel():
            raise ValueError(f"kv_indices: an item reads entries [{b}, {e}) of {ids.numel()}")
        bad = (ids[b:e] >= kv_cache.shape[0]).nonzero().flatten()
        if len(bad):
            i = b + int(bad[0])
            raise ValueError(f"kv_indices: entry {i} (read for token {t}) is slot {int(ids[i])}, past kv_cache's "
                             f"{kv_cache.shape[0]} rows")
    return info, n_partials, n_reduce


def sparse_decode_from_partition(q: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor,
                                 partition: dict[str, torch.Tensor], softmax_scale: float,
                                 kv_lora_rank: int = 512, out: torch.Tensor | None = None) -> torch.Tensor:
    """DSv3.2 sparse decode attention computed by executing ``partition`` item by item.

    Layout: ``q [T, H, D]`` (D = 576: 512 latent + 64 rope), ``kv_cache [slots, D]``, ``kv_indices`` the flat global
    slot ids (``-1`` entries are holes and are masked), ``out [T, H, kv_lora_rank]`` in ``q.dtype``. Each item computes,
    in fp32, ``softmax(q . k * scale) @ v`` over its kv range (``v`` = the first ``kv_lora_rank`` dims of the row) and
    either writes the output (direct item) or a partial ``(o, lse)``; reduce groups then merge partials by log-sum-exp.
    An item with no valid entry gives zeros (lse = -inf). Relies on: the partition describes the current
    ``kv_indices``; it is trusted, not checked, so a stale one produces wrong output. Tokens no item covers keep
    whatever ``out`` held (NaN when ``out`` is allocated here).
    """
    info, n_partials, n_reduce = _check_consumer(q, kv_cache, kv_indices, partition, softmax_scale, kv_lora_rank,
                                                 out)
    T, H, _ = q.shape
    if out is None:
        out = torch.full((T, H, kv_lora_rank), float("nan"), dtype=q.dtype, device=q.device)
    # Partials are poisoned so that a reduce reading a slot no item wrote yields NaN.
    part_o = torch.full((max(n_partials, 1), H, kv_lora_rank), float("nan"), dtype=torch.float32, device=q.device)
    part_lse = torch.full((max(n_partials, 1), H), float("nan"), dtype=torch.float32, device=q.device)
    work_indptr = partition["work_indptr"].cpu().tolist()
    for cu in range(len(work_indptr) - 1):
        for i in range(work_indptr[cu], work_indptr[cu + 1]):
            t, b, e, p = info[i]
            ids = kv_indices[b:e].to(torch.int64)
            ids = ids[ids >= 0]
            if ids.numel() == 0:
                o = torch.zeros(H, kv_lora_rank, dtype=torch.float32, device=q.device)
                lse = torch.full((H,), float("-inf"), dtype=torch.float32, device=q.device)
            else:
                rows = kv_cache[ids].to(torch.float32)
                s = (q[t].to(torch.float32) @ rows.T) * softmax_scale
                m = s.max(dim=-1).values
                pexp = torch.exp(s - m[:, None])
                denom = pexp.sum(dim=-1)
                o = (pexp @ rows[:, :kv_lora_rank]) / denom[:, None]
                lse = m + torch.log(denom)
            if p < 0:
                out[t] = o.to(out.dtype)
            else:
                part_o[p] = o
                part_lse[p] = lse
    reduce_indptr = partition["reduce_indptr"].cpu().tolist()
    final_map = partition["reduce_final_map"].cpu().tolist()
    partial_map = partition["reduce_partial_map"].cpu().tolist()
    for r in range(n_reduce):
        t = final_map[r]
        slots = torch.tensor(partial_map[reduce_indptr[r]:reduce_indptr[r + 1]], dtype=torch.int64)
        lses = part_lse[slots]  # [k, H]
        top = lses.max(dim=0).values
        safe_top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
        w = torch.exp(lses - safe_top)  # all -inf -> weights 0 -> output 0
        total = w.sum(dim=0)
        merged = (w[:, :, None] * part_o[slots]).sum(dim=0) / torch.where(total > 0, total, 1.0)[:, None]
        out[t] = merged.to(out.dtype)
    return out
