"""Contract ``indexer-logits-agreement`` (the subject's ``indexer_logits`` family): the sparse indexer's decode
(paged) and prefill logits against a float64 oracle read from the same bytes, and its top-k against a set-based
oracle with the tie rule. Cases and inputs come from :mod:`fuzz.indexer_logits`.

Error model (the derived bound). Each e4m3 x e4m3 product is exact in fp32; the subject sums 128 of them per head
(fp32 accumulation, any order), applies the relu (1-Lipschitz), multiplies by the head weight (one rounding), sums
H heads (any order) and multiplies by the key scale (one rounding). With A[t, s] = sum_h |w[t, h]| * sum_d
|q[t, h, d] k[s, d]| (the oracle's ``absum``), standard forward error analysis gives

    |logit_fp32 - logit_exact| <= |kscale| * (gamma_n * A + (H + 1) * 2^-149) + 2^-149,
    gamma_n = n u / (1 - n u),  n = 128 + H + 2,  u = 2^-23,

where u is one ulp (2^-23 relative) per operation rather than round-to-nearest's half: MMA units may truncate while
accumulating. The 2^-149 terms cover fp32 underflow (each rounding may lose one subnormal ulp absolutely). No fp32
overflow is reachable from the generated inputs (|logit| < 1e10 for finite scales); a position where
|kscale| * A (1 + gamma_n) >= FLT_MAX is not judged (only the diagnoses of wrong readers, below, meet one).

Diagnoses. When logits differ, the check tries wrong readings and formulas (a SHUFFLE cache read in the NORMAL
order, the cache read as per-token 132-byte rows, the key scale folded into the key before the relu, NaN scores
dropped by the relu); if the subject's logits are one of them within the same bound, one violation names it instead
of a list of positions, so each cause has its own stable message (and a finding its own signature).
"""
from __future__ import annotations

import math
import re

import torch

from contracts.core import ALL_TARGETS, Violation, contract, fmt, record_margin, single_threaded
from contracts.subjects import EntryMissing, bound
from fuzz.indexer_logits import (OUT_POISON, IndexerLogitsCase, build_decode_inputs, build_prefill_inputs,
                                 indexer_logits_cases, lay_out_q, lay_out_weights, long_context_lens, padded_out,
                                 padded_rows_view)
from impl.targets import Target
from oracles import indexer_logits as oracle

U = 2.0 ** -23
ETA = 2.0 ** -149
FLT_MAX = 3.4028234663852886e38
#: a plausible column, not -1: what a top-k that does not pre-fill its buffer leaves in the unwritten entries
TOPK_POISON = 0
LIMIT = 4  # violations reported per kind
CONTRACT_ID = "indexer-logits-agreement"


def _gamma(heads: int) -> float:
    n = 128 + heads + 2
    return n * U / (1 - n * U)


