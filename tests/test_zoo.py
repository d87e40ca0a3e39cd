"""The zoo: every catalogued planted bug is killed; stale, survived, error and crash verdicts behave as promised."""
import json
import textwrap

import pytest

from contracts.cli import main as smv
from contracts.zoo.runner import Mutant, load_catalog, load_catalogs, run_mutant

MUTANTS = load_catalogs()
CAP = 150.0
#: plain pytest runs, for every contract, the first PER_CONTRACT mutants (in catalog order) that expect it; the rest
#: are `slow` (`--run-slow`, the nightly pipeline). `smv zoo` (the pull-request and nightly pipelines) runs them all.
PER_CONTRACT = 3


def _core_ids(mutants) -> set:
    seen: dict = {}
    core = set()
    for m in mutants:
        if any(seen.get(c, 0) < PER_CONTRACT for c in m.expect):
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
    assert doc["schema_version"] == 2 and doc["kill_rate"] == 0.0
    (r,) = doc["results"]
    assert r["status"] == "survived" and r["fired"] == [] and r["expect"] == ["ue8m0-codec-exact"]
    assert set(r) == {"id", "status", "expect", "fired", "seconds", "detail"}


def test_unimportable_patch_is_error_not_kill():
    res = run_mutant(_m(find="UE8M0_NAN_CODE = 255", replace="UE8M0_NAN_CODE = = 255"))
    assert res.status == "error" and "import" in res.detail


def test_crash_counts_as_killed():
    res = run_mutant(_m(find="UE8M0_NAN_CODE = 255",
                        replace="UE8M0_NAN_CODE = 255\nimport os, signal\nos.kill(os.getpid(), signal.SIGSEGV)"))
    assert res.status == "killed" and "SIGSEGV" in res.detail


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

    covered = {c for m in MUTANTS if m.id in CORE for c in m.expect}
    ours = {c for c in load_all() if c != "subject-agreement"}  # its planted bugs live in upstream's catalogs
    assert ours <= covered, sorted(ours - covered)
