"""Cases for ``fp8-ds-mla-dequant-exact``: fp8_ds_mla cache views full of arbitrary bytes (every fp8 code, NaN codes
included; every UE8M0 code, 0 and 255 included), dense or padded block strides, views that start past a pool's first
blocks, slots in any order and repeated; a slot tensor packed or a stride-2 view into a larger buffer."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

TOKEN_BYTES = 584  # 448 fp8 NoPE + 64 bf16 RoPE (128 B) + 7 UE8M0 scales + 1 pad
USED_BLOCK_PAD = 576  # FlashMLA rounds a block of tokens' bytes up to a multiple of 576
BLOCK_CLASSES = ("1", "odd", "64")
SCALE_KINDS = ("random", "extremes")
SLOT_ORDERS = ("sorted", "shuffled", "repeated")
#: the memory of a slot tensor (the same ids): packed, or every other element of a larger buffer starting 3 elements
#: in, the gaps holding another valid slot (a reader that ignores the stride or the offset dequantizes other rows).
#: The cache view's own memory is the ``padded`` and ``offset`` dimensions (blocks padded apart, a slice of a pool)
SLOTS_LAYOUTS = ("contiguous", "strided")


@dataclass(frozen=True)
class DequantCase(Case):
    """A pool of ``num_blocks`` blocks of ``block_size`` tokens from ``seed`` (random bytes; ``scales`` "extremes"
    draws the scale bytes from {0, 1, 126, 127, 128, 254, 255}); ``padded`` block stride; the view starts
    ``offset_blocks`` blocks into the pool; ``slots`` read in ``order``, as a list or a tensor (``slots_as``) laid out
    as ``slots_layout`` says (:data:`SLOTS_LAYOUTS`; a list is always "contiguous"); the fp8 ``flavour``."""

    KIND = "fp8-ds-mla-dequant-exact"
    ADDED_FIELDS = ("slots_layout",)
    seed: int
    block_size: int
    num_blocks: int
    padded: bool
    offset_blocks: int
    flavour: Literal["ocp", "fnuz"]
    scales: Literal["random", "extremes"] = "random"
    order: Literal["sorted", "shuffled", "repeated"] = "sorted"
    slots_as: Literal["list", "tensor"] = "list"
    slots_layout: Literal["contiguous", "strided"] = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.block_size < 1 or self.num_blocks < 1 or self.offset_blocks < 0 or self.seed < 0:
            raise ValueError("block_size / num_blocks: expected >= 1; offset_blocks / seed: expected >= 0")
        if self.slots_layout not in SLOTS_LAYOUTS:
            raise ValueError(f"slots_layout: expected one of {SLOTS_LAYOUTS}, got {self.slots_layout!r}")
        if self.slots_as == "list" and self.slots_layout != "contiguous":
            raise ValueError("slots_layout: a slot list has no memory layout (slots_as='tensor' for one)")

    def slots(self) -> list[int]:
        n = self.block_size * self.num_blocks
        g = torch.Generator().manual_seed(self.seed + 1)
        if self.order == "sorted":
            return list(range(n))
        if self.order == "shuffled":
            return torch.randperm(n, generator=g).tolist()
        return [int(x) for x in torch.randint(0, n, (n + 3,), generator=g)] + [n - 1, n - 1, 0]


@st.composite
def dequant_cases(draw) -> DequantCase:
    bs = draw(st.sampled_from([1, 2, 3, 7, 64]))
    slots_as = draw(st.sampled_from(["list", "tensor"]))
    return DequantCase(seed=draw(st.integers(0, 2**31 - 1)), block_size=bs,
                       num_blocks=draw(st.integers(1, 3 if bs < 64 else 1)), padded=draw(st.booleans()),
                       offset_blocks=draw(st.integers(0, 2)), flavour=draw(st.sampled_from(["ocp", "fnuz"])),
                       scales=draw(st.sampled_from(SCALE_KINDS)), order=draw(st.sampled_from(SLOT_ORDERS)),
                       slots_as=slots_as,
                       slots_layout=draw(st.sampled_from(SLOTS_LAYOUTS)) if slots_as == "tensor" else "contiguous")


def build_slots(case: DequantCase, device="cpu"):
    """``(buffer, argument)``: the case's slots as the dequantizer is handed them (a list, or an int64 tensor on
    ``device`` laid out as ``slots_layout``: a strided view's gaps hold slot ``n - 1 - s`` of its neighbour ``s``)
    and the buffer under a tensor (None for a list)."""
    slots = case.slots()
    if case.slots_as == "list":
        return None, slots
    t = torch.tensor(slots, dtype=torch.int64)
    if case.slots_layout == "contiguous":
        t = t.to(device)
        return t, t
    n = case.block_size * case.num_blocks
    buf = torch.full((2 * len(slots) + 5,), n - 1, dtype=torch.int64)
    buf[3:3 + 2 * len(slots):2] = t
    buf[4:4 + 2 * len(slots):2] = n - 1 - t
    buf = buf.to(device)
    return buf, buf.as_strided((len(slots),), (2,), 3)


def block_stride(case: DequantCase) -> int:
    used = case.block_size * TOKEN_BYTES
    return -(-used // USED_BLOCK_PAD) * USED_BLOCK_PAD if case.padded else used


def build_cache(case: DequantCase, device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """(pool, view): random bytes everywhere, the view ``[num_blocks, block_size, 584]`` with the case's stride."""
    g = torch.Generator().manual_seed(case.seed)
    stride = block_stride(case)
    pool = torch.randint(0, 256, ((case.num_blocks + case.offset_blocks) * stride,), generator=g,
                         dtype=torch.int64).to(torch.uint8)
    if case.scales == "extremes":
        pick = torch.tensor([0, 1, 126, 127, 128, 254, 255], dtype=torch.uint8)
        for b in range(case.num_blocks):
            base = (case.offset_blocks + b) * stride + case.block_size * (TOKEN_BYTES - 8)
            n = case.block_size * 8
            pool[base:base + n] = pick[torch.randint(0, 7, (n,), generator=g)]
    pool = pool.to(device)
    view = pool.as_strided((case.num_blocks, case.block_size, TOKEN_BYTES), (stride, TOKEN_BYTES, 1),
                           case.offset_blocks * stride)
    return pool, view


