"""The sparse indexer's logits: upstream's ``rocm_fp8_paged_mqa_logits`` (decode) and ``rocm_fp8_mqa_logits``
(prefill) from ``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py`` behind our signatures.

Which upstream code is judged. AITER is absent here (the loader never imports it; the adapter's fake
``vllm._aiter_ops`` says ``is_enabled()`` and ``is_rdna_aiter_enabled()`` are false), so the dispatchers take the
paths a ROCm host without AITER takes:

- ``fp8_paged_mqa_logits`` calls the dispatcher ``rocm_fp8_paged_mqa_logits`` with ``compress_ratio`` 4 for a NORMAL
  cache (C4A, the block-flat indexer) and 1 for a SHUFFLE one (our ``layout`` None means upstream's own default:
  NORMAL for bs == 1, SHUFFLE otherwise). On gfx942 and gfx950 a C4A cache with bs > 1 goes to the Triton kernel
  ``rocm_fp8_paged_mqa_logits_triton`` when bs % 64 == 0 and to the torch reference ``fp8_paged_mqa_logits_torch``
  otherwise; every other call (generic target, SHUFFLE caches, bs == 1) reaches the torch reference, as AITER's
  kernels are unavailable. ``fp8_paged_mqa_logits_triton`` / ``fp8_paged_mqa_logits_torch`` call those two
  directly (for tests).
- ``fp8_mqa_logits`` calls ``rocm_fp8_mqa_logits``, which without AITER is ``fp8_mqa_logits_torch``.

Upstream's Triton path takes its output from ``current_workspace_manager().get_simultaneous`` (vLLM's worker
workspace, a stand-in here): the adapter hands it a fresh buffer filled with NaN for each call, so a column the
kernel never writes is seen (a real workspace holds whatever the previous step left). Our ``out`` is filled from
upstream's result (upstream writes its own buffer). ``q`` and ``k_fp8`` go in as upstream's fp8 dtype
(``FP8_DTYPE``, the same bytes); the cache as upstream's ``[nb, bs, 1, 132]`` view (``kv_cache.unsqueeze(-2)``, as
``rocm_aiter_sparse_attn_indexer`` passes it).

No top-k entry point: with AITER absent upstream's indexer ranks with ``torch.ops._C.top_k_per_row_decode`` /
``top_k_per_row_prefill``, compiled vLLM ops (csrc) that are not part of the Python modules this audit loads; with
AITER, ``rocm_aiter_ops.indexer_top_k_decode`` / ``indexer_top_k_prefill`` (then ``_localize_aiter_prefill_topk``),
AITER kernels. ``topk_indices`` and ``topk_indices_prefill`` are therefore ``EntryMissing`` with that reason.
"""
from __future__ import annotations

import contextlib
import importlib.machinery
import sys
import types

import torch

from contracts.subjects.vllm.adapters import native_fnuz_unavailable
from contracts.subjects.base import EntryMissing, Family, SubjectUnavailable
from contracts.subjects.vllm.adapters import needs
from impl.formats import default_indexer_layout
from impl.runtime import triton_mode
from impl.targets import get_target

#: upstream's compress_ratio for our layout: C4A's block-flat (NORMAL) cache, or the SHUFFLE one of ratio 1 and 2
RATIO_FOR_LAYOUT = {"normal": 4, "shuffle": 1}
TOPK_MISSING = ("upstream's indexer top-k is torch.ops._C.top_k_per_row_decode/_prefill (compiled vLLM ops, not in "
                "the audited Python modules) without AITER, rocm_aiter_ops.indexer_top_k_* with it")
_ABSENT = object()


class _PoisonedWorkspace:
    """vLLM's ``current_workspace_manager()`` for one call: every buffer it hands out is new and NaN-filled."""

    def get_simultaneous(self, *specs):
        out = []
        for shape, dtype in specs:
            t = torch.empty(shape, dtype=dtype, device=self.device)
            if dtype.is_floating_point:
                t.fill_(float("nan"))
            else:
                t.fill_(0xFF)
            out.append(t)
        return out

    device = "cpu"


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__path__ = []
    m.__dict__.update(attrs)
    return m


def _no_aiter_ops():
    class rocm_aiter_ops:  # noqa: N801 - upstream's name
        """vLLM's AITER switchboard on a host without AITER."""

        @staticmethod
        def is_enabled() -> bool:
            return False

        @staticmethod
        def is_rdna_aiter_enabled() -> bool:
            return False

        @staticmethod
        def is_mla_enabled() -> bool:
            return False

    return rocm_aiter_ops


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": [
        "FP8_DTYPE", "current_workspace_manager", "fp8_paged_mqa_logits_torch", "rocm_fp8_mqa_logits",
        "rocm_fp8_paged_mqa_logits", "rocm_fp8_paged_mqa_logits_triton",
    ],
}, since={
    "ops.FP8_DTYPE": "0.31.0", "ops.current_workspace_manager": "0.23.0",
    "ops.rocm_fp8_paged_mqa_logits_triton": "0.31.0",
})


