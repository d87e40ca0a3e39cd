"""Cases for ``decode-reduce-oracle``: split-K partials (part_m, part_l, part_acc) fed straight to the reduce.

The partials are built here, not computed by a partial kernel, so the reduce sees what a partial kernel may hand it
and what the decode's own inputs rarely produce: maxima that differ across splits by tens of nats, denominators
that differ by 2^24, dead splits (m = -FLT_MAX, l = 0) anywhere in the row, stale or NaN accumulators behind them
under adaptive splits, a live NaN, a sink below or above every split's maximum.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case

FLT_MAX = float(torch.finfo(torch.float32).max)
HEAD_DIM = 512
SPLIT_CLASSES = ("1", "2", "odd", "32")
DEAD_KINDS = ("none", "first", "middle", "last", "all")
SINK_KINDS = ("none", "below", "dominant")
#: how far the sink sits from the top maximum: "near" (below: 2 under it, dominant: 3 over it); "far" (below: 200
#: under it, so its fp32 weight underflows to 0 and it vanishes, head 0's -inf, a sink that means none;
#: dominant: 200 over it, so every split's weight underflows to 0 and the sink overwhelms them)
SINK_GAPS = ("near", "far")
SINK_OFFSET = {("below", "near"): -2.0, ("dominant", "near"): 3.0, ("below", "far"): -200.0,
               ("dominant", "far"): 200.0}
POISON_KINDS = ("none", "live-nan", "stale-nan")
#: absolute level of the split maxima (the spreads are relative to it): ~N(0, 16); near -110 (e^m underflows in
#: fp32); near +100 (e^m overflows); at zero, the equal maxima +0.0 and -0.0 at random (signed zeros at the cut)
LEVELS = ("ordinary", "underflow", "overflow", "signed-zero")
LEVEL_BASE = {"underflow": -110.0, "overflow": 100.0}
#: memory layouts of the reduce's inputs and output (the values the same in each; unreached elements NaN):
#: the workspace packed, or each partial a view with padded rows (an entry point needing contiguity refuses it);
#: the sink packed, a slice of a NaN buffer, or strided (refusable); out packed, rows padded, or heads-major
WS_LAYOUTS = ("contiguous", "padded")
SINK_LAYOUTS = ("contiguous", "slice", "strided")
OUT_LAYOUTS = ("contiguous", "padded", "heads-major")
MAY_REFUSE = {"ws_layout": ("padded",), "sink_layout": ("strided",)}


@dataclass(frozen=True)
class ReduceCase(Case):
    """``batch`` x ``heads`` rows of ``splits`` partials from ``seed``. Per row, split maxima spread over
    ``m_spread`` nats and denominators over 2^``l_spread``; ``dead`` places the dead splits (m = -FLT_MAX, l = 0:
    a split an adaptive plan left inactive, or one with no valid token); their accumulators hold ``stale`` values
    (adaptive only: an inactive split never writes them). ``poison`` puts a NaN into one live accumulator lane
    (the output lane must be NaN) or into the dead splits' accumulators (it must not leak)."""

    KIND = "decode-reduce-oracle"
    ADDED_FIELDS = ('level', 'sink_gap', 'ws_layout', 'sink_layout', 'out_layout')
    seed: int
    batch: int
    heads: int
    splits: int
    adaptive: bool
    dead: Literal["none", "first", "middle", "last", "all"] = "none"
    sink: Literal["none", "below", "dominant"] = "none"
    m_spread: float = 0.0
    l_spread: float = 0.0
    poison: Literal["none", "live-nan", "stale-nan"] = "none"
    level: str = "ordinary"
    sink_gap: str = "near"
    ws_layout: str = "contiguous"
    sink_layout: str = "contiguous"
    out_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        for name, allowed in (("sink", SINK_KINDS), ("level", LEVELS), ("sink_gap", SINK_GAPS),
                              ("ws_layout", WS_LAYOUTS), ("sink_layout", SINK_LAYOUTS), ("out_layout", OUT_LAYOUTS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name}: expected one of {allowed}, got {getattr(self, name)!r}")
        for name in ("batch", "heads", "splits"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        if self.seed < 0:
            raise ValueError(f"seed: expected an int >= 0, got {self.seed!r}")
        if self.m_spread < 0 or self.l_spread < 0:
            raise ValueError("m_spread / l_spread: expected >= 0")
        if self.poison == "stale-nan" and not (self.adaptive and self.dead != "none"):
            raise ValueError("poison 'stale-nan' needs adaptive splits and dead splits to sit behind")

    def dead_splits(self) -> list[int]:
        S = self.splits
        return {"none": [], "first": [0], "middle": [S // 2] if S > 2 else [], "last": [S - 1],
                "all": list(range(S))}[self.dead]


@st.composite
def reduce_cases(draw) -> ReduceCase:
    """Split counts 1..33, dead splits anywhere, both reduce modes, all sink kinds, spread maxima and
    denominators, poison live or stale."""
    splits = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 16, 31, 32, 33]))
    adaptive = draw(st.booleans())
    dead = draw(st.sampled_from(DEAD_KINDS))
    poison = draw(st.sampled_from(POISON_KINDS if adaptive and dead != "none" else POISON_KINDS[:2]))
    return ReduceCase(seed=draw(st.integers(0, 2**31 - 1)), batch=draw(st.integers(1, 2)),
                      heads=draw(st.sampled_from([1, 2, 3])), splits=splits, adaptive=adaptive, dead=dead,
                      sink=draw(st.sampled_from(SINK_KINDS)), m_spread=draw(st.sampled_from([0.0, 3.0, 60.0])),
                      l_spread=draw(st.sampled_from([0.0, 4.0, 24.0])), poison=poison,
                      level=draw(st.sampled_from(LEVELS)), sink_gap=draw(st.sampled_from(SINK_GAPS)),
                      ws_layout=draw(st.sampled_from(WS_LAYOUTS)),
                      sink_layout=draw(st.sampled_from(SINK_LAYOUTS)), out_layout=draw(st.sampled_from(OUT_LAYOUTS)))


