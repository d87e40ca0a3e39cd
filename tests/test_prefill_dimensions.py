"""The prefill families' declared dimensions reach the inputs the kernels get: a forced case's first row really has
its length class in the index tensors the entry is handed, and an assembly case's first request its prefix, q_len
and replay-shortened gather (tests/test_reach.py checks the classification; this checks the built inputs)."""
import pytest

from fuzz import prefill as fz
from fuzz import prefill_assembly as fza
from impl.targets import get_target


def _first_row_kept(inp: fz.PrefillInputs) -> int:
    if inp.indptr_list is not None:
        return inp.indptr_list[1] - inp.indptr_list[0]
    if inp.topk_list is not None:
        return min(max(inp.topk_list[0], 0), len(inp.dense[0]))
    return sum(1 for x in inp.dense[0] if x >= 0)


@pytest.mark.parametrize("target", ["gfx950"])
def test_forced_prefill_rows_reach_the_index_tensors(target):
    t = get_target(target)
    fam = fz.PREFILL_DIMENSIONS
    for base in fz.prefill_family_examples(t):
        for row in fam.covering_array(t, 2):
            case = fam.force(base, row, t)
            inp = fz.build_prefill_inputs(case, device="cpu")
            assert _first_row_kept(inp) == fz._row_len(row["row_len"]), (row, case)
            assert (inp.indptr is not None) == (row["index_mode"] == "ragged")
            assert (inp.topk_length is not None) == (row["index_mode"] == "dense-topk")
            assert (int(inp.q.shape[1]) > 16) == (row["heads"] == "two")
            assert (inp.attn_sink is None) == (row["sink"] == "none")
            # (counted dense rows get one -1 planted in a row with room, by design: a read past the count shows)
            if row["invalid"] == "none" and row["index_mode"] != "dense-count":
                flat = inp.ragged if inp.ragged is not None else [x for r in inp.dense for x in r]
                rows = case.lens
                # no entry a row keeps is invalid (the dense tails and the ragged junk point at dead rows or -1)
                if inp.ragged is not None:
                    kept = [x for r in range(case.sq) for x in flat[inp.indptr_list[r]:inp.indptr_list[r + 1]]]
                else:
                    kept = [x for r, n in zip(inp.dense, rows) for x in r[:n]]
                assert all(0 <= x < case.skv for x in kept), (row, kept)


def test_forced_assembly_requests_reach_the_gathers():
    t = get_target("generic")
    fam = fza.ASSEMBLY_DIMENSIONS
    for base in fza.assembly_family_examples(t):
        for row in fam.covering_array(t, 2):
            case = fam.force(base, row, t)
            s, q = case.seq_lens[0], case.query_lens[0]
            assert s - q == fza._prefix_len(row["prefix"], case.window) and q == fza._qlen(row["q_len"])
            full = q + min(s - q, case.window - 1)
            assert (case.gather_lens[0] < full) == (row["replay"] == "shortened"), (row, case)
            assert fza.build_assembly_inputs(case, device="cpu").chunks  # the planner and the builder accept it
