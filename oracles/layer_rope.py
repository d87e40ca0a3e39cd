"""Oracle of the layer's inverse-RoPE placement (``impl.layer_rope``), written from the invariant and SPEC 2 alone.

Before the output projection every attention output row of a DSv4 layer with a bf16 wo_a must have had its RoPE
undone exactly once; with an fp8 wo_a the projection's quantization step rotates, so the attention must rotate no
row at all. Which stage does it is free, within what each stage's kernel can do at all:

- AITER's sparse-MLA store rotates only rows of the part (decode or prefill) that runs on AITER;
- the Triton decode rotates only in its split-K reduce's epilogue (SPEC 2): gfx942 and gfx950 have one; any other
  device runs the single-kernel fallback, which has no epilogue;
- the Triton prefill has no epilogue;
- the standalone pass may take any row.
"""
from __future__ import annotations

#: targets whose Triton decode ends in a split-K reduce (SPEC 2 "Kernels"); every other one runs the fallback kernel
SPLIT_K_TARGETS = ("gfx942", "gfx950")


def expected_rotation_counts(num_decode_tokens: int, num_prefill_tokens: int, fuse_inv_rope: bool) -> list[int]:
    """Per output row (decode rows, then prefill rows) how many times the attention must rotate it."""
    rows = num_decode_tokens + num_prefill_tokens
    return [1 if fuse_inv_rope else 0] * rows


def stage_rows(stage: str, target: str, num_decode_tokens: int, num_prefill_tokens: int, aiter_decode: bool,
               aiter_prefill: bool) -> range | None:
    """The output rows ``stage`` can rotate at all on ``target`` for this step, or None where it cannot rotate
    (its kernel does not run, or has no epilogue). Stages: ``aiter-decode-store``, ``decode-reduce``,
    ``aiter-prefill-store``, ``standalone``; any other name is None."""
    d, p = num_decode_tokens, num_prefill_tokens
    if stage == "standalone":
        return range(0, d + p)
    if stage == "aiter-decode-store":
        return range(0, d) if aiter_decode else None
    if stage == "decode-reduce":
        return range(0, d) if not aiter_decode and target in SPLIT_K_TARGETS else None
    if stage == "aiter-prefill-store":
        return range(d, d + p) if aiter_prefill else None
    return None
