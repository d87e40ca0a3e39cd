"""Case types and strategies for the DSv4 cache writers (tensors are built from a case's seed by ``build_*``).

What they reach: NaN, +-inf, huge (fp32-overflowing) and denormal values in state rows, k rows and norm weights;
all-zero NoPE groups (the 1e-4 amax floor); odd block sizes; padded and dense block strides; views that start
inside a shared pool (pool bytes on both sides); inputs in strided memory (:data:`INPUT_LAYOUTS`: row-major inputs
as views of wider, offset buffers, per-token vectors as stride-2 views); slot mappings with -1; windows that start before position 0; two requests with permuted
state block tables; ratio 4 (overlapping windows) and 128 (single pass and two-stage with every split count).
``rope_overflow_cases`` is a branch of its own for RoPE lanes that overflow to +-inf (not NaN) after the rotation
and bf16 rounding: every token writes, the norm stays finite, the RoPE norm weights are huge.
Duplicate slots are not generated: the writers reject them (tests/test_writers.py checks that).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
from hypothesis import strategies as st

from fuzz import capabilities
from fuzz.cases import Case
from impl.formats import allocate_fp8_ds_mla_pool
from oracles.trust_gate import CACHE_DTYPES

SPECIAL_VALUES = {
    "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
    "huge": 1e30,          # pooled c^2 overflows fp32: the norm's mean is inf
    "huger": 3e38,         # near FLT_MAX: sums overflow (nan-free-cache only)
    "denormal": 1e-40,
}
#: special kinds the writer-oracle comparison uses (outcomes do not depend on summation order)
ORACLE_KINDS = ("nan", "inf", "-inf", "huge", "denormal", "zero-group")
#: special kinds for nan-free-cache (anything goes)
ANY_KINDS = ORACLE_KINDS + ("huger",)
WEIGHT_KINDS = ("normal", "huge", "huge-rope", "denormal", "zero-group", "nan", "inf")
#: nan-free-cache leans on the weights that overflow the norm's output (NoPE groups and RoPE lanes)
NAN_FREE_WEIGHT_KINDS = ("normal", "huge", "huge-rope", "rope-near-max", "denormal", "zero-group", "nan", "inf")
#: RoPE-overflow branch: weights that take normed or rotated RoPE lanes past the bf16 maximum
ROPE_OVERFLOW_WEIGHT_KINDS = ("huge-rope", "rope-near-max")
#: specials that keep the norm's mean finite and non-zero (a NaN, inf or huge value there would turn every lane NaN
#: or 0 and hide the +-inf lanes this branch is for)
NORM_SAFE_KINDS = ("denormal", "zero-group")

#: The writers take ``block_size`` under ``do_not_specialize`` (it only splits a slot into block and position), so
#: these sizes cost no extra binaries natively; what the compiler sees is the block stride's alignment (bs * 584
#: bytes: even sizes aligned, odd not). They are kept for the slot arithmetic they exercise (a block of one, blocks
#: of 2..7 with partial last blocks, 16) (benchmarks/GPU_THROUGHPUT.md).
BLOCK_SIZES = (1, 2, 3, 5, 7, 16)


#: how the writer's inputs sit in memory (the values are the same in each; only their layout changes):
#: ``contiguous``; ``strided``: every row-major input a view of a wider, offset buffer (k rows, state rows and blocks,
#: block-table rows, cos/sin rows: a row stride larger than the packed width, poisoned extra columns); ``strided-index``:
#: the per-token vectors (slot mapping, positions, token-to-request) and the norm weight as stride-2 views, the
#: skipped elements holding other valid-looking values. An entry point may refuse ``strided-index`` (the kernels read
#: those vectors packed) with a ValueError/TypeError naming the argument, every buffer unchanged.
INPUT_LAYOUTS = ("contiguous", "strided", "strided-index")
InputLayout = Literal["contiguous", "strided", "strided-index"]
#: extra columns and leading offset (elements) of the wider buffers the ``strided`` layout views
STRIDED_PAD = 24
STRIDED_OFFSET = 8


def widen_rows(x: torch.Tensor, fill: float) -> torch.Tensor:
    """``x`` (rows along the last dimension) copied into a buffer ``STRIDED_PAD`` elements wider per row (one extra
    outer block), ``fill`` everywhere else: the same values, row stride and base offset no longer packed."""
    shape = list(x.shape)
    lead = [shape[0] + 1] + shape[1:-1]
    buf = torch.full(lead + [shape[-1] + STRIDED_PAD], fill, dtype=x.dtype, device=x.device)
    view = buf[1:, ..., STRIDED_OFFSET:STRIDED_OFFSET + shape[-1]]
    view.copy_(x)
    return view


def interleave(x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """A stride-2 view of ``x``'s values whose skipped elements hold ``other`` (same length)."""
    buf = torch.stack([x, other], dim=1).reshape(-1)
    return buf[::2]


