"""copy_ragged_to_graph_buffers: views at the persistent base pointer, the per-target view length, bad inputs."""
import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings

import impl  # noqa: F401  (sets the Triton mode before anything imports triton)
from fuzz.cases import CaseError
from fuzz.graph_buffers import GraphBufferCase, graph_buffer_cases, graph_buffer_inputs
from impl.graph_buffers import copy_ragged_to_graph_buffers, ragged_view_capacity
from impl.runtime import kernel_device
from oracles import graph_buffers as ref

DEV = kernel_device()
POISON = -5


def _buffers(n_idx=16, n_ptr=9):
    return (torch.full((n_idx,), POISON, dtype=torch.int32, device=DEV),
            torch.full((n_ptr,), POISON, dtype=torch.int32, device=DEV))


def test_upstream_graph_buffer_shape(target):
    """SPEC 2 (upstream T-NEW): 3 live entries in a source 6 wide, 2 rows x 8 -> view 6 on gfx950, 16 on gfx942
    (and the generic fallback), both at the buffer's data pointer; indptr carries the true NNZ."""
    ibuf, pbuf = _buffers()
    src = torch.tensor([11, 12, 13, -1, -1, -1], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEV)
    iview, pview = copy_ragged_to_graph_buffers(src, indptr, ibuf, pbuf, 2, 8, target=target)
    want_len = {"gfx950": 6, "gfx942": 16, "generic": 16}[target.name]
    assert iview.numel() == want_len == ref.view_length(target.name, 2, 8, 6)
    assert iview.data_ptr() == ibuf.data_ptr() and pview.data_ptr() == pbuf.data_ptr()
    assert pview.tolist() == [0, 2, 3]
    assert ibuf.tolist() == [11, 12, 13, -1, -1, -1] + [POISON] * 10
    assert pbuf.tolist() == [0, 2, 3] + [POISON] * 6


def test_replays_keep_pointers_and_follow_sizes(target):
    """A capture-then-replay sequence: the same buffers across steps of different sizes, pointers fixed, each view
    as the oracle says, stale entries past the new source left alone (indptr bounds the reads)."""
    ibuf, pbuf = _buffers(24, 5)
    before_i, before_p = ibuf.tolist(), pbuf.tolist()
    steps = [([4, 4, 4], 4), ([1, 0, 2], 0), ([0, 0, 0], 2), ([4, 1, 3], 1)]
    for lens, extra in steps:
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        src = list(range(100, 100 + indptr[-1])) + [-1] * extra
        iview, pview = copy_ragged_to_graph_buffers(
            torch.tensor(src, dtype=torch.int32, device=DEV), torch.tensor(indptr, dtype=torch.int32, device=DEV),
            ibuf, pbuf, 3, 6, target=target)
        want = ref.expected_after_copy(target.name, 3, 6, src, indptr, before_i, before_p)
        assert iview.data_ptr() == ibuf.data_ptr() and pview.data_ptr() == pbuf.data_ptr()
        assert iview.tolist() == want["indices_view"]
        assert pview.tolist() == want["indptr_view"]
        assert ibuf.tolist() == want["indices_buffer"] and pbuf.tolist() == want["indptr_buffer"]
        assert iview.numel() >= indptr[-1]
        before_i, before_p = ibuf.tolist(), pbuf.tolist()


def test_zero_rows_and_zero_width_give_one_entry(target):
    ibuf, pbuf = _buffers(1, 1)
    iview, pview = copy_ragged_to_graph_buffers(torch.zeros(0, dtype=torch.int32, device=DEV),
                                                torch.zeros(1, dtype=torch.int32, device=DEV), ibuf, pbuf, 0, 7,
                                                target=target)
    assert iview.numel() == 1 and pview.tolist() == [0]
    assert ibuf.tolist() == [POISON]
    assert ragged_view_capacity(target, 3, 0, 0) == 1


