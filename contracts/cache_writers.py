"""Contracts of the DSv4 cache writers (SWA insert, compressor single-pass and two-stage) and the trust gate.

* ``writer-oracle-exact``  both writers against their oracles (DESIGN.md "Oracles"): SWA bytes exact; compressor
  fp32 rows within the derived tolerance, bytes exact when quantized from the kernel's own rows, end-to-end bytes
  equal except at counted rounding boundaries; two-stage against single-pass the same way.
* ``nan-free-cache``       the compressed cache is NaN-free for any input on a sanitizing target, and for finite,
  non-overflowing input elsewhere, where the trust gate must stay closed (seed 004).
* ``trust-gate``           ``trust_extra_cache_nan_free`` equals the truth table of ``oracles.trust_gate``.

The code judged is the current subject's (``bound(target).cache_writers`` / ``.compressor``); a subject without an
SWA insert (upstream's is a C++ op) gets the compressor's cases only.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections import Counter
from dataclasses import dataclass, field

import torch
from contracts.core import ALL_TARGETS, CONTRACTS, Violation, contract, record_margin
from fuzz import capabilities
from fuzz import cache_writers as fw
from fuzz.cache_writers import CompressorCase, SwaCase, TrustGateCase, WriterCase
from contracts.formats import subject_has
from contracts.subjects import bound
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import cache_writers as ocw
from oracles import compressor as ocomp
from oracles import trust_gate as otg
from oracles.formats import fp8_decode as ref_fp8_decode
from oracles.formats import fp8_ds_mla_token_spans, storage_bytes
from oracles.formats import ue8m0_decode as ref_ue8m0_decode

#: boundary bytes (end-to-end differences explained by a rounding boundary) seen by passing checks, per target
BOUNDARY_TALLY: Counter = Counter()


@dataclass
class WriterComparison:
    violations: list[Violation] = field(default_factory=list)
    boundary_bytes: int = 0
    tokens: int = 0


# --- helpers ------------------------------------------------------------------------------------------------------

#: messages of the differences that lie in a part of a token holding a non-finite value (after the bf16 rounding the
#: writer applies): there the writers' NaN/inf rules decide, not their arithmetic, so a finding about those rules can
#: name them without covering a difference on finite data
NONFINITE_GROUP = "bytes of a NoPE group holding a non-finite value differ"
NONFINITE_LANE = "bytes of a non-finite RoPE lane differ"
#: a NoPE group holding a finite value whose e4m3 rounding at the group's scale can decode past FLT_MAX (|v| above
#: 240 * 2^120: at the largest finite scale code, 247, such a value rounds to 256 * 2^120 = 2^128): there too the
#: writers' overflow rules decide (ours bounds the code's value so that the reader stays finite), not their arithmetic
NEAR_OVERFLOW_GROUP = "bytes of a NoPE group whose values round past FLT_MAX differ"
_NEAR_OVERFLOW = 240.0 * 2.0 ** 120
#: a token whose window holds a +-inf kv in a live row whose fp32 weight exp(score - max) underflows to 0: the oracle
#: adds the +-inf (module docstring of impl/compressor.py), a plain kv * weight gives inf * 0 = NaN
INF_KV_UNDERFLOW = "fp32 row NaN/inf mask differs where an infinite kv has an underflowed weight"
INF_KV_UNDERFLOW_BYTES = "end-to-end bytes differ where an infinite kv has an underflowed weight"


def nonfinite_parts(*rows: torch.Tensor) -> tuple[set, set]:
    """The NoPE groups (0..6) and RoPE lanes (0..63) holding a non-finite value, after bf16 rounding, in any of the
    fp32 ``rows``."""
    groups, lanes = set(), set()
    for row in rows:
        xb = ~torch.isfinite(row.to(torch.float32).to(torch.bfloat16).to(torch.float32))
        groups |= {g for g in range(7) if bool(xb[64 * g:64 * g + 64].any())}
        lanes |= set(xb[448:].nonzero().flatten().tolist())
    return groups, lanes


def near_overflow_groups(*rows: torch.Tensor) -> set:
    """The NoPE groups (0..6) holding a finite value (after bf16 rounding) above 240 * 2^120 in any of ``rows``."""
    out = set()
    for row in rows:
        xb = row.to(torch.float32).to(torch.bfloat16).to(torch.float32)
        big = torch.isfinite(xb) & (xb.abs() > _NEAR_OVERFLOW)
        out |= {g for g in range(7) if bool(big[64 * g:64 * g + 64].any())}
    return out


def _nonfinite_offsets(cache, base: int, slot: int, groups: set, lanes: set,
                       group_message: str = NONFINITE_GROUP) -> dict:
    """Absolute storage offsets of a token's bytes in ``groups`` (fp8 bytes and scale code) and ``lanes`` -> the
    message for a difference there (``group_message`` for the groups)."""
    spans = fp8_ds_mla_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    out = {}
    for g in groups:
        a = base + spans["nope"][0] + 64 * g
        out.update({o: group_message for o in range(a, a + 64)})
        out[base + spans["scale"][0] + g] = group_message
    for i in lanes:
        a = base + spans["rope"][0] + 2 * i
        out.update({a: NONFINITE_LANE, a + 1: NONFINITE_LANE})
    return out


def _storage_diff(what: str, got: torch.Tensor, want: torch.Tensor, cache: torch.Tensor, limit: int = 4,
                  special: dict | None = None):
    """Violations for the storage bytes that differ: at most ``limit`` per message, then a count. ``special`` maps
    storage offsets to the message a difference there gets instead of the plain one."""
    bad = (got != want).nonzero().flatten()
    if not len(bad):
        return []
    _, base = storage_bytes(cache)
    out, shown, more = [], Counter(), Counter()
    for off in bad.tolist():
        msg = (special or {}).get(off, "cache byte differs")
        if shown[msg] >= limit:
            more[msg] += 1
            continue
        shown[msg] += 1
        out.append(Violation(f"{what}: {msg}", f"storage byte {off} (view offset {off - base})",
                             f"{int(want[off]):#04x}", f"{int(got[off]):#04x}"))
    for msg, n in more.items():
        plain = msg == "cache byte differs"
        out.append(Violation(f"{what}: more cache bytes differ" if plain else f"{what}: more {msg}", what, "",
                             f"{n} more"))
    return out


def _token_diff_message(desc: str, groups: set, lanes: set, plain: str, near: set = frozenset()) -> str:
    """The message for one of ``ocomp.classify_token_bytes``' descriptions: ``plain`` unless it names a non-finite
    group or lane, or a group whose values round past FLT_MAX (``near``)."""
    m = re.match(r"^(scale code of group|nope byte|rope lane) (\d+)", desc)
    if m and m.group(1) == "rope lane":
        return NONFINITE_LANE if int(m.group(2)) in lanes else plain
    if m:
        g = int(m.group(2)) if m.group(1) == "scale code of group" else int(m.group(2)) // 64
        return NONFINITE_GROUP if g in groups else NEAR_OVERFLOW_GROUP if g in near else plain
    return plain


def _inf_kv_underflow(inp: dict, t: int, pos: int, ratio: int) -> bool:
    """Whether token ``t``'s window holds a +-inf kv in a row with a finite score whose fp32 weight
    exp(score - max) is 0 (the max ignoring NaN)."""
    req = int(inp["token_to_req"][t])
    kv, sc, valid = ocomp.gather_window(inp["state"], inp["state_block_table"], req, pos, ratio)
    m = torch.where(torch.isnan(sc), torch.full_like(sc, float("-inf")), sc).max(dim=0).values
    live = valid[:, None] & torch.isfinite(sc) & torch.isinf(kv)
    return bool((live & (torch.exp(sc - m) == 0)).any())


def _run_compressor(inp: dict, cache, case: CompressorCase, target: Target, two_stage: bool, splits, intermediates):
    bound(target).compressor.compress_norm_rope_store(
        inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"], inp["slot_mapping"],
        inp["norm_weight"], inp["cos_sin_cache"], cache, ratio=case.ratio, eps=case.eps, target=target,
        two_stage=two_stage, splits=splits if two_stage else None, intermediates=intermediates)


def _expected_from_rows(before, cache, refs, rows, got, target: Target):
    """Stage 2: the storage the cache must hold if every written token is the oracle's quantization of ``rows``;
    RoPE lanes that are NaN in both keep the kernel's payload."""
    flat_got = got
    _, base = storage_bytes(cache)
    want = before.clone()
    for r in refs:
        tok = ocomp.pack_reference_row(rows[r["t"]], cap=target.writer_scale_code_cap,
                                       sanitize=target.sanitizes_writer)
        ocw.place_token(want, base, cache, r["slot"], tok)
        a, b = fp8_ds_mla_token_spans(r["slot"], int(cache.shape[1]), int(cache.stride(0)))["rope"]
        gl = flat_got[base + a:base + b].view(torch.bfloat16).to(torch.float32)
        wl = want[base + a:base + b].view(torch.bfloat16).to(torch.float32)
        both_nan = (torch.isnan(gl) & torch.isnan(wl)).repeat_interleave(2)
        seg = want[base + a:base + b]
        seg[both_nan] = flat_got[base + a:base + b][both_nan]
    return want


