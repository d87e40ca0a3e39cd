"""Graph-safety contracts for the sparse decode: persistent ragged views, reduce epilogues, per-target dispatch.

Sources: SPEC section 2 (``_copy_ragged_to_graph_buffers``, adaptive splits, optional reduce epilogues) and
section 4 (the trust gate); seed 004 (the gfx950 decode change and its review: gfx950 specialisations must not leak
into gfx942); DESIGN.md (``ragged-view-capacity``).
"""
from __future__ import annotations

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt
from fuzz import graph as fz
from impl.dispatch import decode_dispatch
from impl.epilogues import ROPE_DIM, inverse_rope_gptj, mxfp8_quantize
from impl.graph_buffers import copy_ragged_to_graph_buffers
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import epilogues as ref
from oracles import graph_buffers as ref_gb
from oracles.dispatch import expected_dispatch

SENTINEL = -7777  # what the persistent buffers hold before a copy: any entry the copy should not touch keeps it


# --- ragged-view-capacity ---------------------------------------------------------------------------------------

def _graph_buffer_inputs(case) -> dict:
    """Source tensors, buffer lengths and the storage pools of the buffers for a graph-buffer case."""
    g = torch.Generator().manual_seed(case["seed"])
    num_rows, max_per_row = case["num_rows"], case["max_per_row"]
    lens = list(case["lens"])
    defect = case.get("defect")
    if defect == "row-too-long" and num_rows:
        lens[0] = max_per_row + 1
    indptr = [0]
    for n in lens:
        indptr.append(indptr[-1] + n)
    nnz = indptr[-1]
    capacity = max(num_rows * max_per_row, 1)
    width = nnz + case["source_extra"]
    if defect == "row-too-long":
        width = max(width, nnz)
    if defect == "source-too-wide":
        width = capacity + 1
    if defect == "nnz-beyond-source" and nnz:
        width = nnz - 1
    if defect == "indptr-nonzero-start":
        indptr = [v + 1 for v in indptr]
    # live entries are slot ids; entries past the NNZ are whatever the builder left there (-1, INT32 extremes)
    live = torch.randint(0, 1 << 20, (width,), generator=g, dtype=torch.int64)
    junk = torch.tensor([-1, fz.INT32_MIN, fz.INT32_MAX], dtype=torch.int64)[
        torch.randint(0, 3, (width,), generator=g)]
    source = torch.where(torch.arange(width) < nnz, live, junk).to(torch.int32)
    indices_len = capacity + case["indices_slack"]
    indptr_len = num_rows + 1 + case["indptr_slack"]
    if defect == "indices-buffer-short":
        indices_len = capacity - 1
    if defect == "indptr-buffer-short":
        indptr_len = num_rows
    return {"source": source, "indptr": indptr, "indices_len": indices_len, "indptr_len": indptr_len}


