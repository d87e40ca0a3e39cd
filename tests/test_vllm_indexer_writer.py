"""The vllm subject's indexer-K writers (adapters/indexer_writer.py): upstream's direct writer and head-128 compressor
run behind our signature (a bug planted into a copy of the tree changes the answer), ``indexer-writer-exact`` judges
them with stable messages (FINDINGS.md: IW1 SHUFFLE at an odd block size, IW2 OCP on gfx942, IW3/IW4 the
non-finite rules), and what upstream lacks (MXFP4, layouts it cannot be asked for, MX_SCALE) is never drawn."""
from __future__ import annotations

import pytest
import torch

from contracts import indexer_writer as ciw
from contracts.core import CONTRACTS
from contracts.engine.findings import parse
from contracts.engine.runner import run_contract
from contracts.subjects import SubjectUnavailable, parse_subject, using
from contracts.subjects.vllm.loader import planted_copy
from fuzz.indexer_writer import DirectCase, IndexerCompressorCase, IndexerWriterCase, build_compressor_inputs, \
    build_pool
from impl.runtime import triton_mode
from impl.targets import get_target
from oracles import indexer_writer as oiw

pytestmark = pytest.mark.skipif(triton_mode() == "native", reason="interpreter-only: upstream's kernels on CPU "
                                "tensors; natively the vllm subject is judged by `smv audit --subject`")

OPS = "vllm/v1/attention/ops/rocm_aiter_mla_sparse.py"
#: the messages upstream's verdicts may carry (IW1..IW4); anything else is a new disagreement
UPSTREAM_KNOWN = [
    r"^a layout that cannot hold the block size was accepted$", r"^a refused call changed the cache$",
    r"^quantized from its own fp32 rows: (more: )?token stored as OCP e4m3 with scale / 448 where the target's "
    r"indexer cache is FNUZ$",
    r"^quantized from its own fp32 rows: (more: )?bytes of a token holding a non-finite value differ$",
    r"^(more: )?end-to-end bytes of a token holding a non-finite value differ$",
    r"^(more elements: )?fp32 row NaN/inf mask differs at a lane whose pair partner is non-finite$",
    # IW6, IW7: strided inputs read as packed (the input layout dimension)
    r"^a strided (per-token vector|row-major input) is read as if packed: the pool differs from a contiguous copy's$",
]


def _messages(subject, case, target):
    with using(subject):
        return {v.message for v in ciw.indexer_writer_exact(case, get_target(target))}


DIRECT_SHUFFLE = IndexerWriterCase(direct=DirectCase(
    seed=5, T=3, slots=(17, -1, 2), log_scale=(0, -9, 12), block_size=16, num_blocks=2, scale_fmt="ue8m0",
    specials=((0, 9, "pow2-max"),), stride_pad=64, extra_blocks_before=1))
DIRECT_NORMAL = IndexerWriterCase(direct=DirectCase(
    seed=6, T=3, slots=(2, 0, -1), log_scale=(3, -20, 0), block_size=1, num_blocks=3, dtype="float32",
    specials=((1, 100, "nan"), (0, 5, "inf"), (2, 7, "above-pow2-max"))))
DIRECT_ODD = IndexerWriterCase(direct=DirectCase(seed=7, T=2, slots=(1, 4), log_scale=(0, 0), block_size=3,
                                                 num_blocks=2))
COMPRESSOR = IndexerWriterCase(compressor=IndexerCompressorCase(
    seed=8, positions=(3, 11, 6), reqs=(0, 1, 0), num_reqs=2, slots=(4, 1, 0), block_size=3, num_blocks=2,
    state_block_size=3, stride_pad=64, extra_blocks_before=1))


@pytest.mark.parametrize("target", ["gfx942", "gfx950"])
def test_upstreams_direct_writer_equals_the_reference_byte_for_byte(vllm_subject, target):
    # both scale formats, SHUFFLE and NORMAL, bf16 and fp32 k, NaN / inf, the power-of-two boundary
    for case in (DIRECT_SHUFFLE, DIRECT_NORMAL):
        assert _messages(vllm_subject, case, target) == set(), (target, case)


