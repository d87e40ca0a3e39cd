"""What Triton emits for our decode builds on an NVIDIA sm_90 GPU (H100 / H200), read on a CPU host: no GPU, no launch.

    python3 benchmarks/sm90_static.py                                  # the table for the default rows
    python3 benchmarks/sm90_static.py --rows gfx950:single-read gfx942:narrow --batch 512 --json /tmp/s.json
    python3 benchmarks/sm90_static.py --rows logits:bf16 logits:default logits:fp8dev   # the paged logits

Each row (``family:variant``, a variant name of ``benchmarks/decode_variants.py``'s ``VARIANTS``) runs our
``sparse_attn_decode`` on CPU tensors of ``decode_variants.Work``'s shape (64 heads, 128 SWA + 512 extra tokens per
query row) with Triton native (a ``logits:NAME`` row: the paged MQA logits kernel under
``benchmarks/logits_variants.py``'s build NAME at 64 requests x 8192 context, 64 heads) but its driver replaced by
one that reports an sm_90 target and never launches: each kernel launch becomes ``JITFunction.warmup`` (Triton's
own specialization of the arguments, then its full compile: TTGIR, PTX, ptxas, cubin). The hardware fp8 conversion
is taken where sm_90 has it (OCP), as on the H200.

Per kernel it reports, from the cubin (the wheel's ``cuobjdump``): registers per thread, the spill stack, shared
memory, and SASS instruction counts (HGMMA, global loads, LDGSTS (cp.async), shared stores and loads, local-memory
spill traffic STL/LDL, conversions, MUFU); from the PTX the wgmma shapes; from the TTGIR the shared-memory
allocations of dot operands and each dot's operand shapes and MMA layout (``warpsPerCTA``).

These are static facts of one Triton version (this host's; the H200 runs its own): instruction counts are per
kernel body, not per executed tile, and nothing here is a time. ``benchmarks/DECODE_PERF.md`` uses them beside the
profiles taken on the GPU.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

DEFAULT_ROWS = ["gfx950:narrow", "gfx950:single-read", "gfx950:h32+w8", "gfx942:narrow", "gfx942:single-read"]
#: SASS opcodes the table counts (the first dotted part is matched)
SASS_OPS = ("HGMMA", "QGMMA", "HMMA", "LDG", "LDGSTS", "STS", "LDS", "LDSM", "STL", "LDL", "F2FP", "F2F", "I2F",
            "PRMT", "MUFU", "FMUL", "FFMA", "BAR")


class _CompileOnlyDriver:
    """Triton's active driver for a compile-only run: device 0 is an sm_90 GPU, and nothing is ever launched."""

    def __init__(self, target):
        self._target = target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_current_target(self):
        return self._target

    def is_active(self):
        return True

    def get_active_torch_device(self):
        import torch

        return torch.device("cpu")


def _install(capability: int):
    """Native Triton on CPU tensors, compile-only: returns the list each launch's (name, grid, meta, compiled)
    lands in. Must run before ``impl`` is imported."""
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("sm90_static: TRITON_INTERPRET is set; this tool compiles natively (unset it)")
    os.environ["TRITON_INTERPRET"] = "0"
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver

    driver.set_active(_CompileOnlyDriver(GPUTarget("cuda", capability, 32)))

    import impl.decode as D
    import impl.triton_helpers as H
    import impl.validation as V

    D.kernel_device = lambda: "cpu"  # the inputs stay on the host: nothing is launched
    V.require_kernel_device = D.require_kernel_device = lambda *a, **k: None
    H.native_fp8_flavours = lambda device=None, mode=None: frozenset({"ocp"})  # sm_89+: cvt e4m3x2 in hardware
    compiled = []

    def compile_only(kernel, grid, *args, **meta):
        compiled.append((kernel.fn.__name__, tuple(grid), dict(meta), kernel.warmup(*args, grid=grid, **meta)))

    D._launch = compile_only
    return compiled


