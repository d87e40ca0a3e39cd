"""The row runner: the budget stops Hypothesis itself, case limits are exact and named, margins, typed reproducers."""
import json
import os
import time
from dataclasses import dataclass

import pytest
from hypothesis import strategies as st

from contracts import core
from contracts.engine.runner import REPRO_SCHEMA_VERSION, ReproError, replay, run_contract, write_repro
from fuzz.cases import Case, CaseError
from impl.targets import get_target




def _passes(case, target):
    """Always holds."""
    return []


def test_deadline_stops_hypothesis_not_only_the_checks(register, tmp_path, monkeypatch, capsys):
    import fuzz.profiles

    monkeypatch.setattr(fuzz.profiles, "DATABASE_DIR", str(tmp_path / "db"))

    def slow_case(x):
        time.sleep(0.05)  # stands for an expensive strategy: each draw costs real time
        return x

    c = register("test-slow-strategy", _passes, cases=lambda t: st.integers(0, 10 ** 9).map(slow_case), min_cases=1)
    t0 = time.monotonic()
    row = run_contract(c, "gfx942", profile="nightly", budget=0.5, max_examples=1000)
    wall = time.monotonic() - t0
    # 1000 examples would take 50 s; the budget must end generation within about one case of the deadline
    assert wall < 2.5, wall
    assert row.status == "pass" and row.stopped_by == "budget"
    assert 1 <= row.generated_cases < 40
    # stopping is not a failure: nothing was saved to the example database, nothing was shrunk
    saved = [f for _, _, fs in os.walk(tmp_path / "db") for f in fs]
    assert saved == []
    out = capsys.readouterr()
    assert "reproduce this failure" not in out.out + out.err


def test_case_limit_is_exact_and_named(register):
    c = register("test-limit", _passes, min_cases=5)
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=7, seed=3)
    assert (row.generated_cases, row.pinned_cases, row.cases) == (7, 0, 7)
    assert row.stopped_by == "max_cases" and row.status == "pass"


def test_a_case_limit_below_the_minimum_is_not_blamed_on_the_budget(register):
    c = register("test-limit-one", _passes, min_cases=5)
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=1, seed=3)
    assert row.generated_cases == 1 and row.stopped_by == "max_cases"
    # fewer cases than the contract's minimum are no evidence: incomplete, and the case limit is named as the cause
    assert row.status == "incomplete" and "case limit" in row.reason and "minimum of 5" in row.reason
    assert "budget" not in row.reason and "within" not in row.reason


def test_an_exhausted_space_is_complete(register):
    c = register("test-booleans", _passes, cases=lambda t: st.booleans(), min_cases=5)
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=50, seed=1)
    assert row.generated_cases == 2 and row.stopped_by == "exhausted" and row.status == "pass"


def test_budget_starved_row_is_incomplete_and_says_budget(register):
    def slow(case, target):
        """Slow per case."""
        time.sleep(0.2)
        return []

    c = register("test-starved", slow, min_cases=50)
    row = run_contract(c, "gfx942", profile="dev", budget=0.5, max_examples=100, seed=1)
    assert row.status == "incomplete" and row.stopped_by == "budget" and "budget" in row.reason
    assert row.seconds < 1.5


def test_pinned_and_generated_counted_apart(register):
    c = register("test-pinned", _passes, examples=lambda t: [1, 2, 3], min_cases=2)
    row = run_contract(c, "gfx950", profile="dev", budget=30, max_examples=4, seed=5)
    assert (row.pinned_cases, row.generated_cases, row.cases) == (3, 4, 7)
    js = row.as_json()
    assert js["pinned_cases"] == 3 and js["generated_cases"] == 4 and js["cases"] == 7
    assert js["stopped_by"] == "max_cases"


def test_margin_is_the_worst_ratio_over_passing_cases(register):
    def numeric(case, target):
        """Records a ratio that depends on the case."""
        core.record_margin((case % 10) / 20)  # at most 0.45
        return []

    def exact(case, target):
        """Exact check: records nothing."""
        return []

    def numeric_silent(case, target):
        """Numeric, but records nothing on these cases."""
        return []

    cn = register("test-numeric", numeric, numeric=True, cases=lambda t: st.integers(0, 9))
    ce = register("test-exact", exact)
    cs = register("test-numeric-silent", numeric_silent, numeric=True)
    rn = run_contract(cn, "gfx942", profile="dev", budget=30, max_examples=30, seed=2)
    assert rn.margin is not None and 0 < rn.margin <= 0.45
    assert rn.as_json()["margin"] == pytest.approx(rn.margin)
    assert run_contract(ce, "gfx942", profile="dev", budget=30, max_examples=5, seed=2).margin is None
    assert run_contract(cs, "gfx942", profile="dev", budget=30, max_examples=5, seed=2).margin is None


def test_margin_leaves_out_failing_cases(register):
    def fails_big(case, target):
        """Fails when the ratio is above one."""
        core.record_margin(float(case))
        return [core.Violation("too far", "", "<= 1", str(case))] if case > 1 else []

    c = register("test-numeric-fail", fails_big, numeric=True, cases=lambda t: st.sampled_from([0, 5]),
                 examples=lambda t: [0])
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=20, seed=2)
    assert row.status == "fail" and (row.margin is None or row.margin <= 1)