# --- declared dimensions ---------------------------------------------------------------------------------------

def _bs_class(bs: int) -> str | None:
    return "1" if bs == 1 else "64" if bs == 64 else "odd" if bs % 2 else None


def classify_dequant(case: DequantCase, target) -> dict:
    out = {"padded": case.padded, "offset": case.offset_blocks > 0, "flavour": case.flavour, "scales": case.scales,
           "order": case.order, "slots_as": case.slots_as, "slots_layout": case.slots_layout}
    cls = _bs_class(case.block_size)
    if cls is not None:
        out["block"] = cls
    return out


def force_dequant(case: DequantCase, combo: dict, target) -> DequantCase:
    f = dataclasses.asdict(case)
    if "block" in combo:
        f["block_size"] = {"1": 1, "odd": 3, "64": 64}[combo["block"]]
        if f["block_size"] == 64:
            f["num_blocks"] = 1
    if "offset" in combo:
        f["offset_blocks"] = (1 + case.seed % 2) if combo["offset"] else 0
    for k in ("padded", "flavour", "scales", "order", "slots_as", "slots_layout"):
        if k in combo:
            f[k] = combo[k]
    if f["slots_layout"] != "contiguous" and "slots_as" not in combo:
        f["slots_as"] = "tensor"  # a laid-out slot tensor (the combination names no slots_as)
    if f["slots_as"] == "list":
        f["slots_layout"] = "contiguous"
    return DequantCase(**f)


def _dequant_allowed(c: dict, target) -> bool:
    return not (c.get("slots_as") == "list" and c.get("slots_layout", "contiguous") != "contiguous")


def _examples(target) -> list[DequantCase]:
    return [DequantCase(seed=s, block_size=2, num_blocks=1, padded=False, offset_blocks=0, flavour="ocp")
            for s in (0, 1)]


def _declare():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "fp8-ds-mla-dequant",
        (Dimension("block", BLOCK_CLASSES, "block size: 1, odd, production 64"),
         Dimension("padded", (False, True), "block stride dense (584 bs) or padded to a multiple of 576"),
         Dimension("offset", (False, True), "the view starts past the pool's first blocks"),
         Dimension("flavour", ("ocp", "fnuz"), "fp8 flavour of the NoPE codes"),
         Dimension("scales", SCALE_KINDS, "scale bytes random, or only 0 / 1 / 126-128 / 254 / 255"),
         Dimension("order", SLOT_ORDERS, "slots sorted, shuffled, or repeated"),
         Dimension("slots_as", ("list", "tensor"), "slots as a Python list or an int tensor"),
         Dimension("slots_layout", SLOTS_LAYOUTS, "a slot tensor packed, or a stride-2 view into a larger buffer")),
        (("block", "padded"), ("block", "offset"), ("padded", "offset"), ("flavour", "scales"),
         ("slots_layout", "slots_as"), ("slots_layout", "order")),
        classify_dequant, force_dequant, _dequant_allowed, _examples), "fp8-ds-mla-dequant-exact")


DEQUANT_DIMENSIONS = _declare()