def _tool(name: str) -> str:
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def facts(name: str, grid, meta: dict, k, work_dir: Path) -> dict:
    """The static facts of one compiled kernel."""
    cubin = work_dir / f"{name}.cubin"
    cubin.write_bytes(k.asm["cubin"])
    usage = subprocess.run([_tool("cuobjdump"), "--dump-resource-usage", str(cubin)], capture_output=True,
                           text=True).stdout
    res = dict(re.findall(r"(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    sass = subprocess.run([_tool("cuobjdump"), "-sass", str(cubin)], capture_output=True, text=True).stdout
    ops = collections.Counter(
        m.group(1).split(".")[0]
        for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9]*(?:\.[A-Z0-9.]+)?)", sass))
    ptx, ttgir = k.asm["ptx"], k.asm["ttgir"]
    wgmma = collections.Counter(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)\.", ptx))
    dots = collections.Counter()
    for line in ttgir.splitlines():
        m = re.search(r"warp_group_dot .*?: (.*?) \* (.*?) -> tensor<(\w+), #(\w+)>", line)
        if m:
            a = re.search(r"<(\d+x\d+)x\w+", m.group(1))
            b = re.search(r"<(\d+x\d+)x\w+", m.group(2))
            dots[f"{a.group(1) if a else '?'} @ {b.group(1) if b else '?'} -> {m.group(3)} #{m.group(4)}"] += 1
    layouts = {n: f"warps [{w}], instr [{i}]" for n, w, i in re.findall(
        r"^#(mma\d*) = #ttg\.nvidia_mma<\{[^}]*warpsPerCTA = \[([\d, ]+)\], instrShape = \[([\d, ]+)\]", ttgir, re.M)}
    operand_allocs = collections.Counter(
        m.group(1) for m in re.finditer(r"ttg\.local_alloc %\S+ : \(tensor<(\d+x\d+xbf16)", ttgir))
    return {"kernel": name, "grid": list(grid), "num_warps": k.metadata.num_warps,
            "instructions": sum(ops.values()),
            "num_stages": meta.get("num_stages"), "shared_bytes": k.metadata.shared,
            "registers": int(res.get("REG", 0)), "spill_stack_bytes": int(res.get("STACK", 0)),
            "sass": {op: ops[op] for op in SASS_OPS if ops.get(op)}, "wgmma": dict(wgmma), "dots": dict(dots),
            "mma_layouts": layouts, "bf16_operand_allocs": dict(operand_allocs)}


def logits_kernel(name: str, requests: int = 64, context: int = 8192):
    """(grid, meta, compiled) of our paged MQA logits kernel under ``logits_variants.VARIANTS``' build ``name`` at
    ``smv bench``'s logits point (64 heads, 64-token NORMAL blocks, one query row per request), compiled natively
    with the hardware fp8 conversion, as on the H200. Call after :func:`_install`."""
    import torch

    import impl.indexer_logits as il
    import logits_variants as LV
    from impl.targets import get_target

    builds = dict(LV.VARIANTS)
    if name not in builds:
        raise SystemExit(f"sm90_static: unknown logits build {name!r} (a name of logits_variants.VARIANTS)")
    heads, bs = 64, 64
    blocks = requests * context // bs
    q = torch.zeros(requests, 1, heads, 128, dtype=torch.uint8)
    cache = torch.zeros(blocks, bs * 132, dtype=torch.uint8)
    w = torch.zeros(requests, heads)
    ctx = torch.full((requests,), context, dtype=torch.int32)
    table = torch.arange(blocks, dtype=torch.int32).view(requests, -1)
    out = torch.empty(requests, context)
    grid, meta = il._paged_launch(il.LogitsVariant(**builds[name]), requests, context, bs, cache,
                                  get_target("gfx950"))
    k = il._paged_mqa_logits_kernel.warmup(
        q, q.stride(0), q.stride(1), q.stride(2), cache, cache.stride(0), bs, w, w.stride(0), ctx, ctx.stride(0), 0,
        table, table.stride(0), out, out.stride(0), context, NUM_HEADS=heads, H_PAD=heads, NEXT_N=1,
        CTX_PER_ROW=False, SHUFFLE=False, IS_FNUZ=False, HW_FP8=True, grid=grid, **meta)
    return grid, meta, k


def run_rows(rows: list[str], batch: int, capability: int, work_dir: Path) -> list[dict]:
    compiled = _install(capability)
    import torch

    import decode_variants as DV

    work = DV.Work(batch, torch.device("cpu"), 64, 128, 512)
    out = []
    for row in rows:
        family, _, name = row.partition(":")
        if family == "logits":
            grid, meta, k = logits_kernel(name)
            out.append({"row": row, "batch": 64, "num_splits": None,
                        **facts(name.replace("+", "_"), grid, meta, k, work_dir)})
            continue
        if family not in DV.VARIANTS or name not in dict(DV.VARIANTS[family]):
            raise SystemExit(f"sm90_static: unknown row {row!r} (family:variant of decode_variants.VARIANTS)")
        run, plan, _, _ = work.ours(family)
        start = len(compiled)
        with DV.variant_active(family, name, dict(DV.VARIANTS[family])[name]):
            run()
        for kname, grid, meta, k in compiled[start:]:
            out.append({"row": row, "batch": batch, "num_splits": plan.num_splits,
                        **facts(kname, grid, meta, k, work_dir)})
    return out


def table(results: list[dict]) -> str:
    lines = [f"{'row':<22} {'kernel':<10} {'grid':<12} {'warps':>5} {'regs':>4} {'spill B':>7} {'smem KB':>7}  "
             "wgmma / SASS counts"]
    for r in results:
        kind = "partial" if "partial" in r["kernel"] else ("reduce" if "reduce" in r["kernel"] else r["kernel"][:10])
        s = r["sass"]
        counts = ", ".join(f"{k} {v}" for k, v in r["wgmma"].items())
        shown = ("HGMMA", "QGMMA", "HMMA", "LDGSTS", "LDG", "STS", "LDS", "STL", "LDL", "F2F", "F2FP", "PRMT", "FMUL")
        counts += (" | " if counts else "") + ", ".join(f"{k} {s[k]}" for k in shown if k in s)
        counts += f" | {r['instructions']} in all"
        lines.append(f"{r['row']:<22} {kind:<10} {'x'.join(map(str, r['grid'])):<12} {r['num_warps']:>5} "
                     f"{r['registers']:>4} {r['spill_stack_bytes']:>7} {r['shared_bytes'] / 1024:>7.1f}  {counts}")
        for d, n in r["dots"].items():
            lines.append(f"{'':<22}   dot x{n}: {d}")
        for n, lay in r["mma_layouts"].items():
            lines.append(f"{'':<22}   #{n}: {lay}")
        if r["bf16_operand_allocs"]:
            lines.append(f"{'':<22}   bf16 tiles stored to shared memory: "
                         + ", ".join(f"{k} x{v}" for k, v in r["bf16_operand_allocs"].items()))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", nargs="*", default=DEFAULT_ROWS)
    p.add_argument("--batch", type=int, default=64, help="the launch's batch (the split count follows from it)")
    p.add_argument("--capability", type=int, default=90, help="the sm_ version compiled for (90: H100 / H200)")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--work-dir", type=Path, default=None, help="where the cubins go (default: a temporary folder)")
    a = p.parse_args(argv)
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        wd = a.work_dir or Path(tmp)
        wd.mkdir(parents=True, exist_ok=True)
        results = run_rows(a.rows, a.batch, a.capability, wd)
    import triton

    print(f"sm90_static: Triton {triton.__version__}, sm_{a.capability}, batch {a.batch}, 64 heads, 128 + 512 tokens")
    print(table(results))
    if a.json:
        a.json.write_text(json.dumps({"triton": triton.__version__, "capability": a.capability, "batch": a.batch,
                                      "rows": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
