"""Reference for the DSv4 cache writers' quantization and packing, and for the SWA insert (SPEC 1.2, 4 step 4).

Written from SPEC.md and the rules the writers' docstrings state for what SPEC leaves open; float64 arithmetic
(frexp / ldexp, elementwise over a token's groups) except where a kernel's fp32 step is mirrored on purpose (the
power-of-two multiply, bf16 rounding). Everything checked bitwise is re-derived here or in ``oracles.formats`` (the
fp8 encoder: a brute-force nearest-even search over the representable values; the byte addressing); nothing comes
from ``impl``.

Group rule (per 64 NoPE values x, flavour range FP8_MAX = 448 OCP / 240 FNUZ, code cap CAP):
  finite group:  exp = ceil(log2(max(amax, 1e-4) / FP8_MAX)), code = clamp(exp + 127, 0, CAP);
  a group with a NaN or +-inf: code = CAP [inferred];
  q = fp32(x * 2^-(code - 127)); SANITIZE: non-finite x -> 0 first, |q| <= min(FP8_MAX, 1.875 * 2^(127 - exp));
  byte = e4m3(q), round-to-nearest-even, saturating.
"""
from __future__ import annotations

import math

import torch

from oracles.formats import fp8_ds_mla_token_spans, fp8_encode, storage_bytes

FP8_MAX = {"ocp": 448.0, "fnuz": 240.0}
#: fp32(1e-4): the amax floor as the kernels hold it
AMAX_FLOOR = float(torch.tensor(1e-4, dtype=torch.float32))


def ceil_log2(v: float) -> int:
    m, e = math.frexp(v)
    return e - 1 if m == 0.5 else e


def group_exponent(values: list[float], flavour: str) -> int | None:
    """ceil(log2(max(amax, 1e-4) / FP8_MAX)) of a group, or None when it holds a NaN or an infinity."""
    if any(not math.isfinite(v) for v in values):
        return None
    amax = max(abs(v) for v in values)
    return ceil_log2(max(amax, AMAX_FLOOR) / FP8_MAX[flavour])


def quantize_groups(values: torch.Tensor, flavour: str, cap: int, sanitize: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`quantize_group` of many groups at once: fp32 values [G, 64] -> (e4m3 bytes uint8 [G, 64], UE8M0 codes
    int64 [G]), by the same float64 steps elementwise."""
    v = values.to(torch.float64)
    finite = torch.isfinite(v).all(dim=1)
    amax = torch.where(finite[:, None], v.abs(), torch.zeros_like(v)).amax(dim=1)
    m, e2 = torch.frexp(torch.clamp(amax, min=AMAX_FLOOR) / FP8_MAX[flavour])  # ceil(log2(.)) from frexp
    exp = torch.where(m == 0.5, e2.to(torch.int64) - 1, e2.to(torch.int64))
    code = torch.where(finite, (exp + 127).clamp(0, cap), torch.full_like(exp, cap))
    e = code - 127
    xs = torch.where(torch.isfinite(v), v, torch.zeros_like(v)) if sanitize else v
    # x * 2^-e rounded to fp32 (exact unless the product is an fp32 subnormal)
    q = (xs * torch.ldexp(torch.ones_like(amax), -e)[:, None]).to(torch.float32)
    if sanitize:
        bound = torch.clamp(1.875 * torch.ldexp(torch.ones_like(amax), 127 - e), max=FP8_MAX[flavour])
        bound = bound.to(torch.float32)[:, None].expand_as(q)
        q = torch.where(q.abs() > bound, torch.copysign(bound, q), q)
    return fp8_encode(q, flavour), code


def quantize_group(values: list[float], flavour: str, cap: int, sanitize: bool) -> tuple[list[int], int]:
    """The 64 e4m3 bytes and the UE8M0 code of one NoPE group of fp32 values."""
    b, code = quantize_groups(torch.tensor([values], dtype=torch.float64), flavour, cap, sanitize)
    return b[0].tolist(), int(code[0])


def quantize_pack_row(row: torch.Tensor, *, flavour: str, cap: int, sanitize: bool, rope_from_fp32: bool):
    """Bytes of one token from a 512-wide row: {'nope': [448] uint8, 'scale': [7] uint8, 'rope': [128] uint8,
    'pad': 0}. ``rope_from_fp32``: the row holds fp32 values (compressor: NoPE rounded to bf16 first, RoPE rounded to
    bf16 then, with SANITIZE, NaN/+-inf -> 0); otherwise the row is bf16 and everything is taken as is (SWA)."""
    if rope_from_fp32:
        nope_vals = row[:448].to(torch.float32).to(torch.bfloat16).to(torch.float32)
        rope = row[448:].to(torch.float32).to(torch.bfloat16)
        if sanitize:
            rope = torch.where(torch.isfinite(rope), rope, torch.zeros_like(rope))
    else:
        if row.dtype != torch.bfloat16:
            raise TypeError(f"row: expected bfloat16 for the SWA writer, got {row.dtype}")
        nope_vals = row[:448].to(torch.float32)
        rope = row[448:]
    nope, scale = quantize_groups(nope_vals.reshape(7, 64), flavour, cap, sanitize)  # the 7 groups at once
    return {"nope": nope.reshape(448), "scale": scale.to(torch.uint8),
            "rope": rope.contiguous().view(torch.uint8).clone(), "pad": 0}


def read_token(cache: torch.Tensor, slot: int) -> dict:
    """The bytes of one token of an ``fp8_ds_mla`` cache view, located by absolute offsets (SPEC 1.2)."""
    flat, base = storage_bytes(cache)
    spans = fp8_ds_mla_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    out = {k: flat[base + a:base + b].cpu().clone() for k, (a, b) in spans.items()}
    out["pad"] = int(out["pad"][0])
    return out


def place_token(flat: torch.Tensor, base: int, cache: torch.Tensor, slot: int, tok: dict) -> None:
    """Write a token's expected bytes into a host copy of the cache's storage."""
    spans = fp8_ds_mla_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    for k in ("nope", "rope", "scale"):
        a, b = spans[k]
        flat[base + a:base + b] = tok[k]
    flat[base + spans["pad"][0]] = tok["pad"]


def swa_insert_reference(k: torch.Tensor, slot_mapping: list[int], cache: torch.Tensor, before: torch.Tensor, *,
                         flavour: str, cap: int = 255) -> torch.Tensor:
    """The whole expected storage of ``cache`` after ``quantize_and_insert_k_cache``: ``before`` (a host copy of the
    storage taken before the write) with every token whose slot is >= 0 packed at its slot (SPEC 1.2 reference
    writer)."""
    _, base = storage_bytes(cache)
    expected = before.clone()
    rows = k.detach().cpu()
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        place_token(expected, base, cache, slot,
                    quantize_pack_row(rows[t], flavour=flavour, cap=cap, sanitize=False, rope_from_fp32=False))
    return expected
