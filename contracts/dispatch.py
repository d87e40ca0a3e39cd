"""Dispatch contract (``impl.dispatch``): per-target decode dispatch against an independent truth table.
Source: SPEC sections 2 and 4; seed 004 (review: gfx950 specialisations must not leak into gfx942)."""
from __future__ import annotations

from contracts.core import ALL_TARGETS, CONTRACTS, Violation, contract, fmt
from contracts.subjects import bound
from fuzz import dispatch as fz
from fuzz.dispatch import DispatchCase
from impl.targets import Target
from oracles.dispatch import expected_dispatch

def _dispatch_examples(target: Target) -> list[DispatchCase]:
    return [DispatchCase(flags=tuple(fz.dispatch_flag_grid()))]


def _dispatch_cases(target: Target):
    return fz.dispatch_cases()


@contract("target-dispatch", targets=ALL_TARGETS, cases=_dispatch_cases, examples=_dispatch_examples, min_cases=5,
          max_cases=5,
          case_type=DispatchCase, numeric=False)
def target_dispatch(case: DispatchCase, target: Target) -> list[Violation]:
    """For every target and flag combination the decode dispatch equals an independent truth table.

    Flags: compress ratio (0, 1, 4, 128), SWA-only, graph capture, extra cache present, KV-cache dtype, KV transfer.
    Compared: kernel family, split selector and cap (gfx942 keeps the legacy path and the 16 cap; gfx950 32; the
    generic fallback none), adaptive splits (only gfx950, ratio 128, under capture, not SWA-only), ragged-view rule
    (full on gfx942/generic, source on gfx950), the trust gate (gfx950, fp8_ds_mla, no KV transfer, an extra cache),
    the fp8 flavours, the capture flag carried through; contradictory flags rejected with ValueError. Exhaustive:
    the flag domain is 4 x 2 x 2 x 2 x 4 x 2 = 256 combinations and every case, pinned or generated, checks all of
    them on the row's target (in a drawn order), so no pairs are declared. Source: SPEC 2 and 4; seed 004 (review: gfx950 changes must not reach gfx942).
    """
    decode_dispatch = bound(target).dispatch.decode_dispatch
    out: list[Violation] = []
    for flags in case.flags:
        kwargs = flags.kwargs()
        want = expected_dispatch(target.name, **kwargs)
        where = ", ".join(f"{k}={v}" for k, v in kwargs.items())
        try:
            got = decode_dispatch(target.name, **kwargs)
        except ValueError as exc:
            if want is not None:
                out.append(Violation("valid flags rejected", where, "a dispatch", f"ValueError: {exc}"))
            continue
        if want is None:
            out.append(Violation("contradictory flags accepted", where, "ValueError", fmt(got)))
            continue
        for key, value in want.items():
            g = getattr(got, key, "<missing>")
            if g != value:
                out.append(Violation(f"dispatch {key} differs from the truth table", where, fmt(value), fmt(g)))
        if len(out) >= 8:
            break
    return out


# every case checks the whole flag grid (see the doc): the audit's reach says exhaustive, no pairs declared
CONTRACTS["target-dispatch"].extra["exhaustive"] = True
