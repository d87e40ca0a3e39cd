"""Memory-layout dimensions of the codec, dequant and DSv4 step / builder families (issue 30 item 1): each layout
keeps the values (only memory changes), ours passes every layout, and an entry point that ignores a stride, reads a
view as packed, writes into its input's buffer or refuses a layout without naming the argument is caught."""
import pytest
import torch

from contracts import registry
from contracts import dequant as cdq
from contracts import dsv4_step as cstep
from contracts import formats as cfm
from fuzz import dequant as fdq
from fuzz import dimensions
from fuzz import dsv4_step as fst
from fuzz import formats as ffm
from fuzz.dequant import DequantCase
from fuzz.dsv4_step import BuilderCase, Dsv4StepCase
from fuzz.formats import Fp8Case, Ue8m0Case
from impl import codec_kernels
from impl import decode as impl_decode
from impl import dsv4_step as impl_step
from impl import formats as impl_formats
from impl.runtime import kernel_device
from impl.targets import get_target

registry.load_all()
GFX942, GFX950 = get_target("gfx942"), get_target("gfx950")


def _packed_read(t: torch.Tensor) -> torch.Tensor:
    """``t``'s memory read as if ``t`` were packed from its first element (a reader that ignores the strides)."""
    strides, acc = [], 1
    for d in reversed(t.shape):
        strides.insert(0, acc)
        acc *= int(d)
    return t.as_strided(tuple(t.shape), tuple(strides), t.storage_offset())


# --- the declared dimensions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("cid,dim,values", [
    ("fp8-codec-exact", "input_layout", ffm.CODEC_LAYOUTS),
    ("ue8m0-codec-exact", "input_layout", ffm.CODEC_LAYOUTS),
    ("fp8-ds-mla-dequant-exact", "slots_layout", fdq.SLOTS_LAYOUTS),
    ("dsv4-builder-capture-flag", "table_layout", fst.BUILDER_TABLE_LAYOUTS),
    ("dsv4-builder-capture-flag", "vector_layout", fst.BUILDER_VECTOR_LAYOUTS),
    ("dsv4-step-agreement", "input_layout", fst.STEP_LAYOUTS),
])
@pytest.mark.parametrize("target", [GFX942, GFX950], ids=lambda t: t.name)
def test_every_layout_is_in_the_ci_array_and_forced_rows_classify_as_forced(cid, dim, values, target):
    fam = dimensions.family_for(cid)
    assert any(dim in g for g in fam.interactions), f"{cid}: {dim} interacts with nothing"
    rows = fam.covering_array(target, 2)
    assert {r[dim] for r in rows} == set(values)
    for ex in fam.examples(target):
        for row in rows:
            got = fam.classify(fam.force(ex, row, target), target)
            assert {k: got.get(k) for k in row} == row


@pytest.mark.parametrize("layout", ffm.CODEC_LAYOUTS[1:])
def test_a_codec_layout_keeps_the_values_and_changes_the_memory(layout):
    x = torch.arange(7, dtype=torch.float32) + 0.5
    buf, view = ffm.lay_out_codec_input(x, layout, -1.0)
    assert not view.is_contiguous()
    flat = view.contiguous().reshape(-1)
    if layout == "strided":
        assert torch.equal(flat, x) and view.storage_offset() > 0 and (buf == -1.0).sum() == buf.numel() - 7
    else:
        assert view.shape == (7, 2) and torch.equal(view[:, 0], x) and torch.equal(view[:, 1], x.flip(0))


def test_laid_out_builder_and_step_inputs_hold_the_packed_values():
    case = BuilderCase(seed=4, compress_ratio=4, capture=False, pad_tokens=1)
    packed = fst.builder_inputs(case, "cpu")
    for vec in ("strided",):
        for tab in fst.BUILDER_TABLE_LAYOUTS[1:]:
            laid = fst.builder_inputs(case.replace(vector_layout=vec, table_layout=tab), "cpu")
            assert all(torch.equal(a, b) for a, b in zip(packed, laid))
            assert not any(t.is_contiguous() for t in laid)
    step = Dsv4StepCase(seed=1, contexts=(5, 2), steps=2, heads=1, window=4, swa_block_size=2, c4a_block_size=4,
                        c128a_block_size=128, topk=3, cu_count=1, scale=0.11, sink="none", padded=False,
                        layers=("swaonly",))
    a = fst.build_step_inputs(step, GFX950, "cpu")
    b = fst.build_step_inputs(step.replace(input_layout="strided"), GFX950, "cpu")
    la, lb = a.layers[0], b.layers[0]
    assert torch.equal(la.q.view(torch.int16), lb.q.view(torch.int16)) and not lb.q.is_contiguous()
    assert torch.equal(la.k.view(torch.int16), lb.k.view(torch.int16)) and not lb.k.is_contiguous()
    assert lb.swa.view.storage_offset() >= lb.swa.view.stride(0)
    pos = fst.step_positions(step.replace(input_layout="strided"), 1, "cpu")
    assert pos.stride(0) == 2 and pos.tolist() == step.positions(1)


