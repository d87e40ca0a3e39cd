"""Contract ``ragged-helpers-oracle`` (the subject's ``ragged`` family): the three helpers that turn indexer output
and positions into the decode's slot ids, against the loop oracles of :mod:`oracles.ragged`, exactly.

Sources: SPEC 1.3 (SWA decode indices), SPEC 2 (dense -> ragged, C4A global slots), SPEC 9 (vLLM 0.33.0); cases and
inputs from :mod:`fuzz.ragged`. A difference is worded by its cause (the kind of input entry where it shows: a -1
hole, a position past the block table's width, a negative block id, a request outside the table, a padding or
invalid token), so that a known design difference of a subject is told apart from a bug.
"""
from __future__ import annotations

import torch

from contracts.core import ALL_TARGETS, Violation, contract, fmt, single_threaded
from contracts.subjects import SubjectError, SubjectSkip, bound
from fuzz import ragged as fz
from fuzz.ragged import INT32_MAX, INT32_MIN, DensePart, GlobalPart, RaggedCase, SwaPart
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import ragged as ref

#: exceptions that say nothing about the helper's code: they end the row (see contracts/graph_buffers.py)
_NOT_A_VERDICT = (SubjectSkip, SubjectError)
#: at most this many distinct messages per case (the first of each kind is enough to see the cause)
_MAX_MESSAGES = 8
ENTRY = {"dense": "build_ragged_indices_from_dense", "global": "compute_global_topk_ragged_indices_and_indptr",
         "swa": "compute_swa_indices_and_lens"}


class _Out:
    """Violations of one case, one per distinct message."""

    def __init__(self):
        self.v: list[Violation] = []

    def add(self, message, where, expected, got):
        if len(self.v) < _MAX_MESSAGES and all(x.message != message for x in self.v):
            self.v.append(Violation(message, where, str(expected), str(got)))


def _int32_1d(name: str, t, length: int | None, out: _Out, what: str) -> bool:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1 or \
            (length is not None and t.numel() != length):
        desc = f"{list(t.shape)} {t.dtype}" if isinstance(t, torch.Tensor) else type(t).__name__
        out.add(f"{what}: {name} is not a 1-D int32 tensor of the expected length", name,
                f"int32 [{length if length is not None else 'nnz'}]", desc)
        return False
    return True


def _split(indices: list, indptr: list, rows: int, out: _Out, what: str) -> list | None:
    """Per-row lists from (indices, indptr), or None (with a violation) when indptr is not well formed."""
    ok = (len(indptr) == rows + 1 and indptr[0] == 0 and all(a <= b for a, b in zip(indptr, indptr[1:]))
          and indptr[-1] == len(indices))
    if not ok:
        out.add(f"{what}: indptr is not a prefix sum from 0 to the number of indices", "indptr",
                f"{rows + 1} non-decreasing entries from 0 to {len(indices)}", fmt(indptr))
        return None
    return [indices[indptr[r]:indptr[r + 1]] for r in range(rows)]


