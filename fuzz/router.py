"""Cases, strategies and the input builder for the router contract (``impl.router``): grouped and ungroupable
expert counts, exact ties, both gate dtypes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case


@dataclass(frozen=True)
class RouterCase(Case):
    """``tokens`` rows of gate logits over ``experts`` (normal times ``logit_scale``), a correction bias (normal
    times ``bias_scale``), both on coarse grids when ``ties`` asks for exact ties, from ``seed``; the routing
    arguments; the dtype the gate emits."""

    KIND = "router-oracle-agreement"
    seed: int
    tokens: int
    experts: int
    n_group: int
    topk_group: int
    topk: int
    renormalize: bool
    routed_scaling_factor: float
    gate_dtype: Literal["fp32", "bf16"]
    ties: bool = False
    logit_scale: float = 1.0
    bias_scale: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        for name in ("tokens", "experts", "n_group", "topk_group", "topk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected a positive int, got {getattr(self, name)!r}")
        if self.seed < 0:
            raise ValueError(f"seed: expected an int >= 0, got {self.seed!r}")


@st.composite
def router_cases(draw) -> RouterCase:
    """Expert counts that split into groups and ones that do not (plain biased top-k), every group and top-k
    count the router accepts, renormalised or not, both scaling factors and gate dtypes, exact ties."""
    E = draw(st.sampled_from([8, 10, 12, 16, 32]))
    n_group = draw(st.sampled_from([1, 2, 3, 4, 8]))
    grouped = E > n_group and E % n_group == 0
    if grouped:
        topk_group = draw(st.integers(1, n_group))
        topk = draw(st.integers(1, min(8, topk_group * (E // n_group))))
    else:
        topk_group = draw(st.integers(1, n_group))
        topk = draw(st.integers(1, min(8, E)))
    return RouterCase(
        seed=draw(st.integers(0, 2**31 - 1)),
        tokens=draw(st.integers(1, 8)),
        experts=E, n_group=n_group, topk_group=topk_group, topk=topk,
        renormalize=draw(st.booleans()),
        routed_scaling_factor=draw(st.sampled_from([1.0, 2.5])),
        gate_dtype=draw(st.sampled_from(["fp32", "bf16"])),
        ties=draw(st.booleans()),
        logit_scale=draw(st.sampled_from([0.5, 3.0])),
        bias_scale=draw(st.sampled_from([0.0, 0.05, 1.0])),
    )


def make_inputs(case: RouterCase) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 gate logits and the fp32 correction bias of a case (coarse grids when ``ties`` asks for exact ties)."""
    g = torch.Generator().manual_seed(case.seed)
    logits = torch.randn(case.tokens, case.experts, generator=g) * case.logit_scale
    bias = torch.randn(case.experts, generator=g) * case.bias_scale
    if case.ties:
        logits = torch.round(logits * 2) / 2
        bias = torch.round(bias * 4) / 4
    return logits.to(torch.float32), bias.to(torch.float32)
