"""DSv4 cache writers (SWA insert, compressor single-pass and two-stage), the trust gate, and their contracts."""
from __future__ import annotations

import dataclasses
import json
import time

import pytest
import torch

import impl  # noqa: F401  (selects the Triton mode before Triton is imported)
import contracts.cache_writers as cw
import contracts.int64_probes  # noqa: F401  (registers int64-addressing, run below with the writers' contracts)
from contracts.core import CONTRACTS, collecting_margins
from contracts.engine.runner import run_contract
from fuzz import cache_writers as fw
from fuzz.cases import CASE_SCHEMA_VERSION, CaseError
from impl.cache_writers import quantize_and_insert_k_cache, trust_extra_cache_nan_free
from impl.compressor import compress_norm_rope_store, num_two_stage_splits
from impl.runtime import kernel_device
from impl.targets import get_target
from oracles import cache_writers as ocw
from oracles import compressor as ocomp
from oracles import trust_gate as otg
from oracles.formats import storage_bytes

DEV = kernel_device()

SWA_CASE = fw.SwaCase(seed=3, T=4, block_size=5, padded=True, extra_blocks_before=2, spare_blocks=1, num_blocks=2,
                      slots=(9, -1, 0, 4), log_scale=(0, 12, -25, 30),
                      specials=((0, 3, "nan"), (2, 80, "inf"), (3, 460, "nan"), (3, 130, "zero-group"),
                                (0, 300, "denormal")))


def compressor_case(**kw) -> fw.CompressorCase:
    base = dict(seed=21, ratio=128, state_block_size=8, num_reqs=2, positions=(255, 127, 383), reqs=(1, 0, 1),
                block_size=3, padded=False, extra_blocks_before=1, spare_blocks=1, num_blocks=2, slots=(5, 0, 2),
                score_scale=4.0, weight="normal", eps=1e-6, two_stage=True, splits=None, specials=())
    return fw.CompressorCase(**{**base, **kw})


def run_case(case, target, two_stage=None, intermediates=True):
    inp = fw.build_compressor_inputs(case, DEV)
    _, cache = fw.build_cache(case, DEV)
    inter = torch.full((len(case.positions), 512), float("nan"), device=DEV) if intermediates else None
    ts = case.two_stage if two_stage is None else two_stage
    cw._run_compressor(inp, cache, case, get_target(target), ts, case.splits, inter)
    return inp, cache, inter


# --- oracle agreement -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_swa_insert_matches_reference_bytes(target):
    res = cw.compare_swa(SWA_CASE, get_target(target))
    assert res.violations == [] and res.tokens == 3


def test_swa_flavour_follows_target():
    """gfx942's main cache is FNUZ (range 240), gfx950's OCP (448): the same k gives different bytes."""
    k, slots = fw.build_swa_inputs(SWA_CASE, DEV)
    out = {}
    for t in ("gfx942", "gfx950"):
        _, cache = fw.build_cache(SWA_CASE, DEV)
        quantize_and_insert_k_cache(k, slots, cache, target=t)
        out[t] = ocw.read_token(cache, 9)
        want = ocw.quantize_pack_row(k[0].cpu(), flavour=get_target(t).main_cache_fp8, cap=255, sanitize=False,
                                     rope_from_fp32=False)
        assert torch.equal(out[t]["nope"], want["nope"]) and torch.equal(out[t]["scale"], want["scale"])
    assert not torch.equal(out["gfx942"]["nope"], out["gfx950"]["nope"])


@pytest.mark.parametrize("target,ratio,two_stage", [("gfx950", 128, True), ("gfx942", 4, False),
                                                    ("gfx950", 4, False)])
def test_compressor_oracle_stages(target, ratio, two_stage):
    """Stage 1 within tolerance, stage 2 byte-exact, end-to-end differences only at counted boundaries; for ratio
    128 both variants run and agree."""
    case = compressor_case(two_stage=two_stage) if ratio == 128 else compressor_case(
        ratio=4, state_block_size=4, positions=[7, 11, 2], two_stage=False, specials=[[1, "score", 9, "-inf"]])
    res = cw.compare_compressor(case, get_target(target))
    assert res.violations == []
    assert res.tokens == (3 if ratio == 128 else 2)
    assert isinstance(res.boundary_bytes, int) and res.boundary_bytes >= 0