def record_row_margin(got: torch.Tensor, want: torch.Tensor, tol: torch.Tensor) -> None:
    """The fp32 stage's error-to-tolerance ratio over the lanes where both rows are finite (the NaN/inf masks are
    compared exactly by ``ocomp.compare_rows``, so they carry no margin)."""
    g, w = got.to(torch.float64), want.to(torch.float64)
    both = torch.isfinite(g) & torch.isfinite(w)
    record_margin(torch.where(both, (g - w).abs(), torch.zeros_like(g)), torch.where(both, tol.to(torch.float64),
                                                                                    torch.zeros_like(g)))


def _token_bytes(flat, base, cache, slot):
    spans = fp8_ds_mla_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    out = {k: flat[base + a:base + b] for k, (a, b) in spans.items()}
    out["pad"] = int(out["pad"][0])
    return out


# --- writer-oracle-exact ----------------------------------------------------------------------------------------

#: the arguments a ``strided-index`` case hands in as stride-2 views (fuzz.cache_writers.INPUT_LAYOUTS)
STRIDED_INDEX_ARGS = ("slot_mapping", "positions", "token_to_req", "norm_weight")
REFUSAL_UNCLEAR = "refusal of a strided per-token vector does not name the argument"
REFUSAL_WROTE = "refusal of a strided per-token vector changed the pool"


