"""Ragged index helpers: upstream's ``build_ragged_indices_from_dense`` (``vllm/v1/attention/ops/
rocm_aiter_mla_sparse.py``), ``compute_global_topk_ragged_indices_and_indptr`` (``vllm/models/deepseek_v4/amd/
rocm.py``) and ``_compute_swa_indices_and_lens_kernel`` (``vllm/v1/attention/backends/mla/sparse_swa.py``) behind
our ``impl.ragged`` signatures.

``build_ragged_indices_from_dense``. Upstream's conversion takes the lengths as a required argument; without
``topk_lens`` the adapter passes what upstream's own callers compute in that case, ``(indices >= 0).sum(dim=-1,
dtype=torch.int32)``. Upstream returns an ``R * W`` flat tensor whose entries past ``indptr[-1]`` are never written
(``torch.empty``); our API returns the packed entries, so the adapter keeps the first ``indptr[-1]`` (one host read,
as ours makes). Semantics differ from ours on purpose (SPEC 9, FINDINGS P1): upstream keeps only the valid entries
of each row's first ``len`` (>= 0 and, with ``num_rows >= 0``, < ``num_rows``), compacted, where ours keeps all
``len`` entries in place and writes -1 for the invalid ones.

``compute_global_topk_ragged_indices_and_indptr``. Upstream's host function with the same tensors; its third
result (the lengths) is dropped, its indices cut to ``indptr[-1]`` as above. ``is_valid_token=None`` (ours: every
token valid) is passed as an all-true bool tensor (upstream requires one). Upstream reads a token's first
``count(local >= 0)`` columns in place (a -1 among them stays -1, a valid entry after it is dropped: the prefix
assumption of FINDINGS M3, here with -1 kept rather than mapped to slot 0), and loads ``block_table[req, i // bs]``
without bounding the column or the request row.

``compute_swa_indices_and_lens(positions, token_to_req, block_table, block_size, window)``. Upstream's kernel
derives each token's position from request metadata (``seq_len - query_len + token - query_start``) and takes an
``is_valid_token`` flag; ours takes the positions. The adapter launches upstream's kernel once per token (its
``token_offset`` argument, grid and constexprs from upstream's own launch spec,
``ComputeSWAIndicesAndLensKernel.__call__``), on metadata that makes the token's request ``token_to_req[t]`` a
one-token query whose sequence length is ``position + 1`` (``query_start_loc[req] = t``, ``query_start_loc[req+1]
= t + 1``, ``seq_lens[req] = position + 1``, ``replay_start`` 0, no image visibility), with the caller's block
table. A negative position is ours' padding token: upstream's invalid token (``is_valid_token`` false; upstream's
builder sets it from ``slot_mapping >= 0``). Positions are at most 2^31 - 2 (``seq_lens`` is int32). The index
width is ``window`` (the decode's ``decode_swa_indices[T, 1, window]``).

Memory safety. Upstream's kernels load the block table at ``req * stride + pos // bs`` with no bound on the
column or the row. A load inside the table's storage runs as it would on a GPU (a column past a row's width reads
the rest of the buffer: the next row, or what a column slice of a wider buffer leaves there). A load outside the
storage is not launched: the adapter computes the addresses upstream's kernel loads (its masks: the first
``count(local >= 0)`` columns with ``local >= 0``; the window's positions ``[start, p]`` of a valid token) and
raises :class:`OutOfBoundsRead` naming the first one, where a GPU would read whatever lies there or fault. The
request metadata the SWA kernel reads (``query_start_loc``, ``seq_lens``, ``replay_start``) has one entry per block
table row: a request outside the table is such a read too. Under the Triton interpreter a second guard
(:func:`_bounded_memory`) checks every load and store of every kernel the call launches against the storages of
that launch's tensor arguments, so a changed upstream (a planted bug among them) whose accesses the address model
above no longer describes ends in :class:`OutOfBoundsAccess` (a name of its own: no finding explains it), never in
an access to foreign memory.
"""
from __future__ import annotations

import inspect

import torch

from contracts.subjects.base import Family
from contracts.subjects.memory_bounds import OutOfBoundsAccess  # noqa: F401 - raised through the adapter
from contracts.subjects.memory_bounds import bounded_memory as _bounded_memory
from contracts.subjects.vllm.adapters import needs
from impl.runtime import triton_mode


class OutOfBoundsRead(RuntimeError):
    """Upstream's kernel would load outside a tensor it was handed (the message says where); not launched."""


def _storage_range(t: torch.Tensor) -> tuple[int, int]:
    """The element offsets, relative to ``t``'s first element, that lie inside its storage: [lo, hi). A tensor
    with no elements has none: torch hands a kernel address 0 for it (``data_ptr()`` of an empty view)."""
    if t.numel() == 0:
        return 0, 0
    n = t.untyped_storage().nbytes() // t.element_size()
    return -t.storage_offset(), n - t.storage_offset()


def _check_table_loads(block_table: torch.Tensor, loads, what: str) -> None:
    """``loads``: (token, req, pos, bs) the kernel reads ``block_table[req * stride + pos // bs]`` for."""
    lo, hi = _storage_range(block_table)
    stride = block_table.stride(0) if block_table.dim() == 2 else 0
    rows = block_table.shape[0]
    for t, req, pos, bs in loads:
        off = req * stride + pos // bs
        if not lo <= off < hi:
            raise OutOfBoundsRead(f"{what}: token {t} loads block_table[{req} * {stride} + {pos} // {bs}], element "
                                  f"{off} of a storage of [{lo}, {hi}) (a table of {rows} rows, "
                                  f"{block_table.shape[1] if block_table.dim() == 2 else 0} wide): outside it")


