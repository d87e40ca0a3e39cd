"""Per-target dispatch of the DSv4 sparse decode: which kernels, selector, graph behaviour and trust gate a layer gets.

``decode_dispatch`` is a pure function of a ``Target``'s fields and the layer/runtime flags; it never looks at a
global and never at the device. It is what keeps gfx950's specialisations (the 32-split selector, adaptive splits
under graph capture, the narrowed ragged view, the trust gate) from leaking into gfx942, which keeps the legacy
split-K path with the 16-split selector, and into the generic single-kernel fallback.

Rules (SPEC section 2 "Kernels", "Split count", "Adaptive splits", ``_copy_ragged_to_graph_buffers``; section 4,
the trust gate), as upstream vllm-project/vllm ``vllm/models/deepseek_v4/amd/rocm.py`` applies them:

- kernel family, split selector and cap, ragged-view rule, fp8 flavours: straight from the target;
- adaptive splits only where the target allows them under capture (gfx950), for a layer with an extra cache that
  is not SWA-only, with compress ratio 128 (C128A), and only for graph capture (``for_cudagraph_capture``);
- the extra cache is trusted NaN-free only when ``impl.cache_writers.trust_extra_cache_nan_free`` says so (a
  sanitizing target, ``fp8_ds_mla``, no KV transfer, an extra cache exists).

Layer flags are checked for consistency: a layer is SWA-only exactly when its compress ratio is 0 or 1 (SPEC 1.3),
and an SWA-only layer has no extra cache.
"""
from __future__ import annotations

from dataclasses import dataclass

from impl.cache_writers import trust_extra_cache_nan_free
from impl.targets import Target, get_target

#: compress ratios of DSv4 layers (SPEC 1.3): 0/1 SWA-only, 4 C4A, 128 C128A.
COMPRESS_RATIOS = (0, 1, 4, 128)
SWA_ONLY_RATIOS = (0, 1)
#: the only layer type whose decode may use adaptive splits (C128A; SPEC 2 "Adaptive splits", ROCM-C).
ADAPTIVE_SPLITS_RATIO = 128


@dataclass(frozen=True)
class DecodeDispatch:
    """What the decode of one layer runs on one target (frozen; built only from ``Target`` fields and flags)."""

    target: str
    #: "generic" (single kernel), "gfx942" (split-K partial + reduce), "gfx950" (4x128-tile partial + reduce)
    kernel_family: str
    #: None (no split-K), "gfx942" (cost model over 1..16) or "gfx950" (occupancy target, cap 32)
    split_selector: str | None
    split_cap: int | None
    #: per-query active splits inside a captured graph
    adaptive_splits: bool
    #: graph-buffer indices view length: "full" or "source"
    ragged_view_rule: str
    #: the decode may skip its NaN scrub of the extra cache
    trust_extra_nan_free: bool
    #: the metadata was built for graph capture (carried through so the decode sees it)
    for_cudagraph_capture: bool
    main_cache_fp8: str
    extra_cache_fp8: str


def _require_bool(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected a bool, got {type(v).__name__}")
    return v


def decode_dispatch(target: "Target | str | None", *, compress_ratio: int, swa_only: bool,
                    for_cudagraph_capture: bool, has_extra_cache: bool, kv_cache_dtype: str,
                    has_kv_transfer: bool) -> DecodeDispatch:
    """The decode dispatch for one layer on ``target`` (see the module docstring for the rules).

    Raises TypeError for a flag of the wrong type and ValueError for an unknown compress ratio or flags that
    contradict each other (``swa_only`` disagreeing with the ratio, an SWA-only layer with an extra cache)."""
    t = get_target(target)
    if isinstance(compress_ratio, bool) or not isinstance(compress_ratio, int):
        raise TypeError(f"compress_ratio: expected an int, got {type(compress_ratio).__name__}")
    if compress_ratio not in COMPRESS_RATIOS:
        raise ValueError(f"compress_ratio: expected one of {COMPRESS_RATIOS}, got {compress_ratio}")
    _require_bool("swa_only", swa_only)
    _require_bool("for_cudagraph_capture", for_cudagraph_capture)
    _require_bool("has_extra_cache", has_extra_cache)
    _require_bool("has_kv_transfer", has_kv_transfer)
    if not isinstance(kv_cache_dtype, str):
        raise TypeError(f"kv_cache_dtype: expected a str, got {type(kv_cache_dtype).__name__}")
    if swa_only != (compress_ratio in SWA_ONLY_RATIOS):
        raise ValueError(f"swa_only: a layer is SWA-only exactly when compress_ratio is 0 or 1; got swa_only="
                         f"{swa_only} with compress_ratio={compress_ratio}")
    if swa_only and has_extra_cache:
        raise ValueError("has_extra_cache: an SWA-only layer has no extra (compressed) cache, got True")
    adaptive = (t.adaptive_splits_in_capture and not swa_only and compress_ratio == ADAPTIVE_SPLITS_RATIO
                and for_cudagraph_capture)
    trust = trust_extra_cache_nan_free(t, kv_cache_dtype, has_kv_transfer, has_extra_cache)
    return DecodeDispatch(
        target=t.name, kernel_family=t.decode_family, split_selector=t.split_selector, split_cap=t.split_cap,
        adaptive_splits=adaptive, ragged_view_rule=t.ragged_view_rule, trust_extra_nan_free=trust,
        for_cudagraph_capture=for_cudagraph_capture, main_cache_fp8=t.main_cache_fp8,
        extra_cache_fp8=t.extra_cache_fp8,
    )
