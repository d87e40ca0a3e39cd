"""Reduce-epilogue contract (``impl.epilogues``): inverse GPT-J RoPE and the MXFP8 output against their float64
references. Source: SPEC section 2 ("Optional epilogues") and section 4 (the 254 cap)."""
from __future__ import annotations

import math

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt, record_margin
from contracts.subjects import EntryMissing, bound
from fuzz import epilogues as fz
from fuzz.epilogues import EpilogueCase, Mxfp8Case, Mxfp8Group, RopeCase
from impl.epilogues import ROPE_DIM
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import epilogues as ref

def _check_mxfp8(case: Mxfp8Case, epi) -> list[Violation]:
    x = fz.mxfp8_input(case, kernel_device())
    rows, width = case.rows, case.width
    codes_buf, codes, scales_buf, scales = fz.mxfp8_outputs(case, x.device)
    try:
        got_c, got_s = epi.mxfp8_quantize(x, codes=codes, scales=scales)
    except (ValueError, TypeError) as exc:
        if case.out_layout == "contiguous":
            raise
        # refused: the outputs untouched, and the same rows judged with packed outputs
        return _refusal("codes", "scales", exc=exc, untouched=bool((codes_buf == 0xA5).all() and
                                                                   (scales_buf == 0xA5).all())) + \
            _check_mxfp8(case.replace(out_layout="contiguous"), epi)
    out: list[Violation] = []
    if case.out_layout != "contiguous":
        out += _gaps_untouched(codes_buf, codes, "codes") + _gaps_untouched(scales_buf, scales, "scales")
    if got_c.data_ptr() != codes.data_ptr() or got_s.data_ptr() != scales.data_ptr():
        out.append(Violation("mxfp8 outputs not written into the given buffers", "codes/scales", "the same data "
                             "pointers", "new tensors"))
    got_c, got_s = got_c.cpu().clone(), got_s.cpu().clone()
    want = ref.mxfp8_quantize(x.cpu())
    want_s = want["scales"].to(torch.int64)
    one_low = got_s.to(torch.int64) == want_s - 1
    if bool(one_low.any()):
        # the code of a group whose amax lies just above a scale edge 448 * 2^k, rounded down: named once, with
        # the count; the group's e4m3 codes are then judged at the code it got (below)
        idx = tuple(one_low.nonzero()[0].tolist())
        out.append(Violation(MXFP8_SCALE_ONE_LOW, f"mxfp8 scale codes{list(idx)} ({int(one_low.sum())} groups)",
                             fmt(int(want_s[idx])), fmt(int(got_s[idx]))))
    out += compare_exact("mxfp8 scale codes", torch.where(one_low, want_s, got_s.to(torch.int64)), want_s)
    if got_s.numel() and int(got_s.max()) > ref.CODE_CAP:
        out.append(Violation("mxfp8 scale code above the cap (255 is NaN in e8m0, +inf in readers)",
                             "scales", f"<= {ref.CODE_CAP}", str(int(got_s.max()))))
    want_c = _codes_at_scales(x.cpu(), got_s, want)
    g, w = got_c.to(torch.int64), want_c.to(torch.int64)
    other_nan = ((g & 0x7F) == 0x7F) & ((w & 0x7F) == 0x7F) & (g != w)
    if bool(other_nan.any()):
        idx = tuple(other_nan.nonzero()[0].tolist())
        out.append(Violation(MXFP8_OTHER_NAN, f"mxfp8 e4m3 codes{list(idx)} ({int(other_nan.sum())} lanes)",
                             fmt(int(w[idx])), fmt(int(g[idx]))))
    # a group holding +-inf has the cap's scale code: its finite lanes are scaled by 2^(127 - code), a subnormal
    # fp32 factor, and the infinite lane's code is the conversion's overflow rule; differences there are named once
    # two kinds of group sit at the ends of fp32's range, where the quantizer's arithmetic (not its rules) decides
    # the last code: one holding +-inf (its scale code is the cap, its finite lanes scaled by a subnormal factor
    # 2^(127 - code)) and one whose amax / 448 is fp32-subnormal (amax < 448 * 2^-126, U6's other end, where the
    # fp32 quotient and log2 lose bits): differences there are named once
    xf = x.cpu().to(torch.float32).reshape(rows, width // 32, 32)
    named = other_nan.clone()
    for msg, grp in ((MXFP8_INF_GROUP, torch.isinf(xf).any(-1)),
                     (MXFP8_SUBNORMAL_GROUP, _subnormal_quotient(torch.nan_to_num(xf.abs(), nan=0.0).amax(-1)))):
        lanes = grp.repeat_interleave(32, dim=1) & (g != w) & ~named
        if bool(lanes.any()):
            idx = tuple(lanes.nonzero()[0].tolist())
            out.append(Violation(msg, f"mxfp8 e4m3 codes{list(idx)} ({int(lanes.sum())} lanes)",
                                 fmt(int(w[idx])), fmt(int(g[idx]))))
            named |= lanes
    out += compare_exact("mxfp8 e4m3 codes", torch.where(named, w, g), w)
    return out


MXFP8_OTHER_NAN = "mxfp8 e4m3 NaN lane written as the other NaN code (0x7F and 0xFF are both NaN)"
MXFP8_INF_GROUP = "mxfp8 e4m3 codes differ in a group holding an infinite value (its scale code is the cap)"
MXFP8_SUBNORMAL_GROUP = "mxfp8 e4m3 codes differ in a group whose amax / 448 is fp32-subnormal"
MXFP8_SCALE_ONE_LOW = "mxfp8 scale code one below the exact code: the group's amax exceeds 448 * 2^(code - 127)"


LAYOUT_REFUSAL_UNCLEAR = "refusal of a non-packed layout does not name the argument"
LAYOUT_REFUSAL_WROTE = "refusal of a non-packed layout wrote the output"
GAP_WRITTEN = "bytes between the strided output rows were written"


def _refusal(*names: str, exc: Exception, untouched: bool) -> list[Violation]:
    """A refused non-packed layout: the message names one of ``names``, the outputs are untouched."""
    out = []
    if not any(str(exc).startswith(f"{n}:") or f" {n}" in str(exc) for n in names):
        out.append(Violation(LAYOUT_REFUSAL_UNCLEAR, "error message", f"one of {list(names)}", str(exc)[:200]))
    if not untouched:
        out.append(Violation(LAYOUT_REFUSAL_WROTE, "/".join(names), "unchanged", "written"))
    return out


def _gaps_untouched(buf: torch.Tensor, view: torch.Tensor, name: str) -> list[Violation]:
    mask = torch.ones(buf.numel(), dtype=torch.bool, device=buf.device)
    offs = (torch.arange(view.shape[0], device=buf.device)[:, None] * view.stride(0)
            + torch.arange(view.shape[1], device=buf.device)[None, :] + view.storage_offset() - buf.storage_offset())
    mask[offs.flatten()] = False
    if bool((buf.reshape(-1)[mask] == 0xA5).all()):
        return []
    return [Violation(GAP_WRITTEN, f"{name}'s buffer", "0xa5 (the poison)", "written")]


def _subnormal_quotient(amax: torch.Tensor) -> torch.Tensor:
    """Groups whose amax / 448 is fp32-subnormal; an all-zero group is not one (its codes are exact zeros, signs
    kept)."""
    return (amax > 0) & (amax < 448 * 2.0 ** -126)


def _codes_at_scales(x: torch.Tensor, got_s: torch.Tensor, want: dict) -> torch.Tensor:
    """The reference e4m3 codes of ``x`` at the scale codes the subject wrote: the reference's own codes where its
    scale agrees, else each lane encoded at the written code (oracles.epilogues' OCP encoder), so that the values
    are judged on their own even where the scale is not the exact one."""
    codes = want["codes"].clone()
    W = x.shape[-1]
    flat_x = x.to(torch.float64).reshape(-1, W)
    flat_c = codes.view(-1, W)
    gs, ws = got_s.reshape(flat_x.shape[0], -1), want["scales"].reshape(flat_x.shape[0], -1)
    for r, g in (gs.to(torch.int64) != ws.to(torch.int64)).nonzero().tolist():
        code = int(gs[r, g])
        for lane in range(g * ref.GROUP, (g + 1) * ref.GROUP):
            flat_c[r, lane] = ref._encode_ocp(float(flat_x[r, lane]) * math.ldexp(1.0, 127 - code))[0]
    return codes


#: an accepted non-packed layout read as if packed (the same values packed pass)
LAYOUT_DIFFERS = "inverse RoPE with a non-packed layout differs from the same inputs packed"


def _check_rope(case: RopeCase, epi) -> list[Violation]:
    x, cos_sin, positions = fz.rope_input(case, kernel_device())
    out_dtype = fz.DTYPES[case.out_dtype]
    x, out_buf = fz.rope_out(case, x, out_dtype)
    x_before = x.cpu().clone()  # the reference reads x as given (an in-place call overwrites it)
    T, H, W = x.shape
    out: list[Violation] = []
    try:
        got = epi.inverse_rope_gptj(x, cos_sin, positions, out=out_buf)
    except EntryMissing:
        if out_dtype == torch.bfloat16:
            raise
        # a subject whose inverse RoPE writes bf16 only (upstream's) is judged on the same rows at its own output
        # dtype, against the bf16 bound (in a buffer of its own: a float32 x cannot be its bf16 out)
        out_dtype = torch.bfloat16
        out_buf = torch.full((T, H, W), float("nan"), dtype=out_dtype, device=x.device)
        got = epi.inverse_rope_gptj(x, cos_sin, positions, out=out_buf)
    except ValueError as exc:
        if case.alias in fz.ROPE_REFUSABLE_ALIASES:  # an out overlapping x without being x: refusing is right
            return []
        if case.layout != "contiguous":  # a layout the entry point requires packed: refused, out untouched
            names = {"positions-strided": ("positions",), "table-slice": ("cos_sin",)}.get(case.layout, ("x",))
            return _refusal(*names, exc=exc, untouched=bool(torch.isnan(out_buf.float()).all())
                            if case.alias == "separate" else True) + _check_rope(case.replace(layout="contiguous"), epi)
        raise
    if case.alias in ("in-place", "adjacent") and got.data_ptr() != out_buf.data_ptr():
        out.append(Violation("inverse RoPE result not written into the given out", f"out ({case.alias})",
                             "out's data pointer", "a new tensor"))
    x = x_before
    got = got.cpu().to(torch.float64)
    want, mag = ref.inverse_rope_gptj(x, cos_sin.cpu(), list(case.positions))
    head = W - ROPE_DIM
    # lanes before the RoPE block: copied, cast exactly as torch casts (round to nearest even)
    out += compare_exact("copied lanes", got[:, :, :head], x[:, :, :head].to(out_dtype).to(torch.float64))
    g_r, w_r, m_r = got[:, :, head:], want[:, :, head:], mag[:, :, head:]
    nan_w, nan_g = torch.isnan(w_r), torch.isnan(g_r)
    for idx in (nan_w != nan_g).nonzero()[:3].tolist():
        i = tuple(idx)
        out.append(Violation("inverse RoPE NaN mask differs", f"row {i[:2]} lane {head + i[2]}",
                             fmt(w_r[i].item()), fmt(g_r[i].item())))
    inf_w = torch.isinf(w_r)
    bad_inf = inf_w & ~nan_g & (g_r != w_r)
    for idx in bad_inf.nonzero()[:3].tolist():
        i = tuple(idx)
        out.append(Violation("inverse RoPE inf differs", f"row {i[:2]} lane {head + i[2]}", fmt(w_r[i].item()),
                             fmt(g_r[i].item())))
    fin = torch.isfinite(w_r)
    bound = ref.rope_error_bound(w_r, m_r, out_dtype)
    err = (g_r - w_r).abs()
    bad = fin & ~(err <= bound)  # NaN/inf in got where want is finite fails too
    record_margin(err[fin], bound[fin])
    for idx in bad.nonzero()[:3].tolist():
        i = tuple(idx)
        out.append(Violation("inverse RoPE outside the float32 error bound", f"row {i[:2]} lane {head + i[2]}",
                             f"{w_r[i].item()!r} +- {bound[i].item():.3g}", fmt(g_r[i].item())))
    if case.alias in ("restrided", "shifted", "tail") and out:
        # an out that overlaps x without being x, accepted, and a wrong result: one violation naming that (the
        # lanes it got wrong are where the writes landed on lanes still to be read); refusing it is the contract
        first = out[0]
        return [Violation(f"an out overlapping x without being x ({case.alias}) was accepted and the result is "
                          f"wrong", first.where, "a ValueError naming out, or the oracle's rows", first.got)]
    if case.layout != "contiguous" and out and not _check_rope(case.replace(layout="contiguous"), epi):
        # accepted in a non-packed layout, wrong there and right on the same values packed: one violation naming
        # the layout as the cause (a finding can name it without explaining every wrong inverse RoPE)
        first = out[0]
        return [Violation(f"{LAYOUT_DIFFERS}: layout={case.layout}", first.where,
                          "the rows of the same inputs packed", first.got)]
    return out


def _epilogue_examples(target: Target) -> list[EpilogueCase]:
    groups = fz.mxfp8_boundary_groups()
    return [
        EpilogueCase(epilogue="mxfp8", mxfp8=Mxfp8Case(
            seed=1, rows=1, width=32 * len(groups), dtype="float32", layout="contiguous",
            groups=tuple(Mxfp8Group(kind="values", values=tuple(g)) for g in groups))),
        EpilogueCase(epilogue="mxfp8", mxfp8=Mxfp8Case(
            seed=2, rows=1, width=512, dtype="bfloat16", layout="strided",
            groups=tuple(Mxfp8Group(kind="random", exp=e) for e in range(-150, 128, 18)))),
        EpilogueCase(epilogue="rope", rope=RopeCase(
            seed=3, tokens=2, heads=2, width=512, max_pos=5, positions=(4, 0), scale=1.0, in_dtype="float32",
            out_dtype="bfloat16", cos_sin="angles")),
        # a width whose copied lanes end inside a copy block (96 - 64 = 32 of 64), float32 and in place: the block's
        # lanes past the copied ones are RoPE lanes of the same row, which the kernel reads after the copy
        EpilogueCase(epilogue="rope", rope=RopeCase(
            seed=4, tokens=2, heads=2, width=96, max_pos=5, positions=(4, 1), scale=1.0, in_dtype="float32",
            out_dtype="float32", cos_sin="angles", alias="in-place")),
    ]


def _epilogue_cases(target: Target):
    return fz.epilogue_cases()


@contract("epilogue-oracle-agreement", targets=ALL_TARGETS, cases=_epilogue_cases, examples=_epilogue_examples,
          min_cases=5, case_type=EpilogueCase, numeric=True)
def epilogue_oracle_agreement(case: EpilogueCase, target: Target) -> list[Violation]:
    """The reduce epilogues agree with their float64 references.

    Inverse GPT-J RoPE on the last 64 lanes (even' = a*cos + b*sin, odd' = b*cos - a*sin; cos_i in column i and
    sin_i in column 32 + i of the position's row): NaN and inf positions exactly, finite lanes within the derived
    float32 bound (two products and a sum, then the output cast; see oracles.epilogues.rope_error_bound), the other
    lanes copied exactly. MXFP8 (gfx950's output format, a pure function of the rows so checked on every target):
    one UE8M0 code per 32 lanes aligned at lane 0, clamp(ceil(log2(amax / 448)) + 127, 0, 254), and OCP e4m3 values,
    byte-exact from the same float32 rows, with exact ties (round to even) and amax exactly 448 * 2^k included.
    Source: SPEC 2 "Optional epilogues"; SPEC 4 (why 254: 255 is NaN in e8m0 and +inf in the readers). Margin:
    the worst RoPE lane's error over its bound (MXFP8 is byte-exact, so it adds none). A scale code one below the
    exact one is named as such, and a group's e4m3 codes are always judged at the scale code it got (so one wrong
    scale is one violation); a NaN lane written as 0xFF instead of 0x7F is named as such too. A subject whose inverse RoPE writes bf16 only is judged at bf16 on float32-output cases.
    RoPE's ``out`` may be x itself (an exact in-place call) or a buffer disjoint from x in x's storage: both must
    give the reference's rows; an out that overlaps x any other way (x's first element with other strides, or from
    half a row in, or only at x's last element) must be refused with a ValueError or give the reference's rows of
    x as it was before the call. x, cos_sin, positions and the MXFP8 outputs in other memory layouts are refused
    naming the argument (outputs untouched) or give the reference's values.
    """
    epi = bound(target).epilogues
    if case.epilogue == "mxfp8":
        return _check_mxfp8(case.mxfp8, epi)
    return _check_rope(case.rope, epi)
