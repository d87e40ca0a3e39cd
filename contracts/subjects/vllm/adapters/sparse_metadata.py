"""The DSv3.2 sparse metadata builder on the ``vllm`` subject: upstream's ``ROCMAiterMLASparseMetadataBuilder``
(``vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py``) behind our API (``impl/sparse_metadata.py``).

Entry points: ``SparseMLAMetadataBuilder`` (our constructor, ``build``, ``fill_global_indices``, ``buffers()``,
``partition``, ``paged_kv_indices``, ``counters``) and ``CommonMetadata`` (our input record; ``build`` translates it).

How upstream is built, the way its own tests build a backend builder: a fake AITER (``aiter`` in ``sys.modules``
during each call, :class:`~contracts.subjects.vllm.adapters.work_partition.FakeAiter`) and minimal config objects
holding exactly the fields the constructor and ``build()`` read:

- ``vllm_config``: ``model_config`` (``dtype``, ``max_model_len``, ``hf_text_config.index_topk``,
  ``get_num_attention_heads``), ``cache_config.cache_dtype`` (``auto`` for a bf16 cache, ``fp8`` for an fp8 one),
  ``scheduler_config.max_num_batched_tokens`` (our ``max_tokens``), ``parallel_config`` (no context parallelism),
  ``compilation_config.static_forward_context`` (one layer without attention sinks, on the default sparse path, with
  no separate prefill backend: every token takes the sparse path this builder prepares, which is the path our
  contracts judge), ``attention_config`` (no HiSparse).
- ``kv_cache_spec.block_size`` (our ``block_size``); the forward's ``BLOCK_STRIDE_ROWS`` is the block size (a flat
  row view of a ``[blocks, block_size, D]`` cache).

The builder's base class lives in a module the audit does not load (``sparse_mla_attention``), and a class's bases
bind when its module executes; so this family imports upstream's modules once more for its target, with these
stand-ins (:data:`STANDINS`), each the behaviour upstream's own code has for the fields read here:

- ``SparseMLACommonMetadataBuilder``: the constructor keeps the config and reads ``index_topk``; ``build()`` maps
  tokens to requests into ``req_id_per_token_buffer[:T]``, counts decodes (leading requests of query length <= 1)
  and prefills, and returns the metadata record (no prefill metadata: there is no prefill backend).
- ``SparseMLACommonMetadata``: the record's fields.
- ``AiterMLAHelper.get_actual_mla_num_heads``: heads padded to a multiple of 16 (the fake AITER has no native
  24-head kernel).
- ``current_platform.num_compute_units()``: the target's CU count; ``np_to_pinned_tensor``: ``torch.from_numpy``
  (no pinned memory on a host without a GPU); ``gpu_sync_allowed``: counts the host sync it marks.

Host syncs (``counters.host_syncs``): each ``gpu_sync_allowed`` block upstream enters (its read of ``seq_lens``,
on every build) and each stream synchronisation (after a partition recompute); on a CPU device the latter is
observed rather than run. A build is a cache hit when it did not call ``get_mla_metadata_v1``.

Upstream has no ``seq_lens_cpu`` (it copies the device ``seq_lens`` every build) and no choice of partition
(``use_aiter``: the fake AITER always stands in) or granularity (it passes ``kv_granularity=16``; ``kv_granularity``
here reports what the last ``get_mla_metadata_v1`` call was given). The forward's conversion of top-k rows
(``fit_kpool_indices_to_aiter`` + ``triton_convert_req_index_to_global_index``) is ``fill_global_indices``. The forward
tiles the top-k columns by 128, which needs ``topk % 128 == 0``; for the contracts' small ``topk`` the rows are widened
with -1 columns to the next power of two and converted in one tile per token. The added columns lie past ``topk``,
where no token writes (a sparse length is at most ``topk``), so every entry written is the one the forward writes.
"""
from __future__ import annotations

import contextlib
import sys
import types
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import torch

from contracts.subjects.base import Family, SubjectUnavailable
from contracts.subjects.vllm.adapters.work_partition import FakeAiter, fake_aiter
from contracts.subjects.vllm.adapters import needs
from impl.sparse_metadata import BuildCounters, CommonMetadata
from impl.runtime import triton_mode
from impl.targets import effective_cu_count, get_target

MIN_MLA_HEADS = 16
LAYER = "model.layers.0.self_attn.attn"
KV_LORA_RANK = 512
QK_ROPE_HEAD_DIM = 64
BASE_MODULE = "vllm.model_executor.layers.attention.sparse_mla_attention"

