"""Decode dispatch: what upstream's DSv4 ROCm layer runs for a layer's flags, read off upstream's own code.

Upstream has no single dispatch function: its decisions live where they are used. The adapter runs each of those
places and reports what it decided, in our :class:`impl.dispatch.DecodeDispatch`:

- kernel family, split selector and the fp8 flavours: upstream's decode wrapper (``rocm_sparse_attn_decode``) run
  on ``meta`` tensors with its kernel launches recorded (:mod:`.decode`): which kernel it launched, which selector it
  asked (both selectors are watched), ``IS_FNUZ_MAIN`` / ``IS_FNUZ_EXTRA``. The split cap is the largest count the
  selector it asked returns (one query, one head block, long segments, a device of 2^20 CUs).
- adaptive splits and the trust gate: ``DeepseekV4ROCMAiterMLAAttention.forward_mqa`` and ``_forward_decode`` run
  on a layer object holding only the attributes they read (compress ratio, caches, the KV-cache dtype, the KV
  transfer flag), with the forward context, the decode call (``rocm_sparse_attn_decode``, recorded),
  ``compute_global_topk_ragged_indices_and_indptr`` and the standalone inverse RoPE replaced; the recorded call's
  ``adaptive_splits`` and ``extra_cache_nan_free`` are upstream's decisions.
- ``for_cudagraph_capture``: what ``DeepseekV4ROCMAiterMLASparseMetadataBuilder.build_for_cudagraph_capture``
  leaves on the metadata (its parent's build replaced by a stand-in metadata object); outside capture the
  metadata's default (False).
- ragged-view rule: the length of the view ``_copy_ragged_to_graph_buffers`` returns for a source shorter than
  the buffer ("source" when it is the source's, "full" otherwise).

Flags our API takes but upstream's layer cannot even form are rejected here with ValueError, saying so: upstream
derives ``swa_only`` from the compress ratio (``compress_ratio <= 1``), and an SWA-only layer has no extra cache.
"""
from __future__ import annotations

import types
from unittest import mock

import torch

from contracts.subjects.base import Family
from contracts.subjects.vllm.adapters import decode as dec_adapter
from contracts.subjects.vllm.adapters.splits import pinned_cu
from contracts.subjects.vllm.adapters import aiter_flags_off, needs
from impl import formats
from impl.dispatch import DecodeDispatch
from impl.targets import get_target

_SELECTORS = {"_decode_num_splits": "gfx942", "_decode_gfx950_num_splits": "gfx950"}
#: a device larger than any: the selector's cap shows as its answer for one query with long segments
_HUGE_CU = 1 << 20
_LONG = 1.0e6


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "rocm": [
        "DeepseekV4ROCMAiterMLAAttention", "DeepseekV4ROCMAiterMLASparseMetadataBuilder",
        "_copy_ragged_to_graph_buffers", "compute_global_topk_ragged_indices_and_indptr", "get_forward_context",
        "rocm_inverse_rope_rows_", "rocm_sparse_attn_decode",
    ],
}, since={"rocm.DeepseekV4ROCMAiterMLAAttention": "0.23.0", "rocm.rocm_inverse_rope_rows_": "0.31.0"})