def build_partials(case: ReduceCase) -> dict:
    """part_m, part_l [b, S, h], part_acc [b, S, h, 512] (fp32, CPU) and the sink [h] (or None)."""
    g = torch.Generator().manual_seed(case.seed)
    b, S, h = case.batch, case.splits, case.heads
    base = torch.randn(b, 1, h, generator=g) * 4
    if case.level in LEVEL_BASE:  # a few tenths of a nat apart around the level
        base = LEVEL_BASE[case.level] + base / 16
    elif case.level == "signed-zero":
        base = torch.zeros_like(base)
    m = base - torch.rand(b, S, h, generator=g) * case.m_spread
    if case.level == "signed-zero":
        m = torch.where((m == 0) & (torch.rand(b, S, h, generator=g) < 0.5), torch.tensor(-0.0), m)
    l = torch.exp2((torch.rand(b, S, h, generator=g) - 0.5) * case.l_spread) * (0.5 + torch.rand(b, S, h, generator=g))
    acc = l[..., None] * torch.randn(b, S, h, HEAD_DIM, generator=g)
    dead = case.dead_splits()
    if dead:
        m[:, dead] = -FLT_MAX
        l[:, dead] = 0.0
        # what an inactive split leaves behind: zeros for a plan that writes every split, anything under adaptive
        acc[:, dead] = (torch.randn(b, len(dead), h, HEAD_DIM, generator=g) * 1e30) if case.adaptive else 0.0
        if case.poison == "stale-nan":
            acc[:, dead, :, ::7] = float("nan")
    if case.poison == "live-nan":
        live = [s for s in range(S) if s not in dead]
        if live:
            s = live[case.seed % len(live)]
            acc[0, s, 0, case.seed % HEAD_DIM] = float("nan")
    sink = None
    if case.sink != "none":
        top = m.amax(dim=(0, 1))  # per head, over the live splits (-FLT_MAX where every split is dead)
        top = torch.where(top > -FLT_MAX, top, base.amax(dim=(0, 1)))
        sink = top + SINK_OFFSET[case.sink, case.sink_gap]
        if case.sink == "below" and case.sink_gap == "far":
            sink[0] = -math.inf
    return {"part_m": m.float(), "part_l": l.float(), "part_acc": acc.float(), "sink": sink}


def lay_out(t: torch.Tensor, layout: str, device) -> torch.Tensor:
    """``t`` on ``device`` as ``layout`` says, the values the same: "contiguous"; "padded" (the last dim a view of
    a wider NaN buffer: rows padded); "heads-major" (dims 0 and 1 swapped in memory); for 1-D ``t`` "slice" (3 into
    a NaN buffer) and "strided" (every other element of one)."""
    if layout == "contiguous":
        return t.contiguous().to(device)
    if layout == "heads-major":
        return t.transpose(0, 1).contiguous().to(device).transpose(0, 1)
    if layout == "padded":
        buf = torch.full((*t.shape[:-1], t.shape[-1] + 64), math.nan, dtype=t.dtype)
        buf[..., :t.shape[-1]] = t
        return buf.to(device)[..., :t.shape[-1]]
    n = t.numel()
    buf = torch.full((2 * n if layout == "strided" else n + 5,), math.nan, dtype=t.dtype)
    view = slice(0, 2 * n, 2) if layout == "strided" else slice(3, 3 + n)
    buf[view] = t
    return buf.to(device)[view]


def refusable(case: ReduceCase) -> dict:
    """``{dimension: argument names}`` of the case's layouts an entry point may refuse (:data:`MAY_REFUSE`)."""
    args = {"ws_layout": "workspace", "sink_layout": "attn_sink"}
    return {d: args[d] for d, vals in MAY_REFUSE.items()
            if getattr(case, d) in vals and (d != "sink_layout" or case.sink != "none")}


