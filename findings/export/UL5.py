"""UL5: without AITER, the paged indexer logits read a SHUFFLE indexer cache (16x16 tiles, what
`indexer_k_quant_and_cache_triton` writes for a block size above 1) in the token-major order, so keys are scored from
other tokens' bytes.

Input: gfx942, no AITER. `rocm_fp8_paged_mqa_logits` with compress_ratio 1 (the DSv3.2 / ratio-1 indexer cache, not
C4A), so it takes the fallback `fp8_paged_mqa_logits_torch`; next_n 1, block size 16, one request of context 2,
max_model_len 16, one head of dim 128. The cache is one block ([1, 16, 1, 132] uint8) in the SHUFFLE layout the
writer uses: value d of token t at byte ((t // 16 * 8 + d // 16) * 16 + t % 16) * 16 + d % 16, then the 16 fp32
scales at 2048 + 4t. Token 0's values are fp8 1.0 with scale 0.5, token 1's are fp8 2.0 with scale 0.125, every
other byte 0. q is fp8 1.0 everywhere and the head weight 1.0.

Observed: the fallback reads token t's values as bytes 128t..128t+127. Token 0 then gets 16 lanes of its own 1.0,
16 lanes of token 1's 2.0 and zeros, and scores 48 * 0.5 = 24; token 1 gets tokens 8..15's first 16 lanes (zeros) and
scores 0. AITER's kernel, which the same dispatcher calls with Preshuffle=block_size > 1, and the prefill's
cp-gather read this cache as SHUFFLE, so decode and prefill of one request rank differently.

Expected: the formula on the cache as written: logit = sum over heads of weight * relu(q . k) * scale, so key 0
scores 128 * 1.0 * 0.5 = 64 and key 1 scores 128 * 2.0 * 0.125 = 32; the other columns -inf.

Suggested fix: tell the torch fallback the cache's layout and un-tile the values before the dot when it is SHUFFLE:
view a block's values as [bs/16, dim/16, 16, 16], swap the two middle axes and flatten to [bs, dim] (the scales are
not tiled), as vLLM 0.34.0 does with `shuffled=indexer_k_cache_is_shuffled(block_size)`.
"""
SHARED = ["upstream", "paged_logits"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0): un-tile the SHUFFLE
#: cache before the dispatcher's AITER-less fallback
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     '            "aiter.ops.triton.attention.pa_mqa_logits is importable."\n        )\n'
     "        return fp8_paged_mqa_logits_torch(\n",
     '            "aiter.ops.triton.attention.pa_mqa_logits is importable."\n        )\n'
     "        if block_size > 1:  # SHUFFLE (16x16 tiles): un-tile the values, keep the scales\n"
     "            kv_cache_fp8 = torch.cat([kv_cache_fp8.reshape(kv_cache_fp8.shape[0], -1)[:, : block_size * "
     "q_fp8.shape[-1]].reshape(kv_cache_fp8.shape[0], block_size // 16, q_fp8.shape[-1] // 16, 16, 16).transpose(2, "
     "3).reshape(kv_cache_fp8.shape[0], -1), kv_cache_fp8.reshape(kv_cache_fp8.shape[0], -1)[:, block_size * "
     "q_fp8.shape[-1] :]], dim=1).view(kv_cache_fp8.shape)\n"
     "        return fp8_paged_mqa_logits_torch(\n"),
]
DIM, BLOCK_SIZE, MAX_MODEL_LEN = 128, 16, 16
KEYS = [(1.0, 0.5), (2.0, 0.125)]  # token -> (fp8 value in every lane, fp32 scale); powers of two: exact in fp8


def reproduce(args):
    _, dispatch, fp8 = load_paged_logits(MODULE, "gfx942")
    # one block in the SHUFFLE layout the writer uses at a block size above 1: 16x16 tiles of (token, lane), then
    # the block's fp32 scales, one per token
    cache = fp8_indexer_cache(fp8, KEYS, BLOCK_SIZE, DIM, args.device, shuffled=True)
    got = paged_logits_of_ones(dispatch, fp8, cache, 1, context=len(KEYS), max_model_len=MAX_MODEL_LEN,
                               compress_ratio=1)

    # the expected value: weight * relu(q . k) * scale per visible key
    seen, expected, wrong = first_row_scores(got, KEYS, DIM)
    return Verdict(bool(wrong), f"logits of keys 0 and 1: {seen}; wrong at keys {wrong}",
                   f"logits of keys 0 and 1: {expected} (128 * 1.0 * 0.5, 128 * 2.0 * 0.125)")
