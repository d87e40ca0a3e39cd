"""A representative run of every Triton kernel family for compute-sanitizer (memcheck / racecheck).

Small shapes, ragged rows with -1 / out-of-range entries and an empty row, both caches, a sink: every masked-load
path runs. Prints the max deviation from the float64 oracle so the run is also a correctness check.

    compute-sanitizer --tool memcheck python3 benchmarks/sanitize_decode.py
"""
from __future__ import annotations

import math
import sys

import torch

import impl  # noqa: F401
from impl import formats
from impl.decode import plan_decode, sparse_attn_decode
from impl.runtime import triton_mode
from oracles import compare as cmp
from oracles import decode as oracle_decode


def main() -> int:
    from impl.runtime import kernel_device

    dev = torch.device(kernel_device())
    g = torch.Generator().manual_seed(3)
    failures = 0
    for target in ("generic", "gfx942", "gfx950"):
        flavour = "fnuz" if target == "gfx942" else "ocp"
        bs, nb = 5, 6
        slots = bs * nb
        _, cache = formats.allocate_fp8_ds_mla_pool(nb, bs, device="cpu")
        codes = torch.randint(0, 0x70, (slots, 448), generator=g, dtype=torch.int32).to(torch.uint8)
        formats.pack_fp8_ds_mla(cache, list(range(slots)), codes,
                                torch.randint(122, 130, (slots, 7), generator=g, dtype=torch.int32).to(torch.uint8),
                                torch.randn(slots, 64, generator=g).to(torch.bfloat16))
        _, extra = formats.allocate_fp8_ds_mla_pool(nb, bs, device="cpu")
        formats.pack_fp8_ds_mla(extra, list(range(slots)), codes.flip(0),
                                torch.randint(122, 130, (slots, 7), generator=g, dtype=torch.int32).to(torch.uint8),
                                torch.randn(slots, 64, generator=g).to(torch.bfloat16))
        batch, heads = 3, 5
        rows_main = [[0, 3, -1, 7, slots + 4], [], [2, 2 ** 31 - 1, 9, 11, 12, 13]]
        rows_extra = [[1, 4, 5], [6, -2 ** 31], list(range(8, 26))]
        def ragged(rows):
            ind = torch.tensor([x for r in rows for x in r], dtype=torch.int32)
            ptr = torch.tensor([0] + [sum(len(r) for r in rows[:i + 1]) for i in range(len(rows))], dtype=torch.int32)
            return ind, ptr
        mi, mp = ragged(rows_main)
        ei, ep = ragged(rows_extra)
        q = (torch.randn(batch, heads, 512, generator=g) * 0.2).to(torch.bfloat16)
        sink = torch.tensor([-math.inf, 0.5, 3.0, -1.0, 10.0], dtype=torch.float32)
        out = sparse_attn_decode(q.to(dev), cache.to(dev), mi.to(dev), mp.to(dev), extra.to(dev), ei.to(dev),
                                 ep.to(dev), attn_sink=sink.to(dev), softmax_scale=0.07, target=target)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        ref = oracle_decode.ref_sparse_attn_decode(q, cache, mi, mp, extra, ei, ep, attn_sink=sink,
                                                    softmax_scale=0.07, main_flavour=flavour, extra_flavour="ocp",
                                                    scrub_extra=True)
        plan = plan_decode(target, batch, heads, mi.numel(), ei.numel())
        tol = cmp.attention_tolerance(ref.weight_abs, ref.logit_abs, ref.logit_max_abs, ref.tokens, ref.max_abs_v,
                                      plan.num_splits, 16, cmp.AttentionErrorModel.for_mode(triton_mode()))
        bad = cmp.compare_attention(out, ref.out, tol)
        err = ((out.cpu().double() - ref.out).abs() / tol).max().item()
        failures += len(bad)
        print(f"{target}: S={plan.num_splits}, max |out - oracle| / tolerance = {err:.3f}, "
              f"{len(bad)} mismatches {[(m.kind, m.where) for m in bad[:3]]}")
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