def build(ctx) -> Family:
    ops = ctx["ops"]
    rocm = ctx["rocm"]
    target = ctx.target
    fixed: dict = {}

    def _arch_facts() -> dict:
        """Kernel family, selector, cap, fp8 flavours and ragged-view rule (flag independent: computed once)."""
        if fixed:
            return fixed
        asked: list = []
        spies = {name: _spy(getattr(ops, name), name, asked) for name in _SELECTORS}
        meta = "meta"
        q = torch.empty(1, 1, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=meta)
        cache = torch.empty(1, 1, formats.DSV4_TOKEN_BYTES, dtype=torch.uint8, device=meta)
        idx = torch.empty(64, dtype=torch.int32, device=meta)
        ptr = torch.empty(2, dtype=torch.int32, device=meta)
        out = torch.empty(1, 1, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16, device=meta)
        rec = dec_adapter._Launches(ops, run=False)

        def run():
            with mock.patch.multiple(ops, **spies), rec.installed():
                dec_adapter._call_public(ops, q, cache, idx, ptr, cache, idx, ptr, None,
                                         dec_adapter.DEFAULT_SCALE, out, False, False)
            kernel = next(r for r in rec.records if r[0] in dec_adapter._FAMILY_OF)
            family = dec_adapter._FAMILY_OF[kernel[0]]
            selector = _SELECTORS[asked[0]] if asked else None
            cap = None
            if asked:
                with pinned_cu(ops, _HUGE_CU):
                    cap = int(getattr(ops, asked[0])(1, 1, _LONG, _LONG, 32))
            kw = kernel[3]
            src = torch.arange(3, dtype=torch.int32)
            view, _ = rocm._copy_ragged_to_graph_buffers(src, torch.tensor([0, 3], dtype=torch.int32),
                                                         torch.full((16,), -1, dtype=torch.int32),
                                                         torch.zeros(4, dtype=torch.int32), 1, 16)
            fixed.update(kernel_family=family, split_selector=selector, split_cap=cap,
                         main_cache_fp8="fnuz" if kw["IS_FNUZ_MAIN"] else "ocp",
                         extra_cache_fp8="fnuz" if kw["IS_FNUZ_EXTRA"] else "ocp",
                         ragged_view_rule="source" if view.numel() == src.numel() else "full")

        ctx.call(run)
        return fixed

    def _layer_decisions(compress_ratio, for_cudagraph_capture, has_extra_cache, kv_cache_dtype, has_kv_transfer):
        """(adaptive_splits, extra_cache_nan_free, metadata.for_cudagraph_capture) as upstream's layer decides."""
        calls: list = []

        def decode_recorder(**kw):
            calls.append(kw)
            return 0

        dev = "cpu"
        n = 1
        rocm_metadata = ctx.call(_metadata, rocm, for_cudagraph_capture)
        rocm_metadata.block_size = 64
        rocm_metadata.block_table = torch.zeros(n, 1, dtype=torch.int32, device=dev)
        rocm_metadata.c128a_global_decode_topk_indices = None
        rocm_metadata.c128a_decode_topk_lens = None
        rocm_metadata.c128a_decode_topk_ragged_indices = None
        rocm_metadata.c128a_decode_topk_ragged_indptr = None
        swa_metadata = types.SimpleNamespace(
            num_decodes=n, num_prefills=0, num_decode_tokens=n, is_valid_token=torch.ones(n, dtype=torch.bool),
            token_to_req_indices=torch.zeros(n, dtype=torch.int32), decode_swa_indices=None, decode_swa_lens=None,
            decode_swa_ragged_indices=None, decode_swa_ragged_indptr=None)
        layer = types.SimpleNamespace(
            prefix="layer", compress_ratio=compress_ratio, kv_cache=object() if has_extra_cache else None,
            swa_cache_layer=types.SimpleNamespace(prefix="swa", kv_cache=object()), _wo_a_fp8_weight=None,
            topk_indices_buffer=torch.zeros(n, 1, dtype=torch.int32),
            attn_sink=None, scale=dec_adapter.DEFAULT_SCALE, head_dim=formats.DSV4_HEAD_DIM,
            nope_head_dim=formats.DSV4_NOPE_DIM, rope_head_dim=formats.DSV4_ROPE_DIM, n_local_heads=1,
            rotary_emb=types.SimpleNamespace(cos_sin_cache=None), kv_cache_dtype=kv_cache_dtype,
            _has_kv_transfer=has_kv_transfer, window_size=128, max_model_len=1, max_num_batched_tokens=1)
        cls = rocm.DeepseekV4ROCMAiterMLAAttention
        layer.__dict__.update(aiter_flags_off(cls))
        layer._forward_decode = types.MethodType(cls._forward_decode, layer)
        layer._forward_prefill = None
        context = types.SimpleNamespace(attn_metadata={"layer": rocm_metadata, "swa": swa_metadata})
        q = torch.zeros(n, 1, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16)

        def run():
            with mock.patch.multiple(rocm, get_forward_context=lambda: context, rocm_sparse_attn_decode=decode_recorder,
                                     rocm_inverse_rope_rows_=lambda *a, **k: None,
                                     compute_global_topk_ragged_indices_and_indptr=lambda *a, **k: (None, None,
                                                                                                    None)):
                cls.forward_mqa(layer, q, None, torch.zeros(n, dtype=torch.int64), torch.zeros_like(q))

        ctx.call(run)
        if len(calls) != 1:
            raise RuntimeError(f"upstream's layer made {len(calls)} decode calls for one decode token, expected 1")
        return bool(calls[0]["adaptive_splits"]), bool(calls[0]["extra_cache_nan_free"]), bool(
            rocm_metadata.for_cudagraph_capture)

    def decode_dispatch(t, *, compress_ratio, swa_only, for_cudagraph_capture, has_extra_cache, kv_cache_dtype,
                        has_kv_transfer):
        if t is not None and get_target(t).name != target.name:
            raise ValueError(f"target: this subject is bound to {target.name}, got {get_target(t).name}")
        if swa_only != (compress_ratio <= 1):
            raise ValueError(f"swa_only: upstream's layer derives it from the compress ratio (ratio <= 1); "
                             f"swa_only={swa_only} with compress_ratio={compress_ratio} is no layer it can form")
        if swa_only and has_extra_cache:
            raise ValueError("has_extra_cache: upstream's SWA-only layer has no extra (compressed) cache")
        facts = _arch_facts()
        adaptive, trust, capture = _layer_decisions(compress_ratio, for_cudagraph_capture, has_extra_cache,
                                                    kv_cache_dtype, has_kv_transfer)
        return DecodeDispatch(target=target.name, adaptive_splits=adaptive, trust_extra_nan_free=trust,
                              for_cudagraph_capture=capture, **facts)

    return Family("dispatch", decode_dispatch=decode_dispatch, DecodeDispatch=DecodeDispatch)


def _spy(fn, name, asked):
    def spy(*a, **k):
        asked.append(name)
        return fn(*a, **k)
    return spy


def _metadata(rocm, for_capture: bool):
    """The decode metadata upstream's builder hands the layer: ``build_for_cudagraph_capture``'s (its parent's
    build replaced by a plain object) under capture, else a plain object with the dataclass default (False)."""
    md = types.SimpleNamespace(for_cudagraph_capture=False)
    if not for_capture:
        return md
    builder_cls = rocm.DeepseekV4ROCMAiterMLASparseMetadataBuilder

    class _Parent:
        def build_for_cudagraph_capture(self, common_attn_metadata):
            return md

    probe_cls = type("_BuilderProbe", (builder_cls, _Parent), {})
    probe = object.__new__(probe_cls)
    return builder_cls.build_for_cudagraph_capture(probe, None)
