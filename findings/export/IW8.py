"""IW8: the DSv4 head-128 (indexer) compressor reads a request's state block table row at req_idx * block_table_stride,
an int32 product. A table row past 2^31 elements is read from a wrapped offset: the token compresses the state blocks
another row names and stores that into its own cache slot.

Input: `compress_norm_rope_store_triton` with head 128 (it dispatches to the launcher object
`_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL`, whose launch specification this script launches as
vLLM's `kernel_launcher` would, the kernel being `_fused_kv_compress_norm_rope_insert_indexer_attn`). Ratio 4
(overlap), state blocks of 4 rows, three requests with one token each at position 7, writing cache slots 0, 1 and 2
(block size 1, 128 fp8 bytes + one fp32 scale). Request r's table row names state blocks [2r, 2r + 1], whose rows are
random and differ. The block table is an int32 [3, 2] view whose rows are s = 3 * 2^29 elements apart (the launcher
passes block_table.stride(0), a stride that fits an int32); row 2 starts at 2 * s = 3 * 2^30 elements, past 2^31. The
view starts 2^30 + 2^20 elements into one int32 buffer, so row 2's wrapped offset (-2^30) lands 2^20 elements in,
where the script keeps request 0's row [0, 1]. On CPU the buffer is an anonymous mapping: only the pages the script
touches take memory; on a GPU it is a 17 GB allocation. The same call with the table packed is the reference.

Observed: slots 0 and 1 hold what the packed table gives; slot 2 holds the bytes of slot 0 (request 0's state,
compressed at the same position), not request 2's.

Expected: all three slots hold exactly the bytes the packed table gives (the compressor reads each request's own row).

Suggested fix: widen the request index before the multiply, `req_idx = tl.load(token_to_req_indices_ptr +
token_idx).to(tl.int64)`, in `_fused_kv_compress_norm_rope_insert_indexer_attn`; the MXFP4 indexer kernel, the
head-512 kernel `_fused_kv_compress_norm_rope_insert_sparse_attn` and the two-stage gather
`_compress_gather_split_sparse_attn` form the same product and want the same change.
"""
import mmap
from types import SimpleNamespace

import torch

SHARED = ["upstream", "compressor"]
MODULE = "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py"
LAUNCHER = "_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL"
#: the fix of a line (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py",
     "    ``tl.max`` reduction.\n    \"\"\"\n    token_idx = tl.program_id(0)\n\n"
     "    slot_id = tl.load(slot_mapping_ptr + token_idx)\n    if slot_id < 0:\n        return\n\n"
     "    position = tl.load(positions_ptr + token_idx)\n    if (position + 1) % COMPRESS_RATIO != 0:\n"
     "        return\n\n    req_idx = tl.load(token_to_req_indices_ptr + token_idx)\n",
     "    ``tl.max`` reduction.\n    \"\"\"\n    token_idx = tl.program_id(0)\n\n"
     "    slot_id = tl.load(slot_mapping_ptr + token_idx)\n    if slot_id < 0:\n        return\n\n"
     "    position = tl.load(positions_ptr + token_idx)\n    if (position + 1) % COMPRESS_RATIO != 0:\n"
     "        return\n\n    req_idx = tl.load(token_to_req_indices_ptr + token_idx).to(tl.int64)\n"),
]

HEAD, ROPE, RATIO, STATE_BS = 128, 64, 4, 4
STATE_WIDTH = 2 * HEAD  # ratio 4 overlaps two windows
REQS, POSITION = 3, 7
ROW_STRIDE = 3 * 2 ** 29  # int32 elements between table rows: < 2^31, an int32 launch argument
BASE = 2 ** 30 + 2 ** 20  # the table view's first element; row 2's wrapped offset (-2^30) lands 2^20 elements in
TOKEN_BYTES = HEAD + 4


class _Launch:
    """Stands in for vLLM's ``kernel_launcher`` around upstream's launcher object: takes the launch specification
    its ``__call__`` returns (grid, kernel, the arguments it derives) and fills every other kernel argument from the
    call's input of the same name, or of the name without ``_ptr``."""

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self, **inputs):
        spec = type(self.launcher).__call__(self.launcher, **inputs)
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict) and "kernel" in spec[1]):
            raise CannotRun(f"the launcher object did not return a launch specification: {spec!r}")
        grid, launch = spec[0], dict(spec[1])
        kernel = launch.pop("kernel")
        for name in kernel.arg_names:
            if name not in launch:
                source = name if name in inputs else name[:-len("_ptr")] if name.endswith("_ptr") else None
                if source not in inputs:
                    raise CannotRun(f"no input for the kernel argument {name}")
                launch[name] = inputs[source]
        kernel[grid](**launch)


