"""GPU benchmarks of the sparse indexer path, side by side in one run: the indexer-K gather
(``cp_gather_indexer_k_quant_cache``, both variants, NORMAL and SHUFFLE) against the device copy ceiling and a torch
indexing baseline, and a subject's gather beside ours; the indexer logits go in the marked section below.

Not collected by plain ``pytest`` (the file pattern is ``bench_*.py``); run it by path or through ``smv bench``:

    python -m pytest tests/benchmarks/bench_indexer.py --benchmark-json bench.json

Gather workload: a prefill chunk of 65536 or 262144 tokens over 16 sequences, indexer-K blocks of 64 tokens (132 B a
token) at random places of the pool, the cache a padded-stride view. A gather reads each token's 128 fp8 bytes and 4
scale bytes once and writes them once, and reads its token_to_seq entry: ``bytes`` counts those (table and cu_seqlen
reads are a rounding error). Ours runs with ``check_metadata=False`` (the kernel alone, as upstream's host function
is: no host check). Every round is timed on the GPU between CUDA events after an L2 flush outside the timing
(``contracts.bench``); ``extra_info`` holds the figures and ``fraction_of_copy_ceiling`` against the copy measured in
this run (read + write counted as the gather's bytes are), ``fraction_of_same_size_copy`` against one contiguous copy of the
132 B a token moves (a launch of this size cannot beat it), and the torch baseline's time beside ours. A benchmark
asserts nothing about time.
"""
from __future__ import annotations

import pytest

from contracts import bench

pytestmark = pytest.mark.gpu

TOKENS = (65536, 262144)
BLOCK_SIZE = 64
NUM_SEQS = 16
LAYOUTS = ("shuffle", "normal")
#: variant -> the target whose cp_gather_variant it is
VARIANTS = {"legacy": "generic", "gfx950": "gfx950"}
TOKEN_BYTES, HEAD = 132, 128
#: bytes between blocks beyond the dense 64 * 132 (a view into a shared pool)
STRIDE_PAD = 256


def gather_figures(tokens: int) -> dict:
    """Each token's 132 cache bytes read and written once, and its 4-byte token_to_seq entry read."""
    return {"bytes": 2 * TOKEN_BYTES * tokens + 4 * tokens, "flops": 0}


