"""`smv audit`: the three report files, the JSON schema, skipped/incomplete rows, and replaying a failure."""
import json
import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from hypothesis import strategies as st

from contracts import core
from contracts.engine import reports
from contracts.engine.audit import run_audit
from contracts.cli.smv import main as smv
from contracts.zoo.runner import CODE_FOLDERS, default_root


def test_audit_writes_reports_matching_the_schema(tmp_path):
    rep, junit = tmp_path / "rep", tmp_path / "junit.xml"
    code = smv(["audit", "--contract", "fp8-codec-exact", "--contract", "cache-layout-roundtrip",
                "--target", "gfx942", "--target", "gfx950", "--budget", "60", "--report", str(rep),
                "--junit", str(junit), "--profile", "ci", "--no-progress"])
    assert code == 0
    doc = json.loads((rep / "audit.json").read_text())
    assert reports.validate(doc, reports.AUDIT_JSON_SCHEMA) == []
    assert doc["targets"] == ["gfx942", "gfx950"]
    assert [(r["contract"], r["target"]) for r in doc["results"]] == [
        ("fp8-codec-exact", "gfx942"), ("fp8-codec-exact", "gfx950"),
        ("cache-layout-roundtrip", "gfx942"), ("cache-layout-roundtrip", "gfx950")]
    assert all(r["status"] == "pass" and r["cases"] >= 5 for r in doc["results"])
    md = (rep / "audit.md").read_text()
    assert "| fp8-codec-exact | gfx942 | **pass** |" in md
    suite = ET.parse(junit).getroot().find("testsuite")
    assert suite.get("tests") == "4" and suite.get("failures") == "0"


def test_schema_validator_catches_shape_errors():
    doc = {"schema_version": 1, "run": {}, "device": {"kind": "cpu", "name": "cpu", "arch": "cpu"}, "targets": [],
           "results": [{"contract": "a", "target": "b", "status": "maybe", "reason": "", "cases": 1,
                        "seconds": 0.1, "violations": [], "repro": None}]}
    assert any("maybe" in e for e in reports.validate(doc, reports.AUDIT_JSON_SCHEMA))
    del doc["device"]
    assert any("device" in e for e in reports.validate(doc, reports.AUDIT_JSON_SCHEMA))


def test_skipped_and_incomplete_rows():
    import time

    def only_950(case, target):
        """Applies to gfx950 only."""
        return []

    def slow(case, target):
        """Takes a long time per case."""
        time.sleep(0.3)
        return []

    core.contract("test-only-gfx950", targets=("gfx950",), cases=lambda t: st.integers(), min_cases=1,
                  skip_reason="gfx950-only behaviour")(only_950)
    core.contract("test-slow", cases=lambda t: st.integers(), min_cases=50)(slow)
    try:
        doc, code = run_audit(["test-only-gfx950", "test-slow"], ["gfx942", "gfx950"], budget=1.0, deadline=6.0,
                              progress=False)
    finally:
        core.CONTRACTS.pop("test-only-gfx950")
        core.CONTRACTS.pop("test-slow")
    st_ = {(r["contract"], r["target"]): r for r in doc["results"]}
    assert st_[("test-only-gfx950", "gfx942")]["status"] == "skipped"
    assert st_[("test-only-gfx950", "gfx942")]["reason"] == "gfx950-only behaviour"
    assert st_[("test-only-gfx950", "gfx950")]["status"] == "pass"
    assert st_[("test-slow", "gfx942")]["status"] == "incomplete"  # only the deadline cuts a minimum
    assert "deadline of 6s" in st_[("test-slow", "gfx942")]["reason"]
    assert code == 1 and doc["run"]["ok"] is False


def test_unknown_contract_is_a_usage_error(capsys):
    assert smv(["audit", "--contract", "no-such-contract"]) == 2
    assert "unknown contract 'no-such-contract'" in capsys.readouterr().err


def _broken_copy(tmp_path: Path) -> Path:
    root = default_root()
    dest = tmp_path / "broken"
    for f in CODE_FOLDERS:
        shutil.copytree(root / f, dest / f, ignore=shutil.ignore_patterns("__pycache__"))
    p = dest / "impl" / "formats.py"
    text = p.read_text()
    assert text.count("FP8_FNUZ = Fp8Flavour(\"fnuz\", bias=8,") == 1
    p.write_text(text.replace("FP8_FNUZ = Fp8Flavour(\"fnuz\", bias=8,", "FP8_FNUZ = Fp8Flavour(\"fnuz\", bias=7,"))
    return dest


