"""Comparing an attention kernel's output with a float64 reference, under a stated error model.

Error model (per output lane d of query row r, head h; W_d = sum_j p_j |v_jd|, the output's natural scale, since
|out_d| can cancel to near zero):

* Logits. q and k enter the QK dot exactly (bf16 q; fp8 x 2^k products and bf16 RoPE are exact in bf16), the dot
  accumulates n = 512 products in a unit ``accum_unit`` (any order), then a few fp32 roundings (scale, log2(e),
  the subtraction of the running max, the m*ln2 round trip). So every logit is off by at most
      Ds = (n * accum_unit + 4 u32) * L + 8 u32 * M
  with L = max_j scale * sum_i |q_i k_ji| and M = the largest |logit| or |sink| (both from the reference).
  Perturbing all logits by at most Ds moves each p_j by at most p_j * expm1(2 Ds) (the shift cancels between
  numerator and denominator, what remains is at most e^{+-Ds} over e^{-+Ds}).
* Exponentials: each p_j passes through at most (tiles + splits + 2) exp/exp2 evaluations and rescalings, each
  relative ``exp_unit``.
* p is rounded to bf16 for the PV dot (``operand_unit``); the PV and l sums accumulate at most tokens + tiles +
  splits + 4 terms in ``accum_unit``; the division one u32; the bf16 output rounding ``output_unit``. Native
  casts round to nearest (2^-8); the Triton interpreter truncates (2^-7), see ``AttentionErrorModel.for_mode``.
* Underflow floor: a GPU may flush fp32/bf16 subnormals (dequantised lanes near 2^-127 * fp8, tiny p, tiny
  outputs); each of the (tokens + 2) terms then moves by at most 2^-126 * (1 + max|v|).

tol_d = eps * (1 + eps) * W_d + floor, eps the sum of the relative terms (the (1 + eps) factor bounds the
products of first-order terms). Elementwise |got - ref| <= tol_d must hold for every finite lane: no fraction of
elements may fail. Before that, NaN and +-inf positions must match exactly (the reference rounded to bf16 decides
which lanes overflow). A cosine bound per (row, head) follows: with tau = ||tol|| / ||ref|| < 1, the elementwise bound
implies cos(got, ref) >= sqrt(1 - tau^2). Being implied, it is not a separate pass/fail check; it is reported next
to elementwise failures as the whole-vector view of how far off a row is.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

U32 = 2.0 ** -24
U_BF16 = 2.0 ** -8
FP32_MIN_NORMAL = 2.0 ** -126


@dataclass(frozen=True)
class AttentionErrorModel:
    dot_len: int = 512
    #: unit roundoff of fp32 accumulation; GPU matrix cores may align/truncate, so native runs take 2^-22
    accum_unit: float = U32
    #: relative error of one exp/exp2 (GPU approximations are within 2 ulp)
    exp_unit: float = 2.0 ** -22
    #: p rounded to bf16 before the PV dot
    operand_unit: float = U_BF16
    #: bf16 output
    output_unit: float = U_BF16

    @staticmethod
    def for_mode(triton_mode: str) -> "AttentionErrorModel":
        if triton_mode == "interpreter":
            # The interpreter casts fp32 -> bf16 by truncation (round toward zero), even when asked for
            # fp_downcast_rounding="rtne" (measured here with triton 3.9): one full ulp, 2^-7, per cast.
            return AttentionErrorModel(operand_unit=2.0 ** -7, output_unit=2.0 ** -7)
        return AttentionErrorModel(accum_unit=2.0 ** -22)


@dataclass
class Mismatch:
    kind: str  # "nan-mask" | "inf-mask" | "value" | "cosine" | "shape"
    where: str
    expected: str
    got: str
    #: one line saying what is wrong (a caller prefixes its own label: ``f"{label}: {m.detail}"``)
    detail: str = ""

    def __post_init__(self):
        if not self.detail:
            self.detail = {"nan-mask": "NaN positions differ", "inf-mask": "inf positions differ",
                           "value": "lane out of tolerance", "cosine": "row cosine below the implied bound",
                           "shape": "shape differs"}.get(self.kind, self.kind)


@dataclass
class AttentionComparison:
    """What :func:`attention_comparison` found. ``mismatches`` is empty when the output agrees; ``worst_ratio`` is
    the largest |got - ref| / tol over the finite lanes (None when the masks or shapes already differ, or no lane
    has a non-zero error or tolerance): a passing comparison's margin, 1 being the edge of the error model."""

    mismatches: list[Mismatch]
    worst_ratio: float | None
    lanes: int = 0  # finite lanes compared
    bad_lanes: int = 0

    @property
    def ok(self) -> bool:
        return not self.mismatches


