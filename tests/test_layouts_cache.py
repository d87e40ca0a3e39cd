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
    base_k, base_slots = fw.build_swa_inputs(_swa("contiguous"), "cpu")
    k, slots = fw.build_swa_inputs(_swa(layout), "cpu")
    assert torch.equal(k.view(torch.int16), base_k.view(torch.int16)) and torch.equal(slots, base_slots)
    if layout == "strided":
        assert k.stride(0) > k.shape[1] and k.storage_offset() > 0
    else:
        assert slots.stride(0) == 2
    comp = CompressorCase(seed=4, ratio=4, state_block_size=4, positions=(3, 7, 11), reqs=(0, 1, 0), num_reqs=2,
                          slots=(0, 1, 2), num_blocks=3)
    a = fw.build_compressor_inputs(comp, "cpu")
    b = fw.build_compressor_inputs(dataclasses.replace(comp, input_layout=layout), "cpu")
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
    pool, view = fw.build_cache(case, "cpu", fill=0xAB)
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
