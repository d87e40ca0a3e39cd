"""The vllm subject's loader: fetching a release once (and safely from two fetchers at a time), the three ways of
naming a tree, one fresh import per target, the stand-ins' refusals, ``sys.modules`` put back exactly, and named
rewrites that fail loudly when upstream moves."""
from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import types
import zipfile

import pytest
import torch

from contracts.subjects import SubjectSpecError, parse_subject
from contracts.subjects.vllm import loader, standins
from contracts.subjects.vllm.loader import MARKER, NEEDED, Rewrite
from impl.targets import get_target

TARGETS = ("gfx942", "gfx950", "generic")


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _fp8(name: str):
    return torch.float8_e4m3fnuz if get_target(name).main_cache_fp8 == "fnuz" else torch.float8_e4m3fn


def _one_line(exc) -> str:
    msg = str(exc.value if hasattr(exc, "value") else exc)
    assert msg and "\n" not in msg, msg
    return msg


def _vllm_keys() -> dict:
    return {k: v for k, v in sys.modules.items() if k == "vllm" or k.startswith("vllm.") or k.split(".")[0] == "aiter"}


def _checkout(src_root: str, dst) -> str:
    """A checkout-shaped copy of a tree: ``dst/vllm/...`` holding the audited modules, no smv metadata."""
    for p in NEEDED:
        if os.path.exists(os.path.join(src_root, p)):
            os.makedirs(os.path.dirname(os.path.join(dst, p)), exist_ok=True)
            shutil.copyfile(os.path.join(src_root, p), os.path.join(dst, p))
    return str(dst)


# --- fetching --------------------------------------------------------------------------------------------------------

def test_fetched_release_records_the_wheel_and_is_reused_offline(vllm_subject, monkeypatch):
    tree = vllm_subject.tree
    meta = json.load(open(os.path.join(tree.root, "smv-subject.json")))
    assert meta["version"] == vllm_subject.version == "0.33.0"
    assert tree.wheel_sha256 == meta["wheel_sha256"] and len(tree.wheel_sha256) == 64
    assert meta["wheel"].startswith("vllm-0.33.0-") and meta["wheel"].endswith(".whl")
    # only the audited modules were kept, each as recorded
    kept = sorted(os.path.relpath(os.path.join(d, f), tree.root) for d, _, fs in os.walk(tree.root) for f in fs)
    assert kept == sorted([*meta["modules"], "smv-subject.json"])
    assert set(meta["modules"]) | set(meta["absent"]) == set(NEEDED)
    assert all(_sha(os.path.join(tree.root, p)) == sha for p, sha in meta["modules"].items())

    def no_pip(*a, **k):
        raise AssertionError("a cached release must not be downloaded again")

    monkeypatch.setattr(loader.subprocess, "run", no_pip)
    again = parse_subject("vllm==0.33.0")
    assert again.tree.root == tree.root and again.wheel_sha256 == tree.wheel_sha256

    d = again.describe()
    assert set(d) == {"name", "version", "source", "modules", "rewrites", "wheel_sha256", "standins", "not_run"}
    assert (d["name"], d["version"], d["wheel_sha256"]) == ("vllm", "0.33.0", meta["wheel_sha256"])
    assert d["modules"] == meta["modules"] and tree.root in d["source"] and meta["wheel"] in d["source"]


def _make_wheel(folder, version: str, files: dict) -> str:
    path = os.path.join(folder, f"vllm-{version}-py3-none-any.whl")
    info = f"vllm-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
        zf.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: smv-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip resolves vllm from a folder of wheels only (no index, no config files); its log counts downloads."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CONSTRAINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(wheels))
    monkeypatch.setenv("PIP_LOG", str(tmp_path / "pip.log"))
    monkeypatch.setenv("SMV_CACHE", str(tmp_path / "cache"))
    return wheels


