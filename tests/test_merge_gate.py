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


def test_required_contract_only_skipped_blocks_and_says_which(tmp_path):
    r = _gate(tmp_path, _doc(("a", "gfx942", "pass"), ("b", "gfx942", "skipped"), ("b", "gfx950", "skipped")),
              "--require-contract", "b")
    assert r.returncode == 1
    assert "required contract b has no passing row (b on gfx942: skipped, b on gfx950: skipped)" in r.stdout
    r = _gate(tmp_path, _doc(("a", "gfx942", "pass")), "--require-contract", "c", "--require-target", "generic")
    assert r.returncode == 1
    assert "required contract c is not in the report" in r.stdout
    assert "required target generic is not in the report" in r.stdout
    r = _gate(tmp_path, _doc(("a", "gfx942", "pass"), ("b", "gfx942", "pass")), "--require-contract", "b",
              "--require-target", "gfx942")
    assert r.returncode == 0


def test_a_report_where_nothing_passed_blocks_unless_allowed(tmp_path):
    doc = _doc(("split-bounds", "generic", "skipped"))
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "no row passed (split-bounds on generic: skipped)" in r.stdout
    assert _gate(tmp_path, doc, "--allow-empty").returncode == 0


def test_schema_2_reports_are_read(tmp_path):
    doc = _doc(("a", "gfx942", "pass"), ("b", "gfx950", "fail"))
    doc["schema_version"] = 2
    for row in doc["results"]:
        row.update(pinned_cases=1, generated_cases=4, stopped_by="budget", margin=None)
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "b on gfx950: fail" in r.stdout and "schema_version" not in r.stdout
    doc["results"] = doc["results"][:1]
    assert _gate(tmp_path, doc).returncode == 0


def test_schema_8_reports_are_read(tmp_path):
    """audit.json 8 adds run.jobs (smv audit --jobs); the gate reads it as before and still refuses a later one."""
    doc = _doc(("a", "gfx942", "pass"), ("a", "gfx950", "pass"))
    doc["schema_version"] = 8
    doc["run"] = {"jobs": 12}
    r = _gate(tmp_path, doc)
    assert r.returncode == 0 and "PASS" in r.stdout
    doc["schema_version"] = 99
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "unsupported audit.json schema_version 99" in r.stdout


def test_schema_9_reports_are_read_and_error_rows_block(tmp_path):
    """audit.json 9 adds what the stand-ins served and the lifecycle across subjects; a subject's row that ended
    `error` (its code did not load, a symbol an adapter needs is gone) blocks the merge, naming the cause."""
    doc = _doc(("a", "gfx942", "pass"), ("b", "gfx942", "error"))
    doc["schema_version"] = 9
    doc["results"][1]["reason"] = "subject vllm==0.35.0 could not run on gfx942: ImportError: gone (upstream x.py:3)"
    doc["run"] = {"subjects": [], "lifecycle": {"subjects": ["vllm==0.35.0"], "findings": [], "new_failures": []}}
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "b on gfx942: error: subject vllm==0.35.0 could not run" in r.stdout
    doc["results"][1]["status"] = "pass"
    assert _gate(tmp_path, doc).returncode == 0


def test_schema_10_a_change_that_selected_nothing_passes(tmp_path):
    """audit.json 10 adds run.changed_since (smv audit --changed-since REF); an audit the change selected nothing
    for has no rows and passes, while an audit with no rows and no such selection still blocks."""
    doc = _doc()
    doc["schema_version"] = 10
    doc["run"] = {"changed_since": {"ref": "HEAD~1", "changed": ["README.md"], "selected": [], "why": []}}
    assert _gate(tmp_path, doc).returncode == 0
    doc["run"] = {}
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "the audit ran no rows" in r.stdout


def _reach_doc(subject, *rows):
    doc = _doc(*[(c, t, s) for c, t, s, _ in rows])
    doc["schema_version"] = 12
    for r, (_, _, _, reach) in zip(doc["results"], rows):
        r["subject"] = subject
        r["reach_class"] = reach
    return doc


def test_schema_12_an_upstream_run_whose_only_violations_are_adversarial_passes_saying_so(tmp_path):
    """audit.json 12: each failing row's reach_class. Upstream's adversarial failures are hardening notes by default;
    production and caller-contract ones block; --gate-reach chooses; a row without a class still blocks."""
    vllm = {"name": "vllm", "version": "0.33.0"}
    doc = _reach_doc(vllm, ("a", "gfx942", "pass", None), ("nan-free-cache", "gfx950", "fail", "adversarial"))
    r = _gate(tmp_path, doc)
    assert r.returncode == 0 and "PASS" in r.stdout, r.stdout
    assert "1 hardening note" in r.stdout and "nan-free-cache on gfx950 under vllm==0.33.0: adversarial" in r.stdout
    r = _gate(tmp_path, doc, "--gate-reach", "all")
    assert r.returncode == 1 and "nan-free-cache on gfx950 under vllm==0.33.0: fail" in r.stdout
    for reach in ("production", "caller-contract", None):
        doc["results"][1]["reach_class"] = reach
        assert _gate(tmp_path, doc).returncode == 1, reach
    doc["results"][1]["reach_class"] = "caller-contract"
    assert _gate(tmp_path, doc, "--gate-reach", "production").returncode == 0
    assert _gate(tmp_path, doc, "--gate-reach", "sometimes").returncode == 2


def test_schema_12_ours_blocks_at_every_reach(tmp_path):
    ours = {"name": "ours", "version": "0.2.0"}
    doc = _reach_doc(ours, ("a", "gfx942", "pass", None), ("nan-free-cache", "gfx950", "fail", "adversarial"))
    r = _gate(tmp_path, doc)
    assert r.returncode == 1 and "hardening" not in r.stdout
