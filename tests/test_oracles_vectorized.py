"""The vectorized oracles equal the per-element versions they replaced, kept here as slow references.

Each rewrite (issue 15 item 5: a native audit spent its time in Python loops of the oracles) must compute the same
thing: codecs and byte readers bit for bit (every code, random caches, odd block sizes, views that start past their
pool's first blocks), the attention references with the same NaN/inf masks and values equal up to float64
summation order (every head at once sums in another order than one head at a time).
"""
from __future__ import annotations

import math
import struct

import pytest
import torch

from oracles import decode as odec
from oracles import formats as F
from oracles import indexer_logits as olog
from oracles import prefill as opre

# --- the replaced versions, verbatim in what they compute ---------------------------------------------------------


def old_fp8_decode(codes, flavour):
    table = torch.tensor([F.fp8_value(c, flavour) for c in range(256)], dtype=torch.float64)
    return table[codes.to(torch.int64)]


def old_ue8m0_decode(codes, *, reader=False):
    table = torch.tensor([F.ue8m0_value(c, reader=reader) for c in range(256)], dtype=torch.float64)
    return table[codes.to(torch.int64)]


def old_dequantize_rows(cache, slots, flavour, scrub):
    flat, base = F.storage_bytes(cache)
    flat = flat.cpu()
    bs, stride = int(cache.shape[1]), int(cache.stride(0))
    fp8_table = old_fp8_decode(torch.arange(256), flavour).to(torch.float32)
    scale_table = old_ue8m0_decode(torch.arange(256), reader=True).to(torch.float32)
    rows = torch.empty(len(slots), 512, dtype=torch.float32)
    for i, s in enumerate(slots):
        spans = F.fp8_ds_mla_token_spans(s, bs, stride)
        nope = flat[base + spans["nope"][0]: base + spans["nope"][1]].to(torch.int64)
        codes = flat[base + spans["scale"][0]: base + spans["scale"][1]].to(torch.int64)
        rope = flat[base + spans["rope"][0]: base + spans["rope"][1]].clone().view(torch.bfloat16)
        scl = scale_table[codes].repeat_interleave(64)
        rows[i, :448] = fp8_table[nope] * scl
        rows[i, 448:] = rope.to(torch.float32)
    if scrub:
        rows = torch.where(torch.isnan(rows), torch.zeros_like(rows), rows)
    return rows


