"""float64 oracle for the biased grouped top-k router (SPEC section 7), with a choice of mask value.

vLLM masks the experts of dropped groups with -inf; AITER's torch reference (``biased_grouped_topk_torch``) masks them
with 0.0, which differs whenever a kept expert's biased score is negative (a masked 0.0 then outranks it). Both are
available so a test can show the difference. Tie rule: lower group id, then lower expert id, wins (as in impl).
Written with plain loops, from the spec.
"""
from __future__ import annotations

import math


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x)) if x >= 0 else math.exp(x) / (1.0 + math.exp(x))


def _rank(values: list[float], k: int) -> list[int]:
    """Indices of the k largest, descending, ties by lower index."""
    return sorted(range(len(values)), key=lambda i: (-values[i], i))[:k]


def route_token(logits: list[float], bias: list[float], topk: int, n_group: int, topk_group: int, renormalize: bool,
                routed_scaling_factor: float = 1.0, mask_value: float = float("-inf")) -> dict:
    """One token. Returns ids, weights, and what a comparison needs: the masked biased scores, the group scores,
    the kept groups, and whether the grouped path ran."""
    E = len(logits)
    scores = [_sigmoid(x) for x in logits]
    biased = [s + b for s, b in zip(scores, bias)]
    grouped = E > n_group and E % n_group == 0
    group_scores: list[float] = []
    kept: list[int] = list(range(n_group)) if grouped else []
    if grouped:
        per = E // n_group
        for g in range(n_group):
            members = sorted(biased[g * per:(g + 1) * per], reverse=True)
            group_scores.append(sum(members[:2]))
        kept = sorted(_rank(group_scores, topk_group))
        masked = [biased[e] if (e // per) in kept else mask_value for e in range(E)]
    else:
        masked = list(biased)
    ids = _rank(masked, topk)
    weights = [scores[e] for e in ids]
    if renormalize:
        total = sum(weights)
        weights = [w / total for w in weights]
    weights = [w * routed_scaling_factor for w in weights]
    return {"ids": ids, "weights": weights, "scores": scores, "biased": biased, "masked": masked,
            "group_scores": group_scores, "kept_groups": kept, "grouped": grouped}


def biased_grouped_topk(logits: list[list[float]], bias: list[float], topk: int, *, n_group: int, topk_group: int,
                        renormalize: bool, routed_scaling_factor: float = 1.0,
                        mask_value: float = float("-inf")) -> list[dict]:
    return [route_token(row, bias, topk, n_group, topk_group, renormalize, routed_scaling_factor, mask_value)
            for row in logits]
