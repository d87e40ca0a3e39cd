"""Reference for the DSv4 compressor writer (SPEC 4 steps 1-6), its error model, and the end-to-end byte comparison.

Inputs are those of ``impl.compressor.compress_norm_rope_store`` (its docstring defines the state-row addressing,
the cos/sin table and APE, all [inferred]). Three parts:

* ``compressor_reference``: for every writing token, the fp32 row the kernel quantizes (normed NoPE before bf16
  rounding, rotated RoPE before bf16 rounding), computed by mirroring the kernel's fp32 steps with a plain two-pass
  softmax per dimension, and a per-element tolerance from a float64 evaluation (``error_bound`` documents the model).
* Stage 2 lives in :mod:`oracles.cache_writers` (``quantize_pack_row``): bytes from an fp32 row, exact.
* ``classify_token_bytes``: end-to-end bytes (oracle row vs kernel row) may differ only where the two fp32 values
  straddle a rounding boundary and the two results are neighbours; such bytes are counted, anything else is returned
  as unexplained.
"""
from __future__ import annotations

import math

import torch

from oracles.cache_writers import AMAX_FLOOR, FP8_MAX, quantize_pack_row

U32 = 2.0 ** -24  # fp32 unit roundoff
FLT_MAX = float(torch.finfo(torch.float32).max)
TINY = 2.0 ** -148  # a couple of fp32 subnormal quanta: absolute error floor of products that underflow
#: |x| below this keeps every reader product finite: bf16(x) then e4m3 rounding stays below 2^128
DECODE_SAFE = 1.84 * 2.0 ** 127


def window_rows(ratio: int) -> int:
    return 2 * ratio if ratio == 4 else ratio


