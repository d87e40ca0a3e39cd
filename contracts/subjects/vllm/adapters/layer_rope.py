"""Layer RoPE: which output rows upstream's DSv4 ROCm layer inverse-RoPEs, and where, read off its own code.

Upstream decides it in ``DeepseekV4ROCMAiterMLAAttention.forward_mqa`` (rocm.py): ``fuse_inv_rope`` (a bf16 wo_a),
``prefill_rotated`` (0.34.0: AITER's prefill store rotates too), the count of leading decode rows ``_forward_decode``
returns as rotated, and the ``[rotated, end)`` range it hands the standalone ``rocm_inverse_rope_rows_``. The
adapter's ``inverse_rope_plan`` (our API, :func:`impl.layer_rope.inverse_rope_plan`) runs that method, with
upstream's real ``_forward_decode``, ``_forward_prefill``, ``_forward_prefill_aiter`` and ``_aiter_sparse_mla``, on
a stand-in layer holding only the attributes they read (an SWA-only layer: compress ratio 1, so no top-k metadata;
the rotation logic does not depend on the ratio), for one step of decode rows followed by prefill rows, and records
every rotation as the output rows and the positions it covered (found from the views' addresses in the layer's
``output`` and ``positions``):

- **AITER** (the layer's ``_use_aiter_sparse_mla_decode`` / ``_prefill`` flags): ``vllm._aiter_ops`` is a fake
  whose ``rocm_aiter_ops.triton_sparse_mla_fwd`` rotates exactly the output rows it is handed
  ``inv_rope_positions`` for (the first ``len(positions)`` rows of its ``output``), as AITER's store does, and
  nothing without them; a decode or a prefill store by which of upstream's methods called it;
- **the Triton decode**: upstream's real ``rocm_sparse_attn_decode`` (ops) runs on ``meta`` tensors of the
  arguments ``_forward_decode`` gives it, with every kernel launch recorded instead of run (the decode adapter's
  launch proxies, the CU count pinned): the rows its reduce rotated are the reduce launch's queries when it was
  launched with ``FUSE_INV_ROPE`` and positions (the fallback single kernel has no epilogue), and its return value
  (how many rows it claims) goes back to the layer as upstream's own;
- **the Triton prefill**: ``rocm_sparse_attn_prefill`` takes no positions and rotates nothing: a recorder; the
  gather (``dequantize_and_gather_k_cache``), ``combine_topk_swa_indices`` and the workspace are inert stand-ins;
- **the standalone pass**: ``rocm_inverse_rope_rows_`` is a recorder of the rows and positions it is handed.

The target is the bound one: its arch flags are served by the stand-ins (``on_gfx1250()`` and ``on_rdna()`` are false
on gfx942, gfx950 and generic; generic's ``_ON_GFX942`` / ``_ON_GFX950`` are false, so upstream's decode takes its
fallback kernel there). 0.34.0 split ``_use_aiter_sparse_mla`` into the decode / prefill pair and added
``on_rdna``; an older release ends the rows skipped, naming the symbol.
"""
from __future__ import annotations

import inspect
import sys
import types
from unittest import mock

import torch

from contracts.subjects.base import Family, SymbolMissing, SymbolTooNew
from contracts.subjects.vllm.adapters import aiter_flags_off, needs, predates
from contracts.subjects.vllm.adapters import decode as dec_adapter
from contracts.subjects.vllm.adapters.splits import pinned_cu
from impl import formats
from impl.layer_rope import InverseRopePlan, RowRotation
from impl.targets import get_target

#: the layer's AITER flags this adapter sets (0.34.0's pair; 0.33.0 had one ``_use_aiter_sparse_mla`` for both)
DECODE_FLAG = "_use_aiter_sparse_mla_decode"
PREFILL_FLAG = "_use_aiter_sparse_mla_prefill"
FLAGS_SINCE = "0.34.0"
#: upstream's methods that run for real on the stand-in layer
METHODS = ("_forward_decode", "_forward_prefill", "_forward_prefill_aiter", "_aiter_sparse_mla")
HEADS = 2
#: the layer's positions start here, so that a rotation handed a zero-filled tensor is told apart
POSITION_BASE = 100