def old_ref_sparse_attn_decode(q, main_cache, main_indices, main_indptr, extra_cache=None, extra_indices=None,
                               extra_indptr=None, *, attn_sink, softmax_scale, main_flavour, extra_flavour,
                               scrub_extra):
    b, h, width = q.shape
    q64 = q.detach().cpu().to(torch.float64)
    sink = (torch.full((h,), -math.inf, dtype=torch.float64) if attn_sink is None
            else attn_sink.detach().cpu().to(torch.float64)[:h])
    m_ip = main_indptr.cpu().to(torch.int64)
    main_slots = int(main_cache.shape[0]) * int(main_cache.shape[1])
    if extra_cache is not None:
        e_ip = extra_indptr.cpu().to(torch.int64)
        extra_slots = int(extra_cache.shape[0]) * int(extra_cache.shape[1])
    out = torch.zeros(b, h, 512, dtype=torch.float64)
    wabs = torch.zeros(b, h, 512, dtype=torch.float64)
    labs = torch.zeros(b, h, dtype=torch.float64)
    lmax = torch.zeros(b, h, dtype=torch.float64)
    tokens, max_abs_v = [], []
    for r in range(b):
        parts = [old_dequantize_rows(main_cache, odec.valid_slots(main_indices, m_ip, r, main_slots), main_flavour,
                                     True)]
        if extra_cache is not None:
            parts.append(old_dequantize_rows(extra_cache, odec.valid_slots(extra_indices, e_ip, r, extra_slots),
                                             extra_flavour, scrub_extra))
        kv = torch.cat(parts).to(torch.float64)
        n = kv.shape[0]
        tokens.append(n)
        fin_v = kv[torch.isfinite(kv)]
        max_abs_v.append(float(fin_v.abs().max()) if fin_v.numel() else 0.0)
        s = softmax_scale * (q64[r][:, None, :] * kv[None, :, :]).sum(-1)
        s_abs = softmax_scale * (q64[r].abs()[:, None, :] * kv.abs()[None, :, :]).sum(-1)
        finite_s = torch.isfinite(s)
        labs[r] = torch.where(finite_s, s_abs, torch.zeros_like(s_abs)).amax(-1) if n else 0.0
        cand = torch.cat([torch.where(finite_s, s.abs(), torch.zeros_like(s)),
                          torch.where(torch.isfinite(sink), sink.abs(), torch.zeros_like(sink))[:, None]], dim=1)
        lmax[r] = cand.amax(-1)
        m = torch.maximum(s.amax(-1), sink) if n else sink.clone()
        for hh in range(h):
            mh = float(m[hh])
            if mh == -math.inf:
                continue
            e = torch.exp(s[hh] - mh)
            l = float(e.sum()) + math.exp(float(sink[hh]) - mh) if not math.isnan(mh) else math.nan
            if l <= 0:
                continue
            o = (e[:, None] * kv).sum(0) / l
            p = e / l
            out[r, hh] = o
            wabs[r, hh] = (p[:, None] * kv.abs()).sum(0) if n else 0.0
            if math.isnan(l):
                out[r, hh] = math.nan
                wabs[r, hh] = math.nan
    return odec.DecodeReference(out, wabs, labs, lmax, tokens, max_abs_v)


def old_ref_sparse_attn_prefill(q, kv, *, softmax_scale, attn_sink, out_width, indices, indptr):
    sq, h, d = q.shape
    q64 = q.detach().cpu().to(torch.float64)
    kv64 = kv.detach().cpu().to(torch.float64).reshape(kv.shape[0], d)
    skv = kv64.shape[0]
    sink = (torch.full((h,), -math.inf, dtype=torch.float64) if attn_sink is None
            else attn_sink.detach().cpu().to(torch.float64)[:h])
    out = torch.zeros(sq, h, out_width, dtype=torch.float64)
    wabs = torch.zeros(sq, h, out_width, dtype=torch.float64)
    labs = torch.zeros(sq, h, dtype=torch.float64)
    lmax = torch.zeros(sq, h, dtype=torch.float64)
    vsum = torch.zeros(sq, out_width, dtype=torch.float64)
    tokens, max_abs_v = [], []
    for r in range(sq):
        rows = [int(s) for s in indices[indptr[r]:indptr[r + 1]] if 0 <= int(s) < skv]
        g = kv64[rows] if rows else torch.zeros(0, d, dtype=torch.float64)
        n = len(rows)
        tokens.append(n)
        fin = g[torch.isfinite(g)]
        max_abs_v.append(float(fin.abs().max()) if fin.numel() else 0.0)
        s = softmax_scale * (q64[r][:, None, :] * g[None, :, :]).sum(-1)
        s_abs = abs(softmax_scale) * (q64[r].abs()[:, None, :] * g.abs()[None, :, :]).sum(-1)
        finite_s = torch.isfinite(s)
        labs[r] = torch.where(finite_s, s_abs, torch.zeros_like(s_abs)).amax(-1) if n else 0.0
        cand = torch.cat([torch.where(finite_s, s.abs(), torch.zeros_like(s)),
                          torch.where(torch.isfinite(sink), sink.abs(), torch.zeros_like(sink))[:, None]], dim=1)
        lmax[r] = cand.amax(-1)
        m = torch.maximum(s.amax(-1), sink) if n else sink.clone()
        v = g[:, :out_width]
        vsum[r] = v.abs().sum(0) if n else 0.0
        for hh in range(h):
            mh = float(m[hh])
            if mh == -math.inf:
                continue
            if math.isnan(mh):
                out[r, hh] = math.nan
                wabs[r, hh] = math.nan
                continue
            e = torch.exp(s[hh] - mh)
            l_sum = float(e.sum()) + math.exp(float(sink[hh]) - mh)
            p = e / l_sum
            out[r, hh] = (p[:, None] * v).sum(0) if n else 0.0
            wabs[r, hh] = (p[:, None] * v.abs()).sum(0) if n else 0.0
    return out, wabs, labs, lmax, tokens, max_abs_v, vsum


