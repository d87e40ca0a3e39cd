"""The trust gate's truth table, written out row by row from SPEC 4 / seed 004 (no formula shared with impl).

The decode may skip the NaN scrub of the compressed ("extra") cache only for: gfx950 (the only target whose
compressor sanitizes), cache dtype exactly "fp8_ds_mla", no KV-transfer connector, an extra cache present.
"""
from __future__ import annotations

import itertools

TARGET_NAMES = ("gfx942", "gfx950", "generic")
#: dtypes the table covers: the accepted one, the other ROCm cache dtypes, and near misses that must not match
CACHE_DTYPES = ("fp8_ds_mla", "auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "FP8_DS_MLA", "fp8_ds_mla ", "")

#: (target, cache_dtype, has_kv_transfer, has_extra_cache) -> True; every other row is False
TRUSTED_ROWS = frozenset({("gfx950", "fp8_ds_mla", False, True)})


def trust_expected(target: str, cache_dtype: str, has_kv_transfer: bool, has_extra_cache: bool) -> bool:
    return (target, cache_dtype, has_kv_transfer, has_extra_cache) in TRUSTED_ROWS


def truth_table(target: str) -> list[tuple[tuple[str, str, bool, bool], bool]]:
    """Every row of the table for one target, in a fixed order."""
    rows = []
    for dtype, kv, extra in itertools.product(CACHE_DTYPES, (False, True), (False, True)):
        key = (target, dtype, kv, extra)
        rows.append((key, key in TRUSTED_ROWS))
    return rows
