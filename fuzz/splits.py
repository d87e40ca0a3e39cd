"""Cases and strategies for the split-selector contract (``impl.splits``): batch sizes, head counts, index sizes
and CU counts, the selectors' only inputs."""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from fuzz.cases import Case


@dataclass(frozen=True)
class SplitCase(Case):
    """One selector call: ``batch`` rows of ``heads`` heads, ``avg_main`` / ``avg_extra`` index entries per row
    (the main indices ``ragged_slack`` wider than that when any are present) on ``cu_count`` compute units."""

    KIND = "split-bounds"
    batch: int
    heads: int
    avg_main: int
    avg_extra: int
    ragged_slack: int
    cu_count: int

    def __post_init__(self):
        super().__post_init__()
        for name, low in (("batch", 1), ("heads", 1), ("avg_main", 0), ("avg_extra", 0), ("ragged_slack", 0),
                          ("cu_count", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {getattr(self, name)!r}")

    @property
    def main_numel(self) -> int:
        return self.batch * self.avg_main + (self.ragged_slack if self.avg_main else 0)

    @property
    def extra_numel(self) -> int:
        return self.batch * self.avg_extra


def split_cases(target_cu_count: int):
    """Small, medium and huge batches, odd head counts, empty and long indices, the target's own CU count and any
    other (the selectors must hold for a device of any size)."""
    return st.builds(
        SplitCase,
        batch=st.one_of(st.integers(1, 4), st.integers(1, 80), st.integers(1, 2048)),
        heads=st.sampled_from([1, 3, 16, 17, 32, 64, 128]),
        avg_main=st.one_of(st.just(0), st.sampled_from([64, 128, 256]), st.integers(0, 512)),
        avg_extra=st.one_of(st.just(0), st.sampled_from([32, 512, 2048, 8192]), st.integers(0, 20000)),
        ragged_slack=st.integers(0, 63),
        cu_count=st.one_of(st.sampled_from([target_cu_count, *PRODUCTION_CU_COUNTS, 38]), st.integers(1, 512)),
    )


# --- declared dimensions ----------------------------------------------------------------------------------------
# The selectors' branches: base = batch * ceil(heads / 16) against 16 and 64 (gfx950's short-work, one-wave and
# snapping rules; gfx942's waves), the CU count (the target's own, another at least base, one below base where
# CU // base is 0), the head count around BLOCK_H = 16, the per-row main length around BLOCK_K = 32 with or without
# a remainder (numel not a multiple of batch: every ceil of the average), and the extra length at the short-work
# threshold (the largest with iters(4) <= 3, and one past it) or long.

BLOCK_H, BLOCK_K = 16, 32
BASE_CLASSES = ("<16", "16-63", ">=64")
CU_CLASSES = ("own", "other", "below-base")
#: the CU counts of real parts: MI308X 80, 228 (an MI300-series part), MI355X 256, MI300X 304
PRODUCTION_CU_COUNTS = (80, 228, 256, 304)
HEAD_CLASSES = {"1": 1, "t-1": BLOCK_H - 1, "t": BLOCK_H, "t+1": BLOCK_H + 1, "2t+1": 2 * BLOCK_H + 1}
MAIN_CLASSES = {"0": 0, "1": 1, "t-1": BLOCK_K - 1, "t": BLOCK_K, "t+1": BLOCK_K + 1, "2t-1": 2 * BLOCK_K - 1,
                "2t": 2 * BLOCK_K, "2t+1": 2 * BLOCK_K + 1}
EXTRA_CLASSES = ("long", "0", "short-edge", "short-past")
LONG_EXTRA = 8192


def _hb(heads: int) -> int:
    return -(-heads // BLOCK_H)


def short_edge(case: SplitCase) -> int:
    """The largest per-row extra length with iters(4) <= 3 beside the case's main segment (gfx950's short-work
    threshold; the adaptive kernel's "4 splits" branch at the same lengths)."""
    from oracles.splits import ref_iters

    e = 3 * 4 * BLOCK_K
    while e > 0 and ref_iters(case.main_numel, e * case.batch, case.batch, 4) > 3:
        e -= 1
    return e


def classify_split(case: SplitCase, target) -> dict:
    base = case.batch * _hb(case.heads)
    heads = next((k for k, v in HEAD_CLASSES.items() if v == case.heads), None)
    main = next((k for k, v in MAIN_CLASSES.items() if v == case.avg_main), None)
    edge = short_edge(case)
    extra = {0: "0", edge: "short-edge", edge + 1: "short-past"}.get(case.avg_extra)
    if extra is None and case.avg_extra >= LONG_EXTRA:
        extra = "long"
    out = {"base": "<16" if base < 16 else ("16-63" if base < 64 else ">=64"),
           "cu": "own" if case.cu_count == target.cu_count else ("below-base" if case.cu_count < base else "other"),
           "slack": "remainder" if case.avg_main and case.main_numel % case.batch else "none"}
    for k, v in (("heads", heads), ("main", main), ("extra", extra)):
        if v is not None:
            out[k] = v
    return out


def force_split(case: SplitCase, combo: dict, target) -> SplitCase:
    import random

    rng = random.Random(case.batch * 7919 + case.heads * 31 + case.avg_extra + case.cu_count)
    f = classify_split(case, target)
    f.update(combo)
    heads = HEAD_CLASSES[combo["heads"]] if "heads" in combo else case.heads
    hb = _hb(heads)
    need_two = f.get("cu") == "below-base" or f.get("slack") == "remainder"
    lo, hi = {"<16": (2 if need_two else 1, 15), "16-63": (16, 63), ">=64": (64, 250)}[f["base"]]
    # every other case at the class's lower edge (base 16 or 64 exactly where the head blocks allow)
    batch = -(-lo // hb) if rng.random() < 0.5 else rng.randint(-(-lo // hb), hi // hb)
    if need_two:
        batch = max(batch, 2)
    base = batch * hb
    cu = case.cu_count
    if "cu" in combo:
        # "other": a real part's count (not the target's own) at least base, so the selector sees the counts
        # production has (MI308X 80, 228, MI355X 256, MI300X 304); past them, one more than base
        real = [n for n in PRODUCTION_CU_COUNTS if n >= base and n != target.cu_count]
        cu = {"own": target.cu_count, "below-base": max(1, base - 1 - rng.randrange(max(base - 1, 1))),
              "other": rng.choice(real) if real else base + 1}[combo["cu"]]
        if combo["cu"] == "other" and cu == target.cu_count:
            cu += 1
    avg_main = MAIN_CLASSES[combo["main"]] if "main" in combo else case.avg_main
    slack = 0
    if f.get("slack") == "remainder" and avg_main:
        slack = 1 + rng.randrange(batch - 1)
    forced = SplitCase(batch=batch, heads=heads, avg_main=avg_main, avg_extra=0, ragged_slack=slack, cu_count=cu)
    kind = f.get("extra")
    edge = short_edge(forced)
    avg_extra = {"0": 0, "short-edge": edge, "short-past": edge + 1,
                 "long": LONG_EXTRA + rng.randrange(64)}.get(kind, case.avg_extra)
    return forced.replace(avg_extra=avg_extra)


def _split_allowed(c: dict, target) -> bool:
    if c.get("main") == "0" and c.get("slack") == "remainder":
        return False
    return True


def split_family_examples(target) -> list[SplitCase]:
    return [SplitCase(batch=1, heads=1, avg_main=0, avg_extra=0, ragged_slack=0, cu_count=target.cu_count),
            SplitCase(batch=3, heads=16, avg_main=128, avg_extra=512, ragged_slack=2, cu_count=80)]


def _declare_splits():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "splits",
        (Dimension("base", BASE_CLASSES, "batch * ceil(heads / 16) against gfx950's 16 and 64"),
         Dimension("cu", CU_CLASSES, "the target's CU count, another at least base, one below base"),
         Dimension("extra", EXTRA_CLASSES, "per-row extra length: empty, the largest with iters(4) <= 3, one past, "
                   "long"),
         Dimension("heads", tuple(HEAD_CLASSES), "head count around BLOCK_H = 16"),
         Dimension("main", tuple(MAIN_CLASSES), "per-row main length around BLOCK_K = 32"),
         Dimension("slack", ("none", "remainder"), "main numel a multiple of batch, or not")),
        (("base", "cu"), ("base", "extra"), ("cu", "extra"), ("main", "slack")),
        classify_split, force_split, _split_allowed, split_family_examples), "split-bounds")


SPLIT_DIMENSIONS = _declare_splits()