@dataclass(frozen=True)
class PairCase(Case):
    KIND = "test-pair"
    a: int = 0
    b: int = 0


def _pair_check(case, target):
    """Fails when a > b."""
    return [core.Violation("a > b", "", f"a <= {case.b}", str(case.a))] if case.a > case.b else []


def _pair_contract(register):
    return register("test-pair", _pair_check, case_type=PairCase,
                    cases=lambda t: st.builds(PairCase, a=st.integers(0, 5), b=st.integers(0, 5)))


def test_typed_case_reproducer_round_trip(register, tmp_path):
    c = _pair_contract(register)
    t = get_target("gfx950")
    case = PairCase(a=3, b=1)
    p = write_repro(str(tmp_path / "r.json"), c, t, case, _pair_check(case, t))
    doc = json.loads(open(p).read())
    assert doc["schema_version"] == REPRO_SCHEMA_VERSION == 4
    assert doc["case"] == case.to_json()
    c2, t2, case2, violations = replay(p)
    assert c2 is c and t2.name == "gfx950" and case2 == case and violations and "a > b" in violations[0].message


def test_failing_typed_row_writes_a_replayable_file(register, tmp_path):
    c = _pair_contract(register)
    row = run_contract(c, "gfx942", profile="dev", budget=30, seed=1, repro_dir=str(tmp_path))
    assert row.status == "fail" and row.repro
    _, _, case, violations = replay(row.repro)
    assert isinstance(case, PairCase) and case.a > case.b and violations


def _good_doc(**over):
    doc = {"schema_version": REPRO_SCHEMA_VERSION, "contract": "test-pair", "target": "gfx942",
           "case": PairCase(a=1, b=2).to_json(), "violations": []}
    doc.update(over)
    return doc


@pytest.mark.parametrize("content,what", [
    (None, "cannot read"),
    ("{\n  \"contract\": \n", "line 3"),
    ("[1, 2]", "not an object"),
    (_good_doc(contract=None), "contract"),
    ({k: v for k, v in _good_doc().items() if k != "target"}, "missing 'target'"),
    ({k: v for k, v in _good_doc().items() if k != "case"}, "missing 'case'"),
    ({k: v for k, v in _good_doc().items() if k != "contract"}, "missing 'contract'"),
    (_good_doc(contract="no-such-contract"), "unknown contract 'no-such-contract'"),
    (_good_doc(target="gfx999"), "gfx999"),
    ({k: v for k, v in _good_doc().items() if k != "schema_version"}, "schema_version"),
    (_good_doc(schema_version=1), "version 1"),
    (_good_doc(case={"kind": "test-pair", "schema_version": 1, "a": 1}), "missing field b"),
    (_good_doc(case={"kind": "test-pair", "schema_version": 1, "a": "x", "b": 1}), "expected an integer"),
])
def test_replay_names_the_file_on_every_malformed_input(register, tmp_path, content, what):
    _pair_contract(register)
    p = tmp_path / "bad.json"
    if content is not None:
        p.write_text(content if isinstance(content, str) else json.dumps(content))
    with pytest.raises(ReproError) as info:
        replay(str(p))
    msg = str(info.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg and what in msg, msg
    assert isinstance(info.value, ValueError)


def test_version_1_file_says_which_version_is_supported(register, tmp_path):
    _pair_contract(register)
    p = tmp_path / "old.json"
    p.write_text(json.dumps(_good_doc(schema_version=1)))
    with pytest.raises(ReproError, match=r"version 1.*supported.* 2"):
        replay(str(p))


def test_a_malformed_generated_case_is_a_harness_error_not_a_violation(register):
    def strict(case, target):
        """Rejects a malformed case."""
        raise CaseError("test-pair case.a: expected an integer, got 'x'")

    c = register("test-malformed", strict)
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5, seed=1)
    assert row.status == "error" and not row.violations and "expected an integer" in row.reason


def test_negative_budget_and_max_examples_rejected(register):
    c = register("test-args", _passes)
    with pytest.raises(ValueError, match="budget"):
        run_contract(c, "gfx942", budget=0)
    with pytest.raises(ValueError, match="max_examples"):
        run_contract(c, "gfx942", budget=5, max_examples=-1)


def test_a_device_error_surfacing_after_the_check_is_the_cases_violation_and_marks_the_device_lost(monkeypatch):
    """A kernel's fault is reported on the device at the next call, after the check may have returned: the runner
    synchronizes inside each case, so the error is that case's violation (its reproducer), and the sticky error is
    remembered, so a worker hands its rows to a fresh process (contracts.engine.workers.device_lost)."""
    import torch

    from contracts.engine import runner, workers

    def fault():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    toy = core.Contract(id="zz-async-fault", doc="toy", targets=("gfx942",), cases=lambda t: st.just(1),
                        check=lambda case, t: [])
    monkeypatch.setattr(workers, "_sticky_errors", [])
    assert runner.checked(toy, 1, get_target("gfx942")) == [] and workers.device_lost() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "synchronize", fault)
    v = runner.checked(toy, 1, get_target("gfx942"))
    assert len(v) == 1 and v[0].message.startswith("check raised RuntimeError: CUDA error: an illegal memory")
    assert "illegal memory access" in workers.device_lost()
