"""IW1: the DSv3.2 indexer-K writer uses the SHUFFLE layout for every block size > 1. At a block size that is not a
multiple of 16, its 16x16 tiles reach past the token's block into the next block and past the cache.

Input: `indexer_k_quant_and_cache_triton(k, kv_cache, slot_mapping, 128, None)` with head 128, block size 3 and
2 blocks. kv_cache is [2, 3, 132] uint8: 3 * 128 value bytes and 3 * 4 scale bytes a block, 396 bytes a block. It is
a view at the start of a larger buffer that is filled with a sentinel, so that writes past the cache land in memory
the script owns. One token (k: 128 fp32 values, 1..128 / 64) is written to slot 0 (block 0, row 0). The fp8 flavour
is gfx950's (OCP). gfx942 (FNUZ) chooses its layout by the same rule.

Observed: the writer picks SHUFFLE (the rule is "NORMAL if block_size == 1 else SHUFFLE"). Value byte d of the token
goes to (d // 16) * 16 * 16 + d % 16 from the block's start, up to byte 1807. So the single token rewrites bytes of
block 1 (another token's records and scales) and bytes past the cache.

Expected: a write touches only its own block: with a block size that 16x16 tiles cannot hold, either the NORMAL
layout (the token's 128 value bytes at row * 128 and its 4 scale bytes at 384 + row * 4) or a refusal before any
launch. No byte outside block 0 changes.

Suggested fix: choose SHUFFLE only when the block size is a multiple of the 16-token tile (`layout = "SHUFFLE" if
block_size % block_tile_size == 0 else "NORMAL"`), or refuse such a block size. Use the same rule in the readers
(`cp_gather_indexer_k_quant_cache_triton` and the paged-logits path) that share it.
"""
import torch

SHARED = ["upstream"]
MODULE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
HEAD, SCALE_BYTES = 128, 4
BLOCK_SIZE, NUM_BLOCKS = 3, 2
SLACK = 4096  # more than the furthest SHUFFLE offset (16 * 128 bytes) past the cache
SENTINEL = 0x5A


def reproduce(args):
    device = args.device
    _, writer = load_names(MODULE, rocm_overrides("gfx950"), "indexer_k_quant_and_cache_triton")
    block_bytes = BLOCK_SIZE * (HEAD + SCALE_BYTES)
    cache_bytes = NUM_BLOCKS * block_bytes
    buf = torch.full((cache_bytes + SLACK,), SENTINEL, dtype=torch.uint8, device=device)
    cache = buf[:cache_bytes].view(NUM_BLOCKS, BLOCK_SIZE, HEAD + SCALE_BYTES)
    k = (torch.arange(1, HEAD + 1, dtype=torch.float32) / 64).reshape(1, HEAD).to(device)
    slot_mapping = torch.zeros(1, dtype=torch.int64, device=device)
    got = call_upstream(writer, k, cache, slot_mapping, HEAD, None)
    if device != "cpu":
        torch.cuda.synchronize()
    changed = (buf != SENTINEL).cpu()
    own = changed[:block_bytes]
    neighbour = changed[block_bytes:cache_bytes]
    past = changed[cache_bytes:]
    outside = int(neighbour.sum()) + int(past.sum())
    refused = isinstance(got, Raised)
    last = int(changed.nonzero().max()) if bool(changed.any()) else -1
    observed = (f"{'the call raised ' + repr(got) + '; ' if refused else ''}{int(own.sum())} bytes changed in block 0, "
                f"{int(neighbour.sum())} in block 1, {int(past.sum())} past the {cache_bytes}-byte cache "
                f"(furthest byte changed: {last})")
    if not refused and int(own.sum()) == 0 and outside == 0:
        raise CannotRun("the writer changed no byte at all")
    return Verdict(outside > 0, observed,
                   f"only block 0's bytes change (the token's {HEAD} value bytes and {SCALE_BYTES} scale bytes), or a "
                   f"refusal that changes nothing; 0 bytes in block 1 or past the cache")