def _pool_buffer(length: int, offset: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """A persistent buffer that is a view at ``offset`` into a larger pool (so base pointer != pool pointer), all
    of the pool holding the sentinel."""
    pool = torch.full((length + offset + 2,), SENTINEL, dtype=torch.int32, device=device)
    return pool, pool[offset:offset + length]


def _graph_buffer_cases(target: Target):
    return fz.graph_buffer_cases()


def _graph_buffer_examples(target: Target):
    base = {"seed": 3, "indices_slack": 0, "indptr_slack": 0, "pool_offset": 0, "defect": None}
    return [
        # upstream's graph-buffer test (SPEC 2): 3 live entries in a source 6 wide, capacity 16 -> a view of 6
        # entries on gfx950 and 16 on gfx942, at the same data pointer
        {**base, "num_rows": 2, "max_per_row": 8, "lens": [2, 1], "source_extra": 3},
        {**base, "num_rows": 0, "max_per_row": 5, "lens": [], "source_extra": 0},
        {**base, "num_rows": 3, "max_per_row": 0, "lens": [0, 0, 0], "source_extra": 0},
        {**base, "num_rows": 4, "max_per_row": 3, "lens": [3, 0, 3, 1], "source_extra": 0, "pool_offset": 3},
    ]


def _check_rejected(case, target: Target, inp, device) -> list[Violation]:
    """A bad input: the named argument is rejected with ValueError/TypeError and neither buffer changes."""
    out: list[Violation] = []
    num_rows, max_per_row = case["num_rows"], case["max_per_row"]
    defect = case["defect"]
    source = inp["source"].to(device)
    if defect == "int64-source":
        source = source.to(torch.int64)
        want_arg, want_types = "ragged_indices", (TypeError,)
    else:
        want_arg = ref_gb.rejected_argument(num_rows, max_per_row, inp["source"].tolist(), inp["indptr"],
                                            inp["indices_len"], inp["indptr_len"])
        want_types = (ValueError,)
    ipool, ibuf = _pool_buffer(inp["indices_len"], case["pool_offset"], device)
    ppool, pbuf = _pool_buffer(inp["indptr_len"], case["pool_offset"], device)
    indptr = torch.tensor(inp["indptr"], dtype=torch.int32, device=device)
    try:
        res = copy_ragged_to_graph_buffers(source, indptr, ibuf, pbuf, num_rows, max_per_row, target=target)
    except (ValueError, TypeError) as exc:
        if want_arg is None:
            out.append(Violation(f"a valid input was rejected ({defect})", "copy_ragged_to_graph_buffers",
                                 "no error", f"{type(exc).__name__}: {exc}"))
        elif not isinstance(exc, want_types) or want_arg not in str(exc):
            out.append(Violation(f"bad input ({defect}) rejected without naming the argument",
                                 "copy_ragged_to_graph_buffers",
                                 f"{'/'.join(t.__name__ for t in want_types)} naming {want_arg}",
                                 f"{type(exc).__name__}: {exc}"))
    else:
        if want_arg is not None:
            out.append(Violation(f"bad input ({defect}) accepted", "copy_ragged_to_graph_buffers",
                                 f"an error naming {want_arg}", f"views of {fmt(res[0].numel())} and "
                                 f"{fmt(res[1].numel())} entries"))
        return out
    for name, pool in (("indices pool", ipool), ("indptr pool", ppool)):
        changed = (pool != SENTINEL).nonzero().flatten()
        if len(changed):
            out.append(Violation(f"rejected input still wrote the {name}", f"{name}[{int(changed[0])}]",
                                 str(SENTINEL), str(int(pool[changed[0]]))))
    return out


@contract("ragged-view-capacity", targets=ALL_TARGETS, cases=_graph_buffer_cases, examples=_graph_buffer_examples,
          min_cases=5)
def ragged_view_capacity(case, target: Target) -> list[Violation]:
    """Graph-buffer views keep the persistent base pointer, cover the true NNZ, stay in the buffer, follow the rule.

    ``copy_ragged_to_graph_buffers`` returns (indices view, indptr view). Both start at their persistent buffer's
    data pointer (a captured graph reads that address) and lie inside the buffer; the indptr view is the whole
    source indptr (``num_rows + 1`` entries, its last one the true NNZ) and the indices view's capacity covers that
    NNZ, with the live entries copied; its length is exactly the target's rule: ``max(num_rows * max_per_row, 1)``
    on gfx942 and generic, ``max(source.numel(), 1)`` on gfx950, where the source may be wider than the NNZ. Nothing
    outside the copied entries changes. Bad inputs (buffers too small, a source wider than the capacity, NNZ beyond
    the source, rows longer than ``max_per_row``, a non-int32 source) are rejected, naming the argument, before
    anything is written. Source: SPEC 2; seed 004 (gfx950 narrows the view; gfx942 must not); DESIGN.md.
    """
    device = kernel_device()
    inp = _graph_buffer_inputs(case)
    if case.get("defect"):
        return _check_rejected(case, target, inp, device)
    out: list[Violation] = []
    num_rows, max_per_row = case["num_rows"], case["max_per_row"]
    source = inp["source"].to(device)
    indptr = torch.tensor(inp["indptr"], dtype=torch.int32, device=device)
    ipool, ibuf = _pool_buffer(inp["indices_len"], case["pool_offset"], device)
    ppool, pbuf = _pool_buffer(inp["indptr_len"], case["pool_offset"], device)
    ibase, pbase = ibuf.data_ptr(), pbuf.data_ptr()
    ipool_before, ppool_before = ipool.clone(), ppool.clone()
    iview, pview = copy_ragged_to_graph_buffers(source, indptr, ibuf, pbuf, num_rows, max_per_row, target=target)
    iview_c, pview_c = iview.clone().cpu(), pview.clone().cpu()

    want = ref_gb.expected_after_copy(target.name, num_rows, max_per_row, inp["source"].tolist(), inp["indptr"],
                                      ibuf.new_full((inp["indices_len"],), SENTINEL).tolist(),
                                      pbuf.new_full((inp["indptr_len"],), SENTINEL).tolist())
    for name, view, buf, base, pool in (("indices view", iview, ibuf, ibase, ipool),
                                        ("indptr view", pview, pbuf, pbase, ppool)):
        if view.data_ptr() != base:
            out.append(Violation(f"{name} does not start at the persistent base pointer", name,
                                 hex(base), hex(view.data_ptr())))
        same_storage = view.untyped_storage().data_ptr() == pool.untyped_storage().data_ptr()
        if not same_storage:
            out.append(Violation(f"{name} is not a view of the persistent buffer (reallocated)", name,
                                 "a view of the buffer", "separate storage"))
        elif view.dim() != 1 or view.stride(0) != 1 or \
                view.storage_offset() + view.numel() > buf.storage_offset() + buf.numel() or \
                view.storage_offset() < buf.storage_offset():
            out.append(Violation(f"{name} leaves its buffer", name,
                                 f"entries [{buf.storage_offset()}, {buf.storage_offset() + buf.numel()})",
                                 f"offset {view.storage_offset()}, {view.numel()} entries, stride "
                                 f"{list(view.stride())}"))
    if pview_c.numel() != num_rows + 1:
        out.append(Violation("indptr view does not hold num_rows + 1 entries", "indptr view",
                             str(num_rows + 1), str(pview_c.numel())))
    else:
        out += compare_exact("indptr view", pview_c, torch.tensor(want["indptr_view"], dtype=torch.int32))
    # the capacity promise is stated against the NNZ the decode will read: the returned indptr's last entry
    nnz_seen = int(pview_c[-1]) if pview_c.numel() else 0
    if iview_c.numel() < max(nnz_seen, want["nnz"]):
        out.append(Violation("indices view narrower than the NNZ (reads past the view)", "indices view",
                             f">= {want['nnz']} entries", f"{iview_c.numel()}"))
    if iview_c.numel() != want["view_length"]:
        rule = ref_gb.VIEW_RULE_BY_ARCH[target.name]
        out.append(Violation(f"indices view length does not follow the {target.name} rule ({rule})",
                             "indices view", str(want["view_length"]), str(iview_c.numel())))
    else:
        out += compare_exact("indices view", iview_c, torch.tensor(want["indices_view"], dtype=torch.int32))
    pool_want_i = ipool_before.clone().cpu()
    pool_want_i[case["pool_offset"]:case["pool_offset"] + inp["indices_len"]] = torch.tensor(
        want["indices_buffer"], dtype=torch.int32)
    pool_want_p = ppool_before.clone().cpu()
    pool_want_p[case["pool_offset"]:case["pool_offset"] + inp["indptr_len"]] = torch.tensor(
        want["indptr_buffer"], dtype=torch.int32)
    out += compare_exact("indices pool after the copy", ipool.cpu(), pool_want_i, limit=3)
    out += compare_exact("indptr pool after the copy", ppool.cpu(), pool_want_p, limit=3)
    return out


# --- epilogue-oracle-agreement ----------------------------------------------------------------------------------

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _mxfp8_input(case) -> torch.Tensor:
    """The float32 (or bf16) rows of an MXFP8 case, built group by group; strided layouts are row views into a
    wider buffer."""
    g = torch.Generator().manual_seed(case["seed"])
    vals: list[float] = []
    for grp in case["groups"]:
        if "values" in grp:
            vals += [float(v) for v in grp["values"]]
            continue
        if grp["kind"] == "zero":
            lanes = [0.0] * 32
        else:
            lanes = (torch.randn(32, generator=g, dtype=torch.float64) * 2.0 ** grp["exp"]).tolist()
        for i, v in grp["specials"]:
            lanes[i] = float(v)
        vals += lanes
    rows, width = case["rows"], case["width"]
    x = torch.tensor(vals, dtype=torch.float64).to(torch.float32).reshape(rows, width).to(_DTYPES[case["dtype"]])
    x = x.to(kernel_device())
    if case["layout"] == "strided":
        wide = torch.full((rows, 2 * width), float("nan"), dtype=x.dtype, device=x.device)
        wide[:, :width] = x
        x = wide[:, :width]
    return x


def _check_mxfp8(case) -> list[Violation]:
    x = _mxfp8_input(case)
    rows, width = case["rows"], case["width"]
    codes = torch.full((rows, width), 0xA5, dtype=torch.uint8, device=x.device)
    scales = torch.full((rows, width // 32), 0xA5, dtype=torch.uint8, device=x.device)
    got_c, got_s = mxfp8_quantize(x, codes=codes, scales=scales)
    out: list[Violation] = []
    if got_c.data_ptr() != codes.data_ptr() or got_s.data_ptr() != scales.data_ptr():
        out.append(Violation("mxfp8 outputs not written into the given buffers", "codes/scales", "the same data "
                             "pointers", "new tensors"))
    got_c, got_s = got_c.cpu().clone(), got_s.cpu().clone()
    want = ref.mxfp8_quantize(x.cpu())
    out += compare_exact("mxfp8 scale codes", got_s, want["scales"])
    if got_s.numel() and int(got_s.max()) > ref.CODE_CAP:
        out.append(Violation("mxfp8 scale code above the cap (255 is NaN in e8m0, +inf in readers)",
                             "scales", f"<= {ref.CODE_CAP}", str(int(got_s.max()))))
    out += compare_exact("mxfp8 e4m3 codes", got_c, want["codes"])
    return out


def _rope_input(case):
    g = torch.Generator().manual_seed(case["seed"])
    T, H, W = case["tokens"], case["heads"], case["width"]
    x = (torch.randn(T, H, W, generator=g, dtype=torch.float64) * case["scale"]).to(torch.float32)
    flat = x.view(-1)
    for i, v in case["specials"]:
        flat[i] = float(v)
    x = x.to(_DTYPES[case["in_dtype"]])
    P = case["max_pos"]
    if case["cos_sin"] == "exact":
        choices = torch.tensor([0.0, 1.0, -1.0, 0.5, -0.5, 0.75])
        cos = choices[torch.randint(0, len(choices), (P, 32), generator=g)]
        sin = choices[torch.randint(0, len(choices), (P, 32), generator=g)]
    else:
        # theta_i * p with a GPT-J-like frequency ladder
        theta = torch.arange(P, dtype=torch.float64)[:, None] * (10000.0 ** (-torch.arange(32) / 32.0))[None, :]
        theta = theta + torch.rand(P, 32, generator=g, dtype=torch.float64)
        cos, sin = theta.cos(), theta.sin()
    cos_sin = torch.cat([cos, sin], dim=1).to(torch.float32)
    dev = kernel_device()
    return x.to(dev), cos_sin.to(dev), torch.tensor(case["positions"], dtype=torch.int64, device=dev)


def _check_rope(case) -> list[Violation]:
    x, cos_sin, positions = _rope_input(case)
    out_dtype = _DTYPES[case["out_dtype"]]
    T, H, W = x.shape
    out_buf = torch.full((T, H, W), float("nan"), dtype=out_dtype, device=x.device)
    got = inverse_rope_gptj(x, cos_sin, positions, out=out_buf).cpu().to(torch.float64)
    want, mag = ref.inverse_rope_gptj(x.cpu(), cos_sin.cpu(), case["positions"])
    out: list[Violation] = []
    head = W - ROPE_DIM
    # lanes before the RoPE block: copied, cast exactly as torch casts (round to nearest even)
    out += compare_exact("copied lanes", got[:, :, :head], x.cpu()[:, :, :head].to(out_dtype).to(torch.float64))
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
    for idx in bad.nonzero()[:3].tolist():
        i = tuple(idx)
        out.append(Violation("inverse RoPE outside the float32 error bound", f"row {i[:2]} lane {head + i[2]}",
                             f"{w_r[i].item()!r} +- {bound[i].item():.3g}", fmt(g_r[i].item())))
    return out


def _epilogue_examples(target: Target):
    groups = fz.mxfp8_boundary_groups()
    return [
        {"epilogue": "mxfp8", "seed": 1, "rows": 1, "width": 32 * len(groups), "dtype": "float32",
         "layout": "contiguous", "groups": [{"values": g} for g in groups]},
        {"epilogue": "mxfp8", "seed": 2, "rows": 1, "width": 512, "dtype": "bfloat16", "layout": "strided",
         "groups": [{"kind": "random", "exp": e, "specials": []} for e in range(-150, 128, 18)]},
        {"epilogue": "rope", "seed": 3, "tokens": 2, "heads": 2, "width": 512, "max_pos": 5, "positions": [4, 0],
         "scale": 1.0, "specials": [], "in_dtype": "float32", "out_dtype": "bfloat16", "cos_sin": "angles"},
    ]


def _epilogue_cases(target: Target):
    return fz.epilogue_cases()


@contract("epilogue-oracle-agreement", targets=ALL_TARGETS, cases=_epilogue_cases, examples=_epilogue_examples,
          min_cases=5)
def epilogue_oracle_agreement(case, target: Target) -> list[Violation]:
    """The reduce epilogues agree with their float64 references.

    Inverse GPT-J RoPE on the last 64 lanes (even' = a*cos + b*sin, odd' = b*cos - a*sin; cos_i in column i and
    sin_i in column 32 + i of the position's row): NaN and inf positions exactly, finite lanes within the derived
    float32 bound (two products and a sum, then the output cast; see oracles.epilogues.rope_error_bound), the other
    lanes copied exactly. MXFP8 (gfx950's output format, a pure function of the rows so checked on every target):
    one UE8M0 code per 32 lanes aligned at lane 0, clamp(ceil(log2(amax / 448)) + 127, 0, 254), and OCP e4m3 values,
    byte-exact from the same float32 rows, with exact ties (round to even) and amax exactly 448 * 2^k included.
    Source: SPEC 2 "Optional epilogues"; SPEC 4 (why 254: 255 is NaN in e8m0 and +inf in the readers).
    """
    if case["epilogue"] == "mxfp8":
        return _check_mxfp8(case)
    return _check_rope(case)


# --- target-dispatch --------------------------------------------------------------------------------------------

def _dispatch_examples(target: Target):
    return [{"flags": fz.dispatch_flag_grid()}]


def _dispatch_cases(target: Target):
    return fz.dispatch_cases()


@contract("target-dispatch", targets=ALL_TARGETS, cases=_dispatch_cases, examples=_dispatch_examples, min_cases=5)
def target_dispatch(case, target: Target) -> list[Violation]:
    """For every target and flag combination the decode dispatch equals an independent truth table.

    Flags: compress ratio (0, 1, 4, 128), SWA-only, graph capture, extra cache present, KV-cache dtype, KV transfer.
    Compared: kernel family, split selector and cap (gfx942 keeps the legacy path and the 16 cap; gfx950 32; the
    generic fallback none), adaptive splits (only gfx950, ratio 128, under capture, not SWA-only), ragged-view rule
    (full on gfx942/generic, source on gfx950), the trust gate (gfx950, fp8_ds_mla, no KV transfer, an extra cache),
    the fp8 flavours, the capture flag carried through; contradictory flags rejected with ValueError. The pinned
    example enumerates the whole grid. Source: SPEC 2 and 4; seed 004 (review: gfx950 changes must not reach gfx942).
    """
    out: list[Violation] = []
    for flags in case["flags"]:
        want = expected_dispatch(target.name, **flags)
        where = ", ".join(f"{k}={v}" for k, v in flags.items())
        try:
            got = decode_dispatch(target.name, **flags)
        except ValueError as exc:
            if want is not None:
                out.append(Violation("valid flags rejected", where, "a dispatch", f"ValueError: {exc}"))
            continue
        if want is None:
            out.append(Violation("contradictory flags accepted", where, "ValueError", fmt(got)))
            continue
        for key, value in want.items():
            g = getattr(got, key, "<missing>")
            if g != value:
                out.append(Violation(f"dispatch {key} differs from the truth table", where, fmt(value), fmt(g)))
        if len(out) >= 8:
            break
    return out