def attention_tolerance(weight_abs: torch.Tensor, logit_abs: torch.Tensor, logit_max_abs: torch.Tensor,
                        tokens: list[int], max_abs_v: list[float], num_splits: int, min_tile: int,
                        model: AttentionErrorModel) -> torch.Tensor:
    """Per-lane tolerance [b, h, 512] from the reference's scales (see the module docstring)."""
    b, h, _ = weight_abs.shape
    tol = torch.empty_like(weight_abs)
    for r in range(b):
        n_tok = tokens[r]
        tiles = n_tok // max(min_tile, 1) + 4 * max(num_splits, 1) + 2
        for hh in range(h):
            ds = ((model.dot_len * model.accum_unit + 4 * U32) * float(logit_abs[r, hh])
                  + 8 * U32 * float(logit_max_abs[r, hh]))
            eps = (math.expm1(2 * ds) + (tiles + num_splits + 2) * model.exp_unit + model.operand_unit
                   + 2 * (n_tok + tiles + num_splits + 4) * model.accum_unit + U32 + model.output_unit)
            floor = (n_tok + 2) * FP32_MIN_NORMAL * (1.0 + max_abs_v[r])
            tol[r, hh] = eps * (1 + eps) * weight_abs[r, hh] + floor
    return tol


def _at(idx) -> str:
    return "[" + ", ".join(str(int(i)) for i in idx) + "]"


def _short(x: float) -> str:
    """2 significant digits in exponent form without padding: 3.1e-2, 1e-3, inf."""
    if not math.isfinite(x):
        return str(x)
    if x == 0:
        return "0"
    mant, exp = f"{x:.1e}".split("e")
    return f"{mant.removesuffix('.0')}e{int(exp)}"


def _cos_text(cos: float, need: float) -> str:
    """``cos`` and its bound with enough digits to tell them apart (bounds sit very close to 1)."""
    gap = 1.0 - need
    digits = 5 if not 0 < gap < 1 else min(12, max(5, 2 - math.floor(math.log10(gap))))
    return f"row cosine {cos:.{digits}f} (needs >= {need:.{digits}f})"