# --- codecs -----------------------------------------------------------------------------------------------------

def _fp8(layout, flavour="ocp"):
    return Fp8Case(flavour=flavour, values=(0.5, -3.0, 7.0, 1e30, float("nan"), 0.0625), input_layout=layout)


def _ue8(layout):
    return Ue8m0Case(cap=254, scales=(0.5, 3.0, float("inf"), 1e-40, 2.0 ** 127 * 1.5), input_layout=layout)


@pytest.mark.parametrize("layout", ffm.CODEC_LAYOUTS)
def test_ours_passes_every_codec_layout(layout):
    assert cfm.fp8_codec_exact(_fp8(layout, "fnuz"), GFX942) == []
    assert cfm.ue8m0_codec_exact(_ue8(layout), GFX950) == []


def test_a_codec_launcher_that_reads_its_input_as_packed_is_caught(monkeypatch):
    real = codec_kernels._flat_on_kernel_device

    def packed(name, t, dtype):  # the launcher flattens the input's memory instead of its elements
        real(name, t, dtype)
        return _packed_read(t).reshape(-1).contiguous().to(kernel_device())

    monkeypatch.setattr(codec_kernels, "_flat_on_kernel_device", packed)
    assert cfm.fp8_codec_exact(_fp8("contiguous"), GFX950) == []
    for layout in ffm.CODEC_LAYOUTS[1:]:
        v = cfm.fp8_codec_exact(_fp8(layout), GFX950)
        assert any("triton fp8_decode_bits" in x.message for x in v), layout
        assert any("triton fp8_encode_bits" in x.message for x in v), layout
        assert all(f"input_layout={layout}" in x.where for x in v), layout
        v = cfm.ue8m0_codec_exact(_ue8(layout), GFX950)
        assert any("triton ue8m0_encode_bits" in x.message for x in v)
        assert any("triton ue8m0_decode_reader" in x.message for x in v)


def test_a_host_codec_that_ignores_strides_is_caught(monkeypatch):
    real_enc, real_dec = impl_formats.fp8_encode, impl_formats.ue8m0_decode
    monkeypatch.setattr(impl_formats, "fp8_encode", lambda x, fl: real_enc(_packed_read(x), fl))
    monkeypatch.setattr(impl_formats, "ue8m0_decode", lambda c: real_dec(_packed_read(c)))
    assert cfm.fp8_codec_exact(_fp8("contiguous"), GFX950) == []
    assert cfm.ue8m0_codec_exact(_ue8("contiguous"), GFX950) == []
    for layout in ffm.CODEC_LAYOUTS[1:]:
        assert any("host fp8_encode" in x.message for x in cfm.fp8_codec_exact(_fp8(layout), GFX950))
        assert any("host ue8m0_decode" in x.message for x in cfm.ue8m0_codec_exact(_ue8(layout), GFX950))


