"""The DSv4 step end to end: the step metadata (impl.dsv4_step) against SPEC's formulas, the reference's row check
and top-k rule, the case family, the entry-point probe, and one planted pieces-fit-together bug caught in process."""
import dataclasses
import json

import pytest
import torch

import impl  # noqa: F401  (sets the Triton mode before anything imports triton)
from contracts import dsv4_step as cstep
from contracts.subjects import EntryMissing, Family
from fuzz.cases import CaseError
from fuzz.dsv4_step import Dsv4StepCase
from impl import dsv4_step as step
from impl.runtime import kernel_device
from oracles import cache_writers as ref_writers
from oracles import dsv4_step as ref

DEV = kernel_device()


def _t(x, dtype=torch.int64):
    return torch.tensor(x, dtype=dtype, device=DEV)


SWA_TABLE = [[5, 2, 7, 0, 8, 9], [1, 3, 6, 4, 10, 11]]
TABLE = [[3, 0, 2], [1, 4, 5]]


@pytest.mark.parametrize("positions", [[0, 9], [3, 7], [11, 1], [-1, 4]])
@pytest.mark.parametrize("ratio,block_size", [(1, None), (4, 12), (4, 4), (128, 256), (128, 128)])
def test_layer_metadata_matches_spec(positions, ratio, block_size):
    """Slots, validity, the compressed slot mapping, C128A rows and the conversion's block size, entry by entry
    against oracles.dsv4_step's SPEC formulas (a negative position is a padding token)."""
    sbs = 3
    kw = {}
    if ratio > 1:
        kw = dict(block_table=_t(TABLE, torch.int32), block_size=block_size, max_model_len=300)
    if ratio == 128:
        positions = [p + 120 if p >= 0 else p for p in positions]  # reach C128A row boundaries
        sbs = 32  # the SWA table then maps them (a position past it is an invalid token, see below)
    m = step.build_layer_metadata(ratio, _t(positions), _t([0, 1], torch.int32), _t(SWA_TABLE, torch.int32), sbs,
                                  **kw)
    want_swa = [ref.slot_of(SWA_TABLE, r, p, sbs) for r, p in enumerate(positions)]
    assert m.swa_slot_mapping.tolist() == want_swa
    assert m.is_valid_token.tolist() == [s >= 0 for s in want_swa]
    if ratio == 1:
        assert m.kind == "swaonly" and m.compressed_slot_mapping is None
        return
    cbs = block_size // ratio
    assert m.topk_block_size == cbs
    valid = [s >= 0 for s in want_swa]  # a token the SWA table does not map is not valid (its slot is -1)
    want_comp = [ref.slot_of(TABLE, r, p // ratio, cbs) if valid[r] and ref.completes_row(p, ratio) else -1
                 for r, p in enumerate(positions)]
    assert m.compressed_slot_mapping.tolist() == want_comp
    if ratio == 4:
        assert m.indexer_context_lens.tolist() == [ref.rows_so_far(p, 4) * valid[r] for r, p in enumerate(positions)]
    else:
        width = step.c128a_max_compressed(300)
        assert width == 128 and m.c128a_topk.shape == (2, width)
        for r, p in enumerate(positions):
            n = ref.rows_so_far(p, 128) * valid[r]
            assert m.c128a_lens[r] == n
            assert m.c128a_topk[r].tolist() == [ref.slot_of(TABLE, r, i, cbs) for i in range(n)] + [-1] * (width - n)


@pytest.mark.parametrize("call,match", [
    (lambda: step.build_layer_metadata(2, _t([1]), _t([0]), _t([[0]], torch.int32), 1), "compress_ratio"),
    (lambda: step.build_layer_metadata(4, _t([1]), _t([0]), _t([[0]], torch.int32), 1), "block_table"),
    (lambda: step.build_layer_metadata(4, _t([1]), _t([0]), _t([[0]], torch.int32), 1,
                                       block_table=_t([[0]], torch.int32), block_size=6), "block_size"),
    (lambda: step.build_layer_metadata(1, _t([1]), _t([2]), _t([[0]], torch.int32), 1), "token_to_req"),
    (lambda: step.build_layer_metadata(1, _t([1, 2]), _t([0]), _t([[0]], torch.int32), 1), "token_to_req"),
    (lambda: step.build_layer_metadata(1, _t([1], torch.int32), _t([0]), _t([[0]], torch.int32), 1), "positions"),
    (lambda: step.build_layer_metadata(1, _t([1]), _t([0]), _t([[0]], torch.int32), 0), "swa_block_size"),
    (lambda: step.build_layer_metadata(128, _t([1]), _t([0]), _t([[0]], torch.int32), 1,
                                       block_table=_t([[0]], torch.int32), block_size=128), "max_model_len"),
])
def test_metadata_bad_input_names_the_argument(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def test_select_topk_tie_rule():
    assert ref.select_topk([0.5, 0.9, 0.5, float("-inf"), 0.9], 3) == [1, 4, 0]
    assert ref.select_topk([float("-inf")] * 3, 2) == []
    assert ref.select_topk([], 4) == []


@pytest.mark.parametrize("flavour", ["ocp", "fnuz"])
def test_row_check_accepts_the_reference_writer_and_rejects_another_row(flavour):
    """A row packed by the SWA reference writer (oracles.cache_writers) passes the step's row check with tol 0;
    a different row, or the right row under another scale code, does not."""
    gen = torch.Generator().manual_seed(3)
    k = (torch.randn(512, generator=gen) * torch.exp2(torch.randint(-6, 6, (512,), generator=gen).float())) \
        .to(torch.bfloat16)
    tok = ref_writers.quantize_pack_row(k, flavour=flavour, cap=255, sanitize=False, rope_from_fp32=False)
    zero = torch.zeros(())
    assert ref.row_problems(tok, k.to(torch.float64), zero, flavour=flavour, cap=255) == []
    other = torch.randn(512, generator=gen).to(torch.bfloat16).to(torch.float64)
    assert ref.row_problems(tok, other, zero, flavour=flavour, cap=255)
    bumped = dict(tok, scale=tok["scale"].clone())
    bumped["scale"][2] += 1
    assert any("group 2" in p[0] for p in ref.row_problems(bumped, k.to(torch.float64), zero, flavour=flavour,
                                                            cap=255))


def test_case_round_trip_and_validation():
    c = cstep.REGRESSION_CASE
    assert Dsv4StepCase.from_json(json.loads(json.dumps(c.to_json()))) == c
    with pytest.raises(CaseError, match="c4a_block_size"):
        Dsv4StepCase.from_json({**c.to_json(), "c4a_block_size": 6})
    with pytest.raises(ValueError, match="contexts"):
        dataclasses.replace(c, contexts=())
    with pytest.raises(ValueError, match="c128a_block_size"):
        dataclasses.replace(c, c128a_block_size=64)


class _FakeSubject:
    """A subject whose cache_writers family lacks the SWA insert (as upstream's) and which has no dsv4_step."""

    def __getattr__(self, family):
        if family == "cache_writers":
            return Family("cache_writers", trust_extra_cache_nan_free=lambda *a: False)
        if family == "dsv4_step":
            raise EntryMissing("dsv4_step", "no adapter for this family")
        return Family(family, **{name: object() for fam, name in cstep.ENTRIES if fam == family})


def test_missing_entry_points_are_all_named():
    with pytest.raises(EntryMissing) as exc:
        cstep.step_entries(_FakeSubject())
    assert exc.value.entry == "cache_writers.quantize_and_insert_k_cache"
    assert "also missing: dsv4_step" in exc.value.why


def test_block_size_mix_up_is_caught(monkeypatch):
    """The C4A conversion given the attention block size instead of block_size // 4: each piece keeps its own
    promise (the writer writes at its own states-per-block), the step's decode reads other rows."""
    real = step.build_layer_metadata

    def wrong(ratio, *a, **kw):
        m = real(ratio, *a, **kw)
        return dataclasses.replace(m, topk_block_size=kw["block_size"]) if m.kind == "c4a" else m

    monkeypatch.setattr(step, "build_layer_metadata", wrong)
    case = Dsv4StepCase(seed=5, contexts=(40,), steps=2, heads=1, window=3, swa_block_size=2, c4a_block_size=12,
                        c128a_block_size=128, topk=4, cu_count=1, scale=0.11, sink="none", padded=False,
                        layers=("c4a",))
    v = cstep.dsv4_step_agreement(case, impl.targets.get_target("generic"))
    assert v and "layer 0 (c4a)" in v[0].message and "decode output" in v[0].message


@pytest.mark.parametrize("flavour", ["ocp", "fnuz"])
def test_indexer_row_check_accepts_the_writer_reference(flavour):
    """An indexer-K token packed from a row by oracles.indexer_writer passes the step's indexer row check; another
    row, or the right codes under another scale, does not."""
    from oracles import indexer_writer as ref_idx

    gen = torch.Generator().manual_seed(4)
    row = torch.randn(128, generator=gen, dtype=torch.float32) * 3
    tok = ref_idx.pack_compressor_row(row, kv_format="fp8", flavour=flavour, mx_scale=False)
    zero = torch.zeros(())
    assert ref.indexer_row_problems(tok["codes"], tok["word"], row.to(torch.float64), zero, flavour=flavour) == []
    other = torch.randn(128, generator=gen, dtype=torch.float64) * 3
    assert ref.indexer_row_problems(tok["codes"], tok["word"], other, zero, flavour=flavour)
    word = torch.tensor([float(tok["word"].clone().view(torch.float32)[0]) * 2], dtype=torch.float32).view(torch.uint8)
    assert ref.indexer_row_problems(tok["codes"], word, row.to(torch.float64), zero, flavour=flavour)[0][0] == "scale"


def test_indexer_layout_mix_up_is_named(monkeypatch):
    """The C4A step handing the indexer-K readers no layout: the writer writes NORMAL, the logits read SHUFFLE (a
    block of 16 rows); the violation names that reading."""
    real = step.build_layer_metadata

    def no_layout(ratio, *a, **kw):
        m = real(ratio, *a, **kw)
        return dataclasses.replace(m, indexer_layout=None) if m.kind == "c4a" else m

    monkeypatch.setattr(step, "build_layer_metadata", no_layout)
    case = Dsv4StepCase(seed=6, contexts=(70,), steps=2, heads=1, window=3, swa_block_size=2, c4a_block_size=64,
                        c128a_block_size=128, topk=4, cu_count=1, scale=0.11, sink="none", padded=True,
                        layers=("c4a",))
    v = cstep.dsv4_step_agreement(case, impl.targets.get_target("gfx942"))
    assert v and cstep.SHUFFLE_READING in v[0].message


def test_regression_case_passes():
    assert cstep.dsv4_step_agreement(cstep.REGRESSION_CASE, impl.targets.get_target("gfx942")) == []


@pytest.mark.parametrize("target,ratio", [("gfx950", 128), ("gfx950", 1), ("gfx942", 128), ("generic", 4)])
def test_builder_sets_the_capture_flag_by_target(target, ratio):
    """build: for_cudagraph_capture False; build_for_cudagraph_capture: True exactly on gfx950 (upstream's
    _ON_GFX950), every other field as build's."""
    kw = dict(block_size=256, max_model_len=512) if ratio > 1 else {}
    b = step.Dsv4MetadataBuilder(ratio, swa_block_size=3, target=target, **kw)
    args = (_t([0, 9, -1]), _t([0, 1, 0], torch.int32), _t(SWA_TABLE, torch.int32),
            _t(TABLE, torch.int32) if ratio > 1 else None)
    plain, cap = b.build(*args), b.build_for_cudagraph_capture(*args)
    assert plain.for_cudagraph_capture is False
    assert cap.for_cudagraph_capture is (target == "gfx950")
    assert cstep._same_metadata(plain, cap) == []


def test_invalid_and_padding_tokens_get_an_empty_window():
    """A padding token (position -1) and a token the SWA table does not map (slot -1) hand the window helper
    position -1; a valid token its own."""
    table = [[5, 2, -1], [1, 3, 6]]
    m = step.build_layer_metadata(1, _t([7, 4, -1]), _t([0, 1, 0], torch.int32), _t(table, torch.int32), 3)
    assert m.swa_slot_mapping.tolist() == [-1, 3 * 3 + 1, -1]
    assert m.window_positions.tolist() == [-1, 4, -1]


def test_step_epilogue_quantizes_the_rotated_rows():
    from oracles import epilogues as ref_epi

    gen = torch.Generator().manual_seed(7)
    out = torch.randn(3, 1, 512, generator=gen).to(torch.bfloat16).to(DEV)
    cos_sin = torch.randn(16, 64, generator=gen).to(DEV)
    rot, codes, scales = step.step_epilogue(out, cos_sin, _t([3, 0, -1]), mxfp8=True)
    want = ref_epi.mxfp8_quantize(rot.cpu())
    assert torch.equal(codes.cpu().to(torch.int64), want["codes"].to(torch.int64))
    assert torch.equal(scales.cpu().to(torch.int64), want["scales"].to(torch.int64))
    assert step.step_epilogue(out, cos_sin, _t([3, 0, -1]))[1:] == (None, None)


def test_capture_flag_ignored_is_caught(monkeypatch):
    """A builder whose build_for_cudagraph_capture keeps build's flag: on gfx950 the builder contract names it."""
    monkeypatch.setattr(step.Dsv4MetadataBuilder, "build_for_cudagraph_capture",
                        lambda self, *a: step.Dsv4MetadataBuilder.build(self, *a))
    from fuzz.dsv4_step import BuilderCase

    v = cstep.dsv4_builder_capture_flag(BuilderCase(seed=3, compress_ratio=128, capture=True),
                                        impl.targets.get_target("gfx950"))
    assert v and "for_cudagraph_capture" in v[0].message


def test_broadened_c128a_case_passes_and_a_stale_replay_is_caught(monkeypatch):
    """One C128A layer with padding and an invalid request, freed SWA blocks, the MXFP8 epilogue, captured at
    step 0 and replayed at step 1 (gfx950: adaptive splits): it passes; a replay that keeps the capture step's
    indices is caught at step 1."""
    case = Dsv4StepCase(seed=21, contexts=(126, 4), steps=2, heads=1, window=3, swa_block_size=2,
                        c4a_block_size=12, c128a_block_size=128, topk=3, cu_count=1, scale=0.11, sink="mixed",
                        padded=True, layers=("c128a",), pad_tokens=1, invalid=True, freed=True, epilogue="mxfp8",
                        graph=True)
    t = impl.targets.get_target("gfx950")
    assert cstep.dsv4_step_agreement(case, t) == []
    from impl import graph_capture

    real = graph_capture.DecodeGraph._copy_ragged

    def copy_at_capture_only(self, *a):
        if getattr(self, "replays", None) is None:  # set once the capture is done
            real(self, *a)

    monkeypatch.setattr(graph_capture.DecodeGraph, "_copy_ragged", copy_at_capture_only)
    v = cstep.dsv4_step_agreement(case, t)
    assert v and v[0].message.startswith("step 1, layer 0 (c128a): decode output (replay")
