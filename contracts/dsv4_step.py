"""``dsv4-step-agreement``: a few decode steps of a toy DSv4 attention (an SWA-only, a C4A and a C128A layer), every
piece called through the subject, against a float64 reference of the same step written from SPEC.

The step driver below is the glue a model's forward would be: per step and layer it takes the layer's metadata
(``dsv4_step.build_layer_metadata``: slot mappings, C128A rows, the indexer's context and layout, the compressed
block size of the slot conversion), inserts the token's SWA row (``cache_writers.quantize_and_insert_k_cache``),
writes a completed compressed row (``compressor.compress_norm_rope_store``, head 512, into the extra cache) and, on
C4A, its indexer-K row (``indexer_writer.compress_norm_rope_store_indexer``, head 128); the C4A indexer scores the
rows so far (``indexer_logits.fp8_paged_mqa_logits``) and picks its top-k (``indexer_logits.topk_indices``); the
SWA window (``ragged.compute_swa_indices_and_lens`` + ``build_ragged_indices_from_dense``), the C128A rows (dense ->
ragged) and the C4A top-k (``ragged.compute_global_topk_ragged_indices_and_indptr``) become ragged global slots;
the SWA and C128A ragged metadata are copied into persistent graph buffers (``graph_buffers``, reused across
steps, their stale entries pointing at poisoned slots); the decode runs (``decode``, its plan from the subject's
selector on the views' sizes) and, at the last step, the inverse-RoPE epilogue (``epilogues``). The reference
(``oracles.dsv4_step`` and the oracles it calls) recomputes from the block tables, with SPEC's formulas, which
slots each writer should have written and which each query row should read, then judges per layer and step.
"""
from __future__ import annotations

import math
import warnings

import torch

from contracts.core import ALL_TARGETS, Violation, compare_exact, contract, fmt, record_margin, single_threaded
from contracts.decode import NAN_ROW_ZEROED, oracle_violations, zeroed_nan_rows
from contracts.indexer_logits import compare_topk, judge_logits
from contracts.subjects import EntryMissing, bound
from fuzz import dsv4_step as fz
from fuzz.dsv4_step import Dsv4StepCase
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import cache_writers as ref_writers
from oracles import compressor as ref_comp
from oracles import dsv4_step as ref
from oracles import epilogues as ref_epi
from oracles import indexer_logits as ref_logits
from oracles import indexer_writer as ref_idx_writer
from oracles import trust_gate as ref_trust
from oracles.dispatch import expected_dispatch
from oracles.formats import storage_bytes

#: every entry point the step calls, (family, name)
ENTRIES = (
    ("cache_writers", "quantize_and_insert_k_cache"),
    ("cache_writers", "trust_extra_cache_nan_free"),
    ("compressor", "compress_norm_rope_store"),
    ("indexer_writer", "compress_norm_rope_store_indexer"),
    ("indexer_logits", "fp8_paged_mqa_logits"),
    ("indexer_logits", "topk_indices"),
    ("ragged", "compute_swa_indices_and_lens"),
    ("ragged", "build_ragged_indices_from_dense"),
    ("ragged", "compute_global_topk_ragged_indices_and_indptr"),
    ("graph_buffers", "copy_ragged_to_graph_buffers"),
    ("decode", "plan_decode"),
    ("decode", "DecodeWorkspace"),
    ("decode", "sparse_attn_decode"),
    ("graph_capture", "DecodeGraph"),
    ("dsv4_step", "Dsv4MetadataBuilder"),
    ("dsv4_step", "step_epilogue"),
)
CACHE_DTYPE = "fp8_ds_mla"
#: the diagnosis of logits that are those of the NORMAL C4A indexer cache read in the SHUFFLE order
SHUFFLE_READING = "C4A's NORMAL (block-flat) indexer-K cache read in the SHUFFLE order"


def step_entries(sub) -> dict:
    """``{"family.name": callable}`` for :data:`ENTRIES`; every missing one is named in one EntryMissing (the first
    with its reason, then the others), so a subject's skipped row says all that its step lacks."""
    found, missing = {}, []
    for fam, name in ENTRIES:
        try:
            found[f"{fam}.{name}"] = getattr(getattr(sub, fam), name)
        except EntryMissing as exc:
            missing.append(exc)
    if missing:
        first = missing[0]
        why = first.why
        if len(missing) > 1:
            why = (why + "; " if why else "") + "also missing: " + ", ".join(m.entry for m in missing[1:])
        raise EntryMissing(first.entry, why)
    return found


#: a regression case (tests/test_dsv4_step.py runs it): request 0 completes C128A row 0 at step 1 (position 127) and
#: C4A rows at 123 and 127; request 1 has no compressed row yet and a window that is not full; odd block sizes.
#: Not a pinned example of the contract: each case costs the interpreter seconds, and a row's budget holds one
#: generated case (whose first draw is as rich, see fuzz.dsv4_step.step_cases)
REGRESSION_CASE = Dsv4StepCase(seed=11, contexts=(126, 2), steps=2, heads=1, window=4, swa_block_size=3,
                               c4a_block_size=12, c128a_block_size=256, topk=3, cu_count=1, scale=0.11, sink="mixed",
                               padded=True)


def _cases(target: Target):
    return fz.step_cases()


@contract("dsv4-step-agreement", targets=ALL_TARGETS, cases=_cases, min_cases=3, max_cases=3, case_type=Dsv4StepCase,
          numeric=True)
