"""Ragged index helpers: upstream's ``build_ragged_indices_from_dense`` (``vllm/v1/attention/ops/
rocm_aiter_mla_sparse.py``) behind our signature.

Upstream's conversion takes the lengths as a required argument; without ``topk_lens`` the adapter passes what
upstream's own callers compute in that case, ``(indices >= 0).sum(dim=-1, dtype=torch.int32)``. Upstream returns an
``R * W`` flat tensor whose entries past ``indptr[-1]`` are never written (``torch.empty``); our API returns the
packed entries, so the adapter keeps the first ``indptr[-1]`` (one host read, as ours makes).

Semantics differ from ours on purpose: upstream keeps only the valid entries of each row's first ``len`` (>= 0 and,
with ``num_rows >= 0``, < ``num_rows``), compacted, where ours keeps all ``len`` entries in place and writes -1 for
the invalid ones. The entry point is upstream's behaviour as it is; no contract of this suite holds either form
against the other.
"""
from __future__ import annotations

import torch

from contracts.subjects import Family


def build(ctx) -> Family:
    ops = ctx["ops"]

    def build_ragged_indices_from_dense(dense_indices, topk_lens=None, num_rows=-1):
        def run():
            lengths = topk_lens
            if lengths is None:
                lengths = (dense_indices >= 0).sum(dim=-1, dtype=torch.int32)
            return ops.build_ragged_indices_from_dense(dense_indices, lengths, num_rows=num_rows)

        flat, indptr = ctx.call(run)
        return flat[: int(indptr[-1])], indptr

    return Family("ragged", build_ragged_indices_from_dense=build_ragged_indices_from_dense)
