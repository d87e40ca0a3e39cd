"""The zoo: every catalogued planted bug is killed; stale, survived, error and crash verdicts behave as promised."""
import json
import textwrap

import pytest

from contracts.cli.smv import main as smv
from contracts.zoo.runner import Mutant, load_catalog, load_catalogs, run_mutant

MUTANTS = load_catalogs()
CAP = 150.0
#: plain pytest runs, for every contract, the first PER_CONTRACT mutants (in catalog order) that expect it; the rest
#: are `slow` (`--run-slow`, the nightly pipeline). `smv zoo` (the pull-request and nightly pipelines) runs them all.
#: one: each kill is a subprocess audit (10-45 s of CPU here), and with two a contract the zoo alone took over half of
#: plain pytest's ten minutes on 2 cores
PER_CONTRACT = 1
#: contracts that keep a different number in plain pytest (none today)
PER_CONTRACT_OVERRIDE: dict = {}
#: contracts whose first planted bug costs far more to kill than another of theirs (wall seconds under `smv zoo
#: --jobs 2` here, 2026-12-01): plain pytest kills the cheaper one instead; `smv zoo` still runs both
PLAIN_PYTEST_PICK = {
    "graph-replay-agreement": "graph-replay-reallocates-index-buffer",  # 10.8 s instead of 33.3 s (replans)
    "dsv4-step-agreement": "dsv4-step-swa-slot-from-seq-len",  # 8.0 s instead of 21.2 s
}


def _core_ids(mutants) -> set:
    seen: dict = {}
    core = set()
    for m in mutants:
        if m.id in PLAIN_PYTEST_PICK.values():
            core.add(m.id)
    for c in PLAIN_PYTEST_PICK:
        seen[c] = PER_CONTRACT_OVERRIDE.get(c, PER_CONTRACT)  # its pick above is its one
    for m in mutants:
        if any(seen.get(c, 0) < PER_CONTRACT_OVERRIDE.get(c, PER_CONTRACT) for c in m.expect):
            core.add(m.id)
        for c in m.expect:
            seen[c] = seen.get(c, 0) + 1
    return core


CORE = _core_ids(MUTANTS)


@pytest.mark.parametrize("mutant", [m if m.id in CORE else pytest.param(m, marks=pytest.mark.slow) for m in MUTANTS],
                         ids=[m.id for m in MUTANTS])
def test_planted_bug_is_killed(mutant):
    res = run_mutant(mutant, cap=CAP)
    assert res.status == "killed", f"{mutant.id}: {res.status}: {res.detail}"
    assert set(mutant.expect) <= set(res.fired)
    ttk = res.as_json()["time_to_kill"]  # measured in the audit's rows: at least one case, within the mutant's time
    assert 0 <= ttk["seconds"] < res.seconds, ttk
    if not ttk.get("crash"):  # a crash at import has no row (0 cases); one mid-row names its row like a fail
        assert ttk["cases"] >= 1 and ttk["contract"] in mutant.expect and ttk["target"] in mutant.targets, ttk


def _m(**kw):
    base = dict(id="x", title="t", provenance="p", file="impl/formats.py", find="", replace="",
                expect=["fp8-codec-exact"], targets=["gfx950"])
    base.update(kw)
    return Mutant(**base)


def test_find_missing_or_repeated_is_stale():
    assert run_mutant(_m(find="this text is nowhere in the file", replace="x")).status == "stale"
    res = run_mutant(_m(find="def ", replace="def  "))
    assert res.status == "stale" and "occurs" in res.detail


def test_patch_changing_nothing_observable_survives_and_fails_the_command(tmp_path):
    cat = tmp_path / "noop.toml"
    cat.write_text(textwrap.dedent('''
        [[mutant]]
        id = "comment-only"
        title = "a comment added"
        provenance = "test"
        file = "impl/formats.py"
        find = "UE8M0_NAN_CODE = 255"
        replace = "UE8M0_NAN_CODE = 255  # harmless"
        expect = ["ue8m0-codec-exact"]
        targets = ["gfx950"]
    '''))
    rep = tmp_path / "rep"
    assert smv(["zoo", "--catalog", str(cat), "--report", str(rep)]) == 1
    doc = json.loads((rep / "zoo.json").read_text())
    assert doc["schema_version"] == 5 and doc["kill_rate"] == 0.0
    (r,) = doc["results"]
    assert r["status"] == "survived" and r["fired"] == [] and r["expect"] == ["ue8m0-codec-exact"]
    assert set(r) == {"id", "status", "expect", "fired", "seconds", "detail", "time_to_kill", "cap_seconds"}
    assert r["cap_seconds"] >= 90 and doc["cap"]["baseline"]["startup_seconds"] > 0
    assert r["time_to_kill"] is None and doc["time_to_kill"]["killed"] == 0


