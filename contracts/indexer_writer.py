"""Contract of the indexer-K writers (SPEC 1.3, 4 "Indexer variant"): ``indexer-writer-exact``.

* Direct writer (``indexer_writer.indexer_k_quant_and_cache``): every byte of the pool equals the oracle's (the
  target's platform fp8, both scale formats, NORMAL and SHUFFLE, bytes of other slots and of the pool outside the
  view untouched); a layout that cannot hold the block size is refused with ValueError and the pool is untouched.
* Head-128 compressor (``indexer_writer.compress_norm_rope_store_indexer``, FP8 and MXFP4): the two-stage comparison
  of DESIGN.md "Oracles", as ``writer-oracle-exact`` does for head 512.

The code judged is the current subject's; a subject that writes fewer variants (``indexer_writer.VARIANTS``: upstream
picks the direct writer's layout itself, and its MXFP4 kernel is CUDA PTX) gets only the cases it can run.
"""
from __future__ import annotations

import math
from collections import Counter

import torch

from contracts import cache_writers
from contracts.core import ALL_TARGETS, Violation, contract, record_margin
from contracts.subjects import EntryMissing, bound
from fuzz import capabilities
from fuzz import indexer_writer as fiw
from fuzz.indexer_writer import DirectCase, IndexerCompressorCase, IndexerWriterCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import indexer_writer as oiw
from oracles.formats import indexer_k_token_spans, storage_bytes

#: boundary bytes (end-to-end differences explained by a rounding boundary) seen by passing checks, per target
BOUNDARY_TALLY: Counter = Counter()

#: stable messages (numbers go to where/expected/got), so a finding's signature can name exactly one kind
BYTE_DIFFERS = "cache byte differs"
NONFINITE_TOKEN = "bytes of a token holding a non-finite value differ"
OUTSIDE_RECORDS = "a byte outside the written tokens' records changed"
ROW_OUT_OF_TOL = "fp32 row element out of tolerance"
ROW_MASK = "fp32 row NaN/inf mask differs"
INF_KV_UNDERFLOW = "fp32 row NaN/inf mask differs where an infinite kv has an underflowed weight"
#: a lane whose GPT-J pair partner (dim ^ 1) is non-finite in the oracle's row: a rotation written as
#: e * cos - o * sin over every pair (cos 1, sin 0 for NoPE pairs) turns inf * 0 into NaN there
ROW_MASK_PARTNER = "fp32 row NaN/inf mask differs at a lane whose pair partner is non-finite"
E2E_BYTES = "end-to-end byte differs away from a rounding boundary"
E2E_NONFINITE = "end-to-end bytes of a token holding a non-finite value differ"
INF_KV_UNDERFLOW_BYTES = "end-to-end bytes differ where an infinite kv has an underflowed weight"
REFUSAL_MISSING = "a layout that cannot hold the block size was accepted"
REFUSAL_WRONG = "a layout that cannot hold the block size raised something other than ValueError"
REFUSAL_WROTE = "a refused call changed the cache"
#: a direct-writer token whose fp32 scale is one ulp from the correctly rounded max(amax, 1e-4) / DIV (a division
#: that is not correctly rounded: Triton's fp32 `/` on NVIDIA), its codes as they follow from it
SCALE_ULP = "token scale one fp32 ulp from the correctly rounded max(amax, 1e-4) / DIV"
#: a direct-writer token with the reference's scale whose differing codes are neighbours with x / scale within two
#: fp32 ulps of their rounding boundary (a quotient that is not correctly rounded)
QUOTIENT_ULP = "codes one step apart where x / scale lies within two fp32 ulps of their rounding boundary"
#: an fp8 token whose bytes are exactly the OCP e4m3 / 448 quantization of its row on a target whose indexer cache
#: is FNUZ (/ 224): the flavour decides, not the arithmetic
OTHER_FLAVOUR = "token stored as OCP e4m3 with scale / 448 where the target's indexer cache is FNUZ"


def subject_variants(target: Target) -> dict:
    """What the current subject can write (``indexer_writer.VARIANTS``); all of it when the subject does not say."""
    try:
        return dict(bound(target).indexer_writer.VARIANTS)
    except EntryMissing:
        return dict(fiw.ALL_VARIANTS)


capabilities.provide(capabilities.INDEXER_WRITER_VARIANTS, subject_variants)  # the family's allowed and force ask


