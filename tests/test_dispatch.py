"""decode_dispatch against the independent truth table, over every target and flag combination."""
import dataclasses
import json

import pytest
from hypothesis import given, settings

import impl  # noqa: F401
from fuzz.cases import CaseError
from fuzz.dispatch import DispatchCase, DispatchFlags, dispatch_cases, dispatch_flag_grid
from impl.cache_writers import trust_extra_cache_nan_free
from impl.dispatch import DecodeDispatch, decode_dispatch
from oracles.dispatch import expected_dispatch

VALID = dict(compress_ratio=128, swa_only=False, for_cudagraph_capture=True, has_extra_cache=True,
             kv_cache_dtype="fp8_ds_mla", has_kv_transfer=False)


def test_every_flag_combination_matches_the_truth_table(target):
    grid = dispatch_flag_grid()
    assert len(grid) == 4 * 2 * 2 * 2 * 4 * 2
    valid = 0
    for flags in grid:
        want = expected_dispatch(target.name, **flags.kwargs())
        if want is None:
            with pytest.raises(ValueError):
                decode_dispatch(target, **flags.kwargs())
            continue
        valid += 1
        got = dataclasses.asdict(decode_dispatch(target, **flags.kwargs()))
        assert got == want, flags
        # the gate is the writers' own function, not a second copy of the rule
        assert got["trust_extra_nan_free"] == trust_extra_cache_nan_free(
            target, flags.kv_cache_dtype, flags.has_kv_transfer, flags.has_extra_cache)
    # ratio x capture x extra x dtype x transfer: SWA-only layers (no extra cache) + C4A/C128A layers
    assert valid == 2 * 2 * 1 * 4 * 2 + 2 * 2 * 2 * 4 * 2


def test_adaptive_splits_exactly_where_spec_allows():
    on = [(t, f.compress_ratio, f.for_cudagraph_capture) for t in ("gfx942", "gfx950", "generic")
          for f in dispatch_flag_grid()
          if expected_dispatch(t, **f.kwargs()) and decode_dispatch(t, **f.kwargs()).adaptive_splits]
    assert on and all(x == ("gfx950", 128, True) for x in on)


def test_gfx942_keeps_the_legacy_path():
    d = decode_dispatch("gfx942", **VALID)
    assert (d.kernel_family, d.split_selector, d.split_cap, d.ragged_view_rule, d.adaptive_splits,
            d.trust_extra_nan_free, d.main_cache_fp8) == ("gfx942", "gfx942", 16, "full", False, False, "fnuz")
    g = decode_dispatch("gfx950", **VALID)
    assert (g.split_cap, g.ragged_view_rule, g.adaptive_splits, g.trust_extra_nan_free) == (32, "source", True, True)
    assert isinstance(g, DecodeDispatch)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.adaptive_splits = False


@pytest.mark.parametrize("name, value, exc", [
    ("compress_ratio", 2, ValueError), ("compress_ratio", True, TypeError), ("swa_only", 1, TypeError),
    ("for_cudagraph_capture", None, TypeError), ("kv_cache_dtype", None, TypeError),
    ("has_kv_transfer", "no", TypeError), ("swa_only", True, ValueError),
])
def test_bad_flags_named(name, value, exc):
    with pytest.raises(exc, match=name):
        decode_dispatch("gfx950", **{**VALID, name: value})


def test_swa_layer_with_extra_cache_rejected():
    with pytest.raises(ValueError, match="has_extra_cache"):
        decode_dispatch("gfx950", **{**VALID, "compress_ratio": 1, "swa_only": True})


@settings(max_examples=40, deadline=None, database=None)
@given(dispatch_cases())
def test_dispatch_case_round_trips_through_json(case):
    assert DispatchCase.from_json(case.to_json()) == case
    assert DispatchCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_dispatch_case_rejects_a_missing_field():
    case = DispatchCase(flags=(DispatchFlags(**VALID),))
    doc = case.to_json()
    del doc["flags"]
    with pytest.raises(CaseError, match="missing field flags"):
        DispatchCase.from_json(doc)
    for name in VALID:
        doc = case.to_json()
        del doc["flags"][0][name]
        with pytest.raises(CaseError, match=rf"flags\[0\]: missing field {name}"):
            DispatchCase.from_json(doc)
    with pytest.raises(CaseError, match="kv_cache_dtype"):
        DispatchCase.from_json({**case.to_json(), "flags": [{**VALID, "kv_cache_dtype": "fp16"}]})
    with pytest.raises(CaseError, match="swa_only: expected true/false"):
        DispatchCase.from_json({**case.to_json(), "flags": [{**VALID, "swa_only": 0}]})