SpecialKind = Literal["nan", "inf", "-inf", "huge", "huger", "denormal", "zero-group"]
WeightKind = Literal["normal", "huge", "huge-rope", "rope-near-max", "denormal", "zero-group", "nan", "inf"]


def _check_geometry(case) -> None:
    if case.input_layout not in INPUT_LAYOUTS:
        raise ValueError(f"input_layout: expected one of {INPUT_LAYOUTS}, got {case.input_layout!r}")
    if case.block_size < 1 or case.num_blocks < 1 or case.extra_blocks_before < 0 or case.spare_blocks < 0:
        raise ValueError("block_size and num_blocks must be >= 1, extra_blocks_before and spare_blocks >= 0")
    cap = case.num_blocks * case.block_size
    bad = [s for s in case.slots if not -1 <= s < cap]
    if bad:
        raise ValueError(f"slots: {bad} outside -1..{cap - 1} (num_blocks * block_size)")


@dataclass(frozen=True)
class SwaCase(Case):
    """An SWA-insert case: ``T`` bf16 k rows (seeded, per-row scale 10^(log_scale/3), specials planted at
    (token, dim, kind)) written through ``slots`` into a pool of the given geometry."""

    KIND: ClassVar[str] = "swa-writer"
    ADDED_FIELDS = ('input_layout',)

    seed: int
    T: int
    slots: tuple[int, ...]
    log_scale: tuple[int, ...]
    specials: tuple[tuple[int, int, SpecialKind], ...] = ()
    block_size: int = 1
    padded: bool = False
    extra_blocks_before: int = 0
    spare_blocks: int = 0
    num_blocks: int = 1
    input_layout: InputLayout = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.T < 1 or len(self.slots) != self.T or len(self.log_scale) != self.T:
            raise ValueError(f"T={self.T}: slots and log_scale need one entry per token")
        _check_geometry(self)
        bad = [sp for sp in self.specials if not (0 <= sp[0] < self.T and 0 <= sp[1] < 512)]
        if bad:
            raise ValueError(f"specials: {bad} outside token 0..{self.T - 1}, dim 0..511")


@dataclass(frozen=True)
class CompressorCase(Case):
    """A compressor case (``compress_norm_rope_store``): tokens at ``positions`` of requests ``reqs`` over seeded state
    rows (scores times ``score_scale``, specials planted at (index, "kv" | "score", dim, kind)), norm weights of kind
    ``weight``, written through ``slots`` into a pool of the given geometry; ``two_stage`` with ``splits`` (None:
    the kernel's own count) for ratio 128."""

    KIND: ClassVar[str] = "compressor-writer"
    ADDED_FIELDS = ('input_layout',)

    seed: int
    ratio: Literal[4, 128]
    state_block_size: int
    positions: tuple[int, ...]
    reqs: tuple[int, ...]
    slots: tuple[int, ...]
    num_reqs: int = 1
    score_scale: float = 1.0
    weight: WeightKind = "normal"
    eps: float = 1e-6
    two_stage: bool = False
    splits: int | None = None
    specials: tuple[tuple[int, Literal["kv", "score"], int, SpecialKind], ...] = ()
    block_size: int = 1
    padded: bool = False
    extra_blocks_before: int = 0
    spare_blocks: int = 0
    num_blocks: int = 1
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
        if (self.two_stage and self.ratio != 128) or (self.splits is not None and not self.two_stage):
            raise ValueError("two_stage is for ratio 128, and splits only for two_stage")
        _check_geometry(self)
        bad = [sp for sp in self.specials if not (sp[0] >= 0 and 0 <= sp[2] < 512)]
        if bad:
            raise ValueError(f"specials: {bad} need index >= 0 and dim 0..511")


@dataclass(frozen=True)
class WriterCase(Case):
    """A writer-oracle-exact case: exactly one of an SWA-insert and a compressor case."""

    KIND: ClassVar[str] = "writer"

    swa: SwaCase | None = None
    compressor: CompressorCase | None = None

    def __post_init__(self):
        super().__post_init__()
        if (self.swa is None) == (self.compressor is None):
            raise ValueError("a writer case holds exactly one of swa and compressor")


