"""Graph capture and replay contract for the sparse decode (``impl.graph_capture``).

``graph-replay-agreement``: a decode captured at one set of row lengths and replayed at others (all rows empty, all
rows at their maximum, fewer rows than captured) gives, at every replay, exactly what an eager decode with the same
frozen plan gives on the same data, agrees with the float64 oracle, and never moves a pointer. (The decode's
far-end addressing probe is in contracts/int64_probes.py.)

Sources: SPEC section 2 (adaptive splits under capture, ``_copy_ragged_to_graph_buffers``); seed 004 (the gfx950
decode and its graph-capture changes).
"""
from __future__ import annotations

import math
import warnings

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt
from contracts.decode import layout_refusal, oracle_violations
from contracts.subjects import bound
from fuzz import graph_capture as fzg
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import decode as ref_decode
from oracles.dispatch import expected_dispatch
from oracles.splits import ref_adaptive_host


#: a refusal must be of a layout the capture may refuse (fuzz.graph_capture.MAY_REFUSE) and name the argument; a
#: replay may refuse none (every layout it copies from is accepted)
REFUSED_ACCEPTED_LAYOUT = "graph capture or replay refused a layout it must accept"
REFUSAL_UNNAMED = "graph capture refused a layout without naming the argument"
REFUSAL_WROTE = "graph capture refused a layout but wrote first"
#: a mismatch of a case whose packed twin passes, named by the one layout that alone makes it differ
LAYOUT_DIFFERS = "graph replay with a non-packed layout differs from the same inputs packed"


def _packed(t):
    """A packed copy (the eager decode and the oracle see the values, not the caller's layout: a graph that accepts
    a layout must compute what the contiguous copy gives)."""
    return None if t is None else t.contiguous()


class _PackedStep:
    def __init__(self, step: fzg.StepInputs):
        self.q = _packed(step.q)
        self.main_indices, self.main_indptr = _packed(step.main_indices), _packed(step.main_indptr)
        self.extra_indices, self.extra_indptr = _packed(step.extra_indices), _packed(step.extra_indptr)


def _oracle_violations(label: str, got: torch.Tensor, step, inp, target: Target, plan, trust: bool):
    ref = ref_decode.ref_sparse_attn_decode(
        step.q, inp.main_view, step.main_indices, step.main_indptr, inp.extra_view, step.extra_indices,
        step.extra_indptr, attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale,
        main_flavour=target.main_cache_fp8, extra_flavour=target.extra_cache_fp8, scrub_extra=not trust)
    return oracle_violations(f"{label} vs float64 oracle (S={plan.num_splits}, adaptive={plan.adaptive})", got, ref,
                             plan.num_splits)


class _Views:
    """The persistent cache views of a case, under the names the oracle helper reads."""

    def __init__(self, inp: fzg.GraphCaseInputs):
        self.main_view = inp.main.view
        self.extra_view = inp.extra.view if inp.extra is not None else None
        self.attn_sink = _packed(inp.attn_sink)
        self.softmax_scale = inp.softmax_scale