def dsv4_step_agreement(case: Dsv4StepCase, target: Target) -> list[Violation]:
    """A few decode steps of a toy DSv4 attention (SWA-only, C4A and C128A layers) agree, layer by layer and step by
    step, with a float64 reference of the same step written from SPEC.

    Each layer's metadata comes from its builder (``dsv4_step.Dsv4MetadataBuilder``: ``build``, and at a captured
    step ``build_for_cudagraph_capture``). Per layer and step: (0) the metadata's ``for_cudagraph_capture`` is
    False from ``build`` and, from ``build_for_cudagraph_capture``, whether the target takes the adaptive graph path
    (gfx950: upstream's ``_ON_GFX950``), and a captured decode's dispatch has adaptive splits exactly where
    oracles.dispatch says (gfx950, C128A, under capture); (1) every byte of the SWA cache outside the record at the
    SPEC slot of each valid token's position (the SWA block table, its own block size) is unchanged, and that
    record holds the token's row - a padding token (position -1) and a token whose position the table does not map
    (slot -1) write nothing; (2) on a compressed layer, every byte of the extra cache (and, on C4A, of the indexer-K
    cache, NORMAL) outside the records of the rows this step's valid tokens complete is unchanged, and each such
    record, at SPEC's slot (the layer's block table, block_size // ratio rows per block), holds the compressor's row
    for those positions up to the writer's rounding (oracles.dsv4_step.row_problems / indexer_row_problems: they
    identify the row, the writers' own contracts judge the bytes); (3) C4A: the indexer's logits equal the float64
    logits of the (pos + 1) // 4 rows each valid query sees (none for an invalid or padding token), read from the
    indexer-K cache at SPEC's slots, and its top-k is their top-k, by the rules of indexer-logits-agreement (masks
    exact, its derived bound, sets that differ only by swaps within the bound of the k-th gap are excused; the
    attention below then reads the subject's excused set, else SPEC's); (4) the decode output - eager, or from the
    graph captured at step 0 and replayed at each later step with that step's indices - equals the float64
    attention over exactly SPEC's slots (the SWA window max(pos - window + 1, 0)..pos; C128A: every row so far,
    (pos + 1) // 128; C4A: the top-k rows; nothing for an invalid or padding token) of the caches the kernels wrote
    in this and every earlier step, dequantized the way the kernels read them, within oracles.compare's derived
    bound for the plan's split count, NaN/inf masks exactly; (5) at the last step, the epilogue's output is the
    inverse GPT-J RoPE at the query's position of that decode output, within oracles.epilogues' float32 bound, the
    other lanes copied exactly, and with the MXFP8 epilogue (on the last layer) its codes and scale codes equal
    oracles.epilogues' MXFP8 of those rotated rows exactly; (6) the trust gate is SPEC 4's. Every cache slot nobody should read is
    poisoned, SWA blocks that fell out of the window may be unmapped (-1), the graph buffers' stale entries point
    at poisoned slots, outputs, logits and workspaces are NaN-poisoned before each run, and the kernels run before
    the reference. This is where pieces that each pass their own contract can still disagree: a writer's slot and
    the table a reader uses, the window positions and the insert positions, the compressed block size of the slot
    conversion, the indexer-K layout its writer and its reader are given, the graph-buffer copy and the rows the
    decode reads, a replay and the step it is given, the capture flag and the captured plan, the epilogue and the
    decode's output. With the case's ``input_layout`` "strided", every layer's query and insert rows are lane-padded
    views, the positions a stride-2 view and every cache a view past its pool's first block: the step must give
    exactly what it gives packed (the same judgements). Sources: SPEC 1.2, 1.3, 2, 4, 5; seed 004 item 2;
    upstream's ``_forward_decode`` and ``DeepseekV4ROCMAiterMLASparseMetadataBuilder`` (vllm/models/deepseek_v4/amd/rocm.py) for the order of the
    pieces and the capture flag. The first step and layer with a violation ends the case.
    """
    sub = bound(target)
    ent = step_entries(sub)
    with single_threaded():
        inp = fz.build_step_inputs(case, target)
        bufs = _graph_buffers(case, inp)
        for li, layer in enumerate(inp.layers):
            bufs[li]["builder"] = ent["dsv4_step.Dsv4MetadataBuilder"](
                layer.ratio, swa_block_size=case.swa_block_size, block_size=layer.block_size,
                max_model_len=inp.max_model_len, target=target)
        for s in range(case.steps):
            for li, layer in enumerate(inp.layers):
                out = _layer_step(case, target, ent, inp, bufs[li], s, li, layer)
                if out:
                    return out
    return []


# ---------------------------------------------------------------------------------------------------------------
# the step driver
# ---------------------------------------------------------------------------------------------------------------

def _graph_buffers(case: Dsv4StepCase, inp: fz.StepInputs) -> list[dict]:
    """Persistent graph buffers per layer, one token of slack past the batch, every entry a poisoned slot."""
    dev = kernel_device()
    max_tokens = case.num_tokens + 1
    out = []
    for layer in inp.layers:
        b = {"swa_idx": torch.full((max_tokens * case.window,), layer.swa.spare_slot, dtype=torch.int32, device=dev),
             "swa_ptr": torch.full((max_tokens + 1,), 0, dtype=torch.int32, device=dev)}
        if layer.ratio == 128:
            width = ref.c128a_width(inp.max_model_len)
            b["c128a_width"] = width
            b["c128a_idx"] = torch.full((max_tokens * width,), layer.extra.spare_slot, dtype=torch.int32, device=dev)
            b["c128a_ptr"] = torch.full((max_tokens + 1,), 0, dtype=torch.int32, device=dev)
        out.append(b)
    return out