def test_two_stage_agrees_with_single_pass_for_every_split_count():
    for splits in (1, 2, 4, 8, 16):
        res = cw.compare_compressor(compressor_case(splits=splits, positions=[127], reqs=[0], slots=[1]),
                                    get_target("gfx950"))
        assert res.violations == [], (splits, res.violations[:2])


def test_inf_kv_with_underflowing_weight_is_inf_in_both_variants():
    """Regression (dev sweep): a -inf kv whose weight exp(score - max) underflows to 0 against the window's max but
    not against its split's max pools to -inf in both variants and the oracle (not -inf * 0 = NaN in some of them):
    mean(c^2) = inf, r = 0, so every lane is +-0 except dim 460 (-inf * 0), its RoPE partner 461 and dim 300
    (weight inf)."""
    case = cw.INF_KV_UNDERFLOW_CASE
    inp = fw.build_compressor_inputs(case, DEV)
    kv, sc, _ = ocomp.gather_window(inp["state"], inp["state_block_table"], 0, 127, 128)
    assert float(kv[118, 460]) == float("-inf")
    # the premise: the weight underflows against the window max, not against the max of rows 112..127
    assert float(torch.exp(sc[118, 460] - sc[:, 460].max())) == 0.0
    assert float(torch.exp(sc[118, 460] - sc[112:128, 460].max())) > 0.0
    want_nan = torch.zeros(512, dtype=torch.bool)
    want_nan[[300, 460, 461]] = True
    ref = ocomp.token_reference(inp["state"], inp["state_block_table"], 0, 127, inp["norm_weight"],
                                inp["cos_sin_cache"], ratio=128, eps=case.eps)
    assert torch.equal(torch.isnan(ref["row"]), want_nan)
    rows = {}
    for two_stage in (True, False):
        _, cache, inter = run_case(case, "gfx942", two_stage=two_stage)
        row = inter[0].cpu()
        assert torch.equal(torch.isnan(row), want_nan), two_stage
        assert bool((row[~want_nan] == 0).all()), two_stage
        tok = ocw.read_token(cache, 1)
        # zero groups take the 1e-4 amax floor (code 105); group 4 holds the NaN of dim 300 (unsanitized: 255)
        assert tok["scale"].tolist() == [105] * 4 + [255] + [105] * 2, two_stage
        rows[two_stage] = row
    assert torch.equal(rows[True].view(torch.int32)[~want_nan], rows[False].view(torch.int32)[~want_nan])
    for target in ("generic", "gfx942", "gfx950"):
        assert cw.compare_compressor(case, get_target(target)).violations == [], target


def test_tolerance_is_not_vacuous():
    """The derived tolerance is small relative to the values it guards (a wrong RoPE row or norm would exceed it)."""
    case = compressor_case()
    inp = fw.build_compressor_inputs(case, DEV)
    ref = ocomp.token_reference(inp["state"], inp["state_block_table"], 1, 255, inp["norm_weight"],
                                inp["cos_sin_cache"], ratio=128, eps=1e-6)
    tol, exact = ref["tol"], ref["exact"].abs()
    assert 0 < float((tol / exact).median()) < 1e-3
    assert float(tol.max() / exact.max()) < 2e-3


