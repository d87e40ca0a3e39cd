"""Codec device functions: upstream's one Triton codec helper of its own, ``_decode_e8m0_scales_triton`` (the gfx950
reader's UE8M0 decode: code << 23 as fp32 bits, code 0 -> 2^-127), launched elementwise as ours are
(impl/codec_kernels.py).

Everything else upstream does with codes happens inline in its kernels with Triton's own casts (e4m3 decode and
encode through ``to(tl.float8e4nv / tl.float8e4b8)``, UE8M0 encode in the compressor), which the writer and decode
contracts judge; those entry points are missing here, each saying so.

Each binding (one per target and tree) loads this file again as a module of its own, whose launcher calls that
binding's upstream helper (``UPSTREAM_UE8M0_READER``): a launcher compiled for one tree never runs another's code.
"""
from __future__ import annotations

import importlib.util
import itertools

import torch
import triton
import triton.language as tl

from contracts.subjects.vllm.adapters.cache_writers import FamilyWithReasons
from contracts.subjects.vllm.adapters import needs
from impl.runtime import kernel_device

_BLOCK = 256
#: set on each binding's own copy of this module (see the module docstring)
UPSTREAM_UE8M0_READER = None

INLINE_FP8 = ("upstream has no e4m3 helper of its own: its kernels cast inline with Triton's conversions "
              "(to(tl.float8e4nv) / to(tl.float8e4b8)), judged through the writer and decode contracts")
MISSING = {
    "fp8_decode_triton": INLINE_FP8,
    "fp8_encode_triton": INLINE_FP8,
    "ue8m0_encode_triton": "upstream encodes UE8M0 scale codes inline in the compressor's kernels (judged by "
                           "writer-oracle-exact)",
}

_COPIES = itertools.count()


@triton.jit
def _ue8m0_reader_kernel(src, dst, n, BLOCK: tl.constexpr):
    """Grid (cdiv(n, BLOCK),): dst[i] = upstream's reader decode of the uint8 code src[i], as float32."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    codes = tl.load(src + offs, mask=m, other=0)
    tl.store(dst + offs, UPSTREAM_UE8M0_READER(codes), mask=m)


def _own_copy(helper):
    spec = importlib.util.spec_from_file_location(f"smv_vllm_codec_kernels_{next(_COPIES)}", __file__)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.UPSTREAM_UE8M0_READER = helper
    return mod


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["_decode_e8m0_scales_triton"],
}, since={"ops._decode_e8m0_scales_triton": "0.28.0"})


def build(ctx):
    copy = _own_copy(ctx["ops"]._decode_e8m0_scales_triton)

    def ue8m0_decode_reader_triton(codes: torch.Tensor) -> torch.Tensor:
        if not isinstance(codes, torch.Tensor) or codes.dtype != torch.uint8:
            raise TypeError("codes: expected a uint8 torch.Tensor")
        src = codes.reshape(-1).contiguous().to(kernel_device())
        n = src.numel()
        dst = torch.empty(n, dtype=torch.float32, device=src.device)
        if n:
            ctx.call(copy._ue8m0_reader_kernel[(triton.cdiv(n, _BLOCK),)], src, dst, n, BLOCK=_BLOCK)
        return dst.reshape(codes.shape).cpu()

    return FamilyWithReasons("codec_kernels", MISSING, ue8m0_decode_reader_triton=ue8m0_decode_reader_triton)
