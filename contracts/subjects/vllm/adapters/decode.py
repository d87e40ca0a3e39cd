"""Decode, plan and reduce: upstream's ``rocm_sparse_attn_decode`` and its kernels, behind our API.

- ``sparse_attn_decode`` (our signature, ragged indices) calls upstream's public ``rocm_sparse_attn_decode`` with
  the ragged SWA indices as ``swa_ragged_*`` and the extra ones as ``topk_ragged_*`` (so its dense -> ragged builder
  is not on this path; the builder's own contracts judge it). The CU count is pinned as upstream's tests pin it
  (``ops._decode_cu_count``). Our API can *freeze a plan* (split count, adaptive splits, ONE_WAVE) and own the
  split-K workspace; upstream derives both inside its wrapper. For a frozen plan the adapter lets the wrapper run as
  it is and intervenes only at its launches: the selectors return the plan's split count, and the launch arguments
  that carry the plan (``NUM_SPLITS`` is already the selector's answer; ``ADAPTIVE_SPLITS``, ``ONE_WAVE_SPLITS``)
  and the workspace pointers (``part_m``, ``part_l``, ``part_acc``, laid out as the wrapper allocates them) are
  replaced by ours. Nothing else of the wrapper or the kernels changes.
- ``plan_decode`` runs the same wrapper on ``meta`` tensors of the right sizes with every kernel launch recorded
  instead of run, and reads the plan off the recorded launches (the partial's grid and ``NUM_SPLITS``,
  ``ADAPTIVE_SPLITS``, ``ONE_WAVE_SPLITS``; the fallback kernel means the generic family): the plan upstream's own
  host code makes, with no device work.
- ``decode_reduce`` launches upstream's ``_sparse_attn_decode_reduce_kernel`` over given partials with the
  arguments the wrapper gives it (no epilogue).
- ``DecodePlan`` / ``DecodeWorkspace`` are our API's data types, shared with ours.

Natively on NVIDIA, FNUZ fp8 does not exist: a gfx942 decode (its main cache is FNUZ) is ``SubjectUnavailable``.
So is a decode for a target of the bound one's name with another decode family (a twin such as the generic kernel
under gfx942's flavours): upstream picks its kernel from the arch flags, so that path does not exist in it.
Under the interpreter the wrapper's ``assert not q.is_cpu ...`` is the named rewrite
``decode-host-accepts-cpu-tensors`` (a target imported before this module registered it gets a fresh import
that has it).
"""
from __future__ import annotations

import contextlib
from unittest import mock

import torch

from contracts.subjects.vllm.adapters import native_fnuz_unavailable
from contracts.subjects.base import Family, SubjectUnavailable
from contracts.subjects.vllm.adapters.splits import pinned_cu
from contracts.subjects.vllm.loader import Rewrite, register_rewrite
from contracts.subjects.vllm.adapters import needs
from impl import formats
from impl.decode import DecodePlan, DecodeWorkspace
from impl.runtime import triton_mode
from impl.targets import effective_cu_count, get_target

OPS_PATH = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"

HOST_CPU_REWRITE = register_rewrite(Rewrite(
    id="decode-host-accepts-cpu-tensors",
    path=OPS_PATH,
    find=("        not q.is_cpu\n        and not main_cache.is_cpu\n        and not main_indices.is_cpu\n"
          "        and not main_indptr.is_cpu\n"),
    replace=("        True  # smv: the Triton interpreter runs kernels on CPU tensors\n"
             "        or not main_cache.is_cpu\n        or not main_indices.is_cpu\n        or not main_indptr.is_cpu\n"),
    why="the split-K decode wrapper asserts its inputs are not CPU tensors; under the Triton interpreter they are",
    when="interpreter",
))

#: upstream's decode kernels by our family name, and the reduce
PARTIAL_KERNELS = {"generic": "_sparse_attn_decode_ragged_kernel", "gfx942": "_sparse_attn_decode_partial_kernel",
                   "gfx950": "_sparse_attn_decode_gfx950_partial_kernel"}
REDUCE_KERNEL = "_sparse_attn_decode_reduce_kernel"
_FAMILY_OF = {v: k for k, v in PARTIAL_KERNELS.items()}
#: positions of part_m, part_l, part_acc in the split-K partials' and the reduce's argument lists
_PARTIAL_WS_ARGS = (7, 8, 9)
_REDUCE_WS_ARGS = (0, 1, 2)
HEAD_DIM = formats.DSV4_HEAD_DIM
NOPE_DIM = formats.DSV4_NOPE_DIM
ROPE_DIM = formats.DSV4_ROPE_DIM
DEFAULT_SCALE = HEAD_DIM ** -0.5


