"""Ragged index helpers for the DSv4 sparse decode (SPEC sections 1.3 and 2).

A ragged segment is (indices, indptr): row r owns ``indices[indptr[r]:indptr[r+1]]``, global slot ids of an
``fp8_ds_mla`` cache. -1 marks an entry the decode must mask.

Sources: vllm-project/vllm ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` (``build_ragged_indices_from_dense``),
``vllm/models/deepseek_v4/amd/rocm.py`` (``compute_global_topk_ragged_indices_and_indptr``) and
``vllm/v1/attention/backends/mla/sparse_swa.py`` (``_compute_swa_indices_and_lens_kernel``), restated in SPEC.

These run as torch ops on the tensors' own device (the packed length needs one host read, as upstream's does).

Slot lookups. ``slot = block_table[req, pos // bs] * bs + pos % bs`` is -1 (masked) wherever a piece is missing:
a negative position, a request row outside the table, a column at or past the table's width (``block_table.shape[1]``,
also when the table is a column slice of a wider buffer: nothing past its width is read) or a negative block id.
Slot ids are int32 (SPEC 2); a referenced block whose slots do not all fit int32 (``(b + 1) * bs > 2^31``) is a bad
block table, rejected with a ValueError (one host read) rather than wrapped.

Every argument is checked before any work: tensors of int32 or int64 (``is_valid_token`` bool) on one device,
the documented dimensions and lengths, positive ``block_size`` and ``window``; a bad one is a TypeError or ValueError
naming it.
"""
from __future__ import annotations

import torch

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1


