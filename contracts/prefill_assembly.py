"""DSv4 prefill assembly contract: the chunk plan and the combined top-k + SWA index rows equal SPEC's loop
oracles exactly."""
from __future__ import annotations

import torch

from contracts.core import ALL_TARGETS, Violation, contract, fmt
from contracts.subjects import bound
from fuzz import prefill_assembly as fz
from impl.targets import Target
from oracles import prefill_assembly as ref

#: violations reported per kind before the rest are summed up
_LIMIT = 4

#: upstream's older test table (T-OLD): ratio 2, window 3, top-k 4, M 20, N 8, two requests of 6 and 4 tokens with
#: 3 and 2 query tokens and gathers of 4 and 3. Its literal rows (SPEC 3: 100, 101, 7, 8, 9 / 110, 111, 8, 9, 10 /
#: 120, 121, 122, 9, 10, 11 / 150, 27, 28, 29 / 160, 161, 28, 29, 30) follow SPEC 3's formula as written; under
#: vLLM 0.33.0's two rules the same inputs give the rows below: the top-k ids 100.. are >= N (-1), and the gathers
#: are one token short of q_len + min(prefix, window - 1) (as a bounded replay leaves them), so each window starts
#: at the first gathered token instead of one below the SWA region (the 7 and 27 of the old table are compressed
#: rows, not window tokens).
T_OLD_TOPK = ((100, 101, 102, 103), (110, 111, 112, 113), (120, 121, 122, 123), (130, 131, 132, 133),
              (140, 141, 142, 143))
T_OLD_ROWS_V033 = ((-1, -1, 8, 9), (-1, -1, 8, 9, 10), (-1, -1, -1, 9, 10, 11), (-1, 28, 29), (-1, -1, 28, 29, 30))
#: T-OLD's layout with the full gathers (5, 4) and causal top-k ids < N: here SPEC 3's formula as written and
#: 0.33.0's rules agree, so these are the old table's rows for inputs both readings accept
T_OLD_FULL_TOPK = ((0, 1, 2, 3), (1, 2, 3, 4), (2, 3, 4, 5), (0, 1, 2, 3), (1, 2, 3, 4))
T_OLD_FULL_ROWS = ((0, 1, 8, 9, 10), (1, 2, 9, 10, 11), (2, 3, 4, 10, 11, 12), (20, 28, 29, 30),
                   (21, 22, 29, 30, 31))


