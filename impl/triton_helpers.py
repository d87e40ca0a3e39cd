"""Shared Triton device functions: fp8 e4m3 (OCP/FNUZ) and UE8M0 codecs built from raw bits, the fp8 decode that
uses the hardware conversion where the device has the flavour, and a dot product that is safe under the Triton
interpreter.

Why from bits: Triton on NVIDIA refuses the FNUZ fp8 type (``fp8e4b8 not supported in this architecture``), the
interpreter (3.9) converts OCP 0x7F/0xFF to +-480 and FNUZ 0x80 to -0 instead of NaN, and ``exp2`` on a GPU may flush
2^-127 to zero. Integer arithmetic on the uint8 codes behaves identically on the interpreter, NVIDIA and AMD.

Where the device converts a flavour itself, the bit-level decode is a few dozen integer instructions per element
for nothing: :func:`fp8_decode` takes the hardware conversion there. Which path a flavour gets on this device is
decided in one place, :func:`hw_fp8_decode` (host side; kernels receive it as a constexpr):

    ==================  =====================  =====================
    device              OCP e4m3 (float8e4nv)  FNUZ e4m3 (float8e4b8)
    ==================  =====================  =====================
    NVIDIA sm_89+       hardware               bits (no such type)
    AMD gfx950          hardware               bits
    AMD gfx942          bits                   hardware
    anything else       bits                   bits
    Triton interpreter  bits (inexact NaNs)    bits (inexact NaN)
    ==================  =====================  =====================

Exactness is checked against torch's fp8 dtypes for all 256 codes on each path: the bit-level path here
(tests/test_codecs.py), the hardware paths on the device (the same test natively, and benchmarks/decode_variants.py).
"""
from __future__ import annotations

import os

import triton
import triton.language as tl

INTERPRETER: tl.constexpr = tl.constexpr(os.environ.get("TRITON_INTERPRET", "0") == "1")


def native_fp8_flavours(device=None, mode: str | None = None) -> frozenset:
    """The fp8 e4m3 flavours ("ocp", "fnuz") the device converts in hardware, exactly (NaN codes included): the
    table in this module's docstring. ``device`` is an :class:`impl.runtime.DeviceInfo` (default: the detected one);
    ``mode`` the Triton mode (default: the current one). Under the interpreter: none (its conversions are inexact)."""
    from impl.runtime import detect_device, triton_mode

    if (mode or triton_mode()) != "native":
        return frozenset()
    dev = detect_device() if device is None else device
    if dev.kind == "cuda":
        try:
            sm = int(str(dev.arch).removeprefix("sm_"))
        except ValueError:
            return frozenset()
        # cvt.rn.f16x2.e4m3x2 exists from sm_89 (Ada, Hopper); an older GPU would get Triton's emulation
        return frozenset({"ocp"}) if sm >= 89 else frozenset()
    if dev.kind == "rocm":
        arch = str(dev.arch)
        if arch.startswith("gfx950"):
            return frozenset({"ocp"})
        if arch.startswith("gfx942"):
            return frozenset({"fnuz"})
    return frozenset()


def hw_fp8_decode(is_fnuz: bool, device=None, mode: str | None = None) -> bool:
    """Whether kernels decode this flavour with the hardware conversion here (``HW_FP8`` of :func:`fp8_decode`)."""
    return ("fnuz" if is_fnuz else "ocp") in native_fp8_flavours(device, mode)


@triton.jit
def fp8_decode_bits(codes, IS_FNUZ: tl.constexpr):
    """uint8 fp8 e4m3 codes -> float32 (NaN codes -> NaN). OCP: bias 7, NaN = x.1111.111. FNUZ: bias 8, NaN = 0x80."""
    c = codes.to(tl.int32) & 0xFF
    sign = (c >> 7) & 1
    exp = (c >> 3) & 0xF
    man = c & 0x7
    if IS_FNUZ:
        bias: tl.constexpr = 8
    else:
        bias: tl.constexpr = 7
    normal_bits = ((exp - bias + 127) << 23) | (man << 20)
    normal = normal_bits.to(tl.float32, bitcast=True)
    sub = man.to(tl.float32) * (2.0 ** (-2 - bias))
    mag = tl.where(exp == 0, sub, normal)
    # the sign as a bit, not a negation: a GPU build turned -mag of 0x80's zero into +0 (decode_variants on an H200)
    val = (mag.to(tl.int32, bitcast=True) | (sign << 31)).to(tl.float32, bitcast=True)
    if IS_FNUZ:
        is_nan = c == 0x80
    else:
        is_nan = (c & 0x7F) == 0x7F
    return tl.where(is_nan, float("nan"), val)


