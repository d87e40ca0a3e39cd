"""fuzz.metamorphic's inputs and contracts.metamorphic's paths (the contract's own row runs in
tests/test_contracts.py; its planted bugs in contracts/zoo/metamorphic.toml)."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings

from contracts.metamorphic import decode_paths, decode_paths_agree, generic_twin
from fuzz import metamorphic as fm
from impl import decode as dec
from impl import formats
from impl.targets import GFX942, GFX950


@settings(max_examples=40, database=None, deadline=None, suppress_health_check=list(HealthCheck))
@given(fm.metamorphic_cases(GFX942))
def test_cases_are_tiny_and_valid(case):
    assert 2 <= case.num_splits <= fm.MAX_SPLITS and case.decode.batch == 2
    assert case.decode.adaptive is None  # only gfx950 draws the adaptive plan's fields
    for n in case.decode.main_lens + (case.decode.extra_lens or ()):
        assert 0 <= n <= 2 * max(fm.TILES) + 1


def test_tails_of_every_split_length_are_drawn():
    for s in range(2, fm.MAX_SPLITS + 1):
        seen: set[int] = set()

        @settings(max_examples=60, database=None, deadline=None, derandomize=True,
                  suppress_health_check=list(HealthCheck))
        @given(fm._tail_lengths(s))
        def collect(n):
            seen.add(n % s if n > s else -n)  # -n: at most s entries (some splits empty)

        collect()
        assert set(range(s)) <= {r for r in seen if r >= 0} and {-1, -s} <= seen, (s, sorted(seen))


def test_gfx950_cases_carry_the_adaptive_plan():
    @settings(max_examples=10, database=None, deadline=None, suppress_health_check=list(HealthCheck))
    @given(fm.metamorphic_cases(GFX950))
    def check(case):
        assert case.decode.adaptive == fm.fz.AdaptiveSplits(case.one_wave) and case.decode.num_splits == case.num_splits

    check()


def test_spikes_give_every_split_region_its_own_maximum():
    from fuzz.decode import DecodeCase

    d = DecodeCase(seed=3, batch=2, heads=1, main_bs=1, extra_bs=2, main_lens=(4, 10), extra_lens=None,
                   invalid_rate=0.0, indptr_offset=0, tail_junk=0, scale=0.3, sink="none", poison="none",
                   padded=False, q_transposed=False, cu_count=2, int32_extremes=False)
    case = fm.MetamorphicCase(decode=d, num_splits=3)
    plain = fm.build_metamorphic_inputs(case.replace(spikes=False), GFX942)
    spiked = fm.build_metamorphic_inputs(case, GFX942)
    idx = spiked.main_indices.tolist()
    for lo, hi in ((4, 8), (8, 12), (12, 14)):  # row 1: ceil(10 / 3) = 4 entries per split
        raised = [formats.unpack_fp8_ds_mla(spiked.main_cache, [idx[p]])["scale"].max().item() for p in range(lo, hi)]
        before = [formats.unpack_fp8_ds_mla(plain.main_cache, [idx[p]])["scale"].max().item() for p in range(lo, hi)]
        assert max(raised) >= 131 > max(before)
    for p in range(4):  # row 0 keeps its data
        assert torch.equal(formats.unpack_fp8_ds_mla(spiked.main_cache, [idx[p]])["scale"],
                           formats.unpack_fp8_ds_mla(plain.main_cache, [idx[p]])["scale"])


def test_paths_and_the_generic_twin():
    assert [lbl for lbl, _, _ in decode_paths(fm.MetamorphicCase(decode=_small(), num_splits=2), GFX942, dec)] == \
        ["1 split", "2 splits", "generic kernel (fnuz/ocp)"]
    twin = generic_twin(GFX942)
    assert (twin.decode_family, twin.main_cache_fp8, twin.extra_cache_fp8) == ("generic", "fnuz", "ocp")
    # adaptive splits exist only for S > 4 (SPEC 2's host rule): with S = 2 gfx950 has the two fixed paths alone
    assert len(decode_paths(fm.MetamorphicCase(decode=_small(adaptive=True), num_splits=2), GFX950, dec)) == 2
    five = fm.MetamorphicCase(decode=_small(adaptive=True).replace(num_splits=5), num_splits=5)
    assert [lbl for lbl, _, _ in decode_paths(five, GFX950, dec)] == ["1 split", "5 splits",
                                                                     "5 adaptive splits (one_wave 1)"]


def test_every_pinned_adaptive_example_has_more_than_four_splits():
    from contracts.metamorphic import _examples, has_adaptive_path

    assert all(has_adaptive_path(c, GFX950) for c in _examples(GFX950) + fm.metamorphic_examples(GFX950))


def test_a_note_ends_a_passing_rows_reason():
    """What a check leaves unchecked (a path the subject lacks) is said in its row's reason, pass or known."""
    from hypothesis import strategies as st

    from contracts.core import Contract, record_note
    from contracts.engine.runner import run_contract

    def check(case, target):
        record_note("path 'x' not run: the subject has none")
        return []

    toy = Contract(id="zz-noted", doc="toy", targets=("gfx942",), cases=lambda t: st.just(1), check=check,
                   min_cases=1, max_cases=2)
    row = run_contract(toy, "gfx942", budget=30.0)
    assert (row.status, row.reason) == ("pass", "path 'x' not run: the subject has none")


def test_the_paths_agree_on_a_small_case():
    assert decode_paths_agree(fm.MetamorphicCase(decode=_small(), num_splits=2), GFX942) == []


def _small(adaptive: bool = False):
    from fuzz.decode import AdaptiveSplits, DecodeCase

    return DecodeCase(seed=5, batch=1, heads=1, main_bs=5, extra_bs=2, main_lens=(5,), extra_lens=(3,),
                      invalid_rate=0.0, indptr_offset=0, tail_junk=0, scale=0.11, sink="ordinary", poison="none",
                      padded=False, q_transposed=False, cu_count=2, int32_extremes=False,
                      num_splits=2 if adaptive else None, adaptive=AdaptiveSplits(1) if adaptive else None)


def test_active_four_with_an_extra_segment_leaves_entries_to_a_slice_by_s():
    """The covering array's (extra present, active 4) row: row 0 runs on 4 of S splits, and 4 slices of
    ceil(n / S) of its extra segment leave S or more entries unread (the planted bug
    metamorphic-adaptive-extra-sliced-by-all-splits)."""
    from oracles.splits import ref_adaptive_active

    base = fm.metamorphic_examples(GFX950)[0]
    for extra in (base.decode.extra_lens, None):
        case = fm.force_metamorphic(base.replace(decode=base.decode.replace(extra_lens=extra)),
                                    {"active": "4", "extra": "present"}, GFX950)
        d, s = case.decode, case.num_splits
        assert ref_adaptive_active(d.main_lens[0], d.extra_lens[0], s, case.one_wave) == 4 < s
        assert d.extra_lens[0] - 4 * -(-d.extra_lens[0] // s) >= s