def _layer_step(case, target, ent, inp, bufs, s, li, layer) -> list[Violation]:
    dev = kernel_device()
    pos_list = case.positions(s)
    positions = fz.step_positions(case, s, dev)
    has_extra = layer.extra is not None
    where = f"step {s}, layer {li} ({layer.name})"
    builder = bufs["builder"]
    capture = case.graph and s == 0
    args = (positions, inp.token_to_req, layer.swa.table, layer.extra.table if has_extra else None)
    meta = builder.build_for_cudagraph_capture(*args) if capture else builder.build(*args)
    before = _run_writes(case, target, ent, inp, layer, s, meta, positions)
    logits = local = None
    if layer.indexer is not None:
        logits, local = _run_indexer(case, target, ent, inp, layer, s, meta)
    segs = _run_slots(case, target, ent, inp, bufs, layer, meta, local, positions)
    trust = ent["cache_writers.trust_extra_cache_nan_free"](target, CACHE_DTYPE, False, has_extra)
    got, plan, dispatch = _run_decode(case, target, ent, bufs, layer, s, meta, segs, trust)
    dec_out = got.clone()  # what the epilogue was given (``got`` may have rows marked by zeroed_nan_rows below)
    epi = None
    if s == case.steps - 1:  # each launch costs the interpreter more than the rest of a layer's step
        rot_buf = torch.full(tuple(got.shape), math.nan, dtype=torch.bfloat16, device=dev)
        # the MXFP8 output on the last layer only: its kernel costs the interpreter seconds per layer
        mxfp8 = case.epilogue == "mxfp8" and li == len(inp.layers) - 1
        epi = ent["dsv4_step.step_epilogue"](got.to(dev), inp.cos_sin, positions, mxfp8=mxfp8, rotated=rot_buf)
        epi = tuple(x.cpu().clone() if x is not None else None for x in epi)

    # ================= the reference, after every kernel ran =================
    v = _flag_violations(where, case, target, layer, meta, capture, dispatch)
    v += _slot_mapping_violations(where, case, layer, meta, pos_list)
    v += _write_violations(where, case, target, inp, layer, s, pos_list, before)
    c4a_rows = None
    if layer.indexer is not None:
        # the indexer: logits and top-k against the float64 logits of the rows so far, read at SPEC's slots
        v_idx, c4a_rows = _indexer_violations(where, case, target, layer, s, pos_list, logits.cpu().clone(),
                                              local.cpu().clone(), inp.max_model_len // 4)
        v += v_idx
    want_trust = ref_trust.trust_expected(target.name, CACHE_DTYPE, False, has_extra)
    if trust != want_trust:
        v.append(Violation(f"{where}: trust gate differs from SPEC 4's", "trust_extra_cache_nan_free",
                           str(want_trust), str(trust)))
    attn = _reference_attention(case, target, layer, s, pos_list, c4a_rows, not want_trust)
    v += zeroed_nan_rows(f"{where}: {NAN_ROW_ZEROED}", got, attn.out)
    mode = f"replay of the graph captured at step 0" if case.graph and s else ("captured" if capture else "eager")
    v += oracle_violations(f"{where}: decode output ({mode}) vs the float64 attention over SPEC's slots "
                           f"(S={plan.num_splits})", got, attn, plan.num_splits)
    if epi is not None:
        v += _epilogue_violations(where, dec_out, epi[0], inp.cos_sin.cpu(), pos_list)
        if epi[1] is not None:
            v += _mxfp8_violations(where, epi[0], epi[1], epi[2])
    return v


def _run_writes(case, target, ent, inp, layer, s, meta, positions) -> dict:
    """The step's cache writes (SWA insert, compressor, indexer-K writer); returns every cache's bytes before."""
    t2r = inp.token_to_req
    # the compressors take positions >= 0: a padding token reaches them at position 0 (where vLLM's padded
    # positions sit) with its slot -1, so it writes nothing
    positions = positions.clamp(min=0)
    before = {"swa": storage_bytes(layer.swa.view)[0].cpu().clone()}
    ent["cache_writers.quantize_and_insert_k_cache"](layer.k[s], meta.swa_slot_mapping, layer.swa.view,
                                                      target=target)
    if layer.extra is not None:
        before["extra"] = storage_bytes(layer.extra.view)[0].cpu().clone()
        ent["compressor.compress_norm_rope_store"](
            layer.state, layer.state_table, t2r, positions, meta.compressed_slot_mapping, layer.norm_weight,
            inp.cos_sin, layer.extra.view, ratio=layer.ratio, eps=fz.NORM_EPS, target=target)
    idx = layer.indexer
    if idx is not None:
        before["indexer"] = storage_bytes(idx.view)[0].cpu().clone()
        ent["indexer_writer.compress_norm_rope_store_indexer"](
            idx.state, idx.state_table, t2r, positions, meta.compressed_slot_mapping, idx.norm_weight, inp.cos_sin,
            idx.view, ratio=4, eps=fz.NORM_EPS, layout=meta.indexer_layout, target=target)
    return before


def _run_indexer(case, target, ent, inp, layer, s, meta):
    """C4A: the logits over the rows so far, then the top-k."""
    idx = layer.indexer
    width = inp.max_model_len // 4
    logits_buf = torch.full((case.num_tokens, width), math.nan, dtype=torch.float32, device=kernel_device())
    # one block-table row per query token (a padding token takes its request row's, 0)
    tables = layer.extra.table.index_select(0, inp.token_to_req.to(torch.int64))
    logits = ent["indexer_logits.fp8_paged_mqa_logits"](
        idx.q[s], idx.view, idx.weights[s], meta.indexer_context_lens, tables, width,
        layout=meta.indexer_layout, out=logits_buf, target=target)
    return logits, ent["indexer_logits.topk_indices"](logits, case.topk)


def _run_slots(case, target, ent, inp, bufs, layer, meta, local, positions) -> dict:
    """The ragged segments the decode reads: the SWA window of each token's window position (-1 for an invalid
    token: an empty window), the C4A top-k as global slots, the C128A rows; eagerly, the SWA and C128A ones copied
    into the layer's persistent graph buffers (a captured graph copies them into its own)."""
    T, t2r = case.num_tokens, inp.token_to_req
    swa_dense, swa_lens = ent["ragged.compute_swa_indices_and_lens"](meta.window_positions, t2r, layer.swa.table,
                                                                      case.swa_block_size, case.window)
    main = ent["ragged.build_ragged_indices_from_dense"](swa_dense.reshape(T, case.window), swa_lens)
    extra = None
    if layer.ratio == 4:
        extra = ent["ragged.compute_global_topk_ragged_indices_and_indptr"](
            local, t2r, layer.extra.table, meta.topk_block_size, meta.is_valid_token)
    elif layer.ratio == 128:
        extra = ent["ragged.build_ragged_indices_from_dense"](meta.c128a_topk, meta.c128a_lens)
    segs = {"main": main, "extra": extra, "main_width": case.window,
            "extra_width": case.topk if layer.ratio == 4 else bufs.get("c128a_width")}
    if case.graph:
        return segs
    copy = ent["graph_buffers.copy_ragged_to_graph_buffers"]
    segs["main"] = copy(*main, bufs["swa_idx"], bufs["swa_ptr"], T, case.window, target=target)
    if layer.ratio == 128:
        segs["extra"] = copy(*extra, bufs["c128a_idx"], bufs["c128a_ptr"], T, bufs["c128a_width"], target=target)
    return segs


def _run_decode(case, target, ent, bufs, layer, s, meta, segs, trust):
    """The decode: eager (its plan from the subject's selector on the views' sizes), or captured at step 0 with
    the metadata's capture flag and replayed at later steps. Returns (output on the CPU, plan, dispatch or None)."""
    dev = kernel_device()
    T, H = case.num_tokens, case.heads
    has_extra = layer.extra is not None
    (main_idx, main_ptr), extra = segs["main"], segs["extra"]
    extra_idx, extra_ptr = extra if extra is not None else (None, None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on 0 * inf by design
        if case.graph and s == 0:
            g = ent["graph_capture.DecodeGraph"].capture(
                layer.q[s], layer.swa.view, main_idx, main_ptr, layer.extra.view if has_extra else None, extra_idx,
                extra_ptr, max_per_row_main=segs["main_width"],
                max_per_row_extra=segs["extra_width"] if has_extra else None, compress_ratio=layer.ratio,
                attn_sink=layer.sink, softmax_scale=case.scale, target=target, cu_count=case.cu_count,
                kv_cache_dtype=CACHE_DTYPE, for_cudagraph_capture=meta.for_cudagraph_capture)
            bufs["graph"] = g
            return g.out.cpu().clone(), g.plan, g.dispatch
        if case.graph:
            g = bufs["graph"]
            out = g.replay(layer.q[s], main_idx, main_ptr, extra_idx, extra_ptr)
            return out.cpu().clone(), g.plan, None
        plan = ent["decode.plan_decode"](target, T, H, main_idx.numel(), extra_idx.numel() if has_extra else 0,
                                         cu_count=case.cu_count)
        ws = ent["decode.DecodeWorkspace"].allocate(T, plan.num_splits, H, dev, fill=math.nan)
        out = torch.full((T, H, 512), math.nan, dtype=torch.bfloat16, device=dev)
        ent["decode.sparse_attn_decode"](
            layer.q[s], layer.swa.view, main_idx, main_ptr, layer.extra.view if has_extra else None, extra_idx,
            extra_ptr, attn_sink=layer.sink, softmax_scale=case.scale, target=target, trust_extra_nan_free=trust,
            plan=plan, workspace=ws, out=out)
    return out.cpu().clone(), plan, None


def _flag_violations(where, case, target, layer, meta, capture: bool, dispatch) -> list[Violation]:
    """(0) the builder's capture flag and the captured dispatch's adaptive splits (oracles)."""
    want_flag = ref.capture_flag(target.name) if capture else False
    v = []
    if meta.for_cudagraph_capture != want_flag:
        how = "build_for_cudagraph_capture" if capture else "build"
        v.append(Violation(f"{where}: the metadata builder's {how} sets for_cudagraph_capture other than seed 004's "
                           f"rule (True exactly on gfx950, for a capture)", "for_cudagraph_capture",
                           str(want_flag), str(meta.for_cudagraph_capture)))
    if dispatch is not None:
        want = expected_dispatch(target.name, layer.ratio, layer.ratio <= 1, want_flag, layer.extra is not None,
                                 CACHE_DTYPE, False)["adaptive_splits"]
        if dispatch.adaptive_splits != want:
            v.append(Violation(f"{where}: the captured decode's adaptive splits differ from SPEC 2's (gfx950, "
                               f"C128A, under capture)", "DecodeGraph.dispatch.adaptive_splits", str(want),
                               str(dispatch.adaptive_splits)))
    return v


def _slot_mapping_violations(where, case, layer, meta, pos_list) -> list[Violation]:
    """(0) the metadata's slot mappings, which any writer is handed (one that trusts them writes wherever they
    point): SPEC 1.3's SWA slot of each token (-1 for a padding token or an unmapped block), and on a compressed
    layer the compressed slot of row pos // ratio for a valid token that completes it ((pos + 1) % ratio == 0),
    -1 for every other token (impl.dsv4_step's module docstring)."""
    reqs = case.token_requests()
    swa = layer.swa.table.cpu().tolist()
    want = {"swa_slot_mapping": [ref.slot_of(swa, reqs[t], p, case.swa_block_size) for t, p in enumerate(pos_list)]}
    if layer.extra is not None:
        table = layer.extra.table.cpu().tolist()
        cbs = layer.block_size // layer.ratio
        want["compressed_slot_mapping"] = [
            ref.slot_of(table, reqs[t], p // layer.ratio, cbs)
            if want["swa_slot_mapping"][t] >= 0 and ref.completes_row(p, layer.ratio) else -1
            for t, p in enumerate(pos_list)]
    v = []
    for name, w in want.items():
        got = [int(x) for x in getattr(meta, name).cpu().tolist()]
        bad = [t for t, (g, e) in enumerate(zip(got, w)) if g != e]
        if bad or len(got) != len(w):
            t = bad[0] if bad else min(len(got), len(w))
            v.append(Violation(f"{where}: the metadata's {name} differs from SPEC 1.3's slots",
                               f"token {t} (position {pos_list[t] if t < len(pos_list) else '-'}; "
                               f"{len(bad)} tokens differ)", str(w), str(got)))
    return v


def _write_violations(where, case, target, inp, layer, s, pos_list, before) -> list[Violation]:
    """(1) the SWA insert and (2) the compressors' writes: each valid token's record at its SPEC slot, nothing
    else touched."""
    swa_table = layer.swa.table.cpu().tolist()
    sbs = case.swa_block_size
    reqs = case.token_requests()
    spec_swa = {}
    for t, p in enumerate(pos_list):
        slot = ref.slot_of(swa_table, reqs[t], p, sbs)
        if slot >= 0:
            spec_swa[slot] = (f"the SWA row of request {reqs[t]} position {p}",
                              layer.k[s][t].cpu().to(torch.float64), torch.zeros(()))
    v = _written_rows_violations(f"{where}: SWA cache", layer.swa.view, before["swa"], spec_swa, pos_list,
                                 flavour=target.main_cache_fp8, cap=255)
    valid = _valid_tokens(case, layer, pos_list)
    if layer.extra is not None:
        v += _compressor_violations(where, case, target, inp, layer, pos_list, before["extra"], valid)
    if layer.indexer is not None:
        v += _indexer_writer_violations(where, target, inp, layer, pos_list, before["indexer"], valid)
    return v


def _valid_tokens(case, layer, pos_list) -> list[bool]:
    """SPEC 1.3: a token is valid when the SWA table maps its position (a padding token's position is -1)."""
    table = layer.swa.table.cpu().tolist()
    reqs = case.token_requests()
    return [ref.slot_of(table, reqs[t], p, case.swa_block_size) >= 0 for t, p in enumerate(pos_list)]


def _reference_attention(case, target, layer, s, pos_list, c4a_rows, scrub_extra: bool):
    """(4) the float64 attention over SPEC's slots: nothing for an invalid or padding token."""
    valid = _valid_tokens(case, layer, pos_list)
    reqs = case.token_requests()
    swa_table = layer.swa.table.cpu().tolist()
    main_slots = [[ref.slot_of(swa_table, reqs[t], p, case.swa_block_size) for p in ref.swa_positions(pos, case.window)]
                  if valid[t] else [] for t, pos in enumerate(pos_list)]
    extra_slots = None
    if layer.extra is not None:
        table = layer.extra.table.cpu().tolist()
        cbs = layer.block_size // layer.ratio
        if layer.ratio == 4:
            rows = c4a_rows
        else:
            rows = [list(range(ref.rows_so_far(pos, 128))) if valid[t] else [] for t, pos in enumerate(pos_list)]
        extra_slots = [[ref.slot_of(table, reqs[t], i, cbs) for i in row] for t, row in enumerate(rows)]
    return ref.reference_decode(layer.q[s].cpu(), layer.swa.view, main_slots,
                                layer.extra.view if layer.extra is not None else None, extra_slots,
                                attn_sink=layer.sink, softmax_scale=case.scale, main_flavour=target.main_cache_fp8,
                                extra_flavour=target.extra_cache_fp8, scrub_extra=scrub_extra)


def _mxfp8_violations(where, rot, codes, scales) -> list[Violation]:
    """(5) the MXFP8 epilogue: codes and scale codes of the rotated rows, exactly oracles.epilogues'."""
    want = ref_epi.mxfp8_quantize(rot)
    v = compare_exact(f"{where}: MXFP8 epilogue scale codes of the rotated decode output", scales.to(torch.int64),
                      want["scales"].to(torch.int64))
    v += compare_exact(f"{where}: MXFP8 epilogue e4m3 codes of the rotated decode output", codes.to(torch.int64),
                       want["codes"].to(torch.int64))
    return v


# ---------------------------------------------------------------------------------------------------------------
# the judgements
# ---------------------------------------------------------------------------------------------------------------

def _byte_owner(view: torch.Tensor, off: int) -> str:
    """Which slot and part of an ``fp8_ds_mla`` view a storage byte belongs to."""
    _, base = storage_bytes(view)
    rel = off - base
    bs, stride = int(view.shape[1]), int(view.stride(0))
    block, within = divmod(rel, stride)
    if rel < 0 or block >= view.shape[0]:
        return f"storage byte {off} (outside the view)"
    if within < bs * 576:
        pos, b = divmod(within, 576)
        part = "NoPE" if b < 448 else "RoPE"
    elif within < bs * 584:
        pos, b = divmod(within - bs * 576, 8)
        part = "scale" if b < 7 else "pad"
    else:
        return f"storage byte {off} (block {block} padding)"
    return f"slot {block * bs + pos} {part} byte {b}"


def _indexer_byte_owner(view: torch.Tensor, off: int) -> str:
    """Which slot and part of a NORMAL indexer-K view a storage byte belongs to."""
    _, base = storage_bytes(view)
    rel = off - base
    bs, stride = int(view.shape[1]), int(view.stride(0))
    block, within = divmod(rel, stride)
    if rel < 0 or block >= view.shape[0]:
        return f"storage byte {off} (outside the view)"
    if within < bs * 128:
        pos, b = divmod(within, 128)
        return f"slot {block * bs + pos} fp8 byte {b}"
    if within < bs * 132:
        pos, b = divmod(within - bs * 128, 4)
        return f"slot {block * bs + pos} scale byte {b}"
    return f"storage byte {off} (block {block} padding)"


def _storage_violations(label: str, view: torch.Tensor, want: torch.Tensor, pos_list, limit: int = 3,
                        owner=_byte_owner):
    got = storage_bytes(view)[0].cpu()
    bad = (got != want).nonzero().flatten().tolist()
    if not bad:
        return []
    owners = []
    for off in bad:
        o = owner(view, off).rsplit(" byte", 1)[0]
        if o not in owners:
            owners.append(o)
    out = [Violation(f"{label} differs from SPEC's (token positions {pos_list})", owner(view, off),
                     f"{int(want[off]):#04x}", f"{int(got[off]):#04x}") for off in bad[:limit]]
    out.append(Violation(f"{label}: {len(bad)} bytes differ in all", "; ".join(owners[:6]), "", ""))
    return out


def _written_rows_violations(label, view, before, records: dict, pos_list, *, flavour: str, cap: int):
    """Bytes outside the token records of ``records`` (slot -> (what, exact row, tol)) are unchanged, and each such
    record holds its row (``oracles.dsv4_step.row_problems``)."""
    after = storage_bytes(view)[0].cpu()
    allowed = torch.zeros_like(after, dtype=torch.bool)
    for slot in records:
        allowed[torch.tensor(ref.token_byte_offsets(view, slot), dtype=torch.int64)] = True
    want = torch.where(allowed, after, before)
    out = _storage_violations(f"{label} outside the rows this step writes", view, want, pos_list)
    for slot, (what, exact, tol) in records.items():
        tok = ref_writers.read_token(view, slot)
        for part, exp, got in ref.row_problems(tok, exact, tol, flavour=flavour, cap=cap):
            out.append(Violation(f"{label}: SPEC's slot {slot} does not hold {what}", part, exp, got))
    return out


def _compressor_violations(where, case, target, inp, layer, pos_list, before, valid) -> list[Violation]:
    """The compressed rows this step's valid tokens complete, against the compressor's reference row."""
    table = layer.extra.table.cpu().tolist()
    cbs = layer.block_size // layer.ratio
    records = {}
    for r, pos in enumerate(pos_list):
        if valid[r] and ref.completes_row(pos, layer.ratio):
            row = pos // layer.ratio
            tr = ref_comp.token_reference(layer.state, layer.state_table, r, pos, layer.norm_weight, inp.cos_sin,
                                          ratio=layer.ratio, eps=fz.NORM_EPS)
            records[ref.slot_of(table, r, row, cbs)] = (
                f"compressed row {row} of request {r} (completed by position {pos})", tr["exact"], tr["tol"])
    return _written_rows_violations(f"{where}: extra cache", layer.extra.view, before, records, pos_list,
                                    flavour=target.extra_cache_fp8, cap=target.writer_scale_code_cap)


def _indexer_writer_violations(where, target, inp, layer, pos_list, before, valid) -> list[Violation]:
    """The indexer-K rows this step's tokens complete: at SPEC's slots (NORMAL, the layer's table and rows per
    block), holding the head-128 compressor's row; nothing else touched."""
    idx = layer.indexer
    view = idx.view
    table = layer.extra.table.cpu().tolist()
    cbs = layer.block_size // 4
    after = storage_bytes(view)[0].cpu()
    flat, base = storage_bytes(view)
    flat = flat.cpu()
    allowed = torch.zeros_like(after, dtype=torch.bool)
    records = []
    for r, pos in enumerate(pos_list):
        if valid[r] and ref.completes_row(pos, 4):
            slot = ref.slot_of(table, r, pos // 4, cbs)
            allowed[torch.tensor(ref.indexer_token_offsets(view, slot, "normal"), dtype=torch.int64)] = True
            records.append((r, pos, slot))
    want = torch.where(allowed, after, before)
    label = f"{where}: indexer-K cache"
    out = _storage_violations(f"{label} outside the rows this step writes", view, want, pos_list,
                              owner=_indexer_byte_owner)
    for r, pos, slot in records:
        tok = ref_idx_writer.read_fp8_token(flat, base, view, slot, "normal")
        tr = ref_idx_writer.token_reference(idx.state, idx.state_table, r, pos, idx.norm_weight, inp.cos_sin,
                                            ratio=4, eps=fz.NORM_EPS)
        for part, exp, got in ref.indexer_row_problems(tok["codes"], tok["word"], tr["exact"], tr["tol"],
                                                       flavour=target.main_cache_fp8):
            out.append(Violation(f"{label}: SPEC's slot {slot} (NORMAL) does not hold the indexer row "
                                 f"{pos // 4} of request {r} (completed by position {pos})", part, exp, got))
    return out


def _indexer_violations(where, case, target, layer, s, pos_list, logits, local, width):
    """The indexer's logits and top-k against the float64 logits of the rows each query sees, (pos + 1) // 4,
    read from the indexer-K cache at SPEC's slots (NORMAL): ``contracts.indexer_logits``' comparisons (masks
    exact, the derived bound, the top-k set up to swaps within the bound of the k-th gap). Returns the violations
    and the rows the attention reference reads: the subject's top-k where it is excused, else SPEC's."""
    idx = layer.indexer
    label = f"{where}: indexer"
    valid = _valid_tokens(case, layer, pos_list)
    visible = [[ref.rows_so_far(pos, 4) if valid[t] else 0] for t, pos in enumerate(pos_list)]
    by_req = layer.extra.table.cpu().tolist()
    table = [by_req[r] for r in case.token_requests()]

    def paged(reading):
        return ref_logits.paged_logits(idx.q[s].cpu(), idx.view, idx.weights[s].cpu(), visible, table, width,
                                       reading, target.main_cache_fp8)

    def alternatives():
        # the reading a C4A step gets wrong when a reader is handed no layout (its default for bs > 1)
        if int(idx.view.shape[1]) % 16 == 0:
            yield [SHUFFLE_READING], paged("shuffle")

    lref = paged("normal")
    lref["heads"] = case.indexer_heads
    v = judge_logits(logits, lref, case.indexer_heads, label, alternatives)
    vt = compare_topk(local, logits, lref, case.topk, label)
    if vt or v:
        rows = [[c for c in row if c >= 0] for row in ref_logits.topk(lref["logits"].tolist(), case.topk)]
    else:
        rows = [[c for c in row if c >= 0] for row in local.tolist()]
    return v + vt, rows


def _epilogue_violations(where, dec_out, rot, cos_sin, pos_list, limit: int = 3) -> list[Violation]:
    """The epilogue's output against the inverse GPT-J RoPE (float64) of the decode output it was given."""
    x = dec_out.to(torch.float32)
    # a padding token's row (position -1, an empty attention: zeros) is rotated at position 0
    want, mag = ref_epi.inverse_rope_gptj(x, cos_sin, [max(p, 0) for p in pos_list])
    out: list[Violation] = []
    head = x.shape[2] - 64
    same = (rot[:, :, :head].view(torch.int16) == dec_out[:, :, :head].view(torch.int16)) | \
        (torch.isnan(rot[:, :, :head]) & torch.isnan(dec_out[:, :, :head]))
    for idx in (~same).nonzero()[:limit].tolist():
        i = tuple(idx)
        out.append(Violation(f"{where}: epilogue changed a NoPE lane of the decode output", f"out{list(i)}",
                             fmt(float(dec_out[i])), fmt(float(rot[i]))))
    g = rot[:, :, head:].to(torch.float64)
    w = want[:, :, head:]
    nan_w, nan_g = torch.isnan(w), torch.isnan(g)
    for idx in (nan_w != nan_g).nonzero()[:limit].tolist():
        i = tuple(idx)
        out.append(Violation(f"{where}: epilogue NaN mask differs from the inverse RoPE of the decode output",
                             f"out[{i[0]}, {i[1]}, {head + i[2]}]", fmt(float(w[i])), fmt(float(g[i]))))
    fin = torch.isfinite(w)
    bound_ = ref_epi.rope_error_bound(w, mag[:, :, head:], torch.bfloat16)
    err = (g - w).abs()
    bad = (fin & ~(err <= bound_)) | (torch.isinf(w) & (g != w) & ~nan_g)
    if bool(fin.any()):
        record_margin(err[fin], bound_[fin])
    for idx in bad.nonzero()[:limit].tolist():
        i = tuple(idx)
        out.append(Violation(f"{where}: epilogue output is not the inverse RoPE of the decode output at the query's "
                             f"position {pos_list[i[0]]}", f"out[{i[0]}, {i[1]}, {head + i[2]}]",
                             f"{float(w[i])!r} +- {float(bound_[i]):.3g}", fmt(float(g[i]))))
    return out


# ---------------------------------------------------------------------------------------------------------------
# the metadata builder's capture flag
# ---------------------------------------------------------------------------------------------------------------

def _same_metadata(a, b) -> list[str]:
    """Names of the fields (other than ``for_cudagraph_capture``) on which two metadata objects differ."""
    names = [n for n in vars(a) if n != "for_cudagraph_capture"]
    diff = []
    for n in names:
        x, y = getattr(a, n), getattr(b, n, None)
        same = torch.equal(x.cpu(), y.cpu()) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) \
            else x == y
        if not same:
            diff.append(n)
    return diff


@contract("dsv4-builder-capture-flag", targets=ALL_TARGETS, cases=lambda t: fz.builder_cases(), min_cases=8,
          case_type=fz.BuilderCase)
def dsv4_builder_capture_flag(case: fz.BuilderCase, target: Target) -> list[Violation]:
    """The DSv4 step metadata builder (``dsv4_step.Dsv4MetadataBuilder``; upstream's
    ``DeepseekV4ROCMAiterMLASparseMetadataBuilder``) sets ``for_cudagraph_capture`` by seed 004's rule: False from
    ``build``; from ``build_for_cudagraph_capture``, True exactly on gfx950 (upstream: ``_ON_GFX950``), for every
    layer kind (SWA-only, C4A, C128A: the layer decides adaptive splits from it, not the builder), with or without
    padding tokens; and, a capture being built like any step, the capture metadata equals ``build``'s in every
    other field. The flag decides whether a captured C128A decode takes the adaptive-splits path (SPEC 2):
    ``dsv4-step-agreement`` then judges the captured plan. The positions, token_to_req and block tables may be
    laid out otherwise than packed (stride-2 vectors; a slice of a wider table, column-major tables:
    :func:`builder_layout_violations`): the metadata is then field for field that of packed copies of the same
    values, or the layout is refused before anything is built (a ValueError/TypeError naming the argument, no input
    buffer changed). Sources: seed 004 item 2; upstream's rocm.py; issue 30 (memory layouts)."""
    fam = bound(target).dsv4_step
    builder = fam.Dsv4MetadataBuilder(case.compress_ratio, swa_block_size=fz.BUILDER_SIZES["swa_block_size"],
                                      block_size=fz.BUILDER_SIZES["block_size"] if case.compress_ratio > 1 else None,
                                      max_model_len=fz.BUILDER_SIZES["max_model_len"], target=target)
    if _builder_laid_out(case):
        v, case = builder_layout_violations(builder, case)
        if v or case is None:
            return v
    args = fz.builder_inputs(case)
    plain = builder.build(*args)
    meta = builder.build_for_cudagraph_capture(*args) if case.capture else plain
    how = "build_for_cudagraph_capture" if case.capture else "build"
    want = ref.capture_flag(target.name) if case.capture else False
    v = []
    if getattr(meta, "for_cudagraph_capture", None) is not want:
        v.append(Violation(f"the builder's {how} sets for_cudagraph_capture other than seed 004's rule (True exactly "
                           f"on gfx950, for a capture)", f"compress_ratio {case.compress_ratio}", str(want),
                           repr(getattr(meta, "for_cudagraph_capture", "<absent>"))))
    if case.capture:
        diff = _same_metadata(plain, meta)
        if diff:
            v.append(Violation("build_for_cudagraph_capture's metadata differs from build's beyond the flag",
                               ", ".join(diff), "equal", "different"))
    return v


# --- the builder's input layouts (fuzz.dsv4_step.BUILDER_*_LAYOUTS, issue 30) -------------------------------------

BUILDER_LAYOUT_DIFFERS = "the builder's metadata from non-packed inputs differs from packed copies'"
BUILDER_REFUSAL_UNCLEAR = "the builder refused a non-packed input layout without naming the argument"
BUILDER_INPUT_WRITTEN = "the builder wrote into an input's buffer"


def _builder_laid_out(case: fz.BuilderCase) -> dict:
    return {d: getattr(case, d) for d in fz.BUILDER_LAYOUT_ARGS if getattr(case, d) != "contiguous"}


def builder_layout_violations(builder, case: fz.BuilderCase):
    """A builder case with non-packed inputs, against the same builder on packed copies of the same values:
    ``build`` (and, for a capture, ``build_for_cudagraph_capture``) give metadata equal in every field, the flag
    included, and no input buffer changes; or the call refuses with a ValueError/TypeError naming one of the
    laid-out arguments. Returns ``(violations, packed twin)``: the twin (for the flag's own checks) is None after a
    refusal."""
    laid = _builder_laid_out(case)
    names = [n for d in laid for n in fz.BUILDER_LAYOUT_ARGS[d]]
    twin = case.replace(**{d: "contiguous" for d in laid})
    bufs = fz.builder_buffers(case)
    args = tuple(view for _, view in bufs)
    before = [b.cpu().clone() if b is not None else None for b, _ in bufs]
    where = ", ".join(f"{k}={v}" for k, v in laid.items())
    v: list[Violation] = []

    def unchanged(how: str):
        for (b, _), old, name in zip(bufs, before, ("positions", "token_to_req", "swa_block_table", "block_table")):
            if b is not None and not torch.equal(b.cpu(), old):
                v.append(Violation(BUILDER_INPUT_WRITTEN, f"{name} ({where}; {how})", "unchanged", "changed"))

    packed = fz.builder_inputs(twin)
    for how in ("build", "build_for_cudagraph_capture") if case.capture else ("build",):
        want = getattr(builder, how)(*packed)
        try:
            got = getattr(builder, how)(*args)
        except (ValueError, TypeError) as exc:
            if not any(n in str(exc) for n in names):
                v.append(Violation(BUILDER_REFUSAL_UNCLEAR, f"{how} ({where})", f"one of {names}", str(exc)[:200]))
            unchanged(f"{how}, refused")
            return v, None
        unchanged(how)
        diff = _same_metadata(want, got)
        if getattr(want, "for_cudagraph_capture", None) != getattr(got, "for_cudagraph_capture", None):
            diff.append("for_cudagraph_capture")
        if diff:
            v.append(Violation(BUILDER_LAYOUT_DIFFERS, f"{how} ({where}): {', '.join(diff)}", "equal", "different"))
    return v, twin
