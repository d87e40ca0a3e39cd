"""UC1: the gfx950 indexer-K gather `_cp_gather_indexer_quant_cache_gfx950_kernel` keeps Triton's default 16-byte
alignment specialization on its block-table pointer. The indexer hands it row slices of the persistent block table.
When a table row is not a multiple of 16 bytes, two prefill chunks of the same geometry compile the kernel twice.

Input: gfx950, upstream's `cp_gather_indexer_k_quant_cache_triton` called as the DSv4 indexer's prefill calls it,
once per chunk, with `chunk.block_table = block_table[start_idx:end_idx]` (vllm/v1/attention/backends/mla/indexer.py).
The persistent block table is a production-shaped [4, 391] int32 table: max_model_len 100000 in blocks of 256
tokens. The DSv4 cache group's block size is 256, and `get_block_table_width` pads the width to 128 tokens' worth
of blocks, which is 1 block at a block size of 256, so it stays cdiv(100000, 256) = 391 columns. A row is 1564
bytes, not a multiple of 16. The indexer cache is a C4A one: [4, 64, 132] uint8, NORMAL layout (as the C4A path
passes). Chunk A is rows [0, 1): a prefill-only step. Chunk B is rows [1, 2): one decode request ahead of the
prefill. Both are one request of 4 tokens, with fresh cu_seq_lens / token_to_seq tensors and the workspace's
leading k_fp8 / k_scale rows. Only the table slice's address differs: row 0 is 16-byte aligned, row 1 is 1564
bytes in.

Observed: two specialization keys, so two compiled variants of the kernel for one geometry. They differ only in
block_table_ptr: divisible by 16 for chunk A, not for chunk B. On a GPU the kernel's in-memory cache grows by
one entry per chunk. Without a GPU the keys come from Triton's own JIT binder for a gfx950 (HIP) target. The padding
makes the width a multiple of 4 blocks at block sizes up to 32 (1 and 16 included), so every row is aligned there.
At 64 it is a multiple of 2, so a row is unaligned only for some lengths (max_model_len 32832: 514 columns). At 128
or more there is no padding, and any width that is not a multiple of 4 is unaligned. The result is a one-off
mid-serving JIT stall the first time a chunk starts at such a row, bounded at one extra variant.

Expected: one compiled variant for both chunks: the table's row offset must not change the specialization key.

Suggested fix: add `do_not_specialize_on_alignment=["block_table_ptr"]` to the kernel's `@triton.jit` (next to
`do_not_specialize=["num_batches"]`). Its per-program scalar load gains nothing from the alignment. The other
metadata pointers (cu_seqlen_ptr, token_to_seq_ptr) may take the same treatment if a caller ever slices them.
"""
import math

import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     '@triton.jit(do_not_specialize=["num_batches"])\ndef _cp_gather_indexer_quant_cache_gfx950_kernel(',
     '@triton.jit(\n    do_not_specialize=["num_batches"],\n'
     '    do_not_specialize_on_alignment=["block_table_ptr"],\n)\n'
     'def _cp_gather_indexer_quant_cache_gfx950_kernel('),
]

KERNEL = "_cp_gather_indexer_quant_cache_gfx950_kernel"
MAX_MODEL_LEN, TABLE_BLOCK_SIZE, TOKEN_ALIGNMENT = 100000, 256, 128
MAX_NUM_REQS = 4
CACHE_BLOCKS, CACHE_BLOCK, HEAD, SCALE_BYTES = 4, 64, 128, 4
TOKENS = 4
CHUNKS = (("A", 0), ("B", 1))  # (name, first row of the persistent table)


