"""``--changed-since REF`` (issue 28 item 3): what a change touched selects the audit rows, zoo entries and tests
that cover it (contracts.engine.changes); a change to shared machinery runs everything."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from contracts.engine import changes
from contracts.zoo.runner import load_catalogs

ROOT = Path(__file__).resolve().parent.parent
GIT = ("git", "-c", "user.email=a@b", "-c", "user.name=t", "-c", "commit.gpgsign=false")


def _git(repo, *args) -> str:
    return subprocess.run([*GIT, "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def _repo(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    _git(path, "init", "-q")
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "base", "--allow-empty")
    return path


def test_a_splits_change_selects_the_split_rows_entries_and_tests_not_decode_only_ones():
    sel = changes.select_suite(["impl/splits.py"])
    assert not sel.everything
    assert "split-bounds" in sel.contracts
    assert "decode-reduce-oracle" not in sel.contracts  # decode's reduction never runs the split selector
    assert any("impl/splits.py" in w for w in sel.why)
    mutants = load_catalogs()
    picked = {m.id for m in changes.select_mutants(mutants, sel, changed_code=["impl/splits.py"])}
    assert {m.id for m in mutants if m.file == "impl/splits.py"} <= picked
    decode_only = {m.id for m in mutants if m.file == "impl/decode.py" and set(m.expect) == {"decode-reduce-oracle"}}
    assert decode_only and not decode_only & picked
    tests, why = changes.select_tests(["impl/splits.py"])
    assert tests is not None and "tests/test_splits.py" in tests
    assert "tests/test_ragged.py" not in tests and "tests/test_router.py" not in tests


def test_upstream_subjects_take_only_what_their_contracts_compute_with_ours():
    """For a wheel subject an impl change selects only contracts that compute expectations with that impl module
    or compare against ours; a contract module or an adapter selects its rows for every subject."""
    up = changes.select_suite(["impl/splits.py"], upstream=True)
    assert "split-bounds" not in up.contracts
    assert changes.select_suite(["impl/router.py"], upstream=True).contracts == set()
    adapter = changes.select_suite(["contracts/subjects/vllm/adapters/splits.py"], upstream=True)
    assert "split-bounds" in adapter.contracts
    assert "split-bounds" in changes.select_suite(["contracts/splits.py"], upstream=True).contracts


@pytest.mark.parametrize("path", ["contracts/engine/runner.py", "oracles/decode.py", "fuzz/splits.py",
                                  "tests/conftest.py", "pyproject.toml", "contracts/subjects/vllm/loader.py"])
def test_shared_machinery_selects_everything(path):
    sel = changes.select_suite([path])
    assert sel.everything and sel.as_json()["selected"] == "all"
    assert changes.select_mutants(["m"], sel) == ["m"]
    assert changes.select_tests([path])[0] is None


def test_documentation_selects_nothing():
    sel = changes.select_suite(["README.md", "ci/nightly.sh"])
    assert sel.contracts == set() and sel.as_json()["selected"] == []


def test_changed_files_are_the_branch_plus_uncommitted_and_untracked(tmp_path):
    repo = tmp_path / "r"
    repo.mkdir()
    (repo / "a.py").write_text("a = 1\n")
    (repo / "b.py").write_text("b = 1\n")
    _repo(repo)
    base = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "a.py").write_text("a = 2\n")
    _git(repo, "commit", "-qam", "a")
    (repo / "b.py").write_text("b = 2\n")
    (repo / "c.py").write_text("c = 1\n")
    assert changes.changed_files(repo, base) == ["a.py", "b.py", "c.py"]
    assert changes.changed_files(repo, "HEAD") == ["b.py", "c.py"]
    with pytest.raises(changes.ChangesError, match="no such commit"):
        changes.changed_files(repo, "no-such-ref")
    with pytest.raises(changes.ChangesError, match="not a git checkout"):
        changes.repo_root(_not_a_repo(tmp_path))


def _not_a_repo(tmp_path: Path) -> Path:
    p = tmp_path / "plain"
    p.mkdir()
    (p / ".git").write_text("gitdir: /nonexistent\n")  # stops git's search upward: not a work tree
    return p


@pytest.fixture
def vllm_checkout(tmp_path):
    src = ROOT / ".smv-subject" / "vllm-0.34.0"
    if not (src / "vllm").is_dir():
        pytest.skip("no fetched vllm-0.34.0 tree in .smv-subject (smv subject fetch vllm==0.34.0)")
    repo = tmp_path / "vllm-src"
    shutil.copytree(src, repo, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return _repo(repo)


def test_a_checkout_selects_the_rows_of_the_functions_that_changed(vllm_checkout):
    ops = vllm_checkout / "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
    text = ops.read_text()
    anchor = "def _decode_gfx950_num_splits(\n"
    assert text.count(anchor) == 1
    # a function nothing audited uses: nothing selected
    ops.write_text(text + "\n\ndef _an_unaudited_helper():\n    return 1\n")
    sel = changes.select_checkout(vllm_checkout, "HEAD")
    assert sel.contracts == set() and sel.changed == ["vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"]
    # the gfx950 split selector's body: the splits family's rows, not the writers' or the router's
    body_start = text.index(anchor)
    colon = text.index(":\n", text.index(")", body_start)) + 2
    ops.write_text(text[:colon] + "    _changed_here = 1\n" + text[colon:])
    sel = changes.select_checkout(vllm_checkout, "HEAD")
    assert "split-bounds" in sel.contracts
    assert not {"router-oracle-agreement", "writer-oracle-exact", "nan-free-cache"} & sel.contracts
    assert any("_decode_gfx950_num_splits" in w for w in sel.why)
    # a file no adapter loads selects nothing
    ops.write_text(text)
    (vllm_checkout / "vllm" / "unrelated.py").write_text("x = 1\n")
    sel = changes.select_checkout(vllm_checkout, "HEAD")
    assert sel.contracts == set() and any("not an audited module" in w for w in sel.why)
