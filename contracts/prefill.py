"""Sparse prefill contracts: the Triton kernel agrees with the float64 oracle, and the OPUS routing guard equals
SPEC 3's truth table while the entry hands OPUS exactly what the oracle expects (or runs Triton); the gfx942 AITER
``pa_prefill_sparse`` route (SPEC 10) likewise, and its failure (the op missing or raising) falls back to Triton."""
from __future__ import annotations

import contextlib
import math
import warnings
from unittest import mock

import torch

from contracts.core import ALL_TARGETS, Violation, contract, fmt
from contracts.decode import attention_violations, layout_refusal
from contracts.subjects import bound
from fuzz import prefill as fz
from impl.runtime import triton_mode
from impl.targets import Target
from oracles import prefill as ref_prefill


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A tensor's raw bits (NaN payloads included) as an integer tensor, for exact before/after comparisons."""
    t = t.detach().cpu()
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.view(torch.int16).clone()
    if t.dtype == torch.float32:
        return t.view(torch.int32).clone()
    return t.clone()


def _snapshot(inp: fz.PrefillInputs) -> dict:
    snap = {"q": inp.q, "kv buffer": inp.kv_buffer, "indices": inp.indices, "topk_length": inp.topk_length,
            "indptr": inp.indptr, "attn_sink": inp.attn_sink}
    return {k: _bits(v) for k, v in snap.items() if v is not None}


def _unchanged(before: dict, inp: fz.PrefillInputs) -> list[Violation]:
    now = {"q": inp.q, "kv buffer": inp.kv_buffer, "indices": inp.indices, "topk_length": inp.topk_length,
           "indptr": inp.indptr, "attn_sink": inp.attn_sink}
    out = []
    for k, b in before.items():
        a = _bits(now[k])
        if not torch.equal(a, b):
            out.append(Violation("prefill modified an input", k, "unchanged", f"{int((a != b).sum())} elements changed"))
    pad = inp.out_buffer[..., inp.out.shape[-1]:]
    if pad.numel() and not bool(torch.isnan(pad.detach().cpu().float()).all()):
        out.append(Violation("prefill wrote past the output's last dim", "out buffer padding", "all NaN (untouched)",
                             f"{int((~torch.isnan(pad.detach().cpu().float())).sum())} lanes written"))
    return out


def _reference(inp: fz.PrefillInputs) -> ref_prefill.PrefillReference:
    kw = dict(softmax_scale=inp.softmax_scale, attn_sink=inp.attn_sink, out_width=int(inp.out.shape[-1]))
    if inp.dense is not None:
        return ref_prefill.ref_sparse_attn_prefill(inp.q, inp.kv, dense=inp.dense, topk_length=inp.topk_list, **kw)
    return ref_prefill.ref_sparse_attn_prefill(inp.q, inp.kv, indices=inp.ragged, indptr=inp.indptr_list, **kw)


def _compare_with_oracle(got: torch.Tensor, inp: fz.PrefillInputs, label: str) -> list[Violation]:
    ref = _reference(inp)
    # oracles.compare's model for the input dtype (fp16: its unit and underflow floor), SPEC 3's BLOCK_K
    tol = ref_prefill.prefill_tolerance(ref, fz.dtype_name(inp.q.dtype), triton_mode(), int(inp.q.shape[-1]),
                                        fz.dtype_name(inp.out.dtype))
    return attention_violations(label, got, ref.out, tol)


def _run_entry(inp: fz.PrefillInputs, target: Target) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on inf - inf by design
        bound(target).prefill.sparse_attn_prefill(inp.q, inp.kv, inp.indices, inp.softmax_scale, inp.attn_sink,
                                                  inp.out, topk_length=inp.topk_length, indptr=inp.indptr,
                                                  target=target)


# --- prefill-oracle-agreement ------------------------------------------------------------------------------------

def _agreement_examples(target: Target) -> list[fz.PrefillCase]:
    base = fz.PrefillCase(seed=5, sq=3, heads=3, d=512, skv=9, mode="dense", width=8, lens=(8, 0, 3), topk_given=True,
                          topk_quirks=True, dense_3d=True, invalid_rate=0.2, int32_extremes=True, indptr_offset=0,
                          tail_junk=0, scale=0.0625, sink="mixed", out_width="full", out_padded=True,
                          q_layout="heads_major", kv_layout="3d", magnitude=1.0, dtype="bfloat16")
    return [base,
            base.replace(seed=6, d=576, mode="ragged", lens=(2, 3, 0), indptr_offset=3, tail_junk=2, sink="large",
                         out_width="nope", q_layout="strided", kv_layout="padded_rows"),
            base.replace(seed=7, d=576, topk_given=False, lens=(5, 1, 0), sink="-inf", kv_layout="strided_lanes",
                         scale=0.3),
            # fp16 under a dominating sink (outputs below fp16's range), 17 heads (two head blocks), rows of three
            # BLOCK_K tiles
            base.replace(seed=8, dtype="float16", sq=2, heads=17, skv=40, mode="ragged", width=36, lens=(36, 20),
                         indptr_offset=2, tail_junk=1, sink="large", q_layout="contiguous", kv_layout="2d",
                         scale=0.3),
            # an out of another float dtype, converted on store: fp32 from bf16 (dense, in place), bf16 from fp16
            # (ragged, past three tiles)
            base.replace(seed=9, out_dtype="float32", sink="ordinary"),
            base.replace(seed=10, dtype="float16", out_dtype="bfloat16", mode="ragged", skv=40, width=36,
                         lens=(36, 3, 0), indptr_offset=1, out_width="nope", q_layout="contiguous")]


@contract("prefill-oracle-agreement", targets=ALL_TARGETS, cases=lambda t: fz.prefill_cases(),
          examples=_agreement_examples, min_cases=5, case_type=fz.PrefillCase, numeric=True)
