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

from contracts import core, reports
from contracts.audit import run_audit
from contracts.cli import main as smv
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
        doc, code = run_audit(["test-only-gfx950", "test-slow"], ["gfx942", "gfx950"], budget=6.0,
                              progress=False)
    finally:
        core.CONTRACTS.pop("test-only-gfx950")
        core.CONTRACTS.pop("test-slow")
    st_ = {(r["contract"], r["target"]): r for r in doc["results"]}
    assert st_[("test-only-gfx950", "gfx942")]["status"] == "skipped"
    assert st_[("test-only-gfx950", "gfx942")]["reason"] == "gfx950-only behaviour"
    assert st_[("test-only-gfx950", "gfx950")]["status"] == "pass"
    assert st_[("test-slow", "gfx942")]["status"] == "incomplete"
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
