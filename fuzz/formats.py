"""Cases and strategies for the codec and layout contracts (``impl.formats``): boundary-heavy float32 values and
cache geometries."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Literal

from hypothesis import strategies as st

from fuzz import capabilities
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


def next32(x: float, toward: float) -> float:
    """The float32 neighbour of float32 ``x`` toward ``toward`` (``math.nextafter`` steps a float64 ulp, which
    rounds back to ``x`` in float32)."""
    import torch

    a = torch.tensor(x, dtype=torch.float32)
    return float(torch.nextafter(a, torch.tensor(toward, dtype=torch.float32)))


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
        out += [mid, next32(mid, 0.0), next32(mid, math.inf)]
    vmax = FP8_MAX[flavour]
    out += [vmax * 1.03125, vmax * 1.0625, vmax * 2, 1e30, math.ldexp(1, -2 - FP8_BIAS[flavour]) / 2]
    return [f32(v) for v in out]


#: the memory of a codec's input tensor (the encode inputs, and the codes every decode reads), the values the same:
#: packed (ending where an unreadable page begins); "strided": every other element of a larger buffer, starting 3 elements in (the gaps hold a poison value,
#: so a reader that ignores the stride or the view's offset reads other values); "column-major": a 2-D ``[n, 2]``
#: tensor (column 0 the values, column 1 them reversed) stored as the transpose of a packed ``[2, n]`` (a reader that
#: walks memory instead of the logical order reads them interleaved)
CODEC_LAYOUTS = ("contiguous", "strided", "column-major")


def lay_out_codec_input(x, layout: str, fill):
    """``x`` (1-D, CPU) in ``layout``'s memory (:data:`CODEC_LAYOUTS`; ``fill``: the strided view's gap value).
    Returns ``(buffer, view)``: the whole buffer under the view (to check nothing wrote into it) and the view,
    whose logical row-major elements are what the codec is handed (for "column-major", ``[n, 2]``)."""
    import torch

    if layout == "contiguous":
        # a packed copy whose last byte is the last readable one before a PROT_NONE page (Linux, CPU): a kernel
        # that reads its tail block unmasked (past the n elements it was handed) faults instead of reading garbage
        # it then drops (the Triton kernels run on the CPU tensor itself under the interpreter)
        from fuzz.cp_gather import before_guard_page

        g = before_guard_page(x) if x.device.type == "cpu" and x.numel() else x
        return g, g
    if layout == "strided":
        n = x.numel()
        buf = torch.full((2 * n + 5,), fill, dtype=x.dtype)
        view = buf[3:3 + 2 * n:2]
        view.copy_(x)
        return buf, view
    if layout == "column-major":
        packed = torch.stack([x, x.flip(0)])  # [2, n]
        buf = packed.contiguous()
        return buf, buf.t()
    raise ValueError(f"layout: expected one of {CODEC_LAYOUTS}, got {layout!r}")


@dataclass(frozen=True)
class Fp8Case(Case):
    """float32 inputs to encode in one fp8 flavour (decode is checked on all 256 codes whatever the inputs); the
    encode inputs and the decoded codes are laid out in memory as ``input_layout`` says (:data:`CODEC_LAYOUTS`)."""

    KIND = "fp8-codec"
    ADDED_FIELDS = ("input_layout",)
    flavour: Fp8Flavour
    values: tuple[float, ...]
    input_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.input_layout not in CODEC_LAYOUTS:
            raise ValueError(f"input_layout: expected one of {CODEC_LAYOUTS}, got {self.input_layout!r}")


@dataclass(frozen=True)
class Ue8m0Case(Case):
    """Positive float32 scales to encode with the writer's code cap."""

    KIND = "ue8m0-codec"
    ADDED_FIELDS = ("input_layout",)
    cap: int
    scales: tuple[float, ...]
    #: the memory of the encoded scales and the decoded codes (:data:`CODEC_LAYOUTS`)
    input_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.cap not in (254, 255):
            raise ValueError(f"cap: expected 254 or 255, got {self.cap!r}")
        if self.input_layout not in CODEC_LAYOUTS:
            raise ValueError(f"input_layout: expected one of {CODEC_LAYOUTS}, got {self.input_layout!r}")


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
        lambda t: next32(math.ldexp(1.0, t[0]), math.inf if t[1] > 0 else 0.0))
    rnd = st.floats(min_value=1.401298464324817e-45, max_value=3.4028234663852886e38, width=32, allow_subnormal=True)
    # scales above 2^126 encode to 254 or 255: the only place the writer's cap shows
    top = st.floats(min_value=math.ldexp(1.0, 126), max_value=3.4028234663852886e38, width=32)
    special = st.sampled_from([math.inf, math.nan, 1e-45, 3.4028234663852886e38, 1e-4 / 448])
    return st.lists(st.one_of(pow2, near, rnd, top, special), min_size=1, max_size=48)


