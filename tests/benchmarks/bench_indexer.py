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
(``contracts.cli.bench``); ``extra_info`` holds the figures and ``fraction_of_copy_ceiling`` against the copy measured in
this run (read + write counted as the gather's bytes are), ``fraction_of_same_size_copy`` against one contiguous copy of the
132 B a token moves (a launch of this size cannot beat it), and the torch baseline's time beside ours. A benchmark
asserts nothing about time.
"""
from __future__ import annotations

import pytest

from contracts.cli import bench

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
# INDEXER LOGITS (fp8_mqa_logits / fp8_paged_mqa_logits vs the torch reference).
# Measured in the same run as the gather above (same fixtures: ``device``, ``flush``, ``refs``, ``gpu_benchmark``),
# with kind="logits" in extra_info.
# =====================================================================================================================

#: the decode indexer at a realistic size: 64 requests, one query row each, 64 heads, 8192 visible keys of 64-token
#: blocks (C4A's NORMAL layout and the SHUFFLE one), max_model_len 8192
LOGITS_BATCH, LOGITS_NEXT_N, LOGITS_HEADS, LOGITS_CTX, LOGITS_BLOCK = 64, 1, 64, 8192, 64
LOGITS_LAYOUTS = ("normal", "shuffle")


def logits_figures(batch: int, next_n: int, heads: int, ctx: int, max_model_len: int, block_size: int) -> dict:
    """Bytes: each request's visible keys (132 B each) read once, its q rows (128 B a head) and weights (4 B a head),
    its table entries, and every logit column written (4 B). FLOPs: the head dot products (2 * 128 per key and head)
    and the relu, weight and head sum (3 per key and head)."""
    rows = batch * next_n
    pages = -(-ctx // block_size)
    return {"bytes": batch * ctx * TOKEN_BYTES + rows * heads * (HEAD + 4) + batch * pages * 4
            + rows * max_model_len * 4,
            "flops": rows * ctx * heads * (2 * HEAD + 3)}


class LogitsWorkload:
    """One decode step's paged indexer logits: a pool of N(0, 1) keys as OCP fp8 codes with positive scales (~2^-8,
    as the writer's amax / 448), each request's blocks at random places, q codes and weights, all made here (outside
    any timing)."""

    def __init__(self, device, *, batch=LOGITS_BATCH, next_n=LOGITS_NEXT_N, heads=LOGITS_HEADS, ctx=LOGITS_CTX,
                 block_size=LOGITS_BLOCK, seed=0):
        import torch

        dev = torch.device(device)
        g = torch.Generator(device=dev).manual_seed(seed)
        self.batch, self.next_n, self.heads, self.ctx, self.block_size = batch, next_n, heads, ctx, block_size
        self.max_model_len = ctx
        pages = -(-ctx // block_size)
        nb = batch * pages + 7

        def finite_codes(*shape):  # N(0, 1) values as OCP e4m3 codes (torch's own cast)
            return torch.randn(shape, device=dev, generator=g).to(torch.float8_e4m3fn).view(torch.uint8)

        pool = finite_codes(nb, block_size * TOKEN_BYTES)
        scales = (torch.rand(nb, block_size, device=dev, generator=g) + 0.5) * 2.0 ** -8
        pool[:, block_size * HEAD:] = scales.view(torch.uint8).reshape(nb, block_size * 4)
        self.pool = pool
        self.cache = pool.view(nb, block_size, TOKEN_BYTES)
        self.q = finite_codes(batch, next_n, heads, HEAD).view(torch.float8_e4m3fn)
        self.weights = torch.randn(batch * next_n, heads, device=dev, generator=g) * heads ** -0.5
        self.context_lens = torch.full((batch,), ctx, dtype=torch.int32, device=dev)
        perm = torch.randperm(nb, device=dev, generator=g)[: batch * pages]
        self.table = perm.to(torch.int32).reshape(batch, pages).contiguous()
        self.out = torch.empty(batch * next_n, self.max_model_len, dtype=torch.float32, device=dev)
        self.figures = logits_figures(batch, next_n, heads, ctx, self.max_model_len, block_size)

    def call(self, layout: str):
        from impl.indexer_logits import fp8_paged_mqa_logits

        def run():
            fp8_paged_mqa_logits(self.q, self.cache, self.weights, self.context_lens, self.table, self.max_model_len,
                                 layout=layout, out=self.out, target="gfx950", check_lengths=False)

        return run

    def torch_call(self, layout: str):
        """The reference's arithmetic in torch ops, vectorized over the batch: gather every visible key and scale
        through strided views of the pool, decode the fp8 codes (torch's own float8_e4m3fn), fp32 head dot products
        (batched matmul), relu, weights, head sum, scale, -inf past each request's length (all lengths are the
        context here, so nothing is masked). Checked against ours once, outside any timing."""
        import torch

        bs, nb = self.block_size, self.cache.shape[0]
        stride = bs * TOKEN_BYTES
        n = torch.arange(self.ctx, device=self.pool.device)
        blk = self.table.long()[:, n // bs]  # [B, ctx]
        pos = (n % bs)[None, :].expand_as(blk)
        if layout == "normal":
            data = self.pool.as_strided((nb, bs, HEAD), (stride, HEAD, 1))

            def keys():
                return data[blk, pos]
        else:
            tiles = self.pool.as_strided((nb, bs // 16, HEAD // 16, 16, 16), (stride, 16 * HEAD, 256, 16, 1))

            def keys():
                return tiles[blk, pos // 16, :, pos % 16, :].reshape(self.batch, self.ctx, HEAD)
        scale_view = self.pool[:, bs * HEAD:].contiguous().view(torch.float32)  # [nb, bs]
        qf = self.q[:, 0].to(torch.float32)  # [B, H, 128]

        def run():
            k = keys().view(torch.float8_e4m3fn).to(torch.float32)  # [B, ctx, 128]
            s = torch.bmm(k, qf.transpose(1, 2)).relu_()  # [B, ctx, H]
            logits = torch.bmm(s, self.weights[:, :, None]).squeeze(-1) * scale_view[blk, pos]
            return logits

        return run

    def check(self, layout: str) -> None:
        import torch

        self.call(layout)()
        ref = self.torch_call(layout)()
        err = float((self.out - ref).abs().max())
        assert err <= 1e-4 * float(ref.abs().max()), f"torch baseline differs from ours ({layout}): {err}"


@pytest.fixture(scope="module")
def logits_workload(device):
    return LogitsWorkload(device[0])


def _record_logits(gpu_benchmark, seconds, device, refs, w, *, family, layout, torch_seconds=None, **extra):
    info = bench.derived_figures(kind="logits", family=family, seconds=seconds, refs=refs.get(), batch=None,
                                 device=device[1], requests=w.batch, next_n=w.next_n, heads=w.heads, context=w.ctx,
                                 block_size=w.block_size, layout=layout, **w.figures, **extra)
    info["torch_seconds"] = torch_seconds
    info["ratio_to_torch"] = torch_seconds / seconds if torch_seconds and seconds else None  # > 1: faster
    gpu_benchmark.benchmark.extra_info.update(info)


@pytest.fixture(scope="module")
def logits_torch_seconds(logits_workload, flush):
    """The torch reference's median time per layout, measured once in this run."""
    made = {}

    def get(layout):
        if layout not in made:
            logits_workload.check(layout)
            made[layout] = _median(logits_workload.torch_call(layout), flush, bench.GPU_ROUNDS)
        return made[layout]

    return get


@pytest.mark.parametrize("layout", LOGITS_LAYOUTS)
def test_paged_mqa_logits(gpu_benchmark, logits_workload, logits_torch_seconds, refs, device, layout):
    base = logits_torch_seconds(layout)
    seconds = gpu_benchmark(logits_workload.call(layout))
    _record_logits(gpu_benchmark, seconds, device, refs, logits_workload, family="paged-mqa-logits", layout=layout,
                   torch_seconds=base)


@pytest.mark.parametrize("layout", LOGITS_LAYOUTS)
def test_paged_mqa_logits_torch_baseline(gpu_benchmark, logits_workload, logits_torch_seconds, refs, device, layout):
    logits_torch_seconds(layout)  # checked against ours first
    seconds = gpu_benchmark(logits_workload.torch_call(layout))
    _record_logits(gpu_benchmark, seconds, device, refs, logits_workload, family="torch-reference", layout=layout)


def test_paged_mqa_logits_subject(gpu_benchmark, logits_workload, logits_torch_seconds, refs, device, subject):
    """Upstream's Triton paged logits (C4A's block-flat layout only: rocm_fp8_paged_mqa_logits_triton) on the same
    inputs for gfx950's target (OCP fp8): a column beside ours."""
    from contracts.subjects import SubjectSkip

    w = logits_workload
    try:
        fn = subject.bind("gfx950").indexer_logits.triton_launcher(w.q, w.cache, w.weights, w.context_lens, w.table,
                                                                   w.max_model_len, target="gfx950")
        fn()
    except SubjectSkip as exc:
        pytest.skip(exc.reason(subject.label))
    seconds = gpu_benchmark(fn)
    _record_logits(gpu_benchmark, seconds, device, refs, w, family="paged-mqa-logits", layout="normal",
                   torch_seconds=logits_torch_seconds("normal"), subject=subject.label)
