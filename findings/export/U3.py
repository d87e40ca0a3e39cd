"""U3: the sparse decode ends with where(l > 0, acc / max(l, 1e-30), 0), so a NaN softmax denominator (a key with an
infinite lane) comes out as a row of zeros instead of NaN.

Input: one query, one head, one KV token. The token's cache row (fp8_ds_mla, 576 data bytes + 8 UE8M0 scale bytes)
has fp8 code 1.0 in NoPE lane 0 and scale code 255 on the first 64-lane group, so the reader decodes lane 0 as
1.0 * 2^128 = +inf (the other lanes of that group decode to 0 * inf = NaN, which the decode's NaN scrub clears).
q is 1.0 in lane 0 and 0 elsewhere, so the token's score is +inf. The online softmax for that token gives
m = +inf, p = exp(inf - inf) = NaN, so l = NaN and acc = NaN. Upstream's split-K reduce
(`_sparse_attn_decode_reduce_kernel`, the gfx942 and gfx950 decodes) is launched with the arguments the wrapper
`_rocm_sparse_attn_decode_ragged_triton` gives it, over one split that holds that state. The split holds m = +inf
as gfx942's partial stores it, or m = -FLT_MAX as gfx950's partial stores it when l is not > 0. On a GPU, the
generic single-kernel decode (`_sparse_attn_decode_ragged_kernel`, through the same wrapper with neither gfx942
nor gfx950 set) also runs end to end on that cache row.

Observed: the output row is 0 in all 512 lanes. `where(l > 0, ..., 0)` takes NaN > 0 as false, so a corrupt key
reads as "no tokens attended".

Expected: NaN in every lane. The softmax over a key with an infinite lane is undefined, and acc is already NaN.
Only l == 0 (really no valid token) should give the zero row.

Suggested fix: test for the empty row explicitly and let NaN through: `out = tl.where(l_final[:, None] != 0.0,
acc / denom[:, None], 0.0)` in `_sparse_attn_decode_reduce_kernel`, and the same for the four `l_final > 0` /
`l_i > 0` selects at the end of `_sparse_attn_decode_ragged_kernel`. The gfx950 partial's `m_store = where(l_i >
0, ...)` does not hide the NaN on its own: acc stays NaN.
"""
import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
HEAD, NOPE, ROPE = 512, 448, 64
TOKEN_DATA, TOKEN_SCALES = 576, 8
SCALE = 0.1
FLT_MAX = 3.4028234663852886e38


