"""UQ2: the sparse decode kernels compute q's and out's row offsets (query_idx * stride(0) + head * stride(1)) in
int32. Past 2^31 elements the offset wraps: q's row is read from, and out's row written to, a place outside the
tensor.

Input: three runs on one bf16 buffer of about 2^32 elements, in which a [3, 1, 512] view (DSv4's head: 448 NoPE + 64
RoPE lanes) has rows s = 3 * 2^29 elements apart. That stride fits an int32, so Triton passes it as one; row 2 starts
at 2 * s = 3 * 2^30 elements, past 2^31. The view starts 2^30 + 2^20 elements into the buffer, so row 2's wrapped
offset (-2^30) lands 2^20 elements in, where the script keeps a sentinel. (1) The single-kernel decode
`_sparse_attn_decode_ragged_kernel` (the decode of architectures other than gfx942/gfx950), launched with the
arguments `_rocm_sparse_attn_decode_ragged_triton` gives it, with q the far-rows view (its three rows equal) and a
packed out; (2) the same with a packed q and out the far-rows view; (3) the split-K reduce
`_sparse_attn_decode_reduce_kernel` (how the gfx942 and gfx950 decodes write out), launched as the wrapper launches
it over one split whose partial state is the same for all three rows, with out the far-rows view. The cache holds two
fp8_ds_mla tokens (block size 1), 1.0 on one half of the NoPE lanes each; q is 1.0 on the first half, the sentinel at
the wrapped place on the second, so a row's output tells which q it read. On CPU the buffer is an anonymous mapping:
only the pages the script touches take memory; on a GPU it is an 8.6 GB allocation. The product is the one production
forms: q and out are packed [T, H, 512], so stride(0) = H * 512 and the wrap starts at T > 2^31 / (H * 512) decode
rows (65,536 at 64 local heads). The view only keeps the launch to 3 rows.

Observed: (1) row 2 of out is the attention of the sentinel q at the wrapped place, not of q's row 2; (2) and (3)
row 2 of out is never written (it keeps its NaN fill) and the sentinel words 2^30 elements before out are
overwritten: an out-of-bounds write.

Expected: the three rows of out are equal (equal q rows, the same keys, the same partial state), and nothing outside
out changes.

Suggested fix: widen the program ids before the multiply, e.g. `query_idx = tl.program_id(0).to(tl.int64)` and
`pid_h = tl.program_id(1).to(tl.int64)` (program_id(2) in the partial kernels), in `_sparse_attn_decode_ragged_kernel`,
`_sparse_attn_decode_partial_kernel`, `_sparse_attn_decode_gfx950_partial_kernel` and
`_sparse_attn_decode_reduce_kernel`. The partial state's offsets (query_idx * pm_stride0, query_idx * pa_stride0) are
int32 products of the same size once a large batch runs one split, and widening query_idx covers them too.
"""
import mmap

import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two in each kernel the script runs (the tests apply it to a copy of the tree: exit 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "    query_idx = tl.program_id(0)\n    pid_h = tl.program_id(1)\n\n"
     "    head_offsets = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)\n    head_mask = head_offsets < num_heads\n"
     "    nope_offsets = tl.arange(0, NOPE_BLOCK)\n",
     "    query_idx = tl.program_id(0).to(tl.int64)\n    pid_h = tl.program_id(1).to(tl.int64)\n\n"
     "    head_offsets = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)\n    head_mask = head_offsets < num_heads\n"
     "    nope_offsets = tl.arange(0, NOPE_BLOCK)\n"),
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "    query_idx = tl.program_id(0)\n    pid_h = tl.program_id(1)\n\n"
     "    head_offsets = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)\n    head_mask = head_offsets < num_heads\n"
     "    comb_offsets = tl.arange(0, COMB_DIM)\n",
     "    query_idx = tl.program_id(0).to(tl.int64)\n    pid_h = tl.program_id(1).to(tl.int64)\n\n"
     "    head_offsets = pid_h * BLOCK_H + tl.arange(0, BLOCK_H)\n    head_mask = head_offsets < num_heads\n"
     "    comb_offsets = tl.arange(0, COMB_DIM)\n"),
]

