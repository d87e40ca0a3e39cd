"""The zoo's per-mutant time cap follows from the unpatched rows' measured cost, and a mutant's audit stops each row
at its first violation (no shrinking): a loaded machine must never turn a kill into an ``error``."""
from __future__ import annotations

import json
import subprocess
import time
from datetime import datetime, timezone

import pytest
from hypothesis import strategies as st

import contracts.zoo.runner as zr
from contracts import core
from contracts.engine.runner import run_contract
from contracts.zoo.runner import Baseline, Mutant, MutantResult, measure_baseline, mutant_cap, run_zoo


def _m(mid="m1", expect=("c-a",), targets=("gfx950",)) -> Mutant:
    return Mutant(mid, "t", "p", "impl/formats.py", "x", "y", list(expect), list(targets))


def _row(c, t, seconds, status="pass"):
    return {"contract": c, "target": t, "status": status, "seconds": seconds, "reason": ""}


# --- the cap ------------------------------------------------------------------------------------------------------


def test_cap_is_the_floor_when_nothing_was_measured():
    assert mutant_cap(_m(), None, 90.0)[0] == 90.0
    assert mutant_cap(_m(), Baseline(), 42.0)[0] == 42.0  # an audit that finished nothing measured nothing


def test_cap_follows_the_measured_cost_of_the_mutants_own_rows():
    base = Baseline(rows={("c-a", "gfx950"): _row("c-a", "gfx950", 40.0), ("c-a", "gfx942"): _row("c-a", "gfx942", 5.0),
                          ("c-b", "gfx950"): _row("c-b", "gfx950", 1000.0)}, startup=4.0)
    cap, why = mutant_cap(_m(expect=["c-a"], targets=["gfx950", "gfx942"]), base, 90.0)
    assert cap == pytest.approx(zr.COST_FACTOR * 45.0 + zr.STARTUP_FACTOR * 4.0)  # c-b's dear row is not its own
    assert "45.0s" in why and "4.0s" in why
    cheap, _ = mutant_cap(_m(expect=["c-a"], targets=["gfx942"]), base, 90.0)
    assert cheap == 90.0  # a cheap mutant keeps the user's floor
    # a row the baseline did not measure counts as the dearest one measured, never as free
    unknown, _ = mutant_cap(_m(expect=["c-new"]), base, 1.0)
    assert unknown == pytest.approx(zr.COST_FACTOR * 1000.0 + zr.STARTUP_FACTOR * 4.0)


def test_run_zoo_caps_each_mutant_from_a_measured_baseline(monkeypatch):
    measured = Baseline(rows={("c-a", "gfx950"): _row("c-a", "gfx950", 50.0),
                              ("c-b", "gfx950"): _row("c-b", "gfx950", 2.0)}, startup=3.0, seconds=60.0)
    calls = {}

    def fake_measure(mutants, subject, **kw):
        calls["baseline"] = [m.id for m in mutants]
        return measured

    def fake_run(m, *, cap, cap_why="", **kw):
        calls[m.id] = cap
        r = MutantResult(m.id, "error" if m.id == "slow" else "killed", list(m.expect), fired=list(m.expect))
        r.cap_seconds = cap
        if m.id == "slow":
            r.detail = f"time cap of {cap:.0f}s ran out ({cap_why})"
        return r

    monkeypatch.setattr(zr, "measure_baseline", fake_measure)
    monkeypatch.setattr(zr, "run_mutant", fake_run)
    doc = run_zoo([_m("slow", ["c-a"]), _m("fast", ["c-b"])], cap=30.0, jobs=1)
    assert calls["baseline"] == ["slow", "fast"]  # ours measures its unpatched cost too
    assert calls["slow"] == pytest.approx(3 * 50.0 + 2 * 3.0) and calls["fast"] == 30.0
    slow, fast = doc["results"]
    assert slow["cap_seconds"] == pytest.approx(156.0) and "156s" in slow["detail"]
    assert "3 x 50.0s" in slow["detail"] and "2 x 3.0s" in slow["detail"]
    assert fast["cap_seconds"] == 30.0
    assert doc["cap"]["floor"] == 30.0 and doc["cap"]["baseline"]["startup_seconds"] == 3.0
    # every field zoo.json promised before is still there
    assert {"id", "status", "expect", "fired", "seconds", "detail", "time_to_kill"} <= set(fast)
    assert {"schema_version", "subject", "results", "time_to_kill", "kill_rate", "seconds"} <= set(doc)


