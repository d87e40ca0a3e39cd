"""Cases and input builders for the DSv4 decode step end to end (contract ``dsv4-step-agreement``).

A case is a toy DSv4 attention: one SWA-only, one C4A and one C128A layer (``layers``), ``batch`` requests whose
prefixes of ``contexts[r]`` tokens are already cached, and ``steps`` decode steps (request r's token of step s sits
at position contexts[r] + s). Every cache starts fully poisoned (finite fp8 codes under scale code 255, i.e. +-inf
lanes that no scrub removes, and NaN RoPE): only the prefix rows a step may read are then written with ordinary
values (the SWA rows of the last ``window - 1`` prefix positions, the compressed rows completed by the prefix), so
a stray read anywhere shows up as a non-finite output. Block tables map each request's columns to a random
permutation of the blocks, one spare column per request points at a poisoned block, and spare blocks stay
unreferenced. The compressor states hold NaN except the window rows the step's writing tokens pool. A C4A layer
also has its indexer: an indexer-K cache (NORMAL, sharing the layer's block table; poisoned with NaN codes and NaN
scales, its prefix rows ordinary), the head-128 compressor's state and norm weight, and per step fp8 query codes and
head weights.

Shapes stay tiny (the kernels run under the Triton interpreter here): 1-2 requests, 1-2 heads, windows of 3-6,
block sizes like 1, 2, 3, 5 (SWA), 4, 12, 16, 64 tokens (C4A: 1, 3, 4, 16 rows per block) and 128, 256 tokens
(C128A: 1, 2 rows), contexts that reach, or cross during the steps, a C128A row boundary (127, 255) as well as
short ones with no compressed row at all. ``build_step_inputs`` makes every tensor from the case's seed.

The batch of a step may also hold (each a declared dimension): ``pad_tokens`` padding tokens after the requests
(position -1, request row 0: a decode batch padded to a captured size); an ``invalid`` request after the others
whose positions its SWA block table does not map (the table's columns from its prefix's last block on are -1, so
its step tokens have slot -1: they write nothing and read nothing); ``freed`` SWA blocks, every SWA block table
column wholly below the first step's window pointing at one shared poisoned "null" block (blocks that fell out of
the window: vLLM's sliding-window manager frees them and puts its null block in their place, so a reader that
reaches an out-of-window position reads poison, and a writer that lands there is seen); the ``mxfp8`` output
epilogue
(the inverse RoPE's rows MXFP8-quantized); and ``graph``: every layer's decode captured at step 0 (metadata from
the builder's ``build_for_cudagraph_capture``) and replayed at every later step. Its inputs may be laid out
otherwise than packed (``input_layout``, :data:`STEP_LAYOUTS`): lane-padded query and insert rows, stride-2
positions, every cache a view past its pool's first block.
"""
from __future__ import annotations

import math
import typing
from dataclasses import dataclass, field
from typing import Literal

import torch
from hypothesis import strategies as st

from fuzz.cases import Case
from fuzz.decode import POISON_NOPE, POISON_ROPE_BITS, POISON_SCALE, SINK_KINDS, SinkKind, make_sink
from impl import formats
from impl.runtime import kernel_device
from impl.targets import Target

LayerName = Literal["swaonly", "c4a", "c128a"]
LAYER_NAMES: tuple[str, ...] = typing.get_args(LayerName)
RATIOS = {"swaonly": 1, "c4a": 4, "c128a": 128}
#: state rows per compressor state block (SPEC 1.3: 4 for C4, 8 for C128)
STATE_BLOCK_SIZES = {4: 4, 128: 8}
#: the compressor's rms_norm_eps in the toy
NORM_EPS = 1e-6
SWA_BLOCK_SIZES = (1, 2, 3, 5)
C4A_BLOCK_SIZES = (4, 12, 16, 64)
C128A_BLOCK_SIZES = (128, 256)
#: blocks past the referenced ones in every cache, poisoned and unreferenced
SPARE_BLOCKS = 2
#: GPT-J RoPE base of the toy's cos/sin table
ROPE_BASE = 10000.0
#: the prefix of the ``invalid`` request (its step positions are unmapped)
INVALID_CONTEXT = 5
EPILOGUES = ("bf16", "mxfp8")
#: the memory of a step's inputs, the values the same: packed (each cache view at a random block offset into its
#: pool, as always); or "strided": every layer's query rows ``[T, H, 512]`` and SWA insert rows ``[T, 512]`` the first
#: 512 lanes of 576-lane rows (the rest NaN), the step's positions a stride-2 view (gaps hold 0), and every cache
#: (SWA, compressed, indexer-K) a view that starts past its pool's first block
STEP_LAYOUTS = ("contiguous", "strided")
#: lanes of a strided layout's padded query and insert rows
STRIDED_ROW = 576


