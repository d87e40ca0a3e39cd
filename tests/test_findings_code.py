"""Findings keyed by code: function source hashes, schema 1 and 2 files, applicability by hash on any version, the
"code changed" failure, and ``smv findings check`` on upstream's real tree, a fixed one and one without the function."""
import hashlib
import json
import os
import re
import shutil
from pathlib import Path

import pytest

from contracts.engine import findings as kf
from contracts.engine.findings_check import check
from contracts.cli.smv import main as smv
from contracts.core import Violation
from contracts.registry import get_contract
from contracts.engine.runner import run_contract

ROOT = Path(__file__).resolve().parent.parent
OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: U2: gfx942's selector skips its snap-down when both average lengths are 0; the fix snaps regardless
SNAP_GUARD = "    if best_splits > 1 and (avg_main_len > 0 or avg_extra_len > 0):"
SNAP_FIXED = "    if best_splits > 1:"
DEV_VERSION = "0.35.1.dev7+gdeadbee"


@pytest.fixture(scope="module")
def tree033():
    """The root of upstream vLLM 0.33.0's audited modules: the extracted tree in the checkout, else the user
    cache's (downloaded once)."""
    local = ROOT / ".smv-subject" / "vllm-0.33.0"
    if (local / OPS).exists():
        return str(local)
    from contracts.subjects import SubjectSpecError, parse_subject

    try:
        return parse_subject("vllm==0.33.0").tree.root
    except SubjectSpecError as exc:
        pytest.skip(f"the vllm==0.33.0 subject is unavailable here: {exc}")


@pytest.fixture(scope="module")
def dev_trees(tree033, tmp_path_factory):
    """Two dev-build copies of 0.33.0: ``same`` (the code as confirmed) and ``moved`` (U2's function with a comment
    appended to its first line: new source, same behaviour)."""
    base = tmp_path_factory.mktemp("dev")
    line = _def_line(tree033, "_decode_num_splits")
    return {"same": _dev_copy(tree033, str(base / "same")),
            "moved": _dev_copy(tree033, str(base / "moved"), line, line + "  # reviewed")}


@pytest.fixture(scope="module")
def dev_subjects(dev_trees):
    """The dev trees as subjects, bound once for the module's tests."""
    from contracts.subjects import parse_subject

    return {k: parse_subject(f"vllm@{v}") for k, v in dev_trees.items()}


def _repo_finding(fid):
    return next(f for f in kf.load() if f.id == fid)


def _dev_copy(src, dest, find=None, replace=None):
    """A copy of the tree at ``src`` that reads as a dev build (no release record, a ``vllm/_version.py``),
    with ``find`` replaced once in the decode ops module when given."""
    from contracts.subjects.vllm import loader

    if find is None:
        shutil.copytree(src, dest)
    else:
        loader.planted_copy(src, dest, OPS, find, replace)
    os.remove(os.path.join(dest, "smv-subject.json"))
    Path(dest, "vllm", "_version.py").write_text(f'__version__ = "{DEV_VERSION}"\n')
    return dest


def _def_line(root, name):
    """The first line of ``def name(`` in the decode ops module (a comment appended to it changes the function's
    source, not its behaviour)."""
    src = Path(root, OPS).read_text()
    (line,) = [ln for ln in src.splitlines() if ln.startswith(f"def {name}(")]
    return line