STRIDED_READ_PACKED = "a strided per-token vector is read as if packed: the pool differs from a contiguous copy's"
STRIDED_ROWS_READ_PACKED = "a strided row-major input is read as if packed: the pool differs from a contiguous copy's"


def _write_once(inner, target: Target, dev):
    """(storage before, cache view, call) for one run of the case's writer on freshly built inputs and pool."""
    _, cache = fw.build_cache(inner, dev)
    if isinstance(inner, SwaCase):
        k, slots = fw.build_swa_inputs(inner, dev)
        call = lambda: bound(target).cache_writers.quantize_and_insert_k_cache(k, slots, cache, target=target)  # noqa
    else:
        inp = fw.build_compressor_inputs(inner, dev)
        call = lambda: _run_compressor(inp, cache, inner, target, inner.two_stage, inner.splits, None)  # noqa
    return storage_bytes(cache)[0].cpu().clone(), cache, call


def compare_strided_index(inner, target: Target, write_once=_write_once) -> WriterComparison:
    """A ``strided`` or ``strided-index`` case (row-major inputs in wider buffers; per-token vectors and the norm
    weight as stride-2 views): the writer either refuses with a ValueError/TypeError naming the argument (for
    ``strided-index`` one of :data:`STRIDED_INDEX_ARGS`), the pool's whole storage unchanged, or writes exactly the
    storage it writes from contiguous copies of the same values (the contiguous rows' oracle comparisons judge that
    one). ``write_once(inner, target, device) -> (storage before, cache, call)``."""
    dev = kernel_device()
    before, cache, call = write_once(inner, target, dev)
    try:
        call()
    except (ValueError, TypeError) as e:
        out = []
        if inner.input_layout == "strided-index" and not any(name in str(e) for name in STRIDED_INDEX_ARGS):
            out.append(Violation(REFUSAL_UNCLEAR, "error message", f"one of {STRIDED_INDEX_ARGS}", str(e)[:200]))
        if not torch.equal(storage_bytes(cache)[0].cpu(), before):
            out.append(Violation(REFUSAL_WROTE, "pool storage", "unchanged", "bytes differ"))
        return WriterComparison(out, 0, 0)
    got = storage_bytes(cache)[0].cpu()
    _, ref_cache, ref_call = write_once(dataclasses.replace(inner, input_layout="contiguous"), target, dev)
    ref_call()
    want = storage_bytes(ref_cache)[0].cpu()
    diff = (got != want).nonzero().flatten()
    if not len(diff):
        return WriterComparison([], 0, sum(s >= 0 for s in inner.slots))
    off = int(diff[0])
    msg = STRIDED_READ_PACKED if inner.input_layout == "strided-index" else STRIDED_ROWS_READ_PACKED
    return WriterComparison([Violation(msg, f"storage byte {off} ({len(diff)} bytes differ)",
                                       f"0x{int(want[off]):02x}", f"0x{int(got[off]):02x}")], 0, 0)


