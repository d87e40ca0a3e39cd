"""The ``smv`` command line: list/show/zoo --list/--version, one-line usage errors (exit 2), repro's exit codes."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from contracts.cli import smv as cli
from contracts.core import Violation
from contracts.registry import get_contract, load_all
from contracts.zoo.runner import load_catalogs

ROOT = Path(__file__).resolve().parent.parent


def smv(argv, capsys):
    """Run ``smv argv`` in this process: (exit code, stdout, stderr lines)."""
    try:
        code = cli.main(argv)
    except SystemExit as exc:  # argparse's own exits (usage errors, --version)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err.splitlines()


def assert_usage_error(code, err, prog, *needles):
    assert code == 2
    assert len(err) == 1, err
    assert err[0].startswith(f"{prog}: "), err[0]
    for n in needles:
        assert n in err[0], (n, err[0])


# --- docstrings as users read them ------------------------------------------------------------------------------

def test_first_sentence_spans_lines_and_stops_at_the_sentence_end():
    doc = """Every split count lies in [1, cap] (16 on gfx942, 32 on gfx950) and
    equals the formula, e.g. for 1.5 rows; the selector sees sizes. On gfx950 more.

    Second paragraph."""
    assert cli.first_sentence(doc) == ("Every split count lies in [1, cap] (16 on gfx942, 32 on gfx950) and equals "
                                       "the formula, e.g. for 1.5 rows; the selector sees sizes.")


def test_first_sentence_without_an_end_is_the_first_paragraph():
    assert cli.first_sentence("Agrees with the oracle\n    on every target\n\n    More.") == \
        "Agrees with the oracle on every target"


def test_markup_is_stripped():
    doc = """Packs through ``stride(0)`` as :func:`~impl.formats.pack` and :class:`impl.targets.Target` say, see
    `SPEC`_ and the ``a`` example::

        code
    """
    text = cli.plain_doc(doc)
    assert "`" not in text and ":func:" not in text and ":class:" not in text
    assert " ".join(text.split()).startswith(
        "Packs through stride(0) as pack and impl.targets.Target say, see SPEC and the a example: code")
    assert cli.first_sentence(doc).endswith("the a example:")


# --- smv list -----------------------------------------------------------------------------------------------------

def test_list_json_shape_full_sentences_no_markup_and_zoo_ids(capsys):
    code, out, _ = smv(["list", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert set(doc) == {"schema_version", "contracts"} and doc["schema_version"] == cli.LIST_SCHEMA_VERSION
    contracts = load_all()
    assert [c["id"] for c in doc["contracts"]] == sorted(contracts)
    from contracts.zoo.runner import UPSTREAM_CATALOG_DIR, load_catalog

    # ours' planted bugs, then the ones planted into upstream's source
    mutants = {m.id: m for m in load_catalogs()}
    mutants.update({m.id: m for p in sorted(UPSTREAM_CATALOG_DIR.glob("*.toml")) for m in load_catalog(p)})
    for c in doc["contracts"]:
        assert set(c) == {"id", "targets", "summary", "doc", "zoo"}
        assert c["targets"] == list(contracts[c["id"]].targets)
        for text in (c["summary"], c["doc"]):
            assert "``" not in text and not re.search(r":[a-z]+:`", text), (c["id"], text)
        # a whole sentence: the doc's first paragraph starts with it and it ends where a sentence ends
        flat = " ".join(c["doc"].split())
        assert flat.startswith(c["summary"]) and c["summary"][-1] in ".!?:", (c["id"], c["summary"])
        assert "\n" not in c["summary"]
        assert c["zoo"] == [m for m in mutants if c["id"] in mutants[m].expect]
    by_id = {c["id"]: c for c in doc["contracts"]}
    # cut at the first line break before: "... the partition equals a fresh"
    assert by_id["cache-key-staleness"]["summary"].endswith("within a derived fp32/bf16 bound).")
    assert "through stride(0), and nowhere else." in by_id["cache-layout-roundtrip"]["summary"]
    assert any(c["zoo"] for c in doc["contracts"])


def test_list_prints_every_full_summary(capsys):
    code, out, _ = smv(["list"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    for cid, c in load_all().items():
        assert f"{cid} [{', '.join(c.targets)}] {cli.first_sentence(c.doc)}" in flat
    assert "``" not in out
    assert max(len(line) for line in out.splitlines()) <= 110


# --- smv show -----------------------------------------------------------------------------------------------------

def test_show_prints_the_whole_promise_and_its_facts(capsys):
    c = get_contract("split-bounds")
    code, out, _ = smv(["show", "split-bounds"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    assert " ".join(cli.plain_doc(c.doc).split()) in flat  # the whole docstring, not only its first line
    assert "targets: gfx942, gfx950" in flat
    assert f"skipped on: generic: {c.skip_reason}" in flat
    assert f"module: {c.module} (" in flat and ".py:" in flat
    assert "case type: " + (f"{c.case_type.__module__}.{c.case_type.__qualname__}" if c.case_type else "untyped") \
        in flat
    assert ("check: numeric" if c.numeric else "check: exact") in flat
    assert f"at least {c.min_cases} generated" in flat
    for m in load_catalogs():
        if "split-bounds" in m.expect:
            assert f"{m.id}: {m.title}" in out


def test_show_json_and_an_untyped_contract(capsys, monkeypatch):
    from contracts import core

    base = get_contract("split-bounds")
    untyped = core.Contract(id="zz-untyped", doc="Says ``x``.\n\n    More.", targets=("gfx950",), cases=base.cases,
                            check=base.check, module="tests.fake", case_type=None, numeric=True, max_cases=3)
    monkeypatch.setitem(core.CONTRACTS, "zz-untyped", untyped)
    code, out, _ = smv(["show", "zz-untyped", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["case_type"] is None and doc["numeric"] is True and doc["max_cases"] == 3
    assert doc["doc"] == "Says x.\n\nMore." and doc["summary"] == "Says x."
    assert doc["skipped"] == {"gfx942": untyped.skip_reason, "generic": untyped.skip_reason}
    assert doc["zoo"] == []
    code, out, _ = smv(["show", "zz-untyped"], capsys)
    assert code == 0 and "case type:  untyped" in out and "at most 3 a row" in out


def test_show_unknown_id_names_close_matches(capsys):
    code, _, err = smv(["show", "split-bound"], capsys)
    assert_usage_error(code, err, "smv show", "unknown contract 'split-bound'", "split-bounds")
    code, _, err = smv(["show", "decode"], capsys)
    assert_usage_error(code, err, "smv show", "decode-oracle-agreement")
    code, _, err = smv(["show", "qqqqqq"], capsys)
    assert_usage_error(code, err, "smv show", "smv list")


# --- smv zoo --list -----------------------------------------------------------------------------------------------

def test_zoo_list_runs_nothing_and_lists_every_mutant(capsys, monkeypatch):
    import contracts.zoo.runner as zr

    monkeypatch.setattr(zr, "run_mutant", lambda *a, **k: pytest.fail("--list must not run a mutant"))
    mutants = load_catalogs()
    code, out, _ = smv(["zoo", "--list"], capsys)
    assert code == 0
    flat = " ".join(out.split())
    for m in mutants:
        assert f"{m.id} -> {', '.join(m.expect)} {' '.join(m.title.split())}" in flat
    code, out, _ = smv(["zoo", "--list", "--json", "--mutant", mutants[0].id], capsys)
    doc = json.loads(out)
    assert code == 0 and doc["schema_version"] == cli.ZOO_LIST_SCHEMA_VERSION
    assert [(m["id"], m["expect"], m["title"]) for m in doc["mutants"]] == \
        [(mutants[0].id, mutants[0].expect, mutants[0].title)]


def test_zoo_unknown_mutant_is_one_line_with_close_matches(capsys):
    known = load_catalogs()[0].id
    code, _, err = smv(["zoo", "--mutant", known[:-2], "--list"], capsys)
    assert_usage_error(code, err, "smv zoo", f"unknown mutant {known[:-2]!r}", known)
    code, _, err = smv(["zoo", "--mutant", "no-such-mutant-at-all"], capsys)
    assert_usage_error(code, err, "smv zoo", "smv zoo --list")


# --- smv --version ------------------------------------------------------------------------------------------------

def _pyproject_version():
    try:
        import tomllib
    except ModuleNotFoundError:
        import tomli as tomllib
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.mark.parametrize("flag", ["--version", "-V"])
def test_version(flag, capsys):
    code, out, _ = smv([flag], capsys)
    assert code == 0 and out.strip() == f"smv {_pyproject_version()}"


# --- bad option values: one line on stderr, exit 2 ------------------------------------------------------------

def _no_runs(monkeypatch):
    """A usage error must stop the command before it runs anything (and a regression must not run an audit,
    a campaign or the zoo for real)."""
    import contracts.engine.audit
    import contracts.engine.campaign
    import contracts.engine.runner
    import contracts.zoo.runner

    for mod, name in ((contracts.engine.audit, "run_audit"), (contracts.engine.campaign, "run_campaign"),
                      (contracts.zoo.runner, "run_zoo"), (contracts.engine.runner, "replay")):
        monkeypatch.setattr(mod, name, lambda *a, _n=name, **k: pytest.fail(f"{_n} ran despite a usage error"))


BAD = [
    (["audit", "--budget", "-5"], "smv audit", "--budget"),
    (["audit", "--budget", "0"], "smv audit", "--budget"),
    (["audit", "--budget", "nan"], "smv audit", "--budget"),
    (["zoo", "--budget", "-5"], "smv zoo", "--budget"),
    (["zoo", "--budget", "0"], "smv zoo", "--budget"),
    (["fuzz", "--budget", "-5"], "smv fuzz", "--budget"),
    (["fuzz", "--budget", "0"], "smv fuzz", "--budget"),
    (["fuzz", "--round", "3x"], "smv fuzz", "--round"),
    (["audit", "--max-cases", "-1"], "smv audit", "--max-cases"),
    (["zoo", "--cap", "0"], "smv zoo", "--cap"),
    (["zoo", "--jobs", "0"], "smv zoo", "--jobs"),
    (["audit", "--profile", "fast"], "smv audit", "'fast'"),
    (["fuzz", "--profile", "fast"], "smv fuzz", "'fast'"),
    (["audit", "--target", "gfx999"], "smv audit", "'gfx999'"),
    (["fuzz", "--target", "gfx999"], "smv fuzz", "'gfx999'"),
    (["audit", "--contract", "split-bound"], "smv audit", "split-bounds"),
    (["fuzz", "--contract", "split-bound"], "smv fuzz", "split-bounds"),
    (["audit", "--seed", "x"], "smv audit", "--seed"),
    (["zoo", "--json"], "smv zoo", "--list"),
    (["audit", "--bogus"], "smv", "--bogus"),
    ([], "smv", "required"),
]


@pytest.mark.parametrize("argv,prog,needle", BAD, ids=[" ".join(a) or "(none)" for a, _, _ in BAD])
def test_bad_option_value_is_one_line_and_exit_2(argv, prog, needle, capsys, monkeypatch):
    _no_runs(monkeypatch)
    code, out, err = smv(argv, capsys)
    assert_usage_error(code, err, prog, needle)
    assert "usage:" not in " ".join(err) and out == ""


@pytest.mark.parametrize("cmd", ["audit", "zoo", "fuzz"])
def test_report_folder_that_cannot_be_created_is_rejected_before_the_run(cmd, tmp_path, capsys, monkeypatch):
    _no_runs(monkeypatch)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, _, err = smv([cmd, "--report", str(blocker / "rep")], capsys)
    assert_usage_error(code, err, f"smv {cmd}", f"{blocker} is a file, not a folder")
    code, _, err = smv([cmd, "--report", str(blocker)], capsys)
    assert_usage_error(code, err, f"smv {cmd}", "is not a folder")
    if cmd == "audit":
        code, _, err = smv([cmd, "--junit", str(tmp_path)], capsys)
        assert_usage_error(code, err, "smv audit", "is a folder, expected a file")


def test_report_folder_may_be_created_with_its_parents(tmp_path, capsys, monkeypatch):
    import contracts.engine.audit

    calls = []
    monkeypatch.setattr(contracts.engine.audit, "run_audit", lambda *a, **k: calls.append(k) or ({"results": []}, 0))
    monkeypatch.setattr(contracts.engine.audit, "format_table", lambda doc: "table")
    rep = tmp_path / "new" / "deeper"
    code, out, _ = smv(["audit", "--report", str(rep), "--junit", str(rep / "junit.xml")], capsys)
    assert code == 0 and calls and calls[0]["report_dir"] == str(rep)


SMV_TARGET_COMMANDS = [["targets"], ["targets", "--json"], ["list"], ["show", "split-bounds"], ["audit"],
                       ["zoo", "--list"], ["fuzz"], ["repro", "x.json"]]


@pytest.mark.parametrize("argv", SMV_TARGET_COMMANDS, ids=[" ".join(a) for a in SMV_TARGET_COMMANDS])
def test_bad_smv_target_is_one_line_and_exit_2_for_every_command(argv, capsys, monkeypatch):
    _no_runs(monkeypatch)
    monkeypatch.setenv("SMV_TARGET", "gfx999")
    code, out, err = smv(argv, capsys)
    assert_usage_error(code, err, f"smv {argv[0]}", "SMV_TARGET='gfx999'", "gfx942, gfx950, generic")
    assert out == ""


def test_bad_smv_target_in_a_fresh_process():
    env = dict(os.environ, SMV_TARGET="gfx999")
    r = subprocess.run([sys.executable, "-m", "contracts.cli", "targets"], capture_output=True, text=True, env=env,
                       cwd=ROOT, timeout=300)
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.strip().splitlines() == [
        "smv targets: error: SMV_TARGET='gfx999' is not a known target; expected one of gfx942, gfx950, generic "
        "(or unset it to use the detected device)"]


def test_usage_error_in_a_fresh_process_has_no_usage_block():
    r = subprocess.run([sys.executable, "-m", "contracts.cli", "audit", "--budget", "-5"], capture_output=True,
                       text=True, cwd=ROOT, timeout=300)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "smv audit: error: argument --budget: expected a positive number of seconds, got '-5'"]


# --- smv audit --allow-empty --------------------------------------------------------------------------------------

def test_audit_with_nothing_run_fails_unless_allowed(capsys):
    # split-bounds does not apply to generic: every row is skipped
    code, _, _ = smv(["audit", "--contract", "split-bounds", "--target", "generic", "--no-progress"], capsys)
    assert code == 1
    code, _, _ = smv(["audit", "--contract", "split-bounds", "--target", "generic", "--no-progress",
                      "--allow-empty"], capsys)
    assert code == 0


# --- smv repro ----------------------------------------------------------------------------------------------------

def _valid_repro(tmp_path):
    from hypothesis import find

    from contracts.engine.runner import write_repro
    from impl.targets import get_target

    c, t = get_contract("split-bounds"), get_target("gfx942")
    case = find(c.cases(t), lambda _: True)
    path = write_repro(str(tmp_path / "repro.json"), c, t, case, [])
    return path, json.loads(Path(path).read_text())


def _repro_error(capsys, path):
    code, out, err = smv(["repro", str(path)], capsys)
    assert_usage_error(code, err, "smv repro", str(path))
    assert "VIOLATION" not in out
    return err[0]


def test_repro_missing_file(tmp_path, capsys):
    line = _repro_error(capsys, tmp_path / "nope.json")
    assert "No such file" in line


def test_repro_json_syntax_error_names_the_file(tmp_path, capsys):
    p = tmp_path / "broken.json"
    p.write_text('{"contract": "split-bounds",')
    assert "JSON" in _repro_error(capsys, p)


def test_repro_without_target(tmp_path, capsys):
    path, doc = _valid_repro(tmp_path)
    del doc["target"]
    Path(path).write_text(json.dumps(doc))
    assert "'target'" in _repro_error(capsys, path)


def test_repro_unknown_contract(tmp_path, capsys):
    path, doc = _valid_repro(tmp_path)
    doc["contract"] = "no-such-contract"
    Path(path).write_text(json.dumps(doc))
    assert "no-such-contract" in _repro_error(capsys, path)


def test_repro_case_missing_a_key(tmp_path, capsys):
    path, doc = _valid_repro(tmp_path)
    key = next(k for k in doc["case"] if k not in ("kind", "schema_version"))
    del doc["case"][key]
    Path(path).write_text(json.dumps(doc))
    assert key in _repro_error(capsys, path)


def test_repro_exit_codes_follow_the_case(tmp_path, capsys, monkeypatch):
    path, _ = _valid_repro(tmp_path)
    code, out, _ = smv(["repro", path], capsys)
    assert code == 0 and "passes now" in out
    c = get_contract("split-bounds")
    monkeypatch.setattr(c, "check", lambda case, target: [Violation("planted", "x", "1", "2")])
    code, out, _ = smv(["repro", path], capsys)
    assert code == 1 and "VIOLATION planted" in out


def test_bench_is_a_subcommand_of_smv(capsys):
    """``smv bench`` reaches contracts.cli.bench: its own usage check answers (nothing is run for --out alone)."""
    from contracts.cli.smv import main

    assert main(["bench", "--out", "x.png"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--out" in err[0] and "--plot" in err[0]


def test_reports_record_the_version_smv_prints(capsys):
    """audit.json's versions.smv is what ``smv --version`` says (an editable install's metadata may lag)."""
    from contracts.cli.smv import main
    from contracts.engine.reports import versions

    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"smv {versions()['smv']}"
