"""Host codecs and cache layouts: what upstream has of them as host-callable code.

* ``ue8m0_decode_reader``: ``_decode_e8m0_scales`` (rocm_aiter_mla_sparse.py), upstream's host decode of raw UE8M0
  bytes, ``exp2(code - 127)`` in fp32 (code 255 -> +inf, as the readers; used for MXFP8 weight scales).
* ``unpack_indexer_k``: ``cp_gather_indexer_k_quant_cache_triton``, upstream's indexer-K gather, reading a token's
  128 fp8 bytes and its fp32 scale through the NORMAL or SHUFFLE layout. Our slots become one sequence per touched
  block (block table ``[[block]]``, ``block_size`` tokens each), so every block is read once; the slots' tokens are
  picked from the gathered rows.

Missing, each with its reason: upstream has no host fp8 codec (it views bytes as torch's fp8 dtypes), no host UE8M0
encoder and no torch-``float8_e8m0fnu`` decode of its own, no host packer or reader of the ``fp8_ds_mla`` block (its
kernels write and read it), and no packer of given indexer codes (its writer quantizes bf16 rows itself).
"""
from __future__ import annotations

import torch

from contracts.subjects.vllm.adapters.cache_writers import FamilyWithReasons
from contracts.subjects.vllm.adapters import needs
from impl.runtime import kernel_device

INDEXER_HEAD = 128
FP8_MISSING = "upstream has no host fp8 codec of its own (its host code views bytes as torch's fp8 dtypes)"
DS_MLA_MISSING = ("upstream writes and reads fp8_ds_mla tokens only inside its kernels (compressor, decode); it has no "
                  "host packer or reader of the block")
MISSING = {
    "fp8_decode": FP8_MISSING,
    "fp8_encode": FP8_MISSING,
    "ue8m0_decode": "upstream has no host decode with float8_e8m0fnu semantics (code 255 -> NaN) of its own",
    "ue8m0_encode": "upstream encodes UE8M0 scale codes only inside its kernels",
    "pack_fp8_ds_mla": DS_MLA_MISSING,
    "unpack_fp8_ds_mla": DS_MLA_MISSING,
    "pack_indexer_k": "upstream's indexer-K writer (indexer_k_quant_and_cache_triton) quantizes bf16 rows itself; "
                      "it has no packer of given codes and scales",
}


def _on_kernel_device(view: torch.Tensor) -> torch.Tensor:
    """``view`` itself, or the same view (shape, strides, offset) over a copy of its storage on the kernel device."""
    dev = kernel_device()
    if view.device.type == dev:
        return view
    st = view.untyped_storage()
    flat = torch.empty(0, dtype=torch.uint8).set_(st, 0, (st.nbytes(),), (1,)).to(dev)
    return flat.as_strided(tuple(view.shape), tuple(view.stride()), view.storage_offset())


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["FP8_DTYPE", "_decode_e8m0_scales", "cp_gather_indexer_k_quant_cache_triton"],
}, since={"ops.FP8_DTYPE": "0.31.0"})


def build(ctx):
    ops = ctx["ops"]

    def ue8m0_decode_reader(codes: torch.Tensor) -> torch.Tensor:
        return ctx.call(ops._decode_e8m0_scales, codes)

    def unpack_indexer_k(cache: torch.Tensor, slots, layout: str = "normal"):
        if layout not in ("normal", "shuffle"):
            raise ValueError(f"layout: expected 'normal' or 'shuffle', got {layout!r}")
        ids = [int(s) for s in (slots.flatten().tolist() if isinstance(slots, torch.Tensor) else slots)]
        bs = int(cache.shape[1])
        blocks = sorted({s // bs for s in ids})
        if not ids:
            return torch.empty(0, INDEXER_HEAD, dtype=torch.uint8), torch.empty(0, dtype=torch.float32)
        k_cache = _on_kernel_device(cache)
        dev = k_cache.device
        n = len(blocks) * bs
        k_fp8 = torch.zeros(n, INDEXER_HEAD, dtype=ops.FP8_DTYPE, device=dev)
        k_scale = torch.zeros(n, dtype=torch.float32, device=dev)
        table = torch.tensor(blocks, dtype=torch.int32, device=dev).reshape(-1, 1)
        cu = torch.arange(0, n + 1, bs, dtype=torch.int32, device=dev)
        token_to_seq = torch.arange(len(blocks), dtype=torch.int32, device=dev).repeat_interleave(bs)
        ctx.call(ops.cp_gather_indexer_k_quant_cache_triton, k_cache, k_fp8, k_scale, table, cu, token_to_seq,
                 cache_layout=layout.upper())
        rows = torch.tensor([blocks.index(s // bs) * bs + s % bs for s in ids], dtype=torch.int64)
        codes = k_fp8.view(torch.uint8).cpu()[rows]
        return codes, k_scale.cpu()[rows]

    return FamilyWithReasons("formats", MISSING, ue8m0_decode_reader=ue8m0_decode_reader,
                             unpack_indexer_k=unpack_indexer_k)
