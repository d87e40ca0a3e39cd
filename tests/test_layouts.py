"""fp8_ds_mla and indexer-K cache layouts: pack/unpack round trips on odd block sizes and strided pool views,
with every byte checked at the reference's absolute offsets."""
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings

from fuzz import formats as fz
from fuzz.cases import CaseError
from fuzz.formats import LayoutCase
from impl import formats as F
from oracles import formats as R


@pytest.mark.parametrize("bs", [1, 2, 5, 61])
@pytest.mark.parametrize("padded", [True, False])
def test_fp8_ds_mla_roundtrip_strided(bs, padded):
    g = torch.Generator().manual_seed(bs)
    nb = 3
    pool, view = F.allocate_fp8_ds_mla_pool(nb, bs, padded=padded, fill=0xEE, extra_blocks_before=1)
    lay = F.Fp8DsMlaLayout(bs)
    assert view.stride(0) == (lay.padded_block_bytes if padded else bs * 584)
    assert lay.padded_block_bytes % 576 == 0 and lay.scale_region_offset == bs * 576
    n = min(4, nb * bs)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    nope = torch.randint(0, 256, (n, 448), generator=g, dtype=torch.int32).to(torch.uint8)
    scale = torch.randint(0, 255, (n, 7), generator=g, dtype=torch.int32).to(torch.uint8)
    rope = torch.randn(n, 64, generator=g).to(torch.bfloat16)
    F.pack_fp8_ds_mla(view, slots, nope, scale, rope)
    got = F.unpack_fp8_ds_mla(view, slots)
    assert torch.equal(got["nope"], nope) and torch.equal(got["scale"], scale)
    assert torch.equal(got["rope"].view(torch.uint8), rope.view(torch.uint8)) and got["pad"].eq(0).all()
    flat, base = R.storage_bytes(view)
    for i, s in enumerate(slots.tolist()):
        spans = R.fp8_ds_mla_token_spans(s, bs, view.stride(0))
        a, b = spans["scale"]
        assert torch.equal(flat[base + a:base + b], scale[i])
        a, b = spans["nope"]
        assert torch.equal(flat[base + a:base + b], nope[i])
    # the block before the view and the padding stay untouched
    assert pool[:base].eq(0xEE).all()


def test_fp8_ds_mla_dequantize_uses_reader_rules():
    _, view = F.allocate_fp8_ds_mla_pool(1, 2)
    nope = torch.zeros(2, 448, dtype=torch.uint8)
    nope[0, :64] = 0x38  # 1.0 in OCP
    scale = torch.full((2, 7), 127, dtype=torch.uint8)
    scale[0, 0] = 128  # x2
    scale[1, 0] = 255  # +inf in readers: 0 * inf = NaN
    F.pack_fp8_ds_mla(view, [0, 1], nope, scale, torch.ones(2, 64, dtype=torch.bfloat16))
    rows = F.dequantize_fp8_ds_mla(view, [0, 1], "ocp")
    assert rows[0, 0].item() == 2.0 and rows[0, 64].item() == 0.0 and rows[0, 448].item() == 1.0
    assert torch.isnan(rows[1, :64]).all() and not torch.isnan(rows[1, 64:]).any()


@pytest.mark.parametrize("layout,bs", [("normal", 1), ("normal", 5), ("shuffle", 16), ("shuffle", 64)])
def test_indexer_k_roundtrip(layout, bs):
    g = torch.Generator().manual_seed(bs)
    nb = 2
    stride = bs * 132 + 64
    pool = torch.zeros((nb + 1) * stride, dtype=torch.uint8)
    view = pool.as_strided((nb, bs, 132), (stride, 132, 1), stride)
    n = min(5, nb * bs)
    slots = torch.randperm(nb * bs, generator=g)[:n]
    codes = torch.randint(0, 256, (n, 128), generator=g, dtype=torch.int32).to(torch.uint8)
    sc = torch.rand(n, generator=g)
    F.pack_indexer_k(view, slots, codes, sc, layout=layout)
    c2, s2 = F.unpack_indexer_k(view, slots, layout=layout)
    assert torch.equal(c2, codes) and torch.equal(s2, sc)
    flat, base = R.storage_bytes(view)
    for i, s in enumerate(slots.tolist()):
        offs, so = R.indexer_k_token_spans(s, bs, stride, layout)
        assert torch.equal(flat[torch.tensor(offs) + base], codes[i])


def test_default_indexer_layout():
    assert F.default_indexer_layout(1) == "normal" and F.default_indexer_layout(64) == "shuffle"


def test_layout_bad_input_errors():
    _, view = F.allocate_fp8_ds_mla_pool(2, 4)
    with pytest.raises(TypeError, match="cache: expected dtype uint8"):
        F.unpack_fp8_ds_mla(view.view(torch.int8), [0])
    with pytest.raises(ValueError, match=r"cache: expected shape \[num_blocks, block_size, 584\]"):
        F.unpack_fp8_ds_mla(torch.zeros(2, 4, 576, dtype=torch.uint8), [0])
    with pytest.raises(ValueError, match=r"slots: slot 8 outside \[0, 8\)"):
        F.unpack_fp8_ds_mla(view, [8])
    with pytest.raises(ValueError, match=r"nope_codes: expected shape \[1, 448\]"):
        F.pack_fp8_ds_mla(view, [0], torch.zeros(1, 447, dtype=torch.uint8), torch.zeros(1, 7, dtype=torch.uint8),
                          torch.zeros(1, 64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="rope: expected dtype bfloat16"):
        F.pack_fp8_ds_mla(view, [0], torch.zeros(1, 448, dtype=torch.uint8), torch.zeros(1, 7, dtype=torch.uint8),
                          torch.zeros(1, 64))
    with pytest.raises(ValueError, match="block_size: the shuffle layout needs a multiple of 16, got 5"):
        F.IndexerKLayout(5, "shuffle")
    with pytest.raises(ValueError, match="block_size: expected a positive int"):
        F.Fp8DsMlaLayout(0)
    with pytest.raises(ValueError, match="each block must be contiguous"):
        F.check_fp8_ds_mla_cache(torch.zeros(2, 584, 4, dtype=torch.uint8).transpose(1, 2))


# --- the typed case of cache-layout-roundtrip ---------------------------------------------------------------------

@settings(max_examples=40, deadline=None, database=None)
@given(fz.layout_cases())
def test_layout_case_round_trips_through_json(case):
    assert LayoutCase.from_json(case.to_json()) == case
    assert LayoutCase.from_json(json.loads(json.dumps(case.to_json()))) == case
    assert case.layout != "indexer-shuffle" or case.block_size % 16 == 0


def test_layout_case_rejects_a_missing_field_and_bad_geometry():
    case = LayoutCase(layout="indexer-normal", block_size=5, num_blocks=1, stride_pad=0, offset_blocks=0, seed=0,
                      num_tokens=1)
    for f in dataclasses.fields(case):
        doc = case.to_json()
        del doc[f.name]
        with pytest.raises(CaseError, match=f"missing field {f.name}"):
            LayoutCase.from_json(doc)
    with pytest.raises(CaseError, match="block_size: the shuffle layout needs a multiple of 16"):
        LayoutCase.from_json({**case.to_json(), "layout": "indexer-shuffle"})
    with pytest.raises(CaseError, match="num_blocks"):
        LayoutCase.from_json({**case.to_json(), "num_blocks": 0})