def fp8_cases(flavours):
    """An :class:`Fp8Case` per draw, in one of ``flavours`` (the ones a target's caches use)."""
    return st.sampled_from(sorted(flavours)).flatmap(
        lambda fl: st.builds(Fp8Case, flavour=st.just(fl), values=fp8_values(fl),
                             input_layout=st.sampled_from(CODEC_LAYOUTS)))


def ue8m0_cases(writer_cap: int):
    """A :class:`Ue8m0Case` per draw: both caps and the target writer's own."""
    return st.builds(Ue8m0Case, cap=st.sampled_from([254, 255, writer_cap]), scales=ue8m0_scales(),
                     input_layout=st.sampled_from(CODEC_LAYOUTS))


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


# --- declared dimensions ----------------------------------------------------------------------------------------

#: the class of an fp8 encode input: NaN, +-inf, zero, above the flavour's max (saturates), an fp8 value, an exact
#: half-way tie (round to even), another value in the subnormal range, another normal one
FP8_VALUE_CLASSES = ("nan", "inf", "zero", "saturate", "grid", "tie", "subnormal", "between")


def _fp8_min_normal(flavour: str) -> float:
    return math.ldexp(1.0, 1 - FP8_BIAS[flavour])


def fp8_value_class(x: float, flavour: str) -> str:
    """The :data:`FP8_VALUE_CLASSES` class of float32 ``x`` for ``flavour``."""
    import bisect

    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf"
    a = abs(x)
    if a == 0:
        return "zero"
    if a > FP8_MAX[flavour]:
        return "saturate"
    g = _grid_values(flavour)
    i = bisect.bisect_left(g, a)
    if g[i] == a:
        return "grid"
    if a == (g[i - 1] + g[i]) / 2:
        return "tie"
    return "subnormal" if a < _fp8_min_normal(flavour) else "between"


def _fp8_class_values(cls: str, flavour: str) -> list[float]:
    g = _grid_values(flavour)
    mids = [(a + b) / 2 for a, b in zip(g, g[1:])]
    vmax, mn = FP8_MAX[flavour], _fp8_min_normal(flavour)
    off = [next32(m, d) for m in mids for d in (0.0, math.inf)]
    return {"nan": [math.nan], "inf": [math.inf], "zero": [0.0],
            "saturate": [f32(vmax * 1.03125), f32(vmax * 2), 1e30, 3.4028234663852886e38],
            "grid": [v for v in g if v > 0], "tie": mids,
            "subnormal": [v for v in off if v < mn], "between": [v for v in off if v >= mn]}[cls]


def classify_fp8(case: Fp8Case, target=None) -> dict:
    """The flavour, and the class and sign of the first input."""
    x = case.values[0]
    return {"flavour": case.flavour, "value": fp8_value_class(x, case.flavour),
            "sign": "-" if math.copysign(1.0, x) < 0 else "+", "input_layout": case.input_layout}


def force_fp8(case: Fp8Case, combo: dict, target=None) -> Fp8Case:
    """``case`` in ``combo``'s flavour, its first input replaced by one of the class (picked by the case's length)
    with the sign; the other inputs as drawn."""
    have = classify_fp8(case)
    flavour = combo.get("flavour", case.flavour)
    cls, sign = combo.get("value", have["value"]), combo.get("sign", have["sign"])
    cands = _fp8_class_values(cls, flavour)
    v = cands[(len(case.values) * 7) % len(cands)]
    v = math.copysign(v, -1.0 if sign == "-" else 1.0)
    return Fp8Case(flavour=flavour, values=(f32(v),) + tuple(case.values[1:]),
                   input_layout=combo.get("input_layout", case.input_layout))


