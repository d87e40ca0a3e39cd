"""The compressor (extra-cache writer): upstream's single-pass launcher ``compress_norm_rope_store_triton`` and its
two-stage dispatch ``compress_norm_rope_store_two_stage_triton``, called with our arguments.

Our inputs map onto upstream's call one to one (SPEC 4): the state is the compressor's state cache (rows
``[kv | score]``, the score half at ``STATE_WIDTH`` = 1024 for ratio 4 and 512 for ratio 128, as ours); the state
block table and its block size; our slot mapping is both upstream's state-side ``slot_mapping`` and the cache's
``k_cache_metadata.slot_mapping`` (a token writes when it is >= 0); the norm weight and the cos/sin table
(cos 0:32, sin 32:64, row (pos // ratio) * ratio) are passed as they are; the cache view goes in as ``kv_cache``
(its ``shape[1]`` is the block size, its ``stride(0)`` the block stride). Our ``two_stage=True`` runs every token
through upstream's two-stage path (``num_decode_tokens=0``: all of them are prefill tokens there).

Upstream's split count reads the GPU's CU count (``_n_cu``); the adapter pins it to the target's, the way the
decode selectors are pinned. Our ``splits`` argument forces upstream's count for the call (upstream splits the head
dimension, 512 / splits columns per program, where ours splits the window's rows; any power of two up to 16 is a
valid count for both).

``intermediates`` (our fp32 rows: the normed row, its RoPE lanes rotated, before any bf16 rounding or clearing) are
not stored by upstream's kernels; under the Triton interpreter they are read from the kernel's own frame when it
returns (:class:`RowObserver`: the locals ``normed``, ``new_even`` and ``new_odd``), without touching its source.
Natively they cannot be observed and a call asking for them is :class:`SubjectUnavailable`.
"""
from __future__ import annotations

import contextlib
import sys
import threading
from types import SimpleNamespace

import numpy as np
import torch

from contracts.subjects.base import Family, SubjectUnavailable
from contracts.subjects.vllm.adapters import needs
from impl.runtime import triton_mode
from impl.targets import effective_cu_count, get_target

HEAD = 512
ROPE = 64
NOPE = HEAD - ROPE
#: the kernels whose frames hold a token's fp32 row (single pass; two-stage finalizer)
ROW_KERNELS = ("_fused_kv_compress_norm_rope_insert_sparse_attn", "_finalize_norm_rope_quant_store_sparse_attn")

_PATCH_LOCK = threading.RLock()


def _array(x) -> np.ndarray:
    """An interpreter tensor's values (a Python scalar or numpy array otherwise)."""
    handle = getattr(x, "handle", None)
    data = getattr(handle, "data", x)
    return np.asarray(data)


class RowObserver:
    """Under the interpreter, records each writing token's fp32 row as upstream's kernel computed it: while active,
    a trace function watches only the frames of :data:`ROW_KERNELS` and, when one returns after computing
    ``normed``, stores ``normed[:448]`` and the rotated RoPE pairs (``new_even``/``new_odd``, before the SANITIZE
    clearing and the bf16 cast) interleaved into row ``token_idx + offset`` of ``rows``."""

    def __init__(self, rows: torch.Tensor, offset: int = 0):
        self.rows = rows
        self.offset = offset
        self.seen: list[int] = []

    def _local(self, frame, event, arg):
        if event == "return":
            loc = frame.f_locals
            if "normed" in loc and "new_even" in loc and "new_odd" in loc:
                t = int(_array(loc["token_idx"]).reshape(-1)[0]) + self.offset
                normed = _array(loc["normed"]).astype(np.float32).reshape(-1)
                ev = _array(loc["new_even"]).astype(np.float32).reshape(-1)
                od = _array(loc["new_odd"]).astype(np.float32).reshape(-1)
                row = normed[:HEAD].copy()
                row[NOPE::2] = ev[NOPE // 2:HEAD // 2]
                row[NOPE + 1::2] = od[NOPE // 2:HEAD // 2]
                self.rows[t] = torch.from_numpy(row)
                self.seen.append(t)
        return self._local

    def _global(self, frame, event, arg):
        if frame.f_code.co_name in ROW_KERNELS:
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


@contextlib.contextmanager
def _patched(module, **attrs):
    with _PATCH_LOCK:
        saved = {k: module.__dict__[k] for k in attrs}
        module.__dict__.update(attrs)
        try:
            yield
        finally:
            module.__dict__.update(saved)


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "compress": [
        "_pick_compress_num_splits", "compress_norm_rope_store_triton", "compress_norm_rope_store_two_stage_triton",
    ],
}, since={
    "compress._pick_compress_num_splits": "0.26.0", "compress.compress_norm_rope_store_two_stage_triton": "0.26.0",
})