def test_unimportable_patch_is_error_not_kill():
    res = run_mutant(_m(find="UE8M0_NAN_CODE = 255", replace="UE8M0_NAN_CODE = = 255"))
    assert res.status == "error" and "import" in res.detail


def test_crash_counts_as_killed():
    res = run_mutant(_m(find="UE8M0_NAN_CODE = 255",
                        replace="UE8M0_NAN_CODE = 255\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"))
    assert res.status == "killed" and "SIGSEGV" in res.detail
    ttk = res.as_json()["time_to_kill"]  # at import, before any case: no row, and the process's own seconds
    assert ttk["crash"] is True and ttk["cases"] == 0 and ttk["contract"] is None
    assert 0 < ttk["seconds"] <= res.seconds


def test_time_cap_is_error():
    res = run_mutant(_m(find="UE8M0_NAN_CODE = 255", replace="UE8M0_NAN_CODE = 255\nimport time; time.sleep(60)"),
                     cap=3)
    assert res.status == "error" and "time cap" in res.detail


def test_catalog_validation(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[[mutant]]\nid = "Bad_Id"\n')
    with pytest.raises(ValueError, match="lacks"):
        load_catalog(bad)
    bad.write_text('[[mutant]]\nid="a"\ntitle="t"\nprovenance="p"\nfile="f"\nfind="x"\nreplace="y"\n'
                   'expect=["c"]\ntargets=["gfx1"]\n')
    with pytest.raises(ValueError, match="unknown or no targets"):
        load_catalog(bad)
    bad.write_text("not toml [")
    with pytest.raises(ValueError, match="not valid TOML"):
        load_catalog(bad)
    assert smv(["zoo", "--catalog", str(bad)]) == 2


def test_builtin_catalog_ids_unique_and_provenanced():
    ids = [m.id for m in MUTANTS]
    assert len(ids) == len(set(ids))
    for m in MUTANTS:
        assert m.provenance.strip() and m.title.strip()


def test_list_shows_a_given_catalog_without_running_it(tmp_path, capsys, monkeypatch):
    import contracts.zoo.runner as zr

    monkeypatch.setattr(zr, "run_mutant", lambda *a, **k: pytest.fail("--list must not run a mutant"))
    cat = tmp_path / "one.toml"
    cat.write_text(textwrap.dedent('''
        [[mutant]]
        id = "listed-only"
        title = "a planted bug that is only listed"
        provenance = "test"
        file = "impl/formats.py"
        find = "UE8M0_NAN_CODE = 255"
        replace = "UE8M0_NAN_CODE = 254"
        expect = ["ue8m0-codec-exact", "fp8-codec-exact"]
        targets = ["gfx950"]
    '''))
    assert smv(["zoo", "--catalog", str(cat), "--list"]) == 0
    out = capsys.readouterr().out
    assert out.split() == ["listed-only", "->", "ue8m0-codec-exact,", "fp8-codec-exact", "a", "planted", "bug",
                           "that", "is", "only", "listed"]
    assert smv(["zoo", "--catalog", str(cat), "--list", "--json"]) == 0
    (m,) = json.loads(capsys.readouterr().out)["mutants"]
    assert (m["id"], m["expect"], m["title"]) == ("listed-only", ["ue8m0-codec-exact", "fp8-codec-exact"],
                                                  "a planted bug that is only listed")
    assert smv(["zoo", "--catalog", str(cat), "--mutant", "listed"]) == 2
    assert capsys.readouterr().err.strip() == "smv zoo: error: unknown mutant 'listed'; did you mean listed-only?"


def test_plain_pytest_still_kills_a_planted_bug_of_every_contract():
    from contracts.registry import load_all

    by_id = {m.id: m for m in MUTANTS}
    assert all(cid in by_id[mid].expect for cid, mid in PLAIN_PYTEST_PICK.items()), "a stale plain-pytest pick"
    covered = {c for m in MUTANTS if m.id in CORE for c in m.expect}
    ours = {c for c in load_all() if c != "subject-agreement"}  # its planted bugs live in upstream's catalogs
    assert ours <= covered, sorted(ours - covered)


# --- time to kill: measured by the runner, not invented ----------------------------------------------------------

def _sequence(register, cid, n, **kw):
    """The row's generated cases in order (ci profile, seed 0), recorded by a check that passes them all."""
    from contracts.engine.runner import run_contract

    seen = []

    def record(case, target):
        """Records every case."""
        seen.append(case)
        return []

    c = register(cid, record, **kw)
    r = run_contract(c, "gfx950", profile="ci", seed=0, max_examples=n, use_examples=False, budget=60)
    assert r.status == "pass" and r.first_violation is None and r.as_json()["first_violation"] is None
    return seen


def _fails_on(bad):
    from contracts.core import Violation

    def check(case, target):
        """Fails on the planted cases."""
        return [Violation("planted", "here", "not planted", case)] if case in bad else []

    return check


def test_first_violation_is_the_case_index_of_the_planted_bug(register):
    from contracts.engine.runner import run_contract

    seq = _sequence(register, "test-ttk-record", 12)
    k = next(i for i in range(5, len(seq)) if seq[i] not in seq[:i])  # a case first drawn at index k
    c = register("test-ttk-fails", _fails_on({seq[k]}))
    r = run_contract(c, "gfx950", profile="ci", seed=0, max_examples=12, use_examples=False, budget=60)
    assert r.status == "fail" and r.first_violation["cases"] == k + 1
    assert 0 < r.first_violation["seconds"] <= r.seconds
    # pinned examples are cases too: two passing ones come first
    c2 = register("test-ttk-fails-pinned", _fails_on({seq[k]}), examples=lambda t: [-1, -2])
    r2 = run_contract(c2, "gfx950", profile="ci", seed=0, max_examples=12, budget=60)
    assert r2.first_violation["cases"] == k + 3 and r2.pinned_cases == 2


def test_first_violation_in_the_second_pass_counts_the_first(register, tmp_path):
    from contracts.engine import reports
    from contracts.engine.audit import run_audit

    seq = _sequence(register, "test-ttk-record2", 12, min_cases=3)
    k = next(i for i in range(6, len(seq)) if seq[i] not in seq[:i])  # past pass 1's three cases
    register("test-ttk-pass2", _fails_on({seq[k]}), min_cases=3)
    doc, code = run_audit(["test-ttk-pass2"], ["gfx950"], budget=60, profile="ci", max_cases=12, progress=False,
                          use_examples=False, report_dir=str(tmp_path))
    (row,) = doc["results"]
    assert code == 1 and row["status"] == "fail" and row["first_violation"]["cases"] == k + 1
    assert 0 < row["first_violation"]["seconds"] <= row["seconds"]
    assert doc["schema_version"] == reports.AUDIT_SCHEMA_VERSION >= 5
    assert reports.validate(doc, reports.audit_schema(5)) == []


def test_crash_mid_row_is_timed_from_the_case_trace(register, tmp_path, monkeypatch):
    """The runner's trace says which case a dying run was in; the zoo counts that case and the row's time."""
    import os
    import signal
    import time

    from contracts.engine.runner import CASE_TRACE_ENV, run_contract
    from contracts.zoo.runner import _crash_time_to_kill

    calls = []

    def dies(case, target):
        """Kills its process at its fifth case."""
        calls.append(case)
        if len(calls) == 5:
            os.kill(os.getpid(), signal.SIGKILL)
        return []

    trace = tmp_path / "trace.json"
    monkeypatch.setenv(CASE_TRACE_ENV, str(trace))
    c = register("test-ttk-dies", dies)
    t0 = time.time()
    pid = os.fork()
    if pid == 0:  # the child runs the row and dies in it
        try:
            run_contract(c, "gfx950", profile="ci", seed=0, max_examples=12, use_examples=False, budget=60)
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    ended = time.time()
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    ttk = _crash_time_to_kill(trace, tmp_path / "no-report", t0, ended)
    assert ttk["crash"] is True and ttk["cases"] == 5
    assert (ttk["contract"], ttk["target"]) == ("test-ttk-dies", "gfx950")
    assert 0 <= ttk["seconds"] <= ended - t0 + 0.01
    # no trace at all: the crash came before any case (at import)
    none = _crash_time_to_kill(tmp_path / "absent.json", tmp_path, t0, ended)
    assert none["cases"] == 0 and none["crash"] is True


def test_time_to_kill_of_a_mutant_is_its_slowest_expected_contract():
    from contracts.zoo.runner import time_to_kill, ttk_summary

    rows = [{"contract": "a", "target": "gfx942", "status": "fail", "first_violation": {"cases": 9, "seconds": 4.0}},
            {"contract": "a", "target": "gfx950", "status": "fail", "first_violation": {"cases": 2, "seconds": 1.0}},
            {"contract": "b", "target": "gfx950", "status": "fail", "first_violation": {"cases": 3, "seconds": 2.5}},
            {"contract": "b", "target": "gfx942", "status": "pass", "first_violation": None}]
    assert time_to_kill(rows, ["a"]) == {"cases": 2, "seconds": 1.0, "contract": "a", "target": "gfx950"}
    assert time_to_kill(rows, ["a", "b"]) == {"cases": 3, "seconds": 2.5, "contract": "b", "target": "gfx950"}
    assert time_to_kill(rows, ["a", "c"]) is None
    res = [{"id": i, "status": "killed", "time_to_kill": {"cases": n, "seconds": s}}
           for i, n, s in (("x", 1, 1.0), ("y", 5, 9.0), ("z", 2, 3.0))] + [{"id": "w", "status": "survived",
                                                                                "time_to_kill": None}]
    assert ttk_summary(res) == {"killed": 3, "median_seconds": 3.0, "worst_seconds": 9.0, "worst": "y",
                                "median_cases": 2, "worst_cases": 5}


@pytest.mark.slow
@pytest.mark.parametrize("at,cases", [(3, 4), (6, 7)], ids=["first-pass", "second-pass"])
def test_crash_at_a_known_case_of_a_zoo_run(at, cases):
    """A planted crash at a known generated case of ue8m0-codec-exact (min_cases 5: case 7 is in the audit's second
    pass) is reported at that case, through the subprocess, the case trace and the saved first pass."""
    res = run_mutant(_m(file="contracts/engine/runner.py", expect=["ue8m0-codec-exact"], find='''    os.replace(tmp, path)


def case_to_json(case):''', replace=f'''    os.replace(tmp, path)
    if contract_id == "ue8m0-codec-exact" and skip + state["generated"] == {at}:
        os.kill(os.getpid(), 11)


def case_to_json(case):'''), cap=CAP)
    assert res.status == "killed" and "SIGSEGV" in res.detail, res.detail
    ttk = res.as_json()["time_to_kill"]
    assert ttk["crash"] is True and ttk["cases"] == cases
    assert (ttk["contract"], ttk["target"]) == ("ue8m0-codec-exact", "gfx950")
    assert 0 < ttk["seconds"] < res.seconds


# --- upstream entries newer than the subject ------------------------------------------------------------------------

def test_an_entry_the_subject_predates_is_skipped_naming_both_releases(tmp_path):
    import types

    from contracts.zoo.runner import is_release_skip, release_skip, run_zoo

    ops = tmp_path / "vllm" / "ops.py"
    ops.parent.mkdir()
    ops.write_text("def old():\n    return 1\n")

    def subject(version):
        return types.SimpleNamespace(name="vllm", version=version, label=f"vllm=={version}", source=str(tmp_path),
                                     tree=types.SimpleNamespace(root=str(tmp_path)))

    new = _m(id="new-route", file="vllm/ops.py", find="def new_route(", replace="def new_route_(", since="0.34.0")
    res = run_mutant(new, subject=subject("0.33.0"))
    assert res.status == "stale" and res.detail.startswith("skipped: vllm==0.33.0 predates")
    assert "0.34.0" in res.detail and is_release_skip(res.as_json())
    assert set(res.as_json()) == {"id", "status", "expect", "fired", "seconds", "detail", "time_to_kill",
                                  "cap_seconds"} and res.as_json()["cap_seconds"] is None  # not run: no cap
    # a subject as new as the entry (or a branch of no release) that lacks the text: the catalog needs a look
    for version in ("0.34.0", "0.35.0.dev1+gabc", "unknown"):
        assert release_skip(new, subject(version)) == ""
        res = run_mutant(new, subject=subject(version))
        assert res.status == "stale" and not is_release_skip(res.as_json()) and "occurs 0 times" in res.detail
    # an entry with no `since`, or on ours, is never skipped
    assert release_skip(_m(file="vllm/ops.py", find="nowhere", replace="x"), subject("0.33.0")) == ""
    # a zoo of skipped entries: no baseline audit, nothing judged, nothing failed
    doc = run_zoo([new], subject=subject("0.33.0"))
    assert [r["status"] for r in doc["results"]] == ["stale"] and doc["kill_rate"] == 1.0


def test_catalog_since_is_a_release(tmp_path):
    entry = ('[[mutant]]\nid="a"\ntitle="t"\nprovenance="p"\nfile="f"\nfind="x"\nreplace="y"\nexpect=["c"]\n'
             'targets=["gfx942"]\n')
    cat = tmp_path / "c.toml"
    cat.write_text(entry + 'since = "0.34.0"\n')
    assert load_catalog(cat)[0].since == "0.34.0"
    cat.write_text(entry + 'since = "next"\n')
    with pytest.raises(ValueError, match="since must be a release"):
        load_catalog(cat)
    cat.write_text(entry + 'sinse = "0.34.0"\n')
    with pytest.raises(ValueError, match=r"unknown keys \['sinse'\]"):
        load_catalog(cat)
    # the upstream catalog's gfx942 AITER entries say when their code came
    from contracts.zoo.runner import UPSTREAM_CATALOG_DIR

    pa = [m for m in load_catalog(UPSTREAM_CATALOG_DIR / "prefill.toml") if m.id.startswith("vllm-aiter-pa-")]
    assert len(pa) >= 2 and all(m.since == "0.34.0" for m in pa)
