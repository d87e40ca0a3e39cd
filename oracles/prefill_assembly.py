"""References for the DSv4 prefill assembly (SPEC sections 3 and 9), written from SPEC.md as Python loops.

1. ``ref_combined_rows``: the combined top-k + SWA index row of every query token of one chunk, from SPEC 3's
   formulas - topk_len = min((pos + 1) // ratio, topk) entries topk_local + M * req, then swa_len entries
   M * req + N + j + pos - swa_len + 1 - (seq_len - gather_len) - and the row padded with -1 to a multiple of 128.
   ``rule`` picks how the two bounds SPEC 3 leaves open are read:
   - "v0.33" (vLLM 0.33.0): a top-k value is kept only in [0, N) (else -1, SPEC 3's "newer code"), and the window
     starts no earlier than the first gathered SWA token (SPEC 9: a bounded replay may gather fewer than
     q_len + min(prefix, window - 1) tokens), i.e. swa_len = min(pos + 1, window, pos + 1 - (seq_len - gather_len));
   - "t-old" (SPEC 3's formula as written, upstream's older test table): every top-k value >= 0 kept,
     swa_len = min(pos + 1, window) whatever the gather.
   With the full gather (gather_len = q_len + min(prefix, window - 1)) and top-k values in [0, N) both agree.
   Image visibility (``max_image_tokens`` > 0, the vision variant): the row holds window + max_image_tokens SWA
   entries at most; a token given ``left[t]`` / ``right[t]`` visible image tokens sees every position from the
   earlier of its window's first token and its first visible image token, through its last visible image token,
   never before the first gathered token nor at or past seq_len ("v0.33" rule only).
1b. ``ref_image_visibility``: the visible counts of one position from its request's image spans (inclusive
   [start, end]): inside a span, left = min(pos - start, max_image_tokens - 1) and right = min(end - pos,
   max_image_tokens) (upstream's ``get_image_visible``, ported in ``_compute_image_visibility_kernel`` of
   vllm/v1/attention/backends/mla/sparse_swa.py); 0 and 0 outside every span.
2. ``ref_plan_chunks``: SPEC 9's chunk plan: a chunk starting at request s ends at the largest e such that
   (e - s) * (max(seq // ratio) + max(gather)) over [s, e) is within the area budget
   4 * (ceil(max_model_len / ratio) + window + max_num_batched_tokens) (at least one request), where
   gather = q_len + min(prefix, window - 1); N = max(seq // ratio), M = N + max(gather) (N = 0 and no compressed
   term for an SWA-only layer). Found by trying every end, not by growing the chunk.
"""
from __future__ import annotations

#: SPEC 3: combined rows are padded to a multiple of this many entries
SPEC_ROW_ALIGNMENT = 128
#: SPEC 9: PREFILL_CHUNK_SIZE in vLLM 0.33.0
SPEC_PREFILL_CHUNK_SIZE = 4
RULES = ("v0.33", "t-old")


def ref_row_width(topk: int, window: int, max_image_tokens: int = 0) -> int:
    w = topk + window + max_image_tokens
    return -(-w // SPEC_ROW_ALIGNMENT) * SPEC_ROW_ALIGNMENT


def ref_combined_rows(topk_rows: list[list[int]], query_start_loc: list[int], seq_lens: list[int],
                      gather_lens: list[int], *, window: int, ratio: int, topk: int, M: int, N: int,
                      rule: str = "v0.33", max_image_tokens: int = 0, left: list[int] | None = None,
                      right: list[int] | None = None) -> tuple[list[list[int]], list[int]]:
    """(rows, lens): one full-width row (prefix, then -1 padding) and its length per query token of the chunk.
    ``topk_rows[t]`` is token t's chunk-local top-k row (at least ``topk`` entries; unused when topk is 0);
    ``left`` / ``right``: per token visible image counts (None: no image spans)."""
    if rule not in RULES:
        raise ValueError(f"rule: expected one of {RULES}, got {rule!r}")
    if (left is not None or max_image_tokens) and rule != "v0.33":
        raise ValueError("image visibility is modelled under the v0.33 rule only")
    width = ref_row_width(topk, window, max_image_tokens)
    rows: list[list[int]] = []
    lens: list[int] = []
    base = query_start_loc[0]
    for req in range(len(seq_lens)):
        first, last = query_start_loc[req] - base, query_start_loc[req + 1] - base
        q_len = last - first
        seq_len, gather_len = seq_lens[req], gather_lens[req]
        for i in range(q_len):
            t = first + i
            pos = seq_len - q_len + i
            row: list[int] = []
            topk_len = min((pos + 1) // ratio, topk)
            for j in range(topk_len):
                v = topk_rows[t][j]
                keep = (0 <= v < N) if rule == "v0.33" else v >= 0
                row.append(v + M * req if keep else -1)
            if left is not None:
                seen = range(min(pos - window + 1, pos - left[t]), pos + right[t] + 1)
                gathered = range(seq_len - gather_len, seq_len)
                for p in seen:
                    if p >= 0 and p in gathered:
                        row.append(M * req + N + p - (seq_len - gather_len))
                lens.append(len(row))
                rows.append(row + [-1] * (width - len(row)))
                continue
            swa_len = min(pos + 1, window)
            if rule == "v0.33":
                swa_len = max(0, min(swa_len, pos + 1 - (seq_len - gather_len)))
            for j in range(swa_len):
                row.append(M * req + N + j + pos - swa_len + 1 - (seq_len - gather_len))
            lens.append(len(row))
            rows.append(row + [-1] * (width - len(row)))
    return rows, lens


def ref_image_visibility(pos: int, spans: list[tuple[int, int]], max_image_tokens: int) -> tuple[int, int]:
    """(left, right) visible image tokens of a token at ``pos`` given its request's spans (module docstring, 1b;
    a later span wins where spans overlap, as upstream's loop)."""
    left = right = 0
    for start, end in spans:
        if start <= pos <= end:
            left, right = min(pos - start, max_image_tokens - 1), min(end - pos, max_image_tokens)
    return left, right


def ref_gather_len(seq_len: int, q_len: int, window: int) -> int:
    """SPEC 3: the SWA tokens a request gathers, q_len + min(prefix, window - 1)."""
    return q_len + min(seq_len - q_len, window - 1)


def ref_plan_chunks(seq_lens: list[int], query_lens: list[int], *, ratio: int, max_model_len: int,
                    max_num_batched_tokens: int, window: int, chunk_size: int = SPEC_PREFILL_CHUNK_SIZE,
                    swa_only: bool | None = None) -> list[tuple[int, int, int, int]]:
    """SPEC 9's plan as (start, end, N, M) per chunk (``swa_only`` defaults to ratio <= 1)."""
    if swa_only is None:
        swa_only = ratio <= 1
    compressed_term = 0 if swa_only else -(-max_model_len // ratio)
    budget = chunk_size * (compressed_term + window + max_num_batched_tokens)
    n_of = [0 if swa_only else s // ratio for s in seq_lens]
    g_of = [ref_gather_len(s, q, window) for s, q in zip(seq_lens, query_lens)]
    plan = []
    s = 0
    while s < len(seq_lens):
        best = s + 1
        for e in range(s + 1, len(seq_lens) + 1):
            if (e - s) * (max(n_of[s:e]) + max(g_of[s:e])) <= budget:
                best = e
        n = max(n_of[s:best])
        plan.append((s, best, n, n + max(g_of[s:best])))
        s = best
    return plan
