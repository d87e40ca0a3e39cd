"""The sparse metadata builder fed a batch padded past R (issue 13's generator gap), and the declared family of
``cache-key-staleness``: the key probe of the last two steps, forced and classified."""
from __future__ import annotations

import pytest

from contracts.sparse_metadata import PAD_SEQ_LEN, _common, _replay, _step_inputs
from fuzz.sparse_metadata import (KEY_WEAKENINGS, STALENESS_DIMENSIONS, MetadataCase, MetadataConfig, MetadataStep,
                                  classify_staleness, pad_for, step_key)
from impl.targets import get_target

CFG = MetadataConfig(seed=0, topk=8, granularity=8, block_size=3, num_heads=2)


def test_a_padded_batch_is_read_for_its_first_R_requests_only():
    step = MetadataStep(q_lens=(2, 1), seq_lens=(5, 9), seed=4, pad=2)
    common = _common(step, _step_inputs(CFG, step)["block_table"])
    assert common.num_reqs == 2 and common.num_actual_tokens == 3
    assert common.seq_lens.tolist() == [5, 9, PAD_SEQ_LEN, PAD_SEQ_LEN]
    assert common.query_start_loc_cpu.tolist() == [0, 2, 3, 3, 3] and common.block_table.shape[0] == 4
    case = MetadataCase(config=CFG, steps=(step, MetadataStep(q_lens=(1, 1), seq_lens=(6, 10), host_lens=False,
                                                              seed=5, pad=1)))
    assert _replay(case, get_target("gfx942"), staleness=True, extents=True) == []
    with pytest.raises(ValueError):
        MetadataStep(q_lens=(1,), seq_lens=(1,), pad=-1)
    assert {pad_for(s) for s in range(10)} == {0, 2}


def test_each_probe_is_forced_and_a_correct_key_tells_the_pair_apart():
    t = get_target("gfx950")
    base = STALENESS_DIMENSIONS.examples(t)[1]
    for probe in ("repeat",) + KEY_WEAKENINGS:
        for host in (True, False):
            if probe == "clamped-hostless" and host:
                continue
            case = STALENESS_DIMENSIONS.force(base, {"probe": probe, "host_lens": host, "padded": True}, t)
            got = classify_staleness(case, t)
            assert (got["probe"], got["host_lens"], got["padded"]) == (probe, host, True)
            prev, last = case.steps[-2:]
            assert (step_key(prev, case.config) == step_key(last, case.config)) == (probe == "repeat")
    assert len(STALENESS_DIMENSIONS.covering_array(t, 2)) <= 25


def test_a_short_query_start_loc_is_refused_naming_the_count_it_needs():
    import dataclasses

    from contracts.sparse_metadata import MetadataReplay

    step = MetadataStep(q_lens=(2, 1, 1), seq_lens=(5, 9, 4), seed=4)
    replay = MetadataReplay(CFG, get_target("gfx942"))
    common = _common(step, _step_inputs(CFG, step)["block_table"])
    short = dataclasses.replace(common, query_start_loc_cpu=common.query_start_loc_cpu[:3])
    with pytest.raises(ValueError, match=r"query_start_loc_cpu: expected at least num_reqs \+ 1 = 4 entries"):
        replay.builder.build(short)