def old_read_keys(cache, slots, layout):
    flat, base = F.storage_bytes(cache)
    flat = flat.cpu()
    bs, stride = int(cache.shape[1]), int(cache.stride(0))
    codes = torch.empty(len(slots), 128, dtype=torch.uint8)
    scales = torch.empty(len(slots), dtype=torch.float64)
    for i, slot in enumerate(slots):
        if layout == "token-rows":
            block, t = divmod(slot, bs)
            row = block * stride + t * 132
            offs, soff = [row + d for d in range(128)], row + 128
        else:
            offs, soff = F.indexer_k_token_spans(slot, bs, stride, layout)
        codes[i] = flat[torch.tensor(offs, dtype=torch.int64) + base]
        scales[i] = struct.unpack("<f", bytes(flat[base + soff: base + soff + 4].tolist()))[0]
    return codes, scales


# --- comparisons ----------------------------------------------------------------------------------------------


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit for bit, except that any NaN equals any NaN (the sign of zero counts)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    na, nb = torch.isnan(a), torch.isnan(b)
    if not torch.equal(na, nb):
        return False
    ints = {torch.float64: torch.int64, torch.float32: torch.int32}[a.dtype]
    return torch.equal(torch.where(na, 0, a.view(ints)), torch.where(nb, 0, b.view(ints)))


def close(a: torch.Tensor, b: torch.Tensor, rel: float = 1e-12) -> bool:
    """Same NaN and infinity masks, equal infinities, finite values within ``rel`` of the larger magnitude (or
    the tensor's scale, for values that cancel)."""
    if a.shape != b.shape:
        return False
    if not torch.equal(torch.isnan(a), torch.isnan(b)) or not torch.equal(torch.isinf(a), torch.isinf(b)):
        return False
    inf = torch.isinf(a)
    if not torch.equal(a[inf], b[inf]):
        return False
    fin = torch.isfinite(a)
    if not bool(fin.any()):
        return True
    x, y = a[fin], b[fin]
    scale = max(float(x.abs().max()), float(y.abs().max()), 1e-300)
    return bool(((x - y).abs() <= rel * torch.maximum(torch.maximum(x.abs(), y.abs()), torch.tensor(scale * 1e-3))
                 ).all())


# --- codecs: every code -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("flavour", ["ocp", "fnuz"])
def test_fp8_decode_equals_the_per_code_table_on_every_code(flavour):
    codes = torch.arange(256)
    assert same_bits(F.fp8_decode(codes, flavour), old_fp8_decode(codes, flavour))
    grid = torch.randint(0, 256, (3, 7, 5), dtype=torch.uint8)
    assert same_bits(F.fp8_decode(grid, flavour), old_fp8_decode(grid, flavour))
    assert F.fp8_decode(grid, flavour).shape == (3, 7, 5)


@pytest.mark.parametrize("reader", [False, True])
def test_ue8m0_decode_equals_the_per_code_table_on_every_code(reader):
    codes = torch.arange(256).to(torch.uint8)
    assert same_bits(F.ue8m0_decode(codes, reader=reader), old_ue8m0_decode(codes, reader=reader))


def test_the_decoders_refuse_codes_outside_a_byte():
    with pytest.raises(ValueError, match="0..255"):
        F.fp8_decode(torch.tensor([256]), "ocp")
    with pytest.raises(ValueError, match="0..255"):
        F.ue8m0_decode(torch.tensor([-1]))


