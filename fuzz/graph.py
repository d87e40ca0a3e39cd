"""Strategies for the graph-safety contracts: ragged graph-buffer copies, reduce epilogues, dispatch flags.

Every case is plain JSON; tensors are made inside the checks from the case's ``seed``.
"""
from __future__ import annotations

import itertools
import math
import struct

from hypothesis import strategies as st

from fuzz.formats import f32

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1
F32_MAX = 3.4028234663852886e38

#: Bad inputs the graph-buffer copy must reject before writing anything (None = a valid case).
GRAPH_BUFFER_DEFECTS = ("indices-buffer-short", "indptr-buffer-short", "source-too-wide", "nnz-beyond-source",
                        "row-too-long", "indptr-nonzero-start", "int64-source")


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
    return {
        "seed": draw(st.integers(0, 2 ** 31 - 1)),
        "num_rows": num_rows,
        "max_per_row": max_per_row,
        "lens": lens,
        "source_extra": source_extra,
        "indices_slack": draw(st.sampled_from([0, 0, 1, 7])),
        "indptr_slack": draw(st.sampled_from([0, 0, 2])),
        "pool_offset": draw(st.sampled_from([0, 3])),
        "defect": defect,
    }


# --- reduce epilogues -------------------------------------------------------------------------------------------

def _signed(mag):
    return st.tuples(mag, st.booleans()).map(lambda t: -t[0] if t[1] else t[0])


