"""The cache writers' family: the extra-cache trust gate ``_trust_dsv4_extra_cache_nan_free`` (rocm.py).

The SWA ("main") cache insert is upstream's C++ op ``torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert``,
whose source is not in the wheel: ``quantize_and_insert_k_cache`` is missing (a ``skipped`` row naming it, with that
reason). The compressor is its own family (:mod:`.compressor`).
"""
from __future__ import annotations

from contracts.subjects.base import EntryMissing, Family
from contracts.subjects.vllm.adapters import needs
from impl.targets import get_target

SWA_MISSING = ("upstream's SWA insert is the C++ op torch.ops._C.fused_deepseek_v4_qnorm_rope_kv_rope_quant_insert, "
               "whose source is not in the wheel")


class FamilyWithReasons(Family):
    """A :class:`Family` whose missing entry points say why they are missing."""

    def __init__(self, name: str, missing: dict, **entries):
        super().__init__(name, **entries)
        self.__dict__["_missing"] = dict(missing)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        why = self.__dict__.get("_missing", {}).get(name)
        if why is not None:
            raise EntryMissing(f"{self._name}.{name}", why)
        return super().__getattr__(name)


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "rocm": ["_trust_dsv4_extra_cache_nan_free"],
}, since={"rocm._trust_dsv4_extra_cache_nan_free": "0.28.0"})


def build(ctx) -> Family:
    rocm = ctx["rocm"]
    tgt = ctx.target

    def trust_extra_cache_nan_free(target, cache_dtype, has_kv_transfer, has_extra_cache) -> bool:
        """Upstream's gate reads the target from its import-time ``_ON_GFX950``; ``target`` must be the bound
        one."""
        if target is not None and get_target(target).name != tgt.name:
            raise ValueError(f"target: this binding of the subject is for {tgt.name}, got {get_target(target).name}")
        return ctx.call(rocm._trust_dsv4_extra_cache_nan_free, cache_dtype, has_kv_transfer, has_extra_cache)

    return FamilyWithReasons("cache_writers", {"quantize_and_insert_k_cache": SWA_MISSING},
                             trust_extra_cache_nan_free=trust_extra_cache_nan_free)