class _Launches:
    """Stands in for upstream's decode kernels during one wrapper call: each launch is recorded as
    ``(kernel name, grid, args, kwargs)``, passed through ``edit`` and, when ``run``, launched on the real kernel."""

    def __init__(self, ops, *, run: bool, edit=None):
        self.ops = ops
        self.run = run
        self.edit = edit
        self.records: list = []

    @contextlib.contextmanager
    def installed(self):
        with contextlib.ExitStack() as stack:
            for name in (*PARTIAL_KERNELS.values(), REDUCE_KERNEL):
                stack.enter_context(mock.patch.object(self.ops, name, _KernelProxy(self, name,
                                                                                   getattr(self.ops, name))))
            yield self

    def kernel(self, name: str):
        return [r for r in self.records if r[0] == name]


class _KernelProxy:
    def __init__(self, owner: _Launches, name: str, real):
        self.owner, self.name, self.real = owner, name, real

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            args, kwargs = list(args), dict(kwargs)
            if self.owner.edit is not None:
                args, kwargs = self.owner.edit(self.name, grid, args, kwargs)
            self.owner.records.append((self.name, tuple(grid), args, kwargs))
            if self.owner.run:
                self.real[grid](*args, **kwargs)
        return launch


def _no_twin_path(given, bound) -> None:
    """A target of the bound one's name with another decode family (a twin, e.g. contracts.metamorphic's generic
    kernel under gfx942's fp8 flavours) asks for a path upstream does not have: its wrapper picks the kernel from
    the arch flags alone (the single-kernel fallback only when neither ``_ON_GFX942`` nor ``_ON_GFX950`` is set,
    and then with the platform's fp8 flavour), so this import can run only the bound target's own family."""
    if given is None or not isinstance(given, type(bound)):
        return
    if given.decode_family != bound.decode_family:
        raise SubjectUnavailable(
            f"no {given.decode_family} decode path on {bound.name} ({given.main_cache_fp8}/{given.extra_cache_fp8} "
            f"caches): upstream's rocm_sparse_attn_decode picks its kernel from the arch flags, and with "
            f"{bound.name}'s set it runs the {bound.decode_family} family only")


def _native_fnuz_unavailable(target) -> None:
    native_fnuz_unavailable(target, "decode reads its main (SWA) cache")


def _with_host_rewrite(ctx):
    """``ctx``, or, when this target was imported before this module registered its rewrite and the host needs it
    (the interpreter), a context over a fresh import of upstream's modules that has it (listed in the report like
    every rewrite)."""
    from contracts.subjects import fidelity
    from contracts.subjects.vllm.context import BoundContext

    needed = any(rw.id == HOST_CPU_REWRITE.id for rw in fidelity.rewrites_for_host())
    if not needed or any(rw["id"] == HOST_CPU_REWRITE.id for rw in ctx.loaded.rewrites):
        return ctx
    t = ctx.target
    fp8 = torch.float8_e4m3fnuz if t.main_cache_fp8 == "fnuz" else torch.float8_e4m3fn
    loaded = ctx.subject.tree.load(t.name, fp8, t.cu_count, rewrites=fidelity.rewrites_for_host())
    for rw in loaded.rewrites:
        if all(r["id"] != rw["id"] for r in ctx.subject.rewrites):
            ctx.subject.rewrites.append(rw)
    return BoundContext(ctx.subject, t, loaded)


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["_sparse_attn_decode_reduce_kernel", "rocm_sparse_attn_decode"],
}, since={"ops._sparse_attn_decode_reduce_kernel": "0.24.0"})


