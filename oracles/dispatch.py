"""An independent truth table for the sparse-decode dispatch, written from SPEC sections 1.2, 1.3, 2 and 4 and
seed 004 (not from ``impl.targets``): per architecture, what the decode of a layer must run.
"""
from __future__ import annotations

# Per architecture (SPEC 2 "Kernels" and "Split count"; 1.2 fp8 flavours; 2 `_copy_ragged_to_graph_buffers`;
# 4 sanitizing writer). gfx942 keeps the legacy split-K path and the 16 cap (seed 004's review); the generic
# fallback is one kernel with no split selector.
ARCH_FACTS = {
    "gfx942": {"kernel_family": "gfx942", "split_selector": "gfx942", "split_cap": 16, "ragged_view_rule": "full",
               "main_cache_fp8": "fnuz", "extra_cache_fp8": "ocp"},
    "gfx950": {"kernel_family": "gfx950", "split_selector": "gfx950", "split_cap": 32, "ragged_view_rule": "source",
               "main_cache_fp8": "ocp", "extra_cache_fp8": "ocp"},
    "generic": {"kernel_family": "generic", "split_selector": None, "split_cap": None, "ragged_view_rule": "full",
                "main_cache_fp8": "ocp", "extra_cache_fp8": "ocp"},
}


def expected_dispatch(arch: str, compress_ratio: int, swa_only: bool, for_cudagraph_capture: bool,
                      has_extra_cache: bool, kv_cache_dtype: str, has_kv_transfer: bool) -> dict | None:
    """The dispatch a layer must get, or None when the flags must be rejected (ValueError).

    Rejected: a ratio outside {0, 1, 4, 128}; swa_only disagreeing with the ratio (0/1 are the SWA-only layers,
    SPEC 1.3); an SWA-only layer claiming an extra cache.
    Adaptive splits: gfx950, not SWA-only, ratio 128, graph capture (SPEC 2, ROCM-C).
    Trust gate: gfx950, cache dtype "fp8_ds_mla", no KV transfer, an extra cache (SPEC 4).
    """
    if compress_ratio not in (0, 1, 4, 128):
        return None
    if swa_only != (compress_ratio <= 1):
        return None
    if swa_only and has_extra_cache:
        return None
    facts = dict(ARCH_FACTS[arch])
    on_gfx950 = arch == "gfx950"
    facts["adaptive_splits"] = (on_gfx950 and not swa_only and compress_ratio == 128 and for_cudagraph_capture)
    facts["trust_extra_nan_free"] = (on_gfx950 and kv_cache_dtype == "fp8_ds_mla" and not has_kv_transfer
                                     and has_extra_cache)
    facts["for_cudagraph_capture"] = for_cudagraph_capture
    facts["target"] = arch
    return facts
