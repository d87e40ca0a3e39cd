"""CPU-side cost of ``SparseMLAMetadataBuilder.build()`` for a steady decode step: partition cache hit vs miss.

A benchmark, not a test (pytest does not collect it: it lives outside ``tests/``). Both variants run side by side in
one process; the miss is forced with ``invalidate_partition_cache()`` before each build, so the two differ only in
the partition recompute (and its one counted host sync). Steady decode: every request has one query token and a
sequence longer than ``topk`` (2048), so the cache key does not change from step to step.

    /work/venv/bin/python benchmarks/bench_metadata.py [--tokens 64 512] [--repeats 200] [--target gfx950]
"""
from __future__ import annotations

import argparse
import statistics
import time

import impl  # noqa: F401
import torch

from impl.sparse_metadata import CommonMetadata, SparseMLAMetadataBuilder


def _decode_step(num_reqs: int, step: int) -> CommonMetadata:
    qsl = torch.arange(num_reqs + 1, dtype=torch.int32)
    seq = torch.full((num_reqs,), 3000 + step, dtype=torch.int32)
    return CommonMetadata(query_start_loc=qsl.clone(), query_start_loc_cpu=qsl, seq_lens=seq.clone(),
                          seq_lens_cpu=seq, num_reqs=num_reqs, num_actual_tokens=num_reqs, max_query_len=1,
                          block_table=torch.zeros(num_reqs, 3100, dtype=torch.int32))


def bench(num_tokens: int, repeats: int, target: str) -> dict:
    b = SparseMLAMetadataBuilder(max(num_tokens, 512), 16, topk_tokens=2048, target=target, use_aiter=False)
    steps = [_decode_step(num_tokens, i) for i in range(repeats)]
    b.build(steps[0])  # warm: buffers touched, key set
    hit, miss = [], []
    for i, common in enumerate(steps):
        # interleaved so that machine noise hits both alike
        t0 = time.perf_counter()
        md = b.build(common)
        hit.append(time.perf_counter() - t0)
        assert md.cache_hit
        b.invalidate_partition_cache()
        t0 = time.perf_counter()
        md = b.build(common)
        miss.append(time.perf_counter() - t0)
        assert not md.cache_hit
    return {"tokens": num_tokens, "hit_us": statistics.median(hit) * 1e6, "miss_us": statistics.median(miss) * 1e6}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, nargs="+", default=[64, 512])
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--target", default="gfx950")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (1: stable on a shared host)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"steady decode build(), target {args.target}, median of {args.repeats}, topk 2048, 16 heads")
    print(f"{'tokens':>7} {'hit us':>10} {'miss us':>10} {'miss/hit':>9}")
    for n in args.tokens:
        r = bench(n, args.repeats, args.target)
        print(f"{r['tokens']:>7} {r['hit_us']:>10.1f} {r['miss_us']:>10.1f} {r['miss_us'] / r['hit_us']:>9.2f}")


if __name__ == "__main__":
    main()