def test_boundary_classifier_counts_only_rounding_boundaries():
    row = torch.ones(512)
    row[1] = 1.75  # group 0: amax / 448 = 2^-8, so e4m3 values are x * 256
    lo, hi = row.clone(), row.clone()
    lo[0], hi[0] = 1.0625, 1.0703125  # scaled 272 (the tie between e4m3 256 and 288, to even: 256) and 274 (288)
    lo[448], hi[448] = 1.0 + 2.0 ** -8 - 2.0 ** -20, 1.0 + 2.0 ** -8 + 2.0 ** -20  # either side of a bf16 midpoint
    a = ocomp.pack_reference_row(lo, cap=255, sanitize=False)
    b = ocomp.pack_reference_row(hi, cap=255, sanitize=False)
    assert int(a["nope"][0]) != int(b["nope"][0]) and not torch.equal(a["rope"], b["rope"])
    n, bad = ocomp.classify_token_bytes(a, b, lo, hi, sanitize=False)
    assert n == 1 + 2 and bad == []
    far = hi.clone()
    far[5] = 1.5  # a real difference, far from any boundary between the two rows
    c = ocomp.pack_reference_row(far, cap=255, sanitize=False)
    n, bad = ocomp.classify_token_bytes(a, c, lo, far, sanitize=False)
    assert n == 3 and len(bad) == 1 and "nope byte 5" in bad[0]


# --- sanitizing and the unsanitized path -------------------------------------------------------------------------

POISON = compressor_case(ratio=4, state_block_size=4, positions=[7, 11], reqs=[0, 1], slots=[0, 3],
                         two_stage=False, specials=[[0, "kv", 3, "nan"], [1, "score", 70, "inf"]])
HUGE_ROPE = compressor_case(ratio=4, state_block_size=4, positions=[11], reqs=[0], num_reqs=1, slots=[0],
                            two_stage=False, weight="huge-rope", seed=1)


@pytest.mark.parametrize("target", ["gfx942", "generic"])
def test_unsanitized_path_emits_nan_code_and_nan_bytes(target):
    """On non-sanitizing targets the generators' inputs really produce UE8M0 code 255, NaN e4m3 bytes and non-finite
    RoPE lanes, so nan-free-cache's gfx950 check is not vacuous and the gate must stay closed there."""
    _, cache, _ = run_case(POISON, target)
    toks = [ocw.read_token(cache, s) for s in (0, 3)]
    assert any(bool((t["scale"] == 255).any()) for t in toks)
    assert any(bool(((t["nope"].to(torch.int64) & 0x7F) == 0x7F).any()) for t in toks)
    assert any(not bool(torch.isfinite(t["rope"].view(torch.bfloat16).float()).all()) for t in toks)
    assert trust_extra_cache_nan_free(target, "fp8_ds_mla", False, True) is False
    _, cache, inter = run_case(HUGE_ROPE, target)
    rope = ocw.read_token(cache, 0)["rope"].view(torch.bfloat16).float()
    assert bool(torch.isinf(rope).any())


def test_sanitizing_target_stores_finite_cache_for_the_same_inputs():
    for case in (POISON, HUGE_ROPE, POISON.replace(two_stage=True, ratio=128, state_block_size=8, positions=(127,),
                                                    reqs=(0,), slots=(1,))):
        _, cache, inter = run_case(case, "gfx950")
        for t, (p, s) in enumerate(zip(case.positions, case.slots)):
            if s >= 0 and (p + 1) % case.ratio == 0:
                tok = ocw.read_token(cache, s)
                assert cw.cache_token_problems(tok) == [], (case.weight, t)
                assert int(tok["scale"].max()) <= 254
    # the finding (FINDINGS.md F1): the fp32 rotated lanes hold +-inf, which NaN-only clearing would store
    _, _, inter = run_case(HUGE_ROPE, "gfx950")
    assert bool(torch.isinf(inter[0, 448:]).any())


