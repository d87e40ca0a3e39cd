"""Number formats and cache layouts, on the host: fp8 e4m3 (OCP and FNUZ), UE8M0 scale codes, the DSv4
``fp8_ds_mla`` cache block and the indexer-K cache block.

Everything here is built from raw bits with integer arithmetic, so it behaves the same on every device. The Triton
versions of the codecs live in :mod:`impl.triton_helpers`. SPEC.md section 1 is the source of every constant.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from impl.validation import require_tensor as _require_tensor

# ---------------------------------------------------------------------------------------------------------------
# fp8 e4m3: 1 sign bit, 4 exponent bits, 3 mantissa bits.
#   OCP  (float8_e4m3fn):   bias 7, max 448, NaN = S.1111.111 (0x7F / 0xFF), no infinities, -0 exists.
#   FNUZ (float8_e4m3fnuz): bias 8, max 240, NaN = 0x80 (the would-be -0), no infinities, no -0.
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Fp8Flavour:
    name: str
    bias: int
    max_value: float
    max_code: int  # largest finite positive code
    nan_code: int  # the code the encoder writes for NaN

    @property
    def is_fnuz(self) -> bool:
        return self.name == "fnuz"


FP8_OCP = Fp8Flavour("ocp", bias=7, max_value=448.0, max_code=0x7E, nan_code=0x7F)
FP8_FNUZ = Fp8Flavour("fnuz", bias=8, max_value=240.0, max_code=0x7F, nan_code=0x80)
FP8_FLAVOURS = {"ocp": FP8_OCP, "fnuz": FP8_FNUZ}


def fp8_flavour(flavour: "str | Fp8Flavour") -> Fp8Flavour:
    if isinstance(flavour, Fp8Flavour):
        return flavour
    try:
        return FP8_FLAVOURS[flavour]
    except (KeyError, TypeError):
        raise ValueError(f"flavour: expected 'ocp' or 'fnuz', got {flavour!r}") from None


def fp8_decode(codes: torch.Tensor, flavour: "str | Fp8Flavour") -> torch.Tensor:
    """uint8 fp8 codes -> float32 values (NaN codes -> NaN). Exact: every fp8 value is an fp32 value."""
    fl = fp8_flavour(flavour)
    _require_tensor("codes", codes, (torch.uint8,))
    c = codes.to(torch.int32)
    sign = (c >> 7) & 1
    exp = (c >> 3) & 0xF
    man = c & 0x7
    # normal: (8 + m) * 2^(e - bias - 3); subnormal (e == 0): m * 2^(1 - bias - 3)
    normal_bits = ((exp - fl.bias + 127) << 23) | (man << 20)
    normal = normal_bits.view(torch.float32) if normal_bits.dtype == torch.int32 else normal_bits
    sub = man.to(torch.float32) * (2.0 ** (-2 - fl.bias))
    mag = torch.where(exp == 0, sub, normal)
    val = torch.where(sign == 1, -mag, mag)
    if fl.is_fnuz:
        nan = c == 0x80
    else:
        nan = (c & 0x7F) == 0x7F
    return torch.where(nan, torch.full_like(val, float("nan")), val)


def _rne_shift(x: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest-even of x / 2^shift for non-negative int64 x and shift in [1, 62]."""
    q = x >> shift
    rem = x - (q << shift)
    half = torch.ones_like(x) << (shift - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + up.to(x.dtype)


def fp8_encode(x: torch.Tensor, flavour: "str | Fp8Flavour") -> torch.Tensor:
    """float32 -> uint8 fp8 codes, round-to-nearest-even; |x| beyond the flavour's max (inf included) saturates
    to +-max, never NaN; NaN -> the flavour's NaN code; -0 -> 0x80 on OCP, 0x00 on FNUZ (FNUZ has no -0)."""
    fl = fp8_flavour(flavour)
    _require_tensor("x", x, (torch.float32, torch.float64, torch.bfloat16, torch.float16))
    x = x.to(torch.float32)
    nan = torch.isnan(x)
    sign = torch.signbit(x)
    mag = x.abs().clamp(max=fl.max_value)
    mag = torch.where(nan, torch.zeros_like(mag), mag)
    bits = mag.view(torch.int32).to(torch.int64)
    e32 = bits >> 23
    m32 = bits & 0x7FFFFF
    min_normal_e32 = 128 - fl.bias  # fp32 biased exponent of 2^(1 - bias)
    # normal fp8: keep the top 3 mantissa bits of fp32, rounding; a carry bumps the exponent as it should.
    normal_code = _rne_shift(bits, torch.full_like(bits, 20)) - ((127 - fl.bias) << 3)
    # subnormal fp8: quantum 2^(-2 - bias); value = (implicit|m32) * 2^(e32 - 150)
    full_man = torch.where(e32 > 0, m32 | 0x800000, m32)
    shift = (148 - fl.bias - torch.clamp(e32, min=1)).clamp(1, 62)
    sub_code = _rne_shift(full_man, shift)
    code = torch.where(e32 >= min_normal_e32, normal_code, sub_code)
    code = code.clamp(max=fl.max_code)
    signed = torch.where(sign & (code != 0), code | 0x80, code)
    if not fl.is_fnuz:
        signed = torch.where(sign & (code == 0), torch.full_like(code, 0x80), signed)
    signed = torch.where(nan, torch.full_like(code, fl.nan_code), signed)
    return signed.to(torch.uint8)


# ---------------------------------------------------------------------------------------------------------------
# UE8M0 scale codes: value 2^(code - 127). Code 0 is 2^-127 (an fp32 subnormal), code 255 is NaN in torch's
# float8_e8m0fnu. Production Triton readers turn 255 into +inf (see impl.triton_helpers.ue8m0_decode_reader).
# ---------------------------------------------------------------------------------------------------------------

UE8M0_BIAS = 127
UE8M0_NAN_CODE = 255


def ue8m0_decode(codes: torch.Tensor) -> torch.Tensor:
    """Host decode matching torch's ``float8_e8m0fnu``: 2^(code-127), code 255 -> NaN, code 0 -> 2^-127."""
    _require_tensor("codes", codes, (torch.uint8,))
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 1 << 22), c << 23)
    val = bits.view(torch.float32)
    return torch.where(c == UE8M0_NAN_CODE, torch.full_like(val, float("nan")), val)