NEEDS = needs({
    "rocm": [
        "DeepseekV4ROCMAiterMLAAttention.forward_mqa", "DeepseekV4ROCMAiterMLAAttention._forward_decode",
        "DeepseekV4ROCMAiterMLAAttention._forward_prefill", "DeepseekV4ROCMAiterMLAAttention._forward_prefill_aiter",
        "DeepseekV4ROCMAiterMLAAttention._aiter_sparse_mla", "get_forward_context", "rocm_inverse_rope_rows_",
        "rocm_sparse_attn_decode", "rocm_sparse_attn_prefill", "current_workspace_manager",
        "dequantize_and_gather_k_cache", "combine_topk_swa_indices", "on_gfx1250", "on_rdna",
    ],
    "ops": ["rocm_sparse_attn_decode", "_sparse_attn_decode_reduce_kernel"],
}, since={"rocm.on_rdna": FLAGS_SINCE})


class _Ledger:
    """The rotations of one step, as row and position ranges of the layer's ``output`` and ``positions``."""

    def __init__(self, output: torch.Tensor, positions: torch.Tensor):
        self.output, self.positions = output, positions
        self.rotations: list[RowRotation] = []
        self.phase = ""

    @staticmethod
    def _range(view: torch.Tensor, base: torch.Tensor, what: str) -> tuple[int, int]:
        if view.untyped_storage().data_ptr() != base.untyped_storage().data_ptr():
            raise RuntimeError(f"upstream rotated a {what} tensor that is not a view of the layer's {what}")
        row = base.stride(0) * base.element_size()
        off = view.data_ptr() - base.data_ptr()
        if off % row:
            raise RuntimeError(f"upstream rotated a {what} view that does not start on a row of the layer's {what}")
        return off // row, off // row + int(view.shape[0])

    def rotate(self, stage: str, rows: torch.Tensor, positions: torch.Tensor | None) -> None:
        if int(rows.shape[0]) == 0:
            return
        start, end = self._range(rows, self.output, "output")
        if positions is None:
            raise RuntimeError(f"upstream's {stage} rotated rows [{start}, {end}) without positions")
        if int(positions.shape[0]) == 0:
            ps = pe = -1
        else:
            ps, pe = self._range(positions, self.positions, "positions")
        self.rotations.append(RowRotation(stage, start, end, ps, pe))


def _meta(v):
    if isinstance(v, torch.Tensor):
        return torch.empty_strided(tuple(v.shape), tuple(v.stride()), dtype=v.dtype, device="meta")
    return v


def _aiter_module(ledger: _Ledger) -> types.ModuleType:
    class rocm_aiter_ops:  # noqa: N801 - upstream's name
        """AITER's switchboard as the layer calls it: a sparse-MLA store that rotates the rows it gets positions
        for."""

        @staticmethod
        def triton_sparse_mla_fwd(q, kv_buffer, output, scale, kv_indptr, kv_indices, *args,
                                  inv_rope_positions=None, inv_rope_cos_sin_cache=None, **kwargs):
            if inv_rope_positions is None:
                return None
            if inv_rope_cos_sin_cache is None:
                raise ValueError("AITER's sparse MLA got inv_rope_positions without inv_rope_cos_sin_cache")
            k = min(int(inv_rope_positions.shape[0]), int(output.shape[0]))
            ledger.rotate(f"aiter-{ledger.phase}-store", output[:k], inv_rope_positions[:k])
            return None

    m = types.ModuleType("vllm._aiter_ops")
    m.rocm_aiter_ops = rocm_aiter_ops
    return m


class _Workspace:
    def get_simultaneous(self, *specs):
        return [torch.zeros(shape, dtype=dtype) for shape, dtype in specs]


