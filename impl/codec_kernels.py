"""Elementwise launchers around the Triton codec helpers, so every device function is testable on its own and
the codec contracts can compare them with the host codecs and the oracles."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from impl import formats
from impl.runtime import kernel_device
from impl.triton_helpers import fp8_decode_bits, fp8_encode_bits, ue8m0_decode_reader, ue8m0_encode_bits

_BLOCK = 256


@triton.jit
def _fp8_decode_kernel(src, dst, n, IS_FNUZ: tl.constexpr, BLOCK: tl.constexpr):
    """Grid (cdiv(n, BLOCK),); dst[i] = decode(src[i]) for a flat uint8 src and float32 dst."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, fp8_decode_bits(tl.load(src + offs, mask=m, other=0), IS_FNUZ), mask=m)


@triton.jit
def _fp8_encode_kernel(src, dst, n, IS_FNUZ: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, fp8_encode_bits(tl.load(src + offs, mask=m, other=0.0), IS_FNUZ), mask=m)


@triton.jit
def _ue8m0_decode_kernel(src, dst, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, ue8m0_decode_reader(tl.load(src + offs, mask=m, other=0)), mask=m)


@triton.jit
def _ue8m0_encode_kernel(src, dst, n, CAP: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, ue8m0_encode_bits(tl.load(src + offs, mask=m, other=1.0), CAP), mask=m)


def _flat_on_kernel_device(name: str, t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {str(dtype).replace('torch.', '')}, "
                        f"got {str(t.dtype).replace('torch.', '')}")
    return t.reshape(-1).contiguous().to(kernel_device())


def _launch(kernel, src, out_dtype, shape, **meta):
    n = src.numel()
    dst = torch.empty(n, dtype=out_dtype, device=src.device)
    if n:
        kernel[(triton.cdiv(n, _BLOCK),)](src, dst, n, BLOCK=_BLOCK, **meta)
    return dst.reshape(shape).cpu()


def fp8_decode_triton(codes: torch.Tensor, flavour: str) -> torch.Tensor:
    fl = formats.fp8_flavour(flavour)
    src = _flat_on_kernel_device("codes", codes, torch.uint8)
    return _launch(_fp8_decode_kernel, src, torch.float32, codes.shape, IS_FNUZ=fl.is_fnuz)


def fp8_encode_triton(x: torch.Tensor, flavour: str) -> torch.Tensor:
    fl = formats.fp8_flavour(flavour)
    src = _flat_on_kernel_device("x", x, torch.float32)
    return _launch(_fp8_encode_kernel, src, torch.uint8, x.shape, IS_FNUZ=fl.is_fnuz)


def ue8m0_decode_reader_triton(codes: torch.Tensor) -> torch.Tensor:
    src = _flat_on_kernel_device("codes", codes, torch.uint8)
    return _launch(_ue8m0_decode_kernel, src, torch.float32, codes.shape)


def ue8m0_encode_triton(scale: torch.Tensor, cap: int = 255) -> torch.Tensor:
    if cap not in (254, 255):
        raise ValueError(f"cap: expected 254 or 255, got {cap!r}")
    src = _flat_on_kernel_device("scale", scale, torch.float32)
    return _launch(_ue8m0_encode_kernel, src, torch.uint8, scale.shape, CAP=cap)
