"""Sparse prefill: upstream's ``rocm_sparse_attn_prefill`` with its OPUS guard, OPUS route and Triton fallback,
behind our ``impl.prefill`` API.

Entries (our signatures, upstream's code):

- ``sparse_attn_prefill(q, kv, indices, softmax_scale, attn_sink, out, *, topk_length, indptr, rope_head_dim,
  target)`` calls ``rocm_sparse_attn_prefill`` with the arguments its callers pass: kv as ``[skv, 1, d]`` (a 2-D kv
  is viewed so), dense indices with ``topk_length`` or ragged ones as ``ragged_indices`` / ``ragged_indptr``, the
  head dim split as ``d - rope_head_dim`` + ``rope_head_dim``. A missing ``out`` is allocated like q (upstream's
  entry requires one).
- ``can_use_aiter_sparse_prefill_opus(q, kv, attn_sink, out, *, target)``: ``_can_use_aiter_sparse_prefill_opus``
  with the arch flag its import bound for this target (the ``target`` argument is this binding's own).
- ``get_aiter_sparse_prefill_opus()``: ``_get_aiter_sparse_prefill_opus`` (its ``functools.cache`` cleared per
  call) in an AITER environment the adapter fakes; by default the one of a host without AMD AITER, where it gives
  None.
- ``sparse_attn_prefill_triton(q, kv2, indices, indptr, softmax_scale, attn_sink, out, rope_head_dim, *,
  topk_length)``: ``_rocm_sparse_attn_prefill_ragged_triton``; with ``indptr`` None (dense ``[sq, k]`` indices and
  their lengths) upstream's dense Triton entry ``_rocm_sparse_attn_prefill_triton``, which converts the rows with
  ``build_ragged_indices_from_dense`` and runs the same ragged kernel (0.33.0 has no kernel reading dense rows).
  Upstream's kernels store into an ``out`` of any float dtype, converting on store, as ours do.
- ``can_use_aiter_pa_prefill_sparse(q, kv, *, target)`` (vLLM 0.34.0 on): ``_can_use_aiter_pa_prefill_sparse``, the
  gfx942 AITER route's guard, with the CDNA version the stand-ins serve for this target and AITER's MLA switch on
  (the route's environment; with it off the guard is false everywhere, as on a host without AITER).
- ``get_aiter_pa_prefill_sparse()`` (0.34.0 on): the op upstream's route imports
  (``aiter.ops.triton.attention.pa_prefill_sparse``), as a host without AMD AITER offers it: None. Upstream has no
  loader for it (the route imports the op unconditionally once its guard holds); this entry is the seam below.
  On a release without the route (0.33.0) both entries, and any call that replaces them, end the row ``skipped``
  naming ``_can_use_aiter_pa_prefill_sparse`` (``NEEDS``, checked per entry: the rest of the family runs).

Routing seams. A contract replaces one of the three helpers above on this family (``mock.patch.object``), exactly
as it does on ``impl.prefill`` for ours; while ``sparse_attn_prefill`` runs, upstream's own module-level name is then
pointed at a shim that calls the replacement with our arguments (upstream's entry looks them up at call time, as
upstream's monkeypatched routing tests rely on). A replaced ``get_aiter_sparse_prefill_opus`` is not called in
upstream's place: the op it returns (or None) only decides the fake AITER environment - ``vllm._aiter_ops``'s
``rocm_aiter_ops.is_mla_enabled()`` true and ``aiter.ops.pa_sparse_prefill_opus`` offering that op, or no such
module - so upstream's real loader runs and finds it. A replaced ``get_aiter_pa_prefill_sparse`` likewise only
decides the environment of the gfx942 route: AITER's MLA switch on, and ``aiter.ops.triton.attention.pa_prefill_sparse``
offering the op it returns, or (None) no such module, so upstream's own import statement finds it or raises
ImportError. Nothing is patched outside a call.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import sys
import threading
import types

import torch

from contracts.subjects.base import Family, FidelityError
from contracts.subjects.vllm.loader import REWRITES, Rewrite, register_rewrite
from contracts.subjects.vllm.adapters import check_needs, needs

OPS_FILE = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the module and name upstream's loader imports the OPUS op from
AITER_OPUS_MODULE = "aiter.ops.pa_sparse_prefill_opus"
AITER_OPUS_NAME = "pa_sparse_prefill_opus"
#: the module and name upstream's gfx942 route (0.34.0 on) imports its op from
AITER_PA_MODULE = "aiter.ops.triton.attention.pa_prefill_sparse"
AITER_PA_NAME = "pa_prefill_sparse"
#: the route the needs tagged with it belong to (checked when one of its entries runs, not when the family binds)
PA_ROUTE = "aiter_pa_prefill_sparse"

_HOST_ASSERT = "    assert not q.is_cpu and not kv.is_cpu and not indices.is_cpu and not indptr.is_cpu\n"


def _register_host_assert_rewrite() -> None:
    """The ragged host wrappers (prefill's and the bf16 decode's, the same line twice) refuse CPU tensors; under
    the Triton interpreter every tensor is on the CPU. One rewrite per find text: where another adapter already
    registered this line, its rewrite (and id) serves both."""
    if any(r.path == OPS_FILE and r.find == _HOST_ASSERT for r in REWRITES):
        return
    register_rewrite(Rewrite(
        "ops-ragged-host-cpu-assert", OPS_FILE, _HOST_ASSERT,
        "    pass  # smv: CPU tensors allowed under the Triton interpreter\n",
        "the ragged host wrappers assert that q, kv, indices and indptr are not CPU tensors; under the Triton "
        "interpreter every tensor is, so the assert (one line each, nothing else) is replaced by a no-op",
        when="interpreter"))


_register_host_assert_rewrite()


class _Depth(threading.local):
    n = 0


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code. The gfx942
#: AITER route's guard (0.34.0) is checked only by that route's entries (entry=PA_ROUTE), so an older release
#: skips their rows and runs the rest of the family
NEEDS = needs({
    "ops": [
        "_can_use_aiter_sparse_prefill_opus", "_get_aiter_sparse_prefill_opus",
        "_rocm_sparse_attn_prefill_ragged_triton", "_rocm_sparse_attn_prefill_triton", "rocm_sparse_attn_prefill",
        "_can_use_aiter_pa_prefill_sparse",
    ],
}, since={"ops._can_use_aiter_sparse_prefill_opus": "0.30.0", "ops._get_aiter_sparse_prefill_opus": "0.30.0",
          "ops._can_use_aiter_pa_prefill_sparse": "0.34.0"},
    entry={"ops._can_use_aiter_pa_prefill_sparse": PA_ROUTE})


def build(ctx) -> Family:
    ops = ctx["ops"]
    orig_entry = ops.rocm_sparse_attn_prefill
    orig_guard = ops._can_use_aiter_sparse_prefill_opus
    orig_loader = ops._get_aiter_sparse_prefill_opus
    orig_ragged = ops._rocm_sparse_attn_prefill_ragged_triton
    orig_dense = ops._rocm_sparse_attn_prefill_triton
    depth = _Depth()
    missing_rewrite = _host_assert_missing(ctx)

    def run(fn, *args, **kw):
        """``ctx.call`` once: a helper called from inside a running entry (a seam) runs as it is."""
        if depth.n:
            return fn(*args, **kw)
        depth.n += 1
        try:
            return ctx.call(fn, *args, **kw)
        finally:
            depth.n -= 1

    @contextlib.contextmanager
    def aiter_env(op, *, mla=None, pa_op=None):
        """Fake AITER for upstream's loader and the gfx942 route: with ``op``, the OPUS op importable; with
        ``pa_op``, ``pa_prefill_sparse`` importable; a missing one's module is absent (its import raises
        ImportError, as on a host without it). AITER's MLA switch is ``mla`` (None: on exactly when ``op`` is
        given, what the OPUS seam has always meant)."""
        names = ("vllm._aiter_ops", "aiter", "aiter.ops", AITER_OPUS_MODULE, "aiter.ops.triton",
                 "aiter.ops.triton.attention", AITER_PA_MODULE)
        saved = {n: sys.modules.get(n, _ABSENT) for n in names}
        try:
            sys.modules["vllm._aiter_ops"] = _module(
                "vllm._aiter_ops", rocm_aiter_ops=_aiter_ops(mla_enabled=op is not None if mla is None else mla))
            if op is not None or pa_op is not None:
                sys.modules["aiter"] = _module("aiter")
                sys.modules["aiter.ops"] = _module("aiter.ops")
            if op is None:
                sys.modules[AITER_OPUS_MODULE] = None  # import raises ImportError, as on a host without AITER
            else:
                sys.modules[AITER_OPUS_MODULE] = _module(AITER_OPUS_MODULE, **{AITER_OPUS_NAME: op})
            if pa_op is None:
                sys.modules[AITER_PA_MODULE] = None
            else:
                sys.modules["aiter.ops.triton"] = _module("aiter.ops.triton")
                sys.modules["aiter.ops.triton.attention"] = _module("aiter.ops.triton.attention")
                sys.modules[AITER_PA_MODULE] = _module(AITER_PA_MODULE, **{AITER_PA_NAME: pa_op})
            orig_loader.cache_clear()
            yield
        finally:
            orig_loader.cache_clear()
            for n, m in saved.items():
                if m is _ABSENT:
                    sys.modules.pop(n, None)
                else:
                    sys.modules[n] = m

    # --- the helpers, as upstream has them ---

    def can_use_aiter_sparse_prefill_opus(q, kv, attn_sink, out, *, target=None):
        return bool(run(orig_guard, q, kv, attn_sink, out))

    def get_aiter_sparse_prefill_opus():
        def call():
            with aiter_env(None):
                return orig_loader()
        return run(call)

    def sparse_attn_prefill_triton(q, kv2, indices, indptr, softmax_scale, attn_sink, out, rope_head_dim, *,
                                   topk_length=None):
        if missing_rewrite:
            raise FidelityError(missing_rewrite)
        d = int(q.shape[-1])
        if indptr is None:
            run(orig_dense, q, kv2, indices, float(softmax_scale), attn_sink, d - rope_head_dim, rope_head_dim,
                topk_length=topk_length, out=out)
            return
        run(orig_ragged, q, kv2, indices, indptr, float(softmax_scale), attn_sink, d - rope_head_dim,
            rope_head_dim, out)

    # --- the gfx942 AITER route (0.34.0 on): its needs are checked here, per call, not when the family binds ---

    pa_guard = {}

    def orig_pa_guard():
        """Upstream's ``_can_use_aiter_pa_prefill_sparse`` (SymbolTooNew / SymbolMissing where the tree has none),
        looked up once, before any call could point the name at a shim."""
        if "fn" not in pa_guard:
            check_needs(ctx, "prefill", NEEDS, entry=PA_ROUTE)
            pa_guard["fn"] = ops._can_use_aiter_pa_prefill_sparse
        return pa_guard["fn"]

    def can_use_aiter_pa_prefill_sparse(q, kv, *, target=None):
        guard = orig_pa_guard()

        def call():
            with aiter_env(None, mla=True):
                return guard(q, kv)
        return bool(run(call))

    def get_aiter_pa_prefill_sparse():
        orig_pa_guard()

        def call():
            with aiter_env(None):
                try:
                    mod = importlib.import_module(AITER_PA_MODULE)
                except ImportError:
                    return None
                return getattr(mod, AITER_PA_NAME, None)
        return run(call)

    originals = {"can_use_aiter_sparse_prefill_opus": can_use_aiter_sparse_prefill_opus,
                 "get_aiter_sparse_prefill_opus": get_aiter_sparse_prefill_opus,
                 "sparse_attn_prefill_triton": sparse_attn_prefill_triton,
                 "can_use_aiter_pa_prefill_sparse": can_use_aiter_pa_prefill_sparse,
                 "get_aiter_pa_prefill_sparse": get_aiter_pa_prefill_sparse}

    # --- shims: upstream's names pointed at a replaced helper for one call ---

    def guard_shim(q, kv, attn_sink, output, on_gfx950=None):
        return fam.can_use_aiter_sparse_prefill_opus(q, kv, attn_sink, output, target=ctx.target)

    def pa_guard_shim(q, kv):
        return fam.can_use_aiter_pa_prefill_sparse(q, kv, target=ctx.target)

    def ragged_shim(q, kv, indices, indptr, scale, attn_sink, nope_head_dim, rope_head_dim, out=None):
        if out is None:
            out = torch.empty_like(q)
        fam.sparse_attn_prefill_triton(q, kv, indices, indptr, scale, attn_sink, out, rope_head_dim)
        return out

    def sparse_attn_prefill(q, kv, indices, softmax_scale, attn_sink=None, out=None, *, topk_length=None,
                            indptr=None, rope_head_dim=64, target=None):
        if missing_rewrite:
            raise FidelityError(missing_rewrite)
        d = int(q.shape[-1])
        kv3 = kv.unsqueeze(1) if kv.dim() == 2 else kv
        if out is None:
            out = torch.empty_like(q)
        replaced = {k: getattr(fam, k) is not v for k, v in originals.items()}
        op = fam.get_aiter_sparse_prefill_opus() if replaced["get_aiter_sparse_prefill_opus"] else None
        patches = {}
        if replaced["can_use_aiter_sparse_prefill_opus"]:
            patches["_can_use_aiter_sparse_prefill_opus"] = guard_shim
        env = {}
        if replaced["can_use_aiter_pa_prefill_sparse"] or replaced["get_aiter_pa_prefill_sparse"]:
            orig_pa_guard()  # a release without the route skips here, naming the guard it lacks
        if replaced["can_use_aiter_pa_prefill_sparse"]:
            patches["_can_use_aiter_pa_prefill_sparse"] = pa_guard_shim
        if replaced["get_aiter_pa_prefill_sparse"]:
            # the route's environment: MLA on, the op (or no module) as the replacement says
            env = dict(mla=True, pa_op=fam.get_aiter_pa_prefill_sparse())
        if replaced["sparse_attn_prefill_triton"]:
            patches["_rocm_sparse_attn_prefill_ragged_triton"] = ragged_shim
        if indptr is not None:
            args = dict(indices=None, topk_length=None, ragged_indices=indices, ragged_indptr=indptr)
        else:
            args = dict(indices=indices, topk_length=topk_length)

        def call():
            saved = {k: getattr(ops, k) for k in patches}
            try:
                for k, v in patches.items():
                    setattr(ops, k, v)
                with aiter_env(op, **env):
                    orig_entry(q=q, kv=kv3, scale=float(softmax_scale), head_dim=d, nope_head_dim=d - rope_head_dim,
                               rope_head_dim=rope_head_dim, attn_sink=attn_sink, output=out, **args)
            finally:
                for k, v in saved.items():
                    setattr(ops, k, v)

        run(call)
        return out

    fam = Family("prefill", sparse_attn_prefill=sparse_attn_prefill, **originals)
    return fam


_ABSENT = object()


def _host_assert_missing(ctx) -> str:
    """Why upstream's ragged host wrapper cannot run in this binding ('' when it can): under the interpreter its
    CPU assert must have been rewritten when this target's modules were imported."""
    from contracts.subjects import fidelity

    if not fidelity.interpreting():
        return ""
    ids = {r.id for r in REWRITES if r.path == OPS_FILE and r.find == _HOST_ASSERT}
    if any(rw.get("id") in ids and rw.get("file") == OPS_FILE for rw in ctx.loaded.rewrites):
        return ""
    return (f"{OPS_FILE} was imported for {ctx.target.name} without the rewrite {'/'.join(sorted(ids))} (the "
            f"ragged host wrappers' CPU assert): the subject was bound before the prefill adapter registered it")


def _module(name: str, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    m.__path__ = []
    m.__dict__.update(attrs)
    return m


def _aiter_ops(*, mla_enabled: bool):
    class rocm_aiter_ops:  # noqa: N801 - upstream's name
        """vLLM's AITER switchboard as upstream's OPUS loader reads it."""

        @staticmethod
        def is_mla_enabled() -> bool:
            return mla_enabled

    return rocm_aiter_ops