class GatherWorkload:
    """One prefill chunk's gather: the pool (random bytes), its cache view, a block table naming random distinct
    blocks, cu_seqlen / token_to_seq of ``NUM_SEQS`` equal sequences, and the outputs, all made here (outside any
    timing)."""

    def __init__(self, tokens: int, device, *, block_size: int = BLOCK_SIZE, seqs: int = NUM_SEQS, seed: int = 0):
        import torch

        self.tokens, self.device = tokens, torch.device(device)
        g = torch.Generator(device=self.device).manual_seed(seed)
        per_seq = tokens // seqs
        width = -(-per_seq // block_size)
        nb = seqs * width + 7
        stride = block_size * TOKEN_BYTES + STRIDE_PAD
        self.pool = torch.randint(0, 256, (nb * stride,), dtype=torch.uint8, device=self.device, generator=g)
        self.cache = self.pool.as_strided((nb, block_size, TOKEN_BYTES), (stride, TOKEN_BYTES, 1))
        perm = torch.randperm(nb, device=self.device, generator=g)[: seqs * width]
        self.table = perm.to(torch.int32).reshape(seqs, width).contiguous()
        self.cu = (torch.arange(seqs + 1, dtype=torch.int32, device=self.device) * per_seq)
        self.tts = torch.arange(seqs, dtype=torch.int32, device=self.device).repeat_interleave(per_seq)
        self.k_fp8 = torch.empty(tokens, HEAD, dtype=torch.uint8, device=self.device)
        self.k_scale = torch.empty(tokens, 4, dtype=torch.uint8, device=self.device)
        self.block_size, self.stride = block_size, stride
        # the torch baseline's indices: each token's block and position
        off = torch.arange(tokens, device=self.device) - self.cu.long()[self.tts.long()]
        self.blk = self.table.long()[self.tts.long(), off // block_size]
        self.pos = off % block_size
        self.figures = gather_figures(tokens)

    def call(self, variant: str, layout: str):
        from impl.cp_gather import cp_gather_indexer_k_quant_cache

        target = VARIANTS[variant]

        def run():
            cp_gather_indexer_k_quant_cache(self.cache, self.k_fp8, self.k_scale, self.table, self.cu, self.tts,
                                            layout=layout, target=target, check_metadata=False)

        return run

    def subject_call(self, subject, variant: str, layout: str):
        """The subject's gather for ``variant``'s target on the same inputs: its host function called directly
        (the adapter's ``launcher``), so the harness's per-call module swap is not timed."""
        target = VARIANTS[variant]
        run = subject.bind(target).cp_gather.launcher(self.cache, self.k_fp8, self.k_scale, self.table, self.cu,
                                                      self.tts, layout=layout, target=target)
        run()  # a variant the subject cannot run here says so before any timing
        return run

    def torch_call(self, layout: str):
        """Advanced indexing over strided views of the cache: the same bytes into fresh tensors."""
        import torch

        bs, nb, s = self.block_size, self.cache.shape[0], self.stride
        if layout == "normal":
            data = self.pool.as_strided((nb, bs, HEAD), (s, HEAD, 1))

            def gather_data():
                return data[self.blk, self.pos]
        else:
            # [block, tile of 16 tokens, 16-byte column, token in tile, byte]
            tiles = self.pool.as_strided((nb, bs // 16, HEAD // 16, 16, 16), (s, 16 * HEAD, 256, 16, 1))
            tile, row = self.pos // 16, self.pos % 16

            def gather_data():
                return tiles[self.blk, tile, :, row, :].reshape(-1, HEAD)
        scales = self.pool[bs * HEAD:].as_strided((nb, bs, 4), (s, 4, 1))

        def run():
            return gather_data(), scales[self.blk, self.pos]

        out = run()
        ours = self.call("gfx950", layout)
        ours()
        assert torch.equal(out[0], self.k_fp8) and torch.equal(out[1], self.k_scale), "torch baseline differs"
        return run


@pytest.fixture(scope="module")
def device():
    import torch

    from impl.runtime import detect_device, kernel_device

    return torch.device(kernel_device()), detect_device().name


@pytest.fixture(scope="module")
def gathers(device):
    made = {}

    def get(tokens):
        if tokens not in made:
            made[tokens] = GatherWorkload(tokens, device[0])
        return made[tokens]

    return get


@pytest.fixture(scope="module")
def flush(device):
    import torch

    f = bench.L2Flush(device[0])
    f()
    torch.cuda.synchronize()
    times = sorted(bench.measure(f, lambda: None, bench.CudaEventClock(), rounds=5, warmup_rounds=1))
    f.seconds = times[len(times) // 2]
    return f


def _median(fn, flush, rounds):
    import torch

    fn()
    torch.cuda.synchronize()
    times = sorted(bench.measure(fn, flush, bench.CudaEventClock(), rounds=rounds,
                                 warmup_rounds=bench.GPU_WARMUP_ROUNDS))
    return times[len(times) // 2]


@pytest.fixture(scope="module")
def refs(device, flush, gathers):
    """The copy ceiling and the torch gathers, each measured once per module on first use."""
    import torch

    class Refs:
        def __init__(self):
            self.copy, self.torch, self.same_size_copy = None, {}, {}

        def get(self, tokens=None, layout=None):
            if self.copy is None:
                a = torch.empty(bench.COPY_BYTES, dtype=torch.uint8, device=device[0])
                b = torch.empty_like(a)
                a.random_()
                self.copy = bench.copy_figures()["bytes"] / _median(lambda: b.copy_(a), flush, bench.CEILING_ROUNDS)
            if tokens is not None and (tokens, layout) not in self.torch:
                self.torch[tokens, layout] = _median(gathers(tokens).torch_call(layout), flush, bench.GPU_ROUNDS)
            if tokens is not None and tokens not in self.same_size_copy:
                # one contiguous copy of the bytes the gather moves: the best a launch of this size can do
                a = torch.empty(TOKEN_BYTES * tokens, dtype=torch.uint8, device=device[0])
                b = torch.empty_like(a)
                self.same_size_copy[tokens] = _median(lambda: b.copy_(a), flush, bench.GPU_ROUNDS)
            return bench.References(self.copy, None, {})

    return Refs()


@pytest.fixture
def gpu_benchmark(benchmark, flush):
    """As bench_decode.py's: warmed up (compiled) outside any timing, then pedantic rounds on the GPU-event clock,
    an L2 flush before each. Returns the median seconds (None when pytest-benchmark is disabled)."""
    import torch

    def run(fn, rounds=None):
        fn()
        torch.cuda.synchronize()
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
        return bench.benchmark_median(benchmark)

    run.benchmark = benchmark
    return run


def _record_gather(gpu_benchmark, seconds, device, refs, w, *, family, layout, **extra):
    r = refs.get(w.tokens, layout)
    base = r and refs.torch.get((w.tokens, layout))
    info = bench.derived_figures(kind="gather", family=family, seconds=seconds, refs=r, batch=None, device=device[1],
                                 tokens=w.tokens, block_size=w.block_size, layout=layout, sequences=NUM_SEQS,
                                 **w.figures, **extra)
    info["torch_seconds"] = base
    info["ratio_to_torch"] = base / seconds if base and seconds else None  # > 1: faster than torch indexing
    same = refs.same_size_copy.get(w.tokens)
    info["same_size_copy_seconds"] = same
    # 1: as fast as one contiguous copy of the same bytes (launch latency included in both)
    info["fraction_of_same_size_copy"] = same / seconds if same and seconds else None
    gpu_benchmark.benchmark.extra_info.update(info)


GATHER = [pytest.mark.parametrize("tokens", TOKENS, ids=lambda t: f"t{t}"),
          pytest.mark.parametrize("layout", LAYOUTS)]


def _gather_params(fn):
    for mark in GATHER:
        fn = mark(fn)
    return fn


@_gather_params
@pytest.mark.parametrize("variant", tuple(VARIANTS))
def test_cp_gather(gpu_benchmark, gathers, refs, device, variant, layout, tokens):
    w = gathers(tokens)
    seconds = gpu_benchmark(w.call(variant, layout))
    _record_gather(gpu_benchmark, seconds, device, refs, w, family=f"cp-gather-{variant}", layout=layout,
                   check_metadata=False)


@pytest.fixture(scope="module")
def subject():
    """The subject whose gather runs beside ours (``SMV_BENCH_SUBJECT``, e.g. ``vllm@.smv-subject/vllm``)."""
    import os

    spec = os.environ.get("SMV_BENCH_SUBJECT")
    if not spec:
        pytest.skip("no SMV_BENCH_SUBJECT: only our kernels run (set it to e.g. vllm==0.33.0 or vllm@PATH)")
    from contracts.subjects import parse_subject

    return parse_subject(spec)


@_gather_params
@pytest.mark.parametrize("variant", tuple(VARIANTS))
def test_cp_gather_subject(gpu_benchmark, gathers, refs, device, subject, variant, layout, tokens):
    """The subject's gather for the same variant's target and inputs: a column beside ours."""
    from contracts.subjects import SubjectSkip

    w = gathers(tokens)
    try:
        fn = w.subject_call(subject, variant, layout)
    except SubjectSkip as exc:
        pytest.skip(exc.reason(subject.label))
    seconds = gpu_benchmark(fn)
    _record_gather(gpu_benchmark, seconds, device, refs, w, family=f"cp-gather-{variant}", layout=layout,
                   subject=subject.label)


@_gather_params
def test_cp_gather_torch_baseline(gpu_benchmark, gathers, refs, device, layout, tokens):
    w = gathers(tokens)
    seconds = gpu_benchmark(w.torch_call(layout))
    _record_gather(gpu_benchmark, seconds, device, refs, w, family="torch-indexing", layout=layout)


def test_copy_ceiling(gpu_benchmark, refs, device, flush):
    import torch

    a = torch.empty(bench.COPY_BYTES, dtype=torch.uint8, device=device[0])
    b = torch.empty_like(a)
    a.random_()
    seconds = gpu_benchmark(lambda: b.copy_(a), rounds=bench.CEILING_ROUNDS)
    gpu_benchmark.benchmark.extra_info.update(bench.derived_figures(
        kind="ceiling", family="copy", seconds=seconds, refs=refs.get(), device=device[1], **bench.copy_figures()))


# =====================================================================================================================
# INDEXER LOGITS (fp8_mqa_logits / fp8_paged_mqa_logits vs the torch reference): engineer L's section.
# Add the logits workload and its benchmarks here, measured in the same run as the gather above (same fixtures:
# ``device``, ``flush``, ``refs``, ``gpu_benchmark``), with kind="logits" in extra_info.
# =====================================================================================================================
