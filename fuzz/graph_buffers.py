"""Cases, strategies and input builders for the graph-buffer contract (``impl.graph_buffers``): ragged index
copies into persistent buffers, with the bad inputs the copy must reject."""
from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1

#: Bad inputs the graph-buffer copy must reject before writing anything (None = a valid case).
GraphBufferDefect = Literal["indices-buffer-short", "indptr-buffer-short", "source-too-wide", "nnz-beyond-source",
                            "row-too-long", "indptr-nonzero-start", "int64-source"]
GRAPH_BUFFER_DEFECTS: tuple[str, ...] = typing.get_args(GraphBufferDefect)


@dataclass(frozen=True)
class GraphBufferCase(Case):
    """``num_rows`` rows of at most ``max_per_row`` entries (row lengths ``lens``), a source ``source_extra``
    entries wider than the NNZ, persistent buffers ``indices_slack`` / ``indptr_slack`` entries longer than needed
    and ``pool_offset`` entries into their pools, and at most one ``defect``; tensors come from ``seed``."""

    KIND = "ragged-view-capacity"
    seed: int
    num_rows: int
    max_per_row: int
    lens: tuple[int, ...]
    source_extra: int
    indices_slack: int = 0
    indptr_slack: int = 0
    pool_offset: int = 0
    defect: GraphBufferDefect | None = None

    def __post_init__(self):
        super().__post_init__()
        for name in ("seed", "num_rows", "max_per_row", "source_extra", "indices_slack", "indptr_slack",
                     "pool_offset"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if len(self.lens) != self.num_rows:
            raise ValueError(f"lens: expected num_rows = {self.num_rows} row lengths, got {len(self.lens)}")
        if any(n < 0 or n > self.max_per_row for n in self.lens):
            raise ValueError(f"lens: every row length must lie in [0, max_per_row = {self.max_per_row}], "
                             f"got {list(self.lens)}")


@st.composite
def graph_buffer_cases(draw, defects: bool = True):
    """Rows (0 included), widths, per-row lengths (empty rows, full rows), a source wider than the NNZ by any
    amount up to the graph capacity, buffer slack, buffers that are views into a pool at an offset, and (sometimes)
    one defect."""
    num_rows = draw(st.integers(0, 6))
    max_per_row = draw(st.integers(0, 9))
    lens = draw(st.lists(st.one_of(st.just(0), st.just(max_per_row), st.integers(0, max_per_row)),
                         min_size=num_rows, max_size=num_rows))
    nnz = sum(lens)
    capacity = max(num_rows * max_per_row, 1)
    # the source may be wider than the NNZ, anywhere up to the capacity (the gfx950 view length follows it)
    source_extra = draw(st.one_of(st.just(0), st.just(capacity - nnz), st.integers(0, capacity - nnz)))
    defect = None
    if defects:
        defect = draw(st.one_of(st.none(), st.none(), st.none(), st.sampled_from(GRAPH_BUFFER_DEFECTS)))
    return GraphBufferCase(seed=draw(st.integers(0, 2 ** 31 - 1)), num_rows=num_rows, max_per_row=max_per_row,
                           lens=tuple(lens), source_extra=source_extra,
                           indices_slack=draw(st.sampled_from([0, 0, 1, 7])),
                           indptr_slack=draw(st.sampled_from([0, 0, 2])), pool_offset=draw(st.sampled_from([0, 3])),
                           defect=defect)


@dataclass(frozen=True)
class GraphBufferInputs:
    """What a case builds on the host: the ragged source, its indptr (a list), and the persistent buffers'
    lengths."""

    source: torch.Tensor
    indptr: list[int]
    indices_len: int
    indptr_len: int


def graph_buffer_inputs(case: GraphBufferCase) -> GraphBufferInputs:
    """Source tensor (CPU, int32), indptr and buffer lengths of a case, with its defect applied."""
    g = torch.Generator().manual_seed(case.seed)
    num_rows, max_per_row = case.num_rows, case.max_per_row
    lens = list(case.lens)
    defect = case.defect
    if defect == "row-too-long" and num_rows:
        lens[0] = max_per_row + 1
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    nnz = indptr[-1]
    capacity = max(num_rows * max_per_row, 1)
    width = nnz + case.source_extra
    if defect == "source-too-wide":
        width = capacity + 1
    if defect == "nnz-beyond-source" and nnz:
        width = nnz - 1
    if defect == "indptr-nonzero-start":
        indptr = [v + 1 for v in indptr]
    # live entries are slot ids; entries past the NNZ are whatever the builder left there (-1, INT32 extremes)
    live = torch.randint(0, 1 << 20, (width,), generator=g, dtype=torch.int64)
    junk = torch.tensor([-1, INT32_MIN, INT32_MAX], dtype=torch.int64)[torch.randint(0, 3, (width,), generator=g)]
    source = torch.where(torch.arange(width) < nnz, live, junk).to(torch.int32)
    indices_len = capacity + case.indices_slack
    indptr_len = num_rows + 1 + case.indptr_slack
    if defect == "indices-buffer-short":
        indices_len = capacity - 1
    if defect == "indptr-buffer-short":
        indptr_len = num_rows
    return GraphBufferInputs(source, indptr, indices_len, indptr_len)