def attention_comparison(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, *, limit: int = 5,
                         name: str = "out") -> AttentionComparison:
    """Masks first (NaN, +inf, -inf exactly), then |got - ref| <= tol on every finite lane.

    With lanes out of bound the first mismatch is the summary: how many of how many lanes, the worst lane (largest
    error-to-tolerance ratio) with its error, tolerance and ratio, and that row's cosine against the bound the
    elementwise tolerance implies; then the next worst lanes one by one (``limit`` lanes in all), then rows whose
    cosine also breaks its bound. A passing comparison reports its worst ratio (``worst_ratio``)."""
    if tuple(got.shape) != tuple(ref.shape):
        return AttentionComparison([Mismatch("shape", name, str(list(ref.shape)), str(list(got.shape)))], None)
    g = got.detach().cpu().to(torch.float64)
    r64 = ref.detach().cpu().to(torch.float64)
    tol = tol.detach().cpu().to(torch.float64)
    r_out = r64.to(torch.bfloat16).to(torch.float64)  # which lanes a bf16 output must hold as inf
    out: list[Mismatch] = []
    for kind, label, fg, fr in (("nan-mask", "NaN", torch.isnan(g), torch.isnan(r_out)),
                                ("inf-mask", "+inf", g == math.inf, r_out == math.inf),
                                ("inf-mask", "-inf", g == -math.inf, r_out == -math.inf)):
        bad = (fg != fr).nonzero()
        for i, idx in enumerate(bad[:limit].tolist()):
            ix = tuple(idx)
            detail = f"{label} positions differ at {len(bad)} of {g.numel()} lanes" + (
                f" (first {name}{_at(idx)})" if i == 0 else "")
            out.append(Mismatch(kind, f"{name}{_at(idx)}", str(float(r64[ix])), str(float(g[ix])), detail))
    if out:
        return AttentionComparison(out, None, 0, 0)
    finite = torch.isfinite(r_out) & torch.isfinite(g)
    err = (g - r64).abs()
    lanes = int(finite.sum())
    # lanes where both the error and the tolerance are zero say nothing about the margin
    counted = finite & ~((err == 0) & (tol == 0))
    ratio = torch.where(counted, err / tol, torch.zeros_like(err))  # err > 0 with tol 0 gives inf: a real excess
    ratio = torch.where(torch.isnan(ratio), torch.full_like(ratio, math.inf), ratio)  # a NaN tolerance never passes
    worst = float(ratio.max()) if bool(counted.any()) else None
    bad_mask = finite & ~(err <= tol)
    n_bad = int(bad_mask.sum())
    if not n_bad:
        return AttentionComparison([], worst, lanes, 0)
    # The elementwise bound implies cos(got, ref) >= sqrt(1 - tau^2) per row, so the cosine can only fail together
    # with some lane; it is reported beside a failure as the whole-vector view (how far off the row is overall).
    rows_finite = finite.all(dim=-1)
    nr = r64.norm(dim=-1)
    tau = torch.where(nr > 0, torch.where(finite, tol, torch.zeros_like(tol)).norm(dim=-1) / nr,
                      torch.full_like(nr, math.inf))
    ng = g.norm(dim=-1)
    cos = (g * r64).sum(-1) / (ng * nr)
    need = torch.sqrt(torch.clamp(1 - tau ** 2, min=0.0)) - 1e-12
    has_cos = rows_finite & (tau < 1) & (ng > 0)
    bad_idx = bad_mask.nonzero()
    order = torch.argsort(ratio[bad_mask], descending=True, stable=True)
    shown = [tuple(bad_idx[int(i)].tolist()) for i in order[:max(limit, 1)]]
    for k, ix in enumerate(shown):
        where = f"{name}{_at(ix)}"
        lane = f"off by {_short(float(err[ix]))}, tolerance {_short(float(tol[ix]))}, {float(ratio[ix]):.3g}x"
        if k == 0:
            row = ix[:-1]
            cos_text = (_cos_text(float(cos[row]), float(need[row])) if bool(has_cos[row])
                        else "row cosine not bounded (a non-finite lane, a zero row or tau >= 1)")
            detail = f"{n_bad} of {lanes} lanes out of tolerance (worst {where}: {lane}); {cos_text}"
        else:
            detail = f"lane out of tolerance ({lane})"
        out.append(Mismatch("value", where, f"{float(r64[ix])!r} +- {float(tol[ix]):.3g}",
                            f"{float(g[ix])!r} (off by {float(err[ix]):.3g})", detail))
    for idx in (has_cos & ~(cos >= need)).nonzero()[:limit].tolist():
        ix = tuple(idx)
        out.append(Mismatch("cosine", f"{name}{_at(idx)}", f"cos >= {float(need[ix]):.9f}", f"{float(cos[ix]):.9f}",
                            _cos_text(float(cos[ix]), float(need[ix]))))
    return AttentionComparison(out, worst, lanes, n_bad)


def compare_attention(got: torch.Tensor, ref: torch.Tensor, tol: torch.Tensor, *, limit: int = 5,
                      name: str = "out") -> list[Mismatch]:
    """:func:`attention_comparison`'s mismatches alone (empty: the output agrees)."""
    return attention_comparison(got, ref, tol, limit=limit, name=name).mismatches