def test_measure_baseline_records_row_cost_and_process_start(monkeypatch, tmp_path):
    """One audit per set of targets (only the rows some mutant expects), each row's seconds, and the process's
    start as its wall time less the audit's own seconds."""
    audits = []

    def fake_audit(report, contracts, targets, *, budget, timeout, **kw):
        audits.append((list(contracts), list(targets)))
        report.mkdir(parents=True)
        rows = [_row(c, t, 2.0) for c in contracts for t in targets]
        started = datetime.fromtimestamp(time.time() + 5.0, timezone.utc).isoformat()  # 5 s after the launch
        (report / "audit.json").write_text(json.dumps({"run": {"seconds": 1.0, "started": started},
                                                       "results": rows}))
        return subprocess.CompletedProcess([], 0, "", "")

    monkeypatch.setattr(zr.AuditRun, "run", lambda self, report, contracts, targets, *, budget, timeout:
                        fake_audit(report, contracts, targets, budget=budget, timeout=timeout))
    ms = [_m("a", ["c-a"], ["gfx950"]), _m("b", ["c-b"], ["gfx950"]), _m("c", ["c-c"], ["gfx942", "generic"])]
    base = measure_baseline(ms, None, root=tmp_path, jobs=2)
    assert sorted(audits) == [(["c-a", "c-b"], ["gfx950"]), (["c-c"], ["generic", "gfx942"])]
    assert set(base.rows) == {("c-a", "gfx950"), ("c-b", "gfx950"), ("c-c", "gfx942"), ("c-c", "generic")}
    assert 4.0 <= base.startup <= 6.0 and not base.error  # from the launch until the audit's run.started
    assert base.cost(ms[2]) == 4.0


def test_zoo_audits_stop_at_the_first_violation(monkeypatch, tmp_path):
    seen = {}

    def fake_run(cmd, **kw):
        seen["cmd"] = cmd
        raise subprocess.TimeoutExpired(cmd, 1)

    monkeypatch.setattr(zr.subprocess, "run", fake_run)
    with pytest.raises(subprocess.TimeoutExpired):
        zr._audit(tmp_path / "r", ["c-a"], ["gfx950"], budget=5, timeout=1, code_root=tmp_path, cwd=tmp_path)
    assert "--first-violation" in seen["cmd"]


# --- first_violation in the runner --------------------------------------------------------------------------------


def _counting_odd(calls):
    def check(case, target):
        """Fails on odd integers."""
        calls.append(case)
        return [core.Violation(f"odd value {case}", "", "even", str(case))] if case % 2 else []
    return check


def test_first_violation_stops_the_row_at_its_first_failing_case_unshrunk(register, tmp_path, monkeypatch):
    import fuzz.profiles

    monkeypatch.setattr(fuzz.profiles, "DATABASE_DIR", str(tmp_path / "db"))
    calls: list = []
    c = register("test-fv-odd", _counting_odd(calls), cases=lambda t: st.integers(10 ** 5, 10 ** 6), min_cases=1)
    row = run_contract(c, "gfx942", profile="dev", budget=60, max_examples=200, seed=5, first_violation=True)
    assert row.status == "fail"
    odd = [x for x in calls if x % 2]
    # the row ended at its first failing case: one odd case checked, and it was the last check (no shrink's replays,
    # no re-check of the failure), and that very case is the one reported
    assert len(odd) == 1 and calls[-1] == odd[0]
    assert row.case == odd[0] and row.generated_cases == len(calls) < 200
    assert row.first_violation["cases"] == len(calls)

    # without it the same row shrinks: more checks after the first failing one, towards a smaller case
    calls.clear()
    row2 = run_contract(c, "gfx942", profile="dev", budget=60, max_examples=200, seed=5)
    assert row2.status == "fail"
    first_odd = next(i for i, x in enumerate(calls) if x % 2)
    assert len(calls) > first_odd + 1


def test_first_violation_on_a_pinned_example_checks_nothing_after_it(register):
    calls: list = []
    c = register("test-fv-pinned", _counting_odd(calls), examples=lambda t: [3, 5, 2], min_cases=1)
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=50, seed=1, first_violation=True)
    assert row.status == "fail" and calls == [3] and row.case == 3 and row.generated_cases == 0


def test_audit_first_violation_flag_reaches_the_rows(register, tmp_path):
    from contracts.engine.audit import run_audit

    calls: list = []
    register("test-fv-audit", _counting_odd(calls), cases=lambda t: st.integers(10 ** 5, 10 ** 6), min_cases=3,
             targets=("gfx950",))
    doc, code = run_audit(["test-fv-audit"], ["gfx950"], budget=60, profile="dev", max_cases=100, progress=False,
                          report_dir=str(tmp_path / "rep"), seed=7, first_violation=True)
    (r,) = doc["results"]
    assert code == 1 and r["status"] == "fail"
    assert sum(x % 2 for x in calls) == 1 and calls[-1] % 2 == 1


def test_cli_audit_has_the_first_violation_flag():
    from contracts.cli.smv import build_parser

    args = build_parser().parse_args(["audit", "--first-violation", "--contract", "x"])
    assert args.first_violation is True
    assert build_parser().parse_args(["audit"]).first_violation is False