def tolerances(ref: dict, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(bound on the logit error, bound on the head-sum error) per position (float64), from the module's model."""
    tol_sum = _gamma(heads) * ref["absum"] + (heads + 1) * ETA
    return ref["scale"].abs() * tol_sum + ETA, tol_sum


def _cls(x: float) -> str:
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    return "finite"


def _compare(got: torch.Tensor, ref: dict, heads: int, label: str, *, record: bool) -> dict[str, list[Violation]]:
    """The logit comparison of :func:`judge_logits`, its violations by kind ("mask", "class", "value", "bf16"),
    each kind capped at LIMIT reported positions plus one line counting the rest."""
    g = got.detach().cpu().to(torch.float64)
    r = ref["logits"]
    vis = ref["visible"]
    tol, tol_sum = tolerances(ref, heads)
    kinds: dict[str, list[Violation]] = {"mask": [], "class": [], "value": [], "bf16": []}
    counts = dict.fromkeys(kinds, 0)
    beyond: list[tuple] = []

    def add(kind: str, msg: str, where: str, expected: str, got_s: str):
        counts[kind] += 1
        if counts[kind] <= LIMIT:
            kinds[kind].append(Violation(msg, where, expected, got_s))

    masked_bad = ~vis & ~(g == -math.inf)
    for i, j in masked_bad.nonzero().tolist()[:LIMIT]:
        add("mask", f"{label}: a masked position is not -inf", f"row {i}, column {j}", "-inf", repr(g[i, j].item()))
    counts["mask"] = int(masked_bad.sum())
    spec_inf = not ref.get("variant")  # a variant's fp64 logits give their classes directly
    infinite_scale = torch.isinf(ref["scale"])
    err = (g - r).abs()
    # a logit whose fp32 computation may pass FLT_MAX is not judged (the generated inputs stay far below it; a
    # wrong reader's garbage scales reach it)
    overflow = (ref["scale"].abs() * ref["absum"] * (1 + _gamma(heads))).nan_to_num(0.0) >= FLT_MAX
    for i, j in (vis & ~overflow).nonzero().tolist():
        gv, rv = g[i, j].item(), r[i, j].item()
        where = f"row {i}, column {j}"
        if not (spec_inf and infinite_scale[i, j]):
            want = _cls(rv)
            if _cls(gv) != want:
                add("class", f"{label}: a visible logit is {_cls(gv)} where the oracle's is {want}", where,
                    f"{rv!r}", f"{gv!r}")
            elif want == "finite" and not err[i, j] <= tol[i, j]:
                bf16 = tol[i, j] + abs(ref["scale"][i, j].item()) * 2.0 ** -8 * ref["absum"][i, j].item()
                beyond.append((i, j, rv, gv, bool(err[i, j] <= bf16)))
        else:  # an infinite scale: the sign of the head sum, NaN when nothing survived, unknown within the bound
            hs = ref["head_sum"][i, j].item()
            if math.isnan(hs) or ref["absum"][i, j].item() == 0:
                want = {"NaN"}
            elif abs(hs) > tol_sum[i, j].item():
                want = {_cls(hs * ref["scale"][i, j].item())}
            else:
                want = {"+inf", "-inf", "NaN"}
            if _cls(gv) not in want:
                add("class", f"{label}: a logit with an infinite key scale is {_cls(gv)}", where,
                    " or ".join(sorted(want)), f"{gv!r}")
    # beyond the fp32 bound everywhere only by the rounding of bf16 head scores: that names a subject computing
    # q . k in bf16; any larger difference makes every one of them a plain value difference
    lowp = bool(beyond) and all(x[4] for x in beyond)
    for i, j, rv, gv, _ in beyond:
        if lowp:
            add("bf16", f"{label}: logit differs beyond the fp32 bound, within the rounding of head scores stored in "
                "bf16", f"row {i}, column {j}", f"{rv:.9g} +- {tol[i, j].item():.3g}", f"{gv:.9g}")
        else:
            add("value", f"{label}: logit differs from the oracle beyond the derived bound", f"row {i}, column {j}",
                f"{rv:.9g} +- {tol[i, j].item():.3g}", f"{gv:.9g}")
    keep = vis & ~overflow & torch.isfinite(r) & torch.isfinite(g)
    if record and bool(keep.any()):
        record_margin(err[keep], tol[keep])
    for kind, n in counts.items():
        if n > LIMIT:
            kinds[kind].append(Violation(f"{label}: more positions of the same kind ({kind})", "", "",
                                         f"{n - LIMIT} more"))
    return kinds


#: wrong readings and formulas a diagnosis tries, each named in words (the message of its violation)
READING_WORDS = {"normal": "a SHUFFLE cache read in the NORMAL order",
                 "shuffle": "a NORMAL cache read in the SHUFFLE order",
                 "token-rows": "the cache read as per-token 132-byte rows ([bs, 1, 132] views), not block-flat"}
VARIANT_WORDS = {"scale_inside": "the key scale folded into the key before the relu",
                 "relu_drops_nan": "NaN head scores dropped by the relu"}


def judge_logits(got: torch.Tensor, ref: dict, heads: int, label: str, alternatives=None) -> list[Violation]:
    """Masked positions -inf exactly; NaN and infinities exactly where the oracle has them (an infinite scale's sign
    from the head sum, any of +-inf/NaN only where that sum is within its bound of 0); finite logits within the
    derived bound (margins recorded). Said apart, so that each names one cause: a logit beyond the fp32 bound but
    within the rounding of head scores stored in bf16 (|S_h| 2^-8 each) names a subject computing q . k in bf16;
    and when the class or value differences all vanish against one of ``alternatives()`` (pairs of words and an
    oracle of a wrong reading or formula), one violation names that reading instead of listing them."""
    rows, cols = ref["logits"].shape
    if tuple(got.shape) != (rows, cols) or got.dtype != torch.float32:
        return [Violation(f"{label} logits shape/dtype", "", f"[{rows}, {cols}] float32",
                          f"{list(got.shape)} {got.dtype}")]
    kinds = _compare(got, ref, heads, label, record=True)
    if (kinds["class"] or kinds["value"]) and alternatives is not None:
        for words, alt in alternatives():
            ak = _compare(got, alt, heads, label, record=False)
            if not ak["class"] and not ak["value"]:
                diag = Violation(f"{label}: logits are the formula with {', '.join(words)}", "",
                                 "SPEC 1.3's layout and SPEC 5's formula", ", ".join(words))
                return kinds["mask"] + ak["bf16"] + [diag]
    return [x for k in ("mask", "class", "value", "bf16") for x in kinds[k]]


def compare_topk(got_idx, logits: torch.Tensor, ref: dict, k: int, label: str, starts=None, ends=None
                 ) -> list[Violation]:
    """(a) On the subject's own logits the top-k equals the oracle's as a set, its entries past the candidate count
    are -1, no column twice; (b) against the oracle's top-k of the exact logits the set may differ only by swaps of
    columns whose oracle logits are within their summed bounds of each other (the k-th gap is within the bound)."""
    rows = int(logits.shape[0])
    if not isinstance(got_idx, torch.Tensor) or tuple(got_idx.shape) != (rows, k) or got_idx.dtype != torch.int32:
        return [Violation(f"{label} top-k shape/dtype", "", f"[{rows}, {k}] int32",
                          f"{list(getattr(got_idx, 'shape', []))} {getattr(got_idx, 'dtype', type(got_idx))}")]
    gi = got_idx.detach().cpu().tolist()
    lg = logits.detach().cpu().to(torch.float64).tolist()
    own = oracle.topk(lg, k, starts, ends)
    exact = oracle.topk(ref["logits"].tolist(), k, starts, ends)
    tol = tolerances(ref, int(ref["heads"]))[0]
    v: list[Violation] = []
    for r in range(rows):
        where = f"row {r}"
        want = own[r]
        count = sum(1 for x in want if x >= 0)
        head, tail = gi[r][:count], gi[r][count:]
        if any(x != -1 for x in tail):
            v.append(Violation(f"{label}: top-k entries past the candidate count are not -1", where,
                               f"{count} entries then -1", str(gi[r])))
            continue
        if len(set(head)) != len(head):
            v.append(Violation(f"{label}: top-k holds a column twice", where, str(want), str(gi[r])))
            continue
        if set(head) != set(want[:count]):
            off = 0 if starts is None else starts[r]
            vals = lg[r]
            kth = vals[want[count - 1] + off]
            tie = all(vals[x + off] == kth for x in set(head) ^ set(want[:count]) if 0 <= x + off < len(vals))
            msg = ("top-k breaks an exact tie against the tie rule (equal logits: the lower column first)" if tie
                   else "top-k set differs from the oracle's top-k of the same logits")
            v.append(Violation(f"{label}: {msg}", where, str(sorted(want[:count])), str(sorted(head))))
            continue
        # (b) the exact logits' top-k
        ex = [x for x in exact[r] if x >= 0]
        if len(ex) != count:
            continue  # a class difference, already reported by the logits comparison
        off = 0 if starts is None else starts[r]
        extra, missing = set(head) - set(ex), set(ex) - set(head)
        rv = ref["logits"][r]
        for e in extra:
            for f in missing:
                gap = rv[f + off].item() - rv[e + off].item()
                bnd = tol[r, f + off].item() + tol[r, e + off].item()
                if math.isnan(gap):
                    gap = 0.0
                if not gap <= bnd:
                    v.append(Violation(f"{label}: top-k set differs from the oracle's beyond the rounding bound",
                                       f"{where}: column {e} picked, {f} left out",
                                       f"gap {rv[f + off].item():.9g} - {rv[e + off].item():.9g} <= {bnd:.3g}",
                                       f"gap {gap:.3g}"))
                    break
                if bnd > 0 and math.isfinite(bnd):
                    record_margin(gap / bnd)
    return v


def _examples(target: Target) -> list[IndexerLogitsCase]:
    base = IndexerLogitsCase(seed=11, mode="decode", heads=4, topk=40, next_n=2, block_size=16, layout="shuffle",
                             context_lens=(17, 32, 1), max_model_len=36, extra_columns=1)
    return [
        base,
        base.replace(seed=12, layout="normal", block_size=3, context_lens=(7, 0), next_n=1, topk=9,
                     max_model_len=9, values="ties"),
        base.replace(seed=13, block_size=64, layout="normal", context_lens=(65, 1, 2, 2), per_row=True,
                     max_model_len=70, topk=70, heads=2, values="wide"),
        IndexerLogitsCase(seed=14, mode="prefill", heads=8, topk=12, keys=20, row_starts=(0, 4, 9, 20),
                          row_ends=(5, 4, 20, 20), values="ties"),
        # into a caller's out whose rows are padded: row 0 sees nothing (its one 32-wide tile is all -inf, 12
        # columns wider than the row), and no store may reach the padding
        IndexerLogitsCase(seed=17, mode="prefill", heads=3, topk=6, keys=20, row_starts=(0, 2, 0),
                          row_ends=(0, 20, 7), out_rows="padded"),
        base.replace(seed=15, next_n=1, block_size=1, layout="normal", context_lens=(5, 3), max_model_len=6,
                     nan_q=True, nan_k=True, bad_scale="inf", topk=8),
        # token rows 136 bytes apart (refused or read as the view says), per-row lengths flattened (refused)
        base.replace(seed=16, block_size=3, layout="normal", context_lens=(7, 4), max_model_len=8, topk=5,
                     cache_view="padded-rows", ctx_count="long"),
        # the cache as upstream's [nb, bs, 1, 132] view (how vLLM's indexer hands it): read as the flat bytes
        base.replace(seed=18, next_n=1, block_size=3, layout="normal", context_lens=(5, 2), max_model_len=6, topk=4,
                     cache_view="unit-heads"),
    ]


@contract(CONTRACT_ID, targets=ALL_TARGETS, cases=lambda target: indexer_logits_cases(),
          examples=_examples, case_type=IndexerLogitsCase, numeric=True)
def indexer_logits_agreement(case: IndexerLogitsCase, target: Target) -> list[Violation]:
    """The sparse indexer's logits, logit[t, s] = kscale[s] * sum_h w[t, h] * relu(q[t, h] . k[s]) (SPEC 5), agree
    with a float64 oracle that reads the same cache bytes: decode from the paged indexer-K cache (NORMAL and SHUFFLE,
    odd block sizes, next_n 1 and 2, per-request and per-row context lengths: row j of a request with context ctx
    sees positions n <= ctx - next_n + j) and prefill over gathered keys (-inf outside [ks, ke)). Masked positions
    are -inf exactly, on every column up to max_model_len, whatever the poisoned bytes past each row's length hold;
    NaN propagates exactly (a NaN code in q or a key, a NaN scale) and an infinite scale gives the sign of the head
    sum; finite logits are within the bound derived from fp32 accumulation over 128 lanes and H heads (module
    docstring; the margin is the worst error over its bound). The top-k (pre-filled -1, candidates neither -inf nor
    NaN, equal logits the lower column first; the prefill form local to ks) equals the oracle's set on the subject's
    own logits, and differs from the exact logits' top-k only where the swapped columns' oracle logits are within
    their summed bounds. A cache view whose token rows are not 132 bytes apart is read as the view says at block
    size 1 (the block is still contiguous), and above it either refused or read as the view says (the gaps hold
    NaN codes); upstream's [nb, bs, 1, 132] view of the flat cache is read as the flat cache; at next_n 2 a 1-D
    ``context_lens`` of the per-row lengths flattened (more entries than q has
    requests) is refused with ValueError or TypeError. A q or weights in another memory layout (head slots
    padded, heads outermost, lanes strided; a wider weights table, column-major) is refused naming it or gives
    exactly the packed call's logits. Into a caller's ``out`` whose rows are a slice of a wider buffer, the logits
    are written there and no store reaches the padding after a row's last column. A subject without top-k entry points (``topk_indices``, ``topk_indices_prefill``) is
    judged on its logits alone (vLLM 0.33.0's top-k is a compiled op, outside the audited modules)."""
    with single_threaded():
        return _check(case, target)


def _refusals(case: IndexerLogitsCase, call, inp, flavour: str) -> list[Violation]:
    """The calls a subject must refuse (ValueError or TypeError, DESIGN's bad-input rule) before it judges the
    logits: at next_n >= 2, a 1-D ``context_lens`` of every row's length flattened (``ctx_count`` "long"), which a
    reader of per-request lengths would take for other rows' lengths; on the flat cache."""
    if case.ctx_count != "long":
        return []
    lens = long_context_lens(case, inp.context_lens.device)
    try:
        call(inp.cache, lens)
    except (ValueError, TypeError):
        return []
    # any other exception propagates: the row reports it as the check raising, as for every other call
    return [Violation("decode: a 1-D context_lens longer than q's requests was accepted (per-row lengths "
                      "flattened cannot be told from per-request ones)", "context_lens",
                      f"ValueError ({case.batch} requests)", f"accepted {int(lens.shape[0])} entries")]


LAYOUT_ARGS = {"q_layout": "q", "weights_layout": "weights"}
LAYOUT_REFUSAL_UNCLEAR = "refusal of a non-packed q / weights does not name the argument"
LAYOUT_READ_PACKED = "a non-packed q / weights is read as if packed: the logits differ from a packed copy's"


def compare_layouts(case: IndexerLogitsCase, run, q, weights, got: torch.Tensor, flavour: str) -> list[Violation]:
    """A case whose q or weights are not packed: ``run(q, weights)`` on the same values in that memory either
    raises ValueError/TypeError naming ``q`` or ``weights``, or returns exactly the logits of the packed call
    (``got``; NaN where it is NaN)."""
    laid = {f: getattr(case, f) for f in LAYOUT_ARGS if getattr(case, f) != "contiguous"}
    if not laid:
        return []
    try:
        got2 = run(lay_out_q(q, case.q_layout, flavour), lay_out_weights(weights, case.weights_layout))
    except (ValueError, TypeError) as exc:
        names = [LAYOUT_ARGS[f] for f in laid]
        if not any(re.search(rf"\b{n}\b", str(exc)) for n in names):
            return [Violation(LAYOUT_REFUSAL_UNCLEAR, "error message", f"one of {names}", str(exc)[:200])]
        return []
    a, b = got.detach().cpu(), got2.detach().cpu()
    where = ", ".join(f"{k}={v}" for k, v in laid.items())
    if a.shape != b.shape:
        return [Violation(LAYOUT_READ_PACKED, f"logits shape ({where})", str(list(a.shape)), str(list(b.shape)))]
    same = (a == b) | (torch.isnan(a) & torch.isnan(b))
    if bool(same.all()):
        return []
    bad = (~same).nonzero()[0].tolist()
    return [Violation(LAYOUT_READ_PACKED, f"logits{bad} ({where}; {int((~same).sum())} differ)",
                      fmt(a[tuple(bad)]), fmt(b[tuple(bad)]))]


def _out_buffer(case: IndexerLogitsCase, rows: int, cols: int, device):
    """(wide, out) for the call: (None, None) for a "fresh" case (the subject allocates), else a padded out."""
    if case.out_rows != "padded":
        return None, None
    return padded_out(rows, cols, device)


OUT_PADDING_WRITTEN = ("a store past a row's last column reached the padding of a caller's out (rows a slice of a "
                       "wider buffer)")
OUT_NOT_WRITTEN = "the logits returned are not what the caller's out holds"


def _out_violations(wide, out, got, label: str) -> list[Violation]:
    """A padded out: the columns past each row still hold OUT_POISON, and ``out`` holds the returned logits."""
    if wide is None:
        return []
    v = []
    pad = wide[:, out.shape[1]:].detach().cpu()
    bad = pad != OUT_POISON
    if bool(bad.any()):
        r, c = bad.nonzero()[0].tolist()
        v.append(Violation(f"{label}: {OUT_PADDING_WRITTEN}", f"row {r}, column {out.shape[1] + c} "
                           f"({int(bad.sum())} padding entries changed)", repr(OUT_POISON), repr(pad[r, c].item())))
    a, b = out.detach().cpu(), got.detach().cpu()
    if a.shape == b.shape and not bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all()):
        v.append(Violation(f"{label}: {OUT_NOT_WRITTEN}", "out", "the returned logits", "other values"))
    return v


