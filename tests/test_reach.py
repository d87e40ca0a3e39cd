"""Declared dimensions and pairwise reach: covering arrays, the runner's covering-array phase, the row's ``reach``."""
from __future__ import annotations

import pytest
from hypothesis import strategies as st

from contracts.core import ALL_TARGETS, Contract, Violation
from contracts.engine.runner import RowResult, run_contract
from fuzz import dimensions as D
from impl.targets import TARGET_NAMES, get_target


def _toy_contract(cid, check=None, extra=None):
    cases = lambda t: st.fixed_dictionaries({"a": st.integers(0, 3), "b": st.booleans(), "c": st.sampled_from("xyz")})
    return Contract(id=cid, doc="toy", targets=ALL_TARGETS, cases=cases, check=check or (lambda case, t: []),
                    min_cases=1, extra=dict(extra or {}))


def _toy_family(force=None, allowed=None):
    def classify(case, t):
        return {"a": case["a"], "b": case["b"], "c": case["c"]}

    def default_force(case, combo, t):
        return {**case, **combo}

    return D.Family("toy", (D.Dimension("a", (0, 1, 2, 3)), D.Dimension("b", (False, True)),
                            D.Dimension("c", ("x", "y", "z"))),
                    (("a", "b"),), classify, force or default_force, allowed)


@pytest.fixture
def declared():
    made = []

    def make(cid, family):
        D.declare(family, cid)
        made.append(cid)
        return family

    yield make
    for cid in made:
        D._DECLARED.pop(cid, None)


def _covers(family, target, strength):
    req = family.required(target, strength)
    got = set()
    for row in family.covering_array(target, strength):
        got |= D.covered_by(req, frozenset(row.items()))
    return req, got


def test_required_tuples_are_interacting_pairs_and_lone_values():
    f = _toy_family()
    req = f.required(get_target("generic"), 2)
    assert len(req) == 4 * 2 + 3  # a x b pairs, then each value of the lone dimension c
    assert (("c", "y"),) in req and (("a", 3), ("b", True)) in req
    assert f.required(get_target("generic"), 0) == []


def test_allowed_removes_impossible_pairs_and_the_array_still_covers():
    f = _toy_family(allowed=lambda c, t: not (c.get("a") == 3 and c.get("b") is True))
    req, got = _covers(f, get_target("generic"), 2)
    assert (("a", 3), ("b", True)) not in req
    assert set(req) == got
    assert all(not (r["a"] == 3 and r["b"]) for r in f.covering_array(get_target("generic"), 2))


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError):
        D.Dimension("x", (1, 1))
    with pytest.raises(ValueError):
        D.Family("f", (D.Dimension("a", (1, 2)),), (("a", "nope"),), lambda c, t: {}, lambda c, k, t: c)


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_declared_families_cover_every_required_tuple(target):
    import importlib

    from contracts.registry import load_all

    for m in D.DECLARING_MODULES:  # the families declare themselves where their generators live
        importlib.import_module(m)
    load_all()  # and a few beside their contract (int64-addressing's probes)
    t = get_target(target)
    for cid, family in D._DECLARED.items():
        for strength in (2, 3):
            req, got = _covers(family, t, strength)
            assert set(req) == got, (cid, strength, sorted(set(req) - got)[:3])
        array = family.covering_array(t, 2)
        # no pairwise array is smaller than its largest declared pair (or its largest dimension, alone); the greedy
        # one may exceed that floor by 30%, and the ci profile's count (25) is never what stops a family
        sizes = {d.name: len(d.values) for d in family.dimensions}
        floor = max([25, *sizes.values(), *(sizes[a] * sizes[b] for g in family.interactions for a in g for b in g if a < b)])
        assert len(array) <= 1.3 * floor, f"{cid}: the ci array ({len(array)} rows) is over 1.3x its floor {floor}"
        assert all(family._ok(row, t) for row in array), cid


def test_ci_row_starts_with_the_array_which_overrides_the_case_limit(declared):
    seen = []
    c = _toy_contract("toy-reach-a", check=lambda case, t: seen.append(dict(case)) or [])
    f = declared(c.id, _toy_family())
    n = len(f.covering_array(get_target("generic"), 2))
    r = run_contract(c, "generic", profile="ci", budget=30, max_examples=1)
    assert r.status == "pass" and r.generated_cases == n
    assert [(s["a"], s["b"], s["c"]) for s in seen] == [(w["a"], w["b"], w["c"])
                                                         for w in f.covering_array(get_target("generic"), 2)]
    assert r.as_json()["reach"] == {"pairs_declared": 11, "pairs_covered": 11, "missing": [], "exhaustive": False}


