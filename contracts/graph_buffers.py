"""Graph-buffer contract (``impl.graph_buffers``): persistent ragged views for the captured sparse decode.

Sources: SPEC section 2 (``_copy_ragged_to_graph_buffers``); seed 004 (the gfx950 decode change and its review:
gfx950 specialisations must not leak into gfx942); DESIGN.md (``ragged-view-capacity``).
"""
from __future__ import annotations

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt
from contracts.subjects import SubjectError, SubjectSkip, bound
from fuzz import graph_buffers as fz
from fuzz.graph_buffers import GraphBufferCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import graph_buffers as ref_gb

SENTINEL = -7777  # what the persistent buffers hold before a copy: any entry the copy should not touch keeps it
#: exceptions that say nothing about the copy's code (no entry point, a stand-in reached, an untrusted
#: interpreter): they end the row; every other exception from a bad input is the rejection being judged
_NOT_A_VERDICT = (SubjectSkip, SubjectError)


# --- ragged-view-capacity ---------------------------------------------------------------------------------------

def _pool_buffer(length: int, offset: int, device, layout: str = "contiguous") -> tuple[torch.Tensor, torch.Tensor]:
    """A persistent buffer that is a view at ``offset`` into a larger pool (so base pointer != pool pointer), all
    of the pool holding the sentinel; ``layout`` "strided": every other entry of the pool from ``offset`` on."""
    step = 2 if layout == "strided" else 1
    pool = torch.full((step * length + offset + 2,), SENTINEL, dtype=torch.int32, device=device)
    return pool, pool[offset:offset + step * length:step]


def _graph_buffer_cases(target: Target):
    return fz.graph_buffer_cases()


def _graph_buffer_examples(target: Target) -> list[GraphBufferCase]:
    return [
        # upstream's graph-buffer test (SPEC 2): 3 live entries in a source 6 wide, capacity 16 -> a view of 6
        # entries on gfx950 and 16 on gfx942, at the same data pointer
        GraphBufferCase(seed=3, num_rows=2, max_per_row=8, lens=(2, 1), source_extra=3),
        GraphBufferCase(seed=3, num_rows=0, max_per_row=5, lens=(), source_extra=0),
        GraphBufferCase(seed=3, num_rows=3, max_per_row=0, lens=(0, 0, 0), source_extra=0),
        GraphBufferCase(seed=3, num_rows=4, max_per_row=3, lens=(3, 0, 3, 1), source_extra=0, pool_offset=3),
    ]


def _check_rejected(case: GraphBufferCase, target: Target, inp: fz.GraphBufferInputs, device) -> list[Violation]:
    """A bad input: the named argument is rejected with ValueError/TypeError and neither buffer changes."""
    out: list[Violation] = []
    num_rows, max_per_row = case.num_rows, case.max_per_row
    defect = case.defect
    source = fz.lay_out_source(inp.source, case.source_layout, device)
    if defect == "int64-source":
        source = source.to(torch.int64)
        want_arg, want_types = "ragged_indices", (TypeError,)
    elif defect is None:  # a strided persistent buffer (buffer_layout): the first one checked is named
        defect, want_arg, want_types = "strided-buffer", "indices_buffer", (ValueError,)
    else:
        want_arg = ref_gb.rejected_argument(num_rows, max_per_row, inp.source.tolist(), inp.indptr,
                                            inp.indices_len, inp.indptr_len)
        want_types = (ValueError,)
    ipool, ibuf = _pool_buffer(inp.indices_len, case.pool_offset, device, case.buffer_layout)
    ppool, pbuf = _pool_buffer(inp.indptr_len, case.pool_offset, device, case.buffer_layout)
    indptr = fz.lay_out_source(torch.tensor(inp.indptr, dtype=torch.int32), case.source_layout, device)
    copy = bound(target).graph_buffers.copy_ragged_to_graph_buffers
    try:
        res = copy(source, indptr, ibuf, pbuf, num_rows, max_per_row, target=target)
    except _NOT_A_VERDICT:
        raise
    except Exception as exc:  # noqa: BLE001 - any other rejection is judged: the promise names its type
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
          min_cases=5, case_type=GraphBufferCase, numeric=False)
def ragged_view_capacity(case: GraphBufferCase, target: Target) -> list[Violation]:
    """Graph-buffer views keep the persistent base pointer, cover the true NNZ, stay in the buffer, follow the rule.

    ``copy_ragged_to_graph_buffers`` returns (indices view, indptr view). Both start at their persistent buffer's
    data pointer (a captured graph reads that address) and lie inside the buffer; the indptr view is the whole
    source indptr (``num_rows + 1`` entries, its last one the true NNZ) and the indices view's capacity covers that
    NNZ, with the live entries copied; its length is exactly the target's rule: ``max(num_rows * max_per_row, 1)``
    on gfx942 and generic, ``max(source.numel(), 1)`` on gfx950, where the source may be wider than the NNZ. Nothing
    outside the copied entries changes. Bad inputs (buffers too small, a source wider than the capacity, NNZ beyond
    the source, rows longer than ``max_per_row``, a non-int32 source) are rejected, naming the argument, before
    anything is written. Layouts (issue 30): the sources come packed, as a slice of a larger buffer or strided
    (the copy must give what the packed sources give); persistent buffers that are strided views of their pools
    must be refused naming ``indices_buffer`` (the first checked), the pools untouched. Source: SPEC 2; seed 004
    (gfx950 narrows the view; gfx942 must not); DESIGN.md.
    """
    device = kernel_device()
    inp = fz.graph_buffer_inputs(case)
    if case.defect is not None or case.buffer_layout != "contiguous":
        return _check_rejected(case, target, inp, device)
    out: list[Violation] = []
    num_rows, max_per_row = case.num_rows, case.max_per_row
    source = fz.lay_out_source(inp.source, case.source_layout, device)
    indptr = fz.lay_out_source(torch.tensor(inp.indptr, dtype=torch.int32), case.source_layout, device)
    ipool, ibuf = _pool_buffer(inp.indices_len, case.pool_offset, device)
    ppool, pbuf = _pool_buffer(inp.indptr_len, case.pool_offset, device)
    ibase, pbase = ibuf.data_ptr(), pbuf.data_ptr()
    ipool_before, ppool_before = ipool.clone(), ppool.clone()
    copy = bound(target).graph_buffers.copy_ragged_to_graph_buffers
    iview, pview = copy(source, indptr, ibuf, pbuf, num_rows, max_per_row, target=target)
    iview_c, pview_c = iview.clone().cpu(), pview.clone().cpu()

    want = ref_gb.expected_after_copy(target.name, num_rows, max_per_row, inp.source.tolist(), inp.indptr,
                                      [SENTINEL] * inp.indices_len, [SENTINEL] * inp.indptr_len)
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
    off = case.pool_offset
    pool_want_i[off:off + inp.indices_len] = torch.tensor(want["indices_buffer"], dtype=torch.int32)
    pool_want_p = ppool_before.clone().cpu()
    pool_want_p[off:off + inp.indptr_len] = torch.tensor(want["indptr_buffer"], dtype=torch.int32)
    out += compare_exact("indices pool after the copy", ipool.cpu(), pool_want_i, limit=3)
    out += compare_exact("indptr pool after the copy", ppool.cpu(), pool_want_p, limit=3)
    return out