def ue8m0_decode_reader(codes: torch.Tensor) -> torch.Tensor:
    """Host model of the production Triton readers: like :func:`ue8m0_decode` but code 255 -> +inf."""
    _require_tensor("codes", codes, (torch.uint8,))
    c = codes.to(torch.int32)
    bits = torch.where(c == 0, torch.full_like(c, 1 << 22), c << 23)
    return bits.view(torch.float32)


def ceil_log2(x: torch.Tensor) -> torch.Tensor:
    """Exact ceil(log2(x)) for positive finite float32 x, from the bits (int32 result)."""
    bits = x.to(torch.float32).view(torch.int32).to(torch.int64)
    e32 = bits >> 23
    m32 = bits & 0x7FFFFF
    # subnormal x: x = m32 * 2^-149, ceil(log2) = ceil(log2(m32)) - 149
    sub_bitlen = torch.floor(torch.log2(m32.clamp(min=1).to(torch.float64))).to(torch.int64)
    sub_pow2 = (m32 & (m32 - 1)) == 0
    sub = sub_bitlen + torch.where(sub_pow2, 0, 1) - 149
    norm = e32 - 127 + torch.where(m32 == 0, 0, 1)
    return torch.where(e32 == 0, sub, norm).to(torch.int32)


def ue8m0_encode(scale: torch.Tensor, cap: int = 255) -> torch.Tensor:
    """A power-of-two scale code for ``scale`` > 0: clamp(ceil(log2(scale)) + 127, 0, cap).

    ``cap`` is 254 for sanitizing writers and 255 otherwise. +inf and NaN scales give ``cap`` (the unsanitized writer
    then emits 255, the NaN code). Zero or negative scales are an error: callers clamp amax first (SPEC: 1e-4).
    """
    _require_tensor("scale", scale, (torch.float32, torch.float64))
    if cap not in (254, 255):
        raise ValueError(f"cap: expected 254 or 255, got {cap!r}")
    s = scale.to(torch.float32)
    bad = ~(s > 0) & ~torch.isnan(s)
    if bool(bad.any()):
        raise ValueError("scale: every value must be > 0 (or inf/NaN); clamp amax before encoding")
    finite = torch.isfinite(s)
    safe = torch.where(finite, s, torch.ones_like(s))
    code = (ceil_log2(safe).to(torch.int64) + UE8M0_BIAS).clamp(0, cap)
    code = torch.where(finite, code, torch.full_like(code, cap))
    return code.to(torch.uint8)


