"""Strategies and case builders for the sparse decode: ragged rows with empty rows, invalid indices (-1,
INT32_MIN/MAX, slots at and past the end of the cache), entries outside indptr, NaN/inf-poisoned referenced rows,
every unreferenced slot poisoned, odd block sizes, padded block strides inside a shared pool, non-contiguous q,
sinks of -inf / ordinary / large values, non-default softmax scales.

A case is a :class:`DecodeCase` (``to_json`` / ``from_json``); ``build_decode_inputs`` makes every tensor from the
case's seed, so a saved case replays exactly. Shapes stay tiny: the kernels run under the Triton interpreter here.
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target

INT32_MIN = -(2 ** 31)
INT32_MAX = 2 ** 31 - 1
#: Block sizes and head counts are drawn from a few classes, and that also bounds what a native run compiles
#: (benchmarks/GPU_THROUGHPUT.md). The kernels take ``num_heads`` and the block sizes under ``do_not_specialize``,
#: so the compiler tells them apart only through what they make: a block's stride (bs * 584 bytes dense, 16-byte
#: aligned for an even bs; the padded stride always aligned), whether a view one block into its pool is aligned,
#: and the split-K workspace strides (H, S * H: 1, a multiple of 16 or neither). 1 (a block of one token: block =
#: slot), 2 (even: aligned rows), 5 and 61 (odd, 61 prime: unaligned rows; partial last blocks) reach every class
#: and every masking path; heads 1, 3 (a partial head block) and 16 (a full one, aligned strides) likewise. More
#: values would add no code path and no binary, only slower shrinking.
BLOCK_SIZES = (1, 2, 5, 61)
HEADS = (1, 3, 16)
#: 512^-0.5 (head_dim 512: production's scale) among non-default ones, so a hard-coded scale is caught either way
SCALES = (0.03125, 512 ** -0.5, 0.0625, 0.11, 0.3)
#: the SWA cache's production block size (DeepseekV4SWACache), drawn for the main cache beside the classes above
SWA_BLOCK = 64
SinkKind = Literal["none", "-inf", "ordinary", "large", "mixed"]
PoisonKind = Literal["none", "nan", "inf"]
SINK_KINDS: tuple[str, ...] = typing.get_args(SinkKind)
POISON_KINDS: tuple[str, ...] = typing.get_args(PoisonKind)
#: memory layouts per tensor input (the values are the same in every layout; only where they sit changes; every
#: byte no view reaches is poisoned, NaN or a poisoned slot):
#: q: packed; heads-major (transposed); rows padded to 576 lanes; lanes at stride 2
Q_LAYOUTS = ("contiguous", "transposed", "padded", "lane-strided")
#: caches: block stride = the block's bytes; padded to a multiple of 576 B (production); a padded view one block
#: into a larger pool (offset base, poisoned blocks before it)
CACHE_LAYOUTS = ("packed", "padded", "pool-slice")
#: ragged indices and indptr: packed; a slice of a larger poisoned buffer (offset base); every other element
INDEX_LAYOUTS = ("contiguous", "slice", "strided")
#: the sink: packed; a slice of a larger NaN buffer; every other element
SINK_LAYOUTS = ("contiguous", "slice", "strided")
#: out: packed; rows padded to 576 lanes; heads-major
OUT_LAYOUTS = ("contiguous", "padded", "heads-major")
#: layouts an entry point may refuse because it requires contiguity there: a refusal is a ValueError/TypeError
#: naming the argument before any launch; accepting one means computing what the contiguous copy gives
MAY_REFUSE = {"index_layout": ("strided",), "sink_layout": ("strided",)}
#: absolute logit regimes: as drawn; every live logit near -110 (below fp32 exp's underflow at about -103.97,
#: a few tenths of a nat apart); every referenced row of a cache one row (exact ties everywhere, at every split
#: boundary); q all signed zeros (every logit exactly +0.0 or -0.0)
LOGIT_REGIMES = ("ordinary", "underflow", "tied", "signed-zero")
UNDERFLOW_LOGIT = -110.0
#: the RoPE lane-0 value every referenced row holds in the underflow regime (q's lane 0 carries the offset)
UNDERFLOW_K = 8.0

#: extra blocks past each cache view, poisoned: an unmasked out-of-range slot reads NaN/inf instead of a crash
TAIL_BLOCKS = 2

#: poison for every slot no valid index reaches: finite fp8 codes under scale code 255 (+inf in the readers) give
#: +-inf lanes that no scrub removes, and RoPE NaN; any read of such a slot shows up in the output.
POISON_NOPE = 0x7E
POISON_SCALE = 255
POISON_ROPE_BITS = 0x7FC0


@dataclass(frozen=True)
class AdaptiveSplits(Case):
    """gfx950's adaptive-splits plan for a decode case: ONE_WAVE, in [1, num_splits]."""

    KIND = "decode-adaptive-splits"
    one_wave: int


