"""DSv4 cache writers, part 1: the SWA ("main") cache insert and the extra-cache trust gate.

``quantize_and_insert_k_cache`` writes ``k [T, 512]`` bf16 rows into an ``fp8_ds_mla`` cache (SPEC 1.2): 448 NoPE dims
quantized per 64-wide group to e4m3 with a UE8M0 power-of-two scale, 64 RoPE dims copied as raw bf16, a pad byte 0.
The compressor (the "extra" cache writer) lives in :mod:`impl.compressor` and shares the group quantizer below.

``trust_extra_cache_nan_free`` is the provenance gate of SPEC 4 / seed 004: the decode may skip its NaN scrub of the
extra cache only when the cache came from a sanitizing writer and nothing else can have written it.

Group quantization (one definition for both writers; SPEC 1.2 and 4 step 4, with the gaps filled as stated):
  amax  = max |x| over the group's finite values;
  scale = max(amax, 1e-4) / FP8_MAX, correctly rounded fp32 division; FP8_MAX is the flavour's range
          (448 OCP, 240 FNUZ);
  code  = clamp(ceil(log2(scale)) + 127, 0, CAP)            (UE8M0; ``ue8m0_encode_bits``)
  [inferred] a group holding a NaN or +-inf has a non-finite scale: its code is CAP (255 unsanitized, the NaN code;
          254 sanitized);
  q     = x * 2^-(code - 127), the multiplier rebuilt from the stored code so the reader's product reproduces x
          (for finite groups this is SPEC's x * 2^-exp: the clamp never binds, exp is in [-22, 120]);
  byte  = e4m3(q) of the flavour, round-to-nearest-even, saturating at +-FP8_MAX (``fp8_encode_bits``).
With SANITIZE (the compressor on a sanitizing target) two more rules make every stored group decode to a finite value
for any input, which the ``nan-free-cache`` contract checks:
  non-finite x become 0 before the multiply (the seed's prose: NaN/Inf -> 0);
  |q| is bounded by min(FP8_MAX, 1.875 * 2^(127 - exp)), the largest e4m3 value whose product with 2^exp is a finite
  fp32 (only groups with exp >= 120 are affected: bf16 values within 4% of the bf16 maximum, or code-254 groups).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target, get_target
from impl.triton_helpers import bf16_rne_bits, bf16_round, fp8_encode_bits, ue8m0_encode_bits
from impl.validation import require_tensor  # noqa: F401  (re-exported for the compressor)

NOPE = formats.DSV4_NOPE_DIM
ROPE = formats.DSV4_ROPE_DIM
HEAD = formats.DSV4_HEAD_DIM
TOKEN_DATA_BYTES = formats.DSV4_TOKEN_DATA_BYTES
TOKEN_SCALE_BYTES = formats.DSV4_TOKEN_SCALE_BYTES

#: UE8M0 code cap of the SWA writer. [NF] SPEC does not say whether the C++ writer
#: ``fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert`` caps at 254 or scrubs NaN; the reference writer clamps to
#: [0, 255], and the decode always scrubs the main cache, so 255 is kept.
SWA_SCALE_CODE_CAP = 255

#: The cache dtype the trust gate accepts (SPEC 4).
TRUSTED_CACHE_DTYPE = "fp8_ds_mla"


# ---------------------------------------------------------------------------------------------------------------
# Shared Triton device function
# ---------------------------------------------------------------------------------------------------------------

@triton.jit
def quantize_nope_groups(x, FP8_MAX: tl.constexpr, IS_FNUZ: tl.constexpr, CAP: tl.constexpr,
                         SANITIZE: tl.constexpr):
    """Quantize a ``[8, 64]`` fp32 tile whose rows 0..6 are the seven NoPE groups (row 7 is ignored).

    Returns ``(codes [8, 64] uint8, scale_codes [8] uint8)``; the rules are in the module docstring. Every reduction
    is over explicitly masked finite values, so NaN handling does not depend on the backend's max semantics."""
    g = tl.arange(0, 8)[:, None]
    is_nope = g < 7
    ax = tl.abs(x)
    finite = (x == x) & (ax < float("inf"))
    amax = tl.max(tl.where(finite & is_nope, ax, 0.0), axis=1)
    poisoned = tl.max(tl.where(finite | (g >= 7), 0, 1), axis=1) > 0
    scale = tl.math.div_rn(tl.maximum(amax, 1e-4), FP8_MAX)
    scale = tl.where(poisoned, float("inf"), scale)
    code = ue8m0_encode_bits(scale, CAP)
    exp = code.to(tl.int32) - 127
    # 2^-exp from bits; exp is 127 or 128 only for code 254/255, whose multipliers are fp32 subnormals
    k = 127 - exp
    sub_shift = tl.minimum(tl.maximum(22 + k, 0), 22)
    mult = tl.where(k >= 1, k << 23, 1 << sub_shift).to(tl.float32, bitcast=True)
    if SANITIZE:
        x = tl.where(finite, x, 0.0)
    q = x * mult[:, None]
    if SANITIZE:
        bound_exp = tl.minimum(127 - exp, 8)
        bound = 1.875 * ((127 + bound_exp) << 23).to(tl.float32, bitcast=True)
        bound = tl.minimum(bound, FP8_MAX)[:, None]
        q = tl.where(tl.abs(q) > bound, tl.where(q < 0, -bound, bound), q)
    return fp8_encode_bits(q, IS_FNUZ), code


