"""FINDINGS.md is generated from findings.toml, findings/notes/ and findings/lifecycle.json, and findings.toml's
schema 3 fields (reach, severity, consequence, policy, fixed_in) are validated."""
from __future__ import annotations

import pytest

from contracts.cli.smv import main as smv
from contracts.engine import findings as kf
from contracts.engine.findings_render import lifecycle_from_audits, render

BASE = {"id": "X1", "title": "t", "kind": "upstream-bug", "contract": "split-bounds", "subjects": ["vllm"],
        "confirmed_in": ["0.33.0"], "targets": ["gfx942"], "function": "f", "signature": ["^x$"]}
TRIAGE = {"reach": "production", "severity": "performance", "consequence": "c.", "policy": False}


def test_findings_md_is_what_its_sources_give(capsys):
    assert smv(["findings", "render", "--check"]) == 0, capsys.readouterr().out


def test_render_orders_by_reach_then_severity_and_lists_aliases_under_their_root(tmp_path):
    doc = {"schema_version": 3, "finding": [
        dict(BASE, id="A1", **dict(TRIAGE, reach="adversarial", severity="crash")),
        dict(BASE, id="P2", **dict(TRIAGE, severity="performance")),
        dict(BASE, id="P1", **dict(TRIAGE, severity="crash", consequence="the decode writes zeros.")),
        dict(BASE, id="P1-agreement", contract="subject-agreement", **TRIAGE),
    ]}
    fs = kf.parse(doc, str(tmp_path / "findings.toml"))
    (tmp_path / "findings" / "notes").mkdir(parents=True)
    (tmp_path / "findings" / "notes" / "P1.md").write_text("Counterexample: batch 1.")
    text = render(fs, str(tmp_path / "findings.toml"), {"shown": {"P1": ["vllm==0.33.0"]}})
    assert text.index("### P1") < text.index("### P2") < text.index("### A1")
    assert "### P1-agreement" not in text and "also seen by `subject-agreement` as P1-agreement" in text
    assert "Counterexample: batch 1." in text and "consequence: the decode writes zeros." in text
    assert "| vllm==0.33.0 |" in text
    assert text.index("## Production") < text.index("## Adversarial")


@pytest.mark.parametrize("change,message", [
    ({"reach": "sometimes"}, "field 'reach' must be one of production, caller-contract, adversarial"),
    ({"severity": "bad"}, "field 'severity' must be one of"),
    ({"policy": "yes"}, "field 'policy' must be true or false"),
    ({"policy": True}, "a policy (upstream's deliberate choice) is a semantic-difference"),
    ({"fixed_in": "0.34.0"}, "field 'fixed_in' must be a list of releases"),
])
def test_schema_3_fields_are_checked(change, message):
    with pytest.raises(kf.FindingsError, match=message.replace("(", r"\(").replace(")", r"\)")):
        kf.parse({"schema_version": 3, "finding": [dict(BASE, **dict(TRIAGE, **change))]})


def test_schema_3_requires_the_triage_and_schema_2_still_loads():
    with pytest.raises(kf.FindingsError, match="missing field 'reach'"):
        kf.parse({"schema_version": 3, "finding": [BASE]})
    (f,) = kf.parse({"schema_version": 2, "finding": [BASE]})
    assert f.reach == "" and f.policy is False
    (f,) = kf.parse({"schema_version": 3, "finding": [dict(BASE, fixed_in=["0.34.0"], **TRIAGE)]})
    assert (f.reach, f.severity, f.fixed_in) == ("production", "performance", ("0.34.0",))


def test_lifecycle_from_audits_names_the_subjects_that_showed_each_finding():
    docs = [{"run": {"subjects": [{"label": "vllm==0.33.0"}]}, "results": [
        {"subject": {"name": "vllm", "version": "0.33.0"}, "findings": ["U1", "U2"]},
        {"subject": {"name": "vllm", "version": "0.34.0"}, "findings": ["U1"]},
        {"subject": {"name": "ours", "version": "0.2.0"}, "findings": []}]}]
    assert lifecycle_from_audits(docs)["shown"] == {"U1": ["vllm==0.33.0", "vllm==0.34.0"], "U2": ["vllm==0.33.0"]}
