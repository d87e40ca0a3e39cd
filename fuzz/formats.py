"""Cases and strategies for the codec and layout contracts (``impl.formats``): boundary-heavy float32 values and
cache geometries."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Literal

from hypothesis import strategies as st

from fuzz.cases import Case

Fp8Flavour = Literal["ocp", "fnuz"]
CacheLayout = Literal["fp8_ds_mla", "indexer-normal", "indexer-shuffle"]

FP8_MAX = {"ocp": 448.0, "fnuz": 240.0}
FP8_BIAS = {"ocp": 7, "fnuz": 8}


def f32(x: float) -> float:
    """Round a Python float to the nearest float32 (so a case holds exactly what the kernel sees)."""
    if math.isnan(x) or math.isinf(x):
        return x
    try:
        return struct.unpack("f", struct.pack("f", x))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def _grid_values(flavour: str) -> list[float]:
    """Every finite positive fp8 magnitude of the flavour."""
    bias = FP8_BIAS[flavour]
    vals = [math.ldexp(m / 8.0, 1 - bias) for m in range(8)]
    vals += [math.ldexp(1 + m / 8.0, e - bias) for e in range(1, 16) for m in range(8)]
    return sorted(v for v in vals if v <= FP8_MAX[flavour])


def fp8_boundary_values(flavour: str) -> list[float]:
    """Representable values, exact half-way ties, one float32 ulp either side of each tie, max, just above max."""
    g = _grid_values(flavour)
    out = list(g)
    for a, b in zip(g, g[1:]):
        mid = (a + b) / 2  # exact in float32: one more mantissa bit than fp8
        out += [mid, math.nextafter(mid, 0.0), math.nextafter(mid, math.inf)]
    vmax = FP8_MAX[flavour]
    out += [vmax * 1.03125, vmax * 1.0625, vmax * 2, 1e30, math.ldexp(1, -2 - FP8_BIAS[flavour]) / 2]
    return [f32(v) for v in out]


@dataclass(frozen=True)
class Fp8Case(Case):
    """float32 inputs to encode in one fp8 flavour (decode is checked on all 256 codes whatever the inputs)."""

    KIND = "fp8-codec"
    flavour: Fp8Flavour
    values: tuple[float, ...]


@dataclass(frozen=True)
class Ue8m0Case(Case):
    """Positive float32 scales to encode with the writer's code cap."""

    KIND = "ue8m0-codec"
    cap: int
    scales: tuple[float, ...]

    def __post_init__(self):
        super().__post_init__()
        if self.cap not in (254, 255):
            raise ValueError(f"cap: expected 254 or 255, got {self.cap!r}")


