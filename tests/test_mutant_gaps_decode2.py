"""The split-K partial kernels store their workspace row ``b * stride_ab + split * stride_as`` in int64 (issue 30
item 5: surviving mutants of ``smv mutate`` that narrow one of the two products to int32).

No contract can reach these products cheaply: ``sparse_attn_decode`` and ``decode_reduce`` take only a contiguous
``part_acc [b, S, h, 512]``, so ``b * stride_ab`` passes 2^31 only once b * S * h * 512 does (65,536 rows at 64
heads and S = 1, the production edge FINDINGS.md's UQ2 describes: an 8 GiB workspace written by 65,536 partial and
4M reduce programs, far past the interpreter's budget), and ``split * stride_as`` only at h >= 135,300 heads with
gfx950's 32 splits. So this test pins the widening at the kernel itself: it launches each partial kernel over three
rows (or three splits) whose workspace entries lie 2^30 elements apart in one uncommitted fp32 pool of 2^32
elements, where the entry of index 2 starts at 2^31 elements and a 32-bit product wraps to 2^31 elements before
it, onto NaN-poisoned words. Empty segments make every stored partial 0: the real kernels write every entry and
leave the poison alone; a copy of impl/decode.py with one product narrowed (the mutants' change) is caught.
"""
from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest
import torch

from impl import decode

H, D = 3, 512
FAR = 2 ** 30
BASE = 2 ** 31  # a wrapped (negative) product lands this far before the base: the pool's first words
POISON_WORDS = 4 * H * D


def _far_partials(mod, family: str, axis: str) -> tuple[list[tuple[int, int]], int]:
    """Run ``mod``'s ``family`` partial kernel with the workspace entries 2^30 elements apart along ``axis`` ("b":
    rows, "s": splits). Returns the (b, s) entries left unwritten and how many poisoned words before the base
    changed."""
    B, S = (3, 1) if axis == "b" else (1, 3)
    sab, sas = (FAR, H * D) if axis == "b" else (3 * FAR, FAR)
    pool = torch.empty(BASE + 2 * FAR + 4 * H * D, dtype=torch.float32)  # uncommitted but where touched
    try:
        pool[:POISON_WORDS].fill_(math.nan)
        entries = [(b, s, BASE + b * sab + s * sas) for b in range(B) for s in range(S)]
        for _, _, off in entries:
            pool[off:off + H * D].fill_(math.nan)
        g = torch.Generator().manual_seed(3)
        q = torch.randn(B, H, D, generator=g).to(torch.bfloat16)
        cache = torch.zeros(1, 2, 584, dtype=torch.uint8)
        idx = torch.zeros(1, dtype=torch.int32)
        indptr = torch.zeros(B + 1, dtype=torch.int32)  # empty segments: every partial is m = -FLT_MAX, l = 0, acc 0
        pm, pl = torch.empty(B, S, H), torch.empty(B, S, H)
        seg = (cache, idx, indptr, 2, cache.stride(0), 2)
        args = (q, *q.stride(), *seg, *seg, pm, pl, pool[BASE:], pm.stride(0), pm.stride(1), sab, sas, D, H, S)
        if family == "gfx942":
            mod._sparse_decode_gfx942_partial_kernel[(B, S, 1)](
                *args, 0.1, HAS_EXTRA=False, IS_FNUZ_MAIN=True, IS_FNUZ_EXTRA=True, SCRUB_EXTRA=True, BLOCK_H_=16,
                BLOCK_K=32)
        else:
            mod._sparse_decode_gfx950_partial_kernel[(B, S, 1)](
                *args, S, 0.1, HAS_EXTRA=False, IS_FNUZ_MAIN=False, IS_FNUZ_EXTRA=False, SCRUB_EXTRA=True,
                ADAPTIVE=False, BLOCK_H_=16, MAIN_TILE=32, EXTRA_TILE=64, TAIL_TILE=16, ITER_K=32)
        unwritten = [(b, s) for b, s, off in entries if not bool((pool[off:off + H * D] == 0).all())]
        return unwritten, int((~torch.isnan(pool[:POISON_WORDS])).sum())
    finally:
        del pool


def _planted(tmp_path: Path, monkeypatch, before: str, after: str):
    """impl/decode.py with ``before`` replaced by ``after`` once, imported from a file (Triton reads kernel source)."""
    src = Path(decode.__file__).read_text()
    assert src.count(before) == 1
    path = tmp_path / "decode_planted.py"
    path.write_text(src.replace(before, after))
    spec = importlib.util.spec_from_file_location("decode_planted", path)
    mod = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "decode_planted", mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(decode.kernel_device() != "cpu", reason="the pool is a host allocation (interpreter)")
@pytest.mark.parametrize("family, axis, before, after", [
    ("gfx942", "b", "arow = (part_acc + b.to(tl.int64) * stride_ab + split.to(tl.int64) * stride_as\n"
                    "            + heads[:, None].to(tl.int64) * stride_ah)\n    tl.store(arow + d512",
     "arow = (part_acc + b * stride_ab + split.to(tl.int64) * stride_as\n"
     "            + heads[:, None].to(tl.int64) * stride_ah)\n    tl.store(arow + d512"),
    ("gfx950", "s", "split.to(tl.int64) * stride_as\n            + heads[:, None].to(tl.int64) * stride_ah)\n"
                    "    d128",
     "split.to(tl.int32) * stride_as\n            + heads[:, None].to(tl.int64) * stride_ah)\n    d128"),
], ids=["gfx942-rows", "gfx950-splits"])
def test_partial_workspace_offsets_are_int64(tmp_path, monkeypatch, family, axis, before, after):
    assert _far_partials(decode, family, axis) == ([], 0)
    unwritten, touched = _far_partials(_planted(tmp_path, monkeypatch, before, after), family, axis)
    assert unwritten == [(2, 0) if axis == "b" else (0, 2)] and touched == H * D
