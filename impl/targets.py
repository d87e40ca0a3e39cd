"""Per-architecture semantics as data: one frozen ``Target`` per architecture.

Every difference between gfx942 (MI300X), gfx950 (MI355X) and any other device (``generic``, upstream's single-kernel
fallback) is a field here, never an ``if`` on a global. Functions take ``target=`` explicitly and default to the
detected one, which is what lets the gfx950 logic run on a CPU (Triton interpreter) or on an NVIDIA GPU.

Sources: SPEC.md sections 1.2 (fp8 flavours), 2 (kernel families, split caps, ragged views, adaptive splits),
4 (writer sanitizing, trust gate), 5 (cp-gather variants), 3 (OPUS eligibility), 10 (the gfx942 AITER prefill
route).
"""
from __future__ import annotations

import importlib
import importlib.util
import os
from dataclasses import dataclass, fields

from impl.runtime import detect_device

ENV_OVERRIDE = "SMV_TARGET"


@dataclass(frozen=True)
class Target:
    name: str
    #: fp8 e4m3 flavour of the SWA ("main") cache: "fnuz" on gfx942, "ocp" elsewhere (SPEC 1.2).
    main_cache_fp8: str
    #: fp8 flavour of the compressed ("extra") cache: written by a Triton encoder, OCP on every platform.
    extra_cache_fp8: str
    #: decode kernel family: "generic" (single kernel), "gfx942" (split-K), "gfx950" (4x128 tiles, base-2 softmax).
    decode_family: str
    #: split selector: None (no split-K), "gfx942" (cost model over 1..16) or "gfx950" (occupancy target, cap 32).
    split_selector: str | None
    split_cap: int | None
    #: compressor writers clear non-finite values and cap UE8M0 codes at 254 (``SANITIZE_CACHE_NANS``).
    sanitizes_writer: bool
    #: the decode path may skip the extra-cache NaN scrub when the trust gate's other conditions hold.
    may_trust_extra_nan_free: bool
    #: graph-buffer ragged view length: "full" (num_rows * max_per_row) or "source" (max(source.numel(), 1)).
    ragged_view_rule: str
    #: adaptive splits (per-query active split count) allowed under graph capture.
    adaptive_splits_in_capture: bool
    #: cp-gather kernel variant: "legacy" or "gfx950" (despecialized, int64 block offsets).
    cp_gather_variant: str
    #: AITER OPUS sparse prefill may be routed to.
    opus_eligible: bool
    #: AITER's ``pa_prefill_sparse`` prefill route: the query rows from which it is taken (512 on gfx942, CDNA 3:
    #: a measured crossover against the Triton kernel, SPEC 10), None where the route does not exist.
    aiter_pa_prefill_sparse_min_queries: int | None
    #: CU count used when emulating this architecture (upstream tests pin 256 for gfx950; MI300X has 304).
    cu_count: int

    @property
    def main_cache_is_fnuz(self) -> bool:
        return self.main_cache_fp8 == "fnuz"

    @property
    def extra_cache_is_fnuz(self) -> bool:
        return self.extra_cache_fp8 == "fnuz"

    @property
    def writer_scale_code_cap(self) -> int:
        """Largest UE8M0 code the compressor may store: 254 when sanitizing (255 is NaN/inf in readers)."""
        return 254 if self.sanitizes_writer else 255

    def as_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


GFX942 = Target(
    name="gfx942", main_cache_fp8="fnuz", extra_cache_fp8="ocp", decode_family="gfx942",
    split_selector="gfx942", split_cap=16, sanitizes_writer=False, may_trust_extra_nan_free=False,
    ragged_view_rule="full", adaptive_splits_in_capture=False, cp_gather_variant="legacy",
    opus_eligible=False, cu_count=304,
    aiter_pa_prefill_sparse_min_queries=512,
)
GFX950 = Target(
    name="gfx950", main_cache_fp8="ocp", extra_cache_fp8="ocp", decode_family="gfx950",
    split_selector="gfx950", split_cap=32, sanitizes_writer=True, may_trust_extra_nan_free=True,
    ragged_view_rule="source", adaptive_splits_in_capture=True, cp_gather_variant="gfx950",
    opus_eligible=True, cu_count=256,
    aiter_pa_prefill_sparse_min_queries=None,
)
GENERIC = Target(
    name="generic", main_cache_fp8="ocp", extra_cache_fp8="ocp", decode_family="generic",
    split_selector=None, split_cap=None, sanitizes_writer=False, may_trust_extra_nan_free=False,
    ragged_view_rule="full", adaptive_splits_in_capture=False, cp_gather_variant="legacy",
    opus_eligible=False, cu_count=256,
    aiter_pa_prefill_sparse_min_queries=None,
)

