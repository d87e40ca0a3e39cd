"""contracts.engine.plan: a row's minimum always runs, the budget only shares out the rest, --deadline is the one
hard stop, and the cost model that plans the run round-trips through the user cache."""
import json
import time

from contracts.engine import plan, reports
from contracts.engine.audit import run_audit
from contracts.engine.plan import AuditPlan, CostModel, RowCost, SubjectPlan, cost_key


def _slow(case, target):
    """A few tenths of a second per case."""
    time.sleep(0.1)
    return []


def test_the_minimum_runs_even_past_a_tiny_budget(register, tmp_path):
    register("test-plan-min", _slow, min_cases=8)
    doc, code = run_audit(["test-plan-min"], ["gfx942"], budget=0.5, profile="dev", max_cases=20, progress=False,
                          cost_model=str(tmp_path / "costs.json"))
    (row,) = doc["results"]
    assert code == 0 and row["status"] == "pass" and row["generated_cases"] >= 8
    assert doc["run"]["seconds"] >= 0.8  # the minimum, past the budget: the larger of the two, not a stop
    assert doc["run"]["plan"]["deadline"] is None
    assert reports.validate(doc, reports.audit_schema(reports.AUDIT_SCHEMA_VERSION)) == []


def test_a_tiny_deadline_leaves_the_row_incomplete_naming_it(register, tmp_path):
    register("test-plan-cut", _slow, min_cases=50)
    doc, code = run_audit(["test-plan-cut"], ["gfx942"], budget=0.5, deadline=0.6, profile="dev", max_cases=60,
                          progress=False, cost_model=str(tmp_path / "costs.json"))
    (row,) = doc["results"]
    assert code == 1 and row["status"] == "incomplete"
    assert "deadline of 0.6s" in row["reason"] and row["generated_cases"] < 50
    assert doc["run"]["plan"]["deadline"] == 0.6 and doc["run"]["seconds"] < 0.6 + 1.5


def test_the_pooled_audit_runs_the_minimum_too(tmp_path):
    doc, code = run_audit(["fp8-codec-exact"], ["gfx942"], budget=0.1, profile="dev", max_cases=12, jobs=2,
                          progress=False, cost_model=str(tmp_path / "costs.json"), report_dir=str(tmp_path / "r"))
    (row,) = doc["results"]
    assert code == 0 and row["status"] == "pass" and row["generated_cases"] >= 5


def test_the_cost_model_round_trips_and_updates(tmp_path):
    path = tmp_path / "sub" / "costs.json"
    m = CostModel.load(str(path))
    assert m.rows == {}  # no file yet: empty
    k = cost_key("ours", "c", "gfx942", "dev")
    m.update(k, cpu=2.0, wait=1.0, cases=6)
    assert m.save() and json.loads(path.read_text())["schema_version"] == plan.COST_SCHEMA
    assert not [p for p in path.parent.iterdir() if p.name != "costs.json"]  # no temporary file left behind
    m2 = CostModel.load(str(path))
    assert m2.get(k) == RowCost(2.0, 1.0, 6)
    m2.update(k, cpu=4.0, wait=0.0, cases=6)  # an average: one odd run does not rule
    assert m2.get(k).cpu == 3.0 and m2.get(k).wait == 0.5
    path.write_text("{not json")
    assert CostModel.load(str(path)).rows == {}


def test_an_audit_keeps_its_rows_costs_for_the_next_plan(register, tmp_path):
    register("test-plan-kept", _slow, min_cases=3)
    costs = str(tmp_path / "costs.json")
    run_audit(["test-plan-kept"], ["gfx942"], budget=0.1, profile="dev", max_cases=3, progress=False,
              cost_model=costs)
    kept = CostModel.load(costs).get(cost_key("ours", "test-plan-kept", "gfx942", "dev"))
    assert kept is not None and kept.cases == 3 and kept.cpu + kept.wait > 0.25  # three sleeps of 0.1s
    doc, _ = run_audit(["test-plan-kept"], ["gfx942"], budget=0.1, profile="dev", max_cases=3, progress=False,
                       cost_model=costs)
    assert doc["run"]["plan"]["rows_measured"] == 1


def test_the_estimate_is_the_larger_of_the_minimum_and_the_budget():
    sub = SubjectPlan("ours", "ours", {("a", "gfx942"): 30.0, ("b", "gfx942"): 20.0}, 2, budget=120.0)
    p = AuditPlan([sub], share=1.0)
    assert p.minimum == 50.0 and p.estimate == 120.0
    sub.budget = 10.0
    assert p.estimate == 50.0
    assert AuditPlan([sub], share=1.0, deadline=20.0).estimate == 20.0
    assert "estimate 50s" in p.line()


def test_an_unmeasured_row_costs_the_default_scaled_by_the_load(tmp_path):
    m = CostModel(str(tmp_path / "c.json"))
    m.update(cost_key("ours", "a", "gfx942", "dev"), cpu=4.0, wait=1.0, cases=5)
    sub = plan.plan_subject(m, "ours", "ours", [("a", "gfx942"), ("b", "gfx942")], "dev", share=0.5, budget=1.0)
    assert sub.measured == 1
    assert sub.rows[("a", "gfx942")] == 4.0 / 0.5 + 1.0
    assert sub.rows[("b", "gfx942")] == plan.DEFAULT_ROW_SECONDS / 0.5


def test_the_plan_line_is_printed_before_the_rows(register, tmp_path):
    register("test-plan-line", _slow, min_cases=1)

    class Out:
        text = ""

        def write(self, s):
            self.text += s

        def flush(self):
            pass

    out = Out()
    run_audit(["test-plan-line"], ["gfx942"], budget=0.2, profile="dev", max_cases=1, stream=out,
              cost_model=str(tmp_path / "costs.json"))
    first = out.text.splitlines()[0]
    assert first.startswith("smv audit: plan:") and "estimate" in first
