"""The production domain of every case family: which of its cases upstream's own callers can produce.

A family's domain is a tuple of :class:`Bound`\\ s over the case's fields. Each bound cites the upstream caller that
guarantees it (``path::function (release)``) and says what a case outside *that* bound is:

- ``caller-contract``: a shape, flag, length or id the function's own signature and docstring allow, but that no
  upstream caller passes (odd block sizes, INT32 extremes in index rows, a non-default softmax scale, ...);
- ``adversarial``: corrupt or foreign data (non-finite activations, norm weights no checkpoint holds, cache bytes
  no writer emits from finite values: UE8M0 code 255, NaN fp8 bytes, non-positive key scales).

:func:`reach_class` answers ``production`` (every bound holds), ``caller-contract`` (some bound fails, none of them
adversarial), ``adversarial`` (an adversarial bound fails) or ``None`` (the family declares no domain). Composite
families (a case holding sub-cases) are classified by their own bounds and their parts' (the worst wins).

Honesty rules: a field with no caller bound found in upstream's Python tree stays unbounded (it does not make a case
leave the domain). Some bounds are conservative where the case records a *rate* rather than the drawn values (for
instance ``invalid_rate > 0`` in a decode case mixes -1 entries, which production has, with out-of-range slots,
which it does not); their docstrings say so. The bounds read only the case's fields: no tensor is built, so a
classification costs microseconds. This module imports nothing from ``contracts/``.

Releases cited: vLLM 0.33.0 and 0.34.0 (``/tmp/vllm-full-0.3x.0``); "(0.33.0, 0.34.0)" means both read the same.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal

Reach = Literal["production", "caller-contract", "adversarial"]
#: how production reaches a case, nearest first (findings.toml's ``reach``, audit.json's ``reach_class``)
REACH_CLASSES: tuple = ("production", "caller-contract", "adversarial")
_RANK = {rc: i for i, rc in enumerate(REACH_CLASSES)}


@dataclass(frozen=True)
class Bound:
    """One bound of a family's production domain: ``inside(case)`` holds for every case upstream's callers make;
    ``caller`` is the upstream function that guarantees it; ``outside`` is what a case failing it is."""

    name: str
    inside: Callable[[Any], bool]
    caller: str
    outside: Literal["caller-contract", "adversarial"] = "caller-contract"

    def __post_init__(self):
        if self.outside not in ("caller-contract", "adversarial"):
            raise ValueError(f"bound {self.name}: outside must be caller-contract or adversarial, got {self.outside!r}")
        if ".py::" not in self.caller:
            raise ValueError(f"bound {self.name}: caller must cite 'path.py::function (release)', got {self.caller!r}")


#: case KIND -> the bounds of its production domain (an empty tuple: declared, no bound found)
DOMAINS: dict[str, tuple[Bound, ...]] = {}
#: case KIND -> attribute names of sub-cases classified with it (None-valued parts are skipped)
PARTS: dict[str, tuple[str, ...]] = {}


def domain(kind: str, *bounds: Bound, parts: tuple[str, ...] = ()) -> None:
    """Register the production domain of case family ``kind`` (its ``KIND``)."""
    if kind in DOMAINS:
        raise ValueError(f"domain for {kind!r} declared twice")
    DOMAINS[kind] = tuple(bounds)
    if parts:
        PARTS[kind] = tuple(parts)


def _kind(case) -> str:
    return getattr(type(case), "KIND", "") or ""


def _failed(case, prefix: str = "") -> list[tuple[str, str]] | None:
    """(name, outside) of every failed bound of ``case`` and its parts; None when the family declares no domain."""
    kind = _kind(case)
    bounds = DOMAINS.get(kind)
    if bounds is None:
        return None
    out = []
    for b in bounds:
        try:
            ok = bool(b.inside(case))
        except Exception:  # a malformed case is outside the bound that could not read it
            ok = False
        if not ok:
            out.append((prefix + b.name, b.outside))
    for attr in PARTS.get(kind, ()):
        sub = getattr(case, attr, None)
        if sub is None:
            continue
        for s in (sub if isinstance(sub, tuple) else (sub,)):
            got = _failed(s, f"{prefix}{attr}.")
            if got is None:
                out.append((f"{prefix}{attr}:undeclared({_kind(s)})", "caller-contract"))
            else:
                out.extend(got)
    return out


def reach_class(case) -> Reach | None:
    """``production``, ``caller-contract`` or ``adversarial`` for ``case``; None when its family declares no
    domain."""
    failed = _failed(case)
    if failed is None:
        return None
    worst = "production"
    for _, outside in failed:
        if _RANK[outside] > _RANK[worst]:
            worst = outside
    return worst  # type: ignore[return-value]


def outside(case) -> list[str]:
    """Names of the bounds ``case`` fails (parts' bounds prefixed with the part's attribute), for messages."""
    return [name for name, _ in (_failed(case) or [])]


# --- shared facts (each cited where it is used) -------------------------------------------------------------------

DSV4_SCALE = 512 ** -0.5                        # head_dim ** -0.5, head_dim 512
SWA_BLOCK = 64                                  # DeepseekV4SWACache default, never overridden
DSV4_ATTN_BLOCK = 256                           # DeepseekV4SparseMLABackend kernel block size
C4A_BLOCK = DSV4_ATTN_BLOCK // 4                # 64 compressed rows per block
C128A_BLOCK = DSV4_ATTN_BLOCK // 128            # 2
#: CU counts of the ROCm parts these paths run on: MI300X/MI325X 304, MI300A 228, MI308X 80 (gfx942); MI350/355 256
PRODUCTION_CU_COUNTS = frozenset({80, 228, 256, 304})
COMPRESS_RATIOS = (0, 1, 4, 128)
#: vllm/config/cache.py CacheDType literals (the spellings a validated cache_config holds)
CACHE_DTYPES = frozenset({"auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_ds_mla",
                          "nvfp4_ds_mla"})
NONFINITE = frozenset({"nan", "inf", "-inf"})

C_SWA_BLOCK = ("vllm/v1/attention/backends/mla/sparse_swa.py::DeepseekV4SWACache.__init__ (block_size=64, not "
               "overridden by vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.__init__) (0.33.0, 0.34.0)")
C_EXTRA_BLOCK = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode "
                 "(block_size = attn_metadata.block_size // compress_ratio; attention block 256 from "
                 "vllm/models/deepseek_v4/sparse_mla.py::DeepseekV4SparseMLABackend.get_supported_kernel_block_sizes)"
                 " (0.33.0, 0.34.0)")
C_SCALE = ("vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.__init__ (self.scale = head_dim ** -0.5, "
           "head_dim 512, no YaRN mscale) (0.33.0, 0.34.0)")
C_CU = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_decode_cu_count (the device's multi_processor_count: "
        "304/228/80 on gfx942 parts, 256 on gfx950; fallback 256) (0.33.0, 0.34.0)")
C_PADDED = ("vllm/v1/attention/backends/mla/sparse_swa.py::DeepseekV4SWACache.__init__ (packed_page_alignment=576) "
            "and vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.get_kv_cache_spec (alignment=576 for "
            "fp8_ds_mla): block strides padded to a multiple of 576 B (0.33.0, 0.34.0)")
C_PACKED_VECTORS = ("vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor._compress_norm_rope_store "
                    "(slot_mapping and token_to_req_indices: prefix slices of the metadata builder's persistent "
                    "buffers; positions: the model runner's packed positions; rms_norm_weight: the norm's Parameter): "
                    "every per-token vector and the norm weight has stride 1 (0.33.0, 0.34.0)")
C_PACKED_SLOTS = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (slot_mapping = "
                  "layer_attn_metadata.slot_mapping, the metadata builder's packed prefix slice; k the indexer's own "
                  "projection): stride-1 vectors (0.33.0, 0.34.0)")
C_COMPRESSOR_FINITE = ("vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor.forward (state rows from the "
                       "model's own projections: finite in a finite run) -> vllm/models/deepseek_v4/common/ops/"
                       "fused_compress_quant_cache.py::compress_norm_rope_store_triton (0.33.0, 0.34.0)")
C_NORM_WEIGHT = ("vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor.__init__ (RMSNorm weight loaded from "
                 "the checkpoint: finite, order 1; |normed| <= sqrt(512)*|w| so an overflowing lane needs |w| >~ 1e37)"
                 " (0.33.0, 0.34.0)")
C_WRITER_BYTES = ("vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py::"
                  "_fused_kv_compress_norm_rope_insert_sparse_attn (finite inputs: UE8M0 code <= 247 on gfx942, "
                  "capped at 254 on gfx950; no NaN fp8 byte) (0.33.0, 0.34.0)")
C_V32_INDEXER_BS = ("vllm/v1/attention/backends/mla/indexer.py::DeepseekV32IndexerBackend."
                    "get_supported_kernel_block_sizes ([1, MultipleOf(16)] on ROCm) (0.33.0, 0.34.0)")
C_V4_INDEXER_BS = ("vllm/v1/attention/backends/mla/indexer.py::DeepseekV4IndexerBackend.get_supported_kernel_block_sizes"
                   " ([256] tokens; C4A rows per block 256 // 4 = 64) (0.33.0, 0.34.0)")
C_SHUFFLE = ("vllm/models/deepseek_v32/amd/rocm.py::DeepseekV32ROCmIndexerCache.uses_shuffled_layout (SHUFFLE iff "
             "block_size > 1; 0.34.0: rocm_aiter_mla_sparse.py::indexer_k_cache_is_shuffled); DSv4 C4A always NORMAL "
             "(vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer) (0.33.0, 0.34.0)")
C_STRIDE4 = ("vllm/models/deepseek_v4/attention.py::DeepseekV4IndexerCache.get_kv_cache_spec (block bytes bs*132, "
             "page alignment 576 or 512: every block stride a multiple of 4) (0.33.0, 0.34.0)")
C_PAD_SLOT = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (slot_mapping from the "
              "block table; padding slots are PAD_SLOT_ID = -1) (0.33.0, 0.34.0)")
C_SWA_LEN = ("vllm/v1/attention/backends/mla/sparse_swa.py::_compute_swa_indices_and_lens_kernel (len = pos + 1 - "
             "max(pos - window + 1, 0) >= 1; decode only when num_decodes > 0, "
             "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa) (0.33.0, 0.34.0)")
C_INDPTR0 = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::build_ragged_indices_from_dense (indptr = exclusive "
             "cumsum from 0) and vllm/models/deepseek_v4/amd/rocm.py::compute_global_topk_ragged_indices_and_indptr "
             "(0.33.0, 0.34.0)")
C_VALID_IDS = ("vllm/models/deepseek_v4/amd/rocm.py::compute_global_topk_ragged_indices_and_indptr and "
               "vllm/v1/attention/backends/mla/sparse_swa.py::_compute_swa_indices_and_lens_kernel (entries are "
               "block_table slots or -1; no INT32 extreme, no slot past the cache) (0.33.0, 0.34.0)")


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def _specials_finite(case, kind_at: int) -> bool:
    return not any(sp[kind_at] in NONFINITE for sp in case.specials)


# --- DSv4 cache writers (fuzz/cache_writers.py) ---------------------------------------------------------------------

domain(
    "swa-writer",
    Bound("k-finite", lambda c: _specials_finite(c, 2), "vllm/models/deepseek_v4/attention.py::DeepseekV4Attention."
          "forward (k rows from the model's kv projection and norm: finite in a finite run) (0.33.0, 0.34.0)",
          "adversarial"),
    Bound("swa-block-64", lambda c: c.block_size == SWA_BLOCK, C_SWA_BLOCK),
    Bound("padded-stride", lambda c: c.padded, C_PADDED),
    Bound("packed-per-token-vectors", lambda c: getattr(c, "input_layout", "contiguous") != "strided-index",
          C_PACKED_VECTORS),
)

domain(
    "compressor-writer",
    Bound("state-finite", lambda c: _specials_finite(c, 3), C_COMPRESSOR_FINITE, "adversarial"),
    Bound("norm-weight-finite-order-1", lambda c: c.weight in ("normal", "denormal", "zero-group", "tiny"),
          C_NORM_WEIGHT, "adversarial"),
    Bound("compressed-block-256-over-ratio",
          lambda c: c.block_size == (C4A_BLOCK if c.ratio == 4 else C128A_BLOCK), C_EXTRA_BLOCK),
    Bound("state-block-size", lambda c: c.state_block_size == (4 if c.ratio == 4 else 8),
          "vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor.__init__ (state cache block: 4 rows for C4, 8 "
          "for C128) (0.33.0, 0.34.0)"),
    Bound("padded-stride", lambda c: c.padded, C_PADDED),
    Bound("packed-per-token-vectors", lambda c: getattr(c, "input_layout", "contiguous") != "strided-index",
          C_PACKED_VECTORS),
)

domain("writer", parts=("swa", "compressor"))

domain(
    "trust-gate",
    Bound("cache-dtype-spelling", lambda c: c.cache_dtype in CACHE_DTYPES,
          "vllm/models/deepseek_v4/attention.py::_resolve_dsv4_kv_cache_dtype (kv_cache_dtype is a validated "
          "vllm/config/cache.py CacheDType literal) -> vllm/models/deepseek_v4/amd/rocm.py::"
          "_trust_dsv4_extra_cache_nan_free (0.33.0, 0.34.0)"),
)

# --- indexer-K writers (fuzz/indexer_writer.py) ---------------------------------------------------------------------

domain(
    "indexer-direct",
    Bound("k-finite", lambda c: _specials_finite(c, 2),
          "vllm/model_executor/layers/sparse_attn_indexer.py::SparseAttnIndexer.forward_hip (k from the indexer's "
          "wk projection and LayerNorm: finite in a finite run) (0.33.0, 0.34.0)", "adversarial"),
    Bound("block-size-1-or-16k", lambda c: c.block_size == 1 or c.block_size % 16 == 0, C_V32_INDEXER_BS),
    Bound("layout-matches-block-size", lambda c: c.layout_name == ("normal" if c.block_size == 1 else "shuffle"),
          C_SHUFFLE),
    Bound("skip-slot-is-minus-1", lambda c: all(s >= -1 for s in c.slots), C_PAD_SLOT),
    Bound("stride-multiple-of-4", lambda c: c.stride_pad % 4 == 0, C_STRIDE4),
    Bound("packed-per-token-vectors", lambda c: getattr(c, "input_layout", "contiguous") != "strided-index",
          C_PACKED_SLOTS),
)

domain(
    "indexer-compressor",
    Bound("state-finite", lambda c: _specials_finite(c, 3),
          "vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor.forward -> vllm/models/deepseek_v4/common/ops/"
          "fused_compress_quant_cache.py::_fused_kv_compress_norm_rope_insert_indexer_attn (0.33.0, 0.34.0)",
          "adversarial"),
    Bound("norm-weight-finite-order-1", lambda c: c.weight in ("normal", "denormal", "zero-group", "tiny"),
          C_NORM_WEIGHT, "adversarial"),
    Bound("c4a-block-64", lambda c: c.block_size == C4A_BLOCK, C_V4_INDEXER_BS),
    Bound("c4a-normal-layout", lambda c: c.layout_name == "normal", C_SHUFFLE),
    Bound("state-block-size-4", lambda c: c.state_block_size == 4,
          "vllm/models/deepseek_v4/compressor.py::DeepseekV4Compressor.__init__ (C4 state block 4) (0.33.0, 0.34.0)"),
    Bound("skip-slot-is-minus-1", lambda c: all(s >= -1 for s in c.slots), C_PAD_SLOT),
    Bound("stride-multiple-of-4", lambda c: c.stride_pad % 4 == 0, C_STRIDE4),
    Bound("packed-per-token-vectors", lambda c: getattr(c, "input_layout", "contiguous") != "strided-index",
          C_PACKED_VECTORS),
)

domain("indexer-writer", parts=("direct", "compressor"))

# --- cp-gather (fuzz/cp_gather.py) ----------------------------------------------------------------------------------


def _gather_layout_ok(c) -> bool:
    layout = c.layout if c.layout != "default" else ("normal" if c.block_size == 1 else "shuffle")
    if layout == "shuffle":
        return c.block_size > 1 and c.block_size % 16 == 0
    return c.block_size in (1, C4A_BLOCK)


C_GATHER = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (prefill chunks) -> "
            "cp_gather_indexer_k_quant_cache_triton (0.33.0, 0.34.0)")

domain(
    "cp-gather",
    Bound("block-size", lambda c: c.block_size == 1 or c.block_size % 16 == 0,
          C_V32_INDEXER_BS + "; DSv4 C4A 64: " + C_V4_INDEXER_BS),
    Bound("layout-matches-block-size", _gather_layout_ok, C_SHUFFLE),
    Bound("stride-multiple-of-4", lambda c: c.stride_pad % 4 == 0, C_STRIDE4),
    Bound("table-blocks-allocated", lambda c: all(0 <= b < c.num_blocks for row in c.table for b in row),
          "vllm/v1/attention/backends/mla/indexer.py::DeepseekV32IndexerMetadataBuilder.build (block_table rows "
          "of allocated block ids >= 0, null block 0) -> " + C_GATHER),
    Bound("token-to-seq-from-builder", lambda c: not c.token_to_seq_edits and c.extra_tokens == 0,
          "vllm/v1/attention/backends/mla/indexer.py::DeepseekV32IndexerMetadataBuilder.build (token_to_seq and "
          "cu_seqlen of one chunk describe the same tokens) -> " + C_GATHER),
    # memory layouts (fuzz/cp_gather.py, issue 30): the padded / pool-slice cache views are production (C_STRIDE4)
    Bound("packed-table-metadata-outputs",
          lambda c: (getattr(c, "table_layout", "contiguous"), getattr(c, "seq_layout", "contiguous"),
                     getattr(c, "out_layout", "contiguous")) == ("contiguous",) * 3,
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (k_fp8 / k_scale: leading "
          "row slices of packed workspace buffers; chunk.block_table a row slice of the builder's row-major table; "
          "chunk.cu_seq_lens and chunk.token_to_seq the builder's packed tensors) (0.33.0, 0.34.0)"),
)

domain(
    "compile-once",
    Bound("block-size", lambda c: c.block_size == 1 or c.block_size % 16 == 0, C_V32_INDEXER_BS),
    Bound("layout-matches-block-size",
          lambda c: (c.block_size > 1 and c.block_size % 16 == 0) if c.layout == "shuffle"
          else c.block_size in (1, C4A_BLOCK), C_SHUFFLE),
)

# --- sparse decode, splits, reduce, graph (fuzz/decode.py, splits.py, decode_reduce.py, graph_*.py) ----------------


def _decode_layout_bounds() -> tuple[Bound, ...]:
    """The decode's memory layouts its callers hand it (the eager decode's and a captured graph's alike)."""
    return (
        Bound("q-packed", lambda c: (c.q_layout or ("transposed" if c.q_transposed else "contiguous")) == "contiguous",
              C_DECODE_Q),
        Bound("cache-block-stride-padded",
              lambda c: c.padded if c.cache_layout is None else c.cache_layout in ("padded", "pool-slice"), C_PADDED),
        Bound("ragged-indices-packed-or-slice", lambda c: c.index_layout in ("contiguous", "slice"), C_DECODE_RAGGED),
        Bound("sink-packed-or-slice", lambda c: c.sink == "none" or c.sink_layout in ("contiguous", "slice"),
              C_DECODE_SINK),
    )


