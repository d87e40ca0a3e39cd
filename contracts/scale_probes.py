"""Launchers that feed many scale inputs at once through impl's own Triton scale computations, for the exhaustive
codec contracts: the MXFP4 block code (``impl.indexer_writer.quantize_mxfp4_blocks``) and the MXFP8 group code
(``impl.epilogues.mxfp8_scale_code``). Both probes handle 4,096 groups per program and cover all 65,536 bf16 values
in seconds under the interpreter. The NoPE-group (``impl.cache_writers.quantize_nope_groups``) and indexer-K
(``impl.indexer_writer.quantize_fp8_block``) device functions take one fixed tile per call (8 groups, one block),
about 13 ms a group under the interpreter: their probes below serve the slow tests on the fp32 binade boundaries
only.

Each probe puts one input value in lane 0 of a group whose other lanes are 0, so the group's amax is |value| (and a
NaN value poisons an MXFP4 block), and returns the code the device function computes for that group.
"""
from __future__ import annotations

import torch

from impl import epilogues  # before triton: impl picks the interpreter when no GPU is visible

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from impl.epilogues import mxfp8_scale_code
from impl.cache_writers import quantize_nope_groups
from impl.indexer_writer import quantize_fp8_block, quantize_mxfp4_blocks
from impl.runtime import kernel_device
from impl.triton_helpers import fp8_encode_bits, ue8m0_encode_bits

_ROWS = 4096  # groups per program of the vector probes


