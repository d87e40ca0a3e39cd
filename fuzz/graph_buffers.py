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
#: memory layouts of the ragged sources (issue 30; the values the same): ragged_indices and ragged_indptr packed, a
#: slice of a larger buffer (offset base), or every other element of one (what no view reaches holds -7)
SOURCE_LAYOUTS = ("contiguous", "slice", "strided")
#: the persistent buffers packed (at their placement) or every other element of a pool: a buffer a captured graph
#: reads as packed must be refused, naming it, before anything is written
BUFFER_LAYOUTS = ("contiguous", "strided")
SOURCE_FILL = -7


@dataclass(frozen=True)
class GraphBufferCase(Case):
    """``num_rows`` rows of at most ``max_per_row`` entries (row lengths ``lens``), a source ``source_extra``
    entries wider than the NNZ, persistent buffers ``indices_slack`` / ``indptr_slack`` entries longer than needed
    and ``pool_offset`` entries into their pools, and at most one ``defect``; tensors come from ``seed``."""

    KIND = "ragged-view-capacity"
    ADDED_FIELDS = ('source_layout', 'buffer_layout')
    seed: int
    num_rows: int
    max_per_row: int
    lens: tuple[int, ...]
    source_extra: int
    indices_slack: int = 0
    indptr_slack: int = 0
    pool_offset: int = 0
    defect: GraphBufferDefect | None = None
    source_layout: str = "contiguous"
    buffer_layout: str = "contiguous"

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
        if self.source_layout not in SOURCE_LAYOUTS or self.buffer_layout not in BUFFER_LAYOUTS:
            raise ValueError(f"source_layout/buffer_layout: expected one of {SOURCE_LAYOUTS} / {BUFFER_LAYOUTS}, got "
                             f"{self.source_layout!r} / {self.buffer_layout!r}")


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
                           defect=defect, **_drawn_layouts(draw, defect))


def _drawn_layouts(draw, defect) -> dict:
    """One bad input at a time, as the forced rows (_graph_buffer_allowed): a strided buffer is its own refusal, so only a
    valid case draws one, and a laid-out source only a case whose copy runs."""
    buffer = draw(st.sampled_from(BUFFER_LAYOUTS + ("contiguous",) * 3)) if defect is None else "contiguous"
    source = draw(st.sampled_from(SOURCE_LAYOUTS)) if defect is None and buffer == "contiguous" else "contiguous"
    return {"source_layout": source, "buffer_layout": buffer}


def lay_out_source(t: torch.Tensor, layout: str, device) -> torch.Tensor:
    """1-D ``t`` on ``device`` as ``layout`` (:data:`SOURCE_LAYOUTS`), what no view reaches :data:`SOURCE_FILL`."""
    n = t.numel()
    if layout == "contiguous":
        return t.to(device)
    buf = torch.full((2 * n + 5,), SOURCE_FILL, dtype=t.dtype)
    view = slice(3, 3 + n) if layout == "slice" else slice(0, 2 * n, 2)
    buf[view] = t
    return buf.to(device)[view]


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
    if case.buffer_layout == "strided":  # two entries at least: a one-entry stride-2 view is contiguous
        indices_len, indptr_len = max(indices_len, 2), max(indptr_len, 2)
    return GraphBufferInputs(source, indptr, indices_len, indptr_len)


# --- declared dimensions ----------------------------------------------------------------------------------------
# Counts of rows and of entries per row (0, 1, many), how full the rows are, how much wider than the NNZ the source
# is (the gfx950 view follows it), where the buffers sit in their pools, and each bad input. A forced case holds at
# most 6 rows of 9 entries, as a drawn one does.

COUNT_CLASSES = ("0", "1", "many")
FILL_CLASSES = ("none", "full", "mixed")
SOURCE_CLASSES = ("exact", "wider", "full")
PLACEMENTS = ("tight", "slack", "offset")


def _count_class(n: int) -> str:
    return "0" if n == 0 else ("1" if n == 1 else "many")


def _room(case: GraphBufferCase) -> int:
    return max(case.num_rows * case.max_per_row, 1) - sum(case.lens)


def classify_graph_buffer(case: GraphBufferCase, target=None) -> dict:
    nnz, room = sum(case.lens), _room(case)
    return {
        "rows": _count_class(case.num_rows),
        "width": _count_class(case.max_per_row),
        "fill": "none" if nnz == 0 else ("full" if nnz == case.num_rows * case.max_per_row else "mixed"),
        "source": "exact" if case.source_extra == 0 else ("full" if case.source_extra == room else "wider"),
        "placement": "offset" if case.pool_offset else ("slack" if case.indices_slack or case.indptr_slack
                                                        else "tight"),
        "defect": case.defect or "none",
        "source_layout": case.source_layout,
        "buffer_layout": case.buffer_layout,
    }