def _decode_bounds() -> tuple[Bound, ...]:
    return (
        Bound("cache-rows-finite", lambda c: c.poison == "none", C_WRITER_BYTES, "adversarial"),
        Bound("swa-block-64", lambda c: c.main_bs == SWA_BLOCK, C_SWA_BLOCK),
        Bound("extra-block-256-over-ratio",
              lambda c: c.extra_lens is None or c.extra_bs in (C4A_BLOCK, C128A_BLOCK), C_EXTRA_BLOCK),
        Bound("swa-segment-1..window", lambda c: all(1 <= n <= 128 for n in c.main_lens), C_SWA_LEN),
        Bound("valid-or-minus-1-entries (conservative: any invalid_rate)",
              lambda c: c.invalid_rate == 0.0, C_VALID_IDS),
        Bound("indptr-from-0", lambda c: c.indptr_offset == 0, C_INDPTR0),
        Bound("softmax-scale-512^-0.5", lambda c: math.isclose(c.scale, DSV4_SCALE, rel_tol=1e-6), C_SCALE),
        Bound("production-cu-count", lambda c: c.num_splits is not None or c.cu_count in PRODUCTION_CU_COUNTS, C_CU),
        # memory layouts and absolute regimes (fuzz/decode.py, issue 30)
        *_decode_layout_bounds(),
        Bound("out-packed", lambda c: c.out_layout == "contiguous", C_DECODE_OUT),
        Bound("logits-above-exp-underflow", lambda c: c.logits != "underflow", C_DECODE_Q),
    )