def prefill_oracle_agreement(case: fz.PrefillCase, target: Target) -> list[Violation]:
    """The sparse prefill equals the float64 oracle within the derived error model, NaN/inf masks exactly.

    One softmax per (row, head) over the row's valid entries plus the sink as a zero-value logit (-inf, ordinary,
    large, mixed sinks; none); V = K; an empty row gives 0; invalid entries (-1, -2, slots at or past skv, INT32
    extremes) are masked; dense rows keep only their first clamp(topk_length or count(idx >= 0), 0, k) entries and
    ragged rows only [indptr[r], indptr[r+1]) (ours reads each in its own kernel mode, upstream converts dense rows
    to ragged ones first: both are judged by the same oracle). Every kv row no valid entry reaches is NaN (dead rows, rows past the
    view, padding lanes), and every entry a correct kernel drops points at one, so a stray read shows. d is 448+64
    (one 512-lane tile) or 512+64 (NoPE and RoPE tiles); bf16 or fp16; rows of up to 40 entries (three BLOCK_K
    tiles: the online softmax rescales across them) and 17 heads (a second head block) in some cases; output d or
    nope wide, of q's dtype or another float dtype (bf16, fp16, fp32: converted on store); q, kv and out
    non-contiguous; a non-default scale. Inputs are not modified and nothing is written past
    out's last dim. Tolerance: oracles.prefill.prefill_tolerance - oracles.compare's model (relative to
    sum_j p_j |v_j|, dot length d, SPEC 3's BLOCK_K, the input dtype's unit for p and the output dtype's for the
    store, interpreter truncation for bf16) plus, for fp16 on either side, the underflow floor 2^-25 (1 + sum_j
    |v_j|); no fraction of lanes may fail; the margin is the worst
    error-to-tolerance ratio. Sources: SPEC 3 (Triton fallback), seed 003, upstream's prefill ragged-kernel test.

    Layouts (issue 30): q, kv, the indices (and indptr), topk_length, the sink and out each come packed or as a
    slice, padded, strided, transposed or heads-major view of a poisoned buffer (fuzz.prefill's ``*_LAYOUTS``), the
    values the same, so the oracle's answer is the same. A layout the entry may refuse (a strided ragged index list,
    a strided sink: fuzz.prefill.MAY_REFUSE) is computed the same or refused with a ValueError/TypeError naming the
    argument, out's buffer still all NaN and every input unchanged; refusing any other layout is a violation. A
    mismatch of a case whose packed twin passes is reported as the layouts that alone make it differ
    (LAYOUT_DIFFERS). Absolute regimes (fuzz.prefill.LOGIT_REGIMES): every live logit near -110 (below fp32 exp's
    underflow), exact ties everywhere, q all signed zeros, each against every sink kind (a large sink dominating,
    -inf vanishing).
    """
    got = _agreement_once(case, target)
    if got and fz.non_packed(case) and not any(v.message.startswith("prefill refused") for v in got):
        return layout_violations(case, target) or got
    return got


def _agreement_once(case: fz.PrefillCase, target: Target) -> list[Violation]:
    inp = fz.build_prefill_inputs(case)
    before = _snapshot(inp)
    try:
        _run_entry(inp, target)
    except (ValueError, TypeError) as e:
        return refusal_violations(case, e, inp) + _unchanged(before, inp)
    got = inp.out.detach().cpu().clone()
    out = _unchanged(before, inp)
    out += _compare_with_oracle(got, inp, f"prefill output vs float64 oracle (d={case.d}, {case.mode})")
    return out


#: a prefill that computes differently when an input is laid out other than packed (finding signatures match it)
LAYOUT_DIFFERS = "prefill output with a non-packed layout differs from the same inputs packed"


def layout_violations(case: fz.PrefillCase, target: Target, once=None,
                      message: str = LAYOUT_DIFFERS) -> list[Violation]:
    """Where ``case`` packed passes: a violation naming the first non-packed layout (in fuzz.prefill.PACKED's
    order) that alone (the others packed) makes the result differ, with that run's first violation; [] where no
    single layout does or the packed case fails too. One layout is named, not every one: a subject that ignores
    several strides shows the next once the first is fixed, and each further run costs a kernel launch per case
    the shrinker tries. ``once(inputs) -> violations`` is the check rerun (default: the agreement check; the
    routing contracts pass theirs, with ``message`` theirs)."""
    once = once or (lambda c: _agreement_once(c, target))
    for dim, value in fz.non_packed(case).items():
        alone = once(fz.packed_except(case, {dim: value}))
        if alone:
            if once(fz.packed_except(case, {})):
                return []
            return [Violation(f"{message}: {dim}={value}", alone[0].where, alone[0].expected,
                              f"{alone[0].got} ({alone[0].message})")]
    return []


#: a refusal must be of a layout the entry may refuse, name the argument and write nothing
REFUSED_ACCEPTED_LAYOUT = "prefill refused a layout it must accept"
REFUSAL_UNNAMED = "prefill refused a layout without naming the argument"
REFUSAL_WROTE = "prefill refused a layout but wrote its output first"


def refusal_violations(case: fz.PrefillCase, err: Exception, inp: fz.PrefillInputs) -> list[Violation]:
    """A prefill that raised: fine only for a layout it may refuse (fuzz.prefill.refusable), naming one of that
    layout's arguments, with out's whole buffer still NaN (the inputs are compared by the caller)."""
    written = int((~torch.isnan(inp.out_buffer.detach().cpu().float())).sum())
    return layout_refusal((REFUSED_ACCEPTED_LAYOUT, REFUSAL_UNNAMED, REFUSAL_WROTE), f"layouts {fz.non_packed(case)}",
                          fz.refusable(case), err, [("out", written)])


#: a routing contract's mismatch that packing one layout alone removes (see layout_violations)
ROUTING_LAYOUT_DIFFERS = "prefill routing with a non-packed layout differs from the same inputs packed"
#: a refusal must come before any guard is asked, op called or kernel launched
REFUSAL_AFTER_ROUTING = "prefill refused a layout after routing it"


def routed_refusal(case: fz.PrefillCase, rec: dict, inp: fz.PrefillInputs, where: str) -> list[Violation]:
    """A routed call that refused (``rec["refused"]``): judged as :func:`refusal_violations` does, and the refusal
    must come before the guards were asked, an op called or Triton launched (the validation precedes routing)."""
    err = rec["refused"]
    v = refusal_violations(case, err, inp)
    calls = {"guard asks": len(rec["guard"]), "op calls": len(rec["op"]), "Triton launches": rec["triton"]}
    if any(calls.values()):
        v.append(Violation(REFUSAL_AFTER_ROUTING, where, f"{type(err).__name__} before any guard, op or launch",
                           ", ".join(f"{n} {k}" for k, n in calls.items())))
    return v


def _diagnosed(check, inputs: fz.PrefillCase, target: Target) -> list[Violation]:
    """``check(inputs)``; violations of non-packed inputs that the packed twin does not show, and that one layout
    alone (the others packed) brings, are replaced by one naming that layout (as prefill-oracle-agreement names its
    own), the packed twin's own violations (a subject's route failing whatever the layout) kept as they are; a
    refusal is reported as it is. Reruns happen only on a failure."""
    got = check(inputs)
    if not got or not fz.non_packed(inputs) or any(x.message.startswith("prefill refused") for x in got):
        return got
    shared = {x.message for x in check(fz.packed_except(inputs, {}))}
    if all(x.message in shared for x in got):
        return got
    for dim, value in fz.non_packed(inputs).items():
        alone = [x for x in check(fz.packed_except(inputs, {dim: value})) if x.message not in shared]
        if alone:
            return [x for x in got if x.message in shared] + [
                Violation(f"{ROUTING_LAYOUT_DIFFERS}: {dim}={value}", alone[0].where, alone[0].expected,
                          f"{alone[0].got} ({alone[0].message})")]
    return got


