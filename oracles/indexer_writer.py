"""Reference for the indexer-K writers (SPEC 1.3, 4 "Indexer variant"): the direct writer and the head-128
compressor, their error model, and the end-to-end byte comparison.

Written from SPEC.md and the rules ``impl/indexer_writer.py``'s docstring states for what SPEC leaves open; nothing
from ``impl`` but the layout constants of ``impl.formats``. Bytes are placed by absolute storage offsets
(``oracles.formats.indexer_k_token_spans``; the MXFP4 record is re-derived here), fp8 codes come from the brute-force
encoder of ``oracles.formats``, E2M1 codes from a nearest-even search over its eight magnitudes, powers of two from
``math.frexp``.

* Quantization (stage 2, byte-exact): :func:`quantize_fp8_row` (one block of 128, fp32 scale, optionally a power
  of two), :func:`quantize_mxfp4_row` (four blocks of 32, UE8M0 codes); rules:
    fp8:   amax over the non-NaN values; scale = fp32(max(amax, fp32(1e-4)) / DIV), DIV 448 (OCP) / 224 (FNUZ);
           POW2: 2^ceil(log2(scale)); q = fp32(x / scale); byte = e4m3(q), nearest-even, saturating;
    mxfp4: amax over the block's non-NaN values, floored at 6 * 2^-126; e = clamp(ceil(log2(fp32(amax / 6))),
           -127, 127); nibble = E2M1(x * 2^-e) (nearest-even, saturating at 6, sign kept); a NaN block: code 255,
           zero nibbles.
* Direct writer: :func:`direct_reference`, the whole expected storage after a call.
* Compressor (stage 1): :func:`compressor_reference`, per writing token the fp32 row the kernel quantizes, computed by
  mirroring its fp32 steps (two-pass softmax per dimension, RMSNorm over 128, RoPE on dims 64..127), and a float64
  tolerance from the head-512 compressor's error model (``oracles.compressor.error_bound``'s, with 128 dims).
* End to end (stage 3): :func:`classify_fp8_token` / :func:`classify_mxfp4_token`: a byte may differ only where the
  two fp32 sources straddle a rounding boundary and the stored values are neighbours; counted.
"""
from __future__ import annotations

import math

import torch

from impl.formats import INDEXER_HEAD_DIM, INDEXER_TOKEN_BYTES
from oracles.compressor import TINY, U32, _norm_bound, _softmax_pool
from oracles.formats import fp8_is_nan_code, fp8_value, indexer_k_token_spans, storage_bytes

HEAD = INDEXER_HEAD_DIM
NOPE = 64
ROPE = 64
DIV = {"ocp": 448.0, "fnuz": 224.0}
AMAX_FLOOR = float(torch.tensor(1e-4, dtype=torch.float32))
MXFP4_FLOOR = 6.0 * 2.0 ** -126
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
MXFP4_TOKEN_BYTES = 68


def f32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def ceil_log2(v: float) -> int:
    m, e = math.frexp(v)
    return e - 1 if m == 0.5 else e


def pow2_at_least(s: float) -> float:
    """2^ceil(log2(s)) (+inf stays +inf)."""
    return s if math.isinf(s) else math.ldexp(1.0, ceil_log2(s))


def bf16_round(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float32)


_FP8_MAX = {"ocp": 448.0, "fnuz": 240.0}
_FP8_TABLES: dict = {}


