"""Cases and strategies for the split-selector contract (``impl.splits``): batch sizes, head counts, index sizes
and CU counts, the selectors' only inputs."""
from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from fuzz.cases import Case


@dataclass(frozen=True)
class SplitCase(Case):
    """One selector call: ``batch`` rows of ``heads`` heads, ``avg_main`` / ``avg_extra`` index entries per row
    (the main indices ``ragged_slack`` wider than that when any are present) on ``cu_count`` compute units."""

    KIND = "split-bounds"
    batch: int
    heads: int
    avg_main: int
    avg_extra: int
    ragged_slack: int
    cu_count: int

    def __post_init__(self):
        super().__post_init__()
        for name, low in (("batch", 1), ("heads", 1), ("avg_main", 0), ("avg_extra", 0), ("ragged_slack", 0),
                          ("cu_count", 1)):
            if getattr(self, name) < low:
                raise ValueError(f"{name}: expected an int >= {low}, got {getattr(self, name)!r}")

    @property
    def main_numel(self) -> int:
        return self.batch * self.avg_main + (self.ragged_slack if self.avg_main else 0)

    @property
    def extra_numel(self) -> int:
        return self.batch * self.avg_extra


def split_cases(target_cu_count: int):
    """Small, medium and huge batches, odd head counts, empty and long indices, the target's own CU count and any
    other (the selectors must hold for a device of any size)."""
    return st.builds(
        SplitCase,
        batch=st.one_of(st.integers(1, 4), st.integers(1, 80), st.integers(1, 2048)),
        heads=st.sampled_from([1, 3, 16, 17, 32, 64, 128]),
        avg_main=st.one_of(st.just(0), st.sampled_from([64, 128, 256]), st.integers(0, 512)),
        avg_extra=st.one_of(st.just(0), st.sampled_from([32, 512, 2048, 8192]), st.integers(0, 20000)),
        ragged_slack=st.integers(0, 63),
        cu_count=st.one_of(st.sampled_from([target_cu_count, 256, 304, 80, 38]), st.integers(1, 512)),
    )