def _examples(target: Target) -> list[fz.AssemblyCase]:
    t_old = fz.AssemblyCase(seed=0, ratio=2, topk=4, topk_extra=0, window=3, seq_lens=(6, 4), query_lens=(3, 2),
                            replay_cut=(2, 1), max_model_len=16, max_num_batched_tokens=8, invalid_rate=0.0,
                            int32_extremes=False, topk_dtype="int32", topk_3d=False, topk_layout="contiguous",
                            qsl_base=0, workspace=(8, 20), topk_rows=T_OLD_TOPK, expect=T_OLD_ROWS_V033)
    # 4 * (ceil(40 / 4) + 8 + 8) = 104: four requests of width 25 fit (100), a fifth does not; the chunk's last
    # request is the small one, so its M (10 + 15) is not the last request's gather
    budget_cross = fz.AssemblyCase(seed=11, ratio=4, topk=8, topk_extra=3, window=8,
                                   seq_lens=(40, 38, 40, 5, 40, 9), query_lens=(8, 8, 7, 1, 8, 2),
                                   replay_cut=(0, 0, 2, 0, 1000, 0), max_model_len=40, max_num_batched_tokens=8,
                                   invalid_rate=0.2, int32_extremes=True, topk_dtype="int64", topk_3d=True,
                                   topk_layout="padded", qsl_base=3)
    # 4 * (ceil(16 / 4) + 4 + 6) = 56 = 7 requests of width 3 + 2 + 3: a chunk area equal to the budget still fits
    budget_equal = fz.AssemblyCase(seed=12, ratio=4, topk=4, topk_extra=0, window=4, seq_lens=(12,) * 8,
                                   query_lens=(2,) * 8, replay_cut=(0,) * 8, max_model_len=16,
                                   max_num_batched_tokens=6, invalid_rate=0.2, int32_extremes=False,
                                   topk_dtype="int32", topk_3d=False, topk_layout="colmajor", qsl_base=0)
    # SWA-only (N = 0) with DSv4's window 128: q_len 1 past a prefix longer than the window, one shorter
    swa_only = fz.AssemblyCase(seed=13, ratio=1, topk=0, topk_extra=3, window=128, seq_lens=(300, 5, 130),
                               query_lens=(1, 3, 2), replay_cut=(0, 0, 7), max_model_len=300,
                               max_num_batched_tokens=4, invalid_rate=0.0, int32_extremes=False, topk_dtype="int32",
                               topk_3d=False, topk_layout="contiguous", qsl_base=5)
    c128a = fz.AssemblyCase(seed=14, ratio=128, topk=4, topk_extra=0, window=8, seq_lens=(300, 129, 20),
                            query_lens=(3, 2, 4), replay_cut=(0, 1, 0), max_model_len=320, max_num_batched_tokens=4,
                            invalid_rate=0.5, int32_extremes=True, topk_dtype="int32", topk_3d=True,
                            topk_layout="contiguous", qsl_base=0)
    t_old_full = t_old.replace(replay_cut=(0, 0), topk_rows=T_OLD_FULL_TOPK, expect=T_OLD_FULL_ROWS)
    # image visibility: request 0's tokens 7..13 are one image (its last tokens see back past the window of 3 to
    # the image's first token, its first ones forward to the last token so far), request 1 is an image of 6 tokens
    # resumed after a bounded replay (the window never reaches below the gather), C4A top-k before the SWA part
    image = fz.AssemblyCase(seed=15, ratio=4, topk=4, topk_extra=0, window=3, seq_lens=(14, 6), query_lens=(8, 3),
                            replay_cut=(0, 2), max_model_len=16, max_num_batched_tokens=8, invalid_rate=0.0,
                            int32_extremes=False, topk_dtype="int32", topk_3d=False, topk_layout="contiguous",
                            qsl_base=0, max_image_tokens=8, image_spans=((0, 7, 13), (1, 0, 5)))
    return [t_old, budget_cross, budget_equal, swa_only, c128a, t_old_full, image]


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().cpu().clone()