@dataclass(frozen=True)
class TrustGateCase(Case):
    """One row of the trust gate's inputs, checked beside the target's whole truth table."""

    KIND: ClassVar[str] = "trust-gate"

    cache_dtype: str
    has_kv_transfer: bool
    has_extra_cache: bool


def _geometry():
    return st.fixed_dictionaries({
        "block_size": st.sampled_from(BLOCK_SIZES),
        "padded": st.booleans(),
        "extra_blocks_before": st.integers(0, 2),
        "spare_blocks": st.integers(0, 2),
    })


def _slots(n_tokens: int, n_slots: int, draw, allow_skip: bool = True):
    perm = draw(st.permutations(range(n_slots)))
    if not allow_skip:
        return tuple(perm[:n_tokens])
    skip = draw(st.lists(st.sampled_from((False, False, False, True)), min_size=n_tokens, max_size=n_tokens))
    return tuple(-1 if s else perm[i] for i, s in enumerate(skip))


@st.composite
def swa_cases(draw, kinds=ORACLE_KINDS) -> SwaCase:
    T = draw(st.integers(1, 5))
    geo = draw(_geometry())
    n_slots = geo["block_size"] * (-(-T // geo["block_size"]) + geo["spare_blocks"])
    return SwaCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)), T=T, **geo,
        num_blocks=n_slots // geo["block_size"], slots=_slots(T, n_slots, draw),
        log_scale=tuple(draw(st.lists(st.integers(-30, 30), min_size=T, max_size=T))),
        specials=tuple(draw(st.lists(st.tuples(st.integers(0, T - 1), st.integers(0, 511), st.sampled_from(kinds)),
                                     max_size=4))),
    )


@st.composite
def compressor_cases(draw, kinds=ORACLE_KINDS, weight_kinds=WEIGHT_KINDS, min_specials=0,
                     all_write=False) -> CompressorCase:
    """``all_write``: every token sits at a window end and has a slot, so every token writes."""
    ratio = draw(st.sampled_from((4, 128)))
    sbs = draw(st.sampled_from((4, 3) if ratio == 4 else (8, 16)))
    n_req = draw(st.integers(1, 2))
    # positions: mostly window ends ((pos + 1) % ratio == 0), some not, windows starting before 0 included
    max_windows = 5 if ratio == 4 else 3
    T = draw(st.integers(1, 4 if ratio == 4 else 3))
    positions, reqs = [], []
    for _ in range(T):
        k = draw(st.integers(1, max_windows))
        off = 0 if all_write else draw(st.sampled_from((0, 0, 0, 1)))
        positions.append(k * ratio - 1 - off)
        reqs.append(draw(st.integers(0, n_req - 1)))
    geo = draw(_geometry())
    n_slots = geo["block_size"] * (-(-T // geo["block_size"]) + geo["spare_blocks"])
    two_stage = ratio == 128 and draw(st.booleans())
    return CompressorCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)), ratio=ratio, state_block_size=sbs, num_reqs=n_req,
        positions=tuple(positions), reqs=tuple(reqs), **geo,
        num_blocks=n_slots // geo["block_size"], slots=_slots(T, n_slots, draw, allow_skip=not all_write),
        score_scale=draw(st.sampled_from((0.0, 1.0, 4.0, 30.0))),
        weight=draw(st.sampled_from(weight_kinds)),
        eps=draw(st.sampled_from((1e-6, 1e-20, 0.0))),
        two_stage=two_stage,
        splits=draw(st.sampled_from((None, 1, 2, 4, 8, 16))) if two_stage else None,
        specials=tuple(draw(st.lists(
            st.tuples(st.integers(0, 10 ** 6), st.sampled_from(("kv", "score")), st.integers(0, 511),
                      st.sampled_from(kinds)), min_size=min_specials, max_size=4))),
    )


def writer_cases():
    return st.one_of(swa_cases().map(lambda c: WriterCase(swa=c)),
                     compressor_cases().map(lambda c: WriterCase(compressor=c)))


def rope_overflow_cases():
    """Compressor cases whose RoPE lanes overflow: every token writes, specials keep the norm finite, and the RoPE
    norm weights push normed or rotated lanes past the bf16 maximum (+-inf after rounding, NaN where inf - inf)."""
    return compressor_cases(kinds=NORM_SAFE_KINDS, weight_kinds=ROPE_OVERFLOW_WEIGHT_KINDS, all_write=True)


