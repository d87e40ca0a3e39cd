"""Contracts of the DSv4 cache writers (SWA insert, compressor single-pass and two-stage) and the trust gate.

* ``writer-oracle-exact``  both writers against their oracles (DESIGN.md "Oracles"): SWA bytes exact; compressor
  fp32 rows within the derived tolerance, bytes exact when quantized from the kernel's own rows, end-to-end bytes
  equal except at counted rounding boundaries; two-stage against single-pass the same way.
* ``nan-free-cache``       the compressed cache is NaN-free for any input on a sanitizing target, and for finite,
  non-overflowing input elsewhere, where the trust gate must stay closed (seed 004).
* ``trust-gate``           ``trust_extra_cache_nan_free`` equals the truth table of ``oracles.trust_gate``.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from contracts.core import ALL_TARGETS, Violation, contract, record_margin
from fuzz import cache_writers as fw
from fuzz.cache_writers import CompressorCase, SwaCase, TrustGateCase, WriterCase
from impl import formats
from impl.cache_writers import quantize_and_insert_k_cache, trust_extra_cache_nan_free
from impl.compressor import compress_norm_rope_store
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import cache_writers as ocw
from oracles import compressor as ocomp
from oracles import trust_gate as otg
from oracles.formats import fp8_ds_mla_token_spans, storage_bytes

#: boundary bytes (end-to-end differences explained by a rounding boundary) seen by passing checks, per target
BOUNDARY_TALLY: Counter = Counter()


@dataclass
class WriterComparison:
    violations: list[Violation] = field(default_factory=list)
    boundary_bytes: int = 0
    tokens: int = 0


# --- helpers ------------------------------------------------------------------------------------------------------

def _storage_diff(what: str, got: torch.Tensor, want: torch.Tensor, cache: torch.Tensor, limit: int = 4):
    bad = (got != want).nonzero().flatten()
    if not len(bad):
        return []
    _, base = storage_bytes(cache)
    out = []
    for off in bad[:limit].tolist():
        rel = off - base
        out.append(Violation(f"{what}: cache byte differs", f"storage byte {off} (view offset {rel})",
                             f"{int(want[off]):#04x}", f"{int(got[off]):#04x}"))
    if len(bad) > limit:
        out.append(Violation(f"{what}: {len(bad) - limit} more cache bytes differ", what))
    return out


def _run_compressor(inp: dict, cache, case: CompressorCase, target: Target, two_stage: bool, splits, intermediates):
    compress_norm_rope_store(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                             inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"], cache,
                             ratio=case.ratio, eps=case.eps, target=target, two_stage=two_stage,
                             splits=splits if two_stage else None, intermediates=intermediates)


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

def compare_swa(case: SwaCase, target: Target) -> WriterComparison:
    dev = kernel_device()
    k, slots = fw.build_swa_inputs(case, dev)
    _, cache = fw.build_cache(case, dev)
    before = storage_bytes(cache)[0].cpu().clone()
    quantize_and_insert_k_cache(k, slots, cache, target=target)
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
    for name, cache, before, got, rows in runs:
        # stage 1: the kernel's fp32 rows against the oracle's, derived tolerance, exact masks
        for r in refs:
            record_row_margin(rows[r["t"]], r["row"], r["tol"])
            for item in ocomp.compare_rows(rows[r["t"]], r["row"], r["tol"]):
                if item[0] == "more":
                    res.violations.append(Violation(f"{name}: {item[1]} more fp32 row elements out of tolerance",
                                                    f"token {r['t']}"))
                    continue
                i, e, g, tol = item
                res.violations.append(Violation(f"{name}: fp32 row element out of tolerance or NaN/inf mask differs",
                                                f"token {r['t']} dim {i}", f"{e!r} +- {tol:.3g}", repr(g)))
        # stage 2: quantization and packing of the kernel's own rows, byte-exact, everything else untouched
        want = _expected_from_rows(before, cache, refs, rows, got, target)
        res.violations += _storage_diff(f"{name} (quantized from its own fp32 rows)", got, want, cache)
        # stage 3: end to end against the oracle's rows, differences only at counted rounding boundaries
        _, base = storage_bytes(cache)
        for r in refs:
            tok = _token_bytes(got, base, cache, r["slot"])
            ref_tok = ocomp.pack_reference_row(r["row"], cap=target.writer_scale_code_cap, sanitize=sanitize)
            n, bad = ocomp.classify_token_bytes(tok, ref_tok, rows[r["t"]], r["row"], sanitize=sanitize)
            res.boundary_bytes += n
            for b in bad[:4]:
                res.violations.append(Violation(f"{name}: end-to-end byte differs away from a rounding boundary",
                                                f"token {r['t']} slot {r['slot']}", "oracle bytes", b))
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


def _writer_examples(target: Target) -> list[WriterCase]:
    return [
        WriterCase(swa=SwaCase(seed=7, T=3, block_size=3, padded=True, extra_blocks_before=1, spare_blocks=1,
                               num_blocks=2, slots=(4, -1, 0), log_scale=(0, -20, 25),
                               specials=((0, 5, "nan"), (2, 100, "inf"), (2, 450, "-inf"), (0, 200, "zero-group")))),
        WriterCase(compressor=CompressorCase(
            seed=11, ratio=128, state_block_size=8, num_reqs=1, positions=(255, 127), reqs=(0, 0), block_size=1,
            padded=True, extra_blocks_before=1, spare_blocks=0, num_blocks=2, slots=(1, 0), score_scale=4.0,
            weight="normal", eps=1e-6, two_stage=True, splits=None, specials=())),
        WriterCase(compressor=INF_KV_UNDERFLOW_CASE),
    ]


@contract("writer-oracle-exact", targets=ALL_TARGETS, cases=lambda target: fw.writer_cases(),
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

def cache_token_problems(tok: dict) -> list[str]:
    """Why a stored extra-cache token would not decode to finite values (empty: it does)."""
    out = []
    codes = tok["scale"].to(torch.int64)
    if bool((codes == 255).any()):
        out.append(f"scale code 255 in groups {(codes == 255).nonzero().flatten().tolist()}")
    nope = tok["nope"]
    nan_bytes = ((nope.to(torch.int64) & 0x7F) == 0x7F)
    if bool(nan_bytes.any()):
        out.append(f"{int(nan_bytes.sum())} NaN e4m3 bytes (first at {int(nan_bytes.nonzero()[0])})")
    rope = tok["rope"].view(torch.bfloat16).to(torch.float32)
    if not bool(torch.isfinite(rope).all()):
        out.append(f"non-finite RoPE lanes {(~torch.isfinite(rope)).nonzero().flatten().tolist()[:8]}")
    vals = formats.fp8_decode(nope, "ocp")
    scale = formats.ue8m0_decode_reader(tok["scale"]).repeat_interleave(64)
    fp32_prod = vals * scale  # the gfx950 reader: fp32 product
    bf16_prod = vals.to(torch.bfloat16) * scale.to(torch.bfloat16)  # generic readers: bf16 product
    if not bool(torch.isfinite(fp32_prod).all()) or not bool(torch.isfinite(bf16_prod).all()):
        bad = (~torch.isfinite(fp32_prod) | ~torch.isfinite(bf16_prod.float())).nonzero().flatten().tolist()
        out.append(f"NoPE dims decode to non-finite values: {bad[:8]}")
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
    if not target.sanitizes_writer and trust_extra_cache_nan_free(target, "fp8_ds_mla", False, True):
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
        for p in cache_token_problems(ocw.read_token(cache, slot)):
            out.append(Violation(f"{variant} compressor stored a non-finite cache entry", f"token {t} slot {slot}",
                                 "finite", p))
    return out


# --- trust-gate -----------------------------------------------------------------------------------------------------

@contract("trust-gate", targets=ALL_TARGETS, cases=lambda target: fw.trust_gate_cases(), min_cases=5,
          case_type=TrustGateCase, numeric=False)
def trust_gate(case: TrustGateCase, target: Target) -> list[Violation]:
    """``trust_extra_cache_nan_free`` is true exactly for (gfx950, "fp8_ds_mla", no KV transfer, extra cache present)
    (SPEC 4, seed 004): every row of the independent truth table in ``oracles.trust_gate`` for this target, the
    generated row, and non-bool flags rejected with TypeError instead of being read as truthy."""
    out = []
    rows = [((target.name, case.cache_dtype, case.has_kv_transfer, case.has_extra_cache),
             otg.trust_expected(target.name, case.cache_dtype, case.has_kv_transfer,
                                case.has_extra_cache))] + otg.truth_table(target.name)
    for (tname, dtype, kv, extra), want in rows:
        got = trust_extra_cache_nan_free(target, dtype, kv, extra)
        if got is not want:
            out.append(Violation("trust gate disagrees with the truth table",
                                 f"dtype={dtype!r} has_kv_transfer={kv} has_extra_cache={extra}", repr(want),
                                 repr(got)))
    for bad in ({"has_kv_transfer": None}, {"has_kv_transfer": 0}, {"has_extra_cache": 1}):
        args = {"has_kv_transfer": False, "has_extra_cache": True, **bad}
        try:
            trust_extra_cache_nan_free(target, "fp8_ds_mla", **args)
        except TypeError:
            continue
        out.append(Violation("trust gate accepted a non-bool flag", repr(bad), "TypeError", "no error"))
    return out