def compare_swa(case: SwaCase, target: Target) -> WriterComparison:
    dev = kernel_device()
    k, slots = fw.build_swa_inputs(case, dev)
    _, cache = fw.build_cache(case, dev)
    before = storage_bytes(cache)[0].cpu().clone()
    bound(target).cache_writers.quantize_and_insert_k_cache(k, slots, cache, target=target)
    got = storage_bytes(cache)[0].cpu().clone()
    want = ocw.swa_insert_reference(k, list(case.slots), cache, before, flavour=target.main_cache_fp8)
    return WriterComparison(_storage_diff("swa insert", got, want, cache), 0, sum(s >= 0 for s in case.slots))


def compare_compressor(case: CompressorCase, target: Target) -> WriterComparison:
    dev = kernel_device()
    inp = fw.build_compressor_inputs(case, dev)
    T = len(case.positions)
    variants = [case.two_stage] + ([not case.two_stage] if case.ratio == 128 else [])
    runs = []
    for two_stage in variants:
        _, cache = fw.build_cache(case, dev)
        before = storage_bytes(cache)[0].cpu().clone()
        inter = torch.full((T, 512), float("nan"), dtype=torch.float32, device=dev)
        _run_compressor(inp, cache, case, target, two_stage, case.splits, inter)
        runs.append(("two-stage" if two_stage else "single-pass", cache, before,
                     storage_bytes(cache)[0].cpu().clone(), inter.cpu()))
    refs = ocomp.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                                      inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"],
                                      ratio=case.ratio, eps=case.eps)
    res = WriterComparison(tokens=len(refs))
    sanitize = target.sanitizes_writer
    # tokens where the oracle's rule for an infinite kv of an underflowed weight decides the whole row
    underflow = {r["t"]: _inf_kv_underflow(inp, r["t"], r["pos"], case.ratio) for r in refs}
    for name, cache, before, got, rows in runs:
        # stage 1: the kernel's fp32 rows against the oracle's, derived tolerance, exact masks
        for r in refs:
            record_row_margin(rows[r["t"]], r["row"], r["tol"])
            shown = Counter()
            for i, e, g, tol in ocomp.compare_rows(rows[r["t"]], r["row"], r["tol"], limit=512):
                if math.isfinite(e) and math.isfinite(g):
                    msg = "fp32 row element out of tolerance"
                else:
                    msg = INF_KV_UNDERFLOW if underflow[r["t"]] else "fp32 row NaN/inf mask differs"
                shown[msg] += 1
                if shown[msg] <= 4:
                    res.violations.append(Violation(f"{name}: {msg}", f"token {r['t']} dim {i}",
                                                    f"{e!r} +- {tol:.3g}", repr(g)))
            for msg, n in shown.items():
                if n > 4:
                    res.violations.append(Violation(f"{name}: more elements: {msg}", f"token {r['t']}", "",
                                                    f"{n - 4} more"))
        # stage 2: quantization and packing of the kernel's own rows, byte-exact, everything else untouched
        want = _expected_from_rows(before, cache, refs, rows, got, target)
        _, base = storage_bytes(cache)
        special = {}
        for r in refs:
            special.update(_nonfinite_offsets(cache, base, r["slot"], near_overflow_groups(rows[r["t"]]), set(),
                                              NEAR_OVERFLOW_GROUP))
            special.update(_nonfinite_offsets(cache, base, r["slot"], *nonfinite_parts(rows[r["t"]])))
        res.violations += _storage_diff(f"{name} (quantized from its own fp32 rows)", got, want, cache,
                                        special=special)
        # stage 3: end to end against the oracle's rows, differences only at counted rounding boundaries
        for r in refs:
            tok = _token_bytes(got, base, cache, r["slot"])
            ref_tok = ocomp.pack_reference_row(r["row"], cap=target.writer_scale_code_cap, sanitize=sanitize)
            n, bad = ocomp.classify_token_bytes(tok, ref_tok, rows[r["t"]], r["row"], sanitize=sanitize)
            res.boundary_bytes += n
            groups, lanes = nonfinite_parts(rows[r["t"]], r["row"])
            near = near_overflow_groups(rows[r["t"]], r["row"])
            shown = Counter()
            for b in bad:
                msg = (INF_KV_UNDERFLOW_BYTES if underflow[r["t"]] else
                       _token_diff_message(b, groups, lanes, "end-to-end byte differs away from a rounding boundary",
                                           near))
                shown[msg] += 1
                if shown[msg] <= 4:
                    res.violations.append(Violation(f"{name}: {msg}", f"token {r['t']} slot {r['slot']}",
                                                    "oracle bytes", b))
    if len(runs) == 2:
        (na, ca, _, ga, ra), (nb, cb, _, gb, rb) = runs
        _, base_a = storage_bytes(ca)
        _, base_b = storage_bytes(cb)
        for r in refs:
            record_row_margin(rb[r["t"]], ra[r["t"]], r["tol"])
            for item in ocomp.compare_rows(rb[r["t"]], ra[r["t"]], r["tol"]):
                if item[0] != "more":
                    i, e, g, tol = item
                    res.violations.append(Violation(f"{nb} vs {na}: fp32 rows disagree beyond the tolerance",
                                                    f"token {r['t']} dim {i}", f"{e!r} +- {tol:.3g}", repr(g)))
            n, bad = ocomp.classify_token_bytes(_token_bytes(gb, base_b, cb, r["slot"]),
                                                _token_bytes(ga, base_a, ca, r["slot"]), rb[r["t"]], ra[r["t"]],
                                                sanitize=sanitize)
            res.boundary_bytes += n
            for b in bad[:4]:
                res.violations.append(Violation(f"{nb} vs {na}: bytes differ away from a rounding boundary",
                                                f"token {r['t']} slot {r['slot']}", f"{na} bytes", b))
    return res