def test_two_fetchers_at_once_download_once_and_share_one_whole_tree(local_index, tmp_path):
    files = {p: f"# {p}\nVALUE = {i}\n" for i, p in enumerate(NEEDED[:-1])}
    files["vllm/__init__.py"] = "raise RuntimeError('not an audited module')\n"  # in the wheel, never extracted
    wheel = _make_wheel(local_index, "9.9.9", files)
    results, errors = [], []

    def fetch():
        try:
            results.append(loader.fetch_tree("9.9.9"))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    dest = str(tmp_path / "cache" / "vllm-9.9.9")
    assert [t.root for t in results] == [dest, dest]
    assert all(t.wheel_sha256 == _sha(wheel) for t in results)
    log = open(tmp_path / "pip.log").read()
    assert log.count("Saved ") == 1, "the second fetcher must wait for the first and reuse its tree"
    meta = json.load(open(os.path.join(dest, "smv-subject.json")))
    assert meta["absent"] == [NEEDED[-1]] and set(meta["modules"]) == set(NEEDED[:-1])
    assert sorted(os.listdir(tmp_path / "cache")) == ["vllm-9.9.9", "vllm-9.9.9.lock"]  # no parts left behind
    assert not os.path.exists(os.path.join(dest, "vllm", "__init__.py"))


def test_a_modified_cache_is_fetched_again_and_a_foreign_directory_is_never_overwritten(local_index, tmp_path,
                                                                                         monkeypatch):
    wheel = _make_wheel(local_index, "9.9.8", {p: f"V = {i}\n" for i, p in enumerate(NEEDED)})
    downloads = []

    def download(version, tmp):  # pip's part is the test above's; here only what the loader decides
        downloads.append(version)
        return shutil.copy(wheel, tmp)

    monkeypatch.setattr(loader, "_download_wheel", download)
    dest = tmp_path / "cache" / "vllm-9.9.8"
    loader.fetch_tree("9.9.8")
    loader.fetch_tree("9.9.8")
    assert downloads == ["9.9.8"]
    (dest / MARKER).write_text("V = 'planted'\n")
    planted = loader.tree_at(str(dest))
    assert planted.modified == (MARKER,) and "modified since: " + MARKER in planted.source
    loader.fetch_tree("9.9.8")
    assert (dest / MARKER).read_text() == "V = 0\n" and len(downloads) == 2

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(SubjectSpecError) as exc:
        loader.fetch_tree("9.9.8", to=str(mine))
    assert "is not a tree written by smv" in _one_line(exc)
    assert os.listdir(mine) == ["notes.txt"] and (mine / "notes.txt").read_text() == "keep me"
    assert len(downloads) == 2  # refused before any download