T_ = TypeVar("T_")


# --- stand-ins bound at import (see the module docstring) ------------------------------------------------------------

@dataclass(kw_only=True)
class SparseMLACommonMetadata:
    num_reqs: int
    max_query_len: int
    max_seq_len: int
    num_actual_tokens: int
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor | None
    block_table: torch.Tensor
    req_id_per_token: torch.Tensor
    seq_lens: torch.Tensor | None = None
    block_size: int = 64
    topk_tokens: int = 2048
    num_decodes: int = 0
    num_prefills: int = 0
    num_decode_tokens: int = 0
    decode_max_query_len: int = 0
    prefill_max_seq_len: int = 0
    prefill: Any = None
    cp_kv_cache_interleave_size: int = 1


class SparseMLACommonMetadataBuilder(Generic[T_]):
    metadata_cls: type

    def __init__(self, kv_cache_spec, layer_names, vllm_config, device):
        self.kv_cache_spec = kv_cache_spec
        self.layer_names = layer_names
        self.vllm_config = vllm_config
        self.device = device
        self.model_config = vllm_config.model_config
        self.mla_dims = types.SimpleNamespace(kv_lora_rank=KV_LORA_RANK, qk_rope_head_dim=QK_ROPE_HEAD_DIM)
        self.topk_tokens = int(vllm_config.model_config.hf_text_config.index_topk)
        self.req_id_per_token_buffer = torch.empty(vllm_config.scheduler_config.max_num_batched_tokens,
                                                   dtype=torch.int32, device=device)
        self.pcp_world_size = 1
        self.use_pcp = False
        self.dcp_world_size = 1
        self.cp_kv_cache_interleave_size = 1
        self.reorder_batch_threshold = 1

    def _init_reorder_batch_threshold(self, reorder_batch_threshold=1, supports_spec_as_decode=False,
                                      supports_dcp_with_varlen=False):
        self.reorder_batch_threshold = reorder_batch_threshold

    def build(self, common_prefix_len, common_attn_metadata, fast_build=False):
        cam = common_attn_metadata
        T, R = int(cam.num_actual_tokens), int(cam.num_reqs)
        starts = cam.query_start_loc_cpu[:R + 1].to(torch.int64)
        q_lens = torch.diff(starts)
        req = torch.repeat_interleave(torch.arange(R, dtype=torch.int32), q_lens)
        self.req_id_per_token_buffer[:T].copy_(req.to(self.req_id_per_token_buffer.device))
        threshold = self.reorder_batch_threshold or 1
        num_decodes = 0
        while num_decodes < R and int(q_lens[num_decodes]) <= threshold:
            num_decodes += 1
        decode_max_q = int(q_lens[:num_decodes].max()) if num_decodes else 0
        return self.metadata_cls(
            num_reqs=R, max_query_len=int(cam.max_query_len), max_seq_len=int(cam.max_seq_len),
            num_actual_tokens=T, query_start_loc=cam.query_start_loc, slot_mapping=cam.slot_mapping,
            block_table=cam.block_table_tensor, req_id_per_token=self.req_id_per_token_buffer[:T],
            seq_lens=cam.seq_lens, block_size=self.kv_cache_spec.block_size, topk_tokens=self.topk_tokens,
            num_decodes=num_decodes, num_prefills=R - num_decodes,
            num_decode_tokens=int(starts[num_decodes]), decode_max_query_len=decode_max_q, prefill_max_seq_len=0,
            prefill=None)


class AiterMLAHelper:
    @staticmethod
    def get_actual_mla_num_heads(num_heads: int) -> int:
        return -(-int(num_heads) // MIN_MLA_HEADS) * MIN_MLA_HEADS


def np_to_pinned_tensor(arr) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr))


class _SyncLog:
    """Where the stand-in ``gpu_sync_allowed`` and the observed stream syncs count (one per adapter call)."""

    current: "BuildCounters | None" = None

    @classmethod
    def note(cls, reason: str) -> None:
        if cls.current is not None:
            cls.current.host_syncs += 1
            cls.current.sync_reasons.append(reason)


@contextlib.contextmanager
def gpu_sync_allowed(*args, **kwargs):
    _SyncLog.note("upstream: gpu_sync_allowed (seq_lens copied to the host)")
    yield


def _platform(target):
    from contracts.subjects.vllm import standins

    fp8 = torch.float8_e4m3fnuz if target.main_cache_fp8 == "fnuz" else torch.float8_e4m3fn
    cu = effective_cu_count(target)

    class _Platform(standins.Platform):
        def num_compute_units(self, device_id=0):
            return cu

    return _Platform(target.name, fp8, target.cu_count)


