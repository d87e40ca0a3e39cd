"""Reference for one DSv4 decode step, layer by layer, written from SPEC sections 1.2, 1.3, 2 and 4.

What SPEC says a decode token at position ``pos`` of request ``req`` attends to, and what the caches must hold:

* SWA (every layer): positions start..pos with start = max(pos - window + 1, 0); position p lives at slot
  swa_table[req][p // sbs] * sbs + p % sbs. The token's own row is inserted first (SPEC 1.2 reference writer).
* Compressed row i of a request (C4A, C128A) pools positions i*ratio .. i*ratio + ratio - 1 (plus the overlap
  window of SPEC 4) and is written by the token at pos = i*ratio + ratio - 1; it lives at slot
  table[req][i // cbs] * cbs + i % cbs with cbs = attention block_size // ratio (SPEC 1.3). A token at pos sees the
  rows completed so far, n = (pos + 1) // ratio (its own included: the compressor runs before the attention).
* C128A attends to all n rows; C4A to the indexer's top-k of them: the ``topk`` rows with the highest logits,
  equal logits -> the lower row first (:func:`select_topk`).
* The attention itself is the SPEC 2 decode (``oracles.decode.ref_sparse_attn_decode``: one softmax over the SWA
  rows and the extra rows plus the sink, V = K, the caches dequantized the way the kernels read them, the main
  cache scrubbed, the extra cache unless the trust gate is open), then the inverse GPT-J RoPE of the epilogue at
  the query's position (``oracles.epilogues``).

Slots are computed here from the block tables with the SPEC formula, never taken from the code under test; the
caches read are those the kernels wrote, after :func:`row_problems` has checked that the rows at SPEC's slots hold
what they should. Imports nothing of ours outside ``oracles``.
"""
from __future__ import annotations

import math

import torch

from oracles import cache_writers as ref_writers
from oracles import decode as ref_decode
from oracles.formats import fp8_decode, storage_bytes

U32 = 2.0 ** -24
U_BF16 = 2.0 ** -8  # half an ulp of bf16, relative, round to nearest
AMAX_FLOOR = ref_writers.AMAX_FLOOR


def slot_of(table: list[list[int]], req: int, index: int, block_size: int) -> int:
    """table[req][index // bs] * bs + index % bs (SPEC 1.3), -1 when the column or the block id is missing."""
    if index < 0 or req < 0 or req >= len(table):
        return -1
    col = index // block_size
    if col >= len(table[req]) or table[req][col] < 0:
        return -1
    return table[req][col] * block_size + index % block_size


def swa_positions(pos: int, window: int) -> list[int]:
    """The positions an SWA window of ``window`` tokens ending at ``pos`` covers (SPEC 1.3)."""
    if pos < 0:
        return []
    return list(range(max(pos - window + 1, 0), pos + 1))


def rows_so_far(pos: int, ratio: int) -> int:
    """Compressed rows a token at ``pos`` sees: (pos + 1) // ratio."""
    return (pos + 1) // ratio if pos >= 0 else 0