def _check(case: IndexerLogitsCase, target: "Target | str") -> list[Violation]:
    from impl.targets import get_target

    tgt = get_target(target)
    fam = bound(tgt).indexer_logits
    flavour = tgt.main_cache_fp8
    if case.mode == "decode":
        inp = build_decode_inputs(case, flavour)

        def call(cache, context_lens, out=None):
            # max_model_len by keyword, as callers may pass it (a positional-or-keyword parameter)
            return fam.fp8_paged_mqa_logits(inp.q, cache, inp.weights, context_lens, inp.block_table,
                                            max_model_len=case.max_model_len, layout=case.layout, out=out,
                                            target=tgt)

        pre = _refusals(case, call, inp, flavour)
        rows_out = case.batch * case.next_n
        got = None
        if case.cache_view == "padded-rows":
            try:
                wide, out = _out_buffer(case, rows_out, case.max_model_len, inp.q.device)
                got = call(padded_rows_view(inp.cache, flavour), inp.context_lens, out)
            except Exception as exc:  # noqa: BLE001 - above block size 1 any refusal will do
                if case.block_size == 1:
                    pre.append(Violation("decode: a block-contiguous cache view (block size 1, its one token row "
                                         "not 132 bytes from the next block's) was refused", "kv_cache",
                                         "logits", f"{type(exc).__name__}: {exc}"))
        if got is None:
            wide, out = _out_buffer(case, rows_out, case.max_model_len, inp.q.device)
            # "unit-heads": upstream's [nb, bs, 1, 132] view of the same bytes, which the entry point accepts
            got = call(inp.cache.unsqueeze(2) if case.cache_view == "unit-heads" else inp.cache, inp.context_lens,
                       out)
        got_cpu = got.detach().cpu().clone()
        pre += _out_violations(wide, out, got, "decode")
        pre += compare_layouts(case, lambda q, w: fam.fp8_paged_mqa_logits(
            q, inp.cache, w, inp.context_lens, inp.block_table, case.max_model_len, layout=case.layout, target=tgt),
            inp.q, inp.weights, got_cpu, flavour)
        cache_cpu = inp.cache.cpu()

        def paged(reading, **variant):
            r = oracle.paged_logits(inp.q_codes, cache_cpu, inp.weights, inp.visible, inp.table, case.max_model_len,
                                    reading, flavour, **variant)
            r["variant"] = bool(variant)
            return r

        ref = paged(case.layout)

        def alternatives():
            # the 16x16 SHUFFLE tiling exists only where a block holds whole tiles
            tiled = ("shuffle",) if case.block_size % 16 == 0 else ()
            readings = [case.layout] + [x for x in ("normal",) + tiled + ("token-rows",) if x != case.layout]
            for reading in readings:
                for variant in ({}, {"scale_inside": True}, {"relu_drops_nan": True}):
                    if reading == case.layout and not variant:
                        continue
                    words = ([READING_WORDS[reading]] if reading != case.layout else []) + \
                        [VARIANT_WORDS[k] for k in variant]
                    yield words, paged(reading, **variant)
        starts = ends = None
        label = "decode"
    else:
        pre = []
        inp = build_prefill_inputs(case, flavour)
        wide, out = _out_buffer(case, len(case.row_starts), case.keys, inp.q.device)
        got = fam.fp8_mqa_logits(inp.q, inp.k_fp8, inp.k_scale, inp.weights, inp.ks, inp.ke, out=out, target=tgt)
        got_cpu = got.detach().cpu().clone()
        pre += _out_violations(wide, out, got, "prefill")
        pre += compare_layouts(case, lambda q, w: fam.fp8_mqa_logits(q, inp.k_fp8, inp.k_scale, w, inp.ks, inp.ke,
                                                                     target=tgt), inp.q, inp.weights, got_cpu, flavour)
        def prefill(**variant):
            r = oracle.prefill_logits(inp.q_codes, inp.k_codes, inp.k_scale, inp.weights, list(case.row_starts),
                                      list(case.row_ends), flavour, **variant)
            r["variant"] = bool(variant)
            return r

        ref = prefill()

        def alternatives():
            for variant in ({"scale_inside": True}, {"relu_drops_nan": True}):
                yield [VARIANT_WORDS[k] for k in variant], prefill(**variant)
        starts, ends = list(case.row_starts), list(case.row_ends)
        label = "prefill"
    ref["heads"] = case.heads
    v = pre + judge_logits(got_cpu, ref, case.heads, label, alternatives)
    try:
        rows = got.shape[0]
        out = torch.full((rows, case.topk), TOPK_POISON, dtype=torch.int32, device=got.device)
        if case.mode == "decode":
            idx = fam.topk_indices(got, case.topk, out=out)
        else:
            idx = fam.topk_indices_prefill(got, inp.ks, inp.ke, case.topk, out=out)
    except EntryMissing:
        return v  # a subject without a top-k (upstream's is a compiled op) is judged on its logits alone
    if any("shape/dtype" in x.message for x in v):
        return v
    return v + compare_topk(idx, got_cpu, ref, case.topk, label, starts, ends)
