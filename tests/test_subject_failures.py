"""Upstream moves: a vLLM tree that fails to load or bind, in any way, ends its rows ``error`` (or ``skipped``)
naming the cause - the module, the name, the upstream line - while every other row still runs; the stand-ins
answer the platform names upstream keeps adding from the target; the adapters name the symbols they need."""
from __future__ import annotations

import json
import os
import shutil
import types

import pytest

from contracts.engine.audit import run_audit
from contracts.subjects import SymbolMissing, SymbolTooNew, parse_subject
from contracts.subjects.vllm import adapters, loader, standins

OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
ROCM = "vllm/models/deepseek_v4/amd/rocm.py"
#: a host-side contract on ops (the split selectors) and one on rocm (the ragged graph-buffer view): both cheap
CONTRACTS = ["split-bounds", "ragged-view-capacity"]


def _tree(vllm_subject, tmp_path, edit=None, version="0.35.0.dev3+gabc1234"):
    """A copy of the pinned release's tree, as a branch checkout would be: a dev version in vllm/_version.py (no
    smv-subject.json), and ``edit(root)`` applied."""
    root = tmp_path / "vllm-branch"
    shutil.copytree(vllm_subject.tree.root, root)
    os.remove(root / "smv-subject.json")
    (root / "vllm" / "_version.py").write_text(f'__version__ = version = "{version}"\n')
    if edit:
        edit(root)
    return parse_subject(f"vllm@{root}")


def _replace(root, rel, find, replace, count=1):
    path = root / rel
    src = path.read_text()
    assert src.count(find) == count, (rel, find, src.count(find))
    path.write_text(src.replace(find, replace))


def _audit(sub, tmp_path):
    doc, code = run_audit(CONTRACTS, ["gfx942", "gfx950"], budget=60, profile="dev", max_cases=2, progress=False,
                          report_dir=str(tmp_path / "report"), subjects=[sub])
    rows = {(r["contract"], r["target"]): r for r in doc["results"]}
    assert len(rows) == 4  # every row has a verdict row: nothing ended the audit
    return doc, code, rows


def test_an_import_time_error_is_an_error_row_naming_the_upstream_line(vllm_subject, tmp_path):
    def edit(root):
        _replace(root, OPS, "\nimport torch\n", "\nimport torch\nraise RuntimeError('branch broke the import')\n")

    doc, code, rows = _audit(_tree(vllm_subject, tmp_path, edit), tmp_path)
    assert code == 1 and doc["run"]["ok"] is False  # the merge gate fails on error rows
    lineno = next(i for i, ln in enumerate((tmp_path / "vllm-branch" / OPS).read_text().splitlines(), 1)
                  if "branch broke" in ln)
    for r in rows.values():
        assert r["status"] == "error", r
        assert "RuntimeError: branch broke the import" in r["reason"]
        assert f"(upstream {OPS}:{lineno})" in r["reason"], r["reason"]


def test_a_name_no_standin_serves_is_an_error_row_naming_it(vllm_subject, tmp_path):
    # upstream imports a new platform probe no rule knows and reads it inside the split selector
    def edit(root):
        _replace(root, OPS, "\nimport torch\n", "\nimport torch\nfrom vllm.platforms.rocm import _ON_WARP_DRIVE\n")
        _replace(root, OPS, "def _decode_num_splits(", "def _decode_num_splits_orig(")
        src = (root / OPS).read_text()
        src += ("\n\ndef _decode_num_splits(*args, **kwargs):\n    if _ON_WARP_DRIVE:\n        pass\n"
                "    return _decode_num_splits_orig(*args, **kwargs)\n")
        (root / OPS).write_text(src)

    sub = _tree(vllm_subject, tmp_path, edit)
    doc, code, rows = _audit(sub, tmp_path)
    r = rows[("split-bounds", "gfx942")]  # gfx942's selector reads the flag; gfx950's has its own selector
    assert r["status"] == "error", r
    assert "vllm.platforms.rocm._ON_WARP_DRIVE was tested for truth" in r["reason"], r["reason"]
    assert f"(upstream {OPS}:" in r["reason"]
    assert rows[("split-bounds", "gfx950")]["status"] != "error"
    for t in ("gfx942", "gfx950"):
        assert rows[("ragged-view-capacity", t)]["status"] != "error"  # the rest still ran
    served = {s["name"]: s["served"] for s in doc["run"]["subjects"][0]["standins"]}
    assert served["vllm.platforms.rocm._ON_WARP_DRIVE"]["gfx942"].startswith("not answered")