def _plan_violations(case: fz.AssemblyCase, want: list[tuple], fam) -> list[Violation]:
    got_plan = fam.plan_prefill_chunks(case.seq_lens, case.query_lens, compress_ratio=case.ratio,
                                       max_model_len=case.max_model_len,
                                       max_num_batched_tokens=case.max_num_batched_tokens, window_size=case.window)
    got = [tuple(int(x) for x in c) for c in got_plan]
    where = f"ratio {case.ratio}, window {case.window}, {len(case.seq_lens)} requests"
    v: list[Violation] = []
    if got != want:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        v.append(Violation("chunk plan differs from SPEC 9's (start, end, N, M) per chunk",
                           f"{where}, chunk {i} of {len(want)} (seq_lens {list(case.seq_lens)}, query_lens "
                           f"{list(case.query_lens)})", fmt(want), fmt(got, 240)))
    budget = ref.SPEC_PREFILL_CHUNK_SIZE * ((0 if case.ratio <= 1 else -(-case.max_model_len // case.ratio))
                                            + case.window + case.max_num_batched_tokens)
    expect_next = 0
    for i, c in enumerate(got):
        if len(c) != 4:
            v.append(Violation("a planned chunk is not (start, end, N, M)", f"{where}, chunk {i}", "4 ints", fmt(c)))
            break
        s, e, _, m = c
        if s != expect_next or e <= s:
            v.append(Violation("chunks do not cover the requests in order, each non-empty", f"{where}, chunk {i}",
                               f"start {expect_next}, end > start", f"({s}, {e})"))
            break
        if e - s > 1 and (e - s) * m > budget:
            v.append(Violation("a chunk of several requests exceeds the area budget", f"{where}, chunk {i}",
                               f"(end - start) * M <= {budget}", f"{e - s} * {m} = {(e - s) * m}"))
        expect_next = e
    if got and expect_next != len(case.seq_lens) and not v:
        v.append(Violation("chunks do not cover every request", where, f"last end {len(case.seq_lens)}",
                           str(expect_next)))
    return v


def _describe_column(col: int, topk_len: int, want_len: int) -> str:
    if col < topk_len:
        return f"top-k entry {col}"
    if col < want_len:
        return f"SWA entry {col - topk_len}"
    return f"padding column {col}"


def _combine_violations(case: fz.AssemblyCase, ch: fz.ChunkInputs, ci: int, fam, prefixes: list) -> list[Violation]:
    """The subject's rows for one chunk against the oracle's; each row's unpadded prefix is added to ``prefixes``."""
    got_idx, got_lens = fam.combine_topk_swa_indices(ch.topk_indices, ch.query_start_loc, ch.seq_lens,
                                                     ch.gather_lens, compress_ratio=case.ratio, M=ch.M, N=ch.N,
                                                     topk=case.topk, window_size=case.window,
                                                     **ch.image_kwargs(case))
    rows, lens = ref.ref_combined_rows(ch.topk_rows, ch.qsl, ch.seqs, ch.gathers, window=case.window,
                                       ratio=case.ratio, topk=case.topk, M=ch.M, N=ch.N,
                                       max_image_tokens=case.max_image_tokens, left=ch.left, right=ch.right)
    T, W = len(rows), ref.ref_row_width(case.topk, case.window, case.max_image_tokens)
    where = f"chunk {ci} (requests {ch.start}..{ch.end - 1}, N {ch.N}, M {ch.M})"
    if tuple(got_idx.shape) != (T, W) or tuple(got_lens.shape) != (T,):
        return [Violation("combined rows or lengths have the wrong shape", where,
                          f"indices [{T}, {W}] (top-k + window + max_image_tokens rounded up to 128), lens [{T}]",
                          f"indices {list(got_idx.shape)}, lens {list(got_lens.shape)}")]
    if got_idx.dtype != torch.int32 or got_lens.dtype != torch.int32:
        return [Violation("combined rows or lengths are not int32", where, "int32, int32",
                          f"{got_idx.dtype}, {got_lens.dtype}")]
    g = got_idx.detach().cpu().to(torch.int64)
    gl = got_lens.detach().cpu().to(torch.int64).tolist()
    prefixes += [tuple(row[:max(n, 0)]) for row, n in zip(g.tolist(), gl)]
    want = torch.tensor(rows, dtype=torch.int64).reshape(T, W)
    v: list[Violation] = []
    # tokens by request: where each row belongs
    owner = []
    for b in range(len(ch.seqs)):
        q = ch.qsl[b + 1] - ch.qsl[b]
        for i in range(q):
            owner.append((b, ch.seqs[b] - q + i))
    chunk_size = ch.end - ch.start
    out_of_range = ((g != -1) & ((g < 0) | (g >= chunk_size * ch.M))).nonzero().tolist()
    for t, c in out_of_range[:_LIMIT]:
        b, pos = owner[t]
        v.append(Violation("a combined index points outside the chunk's workspace",
                           f"{where}, request {ch.start + b}, position {pos}, column {c}",
                           f"-1 or in [0, {chunk_size} * M = {chunk_size * ch.M})", str(int(g[t, c]))))
    bad_len = [t for t in range(T) if gl[t] != lens[t]]
    for t in bad_len[:_LIMIT]:
        b, pos = owner[t]
        v.append(Violation("combined row length differs (topk_len + swa_len)",
                           f"{where}, request {ch.start + b}, position {pos}", str(lens[t]), str(gl[t])))
    diff = (g != want)
    bad_rows = diff.any(dim=1).nonzero().flatten().tolist()
    for t in bad_rows[:_LIMIT]:
        b, pos = owner[t]
        topk_len = min((pos + 1) // case.ratio, case.topk)
        col = int(diff[t].nonzero()[0])
        lo = max(col - 3, 0)
        hi = min(max(col + 6, lens[t]), W, lo + 16)
        part = _describe_column(col, topk_len, lens[t])
        img = f", visible image tokens left {ch.left[t]} right {ch.right[t]}" if ch.left is not None else ""
        v.append(Violation(f"combined row differs from the oracle first at its {part}",
                           f"{where}, request {ch.start + b} (seq {ch.seqs[b]}, gather {ch.gathers[b]}{img}), "
                           f"position {pos}, columns {lo}..{hi - 1}", fmt(want[t, lo:hi].tolist(), 240),
                           fmt(g[t, lo:hi].tolist(), 240)))
    for what, n in (("rows", len(bad_rows)), ("lengths", len(bad_len)), ("out-of-range entries", len(out_of_range))):
        if n > _LIMIT:
            v.append(Violation(f"{n - _LIMIT} more {what} differ", where))
    return v


def _literal_violations(case: fz.AssemblyCase, got_prefixes: list[tuple]) -> list[Violation]:
    v = []
    for t, (want, got) in enumerate(zip(case.expect, got_prefixes)):
        if tuple(want) != tuple(got):
            v.append(Violation("row differs from the pinned table", f"token {t}", fmt(list(want)), fmt(list(got))))
    return v[:_LIMIT]


@contract("prefill-assembly-oracle", targets=ALL_TARGETS, cases=lambda t: fz.assembly_cases(), examples=_examples,
          min_cases=5, case_type=fz.AssemblyCase)
def prefill_assembly_oracle(case: fz.AssemblyCase, target: Target) -> list[Violation]:
    """The DSv4 prefill assembly equals SPEC's loop oracles exactly.

    Chunk plan (``plan_prefill_chunks``): equal to ``oracles.prefill_assembly.ref_plan_chunks`` - each chunk the
    longest run of requests whose area (count * (max(seq // ratio) + max(q_len + min(prefix, window - 1)))) stays
    within 4 * (ceil(max_model_len / ratio) + window + max_num_batched_tokens), N = max(seq // ratio) (0 for
    SWA-only), M = N + max(gather) - and, named apart, chunks that cover the requests in order and stay within the
    budget (a case with a wrong plan reports only that). Combined rows (``combine_topk_swa_indices``, run per chunk
    of the oracle's plan with the exact, possibly replay-shortened gathers): every entry equal to
    ``ref_combined_rows`` (vLLM 0.33.0's rules: top-k ids kept only in [0, N), the window starting no earlier than
    the first gathered token), the -1 padding to a multiple of 128 included; lengths topk_len + swa_len; int32;
    every entry -1 or in [0, chunk * M). Pinned: the older upstream table (ratio 2, window 3, M 20, N 8) restated
    under 0.33.0's rules, the same layout with full gathers (where the old table's formula and 0.33.0 agree), a
    chunk area equal to the budget, a fifth request crossing it, SWA-only with window 128, C128A. Cases (generated:
    chunks crossing the budget, chunks exactly at it): C4A, C128A and SWA-only layers; prefixes longer and shorter
    than the window, q_len 1; invalid top-k ids (-1, -2, N, N + 1, M, INT32 extremes) and live-looking ids past each
    row's topk_len; int32/int64, 2-D/3-D, padded and column-major top-k; query_start_loc not starting at 0; image
    visibility (``max_image_tokens`` 0, or 3 / window + 5 with or without image spans; query tokens at a span's first and
    last token, one off either, spans running past the sequence so far): rows window + max_image_tokens SWA entries
    wide, each image token's SWA part from the earlier of its window start and its first visible image token
    through its last visible one, within the gathered tokens and below seq_len. Inputs are left unchanged. Sources: SPEC 3 (DSv4 assembly), SPEC 9 (chunk plan), upstream's combine tests."""
    fam = bound(target).prefill_assembly
    v: list[Violation] = []
    if case.workspace is None:
        v += _plan_violations(case, fz.oracle_plan(case), fam)
        if v:  # the rows are judged on the oracle's plan; a wrong plan is reported alone (and shrinks fast)
            return v
    inp = fz.build_assembly_inputs(case)
    before = _bits(inp.topk_full)
    prefixes: list[tuple] = []
    for ci, ch in enumerate(inp.chunks):
        v += _combine_violations(case, ch, ci, fam, prefixes)
    if case.expect is not None and len(prefixes) == len(case.expect):
        v += _literal_violations(case, prefixes)
    if not torch.equal(_bits(inp.topk_full), before):
        v.append(Violation("the assembly modified topk_indices", "topk_indices", "unchanged", "changed"))
    return v