def compare_writer_case(case: WriterCase, target: Target) -> WriterComparison:
    inner = case.swa if case.swa is not None else case.compressor
    if inner.input_layout != "contiguous":
        return compare_strided_index(inner, target)
    return compare_swa(case.swa, target) if case.swa is not None else compare_compressor(case.compressor, target)


#: a -inf kv (window row 118, dim 460) whose weight exp(score - max) underflows to 0 against the window's max but not
#: against its split's max (rows 112..127 of 8 splits): before the rule "+-inf kv of a live row adds +-inf whatever its
#: weight rounds to", the single pass and the oracle gave -inf * 0 = NaN (every lane NaN, scale codes 255) and the
#: two-stage variant -inf (rows of +-0, codes 105). Found by a dev-profile sweep.
INF_KV_UNDERFLOW_CASE = CompressorCase(
    seed=124469, ratio=128, state_block_size=8, num_reqs=1, positions=(127, 255), reqs=(0, 0),
    extra_blocks_before=1, block_size=7, spare_blocks=0, padded=False, num_blocks=1, slots=(1, -1), score_scale=30.0,
    weight="inf", eps=1e-20, two_stage=True, splits=8,
    specials=((786, "kv", 460, "-inf"), (786, "kv", 460, "-inf"), (10099, "kv", 185, "-inf")))