#: the class of a UE8M0 encode scale: a power of two, one ulp above or below one, another normal value, an fp32
#: subnormal, above 2^127 (encodes past 254: where the writer's cap shows), inf, NaN
UE8M0_SCALE_CLASSES = ("pow2", "above", "below", "between", "subnormal", "top", "inf", "nan")


def ue8m0_scale_class(s: float) -> str:
    if math.isnan(s):
        return "nan"
    if math.isinf(s):
        return "inf"
    if s < math.ldexp(1.0, -126):
        return "subnormal"
    if s > math.ldexp(1.0, 127):
        return "top"
    if math.frexp(s)[0] == 0.5:
        return "pow2"
    if math.frexp(next32(s, 0.0))[0] == 0.5:
        return "above"
    if math.frexp(next32(s, math.inf))[0] == 0.5:
        return "below"
    return "between"


def _ue8m0_class_value(cls: str, k: int) -> float:
    p = math.ldexp(1.0, k % 250 - 125)  # a normal power of two in [2^-125, 2^124]
    return {"pow2": p, "above": next32(p, math.inf), "below": next32(p, 0.0),
            "between": f32(p * 1.375), "subnormal": math.ldexp(1.0, -149 + k % 23) * (1 + (k % 2)),
            "top": f32(math.ldexp(1.0 + (k % 8) / 8 + 1 / 16, 127)), "inf": math.inf, "nan": math.nan}[cls]


def classify_ue8m0(case: Ue8m0Case, target=None) -> dict:
    return {"cap": case.cap, "scale": ue8m0_scale_class(case.scales[0]), "input_layout": case.input_layout}


def force_ue8m0(case: Ue8m0Case, combo: dict, target=None) -> Ue8m0Case:
    """``case`` with ``combo``'s cap, its first scale replaced by one of the class; the other scales as drawn."""
    cls = combo.get("scale", ue8m0_scale_class(case.scales[0]))
    v = _ue8m0_class_value(cls, len(case.scales) * 37)
    return Ue8m0Case(cap=combo.get("cap", case.cap), scales=(f32(v),) + tuple(case.scales[1:]),
                     input_layout=combo.get("input_layout", case.input_layout))


LAYOUT_BLOCKS = {"1": 1, "odd": 5, "16": 16, "64": 64}
LAYOUT_PADS = {"dense": 0, "odd-pad": 7, "even-pad": 64}


def classify_layout(case: LayoutCase, target=None) -> dict:
    bs, pad = case.block_size, case.stride_pad
    nslots = bs * case.num_blocks
    return {"layout": case.layout,
            "block": "1" if bs == 1 else ("odd" if bs % 2 else str(bs) if bs in (16, 64) else "even"),
            "stride": "dense" if pad == 0 else ("odd-pad" if pad % 2 else "even-pad"),
            "offset": "0" if case.offset_blocks == 0 else "into-pool",
            "blocks": "1" if case.num_blocks == 1 else "many",
            "tokens": "all" if min(case.num_tokens, nslots) == nslots else "few"}


