"""UL3: the paged indexer logits' torch reference reads the cache as per-token 132-byte rows when next_n > 1, where
the writers (and its own next_n == 1 branch) lay a block out flat: the block's bs * 128 fp8 values, then its bs fp32
scales. Every position but the first of a block is scored from other tokens' bytes, and scales come from fp8 codes.

Input: gfx942, no AITER. `rocm_fp8_paged_mqa_logits` with compress_ratio 4 (the C4A block-flat cache) and block
size 2 (not a multiple of 64, so it calls `fp8_paged_mqa_logits_torch`), next_n 2, one request of context 2,
max_model_len 2, one head of dim 128. The cache is one block ([1, 2, 1, 132] uint8) written block-flat: token 0's
128 values are fp8 1.0 and its scale 0.5, token 1's values are fp8 2.0 and its scale 0.125 (bytes 0..255 the values,
256..263 the two fp32 scales). q is fp8 1.0 everywhere and the head weight 1.0.

Observed: the next_n > 1 branch splits `kv_cache[..., :128]` and `kv_cache[..., 128:]` of the [1, 2, 1, 132] view,
so token 0's scale is the float32 whose bytes are token 1's first four fp8 codes, and token 1 reads bytes 132..259
(124 of its values, then token 0's scale bytes as fp8 codes; its scale, bytes 260..263, is its own only because it
is the block's last token). Key 0 scores about 2.6e7 (128 * 1.0 times the scale 0x48484848 = 205089.1) and key 1
about 31.12 instead of 32.

Expected: the formula on the block-flat cache: logit = sum over heads of weight * relu(q . k) * scale, so key 0 scores
128 * 1.0 * 0.5 = 64 and key 1 scores 128 * 2.0 * 0.125 = 32; query row 0 (position 0) sees key 0 only, row 1 sees
both: [[64, -inf], [64, 32]].

Suggested fix: read the block-flat layout in the next_n > 1 branch as the next_n == 1 branch does: view each block as
[bs * dim | bs * 4] bytes, the values as [nb, bs, 1, dim] and the scales as [nb, bs, 1, 1] fp32, e.g. `flat =
kv_cache.reshape(kv_cache.shape[0], -1)`, values `flat[:, :bs * dim]`, scales `flat[:, bs * dim:].view(torch.float)`.
"""
import torch

SHARED = ["upstream", "paged_logits"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     "    kv_cache, scale = kv_cache[..., :dim], kv_cache[..., dim:]\n"
     "    scale = scale.contiguous().view(torch.float)\n",
     "    flat = kv_cache.reshape(kv_cache.shape[0], -1)\n"
     "    kv_cache, scale = flat[:, : kv_cache.shape[1] * dim].reshape(kv_cache.shape[0], kv_cache.shape[1], 1, dim), "
     "flat[:, kv_cache.shape[1] * dim :].contiguous().view(torch.float).reshape(kv_cache.shape[0], kv_cache.shape[1], "
     "1, 1)\n"),
]
DIM, BLOCK_SIZE, NEXT_N = 128, 2, 2
KEYS = [(1.0, 0.5), (2.0, 0.125)]  # token -> (fp8 value in every lane, fp32 scale); powers of two: exact in fp8


def reproduce(args):
    _, dispatch, fp8 = load_paged_logits(MODULE, "gfx942")
    # one block laid out as the writers lay it (block-flat): the block's values, then its scales
    cache = fp8_indexer_cache(fp8, KEYS, BLOCK_SIZE, DIM, args.device)
    got = paged_logits_of_ones(dispatch, fp8, cache, NEXT_N, context=BLOCK_SIZE, max_model_len=BLOCK_SIZE,
                               compress_ratio=4)

    # the expected value: weight * relu(q . k) * scale per key; query row n sits at position n and sees the keys
    # up to it
    score = formula_scores(KEYS, DIM)
    expected = torch.full((NEXT_N, BLOCK_SIZE), float("-inf"))
    for n in range(NEXT_N):
        expected[n, :n + 1] = torch.tensor(score[:n + 1])
    logits = got.detach().float().cpu()
    visible = torch.isfinite(expected)
    wrong = [(n, k) for n in range(NEXT_N) for k in range(BLOCK_SIZE) if bool(visible[n, k])
             and not bool(torch.isclose(logits[n, k], expected[n, k], rtol=1e-5, atol=0.0))]
    return Verdict(bool(wrong), f"logits {logits.tolist()}; wrong at (row, key) {wrong}",
                   f"logits {expected.tolist()} (key 0: 128 * 1.0 * 0.5, key 1: 128 * 2.0 * 0.125)")