def test_a_renamed_symbol_an_adapter_needs_is_an_error_row_naming_it(vllm_subject, tmp_path):
    def edit(root):
        src = (root / OPS).read_text()
        (root / OPS).write_text(src.replace("_decode_gfx950_num_splits", "_decode_num_splits_cdna4"))

    doc, code, rows = _audit(_tree(vllm_subject, tmp_path, edit), tmp_path)
    for t in ("gfx942", "gfx950"):
        r = rows[("split-bounds", t)]
        assert r["status"] == "error", r
        assert "needs _decode_gfx950_num_splits in " + OPS in r["reason"], r["reason"]
        assert "AttributeError" not in r["reason"]
        assert rows[("ragged-view-capacity", t)]["status"] != "error"


def test_a_missing_module_skips_only_the_rows_that_need_it(vllm_subject, tmp_path):
    doc, code, rows = _audit(_tree(vllm_subject, tmp_path, lambda root: os.remove(root / ROCM)), tmp_path)
    for t in ("gfx942", "gfx950"):
        r = rows[("ragged-view-capacity", t)]
        assert r["status"] == "skipped" and ROCM in r["reason"], r
        assert rows[("split-bounds", t)]["status"] != "error"


def test_repro_of_a_tree_that_cannot_import_is_exit_2_naming_the_cause(vllm_subject, tmp_path, capsys):
    from contracts.cli.smv import main

    sub = _tree(vllm_subject, tmp_path)
    doc, _, rows = _audit(sub, tmp_path)
    repro = next((r["repro"] for r in rows.values() if r["repro"]), None)
    if repro is None:  # no row of the pinned release failed: write one by hand from a row's case
        pytest.skip("no reproducer was written by the pinned release's rows")
    _replace(tmp_path / "vllm-branch", OPS, "\nimport torch\n", "\nimport torch\nraise ImportError('gone')\n")
    capsys.readouterr()
    assert main(["repro", repro]) == 2
    err = capsys.readouterr().err
    assert "ImportError: gone" in err and f"(upstream {OPS}:" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("name, answers", [
    ("_ON_GFX942", {"gfx942": True, "gfx950": False, "generic": False}),
    ("_ON_GFX950", {"gfx942": False, "gfx950": True, "generic": False}),
    ("_ON_GFX9", {"gfx942": True, "gfx950": True, "generic": False}),
    ("on_gfx94", {"gfx942": True, "gfx950": False, "generic": False}),
    ("_ON_GFX1151", {"gfx942": False, "gfx950": False, "generic": False}),
    ("on_gfx12x", {"gfx942": False, "gfx950": False, "generic": False}),
    ("on_gfx1x", {"gfx942": False, "gfx950": False, "generic": False}),
    ("_ON_RDNA", {"gfx942": False, "gfx950": False, "generic": False}),
    ("on_rdna3", {"gfx942": False, "gfx950": False, "generic": False}),
    ("on_mi3xx", {"gfx942": True, "gfx950": True, "generic": False}),
    ("_ON_MI300", {"gfx942": True, "gfx950": False, "generic": False}),
    ("on_mi355", {"gfx942": False, "gfx950": True, "generic": False}),
    ("on_cdna", {"gfx942": True, "gfx950": True, "generic": False}),
    ("_ON_CDNA4", {"gfx942": False, "gfx950": True, "generic": False}),
    ("get_cdna_version", {"gfx942": 3, "gfx950": 4, "generic": 0}),
    ("get_rdna_version", {"gfx942": 0, "gfx950": 0, "generic": 0}),
])
def test_platform_names_are_answered_from_the_target_by_rule(name, answers):
    for arch, want in answers.items():
        assert standins.platform_answer(name, arch) == want, (name, arch)
        mod = standins.RocmModule("vllm.platforms.rocm", arch)
        value = getattr(mod, name)
        assert (value() if callable(value) else value) == want


@pytest.mark.parametrize("name", ["_ON_WARP_DRIVE", "on_hbm_stack", "get_firmware_version", "some_helper"])
def test_names_no_rule_knows_are_placeholders_that_refuse_after_import(name):
    served: dict = {}
    with standins.serving(served):
        value = getattr(standins.RocmModule("vllm.platforms.rocm", "gfx950"), name)
    assert standins.is_placeholder(value)
    assert served[("vllm.platforms.rocm", name)].startswith("not answered")
    with pytest.raises(standins.StandInCalled, match=name):
        bool(value) if name.startswith("_ON_") else value()


