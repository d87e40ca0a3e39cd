"""Reference codecs and cache addressing, written from SPEC.md section 1 with plain Python arithmetic.

Independent of ``impl``: values come from math.ldexp/frexp on float64 (and their torch forms, elementwise over a
whole tensor), encoding is a brute-force search for the nearest representable value (per element, or for all
elements at once against every representable value), and cache bytes are located by absolute offsets into the
tensor's storage.
"""
from __future__ import annotations

import math

import torch

# (bias, largest finite value) per flavour, from SPEC 1.2 / DESIGN "Numerics"
_FP8 = {"ocp": (7, 448.0), "fnuz": (8, 240.0)}


def _fp8_params(flavour: str) -> tuple[int, float]:
    if flavour not in _FP8:
        raise ValueError(f"flavour: expected 'ocp' or 'fnuz', got {flavour!r}")
    return _FP8[flavour]


def fp8_is_nan_code(code: int, flavour: str) -> bool:
    if flavour == "fnuz":
        return code == 0x80
    return (code & 0x7F) == 0x7F


def fp8_value(code: int, flavour: str) -> float:
    """The real number an e4m3 code stands for (NaN for NaN codes)."""
    bias, _ = _fp8_params(flavour)
    if fp8_is_nan_code(code, flavour):
        return math.nan
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> 3) & 0xF
    m = code & 7
    if e == 0:
        mag = math.ldexp(m / 8.0, 1 - bias)
    else:
        mag = math.ldexp(1.0 + m / 8.0, e - bias)
    return sign * mag


def _codes(codes: torch.Tensor, what: str) -> torch.Tensor:
    c = torch.as_tensor(codes).detach().cpu().to(torch.int64)
    if c.numel() and bool(((c < 0) | (c > 255)).any()):
        raise ValueError(f"{what}: codes must lie in 0..255, got {int(c.min())}..{int(c.max())}")
    return c


def fp8_decode(codes: torch.Tensor, flavour: str) -> torch.Tensor:
    """:func:`fp8_value` of every code of a tensor at once (float64, same shape): the same fields and rules,
    computed elementwise in float64 (sign, 4 exponent bits, 3 mantissa bits; exponent 0 is subnormal)."""
    bias, _ = _fp8_params(flavour)
    c = _codes(codes, "fp8_decode")
    e = (c >> 3) & 0xF
    m = (c & 7).to(torch.float64) / 8.0
    mag = torch.where(e == 0, torch.ldexp(m, 1 - bias + torch.zeros_like(e)), torch.ldexp(1.0 + m, e - bias))
    val = torch.where((c & 0x80) != 0, -mag, mag)
    nan = (c == 0x80) if flavour == "fnuz" else ((c & 0x7F) == 0x7F)
    return torch.where(nan, torch.full_like(val, math.nan), val)


def _positive_table(flavour: str) -> list[tuple[float, int]]:
    _, vmax = _fp8_params(flavour)
    out = []
    for c in range(0x80):
        v = fp8_value(c, flavour)
        if not math.isnan(v) and v <= vmax:
            out.append((v, c))
    return sorted(out)


def fp8_encode_scalar(x: float, flavour: str) -> int:
    """Nearest representable magnitude (ties to the even code), saturating at max; NaN -> the NaN code."""
    _, vmax = _fp8_params(flavour)
    if math.isnan(x):
        return 0x80 if flavour == "fnuz" else 0x7F
    neg = math.copysign(1.0, x) < 0
    a = min(abs(x), vmax)
    best_c, best_d = None, None
    for v, c in _positive_table(flavour):
        d = abs(v - a)
        if best_d is None or d < best_d or (d == best_d and c % 2 == 0 and best_c % 2 == 1):
            best_c, best_d = c, d
    if neg:
        if flavour == "fnuz":
            return best_c | 0x80 if best_c != 0 else 0
        return best_c | 0x80
    return best_c


#: values per chunk of :func:`fp8_encode`'s distance matrix (chunk x 128 float64)
ENCODE_CHUNK = 8192