def next_f32(x: float, up: bool) -> float:
    """The float32 neighbour of float32 ``x`` > 0 (one ulp up or down)."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return struct.unpack("<f", struct.pack("<I", bits + (1 if up else -1)))[0]


def mxfp8_boundary_magnitudes() -> list[float]:
    """Values that sit on the MXFP8 edges for some scale: 448 * 2^k (a scale step), one float32 ulp either side,
    and fp8 rounding ties (midpoints between neighbouring e4m3 values) times a power of two."""
    out = []
    for k in (-130, -127, -126, -20, -3, 0, 1, 9, 100, 119):
        edge = f32(math.ldexp(448.0, k))
        if 0 < edge < F32_MAX:
            out += [edge, next_f32(edge, False), next_f32(edge, True)]
    for k in (-9, 0, 5):
        for mid in (1.0625, 1.1875, 13.0, 416.0, math.ldexp(1.5, -9), math.ldexp(0.5, -9)):
            out.append(math.ldexp(mid, k))
    return [f32(v) for v in out if 0 < f32(v) < math.inf]


def mxfp8_boundary_groups() -> list[list[float]]:
    """One 32-lane group per boundary magnitude m: m is the group's amax (so a scale edge is exercised as such),
    with -m, values that land on e4m3 rounding ties at that scale, and fillers."""
    out = []
    for m in mxfp8_boundary_magnitudes():
        out.append([m, -m, f32(m * 0.5 * (1 + 1 / 16)), f32(m * (1 / 64) * 1.5 * (1 + 1 / 16))] + [f32(m / 3)] * 28)
    return out


def mxfp8_lane_values():
    """float32 lane values for the MXFP8 epilogue: edges, ties, wide-range random, subnormal, zero, inf, NaN."""
    edge = _signed(st.sampled_from(mxfp8_boundary_magnitudes()))
    wide = st.floats(min_value=-F32_MAX, max_value=F32_MAX, width=32, allow_subnormal=True)
    moderate = st.floats(min_value=-1e4, max_value=1e4, width=32)
    special = st.sampled_from([0.0, -0.0, 1e-45, -1e-45, math.inf, -math.inf, math.nan, 3.4028234663852886e38])
    return st.one_of(edge, edge, wide, moderate, special)


@st.composite
def mxfp8_cases(draw):
    """Rows of lanes (a multiple of 32, the reduce's 512 included) in float32 or bf16; each 32-lane group gets its own
    dynamic range (a common exponent shift) so scale codes from 0 to the cap all occur; some groups are all zero or
    carry a NaN/inf lane."""
    width = draw(st.sampled_from([32, 64, 96, 512]))
    rows = draw(st.integers(1, 3))
    groups = []
    for _ in range(rows * width // 32):
        kind = draw(st.sampled_from(["random", "random", "values", "zero", "nonfinite"]))
        if kind == "values":
            groups.append({"values": draw(st.lists(mxfp8_lane_values(), min_size=32, max_size=32))})
            continue
        lane_value, at_least = mxfp8_lane_values(), 0
        if kind == "nonfinite":  # a random group with an inf or NaN lane: the cap and the NaN rule show here
            kind, lane_value, at_least = "random", st.sampled_from([math.inf, -math.inf, math.nan]), 1
        groups.append({"kind": kind, "exp": draw(st.integers(-150, 127)),
                       "specials": draw(st.lists(st.tuples(st.integers(0, 31), lane_value).map(list),
                                                 min_size=at_least, max_size=3))})
    return {"seed": draw(st.integers(0, 2 ** 31 - 1)), "rows": rows, "width": width, "groups": groups,
            "dtype": draw(st.sampled_from(["float32", "float32", "bfloat16"])),
            "layout": draw(st.sampled_from(["contiguous", "strided"]))}


@st.composite
def rope_cases(draw):
    """Reduce output [tokens, heads, width] (width >= 64; RoPE on the last 64 lanes), positions into a cos/sin cache
    of any length (first and last position included), NaN/inf lanes, float32 or bf16 in and out."""
    tokens = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 2, 3]))
    width = draw(st.sampled_from([64, 128, 512]))
    max_pos = draw(st.integers(1, 40))
    positions = draw(st.lists(st.one_of(st.just(0), st.just(max_pos - 1), st.integers(0, max_pos - 1)),
                              min_size=tokens, max_size=tokens))
    specials = draw(st.lists(st.tuples(st.integers(0, tokens * heads * width - 1),
                                       st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30,
                                                        1e-40])).map(list), max_size=3))
    return {"seed": draw(st.integers(0, 2 ** 31 - 1)), "tokens": tokens, "heads": heads, "width": width,
            "max_pos": max_pos, "positions": positions, "scale": draw(st.sampled_from([1e-3, 1.0, 300.0, 1e20])),
            "specials": specials, "in_dtype": draw(st.sampled_from(["float32", "bfloat16"])),
            "out_dtype": draw(st.sampled_from(["float32", "bfloat16"])),
            "cos_sin": draw(st.sampled_from(["angles", "angles", "exact"]))}


@st.composite
def epilogue_cases(draw):
    """Either epilogue, chosen per case."""
    which = draw(st.sampled_from(["rope", "mxfp8"]))
    inner = draw(rope_cases() if which == "rope" else mxfp8_cases())
    return {"epilogue": which, **inner}


# --- dispatch ---------------------------------------------------------------------------------------------------

COMPRESS_RATIOS = (0, 1, 4, 128)
KV_CACHE_DTYPES = ("fp8_ds_mla", "auto", "bfloat16", "fp8")


def dispatch_flag_grid() -> list[dict]:
    """Every combination of the dispatch inputs (ratio x swa_only x capture x extra cache x dtype x KV transfer),
    contradictory ones included (the dispatcher must reject those)."""
    out = []
    for ratio, swa, cap, extra, dt, xfer in itertools.product(COMPRESS_RATIOS, (False, True), (False, True),
                                                               (False, True), KV_CACHE_DTYPES, (False, True)):
        out.append({"compress_ratio": ratio, "swa_only": swa, "for_cudagraph_capture": cap,
                    "has_extra_cache": extra, "kv_cache_dtype": dt, "has_kv_transfer": xfer})
    return out


def dispatch_cases():
    """A chunk of the flag grid per case (the contract's examples cover the whole grid; the generator samples it)."""
    grid = dispatch_flag_grid()
    return st.lists(st.sampled_from(grid), min_size=1, max_size=24).map(lambda flags: {"flags": flags})