def test_the_newest_flags_load_and_are_listed(vllm_subject, tmp_path):
    # a module that imports names 0.34.0 added (and one of a later release) loads unmodified on every target
    def edit(root):
        _replace(root, OPS, "\nimport torch\n", "\nimport torch\nfrom vllm.platforms.rocm import (_ON_GFX1151, "
                 "_ON_RDNA, get_cdna_version, on_gfx1250, _ON_GFX1201)\n")

    sub = _tree(vllm_subject, tmp_path, edit)
    for t in ("gfx942", "gfx950", "generic"):
        ops = sub.bind(t).ctx["ops"]
        assert (ops._ON_GFX1151, ops._ON_RDNA, ops._ON_GFX1201) == (False, False, False)
        assert ops.get_cdna_version() == {"gfx942": 3, "gfx950": 4, "generic": 0}[t]
    served = {s["name"]: s["served"] for s in sub.describe()["standins"]}
    assert served["vllm.platforms.rocm.get_cdna_version"] == {
        "generic": "get_cdna_version() = 0", "gfx942": "get_cdna_version() = 3", "gfx950": "get_cdna_version() = 4"}
    assert served["vllm.platforms.rocm._ON_GFX1201"]["gfx950"] == "_ON_GFX1201 = False"


class _Ctx:
    def __init__(self, version, **modules):
        self.subject = types.SimpleNamespace(version=version)
        self._m = modules

    def __getitem__(self, short):
        return self._m[short]


@pytest.mark.parametrize("version, expect", [
    ("0.33.0", SymbolTooNew), ("0.33.1", SymbolTooNew),
    ("0.34.0", SymbolMissing), ("0.34.0rc1", SymbolMissing), ("0.35.0.dev3+gabc", SymbolMissing),
    ("git:abc1234", SymbolMissing), ("unknown", SymbolMissing),
])
def test_a_symbol_the_subject_predates_skips_any_other_missing_one_errors(version, expect):
    ops = types.SimpleNamespace(old=lambda: 1, Klass=type("Klass", (), {"method": lambda self: 1}))
    need = adapters.needs({"ops": ["old", "Klass.method", "new_thing"]}, since={"ops.new_thing": "0.34.0"})
    with pytest.raises(expect, match=r"needs new_thing in vllm/v1/attention/ops/rocm_aiter_mla_sparse\.py"):
        adapters.check_needs(_Ctx(version, ops=ops), "fam", need)
    adapters.check_needs(_Ctx(version, ops=ops), "fam", need[:2])  # the ones it has pass
    with pytest.raises(SymbolMissing, match="Klass.gone"):
        adapters.check_needs(_Ctx(version, ops=ops), "fam", adapters.needs({"ops": ["Klass.gone"]}))


def test_every_adapter_declares_the_upstream_symbols_it_uses():
    """The declaration cannot rot: each name an adapter reads off an upstream module (``ops.X``, ``rocm.X``, the
    keywords of ``mock.patch.multiple(rocm, ...)``) is in its NEEDS, and each NEEDS entry names a loader module."""
    import ast
    import importlib
    import pathlib

    aliases = {"ops": "ops", "rocm": "rocm", "swa": "swa", "comp": "compress", "dv2": "deepseek_v2",
               "gt": "grouped_topk"}

    def short_of(node, alias):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) \
                and node.slice.value in loader.SHORT:
            return node.slice.value
        return alias.get(node.id) if isinstance(node, ast.Name) else None

    folder = pathlib.Path(adapters.__file__).parent
    checked = 0
    for path in sorted(folder.glob("*.py")):
        if path.stem.startswith("_"):
            continue
        tree = ast.parse(path.read_text())
        alias = dict(aliases)
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name) \
                    and short_of(node.value, {}) is not None:
                alias[node.targets[0].id] = short_of(node.value, {})
        used = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and short_of(node.value, alias) and not node.attr.startswith("__"):
                used.add((short_of(node.value, alias), node.attr))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "multiple" \
                    and node.args and short_of(node.args[0], alias):
                used |= {(short_of(node.args[0], alias), kw.arg) for kw in node.keywords if kw.arg}
        mod = importlib.import_module(f"contracts.subjects.vllm.adapters.{path.stem}")
        declared = {(n.module, n.symbol.split(".")[0]) for n in getattr(mod, "NEEDS", ())}
        assert used <= declared, f"{path.name} uses {sorted(used - declared)} without declaring them in NEEDS"
        assert all(n.module in loader.SHORT for n in getattr(mod, "NEEDS", ()))
        checked += bool(used)
    assert checked >= 15


