"""The split-K reduce's float64 reference (oracles.decode_reduce) on hand-worked rows, and the partial builder."""
import math

import pytest
import torch

from fuzz.decode_reduce import FLT_MAX, ReduceCase, build_partials
from oracles.decode_reduce import ref_reduce


def _parts(m, l, acc):
    m = torch.tensor(m, dtype=torch.float32).reshape(1, -1, 1)
    l = torch.tensor(l, dtype=torch.float32).reshape(1, -1, 1)
    acc = torch.tensor(acc, dtype=torch.float32).reshape(1, -1, 1, 1).expand(1, m.shape[1], 1, 512).contiguous()
    return m, l, acc


def test_adaptive_skips_dead_splits_and_their_nan():
    # SPEC 2's upstream check: acc 1 and 3 over equal weights give exactly 2; the dead split's NaN never reaches it
    m, l, acc = _parts([0.0, 0.0, -FLT_MAX], [1.0, 1.0, 0.0], [1.0, 3.0, math.nan])
    out, _ = ref_reduce(m, l, acc, None, adaptive=True)
    assert torch.equal(out, torch.full((1, 1, 512), 2.0, dtype=torch.float64))
    out, _ = ref_reduce(m, l, acc, None, adaptive=False)
    assert bool(torch.isnan(out).all())


def test_weights_rescale_to_the_common_maximum_and_the_sink_adds_to_l():
    m, l, acc = _parts([0.0, math.log(2.0)], [1.0, 1.0], [1.0, 1.0])
    out, _ = ref_reduce(m, l, acc, None, adaptive=False)
    assert out[0, 0, 0].item() == pytest.approx((0.5 * 1 + 1 * 1) / (0.5 + 1))
    sink = torch.tensor([math.log(2.0)])
    out, _ = ref_reduce(m, l, acc, sink, adaptive=False)
    assert out[0, 0, 0].item() == pytest.approx(1.5 / (1.5 + 1.0))


def test_an_empty_row_is_zero_with_or_without_a_sink():
    m, l, acc = _parts([-FLT_MAX, -FLT_MAX], [0.0, 0.0], [0.0, 0.0])
    for sink in (None, torch.tensor([3.0])):
        for adaptive in (False, True):
            out, tol = ref_reduce(m, l, acc, sink, adaptive)
            assert torch.equal(out, torch.zeros_like(out)) and bool((tol > 0).all())


def test_builder_places_dead_splits_and_poison():
    case = ReduceCase(seed=2, batch=2, heads=3, splits=5, adaptive=True, dead="middle", poison="stale-nan",
                      m_spread=60.0, l_spread=24.0, sink="dominant")
    p = build_partials(case)
    assert bool((p["part_m"][:, 2] == -FLT_MAX).all()) and bool((p["part_l"][:, 2] == 0).all())
    assert bool(torch.isnan(p["part_acc"][:, 2]).any()) and not bool(torch.isnan(p["part_acc"][:, [0, 1, 3, 4]]).any())
    live = torch.cat([p["part_m"][:, :2], p["part_m"][:, 3:]], dim=1)
    assert bool((p["sink"] > live.amax(dim=(0, 1))).all())
    with pytest.raises(ValueError, match="stale-nan"):
        ReduceCase(seed=0, batch=1, heads=1, splits=2, adaptive=False, dead="first", poison="stale-nan")
