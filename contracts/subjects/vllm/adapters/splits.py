"""Split selectors: upstream's ``_decode_num_splits`` (gfx942) and ``_decode_gfx950_num_splits``, called with
the inputs upstream's decode wrapper computes from our sizes."""
from __future__ import annotations

import inspect

from contracts.subjects import Family


def build(ctx) -> Family:
    ops = ctx["ops"]

    def select_num_splits(selector, batch, heads, main_numel, extra_numel, cu_count):
        fn = {"gfx942": ops._decode_num_splits, "gfx950": ops._decode_gfx950_num_splits}[selector]
        return ctx.call(fn, *_args(fn, batch, heads, main_numel, extra_numel, cu_count))

    return Family("splits", select_num_splits=select_num_splits)


def _args(fn, batch, heads, main_numel, extra_numel, cu_count):
    return [batch, heads, main_numel, extra_numel, cu_count][: len(inspect.signature(fn).parameters)]