def gather_window(state: torch.Tensor, block_table: torch.Tensor, req: int, pos: int, ratio: int):
    """kv, score ``[R, 512]`` float32 and ``valid [R]`` for the window of a token (positions pos-R+1 .. pos)."""
    R = window_rows(ratio)
    coff = 2 if ratio == 4 else 1
    sbs = state.shape[1]
    kv = torch.zeros(R, 512, dtype=torch.float32)
    sc = torch.full((R, 512), float("-inf"), dtype=torch.float32)
    valid = torch.zeros(R, dtype=torch.bool)
    st = state.detach().cpu()
    table = block_table.detach().cpu()
    for i in range(R):
        p = pos - R + 1 + i
        if p < 0:
            continue
        row = st[int(table[req, p // sbs]), p % sbs]
        h = 512 if (ratio == 4 and i >= ratio) else 0
        kv[i] = row[h:h + 512]
        sc[i] = row[coff * 512 + h:coff * 512 + h + 512]
        valid[i] = True
    return kv, sc, valid


def _softmax_pool(kv: torch.Tensor, sc: torch.Tensor, dtype: torch.dtype):
    """Per-dimension softmax pooling in ``dtype`` with the writer's rules: the max ignores NaN, a -inf score weighs 0
    (kv * 0, so a non-finite kv there gives NaN), NaN or +inf scores give NaN, an all -inf dimension gives 0/0 = NaN,
    and a +-inf kv in a row whose score is not -inf adds +-inf whatever exp(score - max) rounds to: its exact weight
    is positive, and whether the fp32 weight underflows to 0 depends on the max it is taken against (global here,
    running or per split in the writers), so kv * weight would make the NaN mask a matter of summation order.
    Returns (pooled, max, weights)."""
    kv, sc = kv.to(dtype), sc.to(dtype)
    m = torch.where(torch.isnan(sc), torch.full_like(sc, float("-inf")), sc).max(dim=0).values
    e = torch.where(sc == float("-inf"), torch.zeros_like(sc), torch.exp(sc - m))
    s = e.sum(dim=0)
    kv_e = torch.where((sc != float("-inf")) & torch.isinf(kv), kv, kv * e)
    return kv_e.sum(dim=0) / s, m, e / s


def _rope(normed: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    ev, od = normed[448::2], normed[449::2]
    out = torch.empty(64, dtype=normed.dtype)
    out[0::2] = ev * cos - od * sin
    out[1::2] = od * cos + ev * sin
    return out


def error_bound(kv: torch.Tensor, sc: torch.Tensor, w: torch.Tensor, eps: float, R: int):
    """Pooling and norm parts of the per-element bound E on |fp32 result - exact result| for any summation order the writers use ([512] float64;
    inf where the exact computation is not finite, so only the exact NaN/inf masks decide there).

    Model (u = 2^-24; exp, rsqrt and division within 4u plus argument rounding, as on the interpreter, NVIDIA and AMD):
      pooling   row i's weight carries a relative error k_id <= (R + 4 (R/8 + 16) + 8 + 2 |s_id - m_d|) u: its exp
                (4u, plus the rounded argument, |s_id - m_run| u <= |s_id - m_d| u), at most R/8 + 16 online or split
                rescales by exp(m_old - m_new) (4u each, plus arguments summing to at most m_d - s_id), and the R-term
                sums (R u, worst case). With p the exact weights:
                |dc_d| <= sum_i (|kv_id| + |c_d|) p_id k_id + R * 2^-148 * sum_i |kv_id|;
      RMSNorm   dms <= (sum_d 2|c_d| dc_d + dc_d^2 + 514u * c_d^2) / 512, rel_r = dms / (2(ms + eps)) + 4u,
                |dn_d| <= |w_d| r ((1 + rel_r) dc_d + |c_d| rel_r) + 3u |n_d| + 2^-148;
      RoPE      |dy| <= |cos| |dn_e| + |sin| |dn_o| + 3u (|n_e cos| + |n_o sin|) + 2^-148.
    Two fp32 results (kernel vs oracle, or two-stage vs single pass) may then differ by 2E. ``w`` are the exact
    softmax weights; returns (c, dc, ms, dms, rel_r, r) in float64; the norm and RoPE parts are finished by the
    caller (``_norm_bound``, ``token_reference``)."""
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
    ms = (c * c).sum() / 512
    dms = (2 * c.abs() * dc + dc * dc + 514 * U32 * c * c).sum() / 512
    denom = ms + eps
    rel_r = dms / (2 * denom) + 4 * U32 if denom > 0 else torch.tensor(float("inf"), dtype=torch.float64)
    r = 1.0 / math.sqrt(denom) if denom > 0 else float("inf")
    return c, dc, ms, dms, rel_r, r


def _norm_bound(c, dc, rel_r, r, w64):
    n = c * r * w64
    dn = w64.abs() * r * ((1 + rel_r) * dc + c.abs() * rel_r) + 3 * U32 * n.abs() + TINY
    return n, dn


def token_reference(state, block_table, req: int, pos: int, norm_weight, cos_sin_cache, *, ratio: int, eps: float):
    """One writing token: {'row': fp32 [512] (kernel-mirroring), 'tol': float64 [512] (2E), 'exact': float64 [512],
    'finite_inputs': bool, 'overflow_free': bool (see ``is_overflow_free``)}."""
    R = window_rows(ratio)
    kv, sc, valid = gather_window(state, block_table, req, pos, ratio)
    w32 = norm_weight.detach().cpu().to(torch.float32)
    rp = (pos // ratio) * ratio
    cs = cos_sin_cache.detach().cpu()[rp].to(torch.float32)
    cos, sin = cs[:32], cs[32:]

    # fp32 mirror of the kernel's steps
    c32, _, _ = _softmax_pool(kv, sc, torch.float32)
    ms32 = (c32 * c32).sum() / 512
    r32 = torch.rsqrt(ms32 + torch.tensor(eps, dtype=torch.float32))
    n32 = c32 * r32 * w32
    row = torch.cat([n32[:448], _rope(n32, cos, sin)])

    # float64 "exact" values and the error model
    _, _, p64 = _softmax_pool(kv, sc, torch.float64)
    c64, dc, ms64, dms, rel_r, r64 = error_bound(kv, sc, p64, eps, R)
    w64 = w32.to(torch.float64)
    n64, dn = _norm_bound(c64, dc, rel_r, r64, w64)
    cos64, sin64 = cos.to(torch.float64), sin.to(torch.float64)
    y64 = _rope(n64, cos64, sin64)
    dy = torch.empty(64, dtype=torch.float64)
    dne, dno = dn[448::2], dn[449::2]
    ne, no = n64[448::2], n64[449::2]
    dy[0::2] = cos64.abs() * dne + sin64.abs() * dno + 3 * U32 * ((ne * cos64).abs() + (no * sin64).abs()) + TINY
    dy[1::2] = cos64.abs() * dno + sin64.abs() * dne + 3 * U32 * ((no * cos64).abs() + (ne * sin64).abs()) + TINY
    exact = torch.cat([n64[:448], y64])
    tol = 2 * torch.cat([dn[:448], dy])
    tol = torch.where(torch.isnan(tol), torch.full_like(tol, float("inf")), tol)

    live_kv = kv[valid]
    finite_inputs = bool(torch.isfinite(live_kv).all() and torch.isfinite(sc[valid]).all()
                         and torch.isfinite(w32).all() and torch.isfinite(cs).all())
    overflow_free = finite_inputs and is_overflow_free(kv[valid], c64, ms64, eps, n64, cos64, sin64)
    return {"row": row, "tol": tol, "exact": exact, "finite_inputs": finite_inputs, "overflow_free": overflow_free}


def is_overflow_free(kv_live, c64, ms64, eps, n64, cos64, sin64) -> bool:
    """The precondition of ``nan-free-cache`` on a non-sanitizing target: with finite inputs, no fp32 step of any
    summation order can overflow and every value a reader reconstructs is finite. Checked on float64 values:
    sum_i |kv_i| <= FLT_MAX/4 (bounds every partial sum of an online or split softmax), sum c^2 <= FLT_MAX/4,
    ms + eps > 0, and every normed NoPE value and every RoPE product sum below DECODE_SAFE (bf16 and e4m3 rounding
    then cannot reach 2^128)."""
    if float(kv_live.to(torch.float64).abs().sum(0).max()) > FLT_MAX / 4 if kv_live.numel() else False:
        return False
    if float((c64 * c64).sum()) > FLT_MAX / 4 or not float(ms64) + eps > 0:
        return False
    if float(n64.abs().max()) > DECODE_SAFE:
        return False
    ne, no = n64[448::2].abs(), n64[449::2].abs()
    rope_mag = torch.maximum(ne * cos64.abs() + no * sin64.abs(), no * cos64.abs() + ne * sin64.abs())
    return float(rope_mag.max()) <= DECODE_SAFE


def compressor_reference(state, state_block_table, token_to_req, positions, slot_mapping, norm_weight,
                         cos_sin_cache, *, ratio: int, eps: float) -> list[dict]:
    """Every token that writes (slot >= 0 and (pos + 1) % ratio == 0), in token order, with its slot and
    :func:`token_reference` fields."""
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


# --- stage 1: fp32 rows within tolerance, masks exact -------------------------------------------------------------

def compare_rows(got: torch.Tensor, expected: torch.Tensor, tol: torch.Tensor, limit: int = 4) -> list[tuple]:
    """(index, expected, got, tol) for every element whose NaN/inf mask differs or whose finite values differ by
    more than ``tol``."""
    g, e = got.to(torch.float64), expected.to(torch.float64)
    nan_diff = torch.isnan(g) != torch.isnan(e)
    inf_diff = (torch.isinf(g) | torch.isinf(e)) & ~(g == e) & ~(torch.isnan(g) | torch.isnan(e))
    both = torch.isfinite(g) & torch.isfinite(e)
    far = both & ((g - e).abs() > tol)
    bad = (nan_diff | inf_diff | far).nonzero().flatten().tolist()
    return [(i, float(e[i]), float(g[i]), float(tol[i])) for i in bad[:limit]] + (
        [("more", len(bad) - limit)] if len(bad) > limit else [])


# --- end-to-end classification --------------------------------------------------------------------------------------

def _fp8_key(code: int) -> int:
    mag = code & 0x7F
    return -mag if code & 0x80 else mag


def _fp8_value(code: int) -> float:
    e, m = (code >> 3) & 0xF, code & 7
    mag = math.ldexp(m / 8.0, -6) if e == 0 else math.ldexp(1 + m / 8.0, e - 7)
    return -mag if code & 0x80 else mag


def _bf16_key(bits: int) -> int:
    mag = bits & 0x7FFF
    return -mag if bits & 0x8000 else mag


def _bf16_value(bits: int) -> float:
    return float(torch.tensor([bits << 16], dtype=torch.int64).to(torch.int32).view(torch.float32))


def _straddles(a: float, b: float, mid: float) -> bool:
    return min(a, b) <= mid <= max(a, b)


def _neighbour_values(key_a, key_b, val_a, val_b, x_a, x_b) -> bool:
    """Two stored values are neighbours on their grid and the rounding boundary between them lies between the two
    unrounded values (for +0/-0: the unrounded values have opposite signs)."""
    if key_a == key_b:  # +0 and -0
        return math.copysign(1.0, x_a) != math.copysign(1.0, x_b)
    if abs(key_a - key_b) != 1:
        return False
    return _straddles(x_a, x_b, (val_a + val_b) / 2)


def _bf16_round(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).to(torch.bfloat16).to(torch.float32)


def classify_token_bytes(got: dict, want: dict, got_row: torch.Tensor, want_row: torch.Tensor, *,
                         sanitize: bool) -> tuple[int, list[str]]:
    """Compare one token's bytes end to end (``got`` from the kernel's cache, ``want`` packed from the oracle's row).

    A differing byte is a *boundary* byte when its two fp32 sources straddle a rounding boundary of the step that
    produced it and the two stored values are neighbours: a scale code off by one with the two group maxima on either
    side of 448 * 2^e (then the group's fp8 bytes follow it); an e4m3 byte one step apart with the midpoint between
    the two scaled bf16 values; a bf16 RoPE lane one step apart with the midpoint between the two fp32 values. NaN
    RoPE lanes count as equal whatever their payload. Returns (boundary bytes, descriptions of every other
    difference)."""
    boundary, bad = 0, []
    if got["pad"] != 0 or want["pad"] != 0:
        bad.append(f"pad byte {got['pad']} (want 0)")
    xg = _bf16_round(got_row[:448])
    xw = _bf16_round(want_row[:448])
    if sanitize:
        xg = torch.where(torch.isfinite(xg), xg, torch.zeros_like(xg))
        xw = torch.where(torch.isfinite(xw), xw, torch.zeros_like(xw))
    gs, ws = got["scale"].tolist(), want["scale"].tolist()
    gn, wn = got["nope"].tolist(), want["nope"].tolist()
    for g in range(7):
        sl = slice(64 * g, 64 * g + 64)
        diff_bytes = [j for j in range(64 * g, 64 * g + 64) if gn[j] != wn[j]]
        if gs[g] != ws[g]:
            ag = max(float(xg[sl].abs().max()), AMAX_FLOOR)
            aw = max(float(xw[sl].abs().max()), AMAX_FLOOR)
            edge = FP8_MAX["ocp"] * math.ldexp(1.0, min(gs[g], ws[g]) - 127)
            if abs(gs[g] - ws[g]) == 1 and min(ag, aw) <= edge < max(ag, aw):
                boundary += 1 + len(diff_bytes)
            else:
                bad.append(f"scale code of group {g}: {gs[g]} vs {ws[g]} (group maxima {ag:.9g} / {aw:.9g})")
            continue
        e = gs[g] - 127
        for j in diff_bytes:
            ag, aw = float(xg[j]) * math.ldexp(1.0, -e), float(xw[j]) * math.ldexp(1.0, -e)
            if _neighbour_values(_fp8_key(gn[j]), _fp8_key(wn[j]), _fp8_value(gn[j]), _fp8_value(wn[j]), ag, aw):
                boundary += 1
            else:
                bad.append(f"nope byte {j}: {gn[j]:#04x} vs {wn[j]:#04x} (scaled {ag:.9g} / {aw:.9g})")
    gr = got["rope"].view(torch.int16).tolist()
    wr = want["rope"].view(torch.int16).tolist()
    for i in range(64):
        a, b = gr[i] & 0xFFFF, wr[i] & 0xFFFF
        if a == b:
            continue
        va, vb = _bf16_value(a), _bf16_value(b)
        if math.isnan(va) and math.isnan(vb):
            continue
        xa, xb = float(got_row[448 + i]), float(want_row[448 + i])
        if _neighbour_values(_bf16_key(a), _bf16_key(b), va, vb, xa, xb):
            boundary += 2
        else:
            bad.append(f"rope lane {i}: bf16 {a:#06x} vs {b:#06x} (fp32 {xa:.9g} / {xb:.9g})")
    return boundary, bad


def pack_reference_row(row: torch.Tensor, *, cap: int, sanitize: bool) -> dict:
    """Stage 2: the bytes the extra cache must hold for a given fp32 row (OCP on every target)."""
    return quantize_pack_row(row, flavour="ocp", cap=cap, sanitize=sanitize, rope_from_fp32=True)