def test_ci_row_missing_a_pair_is_incomplete_naming_it(declared):
    c = _toy_contract("toy-reach-b")
    # a force that never reaches a=3 with b=True, and a generator that cannot draw it either
    c.cases = lambda t: st.fixed_dictionaries({"a": st.integers(0, 2), "b": st.booleans(), "c": st.just("x")})
    declared(c.id, _toy_family(force=lambda case, combo, t: {**case, **combo, "a": min(combo["a"], 2)}))
    r = run_contract(c, "generic", profile="ci", budget=30)
    assert r.status == "incomplete"
    assert "a=3 & b=True" in r.reason and "a=3 & b=True" in r.reach["missing"]
    # dev draws freely: reach is reported, not required
    r = run_contract(c, "generic", profile="dev", budget=30, max_examples=3, seed=1)
    assert r.status == "pass" and r.reach["missing"] and r.reach["pairs_declared"] == 11


def test_undeclared_and_exhaustive_rows(declared):
    r = run_contract(_toy_contract("toy-reach-c"), "generic", profile="ci", budget=30, max_examples=2)
    assert r.as_json()["reach"] == {"pairs_declared": 0, "pairs_covered": 0, "missing": [], "exhaustive": False}
    r = run_contract(_toy_contract("toy-reach-d", extra={"exhaustive": True}), "generic", profile="ci", budget=30,
                     max_examples=2)
    assert r.as_json()["reach"] == {"pairs_declared": 0, "pairs_covered": 0, "missing": [], "exhaustive": True}
    assert RowResult("x", "generic", "skipped").as_json()["reach"]["pairs_declared"] == 0


def test_array_failure_is_shrunk_within_its_row(declared):
    c = _toy_contract("toy-reach-e", check=lambda case, t: [Violation("boom")] if case["a"] == 3 and case["b"]
                      else [])
    declared(c.id, _toy_family())
    r = run_contract(c, "generic", profile="ci", budget=30)
    assert r.status == "fail" and r.case["a"] == 3 and r.case["b"] is True


def test_audit_merge_unions_the_two_passes(declared):
    from contracts.engine.audit import _merge

    req = [(("a", 0),), (("a", 1),)]
    a = RowResult("x", "generic", "pass", reach_required=req, reach_covered={req[0]}, reach_enforced=True)
    b = RowResult("x", "generic", "pass", reach_covered={req[1]})
    m = _merge(a, b)
    assert m.status == "pass" and m.reach["pairs_covered"] == 2
    m = _merge(RowResult("x", "generic", "pass", reach_required=req, reach_covered={req[0]}, reach_enforced=True),
               RowResult("x", "generic", "pass"))
    assert m.status == "incomplete" and m.reach["missing"] == ["a=1"]


def _bases():
    from fuzz.cache_writers import SwaCase, WriterCase
    from fuzz.cp_gather import CpGatherCase
    from fuzz.decode import DecodeCase
    from fuzz.indexer_logits import IndexerLogitsCase
    from fuzz.sparse_metadata import MetadataCase, MetadataConfig, MetadataStep

    return {
        "decode-oracle-agreement": [DecodeCase(
            seed=s, batch=2, heads=1, main_bs=1, extra_bs=1, main_lens=(0, 3), extra_lens=(0, 5), invalid_rate=0.0,
            indptr_offset=0, tail_junk=0, scale=0.03125, sink="none", poison="none", padded=False,
            q_transposed=False, cu_count=1) for s in (0, 1, 2)],
        "writer-oracle-exact": [WriterCase(swa=SwaCase(seed=s, T=1, slots=(0,), log_scale=(0,), num_blocks=1))
                                for s in (0, 1)],
        "gather-oracle-exact": [CpGatherCase(seed=s, layout="normal", block_size=1, num_blocks=1, seq_lens=(),
                                             table_width=0, table=()) for s in (0, 1, 3)],
        "indexer-logits-agreement": [
            IndexerLogitsCase(seed=0, mode="decode", heads=1, topk=1, context_lens=(0,), block_size=1),
            IndexerLogitsCase(seed=1, mode="prefill", heads=1, topk=1, keys=1, row_starts=(0,), row_ends=(0,))],
        "shrink-tail-extents": [MetadataCase(
            config=MetadataConfig(seed=0, topk=k, granularity=8, block_size=1, num_heads=2),
            steps=(MetadataStep(q_lens=(1,), seq_lens=(1,)),) * n) for k, n in ((4, 1), (24, 3))],
    }


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_forced_cases_hit_their_rows(target):
    """Each covering row forced onto a (deliberately plain) case classifies as that row: a force that cannot reach a
    combination shows here, not as a ci row missing a pair."""
    import importlib

    from contracts.registry import load_all

    for m in D.DECLARING_MODULES:
        importlib.import_module(m)
    load_all()
    t = get_target(target)
    bases = _bases()
    for cid, family in D._DECLARED.items():
        if family.examples is not None:
            bases[cid] = family.examples(t)
    assert set(bases) == set(D._DECLARED), f"declared families without plain examples: {set(D._DECLARED) - set(bases)}"
    for cid, cases in bases.items():
        family = D.family_for(cid)
        for base in cases:
            for row in family.covering_array(t, 2):
                got = family.classify(family.force(base, row, t), t)
                assert {k: got.get(k) for k in row} == row, (cid, base, row, got)
