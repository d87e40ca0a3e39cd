"""The indexer-K writers: upstream's DSv3.2 direct writer ``indexer_k_quant_and_cache_triton``
(``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py``) and its head-128 compressor (``compress_norm_rope_store_triton``
with head 128 in ``vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py``) behind our signature.

Direct writer: our ``(k, cache, slot_mapping, scale_fmt=, layout=)`` is upstream's ``(k, kv_cache, slot_mapping,
quant_block_size=128, scale_fmt)``. Upstream picks the layout itself (NORMAL when bs == 1, SHUFFLE otherwise) and
has no argument for it, so an explicit ``layout`` other than that rule is :class:`SubjectUnavailable`; its fp8
flavour is the import's ``FP8_DTYPE`` (FNUZ on gfx942, bound per target by the loader).

Compressor: ``compress_norm_rope_store_triton`` dispatches head 128 to the launcher object
``_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL``, whose ``__call__`` returns a launch specification
(grid, the kernel, its non-input arguments) that vLLM's ``kernel_launcher`` completes and launches. That launcher
lives in a module the audit does not load (a stand-in, which would launch nothing), so for the call the adapter
puts in front of the launcher object a proxy that takes upstream's own specification and launches it the way
vLLM's launcher binds it (``jit_warmup_triton_helper._launch_binding_plan``): every kernel argument the
specification leaves out takes the call's input of the same name, or of the name without ``_ptr``; the kernel
and every value it is launched with are upstream's. Arguments: the state cache and its block table, our slot
mapping as both the state-side ``slot_mapping`` and the cache's ``k_cache_metadata.slot_mapping``, quant block 128,
token stride 128, scale dim 4 (the FP8 record of vLLM's ``DeepseekCompressor`` for head 128). ``mx_scale`` would
switch upstream's ``MX_SCALE`` (``mqa_logits_use_mx_scales()``, CUDA SM100), whose packer ``pack_ue8m0_x4`` lives
in ``vllm/v1/attention/ops/common.py``, a module the audit does not load: only ``mx_scale=False`` runs.
MXFP4 (``use_fp4_cache``) is upstream's ``..._indexer_mxfp4_attn``, which packs E2M1 with CUDA PTX
(``cvt.rn.satfinite.e2m1x2.f32``, Blackwell) that neither the interpreter nor an AMD or Hopper GPU runs (on ROCm
upstream writes MXFP4 with aiter's op): unavailable. ``layout`` other than NORMAL: upstream's head-128 compressor
writes token-major records only.

``VARIANTS`` says what of ours upstream has, so the contracts draw only those cases.

``intermediates``: under the interpreter each writing token's fp32 row is read from the kernel's frame when it
returns (the local ``result``: RoPE applied, before the bf16 rounding), as ``adapters/compressor.py`` does for head
512; natively they cannot be observed and a call asking for them is :class:`SubjectUnavailable`.
"""
from __future__ import annotations

import contextlib
import sys
from types import SimpleNamespace

import numpy as np
import torch

from contracts.subjects.vllm.adapters import native_fnuz_unavailable
from contracts.subjects.base import Family, SubjectUnavailable
from contracts.subjects.vllm.adapters.compressor import _array, _patched
from contracts.subjects.vllm.adapters import needs
from impl.runtime import triton_mode
from impl.targets import get_target

HEAD = 128
ROPE = 64
ROW_KERNEL = "_fused_kv_compress_norm_rope_insert_indexer_attn"
LAUNCHER = "_FUSED_KV_COMPRESS_NORM_ROPE_INSERT_INDEXER_TRITON_KERNEL"
VARIANTS = {"direct_layouts": ("default",), "compressor_formats": ("fp8",), "compressor_layouts": ("default", "normal"),
            "mx_scale": (False,)}
MXFP4_UNAVAILABLE = ("upstream's MXFP4 indexer kernel packs E2M1 with CUDA PTX (cvt.rn.satfinite.e2m1x2.f32, "
                     "Blackwell), which neither the Triton interpreter nor this host runs; on ROCm upstream writes "
                     "the MXFP4 indexer cache with aiter's op")
MX_SCALE_UNAVAILABLE = ("upstream's MX_SCALE path (CUDA SM100) packs with pack_ue8m0_x4 from "
                        "vllm/v1/attention/ops/common.py, a module the audit does not load")


class IndexerRowObserver:
    """Under the interpreter, records each writing token's fp32 row (``result``) as upstream's head-128 kernel
    computed it into row ``token_idx`` of ``rows``, through a trace function that watches only that kernel's
    frames while active."""

    def __init__(self, rows: torch.Tensor):
        self.rows = rows
        self.seen: list[int] = []

    def _local(self, frame, event, arg):
        if event == "return":
            loc = frame.f_locals
            if "result" in loc and "token_idx" in loc:
                t = int(_array(loc["token_idx"]).reshape(-1)[0])
                self.rows[t] = torch.from_numpy(_array(loc["result"]).astype(np.float32).reshape(-1)[:HEAD].copy())
                self.seen.append(t)
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_name == ROW_KERNEL:
            frame.f_trace_lines = False
            return self._local
        return None

    @contextlib.contextmanager
    def watching(self):
        previous = sys.gettrace()
        sys.settrace(self._global)
        try:
            yield self
        finally:
            sys.settrace(previous)