# --- opus-routing-guard ------------------------------------------------------------------------------------------

#: what the fake OPUS op writes (exact in bf16), so a routed call is told apart from the Triton result
OPUS_SENTINEL = 0.375


def _guard_violations(gcase: fz.GuardCase, target: Target) -> list[Violation]:
    # the single perturbations this host can fake (a second GPU only where one exists: fz.guard_gpus)
    configs = [[]] + [[p] for p in fz.guard_perturbations()] + [list(c) for c in gcase.combos]
    guard = bound(target).prefill.can_use_aiter_sparse_prefill_opus
    def judge(perts):
        q, kv, sink, o = fz.guard_tensors(gcase, perts)
        attrs = fz.tensor_attributes(target.name, q, kv, sink, o)
        return guard(q, kv, sink, o, target=target), attrs, ref_prefill.opus_guard_failures(attrs)

    return _guard_table("OPUS guard differs from SPEC 3's truth table", configs, judge, target)


def _guard_table(what: str, configs, judge, target: Target) -> list[Violation]:
    """A guard against its truth table: for each perturbation set, ``judge(perts)`` gives the guard's answer, the
    tensors' attributes and the oracle's broken conditions; the guard must be true exactly when none is broken."""
    out = []
    for perts in configs:
        got, attrs, fails = judge(perts)
        want = not fails
        if got is not want:
            out.append(Violation(what, f"{target.name}, sq={attrs['q_shape'][0]}, perturbations={perts}",
                                 f"{want} (broken: {', '.join(fails) or 'none'})", fmt(got)))
    return out


def _expected_ragged(inp: fz.PrefillInputs) -> tuple[list[int], list[int]]:
    skv = int(inp.kv.shape[0])
    if inp.dense is not None:
        idx, ptr = ref_prefill.ref_dense_to_ragged(inp.dense, inp.topk_list, skv)
    else:
        idx, ptr = inp.ragged, inp.indptr_list
    return ref_prefill.ref_opus_ragged(list(idx), list(ptr), skv)


def _row_pointer_violation(op: str, idx: list[int], ptr: list[int], sq: int, where: str) -> list[Violation]:
    """A CSR row pointer over ``idx`` for ``sq`` rows: ``sq + 1`` entries, non-decreasing, within [0, len(idx)]."""
    if len(ptr) != sq + 1 or ptr[0] < 0 or ptr[-1] > len(idx) or any(a > b for a, b in zip(ptr, ptr[1:])):
        return [Violation(f"{op} indptr is not a row pointer over its indices", where,
                          f"[{sq + 1}] non-decreasing within [0, {len(idx)}]", fmt(ptr))]
    return []


def _check_op_ragged(idx: list[int], ptr: list[int], inp: fz.PrefillInputs, where: str) -> list[Violation]:
    """OPUS's (indices, indptr) must be the oracle's conversion exactly: each row's valid entries in order, packed
    from 0. Told apart, so that each way of missing it has its own message: a pointer that is no CSR row pointer;
    entries that are not kv rows (AITER requires every index to be one); rows whose valid entries differ; a list
    not packed (indptr[0] != 0, or entries past the last row). All four hold exactly when both lists equal the
    oracle's."""
    sq, skv = int(inp.q.shape[0]), int(inp.kv.shape[0])
    want_idx, want_ptr = _expected_ragged(inp)
    bad_ptr = _row_pointer_violation("OPUS", idx, ptr, sq, where)
    if bad_ptr:
        return bad_ptr
    rows = [idx[ptr[r]:ptr[r + 1]] for r in range(sq)]
    want_rows = [want_idx[want_ptr[r]:want_ptr[r + 1]] for r in range(sq)]
    v = []
    bad = sorted({s for row in rows for s in row if not 0 <= s < skv})
    if bad:
        v.append(Violation("OPUS handed entries that are not kv rows", where, f"every entry in [0, {skv})",
                           fmt(bad)))
    kept = [[s for s in row if 0 <= s < skv] for row in rows]
    if kept != want_rows:
        v.append(Violation("OPUS rows differ from the oracle's dense->ragged conversion", where, fmt(want_rows),
                           fmt(kept)))
    if ptr[0] != 0 or len(idx) != ptr[-1]:
        v.append(Violation("OPUS ragged list not packed from 0", where,
                           f"indptr[0] = 0 and {ptr[-1] - ptr[0]} indices",
                           f"indptr[0] = {ptr[0]} and {len(idx)} indices"))
    return v


def _check_call_head(op: str, signature: str, args, kw, inp: fz.PrefillInputs, where: str):
    """What both AITER prefill ops' calls share: nine positional arguments and ``out=``, the caller's q as it is and
    its kv as ``[skv, d]``. Returns the violations and the nine arguments (None when their count is wrong)."""
    sq, h, d = (int(x) for x in inp.q.shape)
    skv = int(inp.kv.shape[0])
    if len(args) != 9 or set(kw) != {"out"}:
        return [Violation(f"{op} called with the wrong arguments", where, signature,
                          f"{len(args)} positional, keywords {sorted(kw)}")], None
    v: list[Violation] = []
    q_, kv_ = args[0], args[1]
    if q_.data_ptr() != inp.q.data_ptr() or tuple(q_.stride()) != tuple(inp.q.stride()):
        v.append(Violation(f"{op} got a different q", where, "the caller's q", "another tensor"))
    if kv_.dim() != 2 or tuple(kv_.shape) != (skv, d) or kv_.data_ptr() != inp.kv.data_ptr():
        v.append(Violation(f"{op} kv is not the caller's kv as [skv, d]", where, f"[{skv}, {d}] view",
                           f"{list(kv_.shape)}"))
    return v, args


