"""The persistent work partition of the DSv3.2 sparse decode, on the ``vllm`` subject: the fake AITER.

Upstream's builder (``ROCMAiterMLASparseMetadataBuilder``) sizes six work buffers with AITER's
``get_mla_metadata_info_v1``, fills them with ``get_mla_metadata_v1`` when its cache key changes, and hands them to
AITER's ``mla_decode_fwd``, which executes them. AITER is not part of the subject (it is a closed ROCm library that
does not exist on this host), so the audit runs upstream's builder against :class:`FakeAiter`, the same model of AITER
that ``impl/sparse_metadata.py`` is written against:

- ``get_mla_metadata_info_v1`` gives the shapes of :func:`impl.work_partition.partition_capacity` (int32) for the
  batch size upstream passes.
- ``get_mla_metadata_v1`` computes the documented partition of :mod:`impl.work_partition` from the ``kv_indptr`` it is
  given, the device's CU count (the target's, as AITER reads it from the device) and the ``kv_granularity`` it is
  passed, and writes every one of the six buffers in full: the live prefix, zeros after. What the real library leaves
  past its live extents is AITER's business, not vLLM's code, so it is not judged here. The arguments the model does
  not use (heads, dtypes, ``max_split_per_batch``, ``fast_mode``) are recorded in :attr:`FakeAiter.calls`.
- the consumer, ``sparse_decode_from_partition`` (this family's one entry point), executes a partition item by item,
  as AITER's persistent decode would; it is the model's consumer, the same as ours, because the partition layout is
  the model's.

So on this subject the partition and its consumer are the model's; what is upstream's is *when* the partition is
recomputed (its cache key), which ``kv_indptr`` it is computed from, and what the builder's other buffers hold.
"""
from __future__ import annotations

import types

import numpy as np
import torch

from contracts.subjects.base import Family
from impl.targets import effective_cu_count
from impl.work_partition import (PARTITION_BUFFERS, compute_work_partition, partition_capacity,
                                 sparse_decode_from_partition)


class FakeAiter:
    """The ``aiter`` module as upstream's builder imports it (``dtypes``, ``get_mla_metadata_info_v1``,
    ``get_mla_metadata_v1``), with the model's partition behind it (see the module docstring). ``calls`` records the
    ``get_mla_metadata_v1`` calls: ``{"kv_indptr": [...], "kv_granularity": int, "kwargs": {...}}``."""

    def __init__(self, num_cu: int, fp8: torch.dtype = torch.float8_e4m3fn):
        self.num_cu = int(num_cu)
        self.fp8 = fp8
        self.calls: list[dict] = []
        self.info_calls: list[tuple] = []
        self.module = self._as_module()

    def _as_module(self) -> types.ModuleType:
        m = types.ModuleType("aiter")
        fp8 = self.fp8
        m.dtypes = types.SimpleNamespace(fp8=fp8, bf16=torch.bfloat16, fp16=torch.float16,
                                         d_dtypes={"fp8": fp8, "bf16": torch.bfloat16, "fp16": torch.float16})
        m.get_mla_metadata_info_v1 = self.get_mla_metadata_info_v1
        m.get_mla_metadata_v1 = self.get_mla_metadata_v1
        return m

    def get_mla_metadata_info_v1(self, batch_size, max_seqlen_qo, num_heads, q_dtype, kv_dtype, *, is_sparse=False,
                                 fast_mode=True, **kwargs):
        self.info_calls.append((int(batch_size), int(max_seqlen_qo), int(num_heads), q_dtype, kv_dtype, is_sparse))
        caps = partition_capacity(int(batch_size) * int(max_seqlen_qo), self.num_cu)
        return [(caps[name], torch.int32) for name in PARTITION_BUFFERS]

    def get_mla_metadata_v1(self, qo_indptr, kv_indptr, kv_last_page_len, num_heads_per_head_k, num_heads_k,
                            is_causal, work_meta_data, work_info_set, work_indptr, reduce_indptr, reduce_final_map,
                            reduce_partial_map, *, kv_granularity=16, page_size=1, **kwargs):
        indptr = kv_indptr.detach().to("cpu").numpy().astype(np.int64)
        live = compute_work_partition(indptr, self.num_cu, int(kv_granularity))
        bufs = {"work_meta": work_meta_data, "work_indptr": work_indptr, "work_info": work_info_set,
                "reduce_indptr": reduce_indptr, "reduce_final_map": reduce_final_map,
                "reduce_partial_map": reduce_partial_map}
        for name, buf in bufs.items():
            arr = live[name]
            n = int(arr.shape[0])
            if tuple(arr.shape[1:]) != tuple(buf.shape[1:]) or n > buf.shape[0]:
                raise ValueError(f"fake AITER: {name} needs {list(arr.shape)}, the buffer holds {list(buf.shape)}")
            buf.zero_()
            if n:
                buf[:n].copy_(torch.from_numpy(np.ascontiguousarray(arr)).to(buf.dtype))
        self.calls.append({"kv_indptr": indptr.tolist(), "kv_granularity": int(kv_granularity),
                           "page_size": int(page_size), "num_heads": int(num_heads_per_head_k),
                           "kwargs": {k: v for k, v in kwargs.items() if not isinstance(v, torch.Tensor)}})


def fake_aiter(target) -> FakeAiter:
    """The fake AITER of ``target``'s device: its CU count and its fp8 type (FNUZ on gfx942)."""
    fp8 = torch.float8_e4m3fnuz if target.main_cache_fp8 == "fnuz" else torch.float8_e4m3fn
    return FakeAiter(effective_cu_count(target), fp8)


def build(ctx) -> Family:
    return Family("work_partition", sparse_decode_from_partition=sparse_decode_from_partition)