def test_broken_copy_fails_with_counterexample_and_standalone_repro(tmp_path):
    dest = _broken_copy(tmp_path)
    env = dict(os.environ, PYTHONPATH=str(dest))
    rep = tmp_path / "rep"
    proc = subprocess.run([sys.executable, "-m", "contracts.cli", "audit", "--contract", "fp8-codec-exact",
                           "--target", "gfx942", "--report", str(rep), "--profile", "ci"],
                          cwd=dest, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads((rep / "audit.json").read_text())
    (row,) = doc["results"]
    assert row["status"] == "fail" and row["violations"] and row["repro"]
    assert "replay: smv repro" in proc.stderr
    assert "fp8_decode[fnuz]" in row["violations"][0]["message"] or "fnuz" in json.dumps(row["violations"])
    # the repro file alone reproduces it against the broken code ...
    again = subprocess.run([sys.executable, "-m", "contracts.cli", "repro", row["repro"]], cwd=dest, env=env,
                           capture_output=True, text=True, timeout=300)
    assert again.returncode == 1 and "VIOLATION" in again.stdout
    # ... and passes against the real code
    fixed = subprocess.run([sys.executable, "-m", "contracts.cli", "repro", row["repro"]], capture_output=True,
                           text=True, timeout=300, cwd=default_root())
    assert fixed.returncode == 0 and "passes now" in fixed.stdout


def test_repro_rejects_garbage(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text("{}")
    assert smv(["repro", str(p)]) == 2
    assert "not an smv repro file" in capsys.readouterr().err


def test_interrupted_audit_keeps_the_rows_done(tmp_path):
    def interrupts(case, target):
        """Stands for a run killed part-way."""
        raise KeyboardInterrupt

    core.contract("test-interrupts", cases=lambda t: st.integers(), min_cases=1)(interrupts)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_audit(["ue8m0-codec-exact", "test-interrupts"], ["gfx950"], budget=30, progress=False,
                      report_dir=str(tmp_path))
    finally:
        core.CONTRACTS.pop("test-interrupts")
    doc = json.loads((tmp_path / "audit.json").read_text())
    assert reports.validate(doc, reports.AUDIT_JSON_SCHEMA) == []
    assert [(r["contract"], r["status"]) for r in doc["results"]] == [("ue8m0-codec-exact", "pass"),
                                                                       ("test-interrupts", "incomplete")]
    assert doc["run"]["finished"] is False and doc["run"]["ok"] is False


# --- one budget model, reproducible reports (schema 2) -------------------------------------------------------------



def test_max_cases_is_the_row_total_across_both_passes(register):
    seen = []

    def records(case, target):
        """Records every case it is handed."""
        seen.append(case)
        return []

    register("test-records", records, examples=lambda t: [-1, -2], min_cases=5)
    doc, code = run_audit(["test-records"], ["gfx942"], budget=60, profile="dev", seed=11, max_cases=20,
                          progress=False)
    (row,) = doc["results"]
    assert code == 0 and row["status"] == "pass"
    assert (row["pinned_cases"], row["generated_cases"], row["cases"]) == (2, 20, 22)
    assert row["stopped_by"] == "max_cases" and len(seen) == 22
    # the two passes are one generated sequence: the same cases a single run of 20 checks, none twice
    from contracts.engine.runner import run_contract

    first_two_passes = list(seen)
    seen.clear()
    run_contract(core.CONTRACTS["test-records"], "gfx942", profile="dev", budget=60, seed=11, max_examples=20)
    assert first_two_passes == seen


def test_max_cases_one_is_not_the_budgets_fault(register):
    register("test-cheap", _cheap, min_cases=5)
    doc, code = run_audit(["test-cheap"], ["gfx942"], budget=60, profile="dev", max_cases=1, progress=False)
    (row,) = doc["results"]
    assert row["generated_cases"] == 1 and row["stopped_by"] == "max_cases"
    assert row["status"] == "incomplete" and code == 1 and "case limit" in row["reason"]
    assert "budget" not in row["reason"] and "within" not in row["reason"]


def _cheap(case, target):
    """Always holds."""
    return []


def test_seed_drawn_when_not_given_reproduces_the_run(register):
    seen = []

    def records(case, target):
        """Records every case it is handed."""
        seen.append(case)
        return []

    register("test-records", records)
    doc, _ = run_audit(["test-records"], ["gfx950"], budget=60, profile="dev", max_cases=8, progress=False)
    seed = doc["run"]["seed"]
    assert isinstance(seed, int)
    first = list(seen)
    seen.clear()
    doc2, _ = run_audit(["test-records"], ["gfx950"], budget=60, profile="dev", max_cases=8, seed=seed,
                        progress=False)
    assert doc2["run"]["seed"] == seed and seen == first and len(first) == 8


def test_report_names_commit_versions_and_device(register, tmp_path):
    register("test-cheap", _cheap)
    doc, _ = run_audit(["test-cheap"], ["gfx942"], budget=30, profile="dev", max_cases=5, progress=False,
                       report_dir=str(tmp_path))
    run = doc["run"]
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=default_root(), capture_output=True, text=True)
    assert run["commit"] == (head.stdout.strip() if head.returncode == 0 else None)
    import hypothesis
    import numpy
    import torch

    v = run["versions"]
    assert set(v) == {"smv", "python", "torch", "triton", "hypothesis", "numpy"}
    assert v["torch"] == torch.__version__ and v["hypothesis"] == hypothesis.__version__
    assert v["numpy"] == numpy.__version__ and v["python"] == sys.version.split()[0]
    dev = doc["device"]
    assert set(dev) >= {"kind", "name", "arch"} and dev["name"] not in ("cpu", "")
    if dev["kind"] == "cpu":
        assert dev["arch"] != "cpu"
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["schema_version"] == reports.AUDIT_SCHEMA_VERSION == 12
    assert reports.validate(saved, reports.audit_schema(11)) == []
    assert reports.validate(saved, reports.AUDIT_JSON_SCHEMA) == []
    md = (tmp_path / "audit.md").read_text()
    assert run["commit"] is None or run["commit"][:12] in md
    assert f"seed {run['seed']}" in md and f"torch {v['torch']}" in md


def test_schema_2_requires_the_new_fields():
    row = {"contract": "a", "target": "b", "status": "pass", "reason": "", "cases": 3, "pinned_cases": 1,
           "generated_cases": 2, "stopped_by": "budget", "margin": 0.5, "seconds": 0.1, "violations": [],
           "repro": None}
    run = {"seed": 1, "commit": None, "versions": {k: "1" for k in ("smv", "python", "torch", "triton",
                                                                     "hypothesis", "numpy")}}
    doc = {"schema_version": 2, "run": run, "device": {"kind": "cpu", "name": "x", "arch": "x86_64"},
           "targets": [], "results": [row]}
    assert reports.validate(doc, reports.AUDIT_JSON_SCHEMA) == []
    for bad in ({"stopped_by": "tired"}, {"margin": "big"}, {"pinned_cases": None}):
        broken = dict(doc, results=[dict(row, **bad)])
        assert reports.validate(broken, reports.AUDIT_JSON_SCHEMA), bad
    for key in ("seed", "commit", "versions"):
        broken = dict(doc, run={k: v for k, v in run.items() if k != key})
        assert any(key in e for e in reports.validate(broken, reports.AUDIT_JSON_SCHEMA)), key


def test_table_and_markdown_show_margin_stopped_by_and_the_split(register, tmp_path):
    def numeric(case, target):
        """Records a margin."""
        core.record_margin(0.25)
        return []

    register("test-numeric", numeric, numeric=True, examples=lambda t: [0])
    doc, _ = run_audit(["test-numeric"], ["gfx942"], budget=30, profile="dev", max_cases=6, progress=False,
                       report_dir=str(tmp_path))
    (row,) = doc["results"]
    assert row["margin"] == 0.25 and row["pinned_cases"] == 1 and row["generated_cases"] == 6
    from contracts.engine.audit import format_table

    table = format_table(doc)
    line = next(ln for ln in table.splitlines() if ln.startswith("test-numeric"))
    assert "1+6" in line and "max_cases" in line and "0.25" in line
    md = (tmp_path / "audit.md").read_text()
    assert "| 1+6 |" in md and "max_cases" in md and "0.25" in md


def test_nothing_passed_is_not_ok_unless_allowed(tmp_path):
    doc, code = run_audit(["split-bounds"], ["generic"], budget=30, progress=False, report_dir=str(tmp_path))
    assert code == 1 and doc["run"]["ok"] is False
    assert all(r["status"] == "skipped" for r in doc["results"])
    assert "no row passed" in doc["run"]["reason"]
    from contracts.engine.audit import format_table

    assert "no row passed" in format_table(doc) and "no row passed" in (tmp_path / "audit.md").read_text()
    doc, code = run_audit(["split-bounds"], ["generic"], budget=30, progress=False, allow_empty=True)
    assert code == 0 and doc["run"]["ok"] is True


@pytest.mark.parametrize("kw,match", [({"budget": 0}, "budget"), ({"budget": -5}, "budget"),
                                      ({"max_cases": -1}, "max_cases")])
def test_bad_budget_and_max_cases_rejected(kw, match):
    with pytest.raises(ValueError, match=match):
        run_audit(["split-bounds"], ["gfx942"], progress=False, **kw)


class _Stream:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass

    def isatty(self):
        return False


def test_progress_in_both_passes_with_counts_that_match_the_table(register):
    register("test-cheap", _cheap, examples=lambda t: [0])
    register("test-cheap-2", _cheap)
    out = _Stream()
    doc, _ = run_audit(["test-cheap", "test-cheap-2"], ["gfx942"], budget=30, profile="dev", max_cases=12,
                       stream=out)
    assert "pass 1" in out.text and "pass 2" in out.text and "ETA" in out.text
    pass2 = out.text[out.text.index("pass 2"):]
    for r in doc["results"]:
        assert r["cases"] == 1 + 12 or r["contract"] == "test-cheap-2"
        line = next(ln for ln in pass2.splitlines() if f"{r['contract']} on {r['target']}" in ln)
        assert f"{r['pinned_cases']}+{r['generated_cases']} cases" in line


def test_rows_past_the_deadline_are_not_started(register):
    import time

    def slow(case, target):
        """Slow per case."""
        time.sleep(0.3)
        return []

    register("test-slow-a", slow, min_cases=1)
    register("test-slow-b", slow, min_cases=1)
    t0 = time.monotonic()
    doc, code = run_audit(["test-slow-a", "test-slow-b"], ["gfx942", "gfx950"], budget=0.1, deadline=0.5,
                          profile="dev", progress=False)
    # the deadline, one case, the harness, and the plan's probe of the machine's load
    assert time.monotonic() - t0 < 0.5 + 0.3 + 0.6 + 0.3
    cut = [r for r in doc["results"] if r["status"] == "incomplete"]
    assert code == 1 and cut and all(r["stopped_by"] == "budget" and "deadline" in r["reason"] for r in cut)


class _Tty(_Stream):
    def isatty(self):
        return True


def test_progress_on_a_terminal_with_and_without_rich(register, monkeypatch):
    register("test-cheap", _cheap)
    for with_rich in (True, False):
        if with_rich:
            pytest.importorskip("rich")
        else:
            monkeypatch.setitem(sys.modules, "rich", None)  # import rich -> ImportError: the plain live line
            monkeypatch.setitem(sys.modules, "rich.console", None)
        out = _Tty()
        doc, code = run_audit(["test-cheap"], ["gfx942"], budget=30, profile="dev", max_cases=8, stream=out)
        assert code == 0
        assert "pass 2" in out.text and "0+8 cases" in out.text and "ETA" in out.text
        if not with_rich:
            assert "\r\x1b[K" in out.text


def test_the_profiles_own_count_is_exhausted_not_a_case_limit(register):
    """Without --max-cases a row that reaches the profile's count says "exhausted": no user limit stopped it."""
    register("test-cheap", _cheap, min_cases=2)
    doc, code = run_audit(["test-cheap"], ["gfx942"], budget=60, profile="ci", max_cases=None, progress=False)
    (row,) = doc["results"]
    assert code == 0 and row["generated_cases"] == 25 and row["stopped_by"] == "exhausted"
    doc, _ = run_audit(["test-cheap"], ["gfx942"], budget=60, profile="ci", max_cases=7, progress=False)
    assert doc["results"][0]["stopped_by"] == "max_cases" and doc["results"][0]["generated_cases"] == 7


def test_the_default_budget_follows_the_profile(register):
    from contracts.engine.audit import DEFAULT_BUDGETS

    register("test-cheap", _cheap, min_cases=1)
    for profile in ("dev", "ci"):
        doc, code = run_audit(["test-cheap"], ["gfx942"], profile=profile, max_cases=1, progress=False)
        assert code == 0 and doc["run"]["budget"] == DEFAULT_BUDGETS[profile]
    assert DEFAULT_BUDGETS["dev"] < DEFAULT_BUDGETS["ci"] < 600  # the whole ci audit ends within ten minutes


def test_the_cli_keeps_the_ci_profiles_count_and_dev_its_hundred(register, tmp_path):
    import json

    from contracts.cli.smv import main as smv

    register("test-cheap", _cheap, min_cases=1)
    for profile, want in (("ci", None), ("dev", 100)):
        rep = tmp_path / profile
        assert smv(["audit", "--contract", "test-cheap", "--target", "gfx942", "--profile", profile, "--budget", "30",
                    "--no-progress", "--report", str(rep)]) == 0
        run = json.loads((rep / "audit.json").read_text())["run"]
        assert run["max_cases"] == want, profile