ROWS, HEAD, NOPE, ROPE = 3, 512, 448, 64
TOKEN_DATA, TOKEN_SCALES = 576, 8
ROW_STRIDE = 3 * 2 ** 29  # < 2^31: Triton passes it as an int32
BASE = 2 ** 30 + 2 ** 20  # the views' first element; row 2's wrapped offset (-2^30) lands 2^20 elements in
SCALE = 0.1
SENTINEL_OUT = 7.0


def _wrap32(x: int) -> int:
    return (x + 2 ** 31) % 2 ** 32 - 2 ** 31


def _buffer(numel: int, device: str):
    """A bf16 buffer of ``numel`` elements; on the CPU an anonymous mapping whose untouched pages take no memory."""
    if device != "cpu":
        return torch.empty(numel, dtype=torch.bfloat16, device=device), None
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_NORESERVE", 0x4000)
    try:
        mm = mmap.mmap(-1, numel * 2, flags=flags)
    except (OSError, ValueError) as exc:
        raise CannotRun(f"cannot map a {numel * 2 / 2 ** 30:.1f} GiB address range (pages left untouched): {exc}")
    return torch.frombuffer(mm, dtype=torch.bfloat16), mm


def _cache(device):
    """Two tokens of fp8_ds_mla, block size 1 (448 e4m3 NoPE codes, 64 bf16 RoPE lanes, 7 UE8M0 scales of 1.0): token
    0 is 1.0 in NoPE lanes [0, 224) and 0 elsewhere, token 1 is 1.0 in lanes [224, 448). A q that is 1.0 on one half
    attends (almost) only to that half's token, so the output row tells which q a row was computed from."""
    cache = torch.zeros(2, 1, TOKEN_DATA + TOKEN_SCALES, dtype=torch.uint8)
    one = int(torch.tensor([1.0]).to(torch.float8_e4m3fn).view(torch.uint8)[0])
    cache[0, 0, :NOPE // 2] = one
    cache[1, 0, NOPE // 2:NOPE] = one
    cache[:, 0, TOKEN_DATA:TOKEN_DATA + NOPE // 64] = 127
    return cache.to(device)


def _half(which: int):
    q = torch.zeros(HEAD, dtype=torch.bfloat16)
    q[which * NOPE // 2:(which + 1) * NOPE // 2] = 1.0
    return q


def _decode(kernel, q, cache, out):
    """The single-kernel decode over both tokens for every row, launched with the wrapper's arguments (no sink, no
    extra segment, OCP fp8)."""
    device = q.device
    rows, heads = q.shape[0], q.shape[1]
    indices = torch.tensor([0, 1] * rows, dtype=torch.int32, device=device)
    indptr = torch.arange(0, 2 * rows + 1, 2, dtype=torch.int32, device=device)
    sink = torch.empty(1, dtype=torch.float32, device=device)
    extra_indices = torch.empty(0, dtype=torch.int32, device=device)
    extra_indptr = torch.zeros(rows + 1, dtype=torch.int32, device=device)
    got = call_upstream(
        kernel[(rows, 1)], q, cache, indices, indptr, cache, extra_indices, extra_indptr, sink, out,
        q.stride(0), q.stride(1), out.stride(0), out.stride(1), cache.stride(0), cache.stride(0),
        cache.shape[0] * cache.shape[1], cache.shape[0] * cache.shape[1], cache.shape[1], cache.shape[1],
        SCALE, heads, HAS_ATTN_SINK=False, HAS_EXTRA=False, NOPE_DIM=NOPE, NOPE_BLOCK=512, ROPE_DIM=ROPE,
        IS_FNUZ_MAIN=False, IS_FNUZ_EXTRA=False, BLOCK_H=16, BLOCK_K=16, num_warps=8)
    if isinstance(got, Raised):
        raise CannotRun(f"upstream's _sparse_attn_decode_ragged_kernel did not launch with the wrapper's arguments: "
                        f"{got!r}")


def _reduce(kernel, part_acc, out):
    """The split-K reduce over one split per row (m = 0, l = 1, so each row is its acc), launched as the wrapper
    launches it (no sink, no fused inverse RoPE, bf16 out)."""
    device = out.device
    rows = out.shape[0]
    pm = torch.zeros(rows, 1, 1, dtype=torch.float32, device=device)  # [queries, splits, heads]
    pl = torch.ones(rows, 1, 1, dtype=torch.float32, device=device)
    pa = part_acc.reshape(rows, 1, 1, HEAD).to(device=device, dtype=torch.float32).contiguous()
    sink = torch.empty(1, dtype=torch.float32, device=device)
    got = call_upstream(
        kernel[(rows, 1)], pm, pl, pa, sink, out, None, None, None, out.stride(0), out.stride(1), 0, HEAD // 32,
        pm.stride(0), pm.stride(1), pa.stride(0), pa.stride(1), pa.stride(2), 0, 1,
        HAS_ATTN_SINK=False, ADAPTIVE_SPLITS=False, COMB_DIM=HEAD, BLOCK_H=1, NUM_SPLITS=1, SPLITS_PAD=1,
        FUSE_INV_ROPE=False, NOPE=NOPE, HALF=ROPE // 2, QUANT_OUT=False, num_warps=4)
    if isinstance(got, Raised):
        raise CannotRun(f"upstream's _sparse_attn_decode_reduce_kernel did not launch with the wrapper's arguments: "
                        f"{got!r}")


def _rows(t):
    return [t[r, 0].cpu() for r in range(t.shape[0])]


def _same(a, b) -> bool:
    return bool(torch.equal(a.view(torch.int16), b.view(torch.int16)))


def _state(row, want) -> str:
    if _same(row, want):
        return "equals rows 0 and 1"
    return "is not written (NaN)" if bool(torch.isnan(row.float()).all()) else "is wrong"


def reproduce(args):
    device = args.device
    _, decode_kernel, reduce_kernel = load_names(MODULE, rocm_overrides("gfx942"), "_sparse_attn_decode_ragged_kernel",
                                                 "_sparse_attn_decode_reduce_kernel")
    wrapped = BASE + _wrap32((ROWS - 1) * ROW_STRIDE)  # where row 2 of a view at BASE lands if its offset wraps
    assert 0 <= wrapped and wrapped + 2 * HEAD <= BASE
    flat, _keep = _buffer(BASE + (ROWS - 1) * ROW_STRIDE + 2 * HEAD + 2 ** 20, device)
    gen = torch.Generator().manual_seed(11)
    cache = _cache(device)
    q_row = _half(0)
    q_far = flat.as_strided((ROWS, 1, HEAD), (ROW_STRIDE, HEAD, 1), BASE)  # lanes [0, 512) of each far row
    out_far = flat.as_strided((ROWS, 1, HEAD), (ROW_STRIDE, HEAD, 1), BASE + HEAD)  # lanes [512, 1024)
    q_packed = q_row.reshape(1, 1, HEAD).repeat(ROWS, 1, 1).to(device)

    def reset():
        for r in range(ROWS):
            q_far[r, 0].copy_(q_row.to(device))
            out_far[r, 0].fill_(float("nan"))
        flat[wrapped:wrapped + HEAD].copy_(q_sentinel.to(device))
        flat[wrapped + HEAD:wrapped + 2 * HEAD].fill_(SENTINEL_OUT)

    def outside_changed() -> int:
        return int((flat[wrapped + HEAD:wrapped + 2 * HEAD].cpu().float() != SENTINEL_OUT).sum())

    def sync():
        if device != "cpu":
            torch.cuda.synchronize()

    # the reference rows: the same launch on packed tensors, q_row in every row
    ref = torch.full((ROWS, 1, HEAD), float("nan"), dtype=torch.bfloat16, device=device)
    _decode(decode_kernel, q_packed, cache, ref)
    sync()
    want = _rows(ref)[0]
    if not all(_same(r, want) for r in _rows(ref)):
        raise CannotRun("the packed decode gives equal q rows different outputs: the script cannot compare rows")
    # the sentinel: a q whose output (row 2 of a packed launch) differs from q_row's: the q of the other half
    q_sentinel = from_sentinel = None
    for cand in (_half(1), -q_row):
        alt_q = q_packed.clone()
        alt_q[2, 0].copy_(cand.to(device))
        alt = torch.full((ROWS, 1, HEAD), float("nan"), dtype=torch.bfloat16, device=device)
        _decode(decode_kernel, alt_q, cache, alt)
        sync()
        if not _same(_rows(alt)[2], want):
            q_sentinel, from_sentinel = cand, _rows(alt)[2]
            break
    if q_sentinel is None:
        raise CannotRun("no sentinel q gives another output than q's row here: a wrapped read cannot be told apart")

    observed, present = [], False
    # (1) q's rows far apart, out packed
    reset()
    out1 = torch.full((ROWS, 1, HEAD), float("nan"), dtype=torch.bfloat16, device=device)
    _decode(decode_kernel, q_far, cache, out1)
    sync()
    r1 = _rows(out1)
    if not (_same(r1[0], want) and _same(r1[1], want)):
        raise CannotRun("rows 0 and 1 (below 2^31 elements) differ from the packed decode: not this defect")
    state = ("is the attention of the sentinel q 2^30 elements before q" if _same(r1[2], from_sentinel) else
             "equals rows 0 and 1" if _same(r1[2], want) else f"is neither ({r1[2][0].item():.4g} in lane 0)")
    present |= not _same(r1[2], want)
    observed.append(f"decode with q's rows {ROW_STRIDE} elements apart: row 2 of out {state}")
    # (2) q packed, out's rows far apart
    reset()
    _decode(decode_kernel, q_packed, cache, out_far)
    sync()
    r2, changed = _rows(out_far), outside_changed()
    present |= changed > 0 or not _same(r2[2], want)
    observed.append(f"decode with out's rows far apart: row 2 of out {_state(r2[2], want)}, {changed} of {HEAD} "
                    "sentinel words 2^30 elements before out overwritten")
    # (3) the split-K reduce (gfx942 / gfx950) writing out's rows far apart
    acc = torch.randn(HEAD, generator=gen).repeat(ROWS, 1)
    packed = torch.full((ROWS, 1, HEAD), float("nan"), dtype=torch.bfloat16, device=device)
    _reduce(reduce_kernel, acc, packed)
    sync()
    acc_bf16 = _rows(packed)[0]
    if not all(_same(r, acc_bf16) for r in _rows(packed)):
        raise CannotRun("the reduce gives equal partial states different rows: the script cannot compare rows")
    reset()
    _reduce(reduce_kernel, acc, out_far)
    sync()
    r3, changed = _rows(out_far), outside_changed()
    if not (_same(r3[0], acc_bf16) and _same(r3[1], acc_bf16)):
        raise CannotRun("the reduce's rows 0 and 1 (below 2^31 elements) differ from its packed rows: not this defect")
    present |= changed > 0 or not _same(r3[2], acc_bf16)
    observed.append(f"split-K reduce with out's rows far apart: row 2 of out {_state(r3[2], acc_bf16)}, {changed} "
                    f"of {HEAD} sentinel words overwritten")
    expected = (f"all three rows of out equal (decode: lane 0 {want[0].item():.4g}; reduce: the partial acc, lane 0 "
                f"{acc_bf16[0].item():.4g}); 0 words changed outside out ({2 * ROW_STRIDE} wraps to "
                f"{_wrap32(2 * ROW_STRIDE)} in int32)")
    note = ("" if device != "cpu" else
            "(Triton's interpreter does not compute the decode's bf16 arithmetic as a GPU does, so its values are not "
            "a GPU's; each row is compared with rows of the same kernel on packed tensors, which that does not affect)")
    return Verdict(present, "; ".join(observed), expected, note)
