"""Host-side cost of ``SparseMLAMetadataBuilder.build()`` for a steady decode step: partition cache hit vs miss.

Not collected by plain ``pytest`` (the file pattern is ``bench_*.py``); run it by path or with ``smv bench -k
metadata``. It runs on any machine: the builder works on the host. Steady decode: every request has one query token
and a sequence longer than ``topk`` (2048), so the cache key does not change from step to step; the miss is forced
by ``invalidate_partition_cache()`` in the round's setup (outside the timing), so hit and miss differ only in the
partition recompute. Torch runs one intra-op thread (the suite's plugin sets it), the stable choice on a shared host.
"""
from __future__ import annotations

import pytest

from contracts.cli import bench

TARGET = "gfx950"
ROUNDS = 200


def _steps(num_reqs: int, count: int):
    import torch

    from impl.sparse_metadata import CommonMetadata

    qsl = torch.arange(num_reqs + 1, dtype=torch.int32)
    table = torch.zeros(num_reqs, 3100, dtype=torch.int32)  # read only: one table serves every step
    out = []
    for step in range(count):
        seq = torch.full((num_reqs,), 3000 + step, dtype=torch.int32)
        out.append(CommonMetadata(query_start_loc=qsl.clone(), query_start_loc_cpu=qsl, seq_lens=seq.clone(),
                                  seq_lens_cpu=seq, num_reqs=num_reqs, num_actual_tokens=num_reqs, max_query_len=1,
                                  block_table=table))
    return out


@pytest.mark.parametrize("tokens", (64, 512))
@pytest.mark.parametrize("variant", ("hit", "miss"))
def test_metadata_build(benchmark, variant, tokens):
    from impl.sparse_metadata import SparseMLAMetadataBuilder

    b = SparseMLAMetadataBuilder(max(tokens, 512), 16, topk_tokens=2048, target=TARGET, use_aiter=False)
    steps = _steps(tokens, ROUNDS + 6)
    b.build(steps[0])  # buffers touched, key set
    it = iter(steps[1:])

    def setup():
        if variant == "miss":
            b.invalidate_partition_cache()
        return (next(it),), {}

    md = benchmark.pedantic(b.build, setup=setup, rounds=ROUNDS, warmup_rounds=5, iterations=1)
    # not a timing check: a hit that missed (or the reverse) would have timed the other variant
    assert md.cache_hit == (variant == "hit"), f"the {variant} benchmark's last build had cache_hit={md.cache_hit}"
    benchmark.extra_info.update(bench.derived_figures(
        kind="metadata", family="metadata", seconds=bench.benchmark_median(benchmark), bytes=0, flops=0,
        refs=bench.References(), variant=variant, tokens=tokens, target=TARGET))
