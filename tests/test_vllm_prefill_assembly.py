"""The vllm subject's prefill-assembly adapter: upstream's own combine_topk_swa_indices and chunk planner run (a bug
planted into a copy of the tree changes the answer and the contract sees it), agree with ours on the pinned cases,
and what upstream lacks is a skipped entry naming why."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from contracts import prefill_assembly as cpa
from contracts.subjects import EntryMissing, parse_subject, using
from contracts.subjects.vllm.loader import planted_copy
from fuzz import prefill_assembly as fz
from impl import prefill_assembly as pa
from impl.runtime import triton_mode
from impl.targets import get_target

# these drive upstream's kernels on CPU tensors under the Triton interpreter (with its fidelity corrections);
# natively the vllm subject is judged by its audit (ci/gpu_validate.sh's subject step)
pytestmark = pytest.mark.skipif(triton_mode() == "native", reason="interpreter-only: upstream's kernels on CPU "
                                "tensors; natively the vllm subject is judged by `smv audit --subject`")

ROCM = "vllm/models/deepseek_v4/amd/rocm.py"
SWA = "vllm/v1/attention/backends/mla/sparse_swa.py"


def _planted(vllm_subject, tmp_path, rel, find, replace):
    return parse_subject(f"vllm@{planted_copy(vllm_subject.tree.root, str(tmp_path / 'tree'), rel, find, replace)}")


def _examples():
    return cpa._examples(get_target("generic"))


def test_upstream_passes_the_pinned_tables_and_plans(vllm_subject):
    t = get_target("generic")
    ex = _examples()
    with using(vllm_subject):
        # the older table under 0.33.0's rules, the full-gather table, a chunk at the budget, a fifth request
        # crossing it
        for case in (ex[0], ex[5], ex[2], ex[1]):
            assert cpa.prefill_assembly_oracle(case, t) == [], case


def test_upstreams_rows_and_plans_equal_ours(vllm_subject):
    fam = vllm_subject.bind("generic").prefill_assembly
    case = _examples()[1]
    inp = fz.build_assembly_inputs(case)
    plan_kw = dict(compress_ratio=case.ratio, max_model_len=case.max_model_len,
                   max_num_batched_tokens=case.max_num_batched_tokens, window_size=case.window)
    assert fam.plan_prefill_chunks(case.seq_lens, case.query_lens, **plan_kw) == \
        pa.plan_prefill_chunks(case.seq_lens, case.query_lens, **plan_kw)
    for ch in inp.chunks:
        kw = dict(compress_ratio=case.ratio, M=ch.M, N=ch.N, topk=case.topk, window_size=case.window)
        args = (ch.topk_indices, ch.query_start_loc, ch.seq_lens, ch.gather_lens)
        up, ours = fam.combine_topk_swa_indices(*args, **kw), pa.combine_topk_swa_indices(*args, **kw)
        assert torch.equal(up[0], ours[0]) and torch.equal(up[1], ours[1])


def test_a_topk_clamp_planted_upstream_fails_the_older_table(vllm_subject, tmp_path):
    find = "        valid_topk = (topk_indices >= 0) & (topk_indices < N)"
    planted = _planted(vllm_subject, tmp_path, ROCM, find, "        valid_topk = topk_indices >= 0")
    with using(planted):
        v = cpa.prefill_assembly_oracle(_examples()[0], get_target("generic"))
    msgs = {x.message for x in v}
    assert "a combined index points outside the chunk's workspace" in msgs
    assert "row differs from the pinned table" in msgs


def test_a_budget_boundary_planted_upstream_splits_the_chunk_at_the_budget(vllm_subject, tmp_path):
    find = "                if candidate_area > max_workspace_area:"
    planted = _planted(vllm_subject, tmp_path, SWA, find, find.replace(">", ">="))
    with using(planted):
        v = cpa.prefill_assembly_oracle(_examples()[2], get_target("generic"))
    assert [x.message for x in v] == ["chunk plan differs from SPEC 9's (start, end, N, M) per chunk"]


def test_the_gate_is_upstreams_and_the_layout_helper_is_missing_with_its_reason(vllm_subject):
    fam = vllm_subject.bind("gfx950").prefill_assembly
    for r in (1, 2, 4, 128):
        assert fam.indexer_k_is_c4a_block_flat(r) is pa.indexer_k_is_c4a_block_flat(r)
    with pytest.raises(EntryMissing) as exc:
        fam.indexer_k_layout_for_ratio(4)
    assert "inline" in exc.value.why


def test_a_tree_without_the_swa_module_has_no_planner_but_a_combine(vllm_subject, tmp_path):
    dest = str(tmp_path / "tree")
    shutil.copytree(vllm_subject.tree.root, dest)
    os.remove(os.path.join(dest, SWA))
    fam = parse_subject(f"vllm@{dest}").bind("generic").prefill_assembly
    with pytest.raises(EntryMissing) as exc:
        fam.plan_prefill_chunks([4], [2], compress_ratio=4, max_model_len=8, max_num_batched_tokens=4)
    assert "sparse_swa.py" in exc.value.why
    idx, lens = fam.combine_topk_swa_indices(torch.zeros(1, 4, dtype=torch.int32), torch.tensor([0, 1]),
                                             torch.tensor([1]), torch.tensor([1]), compress_ratio=4, M=1, N=0,
                                             topk=4, window_size=3)
    assert lens.tolist() == [1] and idx[0, :2].tolist() == [0, -1]