def _bind_launch(kernel, spec_kwargs: dict, args: dict) -> dict:
    """Upstream's launcher convention: a tensor argument ``x`` binds to the kernel's ``x_ptr``; every other
    kernel parameter comes from the call's arguments or the launch spec's keywords."""
    params = inspect.signature(getattr(kernel, "fn", kernel)).parameters
    out = {}
    for name in params:
        if name in spec_kwargs:
            out[name] = spec_kwargs[name]
        elif name.endswith("_ptr") and name[:-4] in args:
            out[name] = args[name[:-4]]
        else:
            out[name] = args[name]
    return out


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["build_ragged_indices_from_dense"],
    "rocm": ["compute_global_topk_ragged_indices_and_indptr"],
    "swa": ["_COMPUTE_SWA_INDICES_AND_LENS_KERNEL", "_compute_swa_indices_and_lens_kernel"],
}, since={"swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL": "0.30.0"})


def build(ctx) -> Family:
    ops = ctx["ops"]
    rocm = ctx["rocm"]

    def build_ragged_indices_from_dense(dense_indices, topk_lens=None, num_rows=-1):
        def run():
            lengths = topk_lens
            if lengths is None:
                lengths = (dense_indices >= 0).sum(dim=-1, dtype=torch.int32)
            return ops.build_ragged_indices_from_dense(dense_indices, lengths, num_rows=num_rows)

        with _bounded_memory():
            flat, indptr = ctx.call(run)
        return flat[: int(indptr[-1])], indptr

    def compute_global_topk_ragged_indices_and_indptr(local_indices, token_to_req, block_table, block_size,
                                                      is_valid_token=None):
        T = local_indices.shape[0]
        valid = is_valid_token if is_valid_token is not None else \
            torch.ones(T, dtype=torch.bool, device=local_indices.device)
        loads = []
        for t, (row, req, ok) in enumerate(zip(local_indices.tolist(), token_to_req.tolist(), valid.tolist())):
            n = sum(1 for i in row if i >= 0) if ok else 0
            loads += [(t, req, i, block_size) for i in row[:n] if i >= 0]
        _check_table_loads(block_table, loads, "compute_global_topk_ragged_indices_and_indptr")
        with _bounded_memory():
            ragged, indptr, _lens = ctx.call(rocm.compute_global_topk_ragged_indices_and_indptr, local_indices,
                                             token_to_req, block_table, block_size, valid)
        return ragged[: int(indptr[-1])], indptr

    def compute_swa_indices_and_lens(positions, token_to_req, block_table, block_size, window):
        swa = ctx["swa"]  # here, not in build(): a tree without the module skips this entry only
        dev = positions.device
        T, R = positions.numel(), block_table.shape[0]
        pos_l, req_l = positions.tolist(), token_to_req.tolist()
        if any(p > 2 ** 31 - 2 for p in pos_l):
            raise ValueError("positions: upstream derives a position as seq_len - 1 from an int32 seq_lens; at most "
                             "2^31 - 2")
        loads = []
        for t, (p, req) in enumerate(zip(pos_l, req_l)):
            if p < 0:
                continue
            if not 0 <= req < R:
                raise OutOfBoundsRead(f"compute_swa_indices_and_lens: token {t}'s request {req} is outside the block "
                                      f"table's {R} rows (upstream loads its query_start_loc, seq_lens, replay_start "
                                      f"and block-table row)")
            loads += [(t, req, q, block_size) for q in range(max(p - window + 1, 0), p + 1)]
        _check_table_loads(block_table, loads, "compute_swa_indices_and_lens")
        indices = torch.full((T, 1, window), -1, dtype=torch.int32, device=dev)
        lens = torch.zeros(T, dtype=torch.int32, device=dev)
        is_valid = positions >= 0
        launcher = swa._COMPUTE_SWA_INDICES_AND_LENS_KERNEL
        kernel = swa._compute_swa_indices_and_lens_kernel

        def run():
            for t in range(T):
                req = req_l[t] if pos_l[t] >= 0 else 0
                qsl = torch.zeros(R + 1, dtype=torch.int32, device=dev)
                seq = torch.zeros(max(R, 1), dtype=torch.int32, device=dev)
                if pos_l[t] >= 0:
                    qsl[req], qsl[req + 1], seq[req] = t, t + 1, pos_l[t] + 1
                replay = torch.zeros(max(R, 1), dtype=torch.int32, device=dev)
                out_t, lens_t = indices[t], lens[t:t + 1]
                args = dict(swa_indices=out_t, swa_lens=lens_t, window_size=window, index_width=window,
                            left_visible=lens_t, right_visible=lens_t, query_start_loc=qsl, seq_lens=seq,
                            token_to_req_indices=token_to_req, is_valid_token=is_valid, block_table=block_table,
                            block_size=block_size, replay_start=replay, num_tokens=1, token_offset=t)
                grid, spec = type(launcher).__call__(launcher, **args)  # upstream's launch spec (grid, constexprs)
                kernel[grid](**_bind_launch(kernel, spec, args))

        if T:
            with _bounded_memory():
                ctx.call(run)
        return indices, lens

    return Family("ragged", build_ragged_indices_from_dense=build_ragged_indices_from_dense,
                  compute_global_topk_ragged_indices_and_indptr=compute_global_topk_ragged_indices_and_indptr,
                  compute_swa_indices_and_lens=compute_swa_indices_and_lens)