def _check_op_call(args, kw, inp: fz.PrefillInputs, where: str) -> list[Violation]:
    sq, h, d = (int(x) for x in inp.q.shape)
    v, args = _check_call_head(
        "OPUS", "(q, kv, indices, indptr, extend_kv, extend_indices, extend_indptr, sink, scale, out=)", args, kw,
        inp, where)
    if args is None:
        return v
    _, _, idx, ptr, ekv, eidx, eptr, sink, scale = args
    for name, t in (("indices", idx), ("indptr", ptr)):
        if t.dtype != torch.int32:
            v.append(Violation(f"OPUS {name} not int32", where, "int32", str(t.dtype)))
    v += _check_op_ragged(idx.detach().cpu().reshape(-1).tolist(), ptr.detach().cpu().reshape(-1).tolist(), inp,
                          where)
    if ekv.dim() != 2 or ekv.shape[-1] != d or ekv.dtype != inp.q.dtype:
        v.append(Violation("OPUS second-segment kv placeholder malformed", where, f"[n, {d}] {inp.q.dtype}",
                           f"{list(ekv.shape)} {ekv.dtype}"))
    if eidx.numel() != 0 or eidx.dtype != torch.int32:
        v.append(Violation("OPUS second segment not empty", where, "0 int32 indices",
                           f"{eidx.numel()} {eidx.dtype}"))
    if eptr.dtype != torch.int32 or tuple(eptr.shape) != (sq + 1,) or bool(eptr.detach().cpu().ne(0).any()):
        v.append(Violation("OPUS second-segment indptr not all zero", where, f"int32 zeros [{sq + 1}]",
                           fmt(eptr)))
    want_sink = inp.attn_sink[:h].detach().cpu()
    if sink is None or sink.dtype != torch.float32 or tuple(sink.shape) != (h,) \
            or not torch.equal(sink.detach().cpu(), want_sink):
        v.append(Violation("OPUS sink is not attn_sink[:h] in fp32", where, fmt(want_sink), fmt(sink)))
    if not isinstance(scale, float) or scale != inp.softmax_scale:
        v.append(Violation("OPUS softmax scale", where, fmt(inp.softmax_scale), fmt(scale)))
    if kw["out"].data_ptr() != inp.out.data_ptr():
        v.append(Violation("OPUS did not get the caller's out", where, "out", "another tensor"))
    return v


def _route(inp: fz.PrefillInputs, target: Target, guard_says: bool, op_kind: str | None) -> dict:
    """Run the entry with the guard answering ``guard_says`` and the loader returning a fake op (``ok``: writes the
    sentinel; ``raises``: writes NaN then reports failure) or None. Records every call."""
    rec = {"guard": [], "op": [], "triton": 0, "raised": None, "escaped": None, "refused": None}
    fam = bound(target).prefill
    triton_impl = fam.sparse_attn_prefill_triton

    def fake_guard(q, kv, attn_sink, out, *, target=None):
        rec["guard"].append((q, kv, attn_sink, out, target))
        return guard_says

    def fake_op(*args, **kw):
        rec["op"].append((args, kw))
        if op_kind == "raises":
            kw["out"].fill_(math.nan)
            rec["raised"] = RuntimeError("fake OPUS: unsupported configuration")
            raise rec["raised"]
        kw["out"].fill_(OPUS_SENTINEL)
        return kw["out"]

    def counting_triton(*args, **kw):
        rec["triton"] += 1
        return triton_impl(*args, **kw)

    # the subject's seams (for ours: impl.prefill's module-level names, which its entry looks up at call time)
    with mock.patch.object(fam, "can_use_aiter_sparse_prefill_opus", fake_guard), \
            mock.patch.object(fam, "get_aiter_sparse_prefill_opus", lambda: None if op_kind is None else fake_op), \
            mock.patch.object(fam, "sparse_attn_prefill_triton", counting_triton):
        try:
            _run_entry(inp, target)
        except (RuntimeError, ValueError, TypeError) as exc:
            if exc is rec["raised"]:
                rec["escaped"] = exc  # the entry let the fake op's failure through
            elif isinstance(exc, (ValueError, TypeError)):
                rec["refused"] = exc  # a refusal of the arguments (judged by routed_refusal)
            else:
                raise
    return rec


def _check_guard_args(rec: dict, inp: fz.PrefillInputs, target: Target, where: str) -> list[Violation]:
    if len(rec["guard"]) != 1:
        return [Violation("the entry did not ask the guard exactly once", where, "1 call", str(len(rec["guard"])))]
    q, kv, sink, out, t = rec["guard"][0]
    h, d = int(inp.q.shape[1]), int(inp.q.shape[2])
    v = []
    if q.data_ptr() != inp.q.data_ptr():
        v.append(Violation("guard asked about another q", where, "the caller's q", "another tensor"))
    if kv.dim() != 2 or kv.shape[-1] != d or kv.data_ptr() != inp.kv.data_ptr():
        v.append(Violation("guard asked about kv not as [skv, d]", where, f"[skv, {d}]", fmt(list(kv.shape))))
    if sink is None or tuple(sink.shape) != (h,):
        v.append(Violation("guard asked about a sink not sliced to h heads", where, f"({h},)",
                           "None" if sink is None else fmt(tuple(sink.shape))))
    if out.data_ptr() != inp.out.data_ptr():
        v.append(Violation("guard asked about another out", where, "the caller's out", "another tensor"))
    if t is not target and getattr(t, "name", t) != target.name:
        v.append(Violation("guard asked about another target", where, target.name, fmt(t)))
    return v


def _routing_violations(case: fz.RoutingCase, target: Target) -> list[Violation]:
    return _diagnosed(lambda inputs: _routing_once(case.replace(inputs=inputs), target), case.inputs, target)