@pytest.mark.parametrize("kind, arg", [
    ("indices-buffer-short", "indices_buffer"), ("indptr-buffer-short", "indptr_buffer"),
    ("source-too-wide", "ragged_indices"), ("nnz-beyond-source", "ragged_indptr"),
    ("row-too-long", "ragged_indptr"), ("decreasing", "ragged_indptr"), ("indptr-len", "ragged_indptr"),
    ("nonzero-start", "ragged_indptr"),
])
def test_bad_input_rejected_before_writing(kind, arg):
    ibuf, pbuf = _buffers(8, 4)
    src = torch.tensor([1, 2, 3, 4], dtype=torch.int32, device=DEV)
    indptr = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEV)
    num_rows, width = 2, 4
    if kind == "indices-buffer-short":
        ibuf = ibuf[:7]
    elif kind == "indptr-buffer-short":
        pbuf = pbuf[:2]
    elif kind == "source-too-wide":
        src = torch.arange(9, dtype=torch.int32, device=DEV)
    elif kind == "nnz-beyond-source":
        src = src[:3]
    elif kind == "row-too-long":
        indptr = torch.tensor([0, 5, 5], dtype=torch.int32, device=DEV)
        src = torch.arange(5, dtype=torch.int32, device=DEV)
    elif kind == "decreasing":
        indptr = torch.tensor([0, 3, 2], dtype=torch.int32, device=DEV)
    elif kind == "indptr-len":
        indptr = indptr[:2]
    elif kind == "nonzero-start":
        indptr = torch.tensor([1, 2, 4], dtype=torch.int32, device=DEV)
    want = ref.rejected_argument(num_rows, width, src.tolist(), indptr.tolist(), ibuf.numel(), pbuf.numel())
    assert want == arg
    with pytest.raises(ValueError, match=arg):
        copy_ragged_to_graph_buffers(src, indptr, ibuf, pbuf, num_rows, width, target="gfx950")
    assert set(ibuf.tolist()) == {POISON} and set(pbuf.tolist()) == {POISON}


@pytest.mark.parametrize("which", ["ragged_indices", "ragged_indptr", "indices_buffer", "indptr_buffer"])
def test_wrong_dtype_names_the_argument(which):
    ibuf, pbuf = _buffers(8, 4)
    args = {"ragged_indices": torch.tensor([1, 2], dtype=torch.int32, device=DEV),
            "ragged_indptr": torch.tensor([0, 1, 2], dtype=torch.int32, device=DEV),
            "indices_buffer": ibuf, "indptr_buffer": pbuf}
    args[which] = args[which].to(torch.int64)
    with pytest.raises(TypeError, match=which):
        copy_ragged_to_graph_buffers(args["ragged_indices"], args["ragged_indptr"], args["indices_buffer"],
                                     args["indptr_buffer"], 2, 4, target="gfx942")
    assert set(ibuf.tolist()) == {POISON} and set(pbuf.tolist()) == {POISON}


def test_counts_must_be_ints():
    ibuf, pbuf = _buffers()
    src = torch.zeros(0, dtype=torch.int32, device=DEV)
    indptr = torch.zeros(1, dtype=torch.int32, device=DEV)
    with pytest.raises(TypeError, match="num_rows"):
        copy_ragged_to_graph_buffers(src, indptr, ibuf, pbuf, 0.0, 4, target="gfx950")
    with pytest.raises(ValueError, match="max_per_row"):
        copy_ragged_to_graph_buffers(src, indptr, ibuf, pbuf, 0, -1, target="gfx950")


# --- the typed case of ragged-view-capacity -----------------------------------------------------------------------

@settings(max_examples=60, deadline=None, database=None)
@given(graph_buffer_cases())
def test_graph_buffer_case_round_trips_through_json(case):
    assert GraphBufferCase.from_json(case.to_json()) == case
    assert GraphBufferCase.from_json(json.loads(json.dumps(case.to_json()))) == case


def test_graph_buffer_case_rejects_a_missing_field_and_bad_rows():
    case = GraphBufferCase(seed=3, num_rows=2, max_per_row=8, lens=(2, 1), source_extra=3, defect="row-too-long")
    for f in dataclasses.fields(case):
        doc = case.to_json()
        del doc[f.name]
        if f.name in GraphBufferCase.ADDED_FIELDS:  # added later: a case saved before it replays with the default
            assert GraphBufferCase.from_json(doc) == case
            continue
        with pytest.raises(CaseError, match=f"missing field {f.name}"):
            GraphBufferCase.from_json(doc)
    with pytest.raises(CaseError, match="defect"):
        GraphBufferCase.from_json({**case.to_json(), "defect": "row-too-short"})
    with pytest.raises(CaseError, match="lens: expected num_rows = 2"):
        GraphBufferCase.from_json({**case.to_json(), "lens": [1]})
    with pytest.raises(CaseError, match=r"lens: every row length must lie in \[0, max_per_row = 8\]"):
        GraphBufferCase.from_json({**case.to_json(), "lens": [9, 0]})


def test_graph_buffer_inputs_apply_the_defect():
    """The case's defect reaches the inputs: a row one longer than max_per_row, the source as wide as the NNZ."""
    inp = graph_buffer_inputs(GraphBufferCase(seed=1, num_rows=2, max_per_row=3, lens=(1, 2), source_extra=0,
                                              defect="row-too-long"))
    assert inp.indptr == [0, 4, 6] and inp.source.numel() == 6
    assert ref.rejected_argument(2, 3, inp.source.tolist(), inp.indptr, inp.indices_len, inp.indptr_len) == \
        "ragged_indptr"