def _findings_file(tmp_path, *fids, confirmed_in=("0.33.0",)):
    """A schema-2 findings file holding the repository's findings ``fids`` (their hashes, signatures and stored
    reproducers), each confirmed in ``confirmed_in``."""
    out = ["schema_version = 2"]
    (tmp_path / "findings").mkdir(exist_ok=True)
    for fid in fids:
        f = _repo_finding(fid)
        fns = ", ".join("{module = %s, qualname = %s, sha256 = %s}" % (json.dumps(r.module), json.dumps(r.qualname),
                                                                       json.dumps(list(r.sha256)))
                        for r in f.functions)
        out += ["[[finding]]", f"id = {json.dumps(f.id)}", f"title = {json.dumps(f.title)}",
                f"kind = {json.dumps(f.kind)}", f"contract = {json.dumps(f.contract)}",
                f"subjects = {json.dumps(list(f.subjects))}", f"confirmed_in = {json.dumps(list(confirmed_in))}",
                f"targets = {json.dumps(list(f.targets))}", f"function = {json.dumps(f.function)}",
                f"functions = [{fns}]", f"signature = {json.dumps([p.pattern for p in f.signature])}"]
        shutil.copyfile(f.reproducer, tmp_path / "findings" / f"{fid}.json")
    path = tmp_path / "findings.toml"
    path.write_text("\n".join(out) + "\n")
    return str(path)


