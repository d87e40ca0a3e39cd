"""The vllm subject's indexer-logits adapter: upstream's paged logits (the Triton kernel for a C4A cache on gfx9, the
torch reference everywhere else, AITER being absent) and prefill logits run upstream's own code (a bug planted
into a copy of the tree changes the answer); each upstream difference the contract finds has its own stable
message (UL1..UL6 in FINDINGS.md); the top-k is missing, named with its reason, and the logits are judged
without it."""
from __future__ import annotations

import pytest
import torch

from contracts import indexer_logits as cl
from contracts.registry import get_contract
from contracts.engine.runner import checked
from contracts.subjects import EntryMissing, parse_subject, using
from contracts.subjects.vllm.loader import planted_copy
from fuzz.indexer_logits import IndexerLogitsCase, build_decode_inputs
from impl.runtime import triton_mode
from impl.targets import get_target

pytestmark = pytest.mark.skipif(triton_mode() == "native", reason="interpreter-only: upstream's kernels on CPU "
                                "tensors; natively the vllm subject is judged by `smv audit --subject`")

OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
DECODE = IndexerLogitsCase(seed=5, mode="decode", heads=4, topk=3, next_n=1, block_size=16, layout="normal",
                           context_lens=(20, 3), max_model_len=24)


def _messages(subject, case, target):
    """The contract's violation messages as an audit row gets them (an exception raised by the subject included)."""
    with using(subject):
        return {v.message for v in checked(get_contract(cl.CONTRACT_ID), case, get_target(target))}


def test_the_torch_reference_agrees_on_a_block_flat_cache_and_the_topk_is_missing_with_its_reason(vllm_subject):
    assert _messages(vllm_subject, DECODE, "generic") == set()
    fam = vllm_subject.bind("generic").indexer_logits
    with pytest.raises(EntryMissing) as exc:
        fam.topk_indices(torch.zeros(1, 4), 2)
    assert exc.value.entry == "indexer_logits.topk_indices" and "top_k_per_row" in exc.value.why


def test_ul1_ul2_the_triton_kernel_leaves_masked_columns_unwritten_and_drops_nan(vllm_subject):
    case = DECODE.replace(block_size=64, context_lens=(70, 3), max_model_len=72, nan_k=True)
    got = _messages(vllm_subject, case, "gfx950")
    assert got == {"decode: a masked position is not -inf", "decode: more positions of the same kind (mask)",
                   "decode: logits are the formula with NaN head scores dropped by the relu"}
    assert _messages(parse_subject("ours"), case, "gfx950") == set()
    # the same cache on generic goes to the torch reference, which writes -inf and keeps NaN
    assert _messages(vllm_subject, case, "generic") == set()


def test_ul3_ul4_ul5_the_torch_fallbacks_readings(vllm_subject):
    mtp = DECODE.replace(next_n=2, context_lens=(32, 3), max_model_len=32)
    assert _messages(vllm_subject, mtp, "generic") == {
        "decode: logits are the formula with the cache read as per-token 132-byte rows ([bs, 1, 132] views), not "
        "block-flat, the key scale folded into the key before the relu"}
    (crash,) = _messages(vllm_subject, mtp.replace(context_lens=(20, 3), max_model_len=20), "generic")
    assert crash.startswith("check raised RuntimeError: The expanded size of the tensor")
    shuffle = DECODE.replace(layout="shuffle", context_lens=(17, 3))
    assert _messages(vllm_subject, shuffle, "gfx942") == {
        "decode: logits are the formula with a SHUFFLE cache read in the NORMAL order"}


def test_ul6_prefill_scores_in_bf16(vllm_subject):
    case = IndexerLogitsCase(seed=4, mode="prefill", heads=4, topk=3, keys=24, row_starts=(0, 3), row_ends=(24, 9))
    got = _messages(vllm_subject, case, "gfx942")
    assert "prefill: logit differs beyond the fp32 bound, within the rounding of head scores stored in bf16" in got
    assert got <= {"prefill: logit differs beyond the fp32 bound, within the rounding of head scores stored in bf16",
                   "prefill: more positions of the same kind (bf16)"}


def test_a_relu_planted_out_of_upstreams_triton_kernel_changes_the_verdict(vllm_subject, tmp_path):
    planted = parse_subject("vllm@" + planted_copy(vllm_subject.tree.root, str(tmp_path / "tree"), OPS,
                                                   "        s = tl.maximum(s, 0.0)\n", ""))
    case = DECODE.replace(block_size=64, context_lens=(64, 64), max_model_len=64)
    assert _messages(vllm_subject, case, "gfx950") == set()
    assert "decode: logit differs from the oracle beyond the derived bound" in _messages(planted, case, "gfx950")


def test_the_adapter_returns_upstreams_buffer_or_fills_ours(vllm_subject):
    fam = vllm_subject.bind("generic").indexer_logits
    inp = build_decode_inputs(DECODE, "ocp", "cpu")
    out = torch.full((2, 24), 7.0)
    res = fam.fp8_paged_mqa_logits(inp.q, inp.cache, inp.weights, inp.context_lens, inp.block_table, 24,
                                   layout="normal", out=out)
    assert res is out and torch.equal(torch.isinf(out[0]), torch.arange(24) >= 20)
    with pytest.raises(ValueError, match="binding of the subject is for generic"):
        fam.fp8_paged_mqa_logits(inp.q, inp.cache, inp.weights, inp.context_lens, inp.block_table, 24,
                                 target="gfx950")


def test_the_native_bf16_operand_rewrite_changes_no_bit_where_the_dot_accumulates_in_fp32(vllm_subject, tmp_path):
    """native-fp8-dot-bf16-operands (applied on NVIDIA hosts only, where the fp8 MMA accumulates in fewer bits than
    AMD's): under the interpreter, whose dot accumulates fp8 products in fp32 as gfx950's MFMA does, upstream's
    kernel with bf16 operands writes the same bits, visible columns and poison alike."""
    from contracts.subjects import fidelity  # noqa: F401 - registers the native rewrites
    from contracts.subjects.vllm import loader

    rw = next(r for r in loader.REWRITES if r.id == "native-fp8-dot-bf16-operands")
    rewritten = parse_subject("vllm@" + planted_copy(vllm_subject.tree.root, str(tmp_path / "tree"), OPS,
                                                     rw.find, rw.replace))
    case = DECODE.replace(block_size=64, context_lens=(70, 3), max_model_len=72, seed=9)
    inp = build_decode_inputs(case, "ocp", "cpu")
    outs = []
    for sub in (vllm_subject, rewritten):
        fam = sub.bind("gfx950").indexer_logits
        outs.append(fam.fp8_paged_mqa_logits_triton(inp.q, inp.cache, inp.weights, inp.context_lens,
                                                    inp.block_table, 72))
    a, b = outs
    assert torch.equal(torch.isnan(a), torch.isnan(b)) and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b))
    assert torch.isfinite(a[0, :70]).all() and (a[0, :70] != 0).any()  # real scores, not an empty comparison