def c128a_width(max_model_len: int, ratio: int = 128, align: int = 128) -> int:
    """Entries per C128A row of the decode's dense indices and graph buffer (SPEC 1.3 ``c128a_max_compressed``):
    ceil(max_model_len / ratio) rounded up to a multiple of 128."""
    n = -(-max_model_len // ratio)
    return max(1, -(-n // align)) * align


def capture_flag(arch: str) -> bool:
    """``for_cudagraph_capture`` of metadata built for a graph capture (seed 004 item 2: upstream's
    ``build_for_cudagraph_capture`` sets it to ``_ON_GFX950``): True on gfx950 only."""
    return arch == "gfx950"


def completes_row(pos: int, ratio: int) -> bool:
    return pos >= 0 and (pos + 1) % ratio == 0


def select_topk(logits: list[float], k: int) -> list[int]:
    """Set-based top-k with an explicit tie rule: the ``k`` highest values, equal values -> lower index first,
    -inf rows never selected; returned in that order."""
    order = sorted((i for i, v in enumerate(logits) if v > -math.inf), key=lambda i: (-logits[i], i))
    return order[:k]


def reference_decode(q: torch.Tensor, main_cache: torch.Tensor, main_slots: list[list[int]], extra_cache,
                     extra_slots: list[list[int]] | None, *, attn_sink, softmax_scale: float, main_flavour: str,
                     extra_flavour: str, scrub_extra: bool) -> ref_decode.DecodeReference:
    """The SPEC 2 decode over exactly the given slots per query row (``oracles.decode``)."""

    def ragged(rows):
        flat, ptr = [], [0]
        for r in rows:
            flat += r
            ptr.append(len(flat))
        return torch.tensor(flat, dtype=torch.int64), torch.tensor(ptr, dtype=torch.int64)

    mi, mp = ragged(main_slots)
    ei = ep = None
    if extra_slots is not None:
        ei, ep = ragged(extra_slots)
    return ref_decode.ref_sparse_attn_decode(q, main_cache, mi, mp, extra_cache if extra_slots is not None else None,
                                             ei, ep, attn_sink=attn_sink, softmax_scale=softmax_scale,
                                             main_flavour=main_flavour, extra_flavour=extra_flavour,
                                             scrub_extra=scrub_extra)


def token_byte_offsets(cache: torch.Tensor, slot: int) -> list[int]:
    """Absolute storage offsets of every byte of one ``fp8_ds_mla`` token record (data, scales, pad)."""
    from oracles.formats import fp8_ds_mla_token_spans

    _, base = storage_bytes(cache)
    spans = fp8_ds_mla_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    out = []
    for a, b in spans.values():
        out += range(base + a, base + b)
    return out


def _ceil_log2(v: float) -> int:
    return ref_writers.ceil_log2(v)


FP8_MAX = ref_writers.FP8_MAX


def _e4m3_half_step(v: torch.Tensor, flavour: str) -> torch.Tensor:
    """Half the spacing of e4m3 values around magnitudes ``v`` (float64): 2^(floor(log2 v) - 4) for normal values,
    the subnormal half spacing below the smallest normal (2^-6 OCP, 2^-7 FNUZ)."""
    min_exp = -6 if flavour == "ocp" else -7
    _, e = torch.frexp(v.clamp(min=2.0 ** min_exp))
    return torch.ldexp(torch.ones_like(v), (e - 1 - 4).to(torch.int64))


def row_problems(tok: dict, exact: torch.Tensor, tol: torch.Tensor, *, flavour: str, cap: int,
                 limit: int = 3) -> list[tuple[str, str, str]]:
    """Does the record ``tok`` (``oracles.cache_writers.read_token``) hold the row ``exact`` (float64 [512]) up to
    the writer's rounding? ``tol`` bounds how far the writer's own fp32 row may lie from ``exact`` (0 for the SWA
    insert, whose input is the bf16 row itself; ``oracles.compressor.token_reference``'s bound for the compressor).
    The check identifies the row; the writers' bytes are judged by ``writer-oracle-exact``:

    * each NoPE group's scale code lies between the codes of the group's amax at -tol and +tol (bf16 rounding
      included): clamp(ceil(log2(max(amax, 1e-4) / FP8_MAX)) + 127, 0, cap);
    * every NoPE value fp8(byte) * 2^(code - 127) lies within tol + 2^-8 (|x| + tol) (bf16) + half an e4m3 step at
      that scale (+ any saturation excess) of x;
    * every RoPE lane (bf16) within tol + 2^-8 (|x| + tol) of x.
    Lanes where ``exact`` or ``tol`` is not finite are left to the writer contracts. Returns (where, expected,
    got) for at most ``limit`` problems per kind."""
    x = exact.to(torch.float64)
    t = tol.to(torch.float64).expand_as(x)
    fmax = FP8_MAX[flavour]
    out: list[tuple[str, str, str]] = []
    codes = tok["scale"].to(torch.int64)
    nope = fp8_decode(tok["nope"], flavour)
    xg, tg = x[:448].reshape(7, 64), t[:448].reshape(7, 64)
    fin = torch.isfinite(xg) & torch.isfinite(tg)
    group_ok = fin.all(dim=1)
    lo = torch.clamp(xg.abs() - tg, min=0).amax(dim=1) * (1 - U_BF16)
    hi = (xg.abs() + tg).amax(dim=1) * (1 + U_BF16)
    c_lo = [max(0, min(cap, _ceil_log2(max(float(a), AMAX_FLOOR) / fmax) + 127)) for a in lo.tolist()]
    c_hi = [max(0, min(cap, _ceil_log2(max(float(a), AMAX_FLOOR) / fmax) + 127)) if math.isfinite(float(a))
            else cap for a in hi.tolist()]
    code_ok = torch.tensor([c_lo[g] <= int(codes[g]) <= c_hi[g] for g in range(7)])
    for g in (group_ok & ~code_ok).nonzero().flatten().tolist()[:limit]:
        out.append((f"NoPE group {g} scale code", f"{c_lo[g]}..{c_hi[g]}", str(int(codes[g]))))
    e = (codes - 127).to(torch.float64)[:, None]
    scale = torch.exp2(e)
    v_hi = (xg.abs() + tg) * (1 + U_BF16) / scale
    bound = tg + U_BF16 * (xg.abs() + tg) + (_e4m3_half_step(v_hi, flavour) + torch.clamp(v_hi - fmax, min=0)) * scale
    got = nope.reshape(7, 64) * scale
    bad = (group_ok & code_ok)[:, None] & fin & ~((got - xg).abs() <= bound * 1.01 + 2.0 ** -140)
    for g, d in bad.nonzero().tolist()[:limit]:
        out.append((f"NoPE lane {64 * g + d}", f"{float(xg[g, d])!r} +- {float(bound[g, d]):.3g}",
                    repr(float(got[g, d]))))
    rope = tok["rope"].clone().view(torch.bfloat16).to(torch.float64)
    xr, tr = x[448:], t[448:]
    rb = tr + U_BF16 * (xr.abs() + tr)
    bad_r = torch.isfinite(xr) & torch.isfinite(tr) & ~((rope - xr).abs() <= rb * 1.01 + 2.0 ** -140)
    for i in bad_r.nonzero().flatten().tolist()[:limit]:
        out.append((f"RoPE lane {i}", f"{float(xr[i])!r} +- {float(rb[i]):.3g}", repr(float(rope[i]))))
    return out


#: the indexer-K fp8 scale divisor per flavour (SPEC 1.3: max(amax, 1e-4) / 448 OCP, / 224 FNUZ)
INDEXER_DIV = {"ocp": 448.0, "fnuz": 224.0}


def _pow2_at_least(v: float) -> float:
    return math.ldexp(1.0, _ceil_log2(v))


def indexer_token_offsets(cache: torch.Tensor, slot: int, layout: str) -> list[int]:
    """Absolute storage offsets of the 128 fp8 bytes and the 4 scale bytes of one indexer-K token (SPEC 1.3)."""
    from oracles.formats import indexer_k_token_spans

    _, base = storage_bytes(cache)
    offs, soff = indexer_k_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)), layout)
    return [base + o for o in offs] + list(range(base + soff, base + soff + 4))


