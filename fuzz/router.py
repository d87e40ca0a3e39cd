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
    ADDED_FIELDS = ('layout',)
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
    #: memory of the router's inputs (the same values): see :data:`ROUTER_LAYOUTS`
    layout: Literal["contiguous", "strided", "transposed"] = "contiguous"

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


# --- declared dimensions ----------------------------------------------------------------------------------------
# The router's code paths: one group (n_group = 1: the group stage keeps everything), several groups, the
# ungroupable fallback (plain biased top-k); how many groups are kept (one, some, all); top-k at 1, between, and the
# largest the router accepts (every expert of the kept groups; every expert in the fallback); exact ties; the gate
# dtype; the bias size; renormalisation and the routed scaling factor (each a branch). Shapes stay as drawn (at most
# 8 tokens of 32 experts).

GROUPINGS = ("one-group", "groups", "fallback")
GROUP_PICKS = ("one", "some", "all")
TOPK_CLASSES = ("1", "mid", "max")
BIAS_CLASSES = {"zero": 0.0, "small": 0.05, "large": 1.0}


def _grouped(experts: int, n_group: int) -> bool:
    return experts > n_group and experts % n_group == 0


def _max_topk(experts: int, n_group: int, topk_group: int) -> int:
    return topk_group * (experts // n_group) if _grouped(experts, n_group) else experts


def classify_router(case: RouterCase, target=None) -> dict:
    E, g, kg, k = case.experts, case.n_group, case.topk_group, case.topk
    top = _max_topk(E, g, kg)
    out = {"grouping": ("one-group" if g == 1 else "groups") if _grouped(E, g) else "fallback",
           "group_pick": "one" if kg == 1 else ("all" if kg == g else "some"),
           "topk": "1" if k == 1 else ("max" if k == top else "mid"),
           "ties": case.ties, "gate_dtype": case.gate_dtype, "renormalize": case.renormalize,
           "scaling": "1" if case.routed_scaling_factor == 1.0 else "2.5", "layout": case.layout}
    bias = next((k for k, v in BIAS_CLASSES.items() if v == case.bias_scale), None)
    if bias is not None:
        out["bias"] = bias
    return out


def force_router(case: RouterCase, combo: dict, target=None) -> RouterCase:
    f = classify_router(case)
    f.update(combo)
    s = case.seed
    grouping, pick = f["grouping"], f["group_pick"]
    if grouping == "one-group":
        n_group, E = 1, (8, 12, 16)[s % 3]
    elif grouping == "groups":
        n_group = (4, 8)[s % 2] if pick == "some" else (2, 4, 8)[s % 3]
        E = n_group * 4
    else:  # E % n_group != 0, or E <= n_group
        n_group, E = ((3, 10), (4, 10), (8, 8))[s % 3] if pick != "some" else ((3, 10), (4, 10))[s % 2]
    kg = {"one": 1, "all": n_group, "some": 2 + s % max(n_group - 2, 1)}[pick]
    top = _max_topk(E, n_group, kg)
    k = {"1": 1, "max": top, "mid": 2 + s % max(top - 2, 1)}[f["topk"]]
    return case.replace(experts=E, n_group=n_group, topk_group=kg, topk=k, ties=f["ties"],
                        gate_dtype=f["gate_dtype"], renormalize=f["renormalize"],
                        routed_scaling_factor=1.0 if f["scaling"] == "1" else 2.5, layout=f["layout"],
                        bias_scale=BIAS_CLASSES[f["bias"]] if "bias" in f else case.bias_scale)


def _router_allowed(c: dict, target=None) -> bool:
    # one group: the only group is kept, so one is all
    return not (c.get("grouping") == "one-group" and c.get("group_pick") in ("some", "all"))


def router_family_examples(target=None) -> list[RouterCase]:
    base = RouterCase(seed=0, tokens=1, experts=8, n_group=1, topk_group=1, topk=1, renormalize=False,
                      routed_scaling_factor=1.0, gate_dtype="fp32")
    return [base, base.replace(seed=1, tokens=2, experts=16, n_group=4, topk_group=2, topk=3)]


#: ``contiguous``; ``strided``: the logits a slice of a wider, offset table (row stride E + 5) and the bias a stride-2
#: view; ``transposed``: the logits the transpose of an [experts, tokens] table (column-major)
ROUTER_LAYOUTS = ("contiguous", "strided", "transposed")


def lay_out_router_inputs(logits: torch.Tensor, bias: torch.Tensor, layout: str):
    """``logits [T, E]`` and ``bias [E]`` with the same values in the memory of ``layout`` (the extra elements NaN)."""
    if layout == "strided":
        T, E = logits.shape
        wide = torch.full((T + 1, E + 5), float("nan"), dtype=logits.dtype, device=logits.device)
        wide[1:, 2:2 + E] = logits
        pair = torch.stack([bias, torch.full_like(bias, float("nan"))], dim=1).reshape(-1)
        return wide[1:, 2:2 + E], pair[::2]
    if layout == "transposed":
        return logits.t().contiguous().t(), bias
    return logits, bias


def _declare_router():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "router",
        (Dimension("grouping", GROUPINGS, "n_group = 1, several groups, the ungroupable fallback"),
         Dimension("group_pick", GROUP_PICKS, "topk_group: 1, between, n_group"),
         Dimension("topk", TOPK_CLASSES, "1, between, the largest accepted (every expert of the kept groups)"),
         Dimension("ties", (False, True), "logits and bias on coarse grids: exact ties"),
         Dimension("gate_dtype", ("fp32", "bf16"), "the gate's output dtype policy"),
         Dimension("bias", tuple(BIAS_CLASSES), "correction bias scale"),
         Dimension("renormalize", (False, True)),
         Dimension("scaling", ("1", "2.5"), "routed scaling factor (1.0 skips the multiply)"),
         Dimension("layout", ROUTER_LAYOUTS, "logits packed, a slice of a wider table, or column-major")),
        (("grouping", "group_pick", "topk"), ("ties", "grouping"), ("ties", "topk"), ("gate_dtype", "ties"),
         ("gate_dtype", "bias"), ("renormalize", "scaling"), ("layout", "grouping"), ("layout", "gate_dtype")),
        classify_router, force_router, _router_allowed, router_family_examples), "router-oracle-agreement")


ROUTER_DIMENSIONS = _declare_router()
