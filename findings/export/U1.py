"""U1: the sparse decode wrapper hands its split-count selector average index lengths computed as
numel * (1.0 / num_queries), which is not the exact mean, and the selector picks a different split count than the
exact mean gives.

Input: a gfx942 decode of 91 queries, 16 heads (one head block), no main indices and 8736 extra indices (96 per
query), on 256 compute units: `_rocm_sparse_attn_decode_ragged_triton` passes avg_extra_len = 8736 * (1.0 / 91) =
96.00000000000001 to `_decode_num_splits`.

Observed: the split count for the length the wrapper passes (4 splits).

Expected: the split count at the exact mean 96 (3 splits). The snap-down compares per-split iteration counts, and
ceil(96.00000000000001 / s) overshoots for every s that divides 96.

Suggested fix: compute the averages as numel / num_queries (true division is exact here), or pass the integer
totals and divide inside the selector.
"""
import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py", "        avg_main_len = main_indices.numel() * inv_q\n        avg_extra_len = (extra_indices.numel() * inv_q) if has_extra else 0.0\n        num_splits = _decode_num_splits(",
     "        avg_main_len = main_indices.numel() / max(1, num_queries)\n        avg_extra_len = (extra_indices.numel() / max(1, num_queries)) if has_extra else 0.0\n        num_splits = _decode_num_splits("),
]


class _Chosen(Exception):
    """Stops the wrapper once its split count is chosen, before any kernel launch."""


def reproduce(args):
    mod, wrapper, select = load_names(MODULE, rocm_overrides("gfx942"), "_rocm_sparse_attn_decode_ragged_triton",
                                      "_decode_num_splits")
    mod._decode_cu_count = lambda: 256  # an MI300X; the module asks the GPU, which a CPU host cannot answer
    seen = {}

    def spy(num_queries, heads_blocks, avg_main_len=0.0, avg_extra_len=0.0, block_k=32):
        seen.update(args=(num_queries, heads_blocks, avg_main_len, avg_extra_len, block_k))
        seen["splits"] = select(num_queries, heads_blocks, avg_main_len, avg_extra_len, block_k)
        raise _Chosen

    mod._decode_num_splits = spy
    # meta tensors: the wrapper computes shapes and lengths as it would on a GPU and launches nothing before the
    # selector returns
    batch, heads, extra_numel = 91, 16, 8736
    meta = dict(device="meta")
    q = torch.empty(batch, heads, 512, dtype=torch.bfloat16, **meta)
    cache = torch.empty(4, 64, 584, dtype=torch.uint8, **meta)
    got = call_upstream(
        wrapper, q, cache, torch.empty(0, dtype=torch.int32, **meta), torch.empty(batch + 1, dtype=torch.int32, **meta),
        0.1, None, 448, 64, extra_cache=cache, extra_indices=torch.empty(extra_numel, dtype=torch.int32, **meta),
        extra_indptr=torch.empty(batch + 1, dtype=torch.int32, **meta))
    if "splits" not in seen:
        raise CannotRun(f"the wrapper did not reach its split selector: {got!r}")
    n, hb, main_len, extra_len, block_k = seen["args"]
    exact = select(n, hb, 0 / n, extra_numel / n, block_k)
    return Verdict(seen["splits"] != exact,
                   f"{seen['splits']} splits (the wrapper passed avg_extra_len = {extra_len!r})",
                   f"{exact} splits at the exact mean {extra_numel / n!r}")
