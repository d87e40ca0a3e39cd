"""``smv findings export``: a finding as a standalone script a maintainer runs without this suite, and its ISSUE.md.

The scripts run in a subprocess from a folder outside the checkout with the suite's packages made unimportable
(``sys.modules[name] = None`` for impl, oracles, contracts and fuzz), so any import of the suite fails them. The
slow test goes further: a fresh virtual environment holding only torch and Triton runs every upstream-bug finding's
script against vLLM 0.33.0's tree (exit 1) and, where the finding's part names a fix of a line or two
(``FIXED_BY``), against a copy of the tree with that fix (exit 0)."""
from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from contracts.cli.smv import main as smv
from contracts.engine import findings as kf
from contracts.engine.findings_export import ExportError, export, part_path, sections, shared_names
from upstream_trees import release_tree

ROOT = Path(__file__).resolve().parents[1]
OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
BLOCK_SUITE = ("import runpy, sys\n"
               "for name in ('impl', 'oracles', 'contracts', 'fuzz'):\n"
               "    sys.modules[name] = None  # the suite is not importable in here\n"
               "sys.argv = ['repro.py', *sys.argv[1:]]\n"
               "runpy.run_path('repro.py', run_name='__main__')\n")


def _tree(release: str) -> str:
    return release_tree(release, OPS)


@pytest.fixture(scope="module")
def tree033():
    return _tree("0.33.0")


def _findings() -> dict:
    return {f.id: f for f in kf.load()}


