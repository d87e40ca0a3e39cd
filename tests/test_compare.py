"""oracles.compare's attention comparison: a failure names the worst lane, the count out of the total and the row's
cosine in one summary; a pass reports its worst error-to-tolerance ratio (the margin the audit shows)."""
from __future__ import annotations

import math

import pytest
import torch

from oracles import compare as cmp


def _ref():
    return torch.randn(2, 3, 512, generator=torch.Generator().manual_seed(1), dtype=torch.float64)


def test_failure_summary_names_worst_lane_count_and_cosine():
    ref = _ref()
    tol = torch.full_like(ref, 1e-3)
    got = ref.clone()
    got[0, 0, :62] += 2e-3  # 62 lanes at 2x
    got[1, 2, 17] += 3.1e-2  # the worst lane, 31x, found after the others in memory order
    res = cmp.attention_comparison(got, ref, tol)
    assert not res.ok and res.bad_lanes == 63 and res.lanes == 3072
    first = res.mismatches[0]
    assert first.kind == "value" and first.where == "out[1, 2, 17]"
    assert first.detail.startswith("63 of 3072 lanes out of tolerance (worst out[1, 2, 17]: off by 3.1e-2, "
                                   "tolerance 1e-3, 31x); row cosine 0.")
    assert "(needs >= 0." in first.detail
    assert first.got.endswith("(off by 0.031)") and "+- 0.001" in first.expected
    # the lanes after the summary are the next worst ones, and no "N more lanes" line with empty fields remains
    assert [m.kind for m in res.mismatches[:5]] == ["value"] * 5
    assert all(m.expected and m.got for m in res.mismatches)
    assert not any("more lanes" in m.got for m in res.mismatches)
    assert res.worst_ratio == pytest.approx(31.0, rel=1e-6)


def test_cosine_text_tells_a_bound_near_one_from_the_value():
    text = cmp._cos_text(0.999999105, 0.999999523)
    assert text == "row cosine 0.999999105 (needs >= 0.999999523)"


def test_pass_reports_its_worst_ratio():
    ref = _ref()
    tol = torch.full_like(ref, 1e-3)
    got = ref + 2.5e-4
    got[1, 1, 3] = ref[1, 1, 3] + 9e-4
    res = cmp.attention_comparison(got, ref, tol)
    assert res.ok and res.mismatches == [] and res.bad_lanes == 0
    assert res.worst_ratio == pytest.approx(0.9, rel=1e-6)
    assert cmp.compare_attention(got, ref, tol) == []


def test_lanes_with_zero_error_and_zero_tolerance_do_not_count_but_zero_tolerance_with_error_does():
    ref = torch.zeros(1, 1, 4, dtype=torch.float64)
    tol = torch.zeros_like(ref)
    assert cmp.attention_comparison(ref.clone(), ref, tol).worst_ratio is None
    got = ref.clone()
    got[0, 0, 2] = 1e-30
    res = cmp.attention_comparison(got, ref, tol)
    assert res.worst_ratio == math.inf and res.bad_lanes == 1 and "inf" in res.mismatches[0].detail


def test_mask_mismatch_says_which_mask_and_how_many():
    ref = _ref()
    got = ref.clone()
    got[0, 1, 7] = math.nan
    got[1, 0, 0] = math.inf
    res = cmp.attention_comparison(got, ref, torch.full_like(ref, 1e-3))
    assert [m.kind for m in res.mismatches] == ["nan-mask", "inf-mask"]
    assert res.mismatches[0].detail == "NaN positions differ at 1 of 3072 lanes (first out[0, 1, 7])"
    assert res.mismatches[1].where == "out[1, 0, 0]" and res.worst_ratio is None


def test_shape_mismatch():
    ref = _ref()
    res = cmp.attention_comparison(ref[:1], ref, ref)
    assert [m.kind for m in res.mismatches] == ["shape"] and res.mismatches[0].detail == "shape differs"
