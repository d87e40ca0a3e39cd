"""Split selectors: SPEC's checkpoints, the independent re-derivation, the caps, the adaptive rules, and the
split-bounds contract on both AMD targets (skipped on generic)."""
from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import impl  # noqa: F401
from contracts import splits as _split_contracts  # noqa: F401  (registers the contract)
from contracts.core import CONTRACTS
from contracts.engine.runner import run_contract
from fuzz import splits as fz
from fuzz.cases import CaseError
from fuzz.splits import SplitCase
from impl import splits
from impl.runtime import kernel_device
from impl.targets import TARGETS
from oracles import splits as ref


@pytest.mark.parametrize("selector, b, h, avg_main, avg_extra, want", [
    # SPEC section 2, "Checks at CU=256" (from upstream's tests)
    ("gfx950", 1, 1, 128, 8192, 32),
    ("gfx950", 17, 1, 128, 32, 4),
    ("gfx950", 512, 1, 128, 7812, 1),
    ("gfx942", 1, 1, 128, 8192, 16),
    ("gfx942", 256, 1, 128, 8192, 1),
])
def test_spec_checkpoints(selector, b, h, avg_main, avg_extra, want):
    fn = splits.SELECTORS[selector]
    assert fn(b, h, b * avg_main, b * avg_extra, 256) == want
    assert {"gfx942": ref.ref_num_splits_gfx942, "gfx950": ref.ref_num_splits_gfx950}[selector](
        b, h, b * avg_main, b * avg_extra, 256) == want


def test_caps_match_targets():
    assert TARGETS["gfx942"].split_cap == splits.GFX942_MAX_SPLITS == 16
    assert TARGETS["gfx950"].split_cap == splits.GFX950_MAX_SPLITS == 32
    assert TARGETS["generic"].split_selector is None


@settings(max_examples=300, deadline=None, database=None)
@given(st.integers(1, 3000), st.sampled_from([1, 3, 16, 17, 64, 128]), st.integers(0, 600), st.integers(0, 30000),
       st.integers(0, 40), st.integers(1, 600))
def test_selectors_equal_reference_and_stay_in_bounds(b, h, am, ae, slack, cu):
    main_numel, extra_numel = b * am + slack, b * ae
    for sel, want_fn, cap in (("gfx942", ref.ref_num_splits_gfx942, 16), ("gfx950", ref.ref_num_splits_gfx950, 32)):
        got = splits.select_num_splits(sel, b, h, main_numel, extra_numel, cu)
        assert 1 <= got <= cap
        assert got == want_fn(b, h, main_numel, extra_numel, cu)


def test_split_choice_depends_on_sizes_not_indptr():
    """Sync-free: the launch is chosen from tensor sizes only, so two batches with the same index numel but very
    different per-row lengths (indptr) launch the same kernels on the same grids. The inputs live where the
    kernels run (the interpreter's CPU here, the GPU on a GPU host)."""
    import torch

    from impl import decode, formats

    dev = kernel_device()
    _, cache = formats.allocate_fp8_ds_mla_pool(4, 16, device=dev)
    q = torch.zeros(2, 3, 512, dtype=torch.bfloat16, device=dev)
    idx = torch.arange(40, dtype=torch.int32, device=dev)
    launches = {}
    for name, ptr in (("even", [0, 20, 40]), ("skewed", [0, 1, 40])):
        seen = []
        prev = decode.set_launch_observer(lambda rec: seen.append((rec.kernel, rec.grid)))
        try:
            decode.sparse_attn_decode(q, cache, idx, torch.tensor(ptr, dtype=torch.int32, device=dev),
                                      target="gfx950", check_indptr=False)
        finally:
            decode.set_launch_observer(prev)
        launches[name] = seen
    assert len(launches["even"]) == 2 and launches["even"][0][1][1] > 1  # a split-K partial and the reduce
    assert launches["even"] == launches["skewed"]


def test_gfx950_partitioned_device_never_returns_zero():
    # base in [16, 64) but CU < base: SPEC's CU // base would be 0; the suite keeps >= 1 split
    assert splits.num_splits_gfx950(40, 1, 40 * 100, 40 * 5000, 38) >= 1
    assert ref.ref_num_splits_gfx950(40, 1, 40 * 100, 40 * 5000, 38) == splits.num_splits_gfx950(
        40, 1, 40 * 100, 40 * 5000, 38)


@pytest.mark.parametrize("args, match", [
    ((0, 1, 0, 0, 256), "batch"), ((1, 0, 0, 0, 256), "num_heads"), ((1, 1, -1, 0, 256), "main_numel"),
    ((1, 1, 0, 0, 0), "cu_count"),
])
def test_bad_sizes_raise(args, match):
    with pytest.raises(ValueError, match=match):
        splits.num_splits_gfx942(*args)
    with pytest.raises(ValueError, match=match):
        splits.num_splits_gfx950(*args)


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(0, 2000), st.integers(0, 2000), st.integers(5, 32).flatmap(
    lambda s: st.tuples(st.just(s), st.integers(1, s))))
def test_adaptive_active_splits_equal_reference(lm, le, s_ow):
    s, ow = s_ow
    got = splits.adaptive_active_splits(lm, le, s, ow)
    assert got == ref.ref_adaptive_active(lm, le, s, ow)
    assert 1 <= got <= s


@settings(max_examples=200, deadline=None, database=None)
@given(st.integers(1, 300), st.sampled_from([1, 16, 64, 128]), st.integers(1, 32), st.integers(1, 600))
def test_adaptive_host_plan_equals_reference(b, h, s, cu):
    ap = splits.adaptive_plan(s, b, h, cu)
    assert (ap.enabled, ap.one_wave) == ref.ref_adaptive_host(s, b, h, cu)


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_split_bounds_contract(target):
    row = run_contract(CONTRACTS["split-bounds"], target, profile="ci", budget=30)
    if target == "generic":
        assert row.status == "skipped" and "selector" in row.reason
    else:
        assert row.status == "pass", row.violations


@settings(max_examples=60, deadline=None, database=None)
@given(fz.split_cases(256))
def test_split_case_round_trips_through_json(case):
    assert SplitCase.from_json(case.to_json()) == case
    assert SplitCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_split_case_rejects_a_missing_field_and_bad_sizes():
    case = SplitCase(batch=2, heads=16, avg_main=128, avg_extra=0, ragged_slack=3, cu_count=256)
    assert (case.main_numel, case.extra_numel) == (259, 0)
    for f in dataclasses.fields(case):
        doc = case.to_json()
        del doc[f.name]
        with pytest.raises(CaseError, match=f"missing field {f.name}"):
            SplitCase.from_json(doc)
    with pytest.raises(CaseError, match="cu_count: expected an int >= 1"):
        SplitCase.from_json({**case.to_json(), "cu_count": 0})
    with pytest.raises(CaseError, match="batch: expected an integer"):
        SplitCase.from_json({**case.to_json(), "batch": 2.0})
