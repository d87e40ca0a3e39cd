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
