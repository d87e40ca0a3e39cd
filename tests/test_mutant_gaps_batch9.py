"""Gaps that surviving mutants of ``smv mutate`` (issue 30 item 5, the seed-4242 sample) showed, closed in the
generators' pinned examples:

* ``sparse_metadata``: a batch that drains to no request at all (num_reqs 0, max_query_len 0), which the builder
  accepts, is a pinned step of ``cache-key-staleness``; a builder that refuses it is caught;
* ``cp_gather``: pinned gathers from an empty cache (no storage: a null pointer) and with cu_seqlen / token_to_seq
  ending where an unreadable page begins, so an unmasked cache or metadata read faults (a crash of the audit row;
  the mutants themselves were shown killed by ``smv audit`` on scratch copies, since a fault cannot be caught in
  this process). These tests pin the harness pieces that make the faults happen.
"""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import impl  # noqa: F401  (the Triton mode first)
from contracts import cp_gather as ccg
from contracts import sparse_metadata as csm
from fuzz import cp_gather as fg
from impl import sparse_metadata as ism
from impl.runtime import kernel_device
from impl.targets import get_target

TARGET = get_target("gfx942")


def _empty_batch_example():
    cases = [c for c in csm._staleness_examples(TARGET) if any(not s.q_lens for s in c.steps)]
    assert cases, "cache-key-staleness lost its empty-batch example"
    return cases[0]


def test_an_empty_batch_step_passes_on_the_builder():
    assert csm.cache_key_staleness(_empty_batch_example(), TARGET) == []


def test_a_builder_that_refuses_an_empty_batch_is_caught(monkeypatch):
    real = ism.SparseMLAMetadataBuilder._validate

    def planted(self, common):  # the mutant: an empty batch's max_query_len must be -1, so 0 is refused
        if common.num_reqs == 0:
            raise ValueError(f"max_query_len: expected the largest query length 0, got {common.max_query_len}")
        return real(self, common)

    monkeypatch.setattr(ism.SparseMLAMetadataBuilder, "_validate", planted)
    with pytest.raises(ValueError, match="max_query_len"):
        csm.cache_key_staleness(_empty_batch_example(), TARGET)


def _example(pred):
    cases = [c for c in fg.gather_examples() if pred(c)]
    assert cases
    return cases[0]


def test_the_empty_cache_example_has_no_storage_and_passes():
    case = _example(lambda c: c.num_blocks == 0)
    inp = fg.build_gather_inputs(case, kernel_device())
    assert inp["k_cache"].shape[0] == 0 and inp["k_cache"].data_ptr() == 0
    assert any(n for n in case.seq_lens)  # valid tokens, every block invalid: zero scales
    assert ccg.gather_oracle_exact(case, TARGET) == []


def test_the_guarded_metadata_example_passes():
    case = _example(lambda c: c.seq_guard)
    assert case.num_batches == 0 and case.num_tokens > 0  # cu_seqlen is one entry: cu_seqlen[1] lies past it
    assert ccg.gather_oracle_exact(case, TARGET) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the guard page is mprotect on Linux")
def test_a_read_one_element_past_a_guarded_vector_faults():
    code = ("import ctypes, torch; from fuzz.cp_gather import before_guard_page as g; "
            "t = g(torch.tensor([7, 8, 9], dtype=torch.int32)); assert t.tolist() == [7, 8, 9]; "
            "print(ctypes.c_int32.from_address(t.data_ptr() + 8).value, flush=True); "
            "ctypes.c_int32.from_address(t.data_ptr() + 12).value")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.stdout.strip() == "9", p.stderr[-500:]  # the last element reads
    assert p.returncode < 0, f"one past the end did not fault (exit {p.returncode})"  # SIGSEGV / SIGBUS


def test_an_empty_cache_gather_that_skips_the_zero_scales_or_writes_before_refusing_is_caught(monkeypatch):
    from impl import cp_gather as icg

    case = _example(lambda c: c.num_blocks == 0)

    def no_op(k_cache, k_fp8, k_scale, *a, **kw):  # gathers nothing: valid tokens keep their stale scales
        return None

    def writes_then_refuses(k_cache, k_fp8, k_scale, *a, **kw):
        k_scale.zero_()
        raise RuntimeError("cannot gather from an empty cache")

    monkeypatch.setattr(icg, "cp_gather_indexer_k_quant_cache", no_op)
    assert any("zero" in v.message or "scale" in v.message for v in ccg.gather_oracle_exact(case, TARGET))
    monkeypatch.setattr(icg, "cp_gather_indexer_k_quant_cache", writes_then_refuses)
    assert [v.message for v in ccg.gather_oracle_exact(case, TARGET)] == [
        "a gather that refused an empty cache changed its outputs"]
