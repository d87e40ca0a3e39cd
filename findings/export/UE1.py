"""UE1: the inverse RoPE kernel computes each row's offset (t * s_t + h * s_h) in int32. Past 2^31 elements the
offset wraps. The in-place standalone pass then reads a row from the wrapped place and writes its rotation back
there: an out-of-bounds write.

Input: `rocm_inverse_rope_rows_(o, positions, cos_sin_cache, 64)`, the standalone in-place pass, on a bf16 o of
shape [3, 1, 512] (DSv4's head: 448 NoPE + 64 RoPE lanes). o's rows are s_t = 3 * 2^29 elements apart. That stride
fits an int32, so Triton passes it as one. Row 2 starts at element 2 * s_t = 3 * 2^30, past 2^31. o is a view
2^30 + 2^20 elements into one bf16 buffer of about 2^32 elements. The 512 elements where the wrapped offset of row 2
lands (2^30 elements before o) hold a sentinel. positions = [5, 0, 7]; cos_sin_cache is [8, 64] (cos | sin). On CPU
the buffer is an anonymous mapping: only the pages the script touches take memory. On a GPU it is an 8 GiB
allocation. The product is the same as in production, where o is a contiguous [T, H, 512] and s_t = H * 512. There
the wrap starts at T > 2^31 / (H * 512) tokens in one forward: more than 65,536 tokens at 64 local heads. The view
only keeps the launch to 3 programs.

Observed: for program (2, 0) the kernel computes in_base = out_base = 2 * s_t, which wraps to -2^30. It reads the
sentinel row 2^30 elements before o, inverse-rotates it and stores it back there: 64 elements outside o change. Row
2 of o is left as it was (not rotated).

Expected: every row of o is inverse-rotated in place (row 2 like rows 0 and 1: even' = a*cos + b*sin,
odd' = b*cos - a*sin on each RoPE pair (a, b), NoPE lanes kept), and nothing outside o changes.

Suggested fix: widen the program ids before the multiply, e.g. `t = tl.program_id(0).to(tl.int64)` and
`h = tl.program_id(1).to(tl.int64)` in `_inverse_rope_gptj_kernel` (both in_base and out_base then use 64 bits). The
MXFP8 epilogue (`_inverse_rope_mxfp8_quant_kernel`) forms its row offsets the same way and may want the same change.
"""
import mmap

import torch

SHARED = ["upstream", "rope"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "    t = tl.program_id(0)\n    h = tl.program_id(1)\n    in_base = t * s_t + h * s_h",
     "    t = tl.program_id(0).to(tl.int64)\n    h = tl.program_id(1).to(tl.int64)\n    in_base = t * s_t + h * s_h"),
]

ROWS, HEAD, ROPE = 3, 512, 64
NOPE = HEAD - ROPE
ROW_STRIDE = 3 * 2 ** 29  # < 2^31: Triton passes it as an int32
BASE = 2 ** 30 + 2 ** 20  # o's first element in the buffer; row 2's wrapped offset (-2^30) lands 2^20 in
POSITIONS = [5, 0, 7]


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


def reproduce(args):
    device = args.device
    _, fn = load_names(MODULE, rocm_overrides("gfx942"), "rocm_inverse_rope_rows_")
    wrapped = BASE + _wrap32((ROWS - 1) * ROW_STRIDE)  # where row 2 lands if its offset wraps
    numel = BASE + (ROWS - 1) * ROW_STRIDE + HEAD + 2 ** 20
    assert 0 <= wrapped and wrapped + HEAD <= BASE
    flat, _keep = _buffer(numel, device)
    gen = torch.Generator().manual_seed(7)
    rows = (torch.randn(ROWS, HEAD, generator=gen) * 3).to(torch.bfloat16)
    sentinel = (torch.arange(1, HEAD + 1, dtype=torch.float32) / 64).to(torch.bfloat16)
    o = flat.as_strided((ROWS, 1, HEAD), (ROW_STRIDE, HEAD, 1), BASE)
    for r in range(ROWS):
        o[r, 0].copy_(rows[r].to(device))
    flat[wrapped:wrapped + HEAD].copy_(sentinel.to(device))
    cos_sin = random_cos_sin(gen, 8, ROPE)
    positions = torch.tensor(POSITIONS, dtype=torch.int64, device=device)
    got = call_upstream(fn, o, positions, cos_sin.to(device), ROPE)
    if isinstance(got, Raised):
        raise CannotRun(f"rocm_inverse_rope_rows_ raised on a [3, 1, 512] view: {got!r}")
    if device != "cpu":
        torch.cuda.synchronize()
    after = torch.stack([o[r, 0].cpu() for r in range(ROWS)]).to(torch.float64)
    outside = flat[wrapped:wrapped + HEAD].cpu()
    changed_outside = int((outside.view(torch.int16) != sentinel.view(torch.int16)).sum())
    want = inverse_rope(rows, cos_sin[torch.tensor(POSITIONS)], NOPE)
    tol = 2 ** -7 * (rows.to(torch.float64).abs() + want.abs()) + 1e-6
    bad_rows = [r for r in range(ROWS) if bool(((after[r] - want[r]).abs() > tol[r]).any())]
    if 0 in bad_rows or 1 in bad_rows:
        raise CannotRun(f"rows below 2^31 elements were not rotated either (rows {bad_rows}): not this defect")
    row2_kept = bool(torch.equal(after[2], rows[2].to(torch.float64)))
    row2_state = "is left unrotated" if row2_kept else "differs from its rotation" if bad_rows else "is rotated"
    present = changed_outside > 0 or bool(bad_rows)
    observed = (f"{changed_outside} of the {HEAD} sentinel elements at buffer offset {wrapped} (2^30 elements before "
                f"o, where 2 * s_t = {2 * ROW_STRIDE} wraps to {_wrap32(2 * ROW_STRIDE)} in int32) were overwritten; "
                f"row 2 of o {row2_state}"
                f" (lane {NOPE}: {after[2, NOPE].item():.4g}, its rotation {want[2, NOPE].item():.4g})")
    expected = (f"rows 0-2 of o inverse-rotated in place (row 2 lane {NOPE}: {want[2, NOPE].item():.4g}); 0 elements "
                f"changed outside o")
    return Verdict(present, observed, expected)