def test_the_report_lists_what_the_standins_served(vllm_subject, tmp_path):
    doc, _, _ = _audit(_tree(vllm_subject, tmp_path), tmp_path)
    d = doc["run"]["subjects"][0]
    served = {s["name"]: s["served"] for s in d["standins"]}
    assert served["vllm.platforms.rocm._ON_GFX950"] == {"gfx942": "_ON_GFX950 = False", "gfx950": "_ON_GFX950 = True"}
    md = (tmp_path / "report" / "audit.md").read_text()
    assert "stand-in `vllm.platforms.rocm._ON_GFX950`: gfx942: _ON_GFX950 = False; gfx950: _ON_GFX950 = True" in md
    saved = json.loads((tmp_path / "report" / "audit.json").read_text())
    assert saved["schema_version"] >= 9 and saved["run"]["subjects"][0]["standins"] == d["standins"]
    # what no row can run here is listed with its reason; a function the tree lacks is not (0.33.0 has no fused mask)
    what = [n["what"] for n in d["not_run"]]
    assert any(w.startswith("aiter.ops.triton.attention.pa_prefill_sparse") for w in what)
    assert not any("_mask_candidates_fused_kernel" in w for w in what)
    assert "not run here: `aiter.ops.triton.attention.pa_prefill_sparse" in md


def test_the_newest_release_lists_its_fused_mask_as_not_run(tmp_path, vllm_subject):
    def edit(root):  # a branch that gained the single-launch mask kernel (its body does not matter here)
        src = (root / OPS).read_text()
        (root / OPS).write_text(src + "\n\ndef _mask_candidates_fused_kernel(x):\n    return x\n")

    d = _tree(vllm_subject, tmp_path, edit).describe()
    assert any(n["what"] == f"{OPS}::_mask_candidates_fused_kernel" and "inline assembly" in n["why"]
               for n in d["not_run"])


def test_the_nightly_lists_every_final_release_since_the_first_with_dsv4_rocm():
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parent.parent / "ci" / "vllm_releases.py"
    spec = importlib.util.spec_from_file_location("vllm_releases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    listing = ("vllm (0.35.0rc1)\nAvailable versions: 0.35.0rc1, 0.34.0, 0.33.0, 0.22.1, 0.22.0, 0.21.0, 0.10.1.1, "
               "0.8.5.post1, 0.3.0\n")
    assert mod.releases("0.22.0", listing) == ["0.22.0", "0.22.1", "0.33.0", "0.34.0"]
    assert mod.releases("0.34.0", listing) == ["0.34.0"]
    assert mod.releases("0.22.0", "ERROR: no network") == []


def test_the_lifecycle_says_which_releases_show_each_finding_and_each_new_failure():
    from contracts.engine import reports

    def row(version, contract, status, findings=(), msg="m"):
        return {"contract": contract, "target": "gfx942", "status": status, "reason": msg, "findings": list(findings),
                "subject": {"name": "vllm", "version": version},
                "violations": [{"message": msg, "where": "", "expected": "", "got": ""}]}

    rows = [row("0.33.0", "a", "known", ["F1", "F2"]), row("0.34.0", "a", "known", ["F2"]),
            row("0.34.0", "b", "fail", msg="new thing"), row("0.33.0", "b", "pass")]
    life = reports.lifecycle(rows, ["vllm==0.33.0", "vllm==0.34.0"], ["F1", "F2", "F3"])
    seen = {f["id"]: f["seen"] for f in life["findings"]}
    assert seen == {"F1": {"vllm==0.33.0": True, "vllm==0.34.0": False},
                    "F2": {"vllm==0.33.0": True, "vllm==0.34.0": True},
                    "F3": {"vllm==0.33.0": False, "vllm==0.34.0": False}}
    assert life["new_failures"] == [{"contract": "b", "target": "gfx942", "message": "new thing",
                                     "seen": {"vllm==0.33.0": False, "vllm==0.34.0": True}}]
    md = "\n".join(reports._md_lifecycle(life))
    assert "| F1 | shown | - |" in md and "| b on gfx942: new thing | - | fail |" in md
    assert "2 of 3 known findings shown by at least one subject; 1 failures no finding explains" in md