@pytest.mark.slow
def test_two_processes_fetching_at_once(local_index, tmp_path):
    wheel = _make_wheel(local_index, "9.9.6", {p: f"V = {i}\n" for i, p in enumerate(NEEDED)})
    code = "from contracts.subjects.vllm import loader; print(loader.fetch_tree('9.9.6').wheel_sha256)"
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    procs = [subprocess.Popen([sys.executable, "-c", code], cwd=repo, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert [o.strip() for o, _ in outs] == [_sha(wheel)] * 2
    assert open(tmp_path / "pip.log").read().count("Saved ") == 1
    assert sorted(os.listdir(tmp_path / "cache")) == ["vllm-9.9.6", "vllm-9.9.6.lock"]


def test_an_unknown_release_is_one_line_and_fast():
    t0 = time.monotonic()
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject("vllm==0.0.0.dev999999")
    elapsed = time.monotonic() - t0
    msg = _one_line(exc)
    if "no such release" not in msg:
        pytest.skip(f"the package index is not reachable from here: {msg}")
    assert msg.startswith("vllm==0.0.0.dev999999: no such release on the package index (newest: ")
    assert elapsed < 30, elapsed


def test_no_network_is_one_line_and_fast(monkeypatch, tmp_path):
    for var in ("PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple/")  # the discard port: connection refused
    monkeypatch.setenv("SMV_CACHE", str(tmp_path))
    t0 = time.monotonic()
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject("vllm==0.33.0")
    assert _one_line(exc) == "vllm==0.33.0: the package index cannot be reached (no network?)"
    assert time.monotonic() - t0 < 30
    assert os.listdir(tmp_path) == ["vllm-0.33.0.lock"]


@pytest.mark.parametrize("spec, says", [
    ("vllm==", "not a version number"), ("vllm==latest", "not a version number"), ("vllm@", "give the path"),
    ("vlm==0.33.0", "unknown subject"),
])
def test_malformed_specs_are_one_line(spec, says):
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject(spec)
    assert says in _one_line(exc)


# --- vllm@PATH and the installed vllm ---------------------------------------------------------------------------------

def test_a_checkout_is_a_tree_and_only_its_audited_modules_run(vllm_subject, tmp_path, monkeypatch):
    root = _checkout(vllm_subject.tree.root, tmp_path / "co")
    # everything else in a checkout (and an importable copy of it) must stay unexecuted
    for p in ("vllm/__init__.py", "vllm/config/__init__.py", "vllm/platforms/__init__.py"):
        os.makedirs(os.path.dirname(os.path.join(root, p)), exist_ok=True)
        open(os.path.join(root, p), "w").write("raise RuntimeError('the loader executed a module it must not')\n")
    monkeypatch.syspath_prepend(root)
    tree = parse_subject(f"vllm@{root}").tree
    assert (tree.root, tree.version, tree.wheel_sha256) == (root, "unknown", None)
    assert parse_subject(f"vllm@{root}/vllm").tree.root == root
    assert tree.module_hashes() == vllm_subject.tree.module_hashes()
    got = tree.load("gfx950", _fp8("gfx950"), 256)
    assert got["ops"].__file__ == os.path.join(root, MARKER)
    assert isinstance(got.modules["vllm.config"], standins.InertModule)
    assert "vllm" not in sys.modules

    with open(os.path.join(root, "vllm", "_version.py"), "w") as fh:
        fh.write("__version__ = version = '0.34.0.dev7+gfeedbee'\n")
    assert loader.tree_at(root).version == "0.34.0.dev7+gfeedbee"


def test_a_checkout_without_version_file_is_named_by_git(vllm_subject, tmp_path):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    root = _checkout(vllm_subject.tree.root, tmp_path / "co")
    git = ["git", "-C", root, "-c", "user.name=t", "-c", "user.email=t@t", "-c", "commit.gpgsign=false"]
    for args in (["init", "-q"], ["add", "."], ["commit", "-qm", "x"]):
        subprocess.run(git + args, check=True, capture_output=True)
    head = subprocess.run(git + ["rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    assert loader.tree_at(root).version == f"git:{head}"
    with open(os.path.join(root, MARKER), "a") as fh:
        fh.write("\n")
    assert loader.tree_at(root).version == f"git:{head}-dirty"
    inner = _checkout(vllm_subject.tree.root, tmp_path / "co" / "nested")  # inside the repo, not its root
    assert loader.tree_at(inner).version == "unknown"


def test_a_path_without_vllm_is_one_line(tmp_path):
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject(f"vllm@{tmp_path / 'nowhere'}")
    assert _one_line(exc).endswith("no such directory")
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject(f"vllm@{tmp_path}")
    assert "is not a vLLM tree" in _one_line(exc) and MARKER in str(exc.value)
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("")
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject(f"vllm@{tmp_path}")
    assert "has a vllm/ package but has no" in _one_line(exc)


def test_installed_vllm_is_found_without_importing_it(vllm_subject, tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "meta_path", [importlib.machinery.PathFinder])
    monkeypatch.setattr(sys, "path", [str(tmp_path)])
    importlib.invalidate_caches()
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject("vllm")
    assert "vLLM is not installed in this environment" in _one_line(exc)

    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text("raise RuntimeError('imported')\n")
    importlib.invalidate_caches()
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject("vllm")
    assert f"the installed vLLM at {tmp_path} has no {MARKER}" in _one_line(exc)

    _checkout(vllm_subject.tree.root, tmp_path)
    (tmp_path / "vllm" / "_version.py").write_text("__version__ = '0.33.1'\n")
    importlib.invalidate_caches()
    sub = parse_subject("vllm")
    assert (sub.tree.root, sub.version, sub.source) == (str(tmp_path), "0.33.1", f"installed: {tmp_path}")
    assert "vllm" not in sys.modules


# --- one import per target ---------------------------------------------------------------------------------------------

def test_each_target_gets_its_own_import(vllm_subject):
    loads = {t: vllm_subject.bind(t).ctx.loaded for t in TARGETS}
    for t, got in loads.items():
        flags = got.modules["vllm.platforms.rocm"]
        want942, want950 = get_target(t).decode_family == "gfx942", get_target(t).decode_family == "gfx950"
        assert (flags._ON_GFX942, flags._ON_GFX950) == (want942, want950), t  # generic: neither
        ops = got["ops"]
        assert (ops._ON_GFX942, ops._ON_GFX950) == (want942, want950), t
        assert got["rocm"]._ON_GFX950 is want950
        assert ops.FP8_DTYPE == _fp8(t)
        assert got.modules["vllm.platforms"].current_platform.get_cu_count() == get_target(t).cu_count
        default = inspect.signature(ops._can_use_aiter_sparse_prefill_opus).parameters["on_gfx950"].default
        assert default is want950, t
        assert got["rocm"].envs is got.modules["vllm.envs"]
    # no module object is shared between two targets, and a later import changed no earlier one
    for a in TARGETS:
        for b in TARGETS:
            if a < b:
                assert not {id(m) for m in loads[a].modules.values()} & {id(m) for m in loads[b].modules.values()}
    fresh = vllm_subject.tree.load("gfx950", _fp8("gfx950"), 256)
    assert fresh["ops"] is not loads["gfx950"]["ops"]
    assert loads["gfx942"]["ops"].FP8_DTYPE == torch.float8_e4m3fnuz and not loads["gfx942"]["ops"]._ON_GFX950


def test_active_restores_sys_modules_exactly_also_on_error(vllm_subject, monkeypatch):
    installed = types.ModuleType("vllm")
    installed.__file__ = "/site-packages/vllm/__init__.py"
    pypi_aiter = types.ModuleType("aiter")  # PyPI's aiter (an unrelated package) imported elsewhere in the process
    pypi_aiter.__file__ = "/site-packages/aiter/__init__.py"
    monkeypatch.setitem(sys.modules, "vllm", installed)
    monkeypatch.setitem(sys.modules, "vllm.config", types.ModuleType("vllm.config"))
    monkeypatch.setitem(sys.modules, "aiter", pypi_aiter)
    before, meta_path = _vllm_keys(), list(sys.meta_path)
    g942 = vllm_subject.tree.load("gfx942", _fp8("gfx942"), 304)
    g950 = vllm_subject.tree.load("gfx950", _fp8("gfx950"), 256)
    assert _vllm_keys() == before and sys.meta_path == meta_path

    with pytest.raises(RuntimeError, match="inside the call"):
        with g942.active():
            assert sys.modules["vllm"] is g942.modules["vllm"] and "aiter" not in sys.modules
            with pytest.raises(ModuleNotFoundError):
                importlib.import_module("aiter")
            lazy = importlib.import_module("vllm.not_imported_at_load.helpers")
            assert isinstance(lazy, standins.InertModule)
            with g950.active():  # nested: the inner target's modules, then the outer's again
                assert sys.modules["vllm.platforms.rocm"]._ON_GFX950 is True
            assert sys.modules["vllm.platforms.rocm"]._ON_GFX950 is False
            fake = types.ModuleType("aiter")  # an adapter's in-memory fake is seen
            sys.modules["aiter"] = fake
            assert importlib.import_module("aiter") is fake
            raise RuntimeError("inside the call")
    after = _vllm_keys()
    assert after.keys() == before.keys() and all(after[k] is before[k] for k in before)
    assert sys.meta_path == meta_path
    assert g942.modules["vllm.not_imported_at_load.helpers"] is lazy  # kept for this target's next call
    assert "vllm.not_imported_at_load.helpers" not in g950.modules


# --- stand-ins ---------------------------------------------------------------------------------------------------------

def test_an_inert_facility_called_after_import_raises_naming_it(vllm_subject):
    got = vllm_subject.tree.load("gfx950", _fp8("gfx950"), 256)
    ops = got["ops"]
    assert standins.is_placeholder(ops.get_current_vllm_config)
    with got.active():
        with pytest.raises(standins.StandInCalled, match=r"^vllm\.config\.get_current_vllm_config was called"):
            ops.get_current_vllm_config()
        with pytest.raises(standins.StandInCalled, match="eager_break_during_capture was called"):
            ops.eager_break_during_capture(lambda: None)  # a decorator only while importing
        with pytest.raises(standins.StandInCalled, match="tested for truth"):
            bool(got.modules["vllm.config"].CUDAGraphMode)
    # what a placeholder decorated at import is upstream's own function, unchanged
    decorated = ops.rocm_aiter_sparse_attn_indexer
    assert inspect.isfunction(decorated) and decorated.__module__ == "vllm.v1.attention.ops.rocm_aiter_mla_sparse"
    # a class upstream derives from a placeholder is its own: instantiable; its stand-in base's __init__ is not
    builder = got["builder"].ROCMAiterMLASparseMetadataBuilder
    assert not standins.is_placeholder(builder) and standins.is_placeholder(builder.__mro__[1])
    with pytest.raises(standins.StandInCalled, match=r"__init__ reached its base .*SparseMLACommonMetadataBuilder"):
        builder(None, [], None, "cpu")
    assert isinstance(object.__new__(builder), builder)


def test_importing_flag_is_the_loading_threads_only(vllm_subject):
    probe = Rewrite(
        "smv-test-importing-probe", MARKER, r"\Z",
        "\nfrom contracts.subjects.vllm.standins import IMPORTING as _smv_i\nimport threading as _smv_t\n"
        "SMV_SEEN = [_smv_i.get()]\n_smv_x = _smv_t.Thread(target=lambda: SMV_SEEN.append(_smv_i.get()))\n"
        "_smv_x.start()\n_smv_x.join()\n", "test probe", regex=True)
    got = vllm_subject.tree.load("generic", _fp8("generic"), 256, rewrites=[probe])
    assert got["ops"].SMV_SEEN == [True, False]
    assert standins.IMPORTING.get() is False
    assert got.rewrites == [{"id": probe.id, "file": MARKER, "count": 1, "why": "test probe"}]


# --- rewrites ----------------------------------------------------------------------------------------------------------

def test_a_rewrite_that_no_longer_matches_names_itself(vllm_subject):
    before, meta_path = _vllm_keys(), list(sys.meta_path)
    stale = Rewrite("smv-test-stale", MARKER, "text upstream never had\n", "", "test")
    with pytest.raises(SubjectSpecError) as exc:
        vllm_subject.tree.load("gfx942", _fp8("gfx942"), 304, rewrites=[stale])
    msg = _one_line(exc)
    assert msg.startswith(f"rewrite smv-test-stale no longer matches {MARKER}")
    assert _vllm_keys() == before and sys.meta_path == meta_path and standins.IMPORTING.get() is False

    with pytest.raises(SubjectSpecError, match="smv-test-elsewhere names vllm/elsewhere.py"):
        vllm_subject.tree.load("gfx942", _fp8("gfx942"), 304,
                               rewrites=[Rewrite("smv-test-elsewhere", "vllm/elsewhere.py", "a", "b", "test")])


def test_describe_lists_the_rewrites_applied(vllm_subject):
    vllm_subject.bind("gfx942")
    d = vllm_subject.describe()
    assert d["modules"] == vllm_subject.tree.module_hashes()
    for rw in d["rewrites"]:
        assert set(rw) == {"id", "file", "count", "why"} and rw["file"] in NEEDED and rw["count"] >= 1
    registered = {(r.id, r.path) for r in loader.REWRITES}
    assert {(rw["id"], rw["file"]) for rw in d["rewrites"]} <= registered


def test_an_unwritable_cache_is_one_line(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        ro = "/proc/smv-no-such-dir"  # root may write anywhere a mode allows; /proc refuses new entries to all
    else:
        (tmp_path / "ro").mkdir(mode=0o500)
        ro = str(tmp_path / "ro" / "cache")
    monkeypatch.setenv("SMV_CACHE", ro)
    with pytest.raises(SubjectSpecError) as exc:
        parse_subject("vllm==9.9.5")
    assert _one_line(exc).startswith(f"vllm==9.9.5: cannot write the tree at {ro}/vllm-9.9.5 (")
