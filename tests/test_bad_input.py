"""bad-input-refusal (contracts/bad_input.py, fuzz/bad_input.py): every declared breakage of every checked argument
is refused by ours, and the check itself notices an accepted argument, a launch, a write and an unnamed refusal."""
from __future__ import annotations

import pytest
import torch

from contracts import bad_input as cb
from contracts.subjects import SubjectUnavailable, using
from contracts.subjects.base import Subject
from fuzz import bad_input as fz
from fuzz import domains
from fuzz.bad_input import BadInputCase
from impl.runtime import kernel_device
from impl.targets import TARGETS

T942 = TARGETS["gfx942"]


def _case(entry, arg=None, breakage=None, target=T942):
    """A covering row's case of ``entry`` (a valid call drawn by the entry's generator), narrowed to one breakage."""
    base = fz.force_bad_input(fz._examples(target)[0], {"entry": entry}, target)
    return base.replace(arg=arg, breakage=breakage)


def test_every_entry_is_a_covering_row_and_every_pair_is_checked_by_its_case():
    fam = fz.BAD_INPUT_DIMENSIONS
    rows = fam.covering_array(T942, 2)
    assert [r["entry"] for r in rows] == sorted(fz.ENTRIES)
    for name, e in fz.ENTRIES.items():
        want = [(a, b) for a in sorted(e.args) for b in e.args[a].breakages()]
        assert fz.BadInputCase(entry=name).breakages() == want and want, name
    assert all("dim2-small" in s.breakages() for s in (fz.ENTRIES["formats.pack_fp8_ds_mla"].args["cache"],))


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_forced_rows_carry_a_generated_call_that_carries_every_breakage(target):
    t = TARGETS[target]
    for row in fz.BAD_INPUT_DIMENSIONS.covering_array(t, 2):
        case = fz.force_bad_input(fz._examples(t)[0], row, t)
        assert fz.classify_bad_input(case, t) == row
        assert case.inner is not None, row  # a valid call from the entry's own generator
        assert BadInputCase.from_json(case.to_json()) == case
        for arg, breakage in case.breakages():
            assert fz.inner_of(case, arg, breakage, t) is not None, (row, arg, breakage)


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_ours_refuses_every_breakage_of_every_entry(target):
    t = TARGETS[target]
    rows = fz.BAD_INPUT_DIMENSIONS.covering_array(t, 2)
    for row in rows if target == "gfx942" else rows[::3]:
        case = fz.force_bad_input(fz._examples(t)[0], row, t)
        assert cb.bad_input_refusal(case, t) == [], row


def test_the_two_issue_30_breakages_are_refused_and_named():
    # a cache view one byte narrower per token (strides of the 584-byte cache) and a writing token's request id
    # past the state table: the breakages the two surviving mutants of issue 30 let through
    c = _case("formats.pack_fp8_ds_mla", "cache", "dim2-small")
    inner = fz.inner_of(c, "cache", "dim2-small", T942)
    inputs = fz.ENTRIES[c.entry].build(inner, "cpu", T942)
    fz.break_inputs(c.entry, "cache", "dim2-small", c.seed, inputs, inner)
    assert inputs["cache"].shape[2] == 583 and inputs["cache"].stride(1) == 584
    assert cb.bad_input_refusal(c, T942) == []
    c = _case("indexer_writer.compress_norm_rope_store_indexer", "token_to_req", "range-high")
    assert cb.bad_input_refusal(c, T942) == []


def _fake_entry(monkeypatch, fn):
    monkeypatch.setattr(cb, "_entry", lambda target, name: fn)


def test_an_accepted_argument_is_a_violation(monkeypatch):
    c = _case("cache_writers.quantize_and_insert_k_cache", "slot_mapping", "dtype")
    _fake_entry(monkeypatch, lambda **kw: None)
    assert [v.message for v in cb.bad_input_refusal(c, T942)] == [cb.REFUSAL_MISSING]


def test_a_launch_before_the_refusal_is_a_violation(monkeypatch):
    from impl import codec_kernels

    c = _case("cache_writers.quantize_and_insert_k_cache", "k", "dtype")

    def launches(**kw):
        codec_kernels.fp8_decode_triton(torch.zeros(4, dtype=torch.uint8), "ocp")

    _fake_entry(monkeypatch, launches)
    assert [v.message for v in cb.bad_input_refusal(c, T942)] == [cb.REFUSAL_LAUNCHED]