def run_graph_case(case: fzg.GraphCase, target: Target, mode: str | None = None) -> tuple[list[Violation], object]:
    """Capture, replay every step of ``case`` and check each replay; returns (violations, the graph). The graph
    and the eager decode are the current subject's (``graph_capture.DecodeGraph``, ``decode.sparse_attn_decode``
    with the captured plan)."""
    sub = bound(target)
    DecodeGraph, GraphReplayError = sub.graph_capture.DecodeGraph, sub.graph_capture.GraphReplayError
    dec = sub.decode
    dev = kernel_device()
    inp = fzg.build_graph_case(case, target)
    views = _Views(inp)
    cap = fzg.build_step(case, case.capture, 0, inp)
    ratio = case.compress_ratio
    messages = (REFUSED_ACCEPTED_LAYOUT, REFUSAL_UNNAMED, REFUSAL_WROTE)
    caches = [c for c in (inp.main, inp.extra) if c is not None]
    pools = [c.pool.clone() for c in caches]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on 0 * inf by design
            g = DecodeGraph.capture(cap.q, views.main_view, cap.main_indices, cap.main_indptr, views.extra_view,
                                    cap.extra_indices, cap.extra_indptr, max_per_row_main=case.max_main,
                                    max_per_row_extra=case.max_extra, compress_ratio=ratio,
                                    attn_sink=inp.attn_sink, softmax_scale=inp.softmax_scale, target=target,
                                    cu_count=case.cu_count, mode=mode)
    except (ValueError, TypeError) as err:
        # a layout the capture may refuse (a strided sink), named; the caches (its only memory it could write)
        # unchanged
        changed = sum(int((a != c.pool).sum()) for a, c in zip(pools, caches))
        return layout_refusal(messages, f"capture, layouts {fzg.non_packed(case)}", fzg.refusable(case), err,
                              [("the caches", changed)]), None
    out: list[Violation] = []
    b, h, cu = case.batch, case.heads, case.cu_count
    want = expected_dispatch(target.name, ratio, ratio in (0, 1), True, inp.extra is not None, "fp8_ds_mla", False)
    en, ow = ref_adaptive_host(g.plan.num_splits, b, h, cu)
    want_adaptive = bool(want["adaptive_splits"]) and en
    if g.plan.adaptive != want_adaptive or (want_adaptive and g.plan.one_wave != ow):
        out.append(Violation("captured plan's adaptive splits differ from the dispatch truth table and host rule",
                             f"ratio={ratio}, batch={b}, heads={h}, cu={cu}, S={g.plan.num_splits}",
                             f"adaptive={want_adaptive}, one_wave={ow}",
                             f"adaptive={g.plan.adaptive}, one_wave={g.plan.one_wave}"))
    trust = bool(g.dispatch.trust_extra_nan_free)
    if trust != bool(want["trust_extra_nan_free"]):
        out.append(Violation("captured trust gate differs from the truth table", target.name,
                             fmt(want["trust_extra_nan_free"]), fmt(trust)))
    pointers = g.buffer_pointers()
    launches = g.launches
    view_base = {k: pointers[k] for k in ("main_indices", "main_indptr", "extra_indices", "extra_indptr")
                 if k in pointers}
    for i, rep in enumerate(case.replays):
        step = fzg.build_step(case, rep, i + 1, inp)
        rows = rep.rows
        label = (f"replay {i} (rows={rows}, main_lens={list(rep.main_lens)}, "
                 f"extra_lens={None if rep.extra_lens is None else list(rep.extra_lens)})")
        g.out.fill_(math.nan)
        if g.workspace is not None:
            for t in (g.workspace.part_m, g.workspace.part_l, g.workspace.part_acc):
                t.fill_(math.nan)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                got = g.replay(step.q, step.main_indices, step.main_indptr, step.extra_indices,
                               step.extra_indptr).cpu().clone()
        except GraphReplayError as exc:
            out.append(Violation("replay did not reuse the captured launches", label, "the captured launches",
                                 str(exc)))
            break
        except (ValueError, TypeError) as err:  # a replay refuses no layout: the capture took them all
            out += layout_refusal(messages, f"{label}, layouts {fzg.non_packed(case)}", {}, err, [])
            break
        step = _PackedStep(step)  # the eager decode and the oracle get the same values packed
        if g.buffer_pointers() != pointers:
            moved = [k for k, v in g.buffer_pointers().items() if pointers.get(k) != v]
            out.append(Violation("a persistent buffer moved", label, "the captured data pointers",
                                 f"moved: {', '.join(moved)}"))
        for name, base in view_base.items():
            v = g.last_views.get(name)
            if v is None or v.data_ptr() != base:
                out.append(Violation(f"{name} view does not start at the persistent base pointer", label, hex(base),
                                     "missing" if v is None else hex(v.data_ptr())))
        if g.launches != launches:
            out.append(Violation("captured launches changed after a replay", label, "unchanged", "changed"))
        # eager decode with the same frozen plan and CU count on the same data, own (poisoned) buffers: the CU
        # count picks the launch's build (its warps), which natively changes the bits
        ws = (dec.DecodeWorkspace.allocate(rows, g.plan.num_splits, h, dev, fill=math.nan)
              if g.workspace is not None else None)
        eager = torch.full((rows, h, formats.DSV4_HEAD_DIM), math.nan, dtype=torch.bfloat16, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dec.sparse_attn_decode(step.q, views.main_view, step.main_indices, step.main_indptr, views.extra_view,
                                   step.extra_indices, step.extra_indptr, attn_sink=views.attn_sink,
                                   softmax_scale=inp.softmax_scale, target=target, trust_extra_nan_free=trust,
                                   cu_count=case.cu_count, plan=g.plan, workspace=ws, out=eager)
        out += compare_exact(f"{label}: replay output vs eager output", got, eager.cpu(), limit=3)
        out += _oracle_violations(label, got, step, views, target, g.plan, trust)
        if len(out) >= 6:
            break
    return out, g


def _graph_replay_examples(target: Target) -> list[fzg.GraphCase]:
    step = fzg.GraphStep
    base = fzg.GraphCase(seed=17, batch=3, heads=2, compress_ratio=128, max_main=4, max_extra=5, main_bs=5,
                         extra_bs=2, padded=True, invalid_rate=0.2, scale=0.11, sink="ordinary", q_transposed=True,
                         cu_count=4,
                         # capture at mid lengths with a wide source; replay empty, at the maximum, then fewer rows
                         capture=step(3, (2, 0, 4), (5, 1, 0), 3, 4),
                         replays=(step(2, (0, 0), (0, 0)), step(3, (4, 4, 4), (5, 5, 5)), step(1, (3,), (2,), 1, 0)))
    return [base,
            base.replace(seed=18, batch=2, heads=1, compress_ratio=0, max_extra=None, sink="none", q_transposed=False,
                         capture=step(2, (1, 3), None, 0), replays=(step(2, (4, 4), None), step(1, (0,), None, 2)))]


@contract("graph-replay-agreement", targets=ALL_TARGETS, cases=lambda t: fzg.graph_replay_cases(t),
          examples=_graph_replay_examples, min_cases=4, max_cases=6, case_type=fzg.GraphCase, numeric=True)
def graph_replay_agreement(case: fzg.GraphCase, target: Target) -> list[Violation]:
    """A captured decode replays exactly: frozen launches, stable pointers, eager-equal and oracle-close output.

    Capture (the subject's ``graph_capture.DecodeGraph``; ours: ``impl.graph_capture``) at one set of row lengths
    freezes the grid (batch, splits, head blocks), every host-side scalar and every buffer pointer; the dispatch is
    the capture one (adaptive splits only on gfx950, ratio 128, not SWA-only, where the host rule allows; the trust
    gate as the truth table says). Each replay (all rows empty, all at max_per_row with the source exactly the
    capacity, fewer rows than captured, sources wider than their NNZ whose extra entries point at poisoned slots)
    must: issue launches equal to the captured ones (emulation: compared launch by launch before each runs; a real
    CUDA graph on a GPU); keep every persistent buffer and the copied views at their captured base pointers; give an
    output bit-for-bit equal to an eager ``sparse_attn_decode`` with the same frozen plan on the same data (outputs
    and workspaces NaN-poisoned first); and agree with the float64 oracle within oracles.compare's error model (the
    margin: the worst error-to-tolerance ratio over every replay). Sources: SPEC 2 ("Adaptive splits",
    ``_copy_ragged_to_graph_buffers``); seed 004; torch.cuda.graphs' persistent-buffer rule.
    """
    got = run_graph_case(case, target)[0]
    if got and fzg.non_packed(case) and not any("refused" in v.message for v in got):
        return layout_violations(case, target) or got
    return got


def layout_violations(case: fzg.GraphCase, target: Target) -> list[Violation]:
    """Where ``case`` packed passes: a violation naming the first non-packed layout that alone (the others packed)
    makes a replay differ, with that run's first violation; [] where none alone does or the packed case fails
    too (as contracts.prefill.layout_violations)."""
    for dim, value in fzg.non_packed(case).items():
        alone = run_graph_case(fzg.packed_except(case, {dim: value}), target)[0]
        if alone:
            if run_graph_case(fzg.packed_except(case, {}), target)[0]:
                return []
            return [Violation(f"{LAYOUT_DIFFERS}: {dim}={value}", alone[0].where, alone[0].expected,
                              f"{alone[0].got} ({alone[0].message})")]
    return []