#: module -> the names this family's import gets (see the module docstring)
STANDINS = {
    BASE_MODULE: ("SparseMLACommonMetadata", "SparseMLACommonMetadataBuilder"),
    "vllm.v1.attention.backends.mla.rocm_aiter_mla": ("AiterMLAHelper",),
    "vllm.utils.torch_utils": ("np_to_pinned_tensor",),
    "vllm.utils.gpu_sync_debug": ("gpu_sync_allowed",),
    "vllm.platforms": ("current_platform",),
}


def _extra_standins(target) -> dict:
    g = globals()
    out = {mod: {name: g[name] for name in names if name in g} for mod, names in STANDINS.items()}
    out["vllm.platforms"] = {"current_platform": _platform(target)}
    return out


# --- calls ---------------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def _no_overflow_asserts():
    """The Triton interpreter checks every int32 add and multiply for overflow (a device assert per operation,
    ``sanitize_overflow``); a GPU compiles those asserts out unless the kernel runs in debug mode, and wraps. The
    builder's kernels are integer-only index arithmetic, where the checks cost about three quarters of the
    interpreted time; during this family's calls they are off, as on the device."""
    try:
        from triton.runtime import interpreter as ti
    except ImportError:  # pragma: no cover - a Triton without the interpreter: nothing to switch
        yield
        return
    builder = getattr(ti, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if options is None or not getattr(options, "sanitize_overflow", False):
        yield
        return
    import dataclasses

    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    try:
        yield
    finally:
        builder.options = options


@contextlib.contextmanager
def _upstream_call(fake: FakeAiter | types.ModuleType, counters: BuildCounters | None):
    """During one call of upstream's builder: ``aiter`` is the fake, syncs are counted, and on a CPU device the
    stream synchronisation upstream does after a recompute is observed (counted) instead of run."""
    mod = fake.module if isinstance(fake, FakeAiter) else fake
    saved_aiter = sys.modules.get("aiter")
    real_stream = torch.cuda.current_stream

    def current_stream(device=None):
        dev = torch.device(device) if device is not None else None
        if dev is not None and dev.type == "cuda":
            stream = real_stream(dev)
            _SyncLog.note("upstream: stream synchronised after the partition")
            return stream
        return types.SimpleNamespace(synchronize=lambda: _SyncLog.note(
            "upstream: stream synchronised after the partition"))

    prev_log = _SyncLog.current
    sys.modules["aiter"] = mod
    torch.cuda.current_stream = current_stream
    _SyncLog.current = counters
    try:
        yield
    finally:
        _SyncLog.current = prev_log
        torch.cuda.current_stream = real_stream
        if saved_aiter is None:
            sys.modules.pop("aiter", None)
        else:
            sys.modules["aiter"] = saved_aiter


@dataclass
class UpstreamBuild:
    """What ``build()`` returns: the fields our checks read, taken from upstream's metadata (``upstream``)."""

    num_reqs: int
    num_tokens: int
    max_query_len: int
    num_kv_entries: int
    topk_tokens: int
    block_size: int
    num_heads: int
    block_table: torch.Tensor
    req_id_per_token: torch.Tensor
    qo_indptr: torch.Tensor
    paged_kv_last_page_len: torch.Tensor
    paged_kv_indptr: torch.Tensor
    paged_kv_indices: torch.Tensor
    partition: dict | None
    cache_hit: bool
    partition_from_aiter: bool = True
    upstream: Any = None


def _tile(topk: int) -> int:
    """The width the top-k rows are converted at: ``topk`` itself when the forward's 128-column tile divides it;
    else the next power of two, the rows widened with -1 columns (see ``fill_global_indices``)."""
    if topk % 128 == 0:
        return 128
    return 1 << (int(topk) - 1).bit_length()


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "builder": [
        "ROCMAiterMLASparseMetadataBuilder", "fit_kpool_indices_to_aiter",
        "triton_convert_req_index_to_global_index",
    ],
}, since={"builder.fit_kpool_indices_to_aiter": "0.30.0"})


