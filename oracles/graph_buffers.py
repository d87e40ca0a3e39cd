"""Reference for the persistent graph-buffer copy of ragged decode metadata, from SPEC section 2 and DESIGN.md
(``ragged-view-capacity``), on plain Python lists.

Given the buffers' contents before the copy, it says what the returned views must be (length, contents) and what
every entry of both buffers must hold afterwards, or which argument a bad input must be rejected for.
"""
from __future__ import annotations

#: The view-length rule per architecture (SPEC 2): the full graph capacity on gfx942 and on the generic fallback,
#: the source tensor's width on gfx950.
VIEW_RULE_BY_ARCH = {"gfx942": "full", "gfx950": "source", "generic": "full"}


def view_length(arch: str, num_rows: int, max_per_row: int, source_numel: int) -> int:
    """Length of the indices view: max(num_rows * max_per_row, 1) ("full") or max(source numel, 1) ("source")."""
    rule = VIEW_RULE_BY_ARCH[arch]
    if rule == "full":
        return max(num_rows * max_per_row, 1)
    return max(source_numel, 1)


def rejected_argument(num_rows: int, max_per_row: int, source: list[int], indptr: list[int],
                      indices_buffer_len: int, indptr_buffer_len: int) -> str | None:
    """The argument a well-behaved copy must reject (its name appears in the error), or None when the input is
    valid. Checked in the order a reader would state them: the indptr's length, the buffers' sizes, the source's
    width against the graph capacity, then the indptr's values (start 0, non-decreasing, rows within
    ``max_per_row``, NNZ within the source)."""
    capacity = max(num_rows * max_per_row, 1)
    if len(indptr) != num_rows + 1:
        return "ragged_indptr"
    if indptr_buffer_len < num_rows + 1:
        return "indptr_buffer"
    if indices_buffer_len < capacity:
        return "indices_buffer"
    if len(source) > capacity:
        return "ragged_indices"
    if indptr[0] != 0:
        return "ragged_indptr"
    for r in range(num_rows):
        step = indptr[r + 1] - indptr[r]
        if step < 0 or step > max_per_row:
            return "ragged_indptr"
    if indptr[-1] > len(source):
        return "ragged_indptr"
    return None


def expected_after_copy(arch: str, num_rows: int, max_per_row: int, source: list[int], indptr: list[int],
                        indices_before: list[int], indptr_before: list[int]) -> dict:
    """Views and buffer contents after a valid copy.

    - ``indices_view``: the first ``view_length`` entries of the indices buffer after the copy;
    - ``indptr_view``: the whole source indptr (``num_rows + 1`` entries; the last is the true NNZ);
    - ``indices_buffer``/``indptr_buffer``: the source copied to the start of each buffer, every later entry as it
      was (the copy writes nothing else).
    """
    n = view_length(arch, num_rows, max_per_row, len(source))
    indices_after = list(source) + list(indices_before[len(source):])
    indptr_after = list(indptr) + list(indptr_before[len(indptr):])
    return {
        "view_length": n,
        "indices_view": indices_after[:n],
        "indptr_view": list(indptr),
        "nnz": indptr[-1],
        "indices_buffer": indices_after,
        "indptr_buffer": indptr_after,
    }
