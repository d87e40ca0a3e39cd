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


LAYOUT_REFUSAL_UNCLEAR = "refusal of a non-packed slot tensor does not name the argument"
SLOTS_WRITTEN = "dequantizer modified the slot tensor's buffer"


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
    first blocks, for slots in any order and repeated, given as a list or a tensor (packed, or a stride-2 view into
    a larger buffer: the same rows as a packed copy; or a refusal of that layout, a ValueError/TypeError naming
    ``slots`` with the cache and the slot buffer untouched). Bit-exact, NaN positions included; neither the cache
    nor the slot tensor's buffer is modified."""
    fmt = bound(target).formats
    pool, view = fz.build_cache(case, device=kernel_device())
    before = pool.clone()
    slots = case.slots()
    slot_buf, arg = fz.build_slots(case, pool.device)
    slots_before = slot_buf.clone() if slot_buf is not None else None
    v: list[Violation] = []
    try:
        got = fmt.dequantize_fp8_ds_mla(view, arg, case.flavour).cpu()
    except (ValueError, TypeError) as exc:
        if case.slots_layout == "contiguous":
            raise
        if "slots" not in str(exc):
            v.append(Violation(LAYOUT_REFUSAL_UNCLEAR, f"slots_layout={case.slots_layout}", "names slots",
                               str(exc)[:200]))
        got = None
    if not torch.equal(before, pool):
        v.append(Violation("dequantizer modified the cache", "", "unchanged bytes",
                           f"{int((before != pool).sum())} bytes changed"))
    if slot_buf is not None and not torch.equal(slots_before, slot_buf):
        v.append(Violation(SLOTS_WRITTEN, f"slots_layout={case.slots_layout}", "unchanged", "changed"))
    if got is None:
        return v
    ref = dequantize_rows(view, slots, case.flavour, scrub=False)
    if tuple(got.shape) != tuple(ref.shape) or got.dtype != torch.float32:
        return v + [Violation("dequantized rows: shape / dtype", "", f"{list(ref.shape)} float32",
                              f"{list(got.shape)} {got.dtype}")]
    same = (got == ref) | (torch.isnan(got) & torch.isnan(ref))
    if not bool(same.all()):
        i, d = (~same).nonzero()[0].tolist()
        part = "NoPE" if d < 448 else "RoPE"
        lay = "" if case.slots_layout == "contiguous" else f", slots_layout={case.slots_layout}"
        v.append(Violation(f"dequantized row differs from the byte-level reader ({int((~same).sum())} lanes)",
                           f"slot {slots[i]} (request {i}), lane {d} ({part}){lay}", f"{float(ref[i, d])!r}",
                           f"{float(got[i, d])!r}"))
    return v
