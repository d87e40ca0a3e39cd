"""The harness on subjects: skipped rows for what a subject lacks, known findings, schema 3 reports, bad specs,
the multi-subject table, the merge gate and the zoo on a subject."""
import importlib.util
import json
import os
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import strategies as st

from contracts.engine import findings as kf
from contracts.engine import reports
from contracts.engine.audit import format_table, run_audit
from contracts.cli.smv import main as smv
from contracts.core import Violation
from contracts.engine.runner import REPRO_SCHEMA_VERSION, replay_row, run_contract, write_repro
from contracts.subjects import (EntryMissing, Family, FidelityError, Subject, SubjectUnavailable, bound,
                                current)
from impl.targets import get_target


class FakeSubject(Subject):
    """A subject whose one family ``fam`` holds the given entries; binding fills modules and rewrites the way a
    real loader does (so a report must describe it after the rows ran)."""

    def __init__(self, name="fake", version="1.0", **entries):
        super().__init__(name, version, source="test tree")
        self.entries = entries
        self.binds = 0

    def bind(self, target):
        self.binds += 1
        self.modules = {"fake/module.py": "0" * 64}
        self.rewrites = [{"id": "fake-rewrite", "file": "fake/module.py", "count": 1, "why": "a test"}]
        return _FakeBound(get_target(target), Family("fam", **self.entries))


class _FakeBound:
    def __init__(self, target, fam):
        self.target, self.fam = target, fam

    def __getattr__(self, family):  # like a real subject: a family it lacks is an entry point it lacks
        raise EntryMissing(family)


def _double_check(calls=None):
    def check(case, target):
        """The subject's fam.double doubles its argument."""
        if calls is not None:
            calls.append(case)
        got = bound(target).fam.double(case)
        return [] if got == 2 * case else [Violation("double is wrong", str(case), str(2 * case), str(got))]

    return check


def _finding(**over):
    base = {"id": "K1", "title": "t", "kind": "upstream-bug", "contract": "test-k", "subjects": ["fake"],
            "versions": ["1.0"], "targets": ["gfx942"], "function": "fake/module.py::f",
            "signature": ["^known defect$"]}
    base.update(over)
    return base


def _toml(**over):
    """One [[finding]] table as TOML (for a registered contract unless ``contract`` says otherwise)."""
    over.setdefault("contract", "split-bounds")
    return "[[finding]]\n" + "\n".join(f"{k} = {json.dumps(v)}" for k, v in _finding(**over).items()) + "\n"


def _findings(*tables):
    return kf.parse({"schema_version": 1, "finding": list(tables)}, "test-findings.toml")


# --- subject exceptions end the row without a verdict -------------------------------------------------------------

def test_entry_missing_is_skipped_naming_the_entry_never_shrunk(register):
    calls = []
    c = register("test-entry", _double_check(calls))
    sub = FakeSubject()  # no fam.double
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=20, seed=1, subject=sub)
    assert row.status == "skipped" and not row.violations and row.repro is None
    assert "fam.double" in row.reason and "fake==1.0" in row.reason
    assert len(calls) == 1  # the first case said it: no more cases, no shrinking replays
    assert row.as_json()["subject"] == {"name": "fake", "version": "1.0"}
    # the same from a pinned example
    c = register("test-entry-pinned", _double_check(), examples=lambda t: [3])
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5, subject=FakeSubject())
    assert row.status == "skipped" and "fam.double" in row.reason and row.pinned_cases == 0


def test_entry_missing_on_the_real_vllm_subject(register, vllm_subject):
    def check(case, target):
        """Asks upstream for a family no adapter serves."""
        bound(target).no_such_family.entry(case)
        return []

    c = register("test-vllm-entry", check)
    row = run_contract(c, "gfx950", profile="dev", budget=60, max_examples=5, seed=1, subject=vllm_subject)
    assert row.status == "skipped", row.reason
    assert row.reason.startswith(f"subject {vllm_subject.label} has no entry point no_such_family")
    assert row.subject == {"name": "vllm", "version": vllm_subject.version}