def build(ctx) -> Family:
    ops = ctx["ops"]
    tgt = ctx.target

    def _check_target(target) -> None:
        if target is not None and get_target(target).name != tgt.name:
            raise ValueError(f"target: this binding of the subject is for {tgt.name}, got {get_target(target).name}")

    @contextlib.contextmanager
    def environment(device):
        saved_mod = sys.modules.get("vllm._aiter_ops", _ABSENT)
        saved_ws = ops.current_workspace_manager
        ws = _PoisonedWorkspace()
        ws.device = device
        try:
            sys.modules["vllm._aiter_ops"] = _module("vllm._aiter_ops", rocm_aiter_ops=_no_aiter_ops())
            ops.current_workspace_manager = lambda: ws
            yield
        finally:
            ops.current_workspace_manager = saved_ws
            if saved_mod is _ABSENT:
                sys.modules.pop("vllm._aiter_ops", None)
            else:
                sys.modules["vllm._aiter_ops"] = saved_mod

    def _fp8(t):
        return t.view(ops.FP8_DTYPE) if t.dtype == torch.uint8 else t

    def _native_fnuz_unavailable() -> None:
        native_fnuz_unavailable(tgt, "paged-logits Triton kernel loads the indexer cache")

    def _run(fn, q, out, *args, **kw):
        def call():
            with environment(q.device):
                return fn(*args, **kw)

        res = ctx.call(call)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def _paged_args(q, kv_cache, weights, context_lens, block_tables, max_model_len):
        cache4 = kv_cache.unsqueeze(-2) if kv_cache.dim() == 3 else kv_cache
        return (_fp8(q), cache4, weights, context_lens, block_tables)

    def fp8_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, layout=None,
                             out=None, target=None):
        _check_target(target)
        lay = default_indexer_layout(int(kv_cache.shape[1])) if layout is None else layout
        if lay not in RATIO_FOR_LAYOUT:
            raise ValueError(f"layout: expected None, 'normal' or 'shuffle', got {layout!r}")
        bs = int(kv_cache.shape[1])
        if lay == "normal" and bs > 1 and bs % 64 == 0 and tgt.name in ("gfx942", "gfx950"):
            _native_fnuz_unavailable()  # the dispatcher's Triton path (the module docstring)
        args = _paged_args(q, kv_cache, weights, context_lens, block_tables, max_model_len)
        return _run(ops.rocm_fp8_paged_mqa_logits, q, out, *args, None, max_model_len,
                    compress_ratio=RATIO_FOR_LAYOUT[lay])

    def fp8_paged_mqa_logits_triton(q, kv_cache, weights, context_lens, block_tables, max_model_len, *,
                                    layout=None, out=None, target=None):
        _check_target(target)
        _native_fnuz_unavailable()
        args = _paged_args(q, kv_cache, weights, context_lens, block_tables, max_model_len)
        return _run(ops.rocm_fp8_paged_mqa_logits_triton, q, out, *args, max_model_len)

    def fp8_paged_mqa_logits_torch(q, kv_cache, weights, context_lens, block_tables, max_model_len, *,
                                   layout=None, out=None, target=None):
        _check_target(target)
        args = _paged_args(q, kv_cache, weights, context_lens, block_tables, max_model_len)
        return _run(ops.fp8_paged_mqa_logits_torch, q, out, *args, max_model_len)

    def fp8_mqa_logits(q, k_fp8, k_scale, weights, ks, ke, *, out=None, target=None):
        _check_target(target)
        if k_scale.dtype == torch.uint8:
            k_scale = k_scale.view(torch.float32)
        return _run(ops.rocm_fp8_mqa_logits, q, out, _fp8(q), (_fp8(k_fp8), k_scale), weights, ks, ke)

    def triton_launcher(q, kv_cache, weights, context_lens, block_tables, max_model_len, *, target=None):
        """A zero-argument call of upstream's ``rocm_fp8_paged_mqa_logits_triton`` on these arguments, for timing on
        a native host: the workspace is one buffer made here (upstream's workspace manager hands out the same one
        each step), so the call is upstream's host function and kernel and nothing else."""
        _check_target(target)
        if triton_mode() != "native":
            raise SubjectUnavailable("the direct launcher is for native hosts; under the interpreter upstream's "
                                     "code runs through the entry point (with its corrections)")
        _native_fnuz_unavailable()
        rows = int(q.shape[0]) * int(q.shape[1])
        buf = torch.empty(rows, max_model_len, dtype=torch.float32, device=q.device)

        class _Fixed:
            def get_simultaneous(self, *specs):
                return [buf]

        ops.current_workspace_manager = lambda: _Fixed()  # this binding's import only; the timing owns it
        args = _paged_args(q, kv_cache, weights, context_lens, block_tables, max_model_len)
        fn = ops.rocm_fp8_paged_mqa_logits_triton
        return lambda: fn(*args, max_model_len)

    def topk_indices(logits, k, *, out=None):
        raise EntryMissing("indexer_logits.topk_indices", TOPK_MISSING)

    def topk_indices_prefill(logits, ks, ke, k, *, out=None):
        raise EntryMissing("indexer_logits.topk_indices_prefill", TOPK_MISSING)

    return Family("indexer_logits", fp8_paged_mqa_logits=fp8_paged_mqa_logits,
                  fp8_paged_mqa_logits_triton=fp8_paged_mqa_logits_triton,
                  fp8_paged_mqa_logits_torch=fp8_paged_mqa_logits_torch, fp8_mqa_logits=fp8_mqa_logits,
                  topk_indices=topk_indices, topk_indices_prefill=topk_indices_prefill,
                  triton_launcher=triton_launcher)
