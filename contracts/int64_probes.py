"""``int64-addressing``: every component that addresses a cache pool through ``block * stride(0)`` does it in 64 bits.

SPEC 1.2: the product passes 2^31 at about 57K blocks. Each probe writes or reads tokens at the far end of a pool
larger than 2^32 bytes, whose block offset computed in 32 bits would wrap to a small positive value inside the same
pool: a wrong read or write, not a crash. The pool's start is poisoned so a wrapped access cannot agree by accident.
Probes: the SWA insert and the compressor (writers), the decode (readers, every kernel family; and its q and out
rows and heads, ``decode-views``), the indexer-K gather (both variants), the sparse prefill (kv rows, ragged and
dense indices, and a strided topk_length), the decode's epilogues (inverse RoPE and MXFP8 input rows) and the
indexer logits (the prefill's q rows, key scales and out rows, the decode's cache blocks), and the indexer-K writers
(the direct writer at the far end of a pool, ``indexer-k-quant``; the head-128 compressor's state block table rows far
apart, ``indexer-compress``). Those rows are 1.6 G bf16 elements
apart, a stride that still fits an int32 (Triton passes it as one), so only the kernel's own widening keeps
``row * stride`` in 64 bits. A component adds its own with :func:`int64_probe`, naming the entry points it runs; a
case names the probes whose entry points the current subject has (``bound(target)``), so a subject without an SWA
insert is probed through its compressor and decode.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import math
import os
import tempfile
import threading
import warnings
from dataclasses import dataclass
from typing import Callable, ClassVar

import torch
from hypothesis import strategies as st

from contracts.cache_writers import record_row_margin
from contracts.core import ALL_TARGETS, Violation, contract
from contracts.decode import oracle_violations
from contracts.formats import subject_has
from contracts.subjects import bound
from fuzz import cache_writers as fw
from fuzz.cases import Case
from fuzz.cache_writers import CompressorCase
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target
from oracles import cache_writers as ocw
from oracles import compressor as ocomp
from oracles import decode as ref_decode


# --- the probe registry and the far-end pool ---------------------------------------------------------------------------------------------

#: name -> probe(target) -> violations; each probe writes at the far end of a pool larger than 2^32 bytes
INT64_PROBES: dict[str, Callable[[Target], list[Violation]]] = {}
#: name -> the entry points ("family.name") of the subject the probe runs
PROBE_ENTRIES: dict[str, tuple[str, ...]] = {}
POOL_BYTES_MIN = 2 ** 32 + 2 ** 20


def int64_probe(name: str, entries: tuple[str, ...] = ()):
    """Register a far-end addressing probe under ``int64-addressing`` (decode readers add theirs here), with the
    subject's entry points it runs; a writer's probe is usually ``far_end_probe(name, write)`` with a callback that
    runs the writer and derives its token."""
    def register(fn):
        @functools.wraps(fn)
        def probe(target: Target) -> list[Violation]:
            with one_big_pool_at_a_time():  # whoever calls it (the contract, a test, a script) takes its turn
                return fn(target)

        INT64_PROBES[name] = probe
        PROBE_ENTRIES[name] = tuple(entries)
        return probe
    return register


def subject_probes(target: Target) -> tuple[str, ...]:
    """The registered probes whose entry points the current subject has on ``target`` (all of them, when it has
    none: the row is then skipped naming the first missing entry point)."""
    have = tuple(name for name in sorted(INT64_PROBES)
                 if all(subject_has(target, *e.split(".")) for e in PROBE_ENTRIES[name]))
    return have or tuple(sorted(INT64_PROBES))


def far_end_pool(block_size: int, device):
    """A ``[nb, bs, 584]`` view over an uninitialised pool of more than 2^32 bytes (pages are only committed where
    touched) whose last block starts just past 2^32, so an offset computed in int32 wraps to a small positive value
    inside the same pool: a wrong read, not a crash. Returns (flat, view, last_slot, wrapped_offset)."""
    stride = formats.Fp8DsMlaLayout(block_size).padded_block_bytes
    nb = POOL_BYTES_MIN // stride + 2
    flat = torch.empty(nb * stride, dtype=torch.uint8, device=device)
    view = flat.as_strided((nb, block_size, formats.DSV4_TOKEN_BYTES), (stride, formats.DSV4_TOKEN_BYTES, 1))
    last = nb * block_size - 1
    far = (nb - 1) * stride
    assert 2 ** 32 <= far < 2 ** 32 + 2 ** 31
    return flat, view, last, far - 2 ** 32


def _poison_ends(flat, view, wrapped: int) -> int:
    stride = view.stride(0)
    head = wrapped + 2 * stride
    flat[:head] = 0xFF
    flat[-2 * stride:] = 0xFF
    return head


def _check_far_token(name, flat, view, slot, want_tok, head) -> list[Violation]:
    out = []
    got = ocw.read_token(view, slot)
    for k in ("nope", "scale", "rope"):
        if not torch.equal(got[k], want_tok[k]):
            bad = int((got[k] != want_tok[k]).sum())
            out.append(Violation(f"{name}: token at the far end of a >2^32-byte pool reads back wrong",
                                 f"slot {slot} {k}", "the written bytes", f"{bad} bytes differ"))
    if got["pad"] != 0:
        out.append(Violation(f"{name}: pad byte at the far end", f"slot {slot}", "0", str(got["pad"])))
    touched = int((flat[:head].cpu() != 0xFF).sum())
    if touched:
        out.append(Violation(f"{name}: bytes at the pool's start changed (an int32 offset wrapped)",
                             f"first {head} bytes", "untouched", f"{touched} bytes changed"))
    return out


#: write(view, slot, device) -> (expected token bytes, further violations): runs one writer so that it stores a
#: token at ``slot`` of ``view``, then derives what that token must hold
FarEndWrite = Callable[[torch.Tensor, int, object], "tuple[dict, list[Violation]]"]


def far_end_probe(name: str, write: FarEndWrite, block_size: int = 3) -> list[Violation]:
    """Run ``write`` against the last slot of a :func:`far_end_pool` whose two ends are poisoned, then check that the
    token reads back as expected and that the pool's start (where a wrapped int32 offset lands) is untouched."""
    dev = kernel_device()
    flat, view, slot, wrapped = far_end_pool(block_size, dev)
    try:
        head = _poison_ends(flat, view, wrapped)
        want, extra = write(view, slot, dev)
        return _check_far_token(name, flat, view, slot, want, head) + extra
    finally:
        del flat, view  # release the > 4 GiB pool before the next probe allocates its own


@int64_probe("swa-insert", ("cache_writers.quantize_and_insert_k_cache",))
def _probe_swa(target: Target) -> list[Violation]:
    insert = bound(target).cache_writers.quantize_and_insert_k_cache

    def write(view, slot, dev):
        g = torch.Generator().manual_seed(5)
        k = (torch.randn(2, 512, generator=g) * 3).to(torch.bfloat16)
        insert(k.to(dev), torch.tensor([slot, -1], dtype=torch.int64, device=dev), view,
                                    target=target)
        return ocw.quantize_pack_row(k[0], flavour=target.main_cache_fp8, cap=255, sanitize=False,
                                     rope_from_fp32=False), []

    return far_end_probe("swa insert", write)


