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
    """Stands in for ``contracts.cli.mutate.audit_until_fail`` (the zoo's subprocess audit, stopped at the first
    failed row): the contract ``tiny-clamp`` fails when ``clamp`` lost its bound (run in-process: exec the mutated
    module)."""
    def audit(report, contracts, targets, *, budget, timeout, code_root, findings=None, cwd=None):
        calls.append({"contracts": list(contracts), "code_root": code_root, "timeout": timeout,
                      "baseline": cwd is not None})
        ns: dict = {}
        exec((Path(code_root) / "impl" / "tiny.py").read_text(), ns)
        try:
            ok = ns["clamp"](5, 3) == 3 and ns["clamp"](1, 3) == 1 and ns["clamp"](3, 3) == 3
        except Exception:  # noqa: BLE001 - a raising check is a failing row
            ok = False
        rows = [{"contract": c, "target": "generic", "status": "pass" if ok else "fail",
                 "reason": "" if ok else "clamp(5, 3) != 3"} for c in contracts]
        return mutate.AuditOutcome(0, "", rows, "" if ok else "first-fail")
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
    monkeypatch.setattr(mutate, "audit_until_fail", fake_audit(calls))
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
    judged = [c for c in calls if not c["baseline"]]
    assert len(judged) == sum(r["status"] not in ("equivalent", "incompetent") for r in doc["results"])
    assert len(calls) - len(judged) == 1  # the unmutated tiny-clamp row, measured once when a kill rested on it


def test_a_killed_session_keeps_what_it_judged(tiny_root, tmp_path, monkeypatch):
    monkeypatch.setattr(mutate, "audit_until_fail", fake_audit([]))
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
    def slow(*a, **k):
        return mutate.AuditOutcome(None, "", None, "timeout")

    monkeypatch.setattr(mutate, "audit_until_fail", slow)
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
    monkeypatch.setattr(mutate, "audit_until_fail", fake_audit(calls))
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


# --- judging cheaper: stopped at the first failed row, contracts ordered by kills, --jobs, --budget, SIGTERM --------

@pytest.fixture(autouse=True)
def _no_stop_left_over():
    yield
    mutate._STOP.clear()
    mutate._STOP_WHY[0] = ""


ROWS_THEN_SLEEP = '''\
import json, os, sys, time
rep = sys.argv[1]
os.makedirs(rep, exist_ok=True)
open(os.path.join(rep, "pid"), "w").write(str(os.getpid()))
def save(rows):
    open(os.path.join(rep, "audit.json.tmp"), "w").write(json.dumps({"results": rows}))
    os.replace(os.path.join(rep, "audit.json.tmp"), os.path.join(rep, "audit.json"))
rows = [{"contract": "a", "target": "generic", "status": "pass", "reason": ""}]
save(rows)
time.sleep(0.3)
if sys.argv[2] == "fail":
    save(rows + [{"contract": "b", "target": "generic", "status": "fail", "reason": "b broke"}])
time.sleep(60)
'''