def test_nan_free_generator_reaches_rope_overflow_within_the_ci_profile():
    """The generated cases alone (the zoo's setting) reach +-inf RoPE lanes in several writing tokens, so a writer
    that clears NaN but not inf is caught without the pinned examples."""
    seen = []

    def record(case, target):
        seen.append(case)
        return []

    contract = dataclasses.replace(CONTRACTS["nan-free-cache"], check=record)
    row = run_contract(contract, "gfx950", profile="ci", budget=60, use_examples=False)
    assert row.status == "pass" and len(seen) >= 20, (row.status, len(seen))
    hits = 0
    for case in seen:
        inp = fw.build_compressor_inputs(case, "cpu")
        refs = ocomp.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"],
                                          inp["positions"], inp["slot_mapping"], inp["norm_weight"],
                                          inp["cos_sin_cache"], ratio=case.ratio, eps=case.eps)
        hit = any(bool(torch.isinf(r["row"][448:].to(torch.bfloat16)).any()) for r in refs)
        hits += hit
        # the covering rows give each RoPE-overflow weight norm-safe specials: "huge-rope" always overflows there
        # ("rope-near-max" only in some lanes of some tokens) - in a case where some token writes (refs lists the
        # writing tokens: a padding slot, or a position short of its compression boundary, writes nothing)
        if case.weight == "huge-rope" and fw.classify_nan_free(case, None)["special"] in ("none", "tiny") and refs:
            assert hit, case
    assert hits >= 4, (hits, len(seen))


# --- bad input -----------------------------------------------------------------------------------------------------

def _bytes(cache):
    return storage_bytes(cache)[0].cpu().clone()


def test_swa_bad_input_raises_before_writing():
    k, slots = fw.build_swa_inputs(SWA_CASE, DEV)
    _, cache = fw.build_cache(SWA_CASE, DEV)
    before = _bytes(cache)
    bad_calls = [
        (TypeError, dict(k=k.float())),
        (ValueError, dict(k=k[:, :448])),
        (ValueError, dict(slot_mapping=slots[:-1])),
        (TypeError, dict(slot_mapping=slots.to(torch.int32))),
        (ValueError, dict(slot_mapping=torch.tensor([9, -1, 9, 4]))),  # duplicate slot
        (ValueError, dict(slot_mapping=torch.tensor([9, -2, 0, 4]))),
        (ValueError, dict(slot_mapping=torch.tensor([9, -1, 0, 10 ** 6]))),
        (ValueError, dict(cache=cache[:, :, :576])),
        (ValueError, dict(target="gfx1100")),
    ]
    bad_calls.append((ValueError, dict(k=k.to("meta") if DEV == "cpu" else k.cpu())))  # not on the kernel device
    for exc, over in bad_calls:
        args = dict(k=k, slot_mapping=slots, cache=cache, target="gfx950")
        args.update(over)
        with pytest.raises(exc):
            quantize_and_insert_k_cache(args.pop("k"), args.pop("slot_mapping"), args.pop("cache"), **args)
        assert torch.equal(_bytes(cache), before), over


def test_compressor_bad_input_raises_before_writing():
    case = compressor_case(ratio=4, state_block_size=4, positions=[7, 3], reqs=[0, 1], slots=[0, 3],
                           two_stage=False)
    inp = fw.build_compressor_inputs(case, DEV)
    _, cache = fw.build_cache(case, DEV)
    before = _bytes(cache)
    bad = [
        (ValueError, dict(ratio=8)),
        (ValueError, dict(ratio=128)),  # state rows are 2048 wide for ratio 4, 1024 for 128
        (ValueError, dict(two_stage=True)),  # two-stage is for ratio 128
        (TypeError, dict(state=inp["state"].double())),
        (ValueError, dict(norm_weight=inp["norm_weight"][:448])),
        (ValueError, dict(cos_sin_cache=inp["cos_sin_cache"][:, :32])),
        (ValueError, dict(cos_sin_cache=inp["cos_sin_cache"][:4])),  # position 7 needs row 4
        (ValueError, dict(slot_mapping=torch.tensor([0, 0]))),  # both tokens write slot 0
        (ValueError, dict(slot_mapping=torch.tensor([0]))),
        (ValueError, dict(positions=torch.tensor([7, -1]))),
        (ValueError, dict(token_to_req=torch.tensor([0, 5], dtype=torch.int32))),
        (ValueError, dict(state_block_table=inp["state_block_table"][:, :1])),
        (ValueError, dict(eps=float("nan"))),
        (ValueError, dict(intermediates=torch.zeros(3, 512))),
    ]
    for exc, over in bad:
        args = dict(inp, cache=cache, ratio=4, eps=1e-6, target="gfx950")
        args.update(over)
        with pytest.raises(exc):
            compress_norm_rope_store(args.pop("state"), args.pop("state_block_table"), args.pop("token_to_req"),
                                     args.pop("positions"), args.pop("slot_mapping"), args.pop("norm_weight"),
                                     args.pop("cos_sin_cache"), args.pop("cache"), **args)
        assert torch.equal(_bytes(cache), before), over


