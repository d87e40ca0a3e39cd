"""GPU benchmarks of the sparse-MLA decode, side by side in one run: every kernel family, the split-K reduce on its
own (with ``SMV_BENCH_SUBJECT``, the subject's decode and reduce beside ours), FlashMLA's sparse decode where it is
installed and the GPU is SM90/SM100 (else skipped, saying why), the torch gather + SDPA baseline, and the two
ceilings (device copy bandwidth, bf16 matmul rate).

Not collected by plain ``pytest`` (the file pattern is ``bench_*.py``); run it by path or through ``smv bench``:

    python -m pytest tests/benchmarks/bench_decode.py --benchmark-json bench.json

DSv4 decode shapes: 64 heads, each query row attends SWA 128 main tokens plus 512 extra (compressed) tokens, batch 1,
64 and 512. The families are portable Triton, so each runs on any GPU with its own target's semantics (split
selector and CU count, fp8 flavour of the main cache). Every round is timed on the GPU between CUDA events
(``contracts.cli.bench.CudaEventClock``) after an L2 flush outside the timing; ``extra_info`` holds the figures and the
ratios to the torch baseline and to the ceilings, all measured in this run. A benchmark asserts nothing about time.
"""
from __future__ import annotations

import pytest

from contracts.cli import bench

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def device():
    import torch

    from impl.runtime import detect_device, kernel_device

    # 'cuda' wherever these run for real (CUDA and ROCm alike); the CPU only in the suite's own dry run
    return torch.device(kernel_device()), detect_device().name


@pytest.fixture(scope="module")
def workloads(device):
    made = {}

    def get(batch):
        if batch not in made:
            made[batch] = bench.DecodeWorkload(batch, device[0])
        return made[batch]

    return get


def _copy_call(dev):
    import torch

    a = torch.empty(bench.COPY_BYTES, dtype=torch.uint8, device=dev)
    b = torch.empty_like(a)
    a.random_()
    return lambda: b.copy_(a)


def _matmul_call(dev):
    import torch

    x = torch.randn(bench.MATMUL_SIZE, bench.MATMUL_SIZE, device=dev, dtype=torch.bfloat16)
    y = torch.randn(bench.MATMUL_SIZE, bench.MATMUL_SIZE, device=dev, dtype=torch.bfloat16)
    return lambda: x @ y