def _fp8_table(flavour: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(values, codes) of the non-negative finite e4m3 codes of a flavour (``oracles.formats.fp8_value``)."""
    if flavour not in _FP8_TABLES:
        pairs = [(fp8_value(c, flavour), c) for c in range(0x80)]
        pairs = [(v, c) for v, c in pairs if not math.isnan(v) and v <= _FP8_MAX[flavour]]
        _FP8_TABLES[flavour] = (torch.tensor([v for v, _ in pairs], dtype=torch.float64),
                                torch.tensor([c for _, c in pairs], dtype=torch.int64))
    return _FP8_TABLES[flavour]


def fp8_encode(x: torch.Tensor, flavour: str) -> torch.Tensor:
    """e4m3 codes of fp32 values by a search over every representable magnitude: the nearest one (ties to the even
    code), saturating at the flavour's max, NaN -> the NaN code, the sign bit for negative values (-0 included) except
    FNUZ's zero (FNUZ has no -0). The same rule as ``oracles.formats.fp8_encode_scalar``, vectorized."""
    vals, codes = _fp8_table(flavour)
    v = x.to(torch.float32).to(torch.float64).flatten()
    a = v.abs().clamp(max=_FP8_MAX[flavour])
    d = (a[:, None] - vals[None, :]).abs()
    best = d.min(dim=1, keepdim=True).values
    tie = d == best
    even = tie & (codes[None, :] % 2 == 0)
    pick = torch.where(even.any(dim=1, keepdim=True), even, tie)
    code = codes[pick.int().argmax(dim=1)]
    neg = torch.signbit(v)
    if flavour == "fnuz":
        code = torch.where(neg & (code != 0), code | 0x80, code)
    else:
        code = torch.where(neg, code | 0x80, code)
    code = torch.where(torch.isnan(v), torch.full_like(code, 0x80 if flavour == "fnuz" else 0x7F), code)
    return code.to(torch.uint8).reshape(x.shape)


# --- stage 2: quantization --------------------------------------------------------------------------------------

def fp8_scale(values: torch.Tensor, flavour: str, pow2: bool) -> float:
    """The fp32 scale of one fp8 block of fp32 ``values``."""
    v = values.to(torch.float64)
    finite_or_inf = v[~torch.isnan(v)]
    amax = float(finite_or_inf.abs().max()) if finite_or_inf.numel() else 0.0
    scale = f32(max(amax, AMAX_FLOOR) / DIV[flavour])  # one rounding: an fp32 division of two fp32 values
    return pow2_at_least(scale) if pow2 else scale


def quantize_fp8_row(values: torch.Tensor, flavour: str, pow2: bool) -> tuple[torch.Tensor, float]:
    """(128 e4m3 codes uint8, fp32 scale) of one row of fp32 values."""
    x = values.to(torch.float32)
    scale = fp8_scale(x, flavour, pow2)
    q = x / torch.tensor(scale, dtype=torch.float32)  # fp32, correctly rounded
    return fp8_encode(q, flavour), scale


def scale_word_bytes(scale: float, mx_scale: bool) -> torch.Tensor:
    """The 4 stored bytes of a token's scale: fp32 little-endian, or (``mx_scale``) its exponent byte four times."""
    b = torch.tensor([scale], dtype=torch.float32).view(torch.uint8).clone()
    if mx_scale:
        code = (int(torch.tensor([scale], dtype=torch.float32).view(torch.int32)) >> 23) & 0xFF
        b = torch.full((4,), code, dtype=torch.uint8)
    return b


def e2m1_code(x: float) -> int:
    """Nearest E2M1 magnitude (ties to the even code), saturating at 6, sign bit 8 kept (-0 included)."""
    a = min(abs(x), 6.0)
    best, best_d = 0, None
    for c, v in enumerate(E2M1_VALUES):
        d = abs(v - a)
        if best_d is None or d < best_d or (d == best_d and c % 2 == 0 and best % 2 == 1):
            best, best_d = c, d
    return best | 8 if math.copysign(1.0, x) < 0 else best


def mxfp4_block_exponent(block: list[float]) -> int | None:
    """e of one block of fp32 values, None when it holds a NaN."""
    if any(math.isnan(v) for v in block):
        return None
    amax = max(max(abs(v) for v in block), MXFP4_FLOOR)
    ratio = f32(amax / 6.0)
    return 127 if math.isinf(ratio) else max(-127, min(127, ceil_log2(ratio)))


def quantize_mxfp4_row(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(64 packed bytes, 4 UE8M0 codes) of one row of fp32 values (block b = elements 32b..32b+31; byte p holds
    element 2p in its low nibble, 2p+1 in its high one)."""
    vals = values.to(torch.float32).tolist()
    nibbles, codes = [], []
    for b in range(4):
        blk = vals[32 * b:32 * b + 32]
        e = mxfp4_block_exponent(blk)
        if e is None:
            nibbles += [0] * 32
            codes.append(255)
            continue
        codes.append(e + 127)
        for v in blk:
            nibbles.append(e2m1_code(f32(v * math.ldexp(1.0, -e)) if math.isfinite(v) else v))
    data = [nibbles[2 * p] | (nibbles[2 * p + 1] << 4) for p in range(64)]
    return torch.tensor(data, dtype=torch.uint8), torch.tensor(codes, dtype=torch.uint8)


# --- byte placement -----------------------------------------------------------------------------------------------

def mxfp4_token_spans(slot: int, block_size: int, block_stride: int) -> tuple[int, int]:
    """Offsets (relative to the view) of a token's 64 packed bytes and of its 4 UE8M0 codes: block b = slot // bs,
    pos = slot % bs; data at b*stride + pos*64, codes at b*stride + bs*64 + pos*4."""
    block, pos = divmod(slot, block_size)
    base = block * block_stride
    return base + pos * 64, base + block_size * 64 + pos * 4


def place_fp8_token(flat: torch.Tensor, base: int, cache: torch.Tensor, slot: int, layout: str, codes, word) -> None:
    offs, so = indexer_k_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)), layout)
    flat[torch.tensor(offs) + base] = codes.to(torch.uint8)
    flat[base + so:base + so + 4] = word


def place_mxfp4_token(flat: torch.Tensor, base: int, cache: torch.Tensor, slot: int, data, codes) -> None:
    d, s = mxfp4_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    flat[base + d:base + d + 64] = data
    flat[base + s:base + s + 4] = codes


def read_fp8_token(flat: torch.Tensor, base: int, cache: torch.Tensor, slot: int, layout: str) -> dict:
    offs, so = indexer_k_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)), layout)
    return {"codes": flat[torch.tensor(offs) + base].clone(), "word": flat[base + so:base + so + 4].clone()}


def read_mxfp4_token(flat: torch.Tensor, base: int, cache: torch.Tensor, slot: int) -> dict:
    d, s = mxfp4_token_spans(slot, int(cache.shape[1]), int(cache.stride(0)))
    return {"data": flat[base + d:base + d + 64].clone(), "codes": flat[base + s:base + s + 4].clone()}


# --- direct writer --------------------------------------------------------------------------------------------------

def direct_reference(k: torch.Tensor, slot_mapping: list[int], cache: torch.Tensor, before: torch.Tensor, *,
                     flavour: str, scale_fmt: "str | None", layout: str) -> torch.Tensor:
    """The whole expected storage of ``cache`` after the direct writer: ``before`` with every token whose slot is
    >= 0 quantized (one fp8 block, ``scale_fmt == "ue8m0"``: power-of-two scale) and placed at its slot."""
    _, base = storage_bytes(cache)
    want = before.clone()
    rows = k.detach().cpu().to(torch.float32)
    for t, slot in enumerate(slot_mapping):
        if slot < 0:
            continue
        codes, scale = quantize_fp8_row(rows[t], flavour, scale_fmt == "ue8m0")
        place_fp8_token(want, base, cache, slot, layout, codes, scale_word_bytes(scale, False))
    return want


# --- compressor, stage 1 ------------------------------------------------------------------------------------------

def window_rows(ratio: int) -> int:
    return 2 * ratio if ratio == 4 else ratio


def gather_window(state: torch.Tensor, block_table: torch.Tensor, req: int, pos: int, ratio: int):
    """kv, score ``[R, 128]`` float32 and ``valid [R]`` for the window of a token (positions pos-R+1 .. pos): row i
    reads kv at ``[h, h+128)`` and score at ``coff*128 + [h, h+128)`` of its state row, h = 128 for i >= ratio
    (ratio 4, the overlapping half)."""
    R = window_rows(ratio)
    coff = 2 if ratio == 4 else 1
    sbs = state.shape[1]
    kv = torch.zeros(R, HEAD, dtype=torch.float32)
    sc = torch.full((R, HEAD), float("-inf"), dtype=torch.float32)
    valid = torch.zeros(R, dtype=torch.bool)
    st = state.detach().cpu()
    table = block_table.detach().cpu()
    for i in range(R):
        p = pos - R + 1 + i
        if p < 0:
            continue
        row = st[int(table[req, p // sbs]), p % sbs]
        h = HEAD if (ratio == 4 and i >= ratio) else 0
        kv[i] = row[h:h + HEAD]
        sc[i] = row[coff * HEAD + h:coff * HEAD + h + HEAD]
        valid[i] = True
    return kv, sc, valid


def _rope(normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Dims 0..63 as they are, pairs (64+2j, 65+2j) rotated by (cos_j, sin_j) (GPT-J)."""
    out = normed.clone()
    ev, od = normed[NOPE::2], normed[NOPE + 1::2]
    out[NOPE::2] = ev * cos - od * sin
    out[NOPE + 1::2] = od * cos + ev * sin
    return out


def _error_bound(kv, sc, w, eps, R):
    """``oracles.compressor.error_bound``'s pooling and norm model over 128 dims (u = 2^-24; see there):
    |dc_d| <= sum_i (|kv_id| + |c_d|) p_id k_id + R 2^-148 sum_i |kv_id|, k_id = (R + 4 (R/8 + 16) + 8 +
    2 |s_id - m_d|) u; dms <= (sum_d 2 |c_d| dc_d + dc_d^2 + (HEAD + 2) u c_d^2) / HEAD, rel_r = dms / (2 (ms + eps))
    + 4u. Returns (c, dc, ms, rel_r, r) in float64."""
    kv64, sc64, w64 = kv.to(torch.float64), sc.to(torch.float64), w.to(torch.float64)
    live = sc64 > float("-inf")
    bad = (~torch.isfinite(kv64) & live) | torch.isnan(sc64) | (sc64 == float("inf"))
    dim_bad = bad.any(dim=0) | ~live.any(dim=0)
    sc_f = torch.where(live & ~bad, sc64, torch.zeros_like(sc64))
    kv_f = torch.where(live & ~bad, kv64, torch.zeros_like(kv64))
    m = torch.where(live, sc64, torch.full_like(sc64, float("-inf"))).max(dim=0).values
    m_f = torch.where(dim_bad, torch.zeros_like(m), m)
    p = torch.where(live & ~bad, w64, torch.zeros_like(w64))
    c = (kv_f * p).sum(0)
    kappa = (R + 4 * (R // 8 + 16) + 8 + 2 * (sc_f - m_f).abs()) * U32
    dc = ((kv_f.abs() + c.abs()) * p * kappa).sum(0) + R * TINY * kv_f.abs().sum(0)
    dc = torch.where(dim_bad, torch.full_like(dc, float("inf")), dc)
    ms = (c * c).sum() / HEAD
    dms = (2 * c.abs() * dc + dc * dc + (HEAD + 2) * U32 * c * c).sum() / HEAD
    denom = float(ms) + eps
    rel_r = dms / (2 * denom) + 4 * U32 if denom > 0 else torch.tensor(float("inf"), dtype=torch.float64)
    r = 1.0 / math.sqrt(denom) if denom > 0 else float("inf")
    return c, dc, ms, rel_r, r


def token_reference(state, block_table, req: int, pos: int, norm_weight, cos_sin_cache, *, ratio: int,
                    eps: float) -> dict:
    """One writing token: {'row': fp32 [128] (kernel-mirroring), 'tol': float64 [128] (twice the bound), 'exact':
    float64 [128], 'inf_kv_underflow': bool (a +-inf kv of a live row whose fp32 weight underflows to 0)}."""
    R = window_rows(ratio)
    kv, sc, _ = gather_window(state, block_table, req, pos, ratio)
    w32 = norm_weight.detach().cpu().to(torch.float32)
    cs = cos_sin_cache.detach().cpu()[(pos // ratio) * ratio].to(torch.float32)
    cos, sin = cs[:32], cs[32:]

    c32, m32, _ = _softmax_pool(kv, sc, torch.float32)
    ms32 = (c32 * c32).sum() / HEAD
    r32 = torch.rsqrt(ms32 + torch.tensor(eps, dtype=torch.float32))
    row = _rope(c32 * r32 * w32, cos, sin)

    _, _, p64 = _softmax_pool(kv, sc, torch.float64)
    c64, dc, _, rel_r, r64 = _error_bound(kv, sc, p64, eps, R)
    n64, dn = _norm_bound(c64, dc, rel_r, r64, w32.to(torch.float64))
    cos64, sin64 = cos.to(torch.float64), sin.to(torch.float64)
    exact = _rope(n64, cos64, sin64)
    tol = dn.clone()
    dne, dno = dn[NOPE::2], dn[NOPE + 1::2]
    ne, no = n64[NOPE::2], n64[NOPE + 1::2]
    tol[NOPE::2] = cos64.abs() * dne + sin64.abs() * dno + 3 * U32 * ((ne * cos64).abs() + (no * sin64).abs()) + TINY
    tol[NOPE + 1::2] = cos64.abs() * dno + sin64.abs() * dne + 3 * U32 * ((no * cos64).abs() + (ne * sin64).abs()) \
        + TINY
    tol = 2 * tol
    tol = torch.where(torch.isnan(tol), torch.full_like(tol, float("inf")), tol)
    live = torch.isfinite(sc) & torch.isinf(kv)
    underflow = bool((live & (torch.exp(sc - m32) == 0)).any())
    return {"row": row, "tol": tol, "exact": exact, "inf_kv_underflow": underflow}


def compressor_reference(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight,
                         cos_sin_cache, *, ratio: int, eps: float) -> list[dict]:
    """Every token that writes (slot >= 0 and (pos + 1) % ratio == 0), in token order, with 't', 'slot', 'pos' and
    the :func:`token_reference` fields."""
    pos = positions.detach().cpu().tolist()
    slots = slot_mapping.detach().cpu().tolist()
    reqs = token_to_req.detach().cpu().tolist()
    out = []
    for t, (p, s, r) in enumerate(zip(pos, slots, reqs)):
        if s < 0 or (p + 1) % ratio:
            continue
        ref = token_reference(state, state_block_table, int(r), int(p), norm_weight, cos_sin_cache, ratio=ratio,
                              eps=eps)
        ref.update(t=t, slot=int(s), pos=int(p))
        out.append(ref)
    return out


def pack_compressor_row(row: torch.Tensor, *, kv_format: str, flavour: str, mx_scale: bool) -> dict:
    """Stage 2: the bytes of one compressor token from its fp32 row (bf16-rounded first). fp8: {'codes', 'word'};
    mxfp4: {'data', 'codes'}."""
    xb = bf16_round(row)
    if kv_format == "mxfp4":
        data, codes = quantize_mxfp4_row(xb)
        return {"data": data, "codes": codes}
    codes, scale = quantize_fp8_row(xb, flavour, True)
    return {"codes": codes, "word": scale_word_bytes(scale, mx_scale)}


def place_compressor_token(flat, base, cache, slot, layout, kv_format, tok) -> None:
    if kv_format == "mxfp4":
        place_mxfp4_token(flat, base, cache, slot, tok["data"], tok["codes"])
    else:
        place_fp8_token(flat, base, cache, slot, layout, tok["codes"], tok["word"])


def compare_rows(got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor) -> list[tuple]:
    """(index, expected, got, tol) for every element whose NaN/inf mask differs or whose finite values differ by
    more than ``tol``."""
    g, e = got.to(torch.float64), expected.to(torch.float64)
    nan_diff = torch.isnan(g) != torch.isnan(e)
    inf_diff = (torch.isinf(g) | torch.isinf(e)) & ~(g == e) & ~(torch.isnan(g) | torch.isnan(e))
    far = torch.isfinite(g) & torch.isfinite(e) & ((g - e).abs() > tol)
    return [(i, float(e[i]), float(g[i]), float(tol[i])) for i in (nan_diff | inf_diff | far).nonzero().flatten().tolist()]


# --- stage 3: end-to-end classification -----------------------------------------------------------------------------

def _fp8_key(code: int, flavour: str) -> int:
    mag = code & 0x7F
    return -mag if code & 0x80 else mag


def _neighbours(key_a, key_b, val_a, val_b, x_a, x_b) -> bool:
    """Adjacent stored values whose rounding boundary lies between the two unrounded values (+0/-0: opposite
    signs)."""
    if key_a == key_b:
        return math.copysign(1.0, x_a) != math.copysign(1.0, x_b)
    if abs(key_a - key_b) != 1:
        return False
    mid = (val_a + val_b) / 2
    return min(x_a, x_b) <= mid <= max(x_a, x_b)


def _word_scale(word: torch.Tensor, mx_scale: bool) -> float:
    if mx_scale:
        return math.ldexp(1.0, int(word[0]) - 127)
    return float(word.clone().view(torch.float32)[0])


def classify_fp8_token(got: dict, want: dict, got_row, want_row, *, flavour: str, mx_scale: bool = False,
                       pow2: bool = True) -> tuple[int, list[str]]:
    """End-to-end bytes of one fp8 token (``got`` from the cache, ``want`` packed from the oracle's row): boundary
    bytes are a scale that moved one power of two with the two row maxima on either side of DIV * 2^e (then every
    code may follow), or a code one step from the other with the midpoint between the two scaled bf16 values.
    Returns (boundary bytes, descriptions of every other difference)."""
    bad, boundary = [], 0
    xg, xw = bf16_round(got_row), bf16_round(want_row)
    gc, wc = got["codes"].tolist(), want["codes"].tolist()
    diff = [j for j in range(HEAD) if gc[j] != wc[j]]
    if not torch.equal(got["word"], want["word"]):
        sg, sw = _word_scale(got["word"], mx_scale), _word_scale(want["word"], mx_scale)
        ag, aw = (max(float(v[~torch.isnan(v)].abs().max()) if bool((~torch.isnan(v)).any()) else 0.0, AMAX_FLOOR)
                  for v in (xg, xw))
        lo, hi = min(sg, sw), max(sg, sw)
        if pow2 and math.isfinite(hi) and hi == 2 * lo and min(ag, aw) <= DIV[flavour] * lo < max(ag, aw):
            return 4 + len(diff), []
        return 0, [f"scale: {sg!r} vs {sw!r} (row maxima {ag:.9g} / {aw:.9g})"]
    s = _word_scale(got["word"], mx_scale)
    for j in diff:
        if fp8_is_nan_code(gc[j], flavour) and fp8_is_nan_code(wc[j], flavour):
            continue  # OCP's two NaN codes are equal whatever the sign
        a, b = float(xg[j]) / s, float(xw[j]) / s
        if not (fp8_is_nan_code(gc[j], flavour) or fp8_is_nan_code(wc[j], flavour)) and _neighbours(
                _fp8_key(gc[j], flavour), _fp8_key(wc[j], flavour), fp8_value(gc[j], flavour),
                fp8_value(wc[j], flavour), a, b):
            boundary += 1
        else:
            bad.append(f"code of dim {j}: {gc[j]:#04x} vs {wc[j]:#04x} (scaled {a:.9g} / {b:.9g})")
    return boundary, bad


def _e2m1_value(n: int) -> float:
    v = E2M1_VALUES[n & 7]
    return -v if n & 8 else v


def classify_mxfp4_token(got: dict, want: dict, got_row, want_row) -> tuple[int, list[str]]:
    """As :func:`classify_fp8_token` for the four MXFP4 blocks: a code one apart with the two block maxima on either
    side of 6 * 2^e (every byte of the block may follow), or a nibble one step from the other with the midpoint
    between the two scaled values."""
    bad, boundary = [], 0
    xg, xw = bf16_round(got_row).tolist(), bf16_round(want_row).tolist()
    gd, wd = got["data"].tolist(), want["data"].tolist()
    gcs, wcs = got["codes"].tolist(), want["codes"].tolist()
    for b in range(4):
        diff = [p for p in range(16 * b, 16 * b + 16) if gd[p] != wd[p]]
        if gcs[b] != wcs[b]:
            eg, ew = mxfp4_block_exponent(xg[32 * b:32 * b + 32]), mxfp4_block_exponent(xw[32 * b:32 * b + 32])
            ag = max(max(abs(v) for v in xg[32 * b:32 * b + 32]), MXFP4_FLOOR)
            aw = max(max(abs(v) for v in xw[32 * b:32 * b + 32]), MXFP4_FLOOR)
            e = min(gcs[b], wcs[b]) - 127
            if eg is not None and ew is not None and abs(gcs[b] - wcs[b]) == 1 and \
                    min(ag, aw) <= 6.0 * math.ldexp(1.0, e) < max(ag, aw):
                boundary += 1 + len(diff)
            else:
                bad.append(f"code of block {b}: {gcs[b]} vs {wcs[b]} (block maxima {ag:.9g} / {aw:.9g})")
            continue
        if gcs[b] == 255:
            bad += [f"byte {p} of NaN block {b}: {gd[p]:#04x} vs {wd[p]:#04x}" for p in diff]
            continue
        mult = math.ldexp(1.0, 127 - gcs[b])
        for p in diff:
            for half in (0, 1):
                ng, nw = (gd[p] >> 4 * half) & 0xF, (wd[p] >> 4 * half) & 0xF
                if ng == nw:
                    continue
                i = 2 * p + half
                a, c = xg[i] * mult, xw[i] * mult
                if _neighbours((-1 if ng & 8 else 1) * (ng & 7), (-1 if nw & 8 else 1) * (nw & 7), _e2m1_value(ng),
                               _e2m1_value(nw), a, c):
                    boundary += 1
                else:
                    bad.append(f"nibble of dim {i}: {ng:#x} vs {nw:#x} (scaled {a:.9g} / {c:.9g})")
    return boundary, bad


def token_nonfinite(*rows: torch.Tensor) -> bool:
    """Whether any of the fp32 ``rows`` holds a non-finite value after bf16 rounding."""
    return any(not bool(torch.isfinite(bf16_round(r)).all()) for r in rows)


def mxfp4_nonfinite_blocks(*rows: torch.Tensor) -> set:
    out = set()
    for r in rows:
        bad = ~torch.isfinite(bf16_round(r))
        out |= {b for b in range(4) if bool(bad[32 * b:32 * b + 32].any())}
    return out


__all__ = ["direct_reference", "compressor_reference", "pack_compressor_row", "place_compressor_token",
           "classify_fp8_token", "classify_mxfp4_token", "compare_rows", "quantize_fp8_row", "quantize_mxfp4_row",
           "INDEXER_TOKEN_BYTES", "MXFP4_TOKEN_BYTES"]
