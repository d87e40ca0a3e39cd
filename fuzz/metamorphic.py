"""Cases for the metamorphic decode contract (contracts.metamorphic): one decode input run through several paths that
must agree (1 split vs S splits, adaptive vs fixed splits on gfx950, a split-K family vs the generic single kernel
under the same fp8 flavours).

The inputs are chosen where the paths differ most. Row lengths give every tail a split of S can have (``k * S + r``
for every remainder r, lengths below S that leave splits empty) and every tail of the kernels' tiles around their
sizes (t - 1, t, t + 1, 2t + 1). ``spikes``: a few referenced tokens per row get UE8M0 scale codes 4 or 5 above the
rest, one or two per split region, with different codes, so that each split's local maximum differs from the
others' by far more than fp32's exp range (a combine that takes the wrong maximum overflows or flushes to 0).
Row 0 keeps its data: its SWA length always leaves a remainder, and every one of its entries counts.

The tensors come from ``fuzz.decode.build_decode_inputs`` (the decode contract's builder), spikes applied after.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from fuzz import decode as fz
from fuzz.cases import Case
from impl import formats
from impl.targets import Target

#: the kernels' token tiles (impl/decode.py): generic BLOCK_K 16, gfx942 BLOCK_K 32, gfx950 extra tiles 64
TILES = (16, 32)
MAX_SPLITS = 5
VIEW_LAYOUTS = ("packed", "views")


@dataclass(frozen=True)
class MetamorphicCase(Case):
    """A decode input (``decode``: its plan fields are those of the adaptive path on gfx950, else None) and the
    split count S of the multi-split paths; ``spikes``: per-split distinct maxima (see the module docstring)."""

    KIND = "metamorphic-decode"
    ADDED_FIELDS = ('view_layout',)
    decode: fz.DecodeCase
    num_splits: int
    one_wave: int = 1
    spikes: bool = True
    #: "views": the S-split path runs on every input re-laid as a view of a larger poisoned buffer (q rows padded
    #: to 576 lanes, both caches' blocks padded one block into a pool, indices, indptr and sink slices), the values
    #: the same: a layout-invariance relation between that path and the packed ones (issue 30)
    view_layout: str = "packed"

    def __post_init__(self):
        super().__post_init__()
        if self.num_splits < 2:
            raise ValueError(f"num_splits: expected >= 2 (the other path has 1), got {self.num_splits}")
        if not 1 <= self.one_wave <= self.num_splits:
            raise ValueError(f"one_wave: expected 1..{self.num_splits}, got {self.one_wave}")
        if self.view_layout not in VIEW_LAYOUTS:
            raise ValueError(f"view_layout: expected one of {VIEW_LAYOUTS}, got {self.view_layout!r}")


def _remainder_length(s: int) -> st.SearchStrategy:
    """k * S + r, r > 0, k >= 4: the last of S splits is shorter, and the last of S - 1 (ceil(n / S) entries each)
    does not reach the end, so slicing by S where the row is active on fewer splits loses entries."""
    return st.tuples(st.integers(4, 6), st.integers(1, s - 1)).map(lambda kr: kr[0] * s + kr[1])


def _tail_lengths(s: int) -> st.SearchStrategy:
    # the first branch is what a derandomized draw starts from: several entries per split and a remainder
    return st.one_of(_remainder_length(s),
                     st.sampled_from(TILES).flatmap(lambda t: st.sampled_from([t + 1, t - 1, t, 2 * t + 1])),
                     st.integers(0, s),  # at most as many entries as splits: some splits are empty
                     st.integers(2, 4).map(lambda k: k * s))


def metamorphic_cases(target: Target) -> st.SearchStrategy:
    """Tiny decode inputs (2 rows, one head: the paths differ along the tokens, not the heads) with tails of every
    length and per-split maxima."""
    is_950 = target.decode_family == "gfx950"

    @st.composite
    def build(draw):
        # gfx950: S = 5, so that a tiny row is active on A = 4 < S adaptive splits (with S <= 4 adaptive is S
        # splits for every row these sizes have: iters(4) <= 3 needs fewer than 385 entries)
        s = MAX_SPLITS if is_950 else draw(st.sampled_from([5, 3, 2, 4]))
        b = 2  # row 0 without spikes (every entry counts), row 1 with them
        lens = _tail_lengths(s)
        one_wave = draw(st.integers(1, s))
        dec = fz.DecodeCase(
            seed=draw(st.integers(0, 2 ** 31 - 1)), batch=b, heads=1,
            main_bs=draw(st.sampled_from([1, 5])), extra_bs=draw(st.sampled_from([2, 61])),
            # row 0's SWA segment always has a remainder: its last split is shorter than the others
            main_lens=(draw(_remainder_length(s)),) + tuple(draw(st.lists(lens, min_size=b - 1, max_size=b - 1))),
            extra_lens=None if draw(st.integers(0, 4)) == 4 else tuple(draw(st.lists(lens, min_size=b, max_size=b))),
            invalid_rate=draw(st.sampled_from([0.0, 0.15])), indptr_offset=draw(st.sampled_from([0, 3])),
            tail_junk=draw(st.integers(0, 2)), scale=draw(st.sampled_from([0.11, 0.3])),
            sink=draw(st.sampled_from(["ordinary", "none", "large", "-inf"])),
            poison=draw(st.sampled_from(["none", "none", "nan", "inf"])), padded=draw(st.booleans()),
            q_transposed=draw(st.booleans()), cu_count=draw(st.integers(1, 8)), int32_extremes=False,
            num_splits=s if is_950 else None, adaptive=fz.AdaptiveSplits(one_wave) if is_950 else None)
        return MetamorphicCase(decode=dec, num_splits=s, one_wave=one_wave, spikes=draw(st.integers(0, 3)) < 3,
                               view_layout=draw(st.sampled_from(VIEW_LAYOUTS)))

    return build()


def _spike_segment(cache, indices, indptr, num_splits: int, gen: torch.Generator) -> None:
    """Raise the scale codes of one or two valid tokens per split region of every row but the first (a spike
    dominates its row's softmax, so a lost entry of that row would not show): each region gets its own
    code (4 or 5 above the data's 123..127), so the regions' maxima differ by orders of magnitude."""
    ptr = indptr.cpu().tolist()
    idx = indices.cpu().tolist()
    num_slots = int(cache.shape[0]) * int(cache.shape[1])
    done: set[int] = set(idx[ptr[0]:ptr[1]])  # row 0's slots stay as they are (rows may share slots)
    for r in range(1, len(ptr) - 1):  # row 0 keeps its data: there a lost entry shows
        lo, hi = ptr[r], ptr[r + 1]
        n = hi - lo
        if n <= 0:
            continue
        chunk = -(-n // num_splits)
        for s in range(num_splits):
            region = [p for p in range(lo + s * chunk, min(lo + (s + 1) * chunk, hi)) if 0 <= idx[p] < num_slots]
            for _ in range(min(len(region), 1 + int(torch.randint(0, 2, (1,), generator=gen)))):
                slot = idx[region[int(torch.randint(0, len(region), (1,), generator=gen))]]
                if slot in done:
                    continue
                done.add(slot)
                tok = formats.unpack_fp8_ds_mla(cache, [slot])
                # split 0's spikes stay below the top code: a later split then holds the row's maximum, which a
                # combine that takes split 0's maximum misses (e^(m_s - m) overflows)
                code = 131 if s == 0 else 131 + int(torch.randint(0, 2, (1,), generator=gen)) + (s % 2)
                scale = torch.where(tok["scale"] >= 255, tok["scale"], torch.full_like(tok["scale"], min(code, 132)))
                formats.pack_fp8_ds_mla(cache, [slot], tok["nope"], scale, tok["rope"], pad=int(tok["pad"][0]))


def build_metamorphic_inputs(case: MetamorphicCase, target: Target) -> fz.DecodeInputs:
    """The decode inputs of ``case.decode`` (fuzz.decode's builder) with the spikes applied."""
    inp = fz.build_decode_inputs(case.decode, target)
    if case.spikes:
        gen = torch.Generator().manual_seed(case.decode.seed ^ 0x5A5A)
        _spike_segment(inp.main_cache, inp.main_indices, inp.main_indptr, case.num_splits, gen)
        if inp.extra_cache is not None:
            _spike_segment(inp.extra_cache, inp.extra_indices, inp.extra_indptr, case.num_splits, gen)
    return inp


def _view_of(t: torch.Tensor | None, fill, lanes_pad: int = 0):
    """(buffer, view): ``t``'s values in a view 3 elements (1-D) or one block (3-D cache) into a buffer of
    ``fill``; a 3-D q's rows padded by ``lanes_pad`` lanes."""
    if t is None:
        return None, None
    if t.dim() == 1:
        buf = torch.full((t.numel() + 5,), fill, dtype=t.dtype, device=t.device)
        buf[3:3 + t.numel()] = t
        return buf, buf[3:3 + t.numel()]
    if lanes_pad:
        buf = torch.full((*t.shape[:-1], t.shape[-1] + lanes_pad), fill, dtype=t.dtype, device=t.device)
        buf[..., :t.shape[-1]] = t
        return buf, buf[..., :t.shape[-1]]
    nb, bs, w = t.shape  # a cache: blocks padded by 64 bytes, one poisoned block before the first
    blk = bs * w + 64
    buf = torch.full(((nb + 1) * blk,), fill, dtype=t.dtype, device=t.device)
    view = buf.as_strided((nb, bs, w), (blk, w, 1), blk)
    view.copy_(t)
    return buf, view


def relaid_inputs(inp: fz.DecodeInputs) -> fz.DecodeInputs:
    """``inp`` with every tensor a view of a larger poisoned buffer (``view_layout`` "views"), the values the
    same: q rows padded to 576 lanes (NaN), caches with padded blocks one 0xFF block into a pool, indices (-1),
    indptr (0) and sink (NaN) slices."""
    import math

    bufs, views = zip(*(_view_of(t, f, pad) for t, f, pad in (
        (inp.q, math.nan, 64), (inp.main_cache, 0xFF, 0), (inp.main_indices, -1, 0), (inp.main_indptr, 0, 0),
        (inp.extra_cache, 0xFF, 0), (inp.extra_indices, -1, 0), (inp.extra_indptr, 0, 0),
        (inp.attn_sink, math.nan, 0))))
    return fz.DecodeInputs(*views, inp.softmax_scale, (inp.pools, bufs))


# --- declared dimensions (fuzz.dimensions): the pairs the ci profile reaches on purpose ---------------------------

#: row 1's SWA length against the split count S: fewer entries than splits (some splits hold nothing: l = 0 and
#: m = -inf next to live ones), k * S + r (the last split shorter: unequal denominators), k * S (equal counts)
TAIL_CLASSES = ("empty-splits", "short-last", "equal-counts")
#: row 0's adaptive active split count on gfx950 (seed 004): 4 (iters(4) <= 3), or S (both segments long enough
#: that iters(4) > 3: 132 + 132 entries, two iterations of 32 in each segment, so that each term of the kernel's
#: iteration count matters); "n/a" on the targets without adaptive splits
ACTIVE_CLASSES = ("4", "S", "n/a")
#: the S-class lengths: ceil(132 / 4) = 33, two iterations of ITER_K = 32 per segment; 132 = 26 * 5 + 2 keeps row 0's
#: remainder
ACTIVE_S_LEN = 132


def _tail_class(n: int, s: int) -> str:
    return "empty-splits" if n < s else ("equal-counts" if n % s == 0 else "short-last")


def _active_class(case: MetamorphicCase, target: Target) -> str:
    if not target.adaptive_splits_in_capture:
        return "n/a"
    from oracles.splits import ref_adaptive_active

    d = case.decode
    a = ref_adaptive_active(d.main_lens[0], d.extra_lens[0] if d.extra_lens is not None else 0, case.num_splits,
                            case.one_wave)
    return "4" if a == 4 else ("S" if a == case.num_splits else "other")


def classify_metamorphic(case: MetamorphicCase, target: Target) -> dict:
    """The dimension values a metamorphic case hits."""
    d = case.decode
    return {"extra": "swa-only" if d.extra_lens is None else "present",
            "tail": _tail_class(d.main_lens[1], case.num_splits), "spikes": case.spikes,
            "active": _active_class(case, target), "poison": d.poison, "view_layout": case.view_layout}


def force_metamorphic(case: MetamorphicCase, combo: dict, target: Target) -> MetamorphicCase:
    """``case`` rewritten to hit ``combo``: row 1's SWA length for the tail class, row 0's lengths for the active
    class (S: 132 SWA and 132 extra entries; 4: as drawn, the long ones cut back to a remainder), the extra segment
    (dropped, or drawn at row 0's SWA lengths), spikes and poison."""
    import dataclasses

    d, s = case.decode, case.num_splits
    main = list(d.main_lens)
    extra = None if d.extra_lens is None else list(d.extra_lens)
    if combo.get("extra") == "swa-only":
        extra = None
    elif combo.get("extra") == "present" and extra is None:
        extra = [n % 40 for n in main]
    tail = combo.get("tail")
    if tail is not None and _tail_class(main[1], s) != tail:
        main[1] = {"empty-splits": d.seed % s, "short-last": 4 * s + 1 + d.seed % (s - 1),
                   "equal-counts": 2 * s}[tail]
    active = combo.get("active")
    if active == "S":
        main[0] = ACTIVE_S_LEN
        extra = extra if extra is not None else [0] * len(main)
        extra[0] = ACTIVE_S_LEN
    elif active == "4" and _active_class(case, target) != "4":
        main[0] = 4 * s + 1
        if extra is not None:
            extra[0] = min(extra[0], 2 * 32 + 1)
    if active == "4" and extra is not None and extra[0] - 4 * -(-extra[0] // s) < s:
        # like its SWA length: 4 slices of ceil(n / S) leave S or more of row 0's extra entries unread (7S - 1: 6
        # of them at S = 5), so an extra segment sliced by S where the row is active on 4 shows
        extra[0] = 7 * s - 1
    dec = dataclasses.replace(d, main_lens=tuple(main), extra_lens=None if extra is None else tuple(extra),
                              poison=combo.get("poison", d.poison))
    return dataclasses.replace(case, decode=dec, spikes=combo.get("spikes", case.spikes),
                               view_layout=combo.get("view_layout", case.view_layout))


def _metamorphic_allowed(c: dict, target: Target) -> bool:
    adaptive = target.adaptive_splits_in_capture
    if c.get("active") is not None and (c["active"] == "n/a") == adaptive:
        return False
    if c.get("active") == "S" and c.get("extra") == "swa-only":
        return False
    if adaptive and c.get("extra") == "present" and c.get("poison") == "inf":
        # inf poison hits about a third of row 0's entries, so row 0 is NaN on every path and hides the active
        # split count that its lengths are there for (a slice by S instead of A, an iteration count that is off):
        # on an adaptive target the inf rows are SWA-only ones
        return False
    return True


def metamorphic_examples(target: Target) -> list[MetamorphicCase]:
    """A plain case: two rows, no invalid entries, S splits of the target."""
    is_950 = target.decode_family == "gfx950"
    s = MAX_SPLITS if is_950 else 3
    dec = fz.DecodeCase(seed=5, batch=2, heads=1, main_bs=1, extra_bs=2, main_lens=(4 * s + 1, 2), extra_lens=(3, 1),
                        invalid_rate=0.0, indptr_offset=0, tail_junk=0, scale=0.11, sink="none", poison="none",
                        padded=False, q_transposed=False, cu_count=1, int32_extremes=False,
                        num_splits=s if is_950 else None, adaptive=fz.AdaptiveSplits(2) if is_950 else None)
    return [MetamorphicCase(decode=dec, num_splits=s, one_wave=2, spikes=False)]


def _declare_metamorphic():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "metamorphic-decode",
        (Dimension("extra", ("swa-only", "present"), "an extra (compressed) segment or an SWA-only layer"),
         Dimension("tail", TAIL_CLASSES, "row 1's SWA length against S: empty splits, a shorter last, equal counts"),
         Dimension("spikes", (False, True), "per-split maxima orders of magnitude apart"),
         Dimension("active", ACTIVE_CLASSES, "row 0's adaptive active split count (gfx950)"),
         Dimension("poison", ("none", "nan", "inf"), "NaN / inf in referenced rows"),
         Dimension("view_layout", VIEW_LAYOUTS, "the S-split path on packed inputs, or on every input re-laid as "
                                                "a view of a larger poisoned buffer (layout invariance)")),
        # one interacting pair: an extra segment on a row active on fewer splits than S (gfx950: A = 4 of 5), else
        # an extra slice taken by S instead of A shows nowhere; it fits the 3 rows of each value once (a case runs
        # every path of the target, 3-6 decodes, 2-6 s each here); other pairs are left to the random cases after
        (("extra", "active"),),
        classify_metamorphic, force_metamorphic, _metamorphic_allowed, examples=metamorphic_examples),
        "decode-paths-agree")


METAMORPHIC_DIMENSIONS = _declare_metamorphic()