def _has_swa_insert(target: Target) -> bool:
    return subject_has(target, "cache_writers", "quantize_and_insert_k_cache")


capabilities.provide(capabilities.SWA_INSERT, _has_swa_insert)  # the cache-writers family's allowed asks


def _writer_cases(target: Target):
    """Both writers' cases; the compressor's alone for a subject without an SWA insert."""
    if _has_swa_insert(target):
        return fw.writer_cases()
    return fw.compressor_cases().map(lambda c: WriterCase(compressor=c))


def _writer_examples(target: Target) -> list[WriterCase]:
    examples = [
        WriterCase(swa=SwaCase(seed=7, T=3, block_size=3, padded=True, extra_blocks_before=1, spare_blocks=1,
                               num_blocks=2, slots=(4, -1, 0), log_scale=(0, -20, 25),
                               specials=((0, 5, "nan"), (2, 100, "inf"), (2, 450, "-inf"), (0, 200, "zero-group")))),
        WriterCase(compressor=CompressorCase(
            seed=11, ratio=128, state_block_size=8, num_reqs=1, positions=(255, 127), reqs=(0, 0), block_size=1,
            padded=True, extra_blocks_before=1, spare_blocks=0, num_blocks=2, slots=(1, 0), score_scale=4.0,
            weight="normal", eps=1e-6, two_stage=True, splits=None, specials=())),
        WriterCase(compressor=INF_KV_UNDERFLOW_CASE),
    ]
    return examples if _has_swa_insert(target) else [c for c in examples if c.swa is None]


@contract("writer-oracle-exact", targets=ALL_TARGETS, cases=_writer_cases,
          examples=_writer_examples, min_cases=5, case_type=WriterCase, numeric=True)
def writer_oracle_exact(case: WriterCase, target: Target) -> list[Violation]:
    """Both DSv4 cache writers agree with their oracles (SPEC 1.2, 4; DESIGN.md "Oracles").

    SWA insert: every byte of the pool equals the reference writer's (main-cache flavour of the target, pad 0, raw
    bf16 RoPE, bytes of other slots untouched). Compressor (ratio 4 and 128, single-pass and two-stage): the kernel's
    fp32 rows are within the derived tolerance of the oracle's (NaN/inf masks exact); quantizing the kernel's own rows
    with the oracle reproduces the pool byte for byte; end-to-end bytes equal the oracle's except where a rounding
    boundary lies between the two fp32 values (counted in ``BOUNDARY_TALLY``); for ratio 128 the two variants agree
    with each other under the same comparison. Inputs include NaN, +-inf, fp32-overflowing and denormal values."""
    res = compare_writer_case(case, target)
    if not res.violations:
        BOUNDARY_TALLY[target.name] += res.boundary_bytes
    return res.violations


# --- nan-free-cache -------------------------------------------------------------------------------------------------

#: what can make a stored extra-cache token decode to a non-finite value; each is a violation message of its own
#: (stable text, the token's numbers in where/got), so a finding's signature can name the kind it explains
PROBLEM_SCALE_255 = "scale code 255"
PROBLEM_NAN_BYTES = "NaN e4m3 bytes"
PROBLEM_ROPE_NAN = "NaN RoPE lanes"
PROBLEM_ROPE_INF = "infinite RoPE lanes"
PROBLEM_NOPE_DECODE = "NoPE values that decode non-finite"