def _check(capsys, spec, findings_file):
    assert smv(["findings", "check", "--subject", spec, "--json", "--findings", findings_file]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema_version"] == kf.CHECK_SCHEMA_VERSION
    return {r["id"]: (r["status"], r["code_changed"]) for r in doc["findings"]}


# --- the hash of a function's source -----------------------------------------------------------------------------

def test_function_sha256_is_the_exact_def_with_its_decorators(tmp_path):
    decorated = "@decorator(1)\n@other\ndef kernel(x):\n    # why\n    return x + 1"
    method = "def build(self):\n        return 2"
    other = method.replace("def build(self)", "def other()")
    cls = f"class Builder:\n    x = 1\n\n    @staticmethod\n    {other}\n\n    {method}"
    late = "if os:\n    def late():\n        pass\n"
    (tmp_path / "m.py").write_text(f"import os\n\n\n{decorated}\n\n\n{cls}\n\n\n{late}")
    sha = lambda s: hashlib.sha256(s.encode()).hexdigest()  # noqa: E731
    assert kf.function_sha256(str(tmp_path), "m.py", "kernel") == sha(decorated)
    assert kf.function_sha256(str(tmp_path), "m.py", "Builder.build") == sha(method)
    assert kf.function_sha256(str(tmp_path), "m.py", "Builder") == sha(cls)
    assert kf.function_sha256(str(tmp_path), "m.py", "late") == sha("def late():\n        pass")
    assert kf.function_sha256(str(tmp_path), "m.py", "Builder.other") == sha("@staticmethod\n    " + other)
    assert kf.function_sha256(str(tmp_path), "m.py", "absent") is None
    assert kf.function_sha256(str(tmp_path), "other.py", "kernel") is None
    # a change inside the body changes it; one outside does not
    (tmp_path / "m.py").write_text(f"import sys\n\n\n{decorated.replace('+ 1', '+ 2')}\n\n\n{cls}\n")
    assert kf.function_sha256(str(tmp_path), "m.py", "kernel") == sha(decorated.replace("+ 1", "+ 2"))
    assert kf.function_sha256(str(tmp_path), "m.py", "Builder.build") == sha(method)


def test_the_repository_findings_are_keyed_by_the_033_code(tree033):
    # vLLM's findings are keyed by its Python source; FlashMLA ships compiled CUDA, so its findings are keyed by the
    # release they were seen in (and name the kernel in ``function``)
    every = kf.load()
    fs = [f for f in every if f.subjects == ("vllm",)]
    assert all(f.subjects == ("flashmla",) and not f.functions and f.confirmed("1.0.0") for f in every if f not in fs)
    assert len(fs) >= 50 and all(f.functions for f in fs)
    old = [f for f in fs if f.confirmed("0.33.0")]
    assert len(old) >= 50
    for f in old:  # the findings of 0.33.0 are keyed by its code; the ones 0.34.0 brought, by 0.34.0's
        assert f.code_matches(tree033), f.id
    for f in fs:
        if f not in old:
            assert f.confirmed("0.34.0") and not f.code_matches(tree033), f.id
    u2 = _repo_finding("U2")
    assert [(r.module, r.qualname) for r in u2.functions] == [(OPS, "_decode_num_splits")]


def test_each_stored_reproducer_replays_its_finding_contract_on_one_of_its_targets():
    from contracts.engine.runner import _load_repro

    stored = [f for f in kf.load() if os.path.exists(f.reproducer)]
    assert len(stored) >= 48
    for f in stored:
        c, t, _, spec = _load_repro(f.reproducer)
        doc = json.loads(Path(f.reproducer).read_text())
        assert c.id == f.contract and t.name in f.targets, f.id
        assert spec.startswith("vllm==") and f.confirmed(spec[len("vllm=="):]), f.id  # a release it was seen in
        assert any(f.explains(v["message"]) for v in doc["violations"]), f.id


# --- schema 1 and 2 ----------------------------------------------------------------------------------------------

V1 = ('schema_version = 1\n[[finding]]\nid = "K1"\ntitle = "t"\nkind = "upstream-bug"\ncontract = "split-bounds"\n'
      'subjects = ["vllm"]\nversions = ["0.33.*"]\ntargets = ["gfx942"]\nfunction = "m.py::f"\n'
      'signature = ["^known$"]\n')


def test_a_schema_1_file_still_loads(tmp_path):
    p = tmp_path / "old.toml"
    p.write_text(V1)
    (f,) = kf.load(str(p))
    assert f.confirmed_in == ("0.33.*",) and f.versions == ("0.33.*",) and f.functions == ()
    assert f.applies("split-bounds", "vllm", "0.33.2", "gfx942") and not f.applies("split-bounds", "vllm", "0.34.0",
                                                                                   "gfx942")
    assert kf.classify([Violation("known")], [f], "split-bounds", "vllm", "0.33.2", "gfx942") == ["K1"]
    assert f.reproducer == str(tmp_path / "findings" / "K1.json")


@pytest.mark.parametrize("text,what", [
    (V1.replace("schema_version = 1", "schema_version = 2"),
     "finding #1 (K1): unknown field 'versions' (schema_version 2 calls it 'confirmed_in')"),
    (V1 + 'functions = [{module = "m.py", qualname = "f", sha256 = ["' + "0" * 64 + '"]}]\n',
     "finding #1 (K1): unknown field 'functions'"),
    (V1.replace("schema_version = 1", "schema_version = 4"), "schema_version 4 is not supported"),
    (V1.replace("schema_version = 1", "schema_version = 2").replace("versions", "confirmed_in")
     + 'functions = [{module = "m.py", qualname = "f", sha256 = ["abc"]}]\n',
     "finding #1 (K1): field 'functions' entry #1: 'sha256' must hold 64 lowercase hex digits, got 'abc'"),
    (V1.replace("schema_version = 1", "schema_version = 2").replace("versions", "confirmed_in")
     + 'functions = [{module = "m.py", qualname = "f(x)", sha256 = ["' + "0" * 64 + '"]}]\n',
     "finding #1 (K1): field 'functions' entry #1: 'qualname' must be a dotted name"),
    (V1.replace("schema_version = 1", "schema_version = 2").replace("versions", "confirmed_in")
     + 'functions = [{module = "../m.py", qualname = "f", sha256 = ["' + "0" * 64 + '"]}]\n',
     "finding #1 (K1): field 'functions' entry #1: 'module' must be a .py path relative"),
    (V1.replace("schema_version = 1", "schema_version = 2").replace("versions", "confirmed_in")
     + 'functions = [{module = "m.py", sha256 = ["' + "0" * 64 + '"]}]\n',
     "finding #1 (K1): field 'functions' entry #1: missing 'qualname'"),
    (V1.replace("schema_version = 1", "schema_version = 2").replace("versions", "confirmed_in")
     + "functions = []\n", "finding #1 (K1): field 'functions' must be a non-empty array"),
])
def test_schema_errors_are_one_line_naming_file_finding_and_field(tmp_path, text, what):
    p = tmp_path / "findings.toml"
    p.write_text(text)
    with pytest.raises(kf.FindingsError) as info:
        kf.load(str(p))
    msg = str(info.value)
    assert msg.startswith(f"{p}: ") and what in msg and "\n" not in msg, msg


# --- applicability by code ---------------------------------------------------------------------------------------

def test_a_finding_applies_by_hash_to_a_dev_build_and_fails_as_code_changed_when_its_code_moves(dev_trees):
    from contracts.subjects.vllm import loader

    u2 = _repo_finding("U2")
    same, moved = dev_trees["same"], dev_trees["moved"]
    assert loader.tree_at(same).version == DEV_VERSION and not u2.confirmed(DEV_VERSION)
    known = Violation("split count differs from the re-derived formula: both segments empty")
    row = ("split-bounds", "vllm", DEV_VERSION, "gfx942")
    assert u2.applies(*row, root=same)
    assert kf.classify([known], [u2], *row, root=same) == ["U2"]
    assert kf.classify([known], [u2], *row) is None  # no tree, an unconfirmed version: nothing applies
    assert kf.code_changed([known], [u2], *row, root=same) is None

    assert kf.function_sha256(moved, OPS, "_decode_num_splits") not in u2.functions[0].sha256
    assert not u2.applies(*row, root=moved) and kf.classify([known], [u2], *row, root=moved) is None
    assert kf.code_changed([known], [u2], *row, root=moved) == (
        "the code of _decode_num_splits changed since finding U2 was confirmed")
    assert kf.code_changed([Violation("another defect")], [u2], *row, root=moved) is None
    # a confirmed version still applies whatever the code (a release the finding was confirmed in)
    assert u2.applies("split-bounds", "vllm", "0.33.0", "gfx942", root=moved)


def test_the_runner_fails_a_changed_function_saying_so_and_knows_the_unchanged_one(dev_subjects):
    fs = [_repo_finding("U1"), _repo_finding("U2")]
    same, moved = dev_subjects["same"], dev_subjects["moved"]
    assert moved.version == same.version == DEV_VERSION
    c = get_contract("split-bounds")
    row = run_contract(c, "gfx942", profile="dev", budget=60, max_examples=0, seed=1, subject=same, findings=fs)
    assert row.status == "known" and "U2" in row.findings, (row.status, row.reason)
    row = run_contract(c, "gfx942", profile="dev", budget=60, max_examples=0, seed=1, subject=moved, findings=fs)
    assert row.status == "fail", (row.status, row.reason)
    assert re.match(r"the code of _decode_num_splits changed since finding U[12] was confirmed: split count "
                    r"differs from the re-derived formula", row.reason), row.reason


# --- smv findings check ------------------------------------------------------------------------------------------

def test_findings_check_present_fixed_and_not_applicable(tree033, tmp_path, capsys):
    from contracts.subjects.vllm import loader

    ff = _findings_file(tmp_path, "U2")
    assert _check(capsys, f"vllm@{tree033}", ff) == {"U2": ("present", False)}
    fixed = loader.planted_copy(tree033, str(tmp_path / "fixed"), OPS, SNAP_GUARD, SNAP_FIXED)
    assert _check(capsys, f"vllm@{fixed}", ff) == {"U2": ("fixed", True)}
    line = _def_line(tree033, "_decode_num_splits")
    gone = loader.planted_copy(tree033, str(tmp_path / "gone"), OPS, line,
                               line.replace("_decode_num_splits", "_decode_split_count"))
    assert _check(capsys, f"vllm@{gone}", ff) == {"U2": ("not_applicable", True)}
    # plain output: one line per finding, then the counts
    assert smv(["findings", "check", "--subject", f"vllm@{gone}", "--findings", ff]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.match(r"^U2\s+not_applicable\s+code changed\s+.*has no _decode_num_splits$", out[0]), out
    assert out[1] == f"1 findings on vllm=={loader.tree_at(gone).version}: 1 not_applicable; 1 with changed code"


def test_findings_check_on_a_changed_but_unfixed_tree_is_present_with_code_changed(dev_subjects, tmp_path):
    ff = _findings_file(tmp_path, "U2")
    os.remove(tmp_path / "findings" / "U2.json")
    fs = kf.load(ff)
    moved = dev_subjects["moved"]
    (r,) = check(fs, moved)
    assert (r["status"], r["code_changed"], r["detail"]) == ("no_reproducer", True,
                                                             "no findings/U2.json beside findings.toml")
    shutil.copyfile(_repo_finding("U2").reproducer, tmp_path / "findings" / "U2.json")
    (r,) = check(fs, moved)
    assert (r["status"], r["code_changed"]) == ("present", True)
    assert r["detail"] == "gfx942: split count differs from the re-derived formula: both segments empty"


def test_findings_check_errors_are_one_line_and_exit_2(tmp_path, capsys):
    assert smv(["findings", "check", "--subject", f"vllm@{tmp_path / 'none'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smv findings: error: vllm@") and "no such directory" in err and err.count("\n") == 1
    bad = tmp_path / "findings.toml"
    bad.write_text("schema_version = [")
    assert smv(["findings", "check", "--subject", "ours", "--findings", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"smv findings: error: {bad}: not valid TOML") and err.count("\n") == 1


def test_a_mutant_audit_matches_findings_against_the_unpatched_tree(monkeypatch, tmp_path):
    """smv zoo plants a bug into a copy of the tree: the copy's hashes differ, so the findings are matched against
    the unpatched tree (CODE_ROOT_ENV), and a finding's usual violation stays known instead of reading as code
    changed (which would be a kill the planted bug did not earn)."""
    import types

    from contracts.engine import findings as kf
    from contracts.zoo import runner as zoo_runner

    sub = types.SimpleNamespace(tree=types.SimpleNamespace(root=str(tmp_path / "patched")))
    assert kf.subject_root(sub) == str(tmp_path / "patched")
    monkeypatch.setenv(kf.CODE_ROOT_ENV, str(tmp_path / "original"))
    assert kf.subject_root(sub) == str(tmp_path / "original")
    assert kf.subject_root(types.SimpleNamespace()) is None  # ours has no tree, whatever the variable says
    monkeypatch.delenv(kf.CODE_ROOT_ENV)
    seen = {}

    def fake_run(cmd, **kw):
        seen.update(kw["env"])
        return types.SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(zoo_runner.subprocess, "run", fake_run)
    zoo_runner._audit(tmp_path / "r", ["c"], ["gfx942"], budget=1, timeout=1, code_root=tmp_path, cwd=tmp_path,
                      tree=tmp_path / "patched", findings_root=tmp_path / "original")
    assert seen[kf.CODE_ROOT_ENV] == str(tmp_path / "original")


def test_a_model_variant_matches_findings_against_its_own_module(tmp_path):
    """A ``#deepseek_v41`` subject's rows run the V4.1 copy of rocm.py: a finding that names V4's module is matched
    against the V4.1 file's code, never against the V4 file that merely sits in the same tree."""
    import types

    from contracts.engine import findings as kf

    v4 = "vllm/models/deepseek_v4/amd/rocm.py"
    v41 = "vllm/models/deepseek_v41/amd/rocm.py"
    for rel, body in ((v4, "def f():\n    return 4\n"), (v41, "def f():\n    return 41\n")):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(body)
    tree = types.SimpleNamespace(root=str(tmp_path))
    plain = kf.subject_root(types.SimpleNamespace(tree=tree, variant=None))
    variant = kf.subject_root(types.SimpleNamespace(tree=tree, variant="deepseek_v41"))
    ref = kf.FunctionRef(v4, "f", (kf.function_sha256(str(tmp_path), v4, "f"),))
    assert variant.path(v4) == v41 and plain.path(v4) == v4
    assert ref.hash_in(plain) in ref.sha256
    assert ref.hash_in(variant) == kf.function_sha256(str(tmp_path), v41, "f") not in ref.sha256
