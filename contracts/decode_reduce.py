"""Contract ``decode-reduce-oracle``: the split-K reduce on its own (``decode.decode_reduce``), over partials built
to stress it (:mod:`fuzz.decode_reduce`), against the float64 reference of :mod:`oracles.decode_reduce`."""
from __future__ import annotations

import torch

from contracts.core import AMD_TARGETS, Violation, contract, record_margin, single_threaded
from contracts.subjects import bound
from contracts.subjects.memory_bounds import bounded_memory
from fuzz import decode_reduce as fz
from fuzz.decode_reduce import ReduceCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles.decode_reduce import ref_reduce


def _examples(target: Target) -> list[ReduceCase]:
    return [
        # upstream's adaptive check (SPEC 2): acc 1 and 3 over equal weights, a stale NaN split skipped
        ReduceCase(seed=3, batch=1, heads=2, splits=3, adaptive=True, dead="last", poison="stale-nan"),
        # maxima 60 nats apart with denominators 2^24 apart: the weights, not the denominators alone, decide
        ReduceCase(seed=4, batch=2, heads=3, splits=32, adaptive=False, m_spread=60.0, l_spread=24.0,
                   sink="below"),
        # every split dead, with a dominant sink: l is the sink's alone and the output is 0
        ReduceCase(seed=5, batch=1, heads=1, splits=4, adaptive=True, dead="all", sink="dominant"),
    ]


@contract("decode-reduce-oracle", targets=AMD_TARGETS, cases=lambda target: fz.reduce_cases(), examples=_examples,
          min_cases=5, max_cases=25, case_type=ReduceCase, numeric=True)
def decode_reduce_oracle(case: ReduceCase, target: Target) -> list[Violation]:
    """The split-K reduce (``decode.decode_reduce``, the kernel every split-K decode ends with) equals SPEC 2's
    merge in float64: m = max(max_s m_s, sink), w_s = e^(m_s - m), l = sum w_s l_s + e^(sink - m),
    out = sum w_s acc_s / l, 0 where l <= 0; with adaptive splits a split whose m is -FLT_MAX is skipped outright (its
    stale or NaN accumulator never reaches the output); a NaN in a live accumulator lane gives NaN in that lane only.
    The partials are built directly, so the merge sees maxima 60 nats apart, denominators 2^24 apart, dead splits
    first, in the middle, last or everywhere, and sinks below and above every maximum. Tolerance: the fp32 rounding
    of the weights and sums (relative to sum w_s |acc_s| / l) plus one bf16 unit; the margin is the worst
    error-to-bound ratio. Absolute regimes (issue 30): the maxima near -110 (e^m underflows in fp32), near +100
    (e^m overflows) or at signed zeros, against sinks 200 nats below (vanishing; head 0's -inf), 200 above
    (overwhelming), or 2-3 nats from the top.
    Layouts: the partials, sink and out come packed or as padded, sliced, strided or heads-major views (the values
    the same); a layout the reduce may refuse (padded partials, a strided sink) is computed the same or refused
    with a ValueError/TypeError naming the argument, out and the partials untouched; any other refusal is a
    violation."""
    dec = bound(target).decode
    p = fz.build_partials(case)
    dev = kernel_device()
    ws = dec.DecodeWorkspace(*(fz.lay_out(p[k], case.ws_layout, dev) for k in ("part_m", "part_l", "part_acc")))
    sink = fz.lay_out(p["sink"].float(), case.sink_layout, dev) if p["sink"] is not None else None
    nan_out = torch.full((case.batch, case.heads, fz.HEAD_DIM), float("nan"), dtype=torch.bfloat16)
    out = fz.lay_out(nan_out, case.out_layout, dev)
    before = [t.clone() for t in (ws.part_m, ws.part_l, ws.part_acc)]
    where = (f"S={case.splits}, adaptive={case.adaptive}, dead={case.dead}, sink={case.sink}, level={case.level}, "
             f"layouts ws={case.ws_layout} sink={case.sink_layout} out={case.out_layout}")
    # under the interpreter every load and store of the launch must stay inside the tensors handed to it (a read
    # past a split's row whose value a masked select then drops, e.g. the padding splits of the one vector load of
    # part_l, changes no output but may fault on a device); natively a no-op
    with single_threaded(), bounded_memory():
        try:
            got = dec.decode_reduce(ws, attn_sink=sink, adaptive=case.adaptive, out=out).cpu().double()
        except (ValueError, TypeError) as e:
            return _refusal(case, e, where, out, before, ws)
        ref, tol = ref_reduce(p["part_m"], p["part_l"], p["part_acc"], p["sink"], case.adaptive)
    v: list[Violation] = []
    nan_ref, nan_got = torch.isnan(ref), torch.isnan(got)
    if not torch.equal(nan_ref, nan_got):
        idx = (nan_ref != nan_got).nonzero()[0].tolist()
        v.append(Violation("reduce output NaN mask differs from the reference", f"{where}; [b, h, d] = {idx}",
                           "NaN" if nan_ref[tuple(idx)] else f"{float(ref[tuple(idx)]):.6g}",
                           f"{float(got[tuple(idx)]):.6g}"))
    ok = ~nan_ref & ~nan_got
    err = (got - ref).abs()
    bad = ok & ~(err <= tol)
    record_margin(torch.where(ok, err, torch.zeros_like(err)), torch.where(ok, tol, torch.ones_like(tol)))
    if bool(bad.any()):
        idx = bad.nonzero()[0].tolist()
        t = tuple(idx)
        v.append(Violation(f"reduce output differs from the float64 merge beyond the fp32/bf16 bound "
                           f"({int(bad.sum())} lanes)", f"{where}; [b, h, d] = {idx}",
                           f"{float(ref[t]):.9g} +- {float(tol[t]):.3g}", f"{float(got[t]):.9g}"))
    return v


REFUSED_ACCEPTED = "reduce refused a layout it must accept"
REFUSAL_UNNAMED = "reduce refused a layout without naming the argument"
REFUSAL_WROTE = "reduce refused a layout but changed its output or partials first"


def _refusal(case: ReduceCase, err: Exception, where: str, out, before, ws) -> list[Violation]:
    """A reduce that raised: fine only for a layout it may refuse (fuzz.decode_reduce.MAY_REFUSE), naming the
    argument, with out still all NaN and the partials unchanged."""
    args = fz.refusable(case)
    if not args:
        return [Violation(REFUSED_ACCEPTED, where, "a result", f"{type(err).__name__}: {err}")]
    v = []
    if not any(a in str(err) for a in args.values()):
        v.append(Violation(REFUSAL_UNNAMED, where, f"a message naming one of {sorted(args.values())}", str(err)))
    if not bool(torch.isnan(out.float()).all()):
        v.append(Violation(REFUSAL_WROTE, f"{where}; out", "every element still NaN", "written"))
    for name, b, t in zip(("part_m", "part_l", "part_acc"), before, (ws.part_m, ws.part_l, ws.part_acc)):
        if not torch.equal(torch.nan_to_num(b), torch.nan_to_num(t)):
            v.append(Violation(REFUSAL_WROTE, f"{where}; workspace.{name}", "unchanged", "changed"))
    return v
