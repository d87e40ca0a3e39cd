"""Contract ``inverse-rope-exactly-once`` (the subject's ``layer_rope`` family, ``impl.layer_rope``): where the DSv4
attention layer undoes the RoPE of its output rows. Source: SPEC 2 (the reduce's optional inverse-RoPE epilogue, the
single-kernel fallback), SPEC 10 (vLLM 0.34.0 moves the rotation into AITER's store for decode and prefill and runs
the standalone pass over ``[rotated, end)`` only). Cases come from :mod:`fuzz.layer_rope`."""
from __future__ import annotations

from contracts.core import ALL_TARGETS, Violation, contract, fmt
from contracts.subjects import bound
from fuzz.layer_rope import LayerRopeCase, layer_rope_cases
from impl.targets import Target
from oracles.layer_rope import expected_rotation_counts, stage_rows

#: at most this many per-row violations are listed (the rest are counted)
ROW_LIMIT = 6


def _examples(target: Target) -> list[LayerRopeCase]:
    mixed = [LayerRopeCase(num_decode_tokens=2, num_prefill_tokens=3, fuse_inv_rope=True, aiter_decode=a,
                           aiter_prefill=b) for a in (False, True) for b in (False, True)]
    return [
        # the smallest decode step on the Triton decode, first so that a failure there is the reproducer: the
        # generic fallback kernel has no reduce epilogue (upstream 0.33.0 / 0.34.0 count its row as rotated)
        LayerRopeCase(num_decode_tokens=1, num_prefill_tokens=0, fuse_inv_rope=True, aiter_decode=False,
                      aiter_prefill=False),
        *mixed,
        # fp8 wo_a with both AITER stores on: nothing here may rotate
        LayerRopeCase(num_decode_tokens=2, num_prefill_tokens=2, fuse_inv_rope=False, aiter_decode=True,
                      aiter_prefill=True),
    ]


def _part(i: int, case: LayerRopeCase) -> str:
    return f"row {i} ({'decode' if i < case.num_decode_tokens else 'prefill'})"


@contract("inverse-rope-exactly-once", targets=ALL_TARGETS, cases=lambda target: layer_rope_cases(),
          examples=_examples, min_cases=5, case_type=LayerRopeCase, numeric=False)
def inverse_rope_exactly_once(case: LayerRopeCase, target: Target) -> list[Violation]:
    """Every attention output row of a DSv4 layer is inverse-RoPE'd exactly once when its wo_a is bf16
    (``fuse_inv_rope``) and never by the attention with an fp8 wo_a, for any split of a step into decode and prefill
    rows, with AITER on or off for each part, on every target.

    No row is rotated twice or skipped: 0..4 decode and 0..4 prefill rows (mixed batches included), AITER's sparse
    MLA on or off for the decode and for the prefill independently; with an fp8 wo_a its quantization step rotates,
    so a rotation here would be the second. Each rotation also uses its own rows' positions, stays inside the output
    and is one its kernel can make: AITER's store only on the rows of the part that ran on AITER, the Triton decode's
    reduce only on decode rows of a split-K target (gfx942, gfx950; the generic single-kernel decode has no
    epilogue), the Triton prefill never, the standalone pass anywhere. The subject reports which rows each stage
    rotated (AITER's decode and prefill stores, the Triton decode's reduce, the standalone pass); the oracle is the
    invariant itself and SPEC 2's kernels. Source: SPEC 2 and 10 (vLLM 0.34.0: ``prefill_rotated``, AITER's store
    rotation, the standalone pass over ``[rotated, end)``).
    """
    plan = bound(target).layer_rope.inverse_rope_plan(target.name, **case.kwargs())
    n = case.num_decode_tokens + case.num_prefill_tokens
    stages = "; ".join(f"{r.stage} rows [{r.start}, {r.end})" for r in plan.rotations) or "no rotation"
    out: list[Violation] = []
    for r in plan.rotations:
        if not 0 <= r.start <= r.end <= n:
            out.append(Violation(f"{r.stage} rotates rows outside the step's output", case.label(),
                                 f"a range within [0, {n})", f"[{r.start}, {r.end})"))
            continue
        can = stage_rows(r.stage, target.name, case.num_decode_tokens, case.num_prefill_tokens, case.aiter_decode,
                         case.aiter_prefill)
        if can is None:
            out.append(Violation(f"{r.stage} cannot rotate in this step on {target.name} (its kernel does not run "
                                 f"here or has no epilogue)", case.label(), "no rotation by it",
                                 f"rows [{r.start}, {r.end})"))
        elif r.start < r.end and not (can.start <= r.start and r.end <= can.stop):
            out.append(Violation(f"{r.stage} rotates rows of another part of the step", case.label(),
                                 f"rows within [{can.start}, {can.stop})", f"rows [{r.start}, {r.end})"))
        if (r.positions_start, r.positions_end) != (r.start, r.end):
            out.append(Violation(f"{r.stage} rotates rows with other rows' positions", case.label(),
                                 f"positions [{r.start}, {r.end})",
                                 f"positions [{r.positions_start}, {r.positions_end})"))
    want = expected_rotation_counts(case.num_decode_tokens, case.num_prefill_tokens, case.fuse_inv_rope)
    got = list(plan.counts())
    if len(got) != n:
        out.append(Violation("the plan's row count differs from the step's", case.label(), str(n), str(len(got))))
        return out
    bad = [i for i in range(n) if got[i] != want[i]]
    for i in bad[:ROW_LIMIT]:
        if not case.fuse_inv_rope:
            msg = "row rotated by the attention although the fp8 wo_a rotates it in its quantization step"
        elif got[i] == 0:
            msg = "row never inverse-RoPE'd"
        else:
            msg = f"row inverse-RoPE'd {got[i]} times"
        out.append(Violation(msg, f"{_part(i, case)} of {case.label()} on {target.name}; stages: {stages}",
                             fmt(want[i]), fmt(got[i])))
    if len(bad) > ROW_LIMIT:
        out.append(Violation(f"{len(bad) - ROW_LIMIT} more rows with the wrong rotation count", case.label()))
    return out
