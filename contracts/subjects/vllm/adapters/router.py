"""Router: upstream's gate out-dtype policy, read off ``DeepseekV2MoE.__init__`` (``model_executor/models/
deepseek_v2.py``) run for real on stand-in collaborators, and upstream's grouped top-k (``grouped_topk`` in
``model_executor/layers/fused_moe/router/grouped_topk_router.py``, its torch path: the fused kernel is for CUDA and
XPU behind a flag).

``gate_out_dtype(gate_weight_dtype, *, has_correction_bias, aiter_moe_enabled, policy)`` builds a
``DeepseekV2MoE`` from a minimal config (``topk_method = "noaux_tc"`` when there is a correction bias;
``moe_router_dtype = "float32"`` for our ``"fp32"`` policy, upstream's way to ask for fp32 routing, none for the
``"weight"`` policy) with its collaborators replaced for the call: one tensor-parallel and expert-parallel rank, a
``GateLinear`` that records ``out_dtype`` and ``set_out_dtype``, a ``FusedMoEFactory`` that records its arguments,
``rocm_aiter_ops.is_fused_moe_enabled()`` as asked. It returns the gate's ``out_dtype`` after ``__init__``.
``correction_bias_for_gate(bias, out_dtype)`` returns ``bias`` cast the way the same ``__init__`` casts its
``e_score_correction_bias`` parameter (AITER MoE on, a gate weight of ``out_dtype``; ``out_dtype`` None: AITER MoE
off, no cast).

Not mapped: our ``"fp32"`` policy with AITER MoE off or without a bias (ours: None, the layer's default;
upstream's ``moe_router_dtype`` gives fp32 whatever AITER does); no contract asks for it.

``biased_grouped_topk`` calls ``grouped_topk`` with sigmoid scoring and the correction bias (DeepSeek's
``noaux_tc``); AITER's fused grouped top-k (ROCm only) is not audited.
"""
from __future__ import annotations

import types

import torch
from torch import nn

from contracts.subjects.base import Family
from contracts.subjects.vllm.adapters import needs

#: experts and hidden size of the minimal config (the policy reads neither)
_EXPERTS, _HIDDEN = 8, 16


class _GateLinear(nn.Module):
    """``GateLinear`` as ``DeepseekV2MoE.__init__`` uses it: a weight of the given dtype, ``out_dtype``,
    ``set_out_dtype``."""

    weight_dtype = torch.bfloat16

    def __init__(self, input_size, output_size, out_dtype=None, prefix=""):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=self.weight_dtype),
                                   requires_grad=False)
        self.out_dtype = out_dtype

    def set_out_dtype(self, dtype):
        self.out_dtype = dtype


class _FusedMoE(nn.Module):
    def __init__(self, **kw):
        super().__init__()
        self.kwargs = kw


class _Group:
    device_group = types.SimpleNamespace(size=lambda: 1)


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself)
NEEDS = needs({
    "deepseek_v2": ["DeepseekV2MoE"],
    "grouped_topk": ["grouped_topk"],
})


def build(ctx) -> Family:
    dv2 = ctx["deepseek_v2"]

    def construct(gate_weight_dtype, *, has_correction_bias, aiter_moe_enabled, router_fp32):
        gate_cls = type("GateLinear", (_GateLinear,), {"weight_dtype": gate_weight_dtype})
        aiter_ops = type("rocm_aiter_ops", (), {"is_fused_moe_enabled": staticmethod(lambda: aiter_moe_enabled)})
        config = types.SimpleNamespace(
            hidden_size=_HIDDEN, n_routed_experts=_EXPERTS, n_shared_experts=None, hidden_act="silu",
            num_experts_per_tok=2, moe_intermediate_size=_HIDDEN, norm_topk_prob=True, n_group=2, topk_group=1,
            scoring_func="sigmoid", routed_scaling_factor=1.0, model_type="deepseek_v3",
            **({"topk_method": "noaux_tc"} if has_correction_bias else {}),
            **({"moe_router_dtype": "float32"} if router_fp32 else {}))
        parallel = types.SimpleNamespace(use_sequence_parallel_moe=False, enable_eplb=False,
                                         eplb_config=types.SimpleNamespace(num_redundant_experts=0))
        fakes = {"get_tensor_model_parallel_world_size": lambda: 1, "get_tensor_model_parallel_rank": lambda: 0,
                 "get_ep_group": lambda: _Group(), "GateLinear": gate_cls, "FusedMoEFactory": _FusedMoE,
                 "rocm_aiter_ops": aiter_ops}

        def call():
            saved = {k: dv2.__dict__.get(k) for k in fakes}
            try:
                dv2.__dict__.update(fakes)
                return dv2.DeepseekV2MoE(config, parallel, prefix="model.layers.3.mlp")
            finally:
                dv2.__dict__.update(saved)

        return ctx.call(call)

    def gate_out_dtype(gate_weight_dtype, *, has_correction_bias, aiter_moe_enabled, policy="weight"):
        if policy not in ("weight", "fp32"):
            raise ValueError(f"policy: expected 'weight' or 'fp32', got {policy!r}")
        moe = construct(gate_weight_dtype, has_correction_bias=has_correction_bias,
                        aiter_moe_enabled=aiter_moe_enabled, router_fp32=policy == "fp32")
        return moe.gate.out_dtype

    def correction_bias_for_gate(bias, out_dtype):
        if out_dtype is None:
            return bias
        moe = construct(out_dtype, has_correction_bias=True, aiter_moe_enabled=True, router_fp32=False)
        return bias.to(moe.gate.e_score_correction_bias.dtype)

    def biased_grouped_topk(gating_output, correction_bias, topk, *, n_group, topk_group, renormalize,
                            routed_scaling_factor=1.0):
        # upstream's torch path (the fused kernel is CUDA/XPU only and behind a flag): sigmoid scores, the bias for
        # selection, top-2 group sums, -inf masking, weights from the unbiased scores
        gt = ctx["grouped_topk"]
        # upstream wraps it in torch.compile with its platform's backend; the audit runs the function itself
        # (the code the compiler would trace), not a compiler the stand-in platform does not have
        fn = getattr(gt.grouped_topk, "_torchdynamo_orig_callable", gt.grouped_topk)
        hidden = torch.empty(int(gating_output.shape[0]), 1, dtype=gating_output.dtype, device=gating_output.device)
        return ctx.call(fn, hidden_states=hidden, gating_output=gating_output, topk=int(topk),
                        renormalize=bool(renormalize), num_expert_group=int(n_group), topk_group=int(topk_group),
                        scoring_func="sigmoid", routed_scaling_factor=float(routed_scaling_factor),
                        e_score_correction_bias=correction_bias)

    return Family("router", gate_out_dtype=gate_out_dtype, correction_bias_for_gate=correction_bias_for_gate,
                  biased_grouped_topk=biased_grouped_topk)
