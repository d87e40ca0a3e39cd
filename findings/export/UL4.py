"""UL4: the paged indexer logits' torch reference raises at next_n > 1 when a request's last block reaches past
max_model_len: it assigns a block-wide slice of scores into the logits' columns of that block, which are fewer.

Input: gfx942, no AITER. `rocm_fp8_paged_mqa_logits` with compress_ratio 4 (the C4A block-flat cache) and block
size 2 (not a multiple of 64, so it calls `fp8_paged_mqa_logits_torch`), next_n 2, one request of context 3,
max_model_len 3 (not a multiple of the block size), one head of dim 128, two blocks (block table [0, 1]). Every key is
fp8 1.0 with scale 1.0, q is fp8 1.0 and the head weight 1.0. The request's second block covers columns 2..3, and the
logits have columns 0..2.

Observed: RuntimeError "The expanded size of the tensor (1) must match the existing size (2) at non-singleton
dimension 1": the branch writes `logits[rows, 2:4] = <2 x 2 scores>`, and that slice of a 3-column tensor has one
column.

Expected: no exception: a [2, 3] float32 logits tensor (query rows at positions 1 and 2, each scoring the keys up to
its position), the block's columns past max_model_len dropped.

Suggested fix: clip the block's scores to the columns that exist before the assignment: `... =
torch.where(k_offsets[None, :] <= q_offsets[:, None], s, float("-inf"))[:, : max_model_len - block_rk * block_size]`
(or bound the column slice and the score slice by min((block_rk + 1) * block_size, max_model_len)).
"""
import torch

SHARED = ["upstream", "paged_logits"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the fix of a line or two (the tests apply it to a copy of the tree: the script then exits 0)
FIXED_BY = [
    ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py",
     '            ] = torch.where(k_offsets[None, :] <= q_offsets[:, None], s, float("-inf"))\n',
     '            ] = torch.where(k_offsets[None, :] <= q_offsets[:, None], s, float("-inf"))[\n'
     '                :, : max_model_len - block_rk * block_size\n            ]\n'),
]
DIM, BLOCK_SIZE, NEXT_N = 128, 2, 2
CONTEXT = MAX_MODEL_LEN = 3
NUM_BLOCKS = 2
KEY = (1.0, 1.0)  # every token: fp8 1.0 in every lane, fp32 scale 1.0


def reproduce(args):
    _, dispatch, fp8 = load_paged_logits(MODULE, "gfx942")
    # each block laid out flat: its values (all fp8 1.0), then its fp32 scales (all 1.0)
    cache = fp8_indexer_cache(fp8, [KEY] * BLOCK_SIZE, BLOCK_SIZE, DIM, args.device, num_blocks=NUM_BLOCKS)
    got = paged_logits_of_ones(dispatch, fp8, cache, NEXT_N, context=CONTEXT, max_model_len=MAX_MODEL_LEN,
                               compress_ratio=4, raised_ok=True)

    # the expected value: row n sits at position CONTEXT - NEXT_N + n and scores keys 0..position, each
    # weight * relu(q . k) * scale = 128
    expected = torch.full((NEXT_N, MAX_MODEL_LEN), float("-inf"))
    for n in range(NEXT_N):
        expected[n, :CONTEXT - NEXT_N + n + 1] = formula_scores([KEY], DIM)[0]
    shape = f"[{NEXT_N}, {MAX_MODEL_LEN}]"
    if isinstance(got, Raised):
        return Verdict(True, got, f"no exception: a {shape} float32 logits tensor {expected.tolist()}")
    logits = got.detach().float().cpu()
    note = ("" if logits.shape == expected.shape and bool(torch.equal(logits, expected)) else
            "(the values differ from the formula: a separate defect of the same branch, its per-token 132-byte "
            "reading of the block-flat cache, fixed in vLLM 0.34.0; this script checks only the exception)")
    return Verdict(False, f"a {list(logits.shape)} logits tensor {logits.tolist()}",
                   f"no exception: a {shape} float32 logits tensor {expected.tolist()}", note)
