"""Ragged helpers against their loop oracles (SPEC 1.3 SWA window, SPEC 2 dense->ragged and C4A global slots)."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import impl  # noqa: F401  (configures Triton before anything imports it)
from impl import ragged
from oracles import ragged as ref

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
_values = st.one_of(st.integers(-3, 40), st.sampled_from([-1, INT32_MIN, INT32_MAX]))


@settings(max_examples=60, deadline=None, database=None)
@given(st.integers(0, 5).flatmap(lambda R: st.tuples(
    st.integers(0, 7).flatmap(lambda W: st.lists(st.lists(_values, min_size=W, max_size=W), min_size=R, max_size=R)),
    st.one_of(st.none(), st.lists(st.integers(-2, 9), min_size=R, max_size=R)),
    st.sampled_from([-1, 0, 5, 33]))))
def test_dense_to_ragged_matches_oracle(args):
    dense, lens, num_rows = args
    W = len(dense[0]) if dense else 0
    d = torch.tensor(dense, dtype=torch.int32).reshape(len(dense), W)
    tl = None if lens is None else torch.tensor(lens, dtype=torch.int32)
    idx, indptr = ragged.build_ragged_indices_from_dense(d, tl, num_rows)
    want_idx, want_ptr = ref.ref_ragged_from_dense([list(r) for r in dense], lens, num_rows)
    assert idx.dtype == torch.int32 and indptr.dtype == torch.int32
    assert idx.tolist() == want_idx
    assert indptr.tolist() == want_ptr


def test_dense_to_ragged_keeps_prefix_not_valid_entries():
    # SPEC: the *first* len entries are kept, even when a -1 sits among them
    d = torch.tensor([[4, -1, 7, 9], [-1, -1, -1, -1]], dtype=torch.int32)
    idx, indptr = ragged.build_ragged_indices_from_dense(d, None, num_rows=8)
    assert indptr.tolist() == [0, 3, 3]
    assert idx.tolist() == [4, -1, 7]  # count(>=0) = 3 -> [4, -1, 7]; 9 is dropped, 7 stays (< 8)


_tables = st.integers(1, 3).flatmap(lambda R: st.integers(1, 4).flatmap(
    lambda nb: st.lists(st.lists(st.integers(-1, 9), min_size=nb, max_size=nb), min_size=R, max_size=R)))


@settings(max_examples=60, deadline=None, database=None)
@given(_tables, st.sampled_from([1, 2, 5, 61]), st.integers(0, 6).flatmap(
    lambda T: st.tuples(st.lists(st.lists(st.integers(-2, 130), min_size=4, max_size=4), min_size=T, max_size=T),
                        st.lists(st.integers(-1, 3), min_size=T, max_size=T),
                        st.one_of(st.none(), st.lists(st.booleans(), min_size=T, max_size=T)))))
def test_global_topk_matches_oracle(table, bs, rows):
    local, reqs, valid = rows
    T = len(local)
    idx, indptr = ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.tensor(local, dtype=torch.int32).reshape(T, 4), torch.tensor(reqs, dtype=torch.int32),
        torch.tensor(table, dtype=torch.int32), bs, None if valid is None else torch.tensor(valid, dtype=torch.bool))
    want_idx, want_ptr = ref.ref_global_topk(local, reqs, table, bs, valid)
    assert idx.tolist() == want_idx
    assert indptr.tolist() == want_ptr


@settings(max_examples=60, deadline=None, database=None)
@given(_tables, st.sampled_from([1, 2, 5, 64]), st.sampled_from([1, 3, 8, 128]), st.integers(0, 6).flatmap(
    lambda T: st.tuples(st.lists(st.integers(-3, 300), min_size=T, max_size=T),
                        st.lists(st.integers(0, 2), min_size=T, max_size=T))))
def test_swa_window_matches_oracle(table, bs, window, rows):
    positions, reqs = rows
    idx, lens = ragged.compute_swa_indices_and_lens(torch.tensor(positions, dtype=torch.int64),
                                                    torch.tensor(reqs, dtype=torch.int32),
                                                    torch.tensor(table, dtype=torch.int32), bs, window)
    want_rows, want_lens = ref.ref_swa_window(positions, reqs, table, bs, window)
    assert tuple(idx.shape) == (len(positions), 1, window) and idx.dtype == torch.int32
    assert idx.reshape(len(positions), window).tolist() == want_rows
    assert lens.tolist() == want_lens


def test_swa_window_example():
    # window 4 at position 5 with block size 2: positions 2..5 -> blocks table[0][1], table[0][2]
    table = torch.tensor([[7, 3, 9]], dtype=torch.int32)
    idx, lens = ragged.compute_swa_indices_and_lens(torch.tensor([5, 1]), torch.tensor([0, 0]), table, 2, 4)
    assert lens.tolist() == [4, 2]
    assert idx[:, 0].tolist() == [[6, 7, 18, 19], [14, 15, -1, -1]]


@pytest.mark.parametrize("call, match", [
    (lambda: ragged.build_ragged_indices_from_dense(torch.zeros(2, 3), None), "dense_indices: expected dtype"),
    (lambda: ragged.build_ragged_indices_from_dense(torch.zeros(2, 3, dtype=torch.int32),
                                                     torch.zeros(3, dtype=torch.int32)), "topk_lens: expected 2"),
    (lambda: ragged.compute_swa_indices_and_lens(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int32),
                                                 torch.zeros(1, 1, dtype=torch.int32), 0, 4), "block_size"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(2, 3, dtype=torch.int32), torch.zeros(3, dtype=torch.int32),
        torch.zeros(1, 1, dtype=torch.int32), 4), "token_to_req: expected 2"),
])
def test_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


# --- the contract's cases, the edges and the rejections ------------------------------------------------------------

from contracts import ragged as contract_ragged  # noqa: E402
from fuzz import ragged as fz  # noqa: E402
from impl.targets import get_target  # noqa: E402

I32, I64 = torch.int32, torch.int64


def test_ours_passes_the_contract_on_many_drawn_cases_and_they_replay_from_json():
    t = get_target("generic")
    for seed in range(150):
        case = fz.case_from_seed(seed)
        assert type(case).from_json(case.to_json()) == case
        assert contract_ragged.ragged_helpers_oracle(case, t) == [], seed


def test_a_table_sliced_from_a_wider_buffer_is_read_only_up_to_its_width():
    buf = torch.full((2, 5), fz.POISON_BLOCK, dtype=I32)
    buf[:, :2] = torch.tensor([[4, 5], [6, 7]], dtype=I32)
    table = buf[:, :2]
    idx, _ = ragged.compute_global_topk_ragged_indices_and_indptr(torch.tensor([[0, 3, 4, 7]], dtype=I32),
                                                                  torch.tensor([1], dtype=I32), table, 2)
    assert idx.tolist() == [12, 15, -1, -1]  # ids 4 and 7: columns 2 and 3, past the width (the buffer holds 7777)
    sw, lens = ragged.compute_swa_indices_and_lens(torch.tensor([4]), torch.tensor([0]), table, 2, 3)
    assert lens.tolist() == [3] and sw[0, 0].tolist() == [10, 11, -1]  # positions 2, 3 in block 5; 4 past the width


def test_int32_extremes_and_both_index_dtypes():
    table = torch.tensor([[1, 2]], dtype=I32)
    for dt in (I32, I64):
        # position 2^31 - 1 in an int32 tensor: computed in int64, a full window past the table
        sw, lens = ragged.compute_swa_indices_and_lens(torch.tensor([2 ** 31 - 1, -2 ** 31], dtype=dt),
                                                       torch.tensor([0, 0], dtype=dt), table.to(dt), 4, 3)
        assert lens.tolist() == [3, 0] and sw.reshape(2, 3).tolist() == [[-1] * 3] * 2
        idx, ptr = ragged.compute_global_topk_ragged_indices_and_indptr(
            torch.tensor([[2 ** 31 - 1, -2 ** 31, 5]], dtype=dt), torch.tensor([0], dtype=dt), table.to(dt), 4)
        assert idx.tolist() == [-1, 9] and ptr.tolist() == [0, 2] and idx.dtype == ptr.dtype == I32
    # the largest block id whose slots fit int32, and one past it (rejected, never wrapped)
    top = torch.tensor([[(2 ** 31) // 64 - 1]], dtype=I64)
    idx, _ = ragged.compute_global_topk_ragged_indices_and_indptr(torch.tensor([[63]]), torch.tensor([0]), top, 64)
    assert idx.tolist() == [2 ** 31 - 1]
    with pytest.raises(ValueError, match="block_table: block id 33554432 with block_size 64"):
        ragged.compute_global_topk_ragged_indices_and_indptr(torch.tensor([[0]]), torch.tensor([0]), top + 1, 64)
    with pytest.raises(ValueError, match="block_table: block id"):
        ragged.compute_swa_indices_and_lens(torch.tensor([0]), torch.tensor([0]), top + 1, 64, 2)
    # an int64 dense value past int32: -1 under a num_rows check, rejected without one
    wide = torch.tensor([[2 ** 31, 3]], dtype=I64)
    assert ragged.build_ragged_indices_from_dense(wide, None, 8)[0].tolist() == [-1, 3]
    with pytest.raises(ValueError, match="dense_indices: kept value 2147483648 does not fit the int32 output"):
        ragged.build_ragged_indices_from_dense(wide, None, -1)


_meta = torch.zeros(1, dtype=I32, device="meta")


@pytest.mark.parametrize("call, exc, match", [
    (lambda: ragged.build_ragged_indices_from_dense(torch.zeros(1, 2, dtype=I32), _meta), ValueError,
     "topk_lens: expected device cpu"),
    (lambda: ragged.build_ragged_indices_from_dense(torch.zeros(1, 2, dtype=I32), None, 2.0), TypeError, "num_rows"),
    (lambda: ragged.build_ragged_indices_from_dense(torch.zeros(2, dtype=I32)), ValueError,
     "dense_indices: expected 2 dimensions"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(1, 2, dtype=I32), _meta, torch.zeros(1, 1, dtype=I32), 4), ValueError,
     "token_to_req: expected device"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32), torch.zeros(1, 1), 4), TypeError, "block_table"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32), torch.zeros(1, 1, dtype=I32), True), ValueError,
     "block_size"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32), torch.zeros(1, 1, dtype=I32), 4,
        torch.ones(1, dtype=I32)), TypeError, "is_valid_token: expected a bool tensor"),
    (lambda: ragged.compute_global_topk_ragged_indices_and_indptr(
        torch.zeros(1, 2, dtype=I32), torch.zeros(1, dtype=I32), torch.zeros(1, 1, dtype=I32), 4,
        torch.ones(2, dtype=torch.bool)), ValueError, "is_valid_token: expected 1 entries"),
    (lambda: ragged.compute_swa_indices_and_lens(torch.zeros(2, dtype=I32), torch.zeros(2, dtype=I32),
                                                 torch.zeros(1, 1, dtype=I32, device="meta"), 4, 4), ValueError,
     "block_table: expected device"),
    (lambda: ragged.compute_swa_indices_and_lens(torch.zeros(2, dtype=I32), torch.zeros(2, dtype=I32),
                                                 torch.zeros(1, 1, dtype=I32), 4, 0), ValueError, "window"),
    (lambda: ragged.compute_swa_indices_and_lens(torch.zeros(2, 1, dtype=I32), torch.zeros(2, dtype=I32),
                                                 torch.zeros(1, 1, dtype=I32), 4, 2), ValueError,
     "positions: expected 1 dimensions"),
])
def test_bad_input_is_rejected_naming_the_argument_and_nothing_changes(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_the_helpers_leave_their_inputs_as_they_were():
    case = contract_ragged._examples(get_target("generic"))[0]
    for helper, entry in (("dense", ragged.build_ragged_indices_from_dense),
                          ("global", ragged.compute_global_topk_ragged_indices_and_indptr),
                          ("swa", ragged.compute_swa_indices_and_lens)):
        kw = fz.make_inputs(case, helper, "cpu")
        before = {k: v.clone() for k, v in kw.items() if isinstance(v, torch.Tensor)}
        entry(**kw)
        assert all(torch.equal(kw[k], v) for k, v in before.items()), helper


def test_dense_to_ragged_num_rows_left_out_is_no_check():
    # SPEC 2: num_rows = -1 turns the bound off, and it is the default (callers leave it out)
    d = torch.tensor([[4, 90, -1]], dtype=torch.int32)
    idx, indptr = ragged.build_ragged_indices_from_dense(d)
    assert idx.tolist() == [4, 90] and indptr.tolist() == [0, 2]


def test_ragged_family_forces_every_row_and_reaches_the_default():
    from fuzz.ragged import RAGGED_DIMENSIONS as fam, case_from_seed, make_inputs
    from impl.targets import get_target

    t = get_target("generic")
    rows = fam.covering_array(t, 2)
    forced = [fam.force(case_from_seed(s), row, t) for s, row in enumerate(rows)]
    for case, row in zip(forced, rows):
        got = fam.classify(case, t)
        assert {k: got.get(k) for k in row} == row
    left_out = [c for c in forced if c.dense.num_rows is None]
    assert left_out and all("num_rows" not in make_inputs(c, "dense", "cpu") for c in left_out)