def build(ctx) -> Family:
    rocm, ops = ctx["rocm"], ctx["ops"]
    target = ctx.target
    cls = rocm.DeepseekV4ROCMAiterMLAAttention
    flags = aiter_flags_off(cls)
    lacking = [f for f in (DECODE_FLAG, PREFILL_FLAG) if f not in flags]
    if lacking:
        version = ctx.subject.version
        what = (f"the layer_rope adapter needs DeepseekV4ROCMAiterMLAAttention.{lacking[0]} in "
                f"vllm/models/deepseek_v4/amd/rocm.py (the layer's methods read {sorted(flags) or 'no AITER flag'})")
        if predates(version, FLAGS_SINCE):
            raise SymbolTooNew(f"{what}, which came in vLLM {FLAGS_SINCE}; this subject is {version}")
        raise SymbolMissing(f"{what}, which this tree does not have (renamed or removed upstream?): the adapter "
                            f"needs a look")
    real_decode = ops.rocm_sparse_attn_decode
    decode_signature = inspect.signature(real_decode)

    def _check(t, counts: dict, bools: dict) -> None:
        if t is not None and get_target(t).name != target.name:
            raise ValueError(f"target: this subject is bound to {target.name}, got {get_target(t).name}")
        for name, v in counts.items():
            if isinstance(v, bool) or not isinstance(v, int):
                raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
            if v < 0:
                raise ValueError(f"{name}: expected a token count >= 0, got {v}")
        for name, v in bools.items():
            if not isinstance(v, bool):
                raise TypeError(f"{name}: expected a bool, got {type(v).__name__}")

    def inverse_rope_plan(t, *, num_decode_tokens, num_prefill_tokens, fuse_inv_rope, aiter_decode,
                          aiter_prefill) -> InverseRopePlan:
        _check(t, {"num_decode_tokens": num_decode_tokens, "num_prefill_tokens": num_prefill_tokens},
               {"fuse_inv_rope": fuse_inv_rope, "aiter_decode": aiter_decode, "aiter_prefill": aiter_prefill})
        d, p = num_decode_tokens, num_prefill_tokens
        n = d + p
        q = torch.zeros(n, HEADS, formats.DSV4_HEAD_DIM, dtype=torch.bfloat16)
        output = torch.zeros_like(q)
        positions = torch.arange(POSITION_BASE, POSITION_BASE + n, dtype=torch.int64)
        ledger = _Ledger(output, positions)
        layer = _layer(cls, flags, fuse_inv_rope, aiter_decode, aiter_prefill, n, ledger)
        swa = _swa_metadata(d, p)
        context = types.SimpleNamespace(attn_metadata={layer.swa_cache_layer.prefix: swa})

        def triton_decode(*args, **kwargs):
            bound_args = decode_signature.bind(*args, **kwargs)
            rec = dec_adapter._Launches(ops, run=False)
            with pinned_cu(ops, target.cu_count), rec.installed():
                claimed = real_decode(**{k: _meta(v) for k, v in bound_args.arguments.items()})
            given = bound_args.arguments.get("inv_rope_positions")
            for name, grid, largs, lkwargs in rec.records:
                # the reduce rotates each query row it is launched for when FUSE_INV_ROPE is set with positions
                if name == dec_adapter.REDUCE_KERNEL and lkwargs.get("FUSE_INV_ROPE") and given is not None:
                    rows = min(int(grid[0]), int(given.shape[0]))
                    ledger.rotate("decode-reduce", bound_args.arguments["output"][:rows], given[:rows])
            return claimed

        def triton_prefill(*args, **kwargs):
            return None  # no positions in its signature: it cannot rotate

        def standalone(o, pos, cos_sin_cache, rope_head_dim):
            ledger.rotate("standalone", o, pos)

        def combine(*args, **kwargs):
            rows = int(args[0].shape[0]) if args and isinstance(args[0], torch.Tensor) else 0
            return torch.zeros(rows, 1, dtype=torch.int32), torch.zeros(rows, dtype=torch.int32)

        def run():
            saved = sys.modules.get("vllm._aiter_ops")
            sys.modules["vllm._aiter_ops"] = _aiter_module(ledger)
            try:
                with mock.patch.multiple(rocm, get_forward_context=lambda: context,
                                         rocm_sparse_attn_decode=triton_decode,
                                         rocm_sparse_attn_prefill=triton_prefill,
                                         rocm_inverse_rope_rows_=standalone,
                                         current_workspace_manager=_Workspace,
                                         dequantize_and_gather_k_cache=lambda *a, **k: None,
                                         combine_topk_swa_indices=combine):
                    cls.forward_mqa(layer, q, None, positions, output)
            finally:
                if saved is None:
                    sys.modules.pop("vllm._aiter_ops", None)
                else:
                    sys.modules["vllm._aiter_ops"] = saved

        ctx.call(run)
        return InverseRopePlan(target=target.name, num_decode_tokens=d, num_prefill_tokens=p,
                               fuse_inv_rope=fuse_inv_rope, rotations=tuple(ledger.rotations))

    return Family("layer_rope", inverse_rope_plan=inverse_rope_plan, InverseRopePlan=InverseRopePlan,
                  RowRotation=RowRotation)