def force_graph_buffer(case: GraphBufferCase, combo: dict, target=None) -> GraphBufferCase:
    """``case`` rewritten to hit ``combo`` (its drawn row lengths kept where they fit the forced classes)."""
    s = case.seed
    f = classify_graph_buffer(case)
    f.update(combo)
    rows = {"0": 0, "1": 1, "many": 3 + s % 4}[f["rows"]] if "rows" in combo else case.num_rows
    width = {"0": 0, "1": 1, "many": 3 + s % 7}[f["width"]] if "width" in combo else case.max_per_row
    fill = f["fill"]
    lens = list(case.lens)
    if len(lens) != rows or any(n > width for n in lens) or \
            classify_graph_buffer(case.replace(num_rows=rows, max_per_row=width, lens=tuple(lens)))["fill"] != fill:
        if fill == "none" or rows == 0 or width == 0:
            lens = [0] * rows
        elif fill == "full":
            lens = [width] * rows
        elif rows == 1:  # within [1, width - 2]: room for a source of either wider class
            lens = [1 + s % max(width - 2, 1)]
        else:
            lens = [1 + s % width] + [0] * (rows - 1)
    room = max(rows * width, 1) - sum(lens)
    extra = case.source_extra
    src = f["source"]
    if "source" in combo or not 0 <= extra <= room:
        extra = 0 if src == "exact" or room == 0 else (room if src == "full" or room < 2 else 1 + s % (room - 1))
    place = f["placement"]
    islack, pslack, off = {"tight": (0, 0, 0), "slack": (1 + 6 * (s % 2), 2, 0), "offset": (0, 0, 3)}[place]
    if "placement" not in combo:
        islack, pslack, off = case.indices_slack, case.indptr_slack, case.pool_offset
    defect = case.defect
    if "defect" in combo:
        defect = None if combo["defect"] == "none" else combo["defect"]
    return GraphBufferCase(seed=s, num_rows=rows, max_per_row=width, lens=tuple(lens), source_extra=extra,
                           indices_slack=islack, indptr_slack=pslack, pool_offset=off, defect=defect,
                           source_layout=combo.get("source_layout", case.source_layout),
                           buffer_layout=combo.get("buffer_layout", case.buffer_layout))


def _graph_buffer_allowed(c: dict, target=None) -> bool:
    rows, width, fill, src = c.get("rows"), c.get("width"), c.get("fill"), c.get("source")
    empty = rows == "0" or width == "0"
    one = rows == "1" and width == "1"
    if fill in ("full", "mixed") and empty:
        return False
    if fill == "mixed" and one:
        return False
    if fill == "full" and src in ("wider", "full"):
        return False
    if src == "wider" and (empty or one):  # the room past the NNZ is at most 1
        return False
    d = c.get("defect")
    if d not in (None, "none") and c.get("placement") not in (None, "tight"):
        return False  # a bad input is rejected before the buffers' placement matters: valid cases take those rows
    if d == "row-too-long" and rows == "0":
        return False
    if d not in (None, "none") and c.get("buffer_layout") == "strided":
        return False  # one bad input at a time: a strided buffer is its own refusal
    if c.get("source_layout", "contiguous") != "contiguous" and (
            d not in (None, "none") or c.get("buffer_layout") == "strided"):
        return False  # a laid-out source is judged by a copy that runs (a refused one reads nothing)
    if d == "nnz-beyond-source" and (fill == "none" or empty):
        return False
    return True


def graph_buffer_family_examples(target=None) -> list[GraphBufferCase]:
    return [GraphBufferCase(seed=0, num_rows=0, max_per_row=0, lens=(), source_extra=0),
            GraphBufferCase(seed=1, num_rows=2, max_per_row=2, lens=(1, 0), source_extra=0)]


def _declare_graph_buffers():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "graph-buffers",
        (Dimension("rows", COUNT_CLASSES, "num_rows: 0, 1, many (the capacity's max(., 1) at 0)"),
         Dimension("width", COUNT_CLASSES, "max_per_row: 0, 1, many"),
         Dimension("fill", FILL_CLASSES, "row lengths: all empty, all full (NNZ = capacity), mixed"),
         Dimension("source", SOURCE_CLASSES, "the source's width: the NNZ, between, the whole capacity (gfx950's "
                   "view follows it)"),
         Dimension("placement", PLACEMENTS, "persistent buffers exactly sized, with slack, at an offset in a pool"),
         Dimension("defect", ("none",) + GRAPH_BUFFER_DEFECTS, "each bad input the copy must reject"),
         Dimension("source_layout", SOURCE_LAYOUTS, "ragged_indices and ragged_indptr packed, a slice of a larger "
                                                    "buffer, or strided (issue 30)"),
         Dimension("buffer_layout", BUFFER_LAYOUTS, "the persistent buffers packed, or strided views of their pools "
                                                    "(refused)")),
        (("rows", "width", "fill", "source"), ("placement", "source"),
         # the source's layout against its width class (the copy's extent); a strided buffer against the placement
         # it is cut from
         ("source", "source_layout"), ("placement", "buffer_layout")),
        classify_graph_buffer, force_graph_buffer, _graph_buffer_allowed, graph_buffer_family_examples),
        "ragged-view-capacity")


GRAPH_BUFFER_DIMENSIONS = _declare_graph_buffers()