TARGETS: dict[str, Target] = {t.name: t for t in (GFX942, GFX950, GENERIC)}
TARGET_NAMES: tuple[str, ...] = tuple(TARGETS)


def get_target(target: "Target | str | None" = None) -> Target:
    """Resolve ``target`` (a Target, a name, or None for the detected one)."""
    if target is None:
        return detect_target()
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        try:
            return TARGETS[target]
        except KeyError:
            raise ValueError(
                f"target: unknown architecture {target!r}; expected one of {', '.join(TARGET_NAMES)}"
            ) from None
    raise TypeError(f"target: expected a Target, a name or None, got {type(target).__name__}")


def target_for_arch(arch: str) -> Target:
    """gfx942* -> gfx942, gfx950* -> gfx950, anything else -> generic."""
    for name in ("gfx942", "gfx950"):
        if arch.startswith(name):
            return TARGETS[name]
    return GENERIC


def env_override() -> Target | None:
    """The target ``SMV_TARGET`` names, or None when it is unset or empty. Needs no device, so a command can
    reject a bad value before doing any work."""
    override = os.environ.get(ENV_OVERRIDE)
    if not override:
        return None
    try:
        return TARGETS[override]
    except KeyError:
        raise ValueError(
            f"{ENV_OVERRIDE}={override!r} is not a known target; expected one of {', '.join(TARGET_NAMES)} "
            f"(or unset it to use the detected device)"
        ) from None


def detect_target() -> Target:
    """``SMV_TARGET`` if set (emulation), else the architecture of the visible device (generic on CPU/NVIDIA)."""
    override = env_override()
    if override is not None:
        return override
    return target_for_arch(detect_device().arch)


def effective_cu_count(target: Target) -> int:
    """The device's CU count on real hardware of ``target``'s architecture; the pinned count otherwise."""
    dev = detect_device()
    if dev.kind == "rocm" and target_for_arch(dev.arch).name == target.name and target.name != "generic":
        import torch

        return int(torch.cuda.get_device_properties(0).multi_processor_count)
    return target.cu_count


@dataclass(frozen=True)
class AiterStatus:
    importable: bool
    reason: str

    def as_json(self) -> dict:
        return {"importable": self.importable, "reason": self.reason}


def aiter_status() -> AiterStatus:
    """Whether AMD's AITER (the ``amd-aiter`` distribution) is importable.

    PyPI's package named ``aiter`` is an unrelated async-iterator library that also imports as ``aiter``; the real
    one is recognised by its ``aiter.ops`` subpackage.
    """
    try:
        spec = importlib.util.find_spec("aiter")
    except (ImportError, ValueError) as exc:
        return AiterStatus(False, f"looking up 'aiter' failed: {exc}")
    if spec is None:
        return AiterStatus(False, "no module named 'aiter' (AMD AITER is the ROCm-only 'amd-aiter' distribution)")
    try:
        mod = importlib.import_module("aiter")
    except Exception as exc:  # a broken ROCm install raises all sorts of things
        return AiterStatus(False, f"'aiter' is installed but failed to import: {type(exc).__name__}: {exc}")
    ops_found = hasattr(mod, "ops")
    if not ops_found:
        try:
            ops_found = importlib.util.find_spec("aiter.ops") is not None
        except (ImportError, ValueError):
            ops_found = False
    if not ops_found:
        return AiterStatus(
            False,
            "the installed 'aiter' has no 'aiter.ops': it is not AMD AITER "
            "(PyPI's 'aiter' is an unrelated async-iterator library)",
        )
    return AiterStatus(True, "AMD AITER found (aiter.ops importable)")