@triton.jit
def store_bf16_bytes(dst, values):
    """Store fp32 ``values`` that are bf16 values as little-endian bf16 into the byte pointers ``dst``/``dst+1``, so
    an unaligned view of the pool is never written through a 2-byte pointer."""
    bits = bf16_rne_bits(values)
    tl.store(dst, (bits & 0xFF).to(tl.uint8))
    tl.store(dst + 1, ((bits >> 8) & 0xFF).to(tl.uint8))


# do_not_specialize: block_size only splits a slot into block and position (and bs*576 is a multiple of 16 whatever bs
# is): a 1 or a multiple of 16 enables nothing; cache_block_stride stays specialized (its divisibility aligns the
# block's rows)
@triton.jit(do_not_specialize=["block_size"])
def _swa_insert_kernel(k_ptr, k_row_stride, slot_ptr, cache_ptr, cache_block_stride, block_size,
                       FP8_MAX: tl.constexpr, IS_FNUZ: tl.constexpr, CAP: tl.constexpr):
    """Grid ``(T,)``: program t writes token t of ``k [T, 512]`` bf16 into slot ``slot_mapping[t]`` (skipped if < 0).

    Layout (SPEC 1.2, region order of ``impl.formats.Fp8DsMlaLayout``): block = slot // bs, pos = slot % bs;
    data at block*stride + pos*576 (448 e4m3 bytes, then 128 bytes of raw bf16 RoPE), scales at
    block*stride + bs*576 + pos*8 (7 UE8M0 codes, pad byte 0). Invariant: slots are unique (the host rejects
    duplicates), so programs never write the same bytes; block offsets are int64 because a pool passes 2^31 bytes
    at about 57K blocks."""
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot >= 0:
        blk = (slot // block_size).to(tl.int64)
        pos = slot % block_size
        block_base = cache_ptr + blk * cache_block_stride
        data = block_base + pos * 576
        scales = block_base + block_size * 576 + pos * 8
        g = tl.arange(0, 8)[:, None]
        d = g * 64 + tl.arange(0, 64)[None, :]
        row = k_ptr + t * k_row_stride
        x = tl.load(row + d, mask=g < 7, other=0.0).to(tl.float32)
        codes, scale_codes = quantize_nope_groups(x, FP8_MAX, IS_FNUZ, CAP, False)
        tl.store(data + d, codes, mask=g < 7)
        gi = tl.arange(0, 8)
        tl.store(scales + gi, tl.where(gi < 7, scale_codes, 0).to(tl.uint8))
        # RoPE: raw bf16 bits, byte by byte (NaN payloads included)
        j = tl.arange(0, 128)
        bits = tl.load(row + 448 + j // 2).to(tl.int16, bitcast=True).to(tl.int32)
        byte = tl.where(j % 2 == 0, bits & 0xFF, (bits >> 8) & 0xFF)
        tl.store(data + 448 + j, byte.to(tl.uint8))


# ---------------------------------------------------------------------------------------------------------------
# Host-side validation (shared with impl.compressor)
# ---------------------------------------------------------------------------------------------------------------



def require_kernel_device(**tensors: torch.Tensor) -> None:
    want = kernel_device()
    for name, t in tensors.items():
        if t.device.type != want:
            raise ValueError(f"{name}: expected a tensor on '{want}' (where kernels run here), got '{t.device}'")


def require_contiguous_vector(name: str, t: torch.Tensor) -> None:
    """The kernels read a per-token vector at ``ptr + t`` (no stride argument): a strided view would be read as if
    packed, so it is refused."""
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{name}: expected a contiguous vector (stride 1), got stride {t.stride(0)}; pass "
                         f"{name}.contiguous()")


def check_slot_mapping(slot_mapping, num_tokens: int, num_slots: int, *, writes=None,
                       name: str = "slot_mapping", any_negative_skips: bool = False) -> list[int]:
    """Validate an int64 ``[T]`` slot mapping on the host (one device sync): every entry is -1 (any negative entry
    with ``any_negative_skips``, the indexer-K writers' rule) or in [0, num_slots), and no slot is written twice in
    one call (``writes`` masks the tokens that write)."""
    require_tensor(name, slot_mapping, (torch.int64,), dim=1)
    if slot_mapping.shape[0] != num_tokens:
        raise ValueError(f"{name}: expected {num_tokens} entries (one per token), got {slot_mapping.shape[0]}")
    require_contiguous_vector(name, slot_mapping)
    slots = slot_mapping.detach().cpu().tolist()
    skip = "< 0" if any_negative_skips else "-1"
    bad = [s for s in slots if not (s < 0 if any_negative_skips else s == -1) and not 0 <= s < num_slots]
    if bad:
        raise ValueError(f"{name}: entries must be {skip} (skip) or in [0, {num_slots}); got {bad[:4]}")
    seen: dict[int, int] = {}
    for i, s in enumerate(slots):
        if s < 0 or (writes is not None and not writes[i]):
            continue
        if s in seen:
            raise ValueError(f"{name}: slot {s} is written by tokens {seen[s]} and {i} in one call; a slot may be "
                             "written once per call (the result would depend on program order)")
        seen[s] = i
    return slots


def check_cache(cache, name: str = "cache") -> formats.Fp8DsMlaLayout:
    require_tensor(name, cache, (torch.uint8,))
    return formats.check_fp8_ds_mla_cache(cache, name)


# ---------------------------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------------------------

def quantize_and_insert_k_cache(k: torch.Tensor, slot_mapping: torch.Tensor, cache: torch.Tensor, *,
                                target: "Target | str | None" = None) -> None:
    """Insert ``k [T, 512]`` bf16 (448 NoPE + 64 RoPE) into the SWA ("main") ``fp8_ds_mla`` cache in place.

    ``slot_mapping`` is int64 ``[T]``; -1 skips a token. ``cache`` is a ``[num_blocks, block_size, 584]`` uint8 view
    (any block stride, e.g. a strided view into a shared pool). NoPE is quantized in the target's main-cache fp8
    flavour (``target.main_cache_fp8``: FNUZ with range 240 on gfx942, OCP with 448 elsewhere) with the group rules of
    this module, scale codes capped at ``SWA_SCALE_CODE_CAP``; no sanitizing ([NF]: the C++ writer's NaN handling is
    not known; the main cache is scrubbed at decode). Every byte outside the written slots' records is left as it
    was. Bad input raises ValueError/TypeError before anything is written.
    """
    t = get_target(target)
    require_tensor("k", k, (torch.bfloat16,), dim=2)
    if k.shape[1] != HEAD:
        raise ValueError(f"k: expected shape [T, {HEAD}] ({NOPE} NoPE + {ROPE} RoPE), got {list(k.shape)}")
    if k.shape[0] and k.stride(1) != 1:
        raise ValueError(f"k: the last dimension must be contiguous, got strides {list(k.stride())}")
    layout = check_cache(cache)
    require_tensor("slot_mapping", slot_mapping, (torch.int64,), dim=1)
    require_kernel_device(k=k, slot_mapping=slot_mapping, cache=cache)
    num_slots = cache.shape[0] * layout.block_size
    check_slot_mapping(slot_mapping, k.shape[0], num_slots)
    if k.shape[0] == 0:
        return
    flavour = formats.fp8_flavour(t.main_cache_fp8)
    _swa_insert_kernel[(k.shape[0],)](
        k, k.stride(0), slot_mapping, cache, cache.stride(0), layout.block_size,
        FP8_MAX=flavour.max_value, IS_FNUZ=flavour.is_fnuz, CAP=SWA_SCALE_CODE_CAP,
    )


def trust_extra_cache_nan_free(target: "Target | str | None", cache_dtype: str, has_kv_transfer: bool,
                               has_extra_cache: bool) -> bool:
    """May the decode skip its NaN scrub of the compressed ("extra") cache? (SPEC 4, seed 004.)

    True only when all four hold: the target's compressor sanitizes and the target allows trusting it (gfx950),
    the cache dtype is ``fp8_ds_mla`` (the only format the sanitizing writer produces), no KV-transfer connector is
    configured (imported bytes bypass the sanitizing writer), and an extra cache exists. Anything else keeps the
    scrub. Arguments of the wrong type are rejected rather than read as truthy.
    """
    t = get_target(target)
    if not isinstance(cache_dtype, str):
        raise TypeError(f"cache_dtype: expected a str, got {type(cache_dtype).__name__}")
    for name, v in (("has_kv_transfer", has_kv_transfer), ("has_extra_cache", has_extra_cache)):
        if not isinstance(v, bool):
            raise TypeError(f"{name}: expected a bool, got {type(v).__name__}")
    return (
        t.sanitizes_writer
        and t.may_trust_extra_nan_free
        and cache_dtype == TRUSTED_CACHE_DTYPE
        and not has_kv_transfer
        and has_extra_cache
    )
