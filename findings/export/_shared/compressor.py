"""The DSv4 compressor (``compress_norm_rope_store_triton``) writing one compressed token whose RoPE is the
identity, and the row it normalizes. Needs the ``upstream`` snippet before it."""
from types import SimpleNamespace

import torch


def load_compressor(module, arch, extra_overrides=None):
    """``(mod, launch)``: ``module`` loaded as a ROCm ``arch`` (plus ``extra_overrides``) and its
    ``compress_norm_rope_store_triton``. On gfx950 the module must see it (the sanitizing path)."""
    overrides = {**rocm_overrides(arch), **(extra_overrides or {})}
    mod, launch = load_names(module, overrides, "compress_norm_rope_store_triton")
    if arch == "gfx950" and getattr(mod, "_ON_GFX950", None) is not True:
        raise CannotRun("the module does not see gfx950 (SANITIZE_CACHE_NANS would be off)")
    return mod, launch


def run_compressor(launch, kv, weight, device, quant_block, token_stride, scale_dim, rope=64):
    """The cache row upstream's compressor writes, ``[1, 1, token_stride + scale_dim]`` uint8 on ``device``: ratio
    4 with overlap, one token at position 3 writing cache slot 0, the four state rows it compresses all ``kv`` (a
    head-long row, in the second half: head offset ``kv.numel()``) with scores 0, RMSNorm ``weight`` (eps 1e-6), the
    cos/sin row cos = 1, sin = 0 (RoPE is the identity), an fp8 (not fp4) cache. A launch that raises stops the
    script with CannotRun."""
    head = kv.numel()
    state_width = 2 * head  # ratio 4 overlaps two windows: kv halves at 0 and head, scores at 2 * head
    state = torch.zeros(1, 4, 2 * state_width, dtype=torch.float32)
    state[0, :, head:2 * head] = kv  # positions 0..3 land in the second half
    cos_sin = torch.zeros(4, rope, dtype=torch.float32)
    cos_sin[:, :rope // 2] = 1.0  # cos 1, sin 0
    cache = torch.zeros(1, 1, token_stride + scale_dim, dtype=torch.uint8, device=device)
    state, weight, cos_sin = (t.to(device) for t in (state, weight, cos_sin))
    slots = torch.zeros(1, dtype=torch.int64, device=device)
    got = call_upstream(
        launch, state_cache=state, num_actual=1, token_to_req_indices=torch.zeros(1, dtype=torch.int32, device=device),
        positions=torch.tensor([3], dtype=torch.int64, device=device), slot_mapping=slots,
        block_table=torch.zeros(1, 1, dtype=torch.int32, device=device), block_size=4, state_width=state_width,
        cos_sin_cache=cos_sin, kv_cache=cache, k_cache_metadata=SimpleNamespace(slot_mapping=slots), pdl_kwargs={},
        head_dim=head, rope_head_dim=rope, compress_ratio=4, overlap=True, use_fp4_cache=False,
        rms_norm_weight=weight, rms_norm_eps=1e-6, quant_block=quant_block, token_stride=token_stride,
        scale_dim=scale_dim)
    if isinstance(got, Raised):
        raise CannotRun(f"upstream's compressor did not run: {got!r}")
    if device != "cpu":
        torch.cuda.synchronize()
    return cache


def rms_normed(kv, weight, eps=1e-6):
    """The compressor's RMSNorm of one row in fp32: kv / sqrt(mean(kv^2) + eps) * weight."""
    return kv * torch.rsqrt((kv * kv).mean() + eps) * weight