def _fp8_records(cache, base: int, slot: int, layout: str) -> list[int]:
    offs, so = indexer_k_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)), layout)
    return [base + o for o in offs] + [base + so + j for j in range(4)]


def _mxfp4_records(cache, base: int, slot: int) -> list[int]:
    d, s = oiw.mxfp4_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    return [base + d + j for j in range(64)] + [base + s + j for j in range(4)]


def _nan_codes(flavour: str) -> set:
    return {0x80} if flavour == "fnuz" else {0x7F, 0xFF}


def storage_diff(what: str, got: torch.Tensor, want: torch.Tensor, owner: dict, messages: dict,
                 limit: int = 4, nan_equal: "tuple[set, set] | None" = None) -> list[Violation]:
    """Violations for the storage bytes that differ: ``owner`` maps a written token's bytes to its index, whose
    ``messages`` entry (default :data:`BYTE_DIFFERS`) names the difference; bytes of no token are
    :data:`OUTSIDE_RECORDS`. ``nan_equal = (offsets, codes)``: at those offsets (fp8 codes) two NaN codes are equal
    whatever their sign (OCP has two). At most ``limit`` per message, then a count."""
    bad = (got != want).nonzero().flatten().tolist()
    out, shown, more = [], Counter(), Counter()
    for off in bad:
        if nan_equal and off in nan_equal[0] and int(got[off]) in nan_equal[1] and int(want[off]) in nan_equal[1]:
            continue
        t = owner.get(off)
        msg = OUTSIDE_RECORDS if t is None else messages.get(t, BYTE_DIFFERS)
        if shown[msg] >= limit:
            more[msg] += 1
            continue
        shown[msg] += 1
        where = f"storage byte {off}" + ("" if t is None else f" (token {t})")
        out.append(Violation(f"{what}: {msg}", where, f"{int(want[off]):#04x}", f"{int(got[off]):#04x}"))
    out += [Violation(f"{what}: more: {msg}", what, "", f"{n} more") for msg, n in more.items()]
    return out


# --- strided per-token vectors (contracts.cache_writers.compare_strided_index) -------------------------------------

def _write_once(inner, target: Target, dev):
    """(storage before, cache view, call) for one run of the case's indexer writer on freshly built inputs and pool."""
    if isinstance(inner, DirectCase):
        k, slots = fiw.build_direct_inputs(inner, dev)
        _, cache = fiw.build_pool(inner, fiw.TOKEN_BYTES["fp8"], dev)
        layout = None if inner.layout == "default" else inner.layout
        call = lambda: bound(target).indexer_writer.indexer_k_quant_and_cache(  # noqa: E731
            k, cache, slots, scale_fmt=inner.scale_fmt, layout=layout, target=target)
    else:
        inp = fiw.build_compressor_inputs(inner, dev)
        _, cache = fiw.build_pool(inner, fiw.TOKEN_BYTES[inner.kv_format], dev)
        call = lambda: _run_compressor(inp, cache, inner, target, None)  # noqa: E731
    return storage_bytes(cache)[0].cpu().clone(), cache, call


def compare_strided_index(inner, target: Target) -> list[Violation]:
    return cache_writers.compare_strided_index(inner, target, _write_once).violations


# --- direct writer --------------------------------------------------------------------------------------------------