class _LaunchingProxy:
    """Stands in front of upstream's launcher object for one call: its ``__call__`` returns the launch specification
    (``kernel_launcher`` is not loaded), which this proxy binds and launches (module docstring)."""

    def __init__(self, launcher):
        self.launcher = launcher

    def __call__(self, **inputs):
        spec = type(self.launcher).__call__(self.launcher, **inputs)
        grid, launch = spec[0], dict(spec[1])
        kernel = launch.pop("kernel")
        for name in kernel.arg_names:
            if name in launch:
                continue
            for cand in (name, name[:-4] if name.endswith("_ptr") else None):
                if cand is not None and cand in inputs:
                    launch[name] = inputs[cand]
                    break
        kernel[grid](**launch)


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself)
NEEDS = needs({
    "compress": ["compress_norm_rope_store_triton"],
    "ops": ["indexer_k_quant_and_cache_triton"],
})


def build(ctx) -> Family:
    ops = ctx["ops"]
    tgt = ctx.target

    def _same_target(target):
        if target is not None and get_target(target).name != tgt.name:
            raise ValueError(f"target: this binding of the subject is for {tgt.name}, got {get_target(target).name}")

    def indexer_k_quant_and_cache(k, cache, slot_mapping, *, scale_fmt=None, layout=None, target=None) -> None:
        _same_target(target)
        bs = int(cache.shape[1])
        rule = "normal" if bs == 1 else "shuffle"
        if layout is not None and str(layout).lower() != rule:
            raise SubjectUnavailable(f"upstream's indexer_k_quant_and_cache_triton picks the layout itself ({rule} at "
                                     f"block size {bs}) and cannot write {layout!r}")
        if int(slot_mapping.shape[0]) == 0:
            return
        native_fnuz_unavailable(tgt, "indexer-K writer stores its codes")
        ctx.call(ops.indexer_k_quant_and_cache_triton, k, cache, slot_mapping, HEAD, scale_fmt)

    def compress_norm_rope_store_indexer(state, state_block_table, token_to_req, positions, slot_mapping,
                                         norm_weight, cos_sin_cache, cache, *, ratio: int = 4, eps: float = 1e-6,
                                         kv_format: str = "fp8", layout=None, mx_scale: bool = False, target=None,
                                         intermediates=None) -> None:
        _same_target(target)
        comp = ctx["compress"]
        if kv_format != "fp8":
            raise SubjectUnavailable(MXFP4_UNAVAILABLE)
        if mx_scale:
            raise SubjectUnavailable(MX_SCALE_UNAVAILABLE)
        if layout is not None and str(layout).lower() != "normal":
            raise SubjectUnavailable("upstream's head-128 compressor writes token-major (NORMAL) records only")
        T = int(positions.shape[0])
        if T == 0:
            return
        overlap = ratio == 4
        args = dict(
            state_cache=state, num_actual=T, token_to_req_indices=token_to_req, positions=positions,
            slot_mapping=slot_mapping, block_table=state_block_table, block_size=int(state.shape[1]),
            state_width=HEAD * (1 + overlap), cos_sin_cache=cos_sin_cache, kv_cache=cache,
            k_cache_metadata=SimpleNamespace(slot_mapping=slot_mapping), pdl_kwargs={}, head_dim=HEAD,
            rope_head_dim=ROPE, compress_ratio=int(ratio), overlap=overlap, use_fp4_cache=False,
            rms_norm_weight=norm_weight, rms_norm_eps=float(eps), quant_block=HEAD, token_stride=HEAD, scale_dim=4)
        observer = None
        if intermediates is not None:
            if triton_mode() != "interpreter":
                raise SubjectUnavailable("upstream's head-128 compressor keeps its fp32 rows in registers; the adapter "
                                         "reads them from the kernel's frames, which only the Triton interpreter has")
            observer = IndexerRowObserver(intermediates)
        proxy = _LaunchingProxy(getattr(comp, LAUNCHER))
        with _patched(comp, **{LAUNCHER: proxy, "mqa_logits_use_mx_scales": lambda: False}):
            with observer.watching() if observer else contextlib.nullcontext():
                ctx.call(comp.compress_norm_rope_store_triton, **args)

    return Family("indexer_writer", indexer_k_quant_and_cache=indexer_k_quant_and_cache,
                  compress_norm_rope_store_indexer=compress_norm_rope_store_indexer, VARIANTS=dict(VARIANTS))
