"""``smv bench``: the decode benchmarks through pytest-benchmark, their side-by-side table and a roofline plot.

The benchmarks themselves are pytest tests in ``tests/benchmarks/bench_*.py`` (a file pattern plain ``pytest`` does not
collect, so they never slow the test suite); this module holds what they share and what reads their JSON:

- the workloads (DSv4 decode shapes: 64 heads, SWA 128 + 512 extra tokens per query) and the figures each one moves
  (bytes, FLOPs), so a CPU test can check them;
- GPU timing: ``CudaEventClock``, a pytest-benchmark timer that returns GPU time between CUDA events, and
  ``L2Flush``, run before every round outside the timing; ``measure`` runs the same protocol without pytest-benchmark
  (the in-run references: copy and matmul ceilings, the torch baseline);
- ``derived_figures``: what every benchmark stores in ``benchmark.extra_info`` (GB/s, TFLOP/s, ratio to the torch
  baseline and to the measured ceilings), so pytest-benchmark's own JSON carries the side-by-side ratios;
- ``format_table`` and ``plot_roofline``, which read only that JSON (any machine);
- ``add_parser(subparsers)`` / ``main(args)``: the ``smv bench`` command (also ``python -m contracts.cli.bench``).

Exit codes of ``smv bench``: 0 when every selected benchmark ran, or was skipped because this machine has no GPU
(one line says so; host-side benchmarks still run); 1 when a benchmark failed or errored, or ``--require-gpu`` was
given on a machine without a GPU; 2 for a usage error (bad option, unreadable or malformed JSON, ``-k`` matching
nothing, pytest-benchmark or the benchmark files missing, matplotlib missing for ``--plot``).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

#: version of the ``extra_info`` fields below; bump it when one changes meaning (add fields freely)
EXTRA_INFO_VERSION = 1

HEADS, SWA, EXTRA = 64, 128, 512
BATCHES = (1, 64, 512)
FAMILIES = ("generic", "gfx942", "gfx950")
#: families whose reduce is a separate launch (split-K partials, then the reduce over splits)
SPLIT_FAMILIES = ("gfx942", "gfx950")
#: timed rounds per GPU benchmark (each after an L2 flush), warm-up rounds before them, rounds of a ceiling
GPU_ROUNDS, GPU_WARMUP_ROUNDS, CEILING_ROUNDS = 100, 10, 50
COPY_BYTES = 1 << 30  # one copy direction; the copy ceiling counts read + write
MATMUL_SIZE = 8192
#: zeroed before every timed round: larger than any GPU's L2, and long enough on the GPU (~0.2 ms at 5 TB/s) that
#: the host has queued the timed launch before the GPU reaches it, so launch overhead stays out of the events
FLUSH_BYTES = 1 << 30

PLOT_HINT = "pip install 'sparse-mla-verify[plot]'"


class BenchUsageError(ValueError):
    """A bad option or an unreadable benchmark JSON: one line, exit 2."""


# ---------------------------------------------------------------------------------------------------------------
# Figures: what each benchmark must move and compute (pure arithmetic, checked on any machine)
# ---------------------------------------------------------------------------------------------------------------

def decode_figures(batch: int, heads: int = HEADS, swa: int = SWA, extra: int = EXTRA) -> dict:
    """The fewest bytes a decode must move and the FLOPs it must do. Bytes: each fp8_ds_mla row it reads once
    (584 B: 448 fp8 + 128 B RoPE + 7 codes + pad; the heads share each row), q read and the bf16 output written.
    FLOPs: QK and PV, 2 * 2 * batch * heads * tokens * 512."""
    from impl import formats

    tokens = swa + extra
    width = formats.DSV4_HEAD_DIM
    return {"bytes": batch * tokens * formats.DSV4_TOKEN_BYTES + 2 * batch * heads * width * 2,
            "flops": 4 * batch * heads * tokens * width, "tokens_per_query": tokens}


def reduce_figures(batch: int, num_splits: int, heads: int = HEADS) -> dict:
    """The split-K reduce: it reads part_m, part_l [b, S, h] and part_acc [b, S, h, 512] (fp32) and writes the bf16
    output; about two FLOPs per partial element (rescale and add)."""
    from impl import formats

    width = formats.DSV4_HEAD_DIM
    partials = batch * num_splits * heads
    return {"bytes": partials * 4 * (2 + width) + batch * heads * width * 2, "flops": 2 * partials * width}


def copy_figures(n: int = COPY_BYTES) -> dict:
    return {"bytes": 2 * n, "flops": 0}


def matmul_figures(m: int = MATMUL_SIZE) -> dict:
    """bf16 [m, m] x [m, m]: 2 m^3 FLOPs over three m x m matrices (two read, one written)."""
    return {"bytes": 3 * m * m * 2, "flops": 2 * m ** 3}


@dataclass(frozen=True)
class References:
    """The in-run yardsticks every benchmark is divided by. Any may be None (not measured in this run)."""

    copy_bytes_per_s: float | None = None
    matmul_flops_per_s: float | None = None
    torch_seconds: dict = field(default_factory=dict)  # batch -> median seconds of the gather + SDPA baseline


def derived_figures(*, kind: str, family: str, seconds: float | None, bytes: int, flops: int,
                    refs: References, batch: int | None = None, **extra) -> dict:
    """The ``extra_info`` of one benchmark: its figures, its rates and its ratios to the references. ``seconds`` is
    the median GPU time per call (None when pytest-benchmark did not time: ``--benchmark-disable`` or xdist)."""
    info = {"smv_bench": EXTRA_INFO_VERSION, "kind": kind, "family": family, "batch": batch, "bytes": int(bytes),
            "flops": int(flops), "seconds": seconds, "bytes_per_s": None, "flops_per_s": None, "gb_per_s": None,
            "tflop_per_s": None, "ratio_to_torch": None, "torch_seconds": None,
            "fraction_of_copy_ceiling": None, "fraction_of_matmul_ceiling": None,
            "copy_ceiling_bytes_per_s": refs.copy_bytes_per_s, "matmul_ceiling_flops_per_s": refs.matmul_flops_per_s}
    info.update(extra)
    if seconds is None or not seconds > 0:
        return info
    info["bytes_per_s"] = bytes / seconds
    info["flops_per_s"] = flops / seconds
    info["gb_per_s"] = bytes / seconds / 1e9
    info["tflop_per_s"] = flops / seconds / 1e12
    if refs.copy_bytes_per_s:
        info["fraction_of_copy_ceiling"] = bytes / seconds / refs.copy_bytes_per_s
    if refs.matmul_flops_per_s:
        info["fraction_of_matmul_ceiling"] = flops / seconds / refs.matmul_flops_per_s
    base = refs.torch_seconds.get(batch) if batch is not None else None
    if base and kind in ("decode", "baseline"):
        info["torch_seconds"] = base
        info["ratio_to_torch"] = base / seconds  # > 1: faster than torch gather + SDPA
    return info


# ---------------------------------------------------------------------------------------------------------------
# Workloads (built on the host, moved to the device; the same code runs under the interpreter at small sizes)
# ---------------------------------------------------------------------------------------------------------------

#: distinct random blocks per cache; the rest repeat them (the indices are a random permutation, so the access
#: pattern is as random as with all-distinct data, and building batch 512 takes seconds, not minutes)
DISTINCT_BLOCKS = 64


def _rand_cache(num_slots: int, block_size: int, flavour: str, g, device):
    """(device view, host view): a padded-stride cache of ``num_slots`` slots with random finite fp8 values (no NaN
    codes) and scale codes near 127. Block ``i`` holds the data of block ``i % k`` of the host view, which has
    ``k = min(blocks, DISTINCT_BLOCKS)`` blocks; slot ``s`` therefore holds host slot ``s % (k * block_size)``."""
    import torch

    from impl import formats

    nb = -(-num_slots // block_size)
    k = min(nb, DISTINCT_BLOCKS)
    n = k * block_size
    small_pool, small = formats.allocate_fp8_ds_mla_pool(k, block_size, device="cpu")
    x = torch.randn(n, formats.DSV4_NOPE_DIM, generator=g) * 8.0
    formats.pack_fp8_ds_mla(small, torch.arange(n), formats.fp8_encode(x, flavour),
                            torch.randint(120, 130, (n, formats.DSV4_NUM_GROUPS), generator=g,
                                          dtype=torch.int32).to(torch.uint8),
                            (torch.randn(n, formats.DSV4_ROPE_DIM, generator=g) * 0.5).to(torch.bfloat16))
    stride = small.stride(0)
    blocks = small_pool.view(k, stride).to(device)
    pool = blocks[torch.arange(nb, device=blocks.device) % k].reshape(-1)
    view = pool.as_strided((nb, block_size, formats.DSV4_TOKEN_BYTES), (stride, formats.DSV4_TOKEN_BYTES, 1))
    return view, small


class DecodeWorkload:
    """One batch of DSv4 decode: q, a sink of -inf (no sink, so the torch baseline computes the same function),
    a main (SWA) cache per fp8 flavour and the extra cache, each query row reading its own ``swa`` main and
    ``extra`` extra slots in a random order. ``decode_call`` / ``reduce_call`` / ``baseline_call`` return the
    zero-argument callables a benchmark times; every buffer they write is allocated here, outside the timing."""

    def __init__(self, batch: int, device, *, heads: int = HEADS, swa: int = SWA, extra: int = EXTRA, seed: int = 0,
                 cu_count: int | None = None):
        import torch

        from impl import formats

        self.batch, self.heads, self.swa, self.extra, self.device = batch, heads, swa, extra, torch.device(device)
        self.cu_count = cu_count  # None: each family's own target CU count, as production plans
        g = torch.Generator().manual_seed(seed)
        width = formats.DSV4_HEAD_DIM
        self.q = (torch.randn(batch, heads, width, generator=g) * 0.3).to(torch.bfloat16).to(self.device)
        self.sink = torch.full((heads,), -math.inf, dtype=torch.float32, device=self.device)
        self.main_idx = torch.randperm(batch * swa, generator=g).to(torch.int32).to(self.device)
        self.extra_idx = torch.randperm(batch * extra, generator=g).to(torch.int32).to(self.device)
        self.main_ptr = (torch.arange(batch + 1, dtype=torch.int32) * swa).to(self.device)
        self.extra_ptr = (torch.arange(batch + 1, dtype=torch.int32) * extra).to(self.device)
        made = {fl: _rand_cache(batch * swa, 64, fl, torch.Generator().manual_seed(seed + 1), self.device)
                for fl in ("ocp", "fnuz")}
        self.main = {fl: m[0] for fl, m in made.items()}
        self.extra_cache, extra_host = _rand_cache(batch * extra, 16, "ocp", g, self.device)
        self._host = {"main": made["ocp"][1], "extra": extra_host}
        self.figures = decode_figures(batch, heads, swa, extra)

    def _main_for(self, family: str):
        from impl.targets import get_target

        return self.main["fnuz" if get_target(family).main_cache_is_fnuz else "ocp"]

    def plan(self, family: str):
        from impl.decode import plan_decode

        return plan_decode(family, self.batch, self.heads, self.main_idx.numel(), self.extra_idx.numel(),
                           cu_count=self.cu_count)

    def decode_call(self, family: str):
        """(callable, plan): one ``sparse_attn_decode`` with a frozen plan and caller-owned out and workspace, and
        the host indptr check off (it reads the device), so a call is the launches and nothing else."""
        import torch

        from impl.decode import DecodeWorkspace, sparse_attn_decode

        plan = self.plan(family)
        main = self._main_for(family)
        out = torch.empty_like(self.q)
        ws = (DecodeWorkspace.allocate(self.batch, plan.num_splits, self.heads, self.device)
              if plan.family != "generic" else None)

        def run():
            return sparse_attn_decode(self.q, main, self.main_idx, self.main_ptr, self.extra_cache, self.extra_idx,
                                      self.extra_ptr, attn_sink=self.sink, target=family, plan=plan, workspace=ws,
                                      out=out, check_indptr=False)

        return run, plan

    def subject_decode_call(self, subject, family: str):
        """(callable, None): the subject's own decode entry point for ``family``'s target, called the way its
        production caller does (its own plan and workspace; ours and upstream alike), on the same inputs as
        :meth:`decode_call`. ``subject`` is a :class:`contracts.subjects.Subject`; a family the subject cannot run
        here raises :class:`contracts.subjects.SubjectSkip` (the benchmark skips, saying why)."""
        import torch

        from contracts.subjects import using

        sub = subject.bind(family)
        main = self._main_for(family)
        out = torch.empty_like(self.q)
        decode = sub.decode.sparse_attn_decode

        def run():
            with using(subject):
                return decode(self.q, main, self.main_idx, self.main_ptr, self.extra_cache, self.extra_idx,
                              self.extra_ptr, attn_sink=self.sink, target=family, out=out)

        run()  # a family the subject cannot run here says so before any timing
        return run, None

    def _partials(self, family: str):
        """(plan, workspace, out): the split-K partials one full decode of ours left in a fresh workspace."""
        import torch

        from impl.decode import DecodeWorkspace, sparse_attn_decode

        plan = self.plan(family)
        if plan.family == "generic":
            raise ValueError(f"family: {family!r} has no separate reduce (one kernel does the whole decode)")
        ws = DecodeWorkspace.allocate(self.batch, plan.num_splits, self.heads, self.device)
        out = torch.empty_like(self.q)
        sparse_attn_decode(self.q, self._main_for(family), self.main_idx, self.main_ptr, self.extra_cache,
                           self.extra_idx, self.extra_ptr, attn_sink=self.sink, target=family, plan=plan,
                           workspace=ws, out=out, check_indptr=False)
        return plan, ws, out

    def reduce_call(self, family: str):
        """(callable, plan): the reduce alone, over partials one full decode left in the workspace."""
        from impl.decode import decode_reduce

        plan, ws, out = self._partials(family)

        def run():
            return decode_reduce(ws, attn_sink=self.sink, adaptive=plan.adaptive, out=out)

        return run, plan

    def subject_reduce_call(self, subject, family: str):
        """(callable, plan): the subject's reduce alone, launched as its own wrapper launches it, over the partials
        our full decode left in the workspace: the same partials :meth:`reduce_call` reduces (their layout is the
        API's, shared with the subject), so both columns do the same work on the same bytes."""
        from contracts.subjects import EntryMissing, using

        plan, ws, out = self._partials(family)
        fam = subject.bind(family).decode
        try:
            launcher = fam.reduce_launch
        except (EntryMissing, AttributeError):  # a family without it: its decode_reduce, adapter and all
            launcher = None
        if launcher is not None:  # the subject's kernel launch alone, without its adapter's host work
            launch, out = launcher(ws, attn_sink=self.sink, adaptive=plan.adaptive, out=out)

            def run():
                launch()
                return out
        else:
            def run():
                with using(subject):
                    return fam.decode_reduce(ws, attn_sink=self.sink, adaptive=plan.adaptive, out=out)

        run()
        return run, plan

    def baseline_call(self):
        """The torch baseline on the OCP caches: rows gathered from pre-dequantized bf16 copies (torch indexing),
        then ``scaled_dot_product_attention`` of [b, h, 1, 512] over [b, 1, n, 512] expanded to h heads. It reads
        bf16 rows (1024 B) where the kernels read 584 B fp8 rows, and dequantizes nothing."""
        import torch

        from impl import formats

        def dequant(host, cache):
            # slot s of the device cache holds host slot s % (host slots): see _rand_cache
            m = host.shape[0] * host.shape[1]
            rows = formats.dequantize_fp8_ds_mla(host, torch.arange(m), "ocp").to(torch.bfloat16).to(self.device)
            return rows[torch.arange(cache.shape[0] * cache.shape[1], device=self.device) % m]

        kv_main = dequant(self._host["main"], self.main["ocp"])
        kv_extra = dequant(self._host["extra"], self.extra_cache)
        gi_main = self.main_idx.long().view(self.batch, self.swa)
        gi_extra = self.extra_idx.long().view(self.batch, self.extra)
        scale = formats.DSV4_HEAD_DIM ** -0.5
        q4 = self.q.unsqueeze(2)

        def run():
            k = torch.cat([kv_main[gi_main], kv_extra[gi_extra]], dim=1).unsqueeze(1)  # [b, 1, n, 512]
            k = k.expand(-1, self.heads, -1, -1)
            return torch.nn.functional.scaled_dot_product_attention(q4, k, k, scale=scale).squeeze(2)

        return run


# ---------------------------------------------------------------------------------------------------------------
# GPU timing
# ---------------------------------------------------------------------------------------------------------------

class CudaEventClock:
    """A pytest-benchmark timer that returns GPU time. pytest-benchmark's pedantic runner calls its timer twice a
    round, before and after the target: the first call records a start event and returns 0.0; the second records an
    end event, waits for it, and returns the seconds between the two on the GPU. ``reset`` (called by the round's
    setup) makes the next call a start again, so one stray call cannot shift every later round.

    Waiting only at the end matters: a timer that synchronised at the start would leave the GPU idle while the host
    prepares the launch, and the round would time the host."""

    __name__ = "cuda_event_clock"  # pytest-benchmark names the timer in its JSON

    def __init__(self, event_factory=None):
        if event_factory is None:
            import torch

            def event_factory():
                return torch.cuda.Event(enable_timing=True)
        self._event = event_factory
        self._start = None

    def reset(self) -> None:
        self._start = None

    def __call__(self) -> float:
        ev = self._event()
        ev.record()
        if self._start is None:
            self._start = ev
            return 0.0
        start, self._start = self._start, None
        ev.synchronize()
        return start.elapsed_time(ev) * 1e-3


class L2Flush:
    """Run before every timed round (outside the timing): zero a buffer larger than L2, so every round reads its
    inputs from HBM as a decode step does, and keep the GPU busy while the host queues the timed launch."""

    def __init__(self, device, nbytes: int = FLUSH_BYTES):
        import torch

        self._buf = torch.empty(nbytes, dtype=torch.uint8, device=device)

    def __call__(self) -> None:
        self._buf.zero_()


def measure(fn, flush, clock, *, rounds: int, warmup_rounds: int) -> list[float]:
    """The rounds of pytest-benchmark's pedantic runner, without pytest-benchmark: per round flush, reset the clock,
    start, call, stop. Returns the seconds of each timed round."""
    times = []
    for i in range(warmup_rounds + rounds):
        flush()
        clock.reset()
        start = clock()
        fn()
        t = clock() - start
        if i >= warmup_rounds:
            times.append(t)
    return times


def graph_replay(fn, device):
    """A zero-argument replay of one CUDA-graph capture of ``fn`` (HIP graphs on ROCm), or None where ``device``
    has no graphs (the CPU of the suite's own dry run). ``fn`` runs once on a side stream before the capture, as
    capture wants; its buffers are the caller's, so every replay writes the same output. A replay costs the host
    one launch whatever ``fn`` does on the host (an adapter's module activation, a wrapper's checks), so its GPU
    time is the kernels' alone on both sides of a comparison."""
    import torch

    if torch.device(device).type != "cuda":
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    torch.cuda.synchronize()
    return graph.replay


def graph_median(fn, device, flush, *, rounds: int, warmup_rounds: int) -> tuple[float | None, str | None]:
    """(median seconds, None) of ``graph_replay(fn)`` event-timed after an L2 flush each round, as the pedantic
    rounds time ``fn`` itself; (None, why) where there are no graphs or the capture failed (a call that
    synchronises with the host cannot be captured: the reason names it)."""
    try:
        replay = graph_replay(fn, device)
    except RuntimeError as exc:
        return None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    if replay is None:
        return None, "no CUDA graphs on this device"
    times = sorted(measure(replay, flush, CudaEventClock(), rounds=rounds, warmup_rounds=warmup_rounds))
    return times[len(times) // 2], None


def host_seconds(fn, sync, calls: int = 5) -> float:
    """Median host time of queuing one call of ``fn`` (``sync`` drains the device between calls, outside the
    timing). A timed round is GPU time only when this is shorter than the flush before it."""
    import time

    times = []
    for _ in range(calls):
        sync()
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    sync()
    times.sort()
    return times[len(times) // 2]


def install_clock(benchmark, clock) -> None:
    """Make ``benchmark`` (pytest-benchmark's fixture) time with ``clock``. The fixture reads its timer from
    ``_timer`` when a run starts; ``--benchmark-timer`` cannot be used because it would apply to the host-side
    benchmarks as well."""
    if not hasattr(benchmark, "_timer"):
        raise RuntimeError(f"pytest-benchmark {_pytest_benchmark_version()}: its fixture has no _timer; this "
                           f"version is not supported by the GPU benchmarks")
    benchmark._timer = clock


def _pytest_benchmark_version() -> str:
    try:
        import pytest_benchmark

        return getattr(pytest_benchmark, "__version__", "?")
    except ImportError:
        return "(not installed)"


def benchmark_median(benchmark) -> float | None:
    """Median seconds per call pytest-benchmark measured, or None when it did not time (disabled, xdist)."""
    st = getattr(benchmark, "stats", None)
    if st is None:
        return None
    return float(st.stats.median)


# ---------------------------------------------------------------------------------------------------------------
# Compiler statistics (registers, spills, shared memory of the binaries Triton built)
# ---------------------------------------------------------------------------------------------------------------

def compiled_kernels(jitfn) -> list:
    """Every compiled binary a ``@triton.jit`` function holds in this process (Triton 3.x keeps them per device in
    ``device_caches``, a tuple whose dicts map a specialization key to a CompiledKernel). Empty under the
    interpreter, which compiles nothing."""
    found, seen = [], set()
    caches = getattr(jitfn, "device_caches", None)
    if caches is None and getattr(jitfn, "fn", None) is not None:
        caches = getattr(jitfn.fn, "device_caches", None)
    for entry in (caches or {}).values():
        for part in (entry if isinstance(entry, tuple) else (entry,)):
            if isinstance(part, dict):
                for v in part.values():
                    if hasattr(v, "metadata") and id(v) not in seen:
                        seen.add(id(v))
                        found.append(v)
    return found


def kernel_stats(ck) -> dict:
    """``{n_regs, n_spills, shared, num_warps, num_stages}`` of one compiled kernel (``shared`` in bytes; a field
    the binary does not know is None). Registers and spills are filled when the binary is first loaded."""
    if getattr(ck, "n_regs", None) is None and hasattr(ck, "_init_handles"):
        try:
            ck._init_handles()
        except Exception:  # noqa: BLE001 - a binary that cannot load here keeps None
            pass
    md = getattr(ck, "metadata", None)
    return {"n_regs": getattr(ck, "n_regs", None), "n_spills": getattr(ck, "n_spills", None),
            "shared": getattr(md, "shared", None), "num_warps": getattr(md, "num_warps", None),
            "num_stages": getattr(md, "num_stages", None)}


class StatsWatch:
    """Which binaries appeared since the last look, per kernel name: run one variant, then ``new()`` gives the
    statistics of the kernels it compiled (or loaded from Triton's disk cache)."""

    def __init__(self, kernels: dict):
        self.kernels = dict(kernels)  # name -> @triton.jit function
        self.seen = {n: {id(c) for c in compiled_kernels(k)} for n, k in self.kernels.items()}

    def new(self) -> dict:
        out = {}
        for n, k in self.kernels.items():
            for c in compiled_kernels(k):
                if id(c) not in self.seen[n]:
                    self.seen[n].add(id(c))
                    out[n] = kernel_stats(c)
        return out


def format_stats(stats: dict) -> str:
    """``name: 128r/0sp/80K`` per kernel (registers / spilled registers / shared KiB)."""
    parts = []
    for name, st in stats.items():
        sh = st.get("shared")
        parts.append(f"{name}: {st.get('n_regs')}r/{st.get('n_spills')}sp/"
                     f"{'-' if sh is None else round(sh / 1024)}K")
    return " ".join(parts)


# ---------------------------------------------------------------------------------------------------------------
# Reading pytest-benchmark's JSON
# ---------------------------------------------------------------------------------------------------------------

def load_results(path) -> dict:
    """pytest-benchmark's JSON from ``path``; a ``BenchUsageError`` naming the file when it cannot be read or is not
    that shape."""
    p = Path(path)
    try:
        doc = json.loads(p.read_text())
    except FileNotFoundError:
        raise BenchUsageError(f"{p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise BenchUsageError(f"{p}: cannot read it ({e})") from None
    except json.JSONDecodeError as e:
        raise BenchUsageError(f"{p}: not JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("benchmarks"), list):
        raise BenchUsageError(f"{p}: not a pytest-benchmark JSON (expected an object with a 'benchmarks' list)")
    for i, b in enumerate(doc["benchmarks"]):
        if not isinstance(b, dict) or not isinstance(b.get("stats"), dict) or "median" not in b["stats"]:
            raise BenchUsageError(f"{p}: benchmarks[{i}] has no stats.median")
    return doc


def _ours(doc: dict) -> list[dict]:
    """Our benchmarks' extra_info, with ``seconds`` taken from pytest-benchmark's own median and ``name``."""
    rows = []
    for b in doc["benchmarks"]:
        info = b.get("extra_info") or {}
        if "smv_bench" not in info:
            continue
        r = dict(info)
        r["seconds"] = float(b["stats"]["median"])
        r["fullname"] = b.get("fullname") or b.get("name")
        rows.append(r)
    return rows


def _device_name(doc: dict) -> str:
    for r in _ours(doc):
        if r.get("device"):
            return str(r["device"])
    mi = doc.get("machine_info") or {}
    return str(mi.get("node") or mi.get("machine") or "unknown device")


_KIND_ORDER = {"decode": 0, "baseline": 1, "reduce": 2}


def _impl_label(r: dict) -> str:
    if r["kind"] == "baseline":
        return "torch gather + SDPA (bf16)"
    if r.get("subject"):
        return f"{r['subject']} {'reduce ' if r['kind'] == 'reduce' else ''}{r['family']}"
    s = f" (S={r['num_splits']})" if r.get("num_splits") is not None else ""
    return f"triton {r['family']}{s}" if r["kind"] == "decode" else f"reduce {r['family']}{s}"


def _pct(x) -> str:
    return f"{100 * x:>5.1f}%" if x is not None else f"{'-':>6}"


def format_table(doc: dict, compare: dict | None = None, compare_name: str = "before") -> str:
    """The side-by-side table: ceilings, then per batch each family's time, GB/s, TFLOP/s, % of the copy and matmul
    ceilings and speed-up over torch (plus, with ``compare``, this run's time over the compared run's), then the
    metadata builder's hit / miss."""
    rows = _ours(doc)
    before = {r["fullname"]: r["seconds"] for r in _ours(compare)} if compare else {}
    lines = []
    ceil = {r["family"]: r for r in rows if r["kind"] == "ceiling"}
    refs = next((r for r in rows if r.get("copy_ceiling_bytes_per_s") or r.get("matmul_ceiling_flops_per_s")), None)
    if ceil or refs:
        bw = (refs or {}).get("copy_ceiling_bytes_per_s")
        fl = (refs or {}).get("matmul_ceiling_flops_per_s")
        lines.append(f"device {_device_name(doc)}: copy {bw / 1e12:.2f} TB/s" if bw else
                     f"device {_device_name(doc)}: copy ceiling not measured")
        lines[-1] += (f", bf16 matmul {fl / 1e12:.0f} TFLOP/s (measured in this run)" if fl else
                      ", matmul ceiling not measured")
    host_bound = False
    gpu = sorted((r for r in rows if r["kind"] in _KIND_ORDER),
                 key=lambda r: (r["batch"], _KIND_ORDER[r["kind"]], r["family"], 1 if r.get("subject") else 0))
    if gpu:
        subj = any(r.get("subject") for r in gpu)
        graphs = any(r.get("graph_seconds") for r in gpu)
        ours_t = {(r["kind"], r["batch"], r["family"]): r for r in gpu if not r.get("subject")}
        head = (f"{'batch':>5}  {'implementation':<28} {'time us':>9}" + (f" {'graph us':>9}" if graphs else "")
                + f" {'GB/s':>8} {'TFLOP/s':>8} {'%copy':>6} {'%mma':>6} {'vs torch':>8}"
                + (f" {'vs subj':>9}" if subj else ""))
        if compare:
            head += f" {'vs ' + compare_name:>14}"
        lines.append(head)
        for r in gpu:
            t = r["seconds"]
            host_bound = host_bound or bool(r.get("host_bound"))
            vs = f"{r['ratio_to_torch']:>7.2f}x" if r.get("ratio_to_torch") else f"{'-':>8}"
            g = r.get("graph_seconds")
            line = (f"{r['batch']:>5}  {_impl_label(r):<28} {t * 1e6:>8.1f}{'!' if r.get('host_bound') else ' '}"
                    + ((f"{g * 1e6:>9.1f} " if g else f"{'-':>9} ") if graphs else "")
                    + f"{r['bytes'] / t / 1e9:>8.0f} "
                    f"{r['flops'] / t / 1e12:>8.2f} {_pct(r.get('fraction_of_copy_ceiling'))} "
                    f"{_pct(r.get('fraction_of_matmul_ceiling'))} {vs}")
            if subj:
                # > 1: ours is faster than the subject's kernel for the same family and batch; the graph replays
                # where both rows have one (no host time on either side), else the event-timed calls
                o = ours_t.get((r["kind"], r["batch"], r["family"])) if r.get("subject") else None
                line += f" {_speedup(r, o):>8.2f}x" if o else f" {'':>9}"
            if compare:
                b = before.get(r["fullname"])
                # > 1: this run is slower than the compared one
                line += f" {t / b:>13.2f}x" if b else f" {'(not in it)':>14}"
            lines.append(line)
        if host_bound:
            lines.append("! the host took longer to queue the call than the L2 flush before it ran on the GPU: that "
                         "time includes launch overhead (host_launch_seconds in the JSON)")
        if graphs:
            lines.append("graph us: the same call replayed from one CUDA graph capture, an L2 flush before each "
                         "replay" + ("; vs subj divides the graph figures where both rows have one" if subj else ""))
        lines.extend(_flashmla_lines(gpu))
    lines.extend(_indexer_lines(rows, before))
    meta = [r for r in rows if r["kind"] == "metadata"]
    if meta:
        lines.append(f"metadata build() on the host, target {meta[0].get('target', '?')}, steady decode, topk 2048")
        head = f"{'tokens':>7} {'hit us':>10} {'miss us':>10} {'miss/hit':>9}"
        lines.append(head + (f" {'hit vs ' + compare_name:>16} {'miss vs ' + compare_name:>16}" if compare else ""))
        for n in sorted({r["tokens"] for r in meta}):
            got = {v: next((r for r in meta if r["tokens"] == n and r["variant"] == v), None) for v in ("hit", "miss")}
            hit, miss = (got[v]["seconds"] if got[v] else None for v in ("hit", "miss"))
            ratio = f"{miss / hit:>9.2f}" if hit and miss else f"{'-':>9}"
            line = (f"{n:>7} {hit * 1e6 if hit else float('nan'):>10.1f} "
                    f"{miss * 1e6 if miss else float('nan'):>10.1f} {ratio}")
            if compare:
                for v in ("hit", "miss"):
                    b = before.get(got[v]["fullname"]) if got[v] else None
                    line += f" {got[v]['seconds'] / b:>15.2f}x" if b else f" {'-':>16}"
            lines.append(line)
    if not lines:
        lines.append("no benchmark results (every selected benchmark was skipped)")
    return "\n".join(lines)


def _flashmla_lines(gpu: list) -> list[str]:
    """Per batch with a FlashMLA row: its time beside our fastest decode family's and their ratio (> 1: ours takes
    longer than FlashMLA), on one clock: the graph replays where every row compared has one, else the event-timed
    medians."""
    out = []
    for fm in (r for r in gpu if str(r.get("subject") or "").startswith("flashmla") and r["kind"] == "decode"):
        ours = [r for r in gpu if r["kind"] == "decode" and not r.get("subject") and r["batch"] == fm["batch"]]
        if not ours:
            continue
        key = "graph_seconds" if all(r.get("graph_seconds") for r in (fm, *ours)) else "seconds"
        best = min(ours, key=lambda r: r[key])
        out.append(f"batch {fm['batch']}: {fm['subject']} {fm['family']} {fm[key] * 1e6:.1f} us; our fastest, triton "
                   f"{best['family']}, {best[key] * 1e6:.1f} us = {best[key] / fm[key]:.2f}x its time "
                   f"({'graph' if key == 'graph_seconds' else 'events'})")
    return out


def _speedup(subject_row: dict, ours_row: dict) -> float:
    """The subject's time over ours (> 1: ours is faster): their graph replays where both have one, so a subject
    whose wrapper's host work outlasts its kernels is not charged for it, else their event-timed calls."""
    sg, og = subject_row.get("graph_seconds"), ours_row.get("graph_seconds")
    if sg and og:
        return sg / og
    return subject_row["seconds"] / ours_row["seconds"]


def _indexer_lines(rows, before: dict) -> list[str]:
    """The indexer path's rows (bench_indexer.py): the cp-gather against the copy ceiling and torch indexing, the
    paged logits against the torch reference, each subject beside ours for the same shape and layout."""
    idx = [r for r in rows if r["kind"] in ("gather", "logits")]
    if not idx:
        return []

    def shape(r):
        if r["kind"] == "gather":
            return f"gather {r.get('tokens')} tok bs {r.get('block_size')}"
        return f"logits B{r.get('requests')} H{r.get('heads')} ctx {r.get('context')}"

    # a subject's row is set against our row of the same family (the torch baselines share the shape and layout)
    ours_t = {(r["kind"], shape(r), r.get("layout"), r["family"]): r["seconds"] for r in idx if not r.get("subject")}
    subj = any(r.get("subject") for r in idx)
    head = (f"{'indexer path':<30} {'layout':<8} {'implementation':<24} {'time us':>9} {'GB/s':>8} {'%copy':>6} "
            f"{'vs torch':>8}" + (f" {'vs subj':>9}" if subj else "") + (f" {'vs before':>10}" if before else ""))
    out = [head]
    for r in sorted(idx, key=lambda r: (r["kind"], shape(r), str(r.get("layout")), 1 if r.get("subject") else 0,
                                        r["family"])):
        t = r["seconds"]
        label = f"{r['subject']} {r['family']}" if r.get("subject") else f"triton {r['family']}"
        if not t:
            out.append(f"{shape(r):<30} {str(r.get('layout')):<8} {label:<24} {'not timed':>9}")
            continue
        vs = f"{r['ratio_to_torch']:>7.2f}x" if r.get("ratio_to_torch") else f"{'-':>8}"
        line = (f"{shape(r):<30} {str(r.get('layout')):<8} {label:<24} {t * 1e6:>9.1f} {r['bytes'] / t / 1e9:>8.0f} "
                f"{_pct(r.get('fraction_of_copy_ceiling'))} {vs}")
        if subj:
            o = ours_t.get((r["kind"], shape(r), r.get("layout"), r["family"])) if r.get("subject") else None
            line += f" {t / o:>8.2f}x" if o else f" {'':>9}"  # > 1: ours is faster than the subject's
        if before:
            b = before.get(r["fullname"])
            line += f" {t / b:>9.2f}x" if b else f" {'-':>10}"
        out.append(line)
    return out


# ---------------------------------------------------------------------------------------------------------------
# Roofline
# ---------------------------------------------------------------------------------------------------------------

class PlotUnavailable(RuntimeError):
    pass


def _point_labels(rows, ai, perf, step: float = 0.055):
    """(text, x, y) for each point's label: points that coincide share one label ("gfx942/gfx950 b64"), and a
    label that would overlap one already placed at about the same x moves up by ``step`` decades."""
    groups = []  # [log x, log y, kind, [(family, batch)]]
    for r, x, y in zip(rows, ai, perf):
        lx, ly = math.log10(x), math.log10(y)
        for g in groups:
            if abs(g[0] - lx) < 0.01 and abs(g[1] - ly) < 0.01 and g[2] == r["kind"]:
                g[3].append((r["family"], r["batch"]))
                break
        else:
            groups.append([lx, ly, r["kind"], [(r["family"], r["batch"])]])
    placed, out = [], []
    for lx, ly, _, members in sorted(groups, key=lambda g: (g[0], g[1])):
        batches = sorted({b for _, b in members})
        fams = "/".join(dict.fromkeys(f for f, _ in members))
        text = f"{fams} b{'/'.join(str(b) for b in batches)}"
        ty = ly
        while any(abs(px - lx) < 0.3 and abs(py - ty) < step for px, py in placed):
            ty += step
        placed.append((lx, ty))
        out.append((text, 10 ** lx, 10 ** ty))
    return out


def plot_roofline(doc: dict, out) -> Path:
    """A log-log roofline PNG: achieved TFLOP/s over arithmetic intensity (FLOP per byte) for every decode,
    baseline and reduce point, under the measured copy-bandwidth slope and matmul roof. ``PlotUnavailable`` when
    matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable(f"smv bench --plot needs matplotlib: {PLOT_HINT}") from None
    rows = [r for r in _ours(doc) if r["kind"] in _KIND_ORDER and r["bytes"] > 0 and r["flops"] > 0]
    if not rows:
        raise BenchUsageError("no decode, baseline or reduce results with bytes and FLOPs in it: nothing to plot")
    refs = next((r for r in _ours(doc) if r.get("copy_ceiling_bytes_per_s")), {})
    bw = refs.get("copy_ceiling_bytes_per_s")
    peak = next((r.get("matmul_ceiling_flops_per_s") for r in _ours(doc) if r.get("matmul_ceiling_flops_per_s")),
                None)
    ai = [r["flops"] / r["bytes"] for r in rows]
    perf = [r["flops"] / r["seconds"] / 1e12 for r in rows]
    lo, hi = min(ai) / 4, max(ai) * 4
    if bw and peak:
        hi = max(hi, 4 * peak / bw)
    fig, ax = plt.subplots(figsize=(10, 6.5), dpi=120)
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    if bw:
        roof = [x * bw / 1e12 for x in xs]
        if peak:
            roof = [min(y, peak / 1e12) for y in roof]
        ax.plot(xs, roof, color="black", lw=2, label=f"roofline: copy {bw / 1e12:.2f} TB/s"
                + (f", bf16 matmul {peak / 1e12:.0f} TFLOP/s" if peak else ""))
    if peak:
        ax.axhline(peak / 1e12, color="grey", ls="--", lw=1)
        ax.annotate(f"bf16 matmul ceiling {peak / 1e12:.0f} TFLOP/s", (lo * 1.1, peak / 1e12 * 1.08), fontsize=8,
                    color="grey")
    if bw:
        ax.annotate(f"copy ceiling {bw / 1e12:.2f} TB/s", (xs[12], xs[12] * bw / 1e12 * 2.5), fontsize=8,
                    color="grey")
    markers = {"generic": "o", "gfx942": "s", "gfx950": "^", "torch": "D"}
    colors = {"decode": "tab:blue", "baseline": "tab:red", "reduce": "tab:green"}
    seen = set()
    for r, x, y in zip(rows, ai, perf):
        key = (r["kind"], r["family"])
        label = _impl_label({**r, "num_splits": None}).strip() if key not in seen else None
        seen.add(key)
        ax.scatter([x], [y], marker=markers.get(r["family"], "o"), color=colors.get(r["kind"], "k"), s=40,
                   label=label, zorder=3)
    for text, x, y in _point_labels(rows, ai, perf):
        ax.annotate(text, (x * 1.12, y), fontsize=7, va="center")
    ax.set_xlabel("arithmetic intensity (FLOP per byte; bytes: the fewest the operation must move)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.set_title(f"sparse MLA decode roofline ({_device_name(doc)}; {HEADS} heads, SWA {SWA} + {EXTRA} extra tokens)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_xlim(lo, hi)
    ys = perf + ([peak / 1e12] if peak else [])
    ax.set_ylim(min(perf) / 4, max(ys) * 2)
    out = Path(out)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


# ---------------------------------------------------------------------------------------------------------------
# The command
# ---------------------------------------------------------------------------------------------------------------

def bench_dir() -> Path:
    """Where the benchmark tests live: ``tests/benchmarks`` of the checkout this package runs from."""
    return Path(__file__).resolve().parents[2] / "tests" / "benchmarks"


_DESCRIPTION = ("Run the benchmarks (tests/benchmarks/bench_*.py) through pytest-benchmark and print the side-by-side "
                "table, or render a roofline PNG from a JSON. Exit 0: ran, or no GPU here (GPU benchmarks skipped); "
                "1: a benchmark failed, or --require-gpu without a GPU; 2: usage error.")


def _add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", metavar="FILE", help="keep pytest-benchmark's JSON here (default: a temporary file)")
    p.add_argument("--compare", metavar="FILE",
                   help="a previous run's JSON: pytest-benchmark compares against it, the table adds a column")
    p.add_argument("-k", metavar="EXPR", dest="keyword", help="only benchmarks matching this pytest -k expression")
    p.add_argument("--require-gpu", action="store_true",
                   help="exit 1 on a machine without a GPU (default: skip the GPU benchmarks, exit 0)")
    p.add_argument("--plot", metavar="FILE.json", help="render a roofline PNG from this JSON; runs nothing")
    p.add_argument("--out", metavar="PNG", help="where --plot writes (default roofline.png)")


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Register ``bench`` on an argparse subparsers object; the parsed args go to ``main``."""
    p = subparsers.add_parser("bench", help="decode benchmarks through pytest-benchmark: table, JSON, roofline",
                              description=_DESCRIPTION)
    _add_arguments(p)
    p.set_defaults(func=main)
    return p


def _check_args(args) -> None:
    if args.plot is not None:
        given = [flag for flag, v in (("--json", args.json), ("--compare", args.compare), ("-k", args.keyword),
                                      ("--require-gpu", args.require_gpu)) if v]
        if given:
            raise BenchUsageError(f"--plot renders an existing JSON and runs nothing: it takes only --out, "
                                  f"got {' '.join(given)}")
        if not args.plot.strip():
            raise BenchUsageError("--plot: expected a JSON file, got an empty name")
    elif args.out is not None:
        raise BenchUsageError("--out: only with --plot FILE.json")
    for name in ("json", "compare", "out"):
        v = getattr(args, name)
        if v is not None and not v.strip():
            raise BenchUsageError(f"--{name}: expected a file name, got an empty one")
    if args.keyword is not None and not args.keyword.strip():
        raise BenchUsageError("-k: expected an expression, got an empty one")


def _pytest_command(files, json_path: Path, compare: Path | None, keyword: str | None) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", *[str(f) for f in files], "-p", "no:cacheprovider", "-q", "-rs",
           f"--benchmark-json={json_path}",
           "--benchmark-columns=median,iqr,min,max,rounds", "--benchmark-sort=fullname"]
    if compare is not None:
        cmd.append(f"--benchmark-compare={compare}")
    if keyword is not None:
        cmd += ["-k", keyword]
    return cmd


def _empty_results() -> dict:
    """pytest-benchmark's JSON shape with no benchmarks in it."""
    import datetime

    return {"machine_info": {}, "commit_info": {}, "benchmarks": [],
            "datetime": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "version": _pytest_benchmark_version()}


def _spawn(cmd: list[str], cwd: Path) -> int:
    """The pytest subprocess (its output goes straight to the terminal); its exit status. An xdist worker's
    variables are not passed on: pytest-benchmark would take the run for a worker's and time nothing."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    sys.stdout.flush()  # our lines before pytest's, also through a pipe
    return subprocess.run(cmd, cwd=cwd, env=env).returncode


def _plot(args) -> int:
    doc = load_results(args.plot)
    try:
        out = plot_roofline(doc, args.out or "roofline.png")
    except PlotUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    except OSError as e:
        raise BenchUsageError(f"--out {args.out or 'roofline.png'}: cannot write it ({e.strerror or e})") from None
    print(f"smv bench: roofline written to {out}")
    return 0


def _run(args) -> int:
    from contracts.markers import marker_status

    compare_doc = load_results(args.compare) if args.compare else None
    try:
        import pytest_benchmark  # noqa: F401
    except ImportError:
        raise BenchUsageError("pytest-benchmark is not installed: pip install pytest-benchmark") from None
    root = bench_dir()
    files = sorted(root.glob("bench_*.py"))
    if not files:
        raise BenchUsageError(f"no benchmark files in {root}: smv bench runs from a source checkout "
                              f"(pip install -e .)")
    gpu, why = marker_status("gpu")
    if not gpu:
        if args.require_gpu:
            print(f"smv bench: --require-gpu, but {why}", file=sys.stderr)
            return 1
        print(f"smv bench: no GPU here ({why.split(': ', 1)[-1]}): the GPU benchmarks are skipped, nothing on a GPU "
              f"is timed; host-side benchmarks still run")
    tmp = None
    if args.json:
        json_path = Path(args.json).resolve()
        try:
            json_path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise BenchUsageError(f"--json {args.json}: cannot create its folder ({e.strerror or e})") from None
    else:
        fd, name = tempfile.mkstemp(prefix="smv-bench-", suffix=".json")
        os.close(fd)
        json_path = tmp = Path(name)
    try:
        if json_path.exists():
            json_path.unlink()
        cmd = _pytest_command(files, json_path, Path(args.compare).resolve() if args.compare else None,
                              args.keyword)
        rc = _spawn(cmd, root.parent.parent)
        if rc == 5:
            raise BenchUsageError(f"-k {args.keyword!r}: no benchmark matches it" if args.keyword else
                                  "pytest collected no benchmark")
        if rc == 4:
            raise BenchUsageError("pytest refused the options (see above)")
        if not json_path.exists():
            if rc:
                print("smv bench: pytest-benchmark wrote no JSON (see the pytest output above)", file=sys.stderr)
                return 1
            # pytest-benchmark writes nothing when nothing was timed; a CI that asked for the file still gets one
            json_path.write_text(json.dumps(_empty_results(), indent=1))
        doc = load_results(json_path)
        print()
        print(format_table(doc, compare_doc, Path(args.compare).name if args.compare else "before"))
        if args.json:
            print(f"smv bench: pytest-benchmark JSON in {json_path}")
        return 0 if rc == 0 else 1
    finally:
        if tmp is not None and tmp.exists():
            tmp.unlink()


def main(args) -> int:
    """``smv bench``: the exit codes are in this module's docstring."""
    try:
        _check_args(args)
        return _plot(args) if args.plot is not None else _run(args)
    except BenchUsageError as e:
        print(f"smv bench: {e}", file=sys.stderr)
        return 2


def cli(argv=None) -> int:
    """``python -m contracts.cli.bench [options]``: the same as ``smv bench``."""
    p = argparse.ArgumentParser(prog="smv bench", description=_DESCRIPTION)
    _add_arguments(p)
    return main(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
