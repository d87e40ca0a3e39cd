"""Unit tests of the indexer-K writers (impl/indexer_writer.py): bad input is refused before any launch with the cache
untouched, the two layouts hold the same token, a few exact byte patterns, the E2M1 encoder against the oracle's
search, and the contract failing on a wrong writer."""
from __future__ import annotations

import math

import pytest
import torch
import triton
import triton.language as tl

from contracts import indexer_writer as ciw
from fuzz.indexer_writer import DirectCase, IndexerCompressorCase, IndexerWriterCase
from impl import formats
from impl import indexer_writer as iw
from impl.runtime import kernel_device
from impl.targets import get_target
from oracles import indexer_writer as oiw

DEV = kernel_device()


def _cache(nb=2, bs=16, width=132, fill=0xA5):
    return torch.full((nb, bs, width), fill, dtype=torch.uint8, device=DEV)


def _direct_args(T=3, bs=16, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(0)
    k = torch.randn(T, 128, generator=g).to(dtype).to(DEV)
    return k, _cache(bs=bs), torch.tensor([5, -1, 17][:T], dtype=torch.int64, device=DEV)


def _compressor_args(kv_format="fp8", T=2):
    g = torch.Generator().manual_seed(1)
    state = torch.randn(4, 4, 512, generator=g)
    return dict(state=state.to(DEV), state_block_table=torch.tensor([[2, 0, 3, 1]], dtype=torch.int32, device=DEV),
                token_to_req=torch.zeros(T, dtype=torch.int32, device=DEV),
                positions=torch.tensor([7, 11][:T], dtype=torch.int64, device=DEV),
                slot_mapping=torch.tensor([3, 0][:T], dtype=torch.int64, device=DEV),
                norm_weight=torch.ones(128, device=DEV),
                cos_sin_cache=torch.cat([torch.ones(16, 32), torch.zeros(16, 32)], 1).to(DEV),
                cache=_cache(nb=1, bs=4, width=132 if kv_format == "fp8" else 68))


# --- bad input: a clear error before any launch, cache untouched -------------------------------------------------

DIRECT_BAD = [
    ("k dtype", lambda a: {**a, "k": a["k"].to(torch.float16)}, TypeError, "^k: expected dtype"),
    ("k width", lambda a: {**a, "k": a["k"][:, :64]}, ValueError, r"^k: expected shape \[T, 128\]"),
    ("cache width", lambda a: {**a, "cache": _cache(width=130)}, ValueError, "^cache: expected shape"),
    ("cache dtype", lambda a: {**a, "cache": _cache().to(torch.int8)}, TypeError, "^cache: expected dtype uint8"),
    ("slots dtype", lambda a: {**a, "slot_mapping": a["slot_mapping"].to(torch.int32)}, TypeError, "^slot_mapping"),
    ("slots length", lambda a: {**a, "slot_mapping": a["slot_mapping"][:2]}, ValueError,
     "^slot_mapping: expected 3 entries"),
    ("slot range", lambda a: {**a, "slot_mapping": torch.tensor([5, -1, 32], device=DEV)}, ValueError,
     r"^slot_mapping: entries must be < 0 \(skip\) or in \[0, 32\)"),
    ("slot twice", lambda a: {**a, "slot_mapping": torch.tensor([5, -1, 5], device=DEV)}, ValueError,
     "^slot_mapping: slot 5 is written by tokens 0 and 2"),
    ("scale_fmt", lambda a: {**a, "scale_fmt": "e8m0"}, ValueError, "^scale_fmt"),
    ("layout name", lambda a: {**a, "layout": "tiled"}, ValueError, "^layout"),
    ("shuffle at bs 3", lambda a: {**a, "cache": _cache(bs=3), "slot_mapping": torch.tensor([0, -1, 4], device=DEV)},
     ValueError, "^block_size: the shuffle layout needs a multiple of 16"),
    ("k device", lambda a: {**a, "k": a["k"].to("meta")}, ValueError, "^k: expected a tensor on"),
]


@pytest.mark.parametrize("name,mutate,exc,match", DIRECT_BAD, ids=[b[0] for b in DIRECT_BAD])
def test_direct_writer_refuses_bad_input_before_writing(name, mutate, exc, match):
    k, cache, slots = _direct_args()
    args = mutate({"k": k, "cache": cache, "slot_mapping": slots})
    before = args["cache"].clone()
    kw = {key: args.pop(key) for key in ("scale_fmt", "layout") if key in args}
    with pytest.raises(exc, match=match):
        iw.indexer_k_quant_and_cache(args["k"], args["cache"], args["slot_mapping"], target="gfx950", **kw)
    assert torch.equal(args["cache"], before)


COMPRESSOR_BAD = [
    ("norm weight width", lambda a: {**a, "norm_weight": torch.ones(512, device=DEV)}, {}, ValueError,
     r"^norm_weight: expected a contiguous \[128\]"),
    ("state width", lambda a: {**a, "state": torch.zeros(4, 4, 1024, device=DEV)}, {}, ValueError, "^state: expected"),
    ("fp8 cache width", lambda a: {**a, "cache": _cache(nb=1, bs=4, width=68)}, {}, ValueError,
     "^cache: expected shape"),
    ("mxfp4 cache width", lambda a: a, {"kv_format": "mxfp4"}, ValueError, r"^cache: expected shape .*68\]"),
    ("kv_format", lambda a: a, {"kv_format": "fp4"}, ValueError, "^kv_format"),
    ("mx_scale with mxfp4", lambda a: {**a, "cache": _cache(nb=1, bs=4, width=68)},
     {"kv_format": "mxfp4", "mx_scale": True}, ValueError, "^mx_scale"),
    ("mx_scale type", lambda a: a, {"mx_scale": 1}, TypeError, "^mx_scale"),
    ("shuffle for mxfp4", lambda a: {**a, "cache": _cache(nb=1, bs=16, width=68)},
     {"kv_format": "mxfp4", "layout": "shuffle"}, ValueError, "^layout: the MXFP4"),
    ("ratio", lambda a: a, {"ratio": 128}, ValueError, "^ratio"),
    ("slots length", lambda a: {**a, "slot_mapping": a["slot_mapping"][:1]}, {}, ValueError, "^slot_mapping"),
    ("intermediates", lambda a: a, {"intermediates": torch.zeros(2, 512, device=DEV)}, ValueError,
     "^intermediates"),
    ("cos/sin rows", lambda a: {**a, "cos_sin_cache": a["cos_sin_cache"][:8]}, {}, ValueError, "^cos_sin_cache"),
    ("table column", lambda a: {**a, "state_block_table": a["state_block_table"][:, :2]}, {}, ValueError,
     "^state_block_table"),
]


@pytest.mark.parametrize("name,mutate,kw,exc,match", COMPRESSOR_BAD, ids=[b[0] for b in COMPRESSOR_BAD])
def test_compressor_refuses_bad_input_before_writing(name, mutate, kw, exc, match):
    args = mutate(_compressor_args())
    before = args["cache"].clone()
    with pytest.raises(exc, match=match):
        iw.compress_norm_rope_store_indexer(**args, target="gfx950", **kw)
    assert torch.equal(args["cache"], before)


# --- layouts and exact bytes ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bs", [16, 64])
def test_normal_and_shuffle_hold_the_same_token(bs):
    k, _, _ = _direct_args()
    slots = torch.tensor([bs + 3, -1, 17], dtype=torch.int64, device=DEV)
    got = {}
    for layout in ("normal", "shuffle"):
        cache = _cache(bs=bs)
        iw.indexer_k_quant_and_cache(k, cache, slots, layout=layout, target="generic")
        got[layout] = formats.unpack_indexer_k(cache.cpu(), [bs + 3, 17], layout)
        # the token at in-block position 3 of block 1: its 16-byte tile rows sit 256 bytes apart in SHUFFLE
        blk = cache[1].reshape(-1).cpu()
        if layout == "shuffle":
            assert torch.equal(blk[3 * 16:3 * 16 + 16], got[layout][0][0, :16])
            assert torch.equal(blk[256 + 3 * 16:256 + 3 * 16 + 16], got[layout][0][0, 16:32])
        else:
            assert torch.equal(blk[3 * 128:4 * 128], got[layout][0][0])
    assert torch.equal(got["normal"][0], got["shuffle"][0]) and torch.equal(got["normal"][1], got["shuffle"][1])
    assert torch.equal(_direct_args()[1], _cache(bs=16))  # the helper's cache starts filled


@pytest.mark.parametrize("target,scale_fmt,code,scale", [
    ("gfx950", None, 0x7E, 1 / 448), ("gfx950", "ue8m0", 0x78, 2.0 ** -8),
    ("gfx942", None, 0x7E, 1 / 224), ("gfx942", "ue8m0", 0x78, 2.0 ** -7),
])
def test_direct_writer_exact_bytes_of_a_constant_row(target, scale_fmt, code, scale):
    # amax 1: scale 1/448 -> q = 448 = 0x7E (OCP); ue8m0 2^-8 -> 256 = 0x78; FNUZ 1/224 -> 224 = 0x7E, 2^-7 -> 128
    k = torch.ones(1, 128, dtype=torch.bfloat16, device=DEV)
    cache = _cache(nb=1, bs=1)
    iw.indexer_k_quant_and_cache(k, cache, torch.tensor([0], device=DEV), scale_fmt=scale_fmt, target=target)
    codes, sc = formats.unpack_indexer_k(cache.cpu(), [0], "normal")
    assert codes.unique().tolist() == [code]
    assert float(sc[0]) == float(torch.tensor(scale, dtype=torch.float32))


def test_zero_row_takes_the_amax_floor_and_skipped_slots_write_nothing():
    k = torch.zeros(2, 128, dtype=torch.float32, device=DEV)
    cache = _cache(nb=1, bs=2)
    before = cache.clone()
    iw.indexer_k_quant_and_cache(k, cache, torch.tensor([1, -2 ** 63], device=DEV), layout="normal",
                                 target="gfx950")
    codes, sc = formats.unpack_indexer_k(cache.cpu(), [1], "normal")
    assert codes.unique().tolist() == [0]
    assert float(sc[0]) == float(torch.tensor(1e-4, dtype=torch.float32) / 448)
    flat, was = cache.reshape(-1).cpu(), before.reshape(-1).cpu()
    changed = (flat != was).nonzero().flatten().tolist()
    assert changed and set(changed) <= set(range(128, 256)) | set(range(260, 264))  # token 1's record only


@pytest.mark.parametrize("kv_format", ["fp8", "mxfp4"])
def test_compressor_exact_bytes_of_a_constant_window(kv_format):
    # every window row kv = 2, equal scores, weight 1, eps 0, cos 1 / sin 0: normed = 1 everywhere, RoPE changes
    # nothing. FP8: scale 2^ceil(log2(1/448)) = 2^-8, codes 256 = 0x78. MXFP4: e = ceil(log2(1/6)) = -2 (code
    # 125), 1 * 4 = 4 -> nibble 6 (0x66 per byte)
    args = _compressor_args(kv_format, T=1)
    args["state"][:, :, :256] = 2.0
    args["state"][:, :, 256:] = 0.5
    inter = torch.full((1, 128), float("nan"), device=DEV)
    iw.compress_norm_rope_store_indexer(**args, eps=0.0, kv_format=kv_format, target="gfx950", intermediates=inter)
    assert bool((inter == 1.0).all())
    flat = args["cache"][0].reshape(-1).cpu()  # slot 3 of a block of 4: [4 * 128 fp8][4 * 4 scale]
    if kv_format == "fp8":
        assert flat[3 * 128:4 * 128].unique().tolist() == [0x78]
        assert flat[4 * 128 + 12:4 * 128 + 16].view(torch.float32).item() == 2.0 ** -8
    else:
        assert flat[3 * 64:4 * 64].unique().tolist() == [0x66]
        assert flat[4 * 64 + 12:4 * 64 + 16].tolist() == [125] * 4


def test_compressor_mx_scale_stores_the_exponent_byte_four_times():
    args = _compressor_args(T=1)
    iw.compress_norm_rope_store_indexer(**args, mx_scale=True, target="generic")
    word = args["cache"][0].reshape(-1)[4 * 128 + 12:4 * 128 + 16].tolist()
    assert len(set(word)) == 1 and 100 < word[0] < 130


@triton.jit
def _e2m1_kernel(x_ptr, out_ptr, N: tl.constexpr):
    i = tl.arange(0, N)
    tl.store(out_ptr + i, iw.e2m1_encode(tl.load(x_ptr + i)))


def test_e2m1_encoder_matches_the_oracles_nearest_even_search():
    grid = list(oiw.E2M1_VALUES)
    mids = [(a + b) / 2 for a, b in zip(grid, grid[1:])]
    near = [math.nextafter(m, s) for m in mids for s in (0.0, 10.0)]
    xs = grid + mids + near + [7.0, 1e30, math.inf, 0.1, 1e-45]
    xs = xs + [-v for v in xs] + [-0.0]
    x = torch.tensor(xs, dtype=torch.float32)
    n = triton.next_power_of_2(len(xs))
    xp = torch.zeros(n, dtype=torch.float32)
    xp[:len(xs)] = x
    out = torch.empty(n, dtype=torch.int32, device=DEV)
    _e2m1_kernel[(1,)](xp.to(DEV), out, N=n)
    assert out[:len(xs)].cpu().tolist() == [oiw.e2m1_code(float(v)) for v in x]


# --- the contract catches a wrong writer ----------------------------------------------------------------------------

def test_the_contract_fails_a_writer_with_the_wrong_fnuz_divisor(monkeypatch):
    case = IndexerWriterCase(direct=DirectCase(seed=1, T=2, slots=(0, 3), log_scale=(0, 5), block_size=16,
                                               num_blocks=1))
    t = get_target("gfx942")
    assert ciw.indexer_writer_exact(case, t) == []
    monkeypatch.setitem(iw.FP8_SCALE_DIVISOR, "fnuz", 448.0)
    v = ciw.indexer_writer_exact(case, t)
    assert v and {x.message.split(": ", 1)[1] for x in v} <= {ciw.BYTE_DIFFERS, "more: " + ciw.BYTE_DIFFERS}


def test_the_contract_fails_a_compressor_whose_rope_row_is_wrong(monkeypatch):
    case = IndexerWriterCase(compressor=IndexerCompressorCase(seed=2, positions=(7,), reqs=(0,), slots=(1,),
                                                              block_size=2, num_blocks=1))
    t = get_target("gfx950")
    assert ciw.indexer_writer_exact(case, t) == []
    real = iw.compress_norm_rope_store_indexer

    def shifted(*a, **kw):  # the writer rotates with the cos/sin row of the next position
        a = list(a)
        a[6] = torch.roll(a[6], -1, dims=0)
        return real(*a, **kw)

    monkeypatch.setattr(iw, "compress_norm_rope_store_indexer", shifted)
    msgs = {x.message for x in ciw.indexer_writer_exact(case, t)}
    assert ciw.ROW_OUT_OF_TOL in msgs