# --- byte readers: random caches --------------------------------------------------------------------------------


def _ds_mla_cache(g, num_blocks, bs, lead_blocks, pad):
    """A fp8_ds_mla cache view [num_blocks, bs, 584] of random bytes (scale codes 0, 255 and NaN codes among
    them), row stride bs * 584 + pad, starting ``lead_blocks`` blocks into its pool."""
    stride = bs * 584 + pad
    pool = torch.randint(0, 256, ((num_blocks + lead_blocks) * stride,), dtype=torch.uint8, generator=g)
    view = pool[lead_blocks * stride:].as_strided((num_blocks, bs, 584), (stride, 584, 1))
    return view


@pytest.mark.parametrize("seed", range(12))
def test_dequantize_rows_equals_the_per_slot_reader(seed):
    g = torch.Generator().manual_seed(seed)
    bs = [1, 3, 5, 16, 64][seed % 5]
    nb = 1 + seed % 4
    cache = _ds_mla_cache(g, nb, bs, seed % 3, 8 * (seed % 2))
    n = int(torch.randint(0, 3 * nb * bs + 1, (1,), generator=g))
    slots = torch.randint(0, nb * bs, (n,), generator=g).tolist()  # any order, repeated
    for flavour in ("ocp", "fnuz"):
        for scrub in (False, True):
            assert same_bits(odec.dequantize_rows(cache, slots, flavour, scrub),
                             old_dequantize_rows(cache, slots, flavour, scrub))


def _decode_inputs(g, seed):
    b, h = 1 + seed % 4, [1, 2, 5, 16][seed % 4]
    bs_m, bs_e = [1, 3, 16][seed % 3], [2, 5][seed % 2]
    nb_m, nb_e = 2 + seed % 3, 1 + seed % 2
    main = _ds_mla_cache(g, nb_m, bs_m, seed % 2, 0)
    extra = _ds_mla_cache(g, nb_e, bs_e, 0, 8) if seed % 3 else None

    def ragged(slots_n, max_len):
        lens = torch.randint(0, max_len + 1, (b,), generator=g)
        if seed % 5 == 0:
            lens[0] = 0  # an empty row
        ptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        idx = torch.randint(-2, slots_n + 3, (int(lens.sum()),), generator=g).to(torch.int32)  # invalid ones too
        if idx.numel() and seed % 4 == 1:
            idx[0] = -2 ** 31
        return idx, ptr

    mi, mp = ragged(nb_m * bs_m, 9)
    ei, ep = ragged(nb_e * bs_e, 7) if extra is not None else (None, None)
    q = (torch.randn(b, h, 512, generator=g) * [0.05, 1.0, 4.0][seed % 3]).to(torch.bfloat16)
    if seed % 6 == 2:
        q[0, 0, 3] = math.inf
    if seed % 7 == 3:
        q[-1, -1, 100] = math.nan
    kind = seed % 5
    sink = None if kind == 0 else torch.randn(h, generator=g) * 3
    if kind == 2:
        sink[0] = math.nan
    if kind == 3:
        sink[-1] = math.inf
    if kind == 4:
        sink[0] = -math.inf
    return q, main, mi, mp, extra, ei, ep, sink


@pytest.mark.parametrize("seed", range(40))
def test_the_decode_reference_equals_its_per_row_and_head_version(seed):
    g = torch.Generator().manual_seed(1000 + seed)
    q, main, mi, mp, extra, ei, ep, sink = _decode_inputs(g, seed)
    kw = dict(attn_sink=sink, softmax_scale=[0.04, 1.3, -0.7][seed % 3], main_flavour=["fnuz", "ocp"][seed % 2],
              extra_flavour="ocp", scrub_extra=bool(seed % 2))
    new = odec.ref_sparse_attn_decode(q, main, mi, mp, extra, ei, ep, **kw)
    old = old_ref_sparse_attn_decode(q, main, mi, mp, extra, ei, ep, **kw)
    assert new.tokens == old.tokens
    assert new.max_abs_v == old.max_abs_v
    assert same_bits(new.logit_abs, old.logit_abs) and same_bits(new.logit_max_abs, old.logit_max_abs)
    assert close(new.out, old.out) and close(new.weight_abs, old.weight_abs)