def build(ctx) -> Family:
    comp = ctx["compress"]
    tgt = ctx.target

    def _cu():
        return int(effective_cu_count(tgt))

    def num_two_stage_splits(num_tokens: int, ratio: int, target=None) -> int:
        """Upstream's ``_pick_compress_num_splits`` with the target's CU count (``num_tokens``: the prefill
        tokens of the call)."""
        _same_target(target)
        with _patched(comp, _n_cu=_cu):
            return int(ctx.call(comp._pick_compress_num_splits, int(num_tokens), int(ratio), HEAD))

    def compress_norm_rope_store(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight,
                                 cos_sin_cache, cache, *, ratio: int, eps: float = 1e-6, target=None,
                                 two_stage: bool = False, intermediates=None, splits=None) -> None:
        _same_target(target)
        if two_stage and ratio < 128:
            raise ValueError(f"two_stage: upstream's two-stage path is for ratio >= 128 (no overlap), got {ratio}")
        if splits is not None and not two_stage:
            raise ValueError("splits: only meaningful with two_stage=True")
        T = int(positions.shape[0])
        if T == 0:
            return
        overlap = ratio == 4
        common = dict(
            state_cache=state, num_actual=T, token_to_req_indices=token_to_req, positions=positions,
            slot_mapping=slot_mapping, block_table=state_block_table, block_size=int(state.shape[1]),
            state_width=HEAD * (1 + overlap), cos_sin_cache=cos_sin_cache, kv_cache=cache,
            k_cache_metadata=SimpleNamespace(slot_mapping=slot_mapping), pdl_kwargs={}, head_dim=HEAD,
            rope_head_dim=ROPE, compress_ratio=int(ratio), overlap=overlap, use_fp4_cache=False,
            rms_norm_weight=norm_weight, rms_norm_eps=float(eps), quant_block=64, token_stride=576, scale_dim=8)
        observer = None
        if intermediates is not None:
            if triton_mode() != "interpreter":
                raise SubjectUnavailable("upstream's compressor keeps its fp32 rows in registers; the adapter reads "
                                         "them from the kernel's frames, which only the Triton interpreter has")
            observer = RowObserver(intermediates)
        with observer.watching() if observer else contextlib.nullcontext():
            if not two_stage:
                ctx.call(comp.compress_norm_rope_store_triton, **common)
                return
            scratch = torch.full((T, HEAD), float("nan"), dtype=torch.float32, device=positions.device)
            patch = {"_n_cu": _cu}
            if splits is not None:
                patch["_pick_compress_num_splits"] = lambda num_actual, compress_ratio, head_dim: int(splits)
            with _patched(comp, **patch):
                ctx.call(comp.compress_norm_rope_store_two_stage_triton, **common, num_decode_tokens=0,
                         compress_scratch=scratch)

    def _same_target(target):
        if target is not None and get_target(target).name != tgt.name:
            raise ValueError(f"target: this binding of the subject is for {tgt.name}, got {get_target(target).name}")

    return Family("compressor", compress_norm_rope_store=compress_norm_rope_store,
                  num_two_stage_splits=num_two_stage_splits)
