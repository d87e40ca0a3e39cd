"""Case types and strategies for the indexer-K writers (``impl.indexer_writer``); tensors are built from a case's seed
by ``build_*``.

What they reach: NaN, +-inf, huge (near FLT_MAX / the bf16 maximum), denormal and all-zero rows (the 1e-4 amax floor),
rows whose maximum is exactly DIV * 2^j (the power-of-two scale's boundary: ceil(log2) of an exact power of two); bf16
and fp32 k; odd block sizes (1, 3, 16, 64; SHUFFLE needs a multiple of 16) and layouts that cannot hold them (the
writer must refuse them and leave the cache untouched); padded block strides (4-byte aligned) and views that start
inside a pool filled with seeded random bytes (so an untouched byte is a checked byte); slot mappings with -1,
INT32_MIN / INT64_MIN and holes; both scale formats; compressor windows that start before position 0, two requests
with permuted state block tables, FP8 (fp32 or 4 x UE8M0 scale words) and MXFP4 records.
Duplicate slots are not generated: the writers reject them (tests/test_indexer_writer.py checks that).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from hypothesis import strategies as st

from fuzz import capabilities
from fuzz.cache_writers import (INPUT_LAYOUTS, WRITER_LAYOUTS, InputLayout, force_input_layout,
                                lay_out_compressor_inputs,
                                lay_out_k_and_slots, writer_layout)
from fuzz.cases import Case

HEAD = 128
TOKEN_BYTES = {"fp8": 132, "mxfp4": 68}
SPECIAL_VALUES = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "huge": 3e38,
                  "denormal": 1e-40}
#: direct-writer specials: "zero-row" zeroes the token, "pow2-max" makes its |max| exactly DIV * 2^j, "above-pow2-max"
#: one fp32 step above it (bf16 k: the bf16 step), where ceil(log2(scale)) must still round up
DIRECT_KINDS = ("nan", "inf", "-inf", "huge", "denormal", "zero-row", "pow2-max", "above-pow2-max")
#: compressor specials (state rows), as the head-512 compressor's generator has them
COMPRESSOR_KINDS = ("nan", "inf", "-inf", "huge", "denormal", "zero-group")
WEIGHT_KINDS = ("normal", "huge", "denormal", "zero-group", "nan", "inf", "tiny")
NEGATIVE_SLOTS = (-1, -1, -1, -2 ** 31, -2 ** 63)
STRIDE_PADS = (0, 4, 64, 576)
#: slack after a pool's last block: a SHUFFLE write at a block size its tiles do not fit (a position < 16 of a
#: block shorter than 16 tokens) reaches at most 16 * 128 bytes past its block's start, so even a writer that skips
#: the refusal stays inside the allocation and the check sees the bytes it changed instead of a crash
POOL_TAIL = 16 * 128

SpecialKind = Literal["nan", "inf", "-inf", "huge", "denormal", "zero-row", "pow2-max", "above-pow2-max",
                      "zero-group"]
WeightKind = Literal["normal", "huge", "denormal", "zero-group", "nan", "inf", "tiny"]
LayoutChoice = Literal["default", "normal", "shuffle"]


def resolved_layout(layout: str, block_size: int, default: str) -> str:
    return default if layout == "default" else layout


def direct_default_layout(block_size: int) -> str:
    """SPEC 1.3 ``cache_layout=None``: NORMAL when bs == 1, SHUFFLE otherwise."""
    return "normal" if block_size == 1 else "shuffle"


def _check_geometry(case) -> None:
    if case.input_layout not in INPUT_LAYOUTS:
        raise ValueError(f"input_layout: expected one of {INPUT_LAYOUTS}, got {case.input_layout!r}")
    if case.block_size < 1 or case.num_blocks < 1 or case.extra_blocks_before < 0 or case.stride_pad < 0:
        raise ValueError("block_size and num_blocks must be >= 1, extra_blocks_before and stride_pad >= 0")
    cap = case.num_blocks * case.block_size
    bad = [s for s in case.slots if s >= cap]
    if bad:
        raise ValueError(f"slots: {bad} outside ..{cap - 1} (num_blocks * block_size)")
    live = [s for s in case.slots if s >= 0]
    if len(set(live)) != len(live):
        raise ValueError(f"slots: {list(case.slots)} repeat a slot (the writers reject that)")


@dataclass(frozen=True)
class DirectCase(Case):
    """A direct-writer case (``indexer_k_quant_and_cache``): ``T`` k rows of ``dtype`` (seeded, per-row scale
    10^(log_scale/3), specials at (token, dim, kind)) written through ``slots`` (negative: skipped) into a pool of
    the given geometry; ``layout`` "default" lets the writer pick (SPEC 1.3). A layout that cannot hold the block
    size (SHUFFLE with bs % 16 != 0) is a case the writer must refuse."""

    KIND: ClassVar[str] = "indexer-direct"
    ADDED_FIELDS = ('input_layout',)

    seed: int
    T: int
    slots: tuple[int, ...]
    log_scale: tuple[int, ...]
    block_size: int
    num_blocks: int
    layout: LayoutChoice = "default"
    scale_fmt: Literal["ue8m0"] | None = None
    dtype: Literal["bfloat16", "float32"] = "bfloat16"
    specials: tuple[tuple[int, int, SpecialKind], ...] = ()
    stride_pad: int = 0
    extra_blocks_before: int = 0
    #: fuzz.cache_writers.INPUT_LAYOUTS: the same values in packed, strided or stride-2 (per-token vectors) memory
    input_layout: InputLayout = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.T < 1 or len(self.slots) != self.T or len(self.log_scale) != self.T:
            raise ValueError(f"T={self.T}: slots and log_scale need one entry per token")
        _check_geometry(self)
        bad = [sp for sp in self.specials if not (0 <= sp[0] < self.T and 0 <= sp[1] < HEAD)]
        if bad:
            raise ValueError(f"specials: {bad} outside token 0..{self.T - 1}, dim 0..127")

    @property
    def layout_name(self) -> str:
        return resolved_layout(self.layout, self.block_size, direct_default_layout(self.block_size))

    @property
    def refused(self) -> bool:
        """The writer must raise: the layout cannot hold the block size."""
        return self.layout_name == "shuffle" and self.block_size % 16 != 0


@dataclass(frozen=True)
class IndexerCompressorCase(Case):
    """A head-128 compressor case (``compress_norm_rope_store_indexer``): tokens at ``positions`` of requests
    ``reqs`` over seeded state rows (scores times ``score_scale``, specials at (index, "kv" | "score", dim, kind)),
    norm weights of kind ``weight``, written through ``slots`` into a pool of ``kv_format``'s record (fp8 132 B,
    mxfp4 68 B); ``layout`` "default" is NORMAL (C4A)."""

    KIND: ClassVar[str] = "indexer-compressor"
    ADDED_FIELDS = ('input_layout',)

    seed: int
    positions: tuple[int, ...]
    reqs: tuple[int, ...]
    slots: tuple[int, ...]
    block_size: int
    num_blocks: int
    ratio: Literal[4] = 4
    state_block_size: int = 4
    num_reqs: int = 1
    score_scale: float = 1.0
    weight: WeightKind = "normal"
    eps: float = 1e-6
    kv_format: Literal["fp8", "mxfp4"] = "fp8"
    layout: LayoutChoice = "default"
    mx_scale: bool = False
    specials: tuple[tuple[int, Literal["kv", "score"], int, SpecialKind], ...] = ()
    stride_pad: int = 0
    extra_blocks_before: int = 0
    #: fuzz.cache_writers.INPUT_LAYOUTS: the same values in packed, strided or stride-2 (per-token vectors) memory
    input_layout: InputLayout = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        n = len(self.positions)
        if n < 1 or len(self.reqs) != n or len(self.slots) != n:
            raise ValueError("positions, reqs and slots need one entry per token (at least one)")
        if self.state_block_size < 1 or self.num_reqs < 1 or any(not 0 <= r < self.num_reqs for r in self.reqs):
            raise ValueError(f"reqs: {list(self.reqs)} outside 0..{self.num_reqs - 1}, or state_block_size < 1")
        if any(p < 0 for p in self.positions):
            raise ValueError(f"positions: {list(self.positions)} must be >= 0")
        if self.kv_format == "mxfp4" and (self.layout == "shuffle" or self.mx_scale):
            raise ValueError("mxfp4: token-major records only, and no mx_scale")
        if self.layout_name == "shuffle" and self.block_size % 16:
            raise ValueError(f"block_size: the shuffle layout needs a multiple of 16, got {self.block_size}")
        _check_geometry(self)
        bad = [sp for sp in self.specials if not (sp[0] >= 0 and 0 <= sp[2] < HEAD)]
        if bad:
            raise ValueError(f"specials: {bad} need index >= 0 and dim 0..127")

    @property
    def layout_name(self) -> str:
        return resolved_layout(self.layout, self.block_size, "normal")


@dataclass(frozen=True)
class IndexerWriterCase(Case):
    """An ``indexer-writer-exact`` case: exactly one of a direct-writer and a compressor case."""

    KIND: ClassVar[str] = "indexer-writer"

    direct: DirectCase | None = None
    compressor: IndexerCompressorCase | None = None

    def __post_init__(self):
        super().__post_init__()
        if (self.direct is None) == (self.compressor is None):
            raise ValueError("an indexer-writer case holds exactly one of direct and compressor")


# --- strategies -------------------------------------------------------------------------------------------------

#: what a subject can write (``impl.indexer_writer.VARIANTS`` has this shape; an adapter may offer less)
ALL_VARIANTS = {"direct_layouts": ("default", "normal", "shuffle"), "compressor_formats": ("fp8", "mxfp4"),
                "compressor_layouts": ("default", "normal", "shuffle"), "mx_scale": (False, True)}


def _slots(draw, n_tokens: int, n_slots: int, allow_skip: bool = True) -> tuple[int, ...]:
    perm = draw(st.permutations(range(n_slots)))
    out = []
    for i in range(n_tokens):
        skip = allow_skip and draw(st.sampled_from((False, False, False, True)))
        out.append(draw(st.sampled_from(NEGATIVE_SLOTS)) if skip else perm[i])
    return tuple(out)


def _geometry(draw, block_sizes, n_tokens: int) -> dict:
    bs = draw(st.sampled_from(block_sizes))
    spare = draw(st.integers(0, 2))
    nb = -(-n_tokens // bs) + spare
    return {"block_size": bs, "num_blocks": nb, "stride_pad": draw(st.sampled_from(STRIDE_PADS)),
            "extra_blocks_before": draw(st.integers(0, 2))}


@st.composite
def direct_cases(draw, variants=ALL_VARIANTS) -> DirectCase:
    T = draw(st.integers(1, 4))
    layout = draw(st.sampled_from(variants["direct_layouts"]))
    if layout == "shuffle" or (layout == "default" and draw(st.booleans())):
        # mostly block sizes the layout can hold; sometimes one it cannot (a refused call)
        sizes = (16, 64) if draw(st.integers(0, 7)) else (3, 5)
    else:
        sizes = (1, 3, 16, 64)
    geo = _geometry(draw, sizes, T)
    return DirectCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)), T=T, layout=layout, **geo,
        slots=_slots(draw, T, geo["block_size"] * geo["num_blocks"]),
        log_scale=tuple(draw(st.lists(st.integers(-30, 30), min_size=T, max_size=T))),
        scale_fmt=draw(st.sampled_from((None, "ue8m0"))),
        dtype=draw(st.sampled_from(("bfloat16", "float32"))),
        specials=tuple(draw(st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, HEAD - 1),
                                               st.sampled_from(DIRECT_KINDS)), max_size=4))),
    )


@st.composite
def compressor_cases(draw, variants=ALL_VARIANTS) -> IndexerCompressorCase:
    # MXFP4 first: the shrinker moves toward the first choice, and a minimal MXFP4 case is as cheap as an FP8 one
    kv_format = draw(st.sampled_from(sorted(variants["compressor_formats"], key=lambda f: f != "mxfp4")))
    layouts = [l for l in variants["compressor_layouts"] if kv_format == "fp8" or l != "shuffle"]
    layout = draw(st.sampled_from(layouts))
    sbs = draw(st.sampled_from((4, 3)))
    n_req = draw(st.integers(1, 2))
    T = draw(st.integers(1, 3))
    positions, reqs = [], []
    for _ in range(T):
        k = draw(st.integers(1, 5))
        positions.append(4 * k - 1 - draw(st.sampled_from((0, 0, 0, 1))))
        reqs.append(draw(st.integers(0, n_req - 1)))
    geo = _geometry(draw, (16, 64) if layout == "shuffle" else (1, 3, 16), T)
    return IndexerCompressorCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)), positions=tuple(positions), reqs=tuple(reqs), num_reqs=n_req,
        state_block_size=sbs, **geo, slots=_slots(draw, T, geo["block_size"] * geo["num_blocks"]),
        score_scale=draw(st.sampled_from((0.0, 1.0, 4.0, 30.0))), weight=draw(st.sampled_from(WEIGHT_KINDS)),
        eps=draw(st.sampled_from((1e-6, 1e-20, 0.0))), kv_format=kv_format, layout=layout,
        mx_scale=kv_format == "fp8" and draw(st.sampled_from(variants["mx_scale"])),
        specials=tuple(draw(st.lists(
            st.tuples(st.integers(0, 10 ** 6), st.sampled_from(("kv", "score")), st.integers(0, HEAD - 1),
                      st.sampled_from(COMPRESSOR_KINDS)), max_size=4))),
    )


def indexer_writer_cases(variants=ALL_VARIANTS):
    return st.one_of(direct_cases(variants).map(lambda c: IndexerWriterCase(direct=c)),
                     compressor_cases(variants).map(lambda c: IndexerWriterCase(compressor=c)))


# --- building tensors from a case ---------------------------------------------------------------------------------

def build_pool(case, token_bytes: int, device):
    """(pool, view): ``view`` is ``[num_blocks, bs, token_bytes]`` uint8 with block stride bs*token_bytes +
    stride_pad, starting ``extra_blocks_before`` blocks into a pool one block and :data:`POOL_TAIL` bytes longer than
    it needs; every byte is seeded random."""
    stride0 = case.block_size * token_bytes + case.stride_pad
    n = (case.extra_blocks_before + case.num_blocks + 1) * stride0 + POOL_TAIL
    g = torch.Generator().manual_seed(case.seed ^ 0x5EED)
    pool = torch.randint(0, 256, (n,), generator=g, dtype=torch.int64).to(torch.uint8).to(device)
    view = torch.as_strided(pool, (case.num_blocks, case.block_size, token_bytes), (stride0, token_bytes, 1),
                            case.extra_blocks_before * stride0)
    return pool, view


def pow2_max_value(dtype: str) -> float:
    """A |max| of exactly 448 * 2^j (also 224 * 2^(j+1)): the power-of-two scale's boundary on both flavours."""
    return 448.0 * 2.0 ** -3