@pytest.mark.parametrize("seed", range(30))
def test_the_prefill_reference_equals_its_per_head_version(seed):
    g = torch.Generator().manual_seed(2000 + seed)
    sq, h, d = 1 + seed % 5, [1, 3, 8][seed % 3], [64, 128, 576][seed % 3]
    skv = 1 + seed % 23
    q = (torch.randn(sq, h, d, generator=g) * 0.3).to(torch.bfloat16)
    kv = (torch.randn(skv, 1, d, generator=g)).to(torch.bfloat16)
    if seed % 4 == 1:
        kv[0, 0, 5] = math.inf
    if seed % 6 == 2:
        kv[-1, 0, 0] = math.nan
    lens = torch.randint(0, 9, (sq,), generator=g)
    if seed % 3 == 0:
        lens[0] = 0
    indptr = [0] + lens.cumsum(0).tolist()
    indices = torch.randint(-3, skv + 4, (indptr[-1],), generator=g).tolist()
    kind = seed % 4
    sink = None if kind == 0 else torch.randn(h, generator=g) * 2
    if kind == 2:
        sink[0] = math.inf
    if kind == 3:
        sink[-1] = math.nan
    width = [d, 512 if d == 576 else d][seed % 2]
    kw = dict(softmax_scale=[0.1, -0.3][seed % 2], attn_sink=sink, out_width=width)
    new = opre.ref_sparse_attn_prefill(q, kv, indices=indices, indptr=indptr, **kw)
    out, wabs, labs, lmax, tokens, max_abs_v, vsum = old_ref_sparse_attn_prefill(q, kv, indices=indices,
                                                                                 indptr=indptr, **kw)
    assert new.tokens == tokens and new.max_abs_v == max_abs_v
    assert same_bits(new.logit_abs, labs) and same_bits(new.logit_max_abs, lmax) and same_bits(new.v_abs_sum, vsum)
    assert close(new.out, out) and close(new.weight_abs, wabs)


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("layout", ["normal", "shuffle", "token-rows"])
def test_the_indexer_key_reader_equals_the_per_slot_reader(seed, layout):
    g = torch.Generator().manual_seed(3000 + seed)
    bs = [16, 32, 64, 1, 3][seed % 5] if layout != "shuffle" else [16, 32, 64][seed % 3]
    nb, lead = 1 + seed % 3, seed % 2
    stride = bs * 132 + 4 * (seed % 2)
    pool = torch.randint(0, 256, ((nb + lead) * stride,), dtype=torch.uint8, generator=g)
    cache = pool[lead * stride:].as_strided((nb, bs, 132), (stride, 132, 1))
    slots = torch.randint(0, nb * bs, (int(torch.randint(0, 40, (1,), generator=g)),), generator=g).tolist()
    codes, scales = olog._read_keys(cache, slots, layout)
    c_old, s_old = old_read_keys(cache, slots, layout)
    assert torch.equal(codes, c_old) and same_bits(scales, s_old)


# --- the writers' quantization: fp8 encode and the NoPE groups -------------------------------------------------


def old_quantize_group(values, flavour, cap, sanitize):
    from oracles.cache_writers import AMAX_FLOOR, FP8_MAX, ceil_log2

    if any(not math.isfinite(v) for v in values):
        exp = None
    else:
        exp = ceil_log2(max(max(abs(v) for v in values), AMAX_FLOOR) / FP8_MAX[flavour])
    code = cap if exp is None else max(0, min(cap, exp + 127))
    e = code - 127
    xs = [v if (math.isfinite(v) or not sanitize) else 0.0 for v in values]
    q = (torch.tensor(xs, dtype=torch.float64) * math.ldexp(1.0, -e)).to(torch.float32)
    if sanitize:
        bound = min(FP8_MAX[flavour], 1.875 * math.ldexp(1.0, 127 - e))
        q = torch.where(q.abs() > bound, torch.copysign(torch.tensor(bound, dtype=torch.float32), q), q)
    return [F.fp8_encode_scalar(v, flavour) for v in q.to(torch.float64).tolist()], code