def test_launches_refused_restores_the_launch_path():
    from impl import codec_kernels

    with pytest.raises(cb.KernelLaunched):
        with cb.launches_refused():
            codec_kernels.fp8_decode_triton(torch.zeros(4, dtype=torch.uint8), "ocp")
    assert codec_kernels.fp8_decode_triton(torch.zeros(4, dtype=torch.uint8), "ocp").shape == (4,)


def test_a_write_before_the_refusal_and_an_unnamed_refusal_are_violations(monkeypatch):
    c = _case("cache_writers.quantize_and_insert_k_cache", "slot_mapping", "range-high")
    calls = []

    def writes_then_refuses(k, slot_mapping, cache, **kw):
        calls.append(1)
        if len(calls) > 1:  # the first call is the valid one, which must be accepted
            cache[0, 0, 0] ^= 0xFF
            raise ValueError("something is off")

    _fake_entry(monkeypatch, writes_then_refuses)
    assert sorted(v.message for v in cb.bad_input_refusal(c, T942)) == sorted([cb.REFUSAL_UNNAMED, cb.REFUSAL_WROTE])


def test_a_refusal_of_the_valid_call_is_a_violation(monkeypatch):
    c = _case("cache_writers.quantize_and_insert_k_cache", "k", "dtype")

    def refuses_everything(k, **kw):
        raise TypeError("k: no")

    _fake_entry(monkeypatch, refuses_everything)
    assert [v.message for v in cb.bad_input_refusal(c, T942)] == [cb.VALID_REFUSED]


def test_a_foreign_exception_is_a_violation(monkeypatch):
    c = _case("compressor.compress_norm_rope_store", "slot_mapping", "dim0-small")
    calls = []

    def crashes(**kw):
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("The size of tensor a (2) must match the size of tensor b (3)")

    _fake_entry(monkeypatch, crashes)
    assert [v.message for v in cb.bad_input_refusal(c, T942)] == [cb.REFUSAL_WRONG_TYPE]


def test_vllm_rows_are_skipped_with_a_reason():
    c = _case("decode.sparse_attn_decode", "q", "dtype")
    with using(Subject("vllm", "0.34.0")):
        with pytest.raises(SubjectUnavailable, match="callers"):
            cb.bad_input_refusal(c, T942)


def test_reach_classes():
    assert domains.reach_class(_case("decode.sparse_attn_decode", "q", "dtype")) == "caller-contract"
    assert domains.reach_class(_case("decode.sparse_attn_decode", "main_indptr", "range-high")) == "adversarial"


def test_overlap_breakages_share_exactly_one_element():
    c = _case("epilogues.inverse_rope_gptj", "out", "overlap-tail")
    inner = fz.inner_of(c, "out", "overlap-tail", T942)
    for kind in fz.OVERLAP_BREAKAGES:
        inputs = fz.build_call(fz.ENTRIES[c.entry], inner, "cpu", T942)
        x_before = inputs["x"].clone()
        fz.break_inputs(c.entry, "out", kind, 0, inputs, inner)
        x, out = inputs["x"], inputs["out"]
        assert torch.equal(x, x_before)  # x keeps its values
        n, e = x.numel(), x.element_size()
        assert x.untyped_storage().data_ptr() == out.untyped_storage().data_ptr()
        first, last = (out, x) if kind == "overlap-tail" else (x, out)
        assert first.storage_offset() - last.storage_offset() == n - 1 and e == out.element_size()
    assert cb.bad_input_refusal(c.replace(breakage=None), T942) == []


def test_scalar_breakages_and_method_entries():
    # a count set negative (the surviving mutant of the brief let num_reqs = -1 through) and a float in place of it
    c = _case("sparse_metadata.SparseMLAMetadataBuilder.build", "num_reqs")
    assert [b for _, b in c.breakages()] == ["dtype", "range-low"]
    inner = fz.inner_of(c, "num_reqs", "range-low", T942)
    inputs = fz.build_call(fz.ENTRIES[c.entry], inner, "cpu", T942)
    fz.break_inputs(c.entry, "num_reqs", "range-low", 0, inputs, inner)
    assert inputs["num_reqs"] == -1
    assert cb.bad_input_refusal(c, T942) == []
    from impl.sparse_metadata import SparseMLAMetadataBuilder

    assert cb._entry(T942, c.entry) is SparseMLAMetadataBuilder.build