@dataclass(frozen=True)
class DecodeCase(Case):
    """One sparse decode: ``batch`` rows of ``heads`` heads; per row ``main_lens`` SWA entries and ``extra_lens``
    compressed entries (None: an SWA-only layer), each entry invalid with probability ``invalid_rate``; caches of
    ``main_bs`` / ``extra_bs`` tokens per block (``padded``: block strides wider than a block), ``indptr_offset``
    junk entries before the first row and ``tail_junk`` after the last; ``poison`` marks some referenced rows
    NaN or inf; a sink of kind ``sink``; q heads-major in memory when ``q_transposed``. The plan: ``num_splits``
    pinned (None: the target's selector with ``cu_count`` CUs), ``adaptive`` (gfx950, needs ``num_splits``),
    ``trust`` opens the trust gate; ``int32_extremes`` adds INT32_MIN/MAX to the invalid entries. Memory layouts
    (see :data:`Q_LAYOUTS` and the others): ``q_layout`` (None: ``q_transposed`` says), ``cache_layout`` (None:
    ``padded`` says, the view at a random block offset), ``index_layout`` (both caches' indices and indptr),
    ``sink_layout``, ``out_layout``; ``logits`` is the absolute regime (:data:`LOGIT_REGIMES`)."""

    KIND = "decode"
    ADDED_FIELDS = ('q_layout', 'cache_layout', 'index_layout', 'sink_layout', 'out_layout', 'logits')
    seed: int
    batch: int
    heads: int
    main_bs: int
    extra_bs: int
    main_lens: tuple[int, ...]
    extra_lens: tuple[int, ...] | None
    invalid_rate: float
    indptr_offset: int
    tail_junk: int
    scale: float
    sink: SinkKind
    poison: PoisonKind
    padded: bool
    q_transposed: bool
    cu_count: int
    num_splits: int | None = None
    adaptive: AdaptiveSplits | None = None
    trust: bool = False
    int32_extremes: bool = True
    q_layout: str | None = None
    cache_layout: str | None = None
    index_layout: str = "contiguous"
    sink_layout: str = "contiguous"
    out_layout: str = "contiguous"
    logits: str = "ordinary"

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in (("q_layout", Q_LAYOUTS + (None,)), ("cache_layout", CACHE_LAYOUTS + (None,)),
                              ("index_layout", INDEX_LAYOUTS), ("sink_layout", SINK_LAYOUTS),
                              ("out_layout", OUT_LAYOUTS), ("logits", LOGIT_REGIMES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        if self.q_layout is None and self.logits in ("underflow", "signed-zero"):
            raise ValueError(f"logits: the {self.logits!r} regime is drawn into q; it needs a q_layout")
        for name in ("batch", "heads", "main_bs", "extra_bs", "cu_count"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {getattr(self, name)!r}")
        for name in ("seed", "indptr_offset", "tail_junk"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected an int >= 0, got {getattr(self, name)!r}")
        for name in ("main_lens", "extra_lens"):
            lens = getattr(self, name)
            if lens is not None and (len(lens) != self.batch or any(n < 0 for n in lens)):
                raise ValueError(f"{name}: expected {self.batch} lengths >= 0, got {list(lens)}")
        if not 0.0 <= self.invalid_rate < 1.0:
            raise ValueError(f"invalid_rate: expected a probability in [0, 1), got {self.invalid_rate!r}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale: expected a finite scale > 0, got {self.scale!r}")
        if self.num_splits is not None and self.num_splits < 1:
            raise ValueError(f"num_splits: expected None or an int >= 1, got {self.num_splits!r}")
        if self.adaptive is not None:
            if self.num_splits is None:
                raise ValueError("adaptive: an adaptive plan needs num_splits")
            if not 1 <= self.adaptive.one_wave <= self.num_splits:
                raise ValueError(f"adaptive.one_wave: expected 1..{self.num_splits}, got {self.adaptive.one_wave}")
        if self.trust and self.extra_lens is None:
            raise ValueError("trust: the trust gate is about the extra cache; an SWA-only case has none")


def decode_cases(target: Target, *, max_batch: int = 3, max_main: int = 40, max_extra: int = 100):
    """A Hypothesis strategy of :class:`DecodeCase` for ``target``."""
    is_950 = target.decode_family == "gfx950"
    split_k = target.split_selector is not None

    @st.composite
    def build(draw):
        b = draw(st.integers(1, max_batch))
        swa_only = draw(st.booleans().map(lambda x: x and draw(st.integers(0, 3)) == 0))
        lens = st.one_of(st.just(0), st.integers(1, max_main))
        fields = dict(
            seed=draw(st.integers(0, 2 ** 31 - 1)),
            batch=b,
            heads=draw(st.sampled_from(HEADS)),
            main_bs=draw(st.sampled_from(BLOCK_SIZES + (SWA_BLOCK,))),
            extra_bs=draw(st.sampled_from(BLOCK_SIZES)),
            main_lens=draw(st.lists(lens, min_size=b, max_size=b)),
            extra_lens=None if swa_only else draw(st.lists(
                st.one_of(st.just(0), st.sampled_from([1, 31, 32, 33, 63, 64, 65]),
                          st.integers(1, max_extra)), min_size=b, max_size=b)),
            invalid_rate=draw(st.sampled_from([0.0, 0.15, 0.4])),
            # without the INT32 extremes every invalid entry lands in the pool's poisoned tail: an unmasked read
            # then shows as NaN in the output instead of a crash, so the comparison itself catches it
            int32_extremes=draw(st.integers(0, 3)) == 3,  # shrinks towards False
            indptr_offset=draw(st.sampled_from([0, 0, 3])),
            tail_junk=draw(st.integers(0, 4)),
            scale=draw(st.sampled_from(SCALES)),
            sink=draw(st.sampled_from(SINK_KINDS)),
            poison=draw(st.sampled_from(POISON_KINDS)),
            # tiny counts: a real part's (fuzz.splits.PRODUCTION_CU_COUNTS, drawn by split-bounds and by
            # subject-agreement's split cases) makes the selector plan its cap of splits for these tiny batches, and
            # under the interpreter every split is a program run in turn (10 s a case); the split plans those
            # counts give are pinned here through num_splits
            cu_count=draw(st.integers(1, 8)),
            q_layout=draw(st.sampled_from(Q_LAYOUTS)),
            cache_layout=draw(st.sampled_from(CACHE_LAYOUTS)),
            index_layout=draw(st.sampled_from(INDEX_LAYOUTS)),
            sink_layout=draw(st.sampled_from(SINK_LAYOUTS)),
            out_layout=draw(st.sampled_from(OUT_LAYOUTS)),
            logits=draw(st.sampled_from(LOGIT_REGIMES)),
        )
        fields["padded"] = fields["cache_layout"] != "packed"
        fields["q_transposed"] = fields["q_layout"] == "transposed"
        if split_k and draw(st.booleans()):
            fields["num_splits"] = draw(st.integers(1, min(target.split_cap or 1, 6)))
        if is_950 and draw(st.integers(0, 2)) == 0:
            s = draw(st.integers(5, 7))
            fields["num_splits"] = s
            fields["adaptive"] = AdaptiveSplits(one_wave=draw(st.integers(1, s)))
        if target.may_trust_extra_nan_free and fields["extra_lens"] is not None:
            fields["trust"] = draw(st.integers(0, 3)) == 0
        return DecodeCase(**fields)

    return build()


@dataclass
class DecodeInputs:
    q: torch.Tensor
    main_cache: torch.Tensor
    main_indices: torch.Tensor
    main_indptr: torch.Tensor
    extra_cache: torch.Tensor | None
    extra_indices: torch.Tensor | None
    extra_indptr: torch.Tensor | None
    attn_sink: torch.Tensor | None
    softmax_scale: float
    pools: tuple  # keep the pools alive


def _fp8_nan_code(flavour: str, gen: torch.Generator) -> int:
    if flavour == "fnuz":
        return 0x80
    return 0x7F if torch.randint(0, 2, (1,), generator=gen).item() else 0xFF


def _make_cache(gen, flavour: str, block_size: int, lens: list[int], invalid_rate: float, indptr_offset: int,
                tail_junk: int, padded: bool, poison: str, device, neg_inf_logits: bool = True,
                int32_extremes: bool = True, cache_layout: str | None = None, index_layout: str = "contiguous",
                logits: str = "ordinary"):
    """One cache segment: a poisoned pool, a view of ``nb`` blocks, referenced rows with data, ragged indices.
    ``cache_layout`` (None: ``padded`` and a random block offset), ``index_layout`` and the ``logits`` regime as
    :class:`DecodeCase` says."""
    total_valid = sum(lens)
    nslots_needed = max(4, int(total_valid * 0.8) + 4)
    nb = -(-nslots_needed // block_size)
    nslots = nb * block_size
    before = int(torch.randint(0, 2, (1,), generator=gen).item())
    if cache_layout is not None:
        padded, before = cache_layout != "packed", int(cache_layout == "pool-slice")
    pool, big = formats.allocate_fp8_ds_mla_pool(nb + TAIL_BLOCKS, block_size, padded=padded,
                                                 extra_blocks_before=before, fill=0xFF)
    all_slots = list(range((nb + TAIL_BLOCKS) * block_size))
    n_all = len(all_slots)
    formats.pack_fp8_ds_mla(big, all_slots, torch.full((n_all, formats.DSV4_NOPE_DIM), POISON_NOPE, dtype=torch.uint8),
                            torch.full((n_all, formats.DSV4_NUM_GROUPS), POISON_SCALE, dtype=torch.uint8),
                            torch.full((n_all, formats.DSV4_ROPE_DIM), POISON_ROPE_BITS,
                                       dtype=torch.int16).view(torch.bfloat16), pad=0xFF)
    view = big[:nb]
    # ragged entries: valid slots drawn from a subset so that some slots stay unreferenced
    usable = max(1, nslots - 2)
    entries, referenced = [], set()
    invalid_values = [-1, nslots, nslots + 1, nslots + block_size, -2]
    if int32_extremes:
        invalid_values += [INT32_MIN, INT32_MAX]
    for n in lens:
        row = []
        for _ in range(n):
            if invalid_rate and torch.rand(1, generator=gen).item() < invalid_rate:
                row.append(invalid_values[int(torch.randint(0, len(invalid_values), (1,), generator=gen))])
            else:
                s = int(torch.randint(0, usable, (1,), generator=gen))
                row.append(s)
                referenced.add(s)
        entries.append(row)
    unreferenced = [s for s in range(nslots) if s not in referenced] or [nslots - 1]
    junk = lambda k: [unreferenced[int(torch.randint(0, len(unreferenced), (1,), generator=gen))] for _ in range(k)]
    flat = junk(indptr_offset)
    indptr = [indptr_offset]
    for row in entries:
        flat += row
        indptr.append(indptr[-1] + len(row))
    flat += junk(tail_junk)
    # data for referenced slots: values ~ N(0, 1) * 2^(code - 127) spread over a few binades
    ref_slots = sorted(referenced)
    T = len(ref_slots)
    if T:
        x = torch.randn(T, formats.DSV4_NOPE_DIM, generator=gen) * 4.0
        nope = formats.fp8_encode(x, flavour)
        scale = torch.randint(123, 128, (T, formats.DSV4_NUM_GROUPS), generator=gen).to(torch.uint8)
        rope = torch.randn(T, formats.DSV4_ROPE_DIM, generator=gen).to(torch.bfloat16)
        if logits == "tied":  # one row everywhere: every live logit of the segment bit-identical
            nope, scale, rope = (t[:1].expand_as(t).clone() for t in (nope, scale, rope))
        elif logits == "underflow":  # q's RoPE lane 0 carries the -110 offset through this lane
            rope[:, 0] = UNDERFLOW_K
        if poison != "none":
            for i in range(T):
                if torch.rand(1, generator=gen).item() >= 0.35:
                    continue
                kind = int(torch.randint(0, 3, (1,), generator=gen))
                if poison == "nan":
                    if kind == 0:  # fp8 NaN bytes
                        lanes = torch.randint(0, formats.DSV4_NOPE_DIM, (3,), generator=gen)
                        nope[i, lanes] = _fp8_nan_code(flavour, gen)
                    elif kind == 1:  # scale code 255 over a zero group: 0 * inf = NaN
                        g = int(torch.randint(0, formats.DSV4_NUM_GROUPS, (1,), generator=gen))
                        nope[i, g * formats.DSV4_GROUP:(g + 1) * formats.DSV4_GROUP] = 0
                        scale[i, g] = 255
                    else:  # NaN RoPE lanes
                        lanes = torch.randint(0, formats.DSV4_ROPE_DIM, (2,), generator=gen)
                        rope.view(torch.int16)[i, lanes] = POISON_ROPE_BITS
                else:
                    if kind < 2 or not neg_inf_logits:  # scale code 255 over finite non-zero codes: +-inf lanes, never scrubbed
                        g = int(torch.randint(0, formats.DSV4_NUM_GROUPS, (1,), generator=gen))
                        scale[i, g] = 255
                        seg = nope[i, g * formats.DSV4_GROUP:(g + 1) * formats.DSV4_GROUP]
                        nope[i, g * formats.DSV4_GROUP:(g + 1) * formats.DSV4_GROUP] = torch.where(
                            (seg & 0x7F) == 0, torch.full_like(seg, 0x38), seg)
                    else:  # an inf RoPE lane: its logit may be -inf, giving 0 * inf = NaN in that lane only
                        lane = int(torch.randint(0, formats.DSV4_ROPE_DIM, (1,), generator=gen))
                        rope[i, lane] = math.inf
        formats.pack_fp8_ds_mla(view, ref_slots, nope, scale, rope)
    indices = laid_out_1d(torch.tensor(flat, dtype=torch.int32), index_layout, unreferenced[0], device)
    indptr_t = laid_out_1d(torch.tensor(indptr, dtype=torch.int32), index_layout, 0, device)
    if device != "cpu":
        pool = pool.to(device)
        big_d = pool.as_strided(big.shape, big.stride(), big.storage_offset())
        view = big_d[:nb]
    return pool, view, indices, indptr_t


def laid_out_1d(t: torch.Tensor, layout: str, fill, device) -> torch.Tensor:
    """``t`` (1-D, CPU) on ``device`` as ``layout`` says: "contiguous"; "slice" (3 elements into a buffer of
    ``fill`` with 2 more after); "strided" (every other element of a buffer of ``fill``). Same values in each."""
    n = t.numel()
    if layout == "contiguous":
        return t.to(device)
    if layout == "slice":
        buf = torch.full((n + 5,), fill, dtype=t.dtype)
        buf[3:3 + n] = t
        return buf.to(device)[3:3 + n]
    if layout == "strided":
        buf = torch.full((2 * n,), fill, dtype=t.dtype)
        buf[::2] = t
        return buf.to(device)[::2]
    raise ValueError(f"layout: expected one of {INDEX_LAYOUTS}, got {layout!r}")


def make_q(case: "DecodeCase", gen: torch.Generator, device) -> torch.Tensor:
    """q [b, h, 512] bf16 of ``case``: its values (and regime) from ``gen``, laid out as ``case.q_layout``; lanes
    no view reaches are NaN."""
    b, h, d = case.batch, case.heads, formats.DSV4_HEAD_DIM
    if case.q_layout is None:  # cases saved before q_layout: q_transposed says, values drawn in that order
        if case.q_transposed:
            return torch.randn(h, b, d, generator=gen).to(torch.bfloat16).to(device).transpose(0, 1)
        return torch.randn(b, h, d, generator=gen).to(torch.bfloat16).to(device)
    v = torch.randn(b, h, d, generator=gen)
    if case.logits == "underflow":
        v = v / 64
        v[..., formats.DSV4_NOPE_DIM] = UNDERFLOW_LOGIT / (case.scale * UNDERFLOW_K)
    elif case.logits == "signed-zero":
        v = torch.where(v < 0, torch.tensor(-0.0), torch.tensor(0.0))
    v = v.to(torch.bfloat16)
    if case.q_layout == "contiguous":
        return v.to(device)
    if case.q_layout == "transposed":
        return v.transpose(0, 1).contiguous().to(device).transpose(0, 1)
    wide = 576 if case.q_layout == "padded" else 2 * d
    buf = torch.full((b, h, wide), math.nan, dtype=torch.bfloat16)
    lanes = slice(0, d) if case.q_layout == "padded" else slice(0, 2 * d, 2)
    buf[..., lanes] = v
    return buf.to(device)[..., lanes]


def make_out(case: "DecodeCase", device) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, base): a NaN-poisoned bf16 out [b, h, 512] laid out as ``case.out_layout`` and the buffer under it
    (compared whole to show a refusal wrote nothing)."""
    b, h, d = case.batch, case.heads, formats.DSV4_HEAD_DIM
    if case.out_layout == "padded":
        base = torch.full((b, h, 576), math.nan, dtype=torch.bfloat16, device=device)
        return base[..., :d], base
    if case.out_layout == "heads-major":
        base = torch.full((h, b, d), math.nan, dtype=torch.bfloat16, device=device)
        return base.transpose(0, 1), base
    base = torch.full((b, h, d), math.nan, dtype=torch.bfloat16, device=device)
    return base, base


def make_sink(kind: str, n: int, gen: torch.Generator) -> "torch.Tensor | None":
    """An fp32 attention sink of ``n`` entries (padded past the head count, as production pads it): "none" (no
    sink), "-inf" (a sink that means none), "ordinary" (~N(0, 2)), "large" (30..40: dominates the softmax) or
    "mixed" (each entry one of the three)."""
    if kind == "none":
        return None
    ordinary = torch.randn(n, generator=gen) * 2.0
    large = 30.0 + torch.rand(n, generator=gen) * 10.0
    ninf = torch.full((n,), -math.inf)
    if kind == "-inf":
        sink = ninf
    elif kind == "ordinary":
        sink = ordinary
    elif kind == "large":
        sink = large
    else:
        pick = torch.randint(0, 3, (n,), generator=gen)
        sink = torch.where(pick == 0, ninf, torch.where(pick == 1, ordinary, large))
    return sink.to(torch.float32)


def build_decode_inputs(case: DecodeCase, target: Target, device: str | None = None) -> DecodeInputs:
    """Every tensor of a decode case, made from ``case.seed`` on the kernel device."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    h = case.heads
    q = make_q(case, gen, device)
    # an adaptive plan's reduce skips splits by their m; inf RoPE lanes (whose logit may be -inf) stay out of it
    neg_inf_logits = case.adaptive is None
    lay = dict(cache_layout=case.cache_layout, index_layout=case.index_layout, logits=case.logits)
    mpool, mview, midx, mptr = _make_cache(gen, target.main_cache_fp8, case.main_bs, list(case.main_lens),
                                           case.invalid_rate, case.indptr_offset, case.tail_junk, case.padded,
                                           case.poison, device, neg_inf_logits, case.int32_extremes, **lay)
    epool = eview = eidx = eptr = None
    if case.extra_lens is not None:
        epool, eview, eidx, eptr = _make_cache(gen, target.extra_cache_fp8, case.extra_bs, list(case.extra_lens),
                                               case.invalid_rate, case.indptr_offset, case.tail_junk, case.padded,
                                               case.poison, device, neg_inf_logits, case.int32_extremes, **lay)
    pad_heads = h + int(torch.randint(0, 3, (1,), generator=gen))
    sink = make_sink(case.sink, pad_heads, gen)
    sink = laid_out_1d(sink, case.sink_layout, math.nan, device) if sink is not None else None
    return DecodeInputs(q, mview, midx, mptr, eview, eidx, eptr, sink, case.scale, (mpool, epool))


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

#: the extra segment's tile per decode family (impl/decode.py: gfx942 BLOCK_K 32, generic 16; gfx950 64, the tokens
#: upstream loads per step of its extra loop, whose two 32-token softmax steps our default takes too, so lengths 63, 64
#: and 65 cross both the 64-token load boundary and the 32-token step boundaries)
EXTRA_TILE = {"gfx950": 64, "gfx942": 32, "generic": 16}
EXTRA_LEN_CLASSES = ("swa-only", "0", "1", "t-1", "t", "t+1")
INVALID_CLASSES = ("none", "in-pool", "int32")
PLANS = ("selector", "pinned", "adaptive")
#: which build impl.decode's size rule launches for a case (its CU count, batch, split count and heads): upstream's
#: 16-head blocks ("narrow") or the single-read build ("wide"); a family without a rule always runs "narrow"
BUILDS = ("narrow", "wide")


def _case_numels(case: "DecodeCase") -> tuple[int, int]:
    """The index lists' sizes build_decode_inputs makes (junk before the first row and after the last included)."""
    junk = case.indptr_offset + case.tail_junk
    return junk + sum(case.main_lens), (0 if case.extra_lens is None else junk + sum(case.extra_lens))


def _build_class(case: "DecodeCase", target: Target) -> str:
    """The build the family's current default launches for ``case`` (impl.decode's ``SizeRule``; a family whose
    variant is fixed runs that one)."""
    from impl import decode as dec

    rule = dec.current_variant(target.decode_family)
    if not isinstance(rule, dec.SizeRule):
        return "wide" if (rule.block_h or dec.BLOCK_H) > dec.BLOCK_H else "narrow"
    s = case.num_splits
    if s is None:
        s = dec.plan_decode(target, case.batch, case.heads, *_case_numels(case), cu_count=case.cu_count).num_splits
    return "wide" if rule.pick(case.batch, s, case.heads, case.cu_count) == rule.wide else "narrow"


def _extra_len(cls: str, tile: int) -> int:
    return {"0": 0, "1": 1, "t-1": tile - 1, "t": tile, "t+1": tile + 1}[cls]


def _len_class(n: int, tile: int) -> str:
    for cls in EXTRA_LEN_CLASSES[1:]:
        if n == _extra_len(cls, tile):
            return cls
    return "other"


def _bs_class(bs: int) -> str:
    return "1" if bs == 1 else ("odd" if bs % 2 else "even")


def effective_q_layout(case: DecodeCase) -> str:
    return case.q_layout or ("transposed" if case.q_transposed else "contiguous")


def refusable(case: DecodeCase) -> dict:
    """``{dimension: argument names}`` of the case's layouts an entry point may refuse (:data:`MAY_REFUSE`)."""
    args = {"index_layout": "main_indices/main_indptr" + ("" if case.extra_lens is None else
                                                            "/extra_indices/extra_indptr"),
            "sink_layout": "attn_sink"}
    out = {}
    for dim, values in MAY_REFUSE.items():
        if getattr(case, dim) in values and (dim != "sink_layout" or case.sink != "none"):
            out[dim] = args[dim]
    return out


#: each layout dimension's packed value (its first)
PACKED = {"q_layout": Q_LAYOUTS[0], "cache_layout": CACHE_LAYOUTS[0], "index_layout": INDEX_LAYOUTS[0],
          "sink_layout": SINK_LAYOUTS[0], "out_layout": OUT_LAYOUTS[0]}


def non_packed(case: DecodeCase) -> dict:
    """``{dimension: value}`` of the case's layouts that are not packed (legacy fields read as their layout)."""
    got = {"q_layout": effective_q_layout(case),
           "cache_layout": case.cache_layout or ("padded" if case.padded else "packed"),
           "index_layout": case.index_layout, "sink_layout": case.sink_layout if case.sink != "none" else "contiguous",
           "out_layout": case.out_layout}
    return {k: v for k, v in got.items() if v != PACKED[k]}


def packed_except(case: DecodeCase, keep: dict) -> DecodeCase:
    """``case`` with every layout packed but those in ``keep``; the same values (q drawn the explicit way)."""
    f = {**PACKED, **keep}
    return case.replace(**f, q_transposed=f["q_layout"] == "transposed", padded=f["cache_layout"] != "packed")


def _layouts(case: DecodeCase) -> dict:
    out = {"q_layout": effective_q_layout(case), "index_layout": case.index_layout,
           "out_layout": case.out_layout, "logits": case.logits}
    if case.cache_layout is not None:
        out["cache_layout"] = case.cache_layout
    out["sink_layout"] = case.sink_layout  # "contiguous" for a case with no sink (allowed says so)
    return out


def classify_decode(case: DecodeCase, target: Target) -> dict:
    """The dimension values a decode case hits (the extra length class is its first row's)."""
    tile = EXTRA_TILE[target.decode_family]
    return {
        **_layouts(case),
        "extra_len": "swa-only" if case.extra_lens is None else _len_class(case.extra_lens[0], tile),
        "plan": "adaptive" if case.adaptive is not None else ("pinned" if case.num_splits is not None
                                                              else "selector"),
        "invalid": "none" if case.invalid_rate == 0 else ("int32" if case.int32_extremes else "in-pool"),
        "trust": case.trust,
        "poison": case.poison,
        "sink": case.sink,
        "main_bs": "swa-64" if case.main_bs == SWA_BLOCK else _bs_class(case.main_bs),
        "build": _build_class(case, target),
    }


def force_decode(case: DecodeCase, combo: dict, target: Target) -> DecodeCase:
    """``case`` rewritten to hit ``combo`` (lengths, plan, invalid entries, trust, poison, sink, block size)."""
    import dataclasses

    tile = EXTRA_TILE[target.decode_family]
    f = dataclasses.asdict(case)
    f["adaptive"] = case.adaptive
    if "extra_len" in combo:
        if combo["extra_len"] == "swa-only":
            f["extra_lens"] = None
        else:
            rest = list(case.extra_lens or [0] * case.batch)[1:]
            f["extra_lens"] = tuple([_extra_len(combo["extra_len"], tile)] + rest)
    if "plan" in combo:
        plan = combo["plan"]
        f["adaptive"] = None
        if plan == "selector":
            f["num_splits"] = None
        elif plan == "pinned":
            f["num_splits"] = 1 + case.seed % min(target.split_cap or 1, 6)
        else:
            s = 5 + case.seed % 3
            f["num_splits"], f["adaptive"] = s, AdaptiveSplits(one_wave=1 + case.seed % s)
    if "invalid" in combo:
        inv = combo["invalid"]
        f["invalid_rate"] = 0.0 if inv == "none" else (case.invalid_rate or 0.4)
        f["int32_extremes"] = inv == "int32"
    for k in ("trust", "poison", "sink"):
        if k in combo:
            f[k] = combo[k]
    if "main_bs" in combo:
        f["main_bs"] = {"1": 1, "odd": 5, "even": 2, "swa-64": SWA_BLOCK}[combo["main_bs"]]
    for k in ("q_layout", "cache_layout", "index_layout", "sink_layout", "out_layout", "logits"):
        if k in combo:
            f[k] = combo[k]
    if f["sink_layout"] != "contiguous" and f["heads"] < 2:
        f["heads"] = 3  # head 0 reads the same element whatever the layout: another head reads across it
    if f["q_layout"] is None and f["logits"] != "ordinary":  # a regime needs q drawn the new way
        f["q_layout"] = effective_q_layout(case)
    if f["q_layout"] is not None:
        f["q_transposed"] = f["q_layout"] == "transposed"
    if f["cache_layout"] is not None:
        f["padded"] = f["cache_layout"] != "packed"
    if f["extra_lens"] is None:
        f["trust"] = False
    for k in ("main_lens", "extra_lens"):
        if f[k] is not None:
            f[k] = tuple(f[k])
    if "build" in combo:  # the CU count moves the case to either side of the size rule (impl.decode.SizeRule)
        if combo["build"] == "wide":
            f["cu_count"] = 1  # any launch fills half of one CU
        elif target.split_selector is not None:
            if f["num_splits"] is None:  # a selector's S grows with the CU count: the narrow side pins S
                f["num_splits"] = 1
            f["cu_count"] = max(f["cu_count"], 2 * f["batch"] * f["num_splits"] * -(-f["heads"] // 64) + 1)
    return DecodeCase(**f)


def _decode_allowed(c: dict, target: Target) -> bool:
    if c.get("plan") == "pinned" and target.split_selector is None:
        return False
    if c.get("plan") == "adaptive" and target.decode_family != "gfx950":
        return False
    if c.get("trust") is True and (not target.may_trust_extra_nan_free or c.get("extra_len") == "swa-only"):
        return False
    if c.get("sink") == "none" and c.get("sink_layout", "contiguous") != "contiguous":
        return False  # no sink, no sink layout
    if c.get("plan") == "adaptive" and "strided" in (c.get("index_layout"), c.get("sink_layout")):
        return False  # a refusable layout would refuse the row before the adaptive kernels it is there to run
    if c.get("build") == "wide" and target.split_selector is None:
        return False  # the generic kernel has no size rule
    if c.get("build") == "narrow" and c.get("plan") == "selector" and target.split_selector is not None:
        return False  # a selector fills the device at any CU count (the narrow side pins S)
    return True


def decode_family_examples(target: Target) -> list[DecodeCase]:
    """Plain cases the forced rows are checked on: one saved before the layout fields (q_layout and cache_layout
    None: q_transposed and padded say), one with every layout field set."""
    legacy = DecodeCase(seed=3, batch=2, heads=3, main_bs=2, extra_bs=1, main_lens=(4, 0), extra_lens=(2, 5),
                        invalid_rate=0.0, indptr_offset=0, tail_junk=0, scale=0.11, sink="none", poison="none",
                        padded=True, q_transposed=True, cu_count=2)
    return [legacy, legacy.replace(seed=4, q_layout="contiguous", cache_layout="padded", q_transposed=False)]


def _declare_decode():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "decode",
        (Dimension("extra_len", EXTRA_LEN_CLASSES, "first row's extra-segment length around the family's tile"),
         Dimension("plan", PLANS, "the split plan: the target's selector, pinned splits, gfx950's adaptive"),
         Dimension("invalid", INVALID_CLASSES, "invalid entries: none, -1 / past the pool, plus INT32 extremes"),
         Dimension("trust", (False, True), "the trust gate (gfx950, with an extra cache)"),
         Dimension("poison", POISON_KINDS, "NaN / inf in referenced rows"),
         Dimension("sink", SINK_KINDS),
         Dimension("main_bs", ("1", "odd", "even", "swa-64"), "main cache block-size class, and production's 64"),
         Dimension("q_layout", Q_LAYOUTS, "q packed, heads-major, rows padded to 576 lanes, lanes at stride 2"),
         Dimension("cache_layout", CACHE_LAYOUTS, "both caches' block stride packed or padded, or a padded view "
                                                  "one block into a poisoned pool"),
         Dimension("index_layout", INDEX_LAYOUTS, "indices/indptr packed, a slice of a larger buffer, or strided "
                                                  "(an entry point needing contiguity refuses it)"),
         Dimension("sink_layout", SINK_LAYOUTS, "the sink packed, a slice of a NaN buffer, or strided (refusable)"),
         Dimension("out_layout", OUT_LAYOUTS, "out packed, rows padded to 576 lanes, or heads-major"),
         Dimension("logits", LOGIT_REGIMES, "absolute regime: as drawn, every live logit near -110 (below fp32 "
                                            "exp underflow), exact ties everywhere, q all signed zeros"),
         Dimension("build", BUILDS, "the build impl.decode's size rule launches: 16-head blocks or single-read")),
        (("extra_len", "plan"), ("extra_len", "invalid"), ("trust", "poison"), ("trust", "extra_len"),
         # layouts against what picks the code that reads them: the kernel family and split plan reads q and
         # writes out (directly or through the reduce); the block-size class and block stride pick the aligned
         # or byte-wise cache loads; invalid entries are what the index reads mask; the regimes meet the sink
         # (dominating or vanishing against them; a tied regime ties every split boundary whatever the plan)
         ("plan", "q_layout"), ("plan", "out_layout"), ("invalid", "index_layout"),
         ("main_bs", "cache_layout"), ("sink", "sink_layout"), ("sink", "logits"),
         # both builds under every plan the rule allows (the wide one holds more heads than a case has)
         ("build", "plan")),
        classify_decode, force_decode, _decode_allowed, decode_family_examples), "decode-oracle-agreement")


DECODE_DIMENSIONS = _declare_decode()