def _routing_once(case: fz.RoutingCase, target: Target) -> list[Violation]:
    inp = fz.build_prefill_inputs(case.inputs)
    before = _snapshot(inp)
    v: list[Violation] = []
    # routed: OPUS gets the oracle's ragged indices and an empty second segment; Triton stays idle
    where = "guard true, OPUS present and succeeding"
    rec = _route(inp, target, True, "ok")
    if rec["refused"] is not None:  # (a layout the entry may refuse: nothing routed, nothing written)
        return routed_refusal(case.inputs, rec, inp, where) + _unchanged(before, inp)
    v += _check_guard_args(rec, inp, target, where)
    if len(rec["op"]) != 1 or rec["triton"] != 0:
        v.append(Violation("routing when the guard holds and OPUS exists", where, "1 OPUS call, 0 Triton launches",
                           f"{len(rec['op'])} OPUS calls, {rec['triton']} Triton launches"))
    for args, kw in rec["op"][:1]:
        v += _check_op_call(args, kw, inp, where)
    got = inp.out.detach().cpu().float()
    if len(rec["op"]) == 1 and not bool((got == OPUS_SENTINEL).all()):
        v.append(Violation("the OPUS result was not returned as is", where, f"all {OPUS_SENTINEL}",
                           f"{int((got != OPUS_SENTINEL).sum())} lanes differ"))
    # not routed (guard false, no op) or OPUS reporting failure: the Triton path runs and its result stands
    scenario = case.fallback
    inp.out_buffer.fill_(math.nan)
    guard_says = scenario != "guard_false"
    op_kind = None if scenario == "no_op" else ("raises" if scenario == "op_raises" else "ok")
    where = {"guard_false": "guard false", "no_op": "guard true, no OPUS op",
             "op_raises": "guard true, OPUS reports failure"}[scenario]
    rec = _route(inp, target, guard_says, op_kind)
    if rec["refused"] is not None:
        return v + routed_refusal(case.inputs, rec, inp, where) + _unchanged(before, inp)
    want_op = 1 if scenario == "op_raises" else 0
    for args, kw in rec["op"][:1]:
        v += _check_op_call(args, kw, inp, where)
    if rec["escaped"] is not None:
        # no result to compare: the caller got OPUS's exception instead of the Triton fallback's output
        v.append(Violation("the OPUS failure escaped the entry instead of falling back to Triton", where,
                           "the failure caught, 1 Triton launch",
                           f"{type(rec['escaped']).__name__}: {rec['escaped']} ({rec['triton']} Triton launches)"))
    else:
        if len(rec["op"]) != want_op or rec["triton"] != 1:
            v.append(Violation("fallback routing", where, f"{want_op} OPUS calls, 1 Triton launch",
                               f"{len(rec['op'])} OPUS calls, {rec['triton']} Triton launches"))
        v += _compare_with_oracle(inp.out.detach().cpu().clone(), inp,
                                  f"Triton fallback ({where}) vs float64 oracle")
    v += _unchanged(before, inp)
    return v


def _routing_examples(target: Target) -> list[fz.RoutingCase]:
    inputs = fz.PrefillCase(seed=21, sq=3, heads=2, d=512, skv=8, mode="dense", width=6, lens=(2, 6, 0),
                            topk_given=True, topk_quirks=True, dense_3d=False, invalid_rate=0.2, int32_extremes=False,
                            indptr_offset=0, tail_junk=0, scale=0.11, sink="ordinary", out_width="full",
                            out_padded=False, q_layout="contiguous", kv_layout="3d", magnitude=1.0, dtype="bfloat16")
    guard = fz.GuardCase(sq=1024, heads=16, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())
    return [fz.RoutingCase(inputs=inputs, fallback="op_raises", guard=guard),
            fz.RoutingCase(inputs=inputs.replace(seed=22, mode="ragged", indptr_offset=3, tail_junk=2, d=576),
                           fallback="guard_false", guard=guard.replace(sq=1023, d=576, dtype="float16"))]


@contract("opus-routing-guard", targets=ALL_TARGETS, cases=lambda t: fz.routing_cases(),
          examples=_routing_examples, min_cases=5, case_type=fz.RoutingCase, numeric=True)
def opus_routing_guard(case: fz.RoutingCase, target: Target) -> list[Violation]:
    """The OPUS guard equals SPEC 3's truth table, and the entry routes by it.

    Guard: for a drawn configuration (sq around 1023/1024, heads, d, bf16/fp16, GPU index) the guard is evaluated
    on fake tensors for the eligible base, for every single perturbation that flips one condition or keeps
    eligibility (sq 1/1023/1024/1025, fp32 q, kv/out dtype, CPU or other-GPU q/kv/out/sink, heads-major and
    last-dim-strided q, strided or padded kv, out strides != q strides, nope-wide out, narrow kv, sink None,
    padded, short, 2-D, bf16, fp64) and for drawn combinations; each answer must equal
    oracles.prefill.opus_guard_expected (false on every target but gfx950). A second GPU is named only where the
    fake mode can name one: without CUDA (fakes are metadata only) and on a host with two or more CUDA devices; on a
    host with one CUDA device the configurations on another GPU (gpu cuda:1; kv, out or sink on another GPU) are
    left out, because a fake CUDA tensor initialises the device it names and cuda:1 fails there with "invalid
    device ordinal" (fuzz.prefill.guard_gpus).
    Routing: on tiny real inputs, with the guard answering true and a fake OPUS op, the op is called once with
    q, kv as [skv, d], int32 ragged indices/indptr equal to the oracle's dense->ragged conversion with the masked
    entries removed (AITER requires every index it gets to be a valid row), an empty second segment (0 indices, all-zero indptr [sq+1]), attn_sink[:h], the scale and
    the caller's out, and its result stands (no Triton launch). With the guard false, no op, or the op reporting
    failure, the Triton kernel runs once and its output agrees with the float64 oracle (its margin: the worst
    error-to-tolerance ratio). Sources: SPEC 3 (OPUS
    guard), seed 003 (strict guard, silent Triton fallback, upstream's monkeypatched routing tests).
    """
    return _guard_violations(case.guard, target) + _routing_violations(case, target)


# --- the gfx942 AITER pa_prefill_sparse route (SPEC 10): aiter-prefill-routing, aiter-prefill-fallback ------------

#: the lanes the fake pa_prefill_sparse writes: k / 256 for k = (37 lane + 7 r + 3 h) mod 251, exact in bf16, fp16
#: and fp32 (k < 256 needs 8 significant bits) and shifted by a nonzero amount under any lane shift short of 251 (the
#: prime modulus: a NoPE slice taken 64 lanes off, say, differs in every lane), so a routed result is told apart
#: from the Triton one and a copy that takes the wrong lanes, rows or heads shows
PA_PATTERN_MODULUS = 251

#: what a failing fake op raises (AITER's pa_prefill_sparse builds raise each of these for what they cannot serve)
_PA_FAILURES = {"RuntimeError": RuntimeError, "AssertionError": AssertionError, "TypeError": TypeError,
                "NotImplementedError": NotImplementedError}


def _pa_pattern(sq: int, h: int, d: int, dtype: torch.dtype, device) -> torch.Tensor:
    r = torch.arange(sq).view(sq, 1, 1)
    hh = torch.arange(h).view(1, h, 1)
    lane = torch.arange(d).view(1, 1, d)
    return (((37 * lane + 7 * r + 3 * hh) % PA_PATTERN_MODULUS).to(torch.float32) / 256).to(dtype=dtype,
                                                                                          device=device)


def _aiter_guard_violations(gcase: fz.AiterGuardCase, target: Target) -> list[Violation]:
    configs = [[]] + [[p] for p in fz.AITER_GUARD_PERTURBATIONS] + [list(c) for c in gcase.combos]
    guard = bound(target).prefill.can_use_aiter_pa_prefill_sparse
    def judge(perts):
        q, kv = fz.aiter_guard_tensors(gcase, perts)
        attrs = fz.aiter_guard_attributes(target.name, q, kv)
        return guard(q, kv, target=target), attrs, ref_prefill.aiter_pa_guard_failures(attrs)

    return _guard_table("gfx942 AITER guard differs from SPEC 10's truth table", configs, judge, target)