def compare_direct(case: DirectCase, target: Target) -> list[Violation]:
    dev = kernel_device()
    k, slots = fiw.build_direct_inputs(case, dev)
    _, cache = fiw.build_pool(case, fiw.TOKEN_BYTES["fp8"], dev)
    before = storage_bytes(cache)[0].cpu().clone()
    layout = None if case.layout == "default" else case.layout
    entry = bound(target).indexer_writer.indexer_k_quant_and_cache
    if case.refused:
        out = []
        try:
            entry(k, cache, slots, scale_fmt=case.scale_fmt, layout=layout, target=target)
            out.append(Violation(REFUSAL_MISSING, f"layout {case.layout_name}, block size {case.block_size}",
                                 "ValueError", "no error"))
        except ValueError:
            pass
        except Exception as exc:  # noqa: BLE001 - any other outcome is the violation
            out.append(Violation(REFUSAL_WRONG, f"block size {case.block_size}", "ValueError",
                                 f"{type(exc).__name__}: {exc}"))
        got = storage_bytes(cache)[0].cpu()
        n = int((got != before).sum())
        if n:
            out.append(Violation(REFUSAL_WROTE, f"block size {case.block_size}", "no byte changed", f"{n} bytes"))
        return out
    entry(k, cache, slots, scale_fmt=case.scale_fmt, layout=layout, target=target)
    got = storage_bytes(cache)[0].cpu().clone()
    want = oiw.direct_reference(k, list(case.slots), cache, before, flavour=target.main_cache_fp8,
                                scale_fmt=case.scale_fmt, layout=case.layout_name)
    _, base = storage_bytes(cache)
    rows = k.detach().cpu().to(torch.float32)
    owner, messages, codes = {}, {}, set()
    for t, s in enumerate(case.slots):
        if s >= 0:
            recs = _fp8_records(cache, base, s, case.layout_name)
            owner.update({o: t for o in recs})
            codes.update(recs[:oiw.HEAD])
            if not bool(torch.isfinite(rows[t]).all()):
                messages[t] = NONFINITE_TOKEN
            else:
                why = _rounding_of_division(got[recs], want[recs], rows[t], target.main_cache_fp8)
                if why:
                    messages[t] = why
    return storage_diff("direct writer", got, want, owner, messages,
                        nan_equal=(codes, _nan_codes(target.main_cache_fp8)))


def _rounding_of_division(got: torch.Tensor, want: torch.Tensor, row: torch.Tensor, flavour: str) -> str | None:
    """:data:`SCALE_ULP` or :data:`QUOTIENT_ULP` when a finite token's difference (128 codes then the scale word)
    is only that of an fp32 division that is not correctly rounded; None otherwise (or when nothing differs)."""
    if torch.equal(got, want):
        return None
    gb = int(got[oiw.HEAD:].clone().view(torch.int32)[0])
    wb = int(want[oiw.HEAD:].clone().view(torch.int32)[0])
    if abs(gb - wb) == 1:
        return SCALE_ULP
    if gb != wb:
        return None
    scale = float(want[oiw.HEAD:].clone().view(torch.float32)[0])
    for j in (got[:oiw.HEAD] != want[:oiw.HEAD]).nonzero().flatten().tolist():
        a, b = int(got[j]), int(want[j])
        va, vb = oiw.fp8_value(a, flavour), oiw.fp8_value(b, flavour)
        q = float(row[j]) / scale
        ulp = math.ulp(float(torch.tensor(q, dtype=torch.float32))) * 2 ** 29  # an fp32 ulp, in float64 units
        if not (math.isfinite(va) and math.isfinite(vb) and abs(a - b) == 1 and (a ^ b) < 0x80
                and abs(q - (va + vb) / 2) <= 2 * ulp):
            return None
    return QUOTIENT_ULP


# --- compressor -----------------------------------------------------------------------------------------------------

def _run_compressor(inp: dict, cache, case: IndexerCompressorCase, target: Target, intermediates) -> None:
    bound(target).indexer_writer.compress_norm_rope_store_indexer(
        inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"], inp["slot_mapping"],
        inp["norm_weight"], inp["cos_sin_cache"], cache, ratio=case.ratio, eps=case.eps, kv_format=case.kv_format,
        layout=None if case.layout == "default" else case.layout, mx_scale=case.mx_scale, target=target,
        intermediates=intermediates)


def _stored_as_ocp(got, base, cache, case: IndexerCompressorCase, flavour: str, row, slot: int) -> bool:
    """Whether an fp8 token's stored bytes are the OCP / 448 quantization of ``row`` on an FNUZ target."""
    if case.kv_format != "fp8" or flavour != "fnuz":
        return False
    tok = oiw.read_fp8_token(got, base, cache, slot, case.layout_name)
    ocp = oiw.pack_compressor_row(row, kv_format="fp8", flavour="ocp", mx_scale=case.mx_scale)
    return torch.equal(tok["codes"], ocp["codes"]) and torch.equal(tok["word"], ocp["word"])


