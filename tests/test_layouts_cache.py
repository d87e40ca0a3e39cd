"""The cache writers' memory-layout dimension (issue 30 item 1): forced layouts classify as forced and keep the
values (only memory changes), a strided per-token vector is refused before launch with the pool untouched, a writer
that ignores a stride is caught, and upstream-style packed reads are told apart from a refusal."""
import dataclasses

import pytest
import torch

from contracts import cache_writers as cw
from contracts import indexer_writer as ciw
from fuzz import cache_writers as fw
from fuzz import indexer_writer as fiw
from fuzz.cache_writers import CompressorCase, SwaCase, WriterCase
from impl import cache_writers as impl_cw
from impl.runtime import kernel_device
from impl.targets import get_target
from oracles.formats import storage_bytes

#: where the kernels run (the host under the interpreter, the GPU natively): inputs that reach a kernel live there
DEV = kernel_device()

TARGETS = ("gfx942", "gfx950")


@pytest.mark.parametrize("family", [fw.WRITER_DIMENSIONS, fiw.INDEXER_WRITER_DIMENSIONS], ids=lambda f: f.name)
@pytest.mark.parametrize("target", TARGETS)
def test_every_covering_row_forces_onto_the_examples_and_classifies_as_forced(family, target):
    t = get_target(target)
    rows = family.covering_array(t, 2)
    layouts = {r.get("layout", r.get("inputs")) for r in rows} | {r.get("inputs") for r in rows}
    assert {"contiguous", "pool-slice", "strided", "strided-index"} <= layouts
    for ex in family.examples(t):
        for row in rows:
            got = family.classify(family.force(ex, row, t), t)
            assert {k: got.get(k) for k in row} == row


def _swa(layout: str) -> SwaCase:
    return SwaCase(seed=3, T=3, slots=(2, 0, 1), log_scale=(0, 3, -3), num_blocks=3, input_layout=layout)


@pytest.mark.parametrize("layout", ["strided", "strided-index"])
def test_a_layout_keeps_the_values_and_changes_the_memory(layout):
    base_k, base_slots = fw.build_swa_inputs(_swa("contiguous"), DEV)
    k, slots = fw.build_swa_inputs(_swa(layout), DEV)
    assert torch.equal(k.view(torch.int16), base_k.view(torch.int16)) and torch.equal(slots, base_slots)
    if layout == "strided":
        assert k.stride(0) > k.shape[1] and k.storage_offset() > 0
    else:
        assert slots.stride(0) == 2
    comp = CompressorCase(seed=4, ratio=4, state_block_size=4, positions=(3, 7, 11), reqs=(0, 1, 0), num_reqs=2,
                          slots=(0, 1, 2), num_blocks=3)
    a = fw.build_compressor_inputs(comp, DEV)
    b = fw.build_compressor_inputs(dataclasses.replace(comp, input_layout=layout), DEV)
    for name in a:
        assert torch.equal(a[name], b[name]), name
    assert any(not b[n].is_contiguous() for n in b)


def test_a_strided_slot_mapping_is_refused_before_launch_pool_untouched():
    t = get_target("gfx950")
    case = _swa("strided-index")
    dev = kernel_device()  # where the kernels run: the refusal must be the layout's, not the device's
    k, slots = fw.build_swa_inputs(case, dev)
    _, cache = fw.build_cache(case, dev)
    before = storage_bytes(cache)[0].clone()
    with pytest.raises(ValueError, match="slot_mapping: expected a contiguous vector"):
        impl_cw.quantize_and_insert_k_cache(k, slots, cache, target=t)
    assert torch.equal(storage_bytes(cache)[0], before)
    # and the contract accepts that refusal
    assert cw.compare_strided_index(case, t).violations == []


def test_a_pool_slice_keeps_the_bytes_on_both_sides_of_the_view():
    case = dataclasses.replace(_swa("contiguous"), extra_blocks_before=1, padded=True)
    pool, view = fw.build_cache(case, DEV, fill=0xAB)
    _, base = storage_bytes(view)
    assert base > 0 and pool.numel() > base + view.shape[0] * view.stride(0)


def test_a_writer_that_reads_the_slot_mapping_packed_is_caught(monkeypatch):
    """A planted bug: the contiguity check removed, so the kernel reads the stride-2 slot mapping as packed."""
    t = get_target("gfx950")
    monkeypatch.setattr(impl_cw, "require_contiguous_vector", lambda name, x: None)
    got = cw.compare_strided_index(_swa("strided-index"), t).violations
    assert [v.message for v in got] == [cw.STRIDED_READ_PACKED]


