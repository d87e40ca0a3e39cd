"""Persistent graph buffers for ragged decode metadata (SPEC section 2, ``_copy_ragged_to_graph_buffers``).

A captured graph bakes in the data pointers of every tensor it reads. The ragged (indices, indptr) pairs that the
decode consumes change every step, so each step copies them into persistent buffers allocated once, and hands the
decode *views* of those buffers:

- the indptr view is ``indptr_buffer[:num_rows + 1]``, a copy of the whole source indptr (its last entry is the
  true NNZ, which is what bounds every read of the indices);
- the indices view always starts at the persistent base pointer ``indices_buffer.data_ptr()``; the source entries
  are copied to its start. Its length follows ``target.ragged_view_rule``:

  - ``"full"`` (gfx942, generic): ``max(num_rows * max_per_row, 1)``, the graph's whole capacity;
  - ``"source"`` (gfx950): ``max(source.numel(), 1)``, the width of the ragged index tensor handed in (which may be
    wider than the NNZ), so that the sync-free split selector, which only sees ``numel()``, sizes its grid by the
    real work while indptr still bounds reads.

Source: vllm-project/vllm ``vllm/models/deepseek_v4/amd/rocm.py`` ``_copy_ragged_to_graph_buffers`` (the gfx950
narrowing came with the change described in seed 004), as SPEC section 2 restates it. Upstream fails with a shape
error inside ``copy_`` when the source is wider than the capacity; here every such input is rejected up front.
"""
from __future__ import annotations

import torch

from impl.targets import Target, get_target
from impl.validation import require_tensor, require_valid_indptr

VIEW_RULES = ("full", "source")


def _require_int32_vector(name: str, t) -> None:
    require_tensor(name, t, torch.int32, dim=1)


def _require_count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < 0:
        raise ValueError(f"{name}: expected an int >= 0, got {v}")
    return v


def ragged_view_capacity(target: "Target | str | None", num_rows: int, max_per_row: int, source_numel: int) -> int:
    """Length of the indices view for ``target``'s rule (see the module docstring)."""
    t = get_target(target)
    if t.ragged_view_rule == "full":
        return max(num_rows * max_per_row, 1)
    if t.ragged_view_rule == "source":
        return max(source_numel, 1)
    raise ValueError(f"target {t.name}: unknown ragged_view_rule {t.ragged_view_rule!r}; expected one of "
                     f"{', '.join(VIEW_RULES)}")


def copy_ragged_to_graph_buffers(ragged_indices: torch.Tensor, ragged_indptr: torch.Tensor,
                                 indices_buffer: torch.Tensor, indptr_buffer: torch.Tensor, num_rows: int,
                                 max_per_row: int, *, target: "Target | str | None" = None,
                                 check_indptr: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Copy a ragged segment into persistent graph buffers; return ``(indices_view, indptr_view)``.

    ``ragged_indices`` int32 [n] (n may exceed the NNZ), ``ragged_indptr`` int32 [num_rows + 1];
    ``indices_buffer`` int32 [>= max(num_rows * max_per_row, 1)] and ``indptr_buffer`` int32 [>= num_rows + 1],
    both contiguous and on the sources' device. Both views start at their buffer's base pointer. Entries of the
    indices view past ``n`` keep whatever the buffer held (indptr bounds every read).

    Rejected before anything is written: wrong types/dtypes/devices, buffers too small, a source wider than the
    graph capacity ``max(num_rows * max_per_row, 1)``, and (with ``check_indptr``, one host read of indptr) an
    indptr that does not start at 0, decreases, has a row longer than ``max_per_row``, or whose NNZ exceeds the
    source's width.
    """
    t = get_target(target)
    _require_int32_vector("ragged_indices", ragged_indices)
    _require_int32_vector("ragged_indptr", ragged_indptr)
    _require_int32_vector("indices_buffer", indices_buffer)
    _require_int32_vector("indptr_buffer", indptr_buffer)
    num_rows = _require_count("num_rows", num_rows)
    max_per_row = _require_count("max_per_row", max_per_row)
    if not isinstance(check_indptr, bool):
        raise TypeError(f"check_indptr: expected a bool, got {type(check_indptr).__name__}")
    device = indices_buffer.device
    for name, ten in (("ragged_indices", ragged_indices), ("ragged_indptr", ragged_indptr),
                      ("indptr_buffer", indptr_buffer)):
        if ten.device != device:
            raise ValueError(f"{name}: expected device {device} (the device of indices_buffer), got {ten.device}")
    for name, ten in (("indices_buffer", indices_buffer), ("indptr_buffer", indptr_buffer)):
        if not ten.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous persistent buffer, got stride {list(ten.stride())}")
    if ragged_indptr.numel() != num_rows + 1:
        raise ValueError(f"ragged_indptr: expected num_rows + 1 = {num_rows + 1} entries, got {ragged_indptr.numel()}")
    if indptr_buffer.numel() < num_rows + 1:
        raise ValueError(f"indptr_buffer: expected at least num_rows + 1 = {num_rows + 1} entries, got "
                         f"{indptr_buffer.numel()}")
    capacity = max(num_rows * max_per_row, 1)
    if indices_buffer.numel() < capacity:
        raise ValueError(f"indices_buffer: expected at least max(num_rows * max_per_row, 1) = {capacity} entries, "
                         f"got {indices_buffer.numel()}")
    source_entries = ragged_indices.numel()
    if source_entries > capacity:
        raise ValueError(f"ragged_indices: {source_entries} entries do not fit the graph capacity "
                         f"max(num_rows * max_per_row, 1) = {capacity}")
    view_len = ragged_view_capacity(t, num_rows, max_per_row, source_entries)
    if check_indptr:
        require_valid_indptr("ragged_indptr", ragged_indptr, "ragged_indices", source_entries, starts_at_zero=True,
                             max_row=max_per_row)

    # --- writes (nothing above wrote anything) ---
    indptr_view = indptr_buffer[: num_rows + 1]
    indptr_view.copy_(ragged_indptr, non_blocking=True)
    indices_view = indices_buffer[:capacity]
    if source_entries > 0:
        indices_view[:source_entries].copy_(ragged_indices, non_blocking=True)
    # a narrower view still starts at the persistent base pointer: the captured graph reads the same address
    indices_view = indices_view[:view_len]
    return indices_view, indptr_view
