"""F1: on gfx950 the sanitizing DSv4 compressor clears NaN RoPE lanes but stores +-inf ones, so rows the decode
trusts as NaN-free hold infinite keys.

Input: gfx950 (`SANITIZE_CACHE_NANS = _ON_GFX950`). `compress_norm_rope_store_triton` with head 512, ratio 4
(overlap), one token at position 3 writing cache slot 0 (block size 1). The four state rows it compresses are equal:
kv is 1.0 in lane 448 (the first RoPE lane) and 0 elsewhere, and the scores are 0. The RMSNorm weight is 1 on NoPE
and 3e38 on RoPE (a weight that large makes the normed value overflow, as an fp32 overflow upstream of the writer
would). The cos/sin row of position 0 is cos = 1, sin = 0. The normed lane 448 is 1 * sqrt(512) * 3e38 = +inf in
fp32. The rotation gives lane 448 = inf * 1 - 0 * 0 = +inf and lane 449 = 0 * 1 + inf * 0 = NaN.

Observed: the stored bf16 RoPE lane 448 is +inf (bytes 0x7F80). Lane 449, which was NaN, is stored as 0: SANITIZE
is `tl.where(result == result, result, 0.0)`, which clears NaN only.

Expected: every stored RoPE lane is finite, with 0 where the rotated value is not finite (the sanitizer's stated
purpose, "NaN/Inf -> 0"). The gfx950 decode's trust gate (`extra_cache_nan_free`) skips the scrub of these rows, and
an infinite key lane there makes the score +-inf and the softmax NaN.

Suggested fix: round to bf16 first, then clear everything that is not finite: `result =
result.to(tl.bfloat16).to(tl.float32)` followed by `result = tl.where(tl.abs(result) <= 3.3895313892515355e38,
result, 0.0)`, in `_fused_kv_compress_norm_rope_insert_sparse_attn` and in the two-stage finalizer
`_finalize_norm_rope_quant_store_sparse_attn`. Rounding first matters because an fp32 value within 0.2% of the bf16
maximum becomes inf on the cast.
"""
import torch

SHARED = ["upstream", "compressor"]
MODULE = "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py"
HEAD, ROPE, NOPE = 512, 64, 448
TOKEN_DATA, TOKEN_SCALES = 576, 8
POISONED_LANE = 448


def reproduce(args):
    _, launch = load_compressor(MODULE, "gfx950")
    kv = torch.zeros(HEAD)
    kv[POISONED_LANE] = 1.0  # the four compressed state rows
    weight = torch.ones(HEAD, dtype=torch.float32)
    weight[NOPE:] = 3e38
    cache = run_compressor(launch, kv, weight, args.device, quant_block=64, token_stride=TOKEN_DATA,
                           scale_dim=TOKEN_SCALES, rope=ROPE)

    # the expected value, inline: the normed, rotated RoPE lanes in fp32, then the sanitizer's promise
    normed = rms_normed(kv, weight)
    even, odd = normed[NOPE::2], normed[NOPE + 1::2]
    rotated = torch.stack([even * 1.0 - odd * 0.0, odd * 1.0 + even * 0.0], dim=1).reshape(-1)
    if not bool(torch.isinf(rotated).any()):
        raise CannotRun("the input did not overflow the rotated RoPE lanes")
    expected = torch.where(torch.isfinite(rotated), rotated, torch.zeros_like(rotated)).to(torch.bfloat16)

    stored = cache[0, 0, NOPE:TOKEN_DATA].cpu().contiguous().view(torch.bfloat16).float()
    words = cache[0, 0, NOPE:TOKEN_DATA].cpu().contiguous().view(torch.int16)
    bad = [i for i in range(ROPE) if torch.isinf(stored[i])]
    observed = "; ".join(
        f"lane {NOPE + i}: rotated value {rotated[i].item()}, stored {stored[i].item()} "
        f"(bf16 0x{int(words[i]) & 0xFFFF:04X})" for i in (0, 1))
    observed += f"; infinite stored RoPE lanes: {[NOPE + i for i in bad]}"
    return Verdict(bool(bad), observed,
                   f"every stored RoPE lane finite, 0 where the rotated value is not (lane {NOPE} -> "
                   f"{expected[0].item()}, lane {NOPE + 1} -> {expected[1].item()})")
