"""The indexer-K gather: upstream's ``cp_gather_indexer_k_quant_cache_triton`` (``vllm/v1/attention/ops/
rocm_aiter_mla_sparse.py``) behind our signature.

Upstream picks its kernel with the import-time ``_ON_GFX950`` (bound per target by the loader):
``_cp_gather_indexer_quant_cache_gfx950_kernel`` (``do_not_specialize=["num_batches"]``, table width and block
count constexpr, no token count argument) on gfx950, ``_cp_gather_indexer_quant_cache_kernel`` (token, batch,
table-width and block counts as plain, specialized ints) elsewhere. ``gather_kernel`` names that kernel object,
which ``compile-once`` counts the specializations of.

Arguments: our uint8 ``k_fp8 [T, 128]`` is handed over as a view in upstream's fp8 dtype (``FP8_DTYPE``, the same
bytes), our uint8 ``k_scale [T, 4]`` as it is (upstream views it as fp32 itself); ``layout`` None / "normal" /
"shuffle" becomes ``cache_layout`` None / "NORMAL" / "SHUFFLE" (None keeps upstream's own default rule).
``check_metadata`` is accepted and changes nothing: upstream makes no host checks (its kernels mask).
``adapters/formats.py``'s ``unpack_indexer_k`` calls the same upstream function as a cache reader.

Natively on NVIDIA, FNUZ fp8 does not exist: on gfx942 (``FP8_DTYPE`` is FNUZ there) the gather is
``SubjectUnavailable``. ``launcher`` returns a zero-argument call of upstream's host function for benchmarks: natively
that function imports nothing when called, so it runs without the per-call module swap of the entry point (about a
millisecond of host time, which would be timed instead of upstream's code); under the interpreter use the entry.
"""
from __future__ import annotations

from contracts.subjects.vllm.adapters import native_fnuz_unavailable
from contracts.subjects.base import Family, SubjectUnavailable
from contracts.subjects.vllm.adapters import needs
from impl.runtime import triton_mode
from impl.targets import get_target

LAYOUTS = {None: None, "normal": "NORMAL", "shuffle": "SHUFFLE"}


#: the upstream symbols this adapter uses, checked when the family is bound (a missing one names itself);
#: since: the release that introduced each one newer than 0.22.0, the first with the DSv4 ROCm code
NEEDS = needs({
    "ops": [
        "FP8_DTYPE", "_ON_GFX950", "_cp_gather_indexer_quant_cache_gfx950_kernel",
        "_cp_gather_indexer_quant_cache_kernel", "cp_gather_indexer_k_quant_cache_triton",
    ],
}, since={"ops.FP8_DTYPE": "0.31.0", "ops._cp_gather_indexer_quant_cache_gfx950_kernel": "0.28.0"})


def build(ctx) -> Family:
    ops = ctx["ops"]
    tgt = ctx.target

    def _check_target(target) -> None:
        if target is not None and get_target(target).name != tgt.name:
            raise ValueError(f"target: this binding of the subject is for {tgt.name}, got {get_target(target).name}")

    def _native_fnuz_unavailable() -> None:
        native_fnuz_unavailable(tgt, "gather views k_fp8 (its FP8_DTYPE)")

    def _upstream_args(k_cache, k_fp8, k_scale, block_table, cu_seqlen, token_to_seq, layout):
        if layout not in LAYOUTS:
            raise ValueError(f"layout: expected None, 'normal' or 'shuffle', got {layout!r}")
        return ((k_cache, k_fp8.view(ops.FP8_DTYPE), k_scale, block_table, cu_seqlen, token_to_seq),
                {"cache_layout": LAYOUTS[layout]})

    def gather_kernel(target=None):
        """The kernel upstream's host function launches on this binding's target."""
        _check_target(target)
        if ops._ON_GFX950:
            return ops._cp_gather_indexer_quant_cache_gfx950_kernel
        return ops._cp_gather_indexer_quant_cache_kernel

    def cp_gather_indexer_k_quant_cache(k_cache, k_fp8, k_scale, block_table, cu_seqlen, token_to_seq, *,
                                        layout=None, target=None, check_metadata=True):
        _check_target(target)
        _native_fnuz_unavailable()
        args, kwargs = _upstream_args(k_cache, k_fp8, k_scale, block_table, cu_seqlen, token_to_seq, layout)
        ctx.call(ops.cp_gather_indexer_k_quant_cache_triton, *args, **kwargs)

    def launcher(k_cache, k_fp8, k_scale, block_table, cu_seqlen, token_to_seq, *, layout=None, target=None):
        """A zero-argument call of upstream's host function on these arguments (native hosts; for timing)."""
        _check_target(target)
        _native_fnuz_unavailable()
        if triton_mode() != "native":
            raise SubjectUnavailable("the direct launcher is for native hosts; under the interpreter upstream's "
                                     "code runs through the entry point (with its corrections)")
        args, kwargs = _upstream_args(k_cache, k_fp8, k_scale, block_table, cu_seqlen, token_to_seq, layout)
        fn = ops.cp_gather_indexer_k_quant_cache_triton
        return lambda: fn(*args, **kwargs)

    return Family("cp_gather", cp_gather_indexer_k_quant_cache=cp_gather_indexer_k_quant_cache,
                  gather_kernel=gather_kernel, launcher=launcher)