def test_two_stage_bad_splits_raise_before_writing():
    """``splits=True`` is an int to ``isinstance`` but must not be read as one split."""
    case = compressor_case(positions=[127], reqs=[0], num_reqs=1, slots=[1])
    inp = fw.build_compressor_inputs(case, DEV)
    _, cache = fw.build_cache(case, DEV)
    before = _bytes(cache)
    for exc, splits in ((TypeError, True), (TypeError, False), (TypeError, 2.0), (TypeError, "4"),
                        (ValueError, 0), (ValueError, 3), (ValueError, 32)):
        with pytest.raises(exc, match="splits"):
            compress_norm_rope_store(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                                     inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"], cache,
                                     ratio=128, target="gfx950", two_stage=True, splits=splits)
        assert torch.equal(_bytes(cache), before), splits
    # one split is valid and writes (the rejection above is about the type, not the value 1)
    compress_norm_rope_store(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                             inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"], cache, ratio=128,
                             target="gfx950", two_stage=True, splits=1)
    assert not torch.equal(_bytes(cache), before)


def test_duplicate_slot_of_a_non_writing_token_is_allowed():
    """Only tokens that write (slot >= 0, window end) must have distinct slots."""
    case = compressor_case(ratio=4, state_block_size=4, positions=[7, 6], reqs=[0, 0], num_reqs=1, slots=[2, 2],
                           two_stage=False)
    res = cw.compare_compressor(case, get_target("gfx950"))
    assert res.violations == [] and res.tokens == 1


# --- trust gate and split count ----------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_trust_gate_truth_table(target):
    rows = otg.truth_table(target)
    assert len(rows) == 4 * len(otg.CACHE_DTYPES)
    for (_, dtype, kv, extra), want in rows:
        assert trust_extra_cache_nan_free(target, dtype, kv, extra) is want
    assert sum(w for _, w in rows) == (1 if target == "gfx950" else 0)
    with pytest.raises(TypeError):
        trust_extra_cache_nan_free(target, "fp8_ds_mla", None, True)


def test_two_stage_split_count():
    # SPEC 4: largest power of two <= min(ceil(CU / (T / ratio)), 16)
    assert num_two_stage_splits(1, 128, "gfx950") == 16
    assert num_two_stage_splits(4096, 128, "gfx950") == 8  # ceil(256 * 128 / 4096) = 8
    assert num_two_stage_splits(5000, 128, "gfx950") == 4  # ceil(6.55) = 7
    assert num_two_stage_splits(4096, 128, "gfx942") == 8  # ceil(9.5) = 10
    assert num_two_stage_splits(10 ** 6, 128, "gfx942") == 1


# --- the contracts under the ci profile -----------------------------------------------------------------------------

# every contract passing on every target under the ci profile is tests/test_contracts.py's job; here only what it
# does not check: the > 2^32-byte int64 pools stay cheap (pages are committed only where touched)
@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_int64_probes_stay_cheap(target):
    start = time.monotonic()
    row = run_contract(CONTRACTS["int64-addressing"], target, profile="ci", budget=60)
    assert row.status == "pass", (row.reason, row.case)
    assert time.monotonic() - start < 30


# --- typed cases ------------------------------------------------------------------------------------------------------

_FAMILIES = [
    ("writer-oracle-exact", fw.WriterCase, fw.writer_cases()),
    ("nan-free-cache", fw.CompressorCase, fw.nan_free_cases()),
    ("trust-gate", fw.TrustGateCase, fw.trust_gate_cases()),
]