def _gone(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _watch(tmp_path, mode, timeout=30.0):
    import sys
    import time

    script = tmp_path / "audit.py"
    script.write_text(ROWS_THEN_SLEEP)
    rep = tmp_path / "rep"
    t0 = time.monotonic()
    out = mutate.watch([sys.executable, str(script), str(rep), mode], env=dict(__import__("os").environ),
                       cwd=tmp_path, report=rep, timeout=timeout)
    return out, time.monotonic() - t0, int((rep / "pid").read_text())


def test_an_audit_is_stopped_at_its_first_failed_row(tmp_path):
    out, took, pid = _watch(tmp_path, "fail")
    assert out.stopped == "first-fail" and took < 15 and _gone(pid)
    assert [r["status"] for r in out.rows] == ["pass", "fail"]
    res = mutate.judge(mutate.MutantResult("m", "impl/x.py", "op", 0, 1, "a", "b", "error", ["a", "b"]), out, 30)
    assert res.status == "killed" and res.fired == ["b"] and res.detail.startswith("b on generic: b broke")


def test_an_audit_past_its_cap_is_a_timeout_and_its_process_group_is_gone(tmp_path):
    out, took, pid = _watch(tmp_path, "pass", timeout=2.0)
    assert out.stopped == "timeout" and took < 15 and _gone(pid)
    res = mutate.judge(mutate.MutantResult("m", "impl/x.py", "op", 0, 1, "a", "b", "error", ["a"]), out, 2)
    assert res.status == "timeout"


def test_a_stopped_session_kills_the_running_audits(tmp_path):
    import threading

    threading.Timer(1.0, mutate.stop_all, ("budget",)).start()
    out, took, pid = _watch(tmp_path, "pass")
    assert out.stopped == "interrupted" and took < 15 and _gone(pid)
    blank = mutate.MutantResult("m", "impl/x.py", "op", 0, 1, "a", "b", "error", ["a"])
    assert mutate.judge(blank, out, 30).status == "error"  # cut by the budget: no verdict, recorded
    mutate._STOP_WHY[0] = "signal"
    assert mutate.judge(blank, out, 30).status == "interrupted"  # cut by a signal: not recorded


def test_each_mutant_has_its_own_triton_cache(tmp_path, monkeypatch):
    seen = {}

    def fake_watch(cmd, *, env, cwd, report, timeout):
        seen.update(env=env, cmd=cmd, cwd=cwd)
        return mutate.AuditOutcome(0, "", [], "")

    monkeypatch.setattr(mutate, "watch", fake_watch)
    mutate.audit_until_fail(tmp_path / "report", ["b", "a"], ["gfx942"], budget=10, timeout=20, code_root=tmp_path,
                            findings=None)
    assert seen["env"]["TRITON_CACHE_DIR"] == str(tmp_path / ".triton-cache") and seen["cwd"] == tmp_path
    assert seen["env"]["PYTHONPATH"].startswith(str(tmp_path))
    c = seen["cmd"]
    assert "--first-violation" in c and [c[i + 1] for i, x in enumerate(c) if x == "--contract"] == ["b", "a"]


def test_contracts_are_ordered_by_their_kills(tmp_path):
    rep = tmp_path / "old.json"
    rep.write_text(json.dumps({"results": [{"module": "impl/x.py", "fired": ["c"]},
                                           {"module": "impl/y.py", "fired": ["b"]},
                                           {"module": "impl/y.py", "fired": ["b"]}]}))
    h = mutate.kill_history([rep], zoo=False)
    assert mutate.order_contracts(["a", "b", "c"], "impl/x.py", h) == ["c", "b", "a"]
    assert mutate.order_contracts(["a", "b", "c"], "impl/z.py", h) == ["b", "c", "a"]
    assert mutate.order_contracts(["a", "b"], "impl/z.py", {}) == ["a", "b"]
    # a contract measured running the mutated function goes first
    assert mutate.order_contracts(["a", "b", "c"], "impl/x.py", h, reached=["a"]) == ["a", "c", "b"]
    src = "import triton\n\nX = 1\n\n\n@triton.jit(\n    do_not_specialize=['n'])\ndef k(n):\n    return n\n"
    assert [mutate.enclosing_function(src, i) for i in (3, 6, 7, 9)] == [None, "k", "k", "k"]
    # reached_by reads the measured record (tests/entry_points.json) for the function holding the line
    root = zoo_runner.default_root()
    record = json.loads((root / "tests" / "entry_points.json").read_text())["exercised"]
    dec = (root / "impl" / "decode.py").read_text()
    lines = {t.split("(")[0][4:]: i for i, t in enumerate(dec.splitlines(), 1) if t.startswith("def ")}
    name = next(k.split(".", 1)[1] for k in record if k.startswith("decode.") and k.split(".", 1)[1] in lines)
    assert mutate.reached_by(root, "impl/decode.py", dec, lines[name] + 1) == record[f"decode.{name}"]
    assert mutate.reached_by(root, "impl/decode.py", dec, 1) == []  # module level: no function, no record
    zoo = mutate.kill_history()  # the zoo's planted bugs count as kills of their file
    assert any(k[0] == "impl/decode.py" for k in zoo) and all(v > 0 for v in zoo.values())


def test_jobs_run_side_by_side_each_in_its_own_snapshot(tiny_root, tmp_path, monkeypatch):
    import threading
    import time

    spans, lock = [], threading.Lock()

    def audit(report, contracts, targets, *, budget, timeout, code_root, findings=None, cwd=None):
        t0 = time.monotonic()
        src = (Path(code_root) / "impl" / "tiny.py").read_text()
        time.sleep(0.4)
        assert (Path(code_root) / "impl" / "tiny.py").read_text() == src  # nobody else wrote into this copy
        with lock:
            spans.append((t0, time.monotonic(), str(code_root), src))
        return mutate.AuditOutcome(0, "", [{"contract": "tiny-clamp", "target": "generic", "status": "pass",
                                            "reason": ""}], "")

    monkeypatch.setattr(mutate, "audit_until_fail", audit)
    doc = mutate.run_session(4, seed=2, root=tiny_root, modules=["impl/tiny.py"], cap=30, equivalents={},
                             cmap={"impl/tiny.py": ["tiny-clamp"]}, jobs=2, operators="cosmic-ray")
    assert doc["judged"] == 4 and len(spans) == 4
    assert len({s[2] for s in spans}) == 4 and len({s[3] for s in spans}) == 4  # 4 snapshots, 4 mutated sources
    spans.sort()
    assert any(b[0] < a[1] for a, b in zip(spans, spans[1:]))  # two audits overlapped in time
    assert not any(Path(s[2]).exists() for s in spans)  # every snapshot was removed


def test_the_budget_ends_the_session_and_records_what_it_cut(tiny_root, tmp_path, monkeypatch):
    def audit(report, contracts, targets, *, budget, timeout, code_root, findings=None, cwd=None):
        mutate._STOP.wait(20)
        return mutate.AuditOutcome(None, "", None, "interrupted")

    monkeypatch.setattr(mutate, "audit_until_fail", audit)
    doc = mutate.run_session(5, seed=2, root=tiny_root, modules=["impl/tiny.py"], cap=30, equivalents={},
                             cmap={"impl/tiny.py": ["tiny-clamp"]}, jobs=2, operators="cosmic-ray", budget=1.0,
                             report=tmp_path / "r")
    on_disk = json.loads((tmp_path / "r" / "mutate.json").read_text())
    assert doc["seconds"] < 15 and on_disk["complete"] is False and doc["not_started"] == 3
    assert [r["status"] for r in on_disk["results"]] == ["error", "error"] and on_disk["score"] is None
    assert all("budget" in r["detail"] for r in on_disk["results"])


SIGTERM_DRIVER = '''\
import sys, json, argparse
from pathlib import Path
from contracts.cli import mutate
root, rep, script = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
calls = []
def audit(report, contracts, targets, *, budget, timeout, code_root, findings=None, cwd=None):
    if cwd is not None:  # the unmutated row a kill rests on: it passes
        return mutate.AuditOutcome(0, "", [{"contract": "tiny-clamp", "target": "generic", "status": "pass",
                                            "reason": ""}], "")
    calls.append(1)
    if len(calls) == 1:
        return mutate.AuditOutcome(0, "", [{"contract": "tiny-clamp", "target": "generic", "status": "fail",
                                            "reason": "x"}], "first-fail")
    return mutate.watch([sys.executable, script, str(Path(rep) / ("child%d" % len(calls))), "pass"],
                        env=dict(__import__("os").environ), cwd=code_root, report=Path(report), timeout=timeout)
mutate.audit_until_fail = audit
mutate.contract_map = lambda root: {"impl/tiny.py": ["tiny-clamp"]}
import contracts.zoo.runner as zr
zr.default_root = lambda: root
args = argparse.Namespace(sample=6, seed=2, module=["impl/tiny.py"], cap=60.0, report=rep, equivalents=None,
                          jobs=2, target=None, operators="cosmic-ray", budget=None, history=None, triage=None,
                          no_progress=True)
sys.exit(mutate.main_cli(args))
'''


def test_sigterm_leaves_a_valid_report_and_no_audit_behind(tiny_root, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    (tmp_path / "driver.py").write_text(SIGTERM_DRIVER)
    (tmp_path / "audit.py").write_text(ROWS_THEN_SLEEP)
    rep = tmp_path / "rep"
    p = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(tiny_root), str(rep),
                          str(tmp_path / "audit.py")], cwd=zoo_runner.default_root())
    deadline = time.monotonic() + 60
    while len(list(rep.glob("child*/pid"))) < 2 and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    pids = [int(f.read_text()) for f in rep.glob("child*/pid")]
    assert len(pids) == 2, "the driver did not reach two running audits"
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=30) == 128 + signal.SIGTERM
    time.sleep(0.2)
    assert all(_gone(pid) for pid in pids)
    doc = json.loads((rep / "mutate.json").read_text())
    assert doc["complete"] is False and doc["judged"] == 1 and doc["results"][0]["status"] == "killed"
    assert not [n for n in os.listdir(rep) if n.endswith(".tmp")]