def test_unavailable_is_skipped_and_fidelity_is_an_error(register):
    def unavailable(x):
        raise SubjectUnavailable("FNUZ fp8 does not exist on this host")

    def untrusted(x):
        raise FidelityError("Triton 9.9 is not a version the interpreter corrections know")

    c = register("test-unavail", _double_check())
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5, subject=FakeSubject(double=unavailable))
    assert row.status == "skipped" and row.reason == "subject fake==1.0: FNUZ fp8 does not exist on this host"
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5, subject=FakeSubject(double=untrusted))
    assert row.status == "error" and "Triton 9.9" in row.reason and not row.violations
    # an ordinary exception of the subject's code stays a violation
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5,
                       subject=FakeSubject(double=lambda x: 1 // 0))
    assert row.status == "fail" and "ZeroDivisionError" in row.reason


def test_a_subject_that_cannot_load_is_an_error_not_a_violation(register):
    class Broken(FakeSubject):
        def bind(self, target):
            raise ImportError("upstream module does not import")

    row = run_contract(register("test-broken", _double_check()), "gfx942", profile="dev", budget=30,
                       max_examples=5, subject=Broken())
    assert row.status == "error" and not row.violations and "could not run" in row.reason


def test_the_subject_is_current_inside_the_check_only(register):
    seen = []

    def check(case, target):
        """Records the current subject."""
        seen.append(current().label)
        return []

    c = register("test-current", check)
    run_contract(c, "gfx942", profile="dev", budget=30, max_examples=5, subject=FakeSubject())
    assert set(seen) == {"fake==1.0"} and current().name == "ours"


# --- known findings -----------------------------------------------------------------------------------------------

def test_classify_every_violation_must_be_explained():
    fs = _findings(_finding(), _finding(id="K2", signature=["^other known$", "^third$"]))
    known, other, new = Violation("known defect"), Violation("other known"), Violation("new defect")
    args = ("test-k", "fake", "1.0", "gfx942")
    assert kf.classify([known], fs, *args) == ["K1"]
    assert kf.classify([other, known, known], fs, *args) == ["K2", "K1"]
    assert kf.classify([known, new], fs, *args) is None
    assert kf.classify([], fs, *args) is None
    # a finding applies only to its contract, subject, version and target
    for wrong in (("test-x", "fake", "1.0", "gfx942"), ("test-k", "ours", "1.0", "gfx942"),
                  ("test-k", "fake", "2.0", "gfx942"), ("test-k", "fake", "1.0", "gfx950")):
        assert kf.classify([known], fs, *wrong) is None, wrong
    assert kf.classify([known], _findings(_finding(versions=["*"])), "test-k", "fake", "7.3", "gfx942") == ["K1"]
    branch = _findings(_finding(versions=["1.0.*"]))  # a branch off a release reports its own version
    assert kf.classify([known], branch, "test-k", "fake", "1.0.1.dev3+gabc", "gfx942") == ["K1"]
    assert kf.classify([known], branch, "test-k", "fake", "1.1.0", "gfx942") is None


def test_known_cases_do_not_stop_the_row_and_an_unknown_one_fails_it(register, tmp_path):
    def check(case, target):
        """Even cases show the known defect; 77 also a new one."""
        out = [Violation("known defect", str(case))] if case % 2 == 0 else []
        return out + ([Violation("new defect", str(case))] if case == 77 else [])

    c = register("test-k", check, cases=lambda t: st.integers(0, 60))
    fs = _findings(_finding())
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=30, seed=2, findings=fs,
                       subject=FakeSubject(), repro_dir=str(tmp_path))
    assert row.status == "known" and row.findings == ["K1"] and row.generated_cases == 30
    assert row.stopped_by == "max_cases" and "K1" in row.reason and row.violations[0].message == "known defect"
    doc = json.loads(Path(row.repro).read_text())
    assert doc["schema_version"] == REPRO_SCHEMA_VERSION and doc["subject"] == "fake==1.0" and doc["findings"] == ["K1"]
    assert row.as_json()["findings"] == ["K1"]
    # without the finding (or under another subject) the same cases fail
    assert run_contract(c, "gfx942", profile="dev", budget=30, max_examples=30, seed=2, findings=[],
                        subject=FakeSubject()).status == "fail"
    assert run_contract(c, "gfx942", profile="dev", budget=30, max_examples=30, seed=2, findings=fs).status == "fail"
    # one unexplained violation in a case fails the row, even when the case's other violations are known
    c77 = register("test-k77", check, cases=lambda t: st.just(77))
    row = run_contract(c77, "gfx942", profile="dev", budget=30, max_examples=3, findings=_findings(
        _finding(contract="test-k77")), subject=FakeSubject())
    assert row.status == "fail" and [v.message for v in row.violations] == ["new defect"]


