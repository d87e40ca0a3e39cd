"""`smv fuzz`: budget parsing, rounds until the budget, distinct failures kept as reproducers."""
import json

import pytest
from hypothesis import strategies as st

from contracts import core
from contracts.cli import main as smv
from contracts.campaign import parse_duration, run_campaign


@pytest.mark.parametrize("text,seconds", [("8h", 28800), ("30m", 1800), ("90s", 90), ("1h30m", 5400), ("12", 12),
                                          (2.5, 2.5)])
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "8x", "h", "-3", "0"])
def test_parse_duration_rejects(bad):
    with pytest.raises(ValueError, match="budget"):
        parse_duration(bad)


def test_campaign_rounds_and_summary(tmp_path):
    code = smv(["fuzz", "--budget", "4", "--round", "2", "--contract", "ue8m0-codec-exact", "--target", "gfx950",
                "--profile", "dev", "--report", str(tmp_path), "--seed", "7"])
    doc = json.loads((tmp_path / "campaign.json").read_text())
    assert code == 0 and doc["finished"] and doc["failures"] == []
    assert doc["rounds"] >= 1 and doc["cases"]["ue8m0-codec-exact/gfx950"] >= 5 and doc["base_seed"] == 7


def test_campaign_keeps_one_reproducer_per_distinct_failure(tmp_path):
    def odd_fails(case, target):
        """Fails on odd integers (stands for a real bug)."""
        return [core.Violation("odd", str(case), "even", str(case))] if case % 2 else []

    core.contract("test-odd-fails", cases=lambda t: st.integers(0, 10 ** 6), min_cases=1)(odd_fails)
    try:
        doc, code = run_campaign(3.0, str(tmp_path), contract_ids=["test-odd-fails"], target_names=["gfx942"],
                                 round_seconds=1.0, seed=1, profile="dev")
    finally:
        core.CONTRACTS.pop("test-odd-fails")
    assert code == 1 and len(doc["failures"]) == 1
    f = doc["failures"][0]
    assert f["contract"] == "test-odd-fails" and f["occurrences"] == doc["rounds"] >= 2
    saved = json.loads(open(f["repro"]).read())
    assert saved["contract"] == "test-odd-fails" and saved["case"] % 2 == 1


def test_rounds_end_on_time_and_left_is_never_negative(tmp_path):
    import io
    import time

    def slow(case, target):
        """Slow per case (stands for an expensive check)."""
        time.sleep(0.1)
        return []

    def slow_draw(x):
        time.sleep(0.1)  # an expensive strategy: Hypothesis pays this for every case it draws
        return x

    core.contract("test-slow-campaign", cases=lambda t: st.integers(0, 10 ** 6).map(slow_draw), min_cases=2)(slow)
    out = io.StringIO()
    t0 = time.monotonic()
    try:
        doc, code = run_campaign(2.0, str(tmp_path), contract_ids=["test-slow-campaign"],
                                 target_names=["gfx942", "gfx950"], round_seconds=1.2, seed=5, profile="dev",
                                 stream=out)
    finally:
        core.CONTRACTS.pop("test-slow-campaign")
    wall = time.monotonic() - t0
    assert wall < 2.0 + 0.2 + 0.5, wall  # the budget, one case (draw and check), the harness
    assert "-" not in "".join(ln.split(",")[-1] for ln in out.getvalue().splitlines() if "left" in ln)
    assert doc["schema_version"] == 3
    assert [r["seed"] for r in doc["round_log"]] == [5 + i for i in range(doc["rounds"])]
    assert all(set(r) >= {"round", "seed", "seconds", "cases", "budget"} for r in doc["round_log"])
    assert sum(r["cases"] for r in doc["round_log"]) == sum(doc["cases"].values())