def fp8_encode(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """:func:`fp8_encode_scalar` of every element at once, by the same brute force: the distance of each fp32 value
    (as float64) to every representable magnitude, the nearest taken, ties to the even code (the two nearest of a
    tie are neighbouring codes, so exactly one is even), saturating at max; NaN -> the NaN code; a negative input
    (-0.0 included) takes the sign bit, except that FNUZ has no -0."""
    _, vmax = _fp8_params(flavour)
    table = _positive_table(flavour)
    vals = torch.tensor([v for v, _ in table], dtype=torch.float64)
    codes = torch.tensor([c for _, c in table], dtype=torch.int64)
    odd = (codes % 2)[None, :]
    xd = x.to(torch.float32).to(torch.float64).flatten()
    nan = torch.isnan(xd)
    a = torch.where(nan, torch.zeros_like(xd), xd.abs()).clamp(max=vmax)
    best = torch.empty(xd.numel(), dtype=torch.int64)
    for lo in range(0, xd.numel(), ENCODE_CHUNK):
        d = (vals[None, :] - a[lo:lo + ENCODE_CHUNK, None]).abs()  # [n, K]
        nearest = d == d.min(dim=1, keepdim=True).values
        best[lo:lo + ENCODE_CHUNK] = codes[torch.where(nearest, odd, 2).argmin(dim=1)]  # 0 even, 1 odd, 2 farther
    neg = torch.signbit(xd)
    if flavour == "fnuz":
        signed = torch.where(neg & (best != 0), best | 0x80, best)
    else:
        signed = torch.where(neg, best | 0x80, best)
    signed = torch.where(nan, torch.full_like(best, 0x80 if flavour == "fnuz" else 0x7F), signed)
    return signed.to(torch.uint8).reshape(x.shape)


def ue8m0_value(code: int, *, reader: bool) -> float:
    """2^(code-127). Code 255: NaN (float8_e8m0fnu) or +inf (``reader=True``: what production Triton readers give)."""
    if code == 255:
        return math.inf if reader else math.nan
    return math.ldexp(1.0, code - 127)


def ue8m0_decode(codes: torch.Tensor, *, reader: bool = False) -> torch.Tensor:
    """:func:`ue8m0_value` of every code of a tensor at once (float64, same shape)."""
    c = _codes(codes, "ue8m0_decode")
    val = torch.ldexp(torch.ones_like(c, dtype=torch.float64), c - 127)
    return torch.where(c == 255, torch.full_like(val, math.inf if reader else math.nan), val)


def ue8m0_encode_scalar(scale: float, cap: int) -> int:
    """clamp(ceil(log2(scale)) + 127, 0, cap); inf/NaN -> cap."""
    if math.isnan(scale) or math.isinf(scale):
        return cap
    if scale <= 0:
        raise ValueError("scale must be > 0")
    m, e = math.frexp(scale)  # scale = m * 2^e, 0.5 <= m < 1
    k = e - 1 if m == 0.5 else e
    return max(0, min(cap, k + 127))


def ue8m0_encode(scale: torch.Tensor, cap: int) -> torch.Tensor:
    vals = scale.to(torch.float32).to(torch.float64).flatten().tolist()
    return torch.tensor([ue8m0_encode_scalar(v, cap) for v in vals], dtype=torch.int64).to(torch.uint8).reshape(
        scale.shape)


# --- cache addressing by absolute byte offsets into the storage --------------------------------------------------

def fp8_ds_mla_token_spans(slot: int, block_size: int, block_stride: int) -> dict[str, tuple[int, int]]:
    """Byte spans [start, end) of one token, relative to the cache view's first byte (SPEC 1.2):
    data at block*stride + pos*576 (448 fp8 NoPE then 128 B RoPE), scales at block*stride + bs*576 + pos*8
    (7 codes then 1 pad byte)."""
    block, pos = divmod(slot, block_size)
    base = block * block_stride
    data = base + pos * 576
    scales = base + block_size * 576 + pos * 8
    return {"nope": (data, data + 448), "rope": (data + 448, data + 576),
            "scale": (scales, scales + 7), "pad": (scales + 7, scales + 8)}


def fp8_ds_mla_token_offsets(slots: torch.Tensor, block_size: int, block_stride: int) -> dict[str, torch.Tensor]:
    """:func:`fp8_ds_mla_token_spans` for many slots at once: int64 [n, width] byte offsets (relative to the view's
    first byte) of each slot's ``nope`` (448), ``rope`` (128) and ``scale`` (7) bytes."""
    s = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
    block, pos = torch.div(s, block_size, rounding_mode="floor"), torch.remainder(s, block_size)
    data = block * block_stride + pos * 576
    scales = block * block_stride + block_size * 576 + pos * 8
    return {"nope": data[:, None] + torch.arange(448), "rope": data[:, None] + 448 + torch.arange(128),
            "scale": scales[:, None] + torch.arange(7)}


def indexer_k_token_offsets(slots: torch.Tensor, block_size: int, block_stride: int, layout: str
                            ) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`indexer_k_token_spans` for many slots at once: int64 [n, 128] offsets of the fp8 bytes and int64
    [n] offsets of the scales' first bytes."""
    s = torch.as_tensor(slots, dtype=torch.int64).reshape(-1)
    block, t = torch.div(s, block_size, rounding_mode="floor"), torch.remainder(s, block_size)
    base = (block * block_stride)[:, None]
    d = torch.arange(128)[None, :]
    t2 = t[:, None]
    if layout == "normal":
        offs = base + t2 * 128 + d
    elif layout == "shuffle":
        offs = base + torch.div(t2, 16, rounding_mode="floor") * 16 * 128 + torch.div(d, 16, rounding_mode="floor") \
            * 256 + torch.remainder(t2, 16) * 16 + torch.remainder(d, 16)
    else:
        raise ValueError(f"layout: expected 'normal' or 'shuffle', got {layout!r}")
    return offs, block * block_stride + block_size * 128 + 4 * t


def fp32_from_le_bytes(b: torch.Tensor) -> torch.Tensor:
    """float32 [...] from its 4 little-endian bytes [..., 4] (uint8 or int64; every bit pattern kept)."""
    w = b.to(torch.int64)
    word = w[..., 0] | (w[..., 1] << 8) | (w[..., 2] << 16) | (w[..., 3] << 24)
    word = torch.where(word >= 2 ** 31, word - 2 ** 32, word)
    return word.to(torch.int32).view(torch.float32)


def indexer_k_token_spans(slot: int, block_size: int, block_stride: int, layout: str) -> tuple[list[int], int]:
    """Absolute offsets of the 128 fp8 bytes of one indexer-K token and of its 4-byte fp32 scale (SPEC 1.3)."""
    block, t = divmod(slot, block_size)
    base = block * block_stride
    if layout == "normal":
        offs = [base + t * 128 + d for d in range(128)]
    elif layout == "shuffle":
        offs = [base + (t // 16) * 16 * 128 + (d // 16) * 256 + (t % 16) * 16 + d % 16 for d in range(128)]
    else:
        raise ValueError(f"layout: expected 'normal' or 'shuffle', got {layout!r}")
    return offs, base + block_size * 128 + 4 * t


def storage_bytes(view: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All bytes of ``view``'s storage as a flat uint8 tensor, and the view's first byte within it."""
    st = view.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8, device=view.device).set_(st, 0, (st.nbytes(),), (1,))
    return flat, view.storage_offset() * view.element_size()


# --- vectorized references for the exhaustive contracts (same rules as the scalar ones above) -------------------

def fp8_encode_vec(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """:func:`fp8_encode_scalar` for a whole tensor at once: the nearest entry of the flavour's value table (found by
    a sorted search over float64 magnitudes), ties to the even code, saturating at max; NaN -> the NaN code; a
    negative input takes the sign bit unless it rounds to zero (OCP keeps -0 as 0x80, FNUZ has no -0)."""
    _, vmax = _fp8_params(flavour)
    table = _positive_table(flavour)
    vals = torch.tensor([v for v, _ in table], dtype=torch.float64)
    codes = torch.tensor([c for _, c in table], dtype=torch.int64)
    xd = x.to(torch.float32).to(torch.float64).flatten()
    nan = torch.isnan(xd)
    a = torch.where(nan, torch.zeros_like(xd), xd.abs()).clamp(max=vmax)
    hi = torch.searchsorted(vals, a).clamp(max=len(vals) - 1)
    lo = (hi - 1).clamp(min=0)
    d_lo, d_hi = (a - vals[lo]).abs(), (vals[hi] - a).abs()
    c_lo, c_hi = codes[lo], codes[hi]
    pick_hi = (d_hi < d_lo) | ((d_hi == d_lo) & (c_hi % 2 == 0) & (c_lo % 2 == 1))
    c = torch.where(pick_hi, c_hi, c_lo)
    neg = torch.signbit(xd)
    if flavour == "fnuz":
        signed = torch.where(neg & (c != 0), c | 0x80, c)
    else:
        signed = torch.where(neg, c | 0x80, c)
    signed = torch.where(nan, torch.full_like(c, 0x80 if flavour == "fnuz" else 0x7F), signed)
    return signed.to(torch.uint8).reshape(x.shape)


def ceil_log2_vec(s: torch.Tensor) -> torch.Tensor:
    """ceil(log2(s)) for positive finite values (int64), from float64 frexp: s = m * 2^e with 0.5 <= m < 1."""
    m, e = torch.frexp(s.to(torch.float64))
    return torch.where(m == 0.5, e.to(torch.int64) - 1, e.to(torch.int64))


def ue8m0_encode_vec(scale: torch.Tensor, cap: int) -> torch.Tensor:
    """:func:`ue8m0_encode_scalar` for a whole tensor of positive scales (inf/NaN -> ``cap``)."""
    s = scale.to(torch.float32).to(torch.float64)
    if bool((s <= 0).any()):
        raise ValueError("scale must be > 0")
    finite = torch.isfinite(s)
    k = ceil_log2_vec(torch.where(finite, s, torch.ones_like(s)))
    return torch.where(finite, (k + 127).clamp(0, cap), torch.full_like(k, cap)).to(torch.uint8).reshape(scale.shape)


def mxfp8_group_code(amax: torch.Tensor, cap: int = 254) -> torch.Tensor:
    """MXFP8 scale code of a 32-lane group with the given amax (>= 0; OCP MX, the rule in impl.epilogues' docstring): clamp(ceil(log2(amax /
    448)) + 127, 0, cap) with the exact quotient (float64 cannot move a fp32 amax / 448 across a power of two), 0 for
    amax 0, ``cap`` for +inf. int64."""
    a = amax.to(torch.float32).to(torch.float64)
    finite_pos = torch.isfinite(a) & (a > 0)
    k = ceil_log2_vec(torch.where(finite_pos, a / 448.0, torch.ones_like(a)))
    code = (k + 127).clamp(0, cap)
    code = torch.where(torch.isinf(a), torch.full_like(code, cap), code)
    return torch.where(a == 0, torch.zeros_like(code), code)


def mxfp4_block_code(x: torch.Tensor) -> torch.Tensor:
    """MXFP4 scale code of a 32-lane block whose only nonzero lane is ``x`` (OCP MX; impl docstring rule): a NaN
    block is 255; otherwise amax = max(|x|, 6 * 2^-126), e = clamp(ceil(log2(fl32(amax / 6))), -127, 127), code
    e + 127 (+inf: 254). int64."""
    xf = x.to(torch.float32)
    nan = torch.isnan(xf)
    amax = torch.where(nan, torch.zeros_like(xf), xf.abs()).clamp(min=6.0 * 2.0 ** -126)
    q = amax / torch.tensor(6.0, dtype=torch.float32)  # correctly rounded fp32 division
    finite = torch.isfinite(q)
    e = ceil_log2_vec(torch.where(finite, q, torch.ones_like(q)))
    e = torch.where(finite, e, torch.full_like(e, 128)).clamp(-127, 127)
    return torch.where(nan, torch.full_like(e, 255), e + 127)


def writer_group_code(amax: torch.Tensor, fp8_max: float, cap: int, poisoned: "torch.Tensor | None" = None):
    """UE8M0 code of a writer's fp8 group (SPEC 1.2; impl.cache_writers' rule): clamp(ceil(log2(fl32(max(amax,
    1e-4) / fp8_max))) + 127, 0, cap), ``cap`` for a group holding NaN or +-inf. int64."""
    a = amax.to(torch.float32)
    s = torch.maximum(a, torch.tensor(1e-4, dtype=torch.float32)) / torch.tensor(fp8_max, dtype=torch.float32)
    code = ue8m0_encode_vec(s, cap).to(torch.int64)
    return code if poisoned is None else torch.where(poisoned, torch.full_like(code, cap), code)


def indexer_k_scale(amax: torch.Tensor, div: float, pow2: bool) -> torch.Tensor:
    """The indexer-K block scale (SPEC 1.3): fl32(max(amax, 1e-4) / div), rounded up to a power of two when
    ``pow2`` (2^ceil(log2), +inf stays +inf). float32."""
    a = amax.to(torch.float32)
    s = torch.maximum(a, torch.tensor(1e-4, dtype=torch.float32)) / torch.tensor(div, dtype=torch.float32)
    if not pow2:
        return s
    finite = torch.isfinite(s)
    k = ceil_log2_vec(torch.where(finite, s, torch.ones_like(s)))
    p = torch.ldexp(torch.ones_like(s, dtype=torch.float64), k).to(torch.float32)
    return torch.where(finite, p, s)