C_DECODE_Q = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._prepare_and_attn (q = "
              "_wq_b_proj(...).view(-1, n_local_heads, head_dim): packed rows, then RMS-normed by "
              "_fused_qnorm_rope_kv_insert, so |logit| <= scale * |q| * |k| stays tens of nats from fp32 exp's "
              "underflow near -104) (0.33.0, 0.34.0)")
C_DECODE_RAGGED = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode "
                   "(swa_metadata.decode_swa_ragged_indices/indptr and the top-k ragged pair: packed buffers or "
                   "leading slices of persistent ones) (0.33.0, 0.34.0)")
C_DECODE_SINK = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode "
                 "(attn_sink=self.attn_sink, a packed parameter; rocm_sparse_attn_decode slices [:num_heads]) "
                 "(0.33.0, 0.34.0)")
C_DECODE_OUT = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode (output: "
                "the layer's packed [tokens, heads, head_dim] output rows; no caller found handing a padded or "
                "heads-major view) (0.33.0, 0.34.0)")


domain("decode", *_decode_bounds(), parts=("adaptive",))
domain("decode-adaptive-splits")  # ONE_WAVE in [1, S]: no further caller bound found
domain("metamorphic-decode",
       # issue 30: the re-laid path pads q's rows (fuzz/metamorphic.py relaid_inputs), which production never does
       Bound("inputs-packed", lambda c: getattr(c, "view_layout", "packed") == "packed", C_DECODE_Q),
       parts=("decode",))