@int64_probe("compressor", ("compressor.compress_norm_rope_store",))
def _probe_compressor(target: Target) -> list[Violation]:
    compress = bound(target).compressor.compress_norm_rope_store

    def write(view, slot, dev):
        # the case's geometry is the far-end pool's, so it describes where the token lands
        case = CompressorCase(seed=9, ratio=4, state_block_size=4, num_reqs=1, positions=(7,), reqs=(0,),
                              slots=(slot,), score_scale=1.0, weight="normal", eps=1e-6, specials=(),
                              block_size=int(view.shape[1]), padded=True, num_blocks=int(view.shape[0]))
        inp = fw.build_compressor_inputs(case, dev)
        inter = torch.full((1, 512), float("nan"), device=dev)
        compress(inp["state"], inp["state_block_table"], inp["token_to_req"], inp["positions"], inp["slot_mapping"],
                 inp["norm_weight"], inp["cos_sin_cache"], view, ratio=case.ratio, eps=case.eps, target=target,
                 intermediates=inter)
        want = ocomp.pack_reference_row(inter[0].cpu(), cap=target.writer_scale_code_cap,
                                        sanitize=target.sanitizes_writer)
        ref = ocomp.token_reference(inp["state"], inp["state_block_table"], 0, case.positions[0], inp["norm_weight"],
                                    inp["cos_sin_cache"], ratio=case.ratio, eps=case.eps)
        record_row_margin(inter[0].cpu(), ref["row"], ref["tol"])
        extra = [Violation("compressor: fp32 row at the far end out of tolerance", str(item[0]))
                 for item in ocomp.compare_rows(inter[0].cpu(), ref["row"], ref["tol"])]
        return want, extra

    return far_end_probe("compressor", write)


# --- the decode's probe ------------------------------------------------------------------------

#: byte written over the pool's start, where an offset computed in 32 bits would land: a wrong read shows up as
#: huge fp8 values / bf16 RoPE lanes (0x7E7E) instead of the far-end tokens
HEAD_POISON = 0x7E
#: blocks at the far end that hold the tokens the decode reads (both lie past 2^32 in ``far_end_pool``)
FAR_BLOCKS = 2


@int64_probe("decode", ("decode.plan_decode", "decode.sparse_attn_decode"))
def int64_decode_probe(target: Target) -> list[Violation]:
    """Registered under ``int64-addressing``: for block sizes 3, 1 and 64, the decode reads tokens at the far end of
    a cache pool larger than 2^32 bytes through the main and the extra segment of the target's kernel family."""
    out: list[Violation] = []
    for seed, bs in ((3, 3), (4, 1), (5, 64)):
        out += _decode_far_end(seed, bs, target)
    return out


def _decode_far_end(seed: int, bs: int, target: Target) -> list[Violation]:
    """The decode addresses its caches in int64 (SPEC 1.2, ``block * stride(0)``): tokens at the far end of a
    cache pool larger than 2^32 bytes give the oracle's output; the pool's start, where a 32-bit block offset would
    wrap to, is poisoned so a wrapped read cannot agree by accident. The oracle reads a small copy of the far-end
    blocks (same tokens, slots shifted) so it never walks the big pool. Also an invalid entry one past the last
    slot stays masked."""
    dec = bound(target).decode
    dev = kernel_device()
    gen = torch.Generator().manual_seed(seed)
    flat, view, last_slot, wrapped = far_end_pool(bs, dev)
    first_far = last_slot + 1 - FAR_BLOCKS * bs
    try:
        stride = view.stride(0)
        flat[: wrapped + 2 * stride] = HEAD_POISON
        n_far = FAR_BLOCKS * bs
        far_slots = list(range(first_far, first_far + n_far))
        formats.pack_fp8_ds_mla(view, far_slots, formats.fp8_encode(torch.randn(n_far, 448, generator=gen) * 4,
                                                                    target.main_cache_fp8),
                                torch.randint(123, 128, (n_far, formats.DSV4_NUM_GROUPS),
                                              generator=gen).to(torch.uint8),
                                torch.randn(n_far, formats.DSV4_ROPE_DIM, generator=gen).to(torch.bfloat16))
        num_slots = view.shape[0] * bs
        pick = lambda k: [far_slots[int(i)] for i in torch.randint(0, n_far, (k,), generator=gen)]  # noqa: E731
        main_rows = [pick(3) + [far_slots[-1]], pick(2) + [num_slots]]
        extra_rows = [pick(2), [far_slots[0]] + pick(2)]
        h = 2
        q = torch.randn(2, h, formats.DSV4_HEAD_DIM, generator=gen).to(torch.bfloat16)
        sink = torch.tensor([0.5, -math.inf], dtype=torch.float32)

        def ragged(rows, small_copy: bool):
            # for the oracle's small copy of the far blocks, far slots shift down and anything else is invalid
            if small_copy:
                flat_idx = [s - first_far if first_far <= s < first_far + n_far else -1 for r in rows for s in r]
            else:
                flat_idx = [s for r in rows for s in r]
            ptr = [0]
            for r in rows:
                ptr.append(ptr[-1] + len(r))
            return torch.tensor(flat_idx, dtype=torch.int32), torch.tensor(ptr, dtype=torch.int32)

        mi, mp = ragged(main_rows, False)
        ei, ep = ragged(extra_rows, False)
        out = torch.full((2, h, formats.DSV4_HEAD_DIM), math.nan, dtype=torch.bfloat16, device=dev)
        plan = dec.plan_decode(target, 2, h, mi.numel(), ei.numel(), cu_count=2)
        ws = (dec.DecodeWorkspace.allocate(2, plan.num_splits, h, dev, fill=math.nan)
              if plan.family != "generic" else None)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            dec.sparse_attn_decode(q.to(dev), view, mi.to(dev), mp.to(dev), view, ei.to(dev), ep.to(dev),
                                   attn_sink=sink.to(dev), softmax_scale=0.09, target=target, cu_count=2, plan=plan,
                                   workspace=ws, out=out)
        got = out.cpu().clone()
        small = view[view.shape[0] - FAR_BLOCKS:].cpu().clone()
    finally:
        del flat, view
    smi, _ = ragged(main_rows, True)
    sei, _ = ragged(extra_rows, True)
    ref = ref_decode.ref_sparse_attn_decode(q, small, smi, mp, small, sei, ep, attn_sink=sink, softmax_scale=0.09,
                                            main_flavour=target.main_cache_fp8,
                                            extra_flavour=target.extra_cache_fp8, scrub_extra=True)
    return oracle_violations("decode at the far end of a >2^32-byte pool vs oracle", got, ref, plan.num_splits)


