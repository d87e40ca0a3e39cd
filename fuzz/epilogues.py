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
    ADDED_FIELDS = ('out_layout',)
    seed: int
    rows: int
    width: int
    groups: tuple[Mxfp8Group, ...]
    dtype: FloatDtype = "float32"
    layout: Literal["contiguous", "strided"] = "contiguous"
    #: the codes and scales buffers handed in: packed, or row slices of wider buffers (:func:`mxfp8_outputs`)
    out_layout: Literal["contiguous", "strided"] = "contiguous"

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
    ADDED_FIELDS = ('layout',)
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
    #: where ``out`` sits against ``x``: a buffer of its own, ``x`` itself, ``x``'s first element with other strides
    #: (the [H, T, W] order), ``x``'s storage from half a row in, or the same storage just past ``x``
    #: ``tail``: out starts at x's last element (they share exactly that one element)
    alias: Literal["separate", "in-place", "restrided", "shifted", "adjacent", "tail"] = "separate"
    #: the memory of x, cos_sin and positions (the same values): :data:`ROPE_LAYOUTS`
    layout: Literal["contiguous", "x-padded", "x-heads-major", "table-slice", "positions-strided"] = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.layout.startswith("x-") and self.alias != "separate":
            raise ValueError(f"layout: {self.layout!r} lays out x in a buffer of its own; alias {self.alias!r} puts x "
                             "in out's storage")
        if self.alias != "separate" and self.in_dtype != self.out_dtype:
            raise ValueError(f"alias: an out in x's storage ({self.alias!r}) has x's dtype, got {self.in_dtype} in "
                             f"and {self.out_dtype} out")
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


#: where a RoPE case's ``out`` sits against ``x`` (:attr:`RopeCase.alias`)
ALIASES = ("separate", "in-place", "restrided", "shifted", "adjacent", "tail")
#: x packed; x's heads 64 lanes apart past their width (a slice of a wider [T, H, W + 64] buffer); x's heads
#: outermost in memory (strides W, T * W, 1); cos_sin a slice of a wider, row-offset table; positions a stride-2 view
ROPE_LAYOUTS = ("contiguous", "x-padded", "x-heads-major", "table-slice", "positions-strided")
#: an out overlapping x without being x: the entry point is right to refuse it (contracts.epilogues)
ROPE_REFUSABLE_ALIASES = ("restrided", "shifted", "tail")


def rope_refusable(c: "RopeCase") -> bool:
    """Whether the inverse RoPE may refuse this call: an overlapping out, or a layout it requires packed."""
    return c.alias in ROPE_REFUSABLE_ALIASES or c.layout != "contiguous"


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
    width = draw(st.sampled_from([32, 64, 96, 128, 160, 288, 512]))
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
                     layout=draw(st.sampled_from(["contiguous", "strided"])),
                     out_layout=draw(st.sampled_from(["contiguous", "contiguous", "strided"])))


@st.composite
def rope_cases(draw) -> "RopeCase":
    """Reduce output [tokens, heads, width] (width >= 64; RoPE on the last 64 lanes), positions into a cos/sin cache
    of any length (first and last position included), NaN/inf lanes, float32 or bf16 in and out."""
    tokens = draw(st.integers(1, 3))
    heads = draw(st.sampled_from([1, 2, 3]))
    width = draw(st.sampled_from([64, 96, 128, 512]))  # 96: the copied lanes end inside a 64-lane copy block
    max_pos = draw(st.integers(1, 40))
    positions = draw(st.lists(st.one_of(st.just(0), st.just(max_pos - 1), st.integers(0, max_pos - 1)),
                              min_size=tokens, max_size=tokens))
    specials = draw(st.lists(st.tuples(st.integers(0, tokens * heads * width - 1),
                                       st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1e30, -1e30,
                                                        1e-40])), max_size=3))
    case = RopeCase(seed=draw(st.integers(0, 2 ** 31 - 1)), tokens=tokens, heads=heads, width=width,
                    max_pos=max_pos, positions=tuple(positions),
                    scale=draw(st.sampled_from([1e-3, 1.0, 300.0, 1e20])), specials=tuple(specials),
                    in_dtype=draw(st.sampled_from(["float32", "bfloat16"])),
                    out_dtype=draw(st.sampled_from(["float32", "bfloat16"])),
                    cos_sin=draw(st.sampled_from(["angles", "angles", "exact"])))
    alias = draw(st.sampled_from(ALIASES + ("separate",) * 3))
    if alias != "separate":
        import dataclasses

        case = dataclasses.replace(case, alias=alias, out_dtype=case.in_dtype)
    layouts = ROPE_LAYOUTS if alias == "separate" else ("contiguous", "table-slice", "positions-strided")
    return case.replace(layout=draw(st.sampled_from(("contiguous",) * 2 + layouts)))


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
    return lay_out_rope(case.layout, x.to(device), cos_sin.to(device),
                        torch.tensor(case.positions, dtype=torch.int64, device=device))