@triton.jit
def fp8_decode(codes, IS_FNUZ: tl.constexpr, HW_FP8: tl.constexpr):
    """uint8 fp8 e4m3 codes -> float32, NaN codes -> NaN, -0 kept. HW_FP8 (from :func:`hw_fp8_decode`): the
    device's conversion (bitcast to float8e4nv / float8e4b8, then to fp32); otherwise :func:`fp8_decode_bits`.
    Both give the same fp32 values for all 256 codes (every e4m3 value is an fp32 value)."""
    if HW_FP8:
        if IS_FNUZ:
            return codes.to(tl.float8e4b8, bitcast=True).to(tl.float32)
        else:
            return codes.to(tl.float8e4nv, bitcast=True).to(tl.float32)
    else:
        return fp8_decode_bits(codes, IS_FNUZ)


@triton.jit
def _rne_shift(x, shift):
    """Round-to-nearest-even of x / 2^shift (x >= 0 int32, 1 <= shift <= 30)."""
    q = x >> shift
    rem = x - (q << shift)
    half = 1 << (shift - 1)
    up = (rem > half) | ((rem == half) & ((q & 1) == 1))
    return q + up.to(tl.int32)


@triton.jit
def fp8_encode_bits(x, IS_FNUZ: tl.constexpr):
    """float32 -> uint8 e4m3 code, round-to-nearest-even, saturating to +-max (inf included); NaN -> NaN code."""
    if IS_FNUZ:
        bias: tl.constexpr = 8
        max_value: tl.constexpr = 240.0
        max_code: tl.constexpr = 0x7F
        nan_code: tl.constexpr = 0x80
    else:
        bias: tl.constexpr = 7
        max_value: tl.constexpr = 448.0
        max_code: tl.constexpr = 0x7E
        nan_code: tl.constexpr = 0x7F
    x = x.to(tl.float32)
    bits = x.to(tl.int32, bitcast=True)
    negative = bits < 0
    abs_bits = bits & 0x7FFFFFFF
    is_nan = abs_bits > 0x7F800000
    max_bits = tl.full(abs_bits.shape, max_value, tl.float32).to(tl.int32, bitcast=True)
    # integer compare on non-negative fp32 bit patterns is an fp compare; this also saturates +inf
    abs_bits = tl.where(abs_bits > max_bits, max_bits, abs_bits)
    abs_bits = tl.where(is_nan, 0, abs_bits)
    e32 = abs_bits >> 23
    m32 = abs_bits & 0x7FFFFF
    normal_code = _rne_shift(abs_bits, tl.full(abs_bits.shape, 20, tl.int32)) - ((127 - bias) << 3)
    full_man = tl.where(e32 > 0, m32 | 0x800000, m32)
    shift = 148 - bias - tl.maximum(e32, 1)
    shift = tl.minimum(tl.maximum(shift, 1), 30)
    sub_code = _rne_shift(full_man, shift)
    # below 2^-30 relative to the quantum everything rounds to zero
    sub_code = tl.where(148 - bias - tl.maximum(e32, 1) > 30, 0, sub_code)
    code = tl.where(e32 >= 128 - bias, normal_code, sub_code)
    code = tl.minimum(code, max_code)
    if IS_FNUZ:
        signed = tl.where(negative & (code != 0), code | 0x80, code)
    else:
        signed = tl.where(negative, code | 0x80, code)
    signed = tl.where(is_nan, nan_code, signed)
    return signed.to(tl.uint8)


