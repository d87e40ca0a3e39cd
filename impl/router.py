"""DeepSeek MoE router: biased grouped top-k ("noaux_tc"), and the gate's output-dtype policy.

Sources: SPEC section 7 (vllm-project/vllm ``vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py``,
AITER ``biased_grouped_topk_torch``, ``vllm/model_executor/models/deepseek_v2.py``) and seed 000 (the gate emits the
weight dtype, bf16, when AITER MoE and a correction bias are on; AITER accumulates in fp32).

Steps, all in fp32 whatever the gate output dtype:
  scores = sigmoid(logits); biased = scores + bias;
  group score = sum of the top-2 biased scores of each of ``n_group`` groups;
  keep the best ``topk_group`` groups, mask every other expert with -inf;
  ids = top-``topk`` of the masked biased scores;
  weights = the *unbiased* scores at ``ids``, divided by their sum when ``renormalize``, times
  ``routed_scaling_factor``.
When the experts do not divide into groups (``E <= n_group`` or ``E % n_group != 0``) upstream falls back to
``fused_topk_bias``: the same without the group stage.

Tie-break rule (documented, deterministic): among equal values the lower index wins, for groups (lower group id) and
for experts (lower expert id). Implemented with a stable descending sort. ``ids`` are returned in descending order of
the masked biased score, ties by ascending expert id.
"""
from __future__ import annotations

import math
import numbers

import torch

#: Gate output-dtype policies: "weight" (seed 000: the gate weight's dtype) and "fp32" (the older choice).
GATE_DTYPE_POLICIES = ("weight", "fp32")


def gate_out_dtype(gate_weight_dtype: torch.dtype, *, has_correction_bias: bool, aiter_moe_enabled: bool,
                   policy: str = "weight") -> torch.dtype | None:
    """The dtype the router gate GEMM writes (``None``: the layer's default, unchanged).

    With AITER MoE on and a correction bias present: the gate weight's dtype under ``policy="weight"`` (seed 000:
    saves a bf16->fp32 copy per MoE layer), fp32 under ``policy="fp32"`` (the previous behaviour)."""
    if policy not in GATE_DTYPE_POLICIES:
        raise ValueError(f"policy: expected one of {GATE_DTYPE_POLICIES}, got {policy!r}")
    if not (aiter_moe_enabled and has_correction_bias):
        return None
    return gate_weight_dtype if policy == "weight" else torch.float32


def correction_bias_for_gate(bias: torch.Tensor, out_dtype: torch.dtype | None) -> torch.Tensor:
    """The bias parameter is fp32; DeepseekV2MoE casts it to the gate's output dtype (SPEC section 7)."""
    return bias if out_dtype is None else bias.to(out_dtype)


def _topk_stable(x: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the ``k`` largest entries along the last dim; ties by lower index (stable descending sort)."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :k]


def biased_grouped_topk(gating_output: torch.Tensor, correction_bias: torch.Tensor, topk: int, *, n_group: int,
                        topk_group: int, renormalize: bool, routed_scaling_factor: float = 1.0
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Route ``gating_output [T, E]`` (fp32, bf16 or fp16 logits). Returns fp32 weights and int32 ids, ``[T, topk]``."""
    if not isinstance(gating_output, torch.Tensor) or gating_output.dim() != 2:
        raise ValueError(f"gating_output: expected a [tokens, experts] tensor, got "
                         f"{list(gating_output.shape) if isinstance(gating_output, torch.Tensor) else gating_output}")
    if not gating_output.dtype.is_floating_point:
        raise TypeError(f"gating_output: expected a floating dtype, got {gating_output.dtype}")
    T, E = gating_output.shape
    if not isinstance(correction_bias, torch.Tensor) or tuple(correction_bias.shape) != (E,):
        raise ValueError(f"correction_bias: expected shape [{E}], got "
                         f"{list(correction_bias.shape) if isinstance(correction_bias, torch.Tensor) else correction_bias}")
    if not correction_bias.dtype.is_floating_point:
        raise TypeError(f"correction_bias: expected a floating dtype, got {correction_bias.dtype}")
    if correction_bias.device != gating_output.device:
        raise ValueError(f"correction_bias: expected the device of gating_output ({gating_output.device}), "
                         f"got {correction_bias.device}")
    # bool is an int subclass: True would silently mean 1.
    for name, value in (("topk", topk), ("n_group", n_group), ("topk_group", topk_group)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    topk, n_group, topk_group = int(topk), int(n_group), int(topk_group)
    if not isinstance(renormalize, bool):
        raise TypeError(f"renormalize: expected a bool, got {type(renormalize).__name__} {renormalize!r}")
    if not isinstance(routed_scaling_factor, numbers.Real) or isinstance(routed_scaling_factor, bool):
        raise TypeError(f"routed_scaling_factor: expected a float, got "
                        f"{type(routed_scaling_factor).__name__} {routed_scaling_factor!r}")
    if not math.isfinite(routed_scaling_factor):
        raise ValueError(f"routed_scaling_factor: expected a finite value, got {routed_scaling_factor!r}")
    if not 1 <= topk <= E:
        raise ValueError(f"topk: expected 1..{E}, got {topk}")
    if n_group < 1:
        raise ValueError(f"n_group: expected >= 1, got {n_group}")
    grouped = E > n_group and E % n_group == 0
    if grouped and not 1 <= topk_group <= n_group:
        raise ValueError(f"topk_group: expected 1..n_group={n_group}, got {topk_group}")
    if grouped and topk > topk_group * (E // n_group):
        raise ValueError(f"topk: {topk} exceeds the {topk_group * (E // n_group)} experts of {topk_group} groups")

    scores = torch.sigmoid(gating_output.to(torch.float32))
    biased = scores + correction_bias.to(torch.float32)
    if grouped:
        per_group = E // n_group
        by_group = biased.view(T, n_group, per_group)
        top2 = torch.sort(by_group, dim=-1, descending=True).values[..., :min(2, per_group)]
        group_scores = top2.sum(dim=-1)
        keep_groups = _topk_stable(group_scores, topk_group)
        group_mask = torch.zeros(T, n_group, dtype=torch.bool, device=biased.device)
        group_mask.scatter_(1, keep_groups, True)
        expert_mask = group_mask.repeat_interleave(per_group, dim=1)
        choice = biased.masked_fill(~expert_mask, float("-inf"))
    else:
        choice = biased
    ids = _topk_stable(choice, topk)
    weights = scores.gather(1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    if routed_scaling_factor != 1.0:
        weights = weights * routed_scaling_factor
    return weights.to(torch.float32), ids.to(torch.int32)
