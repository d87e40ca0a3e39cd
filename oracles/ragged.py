"""Reference ragged helpers (SPEC sections 1.3 and 2), plain Python loops over lists.

Each returns Python lists; tests and the ``ragged-helpers-oracle`` contract compare them with a subject's tensors
exactly. A block table is the list of its rows at its logical width (a table handed as a column slice of a wider
buffer is given here as the slice: nothing past the width exists). Slot ids are int32 (SPEC 2): a looked-up slot
past 2^31 - 1 is outside the domain and raises ValueError rather than returning a value no int32 output holds.
"""
from __future__ import annotations


def _lookup(block_table: list[list[int]], req: int, pos: int, bs: int) -> int:
    """slot = block_table[req][pos // bs] * bs + pos % bs, or -1 when any piece is missing or negative."""
    if pos < 0 or req < 0 or req >= len(block_table):
        return -1
    col = pos // bs
    if col >= len(block_table[req]):
        return -1
    blk = block_table[req][col]
    if blk < 0:
        return -1
    slot = blk * bs + pos % bs
    if slot > 2 ** 31 - 1:
        raise ValueError(f"block id {blk} with block size {bs}: slot {slot} is past the int32 slot range")
    return slot


def ref_ragged_from_dense(dense: list[list[int]], topk_lens: list[int] | None, num_rows: int):
    """(indices, indptr): row r keeps its first clamp(len_r, 0, width) entries, len_r = topk_lens[r] or the count
    of entries >= 0; with num_rows >= 0 kept values outside [0, num_rows) become -1."""
    indices, indptr = [], [0]
    for r, row in enumerate(dense):
        n = topk_lens[r] if topk_lens is not None else sum(1 for v in row if v >= 0)
        n = max(0, min(n, len(row)))
        for v in row[:n]:
            if num_rows >= 0 and not 0 <= v < num_rows:
                v = -1
            indices.append(v)
        indptr.append(indptr[-1] + n)
    return indices, indptr


def ref_global_topk(local: list[list[int]], token_to_req: list[int], block_table: list[list[int]], bs: int,
                    is_valid: list[bool] | None):
    """C4A: the entries >= 0 of each valid token's row, in order, mapped through the block table."""
    indices, indptr = [], [0]
    for t, row in enumerate(local):
        n = 0
        if is_valid is None or is_valid[t]:
            for i in row:
                if i >= 0:
                    indices.append(_lookup(block_table, token_to_req[t], i, bs))
                    n += 1
        indptr.append(indptr[-1] + n)
    return indices, indptr


def ref_swa_window(positions: list[int], token_to_req: list[int], block_table: list[list[int]], bs: int,
                   window: int):
    """([T][window] slots, [T] lens): positions start..pos of the window, -1 padding."""
    rows, lens = [], []
    for t, p in enumerate(positions):
        start = max(p - window + 1, 0)
        n = max(p + 1 - start, 0)
        row = [_lookup(block_table, token_to_req[t], start + j, bs) if j < n else -1 for j in range(window)]
        rows.append(row)
        lens.append(n)
    return rows, lens
