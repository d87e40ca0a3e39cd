"""Contract ``fp8-ds-mla-dequant-exact``: the fp8_ds_mla cache's host dequantizer (``formats.dequantize_fp8_ds_mla``)
against the decode oracle's byte-level reader (:func:`oracles.decode.dequantize_rows`, without the scrub)."""
from __future__ import annotations

import torch

from contracts.core import ALL_TARGETS, Violation, contract
from contracts.subjects import bound
from fuzz import dequant as fz
from fuzz.dequant import DequantCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles.decode import dequantize_rows


def _examples(target: Target) -> list[DequantCase]:
    return [DequantCase(seed=11, block_size=3, num_blocks=2, padded=True, offset_blocks=1, flavour="fnuz",
                        scales="extremes", order="repeated", slots_as="tensor"),
            DequantCase(seed=12, block_size=64, num_blocks=1, padded=False, offset_blocks=0, flavour="ocp",
                        scales="extremes", order="shuffled")]


@contract("fp8-ds-mla-dequant-exact", targets=ALL_TARGETS, cases=lambda target: fz.dequant_cases(),
          examples=_examples, min_cases=5, max_cases=25, case_type=DequantCase)
def fp8_ds_mla_dequant_exact(case: DequantCase, target: Target) -> list[Violation]:
    """The host dequantizer of the fp8_ds_mla cache returns, for every requested slot, exactly the float32 row the
    byte-level reader gives (SPEC 1.2): each NoPE lane is its fp8 value (the flavour's NaN codes are NaN) times
    2^(code - 127) as one fp32 product, code 0 read as 2^-127 and code 255 as +inf (so 0 x inf is NaN, as in the
    kernels), then the 64 bf16 RoPE lanes widened; through stride(0), from a view that may start past its pool's
    first blocks, for slots in any order and repeated, given as a list or a tensor. Bit-exact, NaN positions
    included; the cache is not modified."""
    fmt = bound(target).formats
    pool, view = fz.build_cache(case, device=kernel_device())
    before = pool.clone()
    slots = case.slots()
    arg = torch.tensor(slots, dtype=torch.int64, device=pool.device) if case.slots_as == "tensor" else slots
    got = fmt.dequantize_fp8_ds_mla(view, arg, case.flavour).cpu()
    ref = dequantize_rows(view, slots, case.flavour, scrub=False)
    v: list[Violation] = []
    if not torch.equal(before, pool):
        v.append(Violation("dequantizer modified the cache", "", "unchanged bytes",
                           f"{int((before != pool).sum())} bytes changed"))
    if tuple(got.shape) != tuple(ref.shape) or got.dtype != torch.float32:
        return v + [Violation("dequantized rows: shape / dtype", "", f"{list(ref.shape)} float32",
                              f"{list(got.shape)} {got.dtype}")]
    same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    if not bool(same.all()):
        i, d = (~same).nonzero()[0].tolist()
        part = "NoPE" if d < 448 else "RoPE"
        v.append(Violation(f"dequantized row differs from the byte-level reader ({int((~same).sum())} lanes)",
                           f"slot {slots[i]} (request {i}), lane {d} ({part})", f"{float(ref[i, d])!r}",
                           f"{float(got[i, d])!r}"))
    return v