def test_a_refusal_that_writes_or_names_nothing_is_caught(monkeypatch):
    t = get_target("gfx950")

    def write_then_refuse(inner, target, dev):
        before, cache, _ = cw._write_once(inner, target, dev)

        def call():
            cache[0, 0, 0] = 7
            raise ValueError("bad input")
        return before, cache, call

    got = cw.compare_strided_index(_swa("strided-index"), t, write_then_refuse).violations
    assert {v.message for v in got} == {cw.REFUSAL_UNCLEAR, cw.REFUSAL_WROTE}


def test_a_writer_that_ignores_k_row_stride_is_caught(monkeypatch):
    """A planted bug: the SWA insert given the packed width for k's row stride (the zoo's swa-k-row-stride-packed)."""
    t = get_target("gfx950")
    kernel = impl_cw._swa_insert_kernel

    class PackedRows:
        def __getitem__(self, grid):
            launch = kernel[grid]
            return lambda k, k_row_stride, *rest, **kw: launch(k, k.shape[1], *rest, **kw)

    monkeypatch.setattr(impl_cw, "_swa_insert_kernel", PackedRows())
    bad = cw.compare_writer_case(WriterCase(swa=_swa("strided")), t).violations
    good = cw.compare_writer_case(WriterCase(swa=_swa("contiguous")), t).violations
    assert bad and not good


def test_indexer_writer_strided_index_is_refused_by_ours():
    t = get_target("gfx942")
    case = fiw.DirectCase(seed=1, T=3, slots=(0, 1, 2), log_scale=(0, 0, 0), block_size=1, num_blocks=3,
                          input_layout="strided-index")
    assert ciw.compare_strided_index(case, t) == []


# --- the gather, the indexer logits, the epilogues and the sparse metadata (issue 30 items 1 and 3) -------------

from contracts import cp_gather as cg  # noqa: E402
from contracts import epilogues as ce  # noqa: E402
from contracts import indexer_logits as cl  # noqa: E402
from fuzz import cp_gather as fg  # noqa: E402
from fuzz import epilogues as fe  # noqa: E402
from fuzz import indexer_logits as fl  # noqa: E402
from fuzz import sparse_metadata as fsm  # noqa: E402
from impl import cp_gather as impl_cg  # noqa: E402



def _gather(**kw) -> fg.CpGatherCase:
    return fg.CpGatherCase(seed=5, layout="normal", block_size=16, num_blocks=3, seq_lens=(20, 5), table_width=2,
                           table=((2, 0), (1, 2)), **kw)


@pytest.mark.parametrize("layout", ["table_layout=column-major", "table_layout=slice", "seq_layout=strided",
                                    "out_layout=strided"])
def test_gather_layouts_keep_the_values(layout):
    field, value = layout.split("=")
    base = fg.build_gather_inputs(_gather(), DEV)
    inp = fg.build_gather_inputs(_gather(**{field: value}), DEV)
    for name in ("block_table", "cu_seqlen", "token_to_seq", "k_fp8", "k_scale"):
        assert torch.equal(inp[name], base[name]), name
    assert any(not inp[n].is_contiguous() for n in ("block_table", "cu_seqlen", "k_fp8"))


@pytest.mark.parametrize("target", TARGETS)
def test_gather_refuses_strided_metadata_before_launch_and_reads_the_other_layouts(target):
    t = get_target(target)
    inp = fg.build_gather_inputs(_gather(seq_layout="strided"), DEV)
    before = inp["k_fp8"].clone()
    with pytest.raises(ValueError, match="cu_seqlen: expected a contiguous vector"):
        impl_cg.cp_gather_indexer_k_quant_cache(inp["k_cache"], inp["k_fp8"], inp["k_scale"], inp["block_table"],
                                                inp["cu_seqlen"], inp["token_to_seq"], layout="normal", target=t)
    assert torch.equal(inp["k_fp8"], before)
    for kw in ({"seq_layout": "strided"}, {"table_layout": "column-major", "out_layout": "strided"}):
        assert cg.gather_oracle_exact(_gather(**kw), t) == []


