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

from contracts.core import ALL_TARGETS, Violation, contract, fmt, record_margin, single_threaded
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
    ("epilogues", "inverse_rope_gptj"),
    ("dsv4_step", "build_layer_metadata"),
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


@contract("dsv4-step-agreement", targets=ALL_TARGETS, cases=_cases, min_cases=1, max_cases=1, case_type=Dsv4StepCase,
          numeric=True)
def dsv4_step_agreement(case: Dsv4StepCase, target: Target) -> list[Violation]:
    """A few decode steps of a toy DSv4 attention (SWA-only, C4A and C128A layers) agree, layer by layer and step by
    step, with a float64 reference of the same step written from SPEC.

    Per layer and step: (1) every byte of the SWA cache outside the record at the SPEC slot of the token's position
    (the SWA block table, its own block size) is unchanged, and that record holds the token's row; (2) on a
    compressed layer, every byte of the extra cache (and, on C4A, of the indexer-K cache, NORMAL) outside the
    records of the rows this step's tokens complete is unchanged, and each such record, at SPEC's slot (the layer's
    block table, block_size // ratio rows per block), holds the compressor's row for those positions up to the
    writer's rounding (oracles.dsv4_step.row_problems / indexer_row_problems: they identify the row, the writers'
    own contracts judge the bytes); (3) C4A: the indexer's logits equal the float64 logits of the (pos + 1) // 4
    rows each query sees, read from the indexer-K cache at SPEC's slots, and its top-k is their top-k, by the rules
    of indexer-logits-agreement (masks exact, its derived bound, sets that differ only by swaps within the bound of
    the k-th gap are excused; the attention below then reads the subject's excused set, else SPEC's); (4) the
    decode output equals the float64 attention over exactly SPEC's slots (the SWA window
    max(pos - window + 1, 0)..pos; C128A: every row so far, (pos + 1) // 128; C4A: the top-k rows) of the caches
    the kernels wrote, dequantized the way the kernels read them, within oracles.compare's derived bound for the
    plan's split count, NaN/inf masks exactly; (5) at the last step, the epilogue's output is the inverse GPT-J RoPE
    at the query's position of that decode output, within oracles.epilogues' float32 bound, the other lanes copied
    exactly; (6) the trust gate is SPEC 4's. Every cache slot nobody should read is poisoned, the graph buffers'
    stale entries point at poisoned slots, outputs, logits and workspaces are NaN-poisoned before each run, and the
    kernels run before the reference. This is where pieces that each pass their own contract can still disagree:
    a writer's slot and the table a reader uses, the window positions and the insert positions, the compressed
    block size of the slot conversion, the indexer-K layout its writer and its reader are given, the graph-buffer
    copy and the rows the decode reads, the epilogue and the decode's output. Sources: SPEC 1.2, 1.3, 2, 4, 5;
    upstream's ``_forward_decode`` (vllm/models/deepseek_v4/amd/rocm.py) for the order of the pieces. The first step
    and layer with a violation ends the case.
    """
    sub = bound(target)
    ent = step_entries(sub)
    with single_threaded():
        inp = fz.build_step_inputs(case, target)
        bufs = _graph_buffers(case, inp)
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
    max_tokens = case.batch + 1
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
    T, H = case.batch, case.heads
    pos_list = case.positions(s)
    positions = torch.tensor(pos_list, dtype=torch.int64, device=dev)
    t2r = inp.token_to_req
    has_extra = layer.extra is not None
    where = f"step {s}, layer {li} ({layer.name})"

    meta = ent["dsv4_step.build_layer_metadata"](
        layer.ratio, positions, t2r, layer.swa.table, case.swa_block_size,
        block_table=layer.extra.table if has_extra else None, block_size=layer.block_size,
        max_model_len=inp.max_model_len)

    # --- writes ---
    swa_before = storage_bytes(layer.swa.view)[0].cpu().clone()
    ent["cache_writers.quantize_and_insert_k_cache"](layer.k[s], meta.swa_slot_mapping, layer.swa.view,
                                                      target=target)
    if has_extra:
        extra_before = storage_bytes(layer.extra.view)[0].cpu().clone()
        ent["compressor.compress_norm_rope_store"](
            layer.state, layer.state_table, t2r, positions, meta.compressed_slot_mapping, layer.norm_weight,
            inp.cos_sin, layer.extra.view, ratio=layer.ratio, eps=fz.NORM_EPS, target=target)
    idx = layer.indexer
    if idx is not None:
        idx_before = storage_bytes(idx.view)[0].cpu().clone()
        ent["indexer_writer.compress_norm_rope_store_indexer"](
            idx.state, idx.state_table, t2r, positions, meta.compressed_slot_mapping, idx.norm_weight, inp.cos_sin,
            idx.view, ratio=4, eps=fz.NORM_EPS, layout=meta.indexer_layout, target=target)

    # --- the indexer (C4A): logits over the rows so far, then the top-k ---
    logits = local = None
    if idx is not None:
        width = inp.max_model_len // 4
        logits_buf = torch.full((T, width), math.nan, dtype=torch.float32, device=dev)
        logits = ent["indexer_logits.fp8_paged_mqa_logits"](
            idx.q[s], idx.view, idx.weights[s], meta.indexer_context_lens, layer.extra.table, width,
            layout=meta.indexer_layout, out=logits_buf, target=target)
        local = ent["indexer_logits.topk_indices"](logits, case.topk)

    # --- slots ---
    swa_dense, swa_lens = ent["ragged.compute_swa_indices_and_lens"](positions, t2r, layer.swa.table,
                                                                      case.swa_block_size, case.window)
    swa_rag, swa_ptr = ent["ragged.build_ragged_indices_from_dense"](swa_dense.reshape(T, case.window), swa_lens)
    copy = ent["graph_buffers.copy_ragged_to_graph_buffers"]
    main_idx, main_ptr = copy(swa_rag, swa_ptr, bufs["swa_idx"], bufs["swa_ptr"], T, case.window, target=target)
    extra_idx = extra_ptr = None
    if layer.ratio == 4:
        extra_idx, extra_ptr = ent["ragged.compute_global_topk_ragged_indices_and_indptr"](
            local, t2r, layer.extra.table, meta.topk_block_size, meta.is_valid_token)
    elif layer.ratio == 128:
        rag, ptr = ent["ragged.build_ragged_indices_from_dense"](meta.c128a_topk, meta.c128a_lens)
        extra_idx, extra_ptr = copy(rag, ptr, bufs["c128a_idx"], bufs["c128a_ptr"], T, bufs["c128a_width"],
                                    target=target)

    # --- decode ---
    trust = ent["cache_writers.trust_extra_cache_nan_free"](target, CACHE_DTYPE, False, has_extra)
    plan = ent["decode.plan_decode"](target, T, H, main_idx.numel(), extra_idx.numel() if has_extra else 0,
                                     cu_count=case.cu_count)
    ws = ent["decode.DecodeWorkspace"].allocate(T, plan.num_splits, H, dev, fill=math.nan)
    out = torch.full((T, H, 512), math.nan, dtype=torch.bfloat16, device=dev)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the interpreter's numpy warns on 0 * inf by design
        ent["decode.sparse_attn_decode"](
            layer.q[s], layer.swa.view, main_idx, main_ptr, layer.extra.view if has_extra else None, extra_idx,
            extra_ptr, attn_sink=layer.sink, softmax_scale=case.scale, target=target, trust_extra_nan_free=trust,
            plan=plan, workspace=ws, out=out)
    got = out.cpu().clone()
    dec_out = got.clone()  # what the epilogue was given (``got`` may have rows marked by zeroed_nan_rows below)

    # --- epilogue (the last step only: each launch costs the interpreter more than the rest of a layer's step) ---
    rot = None
    if s == case.steps - 1:
        rot_buf = torch.full((T, H, 512), math.nan, dtype=torch.bfloat16, device=dev)
        rot = ent["epilogues.inverse_rope_gptj"](out, inp.cos_sin, positions, out=rot_buf).cpu().clone()

    # ================= the reference, after every kernel ran =================
    v: list[Violation] = []
    swa_table = layer.swa.table.cpu().tolist()
    sbs = case.swa_block_size
    # (1) the SWA insert: the token's row at the SPEC slot of its position, nothing else touched
    spec_swa = {ref.slot_of(swa_table, r, p, sbs): (f"the SWA row of request {r} position {p}",
                                                     layer.k[s][r].cpu().to(torch.float64), torch.zeros(()))
                for r, p in enumerate(pos_list)}
    v += _written_rows_violations(f"{where}: SWA cache", layer.swa.view, swa_before, spec_swa, pos_list,
                                  flavour=target.main_cache_fp8, cap=255)
    # (2) the compressors: the rows this step completes, at their SPEC slots, nothing else touched
    if has_extra:
        v += _compressor_violations(where, case, target, inp, layer, pos_list, extra_before)
    c4a_rows = None
    if idx is not None:
        v += _indexer_writer_violations(where, target, inp, layer, pos_list, idx_before)
        # (3) the indexer: logits and top-k against the float64 logits of the rows so far, read at SPEC's slots
        v_idx, c4a_rows = _indexer_violations(where, case, target, layer, s, pos_list, logits.cpu().clone(),
                                              local.cpu().clone(), inp.max_model_len // 4)
        v += v_idx
    # (6) the trust gate
    want_trust = ref_trust.trust_expected(target.name, CACHE_DTYPE, False, has_extra)
    if trust != want_trust:
        v.append(Violation(f"{where}: trust gate differs from SPEC 4's", "trust_extra_cache_nan_free",
                           str(want_trust), str(trust)))
    # (4) the attention over SPEC's slots
    main_slots = [[ref.slot_of(swa_table, r, p, sbs) for p in ref.swa_positions(pos, case.window)]
                  for r, pos in enumerate(pos_list)]
    extra_slots = None
    if has_extra:
        table = layer.extra.table.cpu().tolist()
        cbs = layer.block_size // layer.ratio
        if layer.ratio == 4:
            rows = c4a_rows
        else:
            rows = [list(range(ref.rows_so_far(pos, 128))) for pos in pos_list]
        extra_slots = [[ref.slot_of(table, r, i, cbs) for i in row] for r, row in enumerate(rows)]
    attn = ref.reference_decode(layer.q[s].cpu(), layer.swa.view, main_slots, layer.extra.view if has_extra else None,
                                extra_slots, attn_sink=layer.sink, softmax_scale=case.scale,
                                main_flavour=target.main_cache_fp8, extra_flavour=target.extra_cache_fp8,
                                scrub_extra=not want_trust)
    v += zeroed_nan_rows(f"{where}: {NAN_ROW_ZEROED}", got, attn.out)
    v += oracle_violations(f"{where}: decode output vs the float64 attention over SPEC's slots "
                           f"(S={plan.num_splits})", got, attn, plan.num_splits)
    # (5) the epilogue, from the decode's own output
    if rot is not None:
        v += _epilogue_violations(where, dec_out, rot, inp.cos_sin.cpu(), pos_list)
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


def _compressor_violations(where, case, target, inp, layer, pos_list, before) -> list[Violation]:
    """The compressed rows this step's tokens complete, against the compressor's reference row."""
    table = layer.extra.table.cpu().tolist()
    cbs = layer.block_size // layer.ratio
    records = {}
    for r, pos in enumerate(pos_list):
        if ref.completes_row(pos, layer.ratio):
            row = pos // layer.ratio
            tr = ref_comp.token_reference(layer.state, layer.state_table, r, pos, layer.norm_weight, inp.cos_sin,
                                          ratio=layer.ratio, eps=fz.NORM_EPS)
            records[ref.slot_of(table, r, row, cbs)] = (
                f"compressed row {row} of request {r} (completed by position {pos})", tr["exact"], tr["tol"])
    return _written_rows_violations(f"{where}: extra cache", layer.extra.view, before, records, pos_list,
                                    flavour=target.extra_cache_fp8, cap=target.writer_scale_code_cap)


def _indexer_writer_violations(where, target, inp, layer, pos_list, before) -> list[Violation]:
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
        if ref.completes_row(pos, 4):
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
    visible = [[ref.rows_so_far(pos, 4)] for pos in pos_list]
    table = layer.extra.table.cpu().tolist()

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
    want, mag = ref_epi.inverse_rope_gptj(x, cos_sin, pos_list)
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