def _wrap32(x: int) -> int:
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _buffer(numel: int, device: str):
    """An int32 buffer of ``numel`` elements; on the CPU an anonymous mapping whose untouched pages take no memory."""
    if device != "cpu":
        return torch.empty(numel, dtype=torch.int32, device=device), None
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    try:
        mm = mmap.mmap(-1, numel * 4, flags=flags)
    except (OSError, ValueError) as exc:
        raise CannotRun(f"cannot map a {numel * 4 / 2 ** 30:.1f} GiB address range (pages left untouched): {exc}")
    return torch.frombuffer(mm, dtype=torch.int32), mm


def _run(launch, table, device):
    """The three tokens through upstream's compressor with ``table``; returns the cache, [3, 1, 132] uint8."""
    gen = torch.Generator().manual_seed(8)
    state = torch.randn(2 * REQS, STATE_BS, 2 * STATE_WIDTH, generator=gen)  # kv | scores, per state row
    angles = torch.rand(POSITION + 1, ROPE // 2, generator=gen, dtype=torch.float64) * 6.0
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)
    cache = torch.zeros(REQS, 1, TOKEN_BYTES, dtype=torch.uint8, device=device)
    slots = torch.arange(REQS, dtype=torch.int64, device=device)
    got = call_upstream(
        launch, state_cache=state.to(device), num_actual=REQS,
        token_to_req_indices=torch.arange(REQS, dtype=torch.int32, device=device),
        positions=torch.full((REQS,), POSITION, dtype=torch.int64, device=device), slot_mapping=slots,
        block_table=table, block_size=STATE_BS, state_width=STATE_WIDTH, cos_sin_cache=cos_sin.to(device),
        kv_cache=cache, k_cache_metadata=SimpleNamespace(slot_mapping=slots), pdl_kwargs={}, head_dim=HEAD,
        rope_head_dim=ROPE, compress_ratio=RATIO, overlap=True, use_fp4_cache=False,
        rms_norm_weight=torch.ones(HEAD, dtype=torch.float32, device=device), rms_norm_eps=1e-6, quant_block=HEAD,
        token_stride=HEAD, scale_dim=4)
    if isinstance(got, Raised):
        raise CannotRun(f"upstream's compressor did not run: {got!r}")
    if device != "cpu":
        torch.cuda.synchronize()
    return cache.cpu()


def reproduce(args):
    device = args.device
    no_mx = {"vllm.utils.deep_gemm": {"mqa_logits_use_mx_scales": lambda: False}}  # MX_SCALE is CUDA SM100 only
    mod, launch = load_compressor(MODULE, "gfx942", no_mx)
    launcher = getattr(mod, LAUNCHER, None)
    if launcher is None:
        raise CannotRun(f"{MODULE} has no {LAUNCHER}")
    setattr(mod, LAUNCHER, _Launch(launcher))

    rows = torch.tensor([[2 * r, 2 * r + 1] for r in range(REQS)], dtype=torch.int32)
    want = _run(launch, rows.to(device), device)
    if not bool(want.any()) or torch.equal(want[2], want[0]):
        raise CannotRun("the packed table's run does not give request 2 its own record: the script cannot tell a "
                        "wrapped read apart")
    wrapped = BASE + _wrap32((REQS - 1) * ROW_STRIDE)  # where row 2 lands if its offset wraps
    assert 0 <= wrapped and wrapped + rows.shape[1] <= BASE
    flat, _keep = _buffer(BASE + (REQS - 1) * ROW_STRIDE + 64, device)
    far = flat.as_strided(tuple(rows.shape), (ROW_STRIDE, 1), BASE)
    far.copy_(rows.to(device))
    flat[wrapped:wrapped + rows.shape[1]].copy_(rows[0].to(device))  # request 0's row where row 2 would wrap to
    got = _run(launch, far, device)
    if not (torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])):
        raise CannotRun("slots 0 and 1 (table rows below 2^31 elements) differ from the packed run: not this defect")
    same = torch.equal(got[2], want[2])
    state = ("holds the packed run's record" if same else "holds slot 0's record (request 0's state)"
             if torch.equal(got[2], want[0]) else f"differs from the packed run in {int((got[2] != want[2]).sum())} "
             "bytes")
    observed = (f"with table rows {ROW_STRIDE} elements apart ({2 * ROW_STRIDE} wraps to {_wrap32(2 * ROW_STRIDE)} "
                f"in int32): slots 0 and 1 hold the packed run's records; slot 2 {state}")
    return Verdict(not same, observed, "slot 2 holds request 2's record, as with the packed table "
                   f"({int((want[2] != want[0]).sum())} of its {TOKEN_BYTES} bytes differ from slot 0's)")