def _poisoned_cache(fp8_dtype, device):
    """One block of one token: NoPE lane 0 holds fp8 1.0, the first group's scale code is 255 (2^128)."""
    cache = torch.zeros(1, 1, TOKEN_DATA + TOKEN_SCALES, dtype=torch.uint8)
    one = torch.tensor([1.0]).to(fp8_dtype).view(torch.uint8)
    cache[0, 0, 0] = one[0]
    cache[0, 0, TOKEN_DATA:TOKEN_DATA + NOPE // 64] = 127
    cache[0, 0, TOKEN_DATA] = 255
    return cache.to(device)


def _decoded_key(cache, fp8_dtype):
    """The key as upstream's readers decode it: fp8 * 2^(code - 127), NaN lanes cleared, RoPE lanes as bf16."""
    row = cache[0, 0].cpu()
    codes = row[:NOPE].view(fp8_dtype).float()
    scales = torch.exp2(row[TOKEN_DATA:TOKEN_DATA + NOPE // 64].float() - 127.0).repeat_interleave(64)
    nope = codes * scales
    nope = torch.where(torch.isnan(nope), torch.zeros_like(nope), nope)
    rope = row[NOPE:TOKEN_DATA].view(torch.bfloat16).float()
    return torch.cat([nope, rope])


def _query():
    q = torch.zeros(HEAD)
    q[0] = 1.0
    return q


def _describe(row):
    row = row.float().cpu()
    if bool((row == 0).all()):
        return f"0 in all {row.numel()} lanes"
    if bool(torch.isnan(row).all()):
        return f"NaN in all {row.numel()} lanes"
    return (f"{int(torch.isnan(row).sum())} NaN, {int((row == 0).sum())} zero, "
            f"{int(torch.isfinite(row).sum())} finite lanes")


def _run_reduce(mod, device, part_m, part_l, part_acc):
    """Upstream's reduce over one query, one split, one head, launched as the wrapper launches it (no sink, no
    fused inverse RoPE, bf16 output)."""
    import triton

    kernel = getattr(mod, "_sparse_attn_decode_reduce_kernel", None)
    if kernel is None:
        raise CannotRun(f"{MODULE} has no _sparse_attn_decode_reduce_kernel")
    pm = torch.tensor([[[part_m]]], dtype=torch.float32, device=device)  # [queries, splits, heads]
    pl = torch.tensor([[[part_l]]], dtype=torch.float32, device=device)
    pa = part_acc.reshape(1, 1, 1, HEAD).to(device=device, dtype=torch.float32).contiguous()
    sink = torch.empty(1, dtype=torch.float32, device=device)
    out = torch.full((1, 1, HEAD), 7.0, dtype=torch.bfloat16, device=device)
    got = call_upstream(
        kernel[(1, 1)], pm, pl, pa, sink, out, None, None, None, out.stride(0), out.stride(1), 0, HEAD // 32,
        pm.stride(0), pm.stride(1), pa.stride(0), pa.stride(1), pa.stride(2), 0, 1,
        HAS_ATTN_SINK=False, ADAPTIVE_SPLITS=False, COMB_DIM=HEAD, BLOCK_H=1, NUM_SPLITS=1,
        SPLITS_PAD=triton.next_power_of_2(1), FUSE_INV_ROPE=False, NOPE=NOPE, HALF=ROPE // 2, QUANT_OUT=False,
        num_warps=4)
    if isinstance(got, Raised):
        raise CannotRun(f"upstream's reduce kernel did not launch with the wrapper's arguments: {got!r}")
    return out[0, 0]


def _run_generic_end_to_end(device):
    """The generic single-kernel decode through upstream's wrapper (needs a GPU: under the interpreter the kernel's
    bf16 arithmetic and bf16 tl.dot are not computed as a GPU computes them)."""
    _, wrapper = load_names(MODULE, rocm_overrides("generic"), "_rocm_sparse_attn_decode_ragged_triton")
    cache = _poisoned_cache(torch.float8_e4m3fn, device)
    q = _query().to(torch.bfloat16).reshape(1, 1, HEAD).to(device)
    indices = torch.zeros(1, dtype=torch.int32, device=device)
    indptr = torch.tensor([0, 1], dtype=torch.int32, device=device)
    got = call_upstream(wrapper, q, cache, indices, indptr, SCALE, None, NOPE, ROPE)
    if isinstance(got, Raised):
        return got
    torch.cuda.synchronize()
    return got[0, 0]


def reproduce(args):
    device = args.device
    mod = load_upstream(MODULE, overrides=rocm_overrides("gfx942"))
    fp8 = torch.float8_e4m3fnuz  # gfx942's SWA cache is FNUZ; 1.0 and the 2^128 scale are the same either way
    key = _decoded_key(_poisoned_cache(fp8, "cpu"), fp8)
    q = _query()
    # the expected value, inline: the online softmax of one token with an infinite score
    score = (q * key).sum() * SCALE
    m = score  # the running max after the one token
    p = torch.exp(score - m)  # exp(inf - inf) = NaN
    l_sum, acc = p, p * key
    expected_row = acc / l_sum
    score, m, l_sum = float(score), float(m), float(l_sum)
    if not (score == float("inf") and l_sum != l_sum and bool(torch.isnan(expected_row).all())):
        raise CannotRun(f"the poisoned key did not give an infinite score (score {score}, l {l_sum})")

    observed, present = [], False
    for family, part_m in (("gfx942 partial state (m=+inf, l=NaN, acc=NaN)", m),
                           ("gfx950 partial state (m=-FLT_MAX, l=NaN, acc=NaN)", -FLT_MAX)):
        row = _run_reduce(mod, device, part_m, l_sum, acc)
        zeros = bool((row.float() == 0).all())
        present |= zeros
        observed.append(f"reduce over {family}: {_describe(row)}")
    if device != "cpu":
        row = _run_generic_end_to_end(device)
        if isinstance(row, Raised):  # the reduce above already decides; say why this path did not run
            observed.append(f"generic decode end to end did not run ({row!r})")
        else:
            present |= bool((row.float() == 0).all())
            observed.append(f"generic decode end to end: {_describe(row)}")
    note = ("" if device != "cpu" else
            "(the generic single-kernel decode runs only on a GPU: the Triton interpreter does not compute its bf16 "
            "arithmetic as a GPU does)")
    return Verdict(present, "; ".join(observed),
                   f"NaN in all {HEAD} lanes (score {score}, l = {l_sum}: the row is undefined, not empty)", note)