def nan_free_cases():
    """Anything goes (every special, every weight kind), plus the RoPE-overflow branch with equal weight: alone, the
    general generator reaches a +-inf RoPE lane in few of its cases (most are NaN, or write nothing)."""
    return st.one_of(compressor_cases(kinds=ANY_KINDS, weight_kinds=NAN_FREE_WEIGHT_KINDS), rope_overflow_cases())


def trust_gate_cases():
    return st.builds(TrustGateCase, cache_dtype=st.sampled_from(CACHE_DTYPES), has_kv_transfer=st.booleans(),
                     has_extra_cache=st.booleans())


# --- building tensors from a case ---------------------------------------------------------------------------------

def build_cache(case: "SwaCase | CompressorCase", device, fill: int = 0xFF):
    """(pool, view) for a case's geometry, every byte set to ``fill`` (0xFF: NaN fp8 byte and NaN scale code); a view
    that starts inside the pool (a slice) also has a pool block after it, so a write past either end shows."""
    return allocate_fp8_ds_mla_pool(case.num_blocks, case.block_size, padded=case.padded, device=device, fill=fill,
                                    extra_blocks_before=case.extra_blocks_before,
                                    extra_blocks_after=1 if case.extra_blocks_before else 0)


def build_swa_inputs(case: SwaCase, device):
    g = torch.Generator().manual_seed(case.seed)
    T = case.T
    k = torch.randn(T, 512, generator=g, dtype=torch.float64)
    k *= torch.tensor([10.0 ** (s / 3) for s in case.log_scale], dtype=torch.float64)[:, None]
    for t, d, kind in case.specials:
        if kind == "zero-group":
            lo = (d // 64) * 64
            k[t, lo:lo + 64] = 0.0
        else:
            k[t, d] = SPECIAL_VALUES[kind] * (1 if d % 2 else -1) if kind in ("huge", "huger", "denormal") \
                else SPECIAL_VALUES[kind]
    k = k.to(torch.float32).to(torch.bfloat16).to(device)
    slots = torch.tensor(case.slots, dtype=torch.int64, device=device)
    return lay_out_k_and_slots(k, slots, case.input_layout)


def build_compressor_inputs(case: CompressorCase, device) -> dict:
    """Tensors for ``compress_norm_rope_store`` from a compressor case."""
    g = torch.Generator().manual_seed(case.seed)
    ratio, sbs = case.ratio, case.state_block_size
    coff = 2 if ratio == 4 else 1
    R = coff * ratio
    max_pos = max(case.positions)
    cols = max_pos // sbs + 1
    n_req = case.num_reqs
    n_state_blocks = cols * n_req + 1
    state = torch.randn(n_state_blocks, sbs, 2 * coff * 512, generator=g)
    state[:, :, coff * 512:] *= case.score_scale
    table = torch.stack([torch.randperm(n_state_blocks, generator=g)[:cols] for _ in range(n_req)]).to(torch.int32)
    positions = case.positions
    reqs = case.reqs
    for idx, part, d, kind in case.specials:
        t = idx % len(positions)
        p = positions[t] - (idx // len(positions)) % R
        if p < 0:
            p = positions[t]
        i = p - (positions[t] - R + 1)
        half = 512 if (ratio == 4 and i >= ratio) else 0
        blk = int(table[reqs[t], p // sbs])
        col0 = (coff * 512 if part == "score" else 0) + half
        if kind == "zero-group":
            # every row of the window: this 64-dim group pools to exactly 0
            lo = (d // 64) * 64
            for q in range(max(positions[t] - R + 1, 0), positions[t] + 1):
                qi = q - (positions[t] - R + 1)
                h = 512 if (ratio == 4 and qi >= ratio) else 0
                state[int(table[reqs[t], q // sbs]), q % sbs, h + lo:h + lo + 64] = 0.0
        else:
            v = SPECIAL_VALUES[kind]
            if kind in ("huge", "huger", "denormal") and d % 2 == 0:
                v = -v
            state[blk, p % sbs, col0 + d] = v
    w = 1.0 + 0.25 * torch.randn(512, generator=g)
    kind = case.weight
    if kind == "huge":
        w[::3] = 1e38
    elif kind == "huge-rope":
        # RoPE lanes overflow to +-inf (or inf - inf = NaN after the rotation); NoPE stays finite
        w[448:] = 3e38
        w[449::4] = -3e38
    elif kind == "rope-near-max":
        # normed RoPE lanes (about N(0, 1) times the weight) mostly finite, near the bf16 maximum 3.39e38; the
        # rotation takes some past it (+-inf in fp32, or after bf16 rounding), rarely to inf - inf = NaN
        w[448:] = 2e38
        w[450::4] = -2e38
    elif kind == "denormal":
        w[1::4] = 1e-40
    elif kind == "zero-group":
        w[64:128] = 0.0
    elif kind == "nan":
        w[7] = float("nan")
    elif kind == "inf":
        w[300] = float("inf")
    # rows up to max_pos exist, so a writer that rotates at pos instead of (pos // ratio) * ratio reads wrong rows
    cs_rows = max_pos + 1
    ang = torch.rand(cs_rows, 32, generator=g, dtype=torch.float64) * 6.283185307179586
    cos_sin = torch.cat([ang.cos(), ang.sin()], dim=1).to(torch.float32)
    inp = {
        "state": state.to(device), "state_block_table": table.to(device),
        "token_to_req": torch.tensor(reqs, dtype=torch.int32, device=device),
        "positions": torch.tensor(positions, dtype=torch.int64, device=device),
        "slot_mapping": torch.tensor(case.slots, dtype=torch.int64, device=device),
        "norm_weight": w.to(device), "cos_sin_cache": cos_sin.to(device),
    }
    return lay_out_compressor_inputs(inp, case.input_layout, n_req)


def lay_out_compressor_inputs(inp: dict, layout: str, num_reqs: int) -> dict:
    """The same values in the memory of ``layout`` (see :data:`INPUT_LAYOUTS`): ``strided`` widens the state (block
    and row stride), the block table and the cos/sin rows, the extra state lanes NaN and the extra table entries a
    valid but wrong block id; ``strided-index`` interleaves the per-token vectors and the norm weight with wrong but
    valid-looking values (slot -1, the positions reversed, the next request, the weight negated)."""
    out = dict(inp)
    if layout == "strided":
        out["state"] = widen_rows(inp["state"], float("nan"))
        out["state_block_table"] = widen_rows(inp["state_block_table"], inp["state"].shape[0] - 1)
        out["cos_sin_cache"] = widen_rows(inp["cos_sin_cache"], float("nan"))
    elif layout == "strided-index":
        out["slot_mapping"] = interleave(inp["slot_mapping"], torch.full_like(inp["slot_mapping"], -1))
        out["positions"] = interleave(inp["positions"], inp["positions"].flip(0))
        out["token_to_req"] = interleave(inp["token_to_req"], (inp["token_to_req"] + 1) % num_reqs)
        out["norm_weight"] = interleave(inp["norm_weight"], -inp["norm_weight"])
    return out


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

WRITERS = ("swa", "c4", "c128", "c128-two-stage")
SPECIAL_CLASSES = ("none", "nan", "inf", "huge", "tiny")
_SPECIAL_CLASS = {"nan": "nan", "inf": "inf", "-inf": "inf", "huge": "huge", "huger": "huge", "denormal": "tiny",
                  "zero-group": "tiny"}


def _writer_of(case: WriterCase) -> str:
    if case.swa is not None:
        return "swa"
    c = case.compressor
    return "c4" if c.ratio == 4 else ("c128-two-stage" if c.two_stage else "c128")


def _bs_class(bs: int) -> str:
    return "1" if bs == 1 else ("odd" if bs % 2 else "even")


#: the writers' memory-layout classes: every input packed; the cache a slice of a larger pool (offset base, pool bytes
#: on both sides); the row-major inputs strided; the per-token vectors strided (see :data:`INPUT_LAYOUTS`). A block
#: stride wider than the block's bytes is the ``padded`` dimension, which pairs with this one.
WRITER_LAYOUTS = ("contiguous", "pool-slice", "strided", "strided-index")


def writer_layout(inner: "SwaCase | CompressorCase") -> str:
    if inner.input_layout != "contiguous":
        return inner.input_layout
    return "pool-slice" if inner.extra_blocks_before else "contiguous"


def padded_reached(inner: "SwaCase | CompressorCase") -> bool:
    """A padded pool whose block stride the writer must use: some token writes past block 0 (a case writing only
    block 0 computes the same with the dense stride, so it counts as unpadded)."""
    return inner.padded and any(s >= inner.block_size for s in inner.slots)


def classify_writer(case: WriterCase, target) -> dict:
    """The dimension values a writer case hits (the special class is its first planted special's)."""
    inner = case.swa if case.swa is not None else case.compressor
    specials = inner.specials
    kind = specials[0][-1] if specials else None
    return {"writer": _writer_of(case), "special": "none" if kind is None else _SPECIAL_CLASS[kind],
            "block": _bs_class(inner.block_size), "padded": padded_reached(inner), "layout": writer_layout(inner),
            "weight": "normal" if case.swa is not None else case.compressor.weight,
            "skip": any(s == -1 for s in inner.slots)}


def _special_kind(cls: str, seed: int) -> str:
    return {"nan": ("nan",), "inf": ("inf", "-inf"), "huge": ("huge",), "tiny": ("denormal", "zero-group")}[cls][
        seed % (2 if cls in ("inf", "tiny") else 1)]


def force_writer(case: WriterCase, combo: dict, target) -> WriterCase:
    """``case`` rewritten to hit ``combo``: a case of another writer is made afresh from the drawn one's seed (two
    tokens, window ends for the compressor); geometry, slots, the special and the weight are then set."""
    import dataclasses

    inner = case.swa if case.swa is not None else case.compressor
    seed = inner.seed
    writer = combo.get("writer", _writer_of(case))
    # a stride-2 vector or a strided row read as packed differs from the true one from the second token on, and
    # the last token may be skipped: three tokens
    strided = combo.get("layout") in ("strided", "strided-index")
    n = 3 if strided else 2
    if writer != _writer_of(case) or (strided and len(inner.slots) < 3):
        if writer == "swa":
            inner = SwaCase(seed=seed, T=n, slots=tuple(range(n)), log_scale=(seed % 7 - 3,) + (0,) * (n - 1),
                            block_size=1, num_blocks=n)
        else:
            ratio = 4 if writer == "c4" else 128
            inner = CompressorCase(seed=seed, ratio=ratio, state_block_size=4 if ratio == 4 else 8,
                                   positions=tuple((i + 1) * ratio - 1 for i in range(n)), reqs=(0,) * n,
                                   slots=tuple(range(n)), block_size=1, num_blocks=n,
                                   two_stage=writer == "c128-two-stage")
    f = {k.name: getattr(inner, k.name) for k in dataclasses.fields(inner)}
    T = len(f["slots"])
    bs = {"1": 1, "odd": 3, "even": 2}.get(combo.get("block"), f["block_size"])
    skip = combo.get("skip", any(s == -1 for s in f["slots"]))
    if "padded" in combo:
        f["padded"] = combo["padded"]
    # a padded block stride is only read past block 0: a padded case writes its last slots, in a second block at least
    spare = max(f["spare_blocks"], 1) if f["padded"] else f["spare_blocks"]
    n_slots = bs * (-(-T // bs) + spare)
    f.update(block_size=bs, num_blocks=n_slots // bs, spare_blocks=spare,
             slots=tuple(-1 if (skip and i == T - 1) else n_slots - 1 - i for i in range(T)))
    if "layout" in combo:
        force_input_layout(f, combo["layout"])
    if "special" in combo:
        cls = combo["special"]
        if cls == "none":
            f["specials"] = ()
        else:
            kind = _special_kind(cls, seed)
            f["specials"] = ((0, seed % 512, kind),) if writer == "swa" else ((0, "kv", seed % 512, kind),)
    if writer != "swa" and "weight" in combo:
        f["weight"] = combo["weight"]
    inner = type(inner)(**f)
    return WriterCase(swa=inner) if writer == "swa" else WriterCase(compressor=inner)


def _writer_allowed(c: dict, target) -> bool:
    if c.get("writer") == "swa":
        if c.get("weight", "normal") != "normal":
            return False
        # the subject under audit may lack the SWA insert (the contract side answers; ours has it)
        if not capabilities.ask(capabilities.SWA_INSERT, target, True):
            return False
    return True


def writer_family_examples(target) -> list[WriterCase]:
    """Plain writer cases (packed, two tokens, no special) the tests force every covering row onto."""
    return [WriterCase(swa=SwaCase(seed=5, T=2, slots=(0, 1), log_scale=(0, 1), num_blocks=2)),
            WriterCase(compressor=CompressorCase(seed=6, ratio=4, state_block_size=4, positions=(3, 7), reqs=(0, 0),
                                                 slots=(1, 0), num_blocks=2))]


def _declare_writers():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "cache-writers",
        (Dimension("writer", WRITERS, "SWA insert, compressor ratio 4, ratio 128 single-pass and two-stage"),
         Dimension("special", SPECIAL_CLASSES, "the first planted special: NaN, +-inf, fp32 overflow, denormal/zero"),
         Dimension("block", ("1", "odd", "even"), "pool block-size class"),
         Dimension("padded", (False, True), "block stride wider than a block"),
         Dimension("weight", WEIGHT_KINDS, "the compressor's norm-weight kind"),
         Dimension("skip", (False, True), "a token with slot -1"),
         Dimension("layout", WRITER_LAYOUTS, "inputs packed, the cache a slice of a larger pool, row-major inputs "
                                             "strided, per-token vectors strided (refused or read through)")),
        # each writer reads its own inputs through its own strides (the layout); the cache's block stride and
        # offset meet the block size in the slot arithmetic
        # each writer addresses blocks through the block stride (upstream's single-pass compressor is one kernel,
        # its two-stage another): the padded stride pairs with every writer
        (("writer", "special"), ("block", "padded"), ("writer", "layout"), ("layout", "padded"), ("writer", "padded")),
        classify_writer, force_writer, _writer_allowed, writer_family_examples), "writer-oracle-exact")


WRITER_DIMENSIONS = _declare_writers()


# --- nan-free-cache's declared dimensions ---------------------------------------------------------------------------

NAN_FREE_WRITERS = ("c4", "c128", "c128-two-stage")
#: the class of the first special that sits on a stored token: "huge" (1e30) overflows c^2 in the norm's mean,
#: "huger" (3e38) overflows the pooled sums themselves, "tiny" is a denormal or an all-zero group
NAN_FREE_SPECIALS = ("none", "nan", "inf", "huge", "huger", "tiny")
_NAN_FREE_CLASS = {"nan": "nan", "inf": "inf", "-inf": "inf", "huge": "huge", "huger": "huger", "denormal": "tiny",
                   "zero-group": "tiny"}
#: on a non-sanitizing target the contract checks only tokens whose inputs are finite and cannot overflow: only these
#: specials and weights leave such a token to check
_CHECKED_UNSANITIZED_SPECIALS = ("none", "tiny")
_CHECKED_UNSANITIZED_WEIGHTS = ("normal", "denormal", "zero-group")


def _compressor_writer(c: CompressorCase) -> str:
    return "c4" if c.ratio == 4 else ("c128-two-stage" if c.two_stage else "c128")


def _writes(c: CompressorCase, t: int) -> bool:
    return c.slots[t] >= 0 and (c.positions[t] + 1) % c.ratio == 0


def _stored_special(c: CompressorCase):
    """The first planted special whose token writes (``build_compressor_inputs`` puts special ``idx`` on token
    ``idx % T``), or None."""
    return next((sp for sp in c.specials if _writes(c, sp[0] % len(c.positions))), None)


def classify_nan_free(case: CompressorCase, target) -> dict:
    """The dimension values a nan-free-cache case hits: its variant, the class and part (kv or score; kv when there is
    none) of the first special on a stored token, the norm-weight kind."""
    sp = _stored_special(case)
    return {"writer": _compressor_writer(case), "special": "none" if sp is None else _NAN_FREE_CLASS[sp[3]],
            "part": "kv" if sp is None else sp[1], "weight": case.weight,
            "scores": "flat" if case.score_scale == 0 else "spread"}


def force_nan_free(case: CompressorCase, combo: dict, target) -> CompressorCase:
    """``case`` rewritten to hit ``combo``: another variant is made afresh from the drawn seed (tokens at window
    ends: two for ratio 4, one for 128); token 0 is then made to write (window end, a free slot), and the special is planted on it (the
    drawn specials dropped)."""
    import dataclasses

    f = {k.name: getattr(case, k.name) for k in dataclasses.fields(case)}
    writer = combo.get("writer", _compressor_writer(case))
    if writer != _compressor_writer(case):
        ratio = 4 if writer == "c4" else 128
        # ratio 4: two tokens (the first window starts before position 0); ratio 128: one (a 128-row window costs)
        n = 2 if ratio == 4 else 1
        f.update(ratio=ratio, state_block_size=4 if ratio == 4 else 8, positions=(3, 7)[:n] if ratio == 4 else (127,),
                 reqs=(0,) * n, num_reqs=1, slots=(0, 1)[:n], block_size=1, num_blocks=n, padded=False,
                 extra_blocks_before=0,
                 spare_blocks=0, two_stage=writer == "c128-two-stage",
                 splits=4 if writer == "c128-two-stage" else None, specials=())  # 4 splits: a merge, and cheap
    ratio = f["ratio"]
    pos = list(f["positions"])
    if (pos[0] + 1) % ratio:
        pos[0] = (pos[0] // ratio + 1) * ratio - 1
    slots = list(f["slots"])
    if slots[0] < 0:
        used = set(slots)
        slots[0] = next(s for s in range(f["num_blocks"] * f["block_size"]) if s not in used)
    f.update(positions=tuple(pos), slots=tuple(slots))
    if "special" in combo or "part" in combo:
        sp = _stored_special(case) if writer == _compressor_writer(case) else None
        cls = combo.get("special", "none" if sp is None else _NAN_FREE_CLASS[sp[3]])
        part = combo.get("part", "kv" if sp is None else sp[1])
        seed = f["seed"]
        if cls == "none":
            f["specials"] = ()
        else:
            kind = {"nan": "nan", "inf": ("inf", "-inf")[seed % 2], "huge": "huge", "huger": "huger",
                    "tiny": ("denormal", "zero-group")[seed % 2]}[cls]
            f["specials"] = ((0, part, seed % 512, kind),)
    if "weight" in combo:
        f["weight"] = combo["weight"]
    if "scores" in combo:
        f["score_scale"] = 0.0 if combo["scores"] == "flat" else (f["score_scale"] or 4.0)
    return CompressorCase(**f)


def _nan_free_allowed(c: dict, target) -> bool:
    if c.get("special") == "none" and c.get("part", "kv") != "kv":
        return False
    if c.get("weight") in ROPE_OVERFLOW_WEIGHT_KINDS and c.get("special", "none") not in ("none", "tiny"):
        return False  # a NaN, inf or overflow there turns every lane NaN or 0 and hides the +-inf RoPE lanes
    if not target.sanitizes_writer:
        if c.get("special", "none") not in _CHECKED_UNSANITIZED_SPECIALS:
            return False
        if c.get("weight", "normal") not in _CHECKED_UNSANITIZED_WEIGHTS:
            return False
    return True


def _nan_free_family_examples(target) -> list[CompressorCase]:
    return [CompressorCase(seed=s, ratio=r, state_block_size=4 if r == 4 else 8, positions=(r - 1,), reqs=(0,),
                           slots=(0,), two_stage=ts) for s, r, ts in ((0, 4, False), (1, 128, True))]


def _declare_nan_free():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "nan-free-cache",
        (Dimension("writer", NAN_FREE_WRITERS, "compressor ratio 4, ratio 128 single-pass and two-stage: the pooling "
                                               "and the merge of partials differ, sanitizing is shared"),
         Dimension("special", NAN_FREE_SPECIALS, "the first special on a stored token: NaN, +-inf, c^2 overflow, sum "
                                                 "overflow, denormal / all-zero group"),
         Dimension("part", ("kv", "score"), "where that special sits: a kv lane or a score (the softmax's max and "
                                            "weights)"),
         Dimension("weight", NAN_FREE_WEIGHT_KINDS, "the norm-weight kind: NoPE or RoPE overflow after the norm, NaN, "
                                                    "inf, denormal, zero"),
         Dimension("scores", ("flat", "spread"), "all scores equal (every weight 1: a uniform denominator the norm "
                                                 "cancels) or spread per dimension")),
        # the variants differ in pooling and merging (the specials); the weight acts after pooling, in the code they
        # share, on pooled rows whose scale the scores set
        (("writer", "special"), ("special", "part"), ("weight", "scores")),
        classify_nan_free, force_nan_free, _nan_free_allowed, _nan_free_family_examples), "nan-free-cache")


NAN_FREE_DIMENSIONS = _declare_nan_free()


def force_input_layout(f: dict, lay: str) -> None:
    """A forced case's fields (``f``) laid out as ``lay`` of the layout dimension (the writers' and the indexer
    writers'): an input layout, or the pool's (a slice of a larger pool, or packed)."""
    f["input_layout"] = lay if lay in INPUT_LAYOUTS else "contiguous"
    if lay == "strided" and "reqs" in f and f["num_reqs"] == 1:
        # a second request (token 0's), so the block table's row stride is used
        f.update(num_reqs=2, reqs=(1,) + tuple(f["reqs"][1:]))
    if lay in ("contiguous", "pool-slice"):
        f["extra_blocks_before"] = 1 if lay == "pool-slice" else 0


def lay_out_k_and_slots(k: torch.Tensor, slots: torch.Tensor, layout: str):
    """A direct writer's rows and slot ids laid out as ``layout`` (INPUT_LAYOUTS), the values the same: rows in a
    wider NaN-padded buffer ("strided"), or the slot ids every other entry of a -1-filled one ("strided-index")."""
    if layout == "strided":
        k = widen_rows(k, float("nan"))
    elif layout == "strided-index":
        slots = interleave(slots, torch.full_like(slots, -1))
    return k, slots