def build(ctx) -> Family:
    from contracts.subjects import fidelity
    from contracts.subjects.vllm.context import BoundContext

    target = ctx.target
    fp8 = torch.float8_e4m3fnuz if target.main_cache_fp8 == "fnuz" else torch.float8_e4m3fn
    loaded = ctx.subject.tree.load(target.name, fp8, target.cu_count, rewrites=fidelity.rewrites_for_host(),
                                   extra_standins=_extra_standins(target))
    for rw in loaded.rewrites:  # listed in the report like the bind's own
        if all(r["id"] != rw["id"] or r["file"] != rw["file"] for r in ctx.subject.rewrites):
            ctx.subject.rewrites.append(rw)
    own = BoundContext(ctx.subject, target, loaded)
    mod = loaded["builder"]

    class SparseMLAMetadataBuilder:
        """Our builder's API with upstream's ``ROCMAiterMLASparseMetadataBuilder`` behind it (module docstring)."""

        def __init__(self, max_tokens: int, num_heads: int, *, topk_tokens: int = 2048, block_size: int = 1,
                     target=None, device="cpu", kv_granularity: int = 16, use_aiter: bool | None = None,
                     aiter_module: types.ModuleType | None = None, q_dtype: torch.dtype = torch.bfloat16,
                     kv_dtype: torch.dtype = torch.bfloat16):
            t = get_target(target) if target is not None else ctx.target
            if t.name != ctx.target.name:
                raise SubjectUnavailable(f"this binding imports upstream for {ctx.target.name}, not {t.name}")
            if use_aiter and aiter_module is None:
                raise SubjectUnavailable("real AITER is not available here; the fake AITER stands in "
                                         "(pass use_aiter=False or an aiter_module)")
            self.target = t
            self.device = torch.device(device)
            if self.device.type == "cpu" and triton_mode() == "native":
                # upstream's builder launches Triton kernels on its metadata tensors: natively they must live on
                # the GPU, and this adapter (like ours' builder) keeps them on the host
                raise SubjectUnavailable("upstream's builder launches Triton kernels on its metadata tensors; this "
                                         "adapter keeps them on the host, which only the Triton interpreter runs")
            self.max_tokens = int(max_tokens)
            self.num_heads = int(num_heads)
            self.topk_tokens = int(topk_tokens)
            self.block_size = int(block_size)
            self.requested_kv_granularity = int(kv_granularity)
            self.num_cu = effective_cu_count(t)
            self.fake = fake_aiter(t) if aiter_module is None else None
            self._aiter = self.fake if aiter_module is None else aiter_module
            self.counters = BuildCounters()
            self.q_dtype, self.kv_dtype = q_dtype, kv_dtype
            fp8_cache = kv_dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
            heads = self.num_heads
            model_config = types.SimpleNamespace(
                dtype=q_dtype, max_model_len=1 << 16,
                hf_text_config=types.SimpleNamespace(index_topk=self.topk_tokens),
                get_num_attention_heads=lambda parallel_config: heads)
            layer = types.SimpleNamespace(impl=types.SimpleNamespace(sinks=None, use_aiter_sparse_mla=False),
                                          prefill_backend=None)
            self.vllm_config = types.SimpleNamespace(
                model_config=model_config,
                cache_config=types.SimpleNamespace(cache_dtype="fp8" if fp8_cache else "auto",
                                                   block_size=self.block_size),
                scheduler_config=types.SimpleNamespace(max_num_batched_tokens=self.max_tokens,
                                                       max_num_seqs=self.max_tokens),
                parallel_config=types.SimpleNamespace(prefill_context_parallel_size=1,
                                                      decode_context_parallel_size=1,
                                                      cp_kv_cache_interleave_size=1),
                compilation_config=types.SimpleNamespace(static_forward_context={LAYER: layer}),
                attention_config=types.SimpleNamespace(hisparse_config=None, sparse_mla_force_mqa=False))
            self.kv_cache_spec = types.SimpleNamespace(block_size=self.block_size)
            with _upstream_call(self._aiter, None):
                self.upstream = own.call(mod.ROCMAiterMLASparseMetadataBuilder, self.kv_cache_spec, [LAYER],
                                         self.vllm_config, self.device)

        # --- what our checks read -------------------------------------------------------------------------------

        @property
        def kv_granularity(self) -> int:
            calls = getattr(self.fake, "calls", None)
            return calls[-1]["kv_granularity"] if calls else self.requested_kv_granularity

        @property
        def num_heads_padded(self) -> int:
            return int(self.upstream._num_attention_heads)

        @property
        def paged_kv_indices(self) -> torch.Tensor:
            return self.upstream.paged_kv_indices

        @property
        def partition(self) -> dict:
            u = self.upstream
            return {"work_meta": u._mla_work_meta_data, "work_indptr": u._mla_work_indptr,
                    "work_info": u._mla_work_info_set, "reduce_indptr": u._mla_reduce_indptr,
                    "reduce_final_map": u._mla_reduce_final_map, "reduce_partial_map": u._mla_reduce_partial_map}

        def buffers(self) -> dict:
            u = self.upstream
            out = {"req_id_per_token": u.req_id_per_token_buffer, "qo_indptr": u.qo_indptr,
                   "paged_kv_last_page_len": u.paged_kv_last_page_len, "paged_kv_indptr": u.paged_kv_indptr,
                   "paged_kv_indices": u.paged_kv_indices}
            out.update({f"partition.{k}": v for k, v in self.partition.items()})
            return out

        def invalidate_partition_cache(self) -> None:
            self.upstream._prev_metadata_key = None

        # --- the calls ------------------------------------------------------------------------------------------

        def _attention_metadata(self, common: CommonMetadata):
            R = int(common.num_reqs)
            host = common.seq_lens_cpu if common.seq_lens_cpu is not None else common.seq_lens.to("cpu")
            max_seq = int(host[:R].max()) if R else 0
            return types.SimpleNamespace(
                query_start_loc=common.query_start_loc, query_start_loc_cpu=common.query_start_loc_cpu,
                seq_lens=common.seq_lens, seq_lens_cpu_upper_bound=host, num_reqs=R,
                num_actual_tokens=int(common.num_actual_tokens), max_query_len=int(common.max_query_len),
                max_seq_len=max_seq, block_table_tensor=common.block_table,
                slot_mapping=torch.empty(0, dtype=torch.int64, device=self.device), causal=True,
                max_logits_per_req=None)

        def build(self, common: CommonMetadata) -> UpstreamBuild:
            cam = self._attention_metadata(common)
            calls_before = len(self.fake.calls) if self.fake is not None else None
            key_before = self.upstream._prev_metadata_key
            with _upstream_call(self._aiter, self.counters), _no_overflow_asserts():
                md = own.call(self.upstream.build, 0, cam)
            self.counters.builds += 1
            if self.fake is not None:
                recomputed = len(self.fake.calls) > calls_before
            else:
                recomputed = self.upstream._prev_metadata_key is not key_before
            if recomputed:
                self.counters.recomputes += 1
            else:
                self.counters.hits += 1
            T = int(md.paged_kv_indptr.shape[0]) - 1
            partition = None
            if md.work_meta_data is not None:
                partition = self.partition
            return UpstreamBuild(
                num_reqs=int(md.num_reqs), num_tokens=T, max_query_len=int(md.max_query_len),
                num_kv_entries=int(md.paged_kv_indptr[T]), topk_tokens=int(md.topk_tokens),
                block_size=int(md.block_size), num_heads=self.num_heads_padded, block_table=md.block_table,
                req_id_per_token=md.req_id_per_token, qo_indptr=md.qo_indptr,
                paged_kv_last_page_len=md.paged_kv_last_page_len, paged_kv_indptr=md.paged_kv_indptr,
                paged_kv_indices=md.paged_kv_indices, partition=partition, cache_hit=not recomputed, upstream=md)

        def fill_global_indices(self, metadata: UpstreamBuild, topk_indices: torch.Tensor, *,
                                validate: bool | None = None) -> torch.Tensor:
            """The forward's conversion (upstream validates nothing, so ``validate`` has no effect)."""
            T, K = metadata.num_tokens, metadata.topk_tokens
            md = metadata.upstream

            def forward_conversion():  # one activation of upstream's modules for both of the forward's calls
                rows = mod.fit_kpool_indices_to_aiter(topk_indices[:T], K)
                if not T:
                    return
                width = _tile(K)
                if K % width:
                    # one tile of the next power of two per token: the added columns lie past topk, where no token
                    # writes (a sparse length is at most topk), so every entry written is the forward's own
                    wide = torch.full((T, width), -1, dtype=rows.dtype, device=rows.device)
                    wide[:, :K] = rows
                    rows = wide
                mod.triton_convert_req_index_to_global_index(
                    md.req_id_per_token[:T], md.block_table, rows, md.paged_kv_indptr, md.paged_kv_indices,
                    BLOCK_STRIDE_ROWS=md.block_size, BLOCK_SIZE=md.block_size, NUM_TOPK_TOKENS=rows.shape[1],
                    BLOCK_N=min(width, 128))

            with _no_overflow_asserts():
                own.call(forward_conversion)
            return self.upstream.paged_kv_indices[:metadata.num_kv_entries]

    return Family("sparse_metadata", SparseMLAMetadataBuilder=SparseMLAMetadataBuilder,
                  CommonMetadata=CommonMetadata)