@dataclass(frozen=True)
class LayoutCase(Case):
    """A cache geometry (a view ``offset_blocks`` blocks into a byte pool, ``stride_pad`` bytes between blocks beyond
    the dense size) and how many tokens to write, from ``seed``."""

    KIND = "cache-layout"
    layout: CacheLayout
    block_size: int
    num_blocks: int
    stride_pad: int
    offset_blocks: int
    seed: int
    num_tokens: int

    def __post_init__(self):
        super().__post_init__()
        for name in ("block_size", "num_blocks", "num_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        for name in ("stride_pad", "offset_blocks", "seed"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        if self.layout == "indexer-shuffle" and self.block_size % 16:
            raise ValueError(f"block_size: the shuffle layout needs a multiple of 16, got {self.block_size}")


def fp8_values(flavour: str):
    """Lists of float32 inputs for fp8 encoding: boundaries (either sign), random finite, non-finite."""
    boundary = st.sampled_from(fp8_boundary_values(flavour))
    signed_boundary = st.tuples(boundary, st.booleans()).map(lambda t: -t[0] if t[1] else t[0])
    anyf = st.floats(width=32, allow_nan=True, allow_infinity=True)
    special = st.sampled_from([0.0, -0.0, math.inf, -math.inf, math.nan, 1e-45, -1e-45, 3.4e38])
    return st.lists(st.one_of(signed_boundary, signed_boundary, anyf, special), min_size=1, max_size=48)


def ue8m0_scales():
    """Positive float32 scales: powers of two and their float32 neighbours, subnormals, random, inf, NaN."""
    pow2 = st.integers(-149, 127).map(lambda e: math.ldexp(1.0, e))
    near = st.tuples(st.integers(-140, 126), st.sampled_from([-1, 1])).map(
        lambda t: f32(math.nextafter(math.ldexp(1.0, t[0]), math.inf if t[1] > 0 else 0.0)))
    rnd = st.floats(min_value=1.401298464324817e-45, max_value=3.4028234663852886e38, width=32, allow_subnormal=True)
    # scales above 2^126 encode to 254 or 255: the only place the writer's cap shows
    top = st.floats(min_value=math.ldexp(1.0, 126), max_value=3.4028234663852886e38, width=32)
    special = st.sampled_from([math.inf, math.nan, 1e-45, 3.4028234663852886e38, 1e-4 / 448])
    return st.lists(st.one_of(pow2, near, rnd, top, special), min_size=1, max_size=48)


def fp8_cases(flavours):
    """An :class:`Fp8Case` per draw, in one of ``flavours`` (the ones a target's caches use)."""
    return st.sampled_from(sorted(flavours)).flatmap(
        lambda fl: st.builds(Fp8Case, flavour=st.just(fl), values=fp8_values(fl)))


def ue8m0_cases(writer_cap: int):
    """A :class:`Ue8m0Case` per draw: both caps and the target writer's own."""
    return st.builds(Ue8m0Case, cap=st.sampled_from([254, 255, writer_cap]), scales=ue8m0_scales())


@st.composite
def layout_cases(draw):
    """A cache geometry (odd block sizes, padded and dense strides, views offset into a pool) and tokens; the
    shuffle layout's tiles need a block size that is a multiple of 16."""
    # the main cache's layout as often as both indexer layouts; padded strides and several blocks mostly, since
    # addressing bugs (stride(0) ignored, a region misplaced) show only past block 0 of a padded pool
    layout = draw(st.sampled_from(["fp8_ds_mla", "fp8_ds_mla", "indexer-normal", "indexer-shuffle"]))
    sizes = [16, 64] if layout == "indexer-shuffle" else [1, 2, 5, 16, 61, 64]
    block_size, num_blocks = draw(st.sampled_from(sizes)), draw(st.sampled_from([1, 2, 2, 3, 4]))
    # a few tokens, or enough to reach every block (addressing bugs past block 0 show only there)
    num_tokens = draw(st.one_of(st.integers(1, 6), st.integers(1, block_size * num_blocks)))
    return LayoutCase(layout=layout, block_size=block_size, num_blocks=num_blocks,
                      stride_pad=draw(st.sampled_from([0, 1, 7, 64, 576])), offset_blocks=draw(st.integers(0, 2)),
                      seed=draw(st.integers(0, 2**31 - 1)), num_tokens=num_tokens)


# --- exhaustive domains -------------------------------------------------------------------------------------------

#: what an :class:`ExhaustiveCase` runs: the codec (and its flavour or cap) over its whole small domain
EXHAUSTIVE_PARAMS = {"fp8-encode": ("ocp", "fnuz"), "ue8m0-encode": ("254", "255"), "mx-scale": ("mxfp8", "mxfp4")}


def all_bf16_values():
    """All 65,536 bf16 bit patterns as float32 (exact): both zeros, subnormals, normals, +-inf and every NaN."""
    import torch

    return torch.arange(65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(torch.float32)


def binade_boundaries(signed: bool = True):
    """float32 values on both sides of every binade boundary: 2^k - ulp, 2^k, 2^k + ulp for every k from -149
    (the smallest subnormal; its lower neighbour is 0) to 127, then the largest finite and +inf (2^128's side),
    with 0; both signs when ``signed``."""
    import torch

    p = torch.ldexp(torch.ones(277, dtype=torch.float32), torch.arange(-149, 128, dtype=torch.int32))
    below = torch.nextafter(p, torch.zeros_like(p))
    above = torch.nextafter(p, torch.full_like(p, math.inf))
    top = torch.tensor([3.4028234663852886e38, math.inf, 0.0], dtype=torch.float32)
    pos = torch.cat([below, p, above, top]).unique()
    return torch.cat([pos, -pos]) if signed else pos


@dataclass(frozen=True)
class ExhaustiveCase(Case):
    """One codec over its whole small domain (all bf16 values, every fp32 binade boundary): ``codec`` names it and
    ``param`` its flavour ("ocp"/"fnuz"), writer cap ("254"/"255") or scale format ("mxfp8"/"mxfp4"). The inputs
    are not drawn: the case only says which codec the row checks."""

    KIND = "exhaustive"
    codec: str
    param: str

    def __post_init__(self):
        super().__post_init__()
        if self.codec not in EXHAUSTIVE_PARAMS:
            raise ValueError(f"codec: expected one of {sorted(EXHAUSTIVE_PARAMS)}, got {self.codec!r}")
        if self.param not in EXHAUSTIVE_PARAMS[self.codec]:
            raise ValueError(f"param: expected one of {EXHAUSTIVE_PARAMS[self.codec]}, got {self.param!r}")


def exhaustive_cases(codec: str, params=None):
    """An :class:`ExhaustiveCase` for ``codec`` per draw, over ``params`` (default: all of the codec's)."""
    return st.sampled_from(sorted(params or EXHAUSTIVE_PARAMS[codec])).map(
        lambda p: ExhaustiveCase(codec=codec, param=p))