def test_a_codec_refusal_must_name_the_argument_and_writes_shapes_are_judged(monkeypatch):
    real = impl_formats.fp8_encode

    def refuses(msg):
        def enc(x, fl):
            if not x.is_contiguous():
                raise ValueError(msg)
            return real(x, fl)
        return enc

    monkeypatch.setattr(impl_formats, "fp8_encode", refuses("x: expected a contiguous tensor"))
    assert cfm.fp8_codec_exact(_fp8("strided"), GFX950) == []  # a clean refusal
    monkeypatch.setattr(impl_formats, "fp8_encode", refuses("unsupported"))
    v = cfm.fp8_codec_exact(_fp8("strided"), GFX950)
    assert [x.message for x in v] == [cfm.LAYOUT_REFUSAL_UNCLEAR]

    def writes(x, fl):  # the codec sanitizes its input in place
        out = real(x, fl)
        x.nan_to_num_(0.0)
        return out

    monkeypatch.setattr(impl_formats, "fp8_encode", writes)
    v = cfm.fp8_codec_exact(_fp8("column-major"), GFX950)
    assert cfm.LAYOUT_INPUT_WRITTEN in {x.message for x in v}
    monkeypatch.setattr(impl_formats, "fp8_encode", lambda x, fl: real(x.contiguous().reshape(-1), fl))
    v = cfm.fp8_codec_exact(_fp8("column-major"), GFX950)
    assert [x.message for x in v] == [cfm.LAYOUT_SHAPE]
    assert cfm.fp8_codec_exact(_fp8("strided"), GFX950) == []  # a flat input keeps its shape flat


# --- the fp8_ds_mla dequantizer's slot tensor ---------------------------------------------------------------------

def _dq(layout="strided", order="shuffled"):
    return DequantCase(seed=5, block_size=3, num_blocks=2, padded=True, offset_blocks=1, flavour="ocp",
                       order=order, slots_as="tensor", slots_layout=layout)


def test_a_dequantizer_that_reads_the_slot_tensor_as_packed_is_caught(monkeypatch):
    assert cdq.fp8_ds_mla_dequant_exact(_dq(), GFX950) == []
    real = impl_formats._slot_list

    def packed(slots, cache, name="slots"):
        if isinstance(slots, torch.Tensor):
            slots = _packed_read(slots)
        return real(slots, cache, name)

    monkeypatch.setattr(impl_formats, "_slot_list", packed)
    assert cdq.fp8_ds_mla_dequant_exact(_dq("contiguous"), GFX950) == []
    for order in fdq.SLOT_ORDERS:
        v = cdq.fp8_ds_mla_dequant_exact(_dq(order=order), GFX950)
        assert v and "slots_layout=strided" in v[0].where, order


def test_a_dequantizer_writing_the_slot_buffer_or_refusing_unnamed_is_caught(monkeypatch):
    real = impl_formats._slot_list

    def scribbles(slots, cache, name="slots"):  # reads right, then writes a gap of the slot buffer
        out = real(slots, cache, name)
        if isinstance(slots, torch.Tensor) and not slots.is_contiguous():
            slots.as_strided((1,), (1,), slots.storage_offset() + 1).fill_(0)
        return out

    monkeypatch.setattr(impl_formats, "_slot_list", scribbles)
    assert [x.message for x in cdq.fp8_ds_mla_dequant_exact(_dq(), GFX950)] == [cdq.SLOTS_WRITTEN]

    def refuses(msg):
        def f(slots, cache, name="slots"):
            if isinstance(slots, torch.Tensor) and not slots.is_contiguous():
                raise ValueError(msg)
            return real(slots, cache, name)
        return f

    monkeypatch.setattr(impl_formats, "_slot_list", refuses("slots: expected a contiguous tensor"))
    assert cdq.fp8_ds_mla_dequant_exact(_dq(), GFX950) == []
    monkeypatch.setattr(impl_formats, "_slot_list", refuses("bad input"))
    assert [x.message for x in cdq.fp8_ds_mla_dequant_exact(_dq(), GFX950)] == [cdq.LAYOUT_REFUSAL_UNCLEAR]


# --- the DSv4 metadata builder ----------------------------------------------------------------------------------

def _bc(ratio=4, vec="contiguous", tab="contiguous", capture=True):
    return BuilderCase(seed=9, compress_ratio=ratio, capture=capture, pad_tokens=1, vector_layout=vec,
                       table_layout=tab)


@pytest.mark.parametrize("target", [GFX942, GFX950], ids=lambda t: t.name)
def test_ours_builds_the_same_metadata_from_every_layout(target):
    for ratio in fst.BUILDER_RATIOS:
        for vec in fst.BUILDER_VECTOR_LAYOUTS:
            for tab in fst.BUILDER_TABLE_LAYOUTS:
                assert cstep.dsv4_builder_capture_flag(_bc(ratio, vec, tab), target) == [], (ratio, vec, tab)