def compare_compressor(case: IndexerCompressorCase, target: Target) -> tuple[list[Violation], int]:
    dev = kernel_device()
    inp = fiw.build_compressor_inputs(case, dev)
    _, cache = fiw.build_pool(case, fiw.TOKEN_BYTES[case.kv_format], dev)
    before = storage_bytes(cache)[0].cpu().clone()
    T = len(case.positions)
    inter = torch.full((T, oiw.HEAD), float("nan"), dtype=torch.float32, device=dev)
    _run_compressor(inp, cache, case, target, inter)
    got = storage_bytes(cache)[0].cpu().clone()
    rows = inter.cpu()
    refs = oiw.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                                    inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"],
                                    ratio=case.ratio, eps=case.eps)
    flavour, mxfp4 = target.main_cache_fp8, case.kv_format == "mxfp4"
    out: list[Violation] = []
    # stage 1: the kernel's fp32 rows against the oracle's, derived tolerance, exact masks
    for r in refs:
        g, e = rows[r["t"]].to(torch.float64), r["row"].to(torch.float64)
        both = torch.isfinite(g) & torch.isfinite(e)
        record_margin(torch.where(both, (g - e).abs(), torch.zeros_like(g)),
                      torch.where(both, r["tol"], torch.zeros_like(g)))
        shown = Counter()
        for i, ev, gv, tol in oiw.compare_rows(rows[r["t"]], r["row"], r["tol"]):
            fin = torch.isfinite(torch.tensor([ev, gv])).all()
            partner_bad = not bool(torch.isfinite(r["row"][i ^ 1]))
            msg = ROW_OUT_OF_TOL if bool(fin) else INF_KV_UNDERFLOW if r["inf_kv_underflow"] else \
                ROW_MASK_PARTNER if partner_bad else ROW_MASK
            shown[msg] += 1
            if shown[msg] <= 4:
                out.append(Violation(msg, f"token {r['t']} dim {i}", f"{ev!r} +- {tol:.3g}", repr(gv)))
        out += [Violation(f"more elements: {m}", f"token {r['t']}", "", f"{n - 4} more")
                for m, n in shown.items() if n > 4]
    # stage 2: quantization and packing of the kernel's own rows, byte-exact, everything else untouched
    _, base = storage_bytes(cache)
    want = before.clone()
    owner, messages, codes = {}, {}, set()
    for r in refs:
        tok = oiw.pack_compressor_row(rows[r["t"]], kv_format=case.kv_format, flavour=flavour,
                                      mx_scale=case.mx_scale)
        oiw.place_compressor_token(want, base, cache, r["slot"], case.layout_name, case.kv_format, tok)
        recs = _mxfp4_records(cache, base, r["slot"]) if mxfp4 else \
            _fp8_records(cache, base, r["slot"], case.layout_name)
        owner.update({o: r["t"] for o in recs})
        if not mxfp4:
            codes.update(recs[:oiw.HEAD])
        if oiw.token_nonfinite(rows[r["t"]]):
            messages[r["t"]] = NONFINITE_TOKEN
        elif _stored_as_ocp(got, base, cache, case, flavour, rows[r["t"]], r["slot"]):
            messages[r["t"]] = OTHER_FLAVOUR
    out += storage_diff("quantized from its own fp32 rows", got, want, owner, messages,
                        nan_equal=(codes, _nan_codes(flavour)))
    # stage 3: end to end against the oracle's rows, differences only at counted rounding boundaries
    boundary = 0
    for r in refs:
        ref_tok = oiw.pack_compressor_row(r["row"], kv_format=case.kv_format, flavour=flavour, mx_scale=case.mx_scale)
        if mxfp4:
            n, bad = oiw.classify_mxfp4_token(oiw.read_mxfp4_token(got, base, cache, r["slot"]), ref_tok,
                                              rows[r["t"]], r["row"])
        else:
            n, bad = oiw.classify_fp8_token(oiw.read_fp8_token(got, base, cache, r["slot"], case.layout_name),
                                            ref_tok, rows[r["t"]], r["row"], flavour=flavour, mx_scale=case.mx_scale)
        boundary += n
        if bad and messages.get(r["t"]) == OTHER_FLAVOUR:
            continue  # stage 2 named it
        msg = INF_KV_UNDERFLOW_BYTES if r["inf_kv_underflow"] else \
            E2E_NONFINITE if oiw.token_nonfinite(rows[r["t"]], r["row"]) else E2E_BYTES
        out += [Violation(msg, f"token {r['t']} slot {r['slot']}", "oracle bytes", b) for b in bad[:4]]
        if len(bad) > 4:
            out.append(Violation(f"more: {msg}", f"token {r['t']}", "", f"{len(bad) - 4} more"))
    return out, boundary


# --- the contract ---------------------------------------------------------------------------------------------------

def _cases(target: Target):
    return fiw.indexer_writer_cases(subject_variants(target))