def test_gather_that_reads_the_table_across_rows_is_caught(monkeypatch):
    t = get_target("gfx950")
    kernel = impl_cg._cp_gather_gfx950_kernel

    class PackedColumns:
        def __getitem__(self, grid):
            launch = kernel[grid]
            return lambda *a, **kw: launch(*a[:9], 1, *a[10:], **kw)  # block_table.stride(1) -> 1

    monkeypatch.setattr(impl_cg, "_cp_gather_gfx950_kernel", PackedColumns())
    got = cg.gather_oracle_exact(_gather(table_layout="column-major"), t)
    assert [v.message for v in got][:1] == [cg.LAYOUT_READ_PACKED]
    assert cg.gather_oracle_exact(_gather(), t) == []


def _logits(**kw) -> fl.IndexerLogitsCase:
    return fl.IndexerLogitsCase(seed=3, mode="decode", heads=4, topk=3, block_size=16, context_lens=(5, 9),
                                max_model_len=32, **kw)


@pytest.mark.parametrize("q_layout", fl.Q_LAYOUTS)
def test_q_layouts_keep_the_codes(q_layout):
    inp = fl.build_decode_inputs(_logits(), "ocp", DEV)
    q = fl.lay_out_q(inp.q, q_layout, "ocp")
    assert torch.equal(q.view(torch.uint8), inp.q.view(torch.uint8))
    assert q.is_contiguous() == (q_layout == "contiguous")
    w = fl.lay_out_weights(inp.weights, "column-major")
    assert torch.equal(w, inp.weights) and w.stride(1) != 1


@pytest.mark.parametrize("kw", [{"q_layout": "lane-strided"}, {"weights_layout": "column-major"},
                                {"q_layout": "heads-major", "weights_layout": "padded"}])
def test_logits_layouts_are_refused_or_read_right_by_ours(kw):
    assert cl.indexer_logits_agreement(_logits(**kw), get_target("gfx950")) == []


def test_logits_that_ignore_the_lane_stride_are_caught():
    """A planted reader of packed lanes: it hands the kernel q's storage as if packed (what ignoring q.stride(3)
    does); the packed call is the reference."""
    from impl import indexer_logits as il

    t = get_target("gfx950")
    case = _logits(q_layout="lane-strided")
    inp = fl.build_decode_inputs(case, "ocp", DEV)

    def run(q, w):
        codes = q.view(torch.uint8)
        packed_strides = torch.empty(codes.shape).stride()
        as_packed = codes.as_strided(codes.shape, packed_strides, codes.storage_offset()).view(q.dtype)
        return il.fp8_paged_mqa_logits(as_packed, inp.cache, w, inp.context_lens, inp.block_table, 32,
                                       layout="normal", target=t)

    good = run(inp.q, inp.weights).cpu()
    assert [v.message for v in cl.compare_layouts(case, run, inp.q, inp.weights, good, "ocp")] == \
        [cl.LAYOUT_READ_PACKED]


def test_rope_tail_overlap_is_refused_and_layouts_are_read_right_by_ours():
    t = get_target("gfx950")
    base = fe.RopeCase(seed=2, tokens=2, heads=2, width=128, max_pos=4, positions=(0, 3))
    for case in (base.replace(alias="tail"), *(base.replace(layout=lay) for lay in fe.ROPE_LAYOUTS)):
        assert ce.epilogue_oracle_agreement(fe.EpilogueCase(epilogue="rope", rope=case), t) == []
    x, _, _ = fe.rope_input(base, DEV)
    xv, out = fe.rope_out(base.replace(alias="tail"), x, x.dtype)
    assert out.data_ptr() == xv.reshape(-1)[-1:].data_ptr()  # exactly one shared element


def test_mxfp8_signed_zero_group_is_forced_and_classified():
    fam = fe.EPILOGUE_DIMENSIONS
    t = get_target("gfx950")
    case = fam.force(fe.epilogue_examples(t)[0], {"lanes": "signed-zero", "out_layout": "strided"}, t)
    assert fam.classify(case, t)["lanes"] == "signed-zero"
    assert ce.epilogue_oracle_agreement(case, t) == []


@pytest.mark.parametrize("layout", fsm.META_LAYOUTS)
def test_metadata_layouts_keep_the_values(layout):
    t = torch.tensor([0, 2, 5, 9], dtype=torch.int32)
    table = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    assert torch.equal(fsm.lay_out_ints(t, layout, 99), t)
    assert torch.equal(fsm.lay_out_ints(table, layout, 99), table)
    if layout == "strided":  # a reader of packed storage gets real offsets, still non-decreasing
        packed = fsm.lay_out_ints(t, layout, 99).as_strided((4,), (1,))
        assert packed.tolist() == [0, 0, 2, 2]
