"""Split selectors: upstream's ``_decode_num_splits`` (gfx942) and ``_decode_gfx950_num_splits``.

Our entry point takes sizes (``batch``, ``num_heads``, the two index tensors' ``numel``) and a CU count; upstream's
selectors take what its decode wrapper (``_rocm_sparse_attn_decode_ragged_triton``) derives from them, so the
adapter computes exactly that: ``heads_blocks = cdiv(num_heads, 16)`` (the wrapper's ``block_h``), the average
lengths in floating point as ``numel * (1.0 / max(1, batch))`` (the extra one 0.0 without an extra segment), and
``block_k = 32``. The CU count is pinned the way upstream's own tests pin it: ``ops._decode_cu_count`` is replaced
for the duration of the call (under the loader's lock, so no other call sees it).
"""
from __future__ import annotations

import contextlib
from unittest import mock

from contracts.subjects.base import Family
from contracts.subjects.vllm.adapters import needs

#: the decode wrapper's head block (``block_h``) and its split-K walk (``block_k``)
WRAPPER_BLOCK_H = 16
WRAPPER_BLOCK_K = 32


def wrapper_selector_inputs(batch: int, num_heads: int, main_numel: int, extra_numel: int):
    """``(num_queries, heads_blocks, avg_main_len, avg_extra_len, block_k)`` as the decode wrapper passes them."""
    inv_q = 1.0 / max(1, batch)
    heads_blocks = -(-num_heads // WRAPPER_BLOCK_H)
    avg_main = main_numel * inv_q
    avg_extra = extra_numel * inv_q if extra_numel else 0.0
    return batch, heads_blocks, avg_main, avg_extra, WRAPPER_BLOCK_K


@contextlib.contextmanager
def pinned_cu(ops, cu_count: int):
    """``ops._decode_cu_count`` returns ``cu_count`` inside the block (upstream's tests patch it the same way)."""
    with mock.patch.object(ops, "_decode_cu_count", lambda: cu_count):
        yield


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["_decode_gfx950_num_splits", "_decode_num_splits"],
}, since={"ops._decode_gfx950_num_splits": "0.28.0", "ops._decode_num_splits": "0.24.0"})


def build(ctx) -> Family:
    ops = ctx["ops"]
    selectors = {"gfx942": ops._decode_num_splits, "gfx950": ops._decode_gfx950_num_splits}

    def select_num_splits(selector, batch, num_heads, main_numel, extra_numel, cu_count):
        if selector is None:
            return 1  # no split-K: the wrapper's fallback runs one kernel
        try:
            fn = selectors[selector]
        except KeyError:
            raise ValueError(f"selector: expected one of {sorted(selectors)} or None, got {selector!r}") from None
        args = wrapper_selector_inputs(batch, num_heads, main_numel, extra_numel)

        def run():
            with pinned_cu(ops, cu_count):
                return fn(*args)

        return ctx.call(run)

    def head_blocks(num_heads):
        return -(-num_heads // WRAPPER_BLOCK_H)

    return Family("splits", select_num_splits=select_num_splits, head_blocks=head_blocks)