def test_a_write_into_an_object_arguments_buffer_is_a_violation(monkeypatch):
    # the builder's persistent buffers are among what the call is handed: a refused build that wrote them is caught
    c = _case("sparse_metadata.SparseMLAMetadataBuilder.build", "num_reqs", "range-low")
    calls = []

    def writes_then_refuses(builder, common):
        calls.append(1)
        if len(calls) > 1:
            builder.req_id_per_token[0] += 1
            raise ValueError("num_reqs: no")

    _fake_entry(monkeypatch, writes_then_refuses)
    got = cb.bad_input_refusal(c, T942)
    assert [v.message for v in got] == [cb.REFUSAL_WROTE] and "self.req_id_per_token" in got[0].got


def test_build_call_copies_all_but_shared_arguments():
    for name in ("graph_capture.DecodeGraph.replay", "sparse_metadata.SparseMLAMetadataBuilder.build"):
        e = fz.ENTRIES[name]
        inner = fz.valid_draw(e, 0, T942)
        a, b = fz.build_call(e, inner, kernel_device(), T942), fz.build_call(e, inner, kernel_device(), T942)
        assert (a["self"] is b["self"]) == ("self" in e.shared)
        assert all(a[k] is not b[k] for k, v in a.items() if isinstance(v, torch.Tensor))


def test_a_valid_call_never_carries_a_layout_its_entry_may_refuse():
    """The valid call a breakage starts from is drawn by the entry's generator, which also draws the layouts an entry
    point may refuse (a strided sink for a graph capture): such a draw is no valid call. A fresh clone's audit drew
    one (seed 7444, gfx942: the capture refused its own valid call's strided sink); every entry with refusable
    layouts now declares them, and that case passes."""
    from fuzz import graph_capture as fgc
    from impl.targets import get_target

    for name in ("graph_capture.DecodeGraph.capture", "graph_capture.DecodeGraph.replay"):
        entry = fz.ENTRIES[name]
        case = fgc.GraphCase.from_json(_SAVED_GRAPH_CASE)
        assert entry.valid is not None and entry.valid(case)
        assert not entry.valid(case.replace(sink="ordinary", sink_layout="strided"))
    saved = BadInputCase(entry="graph_capture.DecodeGraph.capture", inner=_SAVED_GRAPH_CASE, seed=7444)
    assert cb.bad_input_refusal(saved, get_target("gfx942")) == []
    # the inverse RoPE may refuse an out overlapping x and a strided layout (contracts.epilogues): a CPU run of
    # test_contract_holds drew one (seed 500, generic: "positions: expected a contiguous tensor" on the valid call)
    from fuzz import epilogues as fep

    rope = fep.RopeCase.from_json(_SAVED_ROPE_CASE)
    entry = fz.ENTRIES["epilogues.inverse_rope_gptj"]
    assert entry.valid is not None and not entry.valid(rope)
    assert entry.valid(rope.replace(alias="separate", layout="contiguous"))
    saved = BadInputCase(entry="epilogues.inverse_rope_gptj", inner=_SAVED_ROPE_CASE, seed=500)
    assert cb.bad_input_refusal(saved, get_target("generic")) == []


_SAVED_ROPE_CASE = {
    "kind": "rope", "schema_version": 1, "seed": 208733037, "tokens": 3, "heads": 1, "width": 96, "max_pos": 14,
    "positions": [4, 0, 0], "scale": 0.001, "specials": [[254, 1e-40], [2, 1e-40]], "in_dtype": "bfloat16",
    "out_dtype": "bfloat16", "cos_sin": "angles", "alias": "tail", "layout": "positions-strided"}


#: the valid call of the case above, as the audit's reproducer stored it
_SAVED_GRAPH_CASE = {
    "kind": "graph-replay", "schema_version": 1, "seed": 0, "batch": 1, "heads": 1, "compress_ratio": 0,
    "max_main": 1, "max_extra": None, "main_bs": 1, "extra_bs": 1, "padded": False, "invalid_rate": 0.0,
    "scale": 0.0625, "sink": "none", "q_transposed": False, "cu_count": 1,
    "capture": {"rows": 1, "main_lens": [1], "extra_lens": None, "main_slack": 0, "extra_slack": 0},
    "replays": [{"rows": 1, "main_lens": [0], "extra_lens": None, "main_slack": 0, "extra_slack": 0},
                {"rows": 1, "main_lens": [1], "extra_lens": None, "main_slack": 0, "extra_slack": 0}],
    "q_layout": "contiguous", "cache_layout": "packed", "index_layout": "contiguous", "sink_layout": "contiguous"}