@int64_probe("decode-views", ("decode.plan_decode", "decode.sparse_attn_decode"))
def int64_decode_views_probe(target: Target) -> list[Violation]:
    """The decode addresses q and out in int64 (``row * stride`` and ``head * stride``; sparse_attn_decode takes
    any strides of q and any of out with a unit last stride): a [3, 3, 512] q and out whose rows, or whose heads,
    lie :data:`FAR_ROW_STRIDE` elements apart in one bf16 pool (index 2 past 2^31 elements, where an int32 product
    wraps onto poisoned words) give the oracle's output of the packed q. Two calls: q heads far with out rows far,
    then q rows far with out heads far; the cache is small and packed."""
    dec = bound(target).decode
    dev = kernel_device()
    gen = torch.Generator().manual_seed(13)
    B = H = 3
    D = formats.DSV4_HEAD_DIM
    bs, nb = 2, 4
    n = nb * bs
    stride = formats.Fp8DsMlaLayout(bs).padded_block_bytes
    cache = torch.zeros(nb * stride, dtype=torch.uint8).as_strided((nb, bs, formats.DSV4_TOKEN_BYTES),
                                                                 (stride, formats.DSV4_TOKEN_BYTES, 1))
    formats.pack_fp8_ds_mla(cache, list(range(n)),
                            formats.fp8_encode(torch.randn(n, 448, generator=gen) * 4, target.main_cache_fp8),
                            torch.randint(123, 128, (n, formats.DSV4_NUM_GROUPS), generator=gen).to(torch.uint8),
                            torch.randn(n, formats.DSV4_ROPE_DIM, generator=gen).to(torch.bfloat16))
    rows = [[0, 3, 5], [1, 7], [2, 4, 6, 0, n]]  # n: one past the last slot, masked
    mi = torch.tensor([s for r in rows for s in r], dtype=torch.int32)
    mp = torch.tensor([0, 3, 5, 10], dtype=torch.int32)
    sink = torch.tensor([0.5, -math.inf, 1.0], dtype=torch.float32)
    qs = [torch.randn(B, H, D, generator=gen).to(torch.bfloat16) for _ in range(2)]
    S = FAR_ROW_STRIDE
    # (name of the far dimension of q, of out) -> lanes of each far row: q at `lane`, out after it
    calls = (("heads", "rows"), ("rows", "heads"))
    got = []
    flat, pool = far_rows_pool(2 * (B * D + H * D), dev, rows=3)
    try:
        lane = 0

        def view(far: str):
            nonlocal lane
            strides = (D, S, 1) if far == "heads" else (S, D, 1)
            v = pool.as_strided((B, H, D), strides, FAR_ROW_BASE + lane)
            lane += 3 * D
            return v

        cache_d = cache.to(dev)
        plan = dec.plan_decode(target, B, H, mi.numel(), 0, cu_count=2)
        for (q_far, out_far), qv in zip(calls, qs):
            q = view(q_far)
            q.copy_(qv.to(dev))
            out = view(out_far)
            out.fill_(math.nan)
            ws = (dec.DecodeWorkspace.allocate(B, plan.num_splits, H, dev, fill=math.nan)
                  if plan.family != "generic" else None)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                dec.sparse_attn_decode(q, cache_d, mi.to(dev), mp.to(dev), attn_sink=sink.to(dev),
                                       softmax_scale=0.09, target=target, cu_count=2, plan=plan, workspace=ws,
                                       out=out)
            got.append(out.cpu().clone())
    finally:
        del flat, pool  # release the ~9 GB pool before the next probe allocates its own
    out_v: list[Violation] = []
    for (q_far, out_far), qv, g in zip(calls, qs, got):
        ref = ref_decode.ref_sparse_attn_decode(qv, cache, mi, mp, attn_sink=sink, softmax_scale=0.09,
                                                main_flavour=target.main_cache_fp8,
                                                extra_flavour=target.extra_cache_fp8, scrub_extra=True)
        out_v += oracle_violations(f"decode with q's {q_far} and out's {out_far} 1.6 G elements apart (index 2 "
                                   "past 2^31) vs oracle", g, ref, plan.num_splits)
    return out_v


# --- the indexer-K gather's probe ----------------------------------------------------------------------------

#: byte written over the indexer pool's start, where a 32-bit block offset would land
GATHER_HEAD_POISON = 0x5A


def far_end_indexer_pool(block_size: int, device):
    """A ``[nb, bs, 132]`` indexer-K view over an uninitialised pool of more than 2^32 bytes (blocks ``bs * 132``
    bytes apart; pages are only committed where touched) whose last block starts just past 2^32, so a block offset
    computed in int32 wraps to a small positive offset inside the same pool. Returns (flat, view, wrapped_offset)."""
    stride = block_size * formats.INDEXER_TOKEN_BYTES
    nb = POOL_BYTES_MIN // stride + 2
    flat = torch.empty(nb * stride, dtype=torch.uint8, device=device)
    view = flat.as_strided((nb, block_size, formats.INDEXER_TOKEN_BYTES), (stride, formats.INDEXER_TOKEN_BYTES, 1))
    far = (nb - 1) * stride
    assert 2 ** 32 <= far < 2 ** 32 + 2 ** 31
    return flat, view, far - 2 ** 32


@int64_probe("cp-gather", ("cp_gather.cp_gather_indexer_k_quant_cache",))
def int64_cp_gather_probe(target: Target) -> list[Violation]:
    """The indexer-K gather addresses its cache in int64 (SPEC 5: block_id cast to int64 before the stride
    multiply): for SHUFFLE blocks of 16 and NORMAL blocks of 1, two sequences whose tables name the last blocks of a
    pool larger than 2^32 bytes gather exactly the bytes packed there, while the pool's start (where a wrapped
    offset lands) holds a poison byte."""
    out: list[Violation] = []
    for seed, bs, layout in ((6, 16, "shuffle"), (7, 1, "normal")):
        out += _cp_gather_far_end(seed, bs, layout, target)
    return out


