"""Sparse MLA decode on a GPU: each kernel family beside a torch gather + SDPA baseline, measured in one run.

A benchmark, not a test. DSv4 decode shapes: 64 heads, each query row attends SWA 128 main tokens plus 512 extra
(compressed) tokens, batch 1, 64 and 512. For every kernel family (generic single kernel, gfx942 split-K, gfx950
4x128 tiles; all are portable Triton, so all run on any GPU) it prints the median time (triton.testing.do_bench),
achieved bytes/s and FLOP/s, and the fraction of two ceilings measured in the same run: the device-to-device copy
bandwidth (bytes read + written) and the bf16 matrix-product rate (8192^3 on random data).

Bytes counted (the fewest the kernel must move): the fp8_ds_mla rows it reads (584 B each: 448 fp8 + 128 B RoPE +
7 codes + pad; the 64 heads share each row), q and the bf16 output. FLOPs: QK and PV, 2 * 2 * b * h * tokens * 512.

Baseline: rows gathered from a pre-dequantized bf16 copy of both caches (torch indexing), then
torch.nn.functional.scaled_dot_product_attention on [b, h, 1, 512] x [b, 1, n, 512] (no sink). It reads bf16 rows
(1024 B) where the kernel reads 584 B fp8 rows, and does no dequantization.

    python3 benchmarks/bench_decode.py [--batch 1 64 512] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import math
import sys

import torch

import impl  # noqa: F401
from impl import formats
from impl.decode import plan_decode, sparse_attn_decode

HEADS, SWA, EXTRA, D = 64, 128, 512, 512


def _rand_cache(num_slots: int, block_size: int, flavour: str, g: torch.Generator, device) -> torch.Tensor:
    """A padded-stride cache with random finite fp8 values (the flavour's NaN codes avoided) and codes near 127."""
    nb = -(-num_slots // block_size)
    n = nb * block_size
    _, view = formats.allocate_fp8_ds_mla_pool(nb, block_size, device="cpu")
    x = torch.randn(n, formats.DSV4_NOPE_DIM, generator=g) * 8.0
    formats.pack_fp8_ds_mla(view, torch.arange(n), formats.fp8_encode(x, flavour),
                            torch.randint(120, 130, (n, formats.DSV4_NUM_GROUPS), generator=g,
                                          dtype=torch.int32).to(torch.uint8),
                            (torch.randn(n, formats.DSV4_ROPE_DIM, generator=g) * 0.5).to(torch.bfloat16))
    return view.to(device) if device != "cpu" else view


def _dequant_all(cache: torch.Tensor, flavour: str) -> torch.Tensor:
    n = cache.shape[0] * cache.shape[1]
    return formats.dequantize_fp8_ds_mla(cache.cpu(), torch.arange(n), flavour).to(torch.bfloat16).to(cache.device)


def ceilings(device) -> dict:
    from triton.testing import do_bench

    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    a.random_()
    t = do_bench(lambda: b.copy_(a), warmup=50, rep=200, return_mode="median") * 1e-3
    bw = 2 * n / t
    m = 8192
    x = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    y = torch.randn(m, m, device=device, dtype=torch.bfloat16)
    t = do_bench(lambda: x @ y, warmup=50, rep=300, return_mode="median") * 1e-3
    return {"copy_bytes_per_s": bw, "bf16_flops_per_s": 2 * m ** 3 / t}


def bench_batch(batch: int, ceil: dict, device, g: torch.Generator) -> list[dict]:
    from triton.testing import do_bench

    main_slots, extra_slots = batch * SWA, batch * EXTRA
    rows = []
    q = (torch.randn(batch, HEADS, D, generator=g) * 0.3).to(torch.bfloat16).to(device)
    sink = torch.full((HEADS,), -math.inf, dtype=torch.float32, device=device)
    main_idx = torch.randperm(main_slots, generator=g).to(torch.int32).to(device)
    extra_idx = torch.randperm(extra_slots, generator=g).to(torch.int32).to(device)
    main_ptr = (torch.arange(batch + 1, dtype=torch.int32) * SWA).to(device)
    extra_ptr = (torch.arange(batch + 1, dtype=torch.int32) * EXTRA).to(device)
    n_tok = SWA + EXTRA
    bytes_moved = batch * n_tok * formats.DSV4_TOKEN_BYTES + 2 * q.numel() * 2
    flops = 4 * batch * HEADS * n_tok * D
    for target in ("generic", "gfx942", "gfx950"):
        main_flavour = "fnuz" if target == "gfx942" else "ocp"
        main = _rand_cache(main_slots, 64, main_flavour, g, device)
        extra = _rand_cache(extra_slots, 16, "ocp", g, device)
        plan = plan_decode(target, batch, HEADS, main_idx.numel(), extra_idx.numel())

        def run():
            return sparse_attn_decode(q, main, main_idx, main_ptr, extra, extra_idx, extra_ptr, attn_sink=sink,
                                      target=target, plan=plan, check_indptr=False)

        run()
        torch.cuda.synchronize()
        t = do_bench(run, warmup=25, rep=200, return_mode="median") * 1e-3
        rows.append({"batch": batch, "impl": f"triton {target} (S={plan.num_splits})", "seconds": t,
                     "bytes_per_s": bytes_moved / t, "flops_per_s": flops / t,
                     "bw_fraction": bytes_moved / t / ceil["copy_bytes_per_s"],
                     "flop_fraction": flops / t / ceil["bf16_flops_per_s"]})
    # baseline on the last target's caches
    kv_main = _dequant_all(main, "ocp")
    kv_extra = _dequant_all(extra, "ocp")
    gi_main = main_idx.long().view(batch, SWA)
    gi_extra = extra_idx.long().view(batch, EXTRA)
    scale = D ** -0.5

    def baseline():
        k = torch.cat([kv_main[gi_main], kv_extra[gi_extra]], dim=1).unsqueeze(1)  # [b, 1, n, 512]
        return torch.nn.functional.scaled_dot_product_attention(q.unsqueeze(2), k.expand(-1, HEADS, -1, -1),
                                                                k.expand(-1, HEADS, -1, -1), scale=scale)

    baseline()
    t = do_bench(baseline, warmup=25, rep=200, return_mode="median") * 1e-3
    rows.append({"batch": batch, "impl": "torch gather + SDPA (bf16)", "seconds": t,
                 "bytes_per_s": bytes_moved / t, "flops_per_s": flops / t,
                 "bw_fraction": bytes_moved / t / ceil["copy_bytes_per_s"],
                 "flop_fraction": flops / t / ceil["bf16_flops_per_s"]})
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 512])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_decode: needs a GPU (the interpreter's timings mean nothing)", file=sys.stderr)
        return 2
    device = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    ceil = ceilings(device)
    print(f"device {torch.cuda.get_device_name()}: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, "
          f"bf16 matmul {ceil['bf16_flops_per_s'] / 1e12:.0f} TFLOP/s (measured now)")
    rows = []
    for b in args.batch:
        rows += bench_batch(b, ceil, device, g)
    print(f"{'batch':>5}  {'implementation':<30} {'time us':>9} {'GB/s':>8} {'TFLOP/s':>8} {'%bw':>6} {'%flop':>6} "
          f"{'vs SDPA':>8}")
    for b in args.batch:
        base = next(r for r in rows if r["batch"] == b and r["impl"].startswith("torch"))
        for r in (r for r in rows if r["batch"] == b):
            print(f"{b:>5}  {r['impl']:<30} {r['seconds'] * 1e6:>9.1f} {r['bytes_per_s'] / 1e9:>8.0f} "
                  f"{r['flops_per_s'] / 1e12:>8.2f} {100 * r['bw_fraction']:>5.1f}% {100 * r['flop_fraction']:>5.1f}% "
                  f"{base['seconds'] / r['seconds']:>7.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"ceilings": ceil, "rows": rows}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