def build_direct_inputs(case: DirectCase, device):
    g = torch.Generator().manual_seed(case.seed)
    k = torch.randn(case.T, HEAD, generator=g, dtype=torch.float64)
    k *= torch.tensor([10.0 ** (s / 3) for s in case.log_scale], dtype=torch.float64)[:, None]
    dt = torch.bfloat16 if case.dtype == "bfloat16" else torch.float32
    k = k.to(dt).to(torch.float64)
    for t, d, kind in case.specials:
        if kind == "zero-row":
            k[t] = 0.0
        elif kind in ("pow2-max", "above-pow2-max"):
            # every other value of the row below half the maximum (earlier specials of the token are dropped)
            row = torch.where(torch.isfinite(k[t]), k[t], torch.zeros_like(k[t]))
            m = float(row.abs().max())
            k[t] = (row * (pow2_max_value(case.dtype) * 0.5 / m) if m > 0 else row).to(dt).to(torch.float64)
            v = torch.tensor(pow2_max_value(case.dtype), dtype=dt)
            if kind == "above-pow2-max":
                v = torch.nextafter(v.float(), torch.tensor(float("inf"))).to(dt) if dt == torch.float32 else \
                    (v.view(torch.int16) + 1).view(torch.bfloat16)
            k[t, d] = float(v) * (1 if d % 2 else -1)
        else:
            v = SPECIAL_VALUES[kind]
            k[t, d] = -v if kind in ("huge", "denormal") and d % 2 == 0 else v
    k = k.to(dt).to(device)
    slots = torch.tensor(case.slots, dtype=torch.int64, device=device)
    return lay_out_k_and_slots(k, slots, case.input_layout)