def force_layout(case: LayoutCase, combo: dict, target=None) -> LayoutCase:
    """``case`` rewritten to ``combo``'s layout, block size, stride padding, pool offset, block count and token
    count (the seed, and so the slots and bytes, as drawn)."""
    import dataclasses

    have = classify_layout(case)
    c = {**have, **combo}
    bs = LAYOUT_BLOCKS.get(c["block"], case.block_size)
    nb = {"1": 1, "many": 3}[c["blocks"]]
    nslots = bs * nb
    return dataclasses.replace(case, layout=c["layout"], block_size=bs, num_blocks=nb,
                               stride_pad=LAYOUT_PADS.get(c["stride"], case.stride_pad),
                               offset_blocks=0 if c["offset"] == "0" else 1 + case.seed % 2,
                               num_tokens=nslots if c["tokens"] == "all" else max(1, nslots // 2))


CASE_LAYOUTS = ("fp8_ds_mla", "indexer-normal", "indexer-shuffle")


def _subject_layouts(target) -> tuple:
    """The layouts whose packer or unpacker the subject under audit has on ``target``, as the contract side answers
    :data:`fuzz.capabilities.CACHE_LAYOUTS` (it caches per subject and target); all three when it has none (the
    contract then skips the row, naming the missing entry point) or when nothing answers."""
    return tuple(capabilities.ask(capabilities.CACHE_LAYOUTS, target, CASE_LAYOUTS) or ()) or CASE_LAYOUTS


def _layout_allowed(c: dict, target=None) -> bool:
    if "layout" in c and target is not None and c["layout"] not in _subject_layouts(target):
        return False
    if c.get("layout") == "indexer-shuffle" and c.get("block") in ("1", "odd"):
        return False
    if c.get("block") == "1" and c.get("blocks") == "1" and c.get("tokens") == "few":
        return False
    return True


def _fp8_flavours(target) -> set:
    return {target.main_cache_fp8, target.extra_cache_fp8}


def fp8_examples(target) -> list[Fp8Case]:
    fl = sorted(_fp8_flavours(target))[0]
    return [Fp8Case(flavour=fl, values=(1.0,)), Fp8Case(flavour=fl, values=(0.5, -3.0, 7.0))]


def ue8m0_examples(target) -> list[Ue8m0Case]:
    return [Ue8m0Case(cap=254, scales=(1.0,)), Ue8m0Case(cap=255, scales=(0.75, 2.0))]


def layout_examples(target=None) -> list[LayoutCase]:
    return [LayoutCase(layout="fp8_ds_mla", block_size=2, num_blocks=1, stride_pad=0, offset_blocks=0, seed=1,
                       num_tokens=1),
            LayoutCase(layout="indexer-normal", block_size=16, num_blocks=2, stride_pad=1, offset_blocks=2, seed=4,
                       num_tokens=5)]


def _declare_formats():
    from fuzz.dimensions import Dimension, Family, declare

    declare(Family(
        "fp8-codec",
        (Dimension("flavour", ("ocp", "fnuz"), "the flavours of the target's caches (FNUZ: gfx942's main cache)"),
         Dimension("value", FP8_VALUE_CLASSES, "the first encode input's class"),
         Dimension("sign", ("+", "-"), "its sign (-0, -NaN and -inf included)"),
         Dimension("input_layout", CODEC_LAYOUTS, "the memory of the encode inputs and the decoded codes: packed, a "
                                                  "stride-2 view past a buffer's start, column-major 2-D")),
        (("flavour", "value"), ("value", "sign"), ("input_layout", "flavour")),
        classify_fp8, force_fp8, lambda c, t: c.get("flavour", "ocp") in _fp8_flavours(t), fp8_examples),
        "fp8-codec-exact")
    declare(Family(
        "ue8m0-codec",
        (Dimension("cap", (254, 255), "the writer's code cap"),
         Dimension("scale", UE8M0_SCALE_CLASSES, "the first scale's class around the binade edges"),
         Dimension("input_layout", CODEC_LAYOUTS, "the memory of the encoded scales and the decoded codes: packed, "
                                                  "a stride-2 view past a buffer's start, column-major 2-D")),
        (("cap", "scale"), ("input_layout", "cap")), classify_ue8m0, force_ue8m0, None, ue8m0_examples),
        "ue8m0-codec-exact")
    declare(Family(
        "cache-layout",
        (Dimension("layout", ("fp8_ds_mla", "indexer-normal", "indexer-shuffle")),
         Dimension("block", tuple(LAYOUT_BLOCKS), "block size: 1, odd, the shuffle tile, production"),
         Dimension("stride", tuple(LAYOUT_PADS), "bytes between blocks beyond the dense size"),
         Dimension("offset", ("0", "into-pool"), "the view's first block in the pool"),
         Dimension("blocks", ("1", "many"), "blocks in the view (addressing bugs show past block 0)"),
         Dimension("tokens", ("few", "all"), "tokens written: some slots, or every slot of every block")),
        (("layout", "block"), ("layout", "stride"), ("block", "stride"), ("stride", "offset"),
         ("blocks", "tokens"), ("layout", "blocks")),
        classify_layout, force_layout, _layout_allowed, layout_examples), "cache-layout-roundtrip")


_declare_formats()
