"""`smv fuzz` with real processes: workers that crash and hang on planted faults, a supervisor SIGKILLed and
resumed, workers sharing a directory example database, shards sharing a real Redis server, and `smv fuzz merge`.

The planted faults live in tests/planted_contracts.py; every campaign here runs as its own `smv fuzz` process
(so the contracts are imported by the supervisor and by each worker exactly as a team's own would be), never in
the pytest process."""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from planted_env import ROOT
from planted_env import planted_env as _env

from contracts.engine.campaign import failure_signature, mask_numbers, parse_duration, parse_shard



@pytest.mark.parametrize("text,seconds", [("8h", 28800), ("30m", 1800), ("90s", 90), ("1h30m", 5400), ("12", 12),
                                          (2.5, 2.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "8x", "h", "-3", "0"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="budget"):
        parse_duration(bad)


def test_parse_shard():
    assert parse_shard("2/8") == (2, 8) and parse_shard(" 1 / 1 ") == (1, 1) and parse_shard(None) is None
    for bad in ("0/4", "5/4", "2", "a/b", "2/0", "-1/3"):
        with pytest.raises(ValueError, match="shard"):
            parse_shard(bad)


def test_signature_masks_numbers_only():
    a = {"subject": "ours", "contract": "c", "target": "gfx942", "status": "fail",
         "violations": [{"message": "out[3, 17] = 1.5e-02 differs from 0.25 by 0x1f"}]}
    b = dict(a, violations=[{"message": "out[0, 2] = -7 differs from 3.0 by 0x2"}])
    assert mask_numbers(a["violations"][0]["message"]) == "out[#, #] = # differs from # by #"
    assert failure_signature(a) == failure_signature(b)
    assert failure_signature(a) != failure_signature(dict(b, target="gfx950"))
    assert failure_signature(a) != failure_signature(dict(b, status="crash"))
    assert failure_signature(a) != failure_signature(dict(b, violations=[{"message": "out[0] is NaN"}]))


# --- real campaigns --------------------------------------------------------------------------------------------


def _fuzz_cmd(report, *args):
    return [sys.executable, "-m", "contracts.cli", "fuzz", "--report", str(report), *args]


def _fuzz(report, *args, timeout=180, **env):
    return subprocess.run(_fuzz_cmd(report, *args), env=_env(**env), capture_output=True, text=True, timeout=timeout,
                          cwd=ROOT)


def _doc(report) -> dict:
    return json.loads((Path(report) / "campaign.json").read_text())


def _journal(report) -> list[dict]:
    out = []
    for line in (Path(report) / "journal.jsonl").read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return out


def _items(report) -> list[dict]:
    return [x["item"] for x in _journal(report) if "item" in x]


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fh:
            state = next(ln for ln in fh if ln.startswith("State:"))
        return " Z " not in state and "zombie" not in state
    except (FileNotFoundError, StopIteration):
        return False


def test_a_row_that_loses_the_device_is_a_failure_and_its_worker_is_replaced_between_rows(tmp_path):
    """A check that meets a sticky device error (on a GPU, every later launch in that process fails with it) is a
    failure of its row, answered; its worker then exits on purpose and a fresh one takes the next row, so the other
    row never inherits the error and no crash is recorded."""
    rep = tmp_path / "camp"
    r = _fuzz(rep, "--budget", "12", "--round", "2", "--jobs", "2", "--seed", "3", "--target", "gfx942",
              "--contract", "planted-lost-device", "--contract", "cache-layout-roundtrip",
              "--database", str(tmp_path / "db"))
    assert r.returncode == 1, r.stderr
    doc = _doc(rep)
    assert [f["contract"] for f in doc["failures"]] == ["planted-lost-device"], doc["failures"]
    assert doc["failures"][0]["status"] == "fail" and "illegal memory access" in doc["failures"][0]["reason"]
    assert "lost its device context after this row" in r.stderr and "in place of" in r.stderr, r.stderr[-2000:]
    statuses = [w["status"] for w in doc["workers"]]
    assert "exited" in statuses and "crashed" not in statuses, statuses
    assert not [w for w in doc["workers"] if _alive(w["pid"])]


def test_crashes_and_hangs_are_findings_with_reproducers_and_the_campaign_goes_on(tmp_path):
    rep = tmp_path / "camp"
    budget = 16  # under a loaded CI host worker restarts take seconds: room for every fault and a second round
    t0 = time.monotonic()
    r = _fuzz(rep, "--budget", str(budget), "--round", "3", "--jobs", "2", "--case-timeout", "2", "--seed", "3",
              "--contract", "planted-abort", "--contract", "planted-segv", "--contract", "planted-hang",
              "--database", str(tmp_path / "db"))
    wall = time.monotonic() - t0
    assert r.returncode == 1, r.stderr
    doc = _doc(rep)
    assert doc["schema_version"] == 4 and doc["finished"] and doc["sessions"][-1]["ended"] == "budget"
    assert wall < budget + 60, wall  # the budget, one hang's limit, worker starts
    by = {f["contract"]: f for f in doc["failures"]}
    assert by["planted-abort"]["status"] == "crash" and "SIGABRT" in by["planted-abort"]["reason"]
    assert by["planted-segv"]["status"] == "crash" and "SIGSEGV" in by["planted-segv"]["reason"]
    assert by["planted-hang"]["status"] == "hang" and "time limit of 2s" in by["planted-hang"]["reason"]
    # each fault ended its worker, a new one took the next row: the rounds went on past the first faults
    statuses = [w["status"] for w in doc["workers"]]
    assert statuses.count("crashed") >= 2 and "hung" in statuses, statuses
    assert doc["rounds"] >= 2 and len({w["id"] for w in doc["workers"]}) == len(doc["workers"])
    assert all(f["occurrences"] >= 1 for f in doc["failures"])
    wants = (("planted-abort", "CRASH reproduced: the replay died (SIGABRT)"),
             ("planted-segv", "CRASH reproduced: the replay died (SIGSEGV)"),
             ("planted-hang", "HANG reproduced: no verdict within 2s"))
    replays = {}
    for cid, _ in wants:  # the three replays run at once
        saved = json.loads(Path(by[cid]["repro"]).read_text())
        assert saved["case"] % 10 == 7 and saved["outcome"]["kind"] in ("crash", "hang")
        replays[cid] = subprocess.Popen([sys.executable, "-m", "contracts.cli", "repro", by[cid]["repro"]],
                                        env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                        cwd=ROOT)
    for cid, want in wants:
        out, err = replays[cid].communicate(timeout=120)
        assert replays[cid].returncode == 1 and want in out, out + err
    # no worker outlived the campaign
    assert not [w for w in doc["workers"] if _alive(w["pid"])]


def test_sigkilled_supervisor_resumes_without_losing_or_recounting_anything(tmp_path):
    rep = tmp_path / "camp"
    args = ["--round", "2", "--jobs", "2", "--seed", "11", "--contract", "planted-odd", "--contract", "planted-slow",
            "--database", str(tmp_path / "db")]
    proc = subprocess.Popen(_fuzz_cmd(rep, "--budget", "300", *args), env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if (rep / "journal.jsonl").exists() and any(i["status"] == "fail" for i in _items(rep)) \
                and len(_items(rep)) >= 4:
            break
        time.sleep(0.2)
    else:
        proc.kill()
        pytest.fail("the campaign finished no row within 120 s")
    pids = [w["pid"] for w in _doc(rep)["workers"]]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _items(rep)
    found = {(i["failure"]["contract"], i["failure"]["target"]) for i in before if i["failure"]}
    # the workers die with their supervisor
    gone_by = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < gone_by:
        time.sleep(0.1)
    assert pids and not [p for p in pids if _alive(p)], "worker processes outlived their SIGKILLed supervisor"
    # the lock died with its owner: the same command resumes
    r = _fuzz(rep, "--budget", "10", *args)  # the budget includes starting the workers again
    assert r.returncode == 1 and "resuming" in r.stderr, r.stderr
    doc = _doc(rep)
    after = _items(rep)
    gs = [i["g"] for i in after]
    assert len(gs) == len(set(gs)), "an item was run twice"
    assert len(after) > len(before) and after[:len(before)] == before
    assert sum(doc["cases"].values()) == sum(i["cases"] for i in after)
    kept = {(f["contract"], f["target"]) for f in doc["failures"]}
    assert found and found <= kept
    assert [s["ended"] for s in doc["sessions"]] == ["budget"] and doc["finished"]
    assert doc["sessions"][0]["budget"] == 10  # the budget counts from the resume


def test_a_worker_killed_from_outside_is_replaced_and_its_row_runs_again(tmp_path):
    rep = tmp_path / "camp"
    args = ["--round", "4", "--jobs", "1", "--seed", "2", "--contract", "planted-slow", "--target", "gfx942",
            "--database", str(tmp_path / "db")]
    proc = subprocess.Popen(_fuzz_cmd(rep, "--budget", "40", *args), env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        victim = None
        while time.monotonic() < deadline and victim is None:
            if (rep / "campaign.json").exists():
                running = [w for w in _doc(rep)["workers"] if w["status"] == "running"]
                victim = running[0]["pid"] if running else None
            time.sleep(0.2)
        assert victim, "no worker took a row within 90 s"
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        time.sleep(3)
    finally:
        proc.send_signal(signal.SIGINT)
        err = proc.communicate(timeout=60)[1]
    doc = _doc(rep)
    assert "was killed from outside (SIGKILL)" in err and "the row runs again" in err, err
    assert doc["failures"] == [] and "killed" in [w["status"] for w in doc["workers"]]
    assert [i["g"] for i in _items(rep)][:1] == [0]  # the killed row ran again and finished


def test_a_live_campaign_owns_its_directory(tmp_path):
    rep = tmp_path / "camp"
    args = ["--round", "2", "--jobs", "1", "--contract", "planted-slow", "--target", "gfx942"]
    proc = subprocess.Popen(_fuzz_cmd(rep, "--budget", "60", *args), env=_env(), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (rep / ".lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        r = _fuzz(rep, "--budget", "5", *args)
        assert r.returncode == 2 and "in use by a running campaign" in r.stderr, r.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert _doc(rep)["sessions"][-1]["ended"] == "SIGTERM"


def test_two_workers_share_one_directory_database(tmp_path):
    """Rows alternate between a slow passing row and a rare failure: one worker finds and saves the failure while
    the other is busy with the slow row, and when that other worker meets the failing row for the first time it
    fails on its first case, which only the shared folder could have given it."""
    from hypothesis.database import DirectoryBasedExampleDatabase

    from contracts.engine.runner import database_key

    rep, db = tmp_path / "camp", tmp_path / "db"
    r = _fuzz(rep, "--budget", "12", "--round", "8", "--jobs", "2", "--seed", "0", "--contract", "planted-slow",
              "--contract", "planted-rare", "--target", "gfx950", "--database", str(db))
    assert r.returncode == 1, r.stderr
    items = sorted(_items(rep), key=lambda i: i["started"])
    rare = [i for i in items if i["key"] == "planted-rare/gfx950"]
    assert rare and rare[0]["status"] == "fail" and rare[0]["first_violation"]["cases"] > 1
    finder = rare[0]["worker"]
    other = [i for i in rare if i["worker"] != finder]
    assert other, f"only {finder} ran the failing row: {items}"
    assert other[0]["status"] == "fail" and other[0]["first_violation"]["cases"] == 1, other[0]
    assert len({i["worker"] for i in items}) == 2
    assert list(DirectoryBasedExampleDatabase(str(db)).fetch(database_key("planted-rare", "gfx950")))
    doc = _doc(rep)
    assert doc["failures"][0]["occurrences"] == len([i for i in rare if i["status"] == "fail"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def redis_url(tmp_path):
    server = shutil.which("redis-server")
    if server is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server)")
    try:
        import redis
    except ImportError:
        pytest.skip("the redis package is not installed (pip install 'sparse-mla-verify[redis]')")
    port = _free_port()
    proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(host="127.0.0.1", port=port)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    pytest.skip("redis-server did not start on 127.0.0.1")
                time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_shards_share_a_redis_database_and_merge_deduplicates(tmp_path, redis_url):
    from contracts.cli.smv import main as smv

    common = ["--round", "6", "--jobs", "1", "--seed", "4", "--contract", "planted-rare", "--contract", "planted-odd",
              "--target", "gfx950", "--database", redis_url]
    a, b = tmp_path / "shard1", tmp_path / "shard2"
    ra = _fuzz(a, "--budget", "14", "--shard", "1/2", *common)
    assert ra.returncode == 1, ra.stderr
    first = [i for i in _items(a) if i["key"] == "planted-rare/gfx950" and i["status"] == "fail"]
    assert first and first[0]["first_violation"]["cases"] > 1  # found by generation, not replayed
    rb = _fuzz(b, "--budget", "14", "--shard", "2/2", *common)
    assert rb.returncode == 1, rb.stderr
    ga, gb = {i["g"] for i in _items(a)}, {i["g"] for i in _items(b)}
    assert not ga & gb and all((g // 2 + g % 2) % 2 == 0 for g in ga) and all((g // 2 + g % 2) % 2 == 1 for g in gb)
    second = [i for i in _items(b) if i["key"] == "planted-rare/gfx950"]
    assert second and second[0]["status"] == "fail" and second[0]["first_violation"]["cases"] == 1, second
    out = tmp_path / "merged"
    code = smv(["fuzz", "merge", str(a), str(b), "--report", str(out)])
    merged = json.loads((out / "campaign.json").read_text())
    assert code == 1 and merged["schema_version"] == 4
    sigs = [f["signature"] for f in merged["failures"]]
    assert len(sigs) == len(set(sigs)) == 2  # one rare and one odd failure, each found by both shards
    for f in merged["failures"]:
        assert sorted(f["found_in"]) == sorted([str(a), str(b)])
        assert f["occurrences"] == sum(g["occurrences"] for d in (a, b) for g in _doc(d)["failures"]
                                       if g["signature"] == f["signature"])
        assert Path(f["repro"]).parent == out / "repro" and Path(f["repro"]).exists()
    assert sum(merged["cases"].values()) == sum(sum(_doc(d)["cases"].values()) for d in (a, b))
    assert {w["shard"] for w in merged["workers"]} == {"1/2", "2/2"}


def test_fuzz_usage_errors(tmp_path, capsys):
    from contracts.cli.smv import main as smv

    for bad in (["--shard", "3/2"], ["--jobs", "0"], ["--case-timeout", "0"]):
        with pytest.raises(SystemExit) as exc:
            smv(["fuzz", *bad, "--report", str(tmp_path / "x")])
        assert exc.value.code == 2
    assert smv(["fuzz", "--database", "http://nowhere", "--budget", "1", "--report", str(tmp_path / "x"),
                "--contract", "ue8m0-codec-exact"]) == 2
    assert "redis://HOST:PORT/DB" in capsys.readouterr().err
    assert smv(["fuzz", "merge", str(tmp_path / "missing"), "--report", str(tmp_path / "o")]) == 2
    assert "campaign.json" in capsys.readouterr().err
