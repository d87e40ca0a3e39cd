"""Declared dimensions of the decode-variant contracts: subject-agreement (declared in contracts.decode, beside its
case type), decode-paths-agree, graph-replay-agreement and compile-once. Each family's ci array reaches every
required tuple within 25 rows, and each row forced onto a plain case classifies as that row (tests/test_reach.py
checks the families of the fuzz modules the same way; subject-agreement's is checked here whatever was imported)."""
from __future__ import annotations

import pytest

from fuzz import dimensions as D
from impl.targets import TARGET_NAMES, get_target

IDS = ("subject-agreement", "decode-paths-agree", "graph-replay-agreement", "compile-once")


def _families():
    import contracts.decode  # noqa: F401  (declares subject-agreement's family)
    import fuzz.cp_gather  # noqa: F401
    import fuzz.graph_capture  # noqa: F401
    import fuzz.metamorphic  # noqa: F401

    return {cid: D.family_for(cid) for cid in IDS}


@pytest.mark.parametrize("target", TARGET_NAMES)
def test_arrays_cover_and_forced_rows_classify(target):
    t = get_target(target)
    for cid, family in _families().items():
        assert family is not None, cid
        req = family.required(t, 2)
        array = family.covering_array(t, 2)
        got = set()
        for row in array:
            got |= D.covered_by(req, frozenset(row.items()))
        assert set(req) == got and len(array) <= 25, cid
        for base in family.examples(t):
            for row in array:
                hit = family.classify(family.force(base, row, t), t)
                assert {k: hit.get(k) for k in row} == row, (cid, row, hit)


def test_split_rows_of_subject_agreement_are_split_cases_only():
    fam = _families()["subject-agreement"]
    t = get_target("gfx942")
    rows = fam.covering_array(t, 2)
    split = [r for r in rows if r["family"] == "split"]
    assert split and all(v == "-" for r in split for k, v in r.items() if k != "family")
    assert not any(r["family"] == "split" for r in fam.covering_array(get_target("generic"), 2))


def test_active_class_s_needs_both_segments_and_every_term():
    """Row 0's S class: iters(4) = 2 + 2 > 3 where each of the five additions of the kernel's iteration count
    matters (a segment of 132 entries: (132 + 3) // 4 = 33, past one iteration of 32)."""
    from fuzz import metamorphic as fm
    from oracles.splits import ref_adaptive_active

    t = get_target("gfx950")
    base = fm.metamorphic_examples(t)[0]
    case = fm.force_metamorphic(base, {"active": "S", "extra": "present"}, t)
    d = case.decode
    assert ref_adaptive_active(d.main_lens[0], d.extra_lens[0], case.num_splits, case.one_wave) == case.num_splits

    def iters(m, e, s, k=32, xor_at=None):
        a = (((m ^ s) if xor_at == 0 else (m + s)) - 1) // s
        a = (((a ^ k) if xor_at == 1 else (a + k)) - 1) // k
        b = (((e ^ s) if xor_at == 3 else (e + s)) - 1) // s
        b = (((b ^ k) if xor_at == 4 else (b + k)) - 1) // k
        return (a ^ b) if xor_at == 2 else (a + b)

    assert iters(d.main_lens[0], d.extra_lens[0], 4) > 3
    for at in range(5):  # with any one + as ^, the row would run on 4 splits
        assert iters(d.main_lens[0], d.extra_lens[0], 4, xor_at=at) <= 3, at