domain("subject-agreement", parts=("decode", "split"))

domain(
    "split-bounds",
    Bound("not-both-averages-0", lambda c: c.avg_main > 0 or c.avg_extra > 0,
          "vllm/models/deepseek_v4/amd/rocm.py::_copy_ragged_to_graph_buffers from "
          "DeepseekV4ROCMAiterSparseSWAMetadataBuilder.build (SWA view >= num_decode_tokens * 128 entries) -> "
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_rocm_sparse_attn_decode_ragged_triton (0.33.0, 0.34.0)"),
    Bound("production-cu-count", lambda c: c.cu_count in PRODUCTION_CU_COUNTS, C_CU),
)

domain(
    "decode-reduce-oracle",
    # a NaN behind a dead split (stale-nan) is production: ADAPTIVE_SPLITS skips splits whose acc may be stale
    Bound("live-partials-finite", lambda c: c.poison != "live-nan",
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_sparse_attn_decode_gfx950_partial_kernel (live partials "
          "from scrubbed, finite cache rows) -> _sparse_attn_decode_reduce_kernel (0.33.0, 0.34.0)", "adversarial"),
    Bound("splits-within-cap", lambda c: 1 <= c.splits <= 32,
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_decode_gfx950_num_splits / _decode_num_splits (caps 32 "
          "and 16) (0.33.0, 0.34.0)"),
    # absolute regimes and layouts (fuzz/decode_reduce.py, issue 30): split maxima are logits, tens of nats from
    # fp32 exp's limits (C_DECODE_Q); the sink is an order-1 parameter next to them; the wrapper allocates the
    # partials packed and hands the reduce a packed sink slice and the layer's packed output
    Bound("maxima-within-exp-range", lambda c: getattr(c, "level", "ordinary") not in ("underflow", "overflow"),
          C_DECODE_Q),
    Bound("sink-near-the-maxima", lambda c: c.sink == "none" or getattr(c, "sink_gap", "near") == "near",
          C_DECODE_SINK),
    Bound("partials-packed", lambda c: getattr(c, "ws_layout", "contiguous") == "contiguous",
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_rocm_sparse_attn_decode_ragged_triton (part_m, part_l, "
          "part_acc from torch.empty: packed) (0.33.0, 0.34.0)"),
    Bound("sink-packed-or-slice", lambda c: c.sink == "none" or getattr(c, "sink_layout", "contiguous") != "strided",
          C_DECODE_SINK),
    Bound("out-packed", lambda c: getattr(c, "out_layout", "contiguous") == "contiguous", C_DECODE_OUT),
)

domain(
    "ragged-view-capacity",
    Bound("no-defect", lambda c: c.defect is None,
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLASparseMetadataBuilder.build and "
          "DeepseekV4ROCMAiterSparseSWAMetadataBuilder.build (buffers max_tokens * width, indptr max_tokens + 1) -> "
          "_copy_ragged_to_graph_buffers (0.33.0, 0.34.0)"),
    Bound("rows>=1", lambda c: c.num_rows >= 1,
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (decode only when "
          "num_decodes > 0) (0.33.0, 0.34.0)"),
    # issue 30 (fuzz/graph_buffers.py): the sources are build_ragged_indices_from_dense's fresh packed outputs, the
    # persistent buffers the builders' torch.empty allocations
    Bound("sources-packed", lambda c: getattr(c, "source_layout", "contiguous") == "contiguous",
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLASparseMetadataBuilder.build (ragged pair from "
          "build_ragged_indices_from_dense) -> _copy_ragged_to_graph_buffers (0.33.0, 0.34.0)"),
    Bound("buffers-packed", lambda c: getattr(c, "buffer_layout", "contiguous") == "contiguous",
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLASparseMetadataBuilder.__init__ (persistent "
          "buffers from torch.empty) -> _copy_ragged_to_graph_buffers (0.33.0, 0.34.0)"),
)

domain(
    "graph-replay",
    Bound("swa-block-64", lambda c: c.main_bs == SWA_BLOCK, C_SWA_BLOCK),
    Bound("extra-block-256-over-ratio",
          lambda c: c.compress_ratio <= 1 or c.extra_bs == (C4A_BLOCK if c.compress_ratio == 4 else C128A_BLOCK),
          C_EXTRA_BLOCK),
    Bound("compress-ratio", lambda c: c.compress_ratio in COMPRESS_RATIOS,
          "vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.__init__ (compress_ratios[layer] in "
          "{0, 1, 4, 128}) (0.33.0, 0.34.0)"),
    Bound("valid-or-minus-1-entries (conservative: any invalid_rate)", lambda c: c.invalid_rate == 0.0,
          C_VALID_IDS),
    Bound("softmax-scale-512^-0.5", lambda c: math.isclose(c.scale, DSV4_SCALE, rel_tol=1e-6), C_SCALE),
    Bound("production-cu-count", lambda c: c.cu_count in PRODUCTION_CU_COUNTS, C_CU),
    Bound("rows>=1", lambda c: all(s.rows >= 1 for s in (c.capture,) + tuple(c.replays)),
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (decode only when "
          "num_decodes > 0) (0.33.0, 0.34.0)"),
    # memory layouts (fuzz/graph_capture.py, issue 30): the captured decode's callers, as the eager decode's
    *_decode_layout_bounds(),
)

domain(
    "dsv4-step",
    Bound("swa-block-64", lambda c: c.swa_block_size == SWA_BLOCK, C_SWA_BLOCK),
    Bound("c4a-block-64", lambda c: "c4a" not in c.layers or c.c4a_block_size == C4A_BLOCK, C_EXTRA_BLOCK),
    Bound("c128a-block-2", lambda c: "c128a" not in c.layers or c.c128a_block_size == C128A_BLOCK, C_EXTRA_BLOCK),
    Bound("softmax-scale-512^-0.5", lambda c: math.isclose(c.scale, DSV4_SCALE, rel_tol=1e-6), C_SCALE),
    Bound("production-cu-count", lambda c: c.cu_count in PRODUCTION_CU_COUNTS, C_CU),
    # padding tokens (slot -1), freed SWA blocks (the null block), capture/replay and the MXFP8 output are what
    # production runs; a scheduled request's token whose position its SWA table does not map is not
    Bound("no-unmapped-request", lambda c: not getattr(c, "invalid", False),
          "vllm/v1/attention/backends/mla/sparse_swa.py::DeepseekSparseSWAMetadataBuilder.build (is_valid_token = "
          "slot_mapping >= 0: -1 only for padding tokens; the scheduler maps every scheduled token's block) "
          "(0.33.0, 0.34.0)"),
    # memory layouts (fuzz/dsv4_step.py, issue 30): caches as views past a pool's first block are production
    # (C_PADDED); lane-padded query / insert rows and stride-2 positions are not
    Bound("step-inputs-packed", lambda c: getattr(c, "input_layout", "contiguous") == "contiguous",
          C_DECODE_Q + "; " + C_PACKED_VECTORS),
)

#: the step metadata builder's capture flag: every layer kind, build and build_for_cudagraph_capture, padded
#: batches are what upstream's builders see (vllm/models/deepseek_v4/amd/rocm.py); non-packed inputs are not
domain(
    "dsv4-builder",
    Bound("builder-inputs-packed",
          lambda c: (getattr(c, "vector_layout", "contiguous"), getattr(c, "table_layout", "contiguous"))
          == ("contiguous", "contiguous"),
          "vllm/v1/attention/backends/mla/sparse_swa.py::DeepseekSparseSWAMetadataBuilder.build (positions, "
          "token_to_req and the block tables: the model runner's packed buffers or leading row slices of its "
          "row-major persistent block table) (0.33.0, 0.34.0)"),
)

# --- ragged helpers (fuzz/ragged.py) --------------------------------------------------------------------------------


def _valid_prefix(row) -> bool:
    seen_hole = False
    for v in row:
        if v < 0:
            seen_hole = True
        elif seen_hole:
            return False
    return True


C_GLOBAL = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode -> "
            "compute_global_topk_ragged_indices_and_indptr (0.33.0, 0.34.0)")

domain(
    "ragged-helpers-oracle",
    Bound("rows>=1", lambda c: len(c.dense.rows) >= 1 and len(c.glob.rows) >= 1,
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (decode only when "
          "num_decodes > 0, prefill only when num_prefills > 0) (0.33.0, 0.34.0)"),
    Bound("block-64", lambda c: c.block_size == C4A_BLOCK, C_EXTRA_BLOCK + "; SWA: " + C_SWA_BLOCK),
    Bound("topk-rows-valid-prefix", lambda c: all(_valid_prefix(r) for r in c.glob.rows),
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (topk_indices_buffer "
          "reset to -1, then min(len, topk) ids written first) -> " + C_GLOBAL),
    Bound("local-ids-inside-table", lambda c: all(v < c.table_width * c.block_size for r in c.glob.rows for v in r),
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode (local ids < "
          "seq_len // compress_ratio <= table width * block size) (0.33.0, 0.34.0)"),
    Bound("block-ids>=0", lambda c: all(b >= 0 for r in c.block_table for b in r),
          "vllm/v1/core/kv_cache_manager.py::KVCacheManager.allocate_slots (allocated block ids >= 0, null block 0) "
          "-> " + C_GLOBAL),
    Bound("token-to-req-inside-table",
          lambda c: all(0 <= r < len(c.block_table) for r in tuple(c.glob.token_to_req) + tuple(c.swa.token_to_req)),
          C_GLOBAL),
    Bound("swa-positions-inside-table",
          lambda c: all(p < c.table_width * c.block_size for p in c.swa.positions),
          "vllm/v1/attention/backends/mla/sparse_swa.py::_compute_swa_indices_and_lens_kernel (pos < seq_len <= "
          "max_model_len <= table width * block size) (0.33.0, 0.34.0)"),
    # issue 30: the helpers' inputs are packed tensors or leading slices of persistent ones (fuzz/ragged.py)
    Bound("inputs-packed-or-slice", lambda c: getattr(c, "input_layout", "contiguous") in ("contiguous", "slice"),
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_decode (topk_indices and "
          "token_to_req_indices: leading slices [:num_decode_tokens] of packed buffers) -> " + C_GLOBAL),
)

# --- indexer logits (fuzz/indexer_logits.py) ------------------------------------------------------------------------

C_LOGITS = ("vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer -> "
            "rocm_fp8_paged_mqa_logits / rocm_fp8_mqa_logits (0.33.0, 0.34.0)")

domain(
    "indexer-logits-agreement",
    # nan_k stays unbounded: on gfx942 the OCP-written indexer keys read as FNUZ NaN in production (triage IW2/UL2)
    Bound("q-finite", lambda c: not c.nan_q,
          "vllm/model_executor/layers/sparse_attn_indexer.py::SparseAttnIndexer.forward_hip (q_fp8 quantized from "
          "finite activations) (0.33.0, 0.34.0)", "adversarial"),
    Bound("key-scales-positive-finite", lambda c: c.bad_scale == "none" and c.values != "zero-cut",
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_indexer_k_quant_and_cache_kernel and "
          "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py::_fused_kv_compress_norm_rope_insert_"
          "indexer_attn (scales max(amax,1e-4)/448 or powers of two: > 0, finite) (0.33.0, 0.34.0)", "adversarial"),
    Bound("block-size", lambda c: c.mode == "prefill" or c.block_size == 1 or c.block_size % 16 == 0,
          C_V32_INDEXER_BS + "; DSv4 C4A 64: " + C_V4_INDEXER_BS),
    Bound("next-n-1-or-2", lambda c: c.mode == "prefill" or c.next_n in (1, 2),
          "vllm/v1/attention/backends/mla/indexer.py::DeepseekV32IndexerMetadataBuilder._supports_native_decode "
          "(ROCm: next_n in (1, 2), else flattened to 1) (0.33.0, 0.34.0)"),
    # "unit-heads" is the same bytes as [nb, bs, 1, 132] (the 4-D form the decode's callers hand the op)
    Bound("block-contiguous-cache-view", lambda c: c.mode == "prefill" or c.cache_view in ("flat", "unit-heads"),
          "vllm/v1/attention/backends/mla/indexer.py::DeepseekV32IndexerBackend.get_kv_cache_shape ([nb, bs, 132] "
          "rows of 132 B) -> " + C_LOGITS),
    Bound("context-lens-shape", lambda c: c.mode == "prefill" or c.ctx_count == "exact",
          "vllm/v1/attention/backends/mla/indexer.py::DeepSeekV32IndexerDecodeMetadata (seq_lens [B] or "
          "[B, next_n]) -> " + C_LOGITS),
    # memory layouts of q and the weights (fuzz/indexer_logits.py, issue 30)
    Bound("q-and-weights-packed",
          lambda c: (getattr(c, "q_layout", "contiguous"), getattr(c, "weights_layout", "contiguous"))
          == ("contiguous", "contiguous"),
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (q_fp8 from the "
          "indexer's per-token quantization and weights from weights_proj(hidden) * scale: fresh packed tensors, "
          "viewed [B, next_n, H, 128] / [B * next_n, H]) (0.33.0, 0.34.0)"),
    # the logits' memory (fuzz/indexer_logits.py out_rows): a caller's out whose rows are padded is caller-contract
    Bound("logits-out-fresh", lambda c: getattr(c, "out_rows", "fresh") == "fresh",
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (the logits are the "
          "fresh tensors rocm_fp8_paged_mqa_logits / rocm_fp8_mqa_logits return; no out buffer is passed) "
          "(0.33.0, 0.34.0)"),
)

# --- prefill (fuzz/prefill.py, prefill_assembly.py) -----------------------------------------------------------------

C_PREFILL_CALL = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_prefill (q and "
                  "output: row slices [query_start:query_end] of packed tensors; kv: the packed gather workspace "
                  "viewed [-1, 1, d]; indices/topk_length: combine_topk_swa_indices' fresh packed [T, W] rows and "
                  "lengths; attn_sink: the layer's packed parameter) (0.33.0, 0.34.0)")
C_PREFILL = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention._forward_prefill -> "
             "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_sparse_attn_prefill (0.33.0, 0.34.0)")

domain(
    "prefill",
    Bound("no-int32-extremes", lambda c: not c.int32_extremes,
          "vllm/models/deepseek_v4/amd/rocm.py::combine_topk_swa_indices (combined rows hold workspace columns or -1)"
          " -> " + C_PREFILL),
    Bound("indptr-from-0", lambda c: c.mode == "dense" or c.indptr_offset == 0, C_INDPTR0),
    Bound("rows>=1", lambda c: c.sq >= 1,
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (prefill only when "
          "num_prefills > 0) (0.33.0, 0.34.0)"),
    # memory layouts and absolute regimes (fuzz/prefill.py, issue 30)
    Bound("q-rows-packed", lambda c: c.q_layout in ("contiguous", "row_slice"), C_PREFILL_CALL),
    Bound("kv-workspace-packed", lambda c: c.kv_layout in ("2d", "3d"), C_PREFILL_CALL),
    Bound("indices-packed", lambda c: getattr(c, "index_layout", "contiguous") == "contiguous", C_PREFILL_CALL),
    Bound("topk-length-packed", lambda c: getattr(c, "topk_layout", "contiguous") == "contiguous" or c.mode != "dense"
          or not c.topk_given, C_PREFILL_CALL),
    Bound("sink-packed", lambda c: c.sink == "none" or getattr(c, "sink_layout", "contiguous") == "contiguous",
          C_PREFILL_CALL),
    Bound("out-rows-packed", lambda c: (getattr(c, "out_layout", None) or ("padded" if c.out_padded else
                                                                           "contiguous")) == "contiguous",
          C_PREFILL_CALL),
    Bound("logits-above-exp-underflow", lambda c: getattr(c, "logits", "ordinary") != "underflow", C_DECODE_Q),
)
domain("opus-guard")
domain("opus-routing", parts=("inputs", "guard"))
domain("aiter-pa-guard")
domain("aiter-pa-routing", parts=("inputs", "guard"))
domain("aiter-pa-fallback", parts=("inputs",))

domain(
    "prefill-assembly",
    Bound("no-int32-extremes", lambda c: not c.int32_extremes,
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (top-k ids: causal "
          "positions or -1) -> vllm/models/deepseek_v4/amd/rocm.py::combine_topk_swa_indices (0.33.0, 0.34.0)"),
    Bound("compress-ratio", lambda c: c.ratio in (1, 4, 128),
          "vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.__init__ (max(1, compress_ratios[layer]) in "
          "{1, 4, 128}) (0.33.0, 0.34.0)"),
)

# --- DSv3.2 metadata builder (fuzz/sparse_metadata.py) ---------------------------------------------------------------

C_V32B = ("vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py::ROCMAiterMLASparseMetadataBuilder.build "
          "(0.33.0, 0.34.0)")

domain(
    "sparse-metadata",
    Bound("block-size-1-or-16k", lambda c: c.config.block_size == 1 or c.config.block_size % 16 == 0,
          "vllm/v1/attention/backends/mla/rocm_aiter_mla_sparse.py::ROCMAiterMLASparseBackend."
          "get_supported_kernel_block_sizes ([1, MultipleOf(16)]) (0.33.0, 0.34.0)"),
    Bound("topk-rows-valid-prefix", lambda c: all(s.holes == "prefix" for s in c.steps),
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_aiter_sparse_attn_indexer (sparse_len = min(pos + 1,"
          " topk) valid ids first; top-k C++ kernels not verified) -> " + C_V32B),
    # memory layouts (fuzz/sparse_metadata.py, issue 30): leading slices of the persistent batch's buffers are what
    # production hands the builder; strided vectors and a column-major table are not
    Bound("metadata-packed-or-persistent-slice",
          lambda c: all(getattr(s, "layout", "contiguous") != "strided" for s in c.steps),
          "vllm/v1/worker/gpu_model_runner.py::GPUModelRunner._prepare_inputs (query_start_loc, seq_lens: leading "
          "slices of the runner's packed persistent buffers; block_table_tensor[:num_reqs] of a row-major "
          "[max_num_reqs, max_num_blocks] table; the runner is outside the extracted modules, not re-read here) "
          "(0.33.0, 0.34.0)"),
)

# --- router (fuzz/router.py) ----------------------------------------------------------------------------------------

domain(
    "router-oracle-agreement",
    Bound("valid-grouping", lambda c: c.experts > c.n_group and c.experts % c.n_group == 0,
          "vllm/model_executor/layers/fused_moe/router/grouped_topk_router.py::GroupedTopKRouter._compute_routing "
          "(valid_grouping, else fused_topk_bias) (0.33.0, 0.34.0)"),
    Bound("topk-group-within-groups", lambda c: 1 <= c.topk_group <= c.n_group,
          "vllm/model_executor/models/deepseek_v2.py::DeepseekV2MoE.__init__ (topk_group <= n_group from the "
          "config: 4 of 8) (0.33.0, 0.34.0)"),
    Bound("packed-logits", lambda c: getattr(c, "layout", "contiguous") == "contiguous",
          "vllm/model_executor/models/deepseek_v2.py::DeepseekV2MoE.forward (hands hidden_states to self.experts, "
          "whose gate computes router_logits as a fresh [tokens, experts] matmul output: row-major, packed) "
          "(0.34.0)"),
)

# --- epilogues (fuzz/epilogues.py) ----------------------------------------------------------------------------------

domain(
    "mxfp8",
    Bound("rows-finite", lambda c: all(_finite(v) for g in c.groups for _, v in g.specials)
          and all(_finite(v) for g in c.groups for v in g.values),
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::_sparse_attn_decode_reduce_kernel (QUANT_OUT) and "
          "rocm_inverse_rope_mxfp8_rows from vllm/models/deepseek_v41/amd/rocm.py (finite attention rows) "
          "(0.33.0, 0.34.0)", "adversarial"),
    Bound("outputs-packed", lambda c: getattr(c, "out_layout", "contiguous") == "contiguous",
          "vllm/models/deepseek_v41/amd/rocm.py::DeepseekV41ROCMAiterMLAAttention._forward_prefill "
          "(rocm_inverse_rope_mxfp8_rows(output, ..., mxfp8_out[0][:n], mxfp8_out[1][:n]): leading row slices of "
          "the layer's output pair, rows unpadded) (0.34.0)"),
)
domain(
    "rope",
    Bound("rows-finite", lambda c: all(_finite(v) for _, v in c.specials),
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (finite attention rows)"
          " (0.33.0, 0.34.0)", "adversarial"),
    Bound("head-dim-512", lambda c: c.width == 512,
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa -> "
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_inverse_rope_rows_ (rows [T, H, 512]) "
          "(0.33.0, 0.34.0)"),
    Bound("out-is-none-or-x", lambda c: c.alias in ("separate", "in-place"),
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_inverse_rope_rows_ / rocm_inv_rope_einsum (out is "
          "None, a fresh tensor, or o itself) (0.33.0, 0.34.0)"),
    # memory layouts (fuzz/epilogues.py, issue 30)
    Bound("rope-inputs-packed", lambda c: getattr(c, "layout", "contiguous") == "contiguous",
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa -> "
          "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py::rocm_inverse_rope_rows_ (o the layer's packed output "
          "rows, the rotary embedding's packed cos_sin_cache buffer, the runner's packed positions) (0.33.0, 0.34.0)"),
)
domain("mxfp8-group")
domain("epilogue-oracle-agreement", parts=("mxfp8", "rope"))

# --- formats, dequant, dispatch, layer rope, int64 -------------------------------------------------------------------

#: the codecs run on values a kernel loaded into registers from packed rows or packed cache bytes
C_CODEC_TILE = ("vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py::_fused_kv_compress_norm_rope_insert_"
                "sparse_attn (encodes the tile it computed; the readers decode bytes loaded through the cache's "
                "block strides into a packed tile): no codec is handed a strided or transposed vector "
                "(0.33.0, 0.34.0)")

domain(
    "fp8-codec",
    Bound("finite-values", lambda c: all(_finite(v) for v in c.values), C_COMPRESSOR_FINITE, "adversarial"),
    Bound("clamped-to-fp8-max", lambda c: all(abs(v) <= (448.0 if c.flavour == "ocp" else 240.0) for v in c.values
                                              if _finite(v)),
          "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py::_fused_kv_compress_norm_rope_insert_"
          "sparse_attn (x * 2^-exp clamped to +-448 before the fp8 cast) (0.33.0, 0.34.0)"),
    # memory layouts (fuzz/formats.py CODEC_LAYOUTS, issue 30)
    Bound("codec-input-packed", lambda c: getattr(c, "input_layout", "contiguous") == "contiguous", C_CODEC_TILE),
)
domain(
    "ue8m0-codec",
    Bound("finite-positive-scales", lambda c: all(_finite(s) and s > 0 for s in c.scales), C_WRITER_BYTES,
          "adversarial"),
    Bound("cap-254-or-255", lambda c: c.cap in (254, 255),
          "vllm/models/deepseek_v4/common/ops/fused_compress_quant_cache.py::compress_norm_rope_store_triton "
          "(SANITIZE_CACHE_NANS = _ON_GFX950: cap 254, else 255) (0.33.0, 0.34.0)"),
    Bound("codec-input-packed", lambda c: getattr(c, "input_layout", "contiguous") == "contiguous", C_CODEC_TILE),
)
domain("exhaustive")  # every code of a codec: the codec's whole domain, no caller bound narrows it
domain(
    "cache-layout",
    Bound("block-size-for-layout",
          lambda c: c.block_size in (SWA_BLOCK, C128A_BLOCK) if c.layout == "fp8_ds_mla"
          else c.block_size in (1, C4A_BLOCK) if c.layout == "indexer-normal"
          else (c.block_size > 1 and c.block_size % 16 == 0),
          C_SWA_BLOCK + "; " + C_EXTRA_BLOCK + "; " + C_SHUFFLE),
)
domain(
    "fp8-ds-mla-dequant-exact",
    Bound("block-size", lambda c: c.block_size in (SWA_BLOCK, C128A_BLOCK), C_SWA_BLOCK + "; " + C_EXTRA_BLOCK),
    Bound("padded-stride", lambda c: c.padded, C_PADDED),
    Bound("slots-packed", lambda c: getattr(c, "slots_layout", "contiguous") == "contiguous", C_PACKED_SLOTS),
)
domain(
    "dispatch-flags",
    Bound("compress-ratio", lambda c: c.compress_ratio in COMPRESS_RATIOS,
          "vllm/models/deepseek_v4/attention.py::DeepseekV4Attention.__init__ (compress_ratios[layer]) "
          "(0.33.0, 0.34.0)"),
    Bound("swa-only-iff-ratio<=1", lambda c: c.swa_only == (c.compress_ratio <= 1),
          "vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (swa_only = "
          "self.compress_ratio <= 1) (0.33.0, 0.34.0)"),
    Bound("kv-cache-dtype", lambda c: c.kv_cache_dtype in ("auto", "fp8_ds_mla", "fp8"),
          "vllm/models/deepseek_v4/sparse_mla.py::DeepseekV4SparseMLABackend.supported_kv_cache_dtypes "
          "(auto, fp8_ds_mla, fp8) (0.33.0, 0.34.0)"),
)
domain("target-dispatch", parts=("flags",))
domain("inverse-rope-exactly-once")   # token counts and flags: every combination is a forward_mqa call
domain("int64-addressing")            # named probes at sizes production reaches (SPEC: 2^31 B at ~57K blocks)

# --- malformed input (fuzz/bad_input.py) ------------------------------------------------------------------------------

C_BAD_INPUT = ("vllm/models/deepseek_v4/amd/rocm.py::DeepseekV4ROCMAiterMLAAttention.forward_mqa (every argument "
               "built from the model's own tensors, caches and metadata: shapes, dtypes and devices as allocated) "
               "(0.33.0, 0.34.0)")
C_BAD_IDS = ("vllm/v1/attention/backends/mla/sparse_swa.py::DeepseekV4SWACache.__init__ and the metadata builders "
             "(slots, requests and table entries index what they allocated) (0.33.0, 0.34.0)")

domain(
    "bad-input",
    Bound("well-formed-arguments", lambda c: c.breakage in ("range-high", "range-low"), C_BAD_INPUT),
    Bound("ids-in-range", lambda c: c.breakage not in ("range-high", "range-low"), C_BAD_IDS, "adversarial"),
)
