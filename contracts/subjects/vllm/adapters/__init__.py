"""Adapters from our API to upstream's calls, one module per family (named after impl's modules). Each module
defines ``build(ctx: contracts.subjects.vllm.BoundContext) -> contracts.subjects.Family``; an entry point a
family leaves out is ``EntryMissing`` (a ``skipped`` row naming it)."""
from impl.runtime import detect_device, triton_mode  # the host probes native_fnuz_unavailable asks (tests patch them)


def native_fnuz_unavailable(target, what: str) -> None:
    """``SubjectUnavailable`` where upstream's code for ``target`` would use FNUZ fp8 (gfx942's platform flavour,
    upstream's ``FP8_DTYPE`` there) in a Triton kernel on an NVIDIA GPU: Triton there has no FNUZ type and refuses
    to compile it, so the row cannot run on this host (under the interpreter, or on gfx942 itself, it does).
    ``what`` says which of upstream's kernels, e.g. "decode reads its main (SWA) cache"."""
    from contracts.subjects import SubjectUnavailable

    if target.main_cache_fp8 == "fnuz" and triton_mode() == "native" and detect_device().kind == "cuda":
        raise SubjectUnavailable(f"upstream's {target.name} {what} as FNUZ fp8, which does not exist on NVIDIA GPUs "
                                 f"(native Triton here)")
