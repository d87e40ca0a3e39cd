"""ci/merge_gate.py turns audit.json into a verdict."""
import json
import subprocess
import sys
from pathlib import Path

GATE = Path(__file__).resolve().parent.parent / "ci" / "merge_gate.py"


def _doc(*rows):
    return {"schema_version": 1, "run": {}, "device": {"kind": "cpu", "name": "cpu", "arch": "cpu"},
            "targets": ["gfx942", "gfx950"],
            "results": [{"contract": c, "target": t, "status": s, "reason": "r", "cases": 5, "seconds": 1.0,
                         "violations": [], "repro": None} for c, t, s in rows]}


def _gate(tmp_path, doc, *extra):
    p = tmp_path / "audit.json"
    p.write_text(json.dumps(doc))
    return subprocess.run([sys.executable, str(GATE), str(p), *extra], capture_output=True, text=True)


def test_pass_and_skip_is_mergeable(tmp_path):
    r = _gate(tmp_path, _doc(("a", "gfx942", "pass"), ("a", "gfx950", "skipped")))
    assert r.returncode == 0 and "PASS" in r.stdout


def test_fail_error_incomplete_block(tmp_path):
    for s in ("fail", "error", "incomplete"):
        r = _gate(tmp_path, _doc(("a", "gfx942", "pass"), ("b", "gfx950", s)))
        assert r.returncode == 1 and "BLOCK" in r.stdout and f"b on gfx950: {s}" in r.stdout


def test_required_target_only_skipped_blocks(tmp_path):
    r = _gate(tmp_path, _doc(("a", "gfx942", "pass"), ("a", "gfx950", "skipped")), "--require-target", "gfx950")
    assert r.returncode == 1 and "required target gfx950" in r.stdout


def test_unknown_schema_and_unreadable_file(tmp_path):
    doc = _doc(("a", "gfx942", "pass"))
    doc["schema_version"] = 99
    assert _gate(tmp_path, doc).returncode == 1
    r = subprocess.run([sys.executable, str(GATE), str(tmp_path / "missing.json")], capture_output=True, text=True)
    assert r.returncode == 2
