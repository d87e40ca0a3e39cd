"""IW2: on gfx942 the DSv4 head-128 (indexer) compressor writes OCP e4m3 with scale amax / 448, but the indexer-K
readers there decode the cache as FNUZ. Every value reads at half its size, and a value stored as OCP -0 (0x80)
reads as NaN.

Input: `compress_norm_rope_store_triton` with head 128 (it dispatches to the launcher object
`_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL`, whose launch specification this script launches as
vLLM's `kernel_launcher` would). Ratio 4 (overlap), one token at position 3 writing cache slot 0 (block size 1, 128
fp8 bytes + one fp32 scale). The four state rows it compresses are all ones and the scores are 0, so the normed row
is the RMSNorm weight. That weight is 1.0 everywhere except -1e-9 at dim 5. The cos/sin row of position 0 is cos = 1,
sin = 0. The reader's fp8 dtype is upstream's own `FP8_DTYPE` of `rocm_aiter_mla_sparse.py` on gfx942
(`current_platform.fp8_dtype()`, float8_e4m3fnuz), which the cp-gather and the paged-logits readers view the
indexer-K cache as.

Observed: the kernel stores OCP codes under the scale 2^ceil(log2(amax / 448)) = 2^-8 (`FP8_MAX=448.0`,
`tl.float8e4nv`, on every platform). Read as FNUZ, dim 0 (1.0, byte 0x78) comes back as 0.5, and dim 5
(-1e-9, which rounds to OCP -0, byte 0x80) comes back as NaN. A NaN makes that token's indexer logit NaN, and
`torch.topk` ranks NaN first.

Expected: the values read back through the gfx942 reader equal the row within e4m3 precision: 1.0 reads as 1.0 and
-1e-9 reads as 0 (or -1e-9 rounded), never NaN.

Suggested fix: quantize to the platform's fp8, as the direct DSv3.2 writer already does (`FP8_DTYPE` with 224 on
FNUZ). Pass an `IS_FNUZ` constexpr (or the fp8 type and its maximum) from the launcher and use
`x_clamped.to(tl.float8e4b8)` with `FP8_MAX = 224.0` when it is set.
"""
import torch

SHARED = ["upstream", "compressor"]
MODULE = "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py"
READER = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
LAUNCHER = "_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL"
HEAD, ROPE = 128, 64
SCALE_BYTES = 4
TINY_DIM, TINY = 5, -1e-9


class _Launch:
    """Stands in for vLLM's ``kernel_launcher`` around upstream's launcher object: takes the launch specification
    its ``__call__`` returns (grid, kernel, the arguments it derives) and fills every other kernel argument from the
    call's input of the same name, or of the name without ``_ptr``."""

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self, **inputs):
        spec = type(self.launcher).__call__(self.launcher, **inputs)
        if not (isinstance(spec, tuple) and len(spec) == 2 and isinstance(spec[1], dict) and "kernel" in spec[1]):
            raise CannotRun(f"the launcher object did not return a launch specification: {spec!r}")
        grid, launch = spec[0], dict(spec[1])
        kernel = launch.pop("kernel")
        for name in kernel.arg_names:
            if name not in launch:
                source = name if name in inputs else name[:-len("_ptr")] if name.endswith("_ptr") else None
                if source not in inputs:
                    raise CannotRun(f"no input for the kernel argument {name}")
                launch[name] = inputs[source]
        kernel[grid](**launch)


def reproduce(args):
    device = args.device
    _, reader_fp8 = load_names(READER, rocm_overrides("gfx942"), "FP8_DTYPE")
    if not isinstance(reader_fp8, torch.dtype):
        raise CannotRun(f"{READER}'s FP8_DTYPE is not a torch dtype: {reader_fp8!r}")
    no_mx = {"vllm.utils.deep_gemm": {"mqa_logits_use_mx_scales": lambda: False}}  # MX_SCALE is CUDA SM100 only
    mod, launch = load_compressor(MODULE, "gfx942", no_mx)
    launcher = getattr(mod, LAUNCHER, None)
    if launcher is None:
        raise CannotRun(f"{MODULE} has no {LAUNCHER}")
    setattr(mod, LAUNCHER, _Launch(launcher))

    kv = torch.ones(HEAD)  # the four compressed state rows; scores 0
    weight = torch.ones(HEAD, dtype=torch.float32)
    weight[TINY_DIM] = TINY
    cache = run_compressor(launch, kv, weight, device, quant_block=HEAD, token_stride=HEAD, scale_dim=SCALE_BYTES,
                           rope=ROPE)

    # the row the kernel quantizes, inline: all-ones rows normed, times the weight; RoPE at angle 0 is the identity
    row = rms_normed(kv, weight)
    stored = cache[0, 0].cpu()
    if not bool(stored.any()):
        raise CannotRun("the compressor stored nothing")
    scale = stored[HEAD:].contiguous().view(torch.float32)[0]
    read = stored[:HEAD].contiguous().view(reader_fp8).float() * scale
    bad = [d for d in range(HEAD) if not bool(torch.isclose(read[d], row[d], rtol=0.125, atol=float(scale) / 512))]
    observed = (f"scale {scale.item()}; read as {reader_fp8}: dim 0 byte 0x{int(stored[0]):02X} -> {read[0].item()}, "
                f"dim {TINY_DIM} byte 0x{int(stored[TINY_DIM]):02X} -> {read[TINY_DIM].item()}; "
                f"{len(bad)} of {HEAD} dims read wrong, {int(torch.isnan(read).sum())} NaN")
    return Verdict(bool(bad), observed,
                   f"read back within e4m3 precision of the row: dim 0 -> {row[0].item():.6g}, dim {TINY_DIM} -> "
                   f"{row[TINY_DIM].item():.3g} or 0, no NaN")