class _Refs:
    """The yardsticks, each measured once per module on first use (whatever ``-k`` selected), with the same
    protocol as the benchmarks."""

    def __init__(self, dev, workloads, flush):
        self.dev, self.workloads, self.flush = dev, workloads, flush
        self.copy, self.matmul, self.torch = None, None, {}

    def _median(self, fn, rounds=None):
        import torch

        fn()
        torch.cuda.synchronize()
        times = bench.measure(fn, self.flush, bench.CudaEventClock(), rounds=rounds or bench.GPU_ROUNDS,
                              warmup_rounds=bench.GPU_WARMUP_ROUNDS)
        times.sort()
        return times[len(times) // 2]

    def get(self, batch=None) -> bench.References:
        if self.copy is None:
            self.copy = bench.copy_figures()["bytes"] / self._median(_copy_call(self.dev), bench.CEILING_ROUNDS)
        if self.matmul is None:
            self.matmul = bench.matmul_figures()["flops"] / self._median(_matmul_call(self.dev),
                                                                         bench.CEILING_ROUNDS)
        if batch is not None and batch not in self.torch:
            self.torch[batch] = self._median(self.workloads(batch).baseline_call())
        return bench.References(self.copy, self.matmul, dict(self.torch))


@pytest.fixture(scope="module")
def flush(device):
    """The L2 flush, with its own GPU time: the host must queue a timed call within it (see gpu_benchmark)."""
    import torch

    f = bench.L2Flush(device[0])
    f()
    torch.cuda.synchronize()
    times = sorted(bench.measure(f, lambda: None, bench.CudaEventClock(), rounds=5, warmup_rounds=1))
    f.seconds = times[len(times) // 2]
    return f


@pytest.fixture(scope="module")
def refs(device, workloads, flush):
    return _Refs(device[0], workloads, flush)


@pytest.fixture
def gpu_benchmark(benchmark, flush, device):
    """``gpu_benchmark(fn, rounds=..., graph=False)``: ``fn`` warmed up (compiled) outside any timing, then
    pytest-benchmark's pedantic mode with the GPU-event clock and an L2 flush before every round; with ``graph``
    also the median of the same rounds replaying ``fn`` from a CUDA graph (``graph_seconds`` in the JSON, with
    ``graph_error`` saying why where there is none). Returns the median seconds, or None
    when pytest-benchmark is disabled (``--benchmark-disable``, xdist)."""
    import torch

    def run(fn, rounds=None, graph=False):
        fn()
        torch.cuda.synchronize()
        # a call whose host side outlasts the flush leaves the GPU idle inside the events: say so in the JSON
        host = bench.host_seconds(fn, torch.cuda.synchronize)
        benchmark.extra_info.update(host_launch_seconds=host, flush_seconds=flush.seconds,
                                    host_bound=host > flush.seconds)
        clock = bench.CudaEventClock()
        bench.install_clock(benchmark, clock)

        def setup():
            flush()
            clock.reset()

        benchmark.pedantic(fn, setup=setup, rounds=rounds or bench.GPU_ROUNDS,
                           warmup_rounds=bench.GPU_WARMUP_ROUNDS, iterations=1)
        torch.cuda.synchronize()
        if graph:  # the same call replayed from a CUDA graph: no host time inside the rounds, on either side
            secs, why = bench.graph_median(fn, device[0], flush, rounds=rounds or bench.GPU_ROUNDS,
                                           warmup_rounds=bench.GPU_WARMUP_ROUNDS)
            benchmark.extra_info.update(graph_seconds=secs, **({"graph_error": why} if why else {}))
        return bench.benchmark_median(benchmark)

    run.benchmark = benchmark
    return run


def _record(gpu_benchmark, seconds, device, **kw):
    gpu_benchmark.benchmark.extra_info.update(bench.derived_figures(seconds=seconds, device=device[1], **kw))


BATCH = pytest.mark.parametrize("batch", bench.BATCHES, ids=lambda b: f"b{b}")


@BATCH
@pytest.mark.parametrize("family", bench.FAMILIES)
def test_decode(gpu_benchmark, workloads, refs, device, family, batch):
    w = workloads(batch)
    fn, plan = w.decode_call(family)
    seconds = gpu_benchmark(fn, graph=True)
    _record(gpu_benchmark, seconds, device, kind="decode", family=family, batch=batch, refs=refs.get(batch),
            num_splits=plan.num_splits, heads=w.heads, tokens_per_query=w.figures["tokens_per_query"],
            bytes=w.figures["bytes"], flops=w.figures["flops"])


@pytest.fixture(scope="module")
def subject():
    """The subject whose decode runs beside ours (``SMV_BENCH_SUBJECT``, e.g. ``vllm@.smv-subject/vllm``)."""
    import os

    spec = os.environ.get("SMV_BENCH_SUBJECT")
    if not spec:
        pytest.skip("no SMV_BENCH_SUBJECT: only our kernels run (set it to e.g. vllm==0.33.0 or vllm@PATH)")
    from contracts.subjects import parse_subject

    return parse_subject(spec)


@BATCH
@pytest.mark.parametrize("family", bench.FAMILIES)
def test_decode_subject(gpu_benchmark, workloads, refs, device, subject, family, batch):
    """The subject's decode for the same family and inputs, with its own plan: a column beside ours."""
    w = workloads(batch)
    fn, _ = _subject_call(subject, w.subject_decode_call, family)
    seconds = gpu_benchmark(fn, graph=True)
    _record(gpu_benchmark, seconds, device, kind="decode", family=family, batch=batch, refs=refs.get(batch),
            subject=subject.label, heads=w.heads, tokens_per_query=w.figures["tokens_per_query"],
            bytes=w.figures["bytes"], flops=w.figures["flops"])


def _flashmla_column():
    """benchmarks/flashmla.py (the column's call and its oracle check), loaded from this checkout."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "flashmla.py"
    spec = importlib.util.spec_from_file_location("smv_bench_flashmla", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def flashmla():
    """(column helpers, flash_mla): FlashMLA's column, or the benchmark skipped with the one-line reason (not
    installed, no CUDA, compute capability X.Y). ``SMV_FLASHMLA_PATH`` names a folder holding flash_mla/."""
    col = _flashmla_column()
    mod, why = col.availability()
    if mod is None:
        pytest.skip(f"FlashMLA column: {why}")
    return col, mod


@BATCH
def test_decode_flashmla(gpu_benchmark, workloads, refs, device, flashmla, batch):
    """FlashMLA's sparse decode (legacy extension, V4 cache format) on the same inputs as ours: the same cache bytes
    and index lists, converted to its shapes outside the timing; its output is checked against the float64 oracle
    on the first rows (a wrong output fails the benchmark; its time is still recorded)."""
    col, mod = flashmla
    w = workloads(batch)
    fn, plan = col.workload_call(mod, w)
    check = col.oracle_check(w, fn(), plan.num_splits)
    seconds = gpu_benchmark(fn, graph=True)
    _record(gpu_benchmark, seconds, device, kind="decode", family=col.arch_family(), batch=batch,
            refs=refs.get(batch), subject=col.label(), heads=w.heads, tokens_per_query=w.figures["tokens_per_query"],
            bytes=w.figures["bytes"], flops=w.figures["flops"], oracle=check)
    assert check["ok"], f"FlashMLA's output disagrees with the float64 oracle: {check['mismatches']}"


@BATCH
@pytest.mark.parametrize("family", bench.SPLIT_FAMILIES)
def test_reduce(gpu_benchmark, workloads, refs, device, family, batch):
    w = workloads(batch)
    fn, plan = w.reduce_call(family)
    _record_reduce(gpu_benchmark, fn, plan, w, refs, device, family, batch)


@BATCH
@pytest.mark.parametrize("family", bench.SPLIT_FAMILIES)
def test_reduce_subject(gpu_benchmark, workloads, refs, device, subject, family, batch):
    """The subject's reduce alone, as its wrapper launches it, over the same partials as test_reduce's."""
    w = workloads(batch)
    fn, plan = _subject_call(subject, w.subject_reduce_call, family)
    _record_reduce(gpu_benchmark, fn, plan, w, refs, device, family, batch, subject=subject.label)


def _subject_call(subject, make, family):
    """``make(subject, family)``, or the benchmark skipped with the subject's reason when it cannot run here."""
    from contracts.subjects import SubjectSkip

    try:
        return make(subject, family)
    except SubjectSkip as exc:
        pytest.skip(exc.reason(subject.label))


def _record_reduce(gpu_benchmark, fn, plan, w, refs, device, family, batch, **kw):
    seconds = gpu_benchmark(fn, graph=True)
    fig = bench.reduce_figures(batch, plan.num_splits, w.heads)
    _record(gpu_benchmark, seconds, device, kind="reduce", family=family, batch=batch, refs=refs.get(),
            num_splits=plan.num_splits, heads=w.heads, bytes=fig["bytes"], flops=fig["flops"], **kw)


@BATCH
def test_torch_baseline(gpu_benchmark, workloads, refs, device, batch):
    w = workloads(batch)
    seconds = gpu_benchmark(w.baseline_call())
    _record(gpu_benchmark, seconds, device, kind="baseline", family="torch", batch=batch, refs=refs.get(batch),
            heads=w.heads, tokens_per_query=w.figures["tokens_per_query"], bytes=w.figures["bytes"],
            flops=w.figures["flops"])


def test_copy_ceiling(gpu_benchmark, refs, device):
    seconds = gpu_benchmark(_copy_call(device[0]), rounds=bench.CEILING_ROUNDS)
    _record(gpu_benchmark, seconds, device, kind="ceiling", family="copy", refs=refs.get(), **bench.copy_figures())


def test_matmul_ceiling(gpu_benchmark, refs, device):
    seconds = gpu_benchmark(_matmul_call(device[0]), rounds=bench.CEILING_ROUNDS)
    _record(gpu_benchmark, seconds, device, kind="ceiling", family="matmul", refs=refs.get(),
            **bench.matmul_figures())