def test_a_builder_that_reads_a_table_or_the_positions_as_packed_is_caught(monkeypatch):
    real_lookup = impl_step._lookup
    monkeypatch.setattr(impl_step, "_lookup", lambda table, *a: real_lookup(_packed_read(table), *a))
    assert cstep.dsv4_builder_capture_flag(_bc(128), GFX950) == []
    for ratio in (1, 4, 128):
        for tab in fst.BUILDER_TABLE_LAYOUTS[1:]:
            v = cstep.dsv4_builder_capture_flag(_bc(ratio, tab=tab), GFX950)
            assert v and v[0].message == cstep.BUILDER_LAYOUT_DIFFERS and "slot_mapping" in v[0].where, (ratio, tab)
    monkeypatch.setattr(impl_step, "_lookup", real_lookup)
    real_build = impl_step.build_layer_metadata
    monkeypatch.setattr(impl_step, "build_layer_metadata",
                        lambda r, positions, *a, **k: real_build(r, _packed_read(positions), *a, **k))
    v = cstep.dsv4_builder_capture_flag(_bc(4, vec="strided", capture=False), GFX942)
    assert [x.message for x in v] == [cstep.BUILDER_LAYOUT_DIFFERS]


def test_a_builder_refusing_unnamed_or_writing_its_inputs_is_caught(monkeypatch):
    real_build = impl_step.build_layer_metadata

    def refuses(msg):
        def f(r, positions, token_to_req, swa_block_table, *a, **k):
            if not swa_block_table.is_contiguous():
                raise ValueError(msg)
            return real_build(r, positions, token_to_req, swa_block_table, *a, **k)
        return f

    monkeypatch.setattr(impl_step, "build_layer_metadata", refuses("swa_block_table: expected a contiguous tensor"))
    assert cstep.dsv4_builder_capture_flag(_bc(tab="slice"), GFX950) == []
    monkeypatch.setattr(impl_step, "build_layer_metadata", refuses("unsupported"))
    assert [x.message for x in cstep.dsv4_builder_capture_flag(_bc(tab="slice"), GFX950)] == \
        [cstep.BUILDER_REFUSAL_UNCLEAR]

    def scribbles(r, positions, *a, **k):  # builds right, then writes a gap of the positions' buffer
        out = real_build(r, positions, *a, **k)
        if not positions.is_contiguous():
            positions.as_strided((1,), (1,), positions.storage_offset() + 1).fill_(3)
        return out

    monkeypatch.setattr(impl_step, "build_layer_metadata", scribbles)
    v = cstep.dsv4_builder_capture_flag(_bc(vec="strided", capture=False), GFX950)
    assert [x.message for x in v] == [cstep.BUILDER_INPUT_WRITTEN]


# --- the DSv4 step -----------------------------------------------------------------------------------------------

def _step(layout="strided", graph=False):
    return Dsv4StepCase(seed=1, contexts=(5, 2), steps=2, heads=1, window=4, swa_block_size=2, c4a_block_size=4,
                        c128a_block_size=128, topk=3, cu_count=1, scale=0.11, sink="none", padded=True,
                        layers=("swaonly",), input_layout=layout, graph=graph)


def test_ours_steps_the_same_through_strided_inputs():
    assert cstep.dsv4_step_agreement(_step(), GFX950) == []
    assert cstep.dsv4_step_agreement(_step(graph=True), GFX942) == []


def test_a_step_whose_decode_reads_q_as_packed_is_caught(monkeypatch):
    real = impl_decode.sparse_attn_decode
    monkeypatch.setattr(impl_decode, "sparse_attn_decode", lambda q, *a, **k: real(_packed_read(q), *a, **k))
    assert cstep.dsv4_step_agreement(_step("contiguous"), GFX950) == []
    v = cstep.dsv4_step_agreement(_step(), GFX950)
    assert v and "decode output" in v[0].message


def test_a_step_whose_builder_reads_positions_as_packed_is_caught(monkeypatch):
    real = impl_step.build_layer_metadata
    monkeypatch.setattr(impl_step, "build_layer_metadata",
                        lambda r, positions, *a, **k: real(r, _packed_read(positions), *a, **k))
    v = cstep.dsv4_step_agreement(_step(), GFX950)
    # the wrong positions show first in the metadata's slot mappings (checked before the writes), then in the cache
    assert v and ("swa_slot_mapping" in v[0].message or "SWA cache" in v[0].message), v[0].message
