"""Cases and strategies for the dispatch contract (``impl.dispatch``): every flag combination the decode's
dispatcher takes, contradictory ones included. Each case is the whole grid (the contract is exhaustive)."""
from __future__ import annotations

import dataclasses
import itertools
import typing
from dataclasses import dataclass
from typing import Literal

from hypothesis import strategies as st

from fuzz.cases import Case

COMPRESS_RATIOS = (0, 1, 4, 128)
KvCacheDtype = Literal["fp8_ds_mla", "auto", "bfloat16", "fp8"]
KV_CACHE_DTYPES: tuple[str, ...] = typing.get_args(KvCacheDtype)


@dataclass(frozen=True)
class DispatchFlags(Case):
    """One call's inputs: ``decode_dispatch(target, **flags.kwargs())``."""

    KIND = "dispatch-flags"
    compress_ratio: int
    swa_only: bool
    for_cudagraph_capture: bool
    has_extra_cache: bool
    kv_cache_dtype: KvCacheDtype
    has_kv_transfer: bool

    def kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclass(frozen=True)
class DispatchCase(Case):
    """A batch of flag combinations, each checked against the truth table on the target."""

    KIND = "target-dispatch"
    flags: tuple[DispatchFlags, ...]

    def __post_init__(self):
        super().__post_init__()
        if not self.flags:
            raise ValueError("flags: expected at least one flag combination")


def dispatch_flag_grid() -> list[DispatchFlags]:
    """Every combination of the dispatch inputs (ratio x swa_only x capture x extra cache x dtype x KV transfer),
    contradictory ones included (the dispatcher must reject those)."""
    out = []
    for ratio, swa, cap, extra, dt, xfer in itertools.product(COMPRESS_RATIOS, (False, True), (False, True),
                                                               (False, True), KV_CACHE_DTYPES, (False, True)):
        out.append(DispatchFlags(compress_ratio=ratio, swa_only=swa, for_cudagraph_capture=cap,
                                 has_extra_cache=extra, kv_cache_dtype=dt, has_kv_transfer=xfer))
    return out


def dispatch_cases():
    """The whole flag grid in every case, in a drawn order: the domain is 256 combinations of six flags and each
    check is a pure function call, so every case checks all of it (``target-dispatch`` is exhaustive; there are no
    pairs to declare). The order is drawn only so that no case depends on the position of a combination."""
    grid = dispatch_flag_grid()
    return st.permutations(grid).map(lambda flags: DispatchCase(flags=tuple(flags)))