def cache_token_problems(tok: dict) -> list[tuple[str, str]]:
    """Why a stored extra-cache token would not decode to finite values: ``(kind, detail)`` pairs, ``kind`` one of
    the ``PROBLEM_*`` texts (empty: it decodes finite). Decoded with the oracle's codecs, under both reader models."""
    out = []
    codes = tok["scale"].to(torch.int64)
    if bool((codes == 255).any()):
        out.append((PROBLEM_SCALE_255, f"groups {(codes == 255).nonzero().flatten().tolist()}"))
    nope = tok["nope"]
    nan_bytes = ((nope.to(torch.int64) & 0x7F) == 0x7F)
    if bool(nan_bytes.any()):
        out.append((PROBLEM_NAN_BYTES, f"{int(nan_bytes.sum())} bytes, first at {int(nan_bytes.nonzero()[0])}"))
    rope = tok["rope"].view(torch.bfloat16).to(torch.float32)
    for kind, bad in ((PROBLEM_ROPE_NAN, torch.isnan(rope)), (PROBLEM_ROPE_INF, torch.isinf(rope))):
        if bool(bad.any()):
            out.append((kind, f"lanes {bad.nonzero().flatten().tolist()[:8]}"))
    vals = ref_fp8_decode(nope, "ocp").to(torch.float32)
    scale = ref_ue8m0_decode(tok["scale"], reader=True).to(torch.float32).repeat_interleave(64)
    fp32_prod = vals * scale  # the gfx950 reader: fp32 product
    bf16_prod = vals.to(torch.bfloat16) * scale.to(torch.bfloat16)  # generic readers: bf16 product
    if not bool(torch.isfinite(fp32_prod).all()) or not bool(torch.isfinite(bf16_prod).all()):
        bad = (~torch.isfinite(fp32_prod) | ~torch.isfinite(bf16_prod.float())).nonzero().flatten().tolist()
        out.append((PROBLEM_NOPE_DECODE, f"dims {bad[:8]}"))
    return out


def nan_free_cases(target: Target):
    return fw.nan_free_cases()


def _nan_free_examples(target: Target) -> list[CompressorCase]:
    def case(**kw) -> CompressorCase:
        base = dict(seed=3, state_block_size=8, num_reqs=1, block_size=2, padded=False, extra_blocks_before=0,
                    spare_blocks=0, num_blocks=1, score_scale=1.0, weight="normal", eps=1e-6, splits=None)
        return CompressorCase(**{**base, **kw})

    return [
        case(ratio=128, positions=(127,), reqs=(0,), slots=(1,), two_stage=True,
             specials=((0, "kv", 3, "nan"), (5, "kv", 460, "inf"))),
        case(ratio=4, state_block_size=4, positions=(7,), reqs=(0,), slots=(0,), two_stage=False,
             specials=((0, "score", 500, "nan"), (1, "kv", 70, "-inf"))),
        # RoPE lanes that are +-inf (not NaN) after the rotation: NaN-only clearing stores them (FINDINGS.md F1)
        case(seed=1, ratio=4, state_block_size=4, positions=(11,), reqs=(0,), slots=(0,), two_stage=False,
             weight="huge-rope", specials=()),
        case(seed=2, ratio=128, positions=(127,), reqs=(0,), slots=(1,), two_stage=True, splits=4,
             weight="rope-near-max", specials=()),
    ]


@contract("nan-free-cache", targets=ALL_TARGETS, cases=nan_free_cases, examples=_nan_free_examples, min_cases=5,
          case_type=CompressorCase, numeric=False)