@pytest.mark.parametrize("cid,case_type,strategy", _FAMILIES, ids=[f[0] for f in _FAMILIES])
def test_cases_round_trip_through_json_and_reject_a_missing_field(cid, case_type, strategy):
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    assert CONTRACTS[cid].case_type is case_type

    @settings(max_examples=40, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(case=strategy, data=st.data())
    def prop(case, data):
        assert isinstance(case, case_type)
        doc = json.loads(json.dumps(case.to_json()))
        assert case_type.from_json(doc) == case
        # drop one field, at the top or inside the nested writer case
        holder, kind = doc, case_type
        if case_type is fw.WriterCase:
            holder = doc["swa"] if doc["swa"] is not None else doc["compressor"]
            kind = fw.SwaCase if doc["swa"] is not None else fw.CompressorCase
        later = ("kind", "schema_version", *kind.ADDED_FIELDS)  # the added ones replay older cases by default
        name = data.draw(st.sampled_from(sorted(k for k in holder if k not in later)))
        del holder[name]
        with pytest.raises(CaseError, match=f"missing field {name}"):
            case_type.from_json(doc)

    prop()


def test_int64_case_round_trips_and_rejects_unknown_probes():
    from contracts.int64_probes import INT64_PROBES, Int64Case

    assert CONTRACTS["int64-addressing"].case_type is Int64Case and CONTRACTS["int64-addressing"].numeric
    case = Int64Case(probes=tuple(sorted(INT64_PROBES)))
    assert Int64Case.from_json(json.loads(json.dumps(case.to_json()))) == case
    with pytest.raises(CaseError, match="missing field probes"):
        Int64Case.from_json({"kind": "int64-addressing", "schema_version": CASE_SCHEMA_VERSION})
    with pytest.raises(CaseError, match="unknown"):
        Int64Case.from_json(dict(case.to_json(), probes=["swa-insert", "nope"]))


def test_malformed_writer_cases_are_case_errors():
    doc = cw.INF_KV_UNDERFLOW_CASE.to_json()
    for change, match in ((dict(ratio=8), "ratio"), (dict(slots=[1]), "one entry per token"),
                          (dict(specials=[[0, "kv", 600, "nan"]]), "dim 0..511"),
                          (dict(specials=[[0, "kv", 6, "nan?"]]), "expected one of"),
                          (dict(splits=4, two_stage=False), "splits only for two_stage"),
                          (dict(slots=[7, -1]), r"outside -1\.\.6")):
        with pytest.raises(CaseError, match=match):
            fw.CompressorCase.from_json(dict(doc, **change))
    with pytest.raises(CaseError, match="exactly one"):
        fw.WriterCase.from_json({"kind": "writer", "schema_version": CASE_SCHEMA_VERSION, "swa": None,
                                 "compressor": None})
    with pytest.raises(CaseError, match="one entry per token"):
        fw.SwaCase.from_json(dict(SWA_CASE.to_json(), log_scale=[0]))


# --- margins --------------------------------------------------------------------------------------------------------

def test_writer_oracle_records_the_fp32_stage_margin_and_the_byte_stage_none():
    check = CONTRACTS["writer-oracle-exact"].check
    target = get_target("gfx950")
    with collecting_margins() as margins:
        assert check(fw.WriterCase(compressor=compressor_case()), target) == []
    # three tokens, each against the oracle in both variants, plus the variants against each other
    assert len(margins) == 3 * 3
    assert all(0 < m <= 1 for m in margins), margins
    with collecting_margins() as margins:
        assert check(fw.WriterCase(swa=SWA_CASE), target) == []
    assert margins == []  # the SWA insert is compared byte for byte: no tolerance, no margin
    assert not CONTRACTS["nan-free-cache"].numeric and not CONTRACTS["trust-gate"].numeric
    assert CONTRACTS["writer-oracle-exact"].numeric


def test_trust_gate_case_is_read_by_attribute():
    check = CONTRACTS["trust-gate"].check
    for dtype in otg.CACHE_DTYPES:
        assert check(fw.TrustGateCase(cache_dtype=dtype, has_kv_transfer=False, has_extra_cache=True),
                     get_target("gfx950")) == []
