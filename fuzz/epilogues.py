"""Cases, strategies and input builders for the reduce-epilogue contract (``impl.epilogues``): MXFP8 rows on the
scale edges and rounding ties, and inverse GPT-J RoPE over NaN/inf lanes and any cos/sin cache."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from fuzz.formats import f32

F32_MAX = 3.4028234663852886e38
FloatDtype = Literal["float32", "bfloat16"]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Mxfp8Group(Case):
    """One 32-lane group: its own ``values``, or ``random`` lanes (normal, times 2^``exp``) or ``zero`` lanes, with
    ``specials`` (lane, value) written over them."""

    KIND = "mxfp8-group"
    kind: Literal["values", "random", "zero"]
    exp: int = 0
    specials: tuple[tuple[int, float], ...] = ()
    values: tuple[float, ...] = ()

    def __post_init__(self):
        super().__post_init__()
        if self.kind == "values" and len(self.values) != 32:
            raise ValueError(f"values: a 'values' group holds 32 lanes, got {len(self.values)}")
        if self.kind != "values" and self.values:
            raise ValueError(f"values: only a 'values' group lists its lanes (this one is {self.kind!r})")
        bad = [i for i, _ in self.specials if not 0 <= i < 32]
        if bad:
            raise ValueError(f"specials: lane {bad[0]} outside [0, 32)")


@dataclass(frozen=True)
class Mxfp8Case(Case):
    """``rows`` rows of ``width`` lanes (``width // 32`` groups each, row-major) in ``dtype``; ``strided`` rows are
    views into a buffer twice as wide."""

    KIND = "mxfp8"
    seed: int
    rows: int
    width: int
    groups: tuple[Mxfp8Group, ...]
    dtype: FloatDtype = "float32"
    layout: Literal["contiguous", "strided"] = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.rows < 1 or self.width < 32 or self.width % 32:
            raise ValueError(f"rows, width: expected rows >= 1 and a positive multiple of 32 lanes, got "
                             f"{self.rows} x {self.width}")
        if len(self.groups) != self.rows * self.width // 32:
            raise ValueError(f"groups: expected rows * width / 32 = {self.rows * self.width // 32}, "
                             f"got {len(self.groups)}")


@dataclass(frozen=True)
class RopeCase(Case):
    """A reduce output [tokens, heads, width] (normal times ``scale``, ``specials`` (flat index, value) written over
    it) in ``in_dtype``, a cos/sin cache of ``max_pos`` rows (``exact`` values or real ``angles``), one position per
    token, the result in ``out_dtype``."""

    KIND = "rope"
    seed: int
    tokens: int
    heads: int
    width: int
    max_pos: int
    positions: tuple[int, ...]
    scale: float = 1.0
    specials: tuple[tuple[int, float], ...] = ()
    in_dtype: FloatDtype = "float32"
    out_dtype: FloatDtype = "float32"
    cos_sin: Literal["angles", "exact"] = "angles"

    def __post_init__(self):
        super().__post_init__()
        if self.tokens < 1 or self.heads < 1 or self.width < 64 or self.max_pos < 1:
            raise ValueError(f"tokens, heads, width, max_pos: expected >= 1, >= 1, >= 64, >= 1, got {self.tokens}, "
                             f"{self.heads}, {self.width}, {self.max_pos}")
        if len(self.positions) != self.tokens or any(not 0 <= p < self.max_pos for p in self.positions):
            raise ValueError(f"positions: expected {self.tokens} positions in [0, {self.max_pos}), "
                             f"got {list(self.positions)}")
        n = self.tokens * self.heads * self.width
        bad = [i for i, _ in self.specials if not 0 <= i < n]
        if bad:
            raise ValueError(f"specials: index {bad[0]} outside [0, {n})")


@dataclass(frozen=True)
class EpilogueCase(Case):
    """One epilogue run: ``epilogue`` names which, and exactly that one of ``mxfp8`` / ``rope`` is set."""

    KIND = "epilogue-oracle-agreement"
    epilogue: Literal["mxfp8", "rope"]
    mxfp8: Mxfp8Case | None = None
    rope: RopeCase | None = None

    def __post_init__(self):
        super().__post_init__()
        given = [name for name in ("mxfp8", "rope") if getattr(self, name) is not None]
        if given != [self.epilogue]:
            raise ValueError(f"epilogue: {self.epilogue!r} needs exactly its own parameters, got {given or 'none'}")


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
def mxfp8_cases(draw) -> "Mxfp8Case":
    """Rows of lanes (a multiple of 32, the reduce's 512 included) in float32 or bf16; each 32-lane group gets its own
    dynamic range (a common exponent shift) so scale codes from 0 to the cap all occur; some groups are all zero or
    carry a NaN/inf lane."""
    width = draw(st.sampled_from([32, 64, 96, 512]))
    rows = draw(st.integers(1, 3))
    groups = []
    for _ in range(rows * width // 32):
        kind = draw(st.sampled_from(["random", "random", "values", "zero", "nonfinite"]))
        if kind == "values":
            groups.append(Mxfp8Group(kind="values",
                                     values=tuple(draw(st.lists(mxfp8_lane_values(), min_size=32, max_size=32)))))
            continue
        lane_value, at_least = mxfp8_lane_values(), 0
        if kind == "nonfinite":  # a random group with an inf or NaN lane: the cap and the NaN rule show here
            kind, lane_value, at_least = "random", st.sampled_from([math.inf, -math.inf, math.nan]), 1
        groups.append(Mxfp8Group(kind=kind, exp=draw(st.integers(-150, 127)),
                                 specials=tuple(draw(st.lists(st.tuples(st.integers(0, 31), lane_value),
                                                              min_size=at_least, max_size=3)))))
    return Mxfp8Case(seed=draw(st.integers(0, 2 ** 31 - 1)), rows=rows, width=width, groups=tuple(groups),
                     dtype=draw(st.sampled_from(["float32", "float32", "bfloat16"])),
                     layout=draw(st.sampled_from(["contiguous", "strided"])))


@st.composite
def rope_cases(draw) -> "RopeCase":
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
                                                        1e-40])), max_size=3))
    return RopeCase(seed=draw(st.integers(0, 2 ** 31 - 1)), tokens=tokens, heads=heads, width=width,
                    max_pos=max_pos, positions=tuple(positions),
                    scale=draw(st.sampled_from([1e-3, 1.0, 300.0, 1e20])), specials=tuple(specials),
                    in_dtype=draw(st.sampled_from(["float32", "bfloat16"])),
                    out_dtype=draw(st.sampled_from(["float32", "bfloat16"])),
                    cos_sin=draw(st.sampled_from(["angles", "angles", "exact"])))


@st.composite
def epilogue_cases(draw) -> "EpilogueCase":
    """Either epilogue, chosen per case."""
    which = draw(st.sampled_from(["rope", "mxfp8"]))
    if which == "rope":
        return EpilogueCase(epilogue="rope", rope=draw(rope_cases()))
    return EpilogueCase(epilogue="mxfp8", mxfp8=draw(mxfp8_cases()))


# --- inputs -----------------------------------------------------------------------------------------------------

def mxfp8_input(case: Mxfp8Case, device) -> torch.Tensor:
    """The float32 (or bf16) rows of an MXFP8 case on ``device``, built group by group; strided layouts are row
    views into a wider NaN-filled buffer."""
    g = torch.Generator().manual_seed(case.seed)
    vals: list[float] = []
    for grp in case.groups:
        if grp.kind == "values":
            vals += [float(v) for v in grp.values]
            continue
        if grp.kind == "zero":
            lanes = [0.0] * 32
        else:
            lanes = (torch.randn(32, generator=g, dtype=torch.float64) * 2.0 ** grp.exp).tolist()
        for i, v in grp.specials:
            lanes[i] = float(v)
        vals += lanes
    rows, width = case.rows, case.width
    x = torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(rows, width).to(DTYPES[case.dtype])
    x = x.to(device)
    if case.layout == "strided":
        wide = torch.full((rows, 2 * width), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, :width] = x
        x = wide[:, :width]
    return x


def rope_input(case: RopeCase, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, cos_sin, positions) of a RoPE case on ``device``: cos_i in column i and sin_i in column 32 + i."""
    g = torch.Generator().manual_seed(case.seed)
    T, H, W = case.tokens, case.heads, case.width
    x = (torch.randn(T, H, W, generator=g, dtype=torch.float64) * case.scale).to(torch.float32)
    flat = x.view(-1)
    for i, v in case.specials:
        flat[i] = float(v)
    x = x.to(DTYPES[case.in_dtype])
    P = case.max_pos
    if case.cos_sin == "exact":
        choices = torch.tensor([0.0, 1.0, -1.0, 0.5, -0.5, 0.75])
        cos = choices[torch.randint(0, len(choices), (P, 32), generator=g)]
        sin = choices[torch.randint(0, len(choices), (P, 32), generator=g)]
    else:
        # theta_i * p with a GPT-J-like frequency ladder
        theta = torch.arange(P, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(32) / 32.0))[None, :]
        theta = theta + torch.rand(P, 32, generator=g, dtype=torch.float64)
        cos, sin = theta.cos(), theta.sin()
    cos_sin = torch.cat([cos, sin], dim=1).to(torch.float32)
    return x.to(device), cos_sin.to(device), torch.tensor(case.positions, dtype=torch.int64, device=device)