def nan_free_cache(case: CompressorCase, target: Target) -> list[Violation]:
    """The compressed ("extra") cache the trust gate may trust decodes to finite values (seed 004, SPEC 4).

    Sanitizing target (gfx950): for ANY input - NaN/+-inf state rows and scores, fp32-overflowing values and norm
    weights, denormals, all-zero groups - the compressor (single-pass and two-stage) stores no scale code 255, no NaN
    e4m3 byte, only finite RoPE lanes, and every NoPE value decodes finite under both reader models (fp32 and bf16
    products). The prose "NaN/Inf -> 0" is followed for RoPE (upstream's code clears NaN only; FINDINGS.md); the
    generator gives RoPE lanes that overflow to +-inf a branch of its own (``fuzz.cache_writers.rope_overflow_cases``).
    Non-sanitizing targets (gfx942, generic): the trust gate is closed, and the same holds for every token whose inputs
    are finite and whose computation cannot overflow (``oracles.compressor.is_overflow_free``)."""
    out: list[Violation] = []
    gate = bound(target).cache_writers.trust_extra_cache_nan_free
    if not target.sanitizes_writer and gate(target, "fp8_ds_mla", False, True):
        out.append(Violation("trust gate open on a target whose compressor does not sanitize", target.name,
                             "False", "True"))
    dev = kernel_device()
    inp = fw.build_compressor_inputs(case, dev)
    _, cache = fw.build_cache(case, dev)
    _run_compressor(inp, cache, case, target, case.two_stage, case.splits, None)
    if target.sanitizes_writer:
        writers = [(t, s) for t, (p, s) in enumerate(zip(case.positions, case.slots))
                   if s >= 0 and (p + 1) % case.ratio == 0]
    else:
        refs = ocomp.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"],
                                          inp["positions"], inp["slot_mapping"], inp["norm_weight"],
                                          inp["cos_sin_cache"], ratio=case.ratio, eps=case.eps)
        writers = [(r["t"], r["slot"]) for r in refs if r["overflow_free"]]
    variant = "two-stage" if case.two_stage else "single-pass"
    for t, slot in writers:
        for kind, detail in cache_token_problems(ocw.read_token(cache, slot)):
            out.append(Violation(f"{variant} compressor stored {kind}", f"token {t} slot {slot}", "finite", detail))
    return out


# --- trust-gate -----------------------------------------------------------------------------------------------------

@contract("trust-gate", targets=ALL_TARGETS, cases=lambda target: fw.trust_gate_cases(), min_cases=1, max_cases=3,
          case_type=TrustGateCase, numeric=False)
def trust_gate(case: TrustGateCase, target: Target) -> list[Violation]:
    """``trust_extra_cache_nan_free`` is true exactly for (gfx950, "fp8_ds_mla", no KV transfer, extra cache present)
    (SPEC 4, seed 004): every row of the independent truth table in ``oracles.trust_gate`` for this target, the
    generated row, and non-bool flags rejected with TypeError instead of being read as truthy. Exhaustive: each case
    checks the whole table of its target (every listed cache dtype, near misses included, with both flags), so the
    family declares no pairs."""
    out = []
    gate = bound(target).cache_writers.trust_extra_cache_nan_free
    rows = [((target.name, case.cache_dtype, case.has_kv_transfer, case.has_extra_cache),
             otg.trust_expected(target.name, case.cache_dtype, case.has_kv_transfer,
                                case.has_extra_cache))] + otg.truth_table(target.name)
    for (tname, dtype, kv, extra), want in rows:
        got = gate(target, dtype, kv, extra)
        if got is not want:
            out.append(Violation("trust gate disagrees with the truth table",
                                 f"dtype={dtype!r} has_kv_transfer={kv} has_extra_cache={extra}", repr(want),
                                 repr(got)))
    for bad in ({"has_kv_transfer": None}, {"has_kv_transfer": 0}, {"has_extra_cache": 1}):
        args = {"has_kv_transfer": False, "has_extra_cache": True, **bad}
        try:
            gate(target, "fp8_ds_mla", **args)
        except TypeError:
            continue
        out.append(Violation("trust gate accepted a non-bool flag", repr(bad), "TypeError", "no error"))
    return out


#: every case checks the target's whole table (each of ``oracles.trust_gate.CACHE_DTYPES`` - the accepted dtype, the
#: other cache dtypes and its near misses - with both flags, and the non-bool flags): the domain is enumerated whole,
#: so there are no pairs to declare, and a few cases suffice
CONTRACTS["trust-gate"].extra["exhaustive"] = True
