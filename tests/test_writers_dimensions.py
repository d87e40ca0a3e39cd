"""Declared dimensions of the writer contracts: nan-free-cache, indexer-writer-exact, int64-addressing, trust-gate."""
from __future__ import annotations

import pytest

from fuzz import dimensions as D
from impl.targets import TARGET_NAMES, get_target


def _check_family(family, t):
    for strength in (2, 3):
        req = family.required(t, strength)
        got = set()
        array = family.covering_array(t, strength)
        for row in array:
            got |= D.covered_by(req, frozenset(row.items()))
        assert set(req) == got, sorted(set(req) - got)[:3]
        assert all(family._ok(row, t) for row in array)
    array = family.covering_array(t, 2)
    assert len(array) <= 25
    for base in family.examples(t):
        for row in array:
            got = family.classify(family.force(base, row, t), t)
            assert {k: got.get(k) for k in row} == row, (base, row, got)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_int64_family_names_every_probe_and_each_row_runs_one(target):
    import contracts.int64_probes as m

    t = get_target(target)
    family = D.family_for("int64-addressing")
    assert family is m.INT64_DIMENSIONS
    assert set(family.values("probe", t)) == set(m.subject_probes(t)) == set(m.INT64_PROBES)
    _check_family(family, t)
    assert [family.force(family.examples(t)[0], row, t).probes for row in family.covering_array(t, 2)] == \
        [(p,) for p in m.INT64_PROBES]


def test_trust_gate_is_exhaustive():
    import contracts.cache_writers  # noqa: F401  registers the contracts
    from contracts.core import CONTRACTS

    assert CONTRACTS["trust-gate"].extra.get("exhaustive") is True
    assert D.family_for("trust-gate") is None


def test_nan_free_rows_reach_a_non_finite_token_on_gfx950_and_only_checked_ones_elsewhere():
    """A forced special of a non-finite or overflowing class really makes the stored token's fp32 computation
    non-finite or overflowing (the oracle says so); off the sanitizing target the array keeps to tokens the contract
    checks (finite, overflow-free)."""
    import fuzz.cache_writers as fw
    from oracles import compressor as ocomp

    family = D.family_for("nan-free-cache")
    for name in TARGET_NAMES:
        t = get_target(name)
        base = family.examples(t)[0]  # ratio 4: cheap
        for row in family.covering_array(t, 2):
            if row["writer"] != "c4":
                continue
            case = family.force(base, {**row, "weight": "normal"}, t)
            inp = fw.build_compressor_inputs(case, "cpu")
            refs = ocomp.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"],
                                              inp["positions"], inp["slot_mapping"], inp["norm_weight"],
                                              inp["cos_sin_cache"], ratio=case.ratio, eps=case.eps)
            assert [r["t"] for r in refs] == [0], (row, refs)
            hostile = row["special"] in ("nan", "inf", "huge", "huger")
            assert refs[0]["overflow_free"] is (not hostile), (name, row)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_every_writer_meets_a_padded_block_stride_past_block_0(target):
    """A padded pool's block stride is read only past block 0: the covering rows give each writer a padded case
    that writes there (upstream's single-pass compressor addressing blocks with the dense size survived a zoo run
    while its only padded rows wrote block 0)."""
    import fuzz.cache_writers as fw

    t = get_target(target)
    family = D.family_for("writer-oracle-exact")
    _check_family(family, t)
    reached = set()
    for base in family.examples(t):
        for row in family.covering_array(t, 2):
            case = family.force(base, row, t)
            inner = case.swa if case.swa is not None else case.compressor
            if row.get("padded"):
                assert fw.padded_reached(inner), (row, inner)
                reached.add(row["writer"])
    assert reached == set(family.values("writer", t)), reached
