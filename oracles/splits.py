"""Reference split selectors, re-derived from SPEC section 2 ("Split count") with exact rational arithmetic.

The average lengths are the rationals numel / batch (SPEC: ``indices.numel()/b``, sync-free), every ceil is taken
on a Fraction, costs are Fractions, so nothing depends on float rounding. Decisions shared with impl/ only because
SPEC leaves them open (and both document them): iters' K is 32 (the split-K BLOCK_K); when CU < base the gfx950
one-wave count CU // base is taken as at least 1 and the answer as at least 1.
"""
from __future__ import annotations

import math
from fractions import Fraction

K = 32
HEADS_PER_BLOCK = 16


def _ceil(x: Fraction) -> int:
    return math.ceil(x)


def ref_iters(main_numel: int, extra_numel: int, batch: int, s: int, k: int = K) -> int:
    a = Fraction(main_numel, batch)
    e = Fraction(extra_numel, batch)
    total = 0
    for seg in (a, e):
        if seg == 0:
            continue  # an empty segment counts 0
        total += _ceil(Fraction(_ceil(seg / s), k))
    return total


def _base(batch: int, num_heads: int) -> int:
    return batch * _ceil(Fraction(num_heads, HEADS_PER_BLOCK))


def _waves(base: int, s: int, cu: int) -> int:
    return _ceil(Fraction(base * s, cu))


def _snap(s: int, base: int, cu: int, iters) -> int:
    target = (_waves(base, s, cu), iters(s))
    return min(c for c in range(1, s + 1) if (_waves(base, c, cu), iters(c)) == target)


def ref_num_splits_gfx942(batch: int, num_heads: int, main_numel: int, extra_numel: int, cu: int) -> int:
    base = _base(batch, num_heads)
    costs = {s: _waves(base, s, cu) * (Fraction(1, s) + Fraction(4, 100)) for s in range(1, 17)}
    best_cost = min(costs.values())
    best = min(s for s, c in costs.items() if c == best_cost)  # ties go to the smaller s
    return _snap(best, base, cu, lambda s: ref_iters(main_numel, extra_numel, batch, s))


def ref_num_splits_gfx950(batch: int, num_heads: int, main_numel: int, extra_numel: int, cu: int) -> int:
    base = _base(batch, num_heads)

    def iters(s):
        return ref_iters(main_numel, extra_numel, batch, s)

    S = min(32, _ceil(Fraction(2 * cu, base)))
    if base >= 16 and S > 4 and iters(4) <= 3:
        return 4
    if 16 <= base < 64:
        ow = max(1, cu // base)
        waves = 1 if iters(ow) <= 9 else 2
        S = max(1, min(S, (waves * cu) // base))
    if base >= 16:
        S = _snap(S, base, cu, iters)
    return S


def ref_adaptive_host(num_splits: int, batch: int, num_heads: int, cu: int) -> tuple[bool, int]:
    """(enabled, ONE_WAVE) on a target that allows adaptive splits: on iff base >= 16 and S > 4; ONE_WAVE =
    CU // base when 16 <= base < 64, else S (kept within [1, S])."""
    base = _base(batch, num_heads)
    ow = cu // base if 16 <= base < 64 else num_splits
    return base >= 16 and num_splits > 4, min(max(ow, 1), num_splits)


def ref_adaptive_active(main_len: int, extra_len: int, num_splits: int, one_wave: int) -> int:
    """Per query: 4 if iters(4) <= 3, else ONE_WAVE if iters(ONE_WAVE) <= 3, else S; never above S."""
    if ref_iters(main_len, extra_len, 1, 4) <= 3:
        a = 4
    elif ref_iters(main_len, extra_len, 1, one_wave) <= 3:
        a = one_wave
    else:
        a = num_splits
    return min(a, num_splits)