def indexer_row_problems(codes: torch.Tensor, word: torch.Tensor, exact: torch.Tensor, tol: torch.Tensor, *,
                         flavour: str, limit: int = 3) -> list[tuple[str, str, str]]:
    """Does an indexer-K token (128 e4m3 ``codes`` of ``flavour``, fp32 scale ``word`` as 4 bytes) hold the head-128
    compressor's row ``exact`` (float64 [128]; ``tol`` its fp32 bound, ``oracles.indexer_writer.token_reference``)
    up to the writer's rounding (SPEC 4 "Indexer variant": one fp8 block with the power-of-two scale
    2^ceil(log2(max(amax, 1e-4) / DIV)), DIV 448 OCP / 224 FNUZ)? The scale must lie between those of the amax at
    -tol and +tol (bf16 rounding included), every value fp8(code) * scale within tol + 2^-8 (|x| + tol) + half an
    e4m3 step at that scale (+ any saturation excess) of x. Identifies the row; ``indexer-writer-exact`` judges the
    bytes."""
    x = exact.to(torch.float64)
    t = tol.to(torch.float64).expand_as(x)
    if not bool(torch.isfinite(x).all() & torch.isfinite(t).all()):
        return []  # a non-finite row is the writer contracts' business
    out: list[tuple[str, str, str]] = []
    div, fmax = INDEXER_DIV[flavour], FP8_MAX[flavour]
    scale = float(word.clone().view(torch.float32)[0])
    lo = float(torch.clamp(x.abs() - t, min=0).max()) * (1 - U_BF16)
    hi = float((x.abs() + t).max()) * (1 + U_BF16)
    s_lo, s_hi = _pow2_at_least(max(lo, AMAX_FLOOR) / div), _pow2_at_least(max(hi, AMAX_FLOOR) / div)
    if not s_lo <= scale <= s_hi:
        return [("scale", f"{s_lo!r}..{s_hi!r}", repr(scale))]
    v_hi = (x.abs() + t) * (1 + U_BF16) / scale
    bound = t + U_BF16 * (x.abs() + t) + (_e4m3_half_step(v_hi, flavour) + torch.clamp(v_hi - fmax, min=0)) * scale
    got = fp8_decode(codes, flavour) * scale
    bad = ~((got - x).abs() <= bound * 1.01 + 2.0 ** -140)
    for d in bad.nonzero().flatten().tolist()[:limit]:
        out.append((f"lane {d}", f"{float(x[d])!r} +- {float(bound[d]):.3g}", repr(float(got[d]))))
    return out
