"""DSv4 prefill assembly: upstream's ``combine_topk_swa_indices`` (``vllm/models/deepseek_v4/amd/rocm.py``), its
chunk planner ``DeepseekSparseSWAMetadata.get_prefill_chunk_plan`` (``vllm/v1/attention/backends/mla/sparse_swa.py``)
and the C4A indexer-K gate ``_indexer_k_is_c4a_block_flat`` (``vllm/v1/attention/ops/rocm_aiter_mla_sparse.py``),
behind our ``impl.prefill_assembly`` API.

- ``combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, *, compress_ratio, M, N, topk,
  window_size, max_image_tokens, left_visible, right_visible)``: upstream's host function with the same tensors
  and its positional ``window_size, compress_ratio, topk, M, N``; the image visibility arguments (vLLM 0.31.0 on;
  0.29.0 has none) by keyword, only when a case gives them (a text case calls it as before).
- ``plan_prefill_chunks(seq_lens, query_lens, *, compress_ratio, max_model_len, max_num_batched_tokens,
  window_size, prefill_chunk_size, has_compressed)``: the planner is a method of the SWA metadata dataclass; the
  adapter builds that dataclass with the fields the method reads (``num_prefills``, ``prefill_seq_lens_cpu``,
  ``prefill_query_lens_cpu`` as int32 CPU tensors, ``prefill_window_size``, ``prefill_max_model_len``,
  ``prefill_max_num_batched_tokens``; placeholder block table and slot mapping it never reads) and calls it.
  ``prefill_chunk_size`` defaults to ``DeepseekV4Attention.PREFILL_CHUNK_SIZE`` (4 in 0.33.0: the class lives in a
  module this subject does not load, so the figure is ours). A tree without the SWA module has no planner: the
  entry is :class:`EntryMissing` naming it.
- ``indexer_k_is_c4a_block_flat(compress_ratio)``: upstream's gate.
- ``indexer_k_layout_for_ratio``: :class:`EntryMissing`. Upstream has no such function: each call site turns the
  gate into a layout inline (``cache_layout="NORMAL" if gate else None``), so there is nothing to call.
"""
from __future__ import annotations

import torch

from contracts.subjects.base import EntryMissing, Family
from contracts.subjects.vllm import standins
from contracts.subjects.vllm.adapters import needs

SWA_MODULE = "vllm.v1.attention.backends.mla.sparse_swa"
#: ``DeepseekV4Attention.PREFILL_CHUNK_SIZE`` in vLLM 0.33.0 (``vllm/models/deepseek_v4/attention.py``)
UPSTREAM_PREFILL_CHUNK_SIZE = 4
UPSTREAM_WINDOW = 128
UPSTREAM_TOPK = 512


def _swa_module(ctx):
    mod = ctx.loaded.modules.get(SWA_MODULE)
    # an InertModule is the loader's stand-in for a module the tree does not provide (its names are placeholders)
    if mod is None or isinstance(mod, standins.InertModule) \
            or standins.is_placeholder(getattr(mod, "DeepseekSparseSWAMetadata", None)):
        raise EntryMissing("prefill_assembly.plan_prefill_chunks",
                           f"upstream plans prefill chunks in {SWA_MODULE.replace('.', '/')}.py "
                           f"(DeepseekSparseSWAMetadata.get_prefill_chunk_plan), which this subject's tree does not "
                           f"load")
    return mod


#: the release whose combine_topk_swa_indices first takes the image visibility (0.29.0 does not; 0.31.0 does)
IMAGE_SINCE = "0.31.0"
IMAGE_PARAMETERS = ("max_image_tokens", "left_visible", "right_visible")


def _require_image_parameters(ctx, fn) -> None:
    """SymbolTooNew (a release before IMAGE_SINCE) or SymbolMissing naming the parameters upstream's combine
    lacks."""
    import inspect

    from contracts.subjects.base import SymbolMissing, SymbolTooNew
    from contracts.subjects.vllm.adapters import predates

    missing = [p for p in IMAGE_PARAMETERS if p not in inspect.signature(fn).parameters]
    if not missing:
        return
    version = getattr(ctx.subject, "release", ctx.subject.version)
    what = (f"the prefill_assembly adapter passes {', '.join(missing)} to combine_topk_swa_indices "
            f"(vllm/models/deepseek_v4/amd/rocm.py)")
    if predates(version, IMAGE_SINCE):
        raise SymbolTooNew(f"{what}, which came in vLLM {IMAGE_SINCE}; this subject is {version}")
    raise SymbolMissing(f"{what}, which this tree's function does not take: the adapter needs a look")


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": ["_indexer_k_is_c4a_block_flat"],
    "rocm": ["combine_topk_swa_indices"],
}, since={"ops._indexer_k_is_c4a_block_flat": "0.31.0"})


def build(ctx) -> Family:
    rocm = ctx["rocm"]
    ops = ctx["ops"]

    def combine_topk_swa_indices(topk_indices, query_start_loc, seq_lens, gather_lens, *, compress_ratio, M, N,
                                 topk=UPSTREAM_TOPK, window_size=UPSTREAM_WINDOW, **image):
        if image:
            _require_image_parameters(ctx, rocm.combine_topk_swa_indices)
        return ctx.call(rocm.combine_topk_swa_indices, topk_indices, query_start_loc, seq_lens, gather_lens,
                        window_size, compress_ratio, topk, M, N, **image)

    def plan_prefill_chunks(seq_lens, query_lens, *, compress_ratio, max_model_len, max_num_batched_tokens,
                            window_size=UPSTREAM_WINDOW, prefill_chunk_size=UPSTREAM_PREFILL_CHUNK_SIZE,
                            has_compressed=None):
        mod = _swa_module(ctx)
        seqs = torch.as_tensor(list(int(x) for x in seq_lens), dtype=torch.int32)
        qs = torch.as_tensor(list(int(x) for x in query_lens), dtype=torch.int32)

        def run():
            meta = mod.DeepseekSparseSWAMetadata(
                block_table=torch.zeros(0, 0, dtype=torch.int32), slot_mapping=torch.zeros(0, dtype=torch.int64),
                block_size=64, num_prefills=int(seqs.numel()), prefill_seq_lens_cpu=seqs,
                prefill_query_lens_cpu=qs, prefill_window_size=window_size, prefill_max_model_len=max_model_len,
                prefill_max_num_batched_tokens=max_num_batched_tokens)
            return meta.get_prefill_chunk_plan(compress_ratio=compress_ratio, prefill_chunk_size=prefill_chunk_size,
                                               has_compressed=has_compressed)

        return ctx.call(run)

    def indexer_k_is_c4a_block_flat(compress_ratio):
        return bool(ctx.call(ops._indexer_k_is_c4a_block_flat, compress_ratio))

    def indexer_k_layout_for_ratio(compress_ratio, block_size=None):
        raise EntryMissing("prefill_assembly.indexer_k_layout_for_ratio",
                           "upstream has no such function: its call sites pass cache_layout='NORMAL' if "
                           "_indexer_k_is_c4a_block_flat(ratio) else None inline; the gate itself is "
                           "indexer_k_is_c4a_block_flat")

    return Family("prefill_assembly", combine_topk_swa_indices=combine_topk_swa_indices,
                  plan_prefill_chunks=plan_prefill_chunks, indexer_k_is_c4a_block_flat=indexer_k_is_c4a_block_flat,
                  indexer_k_layout_for_ratio=indexer_k_layout_for_ratio)