# --- declared dimensions (fuzz.dimensions) ---------------------------------------------------------------------

def _split_class(S: int) -> str:
    return "1" if S == 1 else "2" if S == 2 else "32" if S == 32 else "odd" if S % 2 else "other"


def classify_reduce(case: ReduceCase, target) -> dict:
    out = {"adaptive": case.adaptive, "dead": case.dead, "sink": case.sink, "poison": case.poison,
           "maxima": "spread" if case.m_spread >= 30 else "equal" if case.m_spread == 0 else "near",
           "denominators": "unequal" if case.l_spread >= 16 else "equal" if case.l_spread == 0 else "near",
           "level": case.level, "sink_gap": case.sink_gap, "ws_layout": case.ws_layout,
           "sink_layout": case.sink_layout, "out_layout": case.out_layout}
    cls = _split_class(case.splits)
    if cls != "other":
        out["splits"] = cls
    return out


def force_reduce(case: ReduceCase, combo: dict, target) -> ReduceCase:
    f = dataclasses.asdict(case)
    if "splits" in combo:
        f["splits"] = {"1": 1, "2": 2, "32": 32, "odd": 5 + 2 * (case.seed % 3)}[combo["splits"]]
    for k in ("adaptive", "dead", "sink", "poison", "level", "sink_gap", "ws_layout", "sink_layout", "out_layout"):
        if k in combo:
            f[k] = combo[k]
    if f["sink_layout"] != "contiguous" and f["heads"] < 2:
        f["heads"] = 2  # head 0 reads the same element whatever the layout: a second head reads across it
    if "maxima" in combo:
        f["m_spread"] = {"equal": 0.0, "near": 3.0, "spread": 60.0}[combo["maxima"]]
    if "denominators" in combo:
        f["l_spread"] = {"equal": 0.0, "near": 4.0, "unequal": 24.0}[combo["denominators"]]
    return ReduceCase(**f)


def _reduce_allowed(c: dict, target) -> bool:
    if c.get("poison") == "stale-nan" and (c.get("adaptive") is False or c.get("dead") == "none"):
        return False
    if c.get("splits") == "1" and c.get("dead") in ("first", "middle", "last"):
        return False  # one split: dead is none or all
    if c.get("splits") == "2" and c.get("dead") == "middle":
        return False
    if c.get("dead") == "all" and c.get("poison") == "live-nan":
        return False  # no live split to poison
    if c.get("sink") == "none" and c.get("sink_layout", "contiguous") != "contiguous":
        return False  # no sink, no sink layout
    return True


def _examples(target) -> list[ReduceCase]:
    return [ReduceCase(seed=s, batch=1, heads=1, splits=3, adaptive=False) for s in (0, 1)]


def _declare():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "decode-reduce",
        (Dimension("splits", SPLIT_CLASSES, "split count: 1, 2, odd, gfx950's cap 32"),
         Dimension("dead", DEAD_KINDS, "where the dead splits (m = -FLT_MAX, l = 0) sit"),
         Dimension("adaptive", (False, True), "the reduce's ADAPTIVE skip of dead splits"),
         Dimension("sink", SINK_KINDS, "no sink, one below every maximum, one above them"),
         Dimension("maxima", ("equal", "near", "spread"), "split maxima spread over 0, 3, 60 nats"),
         Dimension("denominators", ("equal", "near", "unequal"), "split denominators spread over 2^0, 2^4, 2^24"),
         Dimension("poison", POISON_KINDS, "a NaN in a live accumulator, or behind dead splits"),
         Dimension("level", LEVELS, "absolute level of the maxima: ordinary, near -110 (e^m underflows), near "
                                    "+100 (e^m overflows), signed zeros"),
         Dimension("sink_gap", SINK_GAPS, "the sink 2-3 nats from the top maximum, or 200 (vanishing below, "
                                          "overwhelming above)"),
         Dimension("ws_layout", WS_LAYOUTS, "the partials packed, or views with padded rows (refusable)"),
         Dimension("sink_layout", SINK_LAYOUTS, "the sink packed, a slice of a NaN buffer, or strided (refusable)"),
         Dimension("out_layout", OUT_LAYOUTS, "out packed, rows padded, or heads-major")),
        (("splits", "dead"), ("dead", "adaptive"), ("adaptive", "poison"), ("dead", "sink"),
         ("maxima", "denominators"), ("splits", "denominators"),
         # the level against the sink and its gap (dominating or vanishing in absolute terms) and the relative
         # spread; the layouts against what walks them: the split count (strides between splits), the sink kind,
         # the reduce mode whose select or product writes out
         ("level", "sink"), ("sink", "sink_gap"), ("level", "sink_gap"), ("level", "maxima"),
         ("splits", "ws_layout"), ("sink", "sink_layout"), ("adaptive", "out_layout")),
        classify_reduce, force_reduce, _reduce_allowed, _examples), "decode-reduce-oracle")


REDUCE_DIMENSIONS = _declare()
