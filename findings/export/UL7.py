"""UL7: on a ROCm device other than gfx942/gfx950 without AITER, the paged indexer logits read a C4A (block-flat,
token-major) indexer cache with more than one token per block as 16x16 SHUFFLE tiles, so every key is scored from
the wrong bytes (a regression of vLLM 0.34.0).

Input: a ROCm device that is neither gfx942 nor gfx950 (`_ON_GFX942` and `_ON_GFX950` false), no AITER.
`rocm_fp8_paged_mqa_logits` with compress_ratio 4 (the C4A cache, which its writer lays out block-flat: a block's
bs * 128 fp8 values token after token, then its bs fp32 scales), next_n 1, block size 16, one request of context 2,
max_model_len 16, one head of dim 128. Token 0's values are fp8 1.0 with scale 0.5, token 1's are fp8 2.0 with scale
0.125, every other byte 0. q is fp8 1.0 everywhere and the head weight 1.0.

Observed: the C4A case is special-cased only under `_ON_GFX942 or _ON_GFX950`; here the cache reaches the torch
fallback `fp8_paged_mqa_logits_torch` with `shuffled=indexer_k_cache_is_shuffled(block_size)`, true for any block
size above 1, so it un-tiles a cache that was never tiled. Token 0 then reads lanes 0..15 of tokens 0, 2, 4, ..., 14
(16 lanes of 1.0) and scores 16 * 0.5 = 8; token 1 reads lanes 16..31 of the same tokens and scores 16 * 0.125 = 2.
(A block size that is not a multiple of 16 raises in the un-tiling reshape instead.) vLLM 0.33.0 scores this cache
right.

Expected: the formula on the block-flat cache: logit = sum over heads of weight * relu(q . k) * scale, so key 0
scores 128 * 1.0 * 0.5 = 64 and key 1 scores 128 * 2.0 * 0.125 = 32.

Suggested fix: pass `shuffled=indexer_k_cache_is_shuffled(block_size) and not
_indexer_k_is_c4a_block_flat(compress_ratio)` in the AITER-less fallback of `rocm_fp8_paged_mqa_logits`.
"""
SHARED = ["upstream", "paged_logits"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "            shuffled=indexer_k_cache_is_shuffled(block_size),\n",
     "            shuffled=indexer_k_cache_is_shuffled(block_size)\n"
     "            and not _indexer_k_is_c4a_block_flat(compress_ratio),\n"),
]
DIM, BLOCK_SIZE, MAX_MODEL_LEN = 128, 16, 16
KEYS = [(1.0, 0.5), (2.0, 0.125)]  # token -> (fp8 value in every lane, fp32 scale); powers of two: exact in fp8


def reproduce(args):
    mod, dispatch, fp8 = load_paged_logits(MODULE, "generic", _ON_RDNA=False, _ON_GFX1151=False)
    if getattr(mod, "_ON_GFX942", None) or getattr(mod, "_ON_GFX950", None):
        raise CannotRun("the module sees gfx942 or gfx950 (the C4A cache would take its own path)")
    # one block as the C4A writer lays it out: token t's values at 128t, then the fp32 scales at bs * 128 + 4t
    cache = fp8_indexer_cache(fp8, KEYS, BLOCK_SIZE, DIM, args.device)
    got = paged_logits_of_ones(dispatch, fp8, cache, 1, context=len(KEYS), max_model_len=MAX_MODEL_LEN,
                               compress_ratio=4)

    # the expected value: weight * relu(q . k) * scale per visible key
    seen, expected, wrong = first_row_scores(got, KEYS, DIM)
    return Verdict(bool(wrong), f"logits of keys 0 and 1: {seen}; wrong at keys {wrong}",
                   f"logits of keys 0 and 1: {expected} (128 * 1.0 * 0.5, 128 * 2.0 * 0.125)")