@triton.jit
def ue8m0_decode_reader(codes):
    """UE8M0 code -> float32 the way production Triton readers do it: 2^(code-127) from bits, code 0 -> 2^-127
    (bits 1<<22, not flushed), code 255 -> +inf (bits 0x7F800000), so a zero fp8 value times it gives NaN."""
    c = codes.to(tl.int32) & 0xFF
    bits = tl.where(c == 0, 1 << 22, c << 23)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def ceil_log2_bits(x):
    """Exact ceil(log2(x)) for positive finite float32 x (normal or subnormal), as int32."""
    bits = x.to(tl.float32).to(tl.int32, bitcast=True) & 0x7FFFFFFF
    e32 = bits >> 23
    m32 = bits & 0x7FFFFF
    norm = e32 - 127 + tl.where(m32 == 0, 0, 1)
    # subnormal: x = m32 * 2^-149; bit length by successive halving (m32 < 2^23)
    bitlen = tl.zeros(bits.shape, tl.int32)
    rest = m32
    for _ in tl.static_range(23):
        nz = rest > 0
        bitlen = bitlen + nz.to(tl.int32)
        rest = rest >> 1
    is_pow2 = (m32 & (m32 - 1)) == 0
    sub = bitlen - 1 + tl.where(is_pow2, 0, 1) - 149
    return tl.where(e32 == 0, sub, norm)


@triton.jit
def ue8m0_encode_bits(scale, CAP: tl.constexpr):
    """A UE8M0 code for a positive scale: clamp(ceil(log2(scale)) + 127, 0, CAP); +inf or NaN -> CAP."""
    s = scale.to(tl.float32)
    finite = (s.to(tl.int32, bitcast=True) & 0x7FFFFFFF) < 0x7F800000
    safe = tl.where(finite & (s > 0), s, 1.0)
    code = ceil_log2_bits(safe) + 127
    code = tl.minimum(tl.maximum(code, 0), CAP)
    code = tl.where(finite, code, CAP)
    return code.to(tl.uint8)


@triton.jit
def bf16_rne_bits(x):
    """fp32 -> bf16 bit pattern (int32 in [0, 0xFFFF]), round-to-nearest-even; a NaN stays a (quiet) NaN.

    From bits because the Triton interpreter (3.9) truncates fp32 -> bf16 casts, ``fp_downcast_rounding="rtne"``
    included, while GPUs round to nearest even; this gives the same bits everywhere."""
    bits = x.to(tl.int32, bitcast=True)
    is_nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return tl.where(is_nan, (bits >> 16) | 0x40, rounded) & 0xFFFF


@triton.jit
def bf16_round(x):
    """fp32 -> nearest bf16 (ties to even), returned as fp32."""
    return (bf16_rne_bits(x) << 16).to(tl.float32, bitcast=True)


@triton.jit
def load_as_f32(ptr, mask, IN_BF16: tl.constexpr):
    """Load as float32. bf16 is read as raw 16-bit words (``ptr`` then points at int16) and widened by a shift: exact
    everywhere, where the Triton interpreter (3.9) converts bf16 subnormals wrongly (2^-130 -> 0)."""
    if IN_BF16:
        bits = tl.load(ptr, mask=mask, other=0).to(tl.int32)
        return (bits << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptr, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def dot(a, b, acc):
    """acc + a @ b. Under the interpreter bf16/fp16 operands are upcast to fp32 first: the interpreter's bf16
    ``tl.dot`` multiplies raw bit patterns (upstream Triton issue 11584); on a GPU the operands stay as given."""
    if INTERPRETER:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def online_softmax_step(s, valid, m_i, l_i, BASE2: tl.constexpr):
    """One online-softmax step over scaled scores ``s`` [M, N]: columns where ``valid`` is false become -inf, the
    running max ``m_i`` and sum ``l_i`` [M] move on (natural exp, or exp2 of log2-unit scores when BASE2). Returns
    (m_new, l_new, alpha, p): the caller rescales its accumulators by ``alpha`` and adds ``p`` times its values. The
    decode kernels and the prefill share it."""
    s = tl.where(valid[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    if BASE2:
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
    else:
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, axis=1)
    return m_new, l_i, alpha, p
