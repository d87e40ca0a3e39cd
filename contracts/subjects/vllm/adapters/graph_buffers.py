"""Graph buffers: upstream's ``_copy_ragged_to_graph_buffers`` (``vllm/models/deepseek_v4/amd/rocm.py``).

Upstream's copy takes the same six arguments as ours, so the adapter passes them through. Two things differ from
our signature and are settled here:

- the view rule is not an argument upstream: ``_ON_GFX950`` binds when the module is imported, so the target is
  the one this subject was bound to (a different ``target=`` is a caller error, not a verdict);
- upstream never reads indptr on the host and validates nothing (its callers size the buffers): ``check_indptr``
  has nothing to switch and is accepted only for the signature's sake.
"""
from __future__ import annotations

from contracts.subjects.base import Family
from contracts.subjects.vllm.adapters import needs
from impl.targets import get_target


def same_target(ctx, target) -> None:
    """Upstream's arch flags are this import's: refuse a call that asks for another target."""
    if target is not None and get_target(target).name != ctx.target.name:
        raise ValueError(f"target: this vllm subject is bound to {ctx.target.name} (arch flags bind at import), "
                         f"got {get_target(target).name}")


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself)
NEEDS = needs({
    "rocm": ["_copy_ragged_to_graph_buffers"],
})


def build(ctx) -> Family:
    rocm = ctx["rocm"]

    def copy_ragged_to_graph_buffers(ragged_indices, ragged_indptr, indices_buffer, indptr_buffer, num_rows,
                                     max_per_row, *, target=None, check_indptr=True):
        same_target(ctx, target)
        return ctx.call(rocm._copy_ragged_to_graph_buffers, ragged_indices, ragged_indptr, indices_buffer,
                        indptr_buffer, num_rows, max_per_row)

    return Family("graph_buffers", copy_ragged_to_graph_buffers=copy_ragged_to_graph_buffers)