def test_the_shrinker_never_moves_toward_a_known_signature(register):
    def check(case, target):
        """Small cases are known, large ones new."""
        if case < 100:
            return [Violation("known defect", str(case))]
        return [Violation("new defect", str(case))] if case >= 500 else []

    c = register("test-k", check, cases=lambda t: st.integers(0, 1000))
    row = run_contract(c, "gfx942", profile="dev", budget=30, max_examples=100, seed=5, findings=_findings(_finding()),
                       subject=FakeSubject())
    # were a known case falsifying, the shrinker would end at 0
    assert row.status == "fail" and row.case == 500 and row.findings == ["K1"]


def test_known_rows_are_accepted_by_audit_and_gate(register, tmp_path):
    def check(case, target):
        """Every third case shows the known defect."""
        return [Violation("known defect")] if case % 3 == 0 else []

    register("test-k", check, cases=lambda t: st.integers(0, 50))
    path = tmp_path / "findings.toml"
    path.write_text('schema_version = 1\n[[finding]]\nid = "K1"\ntitle = "t"\nkind = "semantic-difference"\n'
                    'contract = "test-k"\nsubjects = ["ours"]\nversions = ["*"]\ntargets = ["gfx942"]\n'
                    'function = "impl/x.py::f"\nsignature = ["^known defect$"]\n')
    doc, code = run_audit(["test-k"], ["gfx942"], budget=30, profile="dev", max_cases=12, progress=False,
                          findings_path=str(path), report_dir=str(tmp_path / "rep"))
    (row,) = doc["results"]
    assert code == 0 and doc["run"]["ok"] and row["status"] == "known" and row["findings"] == ["K1"]
    assert row["generated_cases"] == 12  # both passes ran: a known row goes on looking for a new failure
    assert doc["run"]["findings"] == {"file": str(path), "ids": ["K1"]}
    spec = importlib.util.spec_from_file_location("merge_gate", Path(__file__).parent.parent / "ci" / "merge_gate.py")
    gate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gate)
    ok, problems = gate.verdict(doc, ["test-k"], ["gfx942"])
    assert ok and not problems, problems
    assert not gate.verdict(dict(doc, results=[dict(row, status="fail")]))[0]