def _all_examples() -> list[IndexerWriterCase]:
    D, C = DirectCase, IndexerCompressorCase
    return [
        # SHUFFLE (bs 16, the default), a token in the second block, a skipped one, the ue8m0 boundary
        IndexerWriterCase(direct=D(seed=5, T=3, slots=(17, -1, 2), log_scale=(0, -9, 12), block_size=16,
                                   num_blocks=2, scale_fmt="ue8m0", specials=((0, 9, "pow2-max"),), stride_pad=64,
                                   extra_blocks_before=1)),
        # NORMAL at an odd block size, fp32 k, fp32 scale, non-finite values
        IndexerWriterCase(direct=D(seed=6, T=3, slots=(4, 0, -2 ** 31), log_scale=(3, -20, 0), block_size=3,
                                   num_blocks=2, layout="normal", dtype="float32",
                                   specials=((1, 100, "nan"), (2, 5, "inf")), stride_pad=4)),
        # the default layout of an odd block size is SHUFFLE, which cannot hold it: refused, pool untouched
        IndexerWriterCase(direct=D(seed=7, T=2, slots=(1, 4), log_scale=(0, 0), block_size=3, num_blocks=2)),
        # compressor FP8, C4A's NORMAL, odd block size, a window starting before position 0, two requests
        IndexerWriterCase(compressor=C(seed=8, positions=(3, 11, 6), reqs=(0, 1, 0), num_reqs=2, slots=(4, 1, 0),
                                       block_size=3, num_blocks=2, state_block_size=3, stride_pad=64,
                                       extra_blocks_before=1)),
        # compressor FP8 into SHUFFLE with the scale as four UE8M0 bytes
        IndexerWriterCase(compressor=C(seed=9, positions=(7, 15), reqs=(0, 0), slots=(18, 3), block_size=16,
                                       num_blocks=2, layout="shuffle", mx_scale=True, score_scale=4.0)),
        # compressor MXFP4
        IndexerWriterCase(compressor=C(seed=10, positions=(7, 3), reqs=(0, 0), slots=(2, 0), block_size=1,
                                       num_blocks=3, kv_format="mxfp4", extra_blocks_before=2, stride_pad=4)),
    ]


def _examples(target: Target) -> list[IndexerWriterCase]:
    v = subject_variants(target)

    def ok(c: IndexerWriterCase) -> bool:
        if c.direct is not None:
            return c.direct.layout in v["direct_layouts"]
        cc = c.compressor
        return (cc.kv_format in v["compressor_formats"] and cc.layout in v["compressor_layouts"]
                and cc.mx_scale in v["mx_scale"])

    return [c for c in _all_examples() if ok(c)]


@contract("indexer-writer-exact", targets=ALL_TARGETS, cases=_cases, examples=_examples, min_cases=5,
          case_type=IndexerWriterCase, numeric=True)
def indexer_writer_exact(case: IndexerWriterCase, target: Target) -> list[Violation]:
    """Both indexer-K writers agree with their oracles byte for byte (SPEC 1.3, 4; DESIGN.md "Oracles").

    Direct writer: every byte of the pool equals the reference's (one fp8 block of 128 per token in the target's
    platform fp8, scale max(amax, 1e-4) / 448 OCP or / 224 FNUZ, rounded up to a power of two for "ue8m0"; NORMAL and
    SHUFFLE; negative slots skipped; bytes of other slots and outside the view untouched); a layout that cannot hold
    the block size raises ValueError and changes nothing. Head-128 compressor (C4A; FP8 NORMAL/SHUFFLE with an fp32 or
    4 x UE8M0 scale word, MXFP4): the kernel's fp32 rows (pooled, normed, RoPE first) are within the derived
    tolerance of the oracle's (NaN/inf masks exact); quantizing the kernel's own rows with the oracle reproduces the
    pool byte for byte; end-to-end bytes equal the oracle's except where a rounding boundary lies between the two
    fp32 values (counted in ``BOUNDARY_TALLY``). Inputs include NaN, +-inf, huge, denormal and all-zero values."""
    inner = case.direct if case.direct is not None else case.compressor
    if inner.input_layout != "contiguous":
        return compare_strided_index(inner, target)
    if case.direct is not None:
        return compare_direct(case.direct, target)
    violations, boundary = compare_compressor(case.compressor, target)
    if not violations:
        BOUNDARY_TALLY[target.name] += boundary
    return violations
