"""benchmarks/audit_throughput.py: audits side by side, the per-row rates, ratios and the harness bound."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "benchmarks" / "audit_throughput.py"
_spec = importlib.util.spec_from_file_location("audit_throughput", _PATH)
at = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(at)


def _doc(rows, seconds=10.0, jobs=1):
    return {"schema_version": 8, "device": {"name": "dev"},
            "run": {"seconds": seconds, "jobs": jobs, "triton_mode": "native", "counts": {"pass": len(rows)}},
            "results": [{"contract": c, "target": t, "status": "pass", "cases": n, "seconds": s,
                         "time_split": dict(zip(("compile", "kernel", "oracle", "harness"), split))}
                        for c, t, n, s, split in rows]}


def test_rates_ratios_and_the_harness_bound(tmp_path, capsys):
    cpu = _doc([("decode-oracle-agreement", "gfx950", 20, 10.0, (0.0, 9.0, 0.5, 0.5)),
                ("gather-oracle-exact", "gfx950", 28, 1.0, (0.0, 0.5, 0.1, 0.4))])
    gpu = _doc([("decode-oracle-agreement", "gfx950", 20, 4.0, (3.0, 0.4, 0.3, 0.3)),
                ("gather-oracle-exact", "gfx950", 28, 0.5, (0.0, 0.05, 0.05, 0.4))], jobs=12)
    (tmp_path / "a.json").write_text(json.dumps(cpu))
    (tmp_path / "b.json").write_text(json.dumps(gpu))
    rows = at.table([("cpu", cpu), ("gpu", gpu)])
    head, by = rows[0], {r[0]: dict(zip(rows[0], r)) for r in rows[1:]}
    assert head[:2] == ["contract", "target"] and "bound" in head and "gpu / cpu" in head
    d = by["decode-oracle-agreement"]
    assert d["cpu case/s"] == "2.00" and d["gpu case/s"] == "5.00" and d["gpu w/o compile"] == "20.00"
    assert d["gpu / cpu"] == "2.50x"
    assert d["bound"] == "10.0x"  # 10 s over 0.5 + 0.5 s of oracle and harness
    assert by["gather-oracle-exact"]["bound"] == "2.0x"  # harness-bound on the CPU already: 10x is out of reach
    assert at.main(["cpu=" + str(tmp_path / "a.json"), "gpu=" + str(tmp_path / "b.json"), "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| decode-oracle-agreement | gfx950 |" in out and "gpu: 48 cases over 10.0s wall" in out


def test_a_file_that_is_not_an_audit_is_one_line(tmp_path):
    (tmp_path / "x.json").write_text(json.dumps({"schema_version": 5}))
    with pytest.raises(SystemExit, match="schema 6 or later"):
        at.main([f"x={tmp_path / 'x.json'}"])
    with pytest.raises(SystemExit, match="LABEL=PATH"):
        at.main([str(tmp_path / "x.json")])
