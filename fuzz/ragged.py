"""Cases, strategies and the input builder for the ragged helpers contract (``impl.ragged``): dense top-k rows to
ragged, C4A local ids to global slots, and the SWA decode window (SPEC 1.3 and 2).

A case holds its data explicitly (small lists), so a reproducer is the input itself. The generators aim at the
places these helpers go wrong: -1 holes before valid entries, other negative values and INT32_MIN / INT32_MAX,
positions just past the block table's width and far past it, negative block ids and the largest block id whose
slots still fit int32, request ids outside the table, invalid (padding) tokens, empty rows and empty batches,
lengths past the width, odd block sizes, windows that cross block boundaries, int32 and int64 inputs, and block
tables that are a column slice of a wider buffer (stride > width) whose columns past the width hold
:data:`POISON_BLOCK`: a lookup that does not bound the column reads them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
#: the block id every column past the table's width holds in its backing buffer (a real, positive id: a lookup
#: that reads past the width gets a plausible slot, never an obvious -1)
POISON_BLOCK = 7777
#: the largest SWA position a case holds: upstream derives a token's position as seq_len - 1 from an int32
#: sequence length, so the window's end (position + 1) must fit int32 (ours takes any int64 position: tests)
MAX_SWA_POSITION = INT32_MAX - 1
HELPERS = ("dense", "global", "swa")
BLOCK_SIZES = (1, 2, 3, 5, 16, 64)


def max_block_id(block_size: int) -> int:
    """The largest block id whose slots ``b * bs .. b * bs + bs - 1`` all fit int32."""
    return (INT32_MAX + 1) // block_size - 1


@dataclass(frozen=True)
class RaggedCase(Case):
    """One call of one helper. ``dense``: ``rows`` [R][width] dense indices, ``lens`` (topk_lens or None),
    ``num_rows``. ``global``: ``rows`` [T][width] local compressed-row ids, ``token_to_req``, ``valid``
    (is_valid_token or None), the block table, ``block_size``. ``swa``: ``positions``, ``token_to_req``, the block
    table, ``block_size``, ``window``. ``index_dtype`` is the dtype of rows / positions, ``aux_dtype`` that of
    topk_lens, token_to_req and the block table. The block table ``[len(block_table)][table_width]`` is handed as the
    first ``table_width`` columns of a buffer ``table_pad`` columns wider, those holding :data:`POISON_BLOCK`."""

    KIND = "ragged-helpers-oracle"
    helper: Literal["dense", "global", "swa"]
    index_dtype: Literal["int32", "int64"] = "int32"
    aux_dtype: Literal["int32", "int64"] = "int32"
    rows: tuple[tuple[int, ...], ...] = ()
    width: int = 0
    lens: tuple[int, ...] | None = None
    num_rows: int = -1
    positions: tuple[int, ...] = ()
    token_to_req: tuple[int, ...] = ()
    valid: tuple[bool, ...] | None = None
    block_table: tuple[tuple[int, ...], ...] = ()
    table_width: int = 0
    table_pad: int = 0
    block_size: int = 1
    window: int = 1

    def __post_init__(self):
        super().__post_init__()
        if self.helper not in HELPERS:
            raise ValueError(f"helper: expected one of {list(HELPERS)}, got {self.helper!r}")
        for name in ("width", "table_width", "table_pad"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        for name in ("block_size", "window"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        if any(len(r) != self.width for r in self.rows):
            raise ValueError(f"rows: every row must hold width={self.width} entries")
        if any(len(r) != self.table_width for r in self.block_table):
            raise ValueError(f"block_table: every row must hold table_width={self.table_width} entries")
        ints = [v for r in self.rows for v in r] + list(self.positions) + list(self.token_to_req) + \
            [v for r in self.block_table for v in r] + list(self.lens or ()) + [self.num_rows]
        if any(not INT32_MIN <= v <= INT32_MAX for v in ints):
            raise ValueError("every value must fit int32 (the helpers' index domain)")
        if self.helper == "dense":
            if self.lens is not None and len(self.lens) != len(self.rows):
                raise ValueError(f"lens: expected {len(self.rows)} entries, got {len(self.lens)}")
        elif self.helper == "global":
            if len(self.token_to_req) != len(self.rows):
                raise ValueError(f"token_to_req: expected {len(self.rows)} entries, got {len(self.token_to_req)}")
            if self.valid is not None and len(self.valid) != len(self.rows):
                raise ValueError(f"valid: expected {len(self.rows)} entries, got {len(self.valid)}")
        else:
            if len(self.token_to_req) != len(self.positions):
                raise ValueError(f"token_to_req: expected {len(self.positions)} entries, got "
                                 f"{len(self.token_to_req)}")
            if any(p > MAX_SWA_POSITION for p in self.positions):
                raise ValueError(f"positions: at most {MAX_SWA_POSITION} (position + 1 is a sequence length)")
        bmax = max_block_id(self.block_size)
        if any(b > bmax for r in self.block_table for b in r):
            raise ValueError(f"block_table: block ids at most {bmax} for block_size {self.block_size} (int32 slots)")


_DT = {"int32": torch.int32, "int64": torch.int64}


def table_tensor(case: RaggedCase, device) -> torch.Tensor:
    """The case's block table: a ``[R, table_width]`` column slice of a ``[R, table_width + table_pad]`` buffer
    whose extra columns hold :data:`POISON_BLOCK`."""
    R, nb = len(case.block_table), case.table_width
    buf = torch.full((R, nb + case.table_pad), POISON_BLOCK, dtype=_DT[case.aux_dtype])
    if R and nb:
        buf[:, :nb] = torch.tensor(case.block_table, dtype=_DT[case.aux_dtype])
    return buf.to(device)[:, :nb]


def make_inputs(case: RaggedCase, device) -> dict:
    """The helper's arguments as tensors on ``device`` (keyword names of ``impl.ragged``'s entry points)."""
    idt, adt = _DT[case.index_dtype], _DT[case.aux_dtype]
    if case.helper == "dense":
        dense = torch.tensor(case.rows, dtype=idt).reshape(len(case.rows), case.width).to(device)
        lens = None if case.lens is None else torch.tensor(case.lens, dtype=adt).to(device)
        return {"dense_indices": dense, "topk_lens": lens, "num_rows": case.num_rows}
    req = torch.tensor(case.token_to_req, dtype=adt).to(device)
    table = table_tensor(case, device)
    if case.helper == "global":
        local = torch.tensor(case.rows, dtype=idt).reshape(len(case.rows), case.width).to(device)
        valid = None if case.valid is None else torch.tensor(case.valid, dtype=torch.bool).to(device)
        return {"local_indices": local, "token_to_req": req, "block_table": table, "block_size": case.block_size,
                "is_valid_token": valid}
    pos = torch.tensor(case.positions, dtype=idt).to(device)
    return {"positions": pos, "token_to_req": req, "block_table": table, "block_size": case.block_size,
            "window": case.window}


# --- strategies -------------------------------------------------------------------------------------------------

@st.composite
def _table(draw, block_size: int, min_rows: int = 0):
    """(rows, width, pad): block ids mostly small and distinct-looking, with -1, other negative ids, INT32_MIN and
    the largest id whose slots fit int32."""
    R = draw(st.integers(min_rows, 3))
    nb = draw(st.integers(0, 4))
    bmax = max_block_id(block_size)
    block = st.one_of(st.integers(0, 40), st.integers(0, 40), st.integers(0, 40),
                      st.sampled_from([-1, -3, INT32_MIN, bmax]))
    rows = draw(st.lists(st.lists(block, min_size=nb, max_size=nb), min_size=R, max_size=R))
    return rows, nb, draw(st.sampled_from([0, 1, 3]))


def _index_values(span: int):
    """Indices a producer may emit: valid-looking ones in [0, span) (most often), -1, other negatives, values just
    past ``span`` and, rarely, the int32 extremes (one per case is enough to show how they are treated)."""
    def pick(k, v, extreme, past):
        return extreme if k == 0 else past if k == 1 else -1 if k < 5 else -7 if k == 5 else v
    return st.builds(pick, st.integers(0, 19), st.integers(0, max(span - 1, 0)),
                     st.sampled_from([INT32_MIN, INT32_MAX]), st.integers(span, span + 3))


@st.composite
def _rows(draw, n: int, span: int):
    """``n`` rows of one width: some with -1 holes before valid entries, some all -1 (empty), some full."""
    width = draw(st.integers(0, 7))
    rows = []
    for _ in range(n):
        kind = draw(st.sampled_from(["mixed", "mixed", "prefix", "empty"]))
        if kind == "empty":
            rows.append([-1] * width)
            continue
        row = draw(st.lists(_index_values(span), min_size=width, max_size=width))
        if kind == "prefix":  # the valid entries first, then -1 padding (what a top-k producer usually emits)
            good = [v for v in row if v >= 0]
            row = good + [-1] * (width - len(good))
        rows.append(row)
    return rows, width


@st.composite
def dense_cases(draw) -> RaggedCase:
    R = draw(st.integers(0, 5))
    num_rows = draw(st.sampled_from([-1, -1, 0, 5, 33, INT32_MAX]))
    rows, width = draw(_rows(R, num_rows if num_rows > 0 else 40))
    lens = draw(st.one_of(st.none(), st.lists(st.one_of(st.integers(-2, width + 3),
                                                        st.sampled_from([INT32_MIN, INT32_MAX])),
                                              min_size=R, max_size=R)))
    return RaggedCase(helper="dense", index_dtype=draw(st.sampled_from(["int32", "int64"])),
                      aux_dtype=draw(st.sampled_from(["int32", "int64"])), rows=rows, width=width, lens=lens,
                      num_rows=num_rows)


def _requests(R: int):
    """Request ids: rows of the table, now and then one past it or negative."""
    return st.builds(lambda k, r: R if k == 0 else -1 if k == 1 else r, st.integers(0, 15),
                     st.integers(0, max(R - 1, 0)))


@st.composite
def global_cases(draw) -> RaggedCase:
    bs = draw(st.sampled_from(BLOCK_SIZES))
    table, nb, pad = draw(_table(bs))
    R = len(table)
    T = draw(st.integers(0, 5))
    rows, width = draw(_rows(T, nb * bs + 1))
    reqs = draw(st.lists(_requests(R), min_size=T, max_size=T))
    valid = draw(st.one_of(st.none(), st.lists(st.booleans(), min_size=T, max_size=T)))
    return RaggedCase(helper="global", index_dtype=draw(st.sampled_from(["int32", "int64"])),
                      aux_dtype=draw(st.sampled_from(["int32", "int64"])), rows=rows, width=width,
                      token_to_req=reqs, valid=valid, block_table=table, table_width=nb, table_pad=pad,
                      block_size=bs)


@st.composite
def swa_cases(draw) -> RaggedCase:
    bs = draw(st.sampled_from(BLOCK_SIZES))
    window = draw(st.sampled_from([1, 2, 3, 4, 8, 128]))
    table, nb, pad = draw(_table(bs))
    R = len(table)
    T = draw(st.integers(0, 5))
    span = nb * bs
    pos = st.builds(lambda k, p, q, x: x if k == 0 else -1 if k == 1 else q if k < 5 else p, st.integers(0, 11),
                    st.integers(0, span + 2), st.integers(max(span - 3, 0), span + 3),
                    st.sampled_from([-5, INT32_MIN, MAX_SWA_POSITION]))
    positions = draw(st.lists(pos, min_size=T, max_size=T))
    reqs = draw(st.lists(_requests(R), min_size=T, max_size=T))
    return RaggedCase(helper="swa", index_dtype=draw(st.sampled_from(["int32", "int64"])),
                      aux_dtype=draw(st.sampled_from(["int32", "int64"])), positions=positions, token_to_req=reqs,
                      block_table=table, table_width=nb, table_pad=pad, block_size=bs, window=window)


def ragged_cases():
    """Every helper, in equal shares."""
    return st.one_of(dense_cases(), global_cases(), swa_cases())