def _pa_expected_rows(inp: fz.PrefillInputs) -> list[list[int]]:
    skv = int(inp.kv.shape[0])
    if inp.dense is not None:
        return ref_prefill.ref_aiter_pa_rows(skv, dense=inp.dense, topk_length=inp.topk_list)
    return ref_prefill.ref_aiter_pa_rows(skv, indices=inp.ragged, indptr=inp.indptr_list)


def _check_pa_call(args, kw, inp: fz.PrefillInputs, where: str) -> list[Violation]:
    """``pa_prefill_sparse(q, kv [skv, d], indices, indptr, None, None, None, sink, scale, out=)`` as SPEC 10 and
    AITER's signature have it: the caller's q and kv, int32 1-D index lists whose rows ([indptr[r], indptr[r+1]),
    what the op reads) are SPEC 10's (``oracles.prefill.ref_aiter_pa_rows``), no extend source, attn_sink[:h]
    (None without a sink), the scale, and ``out`` None or the caller's out where AITER accepts it (contiguous, q's
    shape and dtype). The list need not be packed (AITER's gfx942 kernel reads through indptr only)."""
    sq, h, d = (int(x) for x in inp.q.shape)
    v, args = _check_call_head(
        "pa_prefill_sparse", "(q, kv, indices, indptr, kv_extend, indices_extend, indptr_extend, sink, scale, out=)",
        args, kw, inp, where)
    if args is None:
        return v
    _, _, idx, ptr, ekv, eidx, eptr, sink, scale = args
    for name, t in (("indices", idx), ("indptr", ptr)):
        if t.dtype != torch.int32 or t.dim() != 1:
            v.append(Violation(f"pa_prefill_sparse {name} not int32 1-D", where, "int32 [n]",
                               f"{t.dtype} {list(t.shape)}"))
    idx_l, ptr_l = idx.detach().cpu().reshape(-1).tolist(), ptr.detach().cpu().reshape(-1).tolist()
    bad_ptr = _row_pointer_violation("pa_prefill_sparse", idx_l, ptr_l, sq, where)
    v += bad_ptr
    if not bad_ptr:
        rows = [idx_l[ptr_l[r]:ptr_l[r + 1]] for r in range(sq)]
        want = _pa_expected_rows(inp)
        if rows != want:
            v.append(Violation("pa_prefill_sparse rows differ from SPEC 10's (dense rows converted to their valid "
                               "entries, ragged rows as given)", where, fmt(want), fmt(rows)))
    if ekv is not None or eidx is not None or eptr is not None:
        v.append(Violation("pa_prefill_sparse given an extend source", where, "None, None, None",
                           fmt([None if t is None else list(t.shape) for t in (ekv, eidx, eptr)])))
    if inp.attn_sink is None:
        if sink is not None:
            v.append(Violation("pa_prefill_sparse given a sink the caller did not pass", where, "None", fmt(sink)))
    else:
        want_sink = inp.attn_sink[:h].detach().cpu()
        if sink is None or sink.dtype != torch.float32 or tuple(sink.shape) != (h,) \
                or not torch.equal(sink.detach().cpu(), want_sink):
            v.append(Violation("pa_prefill_sparse sink is not attn_sink[:h] in fp32", where, fmt(want_sink),
                               fmt(sink)))
    if not isinstance(scale, float) or scale != inp.softmax_scale:
        v.append(Violation("pa_prefill_sparse softmax scale", where, fmt(inp.softmax_scale), fmt(scale)))
    out = kw["out"]
    if out is not None:
        if out.data_ptr() != inp.out.data_ptr():
            v.append(Violation("pa_prefill_sparse got an out that is not the caller's", where, "None or out",
                               "another tensor"))
        elif tuple(out.shape) != tuple(inp.q.shape) or out.dtype != inp.q.dtype or not out.is_contiguous():
            v.append(Violation("pa_prefill_sparse handed an out it does not accept", where,
                               f"contiguous {list(inp.q.shape)} {inp.q.dtype} (else None and a copy)",
                               f"{list(out.shape)} {out.dtype} strides {tuple(out.stride())}"))
    return v


def _route_pa(inp: fz.PrefillInputs, target: Target, guard_says: bool | None, op_kind: str | None,
              failure: str = "RuntimeError", launch_triton: bool = True) -> dict:
    """Run the entry with the OPUS guard false, the gfx942 guard answering ``guard_says`` (None: the subject's own
    guard decides) and its loader returning a fake op (``ok``: writes the pattern, in place when handed ``out``;
    ``raises``: writes NaN into a given out, then raises ``failure``) or None. Records every call; with
    ``launch_triton`` False a Triton launch is counted but not run (out keeps what it held)."""
    rec = {"guard": [], "op": [], "triton": 0, "raised": None, "escaped": None, "refused": None}
    fam = bound(target).prefill
    triton_impl = fam.sparse_attn_prefill_triton

    def fake_guard(q, kv, *, target=None):
        rec["guard"].append((q, kv, target))
        return guard_says

    def fake_op(*args, **kw):
        rec["op"].append((args, kw))
        out = kw.get("out")
        if op_kind == "raises":
            if out is not None:
                out.fill_(math.nan)
            rec["raised"] = _PA_FAILURES[failure](f"fake pa_prefill_sparse: {failure}")
            raise rec["raised"]
        q = args[0]
        res = _pa_pattern(*(int(x) for x in q.shape), q.dtype, q.device)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def counting_triton(*args, **kw):
        rec["triton"] += 1
        return triton_impl(*args, **kw) if launch_triton else None

    patches = [mock.patch.object(fam, "can_use_aiter_sparse_prefill_opus", lambda *a, **k: False),
               mock.patch.object(fam, "get_aiter_pa_prefill_sparse", lambda: None if op_kind is None else fake_op),
               mock.patch.object(fam, "sparse_attn_prefill_triton", counting_triton)]
    if guard_says is not None:
        patches.append(mock.patch.object(fam, "can_use_aiter_pa_prefill_sparse", fake_guard))
    with contextlib.ExitStack() as stack:
        for p in patches:
            stack.enter_context(p)
        try:
            _run_entry(inp, target)
        except Exception as exc:
            if exc is rec["raised"] or (op_kind is None and isinstance(exc, ImportError)):
                rec["escaped"] = exc  # the entry let the op's failure (or its missing module) through
            elif isinstance(exc, (ValueError, TypeError)):
                rec["refused"] = exc  # a refusal of the arguments (judged by routed_refusal)
            else:
                raise
    return rec