# --- findings.toml validation -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text,what", [
    ("finding = []\n", "missing schema_version"),
    ("schema_version = 4\n", "schema_version 4"),
    ("schema_version = 1\nextra = 1\n", "'extra'"),
    ("schema_version = 1\n[[finding]]\nid = 'K1'\n", "finding #1 (K1): missing field 'title'"),
    ("schema_version = 1\n" + _toml(kind="bug"), "field 'kind'"),
    ("schema_version = 1\n" + _toml(targets=["gfx1"]), "unknown target 'gfx1'"),
    ("schema_version = 1\n" + _toml(signature=["(unclosed"]), "field 'signature'"),
    ("schema_version = 1\n" + _toml(signature=[]), "field 'signature'"),
    ("schema_version = 1\n" + _toml(colour="red"), "unknown field 'colour'"),
    ("schema_version = 1\n" + _toml(contract="no-such-contract"), "no contract 'no-such-contract'"),
    ("schema_version = 1\n" + 2 * _toml(), "finding #2 (K1): field 'id'"),
    ("schema_version = [", "not valid TOML"),
])
def test_findings_file_errors_name_the_file_and_field(tmp_path, capsys, text, what):
    from contracts.registry import load_all

    p = tmp_path / "findings.toml"
    p.write_text(text)
    with pytest.raises(kf.FindingsError) as info:
        kf.load(str(p), known_contracts=set(load_all()))
    msg = str(info.value)
    assert msg.startswith(f"{p}: ") and what in msg and "\n" not in msg, msg
    assert smv(["audit", "--contract", "split-bounds", "--findings", str(p)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and what in err


def test_the_repository_findings_file_is_valid():
    from contracts.registry import load_all

    fs = kf.load(kf.default_path(), known_contracts=set(load_all()))
    assert all(f.kind in kf.KINDS and f.signature for f in fs)


# --- reports: schema 3, several subjects ---------------------------------------------------------------------------

def test_schema_3_rows_and_subjects(register, tmp_path):
    register("test-double", _double_check())
    fake = FakeSubject(double=lambda x: 2 * x)
    doc, code = run_audit(["test-double"], ["gfx942", "gfx950"], budget=30, profile="dev", max_cases=6,
                          progress=False, report_dir=str(tmp_path), subjects=[fake], junit=str(tmp_path / "j.xml"))
    assert code == 0 and doc["schema_version"] == reports.AUDIT_SCHEMA_VERSION >= 9
    assert reports.validate(doc, reports.audit_schema(3)) == []
    assert all(r["subject"] == {"name": "fake", "version": "1.0"} and r["findings"] == [] for r in doc["results"])
    (d,) = doc["run"]["subjects"]
    # described after the rows ran: what binding loaded and rewrote is there
    assert d["modules"] == {"fake/module.py": "0" * 64} and d["rewrites"][0]["id"] == "fake-rewrite"
    assert (d["name"], d["version"], d["source"], d["label"]) == ("fake", "1.0", "test tree", "fake==1.0")
    assert d["counts"]["pass"] == 2
    saved = json.loads((tmp_path / "audit.json").read_text())
    assert saved["run"]["subjects"] == doc["run"]["subjects"]
    assert "fake==1.0" in format_table(doc).splitlines()[0] and "`fake==1.0`" in (tmp_path / "audit.md").read_text()
    # a schema-3 document without the new fields does not validate as 3
    row = dict(doc["results"][0])
    del row["subject"]
    assert any("subject" in e for e in reports.validate(dict(doc, results=[row]), reports.audit_schema(3)))
    assert reports.validate(dict(doc, results=[row]), reports.AUDIT_JSON_SCHEMA) == []


def test_multi_subject_table_markdown_and_junit(register, tmp_path):
    register("test-double", _double_check())
    subs = [None, FakeSubject(double=lambda x: 2 * x), FakeSubject("other", "2.0", double=lambda x: x + 1)]
    doc, code = run_audit(["test-double", "split-bounds"], ["gfx942", "generic"], budget=60, profile="dev",
                          max_cases=10, progress=False, report_dir=str(tmp_path), subjects=subs,
                          junit=str(tmp_path / "j.xml"))
    assert code == 1 and len(doc["results"]) == 3 * 4
    split = {(r["subject"]["name"], r["target"]): r["status"] for r in doc["results"] if r["contract"] == "split-bounds"}
    assert split == {("ours", "gfx942"): "pass", ("ours", "generic"): "skipped", ("fake", "gfx942"): "skipped",
                     ("fake", "generic"): "skipped", ("other", "gfx942"): "skipped", ("other", "generic"): "skipped"}
    assert [d["label"] for d in doc["run"]["subjects"]] == ["ours", "fake==1.0", "other==2.0"]
    table = format_table(doc)
    head = next(ln for ln in table.splitlines() if ln.startswith("contract"))
    assert head.split() == ["contract", "target", "ours", "fake==1.0", "other==2.0"]
    line = next(ln for ln in table.splitlines() if ln.startswith("test-double") and " gfx942 " in ln).split()
    assert line[2] == "skipped" and line[3] == "pass" and line[5] == "fail", line  # ours has no impl.fam
    assert sum(ln.startswith("test-double") for ln in table.splitlines()) == 2  # one line per contract x target
    assert "ours: test-double on gfx942: skipped: subject ours has no entry point fam" in table
    md = (tmp_path / "audit.md").read_text()
    assert "| contract | target | `ours` | `fake==1.0` | `other==2.0` |" in md
    assert "## test-double on gfx942 under `other==2.0`: fail" in md
    names = {tc.get("name") for tc in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    assert "gfx942 [other==2.0]" in names and "generic [ours]" in names
    # every subject had the whole budget, and its rows' repro files do not overwrite each other
    repros = [r["repro"] for r in doc["results"] if r["repro"]]
    assert len(repros) == len(set(repros)) and all(os.path.exists(p) for p in repros)


def test_repro_replays_under_its_subject_and_reads_version_2(register, tmp_path, capsys):
    c = register("test-double", _double_check())
    bad = FakeSubject(double=lambda x: x + 1)
    bad.spec = "fake==1.0"
    p = write_repro(str(tmp_path / "r.json"), c, get_target("gfx942"), 3, [Violation("double is wrong")], bad)
    doc = json.loads(Path(p).read_text())
    assert doc["subject"] == "fake==1.0"
    r = replay_row(p, subject=bad)
    assert r.subject is bad and r.violations and r.violations[0].message == "double is wrong"
    doc["schema_version"] = 2
    del doc["subject"]
    Path(p).write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="no entry point fam"):  # version 2 is ours, which lacks fam
        replay_row(p)
    # the CLI says which subject the file names when it cannot be loaded, and --subject overrides it
    doc["schema_version"], doc["subject"] = 3, f"vllm@{tmp_path}"
    Path(p).write_text(json.dumps(doc))
    assert smv(["repro", p]) == 2
    err = capsys.readouterr().err
    assert "not a vLLM tree" in err and "--subject" in err


# --- bad subject specs ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv,what", [
    (["audit", "--subject", "vllm==0.0.0-does-not-exist"], "not a release version"),
    (["audit", "--subject", "vllm@{tmp}"], "not a vLLM tree"),
    (["audit", "--subject", "vllm@{tmp}/missing"], "no such directory"),
    (["audit", "--subject", "llama"], "unknown subject"),
    (["audit", "--subject", "ours", "--subject", "ours"], "told apart"),
    (["zoo", "--subject", "vllm@{tmp}"], "not a vLLM tree"),
    (["repro", "x.json", "--subject", "vllm==not-a-version"], "not a release version"),
    (["subject", "show", "vllm@{tmp}"], "not a vLLM tree"),
    (["subject", "fetch", "vllm==0.0.0-does-not-exist", "--to", "{tmp}/t"], "not a release version"),
    (["subject", "fetch", "ours", "--to", "{tmp}/t"], "expected vllm==VERSION"),
    (["subject", "fetch", "vllm==0.33.0", "--to", "{tmp}"], "not empty"),
])
def test_bad_subject_spec_is_one_line_and_exit_2_before_anything_runs(tmp_path, capsys, monkeypatch, argv, what):
    import contracts.engine.audit
    import contracts.subjects.vllm.loader as loader
    import contracts.zoo.runner

    (tmp_path / "something").write_text("not vllm")
    monkeypatch.setattr(contracts.engine.audit, "run_audit", lambda *a, **k: pytest.fail("the audit ran"))
    monkeypatch.setattr(contracts.zoo.runner, "run_zoo", lambda *a, **k: pytest.fail("the zoo ran"))
    monkeypatch.setattr(loader, "fetch_tree", lambda *a, **k: pytest.fail("a download was attempted"))
    t0 = time.monotonic()
    assert smv([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    assert time.monotonic() - t0 < 5
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and what in err, err


def test_subject_show_and_fetch_from_the_cache(vllm_subject, tmp_path, capsys, monkeypatch):
    import contracts.subjects.vllm.loader as loader

    monkeypatch.setattr(loader, "cache_dir", lambda: os.path.dirname(vllm_subject.tree.root))
    assert smv(["subject", "fetch", f"vllm=={vllm_subject.version}", "--to", str(tmp_path / "tree")]) == 0
    capsys.readouterr()
    assert smv(["subject", "show", f"vllm@{tmp_path / 'tree'}"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["name"] == "vllm" and doc["version"] == vllm_subject.version
    assert doc["modules"] == vllm_subject.describe()["modules"] and doc["label"] == f"vllm=={vllm_subject.version}"


# --- the zoo on a subject -----------------------------------------------------------------------------------------

def test_zoo_on_a_subject_addresses_its_tree(tmp_path):
    from contracts.zoo import runner as zr

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "mod.py").write_text("X = 1\nX = 1\n")
    sub = FakeSubject()
    sub.tree = SimpleNamespace(root=str(tmp_path))
    assert zr.subject_root(sub) == tmp_path
    assert all(p.parent == zr.UPSTREAM_CATALOG_DIR for p in zr.builtin_catalogs(sub))
    assert all(p.parent == zr.CATALOG_DIR for p in zr.builtin_catalogs(None))
    m = zr.Mutant("m", "t", "p", "vllm/mod.py", "X = 1", "X = 2", ["split-bounds"], ["gfx942"])
    res = zr.run_mutant(m, subject=sub)
    assert res.status == "stale" and "2 times" in res.detail
    res = zr.run_mutant(zr.Mutant("m", "t", "p", "vllm/gone.py", "a", "b", ["split-bounds"], ["gfx942"]), subject=sub)
    assert res.status == "stale" and "does not exist" in res.detail
    # a kill on a contract the unpatched subject already fails is no kill
    killed = zr.MutantResult("m", "killed", ["split-bounds"], ["split-bounds"], detail="split-bounds on gfx942: x")
    base = {("split-bounds", "gfx942"): {"status": "fail", "reason": "old failure"}}
    assert zr.judge_against_baseline(killed, m, base).status == "error" and "already fails" in killed.detail
    killed = zr.MutantResult("m", "killed", ["split-bounds"], ["split-bounds"], detail="split-bounds on gfx942: x")
    base = {("split-bounds", "gfx942"): {"status": "known", "reason": "known finding K1"}}
    assert zr.judge_against_baseline(killed, m, base).status == "killed"
    assert zr.subject_json(sub) == {"name": "fake", "version": "1.0", "source": "test tree"}
