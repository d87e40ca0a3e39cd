"""Oracle for the DSv3.2 sparse metadata builder: no cache, every buffer written in full on every call.

Written from SPEC section 6 and the partition scheme documented in ``impl/work_partition.py`` (re-derived here with
plain loops; nothing is imported from ``impl``). Also a float64 sparse decode attention over explicit per-token kv
lists, for judging the consumer.
"""
from __future__ import annotations

import torch


def sparse_lengths(q_lens: list[int], seq_lens: list[int], topk: int) -> list[int]:
    """Per token: min(ctx_pos + 1, topk), ctx_pos = seq_len - q_len + offset; 0 for an empty sequence."""
    out = []
    for q, s in zip(q_lens, seq_lens):
        for off in range(q):
            out.append(0 if s == 0 else min(s - q + off + 1, topk))
    return out


def work_partition(lens: list[int], num_cu: int, granularity: int) -> dict:
    """The documented partition: a granule budget per CU, tokens cut in order, split tokens reduced."""
    granules = [-(-n // granularity) for n in lens]
    budget = max(1, -(-sum(granules) // num_cu))
    starts = [0]
    for n in lens:
        starts.append(starts[-1] + n)
    per_cu: list[list[list[int]]] = [[] for _ in range(num_cu)]
    groups: list[tuple[int, list[int]]] = []
    n_partials = 0
    cu, used = 0, 0
    for t, n in enumerate(lens):
        if n == 0:
            per_cu[cu].append([t, starts[t], starts[t], -1])
            continue
        pieces = []
        left, pos = granules[t], starts[t]
        while left:
            if used == budget:
                cu += 1
                used = 0
            take = min(left, budget - used)
            end = min(pos + take * granularity, starts[t + 1])
            pieces.append((cu, pos, end))
            used += take
            left -= take
            pos = end
        if len(pieces) == 1:
            per_cu[pieces[0][0]].append([t, pieces[0][1], pieces[0][2], -1])
        else:
            slots = []
            for c, b, e in pieces:
                per_cu[c].append([t, b, e, n_partials])
                slots.append(n_partials)
                n_partials += 1
            groups.append((t, slots))
    info = [item for items in per_cu for item in items]
    work_indptr = [0]
    for items in per_cu:
        work_indptr.append(work_indptr[-1] + len(items))
    reduce_indptr = [0] if groups else []
    partial_map = []
    for _, slots in groups:
        partial_map.extend(slots)
        reduce_indptr.append(len(partial_map))
    return {"work_meta": [len(info), n_partials, len(groups)], "work_indptr": work_indptr, "work_info": info,
            "reduce_indptr": reduce_indptr, "reduce_final_map": [t for t, _ in groups],
            "reduce_partial_map": partial_map}


def kv_lists(q_lens: list[int], seq_lens: list[int], topk_rows: list[list[int]], block_table: list[list[int]],
             block_size: int, topk: int) -> list[list[int]]:
    """Per token: its sparse-length list of global slots; valid entries (>= 0) of the row in row order, then -1."""
    lens = sparse_lengths(q_lens, seq_lens, topk)
    out = []
    t = 0
    for r, q in enumerate(q_lens):
        for _ in range(q):
            valid = [p for p in topk_rows[t] if p >= 0][:lens[t]]
            slots = [block_table[r][p // block_size] * block_size + p % block_size for p in valid]
            out.append(slots + [-1] * (lens[t] - len(slots)))
            t += 1
    return out


def fresh_buffers(*, max_tokens: int, topk: int, block_size: int, num_cu: int, granularity: int,
                  q_lens: list[int], seq_lens: list[int], topk_rows: list[list[int]],
                  block_table: list[list[int]]) -> dict[str, torch.Tensor]:
    """Every persistent buffer as a fresh build + index fill leaves it (int64 tensors, full length)."""
    T = sum(q_lens)
    lens = sparse_lengths(q_lens, seq_lens, topk)
    lists = kv_lists(q_lens, seq_lens, topk_rows, block_table, block_size, topk)

    req = [0] * max_tokens
    t = 0
    for r, q in enumerate(q_lens):
        for _ in range(q):
            req[t] = r
            t += 1
    indptr = [0] * (max_tokens + 1)
    for i in range(T):
        indptr[i + 1] = indptr[i] + lens[i]
    for i in range(T + 1, max_tokens + 1):
        indptr[i] = indptr[T]
    indices = [0] * (max_tokens * topk)
    pos = 0
    for slots in lists:
        for s in slots:
            indices[pos] = s
            pos += 1

    part = work_partition(lens, num_cu, granularity)
    shapes = {"work_meta": (3,), "work_indptr": (num_cu + 1,), "work_info": (max_tokens + num_cu, 4),
              "reduce_indptr": (num_cu + 1,), "reduce_final_map": (num_cu,), "reduce_partial_map": (2 * num_cu,)}
    out = {
        "req_id_per_token": torch.tensor(req, dtype=torch.int64),
        "qo_indptr": torch.arange(max_tokens + 1, dtype=torch.int64),
        "paged_kv_last_page_len": torch.ones(max_tokens, dtype=torch.int64),
        "paged_kv_indptr": torch.tensor(indptr, dtype=torch.int64),
        "paged_kv_indices": torch.tensor(indices, dtype=torch.int64),
    }
    for name, shape in shapes.items():
        buf = torch.zeros(shape, dtype=torch.int64)
        live = torch.tensor(part[name], dtype=torch.int64).reshape(-1, *shape[1:])
        buf[:live.shape[0]] = live
        out[f"partition.{name}"] = buf
    out["_live_ends"] = {"req_id_per_token": T, "paged_kv_indices": indptr[T],  # type: ignore[dict-item]
                         **{f"partition.{k}": len(v) for k, v in part.items()}}
    return out


def sparse_decode_reference(q: torch.Tensor, kv_cache: torch.Tensor, lists: list[list[int]], softmax_scale: float,
                            kv_lora_rank: int = 512) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """float64 attention per token over its slot list (-1 skipped; no valid slot -> zeros).

    Returns ``(out [T, H, R], natural_scale [T, H, R] = sum_j p_j |v_j|, max_abs_logit_error_scale [T, H])`` where the
    last is ``scale * sum_d |q_d| |k_d|`` maximised over the token's entries (what fp32 rounding of a score scales
    with)."""
    T, H, D = q.shape
    out = torch.zeros(T, H, kv_lora_rank, dtype=torch.float64)
    nat = torch.zeros(T, H, kv_lora_rank, dtype=torch.float64)
    dot_scale = torch.zeros(T, H, dtype=torch.float64)
    qd = q.to(torch.float64)
    kvd = kv_cache.to(torch.float64)
    for t in range(T):
        slots = [s for s in lists[t] if s >= 0]
        if not slots:
            continue
        rows = kvd[slots]
        s = qd[t] @ rows.T * softmax_scale
        m = s.max(dim=-1).values
        p = torch.exp(s - m[:, None])
        p = p / p.sum(dim=-1, keepdim=True)
        v = rows[:, :kv_lora_rank]
        out[t] = p @ v
        nat[t] = p @ v.abs()
        dot_scale[t] = (qd[t].abs() @ rows.abs().T).max(dim=-1).values * abs(softmax_scale)
    return out, nat, dot_scale


def attention_tolerance(nat: torch.Tensor, dot_scale: torch.Tensor, ref: torch.Tensor, head_dim: int,
                        max_entries: int) -> torch.Tensor:
    """Bound on |impl - ref| for an fp32 consumer with a bf16 output, inputs identical bf16 values.

    Error model: each fp32 score has |err| <= gamma_D * scale * sum|q||k| (gamma_n = n u / (1 - n u), u = 2^-24);
    softmax weights then carry relative error <= 2 * max|score err| + O(L u) for exp/sum/division; partial merges
    by log-sum-exp add a few u. Output: <= (2 e_s + (L + 16) u) * sum_j p_j |v_j|, plus bf16 rounding of the result,
    2^-8 relative to |out| (+ the same bound again for the rounding of the perturbed value)."""
    u = 2.0 ** -24
    gamma = head_dim * u / (1 - head_dim * u)
    e_s = gamma * dot_scale[..., None]
    fp32_part = (2.5 * e_s + (max_entries + 16) * 4 * u) * nat
    return fp32_part * (1 + 2.0 ** -7) + 2.0 ** -8 * ref.abs() + 1e-30
