"""The README's quick start (`smv audit --report DIR`) on a loaded machine: two CPU-bound processes beside it, then
pinned to one core as well. It exits 0 both times (every row's minimum runs; only --deadline cuts a row), and the
estimate it prints before it starts is within 30% of the wall time it takes. Slow (about 7 minutes on 2 cores):
the nightly pipeline runs it (--run-slow)."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SMV = str(Path(sys.executable).parent / "smv")
HOG = [sys.executable, "-c", "while True: pass"]


def _quick_start(report: Path, env: dict, prefix=()) -> tuple[int, float, float, str]:
    """``smv audit --report DIR`` as README's quick start runs it: (exit code, wall seconds, estimate, stderr)."""
    t0 = time.monotonic()
    proc = subprocess.run([*prefix, SMV, "audit", "--report", str(report)], cwd=ROOT, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=900)
    wall = time.monotonic() - t0
    m = re.search(r"^smv audit: plan: .*estimate (\d+)s", proc.stderr, re.M)
    assert m, proc.stderr[-2000:]
    return proc.returncode, wall, float(m.group(1)), proc.stderr


def _loaded(fn):
    hogs = [subprocess.Popen(HOG) for _ in range(2)]
    try:
        return fn()
    finally:
        for h in hogs:
            h.kill()
            h.wait()


@pytest.mark.slow
def test_quick_start_under_load_exits_0_and_its_estimate_holds(tmp_path):
    env = dict(os.environ, SMV_CACHE=str(tmp_path / "cache"), SMV_COST_MODEL=str(tmp_path / "cache" / "audit-costs.json"))
    env.pop("CI", None)  # the quick start's own profile (dev)
    code, _, _, err = _quick_start(tmp_path / "warm", env)  # an unloaded run keeps the rows' costs
    assert code == 0, err[-3000:]
    runs = {"two busy processes": _loaded(lambda: _quick_start(tmp_path / "loaded", env))}
    if shutil.which("taskset"):
        runs["pinned to core 0 too"] = _loaded(lambda: _quick_start(tmp_path / "pinned", env, ("taskset", "-c", "0")))
    for what, (code, wall, estimate, err) in runs.items():
        doc = json.loads((tmp_path / ("loaded" if what.startswith("two") else "pinned") / "audit.json").read_text())
        print(f"{what}: estimate {estimate:.0f}s, actual {wall:.0f}s, plan {doc['run']['plan']}")
        assert code == 0 and not [r for r in doc["results"] if r["status"] == "incomplete"], err[-3000:]
        assert abs(estimate - wall) <= 0.3 * wall, f"{what}: estimate {estimate:.0f}s, actual {wall:.0f}s"