def _cp_gather_far_end(seed: int, bs: int, layout: str, target: Target) -> list[Violation]:
    gather = bound(target).cp_gather.cp_gather_indexer_k_quant_cache
    dev = kernel_device()
    gen = torch.Generator().manual_seed(seed)
    flat, view, wrapped = far_end_indexer_pool(bs, dev)
    try:
        nb = int(view.shape[0])
        flat[: wrapped + 2 * view.stride(0)] = GATHER_HEAD_POISON
        lens = [bs + bs // 2, bs] if bs > 1 else [2, 1]
        # sequence 0 reads the last block then the one before it; sequence 1 the third from last (all past 2^32)
        rows = [[nb - 1, nb - 2], [nb - 3, nb - 3]]
        slots = [rows[b][o // bs] * bs + o % bs for b, n in enumerate(lens) for o in range(n)]
        T = len(slots)
        codes = torch.randint(0, 256, (T, formats.INDEXER_HEAD_DIM), dtype=torch.uint8, generator=gen)
        scales = torch.randn(T, generator=gen).abs() + 0.5
        formats.pack_indexer_k(view, slots, codes.to(dev), scales.to(dev), layout=layout)
        table = torch.tensor(rows, dtype=torch.int32, device=dev)
        cu = torch.tensor([0, lens[0], lens[0] + lens[1]], dtype=torch.int32, device=dev)
        tts = torch.tensor([0] * lens[0] + [1] * lens[1], dtype=torch.int32, device=dev)
        k_fp8 = torch.full((T, formats.INDEXER_HEAD_DIM), 0xEE, dtype=torch.uint8, device=dev)
        k_scale = torch.full((T, 4), 0xEE, dtype=torch.uint8, device=dev)
        gather(view, k_fp8, k_scale, table, cu, tts, layout=layout, target=target)
        got_f, got_s = k_fp8.cpu(), k_scale.cpu()
    finally:
        del flat, view  # release the > 4 GiB pool before the next probe allocates its own
    want_s = scales.view(torch.uint8).reshape(T, 4)
    out = []
    for t in range(T):
        if not torch.equal(got_f[t], codes[t]) or not torch.equal(got_s[t], want_s[t]):
            poisoned = int((got_f[t] == GATHER_HEAD_POISON).sum())
            out.append(Violation(f"cp-gather ({layout}, block size {bs}): a token at the far end of a >2^32-byte "
                                 "pool gathers wrong bytes", f"token {t} (slot {slots[t]})", "the packed bytes",
                                 f"{int((got_f[t] != codes[t]).sum())} fp8 bytes and "
                                 f"{int((got_s[t] != want_s[t]).sum())} scale bytes differ ({poisoned} poison bytes)"))
    return out


# --- the prefill's and the epilogues' probes: rows of a tensor at the far end of a 16-bit pool ------------------------

#: elements between consecutive rows of a far-rows view: below 2^31, so Triton passes it as an int32 and only the
#: kernel's own widening keeps ``row * stride`` in 64 bits; row 3 lies at 3 * FAR_ROW_STRIDE, past 2^32 elements
FAR_ROW_STRIDE = 3 * 2 ** 29
#: the view's first element in the pool: row 2's offset wrapped to int32 is negative, and lands this far before it
#: (1 G elements), still inside the pool
FAR_ROW_BASE = 2 ** 30 + 2 ** 20
#: 16-bit word written where a row offset computed in 32 bits lands (bf16 0x7E7E, about 8.4e37)
ROW_POISON = 0x7E7E


def far_rows_pool(width: int, device, rows: int = 4, dtype: torch.dtype = torch.bfloat16, poison: int = ROW_POISON):
    """A ``[rows, width]`` bf16 view (3 or 4 rows) over an uninitialised pool of up to about 12 GB (pages are only
    committed where touched), rows FAR_ROW_STRIDE elements apart, so row 2 lies past 2^31 elements and row 3 past
    2^32: a row offset computed in int32 wraps to a place inside the same pool (before the view for row 2, after
    it for row 3), which is poisoned. ``dtype`` torch.int32 (``poison`` an int32 word) gives an int32 view over a
    pool twice as large (a table whose rows lie far apart). Returns (flat, view)."""
    assert rows in (3, 4)
    end = FAR_ROW_BASE + (rows - 1) * FAR_ROW_STRIDE + width
    flat = torch.empty(end + 64, dtype=torch.int16 if dtype == torch.bfloat16 else dtype, device=device)
    for row in range(2, rows):
        wrapped = FAR_ROW_BASE + ((row * FAR_ROW_STRIDE + 2 ** 31) % 2 ** 32 - 2 ** 31)
        assert 0 <= wrapped - 64 and wrapped + width + 64 <= end
        flat[wrapped - 64: wrapped + width + 64] = poison
    view = flat.view(dtype).as_strided((rows, width), (FAR_ROW_STRIDE, 1), FAR_ROW_BASE)
    return flat, view


def _fill_rows(view, rows: torch.Tensor) -> None:
    for r in range(rows.shape[0]):
        view[r].copy_(rows[r].to(view.device))


@int64_probe("prefill", ("prefill.sparse_attn_prefill",))
def int64_prefill_probe(target: Target) -> list[Violation]:
    """The sparse prefill addresses kv in int64 (``slot * stride(0)``): index rows naming every row of a
    ``[4, d]`` kv whose rows are 1.6 G elements apart (row 2 past 2^31 elements, row 3 past 2^32) give the oracle's
    output on a small copy of the same rows, ragged and dense; a 32-bit row offset would read the poisoned words it
    wraps to. Then a dense call whose topk_length entries lie 1.6 G elements apart (``row * stride_len``; a
    strided topk_length is the entry point's to take) over packed kv rows."""
    pre = bound(target).prefill
    dev = kernel_device()
    gen = torch.Generator().manual_seed(11)
    h, d, rope = 2, 128, 64
    rows = (torch.randn(4, d, generator=gen) * 2).to(torch.bfloat16)
    q = torch.randn(2, h, d, generator=gen).to(torch.bfloat16)
    dense = [[3, 1, 2, 0], [1, 3, -1, 0]]
    lens = [4, 2]
    flat, kv = far_rows_pool(d, dev)
    try:
        _fill_rows(kv, rows)
        got = {}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out = torch.full((2, h, d), math.nan, dtype=torch.bfloat16, device=dev)
            pre.sparse_attn_prefill(q.to(dev), kv, torch.tensor([3, 1, 2, 0, 1, 3], dtype=torch.int32, device=dev),
                                    0.1, None, out, indptr=torch.tensor([0, 4, 6], dtype=torch.int32, device=dev),
                                    rope_head_dim=rope, target=target)
            got["ragged"] = out.cpu().clone()
            out = torch.full((2, h, d), math.nan, dtype=torch.bfloat16, device=dev)
            pre.sparse_attn_prefill(q.to(dev), kv, torch.tensor(dense, dtype=torch.int64, device=dev), 0.1, None,
                                    out, topk_length=torch.tensor(lens, dtype=torch.int32, device=dev),
                                    rope_head_dim=rope, target=target)
            got["dense"] = out.cpu().clone()
    finally:
        del flat, kv  # release the ~12 GB pool before the next probe allocates its own
    got["dense, far-strided topk_length"], q3, lens3 = _prefill_far_lengths(pre, target, dev, rows, gen, h, d, rope)
    from contracts.decode import attention_violations
    from impl.runtime import triton_mode
    from oracles import prefill as ref_prefill
    ref = ref_prefill.ref_sparse_attn_prefill(q, rows, softmax_scale=0.1, attn_sink=None, out_width=d,
                                              indices=[3, 1, 2, 0, 1, 3], indptr=[0, 4, 6])
    tol = ref_prefill.prefill_tolerance(ref, "bfloat16", triton_mode(), d, "bfloat16")
    out: list[Violation] = []
    far_lens = got.pop("dense, far-strided topk_length")
    for kind, g in got.items():
        out += attention_violations(f"prefill ({kind} indices) reading kv rows past 2^31 elements vs oracle", g,
                                    ref.out, tol)
    ref3 = ref_prefill.ref_sparse_attn_prefill(q3, rows, softmax_scale=0.1, attn_sink=None, out_width=d,
                                               indices=[s for r, n in zip(FAR_LENGTH_ROWS, lens3) for s in r[:n]],
                                               indptr=[0, *itertools.accumulate(lens3)])
    tol3 = ref_prefill.prefill_tolerance(ref3, "bfloat16", triton_mode(), d, "bfloat16")
    out += attention_violations("prefill (dense indices) with topk_length entries 1.6 G elements apart (entry 2 "
                                "past 2^31) vs oracle", far_lens, ref3.out, tol3)
    return out


#: the dense rows of the far-strided topk_length call; row 2's length is 1, so a wrapped (poisoned) read of it,
#: clamped to the width, reads all four
FAR_LENGTH_ROWS = ([3, 1, 2, 0], [1, 3, -1, 0], [2, 0, 3, 1])
FAR_LENGTHS = (4, 2, 1)


def _prefill_far_lengths(pre, target, dev, rows, gen, h, d, rope):
    """The dense prefill over the packed kv ``rows`` with ``topk_length`` a [3] int32 view whose entries lie
    FAR_ROW_STRIDE elements apart (sparse_attn_prefill takes a strided topk_length): entry 2 lies past 2^31
    elements, and a 32-bit ``row * stride`` wraps onto poisoned words (a huge length, clamped to the width) in
    the same pool of about 17 GB (pages committed only where touched). Returns (out on the CPU, q, lengths)."""
    q3 = torch.randn(3, h, d, generator=gen).to(torch.bfloat16)
    S = FAR_ROW_STRIDE
    wrapped = FAR_ROW_BASE + ((2 * S + 2 ** 31) % 2 ** 32 - 2 ** 31)
    flat = torch.empty(FAR_ROW_BASE + 2 * S + 64, dtype=torch.int32, device=dev)
    try:
        flat[wrapped - 64: wrapped + 64] = 0x7E7E7E7E
        lens = flat.as_strided((3,), (S,), FAR_ROW_BASE)
        lens.copy_(torch.tensor(FAR_LENGTHS, dtype=torch.int32))
        out = torch.full((3, h, d), math.nan, dtype=torch.bfloat16, device=dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            pre.sparse_attn_prefill(q3.to(dev), rows.to(dev), torch.tensor(FAR_LENGTH_ROWS, dtype=torch.int32,
                                                                            device=dev),
                                    0.1, None, out, topk_length=lens, rope_head_dim=rope, target=target)
        got = out.cpu().clone()
    finally:
        del flat  # release the pool before the next probe allocates its own
    return got, q3, FAR_LENGTHS


@int64_probe("epilogues", ("epilogues.inverse_rope_gptj", "epilogues.mxfp8_quantize"))
def int64_epilogue_probe(target: Target) -> list[Violation]:
    """The decode's epilogues address their input rows in int64 (``row * stride(0)``): the inverse RoPE of a
    ``[3, 1, 128]`` x (bf16 out) and the MXFP8 quantization of a ``[3, 64]`` x, both bf16 with rows 1.6 G elements
    apart (row 2 past 2^31 elements, where an int32 product turns negative), agree with the oracle on the same
    rows; a 32-bit row offset would read the poisoned words it wraps to. (Three rows, not four: every program is a
    row, and row 2 is the first a 32-bit offset gets wrong.)"""
    epi = bound(target).epilogues
    dev = kernel_device()
    gen = torch.Generator().manual_seed(12)
    out: list[Violation] = []
    R, W = 3, 128
    rows = (torch.randn(R, W, generator=gen) * 3).to(torch.bfloat16)
    angles = torch.rand(8, 32, generator=gen, dtype=torch.float64) * 6.0
    cos_sin = torch.cat([angles.cos(), angles.sin()], dim=1).to(torch.float32)
    positions = [5, 0, 7]
    flat, x = far_rows_pool(W, dev, rows=R)
    try:
        _fill_rows(x, rows)
        x3 = x.as_strided((R, 1, W), (FAR_ROW_STRIDE, W, 1), FAR_ROW_BASE)
        # bf16 out: the output every subject's inverse RoPE writes (upstream's writes nothing else)
        rope_out = torch.full((R, 1, W), math.nan, dtype=torch.bfloat16, device=dev)
        epi.inverse_rope_gptj(x3, cos_sin.to(dev), torch.tensor(positions, dtype=torch.int64, device=dev),
                              out=rope_out)
        rope_got = rope_out.cpu().to(torch.float64)
        x64 = x.as_strided((R, 64), (FAR_ROW_STRIDE, 1), FAR_ROW_BASE)
        codes = torch.full((R, 64), 0xA5, dtype=torch.uint8, device=dev)
        scales = torch.full((R, 2), 0xA5, dtype=torch.uint8, device=dev)
        epi.mxfp8_quantize(x64, codes=codes, scales=scales)
        got_c, got_s = codes.cpu(), scales.cpu()
    finally:
        del flat, x  # release the ~8.6 GB pool before the next probe allocates its own
    from oracles import epilogues as ref_epi
    want, mag = ref_epi.inverse_rope_gptj(rows.reshape(R, 1, W), cos_sin, positions)
    bound_ = ref_epi.rope_error_bound(want, mag, torch.bfloat16)
    bad = ~((rope_got - want).abs() <= bound_)
    if bool(bad.any()):
        i = tuple(bad.nonzero()[0].tolist())
        out.append(Violation("inverse RoPE of x rows past 2^31 elements outside the oracle's bound",
                             f"row {i[0]} lane {i[2]} ({int(bad.sum())} lanes)", repr(want[i].item()),
                             repr(rope_got[i].item())))
    ref = ref_epi.mxfp8_quantize(rows[:, :64])
    for name, g, w in (("scale codes", got_s, ref["scales"]), ("e4m3 codes", got_c, ref["codes"])):
        if not torch.equal(g, w.to(torch.uint8)):
            i = tuple((g != w.to(torch.uint8)).nonzero()[0].tolist())
            out.append(Violation(f"mxfp8 {name} of x rows past 2^31 elements differ from the oracle",
                                 f"{name}{list(i)} ({int((g != w.to(torch.uint8)).sum())} differ)",
                                 str(int(w[i])), str(int(g[i]))))
    return out


# --- the prefill indexer logits' probe: q rows 1.6 G bytes apart ------------------------------------------------------

def far_byte_rows_pool(width: int, device, poison: int, rows: int = 4):
    """:func:`far_rows_pool` in bytes: a ``[rows, width]`` uint8 view over an uninitialised pool of about 6 GB
    (pages are only committed where touched), rows ``FAR_ROW_STRIDE`` bytes apart (a stride below 2^31, passed as
    an int32), so row 2 lies past 2^31 bytes and row 3 past 2^32; the places a row offset computed in int32 wraps to
    (before the view for row 2, after it for row 3, inside the pool) hold ``poison``. Returns (flat, view)."""
    assert rows in (3, 4)
    end = FAR_ROW_BASE + (rows - 1) * FAR_ROW_STRIDE + width
    flat = torch.empty(end + 64, dtype=torch.uint8, device=device)
    for row in range(2, rows):
        wrapped = FAR_ROW_BASE + ((row * FAR_ROW_STRIDE + 2 ** 31) % 2 ** 32 - 2 ** 31)
        assert 0 <= wrapped - 64 and wrapped + width + 64 <= end
        flat[wrapped - 64: wrapped + width + 64] = poison
    return flat, flat.as_strided((rows, width), (FAR_ROW_STRIDE, 1), FAR_ROW_BASE)


@int64_probe("indexer-logits", ("indexer_logits.fp8_mqa_logits", "indexer_logits.fp8_paged_mqa_logits"))
def int64_indexer_logits_probe(target: Target) -> list[Violation]:
    """The indexer logits address in int64: the prefill's q rows (``t * stride(0)``), key scales
    (``s * k_scale.stride(0)``) and out rows (``t * out.stride(0)``) past 2^31 elements, and the decode's cache
    blocks (``block * stride(0)``) past 2^32 bytes, each scored as the oracle does on the same bytes (a 32-bit offset
    reads the NaN poison it wraps to, or stores a row there)."""
    return (_indexer_logits_far_q(target) + _indexer_logits_far_scales(target)
            + _indexer_logits_far_out(target) + _indexer_logits_far_blocks(target))


def _prefill_logits_draw(gen: torch.Generator, T: int, H: int, S: int, flavour: str):
    """The prefill indexer logits' inputs of the far-address probes: fp8 q codes [T, H, 128] and key codes [S, 128]
    of the flavour, key scales in [0.5, 1.5) and head weights, drawn in this order from ``gen``."""
    from impl.formats import fp8_encode

    q_codes = fp8_encode(torch.randn(T, H, 128, generator=gen), flavour)
    k_codes = fp8_encode(torch.randn(S, 128, generator=gen), flavour)
    k_scale = (torch.rand(S, generator=gen) + 0.5).to(torch.float32)
    weights = (torch.randn(T, H, generator=gen) * 0.5).to(torch.float32)
    return q_codes, k_codes, k_scale, weights


def _indexer_logits_far_q(target: Target) -> list[Violation]:
    """The prefill indexer logits address q in int64 (``t * stride(0)``): a ``[4, H, 128]`` q whose rows are 1.6 G
    bytes apart (a q carved from a wider activation; row 2 past 2^31 bytes, where an int32 product turns negative,
    row 3 past 2^32) scores every key as the oracle does on the same codes; a 32-bit row offset would read the NaN
    codes it wraps to (NaN logits)."""
    from contracts.indexer_logits import judge_logits
    from fuzz.indexer_logits import FP8_TORCH, NAN_CODE
    from oracles import indexer_logits as ref_logits

    fam = bound(target).indexer_logits
    flavour = target.main_cache_fp8
    dev = kernel_device()
    gen = torch.Generator().manual_seed(13)
    T, H, S = 4, 4, 8
    q_codes, k_codes, k_scale, weights = _prefill_logits_draw(gen, T, H, S, flavour)
    starts, ends = [0, 1, 0, 2], [S, S, 5, S]
    flat, rows = far_byte_rows_pool(H * 128, dev, NAN_CODE[flavour], rows=T)
    try:
        for t in range(T):
            rows[t].copy_(q_codes[t].reshape(-1).to(dev))
        q = rows.as_strided((T, H, 128), (FAR_ROW_STRIDE, 128, 1), FAR_ROW_BASE).view(FP8_TORCH[flavour])
        fp8 = FP8_TORCH[flavour]
        got = fam.fp8_mqa_logits(q, k_codes.to(dev).view(fp8), k_scale.to(dev), weights.to(dev),
                                 torch.tensor(starts, dtype=torch.int32, device=dev),
                                 torch.tensor(ends, dtype=torch.int32, device=dev), target=target)
        got = got.detach().cpu().clone()
    finally:
        del flat, rows  # release the ~6 GB pool before the next probe allocates its own
    ref = ref_logits.prefill_logits(q_codes, k_codes, k_scale, weights, starts, ends, flavour)
    return judge_logits(got, ref, H, "prefill logits of q rows past 2^31 bytes")


#: fp32 elements between consecutive key scales of the far-scales view: below 2^31 (an int32 launch argument), so
#: key 2's offset 2 * stride = 2^32 - 2^13 computed in 32 bits wraps to -2^13, which lands FAR_SCALE_BASE - 2^13
#: elements into the pool (poisoned), before the view
FAR_SCALE_STRIDE = 2 ** 31 - 2 ** 12
FAR_SCALE_BASE = 2 ** 13 + 2 ** 10


def _indexer_logits_far_scales(target: Target) -> list[Violation]:
    """The prefill indexer logits address the key scales in int64 (``s * k_scale.stride(0)``, a strided [S] fp32
    k_scale the entry point accepts): three scales 2^31 - 2^12 elements apart (a pool of 16 GiB of uncommitted
    pages), key 2's offset past 2^31 elements; its logits agree with the oracle where a 32-bit offset reads the NaN
    poison before the view (NaN logits)."""
    from contracts.indexer_logits import judge_logits
    from fuzz.indexer_logits import FP8_TORCH
    from oracles import indexer_logits as ref_logits

    fam = bound(target).indexer_logits
    flavour = target.main_cache_fp8
    fp8 = FP8_TORCH[flavour]
    dev = kernel_device()
    gen = torch.Generator().manual_seed(14)
    T, H, S = 2, 4, 3
    q_codes, k_codes, k_scale, weights = _prefill_logits_draw(gen, T, H, S, flavour)
    starts, ends = [0, 1], [S, S]
    flat = torch.empty(FAR_SCALE_BASE + (S - 1) * FAR_SCALE_STRIDE + 64, dtype=torch.float32, device=dev)
    try:
        flat[:FAR_SCALE_BASE] = float("nan")
        scales = flat.as_strided((S,), (FAR_SCALE_STRIDE,), FAR_SCALE_BASE)
        scales.copy_(k_scale.to(dev))
        got = fam.fp8_mqa_logits(q_codes.to(dev).view(fp8), k_codes.to(dev).view(fp8), scales, weights.to(dev),
                                 torch.tensor(starts, dtype=torch.int32, device=dev),
                                 torch.tensor(ends, dtype=torch.int32, device=dev), target=target)
        got = got.detach().cpu().clone()
    finally:
        del flat  # release the 16 GiB pool before the next probe allocates its own
    ref = ref_logits.prefill_logits(q_codes, k_codes, k_scale, weights, starts, ends, flavour)
    return judge_logits(got, ref, H, "prefill logits of key scales past 2^31 elements")


def _indexer_logits_far_out(target: Target) -> list[Violation]:
    """The prefill indexer logits address their output rows in int64 (``t * out.stride(0)``): into a caller's
    ``out [3, S]`` (unit column stride, as the entry point accepts) whose rows are 2^31 - 2^12 fp32 elements apart (a
    pool of 16 GiB of uncommitted pages), row 2's offset past 2^31 elements; every row holds the oracle's logits
    (the rows start as NaN), where a 32-bit row offset would store row 2 before the view (in the NaN poison) and
    leave its row NaN."""
    from contracts.indexer_logits import judge_logits
    from fuzz.indexer_logits import FP8_TORCH
    from oracles import indexer_logits as ref_logits

    fam = bound(target).indexer_logits
    flavour = target.main_cache_fp8
    fp8 = FP8_TORCH[flavour]
    dev = kernel_device()
    gen = torch.Generator().manual_seed(16)
    T, H, S = 3, 4, 4
    q_codes, k_codes, k_scale, weights = _prefill_logits_draw(gen, T, H, S, flavour)
    starts, ends = [0, 1, 0], [S, S, 3]
    flat = torch.empty(FAR_SCALE_BASE + (T - 1) * FAR_SCALE_STRIDE + S + 64, dtype=torch.float32, device=dev)
    try:
        flat[:FAR_SCALE_BASE] = float("nan")
        out = flat.as_strided((T, S), (FAR_SCALE_STRIDE, 1), FAR_SCALE_BASE)
        out.fill_(float("nan"))
        fam.fp8_mqa_logits(q_codes.to(dev).view(fp8), k_codes.to(dev).view(fp8), k_scale.to(dev), weights.to(dev),
                           torch.tensor(starts, dtype=torch.int32, device=dev),
                           torch.tensor(ends, dtype=torch.int32, device=dev), out=out, target=target)
        got = out.detach().cpu().clone()  # what the caller's out holds (the entry point writes every column)
    finally:
        del flat, out  # release the 16 GiB pool before the next probe allocates its own
    ref = ref_logits.prefill_logits(q_codes, k_codes, k_scale, weights, starts, ends, flavour)
    return judge_logits(got, ref, H, "prefill logits into out rows past 2^31 elements")


def _indexer_logits_far_blocks(target: Target) -> list[Violation]:
    """The decode indexer logits address the paged indexer-K cache in int64 (``block * stride(0)``): two requests
    whose tables name the last blocks of a pool larger than 2^32 bytes (block size 1, NORMAL) score every visible
    position as the oracle does on the same bytes, while the pool's start (where a wrapped block offset lands)
    holds NaN codes."""
    from contracts.indexer_logits import judge_logits
    from fuzz.indexer_logits import FP8_TORCH, NAN_CODE
    from impl.formats import fp8_encode
    from oracles import indexer_logits as ref_logits

    fam = bound(target).indexer_logits
    flavour = target.main_cache_fp8
    dev = kernel_device()
    gen = torch.Generator().manual_seed(15)
    bs, H, lens, max_model_len = 1, 4, [5, 3], 8
    n = sum(lens)
    q_codes = fp8_encode(torch.randn(len(lens), 1, H, 128, generator=gen), flavour)
    weights = (torch.randn(len(lens), H, generator=gen) * 0.5).to(torch.float32)
    compact = torch.full((n, bs, formats.INDEXER_TOKEN_BYTES), NAN_CODE[flavour], dtype=torch.uint8)
    formats.pack_indexer_k(compact, list(range(n)), fp8_encode(torch.randn(n, 128, generator=gen), flavour),
                           (torch.rand(n, generator=gen) + 0.5).to(torch.float32), layout="normal")
    # the compact cache's block i lies at the pool's block nb - 1 - i: request 0 reads the last five blocks, request 1
    # the three before them (all past 2^32 bytes); table columns past a request's pages name a block too
    W = max(lens)
    compact_table = [[sum(lens[:b]) + min(c, lens[b] - 1) for c in range(W)] for b in range(len(lens))]
    flat, view, wrapped = far_end_indexer_pool(bs, dev)
    try:
        nb = int(view.shape[0])
        assert (nb - n) * view.stride(0) >= 2 ** 32
        flat[: wrapped + 2 * view.stride(0)] = NAN_CODE[flavour]
        for i in range(n):
            view[nb - 1 - i].copy_(compact[i].to(dev))
        table = torch.tensor([[nb - 1 - c for c in row] for row in compact_table], dtype=torch.int32, device=dev)
        got = fam.fp8_paged_mqa_logits(q_codes.to(dev).view(FP8_TORCH[flavour]), view, weights.to(dev),
                                       torch.tensor(lens, dtype=torch.int32, device=dev), table, max_model_len,
                                       layout="normal", target=target)
        got = got.detach().cpu().clone()
    finally:
        del flat, view  # release the > 4 GiB pool before the next probe allocates its own
    ref = ref_logits.paged_logits(q_codes, compact, weights, [[x] for x in lens], compact_table, max_model_len,
                                  "normal", flavour)
    return judge_logits(got, ref, H, "decode logits of cache blocks past 2^32 bytes")


# --- the indexer-K writers' probes -------------------------------------------------------------------------------

@int64_probe("indexer-k-quant", ("indexer_writer.indexer_k_quant_and_cache",))
def int64_indexer_k_quant_probe(target: Target) -> list[Violation]:
    """The direct indexer-K writer addresses its cache in int64 (``block * stride(0)``): bf16 rows written to the
    last two slots of a NORMAL indexer pool (block size 1, whose default layout is NORMAL) larger than 2^32 bytes
    hold exactly the bytes the same call writes into a small pool (whose bytes ``indexer-writer-exact`` judges);
    a skipped token (slot -1) writes nothing, and the pool's start, where a 32-bit block offset wraps to, keeps its
    poison."""
    write = bound(target).indexer_writer.indexer_k_quant_and_cache
    dev = kernel_device()
    gen = torch.Generator().manual_seed(15)
    k = (torch.randn(3, 128, generator=gen) * 3).to(torch.bfloat16).to(dev)
    small = torch.full((2, 1, formats.INDEXER_TOKEN_BYTES), 0xEE, dtype=torch.uint8, device=dev)
    write(k, small, torch.tensor([1, -1, 0], dtype=torch.int64, device=dev), target=target)
    want = small.cpu()
    flat, view, wrapped = far_end_indexer_pool(1, dev)
    try:
        nb = int(view.shape[0])
        head = wrapped + 2 * view.stride(0)
        flat[:head] = GATHER_HEAD_POISON
        # the far slots start as the small pool did: an allocator may hand back the pool an earlier call filled,
        # where a write that went elsewhere would find the right bytes already there (seen on an H100)
        view[nb - 2:] = 0xEE
        write(k, view, torch.tensor([nb - 1, -1, nb - 2], dtype=torch.int64, device=dev), target=target)
        got = view[nb - 2:].cpu().clone()
        touched = int((flat[:head] != GATHER_HEAD_POISON).sum())
    finally:
        del flat, view  # release the > 4 GiB pool before the next probe allocates its own
    out = []
    for i in range(2):
        if not torch.equal(got[i], want[i]):
            out.append(Violation("indexer-K writer: a token at the far end of a >2^32-byte pool differs from the "
                                 "same row written into a small pool", f"token {2 - 2 * i} (last slot - {1 - i})",
                                 "the small pool's bytes", f"{int((got[i] != want[i]).sum())} bytes differ"))
    if touched:
        out.append(Violation("indexer-K writer: bytes at the pool's start changed (an int32 block offset wrapped)",
                             f"first {head} bytes", "untouched", f"{touched} bytes changed"))
    return out


@int64_probe("indexer-compress", ("indexer_writer.compress_norm_rope_store_indexer",))
def int64_indexer_compress_probe(target: Target) -> list[Violation]:
    """The head-128 compressor addresses its state block table in int64 (``req * stride(0)``: the table's rows
    need only be contiguous, so a caller may hand rows of a wider table): three requests whose int32 table rows lie
    FAR_ROW_STRIDE elements apart (row 2 past 2^31 elements, where a 32-bit product wraps onto a poisoned row that
    names another state block), their token_to_req int32, write exactly the bytes the same call writes with the
    table packed (whose bytes ``indexer-writer-exact`` judges)."""
    from fuzz import indexer_writer as fiw

    comp = bound(target).indexer_writer.compress_norm_rope_store_indexer
    dev = kernel_device()
    case = fiw.IndexerCompressorCase(seed=16, positions=(7, 11, 7), reqs=(0, 1, 2), slots=(2, 0, 1), block_size=1,
                                     num_blocks=3, num_reqs=3, state_block_size=4)
    inp = fiw.build_compressor_inputs(case, dev)
    table = inp["state_block_table"].cpu()
    assert table.dtype == torch.int32 and inp["token_to_req"].dtype == torch.int32
    # a wrapped read of row 2 finds a block id that row 2 does not name
    other = min(set(range(int(inp["state"].shape[0]))) - set(table[2].tolist()))

    def run(tab):
        pool, cache = fiw.build_pool(case, fiw.TOKEN_BYTES["fp8"], dev)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            comp(inp["state"], tab, inp["token_to_req"], inp["positions"], inp["slot_mapping"], inp["norm_weight"],
                 inp["cos_sin_cache"], cache, ratio=case.ratio, eps=case.eps, target=target)
        return pool.cpu()

    want = run(inp["state_block_table"])
    flat, far = far_rows_pool(int(table.shape[1]), dev, rows=3, dtype=torch.int32, poison=other)
    try:
        far.copy_(table.to(dev))
        got = run(far)
    finally:
        del flat, far  # release the ~17 GB pool before the next probe allocates its own
    if torch.equal(got, want):
        return []
    diff = (got != want).nonzero().flatten()
    return [Violation("indexer compressor: a state block table whose rows lie 1.6 G elements apart (row 2 past "
                      "2^31) writes other bytes than the packed table", f"pool byte {int(diff[0])}",
                      "the packed table's bytes", f"{diff.numel()} bytes differ")]


@dataclass(frozen=True)
class Int64Case(Case):
    """The probes to run, by their names in :data:`INT64_PROBES` (the generator names every registered one)."""

    KIND: ClassVar[str] = "int64-addressing"

    probes: tuple[str, ...]

    def __post_init__(self):
        super().__post_init__()
        unknown = sorted(set(self.probes) - set(INT64_PROBES))
        if unknown:  # a reproducer naming a probe this code lacks cannot be replayed: a usage error
            raise ValueError(f"probes: unknown {unknown}; known: {sorted(INT64_PROBES)}")


def int64_cases(target: Target):
    """Every probe the subject has in one case first (what a single drawn case runs), then each alone: the ci array
    forces one probe a row onto distinct draws, so the space holds more cases than probes."""
    names = subject_probes(target)
    return st.builds(Int64Case, probes=st.sampled_from([names] + [(n,) for n in names]))


@contract("int64-addressing", targets=ALL_TARGETS,
          cases=lambda target: int64_cases(target),
          min_cases=1, max_cases=1, case_type=Int64Case, numeric=True)
def int64_addressing(case: Int64Case, target: Target) -> list[Violation]:
    """Every registered probe addresses the cache in int64 (SPEC 1.2, ``block * stride(0)``): the writers (SWA
    insert, compressor) store a token at the far end of a pool larger than 2^32 bytes, whose block offset wraps to
    a small positive int32, and it reads back exactly with the pool's first blocks untouched; the decode
    reads far-end tokens and agrees with the oracle; the indexer-K gather copies far-end tokens exactly; the prefill
    and the epilogues read rows past 2^31 elements, the prefill indexer logits q rows past 2^31 bytes and key scales
    past 2^31 elements, the decode indexer logits cache blocks past 2^32 bytes, and agree with the oracle; the
    indexer-K writers write the far end of a pool, or read state block table rows past 2^31 elements, exactly as
    they write a small pool or read a packed table. A case runs the probes whose entry points the subject has; under ``--profile ci`` each probe is a case of its own (the
    declared dimension ``probe``)."""
    out = []
    with one_big_pool_at_a_time():
        for name in case.probes:
            out += INT64_PROBES[name](target)
    return out


_pool_lock_depth = threading.local()


@contextlib.contextmanager
def one_big_pool_at_a_time():
    """On an accelerator, hold a lock file per device while the probes' pools (up to about 16 GiB each) exist, so
    the processes of one run (audit rows on --jobs workers, pytest-xdist workers) take turns instead of running the
    device out of memory side by side. Every registered probe takes it, so a test calling a probe directly waits its
    turn too (14 xdist workers on an 80 GiB H100 ran out of memory before it did). Reentrant within a thread: the
    contract holds it around its probes, each of which takes it again. On the host (the interpreter's pools are
    uncommitted pages) no lock."""
    dev = kernel_device()
    depth = getattr(_pool_lock_depth, "n", 0)
    if dev == "cpu" or depth:
        _pool_lock_depth.n = depth + 1
        try:
            yield
        finally:
            _pool_lock_depth.n = depth
        return
    import fcntl

    index = torch.cuda.current_device() if dev == "cuda" else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", os.environ.get("HIP_VISIBLE_DEVICES", "all")).replace(",", "-")
    path = os.path.join(tempfile.gettempdir(), f"smv-int64-pools-{visible}-{index}.lock")
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        _pool_lock_depth.n = 1
        try:
            yield
        finally:
            _pool_lock_depth.n = 0
            torch.cuda.empty_cache()  # hand the pool's memory back before the next process takes the lock
            fcntl.flock(fh, fcntl.LOCK_UN)


# --- declared dimension (fuzz.dimensions): each probe reached -------------------------------------------------------

def _probe_allowed(c: dict, target: Target) -> bool:
    name = c.get("probe")
    return name is None or all(subject_has(target, *e.split(".")) for e in PROBE_ENTRIES[name])


def _declare_probes():
    from fuzz.dimensions import Dimension, Family, declare

    names = tuple(INT64_PROBES)  # registration order: the writers', the decode's, the gather's, the prefill's, ...
    # a drawn case runs every probe at once (dev and nightly: one case); the ci array runs one probe a row, so each
    # row names the probe it reached and a failure names its probe. The probes share no code path, hence no pairs:
    # each value is required once, at any strength
    return declare(Family(
        "int64-probes",
        (Dimension("probe", names, "the component addressed past 2^31 elements: " + ", ".join(names)),),
        (),
        lambda case, target: {"probe": case.probes[0]} if case.probes else {},
        lambda case, combo, target: Int64Case(probes=(combo["probe"],)) if "probe" in combo else case,
        _probe_allowed,
        lambda target: [Int64Case(probes=names)]), "int64-addressing")


INT64_DIMENSIONS = _declare_probes()
