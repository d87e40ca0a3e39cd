"""UW1: on gfx950 the sanitizing DSv4 compressor does not sanitize NoPE. A NoPE group holding an infinite value is
stored with scale code 254 and an fp8 byte that the reader decodes to +-inf or NaN.

Input: gfx950 (`SANITIZE_CACHE_NANS = _ON_GFX950`). `compress_norm_rope_store_triton` with head 512, ratio 4
(overlap), one token at position 3 writing cache slot 0 (block size 1). The four state rows it compresses are equal:
kv is 1.0 in NoPE lanes 0 and 64 and 0 elsewhere, and the scores are 0, so the RMS factor is sqrt(512 / 2) = 16.
The RMSNorm weight is 3e38 on lane 0, 2.0625e37 on lane 64 and 1 elsewhere, so the normed row is +inf in lane 0
(an fp32 overflow) and about 3.3e38 (finite, within 3% of FLT_MAX) in lane 64. The cos/sin row of position 0 is
cos = 1, sin = 0.

Observed: group 0 (lanes 0..63) is stored with scale code 254 (2^127). The exponent is ceil(log2(inf / 448)) =
inf, the multiplier exp2(-inf) = 0, and lane 0 becomes inf * 0 = NaN. The NaN-ignoring clamp turns that into -448,
byte 0xFE, which decodes to -448 * 2^127 = -inf (hardware whose clamp propagates NaN stores a NaN byte instead). The
other lanes of the group store 0. Group 1 (lanes 64..127) gets code 247, and lane 64 gets the e4m3 value 256, which
decodes to 256 * 2^120 = 2^128 = inf. Both show under the Triton interpreter.

Expected: every NoPE value decodes finite under the fp32 reader (fp8 value * 2^(code - 127)). A non-finite normed
value is stored as 0, and a finite one within the largest code's reach is bounded (|q| <= 240 at code 247 and up)
so that the product stays finite. That is what the sanitizer promises the gfx950 decode, whose trust gate then
skips the scrub.

Suggested fix: under SANITIZE_CACHE_NANS, clear non-finite values before the block max, `quant_input =
tl.where(tl.abs(quant_input) <= 3.4028234663852886e38, quant_input, 0.0)`, and bound the scaled values so that they
cannot round past FLT_MAX, e.g. `x_clamped = tl.where(tl.reshape(exponents, (N_QUANT_BLOCKS, 1)) >= 120.0,
tl.clamp(x_clamped, -240.0, 240.0), x_clamped)`. Apply both in `_fused_kv_compress_norm_rope_insert_sparse_attn` and
in `_finalize_norm_rope_quant_store_sparse_attn`.
"""
import torch

SHARED = ["upstream", "compressor"]
MODULE = "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py"
HEAD, ROPE, NOPE = 512, 64, 448
TOKEN_DATA, TOKEN_SCALES = 576, 8
WEIGHTS = {0: 3e38, 64: 2.0625e37}  # lane -> RMSNorm weight: lane 0 overflows, lane 64 lands near FLT_MAX


def reproduce(args):
    _, launch = load_compressor(MODULE, "gfx950")
    kv = torch.zeros(HEAD)
    kv[list(WEIGHTS)] = 1.0  # the four compressed state rows
    weight = torch.ones(HEAD, dtype=torch.float32)
    weight[list(WEIGHTS)] = torch.tensor(list(WEIGHTS.values()))
    cache = run_compressor(launch, kv, weight, args.device, quant_block=64, token_stride=TOKEN_DATA,
                           scale_dim=TOKEN_SCALES, rope=ROPE)

    # the normed NoPE values, inline (what the groups are quantized from)
    normed = rms_normed(kv, weight)
    if not (bool(torch.isinf(normed[0])) and bool(torch.isfinite(normed[64]))):
        raise CannotRun(f"the input did not give an infinite lane 0 and a finite lane 64 ({normed[0]}, {normed[64]})")

    # the reader's decode: e4m3 value * 2^(code - 127) in fp32
    row = cache[0, 0].cpu()
    codes = row[TOKEN_DATA:TOKEN_DATA + NOPE // 64].to(torch.int32)
    values = row[:NOPE].contiguous().view(torch.float8_e4m3fn).float()
    decoded = values * torch.exp2(codes.float() - 127.0).repeat_interleave(64)
    bad = [i for i in range(NOPE) if not bool(torch.isfinite(decoded[i]))]
    parts = []
    for group, lane in ((0, 0), (1, 64)):
        parts.append(f"group {group}: code {int(codes[group])}, lane {lane} (normed {normed[lane].item():.4g}) byte "
                     f"0x{int(row[lane]):02X} = e4m3 {values[lane].item()} -> decodes {decoded[lane].item()}")
    parts.append(f"NoPE lanes decoding non-finite: {bad}")
    return Verdict(bool(bad), "; ".join(parts),
                   "every NoPE lane decodes finite (lane 0 stored as 0; lane 64 bounded so that value * 2^(code-127) "
                   "<= FLT_MAX)")
