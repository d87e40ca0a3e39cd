"""A row's violations say how production reaches their case (audit.json 12 ``reach_class``, fuzz/domains.py), and
the audit's Markdown and JUnit group by it."""
from __future__ import annotations

from hypothesis import strategies as st

from contracts.core import Violation
from contracts.engine.reports import audit_junit, audit_markdown
from contracts.engine.runner import run_contract
from fuzz.splits import SplitCase

#: the split-bounds family's domain: a production selector call has a SWA segment and a real CU count
PRODUCTION = SplitCase(batch=64, heads=16, avg_main=128, avg_extra=512, ragged_slack=0, cu_count=304)
EMPTY_DECODE = SplitCase(batch=1, heads=16, avg_main=0, avg_extra=0, ragged_slack=0, cu_count=304)


def _always(case, target):
    """Fails every case (a planted contract)."""
    return [Violation("always", "here", "x", "y")]


def _never(case, target):
    """Holds on every case (a planted contract)."""
    return []


def _row(register, case, cid):
    c = register(cid, _always, cases=lambda t: st.just(case), min_cases=1)
    return run_contract(c, "gfx942", budget=5.0, use_examples=False, max_examples=1).as_json()


def test_a_failing_rows_violations_carry_the_reach_of_its_case(register):
    row = _row(register, PRODUCTION, "planted-reach-production")
    assert row["status"] == "fail" and row["reach_class"] == "production"
    assert {v["reach_class"] for v in row["violations"]} == {"production"}
    row = _row(register, EMPTY_DECODE, "planted-reach-empty")
    assert row["reach_class"] == "caller-contract"


def test_a_passing_row_and_an_undeclared_family_have_no_reach_class(register):
    c = register("planted-reach-pass", _never, cases=lambda t: st.just(PRODUCTION), min_cases=1)
    row = run_contract(c, "gfx942", budget=5.0, use_examples=False, max_examples=1).as_json()
    assert row["reach_class"] is None
    assert row["case_reach"] == {"production": row["generated_cases"]} and row["generated_cases"] >= 1
    row = _row(register, 7, "planted-reach-int")  # a plain int: no family, no domain
    assert row["status"] == "fail" and row["reach_class"] is None and set(row["case_reach"]) <= {"unclassified"}


def test_markdown_and_junit_group_failing_rows_by_reach():
    def r(cid, rc):
        return {"contract": cid, "target": "gfx942", "status": "fail", "reason": "why", "cases": 1, "seconds": 0.1,
                "violations": [{"message": "m", "where": "w", "expected": "e", "got": "g", "reach_class": rc}],
                "repro": None, "reach_class": rc, "subject": {"name": "vllm", "version": "0.33.0"}}
    doc = {"run": {"ok": False, "seconds": 1.0, "subjects": []}, "device": {"kind": "cpu", "name": "c", "arch": "x"},
           "results": [r("a-adv", "adversarial"), r("b-prod", "production"), r("c-cc", "caller-contract")]}
    md = audit_markdown(doc)
    assert "by reach: production: 1 · caller-contract: 1 · adversarial: 1" in md
    assert md.index("# Reach: production") < md.index("## b-prod") < md.index("# Reach: caller contract") \
        < md.index("## c-cc") < md.index("# Reach: adversarial") < md.index("## a-adv")
    xml = audit_junit(doc).decode()
    assert 'name="reach_class" value="adversarial"' in xml and 'message="[production] why"' in xml