def _encode_probes(flavour, g):
    """Random fp32 values over the whole range, every tie between neighbouring magnitudes and a step either side,
    both signs, and the specials."""
    table = sorted(v for v in (F.fp8_value(c, flavour) for c in range(128)) if not math.isnan(v))
    mids = [(a + b) / 2 for a, b in zip(table, table[1:])]
    vals = table + mids + [m * (1 + 2 ** -20) for m in mids] + [m * (1 - 2 ** -20) for m in mids]
    vals += [0.0, -0.0, math.inf, -math.inf, math.nan, 1e-30, 2 ** -149, 1e30, table[-1] * 1.01]
    rand = (torch.randn(1500, generator=g, dtype=torch.float64) * torch.exp2(torch.randint(-14, 12, (1500,),
                                                                                          generator=g)))
    vals += rand.tolist()
    return torch.tensor(vals + [-v for v in vals], dtype=torch.float64).to(torch.float32)


@pytest.mark.parametrize("flavour", ["ocp", "fnuz"])
def test_fp8_encode_equals_the_scalar_search(flavour):
    x = _encode_probes(flavour, torch.Generator().manual_seed(5))
    want = torch.tensor([F.fp8_encode_scalar(v, flavour) for v in x.to(torch.float64).tolist()], dtype=torch.uint8)
    assert torch.equal(F.fp8_encode(x, flavour), want)
    assert torch.equal(F.fp8_encode(x.reshape(2, -1), flavour), want.reshape(2, -1))
    old_chunk = F.ENCODE_CHUNK
    try:  # the chunking does not change a byte
        F.ENCODE_CHUNK = 7
        assert torch.equal(F.fp8_encode(x[:200], flavour), want[:200])
    finally:
        F.ENCODE_CHUNK = old_chunk


@pytest.mark.parametrize("seed", range(16))
def test_the_group_quantizer_equals_its_per_group_version(seed):
    from oracles import cache_writers as ocw

    g = torch.Generator().manual_seed(4000 + seed)
    flavour = ["ocp", "fnuz"][seed % 2]
    cap, sanitize = [255, 254][seed // 2 % 2], bool(seed // 4 % 2)
    vals = torch.randn(7, 64, generator=g) * torch.exp2(torch.randint(-30, 30, (7, 1), generator=g).float())
    if seed % 3 == 0:
        vals[1, 3] = math.nan
        vals[2, 0] = math.inf
        vals[4, 63] = -math.inf
    if seed % 5 == 0:
        vals[5] = 0.0
        vals[6] = 3e38
    got_b, got_c = ocw.quantize_groups(vals, flavour, cap, sanitize)
    for grp in range(7):
        b, c = old_quantize_group(vals[grp].to(torch.float64).tolist(), flavour, cap, sanitize)
        assert got_b[grp].tolist() == b and int(got_c[grp]) == c, grp
        assert ocw.quantize_group(vals[grp].to(torch.float64).tolist(), flavour, cap, sanitize) == (b, c)
    row = torch.cat([vals.reshape(-1), torch.randn(64, generator=g)]).to(torch.bfloat16)
    tok = ocw.quantize_pack_row(row, flavour=flavour, cap=cap, sanitize=False, rope_from_fp32=False)
    nope = sum((old_quantize_group(row[64 * k:64 * k + 64].to(torch.float64).tolist(), flavour, cap, False)[0]
                for k in range(7)), [])
    assert tok["nope"].tolist() == nope and tok["nope"].dtype == torch.uint8 and tok["scale"].dtype == torch.uint8
