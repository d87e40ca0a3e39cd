"""The key-weakening step generator of ``cache-key-staleness`` (fuzz.sparse_metadata.key_weakening_case): every case
holds, for each weakening of the DSv3.2 metadata key, two consecutive steps equal under the weakened key whose true
results (sparse lengths, the oracle's work partition) differ; the generator's mirror of the key is the builder's."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz.sparse_metadata import (KEY_COMPONENTS, KEY_EQUIVALENT_DROPS, KEY_WEAKENINGS, MetadataConfig,
                                  MetadataStep, key_weakening_case, step_key, step_sparse_lengths)
from impl.sparse_metadata import SparseMLAMetadataBuilder
from oracles import sparse_metadata as oracle


def _pairs(case, w):
    cfg = case.config
    return [(a, b) for a, b in zip(case.steps, case.steps[1:])
            if step_key(a, cfg, w) == step_key(b, cfg, w)
            and step_sparse_lengths(a, cfg.topk) != step_sparse_lengths(b, cfg.topk)]


@settings(max_examples=60, database=None, deadline=None)
@given(key_weakening_case())
def test_every_case_probes_every_weakening(case):
    cfg = case.config
    for w in KEY_WEAKENINGS:
        pairs = _pairs(case, w)
        assert pairs, f"{w}: no consecutive steps equal under it with different sparse lengths in {case.steps}"
        for a, b in pairs:
            assert step_key(a, cfg) != step_key(b, cfg)  # the full key separates them
            if w == "clamped-hostless":
                assert not a.host_lens and not b.host_lens
    for s in case.steps:
        assert list(step_sparse_lengths(s, cfg.topk)) == oracle.sparse_lengths(list(s.q_lens), list(s.seq_lens),
                                                                                 cfg.topk)


@settings(max_examples=15, database=None, deadline=None)
@given(key_weakening_case())
def test_weakening_pairs_have_different_partitions(case):
    cfg = case.config
    for w in KEY_WEAKENINGS:
        a, b = _pairs(case, w)[0]
        parts = [oracle.work_partition(oracle.sparse_lengths(list(s.q_lens), list(s.seq_lens), cfg.topk), 80,
                                       cfg.granularity) for s in (a, b)]
        assert any(not np.array_equal(np.asarray(parts[0][k]), np.asarray(parts[1][k])) for k in parts[0]), w


_step = st.integers(1, 3).flatmap(lambda n: st.tuples(st.lists(st.integers(1, 4), min_size=n, max_size=n),
                                                      st.lists(st.integers(0, 12), min_size=n, max_size=n)))


def _mk(qs):
    q, s = qs
    return MetadataStep(q_lens=tuple(q), seq_lens=tuple(0 if x == 0 else max(x, y) for y, x in zip(q, s)))


@settings(max_examples=80, database=None, deadline=None)
@given(_step, _step, st.sampled_from([4, 7]))
def test_the_mirror_is_the_builders_key(x, y, topk):
    cfg = MetadataConfig(seed=0, topk=topk, granularity=4, block_size=1, num_heads=2)
    b = SparseMLAMetadataBuilder(16, 2, topk_tokens=topk, use_aiter=False)

    def impl_key(s):
        starts = np.array([0, *itertools.accumulate(s.q_lens)], dtype=np.int64)
        return b._partition_key(int(starts[-1]), max(s.q_lens), starts, np.diff(starts),
                                np.array(s.seq_lens, dtype=np.int64))

    a, c = _mk(x), _mk(y)
    assert (impl_key(a) == impl_key(c)) == (step_key(a, cfg) == step_key(c, cfg))
    # the full key fixes the sparse lengths (what the partition is a function of)
    if step_key(a, cfg) == step_key(c, cfg):
        assert step_sparse_lengths(a, topk) == step_sparse_lengths(c, topk)
    # dropping an equivalent component never merges steps the full key separates
    for comp in KEY_EQUIVALENT_DROPS:
        assert (step_key(a, cfg, f"drop:{comp}") == step_key(c, cfg, f"drop:{comp}")) == \
            (step_key(a, cfg) == step_key(c, cfg))


def test_weakenings_name_every_separable_component():
    dropped = {w[5:] for w in KEY_WEAKENINGS if w.startswith("drop:")}
    assert dropped | set(KEY_EQUIVALENT_DROPS) == set(KEY_COMPONENTS)
    assert "clamp-1" in KEY_WEAKENINGS