def _check_pa_guard_args(rec: dict, inp: fz.PrefillInputs, target: Target, where: str) -> list[Violation]:
    if len(rec["guard"]) != 1:
        return [Violation("the entry did not ask the gfx942 AITER guard exactly once", where, "1 call",
                          str(len(rec["guard"])))]
    q, kv, t = rec["guard"][0]
    v = []
    if q.data_ptr() != inp.q.data_ptr() or tuple(q.shape) != tuple(inp.q.shape):
        v.append(Violation("gfx942 AITER guard asked about another q", where, "the caller's q", "another tensor"))
    if kv.data_ptr() != inp.kv.data_ptr() or kv.shape[-1] != inp.q.shape[-1] or kv.dtype != inp.kv.dtype:
        v.append(Violation("gfx942 AITER guard asked about another kv", where, "the caller's kv",
                           fmt(list(kv.shape))))
    if t is not target and getattr(t, "name", t) != target.name:
        v.append(Violation("gfx942 AITER guard asked about another target", where, target.name, fmt(t)))
    return v


def _check_pa_routed(rec: dict, inp: fz.PrefillInputs, where: str) -> list[Violation]:
    """One op call with SPEC 10's arguments, no Triton launch, and the op's result in out (all lanes, converted)."""
    v = []
    if len(rec["op"]) != 1 or rec["triton"] != 0 or rec["escaped"] is not None:
        v.append(Violation("routing when the gfx942 AITER guard holds and the op exists", where,
                           "1 pa_prefill_sparse call, 0 Triton launches",
                           f"{len(rec['op'])} op calls, {rec['triton']} Triton launches"
                           + (f", {type(rec['escaped']).__name__} escaped" if rec["escaped"] is not None else "")))
    for args, kw in rec["op"][:1]:
        v += _check_pa_call(args, kw, inp, where)
    if len(rec["op"]) == 1 and rec["escaped"] is None:
        sq, h, d = (int(x) for x in inp.q.shape)
        want = _pa_pattern(sq, h, d, inp.q.dtype, "cpu")[..., :inp.out.shape[-1]].to(inp.out.dtype)
        got = inp.out.detach().cpu()
        same = (got == want) | (torch.isnan(got) & torch.isnan(want))
        if not bool(same.all()):
            v.append(Violation("the pa_prefill_sparse result was not returned as is", where,
                               "out = the op's result (its first out-width lanes, in out's dtype)",
                               f"{int((~same).sum())} of {same.numel()} lanes differ"))
    return v


def _check_unrouted(rec: dict, inp: fz.PrefillInputs, want_op: int, where: str) -> list[Violation]:
    """The Triton kernel ran once (after ``want_op`` failed op calls) and its result agrees with the oracle; an op
    failure that escaped the entry is a violation of its own."""
    v = []
    for args, kw in rec["op"][:1]:
        v += _check_pa_call(args, kw, inp, where)
    if rec["escaped"] is not None:
        v.append(Violation("the AITER pa_prefill_sparse failure escaped the entry instead of falling back to Triton",
                           where, "the failure caught, 1 Triton launch",
                           f"{type(rec['escaped']).__name__}: {rec['escaped']} ({rec['triton']} Triton launches)"))
        return v
    if len(rec["op"]) != want_op or rec["triton"] != 1:
        v.append(Violation("gfx942 AITER fallback routing", where, f"{want_op} op calls, 1 Triton launch",
                           f"{len(rec['op'])} op calls, {rec['triton']} Triton launches"))
    v += _compare_with_oracle(inp.out.detach().cpu().clone(), inp, f"Triton fallback ({where}) vs float64 oracle")
    return v


def _pa_guard_says(inp: fz.PrefillInputs, target: Target) -> bool:
    return ref_prefill.aiter_pa_guard_expected(fz.aiter_guard_attributes(target.name, inp.q, inp.kv))


def _aiter_routing_examples(target: Target) -> list[fz.AiterRoutingCase]:
    inputs = fz.PrefillCase(seed=31, sq=3, heads=2, d=512, skv=8, mode="dense", width=6, lens=(2, 6, 0),
                            topk_given=True, topk_quirks=True, dense_3d=True, invalid_rate=0.2, int32_extremes=True,
                            indptr_offset=0, tail_junk=0, scale=0.11, sink="ordinary", out_width="nope",
                            out_padded=False, q_layout="contiguous", kv_layout="3d", magnitude=1.0, dtype="bfloat16")
    guard = fz.AiterGuardCase(sq=512, heads=16, d=512, dtype="bfloat16", gpu="cuda:0", skv=7, combos=())
    large = target.aiter_pa_prefill_sparse_min_queries is not None
    return [fz.AiterRoutingCase(inputs=inputs, guard=guard, large=large),
            # a caller's ragged list with an offset, junk and invalid entries; a full-width out written in place
            fz.AiterRoutingCase(inputs=inputs.replace(seed=32, mode="ragged", indptr_offset=3, tail_junk=2, d=576,
                                                      out_width="full", sink="none", dtype="float16"),
                                guard=guard.replace(sq=511, d=576, dtype="float16"), large=large)]


@contract("aiter-prefill-routing", targets=ALL_TARGETS, cases=lambda t: fz.aiter_routing_cases(t),
          examples=_aiter_routing_examples, min_cases=5, case_type=fz.AiterRoutingCase, numeric=True)
