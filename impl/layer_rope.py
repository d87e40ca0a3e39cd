"""Where the DSv4 attention layer undoes the RoPE of its output rows: the layer-level decision, as data.

A step's attention output is ``[decode tokens | prefill tokens]`` (decode rows first, as the layer lays them out).
Before the output projection (wo_a) every row must have its GPT-J rotation undone on the last 64 lanes
(``impl.epilogues.inverse_rope_gptj``). Who does it depends on the wo_a weight:

- **bf16 wo_a** (``fuse_inv_rope``): the attention does it, and every row must be rotated **exactly once**;
- **fp8 wo_a**: the projection's own quantization step rotates, so nothing here may touch a row (a rotation here
  would be the second one).

With ``fuse_inv_rope`` three places can rotate a row, and the plan says which rows each takes:

- ``aiter-decode-store``: AITER's sparse-MLA decode, handed the decode rows' positions, rotates them in its store;
- ``decode-reduce``: the Triton decode's split-K reduce epilogue (SPEC 2, "Reduce ... Optional epilogues"): only
  the split-K families (gfx942, gfx950) have a reduce; the generic single-kernel decode has no epilogue and
  rotates nothing, so its rows owe the standalone pass;
- ``aiter-prefill-store``: AITER's sparse-MLA prefill, handed the prefill rows' positions, rotates them in its store
  (the Triton and OPUS prefills have no epilogue);
- ``standalone``: the inverse RoPE pass over every row no store rotated.

This is what upstream's layer (``DeepseekV4ROCMAiterMLAAttention.forward_mqa``, vLLM 0.34.0, SPEC 10) decides with
``fuse_inv_rope``, ``prefill_rotated`` and the ``[rotated, end)`` range it hands ``rocm_inverse_rope_rows_``; here
the decision is one pure function of the target and the step's flags, so it can be checked for every split.
"""
from __future__ import annotations

from dataclasses import dataclass

from impl.targets import Target, get_target

#: the places that may rotate an output row, in the order the layer runs them
STAGES = ("aiter-prefill-store", "aiter-decode-store", "decode-reduce", "standalone")
#: decode kernel families whose split-K reduce carries the inverse-RoPE epilogue (SPEC 2); the generic fallback is
#: a single kernel with no reduce
REDUCE_EPILOGUE_FAMILIES = ("gfx942", "gfx950")


@dataclass(frozen=True)
class RowRotation:
    """One stage's rotation: output rows ``[start, end)`` with the layer's positions ``[positions_start,
    positions_end)`` (a correct stage uses each row's own position: the two ranges are equal)."""

    stage: str
    start: int
    end: int
    positions_start: int
    positions_end: int

    @property
    def rows(self) -> range:
        return range(self.start, self.end)


@dataclass(frozen=True)
class InverseRopePlan:
    """Which rows each stage rotates for one step of one layer on ``target``."""

    target: str
    num_decode_tokens: int
    num_prefill_tokens: int
    fuse_inv_rope: bool
    rotations: tuple[RowRotation, ...]

    @property
    def num_rows(self) -> int:
        return self.num_decode_tokens + self.num_prefill_tokens

    def counts(self) -> tuple[int, ...]:
        """How many times each output row is rotated (a rotation past the last row is not counted here)."""
        out = [0] * self.num_rows
        for r in self.rotations:
            for i in r.rows:
                if 0 <= i < self.num_rows:
                    out[i] += 1
        return tuple(out)


def _require_count(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name}: expected an int, got {type(v).__name__}")
    if v < 0:
        raise ValueError(f"{name}: expected a token count >= 0, got {v}")
    return v


def _require_bool(name: str, v) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{name}: expected a bool, got {type(v).__name__}")
    return v


def decode_reduce_rotates(target: "Target | str | None") -> bool:
    """Whether the Triton decode on ``target`` can undo the RoPE in its own epilogue (a split-K family's reduce)."""
    return get_target(target).decode_family in REDUCE_EPILOGUE_FAMILIES


def inverse_rope_plan(target: "Target | str | None", *, num_decode_tokens: int, num_prefill_tokens: int,
                      fuse_inv_rope: bool, aiter_decode: bool, aiter_prefill: bool) -> InverseRopePlan:
    """The rows each stage rotates for a step of ``num_decode_tokens`` decode rows followed by
    ``num_prefill_tokens`` prefill rows (see the module docstring).

    ``fuse_inv_rope``: the layer's wo_a is bf16 (the attention owes the rotation); ``aiter_decode`` /
    ``aiter_prefill``: the decode / prefill runs AITER's sparse MLA (whose store rotates the rows it is handed
    positions for) rather than the Triton one. Raises TypeError for an argument of the wrong type and ValueError
    for a negative token count."""
    t = get_target(target)
    d = _require_count("num_decode_tokens", num_decode_tokens)
    p = _require_count("num_prefill_tokens", num_prefill_tokens)
    for name, v in (("fuse_inv_rope", fuse_inv_rope), ("aiter_decode", aiter_decode),
                    ("aiter_prefill", aiter_prefill)):
        _require_bool(name, v)
    rotations: list[RowRotation] = []
    if fuse_inv_rope:
        owed: list[tuple[int, int]] = []  # row ranges no store rotated
        if p:
            if aiter_prefill:
                rotations.append(RowRotation("aiter-prefill-store", d, d + p, d, d + p))
            else:
                owed.append((d, d + p))
        if d:
            if aiter_decode:
                rotations.append(RowRotation("aiter-decode-store", 0, d, 0, d))
            elif decode_reduce_rotates(t):
                rotations.append(RowRotation("decode-reduce", 0, d, 0, d))
            else:
                owed.insert(0, (0, d))
        # at most the decode rows [0, d) and the prefill rows [d, d + p): adjacent, so one standalone pass over
        # their union
        if owed:
            start, end = owed[0][0], owed[-1][1]
            rotations.append(RowRotation("standalone", start, end, start, end))
    return InverseRopePlan(target=t.name, num_decode_tokens=d, num_prefill_tokens=p, fuse_inv_rope=fuse_inv_rope,
                           rotations=tuple(rotations))