# ---------------------------------------------------------------------------------------------------------------
# Cache layouts
# ---------------------------------------------------------------------------------------------------------------

DSV4_NOPE_DIM = 448
DSV4_ROPE_DIM = 64
DSV4_HEAD_DIM = DSV4_NOPE_DIM + DSV4_ROPE_DIM  # 512
DSV4_GROUP = 64  # NoPE dims per UE8M0 code
DSV4_NUM_GROUPS = DSV4_NOPE_DIM // DSV4_GROUP  # 7
DSV4_TOKEN_DATA_BYTES = DSV4_NOPE_DIM + 2 * DSV4_ROPE_DIM  # 448 fp8 + 64 bf16 = 576
DSV4_TOKEN_SCALE_BYTES = DSV4_NUM_GROUPS + 1  # 7 codes + 1 pad byte
DSV4_TOKEN_BYTES = DSV4_TOKEN_DATA_BYTES + DSV4_TOKEN_SCALE_BYTES  # 584
DSV4_BLOCK_ALIGN = 576  # FlashMLA pads each block to a multiple of this


@dataclass(frozen=True)
class Fp8DsMlaLayout:
    """The DSv4 ``fp8_ds_mla`` cache block (SPEC 1.2), as vLLM's cache_utils lays it out.

    A block of ``block_size`` tokens is three regions, not token-major records:
      data   [0, bs*576):            per token 448 B fp8 NoPE, then 64 bf16 RoPE (128 B);
      scales [bs*576, bs*576+bs*8):  per token 7 UE8M0 codes then one pad byte (0);
      padding up to the block stride (``tensor.stride(0)``; FlashMLA pads to a multiple of 576).
    Slot s lives in block s // bs at position s % bs. Offsets are int64: block * stride passes 2^31 early.
    """

    block_size: int

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {self.block_size!r}")

    data_region_offset = 0
    nope_offset_in_token = 0
    rope_offset_in_token = DSV4_NOPE_DIM

    @property
    def scale_region_offset(self) -> int:
        return self.block_size * DSV4_TOKEN_DATA_BYTES

    @property
    def used_block_bytes(self) -> int:
        return self.block_size * DSV4_TOKEN_BYTES

    @property
    def padded_block_bytes(self) -> int:
        return -(-self.used_block_bytes // DSV4_BLOCK_ALIGN) * DSV4_BLOCK_ALIGN

    def data_offset(self, pos: int) -> int:
        return self.data_region_offset + pos * DSV4_TOKEN_DATA_BYTES

    def scale_offset(self, pos: int) -> int:
        return self.scale_region_offset + pos * DSV4_TOKEN_SCALE_BYTES


def check_fp8_ds_mla_cache(cache: torch.Tensor, name: str = "cache") -> Fp8DsMlaLayout:
    """Validate a ``[num_blocks, block_size, 584]`` uint8 cache view (any block stride) and return its layout."""
    _require_tensor(name, cache, (torch.uint8,))
    if cache.dim() != 3 or cache.shape[2] != DSV4_TOKEN_BYTES:
        raise ValueError(f"{name}: expected shape [num_blocks, block_size, {DSV4_TOKEN_BYTES}], got {list(cache.shape)}")
    if cache.stride(2) != 1 or cache.stride(1) != DSV4_TOKEN_BYTES:
        raise ValueError(
            f"{name}: each block must be contiguous (strides [*, {DSV4_TOKEN_BYTES}, 1]), got {list(cache.stride())}"
        )
    if cache.shape[0] > 1 and cache.stride(0) < cache.shape[1] * DSV4_TOKEN_BYTES:
        raise ValueError(f"{name}: block stride {cache.stride(0)} is smaller than one block")
    return Fp8DsMlaLayout(int(cache.shape[1]))


def allocate_fp8_ds_mla_pool(num_blocks: int, block_size: int, *, padded: bool = True, device="cpu",
                             fill: int = 0, extra_blocks_before: int = 0,
                             extra_blocks_after: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A byte pool and a ``[num_blocks, block_size, 584]`` view into it whose ``stride(0)`` is the padded block
    size (as FlashMLA allocates) or the dense one. ``extra_blocks_before`` offsets the view into the pool, the way
    production hands out views of a shared pool; ``extra_blocks_after`` leaves pool bytes past the view's end.
    Returns (pool, view)."""
    layout = Fp8DsMlaLayout(block_size)
    stride = layout.padded_block_bytes if padded else layout.used_block_bytes
    total = num_blocks + extra_blocks_before + extra_blocks_after
    pool = torch.full((total * stride,), fill, dtype=torch.uint8, device=device)
    view = pool.as_strided((num_blocks, block_size, DSV4_TOKEN_BYTES), (stride, DSV4_TOKEN_BYTES, 1),
                           extra_blocks_before * stride)
    return pool, view


def _slot_list(slots, cache: torch.Tensor, name: str = "slots") -> list[int]:
    if isinstance(slots, torch.Tensor):
        if slots.dtype not in (torch.int32, torch.int64):
            raise TypeError(f"{name}: expected an int32/int64 tensor, got {slots.dtype}")
        slots = slots.flatten().tolist()
    nslots = cache.shape[0] * cache.shape[1]
    out = [int(s) for s in slots]
    for s in out:
        if not 0 <= s < nslots:
            raise ValueError(f"{name}: slot {s} outside [0, {nslots})")
    return out


def _byte_span(cache: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view over every byte the cache view can address, through ``stride(0)`` (blocks may be padded
    or be views into a larger pool)."""
    nb, bs, width = cache.shape
    span = (nb - 1) * cache.stride(0) + bs * width if nb else 0
    return cache.as_strided((span,), (1,), cache.storage_offset())


def _token_offsets(layout: Fp8DsMlaLayout, slot_ids: list[int], stride0: int) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 byte offsets (from the view's first byte) of each slot's data record and scale record."""
    s = torch.tensor(slot_ids, dtype=torch.int64)
    block, pos = s // layout.block_size, s % layout.block_size
    base = block * stride0
    return base + layout.data_offset(pos), base + layout.scale_offset(pos)


def pack_fp8_ds_mla(cache: torch.Tensor, slots, nope_codes: torch.Tensor, scale_codes: torch.Tensor,
                    rope: torch.Tensor, pad: int = 0) -> None:
    """Write tokens into an ``fp8_ds_mla`` cache: nope_codes [T,448] uint8, scale_codes [T,7] uint8,
    rope [T,64] bf16, at global ``slots`` [T] (distinct). Bytes of other slots are untouched."""
    layout = check_fp8_ds_mla_cache(cache)
    slot_ids = _slot_list(slots, cache)
    T = len(slot_ids)
    if len(set(slot_ids)) != T:
        raise ValueError("slots: every slot may be written once per call")
    _require_tensor("nope_codes", nope_codes, (torch.uint8,))
    _require_tensor("scale_codes", scale_codes, (torch.uint8,))
    _require_tensor("rope", rope, (torch.bfloat16,))
    for nm, t, w in (("nope_codes", nope_codes, DSV4_NOPE_DIM), ("scale_codes", scale_codes, DSV4_NUM_GROUPS),
                     ("rope", rope, DSV4_ROPE_DIM)):
        if tuple(t.shape) != (T, w):
            raise ValueError(f"{nm}: expected shape [{T}, {w}], got {list(t.shape)}")
    if T == 0:
        return
    data_off, scale_off = _token_offsets(layout, slot_ids, cache.stride(0))
    record = torch.cat([nope_codes.cpu(), rope.contiguous().cpu().view(torch.uint8).reshape(T, 2 * DSV4_ROPE_DIM)], 1)
    flat = _byte_span(cache)
    dev = cache.device
    flat[(data_off[:, None] + torch.arange(DSV4_TOKEN_DATA_BYTES)).reshape(-1).to(dev)] = record.reshape(-1).to(dev)
    flat[(scale_off[:, None] + torch.arange(DSV4_NUM_GROUPS)).reshape(-1).to(dev)] = \
        scale_codes.cpu().reshape(-1).to(dev)
    flat[(scale_off + DSV4_NUM_GROUPS).to(dev)] = pad


def unpack_fp8_ds_mla(cache: torch.Tensor, slots) -> dict[str, torch.Tensor]:
    """Read tokens back: {'nope': [T,448] uint8, 'scale': [T,7] uint8, 'rope': [T,64] bf16, 'pad': [T] uint8}."""
    layout = check_fp8_ds_mla_cache(cache)
    slot_ids = _slot_list(slots, cache)
    T = len(slot_ids)
    data_off, scale_off = _token_offsets(layout, slot_ids, cache.stride(0))
    flat = _byte_span(cache)
    dev = cache.device
    record = flat[(data_off[:, None] + torch.arange(DSV4_TOKEN_DATA_BYTES)).to(dev)].cpu().reshape(T, -1)
    scales = flat[(scale_off[:, None] + torch.arange(DSV4_TOKEN_SCALE_BYTES)).to(dev)].cpu().reshape(T, -1)
    return {"nope": record[:, :DSV4_NOPE_DIM].contiguous(),
            "rope": record[:, DSV4_NOPE_DIM:].contiguous().view(torch.bfloat16),
            "scale": scales[:, :DSV4_NUM_GROUPS].contiguous(), "pad": scales[:, DSV4_NUM_GROUPS].contiguous()}


def dequantize_fp8_ds_mla(cache: torch.Tensor, slots, flavour: "str | Fp8Flavour") -> torch.Tensor:
    """[T, 512] float32 rows: fp8 NoPE x 2^(code-127) (fp32 product, code 255 -> +inf as the readers do), then RoPE."""
    u = unpack_fp8_ds_mla(cache, slots)
    vals = fp8_decode(u["nope"], flavour)
    scl = ue8m0_decode_reader(u["scale"]).repeat_interleave(DSV4_GROUP, dim=1)
    return torch.cat([vals * scl, u["rope"].to(torch.float32)], dim=1)


# --- indexer-K cache (DSv3.2 and DSv4 C4A): per block [bs*128 fp8][bs fp32 scales], 132 B per token ---------------

INDEXER_HEAD_DIM = 128
INDEXER_TOKEN_BYTES = INDEXER_HEAD_DIM + 4  # 132
SHUFFLE_TILE_TOKENS = 16
SHUFFLE_TILE_BYTES = 16


@dataclass(frozen=True)
class IndexerKLayout:
    """Indexer-K block (SPEC 1.3): fp8 data region [bs*128] then fp32 scales [bs]. ``layout`` is "normal"
    (token-major: t*128 + d) or "shuffle" (16-token x 16-byte tiles:
    (t//16)*16*128 + (d//16)*256 + (t%16)*16 + d%16; needs bs % 16 == 0)."""

    block_size: int
    layout: str = "normal"

    def __post_init__(self):
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size: expected a positive int, got {self.block_size!r}")
        if self.layout not in ("normal", "shuffle"):
            raise ValueError(f"layout: expected 'normal' or 'shuffle', got {self.layout!r}")
        if self.layout == "shuffle" and self.block_size % SHUFFLE_TILE_TOKENS:
            raise ValueError(f"block_size: the shuffle layout needs a multiple of 16, got {self.block_size}")

    @property
    def scale_region_offset(self) -> int:
        return self.block_size * INDEXER_HEAD_DIM

    def element_offsets(self, pos: int) -> torch.Tensor:
        d = torch.arange(INDEXER_HEAD_DIM, dtype=torch.int64)
        if self.layout == "normal":
            return pos * INDEXER_HEAD_DIM + d
        return ((pos // SHUFFLE_TILE_TOKENS) * SHUFFLE_TILE_TOKENS * INDEXER_HEAD_DIM
                + (d // SHUFFLE_TILE_BYTES) * (SHUFFLE_TILE_TOKENS * SHUFFLE_TILE_BYTES)
                + (pos % SHUFFLE_TILE_TOKENS) * SHUFFLE_TILE_BYTES + d % SHUFFLE_TILE_BYTES)

    def scale_offset(self, pos: int) -> int:
        return self.scale_region_offset + 4 * pos


def default_indexer_layout(block_size: int) -> str:
    """``cache_layout=None``: NORMAL when bs == 1, SHUFFLE otherwise (C4A always passes NORMAL)."""
    return "normal" if block_size == 1 else "shuffle"


def check_indexer_k_cache(cache: torch.Tensor, layout: str, name: str = "cache") -> IndexerKLayout:
    _require_tensor(name, cache, (torch.uint8,))
    if cache.dim() != 3 or cache.shape[2] != INDEXER_TOKEN_BYTES:
        raise ValueError(f"{name}: expected shape [num_blocks, block_size, {INDEXER_TOKEN_BYTES}], got {list(cache.shape)}")
    if cache.stride(2) != 1 or cache.stride(1) != INDEXER_TOKEN_BYTES:
        raise ValueError(f"{name}: each block must be contiguous, got strides {list(cache.stride())}")
    return IndexerKLayout(int(cache.shape[1]), layout)


def _block_bytes(cache: torch.Tensor, block: int) -> torch.Tensor:
    return cache[block].reshape(-1)


def pack_indexer_k(cache: torch.Tensor, slots, k_codes: torch.Tensor, k_scale: torch.Tensor,
                   layout: str = "normal") -> None:
    """Write k_codes [T,128] uint8 and k_scale [T] float32 at ``slots``."""
    lay = check_indexer_k_cache(cache, layout)
    slot_ids = _slot_list(slots, cache)
    T = len(slot_ids)
    _require_tensor("k_codes", k_codes, (torch.uint8,))
    _require_tensor("k_scale", k_scale, (torch.float32,))
    if tuple(k_codes.shape) != (T, INDEXER_HEAD_DIM):
        raise ValueError(f"k_codes: expected shape [{T}, {INDEXER_HEAD_DIM}], got {list(k_codes.shape)}")
    if tuple(k_scale.shape) != (T,):
        raise ValueError(f"k_scale: expected shape [{T}], got {list(k_scale.shape)}")
    sb = k_scale.contiguous().view(torch.uint8).reshape(T, 4)
    bs = lay.block_size
    for i, s in enumerate(slot_ids):
        blk = _block_bytes(cache, s // bs)
        blk[lay.element_offsets(s % bs).to(cache.device)] = k_codes[i].to(cache.device)
        so = lay.scale_offset(s % bs)
        blk[so:so + 4] = sb[i].to(cache.device)


def unpack_indexer_k(cache: torch.Tensor, slots, layout: str = "normal") -> tuple[torch.Tensor, torch.Tensor]:
    lay = check_indexer_k_cache(cache, layout)
    slot_ids = _slot_list(slots, cache)
    T = len(slot_ids)
    codes = torch.empty(T, INDEXER_HEAD_DIM, dtype=torch.uint8)
    sb = torch.empty(T, 4, dtype=torch.uint8)
    bs = lay.block_size
    for i, s in enumerate(slot_ids):
        blk = _block_bytes(cache, s // bs).cpu()
        codes[i] = blk[lay.element_offsets(s % bs)]
        so = lay.scale_offset(s % bs)
        sb[i] = blk[so:so + 4]
    return codes, sb.view(torch.float32).reshape(T)
