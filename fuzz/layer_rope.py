"""Cases and strategies for the layer's inverse-RoPE placement (``impl.layer_rope``): every split of a step into
decode and prefill rows (each 0..4, mixed batches included), the wo_a kind (bf16: the attention rotates; fp8: it must
not), and AITER's sparse MLA on or off for the decode and for the prefill independently. The target is the row's."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from hypothesis import strategies as st

from fuzz.cases import Case

#: token counts drawn per part of the step: 0 (the part is absent), 1, and a few (a part of several rows is where
#: an off-by-one in a row range shows)
TOKEN_COUNTS = (0, 1, 2, 3, 4)
#: the largest count a case accepts (a reproducer may be edited past the generator's range)
MAX_TOKENS = 64


@dataclass(frozen=True)
class LayerRopeCase(Case):
    """One step of one layer: ``num_decode_tokens`` decode rows then ``num_prefill_tokens`` prefill rows;
    ``fuse_inv_rope`` is a bf16 wo_a (False: fp8 wo_a); ``aiter_decode`` / ``aiter_prefill`` pick AITER's sparse
    MLA over the Triton kernels for each part."""

    KIND = "inverse-rope-exactly-once"
    num_decode_tokens: int
    num_prefill_tokens: int
    fuse_inv_rope: bool
    aiter_decode: bool
    aiter_prefill: bool

    def __post_init__(self):
        super().__post_init__()
        for name in ("num_decode_tokens", "num_prefill_tokens"):
            v = getattr(self, name)
            if not 0 <= v <= MAX_TOKENS:
                raise ValueError(f"{name}: expected a token count in [0, {MAX_TOKENS}], got {v}")

    def kwargs(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def label(self) -> str:
        return (f"{self.num_decode_tokens} decode + {self.num_prefill_tokens} prefill rows, "
                f"{'bf16' if self.fuse_inv_rope else 'fp8'} wo_a (fuse_inv_rope={self.fuse_inv_rope}), "
                f"AITER decode {'on' if self.aiter_decode else 'off'}, AITER prefill "
                f"{'on' if self.aiter_prefill else 'off'}")


def layer_rope_cases():
    """Any split of 0..4 decode and 0..4 prefill rows, either wo_a, AITER on or off per part."""
    counts = st.sampled_from(TOKEN_COUNTS)
    return st.builds(LayerRopeCase, num_decode_tokens=counts, num_prefill_tokens=counts,
                     fuse_inv_rope=st.booleans(), aiter_decode=st.booleans(), aiter_prefill=st.booleans())


def layer_rope_grid() -> list[LayerRopeCase]:
    """Every case the generator can draw (5 x 5 x 2 x 2 x 2 = 200): the tests check ours on all of them."""
    import itertools

    return [LayerRopeCase(num_decode_tokens=d, num_prefill_tokens=p, fuse_inv_rope=f, aiter_decode=a,
                          aiter_prefill=b)
            for d, p, f, a, b in itertools.product(TOKEN_COUNTS, TOKEN_COUNTS, (False, True), (False, True),
                                                   (False, True))]


# --- declared dimensions ----------------------------------------------------------------------------------------
# Every input of the decision is a dimension with all of its values (the domain is small): the decode and prefill
# row counts (0 = that part absent; a mixed batch is both > 0), the wo_a kind, and AITER per part. They all meet in
# the row ranges, so every pair of them is required: 5 x 5 = 25 pairs of counts set the array's 25 rows, and the
# flags' pairs fit inside them.

def classify_layer_rope(case: LayerRopeCase, target=None) -> dict:
    return {"decode_tokens": case.num_decode_tokens, "prefill_tokens": case.num_prefill_tokens,
            "fuse_inv_rope": case.fuse_inv_rope, "aiter_decode": case.aiter_decode,
            "aiter_prefill": case.aiter_prefill}


def force_layer_rope(case: LayerRopeCase, combo: dict, target=None) -> LayerRopeCase:
    f = classify_layer_rope(case)
    f.update(combo)
    return case.replace(num_decode_tokens=f["decode_tokens"], num_prefill_tokens=f["prefill_tokens"],
                        fuse_inv_rope=f["fuse_inv_rope"], aiter_decode=f["aiter_decode"],
                        aiter_prefill=f["aiter_prefill"])


def layer_rope_examples(target=None) -> list[LayerRopeCase]:
    return [LayerRopeCase(num_decode_tokens=0, num_prefill_tokens=0, fuse_inv_rope=False, aiter_decode=False,
                          aiter_prefill=False),
            LayerRopeCase(num_decode_tokens=2, num_prefill_tokens=3, fuse_inv_rope=True, aiter_decode=True,
                          aiter_prefill=True)]


def _declare_layer_rope():
    from fuzz.dimensions import Dimension, Family, declare

    dims = ("decode_tokens", "prefill_tokens", "fuse_inv_rope", "aiter_decode", "aiter_prefill")
    return declare(Family(
        "layer-rope",
        (Dimension("decode_tokens", TOKEN_COUNTS, "decode rows of the step (0: a prefill-only step)"),
         Dimension("prefill_tokens", TOKEN_COUNTS, "prefill rows after them (0: a decode-only step)"),
         Dimension("fuse_inv_rope", (False, True), "bf16 wo_a (the attention rotates) or fp8 wo_a (it must not)"),
         Dimension("aiter_decode", (False, True), "the decode runs AITER's sparse MLA (its store can rotate)"),
         Dimension("aiter_prefill", (False, True), "the prefill runs AITER's sparse MLA (its store can rotate)")),
        tuple((a, b) for i, a in enumerate(dims) for b in dims[i + 1:]),
        classify_layer_rope, force_layer_rope, None, layer_rope_examples), "inverse-rope-exactly-once")


LAYER_ROPE_DIMENSIONS = _declare_layer_rope()