def build_compressor_inputs(case: IndexerCompressorCase, device) -> dict:
    """Tensors for ``compress_norm_rope_store_indexer`` (head 128, ratio 4: state rows [kv 256 | score 256])."""
    g = torch.Generator().manual_seed(case.seed)
    ratio, sbs = case.ratio, case.state_block_size
    coff = 2 if ratio == 4 else 1
    R = coff * ratio
    max_pos = max(case.positions)
    cols = max_pos // sbs + 1
    n_state_blocks = cols * case.num_reqs + 1
    state = torch.randn(n_state_blocks, sbs, 2 * coff * HEAD, generator=g)
    state[:, :, coff * HEAD:] *= case.score_scale
    table = torch.stack([torch.randperm(n_state_blocks, generator=g)[:cols]
                         for _ in range(case.num_reqs)]).to(torch.int32)
    positions, reqs = case.positions, case.reqs
    for idx, part, d, kind in case.specials:
        t = idx % len(positions)
        p = positions[t] - (idx // len(positions)) % R
        if p < 0:
            p = positions[t]
        i = p - (positions[t] - R + 1)
        half = HEAD if (ratio == 4 and i >= ratio) else 0
        col0 = (coff * HEAD if part == "score" else 0) + half
        if kind == "zero-group":
            lo = (d // 64) * 64
            for q in range(max(positions[t] - R + 1, 0), positions[t] + 1):
                qi = q - (positions[t] - R + 1)
                h = HEAD if (ratio == 4 and qi >= ratio) else 0
                state[int(table[reqs[t], q // sbs]), q % sbs, h + lo:h + lo + 64] = 0.0
        else:
            v = SPECIAL_VALUES[kind]
            if kind in ("huge", "denormal") and d % 2 == 0:
                v = -v
            state[int(table[reqs[t], p // sbs]), p % sbs, col0 + d] = v
    w = 1.0 + 0.25 * torch.randn(HEAD, generator=g)
    if case.weight == "huge":
        w[::3] = 1e38
    elif case.weight == "denormal":
        w[1::4] = 1e-40
    elif case.weight == "zero-group":
        w[64:128] = 0.0
    elif case.weight == "nan":
        w[7] = float("nan")
    elif case.weight == "inf":
        w[100] = float("inf")
    elif case.weight == "tiny":
        w *= 1e-30  # normed values below the 1e-4 amax floor
    ang = torch.rand(max_pos + 1, 32, generator=g, dtype=torch.float64) * 6.283185307179586
    cos_sin = torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.float32)
    inp = {
        "state": state.to(device), "state_block_table": table.to(device),
        "token_to_req": torch.tensor(reqs, dtype=torch.int32, device=device),
        "positions": torch.tensor(positions, dtype=torch.int64, device=device),
        "slot_mapping": torch.tensor(case.slots, dtype=torch.int64, device=device),
        "norm_weight": w.to(device), "cos_sin_cache": cos_sin.to(device),
    }
    return lay_out_compressor_inputs(inp, case.input_layout, case.num_reqs)


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

IW_WRITERS = ("direct", "compressor-fp8", "compressor-mxfp4")
#: "refused": a layout that cannot hold the block size (SHUFFLE at bs % 16 != 0), which the direct writer must refuse
IW_LAYOUTS = ("normal", "shuffle", "refused")
#: block-size classes: 1, odd, the production sizes (16: SHUFFLE's tile; 64)
IW_BLOCKS = ("1", "odd", "16", "64")
IW_SCALES = ("fp32", "ue8m0")
#: the class of the first special on a stored token ("pow2": |max| exactly DIV * 2^j or one step above, direct only)
IW_SPECIALS = ("none", "nan", "inf", "huge", "tiny", "pow2")
_IW_CLASS = {"nan": "nan", "inf": "inf", "-inf": "inf", "huge": "huge", "denormal": "tiny", "zero-row": "tiny",
             "zero-group": "tiny", "pow2-max": "pow2", "above-pow2-max": "pow2"}
#: the invalid slot entries the writers skip, on the last token
IW_SKIPS = ("none", "-1", "int32-min", "int64-min")
_IW_SKIP_VALUE = {"-1": -1, "int32-min": -2 ** 31, "int64-min": -2 ** 63}
_IW_BS = {"1": 1, "odd": 3, "16": 16, "64": 64}


def _iw_writer(case: IndexerWriterCase) -> str:
    if case.direct is not None:
        return "direct"
    return "compressor-" + case.compressor.kv_format


def _iw_block(bs: int) -> str:
    return "1" if bs == 1 else ("odd" if bs % 2 else str(bs))


def _iw_writes(inner, t: int) -> bool:
    if inner.slots[t] < 0:
        return False
    return isinstance(inner, DirectCase) or (inner.positions[t] + 1) % inner.ratio == 0


def _iw_stored_special(inner):
    n = len(inner.slots)
    if isinstance(inner, DirectCase):
        return next((sp for sp in inner.specials if _iw_writes(inner, sp[0])), None)
    return next((sp for sp in inner.specials if _iw_writes(inner, sp[0] % n)), None)


def classify_indexer_writer(case: IndexerWriterCase, target) -> dict:
    """The dimension values an indexer-writer case hits: writer, layout (``refused`` when the layout cannot hold the
    block size), block-size class, scale format (MXFP4's is a UE8M0 code), the class of the first special on a stored
    token, the first negative slot's kind, a padded block stride, the input dtype (the compressor's state is fp32)."""
    inner = case.direct if case.direct is not None else case.compressor
    direct = case.direct is not None
    if direct:
        layout = "refused" if inner.refused else inner.layout_name
        scale = "ue8m0" if inner.scale_fmt == "ue8m0" else "fp32"
    else:
        layout = inner.layout_name
        scale = "ue8m0" if (inner.kv_format == "mxfp4" or inner.mx_scale) else "fp32"
    sp = _iw_stored_special(inner)
    neg = next((s for s in inner.slots if s < 0), None)
    skip = "none" if neg is None else next((k for k, v in _IW_SKIP_VALUE.items() if v == neg), str(neg))
    return {"writer": _iw_writer(case), "layout": layout, "block": _iw_block(inner.block_size), "scale": scale,
            "special": "none" if sp is None else _IW_CLASS[sp[-1]], "skip": skip, "padded": inner.stride_pad > 0,
            "dtype": inner.dtype if direct else "float32", "inputs": writer_layout(inner)}


def force_indexer_writer(case: IndexerWriterCase, combo: dict, target) -> IndexerWriterCase:
    """``case`` rewritten to hit ``combo``: a case of another writer is made afresh from the drawn one's seed (two
    tokens at window ends); the layout, block size (geometry and slots recomputed, one spare block), scale format,
    stride pad, dtype and the last token's invalid slot are then set, and the special is planted on token 0, which
    writes (the drawn specials dropped)."""
    import dataclasses

    inner = case.direct if case.direct is not None else case.compressor
    seed = inner.seed
    writer = combo.get("writer", _iw_writer(case))
    # a stride-2 vector or a strided row read as packed differs from the true one from the second token on, and
    # the last token may be skipped: three tokens
    strided = combo.get("inputs") in ("strided", "strided-index")
    n = 3 if strided else 2
    if writer != _iw_writer(case) or (strided and len(inner.slots) < 3):
        if writer == "direct":
            inner = DirectCase(seed=seed, T=n, slots=tuple(range(n)), log_scale=(seed % 7 - 3,) + (0,) * (n - 1),
                               block_size=1, num_blocks=n)
        else:
            inner = IndexerCompressorCase(seed=seed, positions=tuple(4 * i + 3 for i in range(n)), reqs=(0,) * n,
                                          slots=tuple(range(n)), block_size=1, num_blocks=n,
                                          kv_format=writer.split("-")[1])
    direct = writer == "direct"
    f = {k.name: getattr(inner, k.name) for k in dataclasses.fields(inner)}
    cur = classify_indexer_writer(IndexerWriterCase(**{("direct" if direct else "compressor"): inner}), target)
    skip = combo.get("skip", cur["skip"] if cur["skip"] in _IW_SKIP_VALUE or cur["skip"] == "none" else "-1")
    T = len(f["slots"])
    if skip != "none" and T == 1:  # a skipped token besides the one that writes
        if direct:
            f.update(T=2, log_scale=f["log_scale"] + (0,))
        else:
            f.update(positions=f["positions"] + (f["positions"][0],), reqs=f["reqs"] + (f["reqs"][0],))
        f["specials"] = ()
        T = 2
    if not direct:  # token 0 writes: at a window end
        pos = list(f["positions"])
        if (pos[0] + 1) % f["ratio"]:
            pos[0] = (pos[0] // f["ratio"] + 1) * f["ratio"] - 1
        f["positions"] = tuple(pos)
    layout = combo.get("layout", cur["layout"])
    block = combo.get("block", _iw_block(f["block_size"]))
    bs = _IW_BS.get(block, f["block_size"])
    want = "shuffle" if layout == "refused" else layout
    if want not in _subject_layouts(target, direct):
        f["layout"] = "default"  # the subject names no layout: ``allowed`` kept rows whose default is ``want``
    elif layout == "refused":
        f["layout"] = "shuffle"
    elif layout != (resolved_layout(f["layout"], bs, direct_default_layout(bs) if direct else "normal")):
        f["layout"] = layout
    nb = -(-T // bs) + 1
    f.update(block_size=bs, num_blocks=nb,
             slots=tuple(_IW_SKIP_VALUE[skip] if (skip != "none" and i == T - 1) else nb * bs - 1 - i
                         for i in range(T)))
    scale = combo.get("scale", cur["scale"])
    if direct:
        f["scale_fmt"] = "ue8m0" if scale == "ue8m0" else None
        if "dtype" in combo:
            f["dtype"] = combo["dtype"]
    elif f["kv_format"] == "fp8":
        f["mx_scale"] = scale == "ue8m0"
    if "padded" in combo:
        f["stride_pad"] = (f["stride_pad"] or 4) if combo["padded"] else 0
    if "inputs" in combo:
        force_input_layout(f, combo["inputs"])
    cls = combo.get("special", cur["special"])
    if "special" in combo or _iw_stored_special(inner) is not None:
        if cls == "none":
            f["specials"] = ()
        else:
            kind = {"nan": ("nan",), "inf": ("inf", "-inf"), "huge": ("huge",),
                    "tiny": ("denormal", "zero-row" if direct else "zero-group"),
                    "pow2": ("pow2-max", "above-pow2-max")}[cls]
            kind = kind[seed % len(kind)]
            f["specials"] = ((0, seed % HEAD, kind),) if direct else ((0, "kv", seed % HEAD, kind),)
    inner = type(inner)(**f)
    return IndexerWriterCase(direct=inner) if direct else IndexerWriterCase(compressor=inner)


def _subject_variants(target) -> dict:
    """What the subject under audit can write on ``target`` (the shape of :data:`ALL_VARIANTS`; it may write fewer),
    as the contract side answers :data:`fuzz.capabilities.INDEXER_WRITER_VARIANTS`; all of them when nothing
    answers."""
    return capabilities.ask(capabilities.INDEXER_WRITER_VARIANTS, target, ALL_VARIANTS)


def _subject_layouts(target, direct: bool) -> tuple:
    return tuple(_subject_variants(target)["direct_layouts" if direct else "compressor_layouts"])


def _indexer_writer_allowed(c: dict, target) -> bool:
    """Whether ``c`` can exist on ``target`` for the subject under audit; a combination without a writer or a block
    class is allowed when some writer and block class complete it."""
    if "writer" not in c:
        return any(_indexer_writer_allowed({**c, "writer": w}, target) for w in IW_WRITERS)
    if "block" not in c:
        return any(_indexer_writer_allowed({**c, "block": b}, target) for b in IW_BLOCKS)
    return _complete_allowed(c, target)


def _complete_allowed(c: dict, target) -> bool:
    w = c.get("writer")
    layout, block = c.get("layout"), c.get("block")
    if layout == "refused" and c.get("inputs") in ("strided", "strided-index"):
        return False  # a refused call reads no input: a strided one there would check nothing
    if layout == "shuffle" and block not in (None, "16", "64"):
        return False
    if layout == "refused" and (block not in (None, "1", "odd") or c.get("special", "none") != "none"):
        return False  # a refused call writes nothing: a special there reaches no quantizer
    if w is not None and w != "direct":
        if layout == "refused" or c.get("special") == "pow2" or c.get("dtype") == "bfloat16":
            return False
        if w == "compressor-mxfp4" and (layout not in (None, "normal") or c.get("scale") not in (None, "ue8m0")):
            return False
    if layout == "refused":
        w = "direct"  # only the direct writer is handed a layout it must refuse
    if w is not None or layout is not None or c.get("scale") is not None:
        v = _subject_variants(target)  # the subject under audit may write fewer variants
        if w is not None and w != "direct" and w.split("-")[1] not in v["compressor_formats"]:
            return False
        lay = "shuffle" if layout == "refused" else layout
        key = "direct_layouts" if w == "direct" else "compressor_layouts"
        if w is not None and lay is not None and lay not in v[key]:
            # reachable only through the default layout: NORMAL at bs 1 and SHUFFLE otherwise (direct), NORMAL
            # (compressor)
            if "default" not in v[key]:
                return False
            if w == "direct" and block is not None and (lay == "normal") != (block == "1"):
                return False
            if w != "direct" and lay != "normal":
                return False
        if w == "compressor-fp8" and c.get("scale") is not None and (c["scale"] == "ue8m0") not in v["mx_scale"]:
            return False
    return True


def _indexer_writer_examples(target) -> list[IndexerWriterCase]:
    return [IndexerWriterCase(direct=DirectCase(seed=s, T=1, slots=(0,), log_scale=(0,), block_size=1,
                                                num_blocks=1)) for s in (0, 1)] + \
        [IndexerWriterCase(compressor=IndexerCompressorCase(seed=2, positions=(3,), reqs=(0,), slots=(0,),
                                                            block_size=1, num_blocks=1))]


def _declare_indexer_writers():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "indexer-writers",
        (Dimension("writer", IW_WRITERS, "the direct writer, the head-128 compressor into FP8 or MXFP4 records"),
         Dimension("layout", IW_LAYOUTS, "NORMAL, SHUFFLE (16-token tiles), or a SHUFFLE the block size cannot hold"),
         Dimension("block", IW_BLOCKS, "block-size class: 1, odd, 16 (one SHUFFLE tile), 64 (production)"),
         Dimension("scale", IW_SCALES, "an fp32 scale, or a power-of-two one (UE8M0; MXFP4's per-32 codes)"),
         Dimension("special", IW_SPECIALS, "the first special on a stored token: NaN, +-inf, near FLT_MAX, "
                                           "denormal / all-zero, |max| at the power-of-two scale boundary"),
         Dimension("skip", IW_SKIPS, "the invalid slot on the last token: none, -1, INT32_MIN, INT64_MIN"),
         Dimension("padded", (False, True), "block stride wider than the block's records"),
         Dimension("dtype", ("bfloat16", "float32"), "the direct writer's k dtype"),
         Dimension("inputs", WRITER_LAYOUTS, "inputs packed, the cache a slice of a larger pool, row-major inputs "
                                             "strided, per-token vectors strided (refused or read through)")),
        # where and how a record is placed; which values reach the quantizer and at what scale format; each writer
        # reads its inputs through its own strides, and the cache's block stride meets the view's offset
        (("writer", "layout", "block", "dtype"), ("special", "scale"), ("writer", "inputs"), ("inputs", "padded")),
        classify_indexer_writer, force_indexer_writer, _indexer_writer_allowed, _indexer_writer_examples),
        "indexer-writer-exact")


INDEXER_WRITER_DIMENSIONS = _declare_indexer_writers()