def _table_width() -> int:
    """The persistent table's width, as vLLM sizes it: cdiv(max_model_len, block_size) blocks, rounded up to a
    multiple of 128 tokens' worth of blocks."""
    blocks = -(-MAX_MODEL_LEN // TABLE_BLOCK_SIZE)
    align = TOKEN_ALIGNMENT // math.gcd(TOKEN_ALIGNMENT, TABLE_BLOCK_SIZE)
    return -(-blocks // align) * align


def _binder(kernel):
    """Triton's own argument binder for ``kernel`` on a gfx950 target: what the JIT keys its compiled variants
    on (None where this Triton does not expose it)."""
    try:
        from triton.backends.compiler import GPUTarget
        from triton.compiler import make_backend
        from triton.runtime.jit import JITFunction, create_function_from_signature
    except ImportError:
        return None
    opts = dict(getattr(kernel, "kwargs", None) or {})  # the interpreter keeps the decorator's arguments here
    for name in ("do_not_specialize", "do_not_specialize_on_alignment"):
        opts.setdefault(name, getattr(kernel, name, None))
    jf = JITFunction(kernel.fn, do_not_specialize=opts["do_not_specialize"],
                     do_not_specialize_on_alignment=opts["do_not_specialize_on_alignment"])
    bind = create_function_from_signature(jf.signature, jf.params, make_backend(GPUTarget("hip", "gfx950", 64)))
    names = [p.name for p in jf.params]

    def key(args, kwargs):
        _, spec, _ = bind(*args, **kwargs)
        return tuple((n, tuple(s) if isinstance(s, (tuple, list)) else s) for n, s in zip(names, spec))

    return key


def reproduce(args):
    device = args.device
    mod, gather, kernel = load_names(MODULE, rocm_overrides("gfx950"), "cp_gather_indexer_k_quant_cache_triton",
                                     KERNEL)
    native = device != "cpu" and isinstance(getattr(kernel, "device_caches", None), dict)
    key_of = _binder(kernel)
    if key_of is None and not native:
        raise CannotRun("this Triton exposes neither a JIT binder (triton.runtime.jit.create_function_from_signature)"
                        " nor, without a GPU, a kernel cache to count compiled variants in")
    launches = []

    class _Spy:
        def __getitem__(self, grid):
            def launch(*a, **k):
                launches.append((a, k))
                # natively the launch compiles (or reuses) a variant; without a GPU only its key is taken (Triton's
                # interpreter refuses this kernel's scalar store mask, which a GPU compiles)
                return kernel[grid](*a, **k) if native else None
            return launch

    mod.__dict__[KERNEL] = _Spy()
    width = _table_width()
    table = torch.arange(MAX_NUM_REQS * width, dtype=torch.int32).remainder(CACHE_BLOCKS)
    table = table.reshape(MAX_NUM_REQS, width).to(device)
    cache = torch.randint(0, 120, (CACHE_BLOCKS, CACHE_BLOCK, HEAD + SCALE_BYTES), dtype=torch.uint8,
                          generator=torch.Generator().manual_seed(1)).to(device)
    fp8 = torch.float8_e4m3fn  # gfx950's (OCP)
    k_fp8_full = torch.zeros(64, HEAD, dtype=fp8, device=device)
    k_scale_full = torch.zeros(64, SCALE_BYTES, dtype=torch.uint8, device=device)
    compiled, aligned = [], []
    cache_of = None
    if native:
        dev_index = torch.cuda.current_device()
    for name, row in CHUNKS:
        chunk_table = table[row:row + 1]
        aligned.append(chunk_table.data_ptr() % 16 == 0)
        cu = torch.tensor([0, TOKENS], dtype=torch.int32, device=device)
        token_to_seq = torch.zeros(TOKENS, dtype=torch.int32, device=device)
        got = call_upstream(gather, cache, k_fp8_full[:TOKENS], k_scale_full[:TOKENS], chunk_table, cu,
                            token_to_seq=token_to_seq, cache_layout="NORMAL")
        if isinstance(got, Raised):
            raise CannotRun(f"cp_gather_indexer_k_quant_cache_triton raised for chunk {name}: {got!r}")
        if native:
            torch.cuda.synchronize()
            caches = kernel.device_caches.get(dev_index) or next(iter(kernel.device_caches.values()))
            cache_of = caches[0]
            compiled.append(len(cache_of))
    if len(launches) != len(CHUNKS):
        raise CannotRun(f"the gather launched {KERNEL} {len(launches)} times for {len(CHUNKS)} chunks (expected one "
                        f"launch each: the gfx950 path)")
    keys = [key_of(a, k) for a, k in launches] if key_of else []
    diff = []
    if keys:
        first, second = dict(keys[0]), dict(keys[1])
        diff = [f"{n}: {first[n]} / {second[n]}" for n in first if first[n] != second[n]]
    variants = compiled[-1] if native else len(set(keys))
    where = (f"the kernel's in-memory cache after each chunk: {compiled} entries" if native else
             "Triton's JIT binder for a gfx950 target")
    observed = (f"{variants} compiled variant(s) for one geometry ({where}); table rows of {width} int32 = "
                f"{4 * width} bytes; chunk A's slice {'is' if aligned[0] else 'is not'} 16-byte aligned, chunk B's "
                f"{'is' if aligned[1] else 'is not'}; keys differ in: {'; '.join(diff) or 'nothing'}")
    if all(aligned):
        raise CannotRun(f"both slices are 16-byte aligned (rows of {4 * width} bytes): no case for this finding")
    return Verdict(variants > 1, observed, "1 compiled variant: both chunks share one specialization key",
                   note="" if native else "(no GPU: the keys are what Triton's JIT would compile on; nothing was "
                                          "compiled or run)")
