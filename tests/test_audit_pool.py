"""`smv audit --jobs N`: rows on real worker processes give the serial audit's verdicts, and a worker that crashes
or hangs makes its row an error with a reproducer while the other rows go on.

The planted faults are tests/planted_contracts.py's (SMV_CONTRACT_MODULES); each audit here is a real `smv audit`
process or run_audit with real workers."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from planted_env import ROOT
from planted_env import planted_env as _env

from contracts.engine import reports
from contracts.engine.audit import run_audit

def _audit_cmd(report, *args):
    return [sys.executable, "-m", "contracts.cli", "audit", "--report", str(report), "--no-progress", *args]


def _rows(doc):
    return {(r["contract"], r["target"]): r for r in doc["results"]}


def test_parallel_rows_give_the_serial_verdicts_cases_and_margins(tmp_path):
    common = dict(contract_ids=["fp8-codec-exact", "cache-layout-roundtrip", "decode-reduce-oracle"],
                  target_names=["gfx942", "generic"], budget=240, profile="dev", seed=7, max_cases=12,
                  progress=False)
    serial, code1 = run_audit(report_dir=str(tmp_path / "serial"), **common)
    pooled, code2 = run_audit(report_dir=str(tmp_path / "pooled"), jobs=2, **common)
    assert code1 == code2 == 0
    assert serial["run"]["jobs"] == 1 and pooled["run"]["jobs"] == 2
    a, b = _rows(serial), _rows(pooled)
    assert list(a) == list(b)  # the same rows, in the same order
    for k in a:
        for field in ("status", "pinned_cases", "generated_cases", "stopped_by", "margin", "violations"):
            assert a[k][field] == b[k][field], (k, field, a[k][field], b[k][field])
    assert b[("decode-reduce-oracle", "generic")]["status"] == "skipped"
    assert b[("fp8-codec-exact", "gfx942")]["generated_cases"] == 12  # the second pass ran in its worker
    # both are audit.json 8, which requires run.jobs
    for doc in (serial, pooled):
        assert doc["schema_version"] == reports.AUDIT_SCHEMA_VERSION >= 9
        assert reports.validate(doc, reports.audit_schema(reports.AUDIT_SCHEMA_VERSION)) == []
    stale = dict(pooled, run={k: v for k, v in pooled["run"].items() if k != "jobs"})
    assert any("jobs" in e for e in reports.validate(stale, reports.audit_schema(8)))
    # each worker kept its log beside the report
    logs = sorted((tmp_path / "pooled" / "workers").glob("a*/worker.log"))
    assert len(logs) == 2


def test_a_crashing_or_hanging_worker_is_an_error_row_with_a_reproducer_and_the_rest_pass(tmp_path):
    rep = tmp_path / "audit"
    t0 = time.monotonic()
    p = subprocess.run(_audit_cmd(rep, "--jobs", "2", "--case-timeout", "3", "--budget", "120", "--seed", "3",
                                  "--max-cases", "40", "--target", "gfx942", "--contract", "planted-segv",
                                  "--contract", "planted-stuck", "--contract", "cache-layout-roundtrip"),
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    doc = json.loads((rep / "audit.json").read_text())
    rows = _rows(doc)
    segv, hang = rows[("planted-segv", "gfx942")], rows[("planted-stuck", "gfx942")]
    assert segv["status"] == "error" and "SIGSEGV" in segv["reason"], segv
    assert hang["status"] == "error" and "hang" in hang["reason"] and "3s" in hang["reason"], hang
    assert rows[("cache-layout-roundtrip", "gfx942")]["status"] == "pass"
    assert doc["run"]["ok"] is False and "2 error" in doc["run"]["reason"]
    for r in (segv, hang):
        saved = json.loads(Path(r["repro"]).read_text())
        assert saved["schema_version"] == 4 and isinstance(saved["case"], int)
        if r is segv:
            assert saved["case"] % 10 == 7  # the value the planted fault fires on
        assert saved["outcome"]["kind"] == ("crash" if r is segv else "hang")
    # the crash's reproducer replays as a crash, in a subprocess
    rp = subprocess.run([sys.executable, "-m", "contracts.cli", "repro", segv["repro"]], env=_env(),
                        capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert rp.returncode == 1 and "CRASH reproduced" in rp.stdout + rp.stderr, rp.stdout + rp.stderr
    assert time.monotonic() - t0 < 250


def _warm_rows_beside(tmp_path, *pooled_args):
    """Audit planted-warm on gfx942 and gfx950 serially, then on two workers beside ``pooled_args``' rows; the pooled
    planted-warm rows must give the serial run's verdicts and cases (nothing cut short by what happened beside them).
    Returns the pooled run's process and rows."""
    args = ("--budget", "120", "--seed", "5", "--max-cases", "40", "--target", "gfx942", "--target", "gfx950")
    serial = tmp_path / "serial"
    subprocess.run(_audit_cmd(serial, *args, "--contract", "planted-warm"), env=_env(),
                   capture_output=True, text=True, timeout=300, cwd=ROOT)
    want = _rows(json.loads((serial / "audit.json").read_text()))
    rep = tmp_path / "pooled"
    p = subprocess.run(_audit_cmd(rep, *args, "--jobs", "2", "--contract", "planted-warm", *pooled_args),
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    rows = _rows(json.loads((rep / "audit.json").read_text()))
    for t in ("gfx942", "gfx950"):
        got, exp = rows[("planted-warm", t)], want[("planted-warm", t)]
        assert exp["generated_cases"] > 1 and exp["stopped_by"] != "budget", exp
        for k in ("status", "pinned_cases", "generated_cases", "stopped_by", "violations"):
            assert got[k] == exp[k], (t, k, got, exp)
    return p, rows


def test_rows_held_by_a_worker_that_dies_run_again_whole_with_the_serial_cases(tmp_path):
    """A worker keeps each row's first pass for its second; when it dies on another row, those rows run again whole
    on a new worker, so a crash in one row never cuts another row's cases short. Each of the two workers takes one
    of planted-warm's rows (its first case takes 2.5 s) and holds it; the first to finish takes planted-stuck and is
    killed as hung."""
    p, rows = _warm_rows_beside(tmp_path, "--case-timeout", "5", "--contract", "planted-stuck")
    assert rows[("planted-stuck", "gfx942")]["status"] == "error"
    assert "in place of" in p.stderr  # the hung worker was replaced, to run the row it held again


def test_a_row_that_loses_the_device_fails_alone_and_the_rows_after_it_get_a_fresh_worker(tmp_path):
    """A row whose check meets a sticky device error (an illegal access: on a GPU every later launch in that process
    fails with it) fails with the error and its reproducer; its worker exits once it has answered and a fresh one
    takes the rows after it, which pass, and the rows it held run again with the serial cases. Serially the rows
    after it are incomplete, saying why, instead of failing with an error that is not theirs (an H100 audit of
    vLLM 0.34.0 failed 11 rows of one worker with one illegal access)."""
    p, rows = _warm_rows_beside(tmp_path, "--contract", "planted-lost-device", "--contract", "cache-layout-roundtrip")
    lost = rows[("planted-lost-device", "gfx942")]
    assert lost["status"] == "fail" and "illegal memory access" in lost["reason"] and lost["repro"]
    assert "lost its device context after this row" in p.stderr and "planted-lost-device on gfx942" in p.stderr, \
        p.stderr[-3000:]
    for t in ("gfx942", "gfx950"):
        assert rows[("cache-layout-roundtrip", t)]["status"] == "pass", rows[("cache-layout-roundtrip", t)]
    one = tmp_path / "serial-lost"
    p = subprocess.run(_audit_cmd(one, "--budget", "60", "--seed", "5", "--max-cases", "5", "--target", "gfx942",
                                  "--contract", "planted-lost-device", "--contract", "cache-layout-roundtrip"),
                       env=_env(), capture_output=True, text=True, timeout=300, cwd=ROOT)
    rows = _rows(json.loads((one / "audit.json").read_text()))
    assert rows[("planted-lost-device", "gfx942")]["status"] == "fail"
    after = rows[("cache-layout-roundtrip", "gfx942")]
    assert after["status"] == "incomplete" and "device context lost" in after["reason"], after
    assert "--jobs 2" in after["reason"] and "left the device context lost" in p.stderr


def test_workers_that_die_before_they_are_ready_end_the_audit_with_one_line(tmp_path):
    """Three workers in a row dying at start (here: a contract module that exits in workers) is exit 2 with one
    line naming the last worker's log, not a traceback and not a silent wait."""
    p = subprocess.run(_audit_cmd(tmp_path / "audit", "--jobs", "2", "--budget", "60", "--target", "gfx942",
                                  "--contract", "cache-layout-roundtrip"),
                       env=_env(SMV_CONTRACT_MODULES="planted_dead_worker"), capture_output=True, text=True,
                       timeout=200, cwd=ROOT)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "3 audit workers in a row died before they could take a row" in p.stderr, p.stderr
    assert "worker.log" in p.stderr and "Traceback" not in p.stderr


def _workers_of(report: Path) -> list[int]:
    pids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().decode(errors="replace")
            state = next(ln for ln in (d / "status").read_text().splitlines() if ln.startswith("State:"))
        except (OSError, StopIteration):
            continue
        if "campaign_worker" in cmd and str(report) in cmd and "zombie" not in state:
            pids.append(int(d.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc to find the worker processes")
def test_a_terminated_audit_keeps_its_rows_and_leaves_no_worker(tmp_path):
    rep = tmp_path / "audit"
    proc = subprocess.Popen(_audit_cmd(rep, "--jobs", "2", "--budget", "200", "--seed", "1", "--target", "gfx942",
                                       "--contract", "cache-layout-roundtrip", "--contract", "planted-stuck"),
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:  # until the quick row is on disk and the hanging one is running
        try:
            doc = json.loads((rep / "audit.json").read_text())
            if _rows(doc)[("cache-layout-roundtrip", "gfx942")]["status"] == "pass" and _workers_of(rep):
                break
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.5)
    else:
        proc.kill()
        pytest.fail("the audit never finished its quick row")
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, out
    doc = json.loads((rep / "audit.json").read_text())
    assert doc["run"]["finished"] is False
    rows = _rows(doc)
    assert rows[("cache-layout-roundtrip", "gfx942")]["status"] == "pass"
    # the row cut by the signal is not reached, never a finding: the user's signal is not the code's hang
    assert rows[("planted-stuck", "gfx942")]["status"] == "incomplete"
    assert doc["run"]["ok"] is False
    end = time.monotonic() + 15
    while _workers_of(rep) and time.monotonic() < end:
        time.sleep(0.3)
    assert _workers_of(rep) == []


def test_jobs_must_be_a_positive_count():
    with pytest.raises(ValueError, match="jobs"):
        run_audit(["fp8-codec-exact"], ["generic"], budget=5, jobs=0, progress=False)
    p = subprocess.run([sys.executable, "-m", "contracts.cli", "audit", "--jobs", "0"], capture_output=True,
                       text=True, cwd=ROOT, env=_env())
    assert p.returncode == 2 and "--jobs" in p.stderr