@triton.jit
def _mxfp4_probe_kernel(src, dst, n, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    lane = tl.arange(0, 32)
    m = r < n
    v = tl.load(src + r, mask=m, other=0.0)
    x = tl.where(lane[None, :] == 0, v[:, None], 0.0)
    _, codes = quantize_mxfp4_blocks(x)
    tl.store(dst + r, codes, mask=m)


@triton.jit
def _mxfp8_probe_kernel(src, dst, n, CAP: tl.constexpr, LOW_AMAX: tl.constexpr, LOW_SHIFT: tl.constexpr,
                        ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    m = r < n
    v = tl.load(src + r, mask=m, other=0.0)
    amax = tl.where(v == v, tl.abs(v), 0.0)  # the kernel's amax rule: NaN lanes ignored
    tl.store(dst + r, mxfp8_scale_code(amax, CAP, LOW_AMAX, LOW_SHIFT), mask=m)


def _flat(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).reshape(-1).contiguous().to(kernel_device())


def mxfp4_block_codes(x: torch.Tensor) -> torch.Tensor:
    """The scale code ``quantize_mxfp4_blocks`` gives a 32-lane block holding one value of ``x`` (other lanes 0)."""
    src = _flat(x)
    n = src.numel()
    dst = torch.empty(n, dtype=torch.int32, device=src.device)
    _mxfp4_probe_kernel[(triton.cdiv(n, _ROWS),)](src, dst, n, ROWS=_ROWS)
    return dst.cpu()


def mxfp8_group_codes(x: torch.Tensor) -> torch.Tensor:
    """The UE8M0 code ``mxfp8_scale_code`` gives a 32-lane group whose amax is |value| (NaN lanes ignored)."""
    src = _flat(x)
    n = src.numel()
    dst = torch.empty(n, dtype=torch.int32, device=src.device)
    _mxfp8_probe_kernel[(triton.cdiv(n, _ROWS),)](src, dst, n, CAP=epilogues.MXFP8_SCALE_CODE_CAP,
                                                  LOW_AMAX=epilogues.MXFP8_LOW_AMAX,
                                                  LOW_SHIFT=epilogues.MXFP8_LOW_SHIFT, ROWS=_ROWS)
    return dst.cpu()


@triton.jit
def _fp8_encode_probe_kernel(src, dst, n, IS_FNUZ: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    m = r < n
    tl.store(dst + r, fp8_encode_bits(tl.load(src + r, mask=m, other=0.0), IS_FNUZ), mask=m)


@triton.jit
def _ue8m0_encode_probe_kernel(src, dst, n, CAP: tl.constexpr, ROWS: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    m = r < n
    tl.store(dst + r, ue8m0_encode_bits(tl.load(src + r, mask=m, other=1.0), CAP), mask=m)


def fp8_encode_codes(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """``impl.triton_helpers.fp8_encode_bits`` over ``x`` in programs of 4,096 lanes (uint8 codes)."""
    src = _flat(x)
    n = src.numel()
    dst = torch.empty(n, dtype=torch.uint8, device=src.device)
    _fp8_encode_probe_kernel[(triton.cdiv(n, _ROWS),)](src, dst, n, IS_FNUZ=flavour == "fnuz", ROWS=_ROWS)
    return dst.cpu().reshape(x.shape)


def ue8m0_encode_codes(s: torch.Tensor, cap: int) -> torch.Tensor:
    """``impl.triton_helpers.ue8m0_encode_bits`` over ``s`` in programs of 4,096 lanes (uint8 codes)."""
    src = _flat(s)
    n = src.numel()
    dst = torch.empty(n, dtype=torch.uint8, device=src.device)
    _ue8m0_encode_probe_kernel[(triton.cdiv(n, _ROWS),)](src, dst, n, CAP=cap, ROWS=_ROWS)
    return dst.cpu().reshape(s.shape)


# --- one fixed tile per call: affordable for the fp32 binade boundaries only (slow tests) ------------------------

@triton.jit
def _nope_probe_kernel(src, dst, n, FP8_MAX: tl.constexpr, IS_FNUZ: tl.constexpr, CAP: tl.constexpr):
    g = tl.arange(0, 8)
    lane = tl.arange(0, 64)
    idx = tl.program_id(0) * 7 + g
    m = (g < 7) & (idx < n)
    v = tl.load(src + idx, mask=m, other=0.0)
    x = tl.where(lane[None, :] == 0, v[:, None], 0.0)
    _, code = quantize_nope_groups(x, FP8_MAX, IS_FNUZ, CAP, False)
    tl.store(dst + idx, code.to(tl.int32), mask=m)


@triton.jit
def _indexer_probe_kernel(src, dst, DIV: tl.constexpr, IS_FNUZ: tl.constexpr, POW2: tl.constexpr):
    i = tl.program_id(0)
    lane = tl.arange(0, 2)
    v = tl.load(src + i + lane, mask=lane == 0, other=0.0)
    _, scale = quantize_fp8_block(tl.reshape(v, [1, 2]), DIV, IS_FNUZ, POW2)
    tl.store(dst + i + lane, tl.zeros([2], tl.float32) + scale, mask=lane == 0)


def nope_group_codes(x: torch.Tensor, *, fp8_max: float, is_fnuz: bool, cap: int) -> torch.Tensor:
    """The UE8M0 code ``impl.cache_writers.quantize_nope_groups`` gives a NoPE group holding one value of ``x``
    (other lanes 0), seven groups a call (about 13 ms a group under the interpreter)."""
    src = _flat(x)
    n = src.numel()
    dst = torch.empty(n, dtype=torch.int32, device=src.device)
    _nope_probe_kernel[(triton.cdiv(n, 7),)](src, dst, n, FP8_MAX=fp8_max, IS_FNUZ=is_fnuz, CAP=cap)
    return dst.cpu()


def indexer_k_scales(x: torch.Tensor, *, div: float, is_fnuz: bool, pow2: bool) -> torch.Tensor:
    """The fp32 scale ``impl.indexer_writer.quantize_fp8_block`` gives a block holding one value of ``x`` (other
    lanes 0), one block a call."""
    src = _flat(x)
    n = src.numel()
    dst = torch.empty(n + 1, dtype=torch.float32, device=src.device)
    if n:
        _indexer_probe_kernel[(n,)](torch.cat([src, src.new_zeros(1)]), dst, DIV=div, IS_FNUZ=is_fnuz, POW2=pow2)
    return dst[:n].cpu()