def _layer(cls, flags: dict, fuse_inv_rope: bool, aiter_decode: bool, aiter_prefill: bool, n: int, ledger: _Ledger):
    """The attributes upstream's forward_mqa and its callees read (an SWA-only layer), its methods bound to it; each
    of ``_forward_decode`` / ``_forward_prefill`` tells the ledger which part of the step is running."""
    layer = types.SimpleNamespace(
        prefix="attn", swa_cache_layer=types.SimpleNamespace(
            prefix="swa", kv_cache=torch.zeros(1, 64, formats.DSV4_TOKEN_BYTES, dtype=torch.uint8)),
        compress_ratio=1, kv_cache=None, topk_indices_buffer=torch.full((max(n, 1), 1), -1, dtype=torch.int32),
        _wo_a_fp8_weight=None if fuse_inv_rope else object(), n_local_heads=HEADS,
        rotary_emb=types.SimpleNamespace(cos_sin_cache=torch.zeros(POSITION_BASE + n + 1, formats.DSV4_ROPE_DIM)),
        head_dim=formats.DSV4_HEAD_DIM, nope_head_dim=formats.DSV4_NOPE_DIM, rope_head_dim=formats.DSV4_ROPE_DIM,
        attn_sink=torch.full((HEADS,), float("-inf")), scale=dec_adapter.DEFAULT_SCALE,
        kv_cache_dtype="fp8_ds_mla", _has_kv_transfer=False, window_size=128, max_image_tokens=0,
        PREFILL_CHUNK_SIZE=4, max_model_len=1024, max_num_batched_tokens=max(n, 1))
    layer.__dict__.update(flags)
    setattr(layer, DECODE_FLAG, aiter_decode)
    setattr(layer, PREFILL_FLAG, aiter_prefill)
    for name in METHODS:
        setattr(layer, name, types.MethodType(getattr(cls, name), layer))
    for name, phase in (("_forward_decode", "decode"), ("_forward_prefill", "prefill")):
        setattr(layer, name, _in_phase(getattr(layer, name), ledger, phase))
    return layer


def _in_phase(method, ledger: _Ledger, phase: str):
    def call(*args, **kwargs):
        prev, ledger.phase = ledger.phase, phase
        try:
            return method(*args, **kwargs)
        finally:
            ledger.phase = prev
    return call


def _swa_metadata(d: int, p: int) -> types.SimpleNamespace:
    """The SWA metadata of a step of ``d`` one-token decode requests and, when ``p``, one prefill request of ``p``
    tokens (decode rows first), with one chunk for the prefill."""
    num_prefills = 1 if p else 0
    reqs = d + num_prefills
    qsl = torch.tensor(list(range(d + 1)) + ([d + p] if p else []), dtype=torch.int32)
    return types.SimpleNamespace(
        num_decodes=d, num_prefills=num_prefills, num_decode_tokens=d, num_prefill_tokens=p,
        num_actual_tokens=d + p, is_valid_token=torch.ones(d + p, dtype=torch.bool),
        token_to_req_indices=torch.arange(d + p, dtype=torch.int32).clamp(max=max(reqs - 1, 0)),
        decode_swa_indices=torch.zeros(d, 1, dtype=torch.int32), decode_swa_lens=torch.ones(d, dtype=torch.int32),
        decode_swa_ragged_indices=torch.zeros(max(d, 1), dtype=torch.int32),
        decode_swa_ragged_indptr=torch.arange(d + 1, dtype=torch.int32),
        prefill_swa_ragged_indices=torch.zeros(max(p, 1), dtype=torch.int32),
        prefill_swa_ragged_indptr=torch.arange(p + 1, dtype=torch.int32),
        prefill_seq_lens=torch.full((num_prefills,), p, dtype=torch.int32),
        prefill_gather_lens=torch.full((num_prefills,), p, dtype=torch.int32),
        seq_lens=torch.ones(reqs, dtype=torch.int32), query_start_loc_cpu=qsl, query_start_loc=qsl.clone(),
        prefill_left_visible=None, prefill_right_visible=None,
        block_table=torch.zeros(reqs, 1, dtype=torch.int32), block_size=64,
        get_prefill_chunk_plan=lambda compress_ratio, prefill_chunk_size: [(0, num_prefills, 0, max(p, 1))])