def test_triage_lists_survivors_with_their_diff_and_equivalence():
    doc = {"results": [
        {"id": "tiny-1", "status": "survived", "operator": "core/X", "module": "impl/tiny.py", "line": 2,
         "before": "if x > hi:", "after": "if x >= hi:", "detail": ""},
        {"id": "tiny-2", "status": "killed", "operator": "core/Y", "module": "impl/tiny.py", "line": 3,
         "before": "a", "after": "b", "detail": ""},
        {"id": "tiny-3", "status": "timeout", "operator": "triton/DropMask", "module": "impl/tiny.py", "line": 4,
         "before": "c", "after": "d", "detail": "time cap of 9s ran out"}]}
    lines = mutate.triage_lines(doc, {"tiny-1": {"why": "x == hi returns hi either way"}})
    assert lines[0].startswith("survived tiny-1  core/X  impl/tiny.py:2  recorded equivalent: x == hi")
    assert lines[1:3] == ["    - if x > hi:", "    + if x >= hi:"]
    assert lines[3].startswith("timeout tiny-3  triton/DropMask  impl/tiny.py:4  not recorded equivalent")
    assert "tiny-2" not in "\n".join(lines) and lines[-1] == "    (time cap of 9s ran out)"


def test_a_kill_by_a_contract_that_fails_without_the_mutant_is_void(tiny_root, tmp_path, monkeypatch):
    calls: list = []
    judge_clamp = fake_audit(calls)

    def audit(report, contracts, targets, *, budget, timeout, code_root, findings=None, cwd=None):
        calls.append({"contracts": list(contracts), "baseline": cwd is not None})
        if "always-fails" in contracts:  # broken whatever the code: its row fails first
            return mutate.AuditOutcome(0, "", [{"contract": "always-fails", "target": "generic", "status": "fail",
                                                "reason": "broken"}], "first-fail")
        return judge_clamp(report, contracts, targets, budget=budget, timeout=timeout, code_root=code_root)

    monkeypatch.setattr(mutate, "audit_until_fail", audit)
    doc = mutate.run_session(6, seed=1, root=tiny_root, modules=["impl/tiny.py"], cap=30, equivalents={},
                             cmap={"impl/tiny.py": ["always-fails", "tiny-clamp"]}, operators="cosmic-ray")
    by_status = {r["status"] for r in doc["results"]}
    assert by_status <= {"killed", "survived", "incompetent"} and "killed" in by_status
    # without the baseline every one would be killed by always-fails' row
    assert all(r["fired"] == ["tiny-clamp"] for r in doc["results"] if r["status"] == "killed")
    assert all("left out, failing without any mutant: always-fails" in r["detail"] for r in doc["results"]
               if r["status"] in ("killed", "survived"))
    # each row a kill rested on was measured unmutated once: always-fails (then left out), tiny-clamp (passes)
    assert sorted(c["contracts"][0] for c in calls if c.get("baseline")) == ["always-fails", "tiny-clamp"]
    # the unmutated code passes tiny-clamp: a mutant's own run is what kills
    assert mutate.Baseline(tiny_root, 30, None).fails("tiny-clamp", "generic") is False


def test_the_gpu_script_parses_and_refuses_a_host_without_cuda(tmp_path):
    """ci/mutate_gpu.sh: valid bash, and on a host without CUDA it refuses (unless SMV_MUTATE_ALLOW_CPU=1) before
    any mutant runs, leaving at most three files (the dry run on CPU is the lead's and the README's)."""
    import os
    import subprocess

    torch = pytest.importorskip("torch")
    root = zoo_runner.default_root()
    script = root / "ci" / "mutate_gpu.sh"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    if torch.cuda.is_available():
        pytest.skip("a CUDA host runs the script for real")
    env = {**os.environ, "SMV_MUTATE_NO_INSTALL": "1"}
    env.pop("SMV_MUTATE_ALLOW_CPU", None)
    p = subprocess.run(["bash", str(script), str(tmp_path / "out")], cwd=root, env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "refused: no CUDA device with native Triton" in (tmp_path / "out" / "summary.txt").read_text()
    assert len(os.listdir(tmp_path / "out")) <= 3