def build(ctx) -> Family:
    ctx = _with_host_rewrite(ctx)
    ops = ctx["ops"]
    target = ctx.target

    def _check_target(t):
        if t is not None and get_target(t).name != target.name:
            raise ValueError(f"target: this subject is bound to {target.name}, got {get_target(t).name}")

    def _cu(cu_count):
        return effective_cu_count(target) if cu_count is None else cu_count

    # --- the plan, read off upstream's own host code ---------------------------------------------------------
    def plan_decode(t, batch, num_heads, main_numel, extra_numel=0, *, adaptive_splits=False, cu_count=None):
        _check_target(t)
        meta = "meta"
        q = torch.empty(batch, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=meta)
        cache = torch.empty(1, 1, formats.DSV4_TOKEN_BYTES, dtype=torch.uint8, device=meta)
        mi = torch.empty(main_numel, dtype=torch.int32, device=meta)
        ptr = torch.empty(batch + 1, dtype=torch.int32, device=meta)
        has_extra = extra_numel > 0
        ei = torch.empty(extra_numel, dtype=torch.int32, device=meta) if has_extra else None
        out = torch.empty(batch, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=meta)
        rec = _Launches(ops, run=False)

        def run():
            with pinned_cu(ops, _cu(cu_count)), rec.installed():
                _call_public(ops, q, cache, mi, ptr, cache if has_extra else None, ei, ptr if has_extra else None,
                             None, DEFAULT_SCALE, out, False, adaptive_splits)

        ctx.call(run)
        return plan_from_launches(rec)

    # --- the decode ----------------------------------------------------------------------------------------
    def sparse_attn_decode(q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None,
                           extra_indptr=None, *, attn_sink=None, softmax_scale=None, target=None,
                           adaptive_splits=False, trust_extra_nan_free=False, cu_count=None, plan=None,
                           workspace=None, out=None, check_indptr=True):
        _check_target(target)
        _no_twin_path(target, ctx.target)
        _native_fnuz_unavailable(ctx.target)
        batch, num_heads = int(q.shape[0]), int(q.shape[1])
        if out is None:
            out = torch.empty(batch, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=q.device)
        scale = DEFAULT_SCALE if softmax_scale is None else float(softmax_scale)
        has_extra = extra_cache is not None
        edit = None
        patches = contextlib.ExitStack()
        if plan is not None:
            if plan.family != ctx.target.decode_family:
                raise ValueError(f"plan: family {plan.family!r} does not match target {ctx.target.name}")
            adaptive_splits = bool(plan.adaptive)
            edit = _plan_editor(plan, workspace)
            for name in ("_decode_num_splits", "_decode_gfx950_num_splits"):
                patches.enter_context(mock.patch.object(ops, name, lambda *a, _s=plan.num_splits, **k: _s))
        elif workspace is not None:
            edit = _plan_editor(None, workspace)
        rec = _Launches(ops, run=True, edit=edit)

        def run():
            with patches, pinned_cu(ops, _cu(cu_count)), rec.installed():
                _call_public(ops, q, main_cache, main_indices, main_indptr, extra_cache if has_extra else None,
                             extra_indices if has_extra else None, extra_indptr if has_extra else None, attn_sink,
                             scale, out, trust_extra_nan_free, adaptive_splits)

        ctx.call(run)
        return out

    # --- the reduce alone ------------------------------------------------------------------------------------
    def reduce_launch(workspace, *, attn_sink=None, adaptive=False, out=None):
        """(launch, out): a zero-argument launch of upstream's reduce kernel over ``workspace``, with the grid, block
        and warps its wrapper launches it with. Natively, after the first launch, it is the kernel launch alone (the
        compiled kernel needs no module activation, which costs about a millisecond of host time a call), so a
        benchmark times upstream's kernel and not this adapter's host work; under the interpreter every launch runs
        through ``ctx.call``, where the fidelity corrections apply."""
        pm, pl, pa = workspace.part_m, workspace.part_l, workspace.part_acc
        batch, num_splits, num_heads = (int(x) for x in pm.shape)
        if out is None:
            out = torch.empty(batch, num_heads, HEAD_DIM, dtype=torch.bfloat16, device=pm.device)
        sink = attn_sink.contiguous() if attn_sink is not None else torch.empty(1, device=pm.device,
                                                                              dtype=torch.float32)
        import triton

        kernel = ops._sparse_attn_decode_reduce_kernel[(batch, num_heads)]
        args = (pm, pl, pa, sink, out, None, None, None, out.stride(0), out.stride(1), 0, HEAD_DIM // 32,
                pm.stride(0), pm.stride(1), pa.stride(0), pa.stride(1), pa.stride(2), 0, num_heads)
        kw = dict(HAS_ATTN_SINK=attn_sink is not None, ADAPTIVE_SPLITS=bool(adaptive), COMB_DIM=HEAD_DIM, BLOCK_H=1,
                  NUM_SPLITS=num_splits, SPLITS_PAD=triton.next_power_of_2(num_splits), FUSE_INV_ROPE=False,
                  NOPE=NOPE_DIM, HALF=ROPE_DIM // 2, QUANT_OUT=False, num_warps=4)
        direct = triton_mode() == "native"
        compiled = []

        def launch():
            if direct and compiled:
                return kernel(*args, **kw)
            ctx.call(kernel, *args, **kw)  # the first launch compiles with upstream's modules active, as before
            compiled.append(True)

        return launch, out

    def decode_reduce(workspace, *, attn_sink=None, adaptive=False, out=None):
        launch, out = reduce_launch(workspace, attn_sink=attn_sink, adaptive=adaptive, out=out)
        launch()
        return out

    return Family("decode", sparse_attn_decode=sparse_attn_decode, plan_decode=plan_decode,
                  decode_reduce=decode_reduce, reduce_launch=reduce_launch, DecodePlan=DecodePlan, DecodeWorkspace=DecodeWorkspace)


def _call_public(ops, q, main_cache, main_indices, main_indptr, extra_cache, extra_indices, extra_indptr, attn_sink,
                 scale, out, trust, adaptive):
    """``rocm_sparse_attn_decode`` with ragged indices for both segments, as the DSv4 ROCm layer calls it."""
    lens = main_indptr[1:] - main_indptr[:-1]
    swa_only = extra_cache is None
    ops.rocm_sparse_attn_decode(
        q=q, kv_cache=extra_cache, swa_k_cache=main_cache, swa_only=swa_only, topk_indices=None, topk_lens=None,
        swa_indices=main_indices.reshape(1, -1), swa_lens=lens, swa_ragged_indices=main_indices,
        swa_ragged_indptr=main_indptr, topk_ragged_indices=extra_indices, topk_ragged_indptr=extra_indptr,
        attn_sink=attn_sink, scale=scale, head_dim=HEAD_DIM, nope_head_dim=NOPE_DIM, rope_head_dim=ROPE_DIM,
        output=out, extra_cache_nan_free=trust, adaptive_splits=adaptive)


def plan_from_launches(rec: _Launches) -> DecodePlan:
    """Our plan from the kernel launches one wrapper call made."""
    for name, grid, _args, kw in rec.records:
        family = _FAMILY_OF.get(name)
        if family is None:
            continue
        if family == "generic":
            return DecodePlan("generic", 1, int(grid[1]))
        adaptive = bool(kw.get("ADAPTIVE_SPLITS", False))
        s = int(kw["NUM_SPLITS"])
        # upstream's kernel takes ONE_WAVE_SPLITS only strictly between 4 and NUM_SPLITS, so a value >= S means S;
        # our plan keeps one_wave in [1, S] (below 4 both mean "never": iters(4) <= 3 is tried first)
        return DecodePlan(family, s, int(grid[2]), adaptive, min(int(kw["ONE_WAVE_SPLITS"]), s) if adaptive else 1)
    raise RuntimeError("upstream's decode wrapper launched no decode kernel")


def _plan_editor(plan, workspace):
    """The launch edit for a frozen plan (and/or a caller-owned workspace): see the module docstring."""
    swap: dict = {}

    def edit(name, grid, args, kwargs):
        if name in ("_sparse_attn_decode_partial_kernel", "_sparse_attn_decode_gfx950_partial_kernel"):
            if plan is not None and name == "_sparse_attn_decode_gfx950_partial_kernel":
                kwargs["ADAPTIVE_SPLITS"] = bool(plan.adaptive)
                if plan.adaptive:
                    kwargs["ONE_WAVE_SPLITS"] = int(plan.one_wave)
            if workspace is not None:
                for pos, mine in zip(_PARTIAL_WS_ARGS, (workspace.part_m, workspace.part_l, workspace.part_acc)):
                    theirs = args[pos]
                    if tuple(theirs.shape) != tuple(mine.shape) or not mine.is_contiguous():
                        raise ValueError(f"workspace: expected a contiguous {list(theirs.shape)} tensor, got "
                                         f"{list(mine.shape)}")
                    swap[id(theirs)] = mine
                    args[pos] = mine
        elif name == REDUCE_KERNEL:
            if plan is not None:
                kwargs["ADAPTIVE_SPLITS"] = bool(plan.adaptive)
            for pos in _REDUCE_WS_ARGS:
                args[pos] = swap.get(id(args[pos]), args[pos])
        return args, kwargs

    return edit

