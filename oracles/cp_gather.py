"""Reference indexer-K gather, byte by byte, written from SPEC 5 and 1.3.

Token t: b = token_to_seq[t]; it is gathered only when 0 <= b < B and cu_seqlen[b] <= t < cu_seqlen[b+1]
(otherwise its output rows keep their bytes). At offset o = t - cu_seqlen[b] its block is block_table[b][o // bs]
when o // bs < W; a missing or out-of-range block (outside [0, nb)) gives four zero scale bytes and leaves the fp8
row as it was; otherwise the 128 fp8 bytes and the 4 scale bytes of slot block*bs + o % bs are copied, located by
``oracles.formats.indexer_k_token_spans`` (absolute offsets from the cache view's first byte, block stride
``stride(0)``). Plain Python integers and lists throughout; nothing of ``impl``.
"""
from __future__ import annotations

import torch

from oracles.formats import indexer_k_token_spans, storage_bytes

HEAD_BYTES = 128
SCALE_BYTES = 4


def _ints(x) -> list:
    return x.detach().cpu().tolist() if isinstance(x, torch.Tensor) else [list(r) if isinstance(r, (list, tuple))
                                                                          else r for r in x]


def ref_cp_gather(k_cache: torch.Tensor, k_fp8_before: torch.Tensor, k_scale_before: torch.Tensor, block_table,
                  cu_seqlen, token_to_seq, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(k_fp8 [T, 128] uint8, k_scale [T, 4] uint8) after the gather, starting from the ``*_before`` contents.
    ``layout`` is "normal" or "shuffle" (already resolved)."""
    nb, bs = int(k_cache.shape[0]), int(k_cache.shape[1])
    stride = int(k_cache.stride(0))
    flat, base = storage_bytes(k_cache)
    raw = bytes(flat.cpu().numpy().tobytes())
    table, cu, tts = _ints(block_table), _ints(cu_seqlen), _ints(token_to_seq)
    num_batches = len(cu) - 1
    data = [list(r) for r in k_fp8_before.cpu().tolist()]
    scale = [list(r) for r in k_scale_before.cpu().tolist()]
    for t in range(len(tts)):
        b = tts[t]
        if not 0 <= b < num_batches:
            continue
        if not cu[b] <= t < cu[b + 1]:
            continue
        o = t - cu[b]
        col = o // bs
        row = table[b] if b < len(table) else []
        blk = row[col] if col < len(row) else None
        if blk is None or not 0 <= blk < nb:
            scale[t] = [0] * SCALE_BYTES
            continue
        offs, soff = indexer_k_token_spans(blk * bs + o % bs, bs, stride, layout)
        data[t] = [raw[base + x] for x in offs]
        scale[t] = [raw[base + soff + i] for i in range(SCALE_BYTES)]
    out_data = torch.tensor(data, dtype=torch.uint8).reshape(len(tts), HEAD_BYTES)
    out_scale = torch.tensor(scale, dtype=torch.uint8).reshape(len(tts), SCALE_BYTES)
    return out_data, out_scale


def gathered_tokens(block_table, cu_seqlen, token_to_seq, num_blocks: int, block_size: int) -> dict:
    """t -> "copied" | "zero-scale" | "untouched": what the gather does to each token's rows (for messages)."""
    table, cu, tts = _ints(block_table), _ints(cu_seqlen), _ints(token_to_seq)
    out = {}
    for t, b in enumerate(tts):
        if not (0 <= b < len(cu) - 1 and cu[b] <= t < cu[b + 1]):
            out[t] = "untouched"
            continue
        o = t - cu[b]
        row = table[b] if b < len(table) else []
        blk = row[o // block_size] if o // block_size < len(row) else None
        out[t] = "copied" if blk is not None and 0 <= blk < num_blocks else "zero-scale"
    return out