def test_iw1_upstream_writes_shuffle_at_an_odd_block_size_past_its_block(vllm_subject):
    assert _messages(vllm_subject, DIRECT_ODD, "gfx950") == {ciw.REFUSAL_MISSING, ciw.REFUSAL_WROTE}
    assert _messages(parse_subject("ours"), DIRECT_ODD, "gfx950") == set()


def test_iw2_upstreams_compressor_writes_ocp_where_gfx942_reads_fnuz(vllm_subject):
    msgs = _messages(vllm_subject, COMPRESSOR, "gfx942")
    assert msgs and all(ciw.OTHER_FLAVOUR in m for m in msgs)
    for target in ("gfx950", "generic"):
        assert _messages(vllm_subject, COMPRESSOR, target) == set()


def test_upstreams_fp32_rows_are_observed_for_the_writing_tokens_only(vllm_subject):
    case = COMPRESSOR.compressor  # position 6 does not write
    t = get_target("gfx950")
    inp = build_compressor_inputs(case, "cpu")
    _, cache = build_pool(case, 132, "cpu")
    rows = torch.full((3, 128), float("nan"))
    with using(vllm_subject):
        ciw._run_compressor(inp, cache, case, t, rows)
    refs = oiw.compressor_reference(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"],
                                    inp["slot_mapping"], inp["norm_weight"], inp["cos_sin_cache"], ratio=4,
                                    eps=case.eps)
    assert [r["t"] for r in refs] == [0, 1]
    for r in refs:
        assert oiw.compare_rows(rows[r["t"]], r["row"], r["tol"]) == []
    assert bool(torch.isnan(rows[2]).all())


def test_what_upstream_lacks_is_unavailable_and_never_drawn(vllm_subject):
    fam = vllm_subject.bind("gfx950").indexer_writer
    assert fam.VARIANTS["compressor_formats"] == ("fp8",) and fam.VARIANTS["direct_layouts"] == ("default",)
    inp = build_compressor_inputs(COMPRESSOR.compressor, "cpu")
    with pytest.raises(SubjectUnavailable, match="CUDA PTX"):
        fam.compress_norm_rope_store_indexer(*inp.values(), torch.zeros(2, 3, 68, dtype=torch.uint8),
                                             kv_format="mxfp4")
    with pytest.raises(SubjectUnavailable, match="picks the layout itself"):
        fam.indexer_k_quant_and_cache(torch.zeros(1, 128), torch.zeros(1, 16, 132, dtype=torch.uint8),
                                      torch.zeros(1, dtype=torch.int64), layout="normal")
    with using(vllm_subject):
        ex = ciw._examples(get_target("gfx950"))
    assert ex and all(c.direct.layout == "default" if c.direct else
                      (c.compressor.kv_format, c.compressor.mx_scale, c.compressor.layout) == ("fp8", False, "default")
                      for c in ex)


def test_a_divisor_planted_upstream_fails_the_contract(vllm_subject, tmp_path):
    tree = planted_copy(vllm_subject.tree.root, str(tmp_path / "tree"), OPS,
                        "        scale = tl.maximum(1e-4, amax) / 224.0", "        scale = tl.maximum(1e-4, amax) / 448.0")
    msgs = _messages(parse_subject(f"vllm@{tree}"), DIRECT_SHUFFLE, "gfx942")
    assert "direct writer: cache byte differs" in msgs


@pytest.mark.parametrize("target", ["gfx942"])
def test_the_contract_row_on_upstream_shows_only_the_recorded_disagreements(vllm_subject, target):
    # the disagreements as one finding, so that the row goes on past a case they explain; a case with any other
    # violation fails the row
    known = parse({"schema_version": 1, "finding": [{
        "id": "IW", "title": "IW1-IW4, IW6, IW7", "kind": "upstream-bug", "contract": "indexer-writer-exact",
        "subjects": ["vllm"], "versions": ["*"], "targets": [target], "function": "-",
        "signature": UPSTREAM_KNOWN}]})
    row = run_contract(CONTRACTS["indexer-writer-exact"], target, profile="ci", max_examples=8, budget=120,
                       subject=vllm_subject, findings=known)
    assert row.status == "known" and row.cases >= 8, (row.status, row.reason)