def lay_out_rope(layout: str, x: torch.Tensor, cos_sin: torch.Tensor, positions: torch.Tensor):
    """(x, cos_sin, positions) with the same values in the memory ``layout`` names (extra elements NaN / -1)."""
    T, H, W = x.shape
    if layout == "x-padded":
        wide = torch.full((T, H, W + 64), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, :, :W] = x
        x = wide[:, :, :W]
    elif layout == "x-heads-major":
        x = x.permute(1, 0, 2).contiguous().permute(1, 0, 2)
    elif layout == "table-slice":
        P, C = cos_sin.shape
        wide = torch.full((P + 1, C + 16), float("nan"), dtype=cos_sin.dtype, device=cos_sin.device)
        wide[1:, 8:8 + C] = cos_sin
        cos_sin = wide[1:, 8:8 + C]
    elif layout == "positions-strided":
        positions = torch.stack([positions, torch.full_like(positions, -1)], dim=1).reshape(-1)[::2]
    return x, cos_sin, positions


def mxfp8_outputs(case: Mxfp8Case, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes_buf, codes, scales_buf, scales): the 0xA5-poisoned output buffers and the views handed in (the whole
    buffers when packed; row slices of buffers 16 bytes wider, from byte 8, when ``out_layout`` is strided)."""
    out = []
    for width in (case.width, case.width // 32):
        if case.out_layout == "strided":
            buf = torch.full((case.rows + 1, width + 16), 0xA5, dtype=torch.uint8, device=device)
            out += [buf, buf.reshape(-1)[8:].as_strided((case.rows, width), (width + 16, 1))]
        else:
            buf = torch.full((case.rows, width), 0xA5, dtype=torch.uint8, device=device)
            out += [buf, buf]
    return tuple(out)


def rope_out(case: RopeCase, x: torch.Tensor, out_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(x, out) for a RoPE case: ``x`` (the tokens of :func:`rope_input`) moved into the storage ``case.alias``
    names, and ``out`` NaN-filled where it does not share ``x``'s elements. ``restrided``: ``out`` starts at ``x``'s
    first element with the [H, T, W] strides (rows of other tokens and heads); ``shifted``: ``out`` starts half a row
    into ``x``; ``adjacent``: ``out`` directly follows ``x`` in one storage (no element shared)."""
    T, H, W = x.shape
    n = T * H * W
    if case.alias == "separate":
        return x, torch.full((T, H, W), float("nan"), dtype=out_dtype, device=x.device)
    if case.alias == "in-place":
        return x, x
    buf = torch.full((2 * n + W,), float("nan"), dtype=x.dtype, device=x.device)
    buf[:n] = x.reshape(-1)
    xv = buf[:n].view(T, H, W)
    if case.alias == "restrided":
        return xv, buf.as_strided((T, H, W), (W, T * W, 1), 0)
    start = {"shifted": W // 2, "tail": n - 1}.get(case.alias, n)
    return xv, buf[start:start + n].view(T, H, W)


# --- declared dimensions ----------------------------------------------------------------------------------------

#: groups per row of an MXFP8 case, around the kernel's tile of ``impl.epilogues.MXFP8_GROUPS_PER_PROGRAM`` = 4
#: groups (1, t-1, t, t+1, 2t+1), and RoPE widths (no copied lanes, one 64-lane copy block, seven of them)
MXFP8_GROUP_COUNTS = {"g1": 1, "g3": 3, "g4": 4, "g5": 5, "g9": 9}
ROPE_WIDTHS = {"w64": 64, "w128": 128, "w512": 512}
#: the first MXFP8 group's amax class: all zero, fp32-subnormal quotient amax / 448 (below 448 * 2^-126), below the
#: kernel's rescale threshold 2^-100, ordinary, exactly a scale edge 448 * 2^k, a +-inf lane (the cap), a NaN lane
MXFP8_LANES = ("zero", "signed-zero", "tiny", "low", "normal", "edge", "inf", "nan")
#: a RoPE case's non-finite lanes: none, a NaN, an inf (written into the first row's RoPE block when forced)
ROPE_LANES = ("none", "nan", "inf")
_LOW_AMAX, _SUBQ_AMAX = 2.0 ** -100, 448.0 * 2.0 ** -126


def _amax_class(case: Mxfp8Case) -> str:
    x = mxfp8_input(case, "cpu").to(torch.float32)[0, :32]
    if bool(torch.isinf(x).any()):
        return "inf"
    if bool(torch.isnan(x).any()):
        return "nan"
    a = float(x.abs().max())
    if a == 0:
        return "signed-zero" if bool(torch.signbit(x).any()) else "zero"
    if a < _SUBQ_AMAX:
        return "tiny"
    if a < _LOW_AMAX:
        return "low"
    return "edge" if math.frexp(a / 448.0)[0] == 0.5 else "normal"


def classify_epilogue(case: EpilogueCase, target=None) -> dict:
    """The dimension values an epilogue case hits."""
    if case.epilogue == "mxfp8":
        m = case.mxfp8
        return {"epilogue": "mxfp8", "in_dtype": m.dtype, "out": "e4m3", "alias": "separate",
                "length": f"g{m.width // 32}", "lanes": _amax_class(m), "layout": m.layout,
                "out_layout": m.out_layout, "rope_layout": "contiguous"}
    r = case.rope
    vals = [v for _, v in r.specials]
    lanes = "nan" if any(math.isnan(v) for v in vals) else ("inf" if any(math.isinf(v) for v in vals) else "none")
    return {"epilogue": "rope", "in_dtype": r.in_dtype, "out": r.out_dtype, "alias": r.alias,
            "length": f"w{r.width}", "lanes": lanes, "layout": "contiguous", "out_layout": "contiguous",
            "rope_layout": r.layout}


def _first_group(kind: str, seed: int) -> Mxfp8Group:
    if kind == "zero":
        return Mxfp8Group(kind="zero")
    if kind == "signed-zero":  # -0.0 and +0.0 lanes: amax 0 (scale code 0), the codes keep each lane's sign
        return Mxfp8Group(kind="values", values=(-0.0, 0.0) * 16)
    if kind in ("tiny", "low", "normal"):
        return Mxfp8Group(kind="random", exp={"tiny": -126, "low": -108, "normal": seed % 21 - 10}[kind])
    if kind == "edge":
        m = math.ldexp(448.0, seed % 7 - 3)
        return Mxfp8Group(kind="values", values=(m, -m / 2) + (f32(m / 3),) * 30)
    return Mxfp8Group(kind="random", exp=0, specials=((seed % 32, math.inf if kind == "inf" else math.nan),))


def force_epilogue(case: EpilogueCase, combo: dict, target=None) -> EpilogueCase:
    """``case`` rewritten to hit ``combo``: the epilogue (a switched one starts from a small case of the same seed),
    dtypes, where ``out`` sits, the row length class, the first group's amax or the non-finite lanes, the layout."""
    import dataclasses

    have = classify_epilogue(case)
    epi = combo.get("epilogue", case.epilogue)
    seed = (case.mxfp8 or case.rope).seed
    if epi == "mxfp8":
        m = case.mxfp8 or Mxfp8Case(seed=seed, rows=1, width=32, groups=(Mxfp8Group(kind="random"),))
        ng = MXFP8_GROUP_COUNTS.get(combo.get("length"), m.width // 32)
        groups = list(m.groups[:m.rows * ng])
        groups += [Mxfp8Group(kind="random", exp=(seed + i) % 41 - 20) for i in range(m.rows * ng - len(groups))]
        lanes = combo.get("lanes", have["lanes"] if case.epilogue == "mxfp8" else "normal")
        groups[0] = _first_group(lanes, seed)
        dtype = combo.get("in_dtype", m.dtype)
        m = dataclasses.replace(m, width=32 * ng, groups=tuple(groups), dtype=dtype,
                                layout=combo.get("layout", m.layout), out_layout=combo.get("out_layout", m.out_layout))
        return EpilogueCase(epilogue="mxfp8", mxfp8=m)
    r = case.rope or RopeCase(seed=seed, tokens=2, heads=2, width=64, max_pos=4, positions=(0, 3))
    width = ROPE_WIDTHS.get(combo.get("length"), r.width)
    in_dtype = combo.get("in_dtype", r.in_dtype)
    alias = combo.get("alias", r.alias)
    out_dtype = combo.get("out", r.out_dtype)
    tokens, heads, positions = r.tokens, r.heads, r.positions
    if alias != "separate":  # two tokens and two heads: programs that read what another one wrote
        out_dtype, tokens, heads = in_dtype, 2, 2
        positions = (tuple(positions) + (r.max_pos - 1,))[:2]
    lanes = combo.get("lanes", have["lanes"] if case.epilogue == "rope" else "none")
    specials = () if lanes == "none" else ((width - 64 + seed % 64, math.nan if lanes == "nan" else math.inf),)
    layout = combo.get("rope_layout", r.layout)
    if alias != "separate" and layout.startswith("x-"):
        layout = "contiguous"
    r = dataclasses.replace(r, width=width, in_dtype=in_dtype, out_dtype=out_dtype, alias=alias, tokens=tokens,
                            heads=heads, positions=tuple(positions), specials=specials, layout=layout)
    return EpilogueCase(epilogue="rope", rope=r)


def _epilogue_of(c: dict) -> set:
    """The epilogues a partial combination can belong to."""
    both = {"mxfp8", "rope"}
    out = set(both) if "epilogue" not in c else {c["epilogue"]}
    if "out" in c:
        out &= {"mxfp8"} if c["out"] == "e4m3" else {"rope"}
    if c.get("alias", "separate") != "separate" or c.get("length", "g").startswith("w"):
        out &= {"rope"}
    if c.get("length", "w").startswith("g") or c.get("layout") == "strided" or c.get("out_layout") == "strided":
        out &= {"mxfp8"}
    if c.get("rope_layout", "contiguous") != "contiguous":
        out &= {"rope"}
    if "lanes" in c and c["lanes"] not in ("nan", "inf"):
        out &= {"rope"} if c["lanes"] == "none" else {"mxfp8"}
    return out


def _epilogue_allowed(c: dict, target=None) -> bool:
    if not _epilogue_of(c):
        return False
    if c.get("alias", "separate") != "separate" and "out" in c and "in_dtype" in c and c["out"] != c["in_dtype"]:
        return False
    if c.get("alias", "separate") != "separate" and c.get("rope_layout", "contiguous").startswith("x-"):
        return False
    return True


def epilogue_examples(target=None) -> list[EpilogueCase]:
    """Plain cases of either epilogue."""
    return [EpilogueCase(epilogue="mxfp8", mxfp8=Mxfp8Case(seed=1, rows=1, width=32,
                                                           groups=(Mxfp8Group(kind="random"),))),
            EpilogueCase(epilogue="rope", rope=RopeCase(seed=2, tokens=1, heads=1, width=64, max_pos=1,
                                                        positions=(0,)))]


def _declare_epilogues():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "epilogues",
        (Dimension("epilogue", ("mxfp8", "rope")),
         Dimension("in_dtype", ("float32", "bfloat16"), "the rows' dtype (bf16 read as raw words)"),
         Dimension("out", ("float32", "bfloat16", "e4m3"), "RoPE's output dtype; MXFP8 writes e4m3 codes"),
         Dimension("alias", ALIASES, "where RoPE's out sits against x: own buffer, x itself, overlapping, adjacent"),
         Dimension("length", tuple(MXFP8_GROUP_COUNTS) + tuple(ROPE_WIDTHS),
                   "MXFP8 groups per row around the 4-group tile; RoPE row width (copied lanes before the last 64)"),
         Dimension("lanes", MXFP8_LANES + ("none",), "MXFP8: the first group's amax class; RoPE: NaN / inf lanes"),
         Dimension("layout", ("contiguous", "strided"), "MXFP8 rows as views into a wider buffer"),
         Dimension("out_layout", ("contiguous", "strided"), "MXFP8 codes / scales buffers packed or row slices"),
         Dimension("rope_layout", ROPE_LAYOUTS, "RoPE's x padded or heads-major, cos_sin a slice, positions "
                                                "strided")),
        # dtype pairs with what bf16 changes: the casts, the overlap arithmetic (element size), the raw-word
        # widening of subnormal / NaN / inf lanes, the strided views; the length classes are reached one by one
        (("in_dtype", "out"), ("alias", "in_dtype"), ("lanes", "in_dtype"), ("layout", "in_dtype"),
         ("out_layout", "in_dtype"), ("rope_layout", "in_dtype"), ("rope_layout", "alias")),
        classify_epilogue, force_epilogue, _epilogue_allowed, epilogue_examples), "epilogue-oracle-agreement")


EPILOGUE_DIMENSIONS = _declare_epilogues()
