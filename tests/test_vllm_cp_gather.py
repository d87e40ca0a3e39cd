"""The vllm subject's indexer-K gather: upstream's ``cp_gather_indexer_k_quant_cache_triton`` runs behind our
signature (a line planted into a copy of its tree changes the verdict), its gfx950 kernel compiles once across
token and batch counts while its legacy kernel is specialized on them (by Triton's integer classes, not per
value), and the kernel the adapter names is the one upstream launches on each target."""
from __future__ import annotations

import pytest

from contracts import cp_gather as cc
from contracts import int64_probes as ci
from contracts.subjects import parse_subject, using
from contracts.subjects.vllm.loader import planted_copy
from fuzz import cp_gather as fg
from fuzz.cp_gather import CompileOnceCase
from impl.runtime import triton_mode
from impl.targets import get_target

pytestmark = pytest.mark.skipif(triton_mode() == "native", reason="interpreter-only: upstream's kernels on CPU "
                                "tensors; natively the vllm subject is judged by `smv audit --subject`")

OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"


def _planted(vllm_subject, tmp_path, find, replace):
    return parse_subject(f"vllm@{planted_copy(vllm_subject.tree.root, str(tmp_path / 'tree'), OPS, find, replace)}")


def test_the_adapter_names_the_kernel_upstream_launches_on_each_target(vllm_subject):
    for name, kernel in (("gfx950", "_cp_gather_indexer_quant_cache_gfx950_kernel"),
                         ("gfx942", "_cp_gather_indexer_quant_cache_kernel"),
                         ("generic", "_cp_gather_indexer_quant_cache_kernel")):
        sub = vllm_subject.bind(name)
        k = sub.cp_gather.gather_kernel(name)
        assert k is getattr(sub.ctx["ops"], kernel)
        params = {p.name: p for p in cc.kernel_params(k)}
        if name == "gfx950":
            # no token count at all (the grid carries it); the batch count is not specialized
            assert "num_tokens" not in params and params["num_batches"].do_not_specialize
            assert params["BLOCK_TABLE_WIDTH"].is_constexpr and params["NUM_BLOCKS"].is_constexpr
        else:
            assert not params["num_tokens"].is_constexpr and not params["num_tokens"].do_not_specialize
    with pytest.raises(ValueError, match="binding of the subject is for gfx950"):
        vllm_subject.bind("gfx950").cp_gather.gather_kernel("gfx942")


@pytest.mark.parametrize("target", ["gfx942", "gfx950", "generic"])
def test_upstream_gathers_every_pinned_case_as_the_oracle(vllm_subject, target):
    with using(vllm_subject):
        for case in fg.gather_examples():
            assert cc.gather_oracle_exact(case, get_target(target)) == [], case


def test_upstreams_gfx950_kernel_compiles_once_and_its_legacy_kernel_per_count_class(vllm_subject):
    case = fg.compile_once_examples()[0]
    with using(vllm_subject):
        assert cc.compile_once(case, get_target("gfx950")) == []
        (v,) = cc.compile_once(case, get_target("generic"))
    # T 1, 16, 3, 32, 5, 17 and B 1, 16, 2, 16, 5, 4: Triton's classes (== 1, divisible by 16, other) of both
    assert "3 compilations for one geometry" in v.message
    assert "num_tokens: ('constexpr', 1) / ('i32', 'D') / ('i32', '')" in v.where and "num_batches" in v.where
    # counts of one class share a variant: upstream's legacy kernel is not specialized per token count
    same_class = CompileOnceCase(seed=1, layout="normal", block_size=1, num_blocks=2, table_width=40,
                                 launches=((2, 2), (3, 3), (5, 5), (7, 6), (11, 7)))
    with using(vllm_subject):
        assert cc.compile_once(same_class, get_target("generic")) == []


def test_uc1_upstreams_gfx950_kernel_compiles_once_per_alignment_of_a_sliced_block_table(vllm_subject):
    # FINDINGS.md UC1: rows [i, i + B) of one 7-wide int32 table start 28 bytes apart
    sliced = fg.compile_once_examples()[1]
    assert sliced.table_rows and sliced.table_width * 4 % 16
    with using(vllm_subject):
        (v,) = cc.compile_once(sliced, get_target("gfx950"))
    assert v.message == ("the gfx950 cp-gather compiles once per 16-byte alignment of its metadata pointers: "
                         "2 compilations for one geometry")
    assert v.where == "block_table_ptr: ('*i32', 'D') / ('*i32', '')"
    assert cc.compile_once(sliced, get_target("gfx950")) == []  # ours


def test_a_specialized_gfx950_kernel_planted_upstream_fails_compile_once(vllm_subject, tmp_path):
    planted = _planted(vllm_subject, tmp_path, '@triton.jit(do_not_specialize=["num_batches"])', "@triton.jit")
    with using(planted):
        (v,) = cc.compile_once(fg.compile_once_examples()[0], get_target("gfx950"))
    assert "num_batches: ('constexpr', 1) / ('i32', 'D') / ('i32', '')" in v.where


def test_upstreams_gather_reads_the_far_end_of_a_large_pool(vllm_subject):
    with using(vllm_subject):
        assert "cp-gather" in ci.subject_probes(get_target("gfx950"))
        assert ci.INT64_PROBES["cp-gather"](get_target("gfx950")) == []