def _require_int_tensor(name: str, t, dims: int | None = None, device=None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{name}: expected dtype int32 or int64, got {str(t.dtype).replace('torch.', '')}")
    if dims is not None and t.dim() != dims:
        raise ValueError(f"{name}: expected {dims} dimensions, got shape {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected device {device} (the device of the other inputs), got {t.device}")


def _require_positive_int(name: str, v) -> None:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")


def _indptr_from_lens(lens: torch.Tensor) -> torch.Tensor:
    indptr = torch.zeros(lens.numel() + 1, dtype=torch.int64, device=lens.device)
    indptr[1:] = torch.cumsum(lens.to(torch.int64), 0)
    if int(indptr[-1]) > INT32_MAX:
        raise ValueError(f"total length {int(indptr[-1])} does not fit the int32 indptr")
    return indptr.to(torch.int32)


def build_ragged_indices_from_dense(dense_indices: torch.Tensor, topk_lens: torch.Tensor | None = None,
                                    num_rows: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``[R, W]`` indices -> (ragged int32 indices, int32 indptr [R+1]).

    Row r keeps its first ``len_r`` entries, in place, len_r = clamp(topk_lens[r] (or, without it, the count of
    entries >= 0), 0, W). With ``num_rows >= 0`` every kept value outside [0, num_rows) becomes -1 (``num_rows`` is
    the number of addressable slots; -1 turns the check off). A kept value that does not fit the int32 output (an
    int64 input with the check off) is a ValueError naming ``dense_indices``, never wrapped.
    """
    _require_int_tensor("dense_indices", dense_indices, 2)
    if isinstance(num_rows, bool) or not isinstance(num_rows, int):
        raise TypeError(f"num_rows: expected an int, got {type(num_rows).__name__}")
    R, W = dense_indices.shape
    if topk_lens is None:
        lens = (dense_indices >= 0).sum(dim=1)
    else:
        _require_int_tensor("topk_lens", topk_lens, 1, dense_indices.device)
        if topk_lens.numel() != R:
            raise ValueError(f"topk_lens: expected {R} entries (one per row of dense_indices), got {topk_lens.numel()}")
        lens = topk_lens.to(torch.int64)
    lens = lens.clamp(0, W)
    keep = torch.arange(W, device=dense_indices.device)[None, :] < lens[:, None]
    values = dense_indices[keep].to(torch.int64)
    if num_rows >= 0:
        values = torch.where((values >= 0) & (values < num_rows), values, torch.full_like(values, -1))
    elif dense_indices.dtype == torch.int64 and values.numel():
        wide = (values < INT32_MIN) | (values > INT32_MAX)
        if bool(wide.any()):
            raise ValueError(f"dense_indices: kept value {int(values[wide][0])} does not fit the int32 output "
                             f"(num_rows=-1 keeps values as they are)")
    return values.to(torch.int32), _indptr_from_lens(lens)


def _lookup_slots(block_table: torch.Tensor, req: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """int64 slot = block_table[req, pos // bs] * bs + pos % bs; -1 where pos < 0, the column is outside the table,
    the request row is outside the table, or the block id is negative (see the module docstring)."""
    R, nb = block_table.shape
    if not (R and nb) or pos.numel() == 0:
        return torch.full_like(pos, -1)
    col = torch.div(pos, block_size, rounding_mode="floor")
    ok = (pos >= 0) & (col < nb) & (req >= 0) & (req < R)
    blk = block_table[req.clamp(0, R - 1), col.clamp(0, nb - 1)].to(torch.int64)
    ok = ok & (blk >= 0)
    too_big = ok & (blk > (INT32_MAX + 1) // block_size - 1)
    if bool(too_big.any()):
        b = int(blk[too_big][0])
        raise ValueError(f"block_table: block id {b} with block_size {block_size} has slots past the int32 slot "
                         f"range (slot ids are int32; at most {(INT32_MAX + 1) // block_size - 1})")
    slot = blk * block_size + pos % block_size
    return torch.where(ok, slot, torch.full_like(slot, -1))


def compute_global_topk_ragged_indices_and_indptr(local_indices: torch.Tensor, token_to_req: torch.Tensor,
                                                  block_table: torch.Tensor, block_size: int,
                                                  is_valid_token: torch.Tensor | None = None
                                                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """C4A: local compressed-row ids ``[T, K]`` (-1 = none) -> packed global slot ids and int32 indptr [T+1].

    len_t = count(local >= 0), or 0 when ``is_valid_token[t]`` is false; the entries >= 0 are kept in their order
    and mapped to slot = block_table[req, i // bs] * bs + i % bs. [I] SPEC does not say what happens when the
    entries >= 0 are not a prefix of the row; they are compacted here (every valid entry is kept, none is read in
    place of a hole). A row id past the block table's width, a request outside it or a negative block id maps to -1
    (the decode masks it) rather than reading outside the table.
    """
    _require_int_tensor("local_indices", local_indices, 2)
    dev = local_indices.device
    _require_int_tensor("token_to_req", token_to_req, 1, dev)
    _require_int_tensor("block_table", block_table, 2, dev)
    _require_positive_int("block_size", block_size)
    T = local_indices.shape[0]
    if token_to_req.numel() != T:
        raise ValueError(f"token_to_req: expected {T} entries (one per row of local_indices), got "
                         f"{token_to_req.numel()}")
    keep = local_indices >= 0
    if is_valid_token is not None:
        if not isinstance(is_valid_token, torch.Tensor) or is_valid_token.dtype != torch.bool:
            got = is_valid_token.dtype if isinstance(is_valid_token, torch.Tensor) else type(is_valid_token).__name__
            raise TypeError(f"is_valid_token: expected a bool tensor, got {got}")
        if is_valid_token.numel() != T:
            raise ValueError(f"is_valid_token: expected {T} entries, got {is_valid_token.numel()}")
        if is_valid_token.device != dev:
            raise ValueError(f"is_valid_token: expected device {dev} (the device of the other inputs), got "
                             f"{is_valid_token.device}")
        keep = keep & is_valid_token.reshape(T, 1)
    lens = keep.sum(dim=1)
    req = token_to_req.to(torch.int64)[:, None].expand_as(local_indices)
    slots = _lookup_slots(block_table, req[keep], local_indices[keep].to(torch.int64), block_size)
    return slots.to(torch.int32), _indptr_from_lens(lens)


def compute_swa_indices_and_lens(positions: torch.Tensor, token_to_req: torch.Tensor, block_table: torch.Tensor,
                                 block_size: int, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """SWA decode window: for token t at position p, start = max(p - window + 1, 0), len = p + 1 - start (0 for a
    negative, i.e. padding, position); entry j < len is the slot of position start + j, the rest -1.
    Returns (indices int32 [T, 1, window], lens int32 [T]). Positions are computed in int64 (an int32 position at
    2^31 - 1 does not overflow)."""
    _require_int_tensor("positions", positions, 1)
    dev = positions.device
    _require_int_tensor("token_to_req", token_to_req, 1, dev)
    _require_int_tensor("block_table", block_table, 2, dev)
    _require_positive_int("block_size", block_size)
    _require_positive_int("window", window)
    T = positions.numel()
    if token_to_req.numel() != T:
        raise ValueError(f"token_to_req: expected {T} entries (one per position), got {token_to_req.numel()}")
    pos = positions.to(torch.int64)
    start = (pos - window + 1).clamp(min=0)
    lens = (pos + 1 - start).clamp(min=0)
    j = torch.arange(window, device=dev)[None, :]
    p = start[:, None] + j
    live = j < lens[:, None]
    req = token_to_req.to(torch.int64)[:, None].expand(T, window)
    # only the live entries are looked up (a padding entry's position is never read, nor checked)
    slots = torch.full((T, window), -1, dtype=torch.int64, device=dev)
    slots[live] = _lookup_slots(block_table, req[live], p[live], block_size)
    return slots.to(torch.int32).reshape(T, 1, window), lens.to(torch.int32)