@dataclass(frozen=True)
class Dsv4StepCase(Case):
    """A toy DSv4 attention run for ``steps`` decode steps (module docstring). ``heads`` query heads,
    SWA ``window``, block sizes in tokens (``c4a_block_size`` / ``c128a_block_size`` are the attention block sizes,
    multiples of the ratio), C4A ``topk`` over an indexer of ``indexer_heads`` heads, decode plans for ``cu_count``
    CUs, softmax ``scale``, a sink of kind ``sink``, block strides padded (``padded``) or dense."""

    KIND = "dsv4-step"
    ADDED_FIELDS = ('pad_tokens', 'invalid', 'freed', 'epilogue', 'graph', 'input_layout')
    seed: int
    contexts: tuple[int, ...]
    steps: int
    heads: int
    window: int
    swa_block_size: int
    c4a_block_size: int
    c128a_block_size: int
    topk: int
    cu_count: int
    scale: float
    sink: SinkKind
    padded: bool
    indexer_heads: int = 2
    layers: tuple[LayerName, ...] = ("swaonly", "c4a", "c128a")
    pad_tokens: int = 0
    invalid: bool = False
    freed: bool = False
    epilogue: str = "bf16"
    graph: bool = False
    #: the memory of the step's inputs (:data:`STEP_LAYOUTS`)
    input_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if not self.contexts or any(c < 1 for c in self.contexts):
            raise ValueError(f"contexts: expected one prefix length >= 1 per request, got {list(self.contexts)}")
        for name in ("steps", "heads", "window", "swa_block_size", "topk", "cu_count", "indexer_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {getattr(self, name)!r}")
        if self.seed < 0:
            raise ValueError(f"seed: expected an int >= 0, got {self.seed!r}")
        if self.c4a_block_size < 4 or self.c4a_block_size % 4:
            raise ValueError(f"c4a_block_size: expected a positive multiple of 4, got {self.c4a_block_size}")
        if self.c128a_block_size < 128 or self.c128a_block_size % 128:
            raise ValueError(f"c128a_block_size: expected a positive multiple of 128, got {self.c128a_block_size}")
        if not (self.scale > 0 and math.isfinite(self.scale)):
            raise ValueError(f"scale: expected a finite scale > 0, got {self.scale!r}")
        if not self.layers:
            raise ValueError("layers: expected at least one layer")
        if self.pad_tokens < 0:
            raise ValueError(f"pad_tokens: expected an int >= 0, got {self.pad_tokens!r}")
        if self.epilogue not in EPILOGUES:
            raise ValueError(f"epilogue: expected one of {EPILOGUES}, got {self.epilogue!r}")
        if self.input_layout not in STEP_LAYOUTS:
            raise ValueError(f"input_layout: expected one of {STEP_LAYOUTS}, got {self.input_layout!r}")

    @property
    def requests(self) -> tuple[int, ...]:
        """Every request's prefix: the valid ones (``contexts``), then the invalid one."""
        return self.contexts + ((INVALID_CONTEXT,) if self.invalid else ())

    @property
    def batch(self) -> int:
        """Requests (the block tables' rows), the invalid one included."""
        return len(self.requests)

    @property
    def num_tokens(self) -> int:
        """Tokens of a step: one per request, then the padding tokens."""
        return self.batch + self.pad_tokens

    def positions(self, step: int) -> list[int]:
        return [c + step for c in self.requests] + [-1] * self.pad_tokens

    def token_requests(self) -> list[int]:
        """The request row of every token of a step (padding tokens: row 0)."""
        return list(range(self.batch)) + [0] * self.pad_tokens

    @property
    def max_position(self) -> int:
        return max(self.requests) + self.steps - 1

    @property
    def max_model_len(self) -> int:
        """A model length past every position (the cos/sin table's and the logits' width)."""
        return -(-(self.max_position + 1) // 64) * 64


def _near_boundary(steps: int):
    """A prefix whose steps complete a C128A row (127 - s, 255 - s), or one just completed (128, 256)."""
    return st.sampled_from([127 - s for s in range(steps)] + [255 - s for s in range(steps)] + [128, 256])


def _contexts(steps: int):
    """Prefix lengths: near a C128A row boundary, short prefixes with no compressed row (and windows not yet
    full), and anything up to 300."""
    return st.one_of(_near_boundary(steps), st.integers(1, 9), st.integers(10, 300))


@st.composite
def step_cases(draw):
    """A Hypothesis strategy of :class:`Dsv4StepCase`. The simplest draw (what the ``ci`` profile tries first)
    is already a rich case: one request completing C4A and C128A rows during the steps, one with a short prefix (no
    compressed row, a window not yet full), odd SWA and C128A block sizes, a C4A block of 16 rows (where a
    reader's default indexer-K layout would be SHUFFLE)."""
    steps = draw(st.sampled_from([2, 3]))
    batch = draw(st.sampled_from([2, 1]))
    first = draw(st.one_of(_near_boundary(steps), _contexts(steps)))
    rest = draw(st.lists(st.one_of(st.integers(1, 9), _contexts(steps)), min_size=batch - 1, max_size=batch - 1))
    contexts = (first, *rest)
    return Dsv4StepCase(
        seed=draw(st.integers(0, 2 ** 31 - 1)),
        contexts=contexts,
        steps=steps,
        heads=draw(st.sampled_from([1, 2])),
        window=draw(st.integers(3, 6)),
        swa_block_size=draw(st.sampled_from((3,) + SWA_BLOCK_SIZES)),
        c4a_block_size=draw(st.sampled_from((64,) + C4A_BLOCK_SIZES)),
        c128a_block_size=draw(st.sampled_from((256, 128))),
        topk=draw(st.integers(3, 6)),
        cu_count=draw(st.integers(1, 2)),
        scale=draw(st.sampled_from([0.11, 0.0625])),
        sink=draw(st.sampled_from(("mixed",) + SINK_KINDS)),
        padded=draw(st.booleans()),
        indexer_heads=draw(st.sampled_from([2, 1, 3])),
        pad_tokens=draw(st.sampled_from([1, 0, 2])),
        invalid=draw(st.booleans()),
        freed=draw(st.booleans()),
        epilogue=draw(st.sampled_from(EPILOGUES[::-1])),
        graph=draw(st.booleans()),
        input_layout=draw(st.sampled_from(STEP_LAYOUTS)),
    )


# ---------------------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class PagedCache:
    """A poisoned ``fp8_ds_mla`` cache view of ``num_blocks`` blocks and a block table [batch, cols] int32 into it
    (each request's columns a random permutation of the blocks; one spare column per request at a poisoned
    block). ``block_size`` is in rows of this cache."""

    pool: torch.Tensor
    view: torch.Tensor
    table: torch.Tensor
    block_size: int
    spare_slot: int  # a poisoned slot no table column of a needed position reaches

    def slot(self, req: int, index: int) -> int:
        bs = self.block_size
        return int(self.table[req, index // bs]) * bs + index % bs


@dataclass
class LayerInputs:
    name: str
    ratio: int
    swa: PagedCache
    extra: PagedCache | None
    block_size: int | None          # attention block size in tokens (compressed layers)
    state: torch.Tensor | None      # fp32 [num_state_blocks, sbs, width]
    state_table: torch.Tensor | None
    norm_weight: torch.Tensor | None
    q: torch.Tensor                 # bf16 [steps, T, H, 512]
    k: torch.Tensor                 # bf16 [steps, T, 512] (the SWA insert's rows)
    sink: torch.Tensor | None       # fp32 [>= H]
    indexer: "IndexerInputs | None" = None


@dataclass
class IndexerInputs:
    """A C4A layer's indexer: its K cache ``view [nb, cbs, 132]`` (NORMAL; the layer's block table), the head-128
    compressor's state and norm weight, per step fp8 query codes ``q [steps, T, 1, Hi, 128]`` uint8 (the target's
    platform flavour) and head weights ``weights [steps, T, Hi]`` fp32."""

    pool: torch.Tensor
    view: torch.Tensor
    state: torch.Tensor
    state_table: torch.Tensor
    norm_weight: torch.Tensor
    q: torch.Tensor
    weights: torch.Tensor


@dataclass
class StepInputs:
    layers: list[LayerInputs]
    cos_sin: torch.Tensor           # fp32 [max_model_len, 64]: cos in 0..31, sin in 32..63
    token_to_req: torch.Tensor      # int32 [T]
    max_model_len: int
    keep: list = field(default_factory=list)


def poison_all(view: torch.Tensor) -> None:
    """Every slot of ``view``: NoPE codes POISON_NOPE under scale code 255 (+-inf lanes), NaN RoPE, pad 0xFF."""
    n = int(view.shape[0]) * int(view.shape[1])
    formats.pack_fp8_ds_mla(view, list(range(n)),
                            torch.full((n, formats.DSV4_NOPE_DIM), POISON_NOPE, dtype=torch.uint8),
                            torch.full((n, formats.DSV4_NUM_GROUPS), POISON_SCALE, dtype=torch.uint8),
                            torch.full((n, formats.DSV4_ROPE_DIM), POISON_ROPE_BITS, dtype=torch.int16)
                            .view(torch.bfloat16), pad=0xFF)


def write_ordinary_rows(view: torch.Tensor, slots: list[int], flavour: str, gen: torch.Generator) -> None:
    """Rows of ordinary values at ``slots``: N(0, 4) quantized in ``flavour`` under scale codes 123..127, bf16
    N(0, 1) RoPE."""
    if not slots:
        return
    n = len(slots)
    nope = formats.fp8_encode(torch.randn(n, formats.DSV4_NOPE_DIM, generator=gen) * 4.0, flavour)
    scale = torch.randint(123, 128, (n, formats.DSV4_NUM_GROUPS), generator=gen).to(torch.uint8)
    rope = torch.randn(n, formats.DSV4_ROPE_DIM, generator=gen).to(torch.bfloat16)
    formats.pack_fp8_ds_mla(view, slots, nope, scale, rope)


def _paged_cache(gen, batch: int, needed: int, block_size: int, padded: bool, device,
                 pool_slice: bool = False) -> PagedCache:
    """A cache holding ``needed`` rows per request (at least one column each), plus a spare column per request
    and SPARE_BLOCKS unreferenced blocks; all poisoned. The view starts 0 or 1 blocks into its pool (1 with
    ``pool_slice``)."""
    cols = max(1, -(-needed // block_size))
    nb = batch * (cols + 1) + SPARE_BLOCKS
    before = max(int(torch.randint(0, 2, (1,), generator=gen)), int(pool_slice))
    pool, view = formats.allocate_fp8_ds_mla_pool(nb, block_size, padded=padded, extra_blocks_before=before,
                                                  fill=0xFF)
    poison_all(view)
    perm = torch.randperm(nb, generator=gen)
    table = perm[: batch * (cols + 1)].reshape(batch, cols + 1).to(torch.int32)
    spare_slot = int(perm[-1]) * block_size
    if device != "cpu":
        pool_d = pool.to(device)
        view = pool_d.as_strided(view.shape, view.stride(), view.storage_offset())
        pool = pool_d
    return PagedCache(pool, view, table.to(device), block_size, spare_slot)


def _cos_sin(max_len: int) -> torch.Tensor:
    i = torch.arange(32, dtype=torch.float64)
    theta = ROPE_BASE ** (-2.0 * i / 64)
    ang = torch.arange(max_len, dtype=torch.float64)[:, None] * theta[None, :]
    return torch.cat([torch.cos(ang), torch.sin(ang)], dim=1).to(torch.float32)


def _state(gen, case: Dsv4StepCase, ratio: int, device, head: int = formats.DSV4_HEAD_DIM):
    """NaN-filled compressor state [blocks, sbs, width] (rows [kv | score] of coff * ``head`` each) with a
    per-request table covering every position; the window rows of the step tokens that complete a compressed row
    hold N(0, 1) kv and scores."""
    sbs = STATE_BLOCK_SIZES[ratio]
    coff = 2 if ratio == 4 else 1
    width = 2 * coff * head
    R = (1 + (ratio == 4)) * ratio
    cols = case.max_position // sbs + 1
    nblk = case.batch * cols
    state = torch.full((nblk, sbs, width), math.nan, dtype=torch.float32)
    table = torch.randperm(nblk, generator=gen).reshape(case.batch, cols).to(torch.int32)
    for r, ctx in enumerate(case.contexts):
        for s in range(case.steps):
            pos = ctx + s
            if (pos + 1) % ratio:
                continue
            for p in range(max(pos - R + 1, 0), pos + 1):
                state[int(table[r, p // sbs]), p % sbs] = torch.randn(width, generator=gen)
    return state.to(device), table.to(device)


INDEXER_TOKEN_BYTES = formats.INDEXER_TOKEN_BYTES
INDEXER_NAN_CODE = {"ocp": 0x7F, "fnuz": 0x80}


def _indexer(gen, case: Dsv4StepCase, target: Target, extra: PagedCache, device) -> IndexerInputs:
    """The indexer of a C4A layer whose compressed cache is ``extra`` (same block table and rows per block)."""
    flavour = target.main_cache_fp8
    nb, bs = int(extra.view.shape[0]), extra.block_size
    stride = bs * INDEXER_TOKEN_BYTES + (16 if case.padded else 0)
    before = max(int(torch.randint(0, 2, (1,), generator=gen)), int(case.input_layout == "strided"))
    pool = torch.empty((nb + before) * stride, dtype=torch.uint8)
    blocks = pool.as_strided((nb + before, stride), (stride, 1))
    blocks[:, : bs * 128] = INDEXER_NAN_CODE[flavour]
    blocks[:, bs * 128: bs * INDEXER_TOKEN_BYTES] = torch.full((bs,), math.nan, dtype=torch.float32).view(torch.uint8)
    blocks[:, bs * INDEXER_TOKEN_BYTES:] = 0xEE
    view = pool.as_strided((nb, bs, INDEXER_TOKEN_BYTES), (stride, INDEXER_TOKEN_BYTES, 1), before * stride)
    slots = [extra.slot(r, i) for r, ctx in enumerate(case.contexts) for i in range(ctx // 4)]
    if slots:
        n = len(slots)
        codes = formats.fp8_encode(torch.randn(n, 128, generator=gen) * 8.0, flavour)
        scales = torch.exp2(-torch.randint(2, 9, (n,), generator=gen).to(torch.float32))
        formats.pack_indexer_k(view, slots, codes, scales, layout="normal")
    state, table = _state(gen, case, 4, device, head=formats.INDEXER_HEAD_DIM)
    weight = (1.0 + 0.1 * torch.randn(formats.INDEXER_HEAD_DIM, generator=gen)).to(torch.float32)
    Hi, T = case.indexer_heads, case.num_tokens
    q = formats.fp8_encode(torch.randn(case.steps, T, 1, Hi, 128, generator=gen) * 4.0, flavour)
    weights = torch.randn(case.steps, T, Hi, generator=gen).to(torch.float32)
    if device != "cpu":
        pool_d = pool.to(device)
        view = pool_d.as_strided(view.shape, view.stride(), view.storage_offset())
        pool = pool_d
    return IndexerInputs(pool, view, state, table, weight.to(device), q.to(device), weights.to(device))


def build_step_inputs(case: Dsv4StepCase, target: Target, device: str | None = None) -> StepInputs:
    """Every tensor of a step case, made from ``case.seed`` on the kernel device (module docstring)."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    B, H = case.batch, case.heads
    max_len = case.max_model_len
    layers = []
    strided = case.input_layout == "strided"
    for name in case.layers:
        ratio = RATIOS[name]
        swa = _paged_cache(gen, B, case.max_position + 1, case.swa_block_size, case.padded, device, strided)
        # the SWA rows a step may read that the prefix wrote: positions ctx - window + 1 .. ctx - 1
        slots = [swa.slot(r, p) for r, ctx in enumerate(case.contexts)
                 for p in range(max(ctx - case.window + 1, 0), ctx)]
        write_ordinary_rows(swa.view, slots, target.main_cache_fp8, gen)
        _unmap_swa_columns(swa, case)
        extra = state = state_table = weight = indexer = None
        block_size = None
        if ratio > 1:
            block_size = case.c4a_block_size if ratio == 4 else case.c128a_block_size
            rows = (case.max_position + 1) // ratio
            extra = _paged_cache(gen, B, rows, block_size // ratio, case.padded, device, strided)
            slots = [extra.slot(r, i) for r, ctx in enumerate(case.contexts) for i in range(ctx // ratio)]
            write_ordinary_rows(extra.view, slots, target.extra_cache_fp8, gen)
            state, state_table = _state(gen, case, ratio, device)
            weight = (1.0 + 0.1 * torch.randn(formats.DSV4_HEAD_DIM, generator=gen)).to(torch.float32).to(device)
            if ratio == 4:
                indexer = _indexer(gen, case, target, extra, device)
        T = case.num_tokens
        q = torch.randn(case.steps, T, H, formats.DSV4_HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
        k = torch.randn(case.steps, T, formats.DSV4_HEAD_DIM, generator=gen).to(torch.bfloat16).to(device)
        if strided:
            q, k = _padded_rows(q), _padded_rows(k)
        sink = make_sink(case.sink, H + int(torch.randint(0, 3, (1,), generator=gen)), gen)
        sink = sink.to(device) if sink is not None else None
        layers.append(LayerInputs(name, ratio, swa, extra, block_size, state, state_table, weight, q, k, sink,
                                  indexer))
    token_to_req = torch.tensor(case.token_requests(), dtype=torch.int32, device=device)
    return StepInputs(layers, _cos_sin(max_len).to(device), token_to_req, max_len)


def _padded_rows(x: torch.Tensor) -> torch.Tensor:
    """``x [..., 512]`` as the first 512 lanes of NaN-filled :data:`STRIDED_ROW`-lane rows (the same values)."""
    buf = torch.full(tuple(x.shape[:-1]) + (STRIDED_ROW,), math.nan, dtype=x.dtype, device=x.device)
    view = buf[..., :x.shape[-1]]
    view.copy_(x)
    return view


def step_positions(case: Dsv4StepCase, step: int, device) -> torch.Tensor:
    """The positions of ``step`` (int64 [T]) in the case's layout: packed, or a stride-2 view (gaps hold 0)."""
    pos = torch.tensor(case.positions(step), dtype=torch.int64)
    if case.input_layout == "strided":
        buf = torch.zeros(2 * pos.numel() + 1, dtype=torch.int64)
        buf[1::2] = pos
        return buf.to(device)[1::2]
    return pos.to(device)


def _unmap_swa_columns(swa: PagedCache, case: Dsv4StepCase) -> None:
    """The invalid request's SWA table columns from its prefix's last block on are -1 (its step positions
    unmapped); with ``freed`` every valid request's columns wholly below its first step's window point at the null
    block (an unreferenced poisoned block, the spare slot's)."""
    bs = swa.block_size
    table = swa.table
    if case.invalid:
        table[case.batch - 1, INVALID_CONTEXT // bs:] = -1
    if case.freed:
        for r, ctx in enumerate(case.contexts):
            first_in_window = max(ctx - case.window + 1, 0)
            table[r, : first_in_window // bs] = swa.spare_slot // bs


# ---------------------------------------------------------------------------------------------------------------
# declared dimensions (fuzz.dimensions)
# ---------------------------------------------------------------------------------------------------------------

#: what the first request's steps do at the C128A row boundary: a step completes a row (the compressor writes it
#: and the same step's attention reads it), or rows exist and none completes. (The second request of a forced case
#: has a prefix below 11: no C128A row at all, the third shape, is in every forced case.)
C128A_SHAPES = ("completes", "has-rows")
#: the last request's SWA window during the steps: not yet full (prefix < window), full
WINDOW_SHAPES = ("filling", "full")
#: the step sinks (the decode contract covers every sink kind; here: a per-head mix of -inf, ordinary and large,
#: and none)
STEP_SINKS = ("mixed", "none")
#: two values a dimension at most: each case costs the interpreter seconds, so the array is two rows


def _c128a_shape(ctx: int, steps: int) -> str:
    if any((ctx + s + 1) % 128 == 0 for s in range(steps)):
        return "completes"
    return "has-rows" if ctx >= 128 else "none"  # "none": a prefix no forced first request has


def _rows_class(rows: int) -> str:
    return "1" if rows == 1 else ("odd" if rows % 2 else "even")


def classify_step(case: Dsv4StepCase, target=None) -> dict:
    out = {
        "c128a": _c128a_shape(case.contexts[0], case.steps),
        "window": "filling" if case.contexts[-1] < case.window else "full",
        "swa_bs": _rows_class(case.swa_block_size),
        "c4a_rows": _rows_class(case.c4a_block_size // 4),
        "c128a_rows": str(case.c128a_block_size // 128),
        "padded": case.padded,
    }
    if case.sink in STEP_SINKS:
        out["sink"] = case.sink
    out["pad_tokens"] = case.pad_tokens > 0
    out["invalid"] = case.invalid
    # freed: only where some column really lies wholly below a window
    out["freed"] = case.freed and any(max(c - case.window + 1, 0) // case.swa_block_size > 0
                                      for c in case.contexts)
    out["epilogue"] = case.epilogue
    out["graph"] = case.graph
    out["input_layout"] = case.input_layout
    return out


def force_step(case: Dsv4StepCase, combo: dict, target=None) -> Dsv4StepCase:
    """``case`` rewritten to hit ``combo``: two requests and two steps (the generator's first draw: the array's
    rows cost no more than it), the first request's prefix at its C128A shape, the second one's against the window;
    block sizes, sink and padding; heads, window, top-k and seed as drawn."""
    case = case.replace(steps=2) if case.steps != 2 else case
    ctx = list(case.contexts)
    if len(ctx) < 2 or ctx[1] >= 11:
        ctx[1:] = [1 + case.seed % 9]
    ctx = ctx[:2]
    s = case.seed
    if "c128a" in combo and _c128a_shape(ctx[0], case.steps) != combo["c128a"]:
        ctx[0] = {"completes": 127 - s % case.steps, "has-rows": 128 + s % 2 * 128}[combo["c128a"]]
    if "window" in combo:
        w = case.window
        if combo["window"] == "filling":
            ctx[1] = 1 + s % (w - 1)
        elif not w <= ctx[1] < 11:
            ctx[1] = w + s % (11 - w)
    f = {"contexts": tuple(ctx)}
    if "swa_bs" in combo:
        f["swa_block_size"] = {"1": 1, "odd": (3, 5)[s % 2]}[combo["swa_bs"]]
    if "c4a_rows" in combo:
        f["c4a_block_size"] = {"odd": 12, "even": (16, 64)[s % 2]}[combo["c4a_rows"]]
    if "c128a_rows" in combo:
        f["c128a_block_size"] = 128 * int(combo["c128a_rows"])
    for k in ("sink", "padded", "invalid", "freed", "epilogue", "graph", "input_layout"):
        if k in combo:
            f[k] = combo[k]
    if "pad_tokens" in combo:
        f["pad_tokens"] = (case.pad_tokens or 1) if combo["pad_tokens"] else 0
    return case.replace(**f)


def step_family_examples(target=None) -> list[Dsv4StepCase]:
    base = Dsv4StepCase(seed=1, contexts=(5, 2), steps=2, heads=1, window=4, swa_block_size=2, c4a_block_size=4,
                        c128a_block_size=128, topk=3, cu_count=1, scale=0.11, sink="none", padded=False)
    return [base, base.replace(seed=2, contexts=(130,), steps=3, window=6, sink="large")]


def _declare_step():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "dsv4-step",
        (Dimension("c128a", C128A_SHAPES, "step-sequence shape of the first request at the C128A row boundary"),
         Dimension("window", WINDOW_SHAPES, "the last request's SWA window not yet full, or full"),
         Dimension("swa_bs", ("1", "odd"), "SWA block size class (tokens)"),
         Dimension("c4a_rows", ("odd", "even"), "C4A compressed rows per block (block_size // 4): 3 or 4, 16 (a "
                                                "reader's default indexer-K layout is SHUFFLE past 1)"),
         Dimension("c128a_rows", ("1", "2"), "C128A compressed rows per block"),
         Dimension("sink", STEP_SINKS, "the layers' sink kind"),
         Dimension("padded", (False, True), "cache block strides padded past the block"),
         Dimension("pad_tokens", (False, True), "padding tokens (position -1) after the requests"),
         Dimension("invalid", (False, True), "a request whose step positions its SWA table does not map (slot -1)"),
         Dimension("freed", (False, True), "SWA table columns wholly below the window at the null block (freed)"),
         Dimension("epilogue", EPILOGUES, "the output epilogue: inverse RoPE (bf16), then MXFP8 quantization"),
         Dimension("graph", (False, True), "every layer's decode eager, or captured at step 0 (the builder's "
                                           "build_for_cudagraph_capture) and replayed at later steps"),
         Dimension("input_layout", STEP_LAYOUTS, "query and insert rows packed or lane-padded, positions packed or "
                                                 "stride-2, caches at a random or a past-the-first block offset")),
        # the one interaction: a captured graph copies q into its own buffer, an eager decode reads the view
        (("input_layout", "graph"),), classify_step, force_step, None, step_family_examples), "dsv4-step-agreement")


STEP_DIMENSIONS = _declare_step()


# ---------------------------------------------------------------------------------------------------------------
# the metadata builder's capture flag (contract ``dsv4-builder-capture-flag``)
# ---------------------------------------------------------------------------------------------------------------

BUILDER_RATIOS = (1, 4, 128, 0)


@dataclass(frozen=True)
class BuilderCase(Case):
    """One build of a layer's step metadata: the layer's ``compress_ratio``, ``capture`` (built with
    ``build_for_cudagraph_capture``, else ``build``), two requests at positions drawn from ``seed`` and
    ``pad_tokens`` padding tokens (position -1); positions and token_to_req laid out as ``vector_layout`` says,
    both block tables as ``table_layout`` says."""

    KIND = "dsv4-builder"
    ADDED_FIELDS = ("vector_layout", "table_layout")
    seed: int
    compress_ratio: int
    capture: bool
    pad_tokens: int = 0
    #: the memory of positions and token_to_req (:data:`BUILDER_VECTOR_LAYOUTS`) and of both block tables
    #: (:data:`BUILDER_TABLE_LAYOUTS`); the values the same in every layout
    vector_layout: str = "contiguous"
    table_layout: str = "contiguous"

    def __post_init__(self):
        super().__post_init__()
        if self.compress_ratio not in BUILDER_RATIOS:
            raise ValueError(f"compress_ratio: expected one of {BUILDER_RATIOS}, got {self.compress_ratio!r}")
        if self.seed < 0 or self.pad_tokens < 0:
            raise ValueError(f"seed, pad_tokens: expected ints >= 0, got {self.seed!r}, {self.pad_tokens!r}")
        if self.vector_layout not in BUILDER_VECTOR_LAYOUTS:
            raise ValueError(f"vector_layout: expected one of {BUILDER_VECTOR_LAYOUTS}, got {self.vector_layout!r}")
        if self.table_layout not in BUILDER_TABLE_LAYOUTS:
            raise ValueError(f"table_layout: expected one of {BUILDER_TABLE_LAYOUTS}, got {self.table_layout!r}")


#: positions and token_to_req packed, or stride-2 views starting one element into a buffer (the gaps hold other
#: valid values: position 7, request row 1)
BUILDER_VECTOR_LAYOUTS = ("contiguous", "strided")
#: the SWA and compressed block tables packed, a [R, W] slice of a wider, row-offset table whose other entries are
#: valid block ids, or column-major (the transpose of a packed [W, R])
BUILDER_TABLE_LAYOUTS = ("contiguous", "slice", "column-major")
#: the argument names of each layout dimension (a refusal must name one of them)
BUILDER_LAYOUT_ARGS = {"vector_layout": ("positions", "token_to_req"),
                       "table_layout": ("swa_block_table", "block_table")}


def builder_cases():
    return st.builds(BuilderCase, seed=st.integers(0, 2 ** 31 - 1), compress_ratio=st.sampled_from(BUILDER_RATIOS),
                     capture=st.booleans(), pad_tokens=st.sampled_from([0, 1, 2]),
                     vector_layout=st.sampled_from(BUILDER_VECTOR_LAYOUTS),
                     table_layout=st.sampled_from(BUILDER_TABLE_LAYOUTS))


def _lay_out_vector(v: torch.Tensor, layout: str, gap: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view) of 1-D ``v``: packed, or a stride-2 view one element into a buffer whose gaps hold ``gap``."""
    if layout == "contiguous":
        return v, v
    buf = torch.full((2 * v.numel() + 2,), gap, dtype=v.dtype, device=v.device)
    view = buf[1:1 + 2 * v.numel():2]
    view.copy_(v)
    return buf, view


def _lay_out_table(t: torch.Tensor, layout: str, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(buffer, view) of table ``t [R, W]``: packed; a slice one row and two columns into a wider table whose
    other entries are valid block ids (not ``t``'s own neighbours: a reader of the slice as packed reads other
    blocks); column-major."""
    if layout == "contiguous":
        return t, t
    R, W = t.shape
    if layout == "column-major":
        buf = t.t().contiguous()
        return buf, buf.t()
    n = (R + 2) * (W + 5)
    buf = (torch.arange(n, dtype=torch.int64).flip(0) * 7 % num_blocks).to(t.dtype).reshape(R + 2, W + 5).to(t.device)
    view = buf[1:1 + R, 2:2 + W]
    view.copy_(t)
    return buf, view


#: the builder's fixed sizes in the toy: SWA block size, attention block size of a compressed layer, model length
BUILDER_SIZES = {"swa_block_size": 3, "block_size": 256, "max_model_len": 512}


def builder_inputs(case: BuilderCase, device: str | None = None):
    """(positions int64 [T], token_to_req int32 [T], swa_block_table int32 [2, 171], block_table int32 [2, 2] or
    None) of a builder case, laid out as its ``vector_layout`` and ``table_layout`` say."""
    return tuple(view for _, view in builder_buffers(case, device))


def builder_buffers(case: BuilderCase, device: str | None = None) -> list:
    """``[(buffer, view)]`` of positions, token_to_req, swa_block_table and block_table (``(None, None)`` for an
    SWA-only layer's): each view the builder's argument in the case's layout, each buffer the whole memory under it.
    The values come from the seed alone (every layout of a case holds the same ones)."""
    device = device or kernel_device()
    gen = torch.Generator().manual_seed(case.seed)
    pos = torch.randint(0, BUILDER_SIZES["max_model_len"], (2,), generator=gen).tolist() + [-1] * case.pad_tokens
    t2r = [0, 1] + [0] * case.pad_tokens
    cols = -(-BUILDER_SIZES["max_model_len"] // BUILDER_SIZES["swa_block_size"])
    swa = torch.randperm(2 * cols, generator=gen).reshape(2, cols).to(torch.int32)
    table = None
    if case.compress_ratio > 1:
        table = torch.randperm(4, generator=gen).reshape(2, 2).to(torch.int32).to(device)
    vec, tab = case.vector_layout, case.table_layout
    return [_lay_out_vector(torch.tensor(pos, dtype=torch.int64, device=device), vec, 7),
            _lay_out_vector(torch.tensor(t2r, dtype=torch.int32, device=device), vec, 1),
            _lay_out_table(swa.to(device), tab, 2 * cols),
            _lay_out_table(table, tab, 4) if table is not None else (None, None)]


def classify_builder(case: BuilderCase, target=None) -> dict:
    return {"ratio": case.compress_ratio, "capture": case.capture, "pad_tokens": case.pad_tokens > 0,
            "vector_layout": case.vector_layout, "table_layout": case.table_layout}


def force_builder(case: BuilderCase, combo: dict, target=None) -> BuilderCase:
    f = {k: combo[k] for k in ("vector_layout", "table_layout") if k in combo}
    if "ratio" in combo:
        f["compress_ratio"] = combo["ratio"]
    if "capture" in combo:
        f["capture"] = combo["capture"]
    if "pad_tokens" in combo:
        f["pad_tokens"] = (case.pad_tokens or 1) if combo["pad_tokens"] else 0
    return case.replace(**f)


def builder_family_examples(target=None) -> list[BuilderCase]:
    return [BuilderCase(seed=1, compress_ratio=128, capture=True), BuilderCase(seed=2, compress_ratio=1,
                                                                               capture=False, pad_tokens=1)]


def _declare_builder():
    from fuzz.dimensions import Dimension, Family, declare

    return declare(Family(
        "dsv4-builder",
        (Dimension("ratio", BUILDER_RATIOS, "the layer kind's compress ratio (0 and 1: SWA-only)"),
         Dimension("capture", (False, True), "build, or build_for_cudagraph_capture"),
         Dimension("pad_tokens", (False, True), "padding tokens (position -1) in the batch"),
         Dimension("vector_layout", BUILDER_VECTOR_LAYOUTS, "positions and token_to_req packed or stride-2 views"),
         Dimension("table_layout", BUILDER_TABLE_LAYOUTS, "both block tables packed, a slice of a wider table, "
                                                          "column-major")),
        (("ratio", "capture"), ("table_layout", "ratio"), ("vector_layout", "ratio")), classify_builder,
        force_builder, None, builder_family_examples),
        "dsv4-builder-capture-flag")


BUILDER_DIMENSIONS = _declare_builder()