def aiter_prefill_routing(case: fz.AiterRoutingCase, target: Target) -> list[Violation]:
    """The gfx942 AITER ``pa_prefill_sparse`` guard equals SPEC 10's truth table, and the entry routes by it.

    Guard: for a drawn configuration (sq around 511/512/513, 1-64 heads, d, bf16/fp16) the guard is evaluated on
    fake tensors for the base, for every single perturbation (sq 1/511/512/513, fp32 q, fp32 q and kv, fp16, kv of
    the other half dtype; and ones that keep its answer: q or everything on the CPU, kv [skv, 1, d], heads-major q,
    a narrow kv, a last-dim-strided kv) and for drawn combinations; each answer must equal
    oracles.prefill.aiter_pa_guard_expected (gfx942 - CDNA 3 - only, sq >= 512, q bf16/fp16, kv of q's dtype;
    false on every other target), with AITER's MLA switch on, the route's environment.
    Routing, on tiny real inputs (1-2 heads) with the OPUS guard false: with the gfx942 guard faked true and a fake
    op present, the entry asks the guard once about the caller's q and kv, calls the op once with q, kv as
    [skv, d], int32 1-D (indices, indptr) whose rows are oracles.prefill.ref_aiter_pa_rows (dense rows - with
    topk_length or counted - converted to their valid entries in order; a caller's ragged rows as given, invalid
    entries included: AITER's gfx942 kernel skips them), no extend source (None x 3), attn_sink[:h] (None without a
    sink), the scale, and out= the caller's out only where AITER accepts it (contiguous, q's shape and dtype; else
    None); no Triton launch, and out then holds the op's result - written in place, or its first out-width lanes
    copied and converted (nope-wide, padded or other-dtype outs). With the real guard (false for tiny inputs on
    every target) the op is not called and the Triton kernel runs once and agrees with the float64 oracle (margin:
    the worst error-to-tolerance ratio). On gfx942 some cases add a real routed call of 512-514 rows (dense and
    ragged) through the real guard and the fake op, checked the same way (a Triton launch there is counted, not
    run: 512 rows cost the interpreter seconds, and the tiny inputs judge the kernel); it runs once the tiny inputs
    pass. Inputs are never modified.
    What cannot run here: AITER's real kernel (ROCm only); the op is a fake that records its arguments and writes a
    known pattern. Sources: SPEC 10 (vLLM 0.34.0's _can_use_aiter_pa_prefill_sparse and
    _rocm_sparse_attn_prefill_aiter), ROCm/aiter aiter/ops/triton/attention/pa_prefill_sparse.py (its arguments).
    """
    return _aiter_guard_violations(case.guard, target) + _diagnosed(
        lambda inputs: _aiter_routing_once(case.replace(inputs=inputs), target), case.inputs, target)


def _aiter_routing_once(case: fz.AiterRoutingCase, target: Target) -> list[Violation]:
    v: list[Violation] = []
    inp = fz.build_prefill_inputs(case.inputs)
    before = _snapshot(inp)
    where = "gfx942 guard faked true, op present"
    rec = _route_pa(inp, target, True, "ok")
    if rec["refused"] is not None:  # (a layout the entry may refuse: nothing routed, nothing written)
        return routed_refusal(case.inputs, rec, inp, where) + _unchanged(before, inp)
    v += _check_pa_guard_args(rec, inp, target, where)
    v += _check_pa_routed(rec, inp, where)
    v += _unchanged(before, inp)
    # the real guard: tiny inputs are below the threshold everywhere, so the Triton kernel answers
    inp.out_buffer.fill_(math.nan)
    routed = _pa_guard_says(inp, target)
    where = f"real guard ({'true' if routed else 'false'}), op present"
    rec = _route_pa(inp, target, None, "ok")
    if rec["refused"] is not None:
        return v + routed_refusal(case.inputs, rec, inp, where) + _unchanged(before, inp)
    v += _check_pa_routed(rec, inp, where) if routed else _check_unrouted(rec, inp, 0, where)
    v += _unchanged(before, inp)
    if case.large and not v:  # (once the tiny inputs fail, 512 rows add nothing but seconds to every shrink step)
        big = fz.build_prefill_inputs(fz.large_inputs(case.inputs))
        before = _snapshot(big)
        routed = _pa_guard_says(big, target)
        where = f"real guard ({'true' if routed else 'false'}), op present, sq={int(big.q.shape[0])}"
        # Triton's launch is counted, not run: 512 rows cost the interpreter seconds, and a subject that fails to
        # route them would spend them on every case
        rec = _route_pa(big, target, None, "ok", launch_triton=False)
        if rec["refused"] is not None:
            v += routed_refusal(fz.large_inputs(case.inputs), rec, big, where)
        elif routed:
            v += _check_pa_routed(rec, big, where)
        elif len(rec["op"]) != 0 or rec["triton"] != 1 or rec["escaped"] is not None:
            v.append(Violation("routing when the gfx942 AITER guard is false", where,
                               "0 pa_prefill_sparse calls, 1 Triton launch",
                               f"{len(rec['op'])} op calls, {rec['triton']} Triton launches"))
        v += _unchanged(before, big)
    return v


def _aiter_fallback_examples(target: Target) -> list[fz.AiterFallbackCase]:
    inputs = _aiter_routing_examples(target)[0].inputs
    return [fz.AiterFallbackCase(inputs=inputs, failure="AssertionError"),
            fz.AiterFallbackCase(inputs=inputs.replace(seed=33, mode="ragged", indptr_offset=2, tail_junk=1,
                                                       out_width="full"), failure="no_op")]


@contract("aiter-prefill-fallback", targets=ALL_TARGETS, cases=lambda t: fz.aiter_fallback_cases(t),
          examples=_aiter_fallback_examples, min_cases=5, case_type=fz.AiterFallbackCase, numeric=True)
def aiter_prefill_fallback(case: fz.AiterFallbackCase, target: Target) -> list[Violation]:
    """When the gfx942 AITER route is taken but its op cannot serve, the prefill still answers, through Triton.

    On tiny real inputs, with the OPUS guard false and the gfx942 guard faked true: the op missing (the loader
    gives None; upstream's route then imports a module that does not exist) or raising what AITER's published
    pa_prefill_sparse builds raise for what they cannot serve (AssertionError: builds that serve gfx1250 only;
    TypeError: builds without out=; RuntimeError, NotImplementedError: inputs it rejects), after writing NaN into an
    out it was handed. The failure must not reach the caller: the Triton kernel runs once and its output, every
    lane of out, agrees with the float64 oracle (margin: the worst error-to-tolerance ratio); a failing op is
    still called with SPEC 10's arguments (see aiter-prefill-routing). Inputs are never modified.
    Why: the guard asks only the architecture, AITER's MLA switch, sq and dtypes, never which AITER build is
    installed, so whether a gfx942 prefill of 512 rows or more answers must not depend on it. Sources: SPEC 10
    (upstream imports the op unconditionally and has no fallback), ROCm/aiter pa_prefill_sparse.py's builds, seed
    003 (the silent Triton fallback of the OPUS route).
    """
    return _diagnosed(lambda inputs: _aiter_fallback_once(case.replace(inputs=inputs), target), case.inputs, target)


def _aiter_fallback_once(case: fz.AiterFallbackCase, target: Target) -> list[Violation]:
    inp = fz.build_prefill_inputs(case.inputs)
    before = _snapshot(inp)
    missing = case.failure == "no_op"
    where = "gfx942 guard faked true, " + ("no op" if missing else f"the op raising {case.failure}")
    rec = _route_pa(inp, target, True, None if missing else "raises", "RuntimeError" if missing else case.failure)
    if rec["refused"] is not None:  # (a layout the entry may refuse: nothing routed, nothing written)
        return routed_refusal(case.inputs, rec, inp, where) + _unchanged(before, inp)
    v = _check_unrouted(rec, inp, 0 if missing else 1, where)
    v += _unchanged(before, inp)
    return v