def _run(folder: Path, python: str = sys.executable, *args, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRITON_INTERPRET", "SMV_TARGET")}
    return subprocess.run([python, "-c", BLOCK_SUITE, *args], cwd=folder, env=env, capture_output=True, text=True,
                          timeout=timeout)


def fixed_by(part: str) -> list:
    """A part's ``FIXED_BY``: ``[(module path, text, replacement), ...]``, the fix of a line or two (or [])."""
    for node in ast.parse(Path(part).read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "FIXED_BY" for t in node.targets):
            return list(ast.literal_eval(node.value))
    return []


def patched_copy(tree: str, fixes: list, dest: Path) -> str:
    shutil.copytree(tree, dest)
    for module, old, new in fixes:
        path = dest / module
        text = path.read_text()
        assert text.count(old) == 1, f"{module}: the fix's text occurs {text.count(old)} times"
        path.write_text(text.replace(old, new))
    return str(dest)


# --- every upstream bug has a reproducer a maintainer can run ----------------------------------------------------


def test_every_upstream_bug_finding_exports_a_script_and_an_issue(tmp_path):
    for f in _findings().values():
        if f.kind != "upstream-bug":
            continue
        assert part_path(f), f"{f.id}: no findings/export/{f.id}.py (nor its root's)"
        repro, md = export(f, str(tmp_path / f.id))
        text = Path(repro).read_text()
        compile(text, repro, "exec")
        assert "def reproduce(args)" in text and f.id in text
        issue = Path(md).read_text()
        for head in ("## Input", "## Expected", "## Suggested fix", "## Reproduce"):
            assert head in issue, f"{f.id}: ISSUE.md lacks {head}"


def test_the_script_shows_the_defect_and_its_fix_without_the_suite(tree033, tmp_path):
    """U1 end to end: present on 0.33.0 (exit 1), gone once the averages are exact (exit 0), and a tree without
    the module cannot run it (exit 2); never an import of the suite."""
    f = _findings()["U1"]
    out = tmp_path / "U1"
    repro, md = export(f, str(out), tree033)
    res = _run(out)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "observed: 4 splits" in res.stdout and "expected: 3 splits" in res.stdout
    fixed = patched_copy(tree033, fixed_by(part_path(f)), tmp_path / "fixed")
    res = _run(out, sys.executable, "--vllm-tree", fixed)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "not present" in res.stdout
    res = _run(out, sys.executable, "--vllm-tree", str(tmp_path / "nothing"))
    assert res.returncode == 2 and "cannot run" in res.stdout, res.stdout + res.stderr
    assert f"--vllm-tree {tree033}" in Path(md).read_text()


def test_export_usage_errors(tmp_path, capsys):
    assert smv(["findings", "export", "NOPE", "--to", str(tmp_path / "a")]) == 2
    assert "no finding 'NOPE'" in capsys.readouterr().err
    assert smv(["findings", "export", "U1", "--to", str(tmp_path / "b"), "--vllm-tree", str(tmp_path)]) == 2
    assert "no vllm/ folder" in capsys.readouterr().err
    assert smv(["findings", "export", "U1", "--to", str(tmp_path / "c")]) == 0
    assert (tmp_path / "c" / "repro.py").exists() and (tmp_path / "c" / "ISSUE.md").exists()


def test_a_part_without_the_issue_paragraphs_is_refused(tmp_path):
    f = _findings()["U1"]
    (tmp_path / "findings" / "export").mkdir(parents=True)
    (tmp_path / "findings" / "export" / "U1.py").write_text('"""U1.\n\nInput: x.\n"""\ndef reproduce(args):\n    pass\n')
    f = dataclasses.replace(f, source=str(tmp_path / "findings.toml"))
    with pytest.raises(ExportError, match="'Expected'"):
        export(f, str(tmp_path / "out"))


PART = ('"""U1.\n\nInput: x.\n\nExpected: y.\n\nSuggested fix: z.\n"""\n'
        'SHARED = {names}\n\n\ndef reproduce(args):\n    return Verdict(helper() != 1, "o", "e")\n')


def _part_with_shared(tmp_path, names, snippets):
    (tmp_path / "findings" / "export" / "_shared").mkdir(parents=True)
    (tmp_path / "findings" / "export" / "U1.py").write_text(PART.format(names=names))
    for name, text in snippets.items():
        (tmp_path / "findings" / "export" / "_shared" / f"{name}.py").write_text(text)
    return dataclasses.replace(_findings()["U1"], source=str(tmp_path / "findings.toml"))


def test_a_part_gets_each_snippet_it_shares_once_between_the_prelude_and_the_part(tmp_path):
    helper = '"""A snippet."""\n\n\ndef helper():\n    """One."""\n    return 1\n'
    other = '"""Another."""\n\n\ndef other():\n    """Two."""\n    return helper() + 1\n'
    f = _part_with_shared(tmp_path, '["helper", "other", "helper"]', {"helper": helper, "other": other})
    repro, _ = export(f, str(tmp_path / "out"))
    text = Path(repro).read_text()
    assert text.count("def helper():") == 1 and text.count("def other():") == 1
    assert text.index("def call_upstream(") < text.index("def helper():") < text.index("def other():") \
        < text.index("def reproduce(args)")
    assert "# --- shared with other findings' reproducers: helper, other" in text
    compile(text, repro, "exec")
    res = _run(tmp_path / "out")
    assert res.returncode == 0, res.stdout + res.stderr  # the part calls the snippet's function


def test_a_part_naming_an_unknown_snippet_is_refused(tmp_path):
    f = _part_with_shared(tmp_path, '["helper", "nope"]', {"helper": "def helper():\n    return 1\n"})
    with pytest.raises(ExportError, match=r"SHARED names 'nope'") as exc:
        export(f, str(tmp_path / "out"))
    assert "\n" not in str(exc.value) and not (tmp_path / "out" / "repro.py").exists()
    for bad in ('["../U1"]', '[name]', '"helper"'):
        (tmp_path / "findings" / "export" / "U1.py").write_text(PART.format(names=bad))
        with pytest.raises(ExportError, match="SHARED"):
            export(f, str(tmp_path / "out"))


def test_every_shared_snippet_is_documented_functions_that_a_part_uses():
    folder = ROOT / "findings" / "export"
    used = {name for part in folder.glob("*.py") for name in shared_names(part.read_text(), str(part))}
    for snippet in sorted((folder / "_shared").glob("*.py")):
        tree = ast.parse(snippet.read_text())
        assert ast.get_docstring(tree), f"{snippet.name}: no docstring"
        assert snippet.stem in used, f"{snippet.name}: no part names it in SHARED"
        for node in tree.body[1:]:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert all(m.split(".")[0] in ("torch", "triton") or m.split(".")[0] in sys.stdlib_module_names
                           for m in mods), f"{snippet.name} imports {mods}"
            else:
                assert isinstance(node, ast.FunctionDef) and ast.get_docstring(node), \
                    f"{snippet.name}:{node.lineno}: a snippet holds documented functions only"


def test_sections_read_the_paragraphs_by_name():
    doc = "Summary.\n\nInput: a\n  b.\n\nExpected: c.\n\nSuggested fix: d."
    assert sections(doc) == {"Input": "a b.", "Expected": "c.", "Suggested fix": "d."}


# --- every script, in an environment without the suite (nightly) ---------------------------------------------------


@pytest.mark.slow
def test_every_upstream_bug_script_runs_in_a_bare_environment(tree033, tmp_path):
    env_dir = tmp_path / "bare"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    py = str(env_dir / "bin" / "python")
    import torch
    import triton

    pins = [f"torch=={torch.__version__.split('+')[0]}", f"triton=={triton.__version__}", "numpy"]
    subprocess.run([py, "-m", "pip", "install", "-q", *pins], check=True, timeout=1800)
    probe = subprocess.run([py, "-c", "import contracts"], capture_output=True, text=True, cwd=tmp_path)
    assert probe.returncode != 0  # the suite is not installed there
    failures = []
    for f in _findings().values():
        if f.kind != "upstream-bug" or part_path(f) is None or part_path(f) != _own_or_root(f):
            continue
        out = tmp_path / f.id
        tree = tree033 if "0.33.0" in f.confirmed_in or not f.confirmed_in else _tree(f.confirmed_in[0])
        export(f, str(out), tree)
        res = subprocess.run([py, "repro.py"], cwd=out, capture_output=True, text=True, timeout=900)
        if res.returncode != 1:
            failures.append(f"{f.id} on 0.33.0: exit {res.returncode}: {res.stdout[-400:]}{res.stderr[-400:]}")
        fixes = fixed_by(part_path(f))
        if fixes:
            fixed = patched_copy(tree, fixes, tmp_path / f"{f.id}-fixed")
            res = subprocess.run([py, "repro.py", "--vllm-tree", fixed], cwd=out, capture_output=True, text=True,
                                 timeout=900)
            if res.returncode != 0:
                failures.append(f"{f.id} fixed: exit {res.returncode}: {res.stdout[-400:]}{res.stderr[-400:]}")
    assert not failures, "\n".join(failures)


def _own_or_root(f) -> str | None:
    """Each script runs once: for its root finding (``U3``), not again for ``U3-agreement``."""
    p = part_path(f)
    return p if p and Path(p).stem == f.id else None