def _cause(req: int, pos: int, case: RaggedCase) -> str | None:
    """Why the oracle gives -1 for the slot of position ``pos`` of request ``req`` (None: a real slot)."""
    R, nb, bs = len(case.block_table), case.table_width, case.block_size
    if pos < 0:
        return "negative"
    if not 0 <= req < R:
        return "request"
    if pos // bs >= nb:
        return "width"
    if case.block_table[req][pos // bs] < 0:
        return "block"
    return None


def _entry_message(what: str, kind: str, cause: str | None) -> str:
    """The message for a slot that differs, by the cause of the oracle's value (``kind``: "local id" or
    "position")."""
    return {
        "negative": f"{what}: a -1 entry is not -1",
        "request": f"{what}: a token whose request is outside the block table gets a slot (expected -1)",
        "width": f"{what}: a {kind} past the block table's width maps to a slot (expected -1)",
        "block": f"{what}: an entry whose block id is negative maps to a slot other than -1",
        None: f"{what}: slot differs from block_table[req, {'i' if kind == 'local id' else 'p'} // bs] * bs + "
              f"{'i' if kind == 'local id' else 'p'} % bs",
    }[cause]


# --- dense -> ragged ------------------------------------------------------------------------------------------------

def _check_dense(case: RaggedCase, got, out: _Out) -> None:
    what = "dense->ragged"
    idx, ptr = got
    d = case.dense
    R = len(d.rows)
    if not (_int32_1d("indices", idx, None, out, what) & _int32_1d("indptr", ptr, R + 1, out, what)):
        return
    want_idx, want_ptr = ref.ref_ragged_from_dense([list(r) for r in d.rows], None if d.lens is None else list(d.lens),
                                                   d.effective_num_rows)
    rows = _split(idx.tolist(), ptr.tolist(), R, out, what)
    if rows is None:
        return
    want_rows = [want_idx[want_ptr[r]:want_ptr[r + 1]] for r in range(R)]
    for r, (g, w) in enumerate(zip(rows, want_rows)):
        if g == w:
            continue
        if g == [v for v in w if v >= 0]:
            out.add(f"{what}: a row holds only its valid entries, compacted (the oracle keeps every one of the "
                    f"first len entries in place, -1 for an invalid one)", f"row {r}", fmt(w), fmt(g))
        elif len(g) != len(w):
            n = d.lens[r] if d.lens is not None else "count(>= 0)"
            out.add(f"{what}: a row's length differs from clamp(len, 0, width)", f"row {r} (len {n}, width "
                    f"{d.width})", len(w), len(g))
        else:
            j = next(j for j in range(len(w)) if g[j] != w[j])
            v = d.rows[r][j]
            if d.effective_num_rows >= 0 and not 0 <= v < d.num_rows:
                msg = f"{what}: a kept value outside [0, num_rows) is not -1"
            else:
                msg = f"{what}: a kept value differs from the dense entry"
            out.add(msg, f"row {r}, entry {j} (value {v}, num_rows {'left out (default)' if d.num_rows is None else d.num_rows})", w[j], g[j])


# --- C4A global slots -----------------------------------------------------------------------------------------------

def _has_holes(row) -> bool:
    """A -1 (any negative) before a valid entry: the valid entries are not a prefix of the row."""
    seen_hole = False
    for v in row:
        if v < 0:
            seen_hole = True
        elif seen_hole:
            return True
    return False


def _lookup(case: RaggedCase, req: int, i: int) -> int:
    return ref._lookup([list(r) for r in case.block_table], req, i, case.block_size)


def _check_global(case: RaggedCase, got, out: _Out) -> None:
    what = "global slots"
    idx, ptr = got
    gp = case.glob
    T = len(gp.rows)
    if not (_int32_1d("indices", idx, None, out, what) & _int32_1d("indptr", ptr, T + 1, out, what)):
        return
    table = [list(r) for r in case.block_table]
    want_idx, want_ptr = ref.ref_global_topk([list(r) for r in gp.rows], list(gp.token_to_req), table,
                                             case.block_size, None if gp.valid is None else list(gp.valid))
    rows = _split(idx.tolist(), ptr.tolist(), T, out, what)
    if rows is None:
        return
    for t, g in enumerate(rows):
        w = want_idx[want_ptr[t]:want_ptr[t + 1]]
        if g == w:
            continue
        row, req = gp.rows[t], gp.token_to_req[t]
        invalid = gp.valid is not None and not gp.valid[t]
        if len(g) != len(w):
            if invalid:
                out.add(f"{what}: an invalid token (is_valid_token false) has entries", f"token {t}", 0, len(g))
            else:
                out.add(f"{what}: a token's length differs from count(local >= 0)", f"token {t} (row {fmt(row)})",
                        len(w), len(g))
            continue
        # the reading in place: the first len columns, each looked up (-1 for a negative one)
        prefix = [_lookup(case, req, i) if i >= 0 else -1 for i in row[:len(w)]]
        # an in-place reading explains an entry it equals, and one whose column's id the oracle masks for a cause of
        # its own (past the width, a negative block, a request outside): that cause is then worded on its own
        in_place = sum(a == b or (i >= 0 and _cause(req, i, case) is not None) for a, b, i in zip(g, prefix, row))
        if _has_holes(row) and in_place > sum(a == b for a, b in zip(g, w)):
            out.add(f"{what}: the first count(>= 0) columns are read in place of the valid entries (a -1 hole "
                    f"kept, a valid entry after it dropped) at a token whose top-k row has -1 holes",
                    f"token {t} (row {fmt(row)})", fmt(w), fmt(g))
            sources, ref_row = list(row[:len(w)]), prefix
        else:
            sources, ref_row = [i for i in row if i >= 0], w
        for j, (a, b) in enumerate(zip(g, ref_row)):
            if a != b:
                i = sources[j]
                out.add(_entry_message(what, "local id", _cause(req, i, case)),
                        f"token {t}, entry {j} (local id {i}, request {req}, block size {case.block_size}, table "
                        f"{len(case.block_table)}x{case.table_width})", b, a)


# --- SWA window -----------------------------------------------------------------------------------------------------

def _check_swa(case: RaggedCase, got, out: _Out) -> None:
    what = "SWA window"
    idx, lens = got
    sp = case.swa
    T, W = len(sp.positions), sp.window
    if not isinstance(idx, torch.Tensor) or idx.dtype != torch.int32 or tuple(idx.shape) != (T, 1, W):
        desc = f"{list(idx.shape)} {idx.dtype}" if isinstance(idx, torch.Tensor) else type(idx).__name__
        out.add(f"{what}: indices are not an int32 [T, 1, window] tensor", "indices", f"int32 [{T}, 1, {W}]", desc)
        return
    if not _int32_1d("lens", lens, T, out, what):
        return
    want_rows, want_lens = ref.ref_swa_window(list(sp.positions), list(sp.token_to_req),
                                              [list(r) for r in case.block_table], case.block_size, W)
    g_rows, g_lens = idx.reshape(T, W).tolist(), lens.tolist()
    for t in range(T):
        p, req = sp.positions[t], sp.token_to_req[t]
        if g_lens[t] != want_lens[t]:
            if p < 0:
                out.add(f"{what}: a padding token (negative position) has a non-zero length", f"token {t} "
                        f"(position {p})", 0, g_lens[t])
            else:
                out.add(f"{what}: a token's length differs from min(position + 1, window)",
                        f"token {t} (position {p}, window {W})", want_lens[t], g_lens[t])
            continue
        start = max(p - W + 1, 0)
        for j in range(W):
            a, b = g_rows[t][j], want_rows[t][j]
            if a == b:
                continue
            if j >= want_lens[t]:
                out.add(f"{what}: an entry past the token's length is not -1", f"token {t}, entry {j} (position "
                        f"{p}, length {want_lens[t]})", b, a)
            else:
                q = start + j
                out.add(_entry_message(what, "position", _cause(req, q, case)),
                        f"token {t}, entry {j} (position {q}, request {req}, block size {case.block_size}, table "
                        f"{len(case.block_table)}x{case.table_width})", b, a)


# --- the contract ---------------------------------------------------------------------------------------------------

def _examples(target: Target) -> list[RaggedCase]:
    table = ((10, 11, 12), (20, -1, 22))
    return [
        RaggedCase(
            # a -1 hole inside the first len, a length past the width, a negative length, values past num_rows
            dense=DensePart(rows=((4, -1, 7, 9), (-1, -1, -1, -1), (1, 2, 3, 40), (5, 6, -1, 2)), width=4,
                            lens=(3, 2, 9, -1), num_rows=8),
            # block size 3, a table padded past its width: holes, an invalid token with valid entries, ids mapping
            # through a negative block id, an empty row, an id just past the width (inside the padded buffer)
            glob=GlobalPart(rows=((3, -1, 5, 1, -1, 2), (0, 1, 2, -1, -1, -1), (4, 6, -1, 0, 3, -1),
                                  (-1, -1, -1, -1, -1, -1), (9, 1, 7, -1, -1, -1)), width=6,
                            token_to_req=(0, 1, 1, 0, 0), valid=(True, False, True, True, True)),
            # window 4: windows crossing block boundaries, a padding token, a negative block id, a window reaching
            # just past the width (inside the padded buffer)
            swa=SwaPart(positions=(5, 1, -1, 7, 9, 4), token_to_req=(0, 0, 0, 1, 0, 1), window=4),
            block_table=table, table_width=3, table_pad=3, block_size=3),
        RaggedCase(
            # int64 inputs at the int32 extremes, no num_rows check
            dense=DensePart(rows=((3, INT32_MAX, -1, INT32_MIN),), width=4, lens=None, num_rows=-1),
            # an id far past the table (INT32_MAX), a request outside it
            glob=GlobalPart(rows=((0, 1, 2, INT32_MAX, -1), (2, -1, -1, -1, -1)), width=5, token_to_req=(0, 2)),
            # a request outside the table, INT32_MIN
            swa=SwaPart(positions=(0, 3, INT32_MIN, 2), token_to_req=(0, 1, 0, 2), window=3),
            index_dtype="int64", aux_dtype="int64", block_table=table, table_width=3, table_pad=0, block_size=1),
        RaggedCase(
            # empty batches; the largest position; the largest block id whose slots fit int32
            dense=DensePart(rows=(), width=3, lens=(), num_rows=5),
            glob=GlobalPart(rows=((0, 64, 127),), width=3, token_to_req=(0,), valid=(True,)),
            swa=SwaPart(positions=(fz.MAX_SWA_POSITION, 2), token_to_req=(0, 0), window=128),
            block_table=((fz.max_block_id(64), 3),), table_width=2, table_pad=1, block_size=64),
    ]


@contract("ragged-helpers-oracle", targets=ALL_TARGETS, cases=lambda target: fz.ragged_cases(), examples=_examples,
          case_type=RaggedCase)
def ragged_helpers_oracle(case: RaggedCase, target: Target) -> list[Violation]:
    """The ragged helpers equal their loop oracles exactly, indices, indptr / lengths and dtypes (int32).

    ``build_ragged_indices_from_dense``: row r keeps its first clamp(topk_lens[r] or count(>= 0), 0, width) entries
    in place; with ``num_rows >= 0`` a kept value outside [0, num_rows) becomes -1; ``num_rows`` left out is -1
    (no check) (SPEC 2).
    ``compute_global_topk_ragged_indices_and_indptr``: a valid token's entries >= 0, all of them and in row order
    (compacted past any -1 hole), each mapped to block_table[req, i // bs] * bs + i % bs; an invalid token has none
    (SPEC 2, C4A). ``compute_swa_indices_and_lens``: start = max(p - window + 1, 0), len = p + 1 - start (0 for a
    negative, padding, position), entry j < len the slot of position start + j, the rest -1, indices
    [T, 1, window] (SPEC 1.3). Every lookup is -1 for a position past the block table's width (the table may be a
    column slice of a wider buffer: nothing past its width is read), a request outside the table or a negative
    block id. Each case calls all three helpers (the last two on one block table). Inputs: holes, -1 and other
    negatives, INT32_MIN / INT32_MAX, empty rows and batches, lengths past the width, odd block sizes, windows
    crossing block boundaries, int32 and int64 inputs. A helper that raises on such an input is a violation naming
    the exception (on the vllm subject the adapter raises OutOfBoundsRead instead of launching a kernel that would
    load outside a tensor it was given). Messages name the cause of a difference (the kind of entry where it
    shows).

    Layouts (issue 30): every input but the block table (``table`` has its own) comes packed, as a slice of a
    larger buffer, strided or column-major (fuzz.ragged.INPUT_LAYOUTS), the values the same; a difference that the
    same inputs packed do not show is reported as the layout's (LAYOUT_DIFFERS), once, beside those they show."""
    got = _oracle_once(case, target)
    if not got or case.input_layout == "contiguous":
        return got
    packed = {(v.message, v.where) for v in _oracle_once(case.replace(input_layout="contiguous"), target)}
    same = [v for v in got if (v.message, v.where) in packed]
    new = [v for v in got if (v.message, v.where) not in packed]
    if new:
        same.append(Violation(f"{LAYOUT_DIFFERS}: input_layout={case.input_layout}", new[0].where,
                              new[0].expected, f"{new[0].got} ({new[0].message})"))
    return same


#: a helper that computes differently when its inputs are laid out other than packed (finding signatures match it)
LAYOUT_DIFFERS = "ragged helper output with a non-packed layout differs from the same inputs packed"


def _oracle_once(case: RaggedCase, target: Target) -> list[Violation]:
    with single_threaded():
        device = kernel_device()
        family = bound(target).ragged
        out = _Out()
        for helper, check in (("dense", _check_dense), ("global", _check_global), ("swa", _check_swa)):
            name = ENTRY[helper]
            entry = getattr(family, name)
            kwargs = fz.make_inputs(case, helper, device)
            try:
                got = entry(**kwargs)
            except _NOT_A_VERDICT:
                raise
            except Exception as exc:  # noqa: BLE001 - a valid input rejected or a crash: judged, with its text
                part = {"dense": case.dense.rows, "global": case.glob.rows, "swa": case.swa.positions}[helper]
                out.v.append(Violation(f"{name} raised {type(exc).__name__} on a valid input"
                                       + ("" if part else " (an empty batch)"), name, "a result",
                                       f"{type(exc).__name__}: {exc}"))
                continue
            check(case, tuple(x.cpu() if isinstance(x, torch.Tensor) else x for x in got), out)
        return out.v
