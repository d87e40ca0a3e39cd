"""The DSv4 step's metadata builder: upstream's ``DeepseekV4ROCMAiterMLASparseMetadataBuilder``
(``vllm/models/deepseek_v4/amd/rocm.py``) behind our ``impl.dsv4_step.Dsv4MetadataBuilder`` API.

Upstream's ROCm builder overrides two methods of its parent (``DeepseekV4SparseMLAMetadataBuilder``, in a module
this audit does not load: a stand-in): ``build`` (the parent's metadata, plus the C128A rows made ragged and copied
into the builder's persistent graph buffers, in a ``DeepseekV4ROCMAiterMLASparseMetadata`` whose
``for_cudagraph_capture`` keeps its default) and ``build_for_cudagraph_capture`` (the parent's capture metadata
with ``for_cudagraph_capture`` set to ``_ON_GFX950``). The adapter runs both overrides as upstream wrote them, on a
builder made without the parent's constructor, with the parent's methods stubbed: the parent's ``build`` hands back
a base with no C128A rows (so the override builds no ragged rows) and the parent's ``build_for_cudagraph_capture``
hands back what the override's own ``build`` made. What the returned metadata says about capture is upstream's;
the slot mappings, windows and rows are the parent's work, which this subject cannot run: the metadata has none
of them (``dsv4-builder-capture-flag`` judges the flag; the step, ``dsv4-step-agreement``, skips this subject for
its SWA insert, a C++ op).

``step_epilogue`` and ``build_layer_metadata`` are missing: upstream has no such functions (its epilogue is
inside ``forward_mqa``; its per-layer metadata comes from the builders).
"""
from __future__ import annotations

import types
from unittest import mock

from contracts.subjects.base import EntryMissing, Family
from contracts.subjects.vllm.adapters import needs
from contracts.subjects.vllm.adapters.cache_writers import FamilyWithReasons
from contracts.subjects.vllm.adapters.graph_buffers import same_target
from impl.dsv4_step import layer_kind

#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself); the
#: capture override came after 0.27.1 and is in 0.29.0 (0.28.0 not audited here): a release before 0.29.0 without
#: it skips
NEEDS = needs({
    "rocm": ["DeepseekV4ROCMAiterMLASparseMetadataBuilder",
             "DeepseekV4ROCMAiterMLASparseMetadataBuilder.build_for_cudagraph_capture",
             "DeepseekV4ROCMAiterMLASparseMetadata"],
}, since={"rocm.DeepseekV4ROCMAiterMLASparseMetadataBuilder.build_for_cudagraph_capture": "0.29.0"})

MISSING = {
    "step_epilogue": "upstream has no standalone step epilogue: its inverse RoPE and output quantization run inside "
                     "DeepseekV4ROCMAiterMLAAttention.forward_mqa",
    "build_layer_metadata": "upstream builds per-layer metadata only through its builders (Dsv4MetadataBuilder)",
}


class _Base:
    """The parent ``build``'s result as the override reads it: no C128A rows (class attributes, so ``vars()`` of
    an instance, which the override spreads into its dataclass, is empty)."""

    c128a_global_decode_topk_indices = None
    c128a_decode_topk_lens = None


def build(ctx) -> Family:
    rocm = ctx["rocm"]
    builder_cls = rocm.DeepseekV4ROCMAiterMLASparseMetadataBuilder
    parent = builder_cls.__mro__[1]

    class Dsv4MetadataBuilder:
        """Upstream's ROCm builder for one layer kind (module docstring); the arguments are validated as ours."""

        def __init__(self, compress_ratio, *, swa_block_size, block_size=None, max_model_len=None, target=None):
            same_target(ctx, target)
            self.kind = layer_kind(compress_ratio)
            self.compress_ratio = compress_ratio
            self._builder = object.__new__(builder_cls)
            self._builder.compress_ratio = max(1, compress_ratio)

        def _build(self):
            def run():
                with mock.patch.object(parent, "build", lambda s, **kw: _Base(), create=True):
                    return builder_cls.build(self._builder, common_prefix_len=0,
                                             common_attn_metadata=types.SimpleNamespace())
            return ctx.call(run)

        def build(self, positions, token_to_req, swa_block_table, block_table=None):
            """Upstream's ``build`` override (its parent stubbed): the metadata's capture flag is its default."""
            return self._build()

        def build_for_cudagraph_capture(self, positions, token_to_req, swa_block_table, block_table=None):
            """Upstream's ``build_for_cudagraph_capture`` override on what its ``build`` made."""
            made = self._build()

            def run():
                with mock.patch.object(parent, "build_for_cudagraph_capture", lambda s, cm: made, create=True):
                    return builder_cls.build_for_cudagraph_capture(self._builder, types.SimpleNamespace())
            return ctx.call(run)

    return FamilyWithReasons("dsv4_step", MISSING, Dsv4MetadataBuilder=Dsv4MetadataBuilder)


__all__ = ["build", "NEEDS", "EntryMissing"]
