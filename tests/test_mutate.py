"""``smv mutate``: cosmic-ray's mutants of a tiny module, judged through a stand-in for the zoo's subprocess audit
(the real audit runs in ``test_one_real_mutant``, slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("cosmic_ray", reason="smv mutate needs the mutate extra (pip install -e .[mutate])")

from contracts.cli import mutate
from contracts.zoo import runner as zoo_runner

TINY = '''\
def clamp(x, hi):
    if x > hi:
        return hi
    return x + 0
'''


@pytest.fixture()
def tiny_root(tmp_path):
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "__init__.py").write_text("")
    (tmp_path / "impl" / "tiny.py").write_text(TINY)
    return tmp_path


def fake_audit(calls):
    """Stands in for ``contracts.zoo.runner._audit``: the contract ``tiny-clamp`` fails when ``clamp`` lost its
    bound (run in-process: exec the mutated module)."""
    def audit(report, contracts, targets, *, budget, timeout, code_root, cwd, tree=None, findings=None):
        calls.append({"contracts": list(contracts), "code_root": code_root, "timeout": timeout})
        ns: dict = {}
        exec((Path(code_root) / "impl" / "tiny.py").read_text(), ns)
        try:
            ok = ns["clamp"](5, 3) == 3 and ns["clamp"](1, 3) == 1 and ns["clamp"](3, 3) == 3
        except Exception:  # noqa: BLE001 - a raising check is a failing row
            ok = False
        report.mkdir(parents=True)
        rows = [{"contract": c, "target": "generic", "status": "pass" if ok else "fail",
                 "reason": "" if ok else "clamp(5, 3) != 3"} for c in contracts]
        (report / "audit.json").write_text(json.dumps({"results": rows}))

        class P:
            returncode, stdout, stderr = 0, "", ""
        return P()
    return audit


def test_sites_and_ids_come_from_cosmic_ray(tiny_root):
    sites = mutate.enumerate_sites(tiny_root, ["impl/tiny.py"])
    ops = {s.operator for s in sites}
    assert "core/ReplaceComparisonOperator_Gt_GtE" in ops and "core/NumberReplacer" in ops
    s = next(s for s in sites if s.operator == "core/ReplaceComparisonOperator_Gt_GtE")
    src = (tiny_root / "impl" / "tiny.py").read_text()
    out = mutate.mutated_source(src, s)
    line, before, after = mutate.changed_lines(src, out)
    assert (line, before, after) == (2, "if x > hi:", "if x >= hi:")
    # the id names the changed text, not the occurrence: stable when other lines move
    assert mutate.mutant_id("impl/tiny.py", s.operator, before, after) == \
        mutate.mutant_id("impl/tiny.py", s.operator, before, after).lower()


def test_contract_map_is_derived_from_the_zoo_and_the_contract_modules():
    cmap = mutate.contract_map(zoo_runner.default_root())
    assert "decode-oracle-agreement" in cmap["impl/decode.py"]  # zoo file -> expect, and the subject family
    assert "split-bounds" in cmap["impl/splits.py"]
    assert "ue8m0-codec-exact" in cmap["impl/triton_helpers.py"]
    # a helper's code runs inside its callers: their contracts judge its mutants too
    assert "prefill-oracle-agreement" in cmap["impl/triton_helpers.py"]
    assert mutate.mutant_cap(90, 2) == 90 and mutate.mutant_cap(90, 20) == 450


def test_session_scores_writes_incrementally_and_honours_equivalents(tiny_root, tmp_path, monkeypatch):
    calls: list = []
    monkeypatch.setattr(zoo_runner, "_audit", fake_audit(calls))
    report = tmp_path / "rep"
    seen = []

    def progress(i, n, r):
        seen.append(json.loads((report / "mutate.json").read_text())["judged"])

    sites = mutate.enumerate_sites(tiny_root, ["impl/tiny.py"])
    # the Gt -> GtE mutant is equivalent for clamp (x == hi returns hi either way): recorded, so not run
    eq = tmp_path / "eq.toml"
    eq.write_text('[[equivalent]]\nmodule = "impl/tiny.py"\noperator = "core/ReplaceComparisonOperator_Gt_GtE"\n'
                  'before = "if x > hi:"\nafter = "if x >= hi:"\nwhy = "x == hi returns hi on both branches"\n')
    doc = mutate.run_session(len(sites), seed=1, root=tiny_root, modules=["impl/tiny.py"], cap=30, report=report,
                             equivalents=eq, cmap={"impl/tiny.py": ["tiny-clamp"]}, progress=progress)
    on_disk = json.loads((report / "mutate.json").read_text())
    assert on_disk["schema_version"] == mutate.MUTATE_SCHEMA_VERSION and on_disk["complete"] is True
    assert seen == list(range(1, len(seen) + 1))  # mutate.json already held each result when it was announced
    by_op = {r["operator"]: r for r in doc["results"]}
    assert by_op["core/ReplaceComparisonOperator_Gt_GtE"]["status"] == "equivalent"
    assert by_op["core/ReplaceComparisonOperator_Gt_Lt"]["status"] == "killed"
    line = mutate.progress_line(1, 1, mutate.MutantResult(**{**by_op["core/ReplaceComparisonOperator_Gt_Lt"],
                                                              "seconds": 0.5}))
    assert line.startswith("[1/1] killed") and "'if x > hi:' -> 'if x < hi:'" in line and "impl/tiny.py:2" in line
    assert all(c["contracts"] == ["tiny-clamp"] for c in calls)
    assert doc["killed"] + doc["survived"] + doc["equivalent"] + doc["incompetent"] + doc["error"] \
        + doc["timeout"] + doc["uncovered"] == len(doc["results"])
    assert doc["score"] == round(doc["killed"] / (doc["killed"] + doc["survived"]), 4)
    assert len(calls) == sum(r["status"] not in ("equivalent", "incompetent") for r in doc["results"])


def test_a_killed_session_keeps_what_it_judged(tiny_root, tmp_path, monkeypatch):
    monkeypatch.setattr(zoo_runner, "_audit", fake_audit([]))
    report = tmp_path / "rep"

    def stop(i, n, r):
        if i == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        mutate.run_session(10, seed=0, root=tiny_root, modules=["impl/tiny.py"], cap=30, report=report,
                           equivalents={}, cmap={"impl/tiny.py": ["tiny-clamp"]}, progress=stop)
    doc = json.loads((report / "mutate.json").read_text())
    assert doc["complete"] is False and doc["judged"] == 2 and len(doc["results"]) == 2


def test_timeout_and_uncovered(tiny_root, monkeypatch):
    import subprocess

    def slow(*a, **k):
        raise subprocess.TimeoutExpired("smv audit", 1)

    monkeypatch.setattr(zoo_runner, "_audit", slow)
    src = TINY
    site = mutate.enumerate_sites(tiny_root, ["impl/tiny.py"])[0]
    out = mutate.mutated_source(src, site)
    assert mutate.run_one(site, src, out, ["tiny-clamp"], root=tiny_root, cap=1).status == "timeout"
    assert mutate.run_one(site, src, out, [], root=tiny_root, cap=1).status == "uncovered"


def test_the_equivalents_file_parses():
    for e in mutate.load_equivalents().values():
        assert e["why"].strip()


@pytest.mark.slow
def test_one_real_mutant():
    """One cosmic-ray mutant of impl/splits.py through the real subprocess audit of split-bounds."""
    root = zoo_runner.default_root()
    src = (root / "impl" / "splits.py").read_text()
    site = next(s for s in mutate.enumerate_sites(root, ["impl/splits.py"])
                if s.operator == "core/NumberReplacer"
                and "GFX942_MAX_SPLITS = 16" in src.splitlines()[s.line - 1])
    r = mutate.run_one(site, src, mutate.mutated_source(src, site), ["split-bounds"], root=root, cap=120,
                       targets=["gfx942"])
    assert r.status == "killed", r.detail


# --- the Triton operators (contracts/cli/mutate_triton.py) ---------------------------------------------------------

TRITON_SRC = '''\
import math
import triton
import triton.language as tl

BLOCK_T = 64


@triton.jit(do_not_specialize=["n", "stride_x"])
def _k(x_ptr, stride_x, y_ptr, n, BLOCK: tl.constexpr = 32):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=0.0)
    w = tl.load(y_ptr + offs, mask=offs >= 0, other=float("-inf"))
    tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w, mask=offs < n)


def launch(x, y):
    if x.stride(1) != 1:
        raise ValueError(f"x: strides {x.stride(0)}")
    _k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=BLOCK_T)
'''


def _triton_mutants(op):
    from contracts.cli import mutate_triton

    out = []
    for name, occ, line in mutate_triton.positions(TRITON_SRC):
        if name == f"triton/{op}":
            new = mutate_triton.apply(TRITON_SRC, name, occ)
            ast_ok = compile(new, "t.py", "exec")  # every mutant still parses
            assert ast_ok is not None and new != TRITON_SRC
            out.append(mutate.changed_lines(TRITON_SRC, new)[1:])
    return out


@pytest.mark.parametrize("op, expected", [
    ("StrideToPackedWidth", [("_k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=BLOCK_T)",
                              "_k[(x.shape[0],)](x, __import__('math').prod((x).shape[1:]), y, x.shape[1], "
                              "BLOCK=BLOCK_T)")]),
    ("DropMask", [("v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=0.0)",
                   "v = tl.load(x_ptr + t * stride_x + offs)"),
                  ("w = tl.load(y_ptr + offs, mask=offs >= 0, other=float(\"-inf\"))", "w = tl.load(y_ptr + offs)"),
                  ("tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w, mask=offs < n)",
                   "tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w)")]),
    ("FlipMaskBound", [("v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=0.0)",
                        "v = tl.load(x_ptr + t * stride_x + offs, mask=offs <= n, other=0.0)"),
                       ("w = tl.load(y_ptr + offs, mask=offs >= 0, other=float(\"-inf\"))",
                        "w = tl.load(y_ptr + offs, mask=offs > 0, other=float(\"-inf\"))"),
                       ("tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w, mask=offs < n)",
                        "tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w, mask=offs <= n)")]),
    ("LoadOtherToNaN", [("v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=0.0)",
                         "v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=float(\"nan\"))")]),
    ("LoadOtherToOne", [("v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=0.0)",
                         "v = tl.load(x_ptr + t * stride_x + offs, mask=offs < n, other=1.0)")]),
    ("LoadOtherToZero", [("w = tl.load(y_ptr + offs, mask=offs >= 0, other=float(\"-inf\"))",
                          "w = tl.load(y_ptr + offs, mask=offs >= 0, other=0)")]),
    ("BlockSizeDouble", [("BLOCK_T = 64", "BLOCK_T = 128"),
                         ("def _k(x_ptr, stride_x, y_ptr, n, BLOCK: tl.constexpr = 32):",
                          "def _k(x_ptr, stride_x, y_ptr, n, BLOCK: tl.constexpr = 64):"),
                         ("_k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=BLOCK_T)",
                          "_k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=(BLOCK_T) * 2)")]),
    ("BlockSizeHalve", [("BLOCK_T = 64", "BLOCK_T = 32"),
                        ("def _k(x_ptr, stride_x, y_ptr, n, BLOCK: tl.constexpr = 32):",
                         "def _k(x_ptr, stride_x, y_ptr, n, BLOCK: tl.constexpr = 16):"),
                        ("_k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=BLOCK_T)",
                         "_k[(x.shape[0],)](x, x.stride(0), y, x.shape[1], BLOCK=(BLOCK_T) // 2)")]),
    ("DropInt64Widening", [("t = tl.program_id(0).to(tl.int64)", "t = tl.program_id(0)")]),
    ("Int64CastToInt32", [("t = tl.program_id(0).to(tl.int64)", "t = tl.program_id(0).to(tl.int32)"),
                          ("tl.store(y_ptr + tl.cast(t, tl.int64) + offs, v + w, mask=offs < n)",
                           "tl.store(y_ptr + tl.cast(t, tl.int32) + offs, v + w, mask=offs < n)")]),
    ("DropDoNotSpecialize", [("@triton.jit(do_not_specialize=[\"n\", \"stride_x\"])",
                              "@triton.jit(do_not_specialize=[\"stride_x\"])"),
                             ("@triton.jit(do_not_specialize=[\"n\", \"stride_x\"])",
                              "@triton.jit(do_not_specialize=[\"n\"])")]),
])
def test_each_triton_operator_finds_its_sites_and_rewrites_only_them(op, expected):
    # the order is the sites' order in the text; the stride checks in the if/raise are not sites
    assert sorted(_triton_mutants(op)) == sorted(expected)


def test_a_triton_rewrite_keeps_the_rest_of_the_file_byte_for_byte():
    from contracts.cli import mutate_triton

    src = TRITON_SRC.replace("mask=offs < n, other=0.0)", "mask=offs < n,   # keep me\n        other=0.0)")
    new = mutate_triton.apply(src, "triton/LoadOtherToOne", 0)
    assert new == src.replace("other=0.0)", "other=1.0)")
    assert mutate_triton.apply(src, "triton/LoadOtherToOne", 1) is None


def test_operators_select_the_families_and_the_sample_is_seeded(tmp_path):
    (tmp_path / "impl").mkdir()
    (tmp_path / "impl" / "k.py").write_text(TRITON_SRC)
    (tmp_path / "impl" / "tiny.py").write_text(TINY)
    mods = ["impl/k.py", "impl/tiny.py"]
    tri = mutate.enumerate_sites(tmp_path, mods, "triton")
    cr = mutate.enumerate_sites(tmp_path, mods, "cosmic-ray")
    both = mutate.enumerate_sites(tmp_path, mods, "all")
    assert tri and all(s.operator.startswith("triton/") and s.module == "impl/k.py" for s in tri)
    assert cr and not any(s.operator.startswith("triton/") for s in cr)
    assert [s.key for s in both] == [s.key for s in cr] + [s.key for s in tri]
    with pytest.raises(ValueError):
        mutate.families_of("pit")
    o1, o2 = (mutate.sample_order(both, 3105, ["cosmic-ray", "triton"]) for _ in range(2))
    assert o1 == o2 and sorted(o1) == list(range(len(both)))
    assert o1 != mutate.sample_order(both, 3106, ["cosmic-ray", "triton"])
    # the families alternate while both last; cosmic-ray alone draws exactly as before
    fams = [mutate.family(both[i].operator) for i in o1[:2 * min(len(cr), len(tri))]]
    assert fams == ["cosmic-ray", "triton"] * min(len(cr), len(tri))
    assert [cr[i].key for i in mutate.sample_order(cr, 7, ["cosmic-ray"])] == \
        [cr[i].key for i in (lambda o: (__import__("random").Random(7).shuffle(o), o)[1])(list(range(len(cr))))]


def test_a_triton_session_reports_its_family(tiny_root, tmp_path, monkeypatch):
    (tiny_root / "impl" / "k.py").write_text(TRITON_SRC)
    calls: list = []
    monkeypatch.setattr(zoo_runner, "_audit", fake_audit(calls))
    doc = mutate.run_session(4, seed=5, root=tiny_root, modules=["impl/k.py", "impl/tiny.py"], cap=30,
                             report=tmp_path / "r", equivalents={}, operators="triton",
                             cmap={"impl/k.py": ["tiny-clamp"], "impl/tiny.py": ["tiny-clamp"]})
    on_disk = json.loads((tmp_path / "r" / "mutate.json").read_text())
    assert on_disk["schema_version"] == 2 and on_disk["operators"] == ["triton"]
    assert set(on_disk["families"]) == {"triton"} and on_disk["families"]["triton"]["survived"] == 4
    assert len(doc["results"]) == 4 and all(r["operator"].startswith("triton/") for r in doc["results"])
    assert [r["id"] for r in doc["results"]] == [r["id"] for r in mutate.run_session(
        4, seed=5, root=tiny_root, modules=["impl/k.py", "impl/tiny.py"], cap=30, equivalents={},
        operators="triton", cmap={"impl/k.py": ["tiny-clamp"], "impl/tiny.py": ["tiny-clamp"]})["results"]]
